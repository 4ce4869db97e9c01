//! Memory regions over memory the region owns, so the device can never touch freed memory.

#![allow(unsafe_code)]

use std::alloc::Layout;
use std::ops::{Bound, RangeBounds};

use engine::{AccessFlags, MrHandle, Sge};

use crate::handshake::RemoteMr;
use crate::provider::{Lkey, RawMr, Rkey};
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
/// Buffers live in memory shared through a sealed `memfd` when the system allows, else on
/// the heap. Registered on `softrdmad`, such a buffer is mapped by the daemon too, which then
/// moves its bytes with a memory copy instead of a `process_vm_readv`/`writev` call (which
/// pins and walks the pages of every access: through the daemon, 2-byte `write_lat` took
/// 13 us on heap memory and 7 us shared). Buffers of [`Buffer::SHARED_MIN`] bytes or more
/// have a file of their own; smaller ones take whole pages of a slab file shared by many
/// (one file descriptor per 1 MiB of them, not one per buffer; a slab's pages are reused,
/// never returned to the system). Being a shared mapping, its pages stay shared with a child
/// after `fork`.
pub struct Buffer {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    backing: Backing,
}

/// Where a [`Buffer`]'s bytes live.
enum Backing {
    Heap,
    /// A memfd of its own.
    File(abi::shm::SharedMemory),
    /// Pages `first..first + pages` of slab `slab` (see [`Slabs`]).
    Slab {
        slab: usize,
        first: usize,
        pages: usize,
    },
}

const PAGE: usize = 4096;

/// Buffers in shared memory, by start address: (length, the memfd, the offset in it of the
/// start). An entry lives exactly as long as its buffer's mapping (removed before the
/// mapping is dropped, under this lock); a slab's entry covers every buffer in it and lives
/// as long as the process; an adopted range's, as long as the adoption.
static SHARED_BUFFERS: std::sync::Mutex<std::collections::BTreeMap<usize, (usize, i32, u64)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn shared_buffers(
) -> std::sync::MutexGuard<'static, std::collections::BTreeMap<usize, (usize, i32, u64)>> {
    // Every update is one map operation: a poisoned lock still guards a consistent map.
    SHARED_BUFFERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// If `addr..addr + len` lies within one shared-memory [`Buffer`] or adopted range: a new
/// descriptor of its file, the offset of `addr` in it (for registering it on the daemon),
/// and the start address of its entry.
fn shared_file_of(addr: usize, len: usize) -> Option<(std::os::fd::OwnedFd, u64, usize)> {
    let map = shared_buffers();
    let (&start, &(blen, raw, base)) = map.range(..=addr).next_back()?;
    if addr.checked_add(len)? > start + blen {
        return None;
    }
    // SAFETY: the entry exists only while its buffer's mapping, which owns `raw`, lives (an
    // adopted range's: while the registry's arena, which is never dropped, holds it); it is
    // removed under this lock (held here) before that fd is closed.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
    let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0).ok()?;
    Some((dup, base + (addr - start) as u64, start))
}

/// Every live registration of this process, on any device of either backend, and the memory
/// of the program's own that registrations on the daemon adopted into a memfd (see
/// [`Registry::share`]). Registrations take its lock for the whole verb, so that adopting
/// pages (copy, then remap) never races a device that could write them. Lock order: this,
/// then [`SHARED_BUFFERS`].
#[derive(Default)]
pub(crate) struct Registry {
    /// By (device serial, MR handle): the pages covered, and the adoption it uses.
    live: std::collections::HashMap<(u64, u32), Registered>,
    /// Adopted memory by start address: the adoption and how many live registrations use
    /// it. One that none uses but that other registrations still overlap stays (at 0) until
    /// they go too. Each is also listed in [`SHARED_BUFFERS`] while it lives.
    adopted: std::collections::BTreeMap<usize, (abi::shm::Adopted, usize)>,
    /// The file that holds every adopted range (made at the first adoption, never closed).
    arena: Option<abi::shm::Arena>,
}

struct Registered {
    /// First page and the end of the last, by address.
    pages: (usize, usize),
    adopted: Option<usize>,
}

static REGISTRY: std::sync::LazyLock<std::sync::Mutex<Registry>> =
    std::sync::LazyLock::new(Default::default);

/// The registry, locked.
pub(crate) fn registry() -> std::sync::MutexGuard<'static, Registry> {
    // Each update finishes its map operations before anything can panic: a poisoned lock
    // still guards consistent maps.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// The number that names one open device's registrations in the [`Registry`] (one for each
/// device opened in this process). Dropping it forgets them all: a provider holds it so that
/// it drops once the device can no longer reach their memory (its engine stopped, or the
/// daemon done reclaiming its connection), as `ibv_close_device` ends a NIC's access to
/// regions the program left registered. Adopted memory that no live registration uses goes
/// back to private pages then.
#[derive(Debug)]
pub(crate) struct DeviceSerial(u64);

impl DeviceSerial {
    pub(crate) fn new() -> DeviceSerial {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        DeviceSerial(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

    pub(crate) fn get(&self) -> u64 {
        self.0
    }
}

impl Drop for DeviceSerial {
    fn drop(&mut self) {
        registry().device_closed(self.0);
    }
}

/// Whether registrations on the daemon may move the program's own memory into shared memory
/// (`SOFTRDMA_ADOPT_MEMORY`, on unless `0`).
fn adoption_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SOFTRDMA_ADOPT_MEMORY").is_none_or(|v| v != "0"))
}

/// Make `fork` give the child private copies of adopted memory, as Linux does with the
/// pinned pages of registered memory (what `ibv_is_fork_initialized`'s
/// `IBV_FORK_UNNEEDED` promises): a child's writes never reach the parent's registered
/// buffers. The registry is held across the fork, so the child finds it whole.
fn fork_copies_adopted_memory() {
    thread_local! {
        static HELD: std::cell::RefCell<Option<std::sync::MutexGuard<'static, Registry>>> =
            const { std::cell::RefCell::new(None) };
    }
    extern "C" fn prepare() {
        HELD.with(|h| *h.borrow_mut() = Some(registry()));
    }
    extern "C" fn parent() {
        HELD.with(|h| drop(h.borrow_mut().take()));
    }
    extern "C" fn child() {
        HELD.with(|h| {
            if let Some(mut r) = h.borrow_mut().take() {
                r.forget_in_child();
            }
        });
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: three handlers that only take and release this module's lock and remap
        // this module's adopted memory, on the thread that forks.
        let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if r != 0 {
            tracing::warn!(
                errno = r,
                "no fork handler: a child would share adopted memory"
            );
        }
    });
}

/// Largest range adopted. Adopting reads every page (an untouched one costs a fault that
/// maps the zero page): a region over a vast reservation, most of it never touched, would
/// take seconds to register, and goes through the process file instead.
const ADOPT_MAX: usize = 4 << 30;

/// The whole pages `addr..addr + len` touches.
fn pages_of(addr: usize, len: usize) -> (usize, usize) {
    let end = addr.saturating_add(len.max(1));
    (addr - addr % PAGE, end.div_ceil(PAGE).saturating_mul(PAGE))
}

/// How a registration on the daemon passes `addr..addr + len` when it can pass it as a file
/// the daemon maps: a descriptor of the file, the offset of `addr` in it, and the adopted
/// memory it holds a use of (recorded with [`Registry::registered`], or given up with
/// [`Registry::release`] if the registration fails).
pub(crate) struct SharedRange {
    pub fd: std::os::fd::OwnedFd,
    pub offset: u64,
    pub adopted: Option<usize>,
}

impl Registry {
    /// The file to register `addr..addr + len` with on the daemon: a shared-memory
    /// [`Buffer`]'s, or memory the program allocated itself (the drop-in's callers), adopted
    /// into a memfd when it is whole pages of private anonymous memory that no live
    /// registration touches. `None`: the daemon reaches the range through
    /// `/proc/<pid>/mem`, one system call per access.
    ///
    /// Adopting copies the pages into the file and maps the file in their place, bytes and
    /// addresses unchanged; when no registration touches them any more, private pages come
    /// back. Other threads of the program may write those pages meanwhile: their writes are
    /// held off for the copy and land in the new mapping (`abi::shm::Arena::adopt`); where
    /// the kernel offers no such hold, nothing is adopted. `SOFTRDMA_ADOPT_MEMORY=0` turns
    /// adoption off. After `fork` the child gets its own copy (see
    /// [`fork_copies_adopted_memory`]). Pages that hold the calling thread's stack are never
    /// adopted (its own writes there would wait for the copy it is making).
    ///
    /// # Safety
    /// The caller registers the range: it stays allocated until the registration ends, and
    /// the calling thread does not write it during this call.
    pub(crate) unsafe fn share(&mut self, addr: usize, len: usize) -> Option<SharedRange> {
        if let Some((fd, offset, start)) = shared_file_of(addr, len) {
            let adopted = self.adopted.get_mut(&start).map(|(_, users)| {
                *users += 1;
                start
            });
            return Some(SharedRange {
                fd,
                offset,
                adopted,
            });
        }
        if !adoption_enabled()
            || len == 0
            || len > ADOPT_MAX
            || pages_of(addr, len) != (addr, addr + len)
        {
            return None;
        }
        if self.touched(addr, addr + len) {
            return None;
        }
        let maps = abi::maps::Maps::open(None).ok()?;
        if !maps.private_anonymous(addr as u64, len as u64) {
            return None;
        }
        // The mapping that holds this thread's stack: its writes during the copy would wait
        // for the copy to end, for good.
        let here = &maps as *const abi::maps::Maps as u64;
        let stack = maps.at(here)?;
        if stack.start < (addr + len) as u64 && (addr as u64) < stack.end {
            return None;
        }
        let ptr = std::ptr::NonNull::new(addr as *mut u8)?;
        let arena = match &mut self.arena {
            Some(arena) => arena,
            None => match abi::shm::Arena::create("softrdma-registered") {
                Ok(arena) => self.arena.insert(arena),
                Err(e) => {
                    tracing::debug!(error = %e, "no arena for adopted memory");
                    return None;
                }
            },
        };
        // SAFETY: whole pages of private anonymous read-write memory (just seen in the maps),
        // which the caller keeps allocated and this thread does not write meanwhile (its
        // signal handlers wait: `abi::shm`'s hold defers them); no device reaches them (no
        // live registration touches them, and none starts while the registry is locked);
        // not this thread's stack.
        let a = match unsafe { arena.adopt(ptr, len) } {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, addr, len, "memory not adopted");
                return None;
            }
        };
        use std::os::fd::AsRawFd;
        let offset = a.offset();
        let Ok(fd) = rustix::io::fcntl_dupfd_cloexec(arena.fd(), 0) else {
            // Registered through the process file instead, on private pages again (or, if
            // even that fails, on the shared ones, every byte in place).
            let _ = arena.give_back(a);
            return None;
        };
        shared_buffers().insert(addr, (len, arena.fd().as_raw_fd(), offset));
        self.adopted.insert(addr, (a, 1));
        fork_copies_adopted_memory();
        Some(SharedRange {
            fd,
            offset,
            adopted: Some(addr),
        })
    }

    /// Whether a live registration touches the pages `start..end`.
    fn touched(&self, start: usize, end: usize) -> bool {
        self.live
            .values()
            .any(|r| r.pages.0 < end && start < r.pages.1)
    }

    /// Region `mr` of device `dev` now covers `addr..addr + len`, using adopted memory
    /// `adopted` (from [`Registry::share`]).
    pub(crate) fn registered(
        &mut self,
        dev: u64,
        mr: u32,
        addr: usize,
        len: usize,
        adopted: Option<usize>,
    ) {
        let pages = pages_of(addr, len);
        if let Some(old) = self.live.insert((dev, mr), Registered { pages, adopted }) {
            // A new translation (ibv_rereg_mr): the old range is no longer reached.
            if let Some(start) = old.adopted {
                self.release(start);
            }
            self.give_back_untouched(old.pages);
        }
    }

    /// Region `mr` of device `dev` is gone: the device no longer reaches its memory.
    pub(crate) fn deregistered(&mut self, dev: u64, mr: u32) {
        if let Some(old) = self.live.remove(&(dev, mr)) {
            if let Some(start) = old.adopted {
                self.release(start);
            }
            self.give_back_untouched(old.pages);
        }
    }

    /// Device `dev` is closed: none of its regions reaches memory any more.
    fn device_closed(&mut self, dev: u64) {
        let gone: Vec<u32> = self
            .live
            .keys()
            .filter(|(d, _)| *d == dev)
            .map(|&(_, mr)| mr)
            .collect();
        for mr in gone {
            self.deregistered(dev, mr);
        }
    }

    /// One use of adopted memory `start` less (a registration ended or never began).
    pub(crate) fn release(&mut self, start: usize) {
        if let Some((_, users)) = self.adopted.get_mut(&start) {
            *users = users.saturating_sub(1);
        }
        self.give_back_untouched(pages_of(start, 1));
    }

    /// In a child after `fork`: no registration is inherited, and every adopted page
    /// becomes the child's private copy.
    fn forget_in_child(&mut self) {
        self.live.clear();
        let starts: Vec<usize> = self.adopted.keys().copied().collect();
        for start in starts {
            shared_buffers().remove(&start);
            if let (Some((a, _)), Some(arena)) = (self.adopted.remove(&start), &self.arena) {
                // The parent keeps the file's bytes. On failure the child keeps sharing
                // those pages with it.
                let _ = arena.copy_out(&a);
            }
        }
        // The file is the parent's: the child's own adoptions go to a file of its own.
        self.arena = None;
    }

    /// Give private pages back for every adoption around `pages` that no registration uses
    /// or touches any more.
    fn give_back_untouched(&mut self, pages: (usize, usize)) {
        let idle: Vec<usize> = self
            .adopted
            .range(..pages.1)
            .filter(|(&start, (a, users))| *users == 0 && pages.0 < start + a.len())
            .map(|(&start, _)| start)
            .collect();
        for start in idle {
            let end = start + self.adopted[&start].0.len();
            if self.touched(start, end) {
                continue;
            }
            shared_buffers().remove(&start);
            if let (Some((a, _)), Some(arena)) = (self.adopted.remove(&start), &self.arena) {
                if let Err(e) = arena.give_back(a) {
                    tracing::warn!(error = %e, start, "memory left in its shared file");
                }
            }
        }
    }
}

/// `len` zero bytes in a new memfd, listed in [`SHARED_BUFFERS`] so that registering any
/// range of them passes the file; `None` (logged) when the system gives no shared memory.
fn new_shared(name: &str, len: usize) -> Option<(abi::shm::SharedMemory, std::ptr::NonNull<u8>)> {
    use std::os::fd::AsRawFd;
    let m = match abi::shm::SharedMemory::create(name, len) {
        Ok(m) => m,
        Err(e) => {
            tracing::debug!(error = %e, "no shared memory; buffer on the heap");
            return None;
        }
    };
    // A new mapping is never at address 0 and keeps its file: both hold.
    let ptr = std::ptr::NonNull::new(m.as_ptr())?;
    let fd = m.fd()?.as_raw_fd();
    shared_buffers().insert(ptr.as_ptr() as usize, (len, fd, 0));
    Some((m, ptr))
}

/// Size of one slab of small buffers.
const SLAB_LEN: usize = 1 << 20;

/// The slabs small buffers are cut from, and which of their pages are taken. Slabs are never
/// unmapped (their index in the list names them).
struct Slabs(Vec<(abi::shm::SharedMemory, Vec<bool>)>);

static SLABS: std::sync::Mutex<Slabs> = std::sync::Mutex::new(Slabs(Vec::new()));

fn slabs() -> std::sync::MutexGuard<'static, Slabs> {
    // Updates only flip page flags after their checks: a poisoned lock guards a usable list.
    SLABS.lock().unwrap_or_else(|e| e.into_inner())
}

impl Slabs {
    /// `len` bytes (at most [`Buffer::SHARED_MIN`]) in free pages of a slab, zeroed; a new
    /// slab when none has room. `None` when no shared memory can be made.
    fn take(&mut self, len: usize) -> Option<(std::ptr::NonNull<u8>, Backing)> {
        let pages = len.max(1).div_ceil(PAGE);
        let found = self.0.iter().enumerate().find_map(|(i, (_, used))| {
            let run = used.windows(pages).position(|w| w.iter().all(|&u| !u))?;
            Some((i, run))
        });
        let (slab, first) = match found {
            Some(f) => f,
            None => {
                let (mem, _) = new_shared("softrdma-buffers", SLAB_LEN)?;
                self.0.push((mem, vec![false; SLAB_LEN / PAGE]));
                (self.0.len() - 1, 0)
            }
        };
        let (mem, used) = &mut self.0[slab];
        used[first..first + pages].fill(true);
        // A mapping is never at address 0.
        let ptr = std::ptr::NonNull::new(mem.as_ptr().wrapping_add(first * PAGE))?;
        // SAFETY: these pages lie within the slab's mapping (the run was found in its page
        // list) and were free: nothing else reads or writes them.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, pages * PAGE) };
        Some((ptr, Backing::Slab { slab, first, pages }))
    }

    /// Give pages back.
    fn put(&mut self, slab: usize, first: usize, pages: usize) {
        if let Some(range) = self
            .0
            .get_mut(slab)
            .and_then(|(_, used)| used.get_mut(first..first + pages))
        {
            range.fill(false);
        }
    }
}

impl Buffer {
    /// Size from which a buffer has a shared-memory file of its own (see [`Buffer`]).
    pub const SHARED_MIN: usize = 64 << 10;

    /// `len` zero bytes, aligned to 4096.
    pub fn zeroed(len: usize) -> Buffer {
        if len >= Self::SHARED_MIN {
            if let Some((m, ptr)) = new_shared("softrdma-buffer", len) {
                return Buffer {
                    ptr,
                    len,
                    backing: Backing::File(m),
                };
            }
        } else if let Some((ptr, backing)) = slabs().take(len) {
            return Buffer { ptr, len, backing };
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
            backing: Backing::Heap,
        }
    }

    /// Whether the bytes live in shared memory the daemon can map (see [`Buffer`]).
    pub fn is_shared(&self) -> bool {
        !matches!(self.backing, Backing::Heap)
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
        match std::mem::replace(&mut self.backing, Backing::Heap) {
            Backing::File(m) => {
                let mut map = shared_buffers();
                map.remove(&(self.ptr.as_ptr() as usize));
                // Unmapped and closed with the lock held: no lookup can borrow the fd
                // meanwhile.
                drop(m);
            }
            Backing::Slab { slab, first, pages } => slabs().put(slab, first, pages),
            // SAFETY: allocated in `zeroed` with this same layout.
            Backing::Heap => unsafe {
                std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.len))
            },
        }
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

/// A registered region over memory the crate does not own ([`Pd::register_raw`]); it is
/// deregistered when dropped.
pub struct RawMemoryRegion {
    pd: Pd,
    /// Its handle (the engine's, or the daemon connection's) and keys.
    keys: RawMr,
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
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
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
        let keys = unsafe {
            pd.device()
                .provider()
                .reg_mr(pd.handle(), addr, len, access)?
        };
        Ok(RawMemoryRegion {
            pd: pd.clone(),
            keys,
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
                .provider()
                .dereg_mr_for_good(self.keys.handle);
        }
    }

    /// What the backend names the region by (the engine's handle, or the daemon
    /// connection's).
    pub(crate) fn handle(&self) -> MrHandle {
        self.keys.handle
    }

    /// Local key, for SGEs ([`Sge::new`] takes it; [`Self::sge`] builds one).
    pub fn lkey(&self) -> Lkey {
        self.keys.lkey
    }

    /// Remote key, for peers' RDMA and ATOMIC operations.
    pub fn rkey(&self) -> Rkey {
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
        Ok(Sge::new(self.addr() + off as u64, len32, self.lkey()))
    }

    /// What a peer needs to reach `range` of this region (address, length, rkey).
    pub fn remote(&self, range: impl RangeBounds<usize>) -> Result<RemoteMr> {
        let (off, len) = range_of(range, self.len)?;
        Ok(RemoteMr {
            addr: self.addr() + off as u64,
            len: len as u64,
            rkey: self.rkey(),
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
        self.with_range(0, self.raw.len, f)
    }

    /// Run `f` on `len` bytes at `off` (in bounds) as [`MemoryRegion::with`] does.
    fn with_range<R>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        match self.raw.pd.device().provider().lock_out() {
            Some(_guard) => {
                // SAFETY: in bounds (the callers check) of bytes the region owns (alive,
                // fixed address); holding the device lock excludes every device access, and
                // the application can only reach them through this region's methods, which
                // take the same lock.
                let s =
                    unsafe { std::slice::from_raw_parts((self.raw.addr + off) as *const u8, len) };
                f(s)
            }
            None => f(&self.snapshot(off, len)),
        }
    }

    /// Run `f` on the bytes, mutably, while the device is locked out. `&mut self` keeps other
    /// threads out of [`MemoryRegion::with`]; do not call into the device from `f`.
    ///
    /// On the daemon backend `f` works on a copy, and the bytes it changed are written back
    /// afterwards (bytes it left alone keep whatever the device wrote meanwhile).
    pub fn with_mut<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        match self.raw.pd.device().provider().lock_out() {
            Some(_guard) => {
                // SAFETY: as in `with`; `&mut self` makes this the only application access.
                let s = unsafe {
                    std::slice::from_raw_parts_mut(self.raw.addr as *mut u8, self.raw.len)
                };
                f(s)
            }
            None => {
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
        self.with_range(off, len, |s| out.copy_from_slice(s));
        Ok(())
    }

    /// Copy `data` into the region at `offset`. Takes `&self`: like the device, any thread may
    /// write registered memory; on the embedded backend each copy is atomic with respect to
    /// device accesses (on the daemon backend it is not: see the crate docs).
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let (off, len) = range_of(offset..offset.saturating_add(data.len()), self.raw.len)?;
        match self.raw.pd.device().provider().lock_out() {
            Some(_guard) => {
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
            None => self.store(off, data),
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

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn small_buffers_share_slab_files_page_by_page_and_come_back_zeroed() {
        let mut a = Buffer::zeroed(2);
        let b = Buffer::zeroed(PAGE + 1);
        assert!(a.is_shared() && b.is_shared());
        for buf in [&a, &b] {
            assert_eq!(buf.ptr.as_ptr() as usize % PAGE, 0);
            assert!(buf.as_slice().iter().all(|&x| x == 0));
        }
        let (pa, pb) = (a.ptr.as_ptr() as usize, b.ptr.as_ptr() as usize);
        // Whole pages each: no overlap.
        assert!(pa + PAGE <= pb || pb + 2 * PAGE <= pa, "{pa:#x} {pb:#x}");
        // Both are found in a file, at their offsets, and the file holds their bytes.
        a.as_mut_slice().copy_from_slice(b"hi");
        let (fa, offa, _) = shared_file_of(pa, 2).expect("a's file");
        let (fb, offb, _) = shared_file_of(pb + 5, PAGE - 4).expect("b's file");
        assert!(offa % PAGE as u64 == 0 && offb % PAGE as u64 == 5);
        let mut two = [0u8; 2];
        rustix::io::pread(&fa, &mut two, offa).unwrap();
        assert_eq!(&two, b"hi");
        drop(fb);
        // A range longer than a slab lies in no file.
        assert!(shared_file_of(pa, SLAB_LEN + 1).is_none());
        // Freed pages come back zeroed to the next buffer.
        drop(a);
        let many: Vec<Buffer> = (0..300).map(|_| Buffer::zeroed(100)).collect();
        assert!(many
            .iter()
            .all(|m| m.is_shared() && m.as_slice().iter().all(|&x| x == 0)));
        let mut starts: Vec<usize> = many.iter().map(|m| m.ptr.as_ptr() as usize).collect();
        starts.sort_unstable();
        starts.dedup();
        assert_eq!(starts.len(), 300, "every buffer has pages of its own");
        drop(b);
    }
}
