//! Memory regions and their keys: the checks a NIC makes before every "DMA", and the MR
//! verbs (`reg_mr`, `dereg_mr`, `query_mr`).

use bitflags::bitflags;

use crate::error::VerbsError;
use crate::memory::{MemOwner, Memory};
use crate::pd::PdHandle;
use crate::qp_attr::AccessFlags;
use crate::rng::Rng;
use crate::table::Table;
use crate::{Engine, Lkey, Rkey};

/// Handle of a memory region within one [`crate::Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MrHandle(pub u32);

/// What `reg_mr` gives back: the handle and the two keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKeys {
    /// Handle for `dereg_mr`.
    pub handle: MrHandle,
    /// Local key, for SGEs of this QP's work requests.
    pub lkey: Lkey,
    /// Remote key, for peers' RDMA and ATOMIC operations.
    pub rkey: Rkey,
}

bitflags! {
    /// What [`Engine::rereg_mr`] changes (`enum ibv_rereg_mr_flags`, same bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct ReregFlags: u32 {
        /// A new translation: `owner`, `addr` and `length` (`IBV_REREG_MR_CHANGE_TRANSLATION`).
        const CHANGE_TRANSLATION = 1 << 0;
        /// A new protection domain: `pd` (`IBV_REREG_MR_CHANGE_PD`).
        const CHANGE_PD = 1 << 1;
        /// New access flags: `access` (`IBV_REREG_MR_CHANGE_ACCESS`).
        const CHANGE_ACCESS = 1 << 2;
    }
}

/// Low key bits that are random (the rest is the table index), so that a key cannot be
/// guessed from another one (IBA 10.6.3.1 leaves the key format to the CA; rxe uses 8 bits).
pub(crate) const KEY_TAG_BITS: u32 = 12;
/// Most memory regions the key format can name.
pub(crate) const MAX_KEY_INDEX: u32 = (1 << (32 - KEY_TAG_BITS)) - 1;

#[derive(Debug)]
pub(crate) struct Mr {
    pub(crate) pd: PdHandle,
    pub(crate) owner: MemOwner,
    pub(crate) addr: u64,
    pub(crate) length: u64,
    pub(crate) access: AccessFlags,
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    /// False once invalidated (LOCAL_INV or SEND_WITH_INV naming it): its keys stop working.
    pub(crate) valid: bool,
}

/// Why a key check failed. Each maps to a different completion status or NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KeyError {
    /// No MR has this key.
    BadKey,
    /// The MR belongs to another PD than the QP.
    PdMismatch,
    /// The range is not inside the MR.
    OutOfBounds,
    /// The MR does not grant the access.
    NoAccess,
}

#[derive(Debug, Default)]
pub(crate) struct MrTable {
    table: Table<Mr>,
}

impl MrTable {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn insert(&mut self, rng: &mut Rng, mr: Mr) -> Option<MrKeys> {
        let idx = self.table.insert(mr);
        if idx > MAX_KEY_INDEX {
            self.table.remove(idx);
            return None;
        }
        let tag_mask = (1u32 << KEY_TAG_BITS) - 1;
        let lkey = (idx << KEY_TAG_BITS) | (rng.next_u32() & tag_mask);
        let rkey = (idx << KEY_TAG_BITS) | (rng.next_u32() & tag_mask);
        if let Some(m) = self.table.get_mut(idx) {
            m.lkey = lkey;
            m.rkey = rkey;
        }
        Some(MrKeys {
            handle: MrHandle(idx),
            lkey: Lkey::new(lkey),
            rkey: Rkey::new(rkey),
        })
    }

    pub(crate) fn get(&self, h: MrHandle) -> Option<&Mr> {
        self.table.get(h.0)
    }

    pub(crate) fn get_mut(&mut self, h: MrHandle) -> Option<&mut Mr> {
        self.table.get_mut(h.0)
    }

    pub(crate) fn remove(&mut self, h: MrHandle) -> Option<Mr> {
        self.table.remove(h.0)
    }

    fn by_key(&self, key: u32, remote: bool) -> Option<&Mr> {
        let mr = self.table.get(key >> KEY_TAG_BITS)?;
        let k = if remote { mr.rkey } else { mr.lkey };
        (k == key && mr.valid).then_some(mr)
    }

    /// Whether `h` is still the valid region whose lkey was `lkey` (memory windows check
    /// the region under them this way).
    pub(crate) fn is_live(&self, h: MrHandle, lkey: u32) -> bool {
        self.table
            .get(h.0)
            .is_some_and(|m| m.valid && m.lkey == lkey)
    }

    /// Invalidate the valid region of `pd` whose lkey or rkey is `key` (IBA 10.6.6: local
    /// and remote invalidation). Returns whether one was.
    pub(crate) fn invalidate(&mut self, key: u32, pd: PdHandle) -> bool {
        match self.table.get_mut(key >> KEY_TAG_BITS) {
            Some(m) if m.valid && m.pd == pd && (m.lkey == key || m.rkey == key) => {
                m.valid = false;
                true
            }
            _ => false,
        }
    }

    /// Check a local access through an lkey (IBA 10.6.3.2: key, PD, bounds, rights).
    /// Local reads need no right; local writes need LOCAL_WRITE.
    pub(crate) fn check_local(
        &self,
        lkey: u32,
        pd: PdHandle,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<MemOwner, KeyError> {
        let mr = self.by_key(lkey, false).ok_or(KeyError::BadKey)?;
        let need = if write {
            AccessFlags::LOCAL_WRITE
        } else {
            AccessFlags::empty()
        };
        check(mr, pd, addr, len, need)
    }

    /// Check a remote access through an rkey (IBA 9.4 / 10.6: key, PD, bounds, rights;
    /// the responder NAKs with Remote Access Error on any failure).
    pub(crate) fn check_remote(
        &self,
        rkey: u32,
        pd: PdHandle,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MemOwner, KeyError> {
        let mr = self.by_key(rkey, true).ok_or(KeyError::BadKey)?;
        check(mr, pd, addr, len, need)
    }
}

fn check(
    mr: &Mr,
    pd: PdHandle,
    addr: u64,
    len: u64,
    need: AccessFlags,
) -> Result<MemOwner, KeyError> {
    if mr.pd != pd {
        return Err(KeyError::PdMismatch);
    }
    if !mr.access.contains(need) {
        return Err(KeyError::NoAccess);
    }
    let end = addr.checked_add(len).ok_or(KeyError::OutOfBounds)?;
    let mr_end = mr.addr.saturating_add(mr.length);
    if addr < mr.addr || end > mr_end {
        return Err(KeyError::OutOfBounds);
    }
    Ok(mr.owner)
}

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_reg_mr`: register `length` bytes at `addr` of `owner`'s memory. Remote write or
    /// atomic access requires local write (IBA 10.6.3.1).
    pub fn reg_mr(
        &mut self,
        pd: PdHandle,
        owner: MemOwner,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<MrKeys, VerbsError> {
        if self.pds.get(pd.0).is_none() {
            return Err(VerbsError::InvalidPd);
        }
        if !access.is_valid_for_mr() {
            return Err(VerbsError::InvalidAccess);
        }
        if length > self.config.device.max_mr_size || addr.checked_add(length).is_none() {
            return Err(VerbsError::InvalidLength);
        }
        if self.mrs.len() >= self.config.device.max_mr as usize {
            return Err(VerbsError::TooMany("memory regions"));
        }
        let mr = Mr {
            pd,
            owner,
            addr,
            length,
            access,
            lkey: 0,
            rkey: 0,
            valid: true,
        };
        let keys = self
            .mrs
            .insert(&mut self.rng, mr)
            .ok_or(VerbsError::TooMany("memory regions"))?;
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users += 1;
        }
        Ok(keys)
    }

    /// `ibv_dereg_mr`. Later accesses through its keys fail the key check.
    pub fn dereg_mr(&mut self, mr: MrHandle) -> Result<(), VerbsError> {
        let m = self.mrs.remove(mr).ok_or(VerbsError::InvalidMr)?;
        if let Some(p) = self.pds.get_mut(m.pd.0) {
            p.users = p.users.saturating_sub(1);
        }
        Ok(())
    }

    /// `ibv_rereg_mr`: change what `mr` registers, as a deregistration followed by a
    /// registration would (IBA vol. 1 ch. 11, Reregister Memory Region), selected by
    /// `flags`: the translation (`owner`, `addr`, `length`), the PD (`pd`) and the access
    /// rights (`access`). Arguments `flags` does not select are ignored, except that `access`
    /// must then be empty, as libibverbs requires.
    ///
    /// The handle, the lkey and the rkey stay the same, as Linux rxe keeps them (its
    /// `rereg_user_mr` changes the MR in place) and mlx5 keeps them where it can: peers
    /// holding the rkey need no new one, and from now on every access through the keys is
    /// checked against the new translation, PD and rights. Messages already under way fare
    /// as after `dereg_mr`. A region invalidated by LOCAL_INV or SEND_WITH_INV stays invalid.
    ///
    /// Fails with `InvalidFlags` for no flag or an unknown one, `InvalidMr`, `InvalidPd`,
    /// `InvalidAccess` (remote write or atomic without local write, IBA 10.6.3.1; or access
    /// without `CHANGE_ACCESS`), `InvalidLength` as `reg_mr` does, and `Busy` while memory
    /// windows are bound to the region: their range and rights were checked against the
    /// registration they were bound to (Linux's core returned EBUSY for an MR in use, and rxe
    /// refuses to deregister a region with bound windows, IBA 10.6.7.2.6). On failure nothing
    /// changes.
    #[allow(clippy::too_many_arguments)] // ibv_rereg_mr's arguments, plus reg_mr's owner token
    pub fn rereg_mr(
        &mut self,
        mr: MrHandle,
        flags: ReregFlags,
        pd: PdHandle,
        owner: MemOwner,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<MrKeys, VerbsError> {
        if flags.is_empty() || !ReregFlags::all().contains(flags) {
            return Err(VerbsError::InvalidFlags);
        }
        if !flags.contains(ReregFlags::CHANGE_ACCESS) && !access.is_empty() {
            return Err(VerbsError::InvalidAccess);
        }
        let m = self.mrs.get(mr).ok_or(VerbsError::InvalidMr)?;
        let old_pd = m.pd;
        if flags.contains(ReregFlags::CHANGE_PD) && self.pds.get(pd.0).is_none() {
            return Err(VerbsError::InvalidPd);
        }
        if flags.contains(ReregFlags::CHANGE_ACCESS) && !access.is_valid_for_mr() {
            return Err(VerbsError::InvalidAccess);
        }
        if flags.contains(ReregFlags::CHANGE_TRANSLATION)
            && (length > self.config.device.max_mr_size || addr.checked_add(length).is_none())
        {
            return Err(VerbsError::InvalidLength);
        }
        if self.mws.any_bound_to(&self.mrs, mr) {
            return Err(VerbsError::Busy("memory windows are bound to the region"));
        }
        let Some(m) = self.mrs.get_mut(mr) else {
            return Err(VerbsError::InvalidMr);
        };
        if flags.contains(ReregFlags::CHANGE_TRANSLATION) {
            m.owner = owner;
            m.addr = addr;
            m.length = length;
        }
        if flags.contains(ReregFlags::CHANGE_ACCESS) {
            m.access = access;
        }
        if flags.contains(ReregFlags::CHANGE_PD) && pd != old_pd {
            m.pd = pd;
            if let Some(p) = self.pds.get_mut(old_pd.0) {
                p.users = p.users.saturating_sub(1);
            }
            if let Some(p) = self.pds.get_mut(pd.0) {
                p.users += 1;
            }
        }
        self.query_mr(mr)
    }

    /// The keys of a registered MR.
    pub fn query_mr(&self, mr: MrHandle) -> Result<MrKeys, VerbsError> {
        let m = self.mrs.get(mr).ok_or(VerbsError::InvalidMr)?;
        Ok(MrKeys {
            handle: mr,
            lkey: Lkey::new(m.lkey),
            rkey: Rkey::new(m.rkey),
        })
    }
}
