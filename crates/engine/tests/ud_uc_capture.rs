//! UC and UD traffic as others see it: every UC opcode (SEND and RDMA WRITE first / middle /
//! last / only, with and without immediate) and both UD opcodes, over IPv4 and IPv6, pass our
//! strict parser with a correct ICRC and decode in Wireshark's InfiniBand dissector (DETH
//! included) with no malformed packet and no expert warning. tshark is required
//! (`apt-get install -y tshark`), as for the RC capture test.

mod common;

use core::time::Duration;
use std::collections::BTreeSet;
use std::process::Command;

use common::*;
use engine::{
    AccessFlags, Engine, EngineConfig, PathMtu, QpType, RecvWr, SendOp, SendWr, UdDest, WcStatus,
};
use sim::{NetConfig, NodeId, Sim};

const SECOND: Duration = Duration::from_secs(1);

/// Host `n` with IPv4 or IPv6 addresses, one MR over 1 MiB at `n << 28`.
fn host(sim: &mut Sim<Host>, ipv6: bool, n: u8) -> Host4 {
    let ip = side_ip(ipv6, n);
    let base = u64::from(n) << 28;
    let mem = TestMemory::default();
    mem.add_region(OWNER, base, 1 << 20);
    let mut engine = Engine::new(EngineConfig::new(vec![ip], base), Box::new(mem.clone()));
    let pd = engine.alloc_pd().unwrap();
    let mr = engine
        .reg_mr(
            pd,
            OWNER,
            base,
            1 << 20,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let node = sim.add_node([ip], Host { engine, mem });
    Host4 {
        node,
        ip,
        pd,
        mr,
        base,
        len: 1 << 20,
    }
}

fn engine(sim: &mut Sim<Host>, node: NodeId) -> &mut Engine {
    &mut sim.node_mut(node).engine
}

fn traffic(ipv6: bool) -> Vec<Seen> {
    let mut sim = Sim::new(11, NetConfig::default());
    let a = host(&mut sim, ipv6, 1);
    let b = host(&mut sim, ipv6, 2);
    let tap = Wiretap::install(&mut sim);
    sim.node(a.node)
        .mem
        .set(OWNER, a.addr(0), &pattern(3, 4000));
    let uc_a = new_qp4(engine(&mut sim, a.node), a.pd, QpType::Uc, 32, None, None);
    let uc_b = new_qp4(engine(&mut sim, b.node), b.pd, QpType::Uc, 32, None, None);
    let ud_a = new_qp4(engine(&mut sim, a.node), a.pd, QpType::Ud, 32, None, None);
    let ud_b = new_qp4(engine(&mut sim, b.node), b.pd, QpType::Ud, 32, None, None);
    let mtu = PathMtu::Mtu1024;
    connect4(
        engine(&mut sim, a.node),
        QpType::Uc,
        uc_a.qpn,
        b.ip,
        uc_b.qpn,
        mtu,
        5,
        9,
    );
    connect4(
        engine(&mut sim, b.node),
        QpType::Uc,
        uc_b.qpn,
        a.ip,
        uc_a.qpn,
        mtu,
        9,
        5,
    );
    ud_up(engine(&mut sim, a.node), ud_a.qpn, 77);
    ud_up(engine(&mut sim, b.node), ud_b.qpn, 77);
    let ah = ah4(engine(&mut sim, a.node), a.pd, b.ip);
    let eb = engine(&mut sim, b.node);
    for i in 0..8 {
        eb.post_recv(uc_b.qpn, RecvWr::new(i, vec![b.sge(i * 4096, 4096)]))
            .unwrap();
        eb.post_recv(
            ud_b.qpn,
            RecvWr::new(i, vec![b.sge(0x8_0000 + i * 4096, 4096)]),
        )
        .unwrap();
    }
    let write = |id, len, imm: Option<u32>| {
        let remote_addr = b.addr(0x4_0000 + id * 0x1000);
        let rkey = b.mr.rkey;
        let op = match imm {
            Some(imm) => SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            None => SendOp::RdmaWrite { remote_addr, rkey },
        };
        SendWr::new(id, op, vec![a.sge(0, len)])
    };
    let uc = [
        SendWr::send(1, vec![a.sge(0, 3000)]),
        SendWr::new(2, SendOp::SendWithImm { imm: 2 }, vec![a.sge(0, 3000)]),
        SendWr::send(3, vec![a.sge(0, 100)]),
        SendWr::new(4, SendOp::SendWithImm { imm: 4 }, vec![a.sge(0, 100)]),
        write(5, 3000, None),
        write(6, 3000, Some(6)),
        write(7, 100, None),
        write(8, 100, Some(8)),
    ];
    let ea = engine(&mut sim, a.node);
    for wr in uc {
        ea.post_send(uc_a.qpn, wr).unwrap();
    }
    let dest = UdDest {
        ah,
        remote_qpn: engine::Qpn::new(ud_b.qpn),
        remote_qkey: 77,
    };
    ea.post_send_ud(ud_a.qpn, SendWr::send(1, vec![a.sge(0, 1000)]), dest)
        .unwrap();
    let imm = SendWr::new(2, SendOp::SendWithImm { imm: 1 }, vec![a.sge(0, 10)]);
    ea.post_send_ud(ud_a.qpn, imm, dest).unwrap();
    let got = drain_cq(&mut sim, b.node, uc_b.recv_cq, 6, SECOND);
    assert_eq!(got.len(), 6);
    assert!(got.iter().all(|c| c.status == WcStatus::Success), "{got:?}");
    let got = drain_cq(&mut sim, b.node, ud_b.recv_cq, 2, SECOND);
    assert_eq!(got.len(), 2);
    let seen = tap.seen.borrow().clone();
    seen
}

/// tshark options as in the RC capture test: UDP checksum 0 on IPv6 allowed (tunnels), and
/// the heuristic dissectors that would read payload bytes as other protocols off.
fn tshark(pcap: &std::path::Path, filter: &[&str]) -> String {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(pcap)
        .args(["-o", "udp.ignore_ipv6_zero_checksum:TRUE"]);
    for h in [
        "rpcrdma_infiniband",
        "mellanox_eoib",
        "eth_over_ib",
        "smb_direct_infiniband",
        "smcr_infiniband",
        "sdp_infiniband",
        "iser_infiniband",
        "lnet_ib",
        "fc_infiniband",
        "nvme_rdma",
    ] {
        cmd.args(["--disable-heuristic", h]);
    }
    let out = cmd
        .args(filter)
        .output()
        .expect("tshark is required for this test: apt-get install -y tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tshark prints UTF-8")
}

#[test]
fn every_uc_and_ud_packet_parses_strictly_and_decodes_cleanly_in_tshark() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for ipv6 in [false, true] {
        let seen = traffic(ipv6);
        let mut opcodes = BTreeSet::new();
        for s in &seen {
            wire::RoceV2Packet::parse_checked(&s.bytes)
                .unwrap_or_else(|e| panic!("our own packet fails our parser: {e}"));
            opcodes.insert(s.t.bth.opcode.code());
        }
        let want: BTreeSet<u8> = (0x20..=0x2b).chain([0x64, 0x65]).collect();
        assert_eq!(opcodes, want, "every UC and UD opcode, nothing else");
        let path = dir.join(format!(
            "ud_uc_capture_ipv{}.pcap",
            if ipv6 { 6 } else { 4 }
        ));
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
        assert_eq!(ib.lines().count(), seen.len(), "every packet is InfiniBand");
        let deth = tshark(
            &path,
            &[
                "-Y",
                "infiniband.deth",
                "-T",
                "fields",
                "-e",
                "infiniband.deth.q_key",
            ],
        );
        assert_eq!(
            deth.lines().count(),
            2,
            "both UD packets carry a DETH:\n{deth}"
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
