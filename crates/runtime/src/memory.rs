//! The engine's "DMA": [`engine::Memory`] over this process's own address space.
//!
//! Every registered range is recorded in a [`Regions`] table under a fresh [`MemOwner`] token.
//! The engine already checks keys, bounds and rights before it touches memory; this module
//! checks again that each access lies inside a range that is registered *right now*, so that
//! no bug above it can turn into a stray write through a raw pointer.
//!
//! Soundness rests on one rule the runtime keeps: the engine only runs while the runtime's core
//! lock is held, and ranges are added and removed under that same lock. After
//! [`crate::Runtime::dereg_mr`] returns, the range is never touched again.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use engine::{MemOwner, Memory, MemoryError};

/// One registered range of process memory.
#[derive(Debug, Clone, Copy)]
struct Region {
    base: usize,
    len: usize,
}

/// The table of registered ranges, shared by the runtime (which adds and removes) and the
/// [`ProcessMemory`] the engine owns (which checks).
#[derive(Debug, Default)]
pub(crate) struct Regions {
    /// By owner token (ordered: looked up on every access, where SipHash cost more than
    /// the search).
    map: BTreeMap<u64, Region>,
    next: u64,
}

impl Regions {
    /// Record `len` bytes at `base`; returns the owner token for `reg_mr`.
    pub(crate) fn insert(&mut self, base: usize, len: usize) -> MemOwner {
        self.next += 1;
        self.map.insert(self.next, Region { base, len });
        MemOwner(self.next)
    }

    /// Forget a range: later accesses through its token fail.
    pub(crate) fn remove(&mut self, owner: MemOwner) {
        self.map.remove(&owner.0);
    }

    /// The address of `len` bytes at `addr` if they lie inside the range of `owner`.
    fn check(&self, owner: MemOwner, addr: u64, len: usize) -> Result<usize, MemoryError> {
        let r = self
            .map
            .get(&owner.0)
            .ok_or(MemoryError::UnknownOwner(owner))?;
        let fault = MemoryError::Fault { addr, len };
        let start = usize::try_from(addr).map_err(|_| fault)?;
        let end = start.checked_add(len).ok_or(fault)?;
        if start < r.base || end > r.base + r.len {
            return Err(fault);
        }
        Ok(start)
    }
}

/// Shared handle to the region table.
pub(crate) type SharedRegions = Arc<Mutex<Regions>>;

/// Lock the region table; a poisoned lock still holds a consistent table (every update is a
/// single map operation), so it is used as is.
pub(crate) fn lock(regions: &SharedRegions) -> MutexGuard<'_, Regions> {
    regions.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`Memory`] over the registered ranges of this process.
#[derive(Debug)]
pub(crate) struct ProcessMemory {
    regions: SharedRegions,
}

impl ProcessMemory {
    pub(crate) fn new(regions: SharedRegions) -> ProcessMemory {
        ProcessMemory { regions }
    }
}

impl Memory for ProcessMemory {
    fn read(&mut self, owner: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let p = lock(&self.regions).check(owner, addr, buf.len())?;
        // SAFETY: `p..p + buf.len()` lies inside a range registered through the unsafe
        // `Runtime::reg_mr` contract (valid for reads and writes until `dereg_mr`), and the
        // range cannot be deregistered concurrently: we run under the core lock, which
        // `dereg_mr` takes. `buf` is engine memory, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(p as *const u8, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    fn write(&mut self, owner: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let p = lock(&self.regions).check(owner, addr, data.len())?;
        // SAFETY: as in `read`: a registered, currently valid range, accessed under the core
        // lock; the application reaches it only under the same lock or through its own unsafe
        // contract.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p as *mut u8, data.len()) };
        Ok(())
    }

    fn compare_swap(
        &mut self,
        owner: MemOwner,
        addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        let p = lock(&self.regions).check(owner, addr, 8)?;
        // SAFETY: 8 bytes inside a registered range (see `read`). Unaligned accesses are used
        // because the engine's alignment check is not this module's to rely on; exclusion
        // comes from the core lock, which every access to registered memory holds.
        unsafe {
            let old = std::ptr::read_unaligned(p as *const u64);
            if old == compare {
                std::ptr::write_unaligned(p as *mut u64, swap);
            }
            Ok(old)
        }
    }

    fn fetch_add(&mut self, owner: MemOwner, addr: u64, add: u64) -> Result<u64, MemoryError> {
        let p = lock(&self.regions).check(owner, addr, 8)?;
        // SAFETY: as in `compare_swap`.
        unsafe {
            let old = std::ptr::read_unaligned(p as *const u64);
            std::ptr::write_unaligned(p as *mut u64, old.wrapping_add(add));
            Ok(old)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_stay_inside_registered_ranges() {
        let regions = SharedRegions::default();
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as usize;
        let owner = lock(&regions).insert(base, buf.len());
        let mut mem = ProcessMemory::new(regions.clone());
        mem.write(owner, base as u64 + 8, b"abcd").unwrap();
        let mut out = [0u8; 4];
        mem.read(owner, base as u64 + 8, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
        assert_eq!(mem.fetch_add(owner, base as u64 + 16, 5).unwrap(), 0);
        assert_eq!(mem.compare_swap(owner, base as u64 + 16, 5, 9).unwrap(), 5);
        assert_eq!(mem.compare_swap(owner, base as u64 + 16, 5, 1).unwrap(), 9);
        assert!(matches!(
            mem.write(owner, base as u64 + 62, b"abc"),
            Err(MemoryError::Fault { .. })
        ));
        assert!(mem.read(owner, base as u64 - 1, &mut out).is_err());
        assert!(mem.read(owner, u64::MAX - 1, &mut out).is_err());
        lock(&regions).remove(owner);
        assert!(matches!(
            mem.read(owner, base as u64, &mut out),
            Err(MemoryError::UnknownOwner(_))
        ));
        drop(mem);
        assert_eq!(&buf[8..12], b"abcd");
        assert_eq!(u64::from_ne_bytes(buf[16..24].try_into().unwrap()), 9);
    }
}
