//! RC ATOMIC compare-and-swap and fetch-and-add, and their replay from responder resources.

mod common;

use core::time::Duration;
use std::cell::Cell;
use std::rc::Rc;

use common::{Pair, PairConfig, OWNER};
use engine::{Counter, SendOp, SendWr, WcOpcode, WcStatus};
use wire::OpKind;

const DEADLINE: Duration = Duration::from_secs(10);

fn cas(wr_id: u64, p: &Pair, compare: u64, swap: u64) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::AtomicCmpSwap {
            remote_addr: p.b.addr(64),
            rkey: p.b.mr.rkey,
            compare,
            swap,
        },
        vec![p.a.sge(0, 8)],
    )
}

fn fadd(wr_id: u64, p: &Pair, add: u64, sink: u64) -> SendWr {
    SendWr::new(
        wr_id,
        SendOp::AtomicFetchAdd {
            remote_addr: p.b.addr(64),
            rkey: p.b.mr.rkey,
            add,
        },
        vec![p.a.sge(sink, 8)],
    )
}

#[test]
fn compare_and_swap_swaps_a_matching_word_and_returns_the_original() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.mem(&b).set_word(OWNER, b.addr(64), 0x1111);
    let wr = cas(1, &p, 0x1111, 0x2222);
    p.post_send(&a, wr);
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (sc[0].status, sc[0].opcode, sc[0].byte_len),
        (WcStatus::Success, WcOpcode::CompSwap, 8)
    );
    assert_eq!(p.mem(&a).word(OWNER, a.addr(0)), 0x1111);
    assert_eq!(p.mem(&b).word(OWNER, b.addr(64)), 0x2222);
}

#[test]
fn compare_and_swap_leaves_a_different_word_alone() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.mem(&b).set_word(OWNER, b.addr(64), 0x3333);
    let wr = cas(1, &p, 0x1111, 0x2222);
    p.post_send(&a, wr);
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(sc[0].status, WcStatus::Success);
    assert_eq!(p.mem(&a).word(OWNER, a.addr(0)), 0x3333);
    assert_eq!(p.mem(&b).word(OWNER, b.addr(64)), 0x3333);
}

#[test]
fn fetch_and_add_adds_wrapping_and_returns_each_original_in_order() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.mem(&b).set_word(OWNER, b.addr(64), u64::MAX - 1);
    for i in 0..4u64 {
        let wr = fadd(i, &p, 1, i * 8);
        p.post_send(&a, wr);
    }
    let sc = p.wait_cq(&a, a.send_cq, 4, DEADLINE).unwrap();
    assert!(sc
        .iter()
        .all(|c| c.status == WcStatus::Success && c.opcode == WcOpcode::FetchAdd));
    let m = p.mem(&a);
    let origs: Vec<u64> = (0..4).map(|i| m.word(OWNER, a.addr(i * 8))).collect();
    assert_eq!(origs, vec![u64::MAX - 1, u64::MAX, 0, 1]);
    assert_eq!(p.mem(&b).word(OWNER, b.addr(64)), 2);
}

#[test]
fn a_lost_atomic_ack_is_answered_from_responder_resources_not_executed_again() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.mem(&b).set_word(OWNER, b.addr(64), 100);
    let dropped = Rc::new(Cell::new(false));
    let d2 = Rc::clone(&dropped);
    let bn = b.node;
    p.sim.set_filter(Box::new(move |f| {
        let ack = common::transport_of(f.packet)
            .is_some_and(|t| t.bth.opcode.kind() == OpKind::AtomicAcknowledge);
        if f.from == bn && ack && !d2.get() {
            d2.set(true);
            return sim::Verdict::Drop;
        }
        sim::Verdict::Pass
    }));
    let wr = fadd(1, &p, 5, 0);
    p.post_send(&a, wr);
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert!(dropped.get());
    assert_eq!(sc[0].status, WcStatus::Success);
    assert_eq!(
        p.mem(&a).word(OWNER, a.addr(0)),
        100,
        "the replay returns the first original"
    );
    assert_eq!(
        p.mem(&b).word(OWNER, b.addr(64)),
        105,
        "executed exactly once"
    );
    let replayed = p.engine(&b).counters().get(Counter::RespReplayed);
    assert!(
        replayed >= 1,
        "the duplicate was answered from the resources"
    );
}

#[test]
fn a_misaligned_atomic_fails_and_leaves_memory_alone() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.mem(&b).set_word(OWNER, b.addr(64), 7);
    let wr = SendWr::new(
        1,
        SendOp::AtomicFetchAdd {
            remote_addr: b.addr(66),
            rkey: b.mr.rkey,
            add: 1,
        },
        vec![a.sge(0, 8)],
    );
    // Verbs may refuse it at post time or complete it with an error; either way no memory moves.
    if p.engine(&a).post_send(a.qpn, wr).is_ok() {
        let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
        assert_ne!(sc[0].status, WcStatus::Success);
    }
    assert_eq!(p.mem(&b).word(OWNER, b.addr(64)), 7);
}
