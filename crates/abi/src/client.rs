//! The client side of the control protocol: what the `softrdma` API's daemon backend, tools
//! and tests use to drive `softrdmad`.
//!
//! One [`Client`] is one connection, and the daemon ties every object to the connection that
//! created it: when the client is dropped (or its process dies) the daemon destroys them all.

use std::io::{Read, Write};
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use cm::{CmEvent, CommId, ConnParam};
use engine::{
    AccessFlags, AhAttr, AsyncEvent, DeviceAttr, Gid, MwBind, MwType, PortAttr, QpAttr, QpAttrMask,
    QpInitAttr, QpState, RecvWr, ReregFlags, SendWr, SrqAttr, SrqAttrMask, UdDest, WorkCompletion,
};
use wire::{RejectReason, ServiceId};
use zerocopy::FromBytes;

use crate::arena::{ArenaMap, RingPlace};
use crate::doorbell::DoorbellPage;
use crate::proto::{DeviceInfo, Header, ProtoError, Request, Response, HEADER_LEN, VERSION};
use crate::ring::{Ring, RingError, Role};
use crate::wqe::{self, Cqe};

/// The control socket used when neither the caller nor the environment names one.
pub const DEFAULT_SOCKET: &str = "/run/softrdma/softrdmad.sock";
/// Environment variable naming the control socket.
pub const SOCKET_ENV: &str = "SOFTRDMA_DAEMON_SOCKET";

/// The control socket path: `$SOFTRDMA_DAEMON_SOCKET`, else [`DEFAULT_SOCKET`].
pub fn socket_path() -> PathBuf {
    std::env::var_os(SOCKET_ENV).map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from)
}

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The socket failed (daemon gone...).
    #[error("daemon connection: {0}")]
    Io(#[from] std::io::Error),
    /// The daemon's answer did not decode.
    #[error("bad answer from the daemon: {0}")]
    Proto(#[from] ProtoError),
    /// The daemon refused the request.
    #[error("daemon refused (errno {errno}): {message}")]
    Refused {
        /// errno as libibverbs would return it.
        errno: i32,
        /// The daemon's reason.
        message: String,
    },
    /// The work request cannot be written as an entry (too many SGEs, too much inline data).
    #[error("work request: {0}")]
    Wqe(#[from] wqe::WqeError),
    /// The answer does not belong to the request (wrong id or shape).
    #[error("unexpected answer from the daemon")]
    Unexpected,
}

impl ClientError {
    /// The errno of a refusal, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            ClientError::Refused { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}

/// A new QP as the daemon reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// The connection's handle.
    pub handle: u32,
    /// The QP number peers address.
    pub qpn: u32,
}

/// A new MR as the daemon reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrInfo {
    /// The connection's handle.
    pub handle: u32,
    /// Local key (for SGEs).
    pub lkey: u32,
    /// Remote key (for peers).
    pub rkey: u32,
}

/// A CQ's completions in shared memory, polled without a system call.
#[derive(Debug)]
pub struct CqRing {
    ring: Ring,
    /// Completions taken out of the ring by [`CqRing::discard`], served first.
    held: std::collections::VecDeque<Cqe>,
    /// The device's doorbell: rung after polling when the daemon said completions wait for
    /// room in the ring.
    doorbell: std::sync::Arc<OwnedFd>,
    doorbells: u64,
    /// The CQ's bit in the doorbell page, to arm it through the ring
    /// ([`Client::attach_cq_arm`]).
    arm: Option<(WorkDoorbell, u32)>,
}

impl CqRing {
    /// Arm the CQ's notification (`ibv_req_notify_cq`) through the ring: write the arm word
    /// and set the CQ's bit in the doorbell page, writing the device's eventfd only if the
    /// daemon sleeps; no request, no reply to wait for. `Ok(false)` if this ring has no bit
    /// ([`Client::attach_cq_arm`] was not called or failed): arm by request then. As with a
    /// NIC, the arm is for completions after it: one already in the ring does not fire it
    /// (poll after arming), one that reaches the ring before the daemon takes the arm does.
    pub fn arm(&mut self, solicited_only: bool) -> Result<bool, RingError> {
        let Some((doorbell, bit)) = &self.arm else {
            return Ok(false);
        };
        self.ring.arm(solicited_only);
        doorbell.ring(*bit)?;
        Ok(true)
    }

    /// Write the arm word alone, ringing nothing (tests of the daemon's side: a client whose
    /// bit the daemon takes later, as when it is busy elsewhere).
    pub fn arm_unrung(&mut self, solicited_only: bool) {
        self.ring.arm(solicited_only);
    }

    /// The CQ's bit in the doorbell page, if it is armed through the ring ([`CqRing::arm`]).
    pub fn arm_bit(&self) -> Option<u32> {
        self.arm.as_ref().map(|(_, bit)| *bit)
    }

    /// Completions waiting in the ring (and held back by [`CqRing::discard`]).
    pub fn len(&self) -> Result<u32, RingError> {
        Ok(self.ring.len()? + self.held.len() as u32)
    }

    /// No completions waiting.
    pub fn is_empty(&self) -> Result<bool, RingError> {
        Ok(self.len()? == 0)
    }

    /// Completions into `out`, oldest first, as many as wait and fit; returns how many.
    /// Nothing is allocated. If this freed slots the daemon waits for (more completions
    /// than the ring holds), rings the device's doorbell.
    pub fn poll_into(&mut self, out: &mut [WorkCompletion]) -> Result<usize, RingError> {
        let mut n = 0;
        let mut failed = None;
        while n < out.len() {
            let cqe = match self.next() {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            match cqe.completion() {
                Ok(wc) => out[n] = wc,
                Err(_) => {
                    failed = Some(RingError::Invalid("a completion with unknown numbers"));
                    break;
                }
            }
            n += 1;
        }
        // The slots read go back to the daemon with one store (before the backlog word is
        // read: see `Ring::take_backlog`), whatever ended the loop.
        self.ring.publish();
        if let Some(e) = failed {
            return Err(e);
        }
        if n > 0 && self.ring.take_backlog() {
            self.doorbells += 1;
            // An eventfd write of 8 bytes does not block, and a failure leaves the refill to
            // the daemon's next look.
            let _ = rustix::io::write(&*self.doorbell, &1u64.to_ne_bytes());
        }
        Ok(n)
    }

    fn next(&mut self) -> Result<Option<Cqe>, RingError> {
        if let Some(c) = self.held.pop_front() {
            return Ok(Some(c));
        }
        let mut e = [0u8; wqe::CQE_LEN];
        if !self.ring.take(&mut e)? {
            return Ok(None);
        }
        // `e` is exactly CQE_LEN bytes: the read cannot fail.
        Ok(Some(Cqe::read_from_bytes(&e).unwrap_or_default()))
    }

    /// Drop the completions of QP number `qpn` delivered so far (after the QP was reset:
    /// the daemon removed those it still held; these reached the ring before). The others
    /// are kept, in order, and polled first.
    pub fn discard(&mut self, qpn: u32) -> Result<(), RingError> {
        let mut kept = std::collections::VecDeque::new();
        while let Some(c) = self.next()? {
            if c.qp_num != qpn {
                kept.push_back(c);
            }
        }
        self.held = kept;
        self.ring.publish();
        if self.ring.take_backlog() {
            self.doorbells += 1;
            let _ = rustix::io::write(&*self.doorbell, &1u64.to_ne_bytes());
        }
        Ok(())
    }

    /// Doorbells this ring has rung for completions waiting for room.
    pub fn doorbells(&self) -> u64 {
        self.doorbells
    }
}

/// How a post into a [`WorkQueueRing`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Posted {
    /// In the ring; `doorbell` says whether the daemon slept and the doorbell was rung (a
    /// system call), or it was awake and will take the WQE on its own.
    Queued {
        /// The doorbell was rung.
        doorbell: bool,
    },
    /// The ring is full: post by request (the daemon answers exactly as the verb would).
    Full,
    /// Not a post for a ring, or too large for an entry: post by request.
    Unfit,
}

/// A device's doorbell as work rings ring it: this connection's doorbell page of the device
/// ([`crate::doorbell`]) and the device's eventfd ([`Client::work_doorbell`]). Cloned into
/// every work ring of the connection on that device.
#[derive(Debug, Clone)]
pub struct WorkDoorbell {
    page: std::sync::Arc<DoorbellPage>,
    eventfd: std::sync::Arc<OwnedFd>,
}

impl WorkDoorbell {
    /// Set `bit` (after a push into its ring) and write the eventfd if the daemon sleeps;
    /// returns whether it did.
    pub fn ring(&self, bit: u32) -> Result<bool, RingError> {
        let sleeps = self.page.ring(bit)?;
        if sleeps {
            // An eventfd write of 8 bytes cannot block short of a counter near 2^64; a
            // failure leaves the WQE for the daemon's next look (any request, or a packet).
            let _ = rustix::io::write(&*self.eventfd, &1u64.to_ne_bytes());
        }
        Ok(sleeps)
    }

    /// Whether the daemon's progress thread says it sleeps (the next post writes the
    /// eventfd).
    pub fn daemon_sleeps(&self) -> bool {
        self.page.daemon_sleeps()
    }

    /// The page itself (tools and tests that write rings and bits by hand).
    pub fn page(&self) -> &DoorbellPage {
        &self.page
    }
}

/// A QP's send or receive queue, or an SRQ, in shared memory ([`Request::AttachWorkRing`]):
/// posting writes a WQE into the ring and sets the ring's bit in the doorbell page, and
/// costs no system call while the daemon is awake.
#[derive(Debug)]
pub struct WorkQueueRing {
    ring: Ring,
    /// Where an entry is encoded before it is copied into the ring: the ring's entry size,
    /// made once. Not zeroed for each post: an encoder writes every byte of the entry it
    /// returns the length of, and only those are copied.
    entry: Vec<u8>,
    doorbell: WorkDoorbell,
    /// This ring's bit in the doorbell page.
    bit: u32,
    doorbells: u64,
}

impl WorkQueueRing {
    /// Write `wr` (with `ud`'s address on a UD QP) into the ring as a send entry, and ring
    /// the doorbell if the daemon said it sleeps. Nothing is allocated.
    pub fn post_send(&mut self, wr: &SendWr, ud: Option<&UdDest>) -> Result<Posted, RingError> {
        match wqe::encode_send(wr, ud, &mut self.entry) {
            Ok(n) => self.push(n),
            Err(_) => Ok(Posted::Unfit),
        }
    }

    /// Write `wr` into the ring as a receive entry (a QP's receive queue or an SRQ), and
    /// ring the doorbell if the daemon said it sleeps. Nothing is allocated.
    pub fn post_recv(&mut self, wr: &RecvWr) -> Result<Posted, RingError> {
        match wqe::encode_recv(wr, &mut self.entry) {
            Ok(n) => self.push(n),
            Err(_) => Ok(Posted::Unfit),
        }
    }

    /// Copy the first `n` bytes of `entry` into the ring.
    fn push(&mut self, n: usize) -> Result<Posted, RingError> {
        if !self.ring.push(&self.entry[..n])? {
            return Ok(Posted::Full);
        }
        let doorbell = self.doorbell.ring(self.bit)?;
        if doorbell {
            self.doorbells += 1;
        }
        Ok(Posted::Queued { doorbell })
    }

    /// Whether the daemon's progress thread says it sleeps (the next post rings).
    pub fn daemon_sleeps(&self) -> bool {
        self.doorbell.daemon_sleeps()
    }

    /// This ring's bit in the doorbell page.
    pub fn bit(&self) -> u32 {
        self.bit
    }

    /// Doorbells this ring has rung.
    pub fn doorbells(&self) -> u64 {
        self.doorbells
    }

    /// WQEs the daemon has not taken yet.
    pub fn unconsumed(&self) -> Result<u32, RingError> {
        Ok(self.ring.capacity() - self.ring.free()?)
    }
}

/// `wr` as a send entry for a post request.
fn send_entry(wr: &SendWr, ud: Option<&UdDest>) -> Result<Vec<u8>, ClientError> {
    let mut e = vec![0u8; wqe::MAX_SEND_ENTRY];
    let n = wqe::encode_send(wr, ud, &mut e)?;
    e.truncate(n);
    Ok(e)
}

/// `wr` as a receive entry for a post request.
fn recv_entry(wr: &RecvWr) -> Result<Vec<u8>, ClientError> {
    let mut e = vec![0u8; wqe::MAX_RECV_ENTRY];
    let n = wqe::encode_recv(wr, &mut e)?;
    e.truncate(n);
    Ok(e)
}

/// One connection to `softrdmad`.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    next_id: u32,
    daemon_pid: u32,
    /// The chunks of this connection's ring arena mapped so far ([`crate::arena`]).
    arena: ArenaMap,
}

impl Client {
    /// Connect to the daemon at `path` and say hello.
    pub fn connect(path: impl AsRef<Path>) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path)?;
        let mut c = Client {
            stream,
            next_id: 0,
            daemon_pid: 0,
            arena: ArenaMap::default(),
        };
        match c.call(&Request::Hello { version: VERSION })? {
            Response::Hello { version, pid } if version == VERSION => {
                c.daemon_pid = pid;
                Ok(c)
            }
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Connect to the daemon at [`socket_path`].
    pub fn connect_default() -> Result<Client, ClientError> {
        Client::connect(socket_path())
    }

    /// The daemon's pid.
    pub fn daemon_pid(&self) -> u32 {
        self.daemon_pid
    }

    /// Another descriptor of this connection's socket, to watch for the daemon going away
    /// without taking the connection: it hangs up when the daemon's end closes, as when the
    /// daemon dies.
    pub fn hangup_fd(&self) -> std::io::Result<OwnedFd> {
        self.stream.try_clone().map(OwnedFd::from)
    }

    /// Send a request and wait for its answer; a refusal is an error.
    pub fn call(&mut self, req: &Request) -> Result<Response, ClientError> {
        self.call_passing(req, None)
    }

    /// [`Client::call`], with `fd` riding on the request (SCM_RIGHTS) when given.
    pub fn call_passing(
        &mut self,
        req: &Request,
        fd: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Response, ClientError> {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        match fd {
            None => self.stream.write_all(&req.encode(id))?,
            Some(fd) => crate::proto::send_with_fd(&mut self.stream, &req.encode(id), fd)?,
        }
        crate::proto::look_before_blocking(&self.stream, crate::proto::LOOK_BEFORE_BLOCKING);
        let mut hb = [0u8; HEADER_LEN];
        self.stream.read_exact(&mut hb)?;
        self.answer(&hb, id)
    }

    /// The answer whose header is `hb` to request `id`: its body read and decoded, a
    /// refusal made an error.
    fn answer(&mut self, hb: &[u8; HEADER_LEN], id: u32) -> Result<Response, ClientError> {
        let h = Header::parse(hb)?;
        let mut body = vec![0u8; h.length as usize];
        self.stream.read_exact(&mut body)?;
        if h.id != id {
            return Err(ClientError::Unexpected);
        }
        match Response::decode(h.kind, &body)? {
            Response::Error { errno, message } => Err(ClientError::Refused { errno, message }),
            r => Ok(r),
        }
    }

    fn done(&mut self, req: &Request) -> Result<(), ClientError> {
        match self.call(req)? {
            Response::Done => Ok(()),
            _ => Err(ClientError::Unexpected),
        }
    }

    fn handle(&mut self, req: &Request) -> Result<u32, ClientError> {
        match self.call(req)? {
            Response::Handle { handle } => Ok(handle),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// The devices the daemon serves.
    pub fn list_devices(&mut self) -> Result<Vec<DeviceInfo>, ClientError> {
        match self.call(&Request::ListDevices)? {
            Response::Devices { devices } => Ok(devices),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_query_device`.
    pub fn query_device(&mut self, dev: u32) -> Result<DeviceAttr, ClientError> {
        match self.call(&Request::QueryDevice { dev })? {
            Response::DeviceAttr { attr } => Ok(attr),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_query_port`.
    pub fn query_port(&mut self, dev: u32, port: u8) -> Result<PortAttr, ClientError> {
        match self.call(&Request::QueryPort { dev, port })? {
            Response::PortAttr { attr } => Ok(attr),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_query_gid`.
    pub fn query_gid(&mut self, dev: u32, port: u8, index: u32) -> Result<Gid, ClientError> {
        match self.call(&Request::QueryGid { dev, port, index })? {
            Response::Gid { gid } => Ok(gid),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_alloc_pd`; returns the PD handle.
    pub fn alloc_pd(&mut self, dev: u32) -> Result<u32, ClientError> {
        self.handle(&Request::AllocPd { dev })
    }

    /// `ibv_dealloc_pd`.
    pub fn dealloc_pd(&mut self, pd: u32) -> Result<(), ClientError> {
        self.done(&Request::DeallocPd { pd })
    }

    /// `ibv_reg_mr` over `length` bytes at `addr` of this process.
    ///
    /// # Safety
    ///
    /// The daemon writes that memory from outside the process whenever the access flags allow
    /// (receives, READ responses, remote WRITE and ATOMIC) until [`Client::dereg_mr`] returns
    /// or the connection ends: the caller must keep it allocated and must not hold Rust
    /// references to it that such writes would invalidate.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr(
        &mut self,
        pd: u32,
        addr: *mut u8,
        length: usize,
        access: AccessFlags,
    ) -> Result<MrInfo, ClientError> {
        self.reg_mr_at(pd, addr as u64, length as u64, access)
    }

    /// [`Client::reg_mr`] by plain numbers: for tests of what the daemon refuses, and for
    /// callers that manage the safety contract themselves.
    pub fn reg_mr_at(
        &mut self,
        pd: u32,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, ClientError> {
        self.mr(&Request::RegMr {
            pd,
            addr,
            length,
            access,
        })
    }

    /// `ibv_reg_mr` over `length` bytes at `addr` that are a shared mapping of `fd`'s file
    /// from byte `offset` (a [`crate::shm::SharedMemory`]): the daemon maps the file and
    /// reaches the region with memory copies. It checks that claim against the process's
    /// mappings and refuses the registration if it does not hold.
    pub fn reg_mr_shared(
        &mut self,
        pd: u32,
        addr: u64,
        length: u64,
        access: AccessFlags,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
    ) -> Result<MrInfo, ClientError> {
        let req = Request::RegMrShared {
            pd,
            addr,
            length,
            access,
            offset,
        };
        match self.call_passing(&req, Some(fd))? {
            Response::Mr { handle, lkey, rkey } => Ok(MrInfo { handle, lkey, rkey }),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_rereg_mr`: change region `mr`'s translation (`CHANGE_TRANSLATION`: to `length`
    /// bytes of this process at `addr`), PD or access in place; the handle and keys stay as
    /// the answer says.
    pub fn rereg_mr(
        &mut self,
        mr: u32,
        flags: ReregFlags,
        pd: u32,
        addr: u64,
        length: u64,
        access: AccessFlags,
    ) -> Result<MrInfo, ClientError> {
        let req = Request::ReregMr {
            mr,
            flags,
            pd,
            addr,
            length,
            access,
        };
        self.mr(&req)
    }

    /// A request answered with a region's handle and keys.
    fn mr(&mut self, req: &Request) -> Result<MrInfo, ClientError> {
        match self.call(req)? {
            Response::Mr { handle, lkey, rkey } => Ok(MrInfo { handle, lkey, rkey }),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_dereg_mr`.
    pub fn dereg_mr(&mut self, mr: u32) -> Result<(), ClientError> {
        self.done(&Request::DeregMr { mr })
    }

    /// `ibv_create_cq`; returns the CQ handle.
    pub fn create_cq(&mut self, dev: u32, cqe: u32) -> Result<u32, ClientError> {
        self.handle(&Request::CreateCq { dev, cqe })
    }

    /// `ibv_destroy_cq`.
    pub fn destroy_cq(&mut self, cq: u32) -> Result<(), ClientError> {
        self.done(&Request::DestroyCq { cq })
    }

    /// `ibv_create_qp`.
    /// `ibv_create_qp` (its PD and CQs by this connection's handles).
    pub fn create_qp(&mut self, init: &QpInitAttr) -> Result<QpInfo, ClientError> {
        self.qp(&Request::CreateQp { init: *init })
    }

    /// A request answered with a new QP.
    fn qp(&mut self, req: &Request) -> Result<QpInfo, ClientError> {
        match self.call(req)? {
            Response::Qp { handle, qpn } => Ok(QpInfo { handle, qpn }),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_modify_qp`.
    pub fn modify_qp(
        &mut self,
        qp: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), ClientError> {
        self.done(&Request::ModifyQp {
            qp,
            mask,
            attr: *attr,
        })
    }

    /// `ibv_query_qp`.
    pub fn query_qp(&mut self, qp: u32) -> Result<QpAttr, ClientError> {
        match self.call(&Request::QueryQp { qp })? {
            Response::QpAttr { attr } => Ok(attr),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_destroy_qp`.
    pub fn destroy_qp(&mut self, qp: u32) -> Result<(), ClientError> {
        self.done(&Request::DestroyQp { qp })
    }

    /// `ibv_attach_mcast` of QP `qp` (a handle) to group `gid`.
    pub fn attach_mcast(&mut self, qp: u32, gid: Gid) -> Result<(), ClientError> {
        self.done(&Request::AttachMcast { qp, gid })
    }

    /// `ibv_detach_mcast`.
    pub fn detach_mcast(&mut self, qp: u32, gid: Gid) -> Result<(), ClientError> {
        self.done(&Request::DetachMcast { qp, gid })
    }

    /// `ibv_post_send` of one WR (handles in it are this connection's).
    pub fn post_send(&mut self, qp: u32, wr: &SendWr) -> Result<(), ClientError> {
        self.done(&Request::PostSend {
            qp,
            wqe: send_entry(wr, None)?,
        })
    }

    /// `ibv_post_recv` of one WR.
    pub fn post_recv(&mut self, qp: u32, wr: &RecvWr) -> Result<(), ClientError> {
        self.done(&Request::PostRecv {
            qp,
            wqe: recv_entry(wr)?,
        })
    }

    /// `ibv_poll_cq`: up to `max` completions.
    pub fn poll_cq(&mut self, cq: u32, max: u32) -> Result<Vec<Cqe>, ClientError> {
        match self.call(&Request::PollCq { cq, max })? {
            Response::Completions { cqes } => Ok(cqes),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Deliver `cq`'s completions into a shared-memory ring of `capacity` entries (a power of
    /// two), polled with no system call ([`CqRing::poll_into`]); [`Client::poll_cq`] is refused
    /// on that CQ from then on. `doorbell` is the CQ's device's ([`Client::doorbell`]):
    /// completions that do not fit wait in the daemon until polling frees slots and rings it.
    pub fn attach_cq_ring(
        &mut self,
        cq: u32,
        capacity: u32,
        doorbell: std::sync::Arc<OwnedFd>,
    ) -> Result<CqRing, ClientError> {
        let place = match self.call_with_fd(&Request::AttachCqRing { cq, capacity })? {
            (Response::RingAt { chunk, offset, len }, fd) => {
                self.arena_chunk(chunk, fd)?;
                RingPlace { chunk, offset, len }
            }
            _ => return Err(ClientError::Unexpected),
        };
        Ok(CqRing {
            held: std::collections::VecDeque::new(),
            ring: self.ring_at(place, Role::Consumer)?,
            doorbell,
            doorbells: 0,
            arm: None,
        })
    }

    /// Arm `cq`, whose ring `ring` is, through the ring from now on ([`CqRing::arm`]):
    /// `doorbell` is the CQ's device's ([`Client::work_doorbell`]).
    pub fn attach_cq_arm(
        &mut self,
        cq: u32,
        ring: &mut CqRing,
        doorbell: WorkDoorbell,
    ) -> Result<(), ClientError> {
        match self.call(&Request::AttachCqArm { cq })? {
            Response::ArmBit { bit } => {
                ring.arm = Some((doorbell, bit));
                Ok(())
            }
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Map arena chunk `chunk`, whose file `fd` came with the answer naming it, the first
    /// time an answer names it (and only then).
    fn arena_chunk(&mut self, chunk: u32, fd: Option<OwnedFd>) -> Result<(), ClientError> {
        match fd {
            Some(fd) => self
                .arena
                .insert(chunk, fd)
                .map_err(|_| ClientError::Unexpected),
            None if self.arena.has(chunk) => Ok(()),
            None => Err(ClientError::Unexpected),
        }
    }

    /// This end of the ring the daemon made at `place` in this connection's arena (its
    /// chunk mapped by the answer that named it): the place and the ring's header are
    /// checked.
    pub fn ring_at(&self, place: RingPlace, role: Role) -> Result<Ring, ClientError> {
        self.arena
            .open(place, role)
            .map_err(|_| ClientError::Unexpected)
    }

    /// The file of chunk `chunk` of this connection's ring arena, once an answer named it
    /// (tools and tests that write rings by hand).
    pub fn arena_fd(&self, chunk: u32) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.arena.fd(chunk)
    }

    /// How many chunks of this connection's ring arena this process has mapped.
    pub fn arena_chunks(&self) -> usize {
        self.arena.len()
    }

    /// Post by request: `req` must be a post ([`Request::PostSend`], [`Request::PostRecv`],
    /// or [`Request::PostSrqRecv`]); the daemon answers as the verb.
    pub fn post(&mut self, req: &Request) -> Result<(), ClientError> {
        if req.work_queue().is_none() {
            return Err(ClientError::Unexpected);
        }
        self.done(req)
    }

    /// The doorbell of device `dev`: an eventfd to write after ringing a work ring's bit
    /// while the daemon sleeps ([`WorkDoorbell`] does it), or after polling a CQ ring whose
    /// daemon waits for room ([`CqRing`] does it).
    pub fn doorbell(&mut self, dev: u32) -> Result<OwnedFd, ClientError> {
        self.call_for_fd(&Request::Doorbell { dev })
    }

    /// This connection's doorbell page of device `dev`, mapped ([`crate::doorbell`]; made by
    /// the daemon on the first call, the same page after).
    pub fn doorbell_page(&mut self, dev: u32) -> Result<DoorbellPage, ClientError> {
        let fd = self.call_for_fd(&Request::DoorbellPage { dev })?;
        DoorbellPage::open(&fd).map_err(|_| ClientError::Unexpected)
    }

    /// What the work rings of device `dev` ring: this connection's doorbell page of it and
    /// `eventfd`, the device's doorbell ([`Client::doorbell`]).
    pub fn work_doorbell(
        &mut self,
        dev: u32,
        eventfd: std::sync::Arc<OwnedFd>,
    ) -> Result<WorkDoorbell, ClientError> {
        Ok(WorkDoorbell {
            page: std::sync::Arc::new(self.doorbell_page(dev)?),
            eventfd,
        })
    }

    /// Post to `queue` ([`crate::proto::wq`]) of QP or SRQ `handle` through a ring of
    /// `capacity` entries in shared memory from now on; `doorbell` is the QP's or SRQ's
    /// device's ([`Client::work_doorbell`]). Posts by request keep working (and keep their
    /// order with the ring's: the daemon takes what waits in the rings before any request).
    pub fn attach_work_ring(
        &mut self,
        queue: u8,
        handle: u32,
        capacity: u32,
        doorbell: WorkDoorbell,
    ) -> Result<WorkQueueRing, ClientError> {
        let (place, bit) = self.work_ring_at(queue, handle, capacity)?;
        let ring = self.ring_at(place, Role::Producer)?;
        Ok(WorkQueueRing {
            // At most the largest entry of either kind, whatever size the ring says.
            entry: vec![
                0;
                ring.entry_size()
                    .min(wqe::MAX_SEND_ENTRY.max(wqe::MAX_RECV_ENTRY))
            ],
            ring,
            doorbell,
            bit,
            doorbells: 0,
        })
    }

    /// Where a new work ring is in this connection's arena, and its bit in the doorbell
    /// page ([`Client::attach_work_ring`] without making this end of it), for tools and
    /// tests that write the ring and ring the bit themselves ([`Client::ring_at`],
    /// [`Client::arena_fd`]; [`crate::ring`] and [`crate::doorbell`] have the layouts).
    pub fn work_ring_at(
        &mut self,
        queue: u8,
        handle: u32,
        capacity: u32,
    ) -> Result<(RingPlace, u32), ClientError> {
        let req = Request::AttachWorkRing {
            queue,
            handle,
            capacity,
        };
        match self.call_with_fd(&req)? {
            (
                Response::WorkRingAt {
                    chunk,
                    offset,
                    len,
                    bit,
                },
                fd,
            ) => {
                self.arena_chunk(chunk, fd)?;
                Ok((RingPlace { chunk, offset, len }, bit))
            }
            _ => Err(ClientError::Unexpected),
        }
    }

    /// A completion channel for `cq` (`ibv_create_comp_channel` for one CQ): an eventfd
    /// the daemon signals when an armed notification ([`Client::req_notify_cq`]) fires.
    /// Read it to clear it.
    pub fn cq_channel(&mut self, cq: u32) -> Result<OwnedFd, ClientError> {
        self.call_for_fd(&Request::CqChannel { cq })
    }

    /// This connection's asynchronous event channel: an eventfd the daemon signals whenever
    /// a device raises an asynchronous event (then call [`Client::async_events`]). Read it to
    /// clear it.
    pub fn async_event_channel(&mut self) -> Result<OwnedFd, ClientError> {
        self.call_for_fd(&Request::AsyncEventChannel)
    }

    /// Send `req` and take the descriptor its `Done` answer carries (SCM_RIGHTS).
    fn call_for_fd(&mut self, req: &Request) -> Result<OwnedFd, ClientError> {
        match self.call_with_fd(req)? {
            (Response::Done, Some(fd)) => Ok(fd),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Send `req`; its answer, and the descriptor it carries if any (SCM_RIGHTS).
    fn call_with_fd(&mut self, req: &Request) -> Result<(Response, Option<OwnedFd>), ClientError> {
        self.next_id = self.next_id.wrapping_add(1);
        let id = self.next_id;
        self.stream.write_all(&req.encode(id))?;
        // The fd rides on the answer's first bytes: read the header with recvmsg.
        let mut hb = [0u8; HEADER_LEN];
        let fd = crate::proto::read_with_fd(&self.stream, &mut hb)?
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        Ok((self.answer(&hb, id)?, fd))
    }

    /// A connection-manager channel on device `dev`: its handle, and an eventfd readable
    /// while it holds events ([`Client::cm_get_event`] takes them).
    pub fn cm_channel(&mut self, dev: u32) -> Result<(u32, OwnedFd), ClientError> {
        match self.call_with_fd(&Request::CmChannel { dev })? {
            (Response::Handle { handle }, Some(fd)) => Ok((handle, fd)),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `rdma_listen`: connection requests for `service_id` arrive on `channel`.
    pub fn cm_listen(&mut self, channel: u32, service_id: ServiceId) -> Result<(), ClientError> {
        self.done(&Request::CmListen {
            channel,
            service_id,
        })
    }

    /// Stop listening on `service_id`.
    pub fn cm_unlisten(&mut self, channel: u32, service_id: ServiceId) -> Result<(), ClientError> {
        self.done(&Request::CmUnlisten {
            channel,
            service_id,
        })
    }

    /// `rdma_connect` with QP `qp` (a handle; 0 when the client moves its QP itself and
    /// `param.qp_num` names it) to `service_id` at `peer`.
    pub fn cm_connect(
        &mut self,
        channel: u32,
        qp: u32,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId, ClientError> {
        match self.call(&Request::CmConnect {
            channel,
            qp,
            peer,
            service_id,
            param: param.clone(),
        })? {
            Response::CmId { id } => Ok(id),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// SIDR (`rdma_connect` on a UDP id): which UD QP serves `service_id` at `peer`.
    pub fn cm_resolve(
        &mut self,
        channel: u32,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId, ClientError> {
        match self.call(&Request::CmResolve {
            channel,
            peer,
            service_id,
            param: param.clone(),
        })? {
            Response::CmId { id } => Ok(id),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `rdma_accept` of request `id` with QP `qp` (a handle; 0 as for
    /// [`Client::cm_connect`]).
    pub fn cm_accept(
        &mut self,
        channel: u32,
        id: CommId,
        qp: u32,
        param: &ConnParam,
    ) -> Result<(), ClientError> {
        self.done(&Request::CmAccept {
            channel,
            id,
            qp,
            param: param.clone(),
        })
    }

    /// `rdma_reject` (reason 28) or `rdma_reject_ece` (reason 35) of request `id`.
    pub fn cm_reject(
        &mut self,
        channel: u32,
        id: CommId,
        reason: RejectReason,
        private_data: &[u8],
    ) -> Result<(), ClientError> {
        self.done(&Request::CmReject {
            channel,
            id,
            reason,
            private_data: private_data.to_vec(),
        })
    }

    /// `rdma_disconnect` of connection `id`.
    pub fn cm_disconnect(
        &mut self,
        channel: u32,
        id: CommId,
        private_data: &[u8],
    ) -> Result<(), ClientError> {
        self.done(&Request::CmDisconnect {
            channel,
            id,
            private_data: private_data.to_vec(),
        })
    }

    /// `rdma_establish`: the RTU of connection `id`, whose QP the client moves.
    pub fn cm_establish(&mut self, channel: u32, id: CommId) -> Result<(), ClientError> {
        self.done(&Request::CmEstablish { channel, id })
    }

    /// `rdma_init_qp_attr`: what takes connection `id`'s QP to `state`, and which
    /// attributes to apply.
    pub fn cm_init_qp_attr(
        &mut self,
        channel: u32,
        id: CommId,
        state: QpState,
    ) -> Result<(QpAttr, QpAttrMask), ClientError> {
        match self.call(&Request::CmInitQpAttr { channel, id, state })? {
            Response::CmQpAttr { attr, mask } => Ok((attr, mask)),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `rdma_destroy_id` of connection `id` (in any state; one already gone is fine).
    pub fn cm_destroy_id(&mut self, channel: u32, id: CommId) -> Result<(), ClientError> {
        self.done(&Request::CmDestroyId { channel, id })
    }

    /// The oldest event of `channel`, if any.
    pub fn cm_get_event(&mut self, channel: u32) -> Result<Option<CmEvent>, ClientError> {
        match self.call(&Request::CmGetEvent { channel })? {
            Response::CmEvent { event } => Ok(event),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Close `channel`, destroying the connections it still holds.
    pub fn cm_destroy_channel(&mut self, channel: u32) -> Result<(), ClientError> {
        self.done(&Request::CmDestroyChannel { channel })
    }

    fn count(&mut self, req: &Request) -> Result<u64, ClientError> {
        match self.call(req)? {
            Response::Count { n } => Ok(n),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Completions waiting in `cq` (not counting a ring's).
    pub fn cq_len(&mut self, cq: u32) -> Result<u64, ClientError> {
        self.count(&Request::CqLen { cq })
    }

    /// `ibv_resize_cq`; returns the size the CQ has now.
    pub fn resize_cq(&mut self, cq: u32, cqe: u32) -> Result<u64, ClientError> {
        self.count(&Request::ResizeCq { cq, cqe })
    }

    /// `ibv_req_notify_cq`.
    pub fn req_notify_cq(&mut self, cq: u32, solicited_only: bool) -> Result<(), ClientError> {
        self.done(&Request::ReqNotifyCq { cq, solicited_only })
    }

    /// `ibv_create_srq`; returns the SRQ handle.
    pub fn create_srq(&mut self, pd: u32, attr: &SrqAttr) -> Result<u32, ClientError> {
        self.handle(&Request::CreateSrq { pd, attr: *attr })
    }

    /// `ibv_destroy_srq`.
    pub fn destroy_srq(&mut self, srq: u32) -> Result<(), ClientError> {
        self.done(&Request::DestroySrq { srq })
    }

    /// `ibv_post_srq_recv` of one WR.
    pub fn post_srq_recv(&mut self, srq: u32, wr: &RecvWr) -> Result<(), ClientError> {
        self.done(&Request::PostSrqRecv {
            srq,
            wqe: recv_entry(wr)?,
        })
    }

    /// `ibv_modify_srq`: the fields of `attr` that `mask` selects.
    pub fn modify_srq(
        &mut self,
        srq: u32,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), ClientError> {
        self.done(&Request::ModifySrq {
            srq,
            mask,
            attr: *attr,
        })
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&mut self, srq: u32) -> Result<SrqAttr, ClientError> {
        match self.call(&Request::QuerySrq { srq })? {
            Response::SrqAttr { attr } => Ok(attr),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Receive WRs waiting in `srq`.
    pub fn srq_len(&mut self, srq: u32) -> Result<u64, ClientError> {
        self.count(&Request::SrqLen { srq })
    }

    /// `ibv_create_qp` drawing receives from `srq`.
    pub fn create_qp_with_srq(
        &mut self,
        init: &QpInitAttr,
        srq: u32,
    ) -> Result<QpInfo, ClientError> {
        self.qp(&Request::CreateQpWithSrq { init: *init, srq })
    }

    /// `ibv_create_ah`; returns the AH handle.
    pub fn create_ah(&mut self, pd: u32, ah: &AhAttr) -> Result<u32, ClientError> {
        self.handle(&Request::CreateAh { pd, ah: *ah })
    }

    /// `ibv_destroy_ah`.
    pub fn destroy_ah(&mut self, ah: u32) -> Result<(), ClientError> {
        self.done(&Request::DestroyAh { ah })
    }

    /// `ibv_post_send` of one WR on a UD QP, to `dest` (its AH by this connection's handle).
    pub fn post_send_ud(&mut self, qp: u32, wr: &SendWr, dest: &UdDest) -> Result<(), ClientError> {
        self.done(&Request::PostSend {
            qp,
            wqe: send_entry(wr, Some(dest))?,
        })
    }

    /// `ibv_alloc_mw`; returns the handle and the window's rkey.
    pub fn alloc_mw(&mut self, pd: u32, mw_type: MwType) -> Result<(u32, u32), ClientError> {
        match self.call(&Request::AllocMw { pd, mw_type })? {
            Response::Mw { handle, rkey, .. } => Ok((handle, rkey)),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_dealloc_mw`.
    pub fn dealloc_mw(&mut self, mw: u32) -> Result<(), ClientError> {
        self.done(&Request::DeallocMw { mw })
    }

    /// A window's current rkey and whether it is bound.
    pub fn query_mw(&mut self, mw: u32) -> Result<(u32, bool), ClientError> {
        match self.call(&Request::QueryMw { mw })? {
            Response::Mw { rkey, bound, .. } => Ok((rkey, bound)),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// `ibv_bind_mw` of a type 1 window, posted on `qp`; returns the rkey the window will
    /// have once bound.
    pub fn bind_mw(
        &mut self,
        qp: u32,
        wr_id: u64,
        mw: u32,
        bind: MwBind,
        signaled: bool,
    ) -> Result<u32, ClientError> {
        match self.call(&Request::BindMw {
            qp,
            wr_id,
            mw,
            bind,
            signaled,
        })? {
            Response::Mw { rkey, .. } => Ok(rkey),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// Take the asynchronous events of this connection's objects, oldest first.
    /// CQs and SRQs are named by this connection's handles.
    pub fn async_events(&mut self) -> Result<Vec<AsyncEvent>, ClientError> {
        match self.call(&Request::GetAsyncEvents)? {
            Response::AsyncEvents { events } => Ok(events),
            _ => Err(ClientError::Unexpected),
        }
    }

    /// End the connection and wait until the daemon has closed its end, which it does only
    /// after destroying every object of the connection (its MRs deregistered: it no longer
    /// touches their memory). Every later call fails.
    pub fn close_and_wait(&mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
        let _ = self.stream.set_read_timeout(None);
        let mut sink = [0u8; 4096];
        // Answers still in flight are discarded; end of stream or an error (reset) both mean
        // the daemon's side is gone.
        loop {
            match self.stream.read(&mut sink) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }

    /// The daemon's counters and each device's, by name.
    pub fn stat(&mut self) -> Result<Vec<(String, u64)>, ClientError> {
        match self.call(&Request::Stat)? {
            Response::Stat { counters } => Ok(counters),
            _ => Err(ClientError::Unexpected),
        }
    }
}
