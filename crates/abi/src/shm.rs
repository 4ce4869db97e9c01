//! Registered memory the daemon can map: a client's buffer in a sealed `memfd`, passed with
//! its registration (SCM_RIGHTS), so the daemon copies to and from it with plain memory
//! copies instead of `pread`/`pwrite` on the client's `/proc/<pid>/mem` (which walk every
//! page of every access, most of a same-host transfer's cost).
//!
//! The client makes one with [`SharedMemory::create`] (the `softrdma` API's `Buffer` does,
//! for large buffers). The daemon maps the client's file with [`SharedMemory::map_client`]
//! only after checking what a hostile client could use against it: the file must be sealed
//! against shrinking (a shrunk file turns the daemon's accesses into SIGBUS), and long enough
//! for the range; and the daemon checks that the client really has
//! that file mapped at the registered address, so the daemon touches exactly the bytes the
//! client sees there.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::maps::Maps;

/// Why shared memory could not be made or mapped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// The call.
        what: &'static str,
        /// Its error.
        source: std::io::Error,
    },
    /// The file offered cannot be used.
    #[error("shared memory refused: {0}")]
    Refused(&'static str),
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |e| ShmError::Os {
        what,
        source: e.into(),
    }
}

/// A shared mapping of (part of) a memfd, unmapped on drop.
#[derive(Debug)]
pub struct SharedMemory {
    /// Start of the mapping (page-aligned).
    map: NonNull<u8>,
    map_len: usize,
    /// The first byte of the range asked for, within the mapping.
    skip: usize,
    len: usize,
    /// The file, while this side keeps it (the mapping does not need it).
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is process memory owned by this value (like a Vec's heap storage),
// reached only through raw pointers by its users.
unsafe impl Send for SharedMemory {}
// SAFETY: `&SharedMemory` gives out only the address and the fd; accesses through the
// address are the users' to synchronize (the daemon's device lock; the client's verbs).
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// `len` zero bytes (at least one), page-aligned, in a new memfd called `name`, exactly
    /// that long and sealed against shrinking and growing.
    pub fn create(name: &str, len: usize) -> Result<SharedMemory, ShmError> {
        let size = len.max(1);
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, size as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(os("F_ADD_SEALS"))?;
        let map = map(&fd, 0, size)?;
        Ok(SharedMemory {
            map,
            map_len: size,
            skip: 0,
            len: size,
            fd: Some(fd),
        })
    }

    /// Map `len` bytes at byte `offset` of a peer's file (the descriptor is not kept):
    /// refused unless the file is sealed against shrinking and that long.
    pub fn map_client(fd: &impl AsFd, offset: u64, len: u64) -> Result<SharedMemory, ShmError> {
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(os("F_GET_SEALS"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(ShmError::Refused("file not sealed against shrinking"));
        }
        let st = rustix::fs::fstat(fd).map_err(os("fstat"))?;
        let end = offset
            .checked_add(len)
            .ok_or(ShmError::Refused("offset + length overflows"))?;
        if len == 0 || u64::try_from(st.st_size).map_or(true, |size| end > size) {
            return Err(ShmError::Refused("the range is not within the file"));
        }
        let page = rustix::param::page_size() as u64;
        let start = offset - offset % page;
        let skip = (offset - start) as usize;
        let map_len = usize::try_from(end - start)
            .map_err(|_| ShmError::Refused("the range is too large to map"))?;
        let map = map(fd, start, map_len)?;
        Ok(SharedMemory {
            map,
            map_len,
            skip,
            len: len as usize,
            fd: None,
        })
    }

    /// First byte of the range.
    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: `skip < map_len`: the range starts inside the mapping.
        unsafe { self.map.as_ptr().add(self.skip) }
    }

    /// Bytes in the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range (never: both constructors refuse or round up).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file, to pass to the peer: `None` once taken, and for a peer's file.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// Take the file (the mapping stays): for a creator that hands it to its peer and keeps
    /// no descriptor of its own.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fd.take()
    }
}

fn map(fd: &impl AsFd, offset: u64, len: usize) -> Result<NonNull<u8>, ShmError> {
    // SAFETY: a fresh shared mapping chosen by the kernel (null hint) of a file that is at
    // least `offset + len` bytes long and cannot shrink (checked or sealed by the callers);
    // it aliases no Rust object.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            offset,
        )
    }
    .map_err(os("mmap"))?;
    NonNull::new(p.cast::<u8>()).ok_or(ShmError::Refused("null mapping"))
}

/// How much of a range is locked in memory (`mlock`, `mlockall`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Locked {
    /// None of it.
    No,
    /// All of it.
    Yes,
    /// Some mappings over it are, some not.
    Partly,
}

/// How much of `addr..addr + len` a `/proc/<pid>/smaps` text shows locked: the mappings
/// over it whose `VmFlags` hold `lo`.
fn smaps_locked(smaps: &str, addr: u64, len: u64) -> Locked {
    let end = addr.saturating_add(len);
    let (mut some, mut all) = (false, true);
    let mut current = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            if let Some((start, stop)) = current.take() {
                if start < end && addr < stop {
                    if flags.split_whitespace().any(|f| f == "lo") {
                        some = true;
                    } else {
                        all = false;
                    }
                }
            }
        } else if let Some(m) = crate::maps::parse(line).next() {
            current = Some((m.start, m.end));
        }
    }
    match (some, all) {
        (false, _) => Locked::No,
        (true, true) => Locked::Yes,
        (true, false) => Locked::Partly,
    }
}

/// How much of `addr..addr + len` this process has locked in memory. Most processes lock
/// nothing, which `/proc/self/status` tells without the page-table walk `smaps` costs.
fn own_locked(addr: NonNull<u8>, len: usize) -> Result<Locked, ShmError> {
    let read = |path: &'static str| {
        // A `/proc` file says it has 0 bytes, so `fs::read_to_string` starts with reads of
        // 32 bytes and doubles them: 8 calls for `status`. One page reads it in one.
        use std::io::Read;
        let mut text = String::with_capacity(4096);
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_string(&mut text))
            .map_err(|e| ShmError::Os {
                what: path,
                source: e,
            })?;
        Ok::<_, ShmError>(text)
    };
    let status = read("/proc/self/status")?;
    let none = status
        .lines()
        .find_map(|l| l.strip_prefix("VmLck:"))
        .is_some_and(|v| v.trim() == "0 kB");
    if none {
        return Ok(Locked::No);
    }
    Ok(smaps_locked(
        &read("/proc/self/smaps")?,
        addr.as_ptr() as u64,
        len as u64,
    ))
}

/// One sealed memfd that holds every range of this process's own memory adopted into shared
/// memory ([`Arena::adopt`]), each at an offset of its own: a process that registers many
/// regions holds one descriptor, not one per region. The file only grows (it is sealed
/// against shrinking, so a peer's mapping of it never faults); a range given back leaves a
/// hole that holds no memory.
#[derive(Debug)]
pub struct Arena {
    fd: OwnedFd,
    /// Bytes the file has: the next adoption's offset.
    size: u64,
}

/// A range of this process's memory that lives in the [`Arena`]'s file, mapped shared at its
/// own addresses. [`Arena::give_back`] makes it private memory again; dropped without that,
/// it simply stays shared.
#[derive(Debug)]
#[must_use = "give it back to the arena, or the range stays shared"]
pub struct Adopted {
    addr: NonNull<u8>,
    len: usize,
    /// Offset in the arena's file of the byte at `addr`.
    offset: u64,
}

// SAFETY: like SharedMemory: the value holds an address and numbers; the bytes are the
// process's, reached by its own code as before.
unsafe impl Send for Adopted {}
// SAFETY: `&Adopted` gives out only numbers.
unsafe impl Sync for Adopted {}

/// Write all of `data` at `offset` of `fd`.
fn write_all_at(fd: &OwnedFd, mut data: &[u8], mut offset: u64) -> Result<(), ShmError> {
    while !data.is_empty() {
        match rustix::io::pwrite(fd, data, offset) {
            Ok(0) => return Err(ShmError::Refused("the file took no bytes")),
            Ok(n) => {
                data = &data[n..];
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(os("pwrite")(e)),
        }
    }
    Ok(())
}

/// Fill all of `buf` from `offset` of `fd`.
fn read_exact_at(fd: &OwnedFd, mut buf: &mut [u8], mut offset: u64) -> Result<(), ShmError> {
    while !buf.is_empty() {
        match rustix::io::pread(fd, &mut *buf, offset) {
            Ok(0) => return Err(ShmError::Refused("the file ended early")),
            Ok(n) => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(os("pread")(e)),
        }
    }
    Ok(())
}

/// Move the mapping of `len` bytes at `from` (made by the caller, referred to by nothing
/// else) over `to..to + len` in one step, replacing what is there. On an error it is
/// unmapped and `to` is unchanged.
fn move_over(from: *mut std::ffi::c_void, to: NonNull<u8>, len: usize) -> Result<(), ShmError> {
    // SAFETY: moves the caller's fresh mapping over the range, same length, in one step;
    // nothing else refers to its old address.
    let moved = unsafe {
        rustix::mm::mremap_fixed(
            from,
            len,
            len,
            rustix::mm::MremapFlags::MAYMOVE,
            to.as_ptr().cast(),
        )
    };
    if let Err(e) = moved {
        // SAFETY: the caller's fresh mapping, which nothing else refers to.
        let _ = unsafe { rustix::mm::munmap(from, len) };
        return Err(os("mremap")(e));
    }
    Ok(())
}

/// [`move_over`], the mapping locked in memory first (which faults its pages in).
fn lock_and_move(from: *mut std::ffi::c_void, to: NonNull<u8>, len: usize) -> Result<(), ShmError> {
    // SAFETY: locks the caller's fresh mapping, which nothing else refers to.
    if let Err(e) = unsafe { rustix::mm::mlock(from, len) } {
        // SAFETY: as above.
        let _ = unsafe { rustix::mm::munmap(from, len) };
        return Err(os("mlock")(e));
    }
    move_over(from, to, len)
}

/// The kernel's userfaultfd interface (`linux/userfaultfd.h`), as far as [`WriteHold`] uses
/// it: the handshake, registering a range for write-protect faults, and protecting it.
mod uffd {
    use rustix::ioctl::{opcode, Opcode};

    /// `UFFD_API`: the interface version the handshake asks for.
    pub const API: u64 = 0xAA;
    /// `UFFD_USER_MODE_ONLY`: a flag of `userfaultfd(2)` that lets a process without
    /// `CAP_SYS_PTRACE` make one when `vm.unprivileged_userfaultfd` is 0.
    pub const USER_MODE_ONLY: u32 = 1;
    /// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`: write-protect shared memory (Linux 6.0).
    pub const FEATURE_WP_SHMEM: u64 = 1 << 12;
    /// `UFFD_FEATURE_WP_UNPOPULATED`: write-protect anonymous pages never touched yet too
    /// (Linux 6.4); without it a first write to such a page would not be held.
    pub const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
    /// `UFFDIO_REGISTER_MODE_WP`.
    pub const REGISTER_MODE_WP: u64 = 1 << 1;
    /// `UFFDIO_WRITEPROTECT_MODE_WP`.
    pub const WRITEPROTECT_MODE_WP: u64 = 1 << 0;

    /// `struct uffdio_api`.
    #[repr(C)]
    pub struct Api {
        pub api: u64,
        pub features: u64,
        pub ioctls: u64,
    }

    /// `struct uffdio_range`.
    #[repr(C)]
    pub struct Range {
        pub start: u64,
        pub len: u64,
    }

    /// `struct uffdio_register`.
    #[repr(C)]
    pub struct Register {
        pub range: Range,
        pub mode: u64,
        pub ioctls: u64,
    }

    /// `struct uffdio_writeprotect`.
    #[repr(C)]
    pub struct WriteProtect {
        pub range: Range,
        pub mode: u64,
    }

    pub const IOC_API: Opcode = opcode::read_write::<Api>(0xAA, 0x3F);
    pub const IOC_REGISTER: Opcode = opcode::read_write::<Register>(0xAA, 0x00);
    pub const IOC_WRITEPROTECT: Opcode = opcode::read_write::<WriteProtect>(0xAA, 0x06);
}

std::thread_local! {
    /// Tests set it to hold anonymous memory as a kernel without
    /// `UFFD_FEATURE_WP_UNPOPULATED` (before 6.4) must: always false otherwise.
    static TEST_WITHOUT_WP_UNPOPULATED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Writers of a range held off while it is copied and mapped anew: a userfaultfd that
/// write-protects the range. A thread that writes it meanwhile faults and waits in the
/// kernel; when the hold is dropped (the descriptor closed, after the range was mapped
/// anew) it wakes and writes again, into whatever is mapped there then. Nobody reads the
/// descriptor's fault messages: the waiters only need to be woken, which closing it does.
///
/// What is held is every write made in user mode. Made without `CAP_SYS_PTRACE` where
/// `vm.unprivileged_userfaultfd` is 0 (the usual default), the descriptor is user-mode
/// only: a system call that writes the range meanwhile (a `read` into it) fails with
/// `EFAULT` instead of waiting. The thread that holds must not write the range itself.
struct WriteHold {
    /// Closing it wakes the held writers.
    _fd: OwnedFd,
    /// Dropped after `_fd`: this thread's signals wait until the others' writes go on.
    _signals: SignalsDeferred,
}

/// The calling thread's signals held back until this drops, then delivered. While a range
/// is copied and mapped anew, writers of it wait ([`WriteHold`]) until this very thread has
/// finished: a signal handler run on it meanwhile that wrote the range would wait for good
/// (or, without a hold, write pages about to be replaced).
struct SignalsDeferred(Option<libc::sigset_t>);

impl SignalsDeferred {
    fn new() -> SignalsDeferred {
        let mut all = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        let mut old = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigfillset fills the set it is given; pthread_sigmask reads `all` (filled)
        // and writes the previous mask into `old`. glibc leaves its own internal signals
        // unblocked.
        let blocked = unsafe {
            libc::sigfillset(all.as_mut_ptr()) == 0
                && libc::pthread_sigmask(libc::SIG_BLOCK, all.as_ptr(), old.as_mut_ptr()) == 0
        };
        // SAFETY: written by the successful pthread_sigmask.
        SignalsDeferred(blocked.then(|| unsafe { old.assume_init() }))
    }
}

impl Drop for SignalsDeferred {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            // SAFETY: restores the mask this thread had, read by `new`.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
        }
    }
}

impl WriteHold {
    /// Hold off writes to `addr..addr + len`, mapped private anonymous (`shmem` false) or
    /// shared from a memfd (`shmem` true). `Refused` when this kernel or sandbox offers no
    /// such hold.
    ///
    /// Write-protection holds the pages that are mapped. A page of anonymous memory never
    /// touched is not, and a first write to it would not wait: Linux 6.4 protects those
    /// too (`UFFD_FEATURE_WP_UNPOPULATED`); before, the range is first populated for
    /// reading (`MADV_POPULATE_READ`, Linux 5.14), which maps the shared zero page at each
    /// untouched page at no cost in memory, and that mapping is protected like any other.
    fn new(addr: NonNull<u8>, len: usize, shmem: bool) -> Result<WriteHold, ShmError> {
        if shmem {
            return WriteHold::protect(addr, len, uffd::FEATURE_WP_SHMEM);
        }
        if !TEST_WITHOUT_WP_UNPOPULATED.get() && WriteHold::offers(uffd::FEATURE_WP_UNPOPULATED) {
            return WriteHold::protect(addr, len, uffd::FEATURE_WP_UNPOPULATED);
        }
        // SAFETY: populating changes no byte: it maps what reading would map.
        unsafe {
            rustix::mm::madvise(
                addr.as_ptr().cast(),
                len,
                rustix::mm::Advice::LinuxPopulateRead,
            )
        }
        .map_err(|_| ShmError::Refused("this kernel cannot populate the memory to hold it"))?;
        WriteHold::protect(addr, len, 0)
    }

    /// Whether userfaultfd here offers `feature` (one of [`uffd::FEATURE_WP_SHMEM`] and
    /// [`uffd::FEATURE_WP_UNPOPULATED`]). Asked once each.
    fn offers(feature: u64) -> bool {
        static SHMEM: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        static UNPOPULATED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let cache = match feature {
            uffd::FEATURE_WP_SHMEM => &SHMEM,
            uffd::FEATURE_WP_UNPOPULATED => &UNPOPULATED,
            _ => return false,
        };
        *cache.get_or_init(|| {
            WriteHold::descriptor().is_ok_and(|fd| WriteHold::handshake(&fd, feature).is_ok())
        })
    }

    /// A userfaultfd, handled in user mode only where the process may have no other.
    fn descriptor() -> Result<OwnedFd, ShmError> {
        use rustix::mm::UserfaultfdFlags;
        let flags = UserfaultfdFlags::CLOEXEC | UserfaultfdFlags::NONBLOCK;
        // SAFETY: makes a descriptor only; what it can do to memory is done by its caller,
        // to the caller's range alone.
        unsafe { rustix::mm::userfaultfd(flags) }
            .or_else(|_| {
                // SAFETY: as above.
                unsafe {
                    rustix::mm::userfaultfd(
                        flags | UserfaultfdFlags::from_bits_retain(uffd::USER_MODE_ONLY),
                    )
                }
            })
            .map_err(|_| ShmError::Refused("no userfaultfd here to hold writers off"))
    }

    /// The API handshake of a fresh userfaultfd, asking for `features`.
    fn handshake(fd: &OwnedFd, features: u64) -> Result<(), ShmError> {
        let mut api = uffd::Api {
            api: uffd::API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API takes a `struct uffdio_api`, read and written back.
        unsafe {
            rustix::ioctl::ioctl(
                fd,
                rustix::ioctl::Updater::<{ uffd::IOC_API }, _>::new(&mut api),
            )
        }
        .map_err(|_| ShmError::Refused("this kernel cannot write-protect the memory"))
    }

    /// A userfaultfd asking for `features` that write-protects the mapped pages of the range.
    fn protect(addr: NonNull<u8>, len: usize, features: u64) -> Result<WriteHold, ShmError> {
        // Before any page is protected.
        let signals = SignalsDeferred::new();
        let fd = WriteHold::descriptor()?;
        WriteHold::handshake(&fd, features)?;
        let range = || uffd::Range {
            start: addr.as_ptr() as u64,
            len: len as u64,
        };
        let mut register = uffd::Register {
            range: range(),
            mode: uffd::REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER takes a `struct uffdio_register`; the range is the
        // caller's.
        unsafe {
            rustix::ioctl::ioctl(
                &fd,
                rustix::ioctl::Updater::<{ uffd::IOC_REGISTER }, _>::new(&mut register),
            )
        }
        .map_err(os("UFFDIO_REGISTER"))?;
        let mut protect = uffd::WriteProtect {
            range: range(),
            mode: uffd::WRITEPROTECT_MODE_WP,
        };
        // SAFETY: UFFDIO_WRITEPROTECT takes a `struct uffdio_writeprotect`; the range is
        // the one just registered.
        unsafe {
            rustix::ioctl::ioctl(
                &fd,
                rustix::ioctl::Updater::<{ uffd::IOC_WRITEPROTECT }, _>::new(&mut protect),
            )
        }
        .map_err(os("UFFDIO_WRITEPROTECT"))?;
        Ok(WriteHold {
            _fd: fd,
            _signals: signals,
        })
    }
}

impl Arena {
    /// An empty arena: a memfd called `name`, sealed against shrinking.
    pub fn create(name: &str) -> Result<Arena, ShmError> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::SEAL)
            .map_err(os("F_ADD_SEALS"))?;
        Ok(Arena { fd, size: 0 })
    }

    /// The file, to pass to a peer with the offsets of its ranges.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Move `len` bytes at `addr` into the file, mapped shared read-write at `addr` in place
    /// of the private pages, bytes unchanged.
    ///
    /// # Safety
    /// `addr..addr + len` must be page-aligned, non-empty private anonymous read-write
    /// memory of this process (see [`Maps::private_anonymous`]) that the calling thread
    /// does not write during the call (not its stack). Other threads may: their writes are
    /// held off while the bytes are copied and the mapping replaced (a userfaultfd
    /// write-protects the range: they wait in the kernel), and land in the file. Where no
    /// hold can be had the range is refused, untouched.
    pub unsafe fn adopt(&mut self, addr: NonNull<u8>, len: usize) -> Result<Adopted, ShmError> {
        let page = rustix::param::page_size();
        if len == 0 || !(addr.as_ptr() as usize).is_multiple_of(page) || !len.is_multiple_of(page) {
            return Err(ShmError::Refused("not whole pages"));
        }
        let offset = self.size;
        let size = offset
            .checked_add(len as u64)
            .ok_or(ShmError::Refused("the arena is full"))?;
        // Before the file grows: a range refused here costs the arena nothing.
        let locked = own_locked(addr, len)?;
        if locked == Locked::Partly {
            return Err(ShmError::Refused("partly locked in memory"));
        }
        // Giving back holds a memfd's pages: `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`, Linux 6.0.
        if !WriteHold::offers(uffd::FEATURE_WP_SHMEM) {
            // It could be adopted, never given back: every range would stay in the file.
            return Err(ShmError::Refused(
                "this kernel cannot hold writers off to give memory back",
            ));
        }
        let hold = WriteHold::new(addr, len, false)?;
        rustix::fs::ftruncate(&self.fd, size).map_err(os("ftruncate"))?;
        self.size = size;
        let fill = || -> Result<(), ShmError> {
            // SAFETY: the caller's range: readable, and no one writes it meanwhile (`hold`).
            let bytes = unsafe { std::slice::from_raw_parts(addr.as_ptr(), len) };
            // Runs of pages that are not all zero go into the file with one write each (the
            // kernel copies, no page faults); untouched pages stay holes that hold no memory.
            let mut run: Option<usize> = None;
            for (i, p) in bytes.chunks(page).enumerate() {
                match (p.iter().any(|&b| b != 0), run) {
                    (true, None) => run = Some(i * page),
                    (false, Some(start)) => {
                        write_all_at(&self.fd, &bytes[start..i * page], offset + start as u64)?;
                        run = None;
                    }
                    _ => {}
                }
            }
            if let Some(start) = run {
                write_all_at(&self.fd, &bytes[start..], offset + start as u64)?;
            }
            if locked == Locked::Yes {
                // Locked pages stay locked: the file is mapped elsewhere, locked there, and
                // moved over the range in one step (the lock goes with the mapping).
                return self.move_locked_over(addr, len, offset);
            }
            // SAFETY: replaces the caller's pages (whose bytes the file now holds) by the file,
            // at the same address and length, with the same access: MAP_FIXED is confined to
            // the caller's range.
            unsafe {
                rustix::mm::mmap(
                    addr.as_ptr().cast(),
                    len,
                    ProtFlags::READ | ProtFlags::WRITE,
                    MapFlags::SHARED | MapFlags::FIXED,
                    &self.fd,
                    offset,
                )
            }
            .map_err(os("mmap fixed"))?;
            Ok(())
        };
        let filled = fill();
        // Held writers go on, into the file's pages if the mapping was replaced.
        drop(hold);
        if let Err(e) = filled {
            // The caller's pages are untouched (the mapping is replaced last): free what
            // reached the file.
            let _ = self.punch(offset, len as u64);
            return Err(e);
        }
        Ok(Adopted { addr, len, offset })
    }

    /// Map `len` bytes of the file at `offset` somewhere new, lock them in memory, and move
    /// that mapping over `addr..addr + len` (replacing what is there). On an error nothing
    /// at `addr` changed.
    fn move_locked_over(&self, addr: NonNull<u8>, len: usize, offset: u64) -> Result<(), ShmError> {
        let new = map(&self.fd, offset, len)?;
        lock_and_move(new.as_ptr().cast(), addr, len)
    }

    /// Put private anonymous pages with the range's bytes back at its addresses, and free
    /// its bytes in the file. Leaves the addresses alone unless `/proc/self/maps` shows the
    /// range still mapped there (the owner may have unmapped them early). On an error the
    /// range stays mapped shared, every byte in place.
    /// Writes other threads make meanwhile are held off, as in [`Arena::adopt`], and land in
    /// the private pages; where no hold can be had the range stays shared (`Refused`).
    pub fn give_back(&self, a: Adopted) -> Result<(), ShmError> {
        self.copy_out_holding(&a, true)?;
        // The file's pages of the range hold nothing anyone maps now: free them.
        self.punch(a.offset, a.len as u64)
    }

    /// Free `len` bytes of the file at `offset` (they read as zeros afterwards).
    fn punch(&self, offset: u64, len: u64) -> Result<(), ShmError> {
        rustix::fs::fallocate(
            &self.fd,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            offset,
            len,
        )
        .map_err(os("fallocate"))
    }

    /// Put private anonymous pages with the range's bytes back at its addresses, leaving the
    /// file's bytes as they are: for a child after `fork`, whose parent still maps them,
    /// and whose only thread is the caller (nobody else writes the range meanwhile).
    pub fn copy_out(&self, a: &Adopted) -> Result<(), ShmError> {
        self.copy_out_holding(a, false)
    }

    /// [`Arena::copy_out`], holding other threads' writes off (`hold`) while the bytes are
    /// copied and the mapping replaced.
    fn copy_out_holding(&self, a: &Adopted, hold: bool) -> Result<(), ShmError> {
        let maps = Maps::open(None).map_err(|e| ShmError::Os {
            what: "open /proc/self/maps",
            source: e,
        })?;
        let (addr, len) = (a.addr.as_ptr() as u64, a.len as u64);
        if !maps.shows_file(addr, len, &self.fd, a.offset) {
            return Ok(());
        }
        let locked = own_locked(a.addr, a.len)?;
        if locked == Locked::Partly {
            return Err(ShmError::Refused("partly locked in memory"));
        }
        // Writes made before the hold are in the file, which the copy reads after it.
        // Without a hold (a forked child's only thread copies), its own signal handlers
        // still wait: their writes would land in the pages being replaced.
        let held = match hold {
            true => (Some(WriteHold::new(a.addr, a.len, true)?), None),
            false => (None, Some(SignalsDeferred::new())),
        };
        // SAFETY: a fresh private anonymous mapping chosen by the kernel.
        let copy = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                a.len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .map_err(os("mmap"))?;
        let fill = || -> Result<(), ShmError> {
            // SAFETY: the fresh mapping, `len` bytes, nothing else refers to it.
            let dst = unsafe { std::slice::from_raw_parts_mut(copy.cast::<u8>(), a.len) };
            // The file's data (holes read as zero, as the fresh pages do), one read per
            // extent; nobody writes the range meanwhile (`held`).
            let end = a.offset + len;
            let mut at = a.offset;
            while at < end {
                let data = match rustix::fs::seek(&self.fd, rustix::fs::SeekFrom::Data(at)) {
                    Ok(d) if d < end => d,
                    Ok(_) | Err(rustix::io::Errno::NXIO) => break,
                    Err(e) => return Err(os("SEEK_DATA")(e)),
                };
                let hole = rustix::fs::seek(&self.fd, rustix::fs::SeekFrom::Hole(data))
                    .map_err(os("SEEK_HOLE"))?
                    .min(end);
                let (from, to) = ((data - a.offset) as usize, (hole - a.offset) as usize);
                read_exact_at(&self.fd, &mut dst[from..to], data)?;
                at = hole;
            }
            Ok(())
        };
        if let Err(e) = fill() {
            // SAFETY: the fresh mapping made above, which nothing else refers to.
            let _ = unsafe { rustix::mm::munmap(copy, a.len) };
            return Err(e);
        }
        let moved = if locked == Locked::Yes {
            // Locked pages stay locked (the lock goes with the moved mapping).
            lock_and_move(copy, a.addr, a.len)
        } else {
            move_over(copy, a.addr, a.len)
        };
        // Held writers go on, into the private pages if the copy was moved in.
        drop(held);
        moved
    }
}

impl Adopted {
    /// First byte.
    pub fn addr(&self) -> NonNull<u8> {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty ([`Arena::adopt`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset in the arena's file of the first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this length; no reference into it outlives
        // `self` (users hold raw pointers only while they hold `self`).
        let _ = unsafe { rustix::mm::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const PAGE: usize = 4096;

    /// `len` bytes of fresh private anonymous memory, for the test to unmap.
    fn fresh_pages(len: usize) -> *mut u8 {
        // SAFETY: a fresh private anonymous mapping where the kernel chooses.
        unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .unwrap()
        .cast::<u8>()
    }

    #[test]
    fn a_client_buffer_maps_in_a_second_place_with_the_same_bytes() {
        let a = SharedMemory::create("t", 3 * PAGE + 10).unwrap();
        assert_eq!(a.len(), 3 * PAGE + 10);
        // SAFETY: within the fresh mapping, which nothing else uses.
        unsafe { a.as_ptr().add(PAGE + 5).write(0x5a) };
        let b = SharedMemory::map_client(&a.fd().unwrap(), PAGE as u64 + 5, 100).unwrap();
        assert!(b.fd().is_none(), "a peer's descriptor is not kept");
        // SAFETY: within b's range.
        assert_eq!(unsafe { b.as_ptr().read() }, 0x5a);
        // SAFETY: within b's range; a sees it.
        unsafe { b.as_ptr().add(1).write(0xa5) };
        // SAFETY: within a's range.
        assert_eq!(unsafe { a.as_ptr().add(PAGE + 6).read() }, 0xa5);
    }

    #[test]
    fn files_that_could_shrink_or_are_too_short_are_refused() {
        let loose = rustix::fs::memfd_create("loose", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&loose, 8192).unwrap();
        assert!(matches!(
            SharedMemory::map_client(&loose, 0, 4096),
            Err(ShmError::Refused(_))
        ));
        let mut a = SharedMemory::create("t", PAGE).unwrap();
        for (off, len) in [
            (0, PAGE as u64 + 1),
            (1, PAGE as u64),
            (u64::MAX, 2),
            (0, 0),
        ] {
            assert!(
                matches!(
                    SharedMemory::map_client(&a.fd().unwrap(), off, len),
                    Err(ShmError::Refused(_))
                ),
                "{off}+{len}"
            );
        }
        // The file cannot shrink under a mapping.
        let fd = a.take_fd().unwrap();
        assert!(a.fd().is_none());
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
    }

    #[test]
    fn adopted_memory_keeps_its_bytes_and_gets_them_back_private() {
        let len = 4 * PAGE;
        let p = fresh_pages(len);
        // Pages 0 and 3 written, 1 and 2 untouched.
        // SAFETY: within the mapping, used by this test only.
        unsafe {
            p.write(1);
            p.add(len - 1).write(2);
        }
        let addr = NonNull::new(p).unwrap();
        let maps = Maps::open(None).unwrap();
        assert!(maps.private_anonymous(p as u64, len as u64));
        let mut arena = Arena::create("t").unwrap();
        assert!(matches!(
            // SAFETY: refused before it touches anything.
            unsafe { arena.adopt(NonNull::new(p.wrapping_add(1)).unwrap(), PAGE) },
            Err(ShmError::Refused(_))
        ));
        // Two ranges, at two offsets of the one file.
        // SAFETY: whole pages of private anonymous memory this test owns; no other writer.
        let (a, b) = unsafe {
            (
                arena.adopt(addr, PAGE).unwrap(),
                arena
                    .adopt(NonNull::new(p.add(PAGE)).unwrap(), len - PAGE)
                    .unwrap(),
            )
        };
        assert_eq!((a.offset(), b.offset()), (0, PAGE as u64));
        assert!(maps.shows_file(p as u64, PAGE as u64, &arena.fd(), 0));
        assert!(maps.shows_file(
            p as u64 + PAGE as u64,
            PAGE as u64,
            &arena.fd(),
            PAGE as u64
        ));
        // A second mapping of the file sees the bytes, and its writes show at `p`.
        let peer = SharedMemory::map_client(&arena.fd(), 0, len as u64).unwrap();
        // SAFETY: within both mappings.
        unsafe {
            assert_eq!(
                (peer.as_ptr().read(), peer.as_ptr().add(len - 1).read()),
                (1, 2)
            );
            assert_eq!(peer.as_ptr().add(PAGE).read(), 0);
            peer.as_ptr().add(2 * PAGE).write(3);
            assert_eq!(p.add(2 * PAGE).read(), 3);
        }
        arena.give_back(b).unwrap();
        // SAFETY: within the mappings; `p + PAGE..` is private again, and its bytes in the
        // file were freed (the peer reads zeros there).
        unsafe {
            assert_eq!((p.add(2 * PAGE).read(), p.add(len - 1).read()), (3, 2));
            assert_eq!(peer.as_ptr().add(len - 1).read(), 0);
            p.add(len - 1).write(4);
            assert_eq!(peer.as_ptr().add(len - 1).read(), 0);
            assert_eq!(p.read(), 1, "the other range is untouched");
        }
        assert!(Maps::open(None)
            .unwrap()
            .private_anonymous(p as u64 + PAGE as u64, (len - PAGE) as u64));
        // Addresses the owner mapped anew before the give-back are left alone.
        // SAFETY: replaces the test's own page with fresh private memory, then marks it.
        unsafe {
            rustix::mm::mmap_anonymous(
                p.cast(),
                PAGE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::FIXED,
            )
            .unwrap();
            p.write(7);
        }
        arena.give_back(a).unwrap();
        // SAFETY: the test's mapping, then unmapped.
        unsafe {
            assert_eq!(p.read(), 7);
            rustix::mm::munmap(p.cast(), len).unwrap();
        }
    }

    /// While a range is adopted and given back, again and again: a thread that keeps
    /// counting in its last word loses no increment (a write held off while the bytes are
    /// copied lands in the new mapping), and a thread that writes pages of its second half
    /// for the first time, one every 200 us, loses none of those writes.
    #[test]
    fn writes_during_adoption_and_give_back_are_kept() {
        writes_during_adoption_and_give_back_are_kept_on(false);
    }

    /// The same where the kernel cannot write-protect pages never touched (before Linux
    /// 6.4): the hold populates them first.
    #[test]
    fn writes_during_adoption_are_kept_without_protecting_unpopulated_pages() {
        writes_during_adoption_and_give_back_are_kept_on(true);
    }

    fn writes_during_adoption_and_give_back_are_kept_on(old_kernel: bool) {
        TEST_WITHOUT_WP_UNPOPULATED.set(old_kernel);
        use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
        // Big enough that each copy takes a while: the writers run during it.
        let len = 512 * PAGE;
        let fresh = len / 2 / PAGE - 1;
        let p = fresh_pages(len);
        // The first half holds data, so the copies write it all; the second half is
        // untouched until the second writer reaches it (the counter's page, its last, is
        // written first).
        // SAFETY: within the mapping, used by this test only.
        unsafe { std::ptr::write_bytes(p, 0x11, len / 2) };
        let counter = p.wrapping_add(len - 8) as usize;
        let second_half = p.wrapping_add(len / 2) as usize;
        // SAFETY: the counter word, aligned, inside the mapping.
        unsafe { (counter as *mut u64).write(0) };
        let stop = Arc::new(AtomicBool::new(false));
        let counted = Arc::new(AtomicU64::new(0));
        let counting_started = Arc::new(AtomicBool::new(false));
        let first_touched = Arc::new(AtomicUsize::new(0));
        let counting = {
            let (stop, counted) = (stop.clone(), counted.clone());
            let started = counting_started.clone();
            std::thread::spawn(move || {
                let w = counter as *mut u64;
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: the counter word; only this thread writes it while it runs,
                    // and the mapping lives until the test joins this thread.
                    unsafe { w.write_volatile(w.read_volatile() + 1) };
                    n += 1;
                    if n == 1 {
                        started.store(true, Ordering::Relaxed);
                    }
                }
                counted.store(n, Ordering::Relaxed);
            })
        };
        let touching = {
            let (stop, first_touched) = (stop.clone(), first_touched.clone());
            std::thread::spawn(move || {
                let mut page = 0;
                while !stop.load(Ordering::Relaxed) && page < fresh {
                    // SAFETY: the first byte of an untouched page of the second half (not
                    // the counter's); the mapping lives until the test joins this thread.
                    unsafe {
                        ((second_half + page * PAGE) as *mut u8).write_volatile(page as u8 | 1)
                    };
                    page += 1;
                    first_touched.store(page, Ordering::Relaxed);
                    let t = std::time::Instant::now();
                    while t.elapsed() < std::time::Duration::from_micros(200) {
                        std::hint::spin_loop();
                    }
                }
            })
        };
        let mut arena = Arena::create("t").unwrap();
        let addr = NonNull::new(p).unwrap();
        // Both writers run before the first cycle, and the cycles go on until the second
        // has written all its pages, 40 at least, however the threads are
        // scheduled.
        while !counting_started.load(Ordering::Relaxed)
            || first_touched.load(Ordering::Relaxed) == 0
        {
            std::thread::yield_now();
        }
        let mut cycles = 0;
        while cycles < 40 || first_touched.load(Ordering::Relaxed) < fresh {
            // SAFETY: whole pages of private anonymous memory this test owns; the writers'
            // stores are what the call holds off.
            let a = unsafe { arena.adopt(addr, len) }.unwrap();
            arena.give_back(a).unwrap();
            cycles += 1;
        }
        stop.store(true, Ordering::Relaxed);
        counting.join().unwrap();
        touching.join().unwrap();
        let n = counted.load(Ordering::Relaxed);
        // SAFETY: the counter word; the writers are gone.
        let seen = unsafe { (counter as *const u64).read_volatile() };
        assert_eq!(
            seen, n,
            "increments lost: the thread made {n}, memory holds {seen}"
        );
        let touched = first_touched.load(Ordering::Relaxed);
        for page in 0..touched {
            // SAFETY: within the mapping; the writers are gone.
            let b = unsafe { p.add(len / 2 + page * PAGE).read_volatile() };
            assert_eq!(
                b,
                page as u8 | 1,
                "first write to page {page} of {touched} lost"
            );
        }
        // SAFETY: the test's mapping, unmapped once.
        unsafe { rustix::mm::munmap(p.cast(), len).unwrap() };
    }

    #[test]
    fn smaps_flags_say_how_much_of_a_range_is_locked() {
        const SMAPS: &str = "\
00e03000-00e24000 rw-p 00000000 00:00 0           [heap]
Size:                132 kB
VmFlags: rd wr mr mw me ac
00e24000-00e26000 rw-p 00000000 00:00 0
Size:                  8 kB
Locked:                8 kB
VmFlags: rd wr mr mw me lo ac
00e26000-00e28000 rw-p 00000000 00:00 0
VmFlags: rd wr mr mw me lo ac
";
        assert_eq!(smaps_locked(SMAPS, 0xe03000, 0x1000), Locked::No);
        assert_eq!(smaps_locked(SMAPS, 0xe24000, 0x4000), Locked::Yes);
        assert_eq!(smaps_locked(SMAPS, 0xe23000, 0x2000), Locked::Partly);
        assert_eq!(
            smaps_locked(SMAPS, 0xe30000, 0x1000),
            Locked::No,
            "nothing there"
        );
    }

    /// Locked pages stay locked when adopted and when given back, bytes unchanged; a range
    /// only partly locked is not adopted.
    #[test]
    fn locked_memory_stays_locked_through_adoption() {
        let len = 4 * PAGE;
        let p = fresh_pages(len);
        let addr = NonNull::new(p).unwrap();
        // SAFETY: within the mapping, used by this test only.
        unsafe { p.add(PAGE + 3).write(9) };
        let mut arena = Arena::create("t").unwrap();
        // SAFETY: the test's mapping.
        unsafe { rustix::mm::mlock(p.cast(), PAGE) }.unwrap();
        assert_eq!(own_locked(addr, len).unwrap(), Locked::Partly);
        assert!(matches!(
            // SAFETY: whole pages of private anonymous memory this test owns.
            unsafe { arena.adopt(addr, len) },
            Err(ShmError::Refused(_))
        ));
        // SAFETY: the test's mapping.
        unsafe { rustix::mm::mlock(p.cast(), len) }.unwrap();
        assert_eq!(own_locked(addr, len).unwrap(), Locked::Yes);
        // SAFETY: whole pages of private anonymous memory this test owns; no other writer.
        let a = unsafe { arena.adopt(addr, len) }.unwrap();
        assert!(Maps::open(None)
            .unwrap()
            .shows_file(p as u64, len as u64, &arena.fd(), 0));
        assert_eq!(
            own_locked(addr, len).unwrap(),
            Locked::Yes,
            "adopted, still locked"
        );
        arena.give_back(a).unwrap();
        assert!(Maps::open(None)
            .unwrap()
            .private_anonymous(p as u64, len as u64));
        assert_eq!(
            own_locked(addr, len).unwrap(),
            Locked::Yes,
            "given back, still locked"
        );
        // SAFETY: within the mapping; then unmapped once.
        unsafe {
            assert_eq!(p.add(PAGE + 3).read(), 9);
            rustix::mm::munmap(p.cast(), len).unwrap();
        }
    }
}
