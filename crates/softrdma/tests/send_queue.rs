//! The send queue holds `max_send_wr` work requests, as `ibv_post_send` enforces it: the one
//! too many fails with `ENOMEM` (`QueueFull`), and completions make room again. An unsignaled
//! WR holds its slot too, until a later signaled WR's completion says it is done.
//!
//! The sender's peer has no receive posted, so every SEND waits for it (RNR NAKs, retried
//! forever): the WRs stay outstanding for as long as the test wants, on both backends.

#[macro_use]
mod common;

use common::{all_access, connect, open_pair_on, Side, WAIT};
use softrdma::{Buffer, QpAttr, QpAttrMask, QpState, SendWr, Sge, VerbsError, WcStatus};

const DEPTH: u32 = 4;

/// A sender whose send queue holds [`DEPTH`] WRs, and a receiver with none posted.
fn pair(backend: softrdma::BackendKind) -> (Side, Side) {
    let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
    let side = |dev: softrdma::Device, max_send_wr: u32| {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let qp = pd
            .qp_builder(&cq, &cq)
            .max_send_wr(max_send_wr)
            .max_recv_wr(64)
            .build()
            .unwrap();
        let mr = pd.register(Buffer::zeroed(64), all_access()).unwrap();
        Side {
            dev,
            pd,
            cq,
            qp,
            mr,
        }
    };
    let (a, b) = (side(da, DEPTH), side(db, 64));
    connect(&a, &b);
    assert_eq!(a.qp.query().unwrap().cap.max_send_wr, DEPTH);
    (a, b)
}

fn send(s: &Side, wr_id: u64, signaled: bool) -> softrdma::Result<()> {
    s.qp.post_send(SendWr::send(wr_id, vec![s.mr.sge(..8).unwrap()]).signaled(signaled))
}

fn assert_full(s: &Side, wr_id: u64) {
    let e = send(s, wr_id, true).unwrap_err();
    assert!(
        matches!(e, softrdma::Error::Verbs(VerbsError::QueueFull)),
        "{e}"
    );
    assert_eq!(e.errno(), 12, "{e}");
}

/// Post `n` receives on `b` and take `n` successful completions on it.
fn receive(b: &Side, n: u64) {
    for i in 0..n {
        b.qp.recv(1000 + i, &[b.mr.sge(..).unwrap()]).unwrap();
    }
    for _ in 0..n {
        b.cq.wait_ok(WAIT).unwrap();
    }
}

/// RESET, then INIT as the QP builder leaves it (ready to connect again).
fn reset(s: &Side) {
    let attr = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    s.qp.modify(&attr, QpAttrMask::STATE).unwrap();
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: all_access(),
        ..QpAttr::default()
    };
    let mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    s.qp.modify(&attr, mask).unwrap();
}

on_both_backends! {
fn a_full_send_queue_refuses_one_more_until_a_completion_is_polled(backend: BackendKind) {
    let (a, b) = pair(backend);
    for i in 0..u64::from(DEPTH) {
        send(&a, i, true).unwrap();
    }
    assert_full(&a, 99);
    assert_full(&a, 99);
    // One receive lets the oldest SEND through; its polled completion frees one slot.
    receive(&b, 1);
    assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, 0);
    send(&a, 4, true).unwrap();
    assert_full(&a, 99);
    receive(&b, u64::from(DEPTH));
    for i in 1..=4 {
        assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, i);
    }
    // All done: the whole queue is free again.
    for i in 10..10 + u64::from(DEPTH) {
        send(&a, i, true).unwrap();
    }
    assert_full(&a, 99);
}

fn unsignaled_sends_hold_their_slots_until_a_later_signaled_completion(backend: BackendKind) {
    let (a, b) = pair(backend);
    // Three unsignaled and a signaled one: the queue is full all the same.
    for i in 0..3 {
        send(&a, i, false).unwrap();
    }
    send(&a, 3, true).unwrap();
    assert_full(&a, 99);
    receive(&b, 4);
    // The one completion stands for all four.
    let wc = a.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.wr_id, 3);
    for i in 10..10 + u64::from(DEPTH) {
        send(&a, i, i % 2 == 1).unwrap();
    }
    assert_full(&a, 99);
    receive(&b, 4);
    for i in [11, 13] {
        assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, i);
    }
    assert!(a.cq.poll(16).unwrap().is_empty());
}

fn an_erring_send_queue_takes_every_post_and_the_limit_returns_after_reset(
    backend: BackendKind
) {
    let (a, b) = pair(backend);
    // An unsignaled WR with a key the sender does not hold fails when executed: its error
    // completion comes all the same, the QP goes to ERR and the WRs behind it flush.
    let bad = a.mr.sge(..8).unwrap();
    let bad = Sge::new(bad.addr, bad.length, softrdma::Lkey::new(bad.lkey.value() ^ 0x5a5a_5a00));
    a.qp
        .post_send(SendWr::send(0, vec![bad]).signaled(false))
        .unwrap();
    send(&a, 1, false).unwrap();
    send(&a, 2, false).unwrap();
    let wc = a.cq.wait_one(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.status), (0, WcStatus::LocProtErr));
    for i in 1..3 {
        let wc = a.cq.wait_one(WAIT).unwrap();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::WrFlushErr));
    }
    // In ERR every post is taken and flushed, however many.
    for i in 10..10 + 2 * u64::from(DEPTH) {
        send(&a, i, i % 2 == 0).unwrap();
    }
    for i in 10..10 + 2 * u64::from(DEPTH) {
        let wc = a.cq.wait_one(WAIT).unwrap();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::WrFlushErr));
    }
    // Back in business: the queue holds DEPTH again.
    reset(&a);
    reset(&b);
    connect(&a, &b);
    for i in 20..20 + u64::from(DEPTH) {
        send(&a, i, true).unwrap();
    }
    assert_full(&a, 99);
    receive(&b, u64::from(DEPTH));
    for i in 20..20 + u64::from(DEPTH) {
        assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, i);
    }
}
}

/// On softrdmad a slot is free once the polled completion says so, as on hardware that
/// frees send queue entries when it reads the CQE (mlx5's way): unsignaled WRs that have long
/// been delivered still count until a later signaled completion is polled. (The embedded
/// engine, like Linux rxe, frees a slot as soon as its WR is acknowledged; both keep the
/// verbs contract the shared tests above check.)
#[test]
fn on_the_daemon_delivered_unsignaled_sends_count_until_a_signaled_completion_is_polled() {
    let (a, b) = pair(softrdma::BackendKind::Daemon);
    for i in 0..3 {
        send(&a, i, false).unwrap();
    }
    send(&a, 3, true).unwrap();
    // Two of them arrive (and complete silently at the sender).
    receive(&b, 2);
    assert_full(&a, 99);
    receive(&b, 2);
    assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, 3);
    for i in 10..10 + u64::from(DEPTH) {
        send(&a, i, true).unwrap();
    }
    assert_full(&a, 99);
}

on_both_backends! {
fn a_type_1_bind_takes_a_send_queue_slot_and_its_completion_retires_the_sends_before_it(
    backend: BackendKind
) {
    use softrdma::{AccessFlags, MwType, WcOpcode};
    let (a, b) = pair(backend);
    let mr = a
        .pd
        .register(Buffer::zeroed(4096), all_access() | AccessFlags::MW_BIND)
        .unwrap();
    let mw = a.pd.alloc_mw(MwType::Type1).unwrap();
    for i in 0..3 {
        send(&a, i, false).unwrap();
    }
    a.qp.bind_mw(3, &mw, &mr, 0..64, AccessFlags::REMOTE_WRITE)
        .unwrap();
    assert_full(&a, 99);
    let e = a
        .qp
        .bind_mw(4, &mw, &mr, 0..64, AccessFlags::REMOTE_WRITE)
        .unwrap_err();
    assert!(matches!(e, softrdma::Error::Verbs(VerbsError::QueueFull)), "{e}");
    receive(&b, 3);
    let wc = a.cq.wait_ok(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.opcode), (3, WcOpcode::BindMw));
    for i in 10..10 + u64::from(DEPTH) {
        send(&a, i, true).unwrap();
    }
    assert_full(&a, 99);
    receive(&b, u64::from(DEPTH));
    for i in 10..10 + u64::from(DEPTH) {
        assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, i);
    }
}
}
