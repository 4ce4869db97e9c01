//! Memory windows (`ibv_mw`) and invalidation: remote access to part of a memory region,
//! granted and revoked without touching the registration.
//!
//! A window is allocated in a PD ([`Pd::alloc_mw`]) and bound to a range of a region that
//! allows [`AccessFlags::MW_BIND`], with its own remote rights. Binding gives it an rkey to
//! hand to a peer (a [`RemoteMr`]); the region's own rkey need not allow remote access at
//! all.
//!
//! - A **type 1** window is bound with the bind verb, [`Qp::bind_mw`] (`ibv_bind_mw`), and
//!   serves every QP of its PD. Binding it again (or with [`Qp::unbind_mw`]) moves it and
//!   changes its rkey; it cannot be invalidated.
//! - A **type 2** window is bound with a bind work request, [`Qp::post_bind_mw`]
//!   (`IBV_WR_BIND_MW`), serves only the QP that bound it, and stays bound until
//!   [`Qp::local_inv`] (`IBV_WR_LOCAL_INV`) or a peer's [`Qp::send_with_inv`]
//!   (`IBV_WR_SEND_WITH_INV`) frees it. Every bind changes the key's low byte (as
//!   `ibv_inc_rkey`), so a key handed out for an earlier binding never works again.
//!
//! Binds and local invalidations execute in order with the QP's other work requests and
//! complete on its send CQ ([`WcOpcode::BindMw`](engine::WcOpcode::BindMw),
//! [`WcOpcode::LocalInv`](engine::WcOpcode::LocalInv)); a check that fails there (region
//! without `MW_BIND`, range outside it, PDs that differ, a key the QP may not invalidate)
//! completes with [`WcStatus::MwBindErr`](engine::WcStatus::MwBindErr) and moves the QP to
//! the error state, as on a hardware RNIC. A peer using a window outside its range or rights,
//! or after it was invalidated, gets [`WcStatus::RemAccessErr`](engine::WcStatus::RemAccessErr).
//!
//! Windows never extend the life of memory: once the region under a window is deregistered
//! (dropped), accesses through the window fail the key check.

use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};

use engine::{
    inc_rkey, AccessFlags, MrHandle, MwBind, MwHandle, MwType, SendOp, SendWr, Sge, VerbsError,
};

use crate::handshake::RemoteMr;
use crate::mr::RawMemoryRegion;
use crate::qp::{Pd, Qp};
use crate::{Error, Result, Rkey};

/// A memory window (`ibv_mw`); deallocated (`ibv_dealloc_mw`) when dropped, after which its
/// rkey is refused. Holds its PD, so the PD outlives it.
#[derive(Debug)]
pub struct MemoryWindow {
    pd: Pd,
    handle: MwHandle,
    mw_type: MwType,
    /// Type 2: the rkey the last posted bind WR gives the window. Binds queue up behind other
    /// work requests, so each must name the key after this one, not after the window's
    /// current key (which changes only when a bind executes). Held while a bind is posted,
    /// so that two threads binding the same window post distinct keys.
    posted_rkey: Mutex<Rkey>,
}

impl Pd {
    /// A new, unbound memory window of `mw_type` in this PD (`ibv_alloc_mw`).
    pub fn alloc_mw(&self, mw_type: MwType) -> Result<MemoryWindow> {
        let (handle, rkey) = self.device().provider().alloc_mw(self.handle(), mw_type)?;
        Ok(MemoryWindow {
            pd: self.clone(),
            handle,
            mw_type,
            posted_rkey: Mutex::new(rkey),
        })
    }
}

impl MemoryWindow {
    /// Type 1 (bind verb) or type 2 (bind work request).
    pub fn mw_type(&self) -> MwType {
        self.mw_type
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// The window's rkey as the device sees it now: the key of its latest executed bind
    /// (binds still queued behind other work requests have not changed it yet).
    pub fn rkey(&self) -> Result<Rkey> {
        Ok(self.pd.device().provider().query_mw(self.handle)?.0)
    }

    /// Whether the window is bound now (false before its first bind, after a type 1 unbind,
    /// and after a type 2 window was invalidated).
    pub fn is_bound(&self) -> Result<bool> {
        Ok(self.pd.device().provider().query_mw(self.handle)?.1)
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        if let Err(e) = self.pd.device().provider().dealloc_mw(self.handle) {
            tracing::warn!(error = %e, "dealloc_mw failed");
        }
    }
}

/// Refuse a window or region of another device before naming it by handle: handles are
/// per device, so another device's window would name an unrelated one of this device.
fn same_device(qp: &Qp, mw: &MemoryWindow, mr: Option<&RawMemoryRegion>) -> Result<()> {
    let dev = &qp.pd().device().inner;
    if !Arc::ptr_eq(dev, &mw.pd.device().inner) {
        return Err(Error::Verbs(VerbsError::InvalidMw));
    }
    if mr.is_some_and(|mr| !Arc::ptr_eq(dev, &mr.pd().device().inner)) {
        return Err(Error::Verbs(VerbsError::InvalidMr));
    }
    Ok(())
}

/// The bind description for `range` (byte offsets into `mr`) with `access`, and the
/// descriptor a peer uses once the window is bound with `rkey`.
fn describe(
    mr: &RawMemoryRegion,
    handle: MrHandle,
    range: impl RangeBounds<usize>,
    access: AccessFlags,
) -> Result<(MwBind, RemoteMr)> {
    let remote = mr.remote(range)?;
    let bind = MwBind {
        mr: handle,
        addr: remote.addr,
        length: remote.len,
        access,
    };
    Ok((bind, remote))
}

impl Qp {
    /// What both binds check before posting anything: the window is of the `expected`
    /// type (checked here too, though the engine checks as well, so both backends refuse
    /// it alike), window and region belong to this QP's device, and `range` lies within
    /// the region. Returns the bind description and what a peer will need.
    fn prepare_bind(
        &self,
        mw: &MemoryWindow,
        expected: MwType,
        mr: &RawMemoryRegion,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
    ) -> Result<(MwBind, RemoteMr)> {
        if mw.mw_type != expected {
            return Err(Error::Verbs(VerbsError::InvalidMw));
        }
        same_device(self, mw, Some(mr))?;
        describe(mr, mr.handle(), range, access)
    }

    /// Bind type 1 window `mw` to `range` (byte offsets into `mr`) with the remote rights
    /// `access` (`ibv_bind_mw`): posts a signaled bind on this QP, which executes in order
    /// with its other work requests and completes as `BindMw` (or `MwBindErr`). Returns what
    /// a peer needs to reach the range through the window once the bind has completed.
    ///
    /// The region must allow [`AccessFlags::MW_BIND`] (and `LOCAL_WRITE` for remote write or
    /// atomic rights); the window, the region and this QP must share one PD. A type 2
    /// window is refused here with [`VerbsError::InvalidMw`] (bind it with
    /// [`Qp::post_bind_mw`]), and so is a window of another device (a region of another
    /// device with [`VerbsError::InvalidMr`]); a range outside the region is
    /// [`Error::OutOfBounds`]. Nothing is posted then.
    pub fn bind_mw(
        &self,
        wr_id: u64,
        mw: &MemoryWindow,
        mr: &RawMemoryRegion,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
    ) -> Result<RemoteMr> {
        let (bind, mut remote) = self.prepare_bind(mw, MwType::Type1, mr, range, access)?;
        remote.rkey =
            self.pd()
                .device()
                .provider()
                .bind_mw(self.handle(), wr_id, mw.handle, bind, true)?;
        Ok(remote)
    }

    /// Unbind type 1 window `mw` (a zero-length `ibv_bind_mw`): once the signaled bind has
    /// completed, no key of the window works. Returns the window's new rkey.
    pub fn unbind_mw(&self, wr_id: u64, mw: &MemoryWindow) -> Result<Rkey> {
        same_device(self, mw, None)?;
        let bind = MwBind {
            // Not looked at: a zero-length bind of a type 1 window names no region.
            mr: MrHandle(0),
            addr: 0,
            length: 0,
            access: AccessFlags::empty(),
        };
        self.pd()
            .device()
            .provider()
            .bind_mw(self.handle(), wr_id, mw.handle, bind, true)
    }

    /// Bind type 2 window `mw` to `range` (byte offsets into `mr`) with the remote rights
    /// `access` by posting a signaled bind work request (`IBV_WR_BIND_MW`). The window gets
    /// a new rkey (the next tag after the last one posted); returns what a peer needs to
    /// reach the range through it once the bind has completed. Only requests arriving on
    /// this QP may use the window.
    ///
    /// A type 2 window must be free to be bound: after allocation, [`Qp::local_inv`] or a
    /// peer's [`Qp::send_with_inv`]; otherwise the bind completes with `MwBindErr`. The
    /// region must allow [`AccessFlags::MW_BIND`]; window, region and QP share one PD. A
    /// type 1 window is refused with [`VerbsError::InvalidMw`] (bind it with
    /// [`Qp::bind_mw`]), as are another device's windows and regions and ranges outside
    /// the region (as for [`Qp::bind_mw`]); nothing is posted then.
    pub fn post_bind_mw(
        &self,
        wr_id: u64,
        mw: &MemoryWindow,
        mr: &RawMemoryRegion,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
    ) -> Result<RemoteMr> {
        let (bind, mut remote) = self.prepare_bind(mw, MwType::Type2, mr, range, access)?;
        // Held across reading, posting and advancing the posted key, so that two threads
        // binding the same window post distinct keys.
        let mut posted = mw.posted_rkey.lock().unwrap_or_else(|e| e.into_inner());
        let rkey = inc_rkey(*posted);
        self.post_send(SendWr::bind_mw(wr_id, mw.handle, rkey, bind))?;
        *posted = rkey;
        remote.rkey = rkey;
        Ok(remote)
    }

    /// Post a signaled local invalidation of `rkey` (`IBV_WR_LOCAL_INV`): a type 2 window
    /// bound on this QP's PD becomes free, or a region of this PD named by its rkey (or by its
    /// lkey, as `Rkey::new(mr.lkey().value())`: the verb's one key field takes either) stops
    /// working (for good: regions are not re-validated). Completes as `LocalInv`, or
    /// `MwBindErr` for a key this QP may not invalidate (a type 1 window, an unbound one,
    /// another PD's).
    pub fn local_inv(&self, wr_id: u64, rkey: Rkey) -> Result<()> {
        self.post_send(SendWr::local_inv(wr_id, rkey))
    }

    /// Post a signaled SEND of `sges` that also invalidates `rkey` at the peer
    /// (`IBV_WR_SEND_WITH_INV`): a type 2 window bound on the receiving QP, or a region of
    /// its PD. The peer's receive completion carries `WcFlags::WITH_INV` and the key in
    /// `invalidated_rkey`; a key the peer may not invalidate fails its receive
    /// (`RemInvReqErr`) and this send.
    pub fn send_with_inv(&self, wr_id: u64, sges: &[Sge], rkey: Rkey) -> Result<()> {
        let op = SendOp::SendWithInv { rkey };
        self.post_send(SendWr::new(wr_id, op, sges))
    }
}
