//! Memory windows and invalidation between two devices over real UDP on loopback: device A
//! reaches device B's memory through windows B binds, and loses the access when B unbinds,
//! rebinds or invalidates them (or A invalidates with its SEND). Every scenario runs on both
//! backends: two embedded devices, and two devices of a `softrdmad` in the test process.

#[macro_use]
mod common;

use common::{all_access, pair_v4_on, Side, WAIT};
use softrdma::{
    AccessFlags, Buffer, Error, MemoryRegion, MemoryWindow, MwType, RemoteMr, VerbsError, WcFlags,
    WcOpcode, WcStatus,
};

const LEN: usize = 8192;

/// A region windows can be bound to, without remote rights of its own: all remote access
/// to it goes through windows.
fn window_region(side: &Side) -> MemoryRegion<Buffer> {
    side.pd
        .register(
            Buffer::zeroed(LEN),
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        )
        .unwrap()
}

fn rw() -> AccessFlags {
    AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE
}

/// The completion of the next send-side work request of `side`.
fn next_status(side: &Side, opcode: WcOpcode) -> WcStatus {
    let wc = side.cq.wait_one(WAIT).unwrap();
    assert_eq!(wc.opcode, opcode, "{wc:?}");
    wc.status
}

/// A writes `data` (staged at offset 0 of its region) to `remote`; the write's status.
fn write_from_a(a: &Side, data: &[u8], remote: &RemoteMr) -> WcStatus {
    a.mr.write(0, data).unwrap();
    a.qp.write(7, &[a.mr.sge(..data.len()).unwrap()], remote)
        .unwrap();
    next_status(a, WcOpcode::RdmaWrite)
}

/// A reads `len` bytes of `remote` into offset 4096 of its region; the read's status.
fn read_into_a(a: &Side, len: usize, remote: &RemoteMr) -> WcStatus {
    a.qp.read(8, &[a.mr.sge(4096..4096 + len).unwrap()], remote)
        .unwrap();
    next_status(a, WcOpcode::RdmaRead)
}

fn bytes(mr: &MemoryRegion<Buffer>, offset: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    mr.read(offset, &mut v).unwrap();
    v
}

/// Bind a type 1 window of B over `range` of `mr` and wait for the bind to complete.
fn bind_type1(
    b: &Side,
    mr: &MemoryRegion<Buffer>,
    range: std::ops::Range<usize>,
    access: AccessFlags,
) -> (MemoryWindow, RemoteMr) {
    let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
    let remote = b.qp.bind_mw(1, &mw, mr, range, access).unwrap();
    let wc = b.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.opcode, WcOpcode::BindMw);
    (mw, remote)
}

/// Bind a type 2 window of B over `range` of `mr` with a bind WR and wait for it.
fn bind_type2(
    b: &Side,
    mw: &MemoryWindow,
    mr: &MemoryRegion<Buffer>,
    range: std::ops::Range<usize>,
) -> RemoteMr {
    let remote = b.qp.post_bind_mw(2, mw, mr, range, rw()).unwrap();
    let wc = b.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.opcode, WcOpcode::BindMw);
    remote
}

on_both_backends! {
    fn type1_window_gives_write_and_read_access_within_its_range(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let (mw, remote) = bind_type1(&b, &mr, 1024..2048, rw());
        assert_eq!(remote.addr, mr.addr() + 1024);
        assert_eq!(remote.len, 1024);
        assert_ne!(remote.rkey, mr.rkey(), "the window has its own key");
        assert_eq!(mw.rkey().unwrap(), remote.rkey);
        assert!(mw.is_bound().unwrap());

        let data: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(write_from_a(&a, &data, &remote), WcStatus::Success);
        assert_eq!(
            bytes(&mr, 1024, 1024),
            data,
            "the write landed in the window"
        );
        assert!(bytes(&mr, 0, 1024).iter().all(|&x| x == 0));
        assert!(bytes(&mr, 2048, LEN - 2048).iter().all(|&x| x == 0));

        mr.write(1500, b"read me through the window").unwrap();
        let part = remote.offset(476).unwrap();
        assert_eq!(read_into_a(&a, 26, &part), WcStatus::Success);
        assert_eq!(bytes(&a.mr, 4096, 26), b"read me through the window");
    }
}

on_both_backends! {
    fn type1_window_write_past_its_end_fails_with_rem_access_err(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let (_mw, remote) = bind_type1(&b, &mr, 1024..2048, rw());
        // 16 bytes starting 8 before the end: half inside, half outside.
        let tail = remote.offset(1016).unwrap();
        let tail = RemoteMr { len: 16, ..tail };
        assert_eq!(write_from_a(&a, &[0xab; 16], &tail), WcStatus::RemAccessErr);
        assert!(
            mr.to_vec().iter().all(|&x| x == 0),
            "nothing of a refused write lands"
        );
    }
}

on_both_backends! {
    fn type1_window_read_before_its_start_fails_with_rem_access_err(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        mr.write(1000, &[0x5a; 48]).unwrap();
        let (_mw, remote) = bind_type1(&b, &mr, 1024..2048, rw());
        let before = RemoteMr {
            addr: remote.addr - 24,
            len: 48,
            rkey: remote.rkey,
        };
        assert_eq!(read_into_a(&a, 48, &before), WcStatus::RemAccessErr);
        assert!(bytes(&a.mr, 4096, 48).iter().all(|&x| x == 0));
    }
}

on_both_backends! {
    fn type1_window_refuses_a_right_it_was_not_given(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        mr.write(0, b"readable").unwrap();
        let (_mw, remote) = bind_type1(&b, &mr, 0..1024, AccessFlags::REMOTE_READ);
        assert_eq!(read_into_a(&a, 8, &remote), WcStatus::Success);
        assert_eq!(bytes(&a.mr, 4096, 8), b"readable");
        assert_eq!(
            write_from_a(&a, b"written!", &remote),
            WcStatus::RemAccessErr
        );
        assert_eq!(bytes(&mr, 0, 8), b"readable");
    }
}

on_both_backends! {
    fn type1_rebind_moves_the_window_and_retires_the_old_rkey(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let (mw, first) = bind_type1(&b, &mr, 0..1024, rw());
        assert_eq!(write_from_a(&a, b"first", &first), WcStatus::Success);

        let second = b.qp.bind_mw(3, &mw, &mr, 4096..5120, rw()).unwrap();
        assert_eq!(b.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::BindMw);
        assert_ne!(second.rkey, first.rkey, "every bind changes the key");
        assert_eq!(mw.rkey().unwrap(), second.rkey);
        assert_eq!(write_from_a(&a, b"second", &second), WcStatus::Success);
        assert_eq!(bytes(&mr, 0, 5), b"first");
        assert_eq!(bytes(&mr, 4096, 6), b"second");

        assert_eq!(write_from_a(&a, b"stale", &first), WcStatus::RemAccessErr);
        assert_eq!(bytes(&mr, 0, 5), b"first");
    }
}

on_both_backends! {
    fn type1_unbind_stops_remote_access(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let (mw, remote) = bind_type1(&b, &mr, 0..1024, rw());
        b.qp.unbind_mw(4, &mw).unwrap();
        assert_eq!(b.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::BindMw);
        assert!(!mw.is_bound().unwrap());
        assert_eq!(write_from_a(&a, b"late", &remote), WcStatus::RemAccessErr);
        assert!(mr.to_vec().iter().all(|&x| x == 0));
    }
}

on_both_backends! {
    fn type2_bind_wr_gives_a_new_rkey_that_reaches_the_range(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        assert_eq!(mw.mw_type(), MwType::Type2);
        let allocated = mw.rkey().unwrap();
        assert!(!mw.is_bound().unwrap());

        let remote = bind_type2(&b, &mw, &mr, 2048..3072);
        assert_ne!(remote.rkey, allocated, "a bind WR changes the key");
        assert_eq!(
            remote.rkey.value() & !0xff,
            allocated.value() & !0xff,
            "only the tag (low byte) changes"
        );
        assert_eq!(mw.rkey().unwrap(), remote.rkey);
        assert!(mw.is_bound().unwrap());

        assert_eq!(write_from_a(&a, b"type two", &remote), WcStatus::Success);
        assert_eq!(bytes(&mr, 2048, 8), b"type two");
        assert_eq!(read_into_a(&a, 8, &remote), WcStatus::Success);
        assert_eq!(bytes(&a.mr, 4096, 8), b"type two");
    }
}

on_both_backends! {
    fn type2_rebind_after_local_inv_rejects_the_old_rkey(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let first = bind_type2(&b, &mw, &mr, 0..1024);
        assert_eq!(write_from_a(&a, b"one", &first), WcStatus::Success);

        b.qp.local_inv(5, first.rkey).unwrap();
        assert_eq!(b.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::LocalInv);
        let second = bind_type2(&b, &mw, &mr, 0..1024);
        assert_ne!(second.rkey, first.rkey);
        assert_eq!(write_from_a(&a, b"two", &second), WcStatus::Success);
        assert_eq!(bytes(&mr, 0, 3), b"two");

        // Same window, same range: only the key differs, and the old one is dead.
        assert_eq!(write_from_a(&a, b"old", &first), WcStatus::RemAccessErr);
        assert_eq!(bytes(&mr, 0, 3), b"two");
    }
}

on_both_backends! {
    fn type2_window_bound_twice_without_invalidation_fails_with_mw_bind_err(backend: BackendKind) {
        let (_a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let first = bind_type2(&b, &mw, &mr, 0..1024);
        b.qp.post_bind_mw(6, &mw, &mr, 1024..2048, rw()).unwrap();
        assert_eq!(next_status(&b, WcOpcode::BindMw), WcStatus::MwBindErr);
        assert_eq!(mw.rkey().unwrap(), first.rkey, "the first binding stands");
    }
}

on_both_backends! {
    fn write_after_local_inv_of_a_type2_window_fails(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let remote = bind_type2(&b, &mw, &mr, 0..1024);
        b.qp.local_inv(5, remote.rkey).unwrap();
        let wc = b.cq.wait_ok(WAIT).unwrap();
        assert_eq!(wc.opcode, WcOpcode::LocalInv);
        assert!(!mw.is_bound().unwrap());
        assert_eq!(
            write_from_a(&a, b"too late", &remote),
            WcStatus::RemAccessErr
        );
        assert!(mr.to_vec().iter().all(|&x| x == 0));
    }
}

on_both_backends! {
    fn read_after_send_with_inv_of_a_type2_window_fails(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        mr.write(0, b"secret").unwrap();
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let remote = bind_type2(&b, &mw, &mr, 0..1024);
        assert_eq!(read_into_a(&a, 6, &remote), WcStatus::Success);
        assert_eq!(bytes(&a.mr, 4096, 6), b"secret");

        b.qp.recv(9, &[b.mr.sge(0..64).unwrap()]).unwrap();
        a.mr.write(0, b"done").unwrap();
        a.qp.send_with_inv(10, &[a.mr.sge(0..4).unwrap()], remote.rkey)
            .unwrap();
        assert_eq!(a.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::Send);
        let wc = b.cq.wait_ok(WAIT).unwrap();
        assert_eq!(wc.opcode, WcOpcode::Recv);
        assert!(wc.wc_flags.contains(WcFlags::WITH_INV));
        assert_eq!(wc.invalidated_rkey, remote.rkey);
        assert_eq!(bytes(&b.mr, 0, 4), b"done");
        assert!(!mw.is_bound().unwrap());

        a.mr.write(4096, &[0; 6]).unwrap();
        assert_eq!(read_into_a(&a, 6, &remote), WcStatus::RemAccessErr);
        assert!(bytes(&a.mr, 4096, 6).iter().all(|&x| x == 0));
    }
}

on_both_backends! {
    fn local_inv_of_a_region_rkey_stops_remote_access(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let remote = b.mr.remote(..).unwrap();
        assert_eq!(write_from_a(&a, b"before", &remote), WcStatus::Success);
        b.qp.local_inv(5, b.mr.rkey()).unwrap();
        assert_eq!(b.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::LocalInv);
        assert_eq!(write_from_a(&a, b"after!", &remote), WcStatus::RemAccessErr);
        assert_eq!(bytes(&b.mr, 0, 6), b"before");
    }
}

on_both_backends! {
    fn send_with_inv_of_a_region_rkey_stops_remote_access(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        // A region of B only the peer's invalidation will close; B receives into its own.
        let target = b.pd.register(Buffer::zeroed(LEN), all_access()).unwrap();
        let remote = target.remote(..).unwrap();
        assert_eq!(write_from_a(&a, b"open", &remote), WcStatus::Success);
        b.qp.recv(9, &[b.mr.sge(0..64).unwrap()]).unwrap();
        a.qp.send_with_inv(10, &[], remote.rkey).unwrap();
        a.cq.wait_ok(WAIT).unwrap();
        let wc = b.cq.wait_ok(WAIT).unwrap();
        assert!(wc.wc_flags.contains(WcFlags::WITH_INV));
        assert_eq!(wc.invalidated_rkey, remote.rkey);
        assert_eq!(write_from_a(&a, b"shut", &remote), WcStatus::RemAccessErr);
        assert_eq!(bytes(&target, 0, 4), b"open");
    }
}

on_both_backends! {
    fn local_inv_of_a_type1_window_fails_with_mw_bind_err(backend: BackendKind) {
        let (_a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let (mw, remote) = bind_type1(&b, &mr, 0..1024, rw());
        b.qp.local_inv(5, remote.rkey).unwrap();
        assert_eq!(next_status(&b, WcOpcode::LocalInv), WcStatus::MwBindErr);
        // IBA 10.6.7.2.1: only a bind moves or closes a type 1 window.
        assert!(mw.is_bound().unwrap());
    }
}

on_both_backends! {
    fn binding_to_a_region_without_mw_bind_fails_with_mw_bind_err(backend: BackendKind) {
        let (_a, b) = pair_v4_on(backend, LEN);
        // Every remote right, but not MW_BIND.
        let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
        b.qp.bind_mw(1, &mw, &b.mr, 0..1024, rw()).unwrap();
        assert_eq!(next_status(&b, WcOpcode::BindMw), WcStatus::MwBindErr);
        assert!(!mw.is_bound().unwrap());
    }
}

on_both_backends! {
    fn type2_bind_to_a_region_without_mw_bind_fails_with_mw_bind_err(backend: BackendKind) {
        let (_a, b) = pair_v4_on(backend, LEN);
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        b.qp.post_bind_mw(1, &mw, &b.mr, 0..1024, rw()).unwrap();
        assert_eq!(next_status(&b, WcOpcode::BindMw), WcStatus::MwBindErr);
        assert!(!mw.is_bound().unwrap());
    }
}

on_both_backends! {
    fn remote_write_right_on_a_region_without_local_write_fails_with_mw_bind_err(backend: BackendKind) {
        let (_a, b) = pair_v4_on(backend, LEN);
        let mr =
            b.pd.register(Buffer::zeroed(LEN), AccessFlags::MW_BIND)
                .unwrap();
        let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
        b.qp.bind_mw(1, &mw, &mr, 0..1024, AccessFlags::REMOTE_WRITE)
            .unwrap();
        assert_eq!(next_status(&b, WcOpcode::BindMw), WcStatus::MwBindErr);
    }
}

on_both_backends! {
    fn binding_a_window_of_another_pd_fails_with_mw_bind_err(backend: BackendKind) {
        let (_a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let other = b.dev.alloc_pd().unwrap();
        let mw = other.alloc_mw(MwType::Type1).unwrap();
        b.qp.bind_mw(1, &mw, &mr, 0..1024, rw()).unwrap();
        assert_eq!(next_status(&b, WcOpcode::BindMw), WcStatus::MwBindErr);
        assert!(!mw.is_bound().unwrap());
    }
}

on_both_backends! {
    fn binding_to_a_region_of_another_pd_fails_with_mw_bind_err(backend: BackendKind) {
        let (_a, b) = pair_v4_on(backend, LEN);
        let other = b.dev.alloc_pd().unwrap();
        let mr = other
            .register(
                Buffer::zeroed(LEN),
                AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
            )
            .unwrap();
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        b.qp.post_bind_mw(1, &mw, &mr, 0..1024, rw()).unwrap();
        assert_eq!(next_status(&b, WcOpcode::BindMw), WcStatus::MwBindErr);
        assert!(!mw.is_bound().unwrap());
    }
}

on_both_backends! {
    fn a_range_outside_the_region_is_refused_before_anything_is_posted(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let mw = b.pd.alloc_mw(MwType::Type1).unwrap();
        let r = b.qp.bind_mw(1, &mw, &mr, LEN - 8..LEN + 8, rw());
        assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{r:?}");
        assert!(b.cq.poll_one().unwrap().is_none());
        // The QP is untouched: a good bind still works.
        let remote = b.qp.bind_mw(2, &mw, &mr, LEN - 8..LEN, rw()).unwrap();
        b.cq.wait_ok(WAIT).unwrap();
        assert_eq!(write_from_a(&a, b"last8by", &remote), WcStatus::Success);
        assert_eq!(bytes(&mr, LEN - 8, 7), b"last8by");
    }
}

on_both_backends! {
    fn each_bind_call_accepts_only_its_window_type(backend: BackendKind) {
        let (_a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let t1 = b.pd.alloc_mw(MwType::Type1).unwrap();
        let t2 = b.pd.alloc_mw(MwType::Type2).unwrap();
        let r = b.qp.bind_mw(1, &t2, &mr, 0..64, rw());
        assert!(
            matches!(r, Err(Error::Verbs(VerbsError::InvalidMw))),
            "{r:?}"
        );
        let r = b.qp.post_bind_mw(1, &t1, &mr, 0..64, rw());
        assert!(
            matches!(r, Err(Error::Verbs(VerbsError::InvalidMw))),
            "{r:?}"
        );
        assert!(b.cq.poll_one().unwrap().is_none());
    }
}

on_both_backends! {
    fn type2_window_serves_only_the_qp_that_bound_it(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        // A second connected QP pair between the same devices and PDs.
        let a2 = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
        let b2 = b.pd.qp_builder(&b.cq, &b.cq).build().unwrap();
        a2.connect(&b2.endpoint(None).unwrap()).unwrap();
        b2.connect(&a2.endpoint(None).unwrap()).unwrap();

        let mr = window_region(&b);
        let mw = b.pd.alloc_mw(MwType::Type2).unwrap();
        let remote = bind_type2(&b, &mw, &mr, 0..1024); // bound on b.qp
        a.mr.write(0, b"via qp2").unwrap();
        a2.write(11, &[a.mr.sge(0..7).unwrap()], &remote).unwrap();
        assert_eq!(next_status(&a, WcOpcode::RdmaWrite), WcStatus::RemAccessErr);
        assert!(mr.to_vec().iter().all(|&x| x == 0));
        // The QP it was bound on still gets through.
        assert_eq!(write_from_a(&a, b"via qp1", &remote), WcStatus::Success);
        assert_eq!(bytes(&mr, 0, 7), b"via qp1");
    }
}

on_both_backends! {
    fn dropping_the_region_under_a_window_closes_the_window(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let (mw, remote) = bind_type1(&b, &mr, 0..1024, rw());
        assert_eq!(write_from_a(&a, b"alive", &remote), WcStatus::Success);
        let buf = mr.into_inner(); // deregistered: the device may never touch it again
        assert_eq!(write_from_a(&a, b"freed", &remote), WcStatus::RemAccessErr);
        assert_eq!(&buf.as_slice()[..5], b"alive");
        drop(mw);
    }
}

on_both_backends! {
    fn a_deallocated_window_rkey_is_refused(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        let (mw, remote) = bind_type1(&b, &mr, 0..1024, rw());
        drop(mw);
        assert_eq!(write_from_a(&a, b"gone", &remote), WcStatus::RemAccessErr);
        assert!(mr.to_vec().iter().all(|&x| x == 0));
    }
}

on_both_backends! {
    fn a_window_or_region_of_another_device_is_refused_before_anything_is_posted(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let a_mr = window_region(&a);
        let b_mr = window_region(&b);
        let a_mw = a.pd.alloc_mw(MwType::Type1).unwrap();
        let b_mw = b.pd.alloc_mw(MwType::Type1).unwrap();
        let r = b.qp.bind_mw(1, &a_mw, &b_mr, 0..64, rw());
        assert!(
            matches!(r, Err(Error::Verbs(VerbsError::InvalidMw))),
            "{r:?}"
        );
        let r = b.qp.bind_mw(1, &b_mw, &a_mr, 0..64, rw());
        assert!(
            matches!(r, Err(Error::Verbs(VerbsError::InvalidMr))),
            "{r:?}"
        );
        let a_mw2 = a.pd.alloc_mw(MwType::Type2).unwrap();
        let r = b.qp.post_bind_mw(1, &a_mw2, &b_mr, 0..64, rw());
        assert!(
            matches!(r, Err(Error::Verbs(VerbsError::InvalidMw))),
            "{r:?}"
        );
        assert!(b.cq.poll_one().unwrap().is_none());
        assert!(!b_mw.is_bound().unwrap());
        assert!(!a_mw.is_bound().unwrap());
    }
}

on_both_backends! {
    fn atomics_go_through_a_window_that_allows_them(backend: BackendKind) {
        let (a, b) = pair_v4_on(backend, LEN);
        let mr = window_region(&b);
        mr.write_u64(128, 40).unwrap();
        let (_mw, remote) = bind_type1(&b, &mr, 0..1024, AccessFlags::REMOTE_ATOMIC);
        let word = RemoteMr {
            addr: remote.addr + 128,
            len: 8,
            rkey: remote.rkey,
        };
        a.qp.fetch_add(12, a.mr.sge(0..8).unwrap(), &word, 2)
            .unwrap();
        assert_eq!(a.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::FetchAdd);
        assert_eq!(a.mr.read_u64(0).unwrap(), 40);
        assert_eq!(mr.read_u64(128).unwrap(), 42);
    }
}

#[test]
fn memory_windows_can_be_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<MemoryWindow>();
}
