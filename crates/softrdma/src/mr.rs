//! Memory regions over memory the region owns, so the device can never touch freed memory.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::ops::{Bound, RangeBounds};

use engine::{AccessFlags, Sge};

use crate::backend::Backend;

use crate::handshake::RemoteMr;
use crate::qp::Pd;
use crate::{Error, Result};

/// A buffer whose bytes stay at one address for as long as the value lives, even when the
/// value itself is moved, so it can be registered and handed to the device.
///
/// # Safety
///
/// `as_mut_ptr` must return the same pointer every time, valid for reads and writes of `len()`
/// bytes until the value is dropped, and moving the value must not move the bytes (heap
/// storage). `len` must not change.
pub unsafe trait RegisterableBuffer: Send + 'static {
    /// Start of the bytes.
    fn as_mut_ptr(&mut self) -> *mut u8;
    /// Number of bytes.
    fn len(&self) -> usize;
    /// True for an empty buffer.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: a Vec's heap storage does not move when the Vec is moved, and the region never
// gives out `&mut Vec` (so it cannot grow or shrink while registered).
unsafe impl RegisterableBuffer for Vec<u8> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
}

// SAFETY: as for Vec: boxed slice storage is on the heap and fixed in size.
unsafe impl RegisterableBuffer for Box<[u8]> {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        <[u8]>::as_mut_ptr(self)
    }
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
}

/// Page-aligned, zero-initialized memory: the natural buffer for a memory region (8-byte
/// atomics need 8-byte alignment, which a `Vec<u8>` does not promise).
///
/// Buffers of [`Buffer::SHARED_MIN`] bytes or more live in a sealed `memfd` (one file
/// descriptor each) when the system allows, else on the heap. Registered on `softrdmad`, such
/// a buffer is mapped by the daemon too, which then moves its bytes with one memory copy
/// instead of `process_vm_readv`/`writev` (much faster for large transfers). Being a shared
/// mapping, its pages stay shared with a child after `fork`.
pub struct Buffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// The memfd mapping, for buffers that have one (then `ptr` points into it).
    shared: Option<daemon::shm::SharedMemory>,
}

const PAGE: usize = 4096;

/// Buffers in shared memory, by start address: (length, the memfd). An entry lives exactly
/// as long as its buffer's mapping (removed before the mapping is dropped, under this lock).
static SHARED_BUFFERS: std::sync::Mutex<std::collections::BTreeMap<usize, (usize, i32)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn shared_buffers(
) -> std::sync::MutexGuard<'static, std::collections::BTreeMap<usize, (usize, i32)>> {
    // Every update is one map operation: a poisoned lock still guards a consistent map.
    SHARED_BUFFERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// If `addr..addr + len` lies within one shared-memory [`Buffer`], a new descriptor of its
/// file and the offset of `addr` in it (for registering it on the daemon).
pub(crate) fn shared_file_of(addr: usize, len: usize) -> Option<(std::os::fd::OwnedFd, u64)> {
    let map = shared_buffers();
    let (&start, &(blen, raw)) = map.range(..=addr).next_back()?;
    if addr.checked_add(len)? > start + blen {
        return None;
    }
    // SAFETY: the entry exists only while its buffer's mapping, which owns `raw`, lives; it
    // is removed under this lock (held here) before that fd is closed.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
    let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0).ok()?;
    Some((dup, (addr - start) as u64))
}

impl Buffer {
    /// Size from which a buffer lives in shared memory (see [`Buffer`]).
    pub const SHARED_MIN: usize = 64 << 10;

    /// `len` zero bytes, aligned to 4096.
    pub fn zeroed(len: usize) -> Buffer {
        if len >= Self::SHARED_MIN {
            use std::os::fd::AsRawFd;
            match daemon::shm::SharedMemory::create("softrdma-buffer", len) {
                Ok(m) => {
                    // A new mapping is never at address 0 and keeps its file: both hold.
                    let ptr = std::ptr::NonNull::new(m.as_ptr());
                    if let (Some(ptr), Some(fd)) = (ptr, m.fd().map(|f| f.as_raw_fd())) {
                        shared_buffers().insert(ptr.as_ptr() as usize, (len, fd));
                        return Buffer {
                            ptr,
                            len,
                            shared: Some(m),
                        };
                    }
                }
                Err(e) => tracing::debug!(error = %e, "no shared memory; buffer on the heap"),
            }
        }
        let layout = Self::layout(len);
        // SAFETY: the layout has a non-zero size (at least one byte is allocated).
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(p) else {
            std::alloc::handle_alloc_error(layout)
        };
        Buffer {
            ptr,
            len,
            shared: None,
        }
    }

    /// Whether the bytes live in shared memory the daemon can map (see [`Buffer`]).
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Buffer {
        let mut b = Buffer::zeroed(data.len());
        b.as_mut_slice().copy_from_slice(data);
        b
    }

    fn layout(len: usize) -> Layout {
        // Cannot fail: PAGE is a power of two and sizes beyond isize::MAX are clamped out by
        // the allocator call failing instead.
        Layout::from_size_align(len.max(1), PAGE).unwrap_or(Layout::new::<u8>())
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `len` initialized bytes for the life of `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(m) = self.shared.take() {
            let mut map = shared_buffers();
            map.remove(&(self.ptr.as_ptr() as usize));
            // Unmapped and closed with the lock held: no lookup can borrow the fd meanwhile.
            drop(m);
            return;
        }
        // SAFETY: allocated in `zeroed` with this same layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer").field("len", &self.len).finish()
    }
}

// SAFETY: Buffer uniquely owns its allocation, like a Box<[u8]>.
unsafe impl Send for Buffer {}
// SAFETY: shared access only reads through `&self`.
unsafe impl Sync for Buffer {}

// SAFETY: heap storage allocated once, never reallocated, fixed length.
unsafe impl RegisterableBuffer for Buffer {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// A registered memory region (`ibv_mr`) that owns its buffer. See the crate docs,
/// "Safety of registered memory".
pub struct MemoryRegion<B: RegisterableBuffer = Buffer> {
    raw: RawMemoryRegion,
    buf: Option<B>,
}

impl<B: RegisterableBuffer> std::fmt::Debug for MemoryRegion<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.raw.fmt(f)
    }
}

/// A region's handle (the engine's, or the daemon connection's) and keys.
#[derive(Debug, Clone, Copy)]
struct Keys {
    handle: u32,
    lkey: u32,
    rkey: u32,
}

/// A registered region over memory the crate does not own ([`Pd::register_raw`]); it is
/// deregistered when dropped.
pub struct RawMemoryRegion {
    pd: Pd,
    keys: Keys,
    addr: usize,
    len: usize,
    access: AccessFlags,
    registered: bool,
}

impl std::fmt::Debug for RawMemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.keys.lkey))
            .field("rkey", &format_args!("{:#x}", self.keys.rkey))
            .field("access", &self.access)
            .finish()
    }
}

fn range_of(r: impl RangeBounds<usize>, size: usize) -> Result<(usize, usize)> {
    let start = match r.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match r.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => size,
    };
    if start > end || end > size {
        return Err(Error::OutOfBounds {
            offset: start,
            len: end.saturating_sub(start),
            size,
        });
    }
    Ok((start, end - start))
}

impl RawMemoryRegion {
    /// # Safety
    /// See [`Pd::register_raw`].
    pub(crate) unsafe fn new(
        pd: &Pd,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMemoryRegion> {
        // SAFETY: forwarded from the caller's contract (valid until deregistered).
        let (handle, lkey, rkey) = unsafe {
            pd.device()
                .backend_ref()
                .reg_mr(pd.handle(), addr, len, access)?
        };
        Ok(RawMemoryRegion {
            pd: pd.clone(),
            keys: Keys { handle, lkey, rkey },
            addr: addr as usize,
            len,
            access,
            registered: true,
        })
    }

    /// Deregister (once). When it returns, the device can no longer reach the memory:
    /// a daemon that could not deregister it loses this process's connection first.
    fn dereg(&mut self) {
        if self.registered {
            self.registered = false;
            self.pd
                .device()
                .backend_ref()
                .dereg_mr_for_good(self.keys.handle);
        }
    }

    /// What the backend names the region by (the engine's handle, or the daemon
    /// connection's).
    pub(crate) fn handle(&self) -> u32 {
        self.keys.handle
    }

    /// Local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.keys.lkey
    }

    /// Remote key, for peers' RDMA and ATOMIC operations.
    pub fn rkey(&self) -> u32 {
        self.keys.rkey
    }

    /// The virtual address of the first byte (what SGEs and peers name).
    pub fn addr(&self) -> u64 {
        self.addr as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access flags it was registered with.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }

    /// A scatter/gather element over `range` (byte offsets into the region).
    pub fn sge(&self, range: impl RangeBounds<usize>) -> Result<Sge> {
        let (off, len) = range_of(range, self.len)?;
        let len32 = u32::try_from(len).map_err(|_| Error::OutOfBounds {
            offset: off,
            len,
            size: self.len,
        })?;
        Ok(Sge::new(self.addr() + off as u64, len32, self.keys.lkey))
    }

    /// What a peer needs to reach `range` of this region (address, length, rkey).
    pub fn remote(&self, range: impl RangeBounds<usize>) -> Result<RemoteMr> {
        let (off, len) = range_of(range, self.len)?;
        Ok(RemoteMr {
            addr: self.addr() + off as u64,
            len: len as u64,
            rkey: self.keys.rkey,
        })
    }
}

impl Drop for RawMemoryRegion {
    fn drop(&mut self) {
        self.dereg();
    }
}

impl<B: RegisterableBuffer> MemoryRegion<B> {
    pub(crate) fn new(pd: &Pd, mut buf: B, access: AccessFlags) -> Result<MemoryRegion<B>> {
        let ptr = buf.as_mut_ptr();
        let len = buf.len();
        // SAFETY: `buf` is owned by the region and dropped only after deregistration (Drop of
        // `raw` runs first, `into_inner` deregisters before giving it back); its bytes do not
        // move (RegisterableBuffer contract); the region never lends them out except under the
        // device lock.
        let raw = unsafe { RawMemoryRegion::new(pd, ptr, len, access)? };
        Ok(MemoryRegion {
            raw,
            buf: Some(buf),
        })
    }

    /// Run `f` on the bytes while the device is locked out (it touches registered memory
    /// only under the same lock). Do not call into the device from `f`: it would deadlock.
    ///
    /// On the daemon backend the device cannot be locked out: `f` sees a copy of the bytes
    /// taken just before (see the crate docs, "Safety of registered memory").
    pub fn with<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        match self.raw.pd.device().backend_ref() {
            Backend::Embedded(rt) => {
                let _guard = rt.lock();
                // SAFETY: the region owns the bytes (alive, fixed address); holding the
                // device lock excludes every device access, and the application can only
                // reach them through this region's methods, which take the same lock.
                let s =
                    unsafe { std::slice::from_raw_parts(self.raw.addr as *const u8, self.raw.len) };
                f(s)
            }
            Backend::Daemon(_) => f(&self.snapshot(0, self.raw.len)),
        }
    }

    /// Run `f` on the bytes, mutably, while the device is locked out. `&mut self` keeps other
    /// threads out of [`MemoryRegion::with`]; do not call into the device from `f`.
    ///
    /// On the daemon backend `f` works on a copy, and the bytes it changed are written back
    /// afterwards (bytes it left alone keep whatever the device wrote meanwhile).
    pub fn with_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match self.raw.pd.device().backend_ref() {
            Backend::Embedded(rt) => {
                let _guard = rt.lock();
                // SAFETY: as in `with`; `&mut self` makes this the only application access.
                let s = unsafe {
                    std::slice::from_raw_parts_mut(self.raw.addr as *mut u8, self.raw.len)
                };
                f(s)
            }
            Backend::Daemon(_) => {
                let before = self.snapshot(0, self.raw.len);
                let mut work = before.clone();
                let r = f(&mut work);
                for (i, (old, new)) in before.iter().zip(&work).enumerate() {
                    if old != new {
                        self.store(i, std::slice::from_ref(new));
                    }
                }
                r
            }
        }
    }

    /// `len` bytes at `off` (in bounds), read the way DMA'd memory must be: volatile, one
    /// byte at a time, since the daemon may write them from outside the process meanwhile.
    fn snapshot(&self, off: usize, len: usize) -> Vec<u8> {
        let base = (self.raw.addr + off) as *const u8;
        (0..len)
            // SAFETY: in bounds of memory the region owns and keeps alive; a volatile read
            // of a byte tolerates concurrent writes by the daemon (it sees old or new).
            .map(|i| unsafe { std::ptr::read_volatile(base.add(i)) })
            .collect()
    }

    /// Store `data` at `off` (in bounds) with volatile byte writes (see `snapshot`).
    fn store(&self, off: usize, data: &[u8]) {
        let base = (self.raw.addr + off) as *mut u8;
        for (i, b) in data.iter().enumerate() {
            // SAFETY: in bounds of memory the region owns; the application reaches it only
            // through this region, and the daemon's writes are byte-wise like these.
            unsafe { std::ptr::write_volatile(base.add(i), *b) };
        }
    }

    /// Copy `out.len()` bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let (off, len) = range_of(offset..offset.saturating_add(out.len()), self.raw.len)?;
        match self.raw.pd.device().backend_ref() {
            Backend::Embedded(_) => self.with(|s| out.copy_from_slice(&s[off..off + len])),
            Backend::Daemon(_) => out.copy_from_slice(&self.snapshot(off, len)),
        }
        Ok(())
    }

    /// Copy `data` into the region at `offset`. Takes `&self`: like the device, any thread may
    /// write registered memory; on the embedded backend each copy is atomic with respect to
    /// device accesses (on the daemon backend it is not: see the crate docs).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let (off, len) = range_of(offset..offset.saturating_add(data.len()), self.raw.len)?;
        match self.raw.pd.device().backend_ref() {
            Backend::Embedded(rt) => {
                let _guard = rt.lock();
                // SAFETY: in bounds (checked above) of memory the region owns; the device
                // lock excludes device accesses and every other application access through
                // this region (all take the lock), so this raw copy races with nothing.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        (self.raw.addr + off) as *mut u8,
                        len,
                    )
                };
            }
            Backend::Daemon(_) => self.store(off, data),
        }
        Ok(())
    }

    /// The whole region, copied.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with(<[u8]>::to_vec)
    }

    /// The 8-byte word at `offset` in host byte order (what ATOMIC operations act on).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(offset, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Store an 8-byte word at `offset` in host byte order.
    pub fn write_u64(&self, offset: usize, v: u64) -> Result<()> {
        self.write(offset, &v.to_ne_bytes())
    }

    /// Deregister and give the buffer back (the device will never touch it again).
    pub fn into_inner(mut self) -> B {
        self.raw.dereg();
        // Present until now: only `into_inner` (consuming) and Drop take it.
        self.buf
            .take()
            .unwrap_or_else(|| unreachable!("buffer taken twice"))
    }

    /// The bytes without the lock.
    ///
    /// # Safety
    ///
    /// No device access to the region may happen while the slice lives: no posted work
    /// request that writes it (receives, READ and ATOMIC results) may be outstanding, and no
    /// peer may hold an rkey allowing remote WRITE or ATOMIC on it.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the caller excludes device writes; the bytes are owned and alive.
        unsafe { std::slice::from_raw_parts(self.raw.addr as *const u8, self.raw.len) }
    }
}

impl<B: RegisterableBuffer> std::ops::Deref for MemoryRegion<B> {
    type Target = RawMemoryRegion;
    /// Keys, address, SGE and remote descriptors.
    fn deref(&self) -> &RawMemoryRegion {
        &self.raw
    }
}

impl<B: RegisterableBuffer> Drop for MemoryRegion<B> {
    fn drop(&mut self) {
        // Deregister before the buffer field is dropped.
        self.raw.dereg();
    }
}
