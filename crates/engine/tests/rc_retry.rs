//! RC reliability: local ACK timeout and retry_cnt, RNR NAK and rnr_retry, ghost ACKs, implied
//! NAKs, and duplicate requests.

mod common;

use core::time::Duration;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

use common::{pattern, psn_plus, with_psn, Pair, PairConfig, OWNER};
use engine::{Counter, QpState, RecvWr, SendOp, SendWr, WcStatus};
use sim::{LinkConfig, NetConfig};
use wire::OpKind;

const DEADLINE: Duration = Duration::from_secs(60);

/// Local ACK timeout for a timeout code: 4.096 µs × 2^code.
fn ack_timeout(code: u8) -> Duration {
    Duration::from_nanos(4096 << code)
}

fn statuses(wcs: &[engine::WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|c| (c.wr_id, c.status)).collect()
}

#[test]
fn retry_limit_reached_gives_retry_exc_err_then_flushes_the_rest() {
    let cfg = PairConfig {
        timeout: 10,
        retry_cnt: 3,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    p.sim.partition(a.node, b.node);
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 100)], b.addr(0), b.mr.rkey),
    );
    p.post_send(
        &a,
        SendWr::rdma_read(2, vec![a.sge(0, 100)], b.addr(0), b.mr.rkey),
    );
    p.post_recv(&b, RecvWr::new(9, vec![b.sge(0, 64)]));
    p.post_send(&a, SendWr::send(3, vec![a.sge(0, 10)]));
    let sc = p.wait_cq(&a, a.send_cq, 3, DEADLINE).unwrap();
    assert_eq!(
        statuses(&sc),
        vec![
            (1, WcStatus::RetryExcErr),
            (2, WcStatus::WrFlushErr),
            (3, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.qp_state(&a), QpState::Err);
    // The first transmission and three retries each waited one timeout.
    let t = ack_timeout(10);
    let now = p.sim.now();
    assert!(
        now >= t * 4 && now < t * 5,
        "failed at {now:?}, timeout {t:?}"
    );
    assert_eq!(p.engine(&a).counters().get(Counter::ReqRetryExceeded), 1);
}

#[test]
fn retry_limit_not_reached_recovers_when_the_partition_heals() {
    let cfg = PairConfig {
        timeout: 10,
        retry_cnt: 3,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let t = ack_timeout(10);
    // Transmissions at 0, T and 2T are lost; the third retry, at 3T, gets through (a fourth
    // timeout, at 4T, would have been fatal).
    p.sim
        .partition_window(a.node, b.node, Duration::ZERO, Some(t * 2 + t / 2));
    let data = pattern(5, 5000);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 5000)], b.addr(0), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(1, WcStatus::Success)]);
    assert_eq!(p.mem(&b).get(OWNER, b.addr(0), 5000), data);
    assert_eq!(p.engine(&a).counters().get(Counter::CompLocalAckTimeout), 3);
    assert_eq!(p.qp_state(&a), QpState::Rts);
}

#[test]
fn progress_resets_the_retry_counter() {
    // Three separate outages, each costing one retry of retry_cnt = 1 (the first transmission
    // is lost, the retry at T gets through): they add up to three retries, yet every WR
    // succeeds because each success restores the budget.
    let cfg = PairConfig {
        timeout: 10,
        retry_cnt: 1,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let t = ack_timeout(10);
    for i in 0..3u64 {
        let start = p.sim.now();
        p.sim
            .partition_window(a.node, b.node, start, Some(start + t / 2));
        p.post_send(
            &a,
            SendWr::rdma_write(i, vec![a.sge(0, 64)], b.addr(i * 64), b.mr.rkey),
        );
        let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
        assert_eq!(statuses(&sc), vec![(i, WcStatus::Success)]);
    }
}

#[test]
fn rnr_retry_exhausted_gives_rnr_retry_exc_err() {
    let cfg = PairConfig {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    p.post_send(&a, SendWr::send(1, vec![a.sge(0, 10)]));
    p.post_send(&a, SendWr::send(2, vec![a.sge(0, 10)]));
    let sc = p.wait_cq(&a, a.send_cq, 2, DEADLINE).unwrap();
    assert_eq!(
        statuses(&sc),
        vec![(1, WcStatus::RnrRetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    // One first try and two retries, each answered by an RNR NAK.
    assert_eq!(p.engine(&b).counters().get(Counter::RespRnrNakSent), 3);
}

#[test]
fn rnr_nak_retries_until_a_receive_is_posted() {
    let cfg = PairConfig {
        rnr_retry: 7,
        min_rnr_timer: 14, // 1.28 ms
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let data = pattern(7, 3000);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    p.post_send(&a, SendWr::send(1, vec![a.sge(0, 3000)]));
    p.sim.advance(Duration::from_millis(50)).unwrap();
    assert!(p.poll(&a, a.send_cq).is_empty());
    let naks = p.engine(&b).counters().get(Counter::RespRnrNakSent);
    assert!(
        (30..=45).contains(&naks),
        "about one RNR NAK per 1.28 ms: {naks}"
    );
    p.post_recv(&b, RecvWr::new(9, vec![b.sge(0, 4096)]));
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(1, WcStatus::Success)]);
    let rc = p.poll(&b, b.recv_cq);
    assert_eq!((rc[0].wr_id, rc[0].byte_len), (9, 3000));
    assert_eq!(p.mem(&b).get(OWNER, b.addr(0), 3000), data);
}

#[test]
fn a_ghost_ack_for_a_psn_never_sent_completes_nothing() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    // Capture a genuine ACK from B to use as the template of the forgery.
    let template = Rc::new(RefCell::new(None::<Vec<u8>>));
    let t2 = Rc::clone(&template);
    let (an, bn) = (a.node, b.node);
    let block = Rc::new(Cell::new(false));
    let block2 = Rc::clone(&block);
    p.sim.set_filter(Box::new(move |f| {
        if f.from == bn {
            if let Some(t) = common::transport_of(f.packet) {
                if t.bth.opcode.kind() == OpKind::Acknowledge && t2.borrow().is_none() {
                    *t2.borrow_mut() = Some(f.packet.clone());
                }
            }
        }
        if f.from == an && block2.get() {
            return sim::Verdict::Drop;
        }
        sim::Verdict::Pass
    }));
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 8)], b.addr(0), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(1, WcStatus::Success)]);
    let ack = template
        .borrow()
        .clone()
        .expect("B acknowledged the first WRITE");

    // Now A's requests vanish; a forged ACK for a PSN A never sent must not complete them.
    block.set(true);
    p.post_send(
        &a,
        SendWr::rdma_write(2, vec![a.sge(0, 8)], b.addr(8), b.mr.rkey),
    );
    p.sim.advance(Duration::from_micros(100)).unwrap();
    let ghost = with_psn(&ack, psn_plus(p.cfg.psn_a, 1000));
    p.sim.inject(b.node, a.node, ghost);
    p.sim.advance(Duration::from_micros(100)).unwrap();
    assert!(
        p.poll(&a, a.send_cq).is_empty(),
        "a ghost ACK completed a WR that never arrived"
    );
    assert_eq!(p.engine(&a).counters().get(Counter::CompGhostAck), 1);
    // The real exchange then finishes normally.
    block.set(false);
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(2, WcStatus::Success)]);
}

#[test]
fn an_implied_nak_through_a_later_ack_resends_the_lost_read() {
    let cfg = PairConfig {
        timeout: 14, // 67 ms: recovery must come from the implied NAK, long before this
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let dropped = Rc::new(Cell::new(false));
    let d2 = Rc::clone(&dropped);
    let bn = b.node;
    p.sim.set_filter(Box::new(move |f| {
        let resp = common::transport_of(f.packet)
            .is_some_and(|t| t.bth.opcode.kind() == OpKind::RdmaReadResponse);
        if f.from == bn && resp && !d2.get() {
            d2.set(true);
            return sim::Verdict::Drop;
        }
        sim::Verdict::Pass
    }));
    let data = pattern(8, 200);
    p.mem(&b).set(OWNER, b.addr(0), &data);
    p.post_recv(&b, RecvWr::new(9, vec![b.sge(4096, 64)]));
    p.post_send(
        &a,
        SendWr::rdma_read(1, vec![a.sge(0, 200)], b.addr(0), b.mr.rkey),
    );
    p.post_send(&a, SendWr::send(2, vec![a.sge(1000, 10)]));
    let sc = p.wait_cq(&a, a.send_cq, 2, DEADLINE).unwrap();
    assert!(dropped.get());
    assert_eq!(
        statuses(&sc),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.mem(&a).get(OWNER, a.addr(0), 200), data);
    assert!(p.engine(&a).counters().get(Counter::CompImpliedNak) >= 1);
    assert!(
        p.sim.now() < Duration::from_millis(67),
        "recovered by timeout, not implied NAK"
    );
    assert_eq!(p.poll(&b, b.recv_cq).len(), 1, "the SEND ran exactly once");
}

#[test]
fn every_packet_duplicated_still_executes_each_request_exactly_once() {
    let cfg = PairConfig {
        net: NetConfig::with_link(LinkConfig::default().with_duplicate(1.0)),
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    p.mem(&b).set_word(OWNER, b.addr(0), 10);
    let data = pattern(9, 9000);
    p.mem(&a).set(OWNER, a.addr(64), &data);
    p.mem(&b).set(OWNER, b.addr(20_000), &data);
    p.post_recv(&b, RecvWr::new(1, vec![b.sge(100_000, 9000)]));
    p.post_recv(&b, RecvWr::new(2, vec![b.sge(200_000, 9000)]));
    p.post_send(&a, SendWr::send(10, vec![a.sge(64, 9000)]));
    p.post_send(
        &a,
        SendWr::new(
            11,
            SendOp::AtomicFetchAdd {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey,
                add: 1,
            },
            vec![a.sge(0, 8)],
        ),
    );
    p.post_send(
        &a,
        SendWr::rdma_write(12, vec![a.sge(64, 9000)], b.addr(50_000), b.mr.rkey),
    );
    p.post_send(
        &a,
        SendWr::rdma_read(13, vec![a.sge(30_000, 9000)], b.addr(20_000), b.mr.rkey),
    );
    p.post_send(
        &a,
        SendWr::new(
            14,
            SendOp::AtomicFetchAdd {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey,
                add: 1,
            },
            vec![a.sge(8, 8)],
        ),
    );
    let sc = p.wait_cq(&a, a.send_cq, 5, DEADLINE).unwrap();
    assert!(sc.iter().all(|c| c.status == WcStatus::Success), "{sc:?}");
    p.sim.advance(Duration::from_millis(10)).unwrap();
    let rc = p.poll(&b, b.recv_cq);
    assert_eq!(
        statuses(&rc),
        vec![(1, WcStatus::Success)],
        "one SEND, one receive consumed"
    );
    assert_eq!(p.mem(&b).word(OWNER, b.addr(0)), 12);
    assert_eq!(p.mem(&a).word(OWNER, a.addr(0)), 10);
    assert_eq!(p.mem(&a).word(OWNER, a.addr(8)), 11);
    assert_eq!(p.mem(&b).get(OWNER, b.addr(100_000), 9000), data);
    assert_eq!(p.mem(&b).get(OWNER, b.addr(50_000), 9000), data);
    assert_eq!(p.mem(&a).get(OWNER, a.addr(30_000), 9000), data);
    assert!(p.engine(&b).counters().get(Counter::RespDuplicateRequest) > 0);
}
