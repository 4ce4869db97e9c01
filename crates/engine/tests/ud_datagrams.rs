//! UD in the simulator: single-packet SENDs through address handles, DETH on the wire, the
//! 40-byte GRH in front of received data, Q_Key checks, MTU-sized messages, and loss.

mod common;

use core::time::Duration;

use common::*;
use engine::{
    Counter, PortState, QpState, QpType, RecvWr, SendOp, SendWr, UdDest, WcFlags, WcOpcode,
    WcStatus, GRH_LEN,
};
use sim::{LinkConfig, NetConfig, Sim};

const QKEY: u32 = 0x1111_0000;
const SECOND: Duration = Duration::from_secs(1);

struct Ud {
    sim: Sim<Host>,
    a: Host4,
    b: Host4,
    qa: Qp4,
    qb: Qp4,
    ah_ab: engine::AhHandle,
}

fn setup(seed: u64, net: NetConfig) -> Ud {
    let mut sim = Sim::new(seed, net);
    let a = add_host4(&mut sim, 1, seed, 1 << 20);
    let b = add_host4(&mut sim, 2, seed, 1 << 20);
    let ea = &mut sim.node_mut(a.node).engine;
    let qa = new_qp4(ea, a.pd, QpType::Ud, 512, None, None);
    ud_up(ea, qa.qpn, QKEY);
    let ah_ab = ah4(ea, a.pd, b.ip);
    let eb = &mut sim.node_mut(b.node).engine;
    let qb = new_qp4(eb, b.pd, QpType::Ud, 512, None, None);
    ud_up(eb, qb.qpn, QKEY);
    Ud {
        sim,
        a,
        b,
        qa,
        qb,
        ah_ab,
    }
}

impl Ud {
    fn dest(&self, qkey: u32) -> UdDest {
        UdDest {
            ah: self.ah_ab,
            remote_qpn: engine::Qpn::new(self.qb.qpn),
            remote_qkey: qkey,
        }
    }
}

#[test]
fn ud_send_with_imm_lands_after_a_real_ipv4_grh_with_the_source_qpn() {
    let mut t = setup(1, NetConfig::default());
    let tap = Wiretap::install(&mut t.sim);
    let data = pattern(7, 300);
    t.sim.node(t.a.node).mem.set(OWNER, t.a.addr(0), &data);
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    t.sim
        .node_mut(b.node)
        .engine
        .post_recv(qb.qpn, RecvWr::new(9, vec![b.sge(0x1000, 1024)]))
        .unwrap();
    let wr = SendWr::new(5, SendOp::SendWithImm { imm: 0xabcd }, vec![a.sge(0, 300)]);
    let dest = t.dest(QKEY);
    t.sim
        .node_mut(a.node)
        .engine
        .post_send_ud(qa.qpn, wr, dest)
        .unwrap();
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 1, SECOND);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(sent[0].opcode, WcOpcode::Send);
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, 1, SECOND);
    assert_eq!(got.len(), 1);
    let wc = got[0];
    assert_eq!(wc.wr_id, 9);
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(
        wc.src_qp.value(),
        qa.qpn,
        "the completion names the sending QP"
    );
    assert_eq!(wc.byte_len as usize, GRH_LEN + 300);
    assert!(wc.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    assert_eq!(wc.imm_data, 0xabcd);
    let mem = t.sim.node(b.node).mem.clone();
    let grh = mem.get(OWNER, b.addr(0x1000), GRH_LEN);
    // IPv4: the first 20 bytes are zero and the IPv4 header is in the last 20 (as Linux).
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20], 0x45, "IPv4, 20-byte header");
    assert_eq!(&grh[20 + 12..20 + 16], &[10, 0, 0, 1], "source address");
    assert_eq!(
        &grh[20 + 16..20 + 20],
        &[10, 0, 0, 2],
        "destination address"
    );
    assert_eq!(mem.get(OWNER, b.addr(0x1000) + 40, 300), data);
    // On the wire: UD SEND ONLY with immediate, a DETH with the Q_Key and the source QP.
    let seen = tap.seen.borrow();
    let p = seen.iter().find(|s| s.from == a.node).expect("a packet");
    assert_eq!(p.t.bth.opcode, wire::Opcode::UdSendOnlyImm);
    assert_eq!(p.t.bth.dest_qp.value(), qb.qpn);
    let deth = p.t.deth.expect("DETH");
    assert_eq!(deth.qkey.value(), QKEY);
    assert_eq!(deth.src_qp.value(), qa.qpn);
    assert_eq!(seen.len(), 1, "no acknowledgement on UD");
}

#[test]
fn ud_over_ipv6_puts_the_ipv6_header_in_the_grh() {
    let mut sim = Sim::new(3, NetConfig::default());
    let ip_a = side_ip(true, 1);
    let ip_b = side_ip(true, 2);
    let mk = |ip, base: u64| {
        let mem = TestMemory::default();
        mem.add_region(OWNER, base, 1 << 16);
        let mut e = engine::Engine::new(
            engine::EngineConfig::new(vec![ip], base),
            Box::new(mem.clone()),
        );
        let pd = e.alloc_pd().unwrap();
        let mr = e
            .reg_mr(pd, OWNER, base, 1 << 16, engine::AccessFlags::LOCAL_WRITE)
            .unwrap();
        let q = new_qp4(&mut e, pd, QpType::Ud, 16, None, None);
        ud_up(&mut e, q.qpn, QKEY);
        (e, mem, pd, mr, q)
    };
    let (mut ea, mem_a, pd_a, mr_a, qa) = mk(ip_a, 0x1_0000);
    let (mut eb, mem_b, _pd_b, mr_b, qb) = mk(ip_b, 0x9_0000);
    let ah = ea
        .create_ah(
            pd_a,
            &engine::AhAttr {
                dgid: engine::Gid::from_ip(ip_b).0,
                sgid_index: 0,
                hop_limit: 7,
                traffic_class: 0x28,
                // Bits above the 20 a GRH holds are accepted and dropped, as on Linux.
                flow_label: 0xfff1_2345,
                is_global: true,
                ..Default::default()
            },
        )
        .unwrap();
    mem_a.set(OWNER, 0x1_0000, b"hello over IPv6");
    eb.post_recv(
        qb.qpn,
        RecvWr::new(1, vec![engine::Sge::new(0x9_0000, 100, mr_b.lkey)]),
    )
    .unwrap();
    ea.post_send_ud(
        qa.qpn,
        SendWr::send(2, vec![engine::Sge::new(0x1_0000, 15, mr_a.lkey)]),
        UdDest {
            ah,
            remote_qpn: engine::Qpn::new(qb.qpn),
            remote_qkey: QKEY,
        },
    )
    .unwrap();
    let na = sim.add_node(
        [ip_a],
        Host {
            engine: ea,
            mem: mem_a,
        },
    );
    let nb = sim.add_node(
        [ip_b],
        Host {
            engine: eb,
            mem: mem_b.clone(),
        },
    );
    let _ = na;
    let got = drain_cq(&mut sim, nb, qb.recv_cq, 1, SECOND);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status, WcStatus::Success);
    let grh = mem_b.get(OWNER, 0x9_0000, GRH_LEN);
    assert_eq!(grh[0] >> 4, 6, "an IPv6 header");
    // The AH's traffic class, flow label and hop limit are the header's.
    assert_eq!(((grh[0] & 0xf) << 4) | (grh[1] >> 4), 0x28);
    let flow = (u32::from(grh[1] & 0xf) << 16) | (u32::from(grh[2]) << 8) | u32::from(grh[3]);
    assert_eq!(flow, 0x1_2345);
    assert_eq!(grh[7], 7, "hop limit");
    assert_eq!(
        &grh[8..24],
        &std::net::Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).octets()
    );
    assert_eq!(mem_b.get(OWNER, 0x9_0000 + 40, 15), b"hello over IPv6");
}

#[test]
fn ud_qkey_mismatch_is_dropped_and_a_high_bit_wr_qkey_means_the_qps_own() {
    let mut t = setup(2, NetConfig::default());
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    for i in 0..2 {
        t.sim
            .node_mut(b.node)
            .engine
            .post_recv(qb.qpn, RecvWr::new(i, vec![b.sge(i * 256, 256)]))
            .unwrap();
    }
    let wrong = t.dest(QKEY + 1);
    let own = t.dest(0x8000_0000);
    let e = &mut t.sim.node_mut(a.node).engine;
    e.post_send_ud(qa.qpn, SendWr::send(1, vec![a.sge(0, 8)]), wrong)
        .unwrap();
    e.post_send_ud(qa.qpn, SendWr::send(2, vec![a.sge(0, 16)]), own)
        .unwrap();
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 2, SECOND);
    assert!(sent.iter().all(|w| w.status == WcStatus::Success));
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, 2, SECOND);
    assert_eq!(got.len(), 1, "the wrong Q_Key was dropped");
    assert_eq!(got[0].byte_len as usize, GRH_LEN + 16);
    assert_eq!(
        got[0].wr_id, 0,
        "the dropped datagram consumed no receive WQE"
    );
    let e = &t.sim.node(b.node).engine;
    assert_eq!(
        e.qp_counters(qb.qpn).unwrap().get(Counter::RxQkeyMismatch),
        1
    );
}

#[test]
fn ud_message_longer_than_the_mtu_fails_and_is_never_truncated() {
    let mut t = setup(4, NetConfig::default());
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    t.sim
        .node_mut(b.node)
        .engine
        .post_recv(qb.qpn, RecvWr::new(1, vec![b.sge(0, 8192)]))
        .unwrap();
    let dest = t.dest(QKEY);
    let e = &mut t.sim.node_mut(a.node).engine;
    e.post_send_ud(qa.qpn, SendWr::send(1, vec![a.sge(0, 4097)]), dest)
        .unwrap();
    e.post_send_ud(qa.qpn, SendWr::send(2, vec![a.sge(0, 10)]), dest)
        .unwrap();
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 2, SECOND);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].status, WcStatus::LocLenErr);
    assert_eq!(sent[1].status, WcStatus::WrFlushErr);
    let e = &mut t.sim.node_mut(a.node).engine;
    assert_eq!(e.query_qp(qa.qpn).unwrap().qp_state, QpState::Sqe);
    assert!(drain_cq(&mut t.sim, b.node, qb.recv_cq, 1, SECOND).is_empty());
    // SQE -> RTS recovers the send queue; a full-MTU datagram then goes through.
    let e = &mut t.sim.node_mut(a.node).engine;
    e.modify_qp(
        qa.qpn,
        &engine::QpAttr {
            qp_state: QpState::Rts,
            ..Default::default()
        },
        engine::QpAttrMask::STATE,
    )
    .unwrap();
    e.post_send_ud(qa.qpn, SendWr::send(3, vec![a.sge(0, 4096)]), dest)
        .unwrap();
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 1, SECOND);
    assert_eq!(sent[0].status, WcStatus::Success);
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, 1, SECOND);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].byte_len as usize, GRH_LEN + 4096);
}

#[test]
fn ud_without_a_receive_wqe_drops_the_datagram() {
    let mut t = setup(5, NetConfig::default());
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    let dest = t.dest(QKEY);
    t.sim
        .node_mut(a.node)
        .engine
        .post_send_ud(qa.qpn, SendWr::send(1, vec![a.sge(0, 10)]), dest)
        .unwrap();
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 1, SECOND);
    assert_eq!(sent[0].status, WcStatus::Success);
    let _ = t.sim.run_until(|_| false, SECOND);
    let e = &t.sim.node(b.node).engine;
    assert_eq!(e.qp_counters(qb.qpn).unwrap().get(Counter::RxNoRecvWqe), 1);
}

#[test]
fn ud_under_loss_drops_messages_without_retransmission_or_stale_data() {
    let link = LinkConfig::perfect(Duration::from_micros(10)).with_loss(0.3);
    let mut t = setup(6, NetConfig::with_link(link));
    let tap = Wiretap::install(&mut t.sim);
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    const N: u64 = 200;
    let dest = t.dest(QKEY);
    for i in 0..N {
        let mut msg = pattern(i, 64);
        msg[..8].copy_from_slice(&i.to_le_bytes());
        t.sim.node(a.node).mem.set(OWNER, a.addr(i * 64), &msg);
        t.sim
            .node_mut(b.node)
            .engine
            .post_recv(qb.qpn, RecvWr::new(i, vec![b.sge(i * 128, 128)]))
            .unwrap();
        t.sim
            .node_mut(a.node)
            .engine
            .post_send_ud(qa.qpn, SendWr::send(i, vec![a.sge(i * 64, 64)]), dest)
            .unwrap();
    }
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, N as usize, SECOND);
    assert_eq!(sent.len(), N as usize);
    assert!(sent.iter().all(|w| w.status == WcStatus::Success));
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, N as usize, SECOND);
    let sent_pkts = tap
        .seen
        .borrow()
        .iter()
        .filter(|s| s.from == a.node)
        .count();
    assert_eq!(sent_pkts, N as usize, "one packet per message, none resent");
    assert!(
        got.len() < N as usize && got.len() > N as usize / 2,
        "{}",
        got.len()
    );
    let mem = t.sim.node(b.node).mem.clone();
    let mut last = None;
    for (k, wc) in got.iter().enumerate() {
        assert_eq!(wc.status, WcStatus::Success);
        // Receive WQEs are used in order: the k-th completion is the k-th WQE.
        assert_eq!(wc.wr_id, k as u64);
        let buf = mem.get(OWNER, b.addr(wc.wr_id * 128) + 40, 64);
        let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
        let mut want = pattern(seq, 64);
        want[..8].copy_from_slice(&seq.to_le_bytes());
        assert_eq!(buf, want, "message {seq} intact");
        assert!(last.is_none_or(|l| seq > l), "in order, each once");
        last = Some(seq);
    }
}

#[test]
fn ud_post_checks_the_address_handle_and_the_opcode() {
    let mut t = setup(7, NetConfig::default());
    let (a, qa) = (t.a, t.qa);
    let dest = t.dest(QKEY);
    let e = &mut t.sim.node_mut(a.node).engine;
    let write = SendWr::rdma_write(1, vec![a.sge(0, 8)], 0, engine::Rkey::new(0));
    assert_eq!(
        e.post_send_ud(qa.qpn, write, dest),
        Err(engine::VerbsError::OpNotSupported)
    );
    assert_eq!(
        e.post_send(qa.qpn, SendWr::send(1, vec![a.sge(0, 8)])),
        Err(engine::VerbsError::OpNotSupported),
        "a UD send needs a destination"
    );
    let bad = UdDest {
        ah: engine::AhHandle(99),
        ..dest
    };
    assert_eq!(
        e.post_send_ud(qa.qpn, SendWr::send(1, vec![a.sge(0, 8)]), bad),
        Err(engine::VerbsError::InvalidAh)
    );
    // An AH of another PD may not be used (IBA 10.2.2.2: QP and AH share a PD).
    let pd2 = e.alloc_pd().unwrap();
    let ah2 = ah4(e, pd2, side_ip(false, 2));
    let other = UdDest { ah: ah2, ..dest };
    assert_eq!(
        e.post_send_ud(qa.qpn, SendWr::send(1, vec![a.sge(0, 8)]), other),
        Err(engine::VerbsError::InvalidAh)
    );
    assert_eq!(e.query_ah(dest.ah).unwrap().hop_limit, 64);
}

#[test]
fn port_down_stops_traffic_and_raises_port_events() {
    let mut t = setup(8, NetConfig::default());
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    let dest = t.dest(QKEY);
    t.sim
        .node_mut(b.node)
        .engine
        .post_recv(qb.qpn, RecvWr::new(1, vec![b.sge(0, 256)]))
        .unwrap();
    let e = &mut t.sim.node_mut(b.node).engine;
    e.set_port_state(PortState::Down);
    assert_eq!(e.query_port(1).unwrap().state, PortState::Down);
    assert_eq!(
        e.get_async_event(),
        Some(engine::AsyncEvent::PortErr { port: 1 })
    );
    t.sim
        .node_mut(a.node)
        .engine
        .post_send_ud(qa.qpn, SendWr::send(1, vec![a.sge(0, 10)]), dest)
        .unwrap();
    assert!(drain_cq(&mut t.sim, b.node, qb.recv_cq, 1, SECOND).is_empty());
    let e = &mut t.sim.node_mut(b.node).engine;
    e.set_port_state(PortState::Active);
    assert_eq!(
        e.get_async_event(),
        Some(engine::AsyncEvent::PortActive { port: 1 })
    );
    t.sim
        .node_mut(a.node)
        .engine
        .post_send_ud(qa.qpn, SendWr::send(2, vec![a.sge(0, 10)]), dest)
        .unwrap();
    assert_eq!(drain_cq(&mut t.sim, b.node, qb.recv_cq, 1, SECOND).len(), 1);
}

#[test]
fn ud_address_handle_picks_the_source_gid_and_sets_tos_and_ttl() {
    let mut sim = Sim::new(9, NetConfig::default());
    let ip_a0 = side_ip(false, 1);
    let ip_a1 = side_ip(false, 3);
    let ip_b = side_ip(false, 2);
    let mk = |ips: Vec<std::net::IpAddr>, base: u64| {
        let mem = TestMemory::default();
        mem.add_region(OWNER, base, 1 << 16);
        let mut e =
            engine::Engine::new(engine::EngineConfig::new(ips, base), Box::new(mem.clone()));
        let pd = e.alloc_pd().unwrap();
        let mr = e
            .reg_mr(pd, OWNER, base, 1 << 16, engine::AccessFlags::LOCAL_WRITE)
            .unwrap();
        let q = new_qp4(&mut e, pd, QpType::Ud, 16, None, None);
        ud_up(&mut e, q.qpn, QKEY);
        (e, mem, pd, mr, q)
    };
    let (mut ea, mem_a, pd_a, mr_a, qa) = mk(vec![ip_a0, ip_a1], 0x1_0000);
    let (mut eb, mem_b, _, mr_b, qb) = mk(vec![ip_b], 0x9_0000);
    let attr = engine::AhAttr {
        dgid: engine::Gid::from_ip(ip_b).0,
        sgid_index: 1,
        hop_limit: 9,
        traffic_class: 0x60,
        is_global: true,
        ..Default::default()
    };
    assert!(matches!(
        ea.create_ah(
            pd_a,
            &engine::AhAttr {
                sgid_index: 5,
                ..attr
            }
        ),
        Err(engine::VerbsError::InvalidGidIndex(5))
    ));
    assert_eq!(
        ea.create_ah(
            pd_a,
            &engine::AhAttr {
                is_global: false,
                ..attr
            }
        ),
        Err(engine::VerbsError::InvalidAh),
        "RoCE needs the GRH"
    );
    let ah = ea.create_ah(pd_a, &attr).unwrap();
    eb.post_recv(
        qb.qpn,
        RecvWr::new(1, vec![engine::Sge::new(0x9_0000, 100, mr_b.lkey)]),
    )
    .unwrap();
    let dest = UdDest {
        ah,
        remote_qpn: engine::Qpn::new(qb.qpn),
        remote_qkey: QKEY,
    };
    ea.post_send_ud(
        qa.qpn,
        SendWr::send(2, vec![engine::Sge::new(0x1_0000, 4, mr_a.lkey)]),
        dest,
    )
    .unwrap();
    sim.add_node(
        [ip_a0, ip_a1],
        Host {
            engine: ea,
            mem: mem_a,
        },
    );
    let nb = sim.add_node(
        [ip_b],
        Host {
            engine: eb,
            mem: mem_b.clone(),
        },
    );
    let got = drain_cq(&mut sim, nb, qb.recv_cq, 1, SECOND);
    assert_eq!(got.len(), 1);
    let grh = mem_b.get(OWNER, 0x9_0000, GRH_LEN);
    assert_eq!(grh[20 + 1], 0x60, "TOS from the traffic class");
    assert_eq!(grh[20 + 8], 9, "TTL from the hop limit");
    assert_eq!(&grh[20 + 12..20 + 16], &[10, 0, 0, 3], "source GID index 1");
}
