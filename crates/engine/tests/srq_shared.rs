//! Shared receive queues in the simulator: one SRQ feeding 16 RC QPs under load (with the
//! limit event, RNR while it is empty, replenishing), RC and UD QPs on one SRQ, the verbs'
//! checks, and LAST_WQE_REACHED.

mod common;

use core::time::Duration;

use common::*;
use engine::{
    AsyncEvent, Counter, PathMtu, QpAttr, QpAttrMask, QpState, QpType, RecvWr, SendWr, SrqAttr,
    SrqAttrMask, UdDest, VerbsError, WcStatus, GRH_LEN,
};
use sim::{LinkConfig, NetConfig, Sim};

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn an_srq_shared_by_16_rc_qps_under_load_raises_its_limit_once_and_rnr_waits() {
    const QPS: u64 = 16;
    const PER_QP: u64 = 12;
    const MSG: usize = 1500;
    let link = LinkConfig::perfect(Duration::from_micros(5)).with_loss(0.02);
    let mut sim = Sim::new(16, NetConfig::with_link(link));
    let a = add_host4(&mut sim, 1, 16, 4 << 20);
    let b = add_host4(&mut sim, 2, 16, 4 << 20);
    let eb = &mut sim.node_mut(b.node).engine;
    let srq = eb
        .create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 512,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .unwrap();
    let recv_cq = eb.create_cq(4096).unwrap();
    let send_cq_b = eb.create_cq(64).unwrap();
    let mut pairs = Vec::new();
    for _ in 0..QPS {
        let qa = new_qp4(
            &mut sim.node_mut(a.node).engine,
            a.pd,
            QpType::Rc,
            64,
            None,
            None,
        );
        let qb = new_qp4(
            &mut sim.node_mut(b.node).engine,
            b.pd,
            QpType::Rc,
            64,
            Some(srq),
            Some((send_cq_b, recv_cq)),
        );
        connect4(
            &mut sim.node_mut(a.node).engine,
            QpType::Rc,
            qa.qpn,
            b.ip,
            qb.qpn,
            PathMtu::Mtu1024,
            0,
            0,
        );
        connect4(
            &mut sim.node_mut(b.node).engine,
            QpType::Rc,
            qb.qpn,
            a.ip,
            qa.qpn,
            PathMtu::Mtu1024,
            0,
            0,
        );
        pairs.push((qa, qb));
    }
    // 64 WQEs for 192 messages; the limit is armed at 24.
    let mut next_wqe = 0u64;
    let post = |sim: &mut Sim<Host>, next: &mut u64, n: u64| {
        for _ in 0..n {
            let wr = RecvWr::new(*next, vec![b.sge(*next * 2048, 2048)]);
            sim.node_mut(b.node).engine.post_srq_recv(srq, wr).unwrap();
            *next += 1;
        }
    };
    post(&mut sim, &mut next_wqe, 64);
    let eb = &mut sim.node_mut(b.node).engine;
    eb.modify_srq(
        srq,
        &SrqAttr {
            srq_limit: 24,
            ..Default::default()
        },
        SrqAttrMask::LIMIT,
    )
    .unwrap();
    assert_eq!(eb.query_srq(srq).unwrap().srq_limit, 24);
    assert_eq!(
        eb.post_recv(pairs[0].1.qpn, RecvWr::new(0, vec![b.sge(0, 8)])),
        Err(VerbsError::OpNotSupported),
        "a QP of an SRQ has no receive queue"
    );
    for (i, (qa, _)) in pairs.iter().enumerate() {
        for k in 0..PER_QP {
            let off = (i as u64 * PER_QP + k) * 2048;
            let mut msg = pattern(off, MSG);
            msg[..16].copy_from_slice(&[(i as u64).to_le_bytes(), k.to_le_bytes()].concat());
            sim.node(a.node).mem.set(OWNER, a.addr(off), &msg);
            let wr = SendWr::send(k, vec![a.sge(off, MSG as u32)]).signaled(k + 1 == PER_QP);
            sim.node_mut(a.node).engine.post_send(qa.qpn, wr).unwrap();
        }
    }
    // Run until the SRQ runs dry: the limit event comes once, on the way down.
    let _ = sim.run_until(|s| s.node(b.node).engine.srq_len(srq).unwrap() == 0, SECOND);
    let eb = &mut sim.node_mut(b.node).engine;
    let ev = eb.get_async_event();
    assert_eq!(ev, Some(AsyncEvent::SrqLimitReached { srq }));
    assert_eq!(eb.get_async_event(), None, "once");
    assert_eq!(eb.query_srq(srq).unwrap().srq_limit, 0, "disarmed");
    assert!(matches!(eb.destroy_srq(srq), Err(VerbsError::Busy(_))));
    eb.ack_async_event(&ev.unwrap());
    // Senders wait on RNR NAKs while the SRQ is empty.
    let _ = sim.run_until(|_| false, sim.now() + Duration::from_millis(2));
    let rnr: u64 = sim
        .node(b.node)
        .engine
        .counters()
        .get(Counter::RespRnrNakSent);
    assert!(rnr > 0, "the responders sent RNR NAKs");
    // Replenish; everything arrives, each QP's messages in order, intact.
    post(&mut sim, &mut next_wqe, QPS * PER_QP - 64);
    let total = (QPS * PER_QP) as usize;
    let mut got = Vec::new();
    let deadline = sim.now() + Duration::from_secs(5);
    while got.len() < total && sim.now() < deadline {
        got.extend(drain_cq(
            &mut sim,
            b.node,
            recv_cq,
            total - got.len(),
            Duration::from_millis(50),
        ));
    }
    assert_eq!(got.len(), total);
    let mem = sim.node(b.node).mem.clone();
    let mut next_k = vec![0u64; QPS as usize];
    let mut wqes = std::collections::BTreeSet::new();
    for wc in &got {
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.byte_len as usize, MSG);
        assert!(wqes.insert(wc.wr_id), "each WQE used once");
        let buf = mem.get(OWNER, b.addr(wc.wr_id * 2048), MSG);
        let i = u64::from_le_bytes(buf[..8].try_into().unwrap());
        let k = u64::from_le_bytes(buf[8..16].try_into().unwrap());
        assert_eq!(
            pairs[i as usize].1.qpn,
            wc.qp_num.value(),
            "landed via its own QP"
        );
        assert_eq!(k, next_k[i as usize], "in order per QP");
        next_k[i as usize] += 1;
        let off = (i * PER_QP + k) * 2048;
        let mut want = pattern(off, MSG);
        want[..16].copy_from_slice(&buf[..16]);
        assert_eq!(buf, want);
    }
    for (qa, _) in &pairs {
        let sent = drain_cq(&mut sim, a.node, qa.send_cq, 1, SECOND);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].status, WcStatus::Success);
    }
    assert_eq!(sim.node(b.node).engine.srq_len(srq).unwrap(), 0);
}

#[test]
fn one_srq_feeds_an_rc_qp_and_a_ud_qp() {
    let mut sim = Sim::new(2, NetConfig::default());
    let a = add_host4(&mut sim, 1, 2, 1 << 20);
    let b = add_host4(&mut sim, 2, 2, 1 << 20);
    let eb = &mut sim.node_mut(b.node).engine;
    let srq = eb
        .create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let rq_cq = eb.create_cq(64).unwrap();
    let rc_b = new_qp4(eb, b.pd, QpType::Rc, 8, Some(srq), Some((rq_cq, rq_cq)));
    let ud_b = new_qp4(eb, b.pd, QpType::Ud, 8, Some(srq), Some((rq_cq, rq_cq)));
    assert_eq!(eb.qp_srq(ud_b.qpn).unwrap(), Some(srq));
    ud_up(eb, ud_b.qpn, 7);
    let ea = &mut sim.node_mut(a.node).engine;
    let rc_a = new_qp4(ea, a.pd, QpType::Rc, 8, None, None);
    let ud_a = new_qp4(ea, a.pd, QpType::Ud, 8, None, None);
    ud_up(ea, ud_a.qpn, 7);
    let ah = ah4(ea, a.pd, b.ip);
    connect4(
        ea,
        QpType::Rc,
        rc_a.qpn,
        b.ip,
        rc_b.qpn,
        PathMtu::Mtu1024,
        0,
        0,
    );
    connect4(
        &mut sim.node_mut(b.node).engine,
        QpType::Rc,
        rc_b.qpn,
        a.ip,
        rc_a.qpn,
        PathMtu::Mtu1024,
        0,
        0,
    );
    for i in 0..3 {
        let wr = RecvWr::new(i, vec![b.sge(i * 1024, 1024)]);
        sim.node_mut(b.node).engine.post_srq_recv(srq, wr).unwrap();
    }
    sim.node(a.node).mem.set(OWNER, a.addr(0), b"over RC");
    sim.node(a.node).mem.set(OWNER, a.addr(64), b"over UD");
    let ea = &mut sim.node_mut(a.node).engine;
    ea.post_send(rc_a.qpn, SendWr::send(1, vec![a.sge(0, 7)]))
        .unwrap();
    let dest = UdDest {
        ah,
        remote_qpn: engine::Qpn::new(ud_b.qpn),
        remote_qkey: 7,
    };
    // A datagram with the wrong Q_Key takes no WQE from the SRQ.
    let wrong = UdDest {
        remote_qkey: 8,
        ..dest
    };
    ea.post_send_ud(ud_a.qpn, SendWr::send(3, vec![a.sge(64, 7)]), wrong)
        .unwrap();
    ea.post_send_ud(ud_a.qpn, SendWr::send(2, vec![a.sge(64, 7)]), dest)
        .unwrap();
    let got = drain_cq(&mut sim, b.node, rq_cq, 2, SECOND);
    assert_eq!(got.len(), 2);
    let _ = sim.run_until(|_| false, SECOND);
    assert_eq!(sim.node(b.node).engine.srq_len(srq).unwrap(), 1);
    let mem = sim.node(b.node).mem.clone();
    for wc in &got {
        assert_eq!(wc.status, WcStatus::Success);
        let at = b.addr(wc.wr_id * 1024);
        if wc.qp_num.value() == ud_b.qpn {
            assert_eq!(wc.byte_len as usize, GRH_LEN + 7);
            assert_eq!(mem.get(OWNER, at + 40, 7), b"over UD");
        } else {
            assert_eq!(wc.qp_num.value(), rc_b.qpn);
            assert_eq!(mem.get(OWNER, at, 7), b"over RC");
        }
    }
}

#[test]
fn srq_verbs_check_sizes_limits_and_users() {
    let mut sim = Sim::new(3, NetConfig::default());
    let b = add_host4(&mut sim, 2, 3, 1 << 16);
    let e = &mut sim.node_mut(b.node).engine;
    let big = SrqAttr {
        max_wr: 1 << 30,
        max_sge: 1,
        srq_limit: 0,
    };
    assert!(matches!(
        e.create_srq(b.pd, &big),
        Err(VerbsError::CapExceeded { .. })
    ));
    let srq = e
        .create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 2,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let r = |i| RecvWr::new(i, vec![b.sge(0, 8)]);
    e.post_srq_recv(srq, r(1)).unwrap();
    e.post_srq_recv(srq, r(2)).unwrap();
    assert_eq!(e.post_srq_recv(srq, r(3)), Err(VerbsError::QueueFull));
    let two = RecvWr::new(4, vec![b.sge(0, 8), b.sge(8, 8)]);
    assert!(matches!(
        e.post_srq_recv(srq, two),
        Err(VerbsError::TooManySge { .. })
    ));
    // Resize: not below what is queued; then there is room.
    let one = SrqAttr {
        max_wr: 1,
        ..Default::default()
    };
    assert_eq!(
        e.modify_srq(srq, &one, SrqAttrMask::MAX_WR),
        Err(VerbsError::InvalidLength)
    );
    let four = SrqAttr {
        max_wr: 4,
        ..Default::default()
    };
    e.modify_srq(srq, &four, SrqAttrMask::MAX_WR).unwrap();
    e.post_srq_recv(srq, r(3)).unwrap();
    let q = e.query_srq(srq).unwrap();
    assert_eq!((q.max_wr, q.max_sge, q.srq_limit), (4, 1, 0));
    let lim = SrqAttr {
        srq_limit: 5,
        ..Default::default()
    };
    assert!(matches!(
        e.modify_srq(srq, &lim, SrqAttrMask::LIMIT),
        Err(VerbsError::CapExceeded { .. })
    ));
    // The PD of the QP must be the SRQ's.
    let pd2 = e.alloc_pd().unwrap();
    let cq = e.create_cq(8).unwrap();
    let init = common::one_wr_rc(pd2, cq);
    assert_eq!(e.create_qp_with_srq(&init, srq), Err(VerbsError::InvalidPd));
    let qpn = e
        .create_qp_with_srq(&engine::QpInitAttr { pd: b.pd, ..init }, srq)
        .unwrap();
    assert!(matches!(e.destroy_srq(srq), Err(VerbsError::Busy(_))));
    e.destroy_qp(qpn).unwrap();
    e.destroy_srq(srq).unwrap();
    assert_eq!(e.srq_len(srq), Err(VerbsError::InvalidSrq));
}

#[test]
fn an_srq_qp_entering_error_raises_last_wqe_reached() {
    let mut sim = Sim::new(4, NetConfig::default());
    let b = add_host4(&mut sim, 2, 4, 1 << 16);
    let e = &mut sim.node_mut(b.node).engine;
    let srq = e
        .create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let q = new_qp4(e, b.pd, QpType::Ud, 4, Some(srq), None);
    ud_up(e, q.qpn, 1);
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    e.modify_qp(q.qpn, &err, QpAttrMask::STATE).unwrap();
    let ev = e.get_async_event();
    assert_eq!(
        ev,
        Some(AsyncEvent::QpLastWqeReached {
            qpn: engine::Qpn::new(q.qpn)
        })
    );
    assert_eq!(e.unacked_async_events(), 1);
    e.ack_async_event(&ev.unwrap());
    assert_eq!(e.unacked_async_events(), 0);
    // Only once, however often it is moved to ERR.
    e.modify_qp(q.qpn, &err, QpAttrMask::STATE).unwrap();
    assert_eq!(e.get_async_event(), None);
}
