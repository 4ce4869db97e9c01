//! The receive policy of the UDP receive path (runtime docs, "Receive policy"): the IP header
//! is rebuilt with IPv4 ID 0 and DF, so a packet whose sender computed the ICRC over another
//! ID (Linux rxe counts IDs up) fails the ICRC check and is counted and dropped, while the
//! same packet computed over ID 0 is checked and accepted.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use common::open_pair;
use softrdma::{Counter, Device};
use wire::{BthRepr, IpRepr, Ipv4Repr, Opcode, Psn, Qpn, TransportRepr, ROCEV2_UDP_PORT};

/// A SEND ONLY to QP `qpn` of `dst`, as an IPv4 packet with IP ID `ident`; returns the
/// UDP payload (BTH .. ICRC), which is all a UDP socket carries.
fn send_only(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, qpn: u32, ident: u16) -> Vec<u8> {
    let ip = IpRepr::V4(Ipv4Repr {
        src,
        dst,
        tos: 0,
        ident,
        dont_frag: true,
        ttl: 64,
        payload_len: 0,
    });
    let mut bth = BthRepr::new(Opcode::RcSendOnly, Qpn::new(qpn), Psn::new(0));
    bth.ack_req = true;
    let t = TransportRepr::new(bth);
    let mut buf = [0u8; 256];
    let n = wire::emit_packet(&ip, src_port, ROCEV2_UDP_PORT, &t, b"policy", &mut buf).unwrap();
    buf[20 + 8..n].to_vec()
}

fn wait_for(dev: &Device, c: Counter, at_least: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let v = dev.counters().get(c);
        if v >= at_least || Instant::now() > end {
            return v;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_packet_whose_icrc_covers_a_nonzero_ip_id_is_counted_and_dropped() {
    let (_a, b) = open_pair("127.0.0.1", "127.0.0.2");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sport = sock.local_addr().unwrap().port();
    let to = b.local_addr();
    let (src, dst) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));

    // ICRC over ID 0 + DF: passes the check (then finds no such QP).
    sock.send_to(&send_only(src, dst, sport, 0x4242, 0), to)
        .unwrap();
    assert_eq!(wait_for(&b, Counter::RxUnknownQp, 1), 1);
    assert_eq!(b.counters().get(Counter::RxBadIcrc), 0);

    // ICRC over ID 0x1234, as rxe would send it: fails against the rebuilt header.
    sock.send_to(&send_only(src, dst, sport, 0x4242, 0x1234), to)
        .unwrap();
    assert_eq!(wait_for(&b, Counter::RxBadIcrc, 1), 1);
    assert_eq!(b.counters().get(Counter::RxUnknownQp), 1);
}
