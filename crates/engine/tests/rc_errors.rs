//! RC error paths: remote access errors (bad rkey, bounds, rights), local protection and
//! length errors, and the flush of everything after an error.

mod common;

use core::time::Duration;

use common::{pattern, Pair, PairConfig, OWNER};
use engine::{AccessFlags, Counter, QpAttr, QpAttrMask, QpState, RecvWr, SendWr, Sge, WcStatus};

const DEADLINE: Duration = Duration::from_secs(10);

fn statuses(wcs: &[engine::WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|c| (c.wr_id, c.status)).collect()
}

#[test]
fn an_rkey_violation_completes_with_remote_access_error_and_flushes_the_rest() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.mem(&a).set(OWNER, a.addr(0), &pattern(1, 100));
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 100)], b.addr(0), b.mr.rkey),
    );
    p.post_send(
        &a,
        SendWr::rdma_write(
            2,
            vec![a.sge(0, 100)],
            b.addr(0),
            engine::Rkey::new(b.mr.rkey.value() ^ 0x5a),
        ),
    );
    p.post_send(
        &a,
        SendWr::rdma_write(3, vec![a.sge(0, 100)], b.addr(200), b.mr.rkey),
    );
    p.post_send(
        &a,
        SendWr::rdma_read(4, vec![a.sge(0, 100)], b.addr(0), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 4, DEADLINE).unwrap();
    assert_eq!(
        statuses(&sc),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::RemAccessErr),
            (3, WcStatus::WrFlushErr),
            (4, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(p.qp_state(&a), QpState::Err);
    assert!(
        p.mem(&b)
            .get(OWNER, b.addr(200), 100)
            .iter()
            .all(|&x| x == 0),
        "flushed WR 3 never ran"
    );
    assert!(
        p.engine(&b)
            .counters()
            .get(Counter::RespRemoteAccessNakSent)
            >= 1
    );
    // Posting after the error still completes, with a flush.
    p.post_send(
        &a,
        SendWr::rdma_write(5, vec![a.sge(0, 1)], b.addr(0), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(5, WcStatus::WrFlushErr)]);
}

#[test]
fn a_write_past_the_end_of_the_mr_is_a_remote_access_error() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let end = b.addr(b.len);
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 16)], end - 8, b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.mem(&b).get(OWNER, end - 8, 8), vec![0; 8]);
}

#[test]
fn a_read_from_an_mr_without_remote_read_is_a_remote_access_error() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let pd = b.pd;
    let local_only = p
        .engine(&b)
        .reg_mr(pd, OWNER, b.addr(0), 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    p.post_send(
        &a,
        SendWr::rdma_read(1, vec![a.sge(0, 16)], b.addr(0), local_only.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(1, WcStatus::RemAccessErr)]);
}

#[test]
fn a_write_to_an_mr_of_another_pd_is_a_remote_access_error() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let e = p.engine(&b);
    let other_pd = e.alloc_pd().unwrap();
    let foreign = e
        .reg_mr(
            other_pd,
            OWNER,
            b.addr(0),
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 16)], b.addr(0), foreign.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(1, WcStatus::RemAccessErr)]);
}

#[test]
fn a_bad_lkey_completes_with_local_protection_error() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let bad = Sge::new(a.addr(0), 64, engine::Lkey::new(a.mr.lkey.value() ^ 0x33));
    p.post_send(&a, SendWr::rdma_write(1, vec![bad], b.addr(0), b.mr.rkey));
    p.post_send(
        &a,
        SendWr::rdma_write(2, vec![a.sge(0, 8)], b.addr(0), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 2, DEADLINE).unwrap();
    assert_eq!(
        statuses(&sc),
        vec![(1, WcStatus::LocProtErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.qp_state(&a), QpState::Err);
}

#[test]
fn a_local_sge_past_the_end_of_its_mr_is_a_local_protection_error() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let sge = a.sge(a.len - 10, 20);
    p.post_send(&a, SendWr::send(1, vec![sge]));
    p.post_recv(&b, RecvWr::new(9, vec![b.sge(0, 64)]));
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(1, WcStatus::LocProtErr)]);
}

#[test]
fn a_receive_too_small_for_the_send_fails_both_sides() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.post_recv(&b, RecvWr::new(1, vec![b.sge(0, 100)]));
    p.post_recv(&b, RecvWr::new(2, vec![b.sge(100, 100)]));
    p.post_send(&a, SendWr::send(10, vec![a.sge(0, 3000)]));
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(10, WcStatus::RemInvReqErr)]);
    let rc = p.wait_cq(&b, b.recv_cq, 2, DEADLINE).unwrap();
    assert_eq!(
        statuses(&rc),
        vec![(1, WcStatus::LocLenErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(p.qp_state(&b), QpState::Err);
}

#[test]
fn moving_a_qp_to_error_flushes_its_receives_in_order() {
    let mut p = Pair::new(PairConfig::default());
    let b = p.b;
    for i in 0..5 {
        p.post_recv(&b, RecvWr::new(i, vec![b.sge(i * 64, 64)]));
    }
    let qpn = b.qpn;
    p.engine(&b)
        .modify_qp(
            qpn,
            &QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let rc = p.poll(&b, b.recv_cq);
    assert_eq!(
        statuses(&rc),
        (0..5)
            .map(|i| (i, WcStatus::WrFlushErr))
            .collect::<Vec<_>>()
    );
}

#[test]
fn post_send_before_rts_is_refused_by_the_verb() {
    let mut p = Pair::new(PairConfig::default());
    let a = p.a;
    let qpn = a.qpn;
    let e = p.engine(&a);
    e.modify_qp(
        qpn,
        &QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    let r = e.post_send(qpn, SendWr::send(1, vec![]));
    assert!(r.is_err(), "{r:?}");
}

#[test]
fn a_full_send_queue_refuses_more_work_requests() {
    let cfg = PairConfig {
        depth: 4,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    p.sim.partition(a.node, b.node); // nothing completes, so nothing frees a slot
    for i in 0..4 {
        p.post_send(
            &a,
            SendWr::rdma_write(i, vec![a.sge(0, 8)], b.addr(0), b.mr.rkey),
        );
    }
    let qpn = a.qpn;
    let r = p.engine(&a).post_send(
        qpn,
        SendWr::rdma_write(4, vec![a.sge(0, 8)], b.addr(0), b.mr.rkey),
    );
    assert_eq!(r, Err(engine::VerbsError::QueueFull));
}

#[test]
fn a_cq_overflow_raises_an_async_error_and_errors_the_qp() {
    let cfg = PairConfig {
        cq_depth: 4,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    for i in 0..8 {
        p.post_send(
            &a,
            SendWr::rdma_write(i, vec![a.sge(0, 8)], b.addr(0), b.mr.rkey),
        );
    }
    let _ = p.sim.run_until(|_| false, DEADLINE);
    let events: Vec<_> = std::iter::from_fn(|| p.engine(&a).get_async_event()).collect();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, engine::AsyncEvent::CqErr { cq } if *cq == a.send_cq)),
        "{events:?}"
    );
    assert_eq!(p.qp_state(&a), QpState::Err);
}

#[test]
fn zero_length_rdma_does_not_check_the_rkey() {
    // IBA: the responder validates the R_Key only when the DMA length is not zero.
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.post_send(
        &a,
        SendWr::rdma_write(
            1,
            vec![],
            b.addr(0),
            engine::Rkey::new(b.mr.rkey.value() ^ 1),
        ),
    );
    p.post_send(
        &a,
        SendWr::rdma_read(
            2,
            vec![],
            b.addr(0),
            engine::Rkey::new(b.mr.rkey.value() ^ 1),
        ),
    );
    let sc = p.wait_cq(&a, a.send_cq, 2, DEADLINE).unwrap();
    assert_eq!(
        statuses(&sc),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(p.qp_state(&a), QpState::Rts);
}

#[test]
fn a_qp_in_error_can_be_reset_and_reconnected() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.post_send(
        &a,
        SendWr::rdma_write(
            1,
            vec![a.sge(0, 8)],
            b.addr(0),
            engine::Rkey::new(b.mr.rkey.value() ^ 1),
        ),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(statuses(&sc), vec![(1, WcStatus::RemAccessErr)]);
    assert_eq!(p.qp_state(&a), QpState::Err);
    let _ = p.sim.run_until(|_| false, p.sim.now() + DEADLINE);
    let _ = p.poll(&b, b.recv_cq);
    let _ = p.poll(&b, b.send_cq);

    p.reconnect(&a, &b, 0x12_3456);
    assert_eq!(
        (p.qp_state(&a), p.qp_state(&b)),
        (QpState::Rts, QpState::Rts)
    );
    let data = pattern(6, 5000);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    p.post_recv(&b, RecvWr::new(7, vec![b.sge(10_000, 5000)]));
    p.post_send(&a, SendWr::send(2, vec![a.sge(0, 5000)]));
    p.post_send(
        &a,
        SendWr::rdma_write(3, vec![a.sge(0, 5000)], b.addr(20_000), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 2, DEADLINE).unwrap();
    assert_eq!(
        statuses(&sc),
        vec![(2, WcStatus::Success), (3, WcStatus::Success)]
    );
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].byte_len),
        (7, WcStatus::Success, 5000)
    );
    assert_eq!(p.mem(&b).get(OWNER, b.addr(10_000), 5000), data);
    assert_eq!(p.mem(&b).get(OWNER, b.addr(20_000), 5000), data);
}

#[test]
fn a_receive_buffer_with_a_bad_lkey_fails_the_send_on_both_sides() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let bad = Sge::new(b.addr(0), 64, engine::Lkey::new(b.mr.lkey.value() ^ 1));
    p.post_recv(&b, RecvWr::new(1, vec![bad]));
    p.post_send(&a, SendWr::send(2, vec![a.sge(0, 32)]));
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert!(
        matches!(
            sc[0].status,
            WcStatus::RemAccessErr | WcStatus::RemOpErr | WcStatus::RemInvReqErr
        ),
        "requester saw {:?}",
        sc[0].status
    );
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert!(
        matches!(rc[0].status, WcStatus::LocProtErr | WcStatus::LocAccessErr),
        "responder saw {:?}",
        rc[0].status
    );
    assert_eq!(p.mem(&b).get(OWNER, b.addr(0), 64), vec![0; 64]);
}
