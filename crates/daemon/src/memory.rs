//! The daemon's "DMA": [`engine::Memory`] over the address spaces of client processes.
//!
//! Every registered range is recorded under a fresh [`MemOwner`] token together with the pid
//! of the connection that registered it (from `SO_PEERCRED`, never from the client's word).
//! Accesses go through `process_vm_readv` / `process_vm_writev` on that pid only, after a
//! second bounds check against the recorded range; a short transfer (the client unmapped the
//! memory or died) is a [`MemoryError::Fault`], which the engine reports like a protection
//! error.
//!
//! Atomics are a read and a write under the device lock: every access to registered memory
//! through one device holds that lock, so they are atomic with respect to each other
//! (`IBV_ATOMIC_HCA`), not with respect to the client's own CPU accesses.
//!
//! A region registered with its file ([`abi::shm`]) is mapped into the daemon too: its
//! reads and writes are memory copies (a write's last byte still lands last), and its
//! atomics are CPU atomics, atomic against the client's CPU as well.

// Copies to and from mapped client regions go through raw pointers.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use engine::{MemOwner, Memory, MemoryError};

use abi::shm::SharedMemory;
use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

/// One registered range in a client process.
#[derive(Debug, Clone)]
pub struct Region {
    /// The process whose memory it is.
    pub pid: i32,
    /// First byte.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// The same bytes mapped into the daemon, when the client registered them with their
    /// file ([`abi::shm`]): accesses are memory copies then, not `process_vm_*` calls.
    pub mapped: Option<Arc<SharedMemory>>,
}

/// Where an access lands, once checked against its region.
struct Hit {
    pid: i32,
    addr: usize,
    /// End of the region (reads ahead stop there).
    region_end: usize,
    /// The region's mapping in the daemon and the access's offset in it.
    mapped: Option<(Arc<SharedMemory>, usize)>,
}

/// The ranges registered by every client, shared by all devices.
#[derive(Debug, Default)]
pub struct Regions {
    map: HashMap<u64, Region>,
    next: u64,
}

impl Regions {
    /// Record a range; returns the owner token to register it with.
    pub fn insert(&mut self, r: Region) -> MemOwner {
        self.next += 1;
        self.map.insert(self.next, r);
        MemOwner(self.next)
    }

    /// Forget a range: later accesses through its token fail.
    pub fn remove(&mut self, owner: MemOwner) {
        self.map.remove(&owner.0);
    }

    /// Ranges currently registered.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True if nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn check(&self, owner: MemOwner, addr: u64, len: usize) -> Result<Hit, MemoryError> {
        let r = self
            .map
            .get(&owner.0)
            .ok_or(MemoryError::UnknownOwner(owner))?;
        let fault = MemoryError::Fault { addr, len };
        let end = addr.checked_add(len as u64).ok_or(fault)?;
        let region_end = r.base.saturating_add(r.len);
        if addr < r.base || end > region_end {
            return Err(fault);
        }
        Ok(Hit {
            pid: r.pid,
            addr: usize::try_from(addr).map_err(|_| fault)?,
            region_end: usize::try_from(region_end).map_err(|_| fault)?,
            mapped: r
                .mapped
                .as_ref()
                .map(|m| (m.clone(), (addr - r.base) as usize)),
        })
    }
}

/// Shared handle to the region table.
pub type SharedRegions = Arc<Mutex<Regions>>;

/// Lock the table. Every update is a single map operation, so a poisoned lock still guards a
/// consistent table.
pub fn lock(r: &SharedRegions) -> MutexGuard<'_, Regions> {
    r.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copy `buf.len()` bytes from `addr` in process `pid`.
pub fn read_remote(pid: i32, addr: usize, buf: &mut [u8]) -> Result<(), MemoryError> {
    let len = buf.len();
    if len == 0 {
        return Ok(());
    }
    let fault = MemoryError::Fault {
        addr: addr as u64,
        len,
    };
    let remote = [RemoteIoVec { base: addr, len }];
    let mut local = [IoSliceMut::new(buf)];
    match process_vm_readv(Pid::from_raw(pid), &mut local, &remote) {
        Ok(n) if n == len => Ok(()),
        _ => Err(fault),
    }
}

/// Copy `data` to `addr` in process `pid`. The kernel copies one iovec front to back, so the
/// bytes land in address order, the last byte last.
pub fn write_remote(pid: i32, addr: usize, data: &[u8]) -> Result<(), MemoryError> {
    let len = data.len();
    if len == 0 {
        return Ok(());
    }
    let fault = MemoryError::Fault {
        addr: addr as u64,
        len,
    };
    let remote = [RemoteIoVec { base: addr, len }];
    let local = [IoSlice::new(data)];
    match process_vm_writev(Pid::from_raw(pid), &local, &remote) {
        Ok(n) if n == len => Ok(()),
        _ => Err(fault),
    }
}

/// Whether `addr..addr + len` is mapped readable and writable in process `pid`, by its
/// `/proc/<pid>/maps` (contiguous mappings may cover it together).
pub fn range_is_mapped(pid: i32, addr: u64, len: u64) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    let mut spans: Vec<(u64, u64)> = maps
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let range = f.next()?;
            let perms = f.next()?;
            if !perms.starts_with("rw") {
                return None;
            }
            let (a, b) = range.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect();
    spans.sort_unstable();
    let mut cur = addr;
    for (a, b) in spans {
        if a > cur {
            break;
        }
        if b > cur {
            cur = b;
        }
        if cur >= end {
            return true;
        }
    }
    // A zero-length range needs no mapping.
    len == 0
}

/// Whether process `pid` has `fd`'s file mapped shared and read-write over all of
/// `addr..addr + len`, as one mapping, with byte `offset` of the file at `addr` (by its
/// `/proc/<pid>/maps`): then the daemon's own mapping of that file holds exactly the bytes
/// the client sees at those addresses.
pub fn mapping_matches(
    pid: i32,
    addr: u64,
    len: u64,
    fd: &impl std::os::fd::AsFd,
    offset: u64,
) -> bool {
    let Ok(st) = rustix::fs::fstat(fd) else {
        return false;
    };
    let (major, minor) = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    maps.lines().any(|line| {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(off), Some(dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return false;
        };
        let parse = || -> Option<bool> {
            let (a, b) = range.split_once('-')?;
            let (a, b) = (
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            );
            let off = u64::from_str_radix(off, 16).ok()?;
            let (ma, mi) = dev.split_once(':')?;
            let (ma, mi) = (
                u32::from_str_radix(ma, 16).ok()?,
                u32::from_str_radix(mi, 16).ok()?,
            );
            let inode: u64 = inode.parse().ok()?;
            Some(
                perms.starts_with("rw")
                    && perms.ends_with('s')
                    && a <= addr
                    && end <= b
                    && (ma, mi) == (major, minor)
                    && inode == st.st_ino
                    && off.checked_add(addr - a) == Some(offset),
            )
        };
        parse().unwrap_or(false)
    })
}

/// Copy `src` to `dst` in address order as far as an observer polling the last byte can
/// tell: everything else first, then a release fence, then the last byte.
///
/// # Safety
/// `dst` must be valid for writes of `src.len()` bytes and not overlap `src`.
unsafe fn copy_last_byte_last(src: &[u8], dst: *mut u8) {
    let Some((&last, rest)) = src.split_last() else {
        return;
    };
    // SAFETY: the caller's contract; `rest` is shorter than `src`.
    unsafe { std::ptr::copy_nonoverlapping(rest.as_ptr(), dst, rest.len()) };
    std::sync::atomic::fence(Ordering::Release);
    // SAFETY: the last byte of the destination range.
    unsafe { std::ptr::write_volatile(dst.add(rest.len()), last) };
}

/// Most bytes one read fetches ahead of what the engine asked for.
const READ_AHEAD: usize = 256 << 10;

/// Bytes of one client's registered memory fetched ahead in one `process_vm_readv`, valid
/// while the epoch it was read in lasts.
#[derive(Debug, Default)]
struct ReadAhead {
    epoch: u64,
    pid: i32,
    base: usize,
    data: Vec<u8>,
}

/// Most bytes gathered into one `process_vm_writev`.
const WRITE_BEHIND: usize = 1 << 20;

/// Writes to one client's memory that continue each other, gathered to be copied in one
/// `process_vm_writev` (front to back: address order, last byte last).
#[derive(Debug, Default)]
struct Gathered {
    pid: i32,
    base: usize,
    data: Vec<u8>,
}

/// The writes a [`ClientMemory`] holds back, shared with the host that decides when they
/// must land ([`WriteBehind::flush`]).
#[derive(Debug, Clone, Default)]
pub struct WriteBehind {
    pending: Arc<Mutex<Gathered>>,
    failed: Arc<AtomicU64>,
}

impl WriteBehind {
    /// Copy what is held back into the client's memory now. The host calls this before any
    /// completion reaches a client (a completion says the data is there) and before any
    /// packet leaves.
    pub fn flush(&self) {
        let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if g.data.is_empty() {
            return;
        }
        if write_remote(g.pid, g.base, &g.data).is_err() {
            // The client unmapped registered memory, or died: its own data is lost (as a
            // NIC's DMA to pages the process gave up), nobody else's.
            self.failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                pid = g.pid,
                addr = g.base,
                len = g.data.len(),
                "held-back write failed"
            );
        }
        g.data.clear();
    }

    /// Held-back writes that failed when they were flushed.
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

/// [`Memory`] over registered client ranges.
///
/// The engine reads a message one packet at a time; each `process_vm_readv` costs far more
/// in permission checks and page walks than in copying (measured: 70% of a same-host
/// transfer in the kernel, 3% copying). So a read fetches up to 256 KiB (`READ_AHEAD`) of the
/// region at once and later reads are served from them, but only within one *epoch*: the
/// host starts a new one every time it takes the device lock ([`ClientMemory::epoch`]), so
/// every request, post and packet that arrived before is served from memory read after it
/// (as a NIC's DMA would be), never from bytes fetched earlier. Writes and atomics drop
/// what was fetched.
///
/// Writes are gathered the same way: a write that continues the previous one (same client,
/// next address) joins it, and they land together in one `process_vm_writev` when the host
/// flushes ([`ClientMemory::write_behind`]), before any completion or packet leaves the
/// device; a read or atomic, or a write elsewhere, flushes first. The check of the key and
/// the registered range is made at each write, as before; only the copy is deferred.
#[derive(Debug)]
pub struct ClientMemory {
    regions: SharedRegions,
    epoch: Arc<AtomicU64>,
    ahead: ReadAhead,
    behind: WriteBehind,
}

impl ClientMemory {
    /// Memory over the ranges of `regions`.
    pub fn new(regions: SharedRegions) -> ClientMemory {
        ClientMemory {
            regions,
            epoch: Arc::new(AtomicU64::new(1)),
            ahead: ReadAhead::default(),
            behind: WriteBehind::default(),
        }
    }

    /// The writes this memory holds back, for the host to flush.
    pub fn write_behind(&self) -> WriteBehind {
        self.behind.clone()
    }

    /// The epoch counter: bump it whenever later reads must see memory as it is now.
    pub fn epoch(&self) -> Arc<AtomicU64> {
        self.epoch.clone()
    }
}

impl Memory for ClientMemory {
    fn read(&mut self, owner: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let hit = lock(&self.regions).check(owner, addr, buf.len())?;
        self.behind.flush();
        if let Some((m, off)) = &hit.mapped {
            // SAFETY: `check` put `off + buf.len()` within the region, which the mapping
            // covers whole; the mapping lives while `m` does. The client may write the bytes
            // meanwhile, as it may under a NIC's DMA: the copy then holds some mix of them.
            unsafe {
                std::ptr::copy_nonoverlapping(m.as_ptr().add(*off), buf.as_mut_ptr(), buf.len())
            };
            return Ok(());
        }
        let (pid, a, region_end) = (hit.pid, hit.addr, hit.region_end);
        let len = buf.len();
        let epoch = self.epoch.load(Ordering::Acquire);
        let ra = &mut self.ahead;
        if ra.epoch == epoch && ra.pid == pid && a >= ra.base {
            if let Some(src) = ra.data.get(a - ra.base..).and_then(|d| d.get(..len)) {
                buf.copy_from_slice(src);
                return Ok(());
            }
        }
        if len < READ_AHEAD {
            // Within the region: registration checked it is mapped.
            let want = region_end.saturating_sub(a).min(READ_AHEAD).max(len);
            ra.data.resize(want, 0);
            if read_remote(pid, a, &mut ra.data).is_ok() {
                *ra = ReadAhead {
                    epoch,
                    pid,
                    base: a,
                    data: std::mem::take(&mut ra.data),
                };
                buf.copy_from_slice(&ra.data[..len]);
                return Ok(());
            }
            // Part of the region is gone: read just what was asked, and fail as that fails.
            ra.epoch = 0;
        }
        read_remote(pid, a, buf)
    }

    fn write(&mut self, owner: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let hit = lock(&self.regions).check(owner, addr, data.len())?;
        self.ahead.epoch = 0;
        if let Some((m, off)) = &hit.mapped {
            // Writes held back for other regions land first: one order for all of them.
            self.behind.flush();
            // SAFETY: as in `read`; the range is within the mapping, which no Rust
            // reference covers.
            unsafe { copy_last_byte_last(data, m.as_ptr().add(*off)) };
            return Ok(());
        }
        let (pid, a) = (hit.pid, hit.addr);
        if data.len() >= WRITE_BEHIND {
            self.behind.flush();
            return write_remote(pid, a, data);
        }
        let mut g = self
            .behind
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let continues = !g.data.is_empty()
            && g.pid == pid
            && g.base.checked_add(g.data.len()) == Some(a)
            && g.data.len() + data.len() <= WRITE_BEHIND;
        if !continues {
            drop(g);
            self.behind.flush();
            g = self
                .behind
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            g.pid = pid;
            g.base = a;
        }
        g.data.extend_from_slice(data);
        Ok(())
    }

    fn compare_swap(
        &mut self,
        owner: MemOwner,
        addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        let hit = lock(&self.regions).check(owner, addr, 8)?;
        self.ahead.epoch = 0;
        self.behind.flush();
        if let Some(word) = mapped_word(&hit) {
            // A real atomic: atomic even against the client's own CPU.
            return Ok(
                match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(v) | Err(v) => v,
                },
            );
        }
        let (pid, a) = (hit.pid, hit.addr);
        let mut w = [0u8; 8];
        read_remote(pid, a, &mut w)?;
        let old = u64::from_ne_bytes(w);
        if old == compare {
            write_remote(pid, a, &swap.to_ne_bytes())?;
        }
        Ok(old)
    }

    fn fetch_add(&mut self, owner: MemOwner, addr: u64, add: u64) -> Result<u64, MemoryError> {
        let hit = lock(&self.regions).check(owner, addr, 8)?;
        self.ahead.epoch = 0;
        self.behind.flush();
        if let Some(word) = mapped_word(&hit) {
            return Ok(word.fetch_add(add, Ordering::AcqRel));
        }
        let (pid, a) = (hit.pid, hit.addr);
        let mut w = [0u8; 8];
        read_remote(pid, a, &mut w)?;
        let old = u64::from_ne_bytes(w);
        write_remote(pid, a, &old.wrapping_add(add).to_ne_bytes())?;
        Ok(old)
    }
}

/// The 8-byte word an atomic targets, in the daemon's mapping of its region, if it has one
/// and the word is aligned (IBA requires it; the engine checks before it asks).
fn mapped_word(hit: &Hit) -> Option<&std::sync::atomic::AtomicU64> {
    let (m, off) = hit.mapped.as_ref()?;
    // SAFETY: `check` put the 8 bytes within the mapped region.
    let p = unsafe { m.as_ptr().add(*off) };
    if !(p as usize).is_multiple_of(8) {
        return None;
    }
    // SAFETY: aligned, within the mapping, which lives as long as `hit` holds it; every
    // access the daemon makes to the word is atomic (the device lock orders the rest).
    Some(unsafe { &*p.cast::<std::sync::atomic::AtomicU64>() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ahead_serve_one_epoch_only_and_writes_drop_them() {
        let pid = std::process::id() as i32;
        let mut buf = vec![0u8; 8192];
        let base = buf.as_mut_ptr() as u64;
        let regions = SharedRegions::default();
        let owner = lock(&regions).insert(Region {
            pid,
            base,
            len: 8192,
            mapped: None,
        });
        let mut mem = ClientMemory::new(regions);
        let epoch = mem.epoch();
        let mut out = [0u8; 4];
        mem.read(owner, base, &mut out).unwrap();
        // Changed behind the device's back: the same epoch still sees what it fetched...
        buf[4096] = 7;
        std::hint::black_box(&mut buf);
        mem.read(owner, base + 4096, &mut out).unwrap();
        assert_eq!(out[0], 0);
        // ...and a new epoch reads memory again.
        epoch.fetch_add(1, Ordering::Release);
        mem.read(owner, base + 4096, &mut out).unwrap();
        assert_eq!(out[0], 7);
        // The device's own writes are seen at once.
        mem.write(owner, base + 4097, &[9]).unwrap();
        mem.read(owner, base + 4096, &mut out).unwrap();
        assert_eq!(&out[..2], &[7, 9]);
        // Writes that continue each other land together, at the flush.
        let behind = mem.write_behind();
        mem.write(owner, base + 100, b"ab").unwrap();
        mem.write(owner, base + 102, b"cd").unwrap();
        assert_eq!(std::hint::black_box(&buf)[100..104], [0, 0, 0, 0]);
        behind.flush();
        assert_eq!(&std::hint::black_box(&buf)[100..104], b"abcd");
        // Reads near the region's end fetch no further than it.
        mem.read(owner, base + 8188, &mut out).unwrap();
        assert!(mem.read(owner, base + 8190, &mut out).is_err());
        let _ = std::hint::black_box(buf);
    }

    #[test]
    fn reaches_registered_ranges_of_a_process_and_nothing_else() {
        let pid = std::process::id() as i32;
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        assert!(range_is_mapped(pid, base, 64));
        assert!(!range_is_mapped(pid, 8, 64));
        assert!(!range_is_mapped(pid, u64::MAX - 4, 64));
        let regions = SharedRegions::default();
        let owner = lock(&regions).insert(Region {
            pid,
            base,
            len: 64,
            mapped: None,
        });
        let mut mem = ClientMemory::new(regions.clone());
        let behind = mem.write_behind();
        mem.write(owner, base + 8, b"abcd").unwrap();
        let mut out = [0u8; 4];
        mem.read(owner, base + 8, &mut out).unwrap();
        assert_eq!(&out, b"abcd");
        assert_eq!(mem.fetch_add(owner, base + 16, 5).unwrap(), 0);
        assert_eq!(mem.compare_swap(owner, base + 16, 5, 9).unwrap(), 5);
        assert_eq!(mem.compare_swap(owner, base + 16, 5, 1).unwrap(), 9);
        assert!(mem.write(owner, base + 62, b"abc").is_err());
        behind.flush();
        assert!(mem.read(owner, base - 1, &mut out).is_err());
        lock(&regions).remove(owner);
        assert!(matches!(
            mem.read(owner, base, &mut out),
            Err(MemoryError::UnknownOwner(_))
        ));
        drop(mem);
        let buf = std::hint::black_box(buf);
        assert_eq!(&buf[8..12], b"abcd");
        assert_eq!(u64::from_ne_bytes(buf[16..24].try_into().unwrap()), 9);
    }
}
