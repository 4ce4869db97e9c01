//! `Engine::take_filled_cqs`: the CQs that gained completions since the last look, each
//! once, in the order they first did, so that a host moving completions on (softrdmad into
//! its clients' rings) visits only those.

mod common;

use std::time::Duration;

use common::{Pair, PairConfig};
use engine::{QpState, RecvWr, SendWr};

fn filled(p: &mut Pair) -> Vec<engine::CqHandle> {
    let a = p.a;
    let mut out = Vec::new();
    p.engine(&a).take_filled_cqs(&mut out);
    out
}

#[test]
fn filled_cqs_are_listed_once_until_taken_whoever_fills_them() {
    let mut p = Pair::new(PairConfig {
        one_host: true,
        ..PairConfig::default()
    });
    let (a, b) = (p.a, p.b);
    assert!(filled(&mut p).is_empty(), "no completion yet");
    for i in 0..3 {
        p.post_recv(&b, RecvWr::new(i, vec![b.sge(0, 8)]));
        p.post_send(&a, SendWr::send(i, vec![a.sge(0, 8)]).signaled(true));
    }
    let node = a.node;
    let (scq, rcq) = (a.send_cq, b.recv_cq);
    p.sim
        .run_until(
            |s| {
                let e = &s.node(node).engine;
                e.cq_len(scq) == Ok(3) && e.cq_len(rcq) == Ok(3)
            },
            Duration::from_secs(1),
        )
        .expect("sent and received");
    // Three receives and three sends completed: each CQ is listed once, the receiver's
    // first (the responder completes a message before its ACK reaches the requester).
    assert_eq!(filled(&mut p), vec![b.recv_cq, a.send_cq]);
    assert!(
        filled(&mut p).is_empty(),
        "taken: listed again only when filled again"
    );
    // The completions themselves stay until polled; a later one lists the CQ again even
    // though it was never emptied.
    assert_eq!(p.poll(&a, a.send_cq).len(), 3);
    p.post_recv(&b, RecvWr::new(9, vec![b.sge(0, 8)]));
    p.move_to(&b, QpState::Err);
    // The flushed receive fills B's receive CQ, which still holds the three.
    assert_eq!(filled(&mut p), vec![b.recv_cq]);
    assert_eq!(p.poll(&b, b.recv_cq).len(), 4);
}

#[test]
fn a_destroyed_cq_leaves_the_list() {
    let mut p = Pair::new(PairConfig {
        one_host: true,
        ..PairConfig::default()
    });
    let a = p.a;
    let e = p.engine(&a);
    // A CQ of its own, filled by flushing a QP's receive, then destroyed untaken, again
    // and again (as an embedded device, which never takes the list, would do).
    for _ in 0..3 {
        let cq = e.create_cq(4).expect("create_cq");
        let q = e
            .create_qp(&common::one_wr_rc(a.pd, cq))
            .expect("create_qp");
        let init = engine::QpAttr {
            qp_state: QpState::Init,
            ..engine::QpAttr::default()
        };
        e.modify_qp(
            q,
            &init,
            engine::QpAttrMask::STATE
                | engine::QpAttrMask::PKEY_INDEX
                | engine::QpAttrMask::PORT
                | engine::QpAttrMask::ACCESS_FLAGS,
        )
        .expect("-> INIT");
        e.post_recv(q, RecvWr::new(1, vec![])).expect("post_recv");
        let err = engine::QpAttr {
            qp_state: QpState::Err,
            ..engine::QpAttr::default()
        };
        e.modify_qp(q, &err, engine::QpAttrMask::STATE)
            .expect("-> ERR");
        assert_eq!(e.cq_len(cq), Ok(1), "the flushed receive");
        e.destroy_qp(q).expect("destroy_qp");
        e.destroy_cq(cq).expect("destroy_cq");
    }
    assert!(
        filled(&mut p).is_empty(),
        "no stale entry of a destroyed CQ"
    );
}
