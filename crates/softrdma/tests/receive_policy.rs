//! The receive policy of the UDP receive path (runtime docs, "Receive policy"): the IP header
//! is rebuilt with IPv4 ID 0 and DF; a packet whose sender computed the ICRC over another ID
//! (Linux rxe counts IDs up) is accepted for the one ID its ICRC holds for, and counted; a
//! packet for which no ID holds is counted and dropped.

mod common;

use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use common::{open_pair, pair_on, WAIT};
use socket2::{Domain, Protocol, Socket, Type};
use softrdma::{Counter, Device, RxPath};
use wire::{BthRepr, IpRepr, Ipv4Repr, Opcode, Psn, Qpn, TransportRepr, ROCEV2_UDP_PORT};

/// A SEND ONLY to QP `qpn` of `dst`, as an IPv4 packet with IP ID `ident`; returns the
/// UDP payload (BTH .. ICRC), which is all a UDP socket carries.
fn send_only(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, qpn: u32, ident: u16) -> Vec<u8> {
    whole_send_only(src, dst, src_port, qpn, ident, ROCEV2_UDP_PORT)[20 + 8..].to_vec()
}

/// The whole IP packet of [`send_only`], to UDP port `dst_port` on the wire (its ICRC is
/// computed with 4791, as every softrdma device does).
fn whole_send_only(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    src_port: u16,
    qpn: u32,
    ident: u16,
    dst_port: u16,
) -> Vec<u8> {
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
    buf[22..24].copy_from_slice(&dst_port.to_be_bytes());
    buf[..n].to_vec()
}

fn wait_for(dev: &Device, c: Counter, at_least: u64) -> u64 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let v = dev.counters().unwrap().get(c);
        if v >= at_least || Instant::now() > end {
            return v;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_packet_whose_icrc_covers_a_nonzero_ip_id_is_accepted_for_that_id_and_a_corrupt_one_dropped() {
    let (_a, b) = open_pair("127.0.0.1", "127.0.0.2");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let sport = sock.local_addr().unwrap().port();
    let to = b.local_addr();
    let (src, dst) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    let capture = std::env::temp_dir().join(format!("softrdma-policy-{}.pcap", std::process::id()));
    b.runtime()
        .set_capture(Some(runtime::Capture::create(&capture).unwrap()));

    // ICRC over ID 0 + DF: passes the check (then finds no such QP).
    sock.send_to(&send_only(src, dst, sport, 0x4242, 0), to)
        .unwrap();
    assert_eq!(wait_for(&b, Counter::RxUnknownQp, 1), 1);
    assert_eq!(b.counters().unwrap().get(Counter::RxBadIcrc), 0);
    assert_eq!(b.counters().unwrap().get(Counter::RxIcrcIdRecovered), 0);

    // ICRC over ID 0x1234, as rxe would send it: the ID is found, the packet accepted.
    sock.send_to(&send_only(src, dst, sport, 0x4242, 0x1234), to)
        .unwrap();
    assert_eq!(wait_for(&b, Counter::RxUnknownQp, 2), 2);
    assert_eq!(b.counters().unwrap().get(Counter::RxIcrcIdRecovered), 1);
    assert_eq!(b.counters().unwrap().get(Counter::RxBadIcrc), 0);

    // The same packet with a payload byte flipped: no ID makes its ICRC hold.
    let mut bad = send_only(src, dst, sport, 0x4242, 0x1234);
    let n = bad.len();
    bad[n - 6] ^= 0x01;
    sock.send_to(&bad, to).unwrap();
    assert_eq!(wait_for(&b, Counter::RxBadIcrc, 1), 1);
    assert_eq!(b.counters().unwrap().get(Counter::RxUnknownQp), 2);

    // The capture shows the accepted packet with the ID its sender used, so its ICRC
    // verifies as it did on the wire.
    b.runtime().set_capture(None);
    drop(b);
    let bytes = std::fs::read(&capture).unwrap();
    let _ = std::fs::remove_file(&capture);
    let idents: Vec<u16> = pcap_packets(&bytes)
        .iter()
        .filter_map(|p| {
            let ok = wire::RoceV2Packet::parse_checked(p).ok()?;
            match ok.ip {
                IpRepr::V4(r) => Some(r.ident),
                IpRepr::V6(_) => None,
            }
        })
        .collect();
    assert_eq!(idents, vec![0, 0x1234], "every valid packet, as sent");
}

/// The records of a classic pcap file (24-byte header, 16-byte record headers).
fn pcap_packets(file: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= file.len() {
        let incl = u32::from_le_bytes(file[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 16;
        out.push(file[at..at + incl].to_vec());
        at += incl;
    }
    out
}

/// Devices on the raw receive path, or `None` without CAP_NET_RAW.
fn raw_pair(a_ip: &str, b_ip: &str) -> Option<(Device, Device)> {
    let open = |ip: &str| {
        Device::builder(ip.parse().unwrap())
            .backend(softrdma::BackendKind::Embedded)
            .port(0)
            .rx_path(RxPath::Raw)
            .open()
            .ok()
    };
    let (a, b) = (open(a_ip)?, open(b_ip)?);
    a.runtime().set_remote_port(b.local_addr().port());
    b.runtime().set_remote_port(a.local_addr().port());
    Some((a, b))
}

#[test]
fn the_raw_receive_path_checks_the_real_header_so_any_ip_id_passes() {
    let Some((_a, b)) = raw_pair("127.0.0.51", "127.0.0.52") else {
        eprintln!("skipped: the raw receive path needs root or CAP_NET_RAW");
        return;
    };
    // IP_HDRINCL: the packet leaves with the header we wrote, IP ID 0x1234 included.
    let inject = Socket::new(
        Domain::IPV4,
        Type::RAW,
        Some(Protocol::from(libc_ipproto_raw())),
    )
    .expect("CAP_NET_RAW was there a moment ago");
    let (src, dst) = (Ipv4Addr::new(127, 0, 0, 51), Ipv4Addr::new(127, 0, 0, 52));
    let pkt = whole_send_only(src, dst, 0xc123, 0x4242, 0x1234, b.local_addr().port());
    let to = std::net::SocketAddr::from((dst, 0));
    inject.send_to(&pkt, &to.into()).unwrap();
    assert_eq!(wait_for(&b, Counter::RxUnknownQp, 1), 1);
    assert_eq!(b.counters().unwrap().get(Counter::RxBadIcrc), 0);
}

fn libc_ipproto_raw() -> i32 {
    255 // IPPROTO_RAW
}

#[test]
fn rc_traffic_flows_over_the_raw_receive_path() {
    let Some((da, db)) = raw_pair("127.0.0.53", "127.0.0.54") else {
        eprintln!("skipped: the raw receive path needs root or CAP_NET_RAW");
        return;
    };
    let (a, b) = pair_on(da, db, 8192);
    b.qp.recv(1, &[b.mr.sge(..).unwrap()]).unwrap();
    a.mr.write(0, &[9u8; 6000]).unwrap();
    a.qp.send(1, &[a.mr.sge(..6000).unwrap()]).unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    assert_eq!(b.cq.wait_ok(WAIT).unwrap().byte_len, 6000);
    b.mr.write(100, b"read back").unwrap();
    a.qp.read(
        2,
        &[a.mr.sge(0..9).unwrap()],
        &b.mr.remote(100..109).unwrap(),
    )
    .unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    let mut got = [0u8; 9];
    a.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"read back");
}
