//! What the packets look like on the wire, seen through an AF_PACKET socket on `lo` (needs
//! root or CAP_NET_RAW; the test says so and passes vacuously without them): IPv4 with DF and
//! ID 0, the per-connection UDP source port the engine chose, destination port 4791, and an ICRC
//! that verifies over the real headers, as a Linux rxe or hardware peer checks it. Packets that
//! left as one GSO train cross `lo` uncut: cut where a NIC would, segment k has ID k and each
//! segment's ICRC verifies for it.

mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::{open_pair, pair_on, WAIT};
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

const A: [u8; 4] = [127, 0, 0, 41];
const B: [u8; 4] = [127, 0, 0, 42];

/// UDP packets between A and B to `ports`, as IP packets.
fn captured(s: &Socket, ports: [u16; 2], want: usize) -> Vec<Vec<u8>> {
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
        let to_pair = |o: &[u8]| o == A || o == B;
        let dport = u16::from_be_bytes([ip[22], ip[23]]);
        if to_pair(&ip[12..16]) && to_pair(&ip[16..20]) && ports.contains(&dport) {
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
    // Addresses of their own, ports the OS picks: no other program's traffic matches.
    let (da, db) = open_pair("127.0.0.41", "127.0.0.42");
    let ports = [da.local_addr().port(), db.local_addr().port()];
    let (a, b) = pair_on(da, db, 8192);
    b.qp.recv(1, &[b.mr.sge(..).unwrap()]).unwrap();
    a.mr.write(0, &[7u8; 5000]).unwrap();
    a.qp.send(1, &[a.mr.sge(..5000).unwrap()]).unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    b.cq.wait_ok(WAIT).unwrap();
    // Two SEND packets (MTU 4096: a FIRST and a shorter LAST, one GSO train) and at least one
    // ACK, each seen once or twice on lo.
    let seen = captured(&sniff, ports, 2);
    assert!(seen.len() >= 2, "captured only {} packets", seen.len());
    let mut pkts = Vec::new();
    let mut trains = 0;
    for ip in &seen {
        let flags_frag = u16::from_be_bytes([ip[6], ip[7]]);
        assert_eq!(flags_frag, 0x4000, "DF set, not a fragment");
        assert_eq!(
            u16::from_be_bytes([ip[4], ip[5]]),
            0,
            "IP ID 0 (a train's first)"
        );
        // The packets of a datagram as `lo` carried it: itself, or the segments of a GSO
        // train, each with the headers it gets when cut.
        let cut = wire::train::cut(ip).unwrap_or_else(|| vec![ip.clone()]);
        if cut.len() > 1 {
            trains += 1;
        }
        pkts.extend(cut.into_iter().enumerate());
    }
    assert!(trains > 0, "the SEND left as one train");
    assert!(pkts.len() >= 3, "only {} packets", pkts.len());
    for (k, ip) in &pkts {
        assert_eq!(
            u16::from(ip[4]) << 8 | u16::from(ip[5]),
            *k as u16,
            "segment {k}'s ID"
        );
        // On a port other than 4791 the ICRC is computed as if the port were 4791 (see the
        // runtime docs, "Ports"): put it back, and nothing else, before checking.
        let mut ip = ip.clone();
        ip[22..24].copy_from_slice(&wire::ROCEV2_UDP_PORT.to_be_bytes());
        wire::icrc::verify(&ip).expect("ICRC over the real headers");
        let sport = u16::from_be_bytes([ip[20], ip[21]]);
        let from_a = ip[12..16] == A;
        let (local, remote) = if from_a {
            (a.qp.qpn(), b.qp.qpn())
        } else {
            (b.qp.qpn(), a.qp.qpn())
        };
        // The engine's per-connection port (rxe's rdma_get_udp_sport with flow label 0).
        let want = wire::src_port_for_connection(local, remote);
        assert_eq!(sport, want);
    }
}
