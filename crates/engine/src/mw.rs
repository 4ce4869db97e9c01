//! Memory windows (IBA 10.6.7) and invalidation: the window table, the bind and invalidate
//! operations, and the remote key check that looks through a window before the MR table.
//!
//! A window is a remote-access view of part of a memory region. Type 1 windows belong to a
//! PD; type 2 windows are also tied to the QP that bound them (IBA 10.6.7.2.2), and are freed
//! again by LOCAL_INV or SEND_WITH_INV. Window rkeys have their top bit set (MR keys of this
//! engine never reach it below 2^19 regions), the next 23 bits name the window and the low 8
//! bits are the tag that changes on every bind, as `ibv_inc_rkey` expects.

use crate::error::VerbsError;
use crate::memory::{MemOwner, Memory};
use crate::mr::{KeyError, MrHandle, MrTable};
use crate::pd::PdHandle;
use crate::qp_attr::AccessFlags;
use crate::rng::Rng;
use crate::table::Table;
use crate::{Engine, Rkey};

/// Handle of a memory window within one [`crate::Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MwHandle(pub u32);

/// `enum ibv_mw_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MwType {
    /// Bound with the bind verb ([`crate::Engine::bind_mw`]); belongs to its PD only.
    Type1 = 1,
    /// Bound with a bind WR ([`crate::SendOp::BindMw`]) on one QP, which alone may use it;
    /// freed by LOCAL_INV or SEND_WITH_INV.
    Type2 = 2,
}

/// What `alloc_mw` gives back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwKeys {
    /// Handle for `bind_mw`, bind WRs and `dealloc_mw`.
    pub handle: MwHandle,
    /// The window's current rkey (it changes on every bind).
    pub rkey: Rkey,
}

/// `struct ibv_mw_bind_info`: the part of an MR a window exposes, and with which rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MwBind {
    /// The memory region (must allow `MW_BIND`, same PD as the QP and the window).
    pub mr: MrHandle,
    /// First byte of the window (inside the MR).
    pub addr: u64,
    /// Bytes in the window; 0 unbinds a type 1 window.
    pub length: u64,
    /// Remote rights through the window (REMOTE_READ / REMOTE_WRITE / REMOTE_ATOMIC).
    pub access: AccessFlags,
}

/// Key bit that marks a window rkey.
const MW_KEY_BIT: u32 = 1 << 31;
/// Windows the key format can name.
const MAX_MW_INDEX: u32 = (1 << 23) - 1;

/// The range a bound window exposes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Binding {
    mr: MrHandle,
    /// The MR's lkey when bound: if the MR is deregistered (and its slot reused) or
    /// invalidated, the window stops working.
    mr_lkey: u32,
    owner: MemOwner,
    addr: u64,
    length: u64,
    access: AccessFlags,
    /// Type 2: the QP it was bound on (IBA 10.6.7.2.2: only that QP may use it).
    qpn: Option<u32>,
}

#[derive(Debug)]
pub(crate) struct Mw {
    pub(crate) pd: PdHandle,
    pub(crate) mw_type: MwType,
    pub(crate) rkey: u32,
    /// The key the last `bind_mw` verb handed out (binds queue up: each gets the next tag,
    /// as `ibv_bind_mw` advances `mw->rkey` when it posts).
    pub(crate) posted_rkey: u32,
    pub(crate) binding: Option<Binding>,
}

/// The windows of one device.
#[derive(Debug, Default)]
pub(crate) struct MwTable {
    table: Table<Mw>,
}

impl MwTable {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether a bound window still reaches memory through `mr` (one bound to an earlier
    /// registration of the same slot, or to a region since invalidated, reaches nothing: see
    /// [`check_remote`]).
    pub(crate) fn any_bound_to(&self, mrs: &MrTable, mr: MrHandle) -> bool {
        self.table.iter().any(|w| {
            w.binding
                .is_some_and(|b| b.mr == mr && mrs.is_live(mr, b.mr_lkey))
        })
    }

    /// QP `qpn` is gone: the type 2 windows bound on it become free, so a later QP that
    /// reuses the number cannot reach memory through them.
    pub(crate) fn release_qp(&mut self, qpn: u32) {
        for w in self.table.iter_mut() {
            if w.binding.is_some_and(|b| b.qpn == Some(qpn)) {
                w.binding = None;
            }
        }
    }

    fn by_rkey(&self, rkey: u32) -> Option<&Mw> {
        if rkey & MW_KEY_BIT == 0 {
            return None;
        }
        let mw = self.table.get((rkey & !MW_KEY_BIT) >> 8)?;
        (mw.rkey == rkey).then_some(mw)
    }

    fn by_rkey_mut(&mut self, rkey: u32) -> Option<&mut Mw> {
        if rkey & MW_KEY_BIT == 0 {
            return None;
        }
        let mw = self.table.get_mut((rkey & !MW_KEY_BIT) >> 8)?;
        (mw.rkey == rkey).then_some(mw)
    }
}

/// The rkey after `rkey` with the same window index and the next tag (`ibv_inc_rkey`): what
/// a type 2 bind WR names as the window's new key.
pub fn inc_rkey(rkey: Rkey) -> Rkey {
    Rkey::new(next_tag(rkey.value()))
}

fn next_tag(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Check a remote access (IBA 10.6.7.3 for windows, 10.6.3 for regions): through a bound
/// window if `rkey` names one (its bounds, rights, PD and, for type 2, the QP), else through
/// the MR table. Failures become Remote Access Errors at the responder.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_remote(
    mrs: &MrTable,
    mws: &MwTable,
    rkey: u32,
    pd: PdHandle,
    qpn: u32,
    addr: u64,
    len: u64,
    need: AccessFlags,
) -> Result<MemOwner, KeyError> {
    let Some(mw) = mws.by_rkey(rkey) else {
        return mrs.check_remote(rkey, pd, addr, len, need);
    };
    let b = mw.binding.ok_or(KeyError::BadKey)?;
    if mw.pd != pd {
        return Err(KeyError::PdMismatch);
    }
    if b.qpn.is_some_and(|q| q != qpn) {
        // IBA 10.6.7 (type 2 windows): a type 2 window serves only the QP it was bound on.
        return Err(KeyError::NoAccess);
    }
    if !b.access.contains(need) {
        return Err(KeyError::NoAccess);
    }
    let end = addr.checked_add(len).ok_or(KeyError::OutOfBounds)?;
    if addr < b.addr || end > b.addr.saturating_add(b.length) {
        return Err(KeyError::OutOfBounds);
    }
    // The region under the window must still be the one it was bound to, and valid.
    if !mrs.is_live(b.mr, b.mr_lkey) {
        return Err(KeyError::BadKey);
    }
    Ok(b.owner)
}

/// Execute a bind WR (IBA 10.6.7.2 / 10.8.2.2 checks). `Err` means MW_BIND_ERR.
pub(crate) fn bind(
    mrs: &MrTable,
    mws: &mut MwTable,
    qp_pd: PdHandle,
    qpn: u32,
    mw: MwHandle,
    new_rkey: u32,
    bind: &MwBind,
) -> Result<(), ()> {
    let w = mws.table.get_mut(mw.0).ok_or(())?;
    // IBA 10.6.7 (bind checks): the window, the QP and the region share one PD.
    if w.pd != qp_pd {
        return Err(());
    }
    // The new key keeps the window's index; only the tag may change.
    if new_rkey & !0xff != w.rkey & !0xff {
        return Err(());
    }
    if w.mw_type == MwType::Type2 {
        // IBA 10.6.7.2.2: a type 2 window is bound only while free, and each bind changes
        // the key, so an rkey handed out for an earlier binding never works again.
        if w.binding.is_some() || new_rkey == w.rkey {
            return Err(());
        }
    }
    if w.mw_type == MwType::Type1 && bind.length == 0 {
        // IBA 10.6.7.2.1: a zero-length bind of a type 1 window unbinds it.
        w.binding = None;
        w.rkey = new_rkey;
        return Ok(());
    }
    let remote = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
    if !remote.contains(bind.access) {
        return Err(());
    }
    let mr = mrs.get(bind.mr).ok_or(())?;
    if !mr.valid || mr.pd != qp_pd || !mr.access.contains(AccessFlags::MW_BIND) {
        return Err(());
    }
    // IBA 10.6.7, as 10.6.3 for regions: remote write or atomic rights need local write
    // on the region.
    if bind
        .access
        .intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
        && !mr.access.contains(AccessFlags::LOCAL_WRITE)
    {
        return Err(());
    }
    let end = bind.addr.checked_add(bind.length).ok_or(())?;
    if bind.addr < mr.addr || end > mr.addr.saturating_add(mr.length) {
        return Err(());
    }
    w.binding = Some(Binding {
        mr: bind.mr,
        mr_lkey: mr.lkey,
        owner: mr.owner,
        addr: bind.addr,
        length: bind.length,
        access: bind.access,
        qpn: (w.mw_type == MwType::Type2).then_some(qpn),
    });
    w.rkey = new_rkey;
    Ok(())
}

/// Invalidate `key` (LOCAL_INV, or the IETH of a SEND_WITH_INV when `remote_qpn` names the
/// receiving QP): a bound type 2 window of this PD (remotely: bound on this QP) becomes
/// free; a memory region of this PD named by its lkey or rkey becomes invalid. Type 1
/// windows cannot be invalidated (IBA 10.6.7.2.1).
pub(crate) fn invalidate(
    mrs: &mut MrTable,
    mws: &mut MwTable,
    pd: PdHandle,
    remote_qpn: Option<u32>,
    key: u32,
) -> Result<(), ()> {
    if let Some(w) = mws.by_rkey_mut(key) {
        let Some(b) = w.binding else { return Err(()) };
        if w.mw_type != MwType::Type2 || w.pd != pd {
            return Err(());
        }
        if remote_qpn.is_some_and(|q| b.qpn != Some(q)) {
            return Err(());
        }
        w.binding = None;
        return Ok(());
    }
    if mrs.invalidate(key, pd) {
        Ok(())
    } else {
        Err(())
    }
}

impl<M: Memory + ?Sized> crate::Ctx<'_, M> {
    /// [`check_remote`] for a request arriving on QP `qpn` of `pd`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn check_rkey(
        &self,
        qpn: u32,
        rkey: u32,
        pd: PdHandle,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MemOwner, KeyError> {
        check_remote(self.mrs, self.mws, rkey, pd, qpn, addr, len, need)
    }
}

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_alloc_mw`: a window of `mw_type` in `pd`, not bound yet.
    pub fn alloc_mw(&mut self, pd: PdHandle, mw_type: MwType) -> Result<MwKeys, VerbsError> {
        if self.pds.get(pd.0).is_none() {
            return Err(VerbsError::InvalidPd);
        }
        if self.mws.len() >= self.config.device.max_mw as usize {
            return Err(VerbsError::TooMany("memory windows"));
        }
        let idx = self.mws.table.insert(Mw {
            pd,
            mw_type,
            rkey: 0,
            posted_rkey: 0,
            binding: None,
        });
        if idx > MAX_MW_INDEX {
            self.mws.table.remove(idx);
            return Err(VerbsError::TooMany("memory windows"));
        }
        let rkey = MW_KEY_BIT | (idx << 8) | (tag(&mut self.rng));
        if let Some(w) = self.mws.table.get_mut(idx) {
            w.rkey = rkey;
            w.posted_rkey = rkey;
        }
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users += 1;
        }
        Ok(MwKeys {
            handle: MwHandle(idx),
            rkey: Rkey::new(rkey),
        })
    }

    /// `ibv_dealloc_mw`. Later accesses through its rkey fail the key check.
    pub fn dealloc_mw(&mut self, mw: MwHandle) -> Result<(), VerbsError> {
        let w = self.mws.table.remove(mw.0).ok_or(VerbsError::InvalidMw)?;
        if let Some(p) = self.pds.get_mut(w.pd.0) {
            p.users = p.users.saturating_sub(1);
        }
        Ok(())
    }

    /// The window's current rkey and whether it is bound.
    pub fn query_mw(&self, mw: MwHandle) -> Result<(Rkey, bool), VerbsError> {
        let w = self.mws.table.get(mw.0).ok_or(VerbsError::InvalidMw)?;
        Ok((Rkey::new(w.rkey), w.binding.is_some()))
    }

    /// `ibv_bind_mw` for a type 1 window: posts a bind WR on `qpn` (it executes in order with
    /// the QP's other WRs and completes as `BIND_MW`, or `MW_BIND_ERR` when a check fails)
    /// and returns the rkey the window will have once bound. A zero `length` unbinds.
    pub fn bind_mw(
        &mut self,
        qpn: u32,
        wr_id: u64,
        mw: MwHandle,
        bind: MwBind,
        signaled: bool,
    ) -> Result<Rkey, VerbsError> {
        let w = self.mws.table.get(mw.0).ok_or(VerbsError::InvalidMw)?;
        if w.mw_type != MwType::Type1 {
            // Type 2 windows are bound with a bind WR naming the new key (`ibv_post_send`).
            return Err(VerbsError::InvalidMw);
        }
        let rkey = inc_rkey(Rkey::new(w.posted_rkey));
        let wr = crate::SendWr::new(wr_id, crate::SendOp::BindMw { mw, rkey, bind }, Vec::new())
            .signaled(signaled);
        self.post_send(qpn, wr)?;
        if let Some(w) = self.mws.table.get_mut(mw.0) {
            w.posted_rkey = rkey.value();
        }
        Ok(rkey)
    }
}

fn tag(rng: &mut Rng) -> u32 {
    rng.next_u32() & 0xff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_keeps_the_index() {
        assert_eq!(inc_rkey(Rkey::new(0x8000_01ff)), Rkey::new(0x8000_0100));
        assert_eq!(inc_rkey(Rkey::new(0x8000_0105)), Rkey::new(0x8000_0106));
    }
}
