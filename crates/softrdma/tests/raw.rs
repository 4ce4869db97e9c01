//! The handle-level interface (`softrdma::raw`, what the drop-in libibverbs is built on):
//! two RC QPs made, connected and used with raw verbs only, on both backends.

#![allow(unsafe_code)]

mod common;

use std::time::{Duration, Instant};

use common::open_pair_on;
use softrdma::raw::{PdHandle, QpHandle, QpInitAttr, SrqHandle};
use softrdma::{
    AccessFlags, AhAttr, Device, QpAttr, QpAttrMask, QpCap, QpState, QpType, RawCq, RawMr, RawQp,
    RecvWr, SendOp, SendWr, Sge, SrqAttr, SrqAttrMask, WcOpcode, WcStatus, WorkCompletion,
};

/// One side: a PD, a CQ, an RC QP in RESET and a registered buffer, all raw.
struct Side {
    dev: Device,
    pd: PdHandle,
    cq: RawCq,
    qp: RawQp,
    mr: RawMr,
    buf: Box<[u8]>,
    /// `buf`'s address: the device writes there, so the test reaches it only through this.
    ptr: *mut u8,
}

impl Side {
    /// `len` bytes at `off`, after the completion of what wrote them.
    fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.buf.len());
        // SAFETY: in bounds of the live buffer; nothing writes it while the test reads.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len).to_vec() }
    }

    /// Store `data` at `off` while no operation names the range.
    fn put(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.buf.len());
        // SAFETY: in bounds of the live buffer; no posted operation reads it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
    }
}

fn side(dev: Device) -> Side {
    side_with_srq(dev, false).0
}

/// A side whose QP takes its receives from a new SRQ (of 16 WRs) if `srq`.
fn side_with_srq(dev: Device, srq: bool) -> (Side, Option<SrqHandle>) {
    let raw = dev.raw();
    assert_eq!(raw.kind(), dev.backend());
    let pd = raw.alloc_pd().unwrap();
    let srq = srq.then(|| {
        let attr = SrqAttr {
            max_wr: 16,
            max_sge: 1,
            srq_limit: 0,
        };
        raw.create_srq(pd, &attr).unwrap()
    });
    let cq = raw.create_cq(16).unwrap();
    let mut buf = vec![0u8; 4096].into_boxed_slice();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    // SAFETY: `buf` lives in the Side until after dereg_mr succeeds (see `close`), and the
    // test reads it only after the completion of the operation that wrote it.
    let ptr = buf.as_mut_ptr();
    let mr = unsafe { raw.reg_mr(pd, ptr, buf.len(), access) }.unwrap();
    let init = QpInitAttr {
        pd,
        send_cq: cq.handle(),
        recv_cq: cq.handle(),
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: true,
    };
    let qp = raw.create_qp(&init, srq).unwrap();
    assert_eq!(raw.query_qp(qp.handle).unwrap().qp_state, QpState::Reset);
    let s = Side {
        dev,
        pd,
        cq,
        qp,
        mr,
        buf,
        ptr,
    };
    (s, srq)
}

/// RESET -> INIT -> RTR -> RTS towards `peer`.
fn connect(s: &Side, peer: &Side) {
    let raw = s.dev.raw();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    raw.modify_qp(s.qp.handle, &init, mask).unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: s.dev.query_port().unwrap().active_mtu,
        dest_qp_num: peer.qp.qpn,
        rq_psn: 100,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: peer.dev.gid(0).unwrap().0,
            is_global: true,
            port_num: 1,
            hop_limit: 64,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    raw.modify_qp(s.qp.handle, &rtr, mask).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 100,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    raw.modify_qp(s.qp.handle, &rts, mask).unwrap();
    assert_eq!(raw.query_qp(s.qp.handle).unwrap().qp_state, QpState::Rts);
}

/// The next completion of `s`'s CQ, waiting on its event descriptor between polls.
fn next_completion(s: &Side) -> WorkCompletion {
    let raw = s.dev.raw();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(wc) = raw.poll_cq(&s.cq, 1).unwrap().pop() {
            return wc;
        }
        assert!(Instant::now() < deadline, "no completion");
        raw.wait_cq(&s.cq, Some(Duration::from_millis(100)))
            .unwrap();
    }
}

fn close(s: Side) {
    let raw = s.dev.raw();
    raw.destroy_qp(s.qp.handle).unwrap();
    raw.destroy_cq(&s.cq).unwrap();
    raw.dereg_mr(s.mr.handle).unwrap();
    raw.dealloc_pd(s.pd).unwrap();
    drop(s.buf);
}

/// Wait until the CQ's event descriptor has a notification, and consume it.
fn take_cq_event(cq: &RawCq) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cq.clear_event() {
        assert!(Instant::now() < deadline, "no CQ event");
        runtime::wait_readable(cq.event_fd(), Some(Duration::from_millis(100))).unwrap();
    }
}

on_both_backends! {
    fn raw_verbs_carry_a_send_and_an_rdma_write_and_signal_an_armed_cq(b: BackendKind) {
        let (da, db) = open_pair_on(b, "127.0.0.1", "127.0.0.2");
        let (a, bs) = (side(da), side(db));
        connect(&a, &bs);
        connect(&bs, &a);

        // SEND into a posted receive; the receiver's CQ was armed, so its descriptor fires.
        let rb = bs.dev.raw();
        let recv = RecvWr::new(7, vec![Sge::new(bs.ptr as u64, 64, bs.mr.lkey)]);
        rb.post_recv(bs.qp.handle, recv).unwrap();
        rb.arm_cq(&bs.cq, false).unwrap();
        a.put(0, b"hello raw");
        let ra = a.dev.raw();
        let send = SendWr::new(1, SendOp::Send, vec![Sge::new(a.ptr as u64, 9, a.mr.lkey)]);
        ra.post_send(a.qp.handle, send).unwrap();
        let wc = next_completion(&a);
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
        take_cq_event(&bs.cq);
        let wc = next_completion(&bs);
        assert_eq!((wc.wr_id, wc.status, wc.opcode), (7, WcStatus::Success, WcOpcode::Recv));
        assert_eq!(wc.byte_len, 9);
        assert_eq!(wc.qp_num, bs.qp.qpn);
        assert_eq!(bs.bytes(0, 9), b"hello raw");

        // RDMA WRITE to b's rkey, at offset 100.
        a.put(16, b"written");
        let write = SendWr::new(
            2,
            SendOp::RdmaWrite {
                remote_addr: bs.ptr as u64 + 100,
                rkey: bs.mr.rkey,
            },
            vec![Sge::new(a.ptr as u64 + 16, 7, a.mr.lkey)],
        );
        ra.post_send(a.qp.handle, write).unwrap();
        let wc = next_completion(&a);
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
        assert_eq!(bs.bytes(100, 7), b"written");
        assert_eq!(rb.cq_len(&bs.cq).unwrap(), 0);
        close(a);
        close(bs);
    }

    fn raw_verbs_refuse_stale_handles_with_an_error(b: BackendKind) {
        let (da, _db) = open_pair_on(b, "127.0.0.1", "127.0.0.2");
        let raw = da.raw();
        let pd = raw.alloc_pd().unwrap();
        raw.dealloc_pd(pd).unwrap();
        assert!(raw.dealloc_pd(pd).is_err());
        assert!(raw.query_qp(QpHandle(0xdead)).is_err());
        assert!(raw.destroy_qp(QpHandle(0xdead)).is_err());
        assert!(raw.async_event().unwrap().is_none());
    }

    fn an_srq_whose_limit_event_was_taken_can_be_destroyed(b: BackendKind) {
        let (da, db) = open_pair_on(b, "127.0.0.1", "127.0.0.2");
        let a = side(da);
        let (bs, srq) = side_with_srq(db, true);
        let srq = srq.unwrap();
        connect(&a, &bs);
        connect(&bs, &a);
        let rb = bs.dev.raw();
        for i in 0..4u64 {
            let sge = Sge::new(bs.ptr as u64 + i * 64, 64, bs.mr.lkey);
            rb.post_srq_recv(srq, RecvWr::new(i, vec![sge])).unwrap();
        }
        let limit = SrqAttr {
            srq_limit: 3,
            ..SrqAttr::default()
        };
        rb.modify_srq(srq, &limit, SrqAttrMask::LIMIT).unwrap();
        let ra = a.dev.raw();
        for i in 0..2u64 {
            let send = SendWr::new(i, SendOp::Send, vec![Sge::new(a.ptr as u64, 8, a.mr.lkey)]);
            ra.post_send(a.qp.handle, send).unwrap();
            assert_eq!(next_completion(&a).status, WcStatus::Success);
            assert_eq!(next_completion(&bs).status, WcStatus::Success);
        }
        rb.wait_async_event(Some(Duration::from_secs(10))).unwrap();
        let ev = rb.async_event().unwrap();
        assert!(matches!(ev, Some(softrdma::AsyncEvent::SrqLimitReached { .. })), "{ev:?}");
        // Taking the event acknowledged it (ibv_ack_async_event): nothing holds the SRQ.
        rb.destroy_qp(bs.qp.handle).unwrap();
        rb.destroy_srq(srq).unwrap();
        assert!(rb.query_srq(srq).is_err());
        close(a);
        rb.destroy_cq(&bs.cq).unwrap();
        rb.dereg_mr(bs.mr.handle).unwrap();
        rb.dealloc_pd(bs.pd).unwrap();
    }
}

/// A C program may close a device without destroying its CQs: the CQ it keeps must not keep
/// the device (here its engine, thread and UDP port) open.
#[test]
fn a_cq_left_behind_does_not_keep_its_closed_device_open() {
    let port = 20000 + ((std::process::id().wrapping_mul(23) + 7000) % 12000) as u16;
    let open = || {
        Device::builder("127.0.0.1".parse().unwrap())
            .backend(softrdma::BackendKind::Embedded)
            .port(port)
            .open()
            .expect("the port is free")
    };
    let dev = open();
    let cq = dev.raw().create_cq(4).unwrap();
    drop(dev);
    let again = open();
    drop((cq, again));
}
