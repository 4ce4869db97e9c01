//! The daemon's "DMA": [`engine::Memory`] over the address spaces of client processes.
//!
//! Each connection is bound to the process that connected, once, when it is accepted
//! ([`ClientProcess::of_peer`]): the daemon opens that process's `/proc/<pid>/mem` and
//! `/proc/<pid>/maps` and keeps them. An open one stays with the process's address space, not
//! with its number: once the process exits (or execs) they reach nothing, and a process that
//! later gets the same pid (pid_max may be 32768: numbers come round fast) is never reached
//! through them. A pid alone named whichever process held it at each access, so a WRITE to a
//! client that died before its connection was reclaimed could land in a stranger's memory.
//!
//! Every registered range is recorded under a fresh [`MemOwner`] token together with the
//! process of the connection that registered it. Accesses are `pread` / `pwrite` on that
//! process's `mem` only, after a second bounds check against the recorded range; a short
//! transfer (the client unmapped the memory or died) is a [`MemoryError::Fault`], which the
//! engine reports like a protection error. The kernel writes through `mem` as it does for a
//! debugger: a page the client made read-only after registering it still takes a remote
//! WRITE (as pinned pages under a NIC's DMA would; `process_vm_writev` refused it).
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

use foldhash::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use engine::{MemOwner, Memory, MemoryError};

use abi::shm::SharedMemory;

/// Why a connection could not be bound to the process that made it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// The kernel did not name the peer process (`SO_PEERPIDFD`, `SO_PEERCRED`).
    #[error("cannot identify the peer process: {0}")]
    Peer(std::io::Error),
    /// A file of `/proc/<pid>` did not open: the process is gone, or the daemon may not
    /// reach its memory.
    #[error("cannot open /proc/{pid}/{file}: {source}")]
    Open {
        /// The peer's pid.
        pid: i32,
        /// `mem` or `maps`.
        file: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// The process exited before its files were open: they may be another process's.
    #[error("process {0} exited before its connection was served")]
    Exited(i32),
    /// Before Linux 6.5 the kernel names the socket at the other end only through its
    /// socket diagnostics (`unix_diag`, usually a module it loads when asked).
    #[error(
        "cannot name the connection's other end (before Linux 6.5 softrdmad needs the \
         kernel's unix socket diagnostics, module unix_diag): {0}"
    )]
    NoSocketDiag(std::io::Error),
    /// The process that has the peer's number does not hold the other end of the
    /// connection: the peer exited, and the number may be another process's by now.
    #[error("process {0} does not hold the connection's other end")]
    NotPeer(i32),
}

/// A client process, as the daemon reaches it: its memory and its list of mappings, opened
/// while it was known to be the process on the other end of the connection.
#[derive(Debug)]
pub struct ClientProcess {
    /// The pid it had when bound, for messages only: nothing is reached by it.
    pid: i32,
    /// `/proc/<pid>/mem`, read and written at the address as offset.
    mem: OwnedFd,
    /// `/proc/<pid>/maps`.
    maps: abi::maps::Maps,
}

impl ClientProcess {
    /// The process on the other end of `stream`, which it connected (or, for a socket pair,
    /// created).
    ///
    /// Its files are opened through its `/proc/<pid>` directory, opened once: that directory
    /// stays with the process it was opened on (a process that later gets the number is
    /// not reached through it), so the files are that process's. What is left is to know
    /// that it is the peer, not a process that got the number after the peer died:
    /// - Linux 6.5 and later name the peer itself (`SO_PEERPIDFD`): if it still lives after
    ///   the directory was opened, it has held the number since before it connected, so the
    ///   directory is its own;
    /// - before, the process must hold the other end of `stream` (the socket the kernel's
    ///   socket diagnostics name as its peer): the peer, or a process it handed the socket
    ///   to, never a stranger that got a dead peer's number.
    pub fn of_peer(stream: &UnixStream) -> Result<ClientProcess, BindError> {
        use nix::sys::socket::{getsockopt, sockopt::PeerPidfd};
        let pidfd = match getsockopt(stream, PeerPidfd) {
            Ok(pidfd) => Some(pidfd),
            // Before Linux 6.5.
            Err(nix::errno::Errno::ENOPROTOOPT) => None,
            Err(e) => return Err(BindError::Peer(e.into())),
        };
        ClientProcess::of_peer_named(stream, pidfd)
    }

    /// [`ClientProcess::of_peer`] as on a kernel that does not name the peer itself (before
    /// Linux 6.5): the process must hold the other end of `stream`.
    pub fn of_peer_by_socket(stream: &UnixStream) -> Result<ClientProcess, BindError> {
        ClientProcess::of_peer_named(stream, None)
    }

    /// [`ClientProcess::of_peer`], given the peer's pidfd if the kernel names it.
    fn of_peer_named(
        stream: &UnixStream,
        pidfd: Option<OwnedFd>,
    ) -> Result<ClientProcess, BindError> {
        use rustix::fs::{Mode, OFlags};
        let cred =
            rustix::net::sockopt::socket_peercred(stream).map_err(|e| BindError::Peer(e.into()))?;
        let pid = cred.pid.as_raw_nonzero().get();
        let open_err = |file: &'static str| {
            move |e: rustix::io::Errno| BindError::Open {
                pid,
                file,
                source: e.into(),
            }
        };
        let dir = rustix::fs::open(
            format!("/proc/{pid}"),
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(open_err("."))?;
        let at = |file: &'static str, flags: OFlags| {
            rustix::fs::openat(&dir, file, flags | OFlags::CLOEXEC, Mode::empty())
                .map_err(open_err(file))
        };
        let mem = at("mem", OFlags::RDWR)?;
        let maps = abi::maps::Maps::from_fd(at("maps", OFlags::RDONLY)?);
        match pidfd {
            Some(pidfd) => {
                // Its pidfd turns readable when it exits.
                use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
                let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
                let ready =
                    poll(&mut fds, PollTimeout::ZERO).map_err(|e| BindError::Peer(e.into()))?;
                if ready != 0 {
                    return Err(BindError::Exited(pid));
                }
            }
            None => {
                let peer = peer_socket(stream).map_err(BindError::NoSocketDiag)?;
                if !holds_socket(&dir, peer) {
                    return Err(BindError::NotPeer(pid));
                }
            }
        }
        Ok(ClientProcess { pid, mem, maps })
    }

    /// The pid the process had when it was bound (it is not reached by it).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Copy `buf.len()` bytes from `addr` in the process.
    pub fn read(&self, addr: usize, buf: &mut [u8]) -> Result<(), MemoryError> {
        let fault = MemoryError::Fault {
            addr: addr as u64,
            len: buf.len(),
        };
        let mut done = 0;
        while done < buf.len() {
            // Read 0 bytes: the range is not mapped, or the process is gone.
            match rustix::io::pread(&self.mem, &mut buf[done..], (addr + done) as u64) {
                Ok(0) => return Err(fault),
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return Err(fault),
            }
        }
        Ok(())
    }

    /// Copy `data` to `addr` in the process. The kernel copies front to back, so the bytes
    /// land in address order, the last byte last.
    pub fn write(&self, addr: usize, data: &[u8]) -> Result<(), MemoryError> {
        let fault = MemoryError::Fault {
            addr: addr as u64,
            len: data.len(),
        };
        let mut done = 0;
        while done < data.len() {
            match rustix::io::pwrite(&self.mem, &data[done..], (addr + done) as u64) {
                Ok(0) => return Err(fault),
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(_) => return Err(fault),
            }
        }
        Ok(())
    }
}

/// The inode of the socket at the other end of `stream`, as the kernel's socket diagnostics
/// report it (`NETLINK_SOCK_DIAG`, `unix_diag` asked for `UDIAG_SHOW_PEER`).
fn peer_socket(stream: &UnixStream) -> std::io::Result<u64> {
    use rustix::net::{netlink, AddressFamily, RecvFlags, SendFlags, SocketType};
    /// `SOCK_DIAG_BY_FAMILY`, `NLM_F_REQUEST`, `NLMSG_ERROR`, `UDIAG_SHOW_PEER`,
    /// `UNIX_DIAG_PEER` (`linux/sock_diag.h`, `linux/netlink.h`, `linux/unix_diag.h`).
    const BY_FAMILY: u16 = 20;
    const REQUEST: u16 = 1;
    const ERROR: u16 = 2;
    const SHOW_PEER: u32 = 4;
    const DIAG_PEER: u16 = 2;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let ino = u32::try_from(rustix::fs::fstat(stream)?.st_ino)
        .map_err(|_| bad("socket inode beyond 32 bits"))?;
    let nl = rustix::net::socket(
        AddressFamily::NETLINK,
        SocketType::DGRAM,
        Some(netlink::SOCK_DIAG),
    )?;
    // struct nlmsghdr (16 bytes) + struct unix_diag_req (24 bytes).
    let mut req = Vec::with_capacity(40);
    req.extend_from_slice(&40u32.to_ne_bytes());
    req.extend_from_slice(&BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&REQUEST.to_ne_bytes());
    req.extend_from_slice(&[0; 8]); // sequence, port
    let family = AddressFamily::UNIX.as_raw() as u8;
    req.extend_from_slice(&[family, 0, 0, 0]); // family, protocol, pad
    req.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    req.extend_from_slice(&ino.to_ne_bytes());
    req.extend_from_slice(&SHOW_PEER.to_ne_bytes());
    req.extend_from_slice(&[0xff; 8]); // no cookie to check
    rustix::net::sendto(
        &nl,
        &req,
        SendFlags::empty(),
        &netlink::SocketAddrNetlink::new(0, 0),
    )?;
    let mut buf = [0u8; 1024];
    let (n, _) = rustix::net::recv(&nl, &mut buf, RecvFlags::empty())?;
    let msg = &buf[..n.min(buf.len())];
    let u16_at = |o: usize| msg.get(o..o + 2).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let u32_at = |o: usize| {
        msg.get(o..o + 4)
            .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    };
    let len = u32_at(0).ok_or_else(|| bad("short netlink answer"))? as usize;
    match u16_at(4) {
        Some(ERROR) => {
            // A negative errno; an absurd one is no reason to panic.
            let errno = u32_at(16).map_or(0, |e| (e as i32).unsigned_abs() as i32);
            return Err(std::io::Error::from_raw_os_error(errno));
        }
        Some(BY_FAMILY) if u32_at(20) == Some(ino) => {}
        _ => return Err(bad("unexpected netlink answer")),
    }
    // Attributes follow the header and struct unix_diag_msg (16 bytes), 4-byte aligned.
    let mut at = 32;
    while at + 4 <= len.min(msg.len()) {
        let (alen, kind) = (
            u16_at(at).unwrap_or(0) as usize,
            u16_at(at + 2).unwrap_or(0),
        );
        if alen < 4 {
            break;
        }
        if kind == DIAG_PEER {
            return u32_at(at + 4)
                .map(u64::from)
                .ok_or_else(|| bad("short peer attribute"));
        }
        at += alen.next_multiple_of(4);
    }
    Err(bad("the kernel named no peer socket"))
}

/// Whether the process of `/proc/<pid>` directory `dir` has socket `inode` open.
fn holds_socket(dir: &OwnedFd, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    let Ok(fds) = rustix::fs::openat(
        dir,
        "fd",
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) else {
        return false;
    };
    let Ok(mut entries) = rustix::fs::Dir::read_from(&fds) else {
        return false;
    };
    entries.by_ref().flatten().any(|e| {
        rustix::fs::readlinkat(&fds, e.file_name(), Vec::new())
            .is_ok_and(|target| target.as_bytes() == want.as_bytes())
    })
}

/// One registered range in a client process.
#[derive(Debug, Clone)]
pub struct Region {
    /// The process whose memory it is.
    pub process: Arc<ClientProcess>,
    /// First byte.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// The same bytes mapped into the daemon, when the client registered them with their
    /// file ([`abi::shm`]): accesses are memory copies then, not `pread` / `pwrite`.
    pub mapped: Option<Arc<SharedMemory>>,
}

/// Where an access lands, once checked against its region, borrowed from the region table:
/// a copy into a mapping is made while the table is locked (no reference counted per
/// access); an access through the process file takes its own reference first.
enum Hit<'a> {
    /// In the region's mapping in the daemon, at this offset.
    Mapped(&'a SharedMemory, usize),
    /// In the client process, through its memory file.
    Process {
        process: &'a Arc<ClientProcess>,
        addr: usize,
        /// End of the region (reads ahead stop there).
        region_end: usize,
    },
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

    fn check(&self, owner: MemOwner, addr: u64, len: usize) -> Result<Hit<'_>, MemoryError> {
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
        Ok(match &r.mapped {
            Some(m) => Hit::Mapped(m, (addr - r.base) as usize),
            None => Hit::Process {
                process: &r.process,
                addr: usize::try_from(addr).map_err(|_| fault)?,
                region_end: usize::try_from(region_end).map_err(|_| fault)?,
            },
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

/// Whether `addr..addr + len` is mapped readable and writable in `process` (contiguous
/// mappings may cover it together).
pub fn range_is_mapped(process: &ClientProcess, addr: u64, len: u64) -> bool {
    // A zero-length range needs no mapping.
    len == 0 || process.maps.read_write(addr, len)
}

/// Whether `process` has `fd`'s file mapped shared and read-write over all of
/// `addr..addr + len` with byte `offset` of the file at `addr`: then the daemon's own
/// mapping of that file holds exactly the bytes the client sees at those addresses.
pub fn mapping_matches(
    process: &ClientProcess,
    addr: u64,
    len: u64,
    fd: &impl std::os::fd::AsFd,
    offset: u64,
) -> bool {
    process.maps.shows_file(addr, len, fd, offset)
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

/// What a read fetches when it does not continue the previous fetch.
const FIRST_READ_AHEAD: usize = 16 << 10;

/// Bytes of one client's registered memory fetched ahead in one `pread`, valid while the
/// epoch it was read in lasts.
#[derive(Debug, Default)]
struct ReadAhead {
    epoch: u64,
    process: Option<Arc<ClientProcess>>,
    base: usize,
    data: Vec<u8>,
}

/// Most bytes gathered into one `pwrite`.
const WRITE_BEHIND: usize = 1 << 20;

/// Writes to one client's memory that continue each other, gathered to be copied in one
/// `pwrite` (front to back: address order, last byte last).
#[derive(Debug, Default)]
struct Gathered {
    process: Option<Arc<ClientProcess>>,
    base: usize,
    data: Vec<u8>,
}

/// The writes a [`ClientMemory`] holds back, shared with the host that decides when they
/// must land ([`WriteBehind::flush`]).
#[derive(Debug, Clone, Default)]
pub struct WriteBehind {
    pending: Arc<Mutex<Gathered>>,
    /// Whether `pending` holds a write: read without the lock, so the flush before every
    /// completion and packet costs a load while nothing is held. Set and cleared under the
    /// lock, by the thread that holds the device, which orders it for the next holder.
    held: Arc<AtomicBool>,
    failed: Arc<AtomicU64>,
}

impl WriteBehind {
    /// Copy what is held back into the client's memory now. The host calls this before any
    /// completion reaches a client (a completion says the data is there) and before any
    /// packet leaves.
    pub fn flush(&self) {
        if !self.held.load(Ordering::Relaxed) {
            return;
        }
        let mut g = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        self.held.store(false, Ordering::Relaxed);
        let Some(process) = g.process.take() else {
            return;
        };
        if process.write(g.base, &g.data).is_err() {
            // The client unmapped registered memory, or died: its own data is lost (as a
            // NIC's DMA to pages the process gave up), nobody else's.
            self.failed.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(
                pid = process.pid(),
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
/// The engine reads a message one packet at a time; each system call into another process's
/// memory costs far more in permission checks and page walks than in copying (measured with
/// `process_vm_readv`: 70% of a same-host transfer in the kernel, 3% copying). So a read
/// fetches more of the region than it asks for and later reads are served from those bytes,
/// but only within one *epoch*: the host starts a new one every time it takes the device
/// lock ([`ClientMemory::epoch`]), so every request, post and packet that arrived before is
/// served from memory read after it (as a NIC's DMA would be), never from bytes fetched
/// earlier. Writes and atomics drop what was fetched.
///
/// How much more: 16 KiB (`FIRST_READ_AHEAD`), then twice the last fetch whenever a read
/// continues it, up to 256 KiB (`READ_AHEAD`). A byte costs too: through
/// `/proc/<pid>/mem` (a page at a time, through a bounce page) about three times what it
/// cost `process_vm_readv`, so fetching 256 KiB for a 2-byte READ of a large region took
/// longer than the rest of the request (`examples/access_cost.rs` measures it).
///
/// Writes are gathered the same way: a write that continues the previous one (same client,
/// next address) joins it, and they land together in one `pwrite` when the host flushes
/// ([`ClientMemory::write_behind`]), before any completion or packet leaves the device; a
/// read or atomic, or a write elsewhere, flushes first. The check of the key and the
/// registered range is made at each write, as before; only the copy is deferred, and only
/// once the process has been reached in the epoch: the first write to a process since the
/// device lock was taken is copied at once. A client may die while its connection lives on
/// (a child holds the socket); its region is still registered, and only a copy finds the
/// process gone. Copied at once, that fails the request itself (a NAK, an error completion
/// at the requester) instead of losing the bytes after the ACK; reached in the epoch, the
/// process lived after the request arrived, as it would have for a NIC's DMA.
#[derive(Debug)]
pub struct ClientMemory {
    regions: SharedRegions,
    epoch: Arc<AtomicU64>,
    ahead: ReadAhead,
    behind: WriteBehind,
    /// The process an access last reached, and the epoch it did in.
    reached: Option<(u64, Arc<ClientProcess>)>,
}

impl ClientMemory {
    /// Memory over the ranges of `regions`.
    pub fn new(regions: SharedRegions) -> ClientMemory {
        ClientMemory {
            regions,
            epoch: Arc::new(AtomicU64::new(1)),
            ahead: ReadAhead::default(),
            behind: WriteBehind::default(),
            reached: None,
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

    /// Whether an access reached `process` in the current epoch.
    fn reached_now(&self, process: &Arc<ClientProcess>) -> bool {
        let epoch = self.epoch.load(Ordering::Acquire);
        matches!(&self.reached, Some((e, p)) if *e == epoch && Arc::ptr_eq(p, process))
    }

    /// Note that an access reached `process` in the current epoch.
    fn reach(&mut self, process: &Arc<ClientProcess>) {
        if !self.reached_now(process) {
            self.reached = Some((self.epoch.load(Ordering::Acquire), process.clone()));
        }
    }

    /// An atomic's read and write of the 8 bytes at `a`, under the device lock.
    fn read_modify_write(
        &mut self,
        process: &Arc<ClientProcess>,
        a: usize,
        op: impl FnOnce(u64) -> Option<u64>,
    ) -> Result<u64, MemoryError> {
        let mut w = [0u8; 8];
        process.read(a, &mut w)?;
        self.reach(process);
        let old = u64::from_ne_bytes(w);
        if let Some(new) = op(old) {
            process.write(a, &new.to_ne_bytes())?;
        }
        Ok(old)
    }
}

impl Memory for ClientMemory {
    fn read(&mut self, owner: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let regions = lock(&self.regions);
        let hit = regions.check(owner, addr, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        self.behind.flush();
        let (process, a, region_end) = match hit {
            Hit::Mapped(m, off) => {
                // SAFETY: `check` put `off + buf.len()` within the region, which the mapping
                // covers whole; the mapping lives while `m` does. The client may write the
                // bytes meanwhile, as it may under a NIC's DMA: the copy then holds some mix
                // of them.
                unsafe {
                    std::ptr::copy_nonoverlapping(m.as_ptr().add(off), buf.as_mut_ptr(), buf.len())
                };
                return Ok(());
            }
            Hit::Process {
                process,
                addr,
                region_end,
            } => (process.clone(), addr, region_end),
        };
        drop(regions);
        let len = buf.len();
        let epoch = self.epoch.load(Ordering::Acquire);
        let ra = &mut self.ahead;
        let same = ra
            .process
            .as_ref()
            .is_some_and(|p| Arc::ptr_eq(p, &process));
        if ra.epoch == epoch && same && a >= ra.base {
            if let Some(src) = ra.data.get(a - ra.base..).and_then(|d| d.get(..len)) {
                buf.copy_from_slice(src);
                return Ok(());
            }
        }
        if len < READ_AHEAD {
            // Within the region: registration checked it is mapped. A run of reads through
            // the region (a long message) earns a larger fetch each time it runs past one;
            // the same bytes read again (the same message sent again) do not.
            let follows = same && a > ra.base && a - ra.base <= ra.data.len();
            let window = if follows {
                (2 * ra.data.len()).min(READ_AHEAD)
            } else {
                FIRST_READ_AHEAD
            };
            let want = region_end.saturating_sub(a).min(window).max(len);
            ra.data.resize(want, 0);
            if process.read(a, &mut ra.data).is_ok() {
                ra.epoch = epoch;
                ra.process = Some(process.clone());
                ra.base = a;
                buf.copy_from_slice(&ra.data[..len]);
                self.reach(&process);
                return Ok(());
            }
            // Part of the region is gone: read just what was asked, and fail as that fails.
            ra.epoch = 0;
        }
        process.read(a, buf)?;
        self.reach(&process);
        Ok(())
    }

    fn write(&mut self, owner: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let regions = lock(&self.regions);
        let hit = regions.check(owner, addr, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        self.ahead.epoch = 0;
        let (process, a) = match hit {
            Hit::Mapped(m, off) => {
                // Writes held back for other regions land first: one order for all of them.
                self.behind.flush();
                // SAFETY: as in `read`; the range is within the mapping, which no Rust
                // reference covers.
                unsafe { copy_last_byte_last(data, m.as_ptr().add(off)) };
                return Ok(());
            }
            Hit::Process { process, addr, .. } => (process.clone(), addr),
        };
        drop(regions);
        if data.len() >= WRITE_BEHIND {
            self.behind.flush();
            process.write(a, data)?;
            self.reach(&process);
            return Ok(());
        }
        let pending = self.behind.pending.clone();
        let mut g = pending.lock().unwrap_or_else(|e| e.into_inner());
        let continues = g.process.as_ref().is_some_and(|p| Arc::ptr_eq(p, &process))
            && g.base.checked_add(g.data.len()) == Some(a)
            && g.data.len() + data.len() <= WRITE_BEHIND;
        if !continues {
            drop(g);
            self.behind.flush();
            if !self.reached_now(&process) {
                // Not reached since the device lock was taken: copy now, so that a process
                // gone since fails this request (see the type's comment).
                process.write(a, data)?;
                self.reach(&process);
                return Ok(());
            }
            g = pending.lock().unwrap_or_else(|e| e.into_inner());
            g.process = Some(process);
            g.base = a;
            self.behind.held.store(true, Ordering::Relaxed);
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
        let regions = lock(&self.regions);
        let hit = regions.check(owner, addr, 8)?;
        self.ahead.epoch = 0;
        self.behind.flush();
        let (process, a) = match hit {
            Hit::Mapped(m, off) => {
                return Ok(mapped_atomic(m, off, |old| {
                    (old == compare).then_some(swap)
                }))
            }
            Hit::Process { process, addr, .. } => (process.clone(), addr),
        };
        drop(regions);
        self.read_modify_write(&process, a, |old| (old == compare).then_some(swap))
    }

    fn fetch_add(&mut self, owner: MemOwner, addr: u64, add: u64) -> Result<u64, MemoryError> {
        let regions = lock(&self.regions);
        let hit = regions.check(owner, addr, 8)?;
        self.ahead.epoch = 0;
        self.behind.flush();
        let (process, a) = match hit {
            Hit::Mapped(m, off) => {
                return Ok(mapped_atomic(m, off, |old| Some(old.wrapping_add(add))))
            }
            Hit::Process { process, addr, .. } => (process.clone(), addr),
        };
        drop(regions);
        self.read_modify_write(&process, a, |old| Some(old.wrapping_add(add)))
    }
}

/// An atomic's operation on the 8 bytes at `off` of a region's mapping in the daemon: a real
/// atomic (atomic even against the client's own CPU) when the word is aligned, as IBA
/// requires and the engine checks before it asks; otherwise a read and a write under the
/// device lock. `op` returns the value to store (`None`: leave it) and the old value is
/// returned.
fn mapped_atomic(m: &SharedMemory, off: usize, op: impl Fn(u64) -> Option<u64>) -> u64 {
    use std::sync::atomic::AtomicU64;
    // SAFETY: `check` put the 8 bytes within the mapped region.
    let p = unsafe { m.as_ptr().add(off) };
    if (p as usize).is_multiple_of(8) {
        // SAFETY: aligned, within the mapping, which lives while `m` does; every access the
        // daemon makes to the word is atomic (the device lock orders the rest).
        let word = unsafe { AtomicU64::from_ptr(p.cast::<u64>()) };
        return match word.fetch_update(Ordering::AcqRel, Ordering::Acquire, &op) {
            Ok(v) | Err(v) => v,
        };
    }
    let mut w = [0u8; 8];
    // SAFETY: within the mapping (above); no Rust reference covers it.
    unsafe { std::ptr::copy_nonoverlapping(p, w.as_mut_ptr(), 8) };
    let old = u64::from_ne_bytes(w);
    if let Some(new) = op(old) {
        // SAFETY: as the read.
        unsafe { std::ptr::copy_nonoverlapping(new.to_ne_bytes().as_ptr(), p, 8) };
    }
    old
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test process, bound as a connection's peer is (a socket pair's peer is its
    /// creator).
    fn this_process() -> Arc<ClientProcess> {
        let (a, _b) = UnixStream::pair().unwrap();
        Arc::new(ClientProcess::of_peer(&a).unwrap())
    }

    /// Before Linux 6.5 a connection is bound to the process that holds its other end: the
    /// kernel names that socket, and a process that does not hold it is refused.
    #[test]
    fn the_process_holding_the_other_end_is_the_peer() {
        let (a, b) = UnixStream::pair().unwrap();
        let b_inode = rustix::fs::fstat(&b).unwrap().st_ino;
        assert_eq!(peer_socket(&a).unwrap(), b_inode);
        assert_eq!(
            peer_socket(&b).unwrap(),
            rustix::fs::fstat(&a).unwrap().st_ino
        );
        let dir = |pid: u32| {
            rustix::fs::open(
                format!("/proc/{pid}"),
                rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
                rustix::fs::Mode::empty(),
            )
            .unwrap()
        };
        assert!(holds_socket(&dir(std::process::id()), b_inode));
        // So a connection binds without the peer's pidfd, and reaches this process.
        let bound = ClientProcess::of_peer_by_socket(&a).unwrap();
        let word = 0x5eed_u64;
        let mut got = [0u8; 8];
        bound.read(&word as *const u64 as usize, &mut got).unwrap();
        assert_eq!(u64::from_ne_bytes(got), word);
        // A process that got the number of a dead peer holds none of its sockets.
        let mut other = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let stranger = dir(other.id());
        assert!(!holds_socket(&stranger, b_inode));
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(!holds_socket(&stranger, b_inode), "nor does an exited one");
        drop(b);
        assert!(
            !holds_socket(&dir(std::process::id()), b_inode),
            "a closed socket is held by nobody"
        );
    }

    #[test]
    fn reads_ahead_serve_one_epoch_only_and_writes_drop_them() {
        let process = this_process();
        let mut buf = vec![0u8; 8192];
        let base = buf.as_mut_ptr() as u64;
        let regions = SharedRegions::default();
        let owner = lock(&regions).insert(Region {
            process: process.clone(),
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
        // The first write of an epoch lands at once (so it fails if the process is gone);
        // the next ones wait for the flush again.
        epoch.fetch_add(1, Ordering::Release);
        mem.write(owner, base + 200, b"x").unwrap();
        mem.write(owner, base + 300, b"y").unwrap();
        assert_eq!(std::hint::black_box(&buf)[200..=300].first(), Some(&b'x'));
        assert_eq!(std::hint::black_box(&buf)[300], 0);
        behind.flush();
        assert_eq!(std::hint::black_box(&buf)[300], b'y');
        // Reads near the region's end fetch no further than it.
        mem.read(owner, base + 8188, &mut out).unwrap();
        assert!(mem.read(owner, base + 8190, &mut out).is_err());
        let _ = std::hint::black_box(buf);
    }

    #[test]
    fn a_read_fetches_a_little_ahead_and_more_as_a_run_of_reads_continues() {
        let process = this_process();
        let mut buf = vec![0u8; 1 << 20];
        let base = buf.as_mut_ptr() as u64;
        let regions = SharedRegions::default();
        let owner = lock(&regions).insert(Region {
            process,
            base,
            len: 1 << 20,
            mapped: None,
        });
        let mut mem = ClientMemory::new(regions);
        let kib = |k: usize| base + (k << 10) as u64;
        let mut out = [0u8; 1];
        // 16 KiB at first: bytes changed behind the device's back are seen past them...
        mem.read(owner, kib(0), &mut out).unwrap();
        buf[8 << 10] = 1;
        buf[100 << 10] = 2;
        std::hint::black_box(&mut buf);
        mem.read(owner, kib(8), &mut out).unwrap();
        assert_eq!(out[0], 0);
        mem.read(owner, kib(100), &mut out).unwrap();
        assert_eq!(out[0], 2, "fetched 16 KiB, not the whole 256 KiB");
        // The same read again in later epochs (a message sent again) is no run: 16 KiB.
        for _ in 0..2 {
            mem.epoch().fetch_add(1, Ordering::Release);
            mem.read(owner, kib(100), &mut out).unwrap();
        }
        buf[(100 + 17) << 10] = 5;
        std::hint::black_box(&mut buf);
        mem.read(owner, kib(100 + 17), &mut out).unwrap();
        assert_eq!(out[0], 5, "the same read again fetched 16 KiB, not 32");
        // ...and a read that runs on past a fetch gets twice as much.
        mem.epoch().fetch_add(1, Ordering::Release);
        mem.read(owner, kib(200), &mut out).unwrap();
        mem.read(owner, kib(216), &mut out).unwrap();
        buf[(216 + 31) << 10] = 3;
        std::hint::black_box(&mut buf);
        mem.read(owner, kib(216 + 31), &mut out).unwrap();
        assert_eq!(out[0], 0, "the second fetch was 32 KiB");
        let _ = std::hint::black_box(buf);
    }

    #[test]
    fn reaches_registered_ranges_of_a_process_and_nothing_else() {
        let process = this_process();
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        assert!(range_is_mapped(&process, base, 64));
        assert!(!range_is_mapped(&process, 8, 64));
        assert!(!range_is_mapped(&process, u64::MAX - 4, 64));
        let regions = SharedRegions::default();
        let owner = lock(&regions).insert(Region {
            process: process.clone(),
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

    #[test]
    fn a_mapped_region_takes_copies_and_atomics_aligned_or_not() {
        let m = Arc::new(SharedMemory::create("test-region", 64).unwrap());
        let base = 0x7000_0000u64;
        let regions = SharedRegions::default();
        let owner = lock(&regions).insert(Region {
            process: this_process(),
            base,
            len: 64,
            mapped: Some(m.clone()),
        });
        let mut mem = ClientMemory::new(regions);
        mem.write(owner, base + 1, b"xyz").unwrap();
        let mut out = [0u8; 3];
        mem.read(owner, base + 1, &mut out).unwrap();
        assert_eq!(&out, b"xyz");
        for at in [base + 16, base + 33] {
            assert_eq!(mem.fetch_add(owner, at, 5).unwrap(), 0);
            assert_eq!(mem.compare_swap(owner, at, 5, 9).unwrap(), 5);
            assert_eq!(mem.compare_swap(owner, at, 5, 1).unwrap(), 9);
            assert_eq!(mem.fetch_add(owner, at, 1).unwrap(), 9);
        }
        assert!(mem.fetch_add(owner, base + 60, 1).is_err());
        // SAFETY: the test's own 64-byte mapping, which nothing else touches now.
        let bytes = unsafe { std::slice::from_raw_parts(m.as_ptr(), 64) };
        assert_eq!(&bytes[1..4], b"xyz");
        assert_eq!(u64::from_ne_bytes(bytes[16..24].try_into().unwrap()), 10);
        assert_eq!(u64::from_ne_bytes(bytes[33..41].try_into().unwrap()), 10);
    }
}
