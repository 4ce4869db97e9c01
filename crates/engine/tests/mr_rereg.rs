//! `rereg_mr` (`ibv_rereg_mr`) through the public API, two engines in the sim: a new
//! translation, new access rights and a new PD take effect for the keys the peer already
//! holds, and bad requests are refused without changing the region.

mod common;

use core::time::Duration;

use common::*;
use engine::{
    AccessFlags, MemOwner, MrKeys, MwBind, MwType, PathMtu, PdHandle, QpType, ReregFlags, SendWr,
    VerbsError, WcStatus,
};
use sim::{NetConfig, Sim};

const SECOND: Duration = Duration::from_secs(1);

struct W {
    sim: Sim<Host>,
    a: Host4,
    b: Host4,
}

fn setup(seed: u64) -> W {
    let mut sim = Sim::new(seed, NetConfig::default());
    let a = add_host4(&mut sim, 1, seed, 1 << 20);
    let b = add_host4(&mut sim, 2, seed, 1 << 20);
    W { sim, a, b }
}

impl W {
    /// A new connected RC pair (A's QP in A's PD, B's QP in `pd_b`).
    fn pair_in(&mut self, pd_b: PdHandle) -> (Qp4, Qp4) {
        let (a, b) = (self.a, self.b);
        let qa = new_qp4(self.ea(), a.pd, QpType::Rc, 64, None, None);
        let qb = new_qp4(self.eb(), pd_b, QpType::Rc, 64, None, None);
        connect4(
            self.ea(),
            QpType::Rc,
            qa.qpn,
            b.ip,
            qb.qpn,
            PathMtu::Mtu1024,
            0,
            0,
        );
        connect4(
            self.eb(),
            QpType::Rc,
            qb.qpn,
            a.ip,
            qa.qpn,
            PathMtu::Mtu1024,
            0,
            0,
        );
        (qa, qb)
    }

    fn ea(&mut self) -> &mut engine::Engine {
        &mut self.sim.node_mut(self.a.node).engine
    }

    fn eb(&mut self) -> &mut engine::Engine {
        &mut self.sim.node_mut(self.b.node).engine
    }

    /// Posts `wr` on `qp` of the host at `node` and returns the status of its completion.
    fn complete(&mut self, node: sim::NodeId, qp: Qp4, wr: SendWr) -> WcStatus {
        self.sim
            .node_mut(node)
            .engine
            .post_send(qp.qpn, wr)
            .expect("post_send");
        let wc = drain_cq(&mut self.sim, node, qp.send_cq, 1, SECOND);
        wc.first().map_or(WcStatus::GeneralErr, |w| w.status)
    }

    /// A writes `data` from its offset 0 to B's `addr` through `rkey` on `qa`.
    fn write(&mut self, qa: Qp4, addr: u64, rkey: engine::Rkey, data: &[u8]) -> WcStatus {
        let a = self.a;
        self.sim.node(a.node).mem.set(OWNER, a.addr(0), data);
        let wr = SendWr::rdma_write(1, vec![a.sge(0, data.len() as u32)], addr, rkey);
        self.complete(a.node, qa, wr)
    }

    /// `rereg_mr` of B's region.
    fn rereg_b(
        &mut self,
        flags: ReregFlags,
        pd: PdHandle,
        (owner, addr, length): (MemOwner, u64, u64),
        access: AccessFlags,
    ) -> Result<MrKeys, VerbsError> {
        let mr = self.b.mr.handle;
        self.eb()
            .rereg_mr(mr, flags, pd, owner, addr, length, access)
    }
}

/// No translation change: the arguments `rereg_mr` ignores without `CHANGE_TRANSLATION`.
const SAME: (MemOwner, u64, u64) = (MemOwner(0), 0, 0);

#[test]
fn after_a_new_translation_a_write_lands_in_the_new_range_and_the_old_range_is_refused() {
    let mut w = setup(1);
    let (qa, qb) = w.pair_in(w.b.pd);
    let (a, b) = (w.a, w.b);
    // New memory of another owner on B, far from the old range.
    let owner = MemOwner(2);
    let base = 0x5000_0000;
    w.sim.node(b.node).mem.add_region(owner, base, 1 << 16);
    let keys = w
        .rereg_b(
            ReregFlags::CHANGE_TRANSLATION,
            b.pd,
            (owner, base, 1 << 16),
            AccessFlags::empty(),
        )
        .unwrap();
    assert_eq!(keys, b.mr, "the handle and both keys stay");

    let data = pattern(1, 3000);
    assert_eq!(w.write(qa, base + 100, b.mr.rkey, &data), WcStatus::Success);
    let mb = w.sim.node(b.node).mem.clone();
    assert_eq!(mb.get(owner, base + 100, 3000), data);
    assert!(
        mb.get(OWNER, b.addr(100), 3000).iter().all(|&x| x == 0),
        "the old range is not written"
    );

    // The lkey follows the translation too: B sends from its new range.
    let back = engine::Sge::new(base + 100, 3000, b.mr.lkey);
    let wr = SendWr::rdma_write(2, vec![back], a.addr(0x8000), a.mr.rkey);
    assert_eq!(w.complete(b.node, qb, wr), WcStatus::Success);
    assert_eq!(
        w.sim.node(a.node).mem.get(OWNER, a.addr(0x8000), 3000),
        data
    );

    // The old range is outside the region now.
    assert_eq!(
        w.write(qa, b.addr(100), b.mr.rkey, &data),
        WcStatus::RemAccessErr
    );
}

#[test]
fn after_remote_write_is_taken_away_a_write_completes_with_remote_access_error() {
    let mut w = setup(2);
    let (qa, _) = w.pair_in(w.b.pd);
    let (a, b) = (w.a, w.b);
    let data = pattern(2, 64);
    assert_eq!(w.write(qa, b.addr(0), b.mr.rkey, &data), WcStatus::Success);
    w.rereg_b(
        ReregFlags::CHANGE_ACCESS,
        b.pd,
        SAME,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
    )
    .unwrap();
    // What the new rights allow still works.
    let rd = SendWr::rdma_read(3, vec![a.sge(0x1000, 64)], b.addr(0), b.mr.rkey);
    assert_eq!(w.complete(a.node, qa, rd), WcStatus::Success);
    assert_eq!(w.sim.node(a.node).mem.get(OWNER, a.addr(0x1000), 64), data);
    let other = pattern(3, 64);
    assert_eq!(
        w.write(qa, b.addr(0), b.mr.rkey, &other),
        WcStatus::RemAccessErr
    );
    assert_eq!(w.sim.node(b.node).mem.get(OWNER, b.addr(0), 64), data);
}

#[test]
fn after_a_new_pd_a_qp_of_the_old_pd_gets_a_protection_error() {
    let mut w = setup(3);
    let (qa_old, qb_old) = w.pair_in(w.b.pd);
    let new_pd = w.eb().alloc_pd().unwrap();
    let (qa_new, _) = w.pair_in(new_pd);
    let (a, b) = (w.a, w.b);
    w.rereg_b(ReregFlags::CHANGE_PD, new_pd, SAME, AccessFlags::empty())
        .unwrap();

    // A QP of the new PD reaches the region through the same rkey.
    let data = pattern(4, 128);
    assert_eq!(
        w.write(qa_new, b.addr(0), b.mr.rkey, &data),
        WcStatus::Success
    );
    assert_eq!(w.sim.node(b.node).mem.get(OWNER, b.addr(0), 128), data);

    // A QP of the old PD does not: remotely ...
    assert_eq!(
        w.write(qa_old, b.addr(0), b.mr.rkey, &pattern(5, 128)),
        WcStatus::RemAccessErr
    );
    assert_eq!(w.sim.node(b.node).mem.get(OWNER, b.addr(0), 128), data);

    // ... nor locally, through the lkey. (The remote error moved B's old QP to ERR; a new
    // QP of the old PD shows it.)
    let (_, qb_old2) = w.pair_in(b.pd);
    assert_ne!(qb_old2.qpn, qb_old.qpn);
    let wr = SendWr::rdma_write(4, vec![b.sge(0, 16)], a.addr(0), a.mr.rkey);
    assert_eq!(w.complete(b.node, qb_old2, wr), WcStatus::LocProtErr);
}

#[test]
fn a_pd_holding_a_reregistered_region_is_busy_until_the_region_leaves_it() {
    let mut w = setup(4);
    let b = w.b;
    let pd = w.eb().alloc_pd().unwrap();
    w.rereg_b(ReregFlags::CHANGE_PD, pd, SAME, AccessFlags::empty())
        .unwrap();
    assert_eq!(w.eb().dealloc_pd(pd).map_err(|e| e.errno()), Err(16));
    w.rereg_b(ReregFlags::CHANGE_PD, b.pd, SAME, AccessFlags::empty())
        .unwrap();
    assert_eq!(w.eb().dealloc_pd(pd), Ok(()));
}

#[test]
fn bad_flags_access_pd_length_and_bound_windows_are_refused_and_change_nothing() {
    let mut w = setup(5);
    let (qa, qb) = w.pair_in(w.b.pd);
    let b = w.b;
    let some_access = AccessFlags::LOCAL_WRITE;
    // (flags, pd, translation, access, the error)
    let refused = [
        // No flag: nothing to change (the kernel's EINVAL).
        (
            ReregFlags::empty(),
            b.pd,
            SAME,
            AccessFlags::empty(),
            VerbsError::InvalidFlags,
        ),
        // A bit ibv_rereg_mr_flags does not define.
        (
            ReregFlags::from_bits_retain(1 << 3),
            b.pd,
            SAME,
            AccessFlags::empty(),
            VerbsError::InvalidFlags,
        ),
        (
            ReregFlags::CHANGE_ACCESS | ReregFlags::from_bits_retain(1 << 8),
            b.pd,
            SAME,
            some_access,
            VerbsError::InvalidFlags,
        ),
        // Remote write without local write (IBA 10.6.3.1).
        (
            ReregFlags::CHANGE_ACCESS,
            b.pd,
            SAME,
            AccessFlags::REMOTE_WRITE,
            VerbsError::InvalidAccess,
        ),
        // Access flags without CHANGE_ACCESS (libibverbs refuses them).
        (
            ReregFlags::CHANGE_PD,
            b.pd,
            SAME,
            some_access,
            VerbsError::InvalidAccess,
        ),
        (
            ReregFlags::CHANGE_PD,
            PdHandle(999),
            SAME,
            AccessFlags::empty(),
            VerbsError::InvalidPd,
        ),
        (
            ReregFlags::CHANGE_TRANSLATION,
            b.pd,
            (OWNER, u64::MAX - 10, 100),
            AccessFlags::empty(),
            VerbsError::InvalidLength,
        ),
    ];
    for (flags, pd, translation, access, err) in refused {
        assert_eq!(
            w.rereg_b(flags, pd, translation, access),
            Err(err),
            "{flags:?} {access:?}"
        );
        assert_eq!(err.errno(), 22);
    }
    let bogus = engine::MrHandle(999);
    assert_eq!(
        w.eb().rereg_mr(
            bogus,
            ReregFlags::CHANGE_ACCESS,
            b.pd,
            SAME.0,
            0,
            0,
            some_access
        ),
        Err(VerbsError::InvalidMr)
    );

    // A type 1 window bound to the region: refused with EBUSY until it is unbound.
    let mw = w.eb().alloc_mw(b.pd, MwType::Type1).unwrap();
    let bind = MwBind {
        mr: b.mr.handle,
        addr: b.addr(0),
        length: 4096,
        access: AccessFlags::REMOTE_WRITE,
    };
    let window_rkey = w.eb().bind_mw(qb.qpn, 9, mw.handle, bind, true).unwrap();
    let wc = drain_cq(&mut w.sim, b.node, qb.send_cq, 1, SECOND);
    assert_eq!(wc[0].status, WcStatus::Success);
    let narrow = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let busy = w.rereg_b(ReregFlags::CHANGE_ACCESS, b.pd, SAME, narrow);
    assert_eq!(busy.map_err(|e| e.errno()), Err(16));

    // Nothing changed: the region and the window still take writes.
    let data = pattern(6, 32);
    assert_eq!(w.write(qa, b.addr(64), b.mr.rkey, &data), WcStatus::Success);
    assert_eq!(
        w.write(qa, b.addr(128), window_rkey, &data),
        WcStatus::Success
    );

    let unbind = MwBind { length: 0, ..bind };
    w.eb().bind_mw(qb.qpn, 10, mw.handle, unbind, true).unwrap();
    let wc = drain_cq(&mut w.sim, b.node, qb.send_cq, 1, SECOND);
    assert_eq!(wc[0].status, WcStatus::Success);
    let keys = w
        .rereg_b(ReregFlags::CHANGE_ACCESS, b.pd, SAME, narrow)
        .unwrap();
    assert_eq!(keys, b.mr);
    assert_eq!(
        w.write(qa, b.addr(64), b.mr.rkey, &data),
        WcStatus::RemAccessErr
    );
}
