//! The daemon's control path: a Unix stream socket, one thread per connection, and the
//! per-connection handle tables that keep every client inside its own objects.
//!
//! A connection's handles are small numbers that index only that connection's table, so a
//! handle learned from (or guessed about) another client names nothing here. Memory is
//! registered in the process the kernel reports for the socket, bound when the connection is
//! accepted ([`memory::ClientProcess`]), never a process the client claims. A bad header
//! closes the connection (framing is lost); a bad body or a refused verb gets an error
//! answer. When the connection ends, for whatever reason, every object it still holds is
//! destroyed: QPs moved to ERR (flushing their queues) and destroyed, MRs deregistered, CQs
//! destroyed, PDs freed, and the `reclaimed_*` counters show it.

use foldhash::{HashMap, HashMapExt};
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use engine::{
    AccessFlags, AhHandle, AsyncEvent, CqHandle, MemOwner, MrHandle, MwHandle, PdHandle, QpAttr,
    QpAttrMask, QpInitAttr, QpState, ReregFlags, SendOp, SendWr, SrqHandle, VerbsError,
};

use crate::host::{ConnId, Device};
use crate::memory::{self, ClientProcess, Region, SharedRegions};
use crate::wq::{AttachError, Handles, Queue, WorkRing};
use abi::arena::{RingArena, RingPlace};
use abi::proto::{
    wq, DeviceInfo, Header, ProtoError, Request, Response, HEADER_LEN, MAX_EVENTS, MAX_WCS, VERSION,
};
use abi::ring::{Ring, Role};
use abi::shm::SharedMemory;
use abi::wqe;

const EINVAL: i32 = 22;
const EFAULT: i32 = 14;
const EPROTO: i32 = 71;
const ENOMEM: i32 = 12;

/// Largest CQ ring.
const MAX_RING_ENTRIES: u32 = 1 << 16;
/// Largest work ring (2 MiB of WQEs).
const MAX_WORK_RING_ENTRIES: u32 = 1 << 13;
/// Most work rings one connection may hold, unless [`set_max_work_rings_per_connection`]
/// says otherwise: one per bit of a doorbell page. Rings live in the connection's ring
/// arena ([`abi::arena`]), a few mappings however many rings, but each costs the daemon a
/// look-up slot and memory.
pub const MAX_WORK_RINGS_PER_CONNECTION: usize = abi::doorbell::BITS as usize;
/// The limit in force ([`set_max_work_rings_per_connection`]).
static WORK_RING_LIMIT: AtomicUsize = AtomicUsize::new(MAX_WORK_RINGS_PER_CONNECTION);
/// Most bytes a connection's ring arena may take (address space: pages the rings never
/// touch cost no memory). Its chunks are mappings in the daemon, and mappings are a
/// host-wide budget (`vm.max_map_count`) no client may spend for the others: at most a few
/// hundred chunks fit this.
const MAX_ARENA_BYTES: usize = 64 << 30;

/// Hold each connection to at most `n` work rings (at most
/// [`MAX_WORK_RINGS_PER_CONNECTION`]): the one too many is refused with `ENOMEM`, and the
/// client posts to that queue by request. For the whole process (`softrdmad
/// --max-work-rings`).
pub fn set_max_work_rings_per_connection(n: usize) {
    WORK_RING_LIMIT.store(n.min(MAX_WORK_RINGS_PER_CONNECTION), Ordering::Relaxed);
}

/// The next connection's [`ConnId`].
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// Most connection-manager channels one connection may hold.
const MAX_CM_CHANNELS_PER_CONNECTION: usize = 1024;

/// Most objects one connection may hold (the engine's own limits apply too).
const MAX_OBJECTS_PER_CONNECTION: usize = 1 << 16;

macro_rules! stats {
    ($($(#[$doc:meta])* $f:ident,)*) => {
        /// Daemon-wide counters (the `stat` request shows them).
        #[derive(Debug, Default)]
        pub struct Stats {
            $( $(#[$doc])* pub $f: AtomicU64, )*
        }
        impl Stats {
            /// Every counter with its name.
            pub fn snapshot(&self) -> Vec<(String, u64)> {
                vec![$( (stringify!($f).to_string(), self.$f.load(Ordering::Relaxed)), )*]
            }
        }
    };
}

stats! {
    /// Connections accepted.
    connections_accepted,
    /// Connections ended (closed by the client, died, or closed for a bad header).
    connections_closed,
    /// Connections that ended while still holding objects.
    clients_reclaimed,
    /// Messages whose header was bad (the connection was closed).
    bad_headers,
    /// Messages whose body did not decode (answered with an error).
    bad_bodies,
    /// Requests answered with an error (bad handle, refused verb...).
    request_errors,
    /// Handles used that the connection does not hold.
    foreign_handles,
    /// Registrations refused because the range is not mapped in the client.
    unmapped_registrations,
    /// PDs alive.
    live_pds,
    /// MRs alive.
    live_mrs,
    /// CQs alive.
    live_cqs,
    /// QPs alive.
    live_qps,
    /// PDs freed because their connection ended.
    reclaimed_pds,
    /// MRs deregistered because their connection ended.
    reclaimed_mrs,
    /// CQs destroyed because their connection ended.
    reclaimed_cqs,
    /// QPs flushed and destroyed because their connection ended.
    reclaimed_qps,
    /// SRQs alive.
    live_srqs,
    /// AHs alive.
    live_ahs,
    /// SRQs destroyed because their connection ended.
    reclaimed_srqs,
    /// AHs destroyed because their connection ended.
    reclaimed_ahs,
    /// Memory windows alive.
    live_mws,
    /// Memory windows deallocated because their connection ended.
    reclaimed_mws,
    /// Work requests posted by request on the socket (the rest come through work rings).
    posts_by_request,
    /// Registrations of memory the client shared with its file: the daemon maps it and
    /// copies without going through the client's `/proc/<pid>/mem`.
    mapped_registrations,
    /// Connection-manager connections destroyed because their channel closed or their
    /// client went away before destroying them (peers are told).
    reclaimed_cm_ids,
    /// Work rings and CQ rings refused for a connection's limits (work rings per
    /// connection, bytes of its ring arena): the client posts or polls by request instead.
    ring_refusals,
    /// Chunks made for connections' ring arenas (each one mapping in the daemon and one in
    /// its client, however many rings it holds).
    ring_arena_chunks,
}

/// The daemon: its devices, the registered client memory, its counters.
#[derive(Debug)]
pub struct Daemon {
    /// The devices, indexed as in requests.
    pub devices: Vec<Device>,
    /// Registered client memory, shared by every device's engine.
    pub regions: SharedRegions,
    /// Counters.
    pub stats: Stats,
}

/// A verbs object a connection holds.
#[derive(Debug, Clone, Copy)]
enum Obj {
    Pd {
        dev: usize,
        h: PdHandle,
    },
    Mr {
        dev: usize,
        h: MrHandle,
        owner: MemOwner,
    },
    Cq {
        dev: usize,
        h: CqHandle,
    },
    Qp {
        dev: usize,
        qpn: u32,
    },
    Srq {
        dev: usize,
        h: SrqHandle,
    },
    Ah {
        dev: usize,
        h: AhHandle,
    },
    Mw {
        dev: usize,
        h: MwHandle,
    },
}

impl Obj {
    fn dev(&self) -> usize {
        match *self {
            Obj::Pd { dev, .. }
            | Obj::Mr { dev, .. }
            | Obj::Cq { dev, .. }
            | Obj::Qp { dev, .. }
            | Obj::Srq { dev, .. }
            | Obj::Ah { dev, .. }
            | Obj::Mw { dev, .. } => dev,
        }
    }
}

/// An error answer.
struct Fail {
    errno: i32,
    message: String,
}

impl From<VerbsError> for Fail {
    fn from(e: VerbsError) -> Fail {
        Fail {
            errno: e.errno(),
            message: e.to_string(),
        }
    }
}

impl From<runtime::RuntimeError> for Fail {
    fn from(e: runtime::RuntimeError) -> Fail {
        match e {
            runtime::RuntimeError::Verbs(v) => v.into(),
            runtime::RuntimeError::Cm(c) => fail(c.errno(), c.to_string()),
            other => fail(ENOMEM, other.to_string()),
        }
    }
}

fn fail(errno: i32, message: impl Into<String>) -> Fail {
    Fail {
        errno,
        message: message.into(),
    }
}

/// A connection's handle table, shared with its work rings (which translate the handles
/// WQEs name). Lock order: a device lock may be held when taking this one, never the
/// other way round.
type Table = Arc<Mutex<HashMap<u32, Obj>>>;

/// What a work ring of connection `objs` on device `dev` resolves handles with.
struct ConnHandles {
    objs: Table,
    dev: usize,
}

impl ConnHandles {
    fn get(&self, h: u32) -> Option<Obj> {
        lock_table(&self.objs).get(&h).copied()
    }
}

impl Handles for ConnHandles {
    fn ah(&self, ah: u32) -> Option<AhHandle> {
        match self.get(ah)? {
            Obj::Ah { dev, h } if dev == self.dev => Some(h),
            _ => None,
        }
    }

    fn send_wr(&self, wr: &mut SendWr) -> bool {
        let SendOp::BindMw { mw, bind, .. } = &mut wr.op else {
            return true;
        };
        match self.get(mw.0) {
            Some(Obj::Mw { dev, h }) if dev == self.dev => *mw = h,
            _ => return false,
        }
        if bind.length == 0 {
            bind.mr = MrHandle(0);
            return true;
        }
        match self.get(bind.mr.0) {
            Some(Obj::Mr { dev, h, .. }) if dev == self.dev => {
                bind.mr = h;
                true
            }
            _ => false,
        }
    }
}

fn lock_table(t: &Table) -> MutexGuard<'_, HashMap<u32, Obj>> {
    // Every change to the table is a single insert or remove: a panic elsewhere cannot
    // leave it half-made.
    t.lock().unwrap_or_else(|e| e.into_inner())
}

/// One client connection's state.
struct Conn<'d> {
    daemon: &'d Daemon,
    /// Its number among the daemon's connections (its work rings on each device are
    /// filed under it).
    id: ConnId,
    /// The process that connected: its memory, whatever happens to its pid.
    process: Arc<ClientProcess>,
    pid: i32,
    uid: u32,
    greeted: bool,
    objs: Table,
    next: u32,
    /// A file descriptor to pass with the next answer (SCM_RIGHTS).
    pending_fd: Option<OwnedFd>,
    /// The file descriptor that came with the request being served, if any.
    received_fd: Option<OwnedFd>,
    /// This connection's asynchronous event channel, once asked for (the devices hold only
    /// weak references: it dies with the connection).
    event_channel: Option<Arc<nix::sys::eventfd::EventFd>>,
    /// Work rings this connection holds.
    work_rings: usize,
    /// Where this connection's work and CQ rings live.
    arena: RingArena,
    /// The arena's chunks whose file went to the client already, by number.
    chunks_sent: Vec<bool>,
    /// This connection's connection-manager channels, by handle (numbered apart from the
    /// objects: work rings never name them).
    cm_channels: HashMap<u32, CmChan>,
    next_cm: u32,
}

/// A client's connection-manager channel on one device. The device's runtime knows which
/// connections report to it, and refuses this channel any other (another client's).
struct CmChan {
    dev: usize,
    ch: runtime::CmChannel,
}

impl<'d> Conn<'d> {
    fn objs(&self) -> MutexGuard<'_, HashMap<u32, Obj>> {
        lock_table(&self.objs)
    }

    fn insert(&mut self, o: Obj) -> u32 {
        let objs = self.objs.clone();
        let mut objs = lock_table(&objs);
        loop {
            self.next = self.next.wrapping_add(1).max(1);
            if let std::collections::hash_map::Entry::Vacant(e) = objs.entry(self.next) {
                e.insert(o);
                return self.next;
            }
        }
    }

    fn get(&self, h: u32) -> Result<Obj, Fail> {
        let found = self.objs().get(&h).copied();
        found.ok_or_else(|| {
            self.daemon
                .stats
                .foreign_handles
                .fetch_add(1, Ordering::Relaxed);
            fail(
                EINVAL,
                format!("no object with handle {h} on this connection"),
            )
        })
    }

    fn device(&self, dev: u32) -> Result<(usize, &'d Device), Fail> {
        let i = dev as usize;
        self.daemon
            .devices
            .get(i)
            .map(|d| (i, d))
            .ok_or_else(|| fail(EINVAL, format!("no device {dev}")))
    }

    fn pd(&self, h: u32) -> Result<(usize, PdHandle), Fail> {
        match self.get(h)? {
            Obj::Pd { dev, h } => Ok((dev, h)),
            _ => Err(fail(EINVAL, format!("handle {h} is not a PD"))),
        }
    }

    fn cq(&self, h: u32) -> Result<(usize, CqHandle), Fail> {
        match self.get(h)? {
            Obj::Cq { dev, h } => Ok((dev, h)),
            _ => Err(fail(EINVAL, format!("handle {h} is not a CQ"))),
        }
    }

    fn qp(&self, h: u32) -> Result<(usize, u32), Fail> {
        match self.get(h)? {
            Obj::Qp { dev, qpn } => Ok((dev, qpn)),
            _ => Err(fail(EINVAL, format!("handle {h} is not a QP"))),
        }
    }

    fn srq(&self, h: u32) -> Result<(usize, SrqHandle), Fail> {
        match self.get(h)? {
            Obj::Srq { dev, h } => Ok((dev, h)),
            _ => Err(fail(EINVAL, format!("handle {h} is not an SRQ"))),
        }
    }

    fn ah(&self, h: u32) -> Result<(usize, AhHandle), Fail> {
        match self.get(h)? {
            Obj::Ah { dev, h } => Ok((dev, h)),
            _ => Err(fail(EINVAL, format!("handle {h} is not an AH"))),
        }
    }

    fn mw(&self, h: u32) -> Result<(usize, MwHandle), Fail> {
        match self.get(h)? {
            Obj::Mw { dev, h } => Ok((dev, h)),
            _ => Err(fail(EINVAL, format!("handle {h} is not a memory window"))),
        }
    }

    fn mr(&self, h: u32) -> Result<(usize, MrHandle), Fail> {
        match self.get(h)? {
            Obj::Mr { dev, h, .. } => Ok((dev, h)),
            _ => Err(fail(EINVAL, format!("handle {h} is not an MR"))),
        }
    }

    /// A window bind naming this connection's window and region, turned into the engine's
    /// handles of device `dev` (a zero-length bind names no region).
    fn bind_for_engine(&self, dev: usize, bind: &mut engine::MwBind) -> Result<(), Fail> {
        if bind.length == 0 {
            bind.mr = MrHandle(0);
            return Ok(());
        }
        let (d, mr) = self.mr(bind.mr.0)?;
        if d != dev {
            return Err(fail(EINVAL, "the region is on another device"));
        }
        bind.mr = mr;
        Ok(())
    }

    /// A posted WR with the connection's handles it names (a bind's window and region)
    /// replaced by the engine's.
    fn wr_for_engine(&self, dev: usize, mut wr: SendWr) -> Result<SendWr, Fail> {
        if let SendOp::BindMw { mw, bind, .. } = &mut wr.op {
            let (d, h) = self.mw(mw.0)?;
            if d != dev {
                return Err(fail(EINVAL, "the window is on another device"));
            }
            *mw = h;
            self.bind_for_engine(dev, bind)?;
        }
        Ok(wr)
    }

    /// The connection's handle of an engine object on device `dev` that `matches`.
    fn handle_of(&self, dev: usize, matches: impl Fn(&Obj) -> bool) -> Option<u32> {
        self.objs()
            .iter()
            .find(|(_, o)| o.dev() == dev && matches(o))
            .map(|(h, _)| *h)
    }

    /// A post by request must not overtake a WQE its queue's ring holds back for room in
    /// the engine: the queue is full then.
    fn not_backlogged(&self, dev: usize, q: Queue) -> Result<(), Fail> {
        if self.daemon.devices[dev].backlogged(self.id, q) {
            return Err(VerbsError::QueueFull.into());
        }
        Ok(())
    }

    /// `ibv_rereg_mr`: a new translation is this client's memory, reached through its
    /// `/proc/<pid>/mem` (a shared file's registration comes only with `RegMrShared`).
    fn rereg_mr(
        &mut self,
        mr: u32,
        flags: ReregFlags,
        pd: u32,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<Response, Fail> {
        let d = self.daemon;
        let Obj::Mr { dev, h, owner: old } = self.get(mr)? else {
            return Err(fail(EINVAL, format!("handle {mr} is not an MR")));
        };
        let pdh = if flags.contains(ReregFlags::CHANGE_PD) {
            let (pi, pdh) = self.pd(pd)?;
            if pi != dev {
                return Err(fail(EINVAL, "the PD is on another device"));
            }
            pdh
        } else {
            PdHandle(u32::MAX)
        };
        let moves = flags.contains(ReregFlags::CHANGE_TRANSLATION);
        let owner = if moves {
            if length == 0 || !memory::range_is_mapped(&self.process, addr, length) {
                return Err(self.unmapped(format!(
                    "{addr:#x}+{length} is not mapped read-write in pid {}",
                    self.pid
                )));
            }
            memory::lock(&d.regions).insert(Region {
                process: self.process.clone(),
                base: addr,
                len: length,
                mapped: None,
            })
        } else {
            old
        };
        let r = d.devices[dev].with(|e| e.rereg_mr(h, flags, pdh, owner, addr, length, access));
        if moves {
            // The engine reaches the region through one owner only: the other goes.
            memory::lock(&d.regions).remove(if r.is_ok() { old } else { owner });
        }
        let keys = r?;
        self.objs().insert(mr, Obj::Mr { dev, h, owner });
        Ok(Response::Mr {
            handle: mr,
            lkey: keys.lkey.value(),
            rkey: keys.rkey.value(),
        })
    }

    /// `ibv_reg_mr` over `addr..addr + length` of this client, reached through `mapped` when
    /// the daemon maps the same bytes (checked by the caller), else through the process's
    /// `/proc/<pid>/mem`.
    fn reg_mr(
        &mut self,
        pd: u32,
        addr: u64,
        length: u64,
        access: AccessFlags,
        mapped: Option<Arc<SharedMemory>>,
    ) -> Result<Response, Fail> {
        let d = self.daemon;
        self.room()?;
        let (i, pdh) = self.pd(pd)?;
        if length == 0 || !memory::range_is_mapped(&self.process, addr, length) {
            return Err(self.unmapped(format!(
                "{addr:#x}+{length} is not mapped read-write in pid {}",
                self.pid
            )));
        }
        if mapped.is_some() {
            d.stats.mapped_registrations.fetch_add(1, Ordering::Relaxed);
        }
        let owner = memory::lock(&d.regions).insert(Region {
            process: self.process.clone(),
            base: addr,
            len: length,
            mapped,
        });
        match d.devices[i].with(|e| e.reg_mr(pdh, owner, addr, length, access)) {
            Ok(keys) => {
                self.stat(|s| &s.live_mrs, true);
                let handle = self.insert(Obj::Mr {
                    dev: i,
                    h: keys.handle,
                    owner,
                });
                Ok(Response::Mr {
                    handle,
                    lkey: keys.lkey.value(),
                    rkey: keys.rkey.value(),
                })
            }
            Err(e) => {
                memory::lock(&d.regions).remove(owner);
                Err(e.into())
            }
        }
    }

    /// A registration refused because the memory is not there as claimed (counted).
    fn unmapped(&self, message: String) -> Fail {
        self.daemon
            .stats
            .unmapped_registrations
            .fetch_add(1, Ordering::Relaxed);
        fail(EFAULT, message)
    }

    fn cm_chan(&self, h: u32) -> Result<&CmChan, Fail> {
        self.cm_channels
            .get(&h)
            .ok_or_else(|| fail(EINVAL, format!("no CM channel {h} on this connection")))
    }

    /// Channel `h` and the number of QP `qp`, which must be on the channel's device.
    /// Channel `h` and the QPN of QP handle `qp` on its device; handle 0 names no QP (the
    /// client moves its QP itself).
    fn cm_chan_and_qp(&self, h: u32, qp: u32) -> Result<(&CmChan, Option<u32>), Fail> {
        let c = self.cm_chan(h)?;
        if qp == 0 {
            return Ok((c, None));
        }
        let (dev, qpn) = self.qp(qp)?;
        if dev != c.dev {
            return Err(fail(EINVAL, "the QP is on another device than the channel"));
        }
        Ok((c, Some(qpn)))
    }

    /// Let go of everything channel `c` holds: its listens end, its connections are
    /// destroyed (their QPs to ERR, peers told), and the counters show how many.
    fn close_cm_channel(&self, c: &CmChan) {
        let n = self.daemon.devices[c.dev].cm(|g| g.cm_close_channel(&c.ch));
        self.daemon
            .stats
            .reclaimed_cm_ids
            .fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A new ring of `capacity` entries of `entry` bytes in the connection's arena: this
    /// end, and where it is. Refused (and counted) when the arena is full.
    fn arena_ring(
        &mut self,
        capacity: u32,
        entry: usize,
        role: Role,
    ) -> Result<(Ring, RingPlace), Fail> {
        let chunks = self.arena.chunks();
        let made = self.arena.create_ring(capacity, entry, role);
        let grew = self.arena.chunks().saturating_sub(chunks);
        self.daemon
            .stats
            .ring_arena_chunks
            .fetch_add(grew as u64, Ordering::Relaxed);
        made.map_err(|e| self.refused(format!("no room for the ring: {e}")))
    }

    /// Send the file of arena chunk `chunk` with the answer, unless the client has it.
    fn pass_chunk(&mut self, chunk: u32) -> Result<(), Fail> {
        let i = chunk as usize;
        if self.chunks_sent.get(i).copied().unwrap_or(false) {
            return Ok(());
        }
        let fd = self
            .arena
            .chunk_fd(chunk)
            .map_err(|e| fail(ENOMEM, e.to_string()))?;
        if self.chunks_sent.len() <= i {
            self.chunks_sent.resize(i + 1, false);
        }
        self.chunks_sent[i] = true;
        self.pending_fd = Some(fd);
        Ok(())
    }

    /// A ring refused for the connection's limits (counted).
    fn refused(&self, message: String) -> Fail {
        self.daemon
            .stats
            .ring_refusals
            .fetch_add(1, Ordering::Relaxed);
        fail(ENOMEM, message)
    }

    fn room(&self) -> Result<(), Fail> {
        if self.objs().len() >= MAX_OBJECTS_PER_CONNECTION {
            return Err(fail(ENOMEM, "too many objects on this connection"));
        }
        Ok(())
    }

    fn stat(&self, f: impl Fn(&Stats) -> &AtomicU64, up: bool) {
        let c = f(&self.daemon.stats);
        if up {
            c.fetch_add(1, Ordering::Relaxed);
        } else {
            c.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn handle(&mut self, req: Request) -> Result<Response, Fail> {
        if !self.greeted && !matches!(req, Request::Hello { .. }) {
            return Err(fail(EPROTO, "hello first"));
        }
        let d = self.daemon;
        if req.work_queue().is_some() {
            d.stats.posts_by_request.fetch_add(1, Ordering::Relaxed);
        }
        match req {
            Request::Hello { version } => {
                if version != VERSION {
                    return Err(fail(EPROTO, format!("version {version} not supported")));
                }
                self.greeted = true;
                Ok(Response::Hello {
                    version: VERSION,
                    pid: std::process::id(),
                })
            }
            Request::ListDevices => Ok(Response::Devices {
                devices: d
                    .devices
                    .iter()
                    .enumerate()
                    .map(|(i, dev)| DeviceInfo {
                        index: i as u32,
                        name: dev.name.clone(),
                        addrs: dev.addrs.clone(),
                        port: dev.port,
                    })
                    .collect(),
            }),
            Request::QueryDevice { dev } => {
                let (_, dev) = self.device(dev)?;
                let attr = dev.read(|e| e.query_device());
                Ok(Response::DeviceAttr { attr })
            }
            Request::QueryPort { dev, port } => {
                let (_, dev) = self.device(dev)?;
                let attr = dev.read(|e| e.query_port(port))?;
                Ok(Response::PortAttr { attr })
            }
            Request::QueryGid { dev, port, index } => {
                let (_, dev) = self.device(dev)?;
                let gid = dev.read(|e| e.query_gid(port, index))?;
                Ok(Response::Gid { gid })
            }
            Request::AllocPd { dev } => {
                self.room()?;
                let (i, dev) = self.device(dev)?;
                let h = dev.with(|e| e.alloc_pd())?;
                self.stat(|s| &s.live_pds, true);
                let handle = self.insert(Obj::Pd { dev: i, h });
                Ok(Response::Handle { handle })
            }
            Request::DeallocPd { pd } => {
                let (i, h) = self.pd(pd)?;
                d.devices[i].with(|e| e.dealloc_pd(h))?;
                self.objs().remove(&pd);
                self.stat(|s| &s.live_pds, false);
                Ok(Response::Done)
            }
            Request::RegMr {
                pd,
                addr,
                length,
                access,
            } => self.reg_mr(pd, addr, length, access, None),
            Request::RegMrShared {
                pd,
                addr,
                length,
                access,
                offset,
            } => {
                let fd = self
                    .received_fd
                    .take()
                    .ok_or_else(|| fail(EINVAL, "no file descriptor came with the request"))?;
                if length == 0 || !memory::mapping_matches(&self.process, addr, length, &fd, offset)
                {
                    return Err(self.unmapped(format!(
                        "{addr:#x}+{length} is not that file's bytes from {offset} mapped shared \
                         read-write in pid {}",
                        self.pid
                    )));
                }
                let mapped = SharedMemory::map_client(&fd, offset, length)
                    .map_err(|e| fail(EINVAL, e.to_string()))?;
                self.reg_mr(pd, addr, length, access, Some(Arc::new(mapped)))
            }
            Request::ReregMr {
                mr,
                flags,
                pd,
                addr,
                length,
                access,
            } => self.rereg_mr(mr, flags, pd, addr, length, access),
            Request::DeregMr { mr } => match self.get(mr)? {
                Obj::Mr { dev, h, owner } => {
                    d.devices[dev].with(|e| e.dereg_mr(h))?;
                    memory::lock(&d.regions).remove(owner);
                    self.objs().remove(&mr);
                    self.stat(|s| &s.live_mrs, false);
                    Ok(Response::Done)
                }
                _ => Err(fail(EINVAL, format!("handle {mr} is not an MR"))),
            },
            Request::CreateCq { dev, cqe } => {
                self.room()?;
                let (i, dev) = self.device(dev)?;
                let h = dev.with(|e| e.create_cq(cqe))?;
                self.stat(|s| &s.live_cqs, true);
                let handle = self.insert(Obj::Cq { dev: i, h });
                Ok(Response::Handle { handle })
            }
            Request::DestroyCq { cq } => {
                let (i, h) = self.cq(cq)?;
                d.devices[i].with(|e| e.destroy_cq(h))?;
                d.devices[i].detach_ring(self.id, h);
                d.devices[i].drop_channel(h);
                self.objs().remove(&cq);
                self.stat(|s| &s.live_cqs, false);
                Ok(Response::Done)
            }
            Request::CreateQp { init } => self.create_qp(init, None),
            Request::ModifyQp { qp, mask, attr } => {
                let (i, qpn) = self.qp(qp)?;
                d.devices[i].with(|e| e.modify_qp(qpn, &attr, mask))?;
                Ok(Response::Done)
            }
            Request::QueryQp { qp } => {
                let (i, qpn) = self.qp(qp)?;
                let attr = d.devices[i].read(|e| e.query_qp(qpn))?;
                Ok(Response::QpAttr { attr })
            }
            Request::DestroyQp { qp } => {
                let (i, qpn) = self.qp(qp)?;
                d.devices[i].with(|e| e.destroy_qp(qpn))?;
                let n = [Queue::Sq { qpn }, Queue::Rq { qpn }]
                    .into_iter()
                    .filter(|&q| d.devices[i].detach_work_ring(self.id, q))
                    .count();
                self.work_rings = self.work_rings.saturating_sub(n);
                self.objs().remove(&qp);
                self.stat(|s| &s.live_qps, false);
                Ok(Response::Done)
            }
            Request::AttachMcast { qp, gid } => {
                let (i, qpn) = self.qp(qp)?;
                d.devices[i].with(|e| e.attach_mcast(qpn, gid))?;
                Ok(Response::Done)
            }
            Request::DetachMcast { qp, gid } => {
                let (i, qpn) = self.qp(qp)?;
                d.devices[i].with(|e| e.detach_mcast(qpn, gid))?;
                Ok(Response::Done)
            }
            Request::PostSend { qp, wqe } => {
                let (i, qpn) = self.qp(qp)?;
                self.not_backlogged(i, Queue::Sq { qpn })?;
                let (wr, ud) = wqe::decode_send(&wqe).map_err(bad_wqe)?;
                let wr = self.wr_for_engine(i, wr)?;
                match ud {
                    None => d.devices[i].with(|e| e.post_send(qpn, wr))?,
                    Some(mut dest) => {
                        let (ai, ah) = self.ah(dest.ah.0)?;
                        if ai != i {
                            return Err(fail(EINVAL, "QP and AH are on different devices"));
                        }
                        dest.ah = ah;
                        d.devices[i].with(|e| e.post_send_ud(qpn, wr, dest))?
                    }
                }
                Ok(Response::Done)
            }
            Request::PostRecv { qp, wqe } => {
                let (i, qpn) = self.qp(qp)?;
                self.not_backlogged(i, Queue::Rq { qpn })?;
                let wr = wqe::decode_recv(&wqe).map_err(bad_wqe)?;
                d.devices[i].with(|e| e.post_recv(qpn, wr))?;
                Ok(Response::Done)
            }
            Request::PollCq { cq, max } => {
                let (i, h) = self.cq(cq)?;
                if d.devices[i].has_ring(h) {
                    return Err(fail(
                        EINVAL,
                        "this CQ delivers into its ring: poll the ring",
                    ));
                }
                let max = (max as usize).min(MAX_WCS);
                let wcs = d.devices[i].with(|e| e.poll_cq(h, max))?;
                Ok(Response::Completions {
                    cqes: wcs.iter().map(wqe::Cqe::of).collect(),
                })
            }
            Request::AttachCqRing { cq, capacity } => {
                let (i, h) = self.cq(cq)?;
                if !(1..=MAX_RING_ENTRIES).contains(&capacity) || !capacity.is_power_of_two() {
                    return Err(fail(EINVAL, "ring capacity must be a power of two ≤ 65536"));
                }
                if d.devices[i].has_ring(h) {
                    return Err(fail(EINVAL, "this CQ already has a ring"));
                }
                let (ring, place) = self.arena_ring(capacity, wqe::CQE_LEN, Role::Producer)?;
                d.devices[i].attach_ring(self.id, h, ring)?;
                self.pass_chunk(place.chunk)?;
                Ok(Response::RingAt {
                    chunk: place.chunk,
                    offset: place.offset,
                    len: place.len,
                })
            }
            Request::Stat => {
                let mut v = d.stats.snapshot();
                v.push((
                    "registered_ranges".into(),
                    memory::lock(&d.regions).len() as u64,
                ));
                for dev in &d.devices {
                    dev.read(|e| {
                        for (c, n) in e.counters().iter() {
                            v.push((format!("{}.{}", dev.name, c.name()), n));
                        }
                    });
                    for (c, n) in dev.host_counters() {
                        v.push((format!("{}.{c}", dev.name), n));
                    }
                }
                Ok(Response::Stat { counters: v })
            }
            Request::CreateSrq { pd, attr } => {
                self.room()?;
                let (i, pdh) = self.pd(pd)?;
                let h = d.devices[i].with(|e| e.create_srq(pdh, &attr))?;
                self.stat(|s| &s.live_srqs, true);
                let handle = self.insert(Obj::Srq { dev: i, h });
                Ok(Response::Handle { handle })
            }
            Request::DestroySrq { srq } => {
                let (i, h) = self.srq(srq)?;
                d.devices[i].with(|e| e.destroy_srq(h))?;
                let n = d.devices[i].detach_work_ring(self.id, Queue::Srq { srq: h });
                self.work_rings = self.work_rings.saturating_sub(usize::from(n));
                self.objs().remove(&srq);
                self.stat(|s| &s.live_srqs, false);
                Ok(Response::Done)
            }
            Request::PostSrqRecv { srq, wqe } => {
                let (i, h) = self.srq(srq)?;
                self.not_backlogged(i, Queue::Srq { srq: h })?;
                let wr = wqe::decode_recv(&wqe).map_err(bad_wqe)?;
                d.devices[i].with(|e| e.post_srq_recv(h, wr))?;
                Ok(Response::Done)
            }
            Request::ModifySrq { srq, mask, attr } => {
                let (i, h) = self.srq(srq)?;
                d.devices[i].with(|e| e.modify_srq(h, &attr, mask))?;
                Ok(Response::Done)
            }
            Request::QuerySrq { srq } => {
                let (i, h) = self.srq(srq)?;
                let attr = d.devices[i].read(|e| e.query_srq(h))?;
                Ok(Response::SrqAttr { attr })
            }
            Request::SrqLen { srq } => {
                let (i, h) = self.srq(srq)?;
                let n = d.devices[i].read(|e| e.srq_len(h))?;
                Ok(Response::Count { n: n as u64 })
            }
            Request::CqLen { cq } => {
                let (i, h) = self.cq(cq)?;
                let n = d.devices[i].read(|e| e.cq_len(h))?;
                Ok(Response::Count { n: n as u64 })
            }
            Request::ResizeCq { cq, cqe } => {
                let (i, h) = self.cq(cq)?;
                let n = d.devices[i].with(|e| e.resize_cq(h, cqe))?;
                Ok(Response::Count { n: u64::from(n) })
            }
            Request::CreateAh { pd, ah } => {
                self.room()?;
                let (i, pdh) = self.pd(pd)?;
                let h = d.devices[i].with(|e| e.create_ah(pdh, &ah))?;
                self.stat(|s| &s.live_ahs, true);
                let handle = self.insert(Obj::Ah { dev: i, h });
                Ok(Response::Handle { handle })
            }
            Request::DestroyAh { ah } => {
                let (i, h) = self.ah(ah)?;
                d.devices[i].with(|e| e.destroy_ah(h))?;
                self.objs().remove(&ah);
                self.stat(|s| &s.live_ahs, false);
                Ok(Response::Done)
            }
            Request::CreateQpWithSrq { init, srq } => self.create_qp(init, Some(srq)),
            Request::ReqNotifyCq { cq, solicited_only } => {
                let (i, h) = self.cq(cq)?;
                d.devices[i].arm_cq(h, solicited_only)?;
                Ok(Response::Done)
            }
            Request::CqChannel { cq } => {
                let (i, h) = self.cq(cq)?;
                let fd = d.devices[i]
                    .channel(h)
                    .map_err(|e| fail(ENOMEM, e.to_string()))?;
                self.pending_fd = Some(fd);
                Ok(Response::Done)
            }
            Request::AllocMw { pd, mw_type } => {
                self.room()?;
                let (i, pdh) = self.pd(pd)?;
                let keys = d.devices[i].with(|e| e.alloc_mw(pdh, mw_type))?;
                self.stat(|s| &s.live_mws, true);
                let handle = self.insert(Obj::Mw {
                    dev: i,
                    h: keys.handle,
                });
                Ok(Response::Mw {
                    handle,
                    rkey: keys.rkey.value(),
                    bound: false,
                })
            }
            Request::DeallocMw { mw } => {
                let (i, h) = self.mw(mw)?;
                d.devices[i].with(|e| e.dealloc_mw(h))?;
                self.objs().remove(&mw);
                self.stat(|s| &s.live_mws, false);
                Ok(Response::Done)
            }
            Request::QueryMw { mw } => {
                let (i, h) = self.mw(mw)?;
                let (rkey, bound) = d.devices[i].read(|e| e.query_mw(h))?;
                Ok(Response::Mw {
                    handle: mw,
                    rkey: rkey.value(),
                    bound,
                })
            }
            Request::BindMw {
                qp,
                wr_id,
                mw,
                mut bind,
                signaled,
            } => {
                let (i, qpn) = self.qp(qp)?;
                let (wi, h) = self.mw(mw)?;
                if wi != i {
                    return Err(fail(EINVAL, "the window is on another device"));
                }
                self.bind_for_engine(i, &mut bind)?;
                let rkey = d.devices[i].with(|e| e.bind_mw(qpn, wr_id, h, bind, signaled))?;
                Ok(Response::Mw {
                    handle: mw,
                    rkey: rkey.value(),
                    bound: false,
                })
            }
            Request::AttachWorkRing {
                queue,
                handle,
                capacity,
            } => {
                if !(1..=MAX_WORK_RING_ENTRIES).contains(&capacity) || !capacity.is_power_of_two() {
                    return Err(fail(EINVAL, "ring capacity must be a power of two ≤ 8192"));
                }
                let (i, q) = match queue {
                    wq::SQ => {
                        let (i, qpn) = self.qp(handle)?;
                        (i, Queue::Sq { qpn })
                    }
                    wq::RQ => {
                        let (i, qpn) = self.qp(handle)?;
                        (i, Queue::Rq { qpn })
                    }
                    wq::SRQ => {
                        let (i, srq) = self.srq(handle)?;
                        (i, Queue::Srq { srq })
                    }
                    other => return Err(fail(EINVAL, format!("no queue kind {other}"))),
                };
                if d.devices[i].has_work_ring(self.id, q) {
                    return Err(fail(EINVAL, "this queue already has a ring"));
                }
                let limit = WORK_RING_LIMIT.load(Ordering::Relaxed);
                if self.work_rings >= limit {
                    return Err(self.refused(format!(
                        "too many work rings on this connection (at most {limit})"
                    )));
                }
                // Entries sized for what the queue's WRs may carry, so every WR the verb
                // accepts fits one.
                let entry = match q {
                    Queue::Sq { qpn } => {
                        let cap = d.devices[i].read(|e| e.query_qp(qpn))?.cap;
                        wqe::send_entry_len(cap.max_send_sge, cap.max_inline_data)
                    }
                    Queue::Rq { qpn } => wqe::recv_entry_len(
                        d.devices[i].read(|e| e.query_qp(qpn))?.cap.max_recv_sge,
                    ),
                    Queue::Srq { srq } => {
                        wqe::recv_entry_len(d.devices[i].read(|e| e.query_srq(srq))?.max_sge)
                    }
                    Queue::CqArm { .. } => return Err(fail(EINVAL, "not a work queue")),
                };
                let (ring, place) = self.arena_ring(capacity, entry, Role::Consumer)?;
                let handles = Arc::new(ConnHandles {
                    objs: self.objs.clone(),
                    dev: i,
                });
                let bit = d.devices[i]
                    .attach_work_ring(self.id, WorkRing::new(ring, q, handle, handles))
                    .map_err(|e| match e {
                        AttachError::Full => self.refused(e.to_string()),
                        _ => fail(EINVAL, e.to_string()),
                    })?;
                self.work_rings += 1;
                self.pass_chunk(place.chunk)?;
                Ok(Response::WorkRingAt {
                    chunk: place.chunk,
                    offset: place.offset,
                    len: place.len,
                    bit,
                })
            }
            Request::AttachCqArm { cq } => {
                let (i, h) = self.cq(cq)?;
                let bit = d.devices[i]
                    .attach_cq_arm(self.id, h)
                    .map_err(|e| match e {
                        AttachError::Full => self.refused(e.to_string()),
                        _ => fail(EINVAL, e.to_string()),
                    })?;
                Ok(Response::ArmBit { bit })
            }
            Request::DoorbellPage { dev } => {
                let (_, dev) = self.device(dev)?;
                let fd = dev
                    .doorbell_page(self.id)
                    .map_err(|e| fail(ENOMEM, e.to_string()))?;
                self.pending_fd = Some(fd);
                Ok(Response::Done)
            }
            Request::Doorbell { dev } => {
                let (_, dev) = self.device(dev)?;
                let fd = dev.doorbell().map_err(|e| fail(ENOMEM, e.to_string()))?;
                self.pending_fd = Some(fd);
                Ok(Response::Done)
            }
            Request::AsyncEventChannel => {
                use nix::sys::eventfd::{EfdFlags, EventFd};
                use std::os::fd::AsFd;
                let ch = match &self.event_channel {
                    Some(ch) => ch.clone(),
                    None => {
                        let fd =
                            EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
                                .map_err(|e| fail(ENOMEM, e.to_string()))?;
                        let ch = Arc::new(fd);
                        for dev in &d.devices {
                            dev.add_event_channel(&ch);
                        }
                        self.event_channel = Some(ch.clone());
                        ch
                    }
                };
                let dup = ch
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| fail(ENOMEM, e.to_string()))?;
                self.pending_fd = Some(dup);
                Ok(Response::Done)
            }
            Request::CmChannel { dev } => {
                let (i, _) = self.device(dev)?;
                if self.cm_channels.len() >= MAX_CM_CHANNELS_PER_CONNECTION {
                    return Err(fail(ENOMEM, "too many CM channels on this connection"));
                }
                let ch = runtime::CmChannel::new()?;
                let fd = ch
                    .as_fd()
                    .try_clone_to_owned()
                    .map_err(|e| fail(ENOMEM, e.to_string()))?;
                let handle = loop {
                    self.next_cm = self.next_cm.wrapping_add(1).max(1);
                    if !self.cm_channels.contains_key(&self.next_cm) {
                        break self.next_cm;
                    }
                };
                self.cm_channels.insert(handle, CmChan { dev: i, ch });
                self.pending_fd = Some(fd);
                Ok(Response::Handle { handle })
            }
            Request::CmListen {
                channel,
                service_id,
            } => {
                let c = self.cm_chan(channel)?;
                d.devices[c.dev].cm(|g| g.cm_listen(&c.ch, service_id))?;
                Ok(Response::Done)
            }
            Request::CmUnlisten {
                channel,
                service_id,
            } => {
                let c = self.cm_chan(channel)?;
                d.devices[c.dev].cm(|g| g.cm_unlisten(&c.ch, service_id));
                Ok(Response::Done)
            }
            Request::CmConnect {
                channel,
                qp,
                peer,
                service_id,
                param,
            } => {
                let (c, qpn) = self.cm_chan_and_qp(channel, qp)?;
                let id =
                    d.devices[c.dev].cm(|g| g.cm_connect(&c.ch, qpn, peer, service_id, &param))?;
                Ok(Response::CmId { id })
            }
            Request::CmResolve {
                channel,
                peer,
                service_id,
                param,
            } => {
                let c = self.cm_chan(channel)?;
                let id = d.devices[c.dev].cm(|g| g.cm_resolve(&c.ch, peer, service_id, &param))?;
                Ok(Response::CmId { id })
            }
            Request::CmAccept {
                channel,
                id,
                qp,
                param,
            } => {
                let (c, qpn) = self.cm_chan_and_qp(channel, qp)?;
                d.devices[c.dev].cm(|g| g.cm_accept(&c.ch, id, qpn, &param))?;
                Ok(Response::Done)
            }
            Request::CmEstablish { channel, id } => {
                let c = self.cm_chan(channel)?;
                d.devices[c.dev].cm(|g| g.cm_establish(&c.ch, id))?;
                Ok(Response::Done)
            }
            Request::CmInitQpAttr { channel, id, state } => {
                let c = self.cm_chan(channel)?;
                let (attr, mask) = d.devices[c.dev].cm(|g| g.cm_init_qp_attr(&c.ch, id, state))?;
                Ok(Response::CmQpAttr { attr, mask })
            }
            Request::CmReject {
                channel,
                id,
                reason,
                private_data,
            } => {
                let c = self.cm_chan(channel)?;
                d.devices[c.dev].cm(|g| g.cm_reject(&c.ch, id, reason, &private_data))?;
                Ok(Response::Done)
            }
            Request::CmDisconnect {
                channel,
                id,
                private_data,
            } => {
                let c = self.cm_chan(channel)?;
                d.devices[c.dev].cm(|g| g.cm_disconnect(&c.ch, id, &private_data))?;
                Ok(Response::Done)
            }
            Request::CmDestroyId { channel, id } => {
                let c = self.cm_chan(channel)?;
                match d.devices[c.dev].cm(|g| g.cm_destroy_id(&c.ch, id)) {
                    // Ended on its own (rejected, unreachable) or never this channel's:
                    // there is nothing to let go of, and that is no error to rdma_destroy_id.
                    Ok(()) | Err(runtime::RuntimeError::Cm(runtime::CmError::UnknownId(_))) => {
                        Ok(Response::Done)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Request::CmGetEvent { channel } => {
                let c = self.cm_chan(channel)?;
                Ok(Response::CmEvent {
                    event: c.ch.get_event(),
                })
            }
            Request::CmDestroyChannel { channel } => {
                let c = self
                    .cm_channels
                    .remove(&channel)
                    .ok_or_else(|| fail(EINVAL, format!("no CM channel {channel}")))?;
                self.close_cm_channel(&c);
                Ok(Response::Done)
            }
            Request::GetAsyncEvents => {
                let mut out = Vec::new();
                for (i, dev) in d.devices.iter().enumerate() {
                    if out.len() >= MAX_EVENTS {
                        break;
                    }
                    let room = MAX_EVENTS - out.len();
                    let taken = std::cell::Cell::new(0usize);
                    out.extend(dev.take_events(|ev| {
                        if taken.get() >= room {
                            return None;
                        }
                        let m = self.event_for_me(i, ev)?;
                        taken.set(taken.get() + 1);
                        Some(m)
                    }));
                }
                Ok(Response::AsyncEvents { events: out })
            }
        }
    }

    /// `ev` of device `dev` as this connection names it, if one of its objects is concerned
    /// (port events go to whichever connection asks first).
    /// CQs and SRQs are named by the connection's handles.
    fn event_for_me(&self, dev: usize, ev: &AsyncEvent) -> Option<AsyncEvent> {
        use engine::AsyncEvent as E;
        let owns_qp = |n: u32| {
            self.handle_of(dev, |o| matches!(o, Obj::Qp { qpn, .. } if *qpn == n))
                .is_some()
        };
        Some(match *ev {
            E::SqDrained { qpn } | E::QpFatal { qpn } | E::QpLastWqeReached { qpn }
                if !owns_qp(qpn.value()) =>
            {
                return None;
            }
            E::CqErr { cq } => E::CqErr {
                cq: CqHandle(self.handle_of(dev, |o| matches!(o, Obj::Cq { h, .. } if *h == cq))?),
            },
            E::SrqLimitReached { srq } => E::SrqLimitReached {
                srq: SrqHandle(
                    self.handle_of(dev, |o| matches!(o, Obj::Srq { h, .. } if *h == srq))?,
                ),
            },
            E::SqDrained { .. }
            | E::QpFatal { .. }
            | E::QpLastWqeReached { .. }
            | E::PortActive { .. }
            | E::PortErr { .. } => *ev,
            // An event a later engine raises reaches clients once the protocol names it.
            _ => return None,
        })
    }

    /// `ibv_create_qp`: `init` names the PD and CQs by the connection's handles.
    fn create_qp(&mut self, init: QpInitAttr, srq: Option<u32>) -> Result<Response, Fail> {
        self.room()?;
        let (i, pd) = self.pd(init.pd.0)?;
        let (si, send_cq) = self.cq(init.send_cq.0)?;
        let (ri, recv_cq) = self.cq(init.recv_cq.0)?;
        if si != i || ri != i {
            return Err(fail(EINVAL, "PD and CQs are on different devices"));
        }
        let init = QpInitAttr {
            pd,
            send_cq,
            recv_cq,
            ..init
        };
        let qpn = match srq {
            None => self.daemon.devices[i].with(|e| e.create_qp(&init))?,
            Some(srq) => {
                let (si, srq) = self.srq(srq)?;
                if si != i {
                    return Err(fail(EINVAL, "PD and SRQ are on different devices"));
                }
                self.daemon.devices[i].with(|e| e.create_qp_with_srq(&init, srq))?
            }
        };
        self.stat(|s| &s.live_qps, true);
        let handle = self.insert(Obj::Qp { dev: i, qpn });
        Ok(Response::Qp { handle, qpn })
    }

    /// Destroy everything the connection still holds: QPs first (flushed through ERR), then
    /// MRs, CQs and PDs, the order the engine's references require.
    fn reclaim(&mut self) {
        // Connections first: each lets go of its QP before the QP is destroyed (a late
        // DREQ or REJ must not reach the QP's next owner), and peers are told.
        for (_, c) in std::mem::take(&mut self.cm_channels) {
            self.close_cm_channel(&c);
        }
        // The client is gone: what its rings still hold is never posted.
        for dev in &self.daemon.devices {
            dev.close_doorbell_page(self.id);
        }
        self.work_rings = 0;
        if self.objs().is_empty() {
            return;
        }
        let d = self.daemon;
        let objs: Vec<Obj> = self.objs().drain().map(|(_, o)| o).collect();
        let rank = |o: &Obj| match o {
            Obj::Qp { .. } => 0,
            Obj::Mw { .. } => 1,
            Obj::Mr { .. } | Obj::Ah { .. } => 2,
            Obj::Srq { .. } => 3,
            Obj::Cq { .. } => 4,
            Obj::Pd { .. } => 5,
        };
        let mut objs = objs;
        objs.sort_by_key(rank);
        for o in objs {
            let dev = &d.devices[o.dev()];
            let s = &d.stats;
            let ok = match o {
                Obj::Qp { qpn, .. } => dev
                    .with(|e| {
                        let err = QpAttr {
                            qp_state: QpState::Err,
                            ..QpAttr::default()
                        };
                        let _ = e.modify_qp(qpn, &err, QpAttrMask::STATE);
                        e.destroy_qp(qpn)
                    })
                    .map(|()| {
                        s.live_qps.fetch_sub(1, Ordering::Relaxed);
                        s.reclaimed_qps.fetch_add(1, Ordering::Relaxed);
                    }),
                Obj::Mr { h, owner, .. } => {
                    let r = dev.with(|e| e.dereg_mr(h));
                    memory::lock(&d.regions).remove(owner);
                    r.map(|()| {
                        s.live_mrs.fetch_sub(1, Ordering::Relaxed);
                        s.reclaimed_mrs.fetch_add(1, Ordering::Relaxed);
                    })
                }
                Obj::Srq { h, .. } => {
                    dev.discard_events(
                        |ev| matches!(ev, engine::AsyncEvent::SrqLimitReached { srq } if *srq == h),
                    );
                    dev.with(|e| e.destroy_srq(h)).map(|()| {
                        s.live_srqs.fetch_sub(1, Ordering::Relaxed);
                        s.reclaimed_srqs.fetch_add(1, Ordering::Relaxed);
                    })
                }
                Obj::Mw { h, .. } => dev.with(|e| e.dealloc_mw(h)).map(|()| {
                    s.live_mws.fetch_sub(1, Ordering::Relaxed);
                    s.reclaimed_mws.fetch_add(1, Ordering::Relaxed);
                }),
                Obj::Ah { h, .. } => dev.with(|e| e.destroy_ah(h)).map(|()| {
                    s.live_ahs.fetch_sub(1, Ordering::Relaxed);
                    s.reclaimed_ahs.fetch_add(1, Ordering::Relaxed);
                }),
                Obj::Cq { h, .. } => dev.with(|e| e.destroy_cq(h)).map(|()| {
                    dev.detach_ring(self.id, h);
                    dev.drop_channel(h);
                    s.live_cqs.fetch_sub(1, Ordering::Relaxed);
                    s.reclaimed_cqs.fetch_add(1, Ordering::Relaxed);
                }),
                Obj::Pd { h, .. } => dev.with(|e| e.dealloc_pd(h)).map(|()| {
                    s.live_pds.fetch_sub(1, Ordering::Relaxed);
                    s.reclaimed_pds.fetch_add(1, Ordering::Relaxed);
                }),
            };
            if let Err(e) = ok {
                tracing::warn!(pid = self.pid, object = ?o, error = %e, "reclaim failed");
            }
        }
        // Counted once every object is gone, so a reader that sees the client reclaimed also
        // sees each object's counter (the crash test raced the old order).
        d.stats.clients_reclaimed.fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            pid = self.pid,
            uid = self.uid,
            "reclaimed a client's objects"
        );
    }
}

/// A work request entry that does not decode: the client library never writes one.
fn bad_wqe(e: wqe::WqeError) -> Fail {
    fail(EINVAL, format!("bad work request: {e}"))
}

/// Why the message loop of a connection ended.
enum End {
    Eof,
    Io(std::io::Error),
    BadHeader(ProtoError),
}

/// Read exactly `buf.len()` bytes; `Ok(false)` on a clean end of stream before the first.
fn read_full(s: &mut UnixStream, buf: &mut [u8]) -> Result<bool, std::io::Error> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Close after an error answer so that the answer arrives: a Unix socket closed with unread
/// input resets the connection and the peer may lose what was sent. Discard a bounded amount
/// of what the peer still sends, for a bounded time.
fn linger_close(stream: &mut UnixStream) {
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let _ = stream.set_read_timeout(Some(std::time::Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let mut left = 1usize << 20;
    while left > 0 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

fn message_loop(conn: &mut Conn<'_>, stream: &mut UnixStream) -> End {
    let stats = &conn.daemon.stats;
    let mut body = Vec::new();
    loop {
        // The client's next request of a burst usually follows its answer closely.
        abi::proto::look_before_blocking(stream, abi::proto::LOOK_BEFORE_BLOCKING);
        let mut hb = [0u8; HEADER_LEN];
        // A descriptor rides on the first bytes of the message that names it (SCM_RIGHTS);
        // one no request takes is closed when the next message starts.
        conn.received_fd = match abi::proto::read_with_fd(stream, &mut hb) {
            Ok(Some(fd)) => fd,
            Ok(None) => return End::Eof,
            Err(e) => return End::Io(e),
        };
        let header = match Header::parse(&hb) {
            Ok(h) => h,
            Err(e) => {
                stats.bad_headers.fetch_add(1, Ordering::Relaxed);
                let reply = Response::Error {
                    errno: EPROTO,
                    message: e.to_string(),
                };
                let _ = stream.write_all(&reply.encode(0, 0));
                linger_close(stream);
                return End::BadHeader(e);
            }
        };
        // The length was checked against MAX_BODY before anything is allocated for it.
        body.resize(header.length as usize, 0);
        match read_full(stream, &mut body) {
            Ok(true) => {}
            Ok(false) if body.is_empty() => {}
            Ok(false) => return End::Eof,
            Err(e) => return End::Io(e),
        }
        let reply = match Request::decode(header.kind, &body) {
            Ok(req) => match conn.handle(req) {
                Ok(r) => r,
                Err(f) => {
                    stats.request_errors.fetch_add(1, Ordering::Relaxed);
                    Response::Error {
                        errno: f.errno,
                        message: f.message,
                    }
                }
            },
            Err(e) => {
                stats.bad_bodies.fetch_add(1, Ordering::Relaxed);
                Response::Error {
                    errno: EINVAL,
                    message: e.to_string(),
                }
            }
        };
        let bytes = reply.encode(header.kind, header.id);
        let sent = match conn.pending_fd.take() {
            None => stream.write_all(&bytes),
            Some(fd) => abi::proto::send_with_fd(stream, &bytes, fd.as_fd()),
        };
        if let Err(e) = sent {
            return End::Io(e);
        }
    }
}

/// Serve one connection until it ends, then reclaim what it held.
pub fn serve_connection(daemon: &Daemon, mut stream: UnixStream) {
    daemon
        .stats
        .connections_accepted
        .fetch_add(1, Ordering::Relaxed);
    let bound = rustix::net::sockopt::socket_peercred(&stream)
        .map_err(|e| memory::BindError::Peer(e.into()))
        .and_then(|cred| Ok((cred.uid.as_raw(), ClientProcess::of_peer(&stream)?)));
    let (uid, process) = match bound {
        Ok(b) => b,
        Err(e) => {
            // Served, it could reach memory only by a number that may be another's by now.
            tracing::warn!(error = %e, "cannot bind the connection to its process; closing");
            daemon
                .stats
                .connections_closed
                .fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let mut conn = Conn {
        daemon,
        id: NEXT_CONN.fetch_add(1, Ordering::Relaxed),
        pid: process.pid(),
        process: Arc::new(process),
        uid,
        greeted: false,
        objs: Arc::new(Mutex::new(HashMap::new())),
        next: 0,
        pending_fd: None,
        received_fd: None,
        event_channel: None,
        work_rings: 0,
        arena: RingArena::new(MAX_ARENA_BYTES),
        chunks_sent: Vec::new(),
        cm_channels: HashMap::new(),
        next_cm: 0,
    };
    tracing::info!(pid = conn.pid, uid = conn.uid, "client connected");
    match message_loop(&mut conn, &mut stream) {
        End::Eof => tracing::info!(pid = conn.pid, "client disconnected"),
        End::Io(e) => tracing::info!(pid = conn.pid, error = %e, "client connection failed"),
        End::BadHeader(e) => tracing::warn!(pid = conn.pid, error = %e, "bad header; closed"),
    }
    conn.reclaim();
    daemon
        .stats
        .connections_closed
        .fetch_add(1, Ordering::Relaxed);
}

/// Bind the control socket at `path`: its directory is created if missing, a stale socket
/// left by a dead daemon is replaced, a live daemon's is not. The socket is open to every
/// local user (like a device node); isolation comes from per-connection objects and the
/// kernel-reported peer pid.
pub fn bind_control_socket(path: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("a daemon already listens on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let l = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// Accept connections forever, one thread each.
pub fn serve(daemon: Arc<Daemon>, listener: UnixListener) {
    for stream in listener.incoming() {
        match stream {
            Ok(s) => {
                let d = daemon.clone();
                let spawned = std::thread::Builder::new()
                    .name("softrdmad client".into())
                    .spawn(move || serve_connection(&d, s));
                if let Err(e) = spawned {
                    tracing::error!(error = %e, "cannot spawn a connection thread");
                }
            }
            Err(e) => tracing::warn!(error = %e, "accept failed"),
        }
    }
}
