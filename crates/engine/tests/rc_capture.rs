//! Engine traffic as others see it: every packet two engines exchange (all RC opcodes, NAKs,
//! RNR NAKs, retransmissions and duplicates, IPv4 and IPv6) passes our own strict parser with a
//! correct ICRC, and decodes in Wireshark's InfiniBand dissector with no malformed packet and
//! no expert warning. tshark is required (`apt-get install -y tshark`), as for the CLI's
//! conformance suite.

mod common;

use core::time::Duration;
use std::collections::BTreeSet;
use std::process::Command;

use common::{pattern, Pair, PairConfig, Wiretap, OWNER};
use engine::{PathMtu, RecvWr, SendOp, SendWr, WcStatus};
use sim::{LinkConfig, NetConfig};

const DEADLINE: Duration = Duration::from_secs(30);

/// tshark options, as in the CLI's conformance suite: RoCEv2 over IPv6 uses UDP checksum 0
/// (allowed for tunnels), and heuristic dissectors that would judge our payload bytes as other
/// protocols are off.
const TSHARK_OPTS: &[&str] = &[
    "-o",
    "udp.ignore_ipv6_zero_checksum:TRUE",
    "--disable-heuristic",
    "rpcrdma_infiniband",
    "--disable-heuristic",
    "mellanox_eoib",
    "--disable-heuristic",
    "eth_over_ib",
    "--disable-heuristic",
    "smb_direct_infiniband",
    "--disable-heuristic",
    "smcr_infiniband",
    "--disable-heuristic",
    "sdp_infiniband",
    "--disable-heuristic",
    "iser_infiniband",
    "--disable-heuristic",
    "lnet_ib",
    "--disable-heuristic",
    "fc_infiniband",
    "--disable-heuristic",
    "nvme_rdma",
];

fn tshark(pcap: &std::path::Path, args: &[&str]) -> String {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(pcap).args(TSHARK_OPTS).args(args);
    let out = cmd
        .output()
        .expect("tshark is required for this test: apt-get install -y tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tshark prints UTF-8")
}

/// Runs a little of everything between two engines and returns every packet sent.
fn traffic(ipv6: bool) -> Vec<common::Seen> {
    let cfg = PairConfig {
        ipv6,
        mtu: PathMtu::Mtu1024,
        min_rnr_timer: 1,
        net: NetConfig::with_link(LinkConfig::default().with_loss(0.05).with_duplicate(0.05)),
        seed: 7 + u64::from(ipv6),
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let tap = Wiretap::install(&mut p.sim);
    p.mem(&a).set(OWNER, a.addr(0), &pattern(1, 20_000));
    p.mem(&b).set(OWNER, b.addr(0), &pattern(2, 20_000));
    // A SEND before its receive exists draws RNR NAKs.
    p.post_send(&a, SendWr::send(1, vec![a.sge(0, 3000)]));
    p.sim.advance(Duration::from_micros(200)).unwrap();
    p.post_recv(&b, RecvWr::new(1, vec![b.sge(100_000, 4096)]));
    for i in 2..9 {
        p.post_recv(&b, RecvWr::new(i, vec![b.sge(100_000 + i * 4096, 4096)]));
    }
    let rkey = b.mr.rkey;
    let ops = [
        SendWr::new(2, SendOp::SendWithImm { imm: 9 }, vec![a.sge(0, 2500)]),
        SendWr::send(3, vec![]),
        SendWr::send(4, vec![]).inline(vec![7; 100]),
        SendWr::rdma_write(5, vec![a.sge(0, 5000)], b.addr(200_000), rkey),
        SendWr::new(
            6,
            SendOp::RdmaWriteWithImm {
                remote_addr: b.addr(210_000),
                rkey,
                imm: 5,
            },
            vec![a.sge(0, 1000)],
        ),
        SendWr::rdma_read(7, vec![a.sge(300_000, 6000)], b.addr(0), rkey),
        SendWr::new(
            8,
            SendOp::AtomicCmpSwap {
                remote_addr: b.addr(8),
                rkey,
                compare: 0,
                swap: 1,
            },
            vec![a.sge(400_000, 8)],
        ),
        SendWr::new(
            9,
            SendOp::AtomicFetchAdd {
                remote_addr: b.addr(16),
                rkey,
                add: 1,
            },
            vec![a.sge(400_008, 8)],
        ),
        SendWr::new(10, SendOp::SendWithImm { imm: 10 }, vec![a.sge(0, 100)]),
        SendWr::rdma_read(11, vec![a.sge(310_000, 100)], b.addr(0), rkey),
        SendWr::new(
            12,
            SendOp::RdmaWriteWithImm {
                remote_addr: b.addr(220_000),
                rkey,
                imm: 12,
            },
            vec![a.sge(0, 3000)],
        ),
        // Last: a remote access error, answered by a NAK.
        SendWr::rdma_write(
            13,
            vec![a.sge(0, 64)],
            b.addr(0),
            engine::Rkey::new(rkey.value() ^ 1),
        ),
    ];
    for wr in ops {
        p.post_send(&a, wr);
    }
    let sc = p.wait_cq(&a, a.send_cq, 13, DEADLINE).unwrap();
    assert!(
        sc[..12].iter().all(|c| c.status == WcStatus::Success),
        "{sc:?}"
    );
    assert_eq!(sc[12].status, WcStatus::RemAccessErr);
    let seen = tap.seen.borrow().clone();
    seen
}

#[test]
fn every_packet_the_engines_send_parses_strictly_and_decodes_cleanly_in_tshark() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for ipv6 in [false, true] {
        let seen = traffic(ipv6);
        let mut opcodes = BTreeSet::new();
        let (mut acks, mut rnr_naks, mut naks) = (0, 0, 0);
        for s in &seen {
            match s.t.aeth.map(|a| a.syndrome) {
                Some(wire::Syndrome::Ack { .. }) => acks += 1,
                Some(wire::Syndrome::RnrNak { .. }) => rnr_naks += 1,
                Some(wire::Syndrome::Nak(_)) => naks += 1,
                _ => {}
            }
            wire::RoceV2Packet::parse_checked(&s.bytes)
                .unwrap_or_else(|e| panic!("our own packet fails our parser: {e}"));
            opcodes.insert(s.t.bth.opcode.code());
        }
        // Every RC opcode but SEND with invalidate showed up: SEND and RDMA WRITE first /
        // middle / last / only, with and without immediate, READ request and responses, ACK
        // (with ACK, RNR NAK and NAK syndromes), ATOMIC ACK, compare-and-swap, fetch-and-add.
        for code in 0u8..=20 {
            assert!(
                opcodes.contains(&code),
                "opcode {code} never sent: {opcodes:?}"
            );
        }

        assert!(
            acks > 0 && rnr_naks > 0 && naks > 0,
            "ACK {acks}, RNR NAK {rnr_naks}, NAK {naks}"
        );

        let path = dir.join(format!("rc_capture_ipv{}.pcap", if ipv6 { 6 } else { 4 }));
        let file = std::fs::File::create(&path).expect("create pcap");
        let mut w = sim::pcap::Writer::new(std::io::BufWriter::new(file)).expect("pcap header");
        for s in &seen {
            w.write_packet(s.time, &s.bytes).expect("write pcap");
        }
        w.into_inner().expect("flush pcap");

        let ib = tshark(
            &path,
            &["-Y", "infiniband", "-T", "fields", "-e", "frame.number"],
        );
        assert_eq!(
            ib.lines().count(),
            seen.len(),
            "tshark sees every packet as InfiniBand"
        );
        let bad = tshark(
            &path,
            &["-Y", "_ws.malformed || _ws.expert.severity >= 0x00600000"],
        );
        assert!(
            bad.trim().is_empty(),
            "tshark complains about {}:\n{bad}",
            path.display()
        );
    }
}
