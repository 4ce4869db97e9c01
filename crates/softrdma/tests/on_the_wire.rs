//! What the packets look like on the wire, seen through an AF_PACKET socket on `lo` (needs
//! root or CAP_NET_RAW; the test says so and passes vacuously without them): IPv4 with DF and
//! ID 0, the per-QP UDP source port the engine chose, destination port 4791, and an ICRC
//! that verifies over the real headers, as a Linux rxe or hardware peer checks it.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::{pair_v4, WAIT};
use socket2::{Domain, Protocol, Socket, Type};

const ETH_P_ALL: u16 = 0x0003;
const ETH_HLEN: usize = 14;

fn sniffer() -> Option<Socket> {
    let s = Socket::new(
        Domain::PACKET,
        Type::RAW,
        Some(Protocol::from(i32::from(ETH_P_ALL.to_be()))),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_millis(50))).ok()?;
    Some(s)
}

/// IPv4 RoCEv2 packets between 127.0.0.1 and 127.0.0.2 on `port`, as IP packets.
fn captured(s: &Socket, port: u16, want: usize) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut frame = [0u8; 9000];
    while out.len() < want && Instant::now() < deadline {
        let Ok(n) = (&*s).read(&mut frame) else {
            continue;
        };
        let Some(ip) = frame[..n].get(ETH_HLEN..) else {
            continue;
        };
        if ip.len() < 28 || ip[0] != 0x45 || ip[9] != 17 {
            continue;
        }
        let to_pair = |o: &[u8]| o == [127, 0, 0, 1] || o == [127, 0, 0, 2];
        let dport = u16::from_be_bytes([ip[22], ip[23]]);
        if to_pair(&ip[12..16]) && to_pair(&ip[16..20]) && dport == port {
            out.push(ip.to_vec());
        }
    }
    out
}

#[test]
fn ipv4_packets_carry_df_id_zero_the_qp_source_port_and_a_valid_icrc() {
    let Some(sniff) = sniffer() else {
        eprintln!("skipped: AF_PACKET needs root or CAP_NET_RAW");
        return;
    };
    // Use the standard port so the ICRC the engine computed is the one on the wire.
    let port = wire::ROCEV2_UDP_PORT;
    let (a, b) = pair_v4(port, 8192);
    b.qp.recv(1, &[b.mr.sge(..).unwrap()]).unwrap();
    a.mr.write(0, &[7u8; 5000]).unwrap();
    a.qp.send(1, &[a.mr.sge(..5000).unwrap()]).unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    b.cq.wait_ok(WAIT).unwrap();
    // Two SEND packets (MTU 4096) and at least one ACK, each seen once or twice on lo.
    let pkts = captured(&sniff, port, 3);
    assert!(pkts.len() >= 3, "captured only {} packets", pkts.len());
    for ip in &pkts {
        let flags_frag = u16::from_be_bytes([ip[6], ip[7]]);
        assert_eq!(flags_frag, 0x4000, "DF set, not a fragment");
        assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 0, "IP ID 0");
        wire::icrc::verify(ip).expect("ICRC over the real headers");
        let sport = u16::from_be_bytes([ip[20], ip[21]]);
        let from_a = ip[12..16] == [127, 0, 0, 1];
        let qpn = if from_a { a.qp.qpn() } else { b.qp.qpn() };
        assert_eq!(sport, wire::src_port_for_qpn(wire::Qpn::new(qpn)));
    }
}
