//! Memory windows and invalidation in the simulator: type 1 (bind verb) and type 2 (bind
//! WR) windows, access through them checked for bounds, rights, PD and (type 2) QP, LOCAL_INV
//! and SEND_WITH_INV, use after invalidate, MR local invalidation, and MW_BIND_ERR cases.

mod common;

use core::time::Duration;

use common::*;
use engine::{
    AccessFlags, MwBind, MwType, PathMtu, QpState, QpType, RecvWr, SendOp, SendWr, WcFlags,
    WcOpcode, WcStatus,
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
    /// A new connected RC pair (A's QP, B's QP), in the hosts' main PDs or `pd_b` on B.
    fn pair_in(&mut self, pd_b: engine::PdHandle) -> (Qp4, Qp4) {
        let (a, b) = (self.a, self.b);
        let qa = new_qp4(
            &mut self.sim.node_mut(a.node).engine,
            a.pd,
            QpType::Rc,
            64,
            None,
            None,
        );
        let qb = new_qp4(
            &mut self.sim.node_mut(b.node).engine,
            pd_b,
            QpType::Rc,
            64,
            None,
            None,
        );
        let ea = &mut self.sim.node_mut(a.node).engine;
        connect4(ea, QpType::Rc, qa.qpn, b.ip, qb.qpn, PathMtu::Mtu1024, 0, 0);
        let eb = &mut self.sim.node_mut(b.node).engine;
        connect4(eb, QpType::Rc, qb.qpn, a.ip, qa.qpn, PathMtu::Mtu1024, 0, 0);
        (qa, qb)
    }

    fn pair(&mut self) -> (Qp4, Qp4) {
        self.pair_in(self.b.pd)
    }

    fn eb(&mut self) -> &mut engine::Engine {
        &mut self.sim.node_mut(self.b.node).engine
    }

    /// A writes 16 bytes at B's `addr` through `rkey` on `qa`; returns the status.
    fn write(&mut self, qa: Qp4, addr: u64, len: u32, rkey: engine::Rkey) -> WcStatus {
        let a = self.a;
        let wr = SendWr::rdma_write(77, vec![a.sge(0, len)], addr, rkey);
        self.sim
            .node_mut(a.node)
            .engine
            .post_send(qa.qpn, wr)
            .unwrap();
        let wc = drain_cq(&mut self.sim, a.node, qa.send_cq, 1, SECOND);
        wc.first().map_or(WcStatus::GeneralErr, |w| w.status)
    }

    /// A reads `len` bytes at B's `addr` through `rkey` on `qa`; returns the status.
    fn read(&mut self, qa: Qp4, addr: u64, len: u32, rkey: engine::Rkey) -> WcStatus {
        let a = self.a;
        let wr = SendWr::rdma_read(78, vec![a.sge(0x8000, len)], addr, rkey);
        self.sim
            .node_mut(a.node)
            .engine
            .post_send(qa.qpn, wr)
            .unwrap();
        let wc = drain_cq(&mut self.sim, a.node, qa.send_cq, 1, SECOND);
        wc.first().map_or(WcStatus::GeneralErr, |w| w.status)
    }

    /// Posts `wr` on B's `qb` and returns its completion.
    fn post_b(&mut self, qb: Qp4, wr: SendWr) -> engine::WorkCompletion {
        let b = self.b;
        self.eb().post_send(qb.qpn, wr).unwrap();
        let wc = drain_cq(&mut self.sim, b.node, qb.send_cq, 1, SECOND);
        wc[0]
    }
}

fn window(b: &Host4, off: u64, len: u64, access: AccessFlags) -> MwBind {
    MwBind {
        mr: b.mr.handle,
        addr: b.addr(off),
        length: len,
        access,
    }
}

#[test]
fn type1_window_bound_by_the_verb_checks_bounds_and_rights() {
    let mut w = setup(1);
    let b = w.b;
    let (qa, qb) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type1).unwrap();
    let bind = window(&b, 0x1000, 0x100, AccessFlags::REMOTE_WRITE);
    let rkey = w.eb().bind_mw(qb.qpn, 5, mw.handle, bind, true).unwrap();
    assert_ne!(rkey, mw.rkey, "each bind changes the key");
    let wc = drain_cq(&mut w.sim, b.node, qb.send_cq, 1, SECOND);
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (5, WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(w.eb().query_mw(mw.handle).unwrap(), (rkey, true));
    let data = pattern(1, 16);
    w.sim.node(w.a.node).mem.set(OWNER, w.a.addr(0), &data);
    assert_eq!(
        w.write(qa, b.addr(0x1000 + 0xf0), 16, rkey),
        WcStatus::Success
    );
    assert_eq!(w.sim.node(b.node).mem.get(OWNER, b.addr(0x10f0), 16), data);
    // One byte past the window.
    assert_eq!(
        w.write(qa, b.addr(0x1000 + 0xf1), 16, rkey),
        WcStatus::RemAccessErr
    );
    // A write-only window does not allow READ.
    let (qa, _qb) = w.pair();
    assert_eq!(w.read(qa, b.addr(0x1000), 16, rkey), WcStatus::RemAccessErr);
    // The MR's own rkey still works: the window adds a view, it takes nothing away.
    let (qa, _qb) = w.pair();
    assert_eq!(w.read(qa, b.addr(0x1000), 16, b.mr.rkey), WcStatus::Success);
}

#[test]
fn type1_rebind_retires_the_old_key_and_zero_length_unbinds() {
    let mut w = setup(2);
    let b = w.b;
    let (qa, qb) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type1).unwrap();
    let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let k1 = w
        .eb()
        .bind_mw(qb.qpn, 1, mw.handle, window(&b, 0, 64, rw), false)
        .unwrap();
    let k2 = w
        .eb()
        .bind_mw(qb.qpn, 2, mw.handle, window(&b, 64, 64, rw), false)
        .unwrap();
    w.sim.run_until(|_| false, SECOND).ok();
    assert_eq!(w.read(qa, b.addr(64), 8, k2), WcStatus::Success);
    assert_eq!(
        w.read(qa, b.addr(64), 8, k1),
        WcStatus::RemAccessErr,
        "old key"
    );
    let (qa, qb) = w.pair();
    let k3 = w
        .eb()
        .bind_mw(qb.qpn, 3, mw.handle, window(&b, 0, 0, rw), false)
        .unwrap();
    w.sim.run_until(|_| false, SECOND).ok();
    assert_eq!(w.eb().query_mw(mw.handle).unwrap(), (k3, false));
    assert_eq!(
        w.read(qa, b.addr(0), 8, k3),
        WcStatus::RemAccessErr,
        "unbound"
    );
}

#[test]
fn type2_window_serves_only_its_qp_and_dies_with_local_inv() {
    let mut w = setup(3);
    let b = w.b;
    let (qa, qb) = w.pair();
    let (qa2, _qb2) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type2).unwrap();
    let rkey = engine_inc(mw.rkey);
    let bind = window(
        &b,
        0x2000,
        0x1000,
        AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    );
    let wc = w.post_b(qb, SendWr::bind_mw(1, mw.handle, rkey, bind));
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    assert_eq!(w.read(qa, b.addr(0x2000), 64, rkey), WcStatus::Success);
    // Another QP of the same PD may not use it (IBA 10.6.7.2.2).
    assert_eq!(
        w.read(qa2, b.addr(0x2000), 64, rkey),
        WcStatus::RemAccessErr
    );
    // A bound type 2 window cannot be bound again before it is invalidated.
    let again = w.post_b(qb, SendWr::bind_mw(2, mw.handle, engine_inc(rkey), bind));
    assert_eq!(again.status, WcStatus::MwBindErr);
    assert_eq!(w.eb().query_qp(qb.qpn).unwrap().qp_state, QpState::Err);

    // A fresh pair: bind, LOCAL_INV, then use after invalidate.
    let (qa, qb) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type2).unwrap();
    let rkey = engine_inc(mw.rkey);
    assert_eq!(
        w.post_b(qb, SendWr::bind_mw(1, mw.handle, rkey, bind))
            .status,
        WcStatus::Success
    );
    assert_eq!(w.write(qa, b.addr(0x2000), 64, rkey), WcStatus::Success);
    let inv = w.post_b(qb, SendWr::local_inv(2, rkey));
    assert_eq!(
        (inv.status, inv.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    assert_eq!(w.eb().query_mw(mw.handle).unwrap(), (rkey, false));
    assert_eq!(
        w.write(qa, b.addr(0x2000), 64, rkey),
        WcStatus::RemAccessErr,
        "use after invalidate"
    );
    // Rebinding needs a new tag; with one, the window works again and the old key does not.
    let (qa, qb) = w.pair();
    let same = w.post_b(qb, SendWr::bind_mw(3, mw.handle, rkey, bind));
    assert_eq!(same.status, WcStatus::MwBindErr, "the tag must change");
    let (qa2, qb) = {
        let _ = qa;
        w.pair()
    };
    let k2 = engine_inc(rkey);
    assert_eq!(
        w.post_b(qb, SendWr::bind_mw(4, mw.handle, k2, bind)).status,
        WcStatus::Success
    );
    assert_eq!(w.read(qa2, b.addr(0x2000), 8, k2), WcStatus::Success);
    assert_eq!(w.read(qa2, b.addr(0x2000), 8, rkey), WcStatus::RemAccessErr);
}

/// `ibv_inc_rkey`: the next tag of the same key index.
fn engine_inc(rkey: engine::Rkey) -> engine::Rkey {
    let k = rkey.value();
    engine::Rkey::new((k & !0xff) | (k.wrapping_add(1) & 0xff))
}

#[test]
fn send_with_invalidate_frees_the_window_at_the_receiver() {
    let mut w = setup(4);
    let (a, b) = (w.a, w.b);
    let (qa, qb) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type2).unwrap();
    let rkey = engine_inc(mw.rkey);
    let bind = window(&b, 0, 0x1000, AccessFlags::REMOTE_WRITE);
    assert_eq!(
        w.post_b(qb, SendWr::bind_mw(1, mw.handle, rkey, bind))
            .status,
        WcStatus::Success
    );
    assert_eq!(w.write(qa, b.addr(0), 16, rkey), WcStatus::Success);
    w.eb()
        .post_recv(qb.qpn, RecvWr::new(9, vec![b.sge(0x9000, 64)]))
        .unwrap();
    let inv = SendWr::new(2, SendOp::SendWithInv { rkey }, vec![a.sge(0, 8)]);
    w.sim
        .node_mut(a.node)
        .engine
        .post_send(qa.qpn, inv)
        .unwrap();
    let got = drain_cq(&mut w.sim, b.node, qb.recv_cq, 1, SECOND);
    assert_eq!(got[0].status, WcStatus::Success);
    assert!(got[0].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(got[0].invalidated_rkey, rkey);
    assert_eq!(w.eb().query_mw(mw.handle).unwrap(), (rkey, false));
    let _ = drain_cq(&mut w.sim, a.node, qa.send_cq, 1, SECOND);
    assert_eq!(w.write(qa, b.addr(0), 16, rkey), WcStatus::RemAccessErr);
}

#[test]
fn send_with_invalidate_of_a_key_it_may_not_touch_fails_the_receive() {
    let mut w = setup(5);
    let (a, b) = (w.a, w.b);
    let (qa, qb) = w.pair();
    // A type 1 window cannot be invalidated remotely.
    let mw = w.eb().alloc_mw(b.pd, MwType::Type1).unwrap();
    let k = w
        .eb()
        .bind_mw(
            qb.qpn,
            1,
            mw.handle,
            window(&b, 0, 64, AccessFlags::REMOTE_READ),
            false,
        )
        .unwrap();
    w.eb()
        .post_recv(qb.qpn, RecvWr::new(9, vec![b.sge(0x9000, 64)]))
        .unwrap();
    let inv = SendWr::new(2, SendOp::SendWithInv { rkey: k }, vec![a.sge(0, 8)]);
    w.sim
        .node_mut(a.node)
        .engine
        .post_send(qa.qpn, inv)
        .unwrap();
    let got = drain_cq(&mut w.sim, b.node, qb.recv_cq, 1, SECOND);
    assert_eq!(got[0].status, WcStatus::RemInvReqErr);
    let sent = drain_cq(&mut w.sim, a.node, qa.send_cq, 1, SECOND);
    assert_eq!(sent[0].status, WcStatus::RemInvReqErr);
    assert_eq!(
        w.eb().query_mw(mw.handle).unwrap(),
        (k, true),
        "still bound"
    );
}

#[test]
fn bind_errors_mr_without_mw_bind_pd_mismatch_and_bad_rights() {
    let mut w = setup(6);
    let b = w.b;
    // An MR without MW_BIND.
    let plain = w
        .eb()
        .reg_mr(
            b.pd,
            OWNER,
            b.addr(0),
            0x1000,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let (_qa, qb) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type2).unwrap();
    let bind = MwBind {
        mr: plain.handle,
        addr: b.addr(0),
        length: 64,
        access: AccessFlags::REMOTE_READ,
    };
    let wc = w.post_b(qb, SendWr::bind_mw(1, mw.handle, engine_inc(mw.rkey), bind));
    assert_eq!(wc.status, WcStatus::MwBindErr);
    // A window of another PD than the QP.
    let pd2 = w.eb().alloc_pd().unwrap();
    let mw2 = w.eb().alloc_mw(pd2, MwType::Type2).unwrap();
    let (_qa, qb) = w.pair();
    let bind = window(&b, 0, 64, AccessFlags::REMOTE_READ);
    let wc = w.post_b(
        qb,
        SendWr::bind_mw(1, mw2.handle, engine_inc(mw2.rkey), bind),
    );
    assert_eq!(wc.status, WcStatus::MwBindErr);
    // A window past the end of the MR.
    let (_qa, qb) = w.pair();
    let bind = window(&b, b.len - 8, 64, AccessFlags::REMOTE_READ);
    let wc = w.post_b(qb, SendWr::bind_mw(1, mw.handle, engine_inc(mw.rkey), bind));
    assert_eq!(wc.status, WcStatus::MwBindErr);
    // Remote write through a window needs local write on the MR.
    let ro = w
        .eb()
        .reg_mr(
            b.pd,
            OWNER,
            b.addr(0),
            0x1000,
            AccessFlags::MW_BIND | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let (_qa, qb) = w.pair();
    let bind = MwBind {
        mr: ro.handle,
        addr: b.addr(0),
        length: 64,
        access: AccessFlags::REMOTE_WRITE,
    };
    let wc = w.post_b(qb, SendWr::bind_mw(1, mw.handle, engine_inc(mw.rkey), bind));
    assert_eq!(wc.status, WcStatus::MwBindErr);
    // The type 1 verb refuses a type 2 window.
    let (_qa, qb) = w.pair();
    assert_eq!(
        w.eb().bind_mw(
            qb.qpn,
            1,
            mw.handle,
            window(&b, 0, 8, AccessFlags::REMOTE_READ),
            true
        ),
        Err(engine::VerbsError::InvalidMw)
    );
}

#[test]
fn pd_mismatch_between_qp_and_mr_or_window_is_a_remote_access_error() {
    let mut w = setup(7);
    let b = w.b;
    let pd2 = w.eb().alloc_pd().unwrap();
    // B's QP in PD 2, the MR in PD 1.
    let (qa, _qb) = w.pair_in(pd2);
    assert_eq!(w.write(qa, b.addr(0), 8, b.mr.rkey), WcStatus::RemAccessErr);
    // A type 1 window of PD 1 used through a QP of PD 2.
    let (_qa, qb) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type1).unwrap();
    let k = w
        .eb()
        .bind_mw(
            qb.qpn,
            1,
            mw.handle,
            window(&b, 0, 64, AccessFlags::REMOTE_READ),
            false,
        )
        .unwrap();
    w.sim.run_until(|_| false, SECOND).ok();
    let (qa, _qb) = w.pair_in(pd2);
    assert_eq!(w.read(qa, b.addr(0), 8, k), WcStatus::RemAccessErr);
    // A window cannot be deallocated... but its PD cannot go while it exists.
    assert!(matches!(
        w.eb().dealloc_pd(pd2),
        Err(engine::VerbsError::Busy(_))
    ));
}

#[test]
fn local_invalidation_of_an_mr_stops_remote_and_local_use() {
    let mut w = setup(8);
    let (a, b) = (w.a, w.b);
    let mr = w
        .eb()
        .reg_mr(
            b.pd,
            OWNER,
            b.addr(0x4_0000),
            0x1000,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let (qa, qb) = w.pair();
    assert_eq!(w.write(qa, b.addr(0x4_0000), 8, mr.rkey), WcStatus::Success);
    let inv = w.post_b(qb, SendWr::local_inv(1, engine::Rkey::new(mr.lkey.value())));
    assert_eq!(
        (inv.status, inv.opcode),
        (WcStatus::Success, WcOpcode::LocalInv)
    );
    // B's own use of the lkey now fails locally.
    let wr = SendWr::send(2, vec![engine::Sge::new(b.addr(0x4_0000), 8, mr.lkey)]);
    let wc = w.post_b(qb, wr);
    assert_eq!(wc.status, WcStatus::LocProtErr);
    let (qa, _qb) = w.pair();
    assert_eq!(
        w.write(qa, b.addr(0x4_0000), 8, mr.rkey),
        WcStatus::RemAccessErr
    );
    // A key of no MR or window: the invalidation fails.
    let (_qa, qb) = w.pair();
    let bad = w.post_b(qb, SendWr::local_inv(3, engine::Rkey::new(0x1234_5678)));
    assert_eq!(bad.status, WcStatus::MwBindErr);
    // Deregistering the invalidated MR still works.
    w.eb().dereg_mr(mr.handle).unwrap();
    let _ = a;
}

#[test]
fn a_window_over_a_deregistered_mr_stops_working() {
    let mut w = setup(9);
    let b = w.b;
    let mr = w
        .eb()
        .reg_mr(
            b.pd,
            OWNER,
            b.addr(0),
            0x1000,
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        )
        .unwrap();
    let (qa, qb) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type2).unwrap();
    let rkey = engine_inc(mw.rkey);
    let bind = MwBind {
        mr: mr.handle,
        addr: b.addr(0),
        length: 0x100,
        access: AccessFlags::REMOTE_WRITE,
    };
    assert_eq!(
        w.post_b(qb, SendWr::bind_mw(1, mw.handle, rkey, bind))
            .status,
        WcStatus::Success
    );
    assert_eq!(w.write(qa, b.addr(0), 8, rkey), WcStatus::Success);
    w.eb().dereg_mr(mr.handle).unwrap();
    assert_eq!(w.write(qa, b.addr(0), 8, rkey), WcStatus::RemAccessErr);
}

#[test]
fn destroying_the_qp_frees_its_type2_windows() {
    let mut w = setup(10);
    let b = w.b;
    let (_qa, qb) = w.pair();
    let mw = w.eb().alloc_mw(b.pd, MwType::Type2).unwrap();
    let rkey = engine_inc(mw.rkey);
    let bind = window(&b, 0, 0x100, AccessFlags::REMOTE_READ);
    assert_eq!(
        w.post_b(qb, SendWr::bind_mw(1, mw.handle, rkey, bind))
            .status,
        WcStatus::Success
    );
    assert_eq!(w.eb().query_mw(mw.handle).unwrap(), (rkey, true));
    w.eb().destroy_qp(qb.qpn).unwrap();
    assert_eq!(w.eb().query_mw(mw.handle).unwrap(), (rkey, false));
}

#[test]
fn a_bind_behind_a_send_in_flight_runs_after_it_completes() {
    let mut w = setup(11);
    let (a, b) = (w.a, w.b);
    let (qa, qb) = w.pair();
    for i in 0..2 {
        w.sim
            .node_mut(a.node)
            .engine
            .post_recv(qa.qpn, RecvWr::new(i, vec![a.sge(i * 4096, 4096)]))
            .unwrap();
    }
    let mw = w.eb().alloc_mw(b.pd, MwType::Type2).unwrap();
    let rkey = engine_inc(mw.rkey);
    let bind = window(&b, 0, 0x100, AccessFlags::REMOTE_READ);
    let eb = w.eb();
    eb.post_send(qb.qpn, SendWr::send(10, vec![b.sge(0, 3000)]))
        .unwrap();
    eb.post_send(qb.qpn, SendWr::bind_mw(11, mw.handle, rkey, bind))
        .unwrap();
    eb.post_send(qb.qpn, SendWr::send(12, vec![b.sge(0, 10)]))
        .unwrap();
    // The bind waits for the SEND's ACK (it is not the head of the queue before).
    assert!(!w.eb().query_mw(mw.handle).unwrap().1);
    let wcs = drain_cq(&mut w.sim, b.node, qb.send_cq, 3, SECOND);
    let got: Vec<(u64, WcStatus, WcOpcode)> =
        wcs.iter().map(|c| (c.wr_id, c.status, c.opcode)).collect();
    assert_eq!(
        got,
        vec![
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::Success, WcOpcode::BindMw),
            (12, WcStatus::Success, WcOpcode::Send),
        ]
    );
    assert_eq!(w.eb().query_mw(mw.handle).unwrap(), (rkey, true));
}
