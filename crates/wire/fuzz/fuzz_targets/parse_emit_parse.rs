//! parse -> emit -> parse: whatever parses re-emits into a packet that parses (with a good
//! ICRC) to the same headers and payload, and the ICRC verdict is consistent with the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::{IpRepr, RoceV2Packet};

fuzz_target!(|data: &[u8]| {
    let Ok(p) = RoceV2Packet::parse(data) else { return };
    let mut buf = vec![0u8; p.buffer_len()];
    let n = p.emit(&mut buf).expect("a parsed packet must re-emit");
    assert_eq!(n, buf.len());
    let q = RoceV2Packet::parse_checked(&buf).expect("an emitted packet must parse");
    assert_eq!(q.transport, p.transport);
    assert_eq!(q.payload, p.payload);
    assert_eq!(q.ip, p.ip);
    assert_eq!((q.udp.src_port, q.udp.dst_port, q.udp.length), (p.udp.src_port, p.udp.dst_port, p.udp.length));
    // UDP checksum: 0 over IPv4, computed over IPv6.
    match p.ip {
        IpRepr::V4(_) => assert_eq!(q.udp.checksum, 0),
        IpRepr::V6(_) => assert_ne!(q.udp.checksum, 0),
    }
    let ip_len = match p.ip {
        IpRepr::V4(_) => 20,
        IpRepr::V6(_) => 40,
    };
    assert_eq!(buf.len(), ip_len + p.ip.payload_len());
    // When re-emission reproduced every byte but the (masked) UDP checksum and the ICRC, the
    // fresh ICRC equals the one read exactly when that one was good.
    let body = n - 4;
    let mut orig = data[..body].to_vec();
    orig[ip_len + 6..ip_len + 8].copy_from_slice(&[0, 0]);
    let mut again = buf[..body].to_vec();
    again[ip_len + 6..ip_len + 8].copy_from_slice(&[0, 0]);
    if orig == again {
        assert_eq!(q.icrc == p.icrc, p.icrc_ok);
    }
});
