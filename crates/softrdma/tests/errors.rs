//! One failure, one error, whichever backend: the embedded engine and the daemon refuse the
//! same verb with the same [`softrdma::Error`] variant and the same errno (what the drop-in
//! `libibverbs.so.1` hands its callers). A refusal the daemon sends for one of its engine's
//! verbs errors comes back as that [`VerbsError`]; one that carries a reason (`Busy`...)
//! keeps the daemon's form, with the same errno.

#[macro_use]
mod common;

use common::{all_access, connect, open_on, open_pair_on, Side, WAIT};
use softrdma::raw::QpHandle;
use softrdma::{Buffer, Error, QpAttr, QpAttrMask, QpState, SendWr, VerbsError};

const ENOMEM: i32 = 12;
const EBUSY: i32 = 16;
const EINVAL: i32 = 22;

/// `r` failed with verbs error `want`, and so with its errno.
fn assert_verbs<T: std::fmt::Debug>(r: softrdma::Result<T>, want: VerbsError) {
    let e = r.unwrap_err();
    assert!(matches!(&e, Error::Verbs(v) if *v == want), "{e:?}");
    assert_eq!(e.errno(), want.errno(), "{e}");
}

on_both_backends! {
    fn a_full_receive_queue_is_queue_full_and_enomem(backend: BackendKind) {
        let dev = open_on(backend, "127.0.0.1");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).max_recv_wr(2).build().unwrap();
        let mr = pd.register(Buffer::zeroed(64), all_access()).unwrap();
        for i in 0..2 {
            qp.recv(i, &[mr.sge(..).unwrap()]).unwrap();
        }
        assert_verbs(qp.recv(2, &[mr.sge(..).unwrap()]), VerbsError::QueueFull);
        assert_eq!(VerbsError::QueueFull.errno(), ENOMEM);
    }

    fn a_full_shared_receive_queue_is_queue_full_and_enomem(backend: BackendKind) {
        let dev = open_on(backend, "127.0.0.1");
        let pd = dev.alloc_pd().unwrap();
        // Not a power of two: the daemon's ring for it has room for one WR more.
        let srq = pd.create_srq(3, 1).unwrap();
        let mr = pd.register(Buffer::zeroed(64), all_access()).unwrap();
        for i in 0..3 {
            srq.recv(i, &[mr.sge(..).unwrap()]).unwrap();
        }
        assert_verbs(srq.recv(3, &[mr.sge(..).unwrap()]), VerbsError::QueueFull);
        assert_eq!(srq.len().unwrap(), 3);
    }

    fn a_polled_receive_frees_its_slot_of_a_full_shared_receive_queue(backend: BackendKind) {
        let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        let (ca, cb) = (da.create_cq(16).unwrap(), db.create_cq(16).unwrap());
        let srq = pb.create_srq(2, 1).unwrap();
        let a = Side {
            qp: pa.qp_builder(&ca, &ca).build().unwrap(),
            mr: pa.register(Buffer::zeroed(64), all_access()).unwrap(),
            dev: da,
            pd: pa,
            cq: ca,
        };
        let b = Side {
            qp: pb.qp_builder(&cb, &cb).srq(&srq).build().unwrap(),
            mr: pb.register(Buffer::zeroed(64), all_access()).unwrap(),
            dev: db,
            pd: pb,
            cq: cb,
        };
        connect(&a, &b);
        for i in 0..2 {
            srq.recv(i, &[b.mr.sge(..).unwrap()]).unwrap();
        }
        assert_verbs(srq.recv(2, &[b.mr.sge(..).unwrap()]), VerbsError::QueueFull);
        a.qp.send(10, &[a.mr.sge(..8).unwrap()]).unwrap();
        a.cq.wait_ok(WAIT).unwrap();
        assert_eq!(b.cq.wait_ok(WAIT).unwrap().wr_id, 0);
        srq.recv(3, &[b.mr.sge(..).unwrap()]).unwrap();
        assert_verbs(srq.recv(4, &[b.mr.sge(..).unwrap()]), VerbsError::QueueFull);
    }

    fn more_sges_than_the_qp_takes_are_too_many_sges(backend: BackendKind) {
        let dev = open_on(backend, "127.0.0.1");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).max_recv_sge(2).build().unwrap();
        let granted = qp.query().unwrap().cap.max_recv_sge;
        let mr = pd.register(Buffer::zeroed(64), all_access()).unwrap();
        let sges = vec![mr.sge(..8).unwrap(); granted as usize + 1];
        let want = VerbsError::TooManySge {
            sges: sges.len(),
            max: granted,
        };
        assert_verbs(qp.recv(1, &sges), want);
    }

    fn a_send_before_rts_is_refused_for_the_qp_state(backend: BackendKind) {
        let dev = open_on(backend, "127.0.0.1");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).build().unwrap();
        let mr = pd.register(Buffer::zeroed(64), all_access()).unwrap();
        let r = qp.post_send(SendWr::send(1, vec![mr.sge(..8).unwrap()]));
        assert_verbs(r, VerbsError::InvalidState(QpState::Init));
        assert_eq!(VerbsError::InvalidState(QpState::Init).errno(), EINVAL);
    }

    fn a_transition_that_does_not_exist_is_refused_alike(backend: BackendKind) {
        let dev = open_on(backend, "127.0.0.1");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).build().unwrap();
        let attr = QpAttr {
            qp_state: QpState::Sqd,
            ..QpAttr::default()
        };
        let r = qp.modify(&attr, QpAttrMask::STATE);
        let want = VerbsError::Modify(softrdma::ModifyError::InvalidTransition {
            from: QpState::Init,
            to: QpState::Sqd,
        });
        assert_verbs(r, want);
    }

    fn a_receive_on_a_qp_fed_by_an_srq_is_not_supported(backend: BackendKind) {
        let dev = open_on(backend, "127.0.0.1");
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let srq = pd.create_srq(4, 1).unwrap();
        let qp = pd.qp_builder(&cq, &cq).srq(&srq).build().unwrap();
        let mr = pd.register(Buffer::zeroed(64), all_access()).unwrap();
        assert_verbs(qp.recv(1, &[mr.sge(..).unwrap()]), VerbsError::OpNotSupported);
    }

    fn a_pd_in_use_is_busy(backend: BackendKind) {
        let dev = open_on(backend, "127.0.0.1");
        let raw = dev.raw();
        let pd = raw.alloc_pd().unwrap();
        let cq = raw.create_cq(4).unwrap();
        let init = softrdma::raw::QpInitAttr {
            pd,
            send_cq: cq.handle(),
            recv_cq: cq.handle(),
            cap: softrdma::QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: softrdma::QpType::Rc,
            sq_sig_all: false,
        };
        let qp = raw.create_qp(&init, None).unwrap();
        let e = raw.dealloc_pd(pd).unwrap_err();
        assert_eq!(e.errno(), EBUSY, "{e}");
        raw.destroy_qp(qp.handle).unwrap();
        raw.destroy_cq(&cq).unwrap();
        raw.dealloc_pd(pd).unwrap();
    }

    fn a_qp_handle_that_names_nothing_is_einval(backend: BackendKind) {
        let dev = open_on(backend, "127.0.0.1");
        let e = dev.raw().query_qp(QpHandle(0xdead)).unwrap_err();
        assert_eq!(e.errno(), EINVAL, "{e}");
    }
}
