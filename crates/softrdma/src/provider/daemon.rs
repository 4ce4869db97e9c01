//! The daemon provider: one device of the host daemon `softrdmad`, through one connection
//! of this process ([`abi::client::Client`]). Control verbs are requests on the socket;
//! posts are written into the QP's or SRQ's work ring in shared memory (by request when the
//! ring cannot take them), and completions are read from the CQ's ring with no system call.
//! A refusal the daemon sends for one of its engine's verbs errors comes back as that
//! [`VerbsError`], so that both providers fail alike.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use abi::client::{Client, ClientError, CqRing, Posted, WorkDoorbell, WorkQueueRing};
use abi::proto::{wq, DeviceInfo};
use engine::{
    AccessFlags, AhAttr, AhHandle, AsyncEvent, CqHandle, DeviceAttr, Gid, MrHandle, MwBind,
    MwHandle, MwType, PdHandle, PortAttr, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, ReregFlags, SendFlags, SendOp, SendPayload, SendWr, SrqAttr, SrqAttrMask, SrqHandle,
    UdDest, VerbsError, WcOpcode, WcStatus, WorkCompletion,
};
use runtime::{CmEvent, CommId, ConnParam, EngineGuard};
use wire::{RejectReason, ServiceId};

use super::locate::{self, DaemonConfig};
use super::{
    device_closed, lock, BackendKind, Lkey, Provider, ProviderCmChannel, ProviderCq, QpHandle, Qpn,
    RawMr, RawQp, Rkey,
};
use crate::{Error, Result};

/// The daemon provider of one open device.
#[derive(Debug)]
pub(crate) struct Daemon {
    /// Shared with the device's CQs, whose polls retire send and receive slots.
    dev: Arc<DaemonDevice>,
}

/// One device of `softrdmad`, through one connection of this process.
#[derive(Debug)]
pub(crate) struct DaemonDevice {
    client: Mutex<Client>,
    dev: u32,
    info: DeviceInfo,
    attr: DeviceAttr,
    port: PortAttr,
    gids: Vec<Gid>,
    /// Asynchronous events taken from the daemon but not yet from the API.
    events: Mutex<VecDeque<AsyncEvent>>,
    /// The connection's event channel: readable after the daemon raised an event.
    event_channel: OwnedFd,
    /// The device's doorbell, for CQ rings (`None`: the daemon offers none).
    doorbell: Option<Arc<OwnedFd>>,
    /// What work rings ring: this connection's doorbell page and the device's doorbell
    /// (`None`: the daemon offers none; every post goes by request).
    work_doorbell: Option<WorkDoorbell>,
    /// Work rings and post-time facts of this connection's QPs, by handle.
    qps: Mutex<foldhash::HashMap<QpHandle, Arc<QpRings>>>,
    /// The same QPs by QP number (completions name QPs by number).
    qps_by_qpn: Mutex<foldhash::HashMap<Qpn, Arc<QpRings>>>,
    /// Work rings of this connection's SRQs, by handle.
    srqs: Mutex<foldhash::HashMap<u32, Arc<SrqRing>>>,
    /// The PD of each of this connection's AHs, by handle (a UD post checks it).
    ah_pds: Mutex<foldhash::HashMap<u32, u32>>,
    /// The completion rings of this connection's CQs, by handle (a QP reset cleans them).
    cq_rings: Mutex<HashMap<u32, Weak<Mutex<CqRing>>>>,
    /// What this device's registrations are named by in `crate::mr::Registry` (forgotten
    /// when it drops, after the connection ended: see `Drop`).
    serial: crate::mr::DeviceSerial,
    /// The process that opened it: a child made by `fork` shares the connection's socket.
    opened_by: u32,
    /// Another descriptor of the connection's socket: it hangs up when the daemon dies,
    /// which CQs look for when they find nothing (see `DaemonCq::take`).
    hangup: Arc<OwnedFd>,
    /// `AsyncEvent::DeviceFatal` was handed out (once: the daemon died).
    fatal_told: std::sync::atomic::AtomicBool,
}

impl Drop for DaemonDevice {
    /// Ends the connection and waits until the daemon has destroyed its objects (it closes
    /// its end only after that): as with a NIC's `ibv_close_device`, regions and QPs the
    /// program left behind reach its memory no more once the device is closed.
    ///
    /// In a child made by `fork` the socket is the parent's too: ending the connection would
    /// end the parent's device, so the child only closes its descriptor.
    fn drop(&mut self) {
        if std::process::id() == self.opened_by {
            self.client
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .close_and_wait();
        }
    }
}

/// Largest work ring the daemon grants.
const MAX_WORK_RING: u32 = 1 << 13;

/// A daemon QP's send and receive rings, with what the library checks before writing a WQE:
/// what `ibv_post_send` / `ibv_post_recv` refuse at once must still be refused at once, and
/// anything this cannot vouch for goes by request, where the daemon answers as the verb.
#[derive(Debug)]
struct QpRings {
    /// Its number (completions name it).
    qpn: Qpn,
    /// Handles of its send and receive CQs.
    cqs: [u32; 2],
    qp_type: QpType,
    pd: u32,
    /// The capabilities asked for (the daemon grants at least these).
    cap: QpCap,
    /// The state this process last moved the QP to ([`QpState::to_ibv`]). The daemon on its
    /// own only moves a QP to SQE or ERR, where posting is allowed as in RTS (the WQEs are
    /// flushed). Read by every post: an atomic, not a lock.
    state: AtomicU32,
    /// The send ring with its slots, under one lock: a post takes both.
    sq: Option<Mutex<SendQueue>>,
    rq: Option<Mutex<WorkQueueRing>>,
    /// Receive WRs posted and not yet seen completed by this process's `poll_cq` (a QP
    /// without an SRQ). A WR in a work ring is not in the daemon's queue yet, so the daemon
    /// cannot refuse the one too many: this count does, as `ibv_post_recv` refuses a full
    /// receive queue (`ENOMEM`). Like a hardware RQ's, a slot is free again once the
    /// completion of its WR has been polled.
    rq_outstanding: AtomicU32,
    /// The SRQ feeding its receives, if any (its receive completions free SRQ slots).
    srq: Option<Arc<SrqRing>>,
    /// Every send WR is signaled (`sq_sig_all`).
    sq_sig_all: bool,
}

/// A daemon QP's send ring, and its send WRs posted and not yet seen retired by this
/// process's `poll_cq`: the same reason as `QpRings::rq_outstanding`, the send queue's way.
#[derive(Debug)]
struct SendQueue {
    ring: WorkQueueRing,
    slots: SendSlots,
}

/// The send queue slots of a daemon QP, as a hardware send queue frees them: a WR holds its
/// slot until the polled completion of it, or of a later WR, says it is done. Completions
/// of one send queue come in posting order and an unsignaled WR has none of its own, so a
/// successful completion retires its WR and every unsignaled WR posted before it (which is
/// why verbs applications signal now and then). The daemon's engine frees a slot no later
/// (when the WR is acknowledged), so with at most `max_send_wr` counted here, the WQEs in the
/// ring always find room in the engine's queue.
#[derive(Debug, Default)]
struct SendSlots {
    /// Whether each WR posted and not yet retired is signaled, oldest first.
    posted: VecDeque<bool>,
    /// The send queue flushes: an error completion was polled (its WR failed, or the QP is
    /// in ERR and flushes), or this process moved the QP to ERR. An erring QP holds no WR
    /// and takes every post (each completes with a flush error) with no queue limit, as the
    /// embedded engine does, and which of the counted WRs the error completions stand for
    /// cannot be told (earlier unsignaled WRs may have completed silently): nothing is
    /// counted until this process moves the QP on (RESET, or SQE back to RTS).
    flushing: bool,
}

impl SendSlots {
    /// Whether a post must be refused for want of a slot.
    fn full(&self, max_send_wr: u32) -> bool {
        !self.flushing && self.posted.len() >= max_send_wr as usize
    }

    /// A WR went into the queue.
    fn posted(&mut self, signaled: bool) {
        if !self.flushing {
            self.posted.push_back(signaled);
        }
    }

    /// A send completion of this QP was polled.
    fn completed(&mut self, success: bool) {
        if !success {
            self.posted.clear();
            self.flushing = true;
            return;
        }
        // Its WR is the oldest signaled one; the unsignaled ones before it completed
        // silently. With no signaled WR counted, it is a late completion of a WR posted
        // before a RESET, and retires none of the WRs posted since.
        if let Some(last) = self.posted.iter().position(|&signaled| signaled) {
            self.posted.drain(..=last);
        }
    }

    /// This process moved the QP to `state`.
    fn moved(&mut self, state: QpState) {
        match state {
            // ERR flushes every WR; RESET drops them without completions.
            QpState::Err | QpState::Sqe => {
                self.posted.clear();
                self.flushing = true;
            }
            QpState::Reset => {
                self.posted.clear();
                self.flushing = false;
            }
            // A QP that left ERR or SQE this way holds no WR any more.
            _ => self.flushing = false,
        }
    }
}

impl QpRings {
    /// Whether `wr` passes every check the engine makes at post time, so that a WQE in the
    /// ring is taken exactly as the verb would have taken it.
    fn send_ok(&self, wr: &SendWr, ud: bool) -> bool {
        let op_ok = if ud {
            self.qp_type == QpType::Ud && matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. })
        } else {
            engine::check_send_op(self.qp_type, &wr.op).is_ok()
        };
        let payload_ok = match &wr.payload {
            SendPayload::Sges(s) => s.len() <= self.cap.max_send_sge as usize,
            SendPayload::Inline(d) => {
                !wr.op.is_read_or_atomic() && d.len() <= self.cap.max_inline_data as usize
            }
        };
        op_ok && payload_ok && self.state().can_post_send()
    }

    /// The state this process last moved the QP to.
    fn state(&self) -> QpState {
        let n = self.state.load(Ordering::Relaxed);
        QpState::ALL
            .into_iter()
            .find(|s| s.to_ibv() == n)
            .unwrap_or_default()
    }

    /// Whether `wr` passes every check of `ibv_post_recv` at post time.
    fn recv_ok(&self, wr: &RecvWr) -> bool {
        wr.sg_list.len() <= self.cap.max_recv_sge as usize && self.state().can_post_recv()
    }
}

/// A daemon SRQ's ring, its limits, and its receive WRs outstanding.
#[derive(Debug)]
struct SrqRing {
    max_sge: u32,
    /// Its capacity (`ibv_modify_srq` may change it).
    max_wr: AtomicU32,
    /// Receive WRs posted and not yet seen completed by this process's `poll_cq`, for the
    /// reason of `QpRings::rq_outstanding`: a WR in the ring is not in the daemon's SRQ
    /// yet, and one the daemon cannot take from the ring would be lost rather than refused.
    outstanding: AtomicU32,
    ring: Mutex<WorkQueueRing>,
}

impl SrqRing {
    /// Take a slot for one more receive WR; false if every slot is taken.
    fn reserve(&self) -> bool {
        let max = self.max_wr.load(Ordering::Relaxed);
        self.outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            })
            .is_ok()
    }

    /// Free a slot (a receive completion was polled, or a reserved post failed).
    fn release(&self) {
        // Saturating: completions of WRs posted before this process counted are not counted.
        let _ = self
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// Write a WR into `ring` with `post`; false if it must go by request instead (full, too
/// large, or the ring is unusable).
fn ring_post(
    ring: &mut WorkQueueRing,
    post: impl FnOnce(&mut WorkQueueRing) -> std::result::Result<Posted, abi::ring::RingError>,
) -> bool {
    match post(ring) {
        Ok(Posted::Queued { .. }) => true,
        Ok(_) => false,
        Err(e) => {
            tracing::warn!(error = %e, "work ring unusable; posting by request");
            false
        }
    }
}

/// Ring capacity for a queue of `depth` WRs.
fn ring_capacity(depth: u32) -> u32 {
    depth
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or(MAX_WORK_RING)
        .min(MAX_WORK_RING)
}

/// Largest CQ ring the daemon grants.
const MAX_CQ_RING: u32 = 1 << 16;

fn ring_error(e: abi::ring::RingError) -> Error {
    Error::BadAnswer(format!("CQ ring: {e}"))
}

impl DaemonDevice {
    fn c(&self) -> MutexGuard<'_, Client> {
        lock(&self.client)
    }

    /// Connect (starting the daemon if allowed and needed) and pick the device serving
    /// `addr`, or the first device when `addr` is `None`.
    fn open(addr: Option<std::net::IpAddr>, config: &DaemonConfig) -> Result<DaemonDevice> {
        let socket = config.socket_path();
        let spawn = config.spawn.unwrap_or_else(locate::spawn_from_env);
        let mut client = locate::connect_or_spawn(&socket, spawn, config)?;
        let devices = client.list_devices()?;
        let info = locate::serving(devices, addr).ok_or_else(|| {
            Error::Config(match addr {
                Some(a) => format!("softrdmad at {} serves no device on {a}", socket.display()),
                None => format!("softrdmad at {} serves no device", socket.display()),
            })
        })?;
        DaemonDevice::on(client, info)
    }

    /// The daemon's device `info`, through `client` (a connection already made).
    fn on(mut client: Client, info: DeviceInfo) -> Result<DaemonDevice> {
        let attr = client.query_device(info.index)?;
        let port = client.query_port(info.index, 1)?;
        let mut gids = Vec::new();
        for i in 0..port.gid_tbl_len.min(256) {
            match client.query_gid(info.index, 1, i) {
                Ok(g) => gids.push(g),
                Err(ClientError::Refused { .. }) => break,
                Err(e) => return Err(e.into()),
            }
        }
        let event_channel = client.async_event_channel()?;
        let hangup = Arc::new(client.hangup_fd()?);
        // A daemon without work rings still serves every post by request.
        let doorbell = client.doorbell(info.index).ok().map(Arc::new);
        let work_doorbell = doorbell
            .clone()
            .and_then(|db| client.work_doorbell(info.index, db).ok());
        Ok(DaemonDevice {
            event_channel,
            doorbell,
            work_doorbell,
            qps: Mutex::default(),
            qps_by_qpn: Mutex::default(),
            srqs: Mutex::default(),
            ah_pds: Mutex::default(),
            cq_rings: Mutex::new(HashMap::new()),
            serial: crate::mr::DeviceSerial::new(),
            opened_by: std::process::id(),
            hangup,
            fatal_told: std::sync::atomic::AtomicBool::new(false),
            client: Mutex::new(client),
            dev: info.index,
            info,
            attr,
            port,
            gids,
            events: Mutex::new(VecDeque::new()),
        })
    }

    /// Free the queue slots the completions in `wcs` retire (see `QpRings::rq_outstanding`
    /// and `SendQueue`).
    fn retire(&self, wcs: &[WorkCompletion]) {
        if wcs.is_empty() {
            return;
        }
        let by_qpn = lock(&self.qps_by_qpn);
        for wc in wcs {
            let Some(q) = by_qpn.get(&wc.qp_num) else {
                continue;
            };
            if matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                match &q.srq {
                    Some(srq) => srq.release(),
                    // Saturating: completions of WRs posted before a RESET are not counted.
                    None => {
                        let _ = q.rq_outstanding.fetch_update(
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                            |n| n.checked_sub(1),
                        );
                    }
                }
            } else if let Some(sq) = &q.sq {
                lock(sq).slots.completed(wc.status == WcStatus::Success);
            }
        }
    }

    /// Post a send-queue WR of QP `qp` with `post` (given the QP's rings and its send
    /// ring, if it has them), counted against `max_send_wr` when the QP has a send ring
    /// (`SendQueue`): `QueueFull` when every slot is taken, as `ibv_post_send` fails with
    /// `ENOMEM`.
    fn post_counted<T>(
        &self,
        qp: QpHandle,
        signaled: bool,
        post: impl FnOnce(Option<&QpRings>, Option<&mut WorkQueueRing>) -> Result<T>,
    ) -> Result<T> {
        let rings = self.qp_rings(qp);
        let Some((q, sq)) = rings.as_deref().and_then(|q| Some((q, q.sq.as_ref()?))) else {
            // No ring: every post goes by request, and the daemon's engine refuses exactly.
            return post(rings.as_deref(), None);
        };
        // Held across the post, so the count and the order of WRs match the ring's.
        let mut sq = lock(sq);
        if sq.slots.full(q.cap.max_send_wr) {
            return Err(Error::Verbs(VerbsError::QueueFull));
        }
        let SendQueue { ring, slots } = &mut *sq;
        let r = post(Some(q), Some(ring))?;
        slots.posted(signaled || q.sq_sig_all);
        Ok(r)
    }

    fn qp_rings(&self, qp: QpHandle) -> Option<Arc<QpRings>> {
        lock(&self.qps).get(&qp).cloned()
    }

    /// A work ring for `queue` of `handle`, if the daemon grants one.
    fn attach(&self, c: &mut Client, queue: u8, handle: u32, depth: u32) -> Option<WorkQueueRing> {
        let doorbell = self.work_doorbell.clone()?;
        match c.attach_work_ring(queue, handle, ring_capacity(depth), doorbell) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!(error = %e, queue, "no work ring; posting by request");
                None
            }
        }
    }
}

impl Daemon {
    /// Connect (starting the daemon if allowed and needed) and open the device serving
    /// `addr`, or the first device when `addr` is `None`.
    pub(crate) fn open(addr: Option<std::net::IpAddr>, config: &DaemonConfig) -> Result<Daemon> {
        Ok(Daemon {
            dev: Arc::new(DaemonDevice::open(addr, config)?),
        })
    }

    /// The daemon's device `info`, through `client` (a connection already made).
    pub(crate) fn on(client: Client, info: DeviceInfo) -> Result<Daemon> {
        Ok(Daemon {
            dev: Arc::new(DaemonDevice::on(client, info)?),
        })
    }
}

impl Provider for Daemon {
    fn kind(&self) -> BackendKind {
        BackendKind::Daemon
    }

    fn daemon_info(&self) -> Option<(String, u32)> {
        Some((self.dev.info.name.clone(), self.dev.c().daemon_pid()))
    }

    fn lock_out(&self) -> Option<EngineGuard<'_>> {
        None
    }

    fn local_addr(&self) -> SocketAddr {
        let d = &self.dev;
        let ip = d
            .gids
            .first()
            .map(|g| g.to_ip())
            .or_else(|| d.info.addrs.first().copied())
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
        SocketAddr::new(ip, d.info.port)
    }

    fn query_device(&self) -> DeviceAttr {
        self.dev.attr.clone()
    }

    fn query_port(&self) -> Result<PortAttr> {
        Ok(self.dev.port)
    }

    fn gid(&self, index: u32) -> Result<Gid> {
        self.dev
            .gids
            .get(index as usize)
            .copied()
            .ok_or(Error::Verbs(VerbsError::InvalidGidIndex(index)))
    }

    fn gids(&self) -> Vec<Gid> {
        self.dev.gids.clone()
    }

    fn counters(&self) -> Result<engine::Counters> {
        // The daemon reports its engine's counters by name, with its own beside them.
        let named = self.counter_values()?;
        Ok(engine::Counters::from_values(
            engine::Counter::ALL.iter().filter_map(|&c| {
                named
                    .iter()
                    .find(|(n, _)| n == c.name())
                    .map(|&(_, v)| (c, v))
            }),
        ))
    }

    fn counter_values(&self) -> Result<Vec<(String, u64)>> {
        let prefix = format!("{}.", self.dev.info.name);
        Ok(self
            .dev
            .c()
            .stat()?
            .into_iter()
            .filter_map(|(n, v)| n.strip_prefix(&prefix).map(|n| (n.to_string(), v)))
            .collect())
    }

    fn poll_progress(&self) -> usize {
        // The daemon drives its devices itself; give it the core if the host has few.
        super::relax(BackendKind::Daemon);
        0
    }

    /// Once the daemon died, its events are gone with it: one `DeviceFatal` says so, as a
    /// NIC that failed raises `IBV_EVENT_DEVICE_FATAL`.
    fn async_event(&self) -> Result<Option<AsyncEvent>> {
        let d = &self.dev;
        let mut q = lock(&d.events);
        if q.is_empty() {
            if runtime::hung_up(d.hangup.as_fd()) {
                let first = !d.fatal_told.swap(true, Ordering::Relaxed);
                return Ok(first.then_some(AsyncEvent::DeviceFatal));
            }
            q.extend(d.c().async_events()?);
        }
        Ok(q.pop_front())
    }

    fn wait_async_event(&self, timeout: Option<Duration>) -> Result<()> {
        let channel = &self.dev.event_channel;
        // After `DeviceFatal` nothing more comes: the wait sleeps as long as it was asked.
        runtime::wait_readable_or_hangup(channel.as_fd(), self.hangup_fd(), timeout)?;
        // Clear it (non-blocking: the flag travels with the open file); the caller asks the
        // daemon next, and an event of another connection was a spurious wakeup.
        let mut b = [0u8; 8];
        let _ = rustix::io::read(channel, &mut b);
        Ok(())
    }

    fn async_event_fd(&self) -> BorrowedFd<'_> {
        self.dev.event_channel.as_fd()
    }

    fn hangup_fd(&self) -> Option<BorrowedFd<'_>> {
        (!self.dev.fatal_told.load(Ordering::Relaxed)).then(|| self.dev.hangup.as_fd())
    }

    fn alloc_pd(&self) -> Result<PdHandle> {
        Ok(PdHandle(self.dev.c().alloc_pd(self.dev.dev)?))
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        Ok(self.dev.c().dealloc_pd(pd.0)?)
    }

    #[allow(unsafe_code)]
    unsafe fn reg_mr(
        &self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr> {
        // Memory the daemon can map goes with its file: a shared-memory Buffer's, or the
        // program's own, adopted into one. The registry stays locked until the region is
        // recorded.
        let mut registry = crate::mr::registry();
        // SAFETY: the caller registers the range (reg_mr's contract).
        let m = match unsafe { registry.share(addr as usize, len) } {
            Some(shared) => {
                let m = self.dev.c().reg_mr_shared(
                    pd.0,
                    addr as u64,
                    len as u64,
                    access,
                    shared.fd.as_fd(),
                    shared.offset,
                );
                match (m, shared.adopted) {
                    // Adopted memory the daemon would not map is still the program's
                    // memory: give it back and register it as before adoption.
                    (Err(e), Some(start)) => {
                        tracing::debug!(error = %e, "adopted memory refused; by the process file");
                        registry.release(start);
                        let m = self
                            .dev
                            .c()
                            .reg_mr_at(pd.0, addr as u64, len as u64, access)?;
                        (m, None)
                    }
                    (m, adopted) => (m?, adopted),
                }
            }
            None => (
                self.dev
                    .c()
                    .reg_mr_at(pd.0, addr as u64, len as u64, access)?,
                None,
            ),
        };
        let (m, adopted) = m;
        registry.registered(self.dev.serial.get(), m.handle, addr as usize, len, adopted);
        Ok(RawMr {
            handle: MrHandle(m.handle),
            lkey: Lkey(m.lkey),
            rkey: Rkey(m.rkey),
        })
    }

    #[allow(unsafe_code)]
    unsafe fn rereg_mr(
        &self,
        mr: MrHandle,
        flags: ReregFlags,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr> {
        let mut registry = crate::mr::registry();
        let m = self
            .dev
            .c()
            .rereg_mr(mr.0, flags, pd.0, addr as u64, len as u64, access)?;
        if flags.contains(ReregFlags::CHANGE_TRANSLATION) {
            // The region now reaches the new range through the process file.
            registry.registered(self.dev.serial.get(), mr.0, addr as usize, len, None);
        }
        Ok(RawMr {
            handle: mr,
            lkey: Lkey(m.lkey),
            rkey: Rkey(m.rkey),
        })
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        self.dev.c().dereg_mr(mr.0)?;
        crate::mr::registry().deregistered(self.dev.serial.get(), mr.0);
        Ok(())
    }

    /// A failed deregistration (connection broken, or refused) ends this connection and
    /// waits until the daemon has reclaimed everything it held (the daemon closes its end
    /// only after that). The device is unusable afterwards.
    fn dereg_mr_for_good(&self, mr: MrHandle) {
        if let Err(e) = self.dereg_mr(mr) {
            tracing::warn!(error = %e, "dereg_mr failed");
            tracing::warn!("closing the softrdmad connection so it releases the memory");
            self.dev.c().close_and_wait();
            // The daemon has let go of every region: none reaches its memory now.
            crate::mr::registry().deregistered(self.dev.serial.get(), mr.0);
        }
    }

    fn cm_channel(&self) -> Result<Box<dyn ProviderCmChannel>> {
        let (handle, fd) = self.dev.c().cm_channel(self.dev.dev)?;
        Ok(Box::new(DaemonCmChannel {
            dev: Arc::downgrade(&self.dev),
            handle,
            fd,
        }))
    }

    fn create_cq(&self, depth: u32) -> Result<Box<dyn ProviderCq>> {
        let d = &self.dev;
        let mut c = d.c();
        // The ring's doorbell: polling rings it when completions wait for room.
        let doorbell = match &d.doorbell {
            Some(db) => db.clone(),
            None => Arc::new(c.doorbell(d.dev)?),
        };
        let h = c.create_cq(d.dev, depth)?;
        let capacity = depth
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or(MAX_CQ_RING);
        let setup = c.cq_channel(h).and_then(|channel| {
            let mut ring = c.attach_cq_ring(h, capacity.min(MAX_CQ_RING), doorbell)?;
            // Armed in place where the connection has a doorbell page on the device (as its
            // work rings); by request otherwise.
            if let Some(wd) = &d.work_doorbell {
                if let Err(e) = c.attach_cq_arm(h, &mut ring, wd.clone()) {
                    tracing::debug!(error = %e, "CQ armed by request");
                }
            }
            let ring = Arc::new(Mutex::new(ring));
            lock(&d.cq_rings).insert(h, Arc::downgrade(&ring));
            Ok(DaemonCq {
                dev: Arc::downgrade(d),
                handle: CqHandle(h),
                channel,
                ring,
                hangup: d.hangup.clone(),
                empty_polls: AtomicU32::new(0),
                waits_on: d.work_doorbell.clone(),
            })
        });
        match setup {
            Ok(cq) => Ok(Box::new(cq)),
            Err(e) => {
                let _ = c.destroy_cq(h);
                Err(e.into())
            }
        }
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        self.dev.c().destroy_cq(cq.0)?;
        lock(&self.dev.cq_rings).remove(&cq.0);
        Ok(())
    }

    fn create_qp(&self, init: &QpInitAttr, srq: Option<SrqHandle>) -> Result<RawQp> {
        let d = &self.dev;
        let mut c = d.c();
        let q = match srq {
            Some(s) => c.create_qp_with_srq(init, s.0)?,
            None => c.create_qp(init)?,
        };
        let sq = d
            .attach(&mut c, wq::SQ, q.handle, init.cap.max_send_wr)
            .map(|ring| {
                Mutex::new(SendQueue {
                    ring,
                    slots: SendSlots::default(),
                })
            });
        // A QP on an SRQ has no receive queue of its own.
        let rq = match srq {
            Some(_) => None,
            None => d
                .attach(&mut c, wq::RQ, q.handle, init.cap.max_recv_wr)
                .map(Mutex::new),
        };
        drop(c);
        let raw = RawQp {
            handle: QpHandle(q.handle),
            qpn: Qpn::new(q.qpn),
        };
        let rings = QpRings {
            qpn: raw.qpn,
            cqs: [init.send_cq.0, init.recv_cq.0],
            qp_type: init.qp_type,
            pd: init.pd.0,
            cap: init.cap,
            state: AtomicU32::new(QpState::Reset.to_ibv()),
            sq,
            rq,
            rq_outstanding: AtomicU32::new(0),
            srq: srq.and_then(|s| lock(&d.srqs).get(&s.0).cloned()),
            sq_sig_all: init.sq_sig_all,
        };
        let rings = Arc::new(rings);
        lock(&d.qps_by_qpn).insert(raw.qpn, rings.clone());
        lock(&d.qps).insert(raw.handle, rings);
        Ok(raw)
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        let d = &self.dev;
        d.c().destroy_qp(qp.0)?;
        if let Some(q) = lock(&d.qps).remove(&qp) {
            lock(&d.qps_by_qpn).retain(|_, r| !Arc::ptr_eq(r, &q));
        }
        Ok(())
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let d = &self.dev;
        d.c().modify_qp(qp.0, attr, mask)?;
        if mask.contains(QpAttrMask::STATE) {
            if let Some(q) = d.qp_rings(qp) {
                q.state.store(attr.qp_state.to_ibv(), Ordering::Relaxed);
                if attr.qp_state == QpState::Reset {
                    // RESET empties the queues without completions, and the daemon removed
                    // the QP's completions it still held: those already in the rings go
                    // too.
                    q.rq_outstanding.store(0, Ordering::Relaxed);
                    for cq in q.cqs {
                        let ring = lock(&d.cq_rings).get(&cq).and_then(Weak::upgrade);
                        if let Some(r) = ring {
                            lock(&r).discard(q.qpn.value()).map_err(ring_error)?;
                        }
                    }
                }
                if let Some(sq) = &q.sq {
                    lock(sq).slots.moved(attr.qp_state);
                }
            }
        }
        Ok(())
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        Ok(self.dev.c().query_qp(qp.0)?)
    }

    fn attach_mcast(&self, qp: QpHandle, gid: Gid) -> Result<()> {
        Ok(self.dev.c().attach_mcast(qp.0, gid)?)
    }

    fn detach_mcast(&self, qp: QpHandle, gid: Gid) -> Result<()> {
        Ok(self.dev.c().detach_mcast(qp.0, gid)?)
    }

    fn post_send(&self, qp: QpHandle, wr: SendWr) -> Result<()> {
        let d = &self.dev;
        let signaled = wr.flags.contains(SendFlags::SIGNALED);
        d.post_counted(qp, signaled, |q, ring| {
            if let (Some(q), Some(ring)) = (q, ring) {
                if q.send_ok(&wr, false) && ring_post(ring, |r| r.post_send(&wr, None)) {
                    return Ok(());
                }
            }
            Ok(d.c().post_send(qp.0, &wr)?)
        })
    }

    fn post_send_ud(&self, qp: QpHandle, wr: SendWr, dest: UdDest) -> Result<()> {
        let d = &self.dev;
        let ah_pd = lock(&d.ah_pds).get(&dest.ah.0).copied();
        let signaled = wr.flags.contains(SendFlags::SIGNALED);
        d.post_counted(qp, signaled, |q, ring| {
            if let (Some(q), Some(ring)) = (q, ring) {
                if Some(q.pd) == ah_pd
                    && q.send_ok(&wr, true)
                    && ring_post(ring, |r| r.post_send(&wr, Some(&dest)))
                {
                    return Ok(());
                }
            }
            Ok(d.c().post_send_ud(qp.0, &wr, &dest)?)
        })
    }

    fn post_recv(&self, qp: QpHandle, wr: RecvWr) -> Result<()> {
        let d = &self.dev;
        let rings = d.qp_rings(qp);
        if let Some(q) = &rings {
            if q.rq.is_some() && q.rq_outstanding.load(Ordering::Relaxed) >= q.cap.max_recv_wr {
                return Err(Error::Verbs(VerbsError::QueueFull));
            }
        }
        let counted = |r: Result<()>| {
            if r.is_ok() {
                if let Some(q) = &rings {
                    q.rq_outstanding.fetch_add(1, Ordering::Relaxed);
                }
            }
            r
        };
        let ring = rings.as_ref().filter(|q| q.recv_ok(&wr));
        if let Some(rq) = ring.and_then(|q| q.rq.as_ref()) {
            if ring_post(&mut lock(rq), |r| r.post_recv(&wr)) {
                return counted(Ok(()));
            }
        }
        counted(d.c().post_recv(qp.0, &wr).map_err(Error::from))
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle> {
        let d = &self.dev;
        let mut c = d.c();
        let h = c.create_srq(pd.0, attr)?;
        if let Some(ring) = d.attach(&mut c, wq::SRQ, h, attr.max_wr) {
            let r = SrqRing {
                max_sge: attr.max_sge,
                max_wr: AtomicU32::new(attr.max_wr),
                outstanding: AtomicU32::new(0),
                ring: Mutex::new(ring),
            };
            lock(&d.srqs).insert(h, Arc::new(r));
        }
        Ok(SrqHandle(h))
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        self.dev.c().destroy_srq(srq.0)?;
        lock(&self.dev.srqs).remove(&srq.0);
        Ok(())
    }

    fn post_srq_recv(&self, srq: SrqHandle, wr: RecvWr) -> Result<()> {
        let Some(r) = lock(&self.dev.srqs).get(&srq.0).cloned() else {
            // No ring: by request, where the daemon's engine refuses exactly.
            return Ok(self.dev.c().post_srq_recv(srq.0, &wr)?);
        };
        if !r.reserve() {
            return Err(Error::Verbs(VerbsError::QueueFull));
        }
        if wr.sg_list.len() <= r.max_sge as usize
            && ring_post(&mut lock(&r.ring), |ring| ring.post_recv(&wr))
        {
            return Ok(());
        }
        let posted = self.dev.c().post_srq_recv(srq.0, &wr);
        if posted.is_err() {
            r.release();
        }
        Ok(posted?)
    }

    fn modify_srq(&self, srq: SrqHandle, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.dev.c().modify_srq(srq.0, attr, mask)?;
        if mask.contains(SrqAttrMask::MAX_WR) {
            if let Some(r) = lock(&self.dev.srqs).get(&srq.0) {
                r.max_wr.store(attr.max_wr, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        Ok(self.dev.c().query_srq(srq.0)?)
    }

    fn srq_len(&self, srq: SrqHandle) -> Result<usize> {
        Ok(usize::try_from(self.dev.c().srq_len(srq.0)?).unwrap_or(usize::MAX))
    }

    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        let h = self.dev.c().create_ah(pd.0, attr)?;
        lock(&self.dev.ah_pds).insert(h, pd.0);
        Ok(AhHandle(h))
    }

    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        self.dev.c().destroy_ah(ah.0)?;
        lock(&self.dev.ah_pds).remove(&ah.0);
        Ok(())
    }

    fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> Result<(MwHandle, Rkey)> {
        let (h, rkey) = self.dev.c().alloc_mw(pd.0, mw_type)?;
        Ok((MwHandle(h), Rkey(rkey)))
    }

    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        Ok(self.dev.c().dealloc_mw(mw.0)?)
    }

    fn query_mw(&self, mw: MwHandle) -> Result<(Rkey, bool)> {
        let (rkey, bound) = self.dev.c().query_mw(mw.0)?;
        Ok((Rkey(rkey), bound))
    }

    fn bind_mw(
        &self,
        qp: QpHandle,
        wr_id: u64,
        mw: MwHandle,
        bind: MwBind,
        signaled: bool,
    ) -> Result<Rkey> {
        let d = &self.dev;
        // A bind is a send queue WR: it takes a slot, and its completion retires WRs.
        d.post_counted(qp, signaled, |_, _| {
            let rkey = d.c().bind_mw(qp.0, wr_id, mw.0, bind, signaled)?;
            Ok(Rkey(rkey))
        })
    }
}

/// A daemon CQ: its completion channel (an eventfd passed over the socket) and the
/// shared-memory ring the daemon delivers its completions into (polled with no system call).
#[derive(Debug)]
struct DaemonCq {
    /// The connection, for the requests a CQ makes and the slots its completions retire
    /// (weak: a CQ a C program leaves behind does not keep the connection, and so every
    /// object of it in the daemon, after the device closed).
    dev: Weak<DaemonDevice>,
    handle: CqHandle,
    channel: OwnedFd,
    ring: Arc<Mutex<CqRing>>,
    /// The connection's hang-up descriptor (`DaemonDevice::hangup`).
    hangup: Arc<OwnedFd>,
    /// Polls that found the ring empty: every [`HANGUP_LOOK_EVERY`]th, from the first,
    /// looks whether the daemon is gone.
    empty_polls: AtomicU32,
    /// The connection's doorbell page on the device, where a thread that keeps finding the
    /// ring empty sleeps until the daemon delivers completions ([`ProviderCq::idle`];
    /// `None`: the daemon offers no page, and such a thread only yields).
    waits_on: Option<WorkDoorbell>,
}

/// How often an empty poll looks at the connection (one system call): a program polling
/// a CQ in a tight loop learns within microseconds that softrdmad died, and its polls stay
/// system-call free.
const HANGUP_LOOK_EVERY: u32 = 64;

impl DaemonCq {
    /// The connection, while the device is open.
    fn dev(&self) -> Result<Arc<DaemonDevice>> {
        self.dev.upgrade().ok_or_else(device_closed)
    }

    /// Completions waiting in the ring.
    fn ring_len(&self) -> Result<usize> {
        Ok(lock(&self.ring).len().map_err(ring_error)? as usize)
    }
}

impl ProviderCq for DaemonCq {
    fn handle(&self) -> CqHandle {
        self.handle
    }

    /// A ring in shared memory says nothing when the daemon dies: empty polls look at the
    /// connection now and then, and fail (ECONNRESET) once it hung up, rather than find
    /// nothing forever.
    fn take(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let n = lock(&self.ring).poll_into(out).map_err(ring_error)?;
        if n > 0 {
            self.dev()?.retire(&out[..n]);
        } else {
            // A load and a store, not a read-modify-write: threads polling one CQ at once
            // only blur the count.
            let k = self.empty_polls.load(Ordering::Relaxed);
            self.empty_polls.store(k.wrapping_add(1), Ordering::Relaxed);
            if k.is_multiple_of(HANGUP_LOOK_EVERY) && runtime::hung_up(self.hangup.as_fd()) {
                return Err(super::daemon_gone());
            }
        }
        Ok(n)
    }

    /// Those in the ring plus those the daemon holds until the ring has room.
    fn len(&self) -> Result<usize> {
        let held = usize::try_from(self.dev()?.c().cq_len(self.handle.0)?).unwrap_or(usize::MAX);
        Ok(held.saturating_add(self.ring_len()?))
    }

    /// Completions in the ring count towards the ones waiting, which the engine's check
    /// does not see: checked here first.
    fn resize(&self, cqe: u32) -> Result<u32> {
        let waiting = self.len()?;
        if waiting > cqe as usize {
            return Err(VerbsError::CqTooSmall {
                requested: cqe,
                waiting,
            }
            .into());
        }
        let n = self.dev()?.c().resize_cq(self.handle.0, cqe)?;
        Ok(u32::try_from(n).unwrap_or(cqe))
    }

    /// Yield, or after a long run of empty polls, sleep until the daemon delivers
    /// completions to this connection (any of its CQs: a program often polls several in
    /// turn) or [`super::longest_idle_sleep`] passes.
    fn idle(&self, kind: BackendKind) {
        if !super::yields_when_idle(kind) {
            return;
        }
        match &self.waits_on {
            Some(wd) if super::idle_run_is_long() => {
                // Anything already in the ring ends the wait before it starts.
                let waited = wd
                    .page()
                    .wait_for_completions(super::longest_idle_sleep(), || {
                        self.ring_len().map_or(true, |n| n > 0)
                    });
                super::idle_run_slept(waited);
            }
            _ => std::thread::yield_now(),
        }
    }

    fn arm(&self, solicited_only: bool) -> Result<()> {
        // In place: the arm word and a doorbell bit, a system call only if the daemon sleeps.
        if lock(&self.ring).arm(solicited_only).map_err(ring_error)? {
            return Ok(());
        }
        Ok(self
            .dev()?
            .c()
            .req_notify_cq(self.handle.0, solicited_only)?)
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        // Arming a CQ that already holds completions signals its channel at once, so a
        // completion that came before the arm is not slept through; one already moved into
        // the ring is seen by looking there after arming.
        self.arm(false)?;
        if self.ring_len()? > 0 {
            return Ok(());
        }
        let gone = runtime::wait_readable_or_hangup(
            self.channel.as_fd(),
            Some(self.hangup.as_fd()),
            timeout,
        )?;
        if gone {
            return Err(super::daemon_gone());
        }
        self.clear_event();
        Ok(())
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.channel.as_fd()
    }

    fn hangup_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.hangup.as_fd())
    }

    fn clear_event(&self) -> bool {
        // The daemon made the eventfd non-blocking; the flag travels with the open file, so
        // this read never blocks.
        let mut b = [0u8; 8];
        matches!(rustix::io::read(&self.channel, &mut b), Ok(8))
    }
}

/// A daemon's answer as this API's error: a refusal the daemon sent for one of its engine's
/// verbs errors (it sends the errno and the error's text) is that [`VerbsError`], as the
/// embedded engine would have returned it; any other refusal keeps the daemon's errno and
/// reason ([`Error::Daemon`]).
impl From<ClientError> for Error {
    fn from(e: ClientError) -> Error {
        match &e {
            ClientError::Refused { errno, message } => match verbs_refusal(*errno, message) {
                Some(v) => Error::Verbs(v),
                None => Error::Daemon(e),
            },
            _ => Error::Daemon(e),
        }
    }
}

/// The verbs error a daemon refusal stands for, if it is one the engine returns with this
/// errno and text. A candidate is rebuilt from what the text can name (no data, QP states,
/// the numbers in it) and must render to the very text: errors that carry a reason or a
/// name (`Busy`, `TooMany`, `CapExceeded`...) cannot be rebuilt and stay daemon refusals,
/// with the same errno.
fn verbs_refusal(errno: i32, message: &str) -> Option<VerbsError> {
    use engine::ModifyError;
    let plain = [
        VerbsError::InvalidPd,
        VerbsError::InvalidCq,
        VerbsError::InvalidQp,
        VerbsError::InvalidMr,
        VerbsError::InvalidAccess,
        VerbsError::InvalidFlags,
        VerbsError::InvalidLength,
        VerbsError::QueueFull,
        VerbsError::OpNotSupported,
        VerbsError::InvalidMw,
        VerbsError::InvalidSrq,
        VerbsError::InvalidAh,
        VerbsError::QpTypeNotSupported,
    ];
    let in_state = QpState::ALL.into_iter().map(VerbsError::InvalidState);
    let state_pairs = QpState::ALL
        .into_iter()
        .flat_map(|a| QpState::ALL.into_iter().map(move |b| (a, b)));
    let modify = state_pairs.flat_map(|(a, b)| {
        [
            ModifyError::InvalidTransition { from: a, to: b },
            ModifyError::CurStateMismatch {
                actual: a,
                claimed: b,
            },
        ]
        .map(VerbsError::Modify)
    });
    plain
        .into_iter()
        .chain(in_state)
        .chain(modify)
        .chain(with_numbers(message))
        .find(|v| v.errno() == errno && v.to_string() == message)
}

/// The verbs errors whose fields are the numbers in `message` (in the order their text
/// names them), for [`verbs_refusal`] to check against the text.
fn with_numbers(message: &str) -> Vec<VerbsError> {
    let n: Vec<u64> = message
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    let (Some(&a), b) = (n.first(), n.get(1).copied()) else {
        return Vec::new();
    };
    let mut v = Vec::new();
    if let Ok(i) = u32::try_from(a) {
        v.push(VerbsError::InvalidGidIndex(i));
    }
    if let Ok(p) = u8::try_from(a) {
        v.push(VerbsError::InvalidPort(p));
    }
    if let (Ok(first), Some(Ok(max))) = (usize::try_from(a), b.map(u32::try_from)) {
        v.push(VerbsError::TooManySge { sges: first, max });
        v.push(VerbsError::InlineTooLarge { len: first, max });
        v.push(VerbsError::CqTooSmall {
            requested: max,
            waiting: first,
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_a_verbs_error_is_that_error_and_any_other_stays_the_daemons() {
        let refused = |v: VerbsError| ClientError::Refused {
            errno: v.errno(),
            message: v.to_string(),
        };
        for v in [
            VerbsError::QueueFull,
            VerbsError::InvalidQp,
            VerbsError::InvalidState(QpState::Init),
            VerbsError::Modify(engine::ModifyError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rts,
            }),
            VerbsError::TooManySge { sges: 5, max: 4 },
            VerbsError::InlineTooLarge { len: 300, max: 64 },
            VerbsError::CqTooSmall {
                requested: 2,
                waiting: 9,
            },
            VerbsError::InvalidGidIndex(3),
        ] {
            let e = Error::from(refused(v));
            assert!(matches!(e, Error::Verbs(got) if got == v), "{e:?}");
            assert_eq!(e.errno(), v.errno());
        }
        // The same text with another errno is not that error.
        let e = Error::from(ClientError::Refused {
            errno: 5,
            message: VerbsError::QueueFull.to_string(),
        });
        assert!(matches!(e, Error::Daemon(_)), "{e:?}");
        assert_eq!(e.errno(), 5);
        // A refusal of the daemon's own keeps its errno.
        let e = Error::from(ClientError::Refused {
            errno: 14,
            message: "not mapped".into(),
        });
        assert!(matches!(e, Error::Daemon(_)), "{e:?}");
        assert_eq!(e.errno(), 14);
    }

    /// daemon: every post goes through a work ring (none by request), and the packets never
    /// leave the daemon.
    #[test]
    fn daemon_posts_go_through_work_rings_and_same_device_traffic_stays_inside() {
        use crate::{AccessFlags, Buffer, Device, QpType, DEFAULT_QKEY, GRH_LEN};
        let wait = Some(Duration::from_secs(20));
        let regions = daemon::memory::SharedRegions::default();
        let host = daemon::host::Device::start(
            daemon::host::DeviceConfig {
                name: "srxe0".into(),
                addrs: vec!["127.0.0.1".parse().unwrap()],
                port: 0,
                remote_port: 0,
                ..Default::default()
            },
            regions.clone(),
        )
        .unwrap();
        let socket =
            std::env::temp_dir().join(format!("softrdma-unit-{}-rings.sock", std::process::id()));
        let listener = daemon::server::bind_control_socket(&socket).unwrap();
        let d = Arc::new(daemon::server::Daemon {
            devices: vec![host],
            regions,
            stats: daemon::server::Stats::default(),
        });
        let served = d.clone();
        std::thread::spawn(move || daemon::server::serve(served, listener));
        let open = || {
            Device::builder("127.0.0.1".parse().unwrap())
                .backend(BackendKind::Daemon)
                .daemon_socket(&socket)
                .spawn_daemon(false)
                .open()
                .unwrap()
        };
        let (da, db) = (open(), open());
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        // RC, the receiver's QP fed by an SRQ for half the messages' worth of receives.
        let (pa, pb) = (da.alloc_pd().unwrap(), db.alloc_pd().unwrap());
        let (ca, cb) = (da.create_cq(64).unwrap(), db.create_cq(64).unwrap());
        let qa = pa.qp_builder(&ca, &ca).build().unwrap();
        let qb = pb.qp_builder(&cb, &cb).build().unwrap();
        let ma = pa.register(Buffer::zeroed(4096), access).unwrap();
        let mb = pb.register(Buffer::zeroed(4096), access).unwrap();
        qa.connect(&qb.endpoint(None).unwrap()).unwrap();
        qb.connect(&qa.endpoint(None).unwrap()).unwrap();
        let n = 20u64;
        for i in 0..n {
            let off = i as usize * 64;
            qb.recv(i, &[mb.sge(off..off + 64).unwrap()]).unwrap();
            ma.write(off, format!("rc {i:02}").as_bytes()).unwrap();
            qa.send(i, &[ma.sge(off..off + 5).unwrap()]).unwrap();
        }
        for i in 0..n {
            assert_eq!(ca.wait_ok(wait).unwrap().wr_id, i);
            assert_eq!(cb.wait_ok(wait).unwrap().wr_id, i);
            let mut got = [0u8; 5];
            mb.read(i as usize * 64, &mut got).unwrap();
            assert_eq!(&got, format!("rc {i:02}").as_bytes());
        }
        // SRQ receives.
        let srq = pb.create_srq(16, 1).unwrap();
        let qs = pb.qp_builder(&cb, &cb).srq(&srq).build().unwrap();
        let qt = pa.qp_builder(&ca, &ca).build().unwrap();
        qs.connect(&qt.endpoint(None).unwrap()).unwrap();
        qt.connect(&qs.endpoint(None).unwrap()).unwrap();
        srq.recv(100, &[mb.sge(0..64).unwrap()]).unwrap();
        qt.send(101, &[ma.sge(0..5).unwrap()]).unwrap();
        assert_eq!(ca.wait_ok(wait).unwrap().wr_id, 101);
        assert_eq!(cb.wait_ok(wait).unwrap().wr_id, 100);
        // UD.
        let ua = pa.qp_builder(&ca, &ca).qp_type(QpType::Ud).build().unwrap();
        let ub = pb.qp_builder(&cb, &cb).qp_type(QpType::Ud).build().unwrap();
        ub.recv(200, &[mb.sge(..GRH_LEN + 64).unwrap()]).unwrap();
        let ah = pa.create_ah(db.gid(0).unwrap()).unwrap();
        ua.send_ud(201, &[ma.sge(..5).unwrap()], &ah, ub.qpn(), DEFAULT_QKEY)
            .unwrap();
        assert_eq!(ca.wait_ok(wait).unwrap().wr_id, 201);
        assert_eq!(cb.wait_ok(wait).unwrap().wr_id, 200);

        let posts = 2 * n + 2 + 2;
        assert_eq!(
            d.stats
                .posts_by_request
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        let c: HashMap<&str, u64> = d.devices[0].host_counters().into_iter().collect();
        assert_eq!(c["ring_wqes"], posts);
        assert_eq!((c["ring_bad_wqes"], c["ring_refused_wqes"]), (0, 0));
        assert_eq!(c["tx_datagrams"], 0);
        // At least one packet per send, none through a socket.
        assert!(c["local_packets"] >= n + 2);
        drop((da, db));
        let _ = std::fs::remove_file(&socket);
    }
}

/// A CM channel the daemon holds for this connection: calls go by request, the eventfd it
/// passed is readable while events wait there.
#[derive(Debug)]
struct DaemonCmChannel {
    /// Weak, as a CQ's: a channel left behind does not keep the connection.
    dev: Weak<DaemonDevice>,
    handle: u32,
    fd: OwnedFd,
}

impl DaemonCmChannel {
    fn dev(&self) -> Result<Arc<DaemonDevice>> {
        self.dev.upgrade().ok_or_else(device_closed)
    }
}

impl ProviderCmChannel for DaemonCmChannel {
    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn get_event(&self) -> Result<Option<CmEvent>> {
        Ok(self.dev()?.c().cm_get_event(self.handle)?)
    }

    fn listen(&self, service_id: ServiceId) -> Result<()> {
        Ok(self.dev()?.c().cm_listen(self.handle, service_id)?)
    }

    fn unlisten(&self, service_id: ServiceId) -> Result<()> {
        Ok(self.dev()?.c().cm_unlisten(self.handle, service_id)?)
    }

    fn connect(
        &self,
        qp: Option<QpHandle>,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId> {
        let dev = self.dev()?;
        // Handle 0 names no QP in the protocol.
        let qp = qp.map_or(0, |q| q.0);
        let id = dev
            .c()
            .cm_connect(self.handle, qp, peer, service_id, param)?;
        Ok(id)
    }

    fn resolve(&self, peer: IpAddr, service_id: ServiceId, param: &ConnParam) -> Result<CommId> {
        let dev = self.dev()?;
        let id = dev.c().cm_resolve(self.handle, peer, service_id, param)?;
        Ok(id)
    }

    fn accept(&self, id: CommId, qp: Option<QpHandle>, param: &ConnParam) -> Result<()> {
        let qp = qp.map_or(0, |q| q.0);
        Ok(self.dev()?.c().cm_accept(self.handle, id, qp, param)?)
    }

    fn establish(&self, id: CommId) -> Result<()> {
        Ok(self.dev()?.c().cm_establish(self.handle, id)?)
    }

    fn init_qp_attr(&self, id: CommId, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        Ok(self.dev()?.c().cm_init_qp_attr(self.handle, id, state)?)
    }

    fn reject(&self, id: CommId, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        Ok(self
            .dev()?
            .c()
            .cm_reject(self.handle, id, reason, private_data)?)
    }

    fn disconnect(&self, id: CommId, private_data: &[u8]) -> Result<()> {
        Ok(self
            .dev()?
            .c()
            .cm_disconnect(self.handle, id, private_data)?)
    }

    fn destroy_id(&self, id: CommId) -> Result<()> {
        Ok(self.dev()?.c().cm_destroy_id(self.handle, id)?)
    }
}

impl Drop for DaemonCmChannel {
    fn drop(&mut self) {
        if let Some(dev) = self.dev.upgrade() {
            if let Err(e) = dev.c().cm_destroy_channel(self.handle) {
                tracing::debug!(error = %e, "closing a CM channel");
            }
        }
    }
}
