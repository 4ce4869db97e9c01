//! `ibv_resize_cq`: a CQ grows and shrinks, never below the completions waiting in it, and
//! a grown CQ takes completions that would have overrun it before.

mod common;

use common::{Pair, PairConfig};
use engine::{QpState, RecvWr, VerbsError, WcStatus};

#[test]
fn a_cq_resizes_within_its_limits_and_never_below_what_waits() {
    let mut p = Pair::new(PairConfig {
        cq_depth: 2,
        ..PairConfig::default()
    });
    let b = p.b;
    let e = p.engine(&b);
    assert_eq!(e.resize_cq(b.recv_cq, 1), Ok(1));
    let max = e.query_device().max_cqe;
    assert!(matches!(
        e.resize_cq(b.recv_cq, max + 1),
        Err(VerbsError::CapExceeded { .. })
    ));
    assert!(matches!(
        e.resize_cq(b.recv_cq, 0),
        Err(VerbsError::CapExceeded { .. })
    ));
    // Grown to 4, it holds 4 flushed receives (2 would have overrun it).
    assert_eq!(e.resize_cq(b.recv_cq, 4), Ok(4));
    for i in 0..4 {
        p.post_recv(&b, RecvWr::new(i, vec![]));
    }
    p.move_to(&b, QpState::Err);
    let e = p.engine(&b);
    assert_eq!(e.cq_len(b.recv_cq), Ok(4));
    assert_eq!(
        e.resize_cq(b.recv_cq, 3),
        Err(VerbsError::CqTooSmall {
            requested: 3,
            waiting: 4
        })
    );
    let wcs = p.poll(&b, b.recv_cq);
    assert_eq!(wcs.len(), 4, "nothing lost to the refusal");
    assert!(wcs.iter().all(|w| w.status == WcStatus::WrFlushErr));
    assert_eq!(p.engine(&b).resize_cq(b.recv_cq, 3), Ok(3));
    assert!(matches!(
        p.engine(&b).resize_cq(engine::CqHandle(999), 3),
        Err(VerbsError::InvalidCq)
    ));
}
