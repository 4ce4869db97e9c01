//! The two soft RNICs under one API: the embedded engine ([`runtime::Runtime`] in this
//! process) and the host daemon `softrdmad` (reached over its control socket with
//! [`abi::client::Client`]). Every verb of the API goes through [`Backend`]; handles keep
//! the engine's newtypes on both sides (on the daemon they hold the connection's handle
//! numbers).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use abi::client::{Client, ClientError, CqRing, Posted, WorkQueueRing};
use abi::proto::{wq, DeviceInfo};
use engine::{
    AccessFlags, AhAttr, AhHandle, AsyncEvent, CqHandle, DeviceAttr, Gid, MwBind, MwHandle, MwType,
    PdHandle, PortAttr, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags,
    SendOp, SendPayload, SendWr, SrqAttr, SrqAttrMask, SrqHandle, UdDest, WcOpcode, WcStatus,
    WorkCompletion,
};
use runtime::{CqNotifier, Runtime};

use crate::{Error, Result};

/// Which soft RNIC a [`crate::Device`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// An engine inside this process, on its own UDP socket (one process per address and
    /// port).
    Embedded,
    /// The host daemon `softrdmad`, shared by every process of the host.
    Daemon,
}

/// Environment variable choosing the backend: `embedded` or `daemon`.
pub const BACKEND_ENV: &str = "SOFTRDMA_BACKEND";
/// Environment variable turning the start of a missing daemon off (`0`, `no`, `false`, `off`)
/// or on (anything else).
pub const SPAWN_ENV: &str = "SOFTRDMA_DAEMON_SPAWN";
/// Environment variable naming the `softrdmad` binary to start.
pub const DAEMON_BIN_ENV: &str = "SOFTRDMA_DAEMON_BIN";
/// Environment variable with extra arguments (split at whitespace) for a started daemon,
/// e.g. `--addr 127.0.0.1 --port 4791`.
pub const DAEMON_ARGS_ENV: &str = "SOFTRDMA_DAEMON_ARGS";
pub use abi::client::SOCKET_ENV;

impl BackendKind {
    /// The backend `$SOFTRDMA_BACKEND` names, if set; an unknown value is an error.
    pub fn from_env() -> Result<Option<BackendKind>> {
        match std::env::var(BACKEND_ENV) {
            Err(_) => Ok(None),
            Ok(v) => BackendKind::parse(&v),
        }
    }

    /// A backend name as `$SOFTRDMA_BACKEND` holds it (any case, blanks around it ignored;
    /// empty: not set).
    fn parse(v: &str) -> Result<Option<BackendKind>> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" => Ok(None),
            "embedded" => Ok(Some(BackendKind::Embedded)),
            "daemon" => Ok(Some(BackendKind::Daemon)),
            _ => Err(Error::Config(format!(
                "{BACKEND_ENV}={v}: expected `embedded` or `daemon`"
            ))),
        }
    }
}

/// Whether a missing daemon may be started: `$SOFTRDMA_DAEMON_SPAWN`, default yes.
pub(crate) fn spawn_from_env() -> bool {
    std::env::var(SPAWN_ENV).map_or(true, |v| spawn_allowed(&v))
}

fn spawn_allowed(v: &str) -> bool {
    !matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "0" | "no" | "false" | "off"
    )
}

/// How to reach (and if need be start) the daemon.
#[derive(Debug, Clone)]
pub(crate) struct DaemonConfig {
    pub(crate) socket: Option<PathBuf>,
    pub(crate) spawn: Option<bool>,
    pub(crate) binary: Option<PathBuf>,
    pub(crate) args: Option<Vec<String>>,
}

impl DaemonConfig {
    /// The control socket: the configured one, else `$SOFTRDMA_DAEMON_SOCKET`, else the
    /// default.
    pub(crate) fn socket_path(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(abi::client::socket_path)
    }
}

/// The device of `devices` serving `addr` (any device when `addr` is `None`).
pub(crate) fn serving(
    devices: Vec<DeviceInfo>,
    addr: Option<std::net::IpAddr>,
) -> Option<DeviceInfo> {
    match addr {
        None => devices.into_iter().next(),
        Some(a) => devices.into_iter().find(|d| d.addrs.contains(&a)),
    }
}

/// What a look at the control socket found, for the implicit choice of a backend.
pub(crate) enum Probe {
    /// No daemon answers: the socket file (or a directory on its path) is missing, or
    /// nothing listens on it (a file a stopped daemon left behind).
    Nobody,
    /// A daemon answered, with these devices; the connection is kept for the open that
    /// follows.
    Answers {
        client: Client,
        devices: Vec<DeviceInfo>,
    },
}

/// Look for a daemon on `socket` without starting one: connect, greet it, list its
/// devices. Only a missing socket or a refused connect means that none answers; a daemon
/// that is there but cannot be used (permissions, another protocol version, a broken
/// answer) is an error, since falling back to an embedded device would then fight it for
/// its addresses.
pub(crate) fn probe(socket: &Path) -> Result<Probe> {
    let unusable = |e: ClientError| Error::NoDaemon {
        socket: socket.to_path_buf(),
        reason: format!(
            "a daemon is there but cannot be used ({e}); choose a backend with \
             {BACKEND_ENV}=embedded or =daemon"
        ),
    };
    let mut client = match Client::connect(socket) {
        Ok(c) => c,
        Err(ClientError::Io(e)) if nobody_listens(&e) => return Ok(Probe::Nobody),
        Err(e) => return Err(unusable(e)),
    };
    let devices = client.list_devices().map_err(unusable)?;
    Ok(Probe::Answers { client, devices })
}

/// Whether a failed connect to a Unix socket means that no daemon is there.
fn nobody_listens(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    ) || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
}

/// The backend of one open device.
#[derive(Debug)]
pub(crate) enum Backend {
    Embedded(Runtime),
    Daemon(Box<DaemonDevice>),
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
    /// The device's doorbell, for work rings (`None`: the daemon offers none; every post
    /// goes by request).
    doorbell: Option<Arc<OwnedFd>>,
    /// Work rings and post-time facts of this connection's QPs, by handle.
    qps: Mutex<HashMap<u32, Arc<QpRings>>>,
    /// The same QPs by QP number (completions name QPs by number).
    qps_by_qpn: Mutex<HashMap<u32, Arc<QpRings>>>,
    /// Work rings of this connection's SRQs, by handle.
    srqs: Mutex<HashMap<u32, Arc<SrqRing>>>,
    /// The PD of each of this connection's AHs, by handle (a UD post checks it).
    ah_pds: Mutex<HashMap<u32, u32>>,
    /// The completion rings of this connection's CQs, by handle (a QP reset cleans them).
    cq_rings: Mutex<HashMap<u32, Weak<Mutex<CqRing>>>>,
}

/// Largest work ring the daemon grants.
const MAX_WORK_RING: u32 = 1 << 13;

/// A daemon QP's send and receive rings, with what the library checks before writing a WQE:
/// what `ibv_post_send` / `ibv_post_recv` refuse at once must still be refused at once, and
/// anything this cannot vouch for goes by request, where the daemon answers as the verb.
#[derive(Debug)]
struct QpRings {
    /// Its number (completions name it).
    qpn: u32,
    /// Handles of its send and receive CQs.
    cqs: [u32; 2],
    qp_type: QpType,
    pd: u32,
    /// The capabilities asked for (the daemon grants at least these).
    cap: QpCap,
    /// The state this process last moved the QP to. The daemon on its own only moves a QP
    /// to SQE or ERR, where posting is allowed as in RTS (the WQEs are flushed).
    state: Mutex<QpState>,
    sq: Option<Mutex<WorkQueueRing>>,
    rq: Option<Mutex<WorkQueueRing>>,
    /// Receive WRs posted and not yet seen completed by this process's `poll_cq` (a QP
    /// without an SRQ). A WR in a work ring is not in the daemon's queue yet, so the daemon
    /// cannot refuse the one too many: this count does, as `ibv_post_recv` refuses a full
    /// receive queue (`ENOMEM`). Like a hardware RQ's, a slot is free again once the
    /// completion of its WR has been polled.
    rq_outstanding: AtomicU32,
    /// Every send WR is signaled (`sq_sig_all`).
    sq_sig_all: bool,
    /// Send WRs posted and not yet seen retired by this process's `poll_cq` (a QP with a
    /// send ring): the same reason as `rq_outstanding`, the send queue's way.
    sq_slots: Mutex<SendSlots>,
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
        let op_ok = match (self.qp_type, ud) {
            (QpType::Rc, false) => true,
            (QpType::Uc, false) => matches!(
                wr.op,
                SendOp::Send
                    | SendOp::SendWithImm { .. }
                    | SendOp::RdmaWrite { .. }
                    | SendOp::RdmaWriteWithImm { .. }
                    | SendOp::BindMw { .. }
                    | SendOp::LocalInv { .. }
            ),
            (QpType::Ud, true) => matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }),
            _ => false,
        };
        let payload_ok = match &wr.payload {
            SendPayload::Sges(s) => s.len() <= self.cap.max_send_sge as usize,
            SendPayload::Inline(d) => {
                !wr.op.is_read_or_atomic() && d.len() <= self.cap.max_inline_data as usize
            }
        };
        op_ok && payload_ok && lock(&self.state).can_post_send()
    }

    /// Whether `wr` passes every check of `ibv_post_recv` at post time.
    fn recv_ok(&self, wr: &RecvWr) -> bool {
        wr.sg_list.len() <= self.cap.max_recv_sge as usize && lock(&self.state).can_post_recv()
    }
}

/// A daemon SRQ's ring and its SGE limit.
#[derive(Debug)]
struct SrqRing {
    max_sge: u32,
    ring: Mutex<WorkQueueRing>,
}

/// Write a WR into `ring` with `post`; false if it must go by request instead (full, too
/// large, or the ring is unusable).
fn ring_post(
    ring: &Mutex<WorkQueueRing>,
    post: impl FnOnce(&mut WorkQueueRing) -> std::result::Result<Posted, abi::ring::RingError>,
) -> bool {
    match post(&mut lock(ring)) {
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

/// What a CQ keeps besides its handle: the runtime's notifier, or on the daemon its
/// completion channel (an eventfd passed over the socket) and the shared-memory ring the
/// daemon delivers its completions into (polled with no system call).
#[derive(Debug)]
pub(crate) enum Notifier {
    Embedded(Arc<CqNotifier>),
    Daemon {
        channel: OwnedFd,
        ring: Arc<Mutex<CqRing>>,
    },
}

/// Largest CQ ring the daemon grants.
const MAX_CQ_RING: u32 = 1 << 16;

impl Notifier {
    pub(crate) fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Notifier::Embedded(n) => n.as_fd(),
            Notifier::Daemon { channel, .. } => channel.as_fd(),
        }
    }

    /// Completions waiting in the daemon CQ's ring (0 on the embedded backend).
    fn ring_len(&self) -> Result<usize> {
        match self {
            Notifier::Embedded(_) => Ok(0),
            Notifier::Daemon { ring, .. } => Ok(lock(ring).len().map_err(ring_error)? as usize),
        }
    }

    /// Consume a pending notification; true if there was one.
    pub(crate) fn clear(&self) -> bool {
        match self {
            Notifier::Embedded(n) => n.clear(),
            Notifier::Daemon { channel: fd, .. } => {
                // The daemon made the eventfd non-blocking; the flag travels with the open
                // file, so this read never blocks.
                let mut b = [0u8; 8];
                matches!(rustix::io::read(fd, &mut b), Ok(8))
            }
        }
    }
}

fn ring_error(e: abi::ring::RingError) -> Error {
    Error::BadAnswer(format!("CQ ring: {e}"))
}

fn unsupported(what: &'static str) -> Error {
    Error::Unsupported(what)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while a caller held the connection leaves it usable: every call is one
    // request and its whole answer.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl DaemonDevice {
    fn c(&self) -> MutexGuard<'_, Client> {
        lock(&self.client)
    }

    /// Connect (starting the daemon if allowed and needed) and pick the device serving
    /// `addr`, or the first device when `addr` is `None`.
    pub(crate) fn open(
        addr: Option<std::net::IpAddr>,
        config: &DaemonConfig,
    ) -> Result<DaemonDevice> {
        let socket = config.socket_path();
        let spawn = config.spawn.unwrap_or_else(spawn_from_env);
        let mut client = connect_or_spawn(&socket, spawn, config)?;
        let devices = client.list_devices()?;
        let info = serving(devices, addr).ok_or_else(|| {
            Error::Config(match addr {
                Some(a) => format!("softrdmad at {} serves no device on {a}", socket.display()),
                None => format!("softrdmad at {} serves no device", socket.display()),
            })
        })?;
        DaemonDevice::on(client, info)
    }

    /// The daemon's device `info`, through `client` (a connection already made).
    pub(crate) fn on(mut client: Client, info: DeviceInfo) -> Result<DaemonDevice> {
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
        // A daemon without work rings still serves every post by request.
        let doorbell = client.doorbell(info.index).ok().map(Arc::new);
        Ok(DaemonDevice {
            event_channel,
            doorbell,
            qps: Mutex::new(HashMap::new()),
            qps_by_qpn: Mutex::new(HashMap::new()),
            srqs: Mutex::new(HashMap::new()),
            ah_pds: Mutex::new(HashMap::new()),
            cq_rings: Mutex::new(HashMap::new()),
            client: Mutex::new(client),
            dev: info.index,
            info,
            attr,
            port,
            gids,
            events: Mutex::new(VecDeque::new()),
        })
    }

    /// The daemon device's name (`srxe0`...).
    pub(crate) fn name(&self) -> &str {
        &self.info.name
    }

    /// The connection's asynchronous event channel.
    pub(crate) fn event_channel(&self) -> BorrowedFd<'_> {
        self.event_channel.as_fd()
    }

    /// The daemon's pid.
    pub(crate) fn daemon_pid(&self) -> u32 {
        self.c().daemon_pid()
    }

    /// Free the queue slots the completions in `wcs` retire (see `QpRings::rq_outstanding`
    /// and `QpRings::sq_slots`).
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
                // Saturating: completions of WRs posted before a RESET are not counted.
                let _ = q
                    .rq_outstanding
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            } else {
                lock(&q.sq_slots).completed(wc.status == WcStatus::Success);
            }
        }
    }

    /// Post a send-queue WR of QP `qp` with `post` (given the QP's rings, if it has them),
    /// counted against `max_send_wr` when it goes through a send ring (`QpRings::sq_slots`):
    /// `QueueFull` when every slot is taken, as `ibv_post_send` fails with `ENOMEM`.
    fn post_counted<T>(
        &self,
        qp: u32,
        signaled: bool,
        post: impl FnOnce(Option<&QpRings>) -> Result<T>,
    ) -> Result<T> {
        let rings = self.qp_rings(qp);
        let Some(q) = rings.as_deref().filter(|q| q.sq.is_some()) else {
            // No ring: every post goes by request, and the daemon's engine refuses exactly.
            return post(rings.as_deref());
        };
        // Held across the post, so the count and the order of WRs match the ring's.
        let mut slots = lock(&q.sq_slots);
        if slots.full(q.cap.max_send_wr) {
            return Err(Error::Verbs(engine::VerbsError::QueueFull));
        }
        let r = post(Some(q))?;
        slots.posted(signaled || q.sq_sig_all);
        Ok(r)
    }

    fn qp_rings(&self, qp: u32) -> Option<Arc<QpRings>> {
        lock(&self.qps).get(&qp).cloned()
    }

    /// A work ring for `queue` of `handle`, if the daemon grants one.
    fn attach(&self, c: &mut Client, queue: u8, handle: u32, depth: u32) -> Option<WorkQueueRing> {
        let doorbell = self.doorbell.clone()?;
        match c.attach_work_ring(queue, handle, ring_capacity(depth), doorbell) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!(error = %e, queue, "no work ring; posting by request");
                None
            }
        }
    }
}

/// Where to look for `softrdmad`: `$SOFTRDMA_DAEMON_BIN`, the configured path, next to the
/// current executable (and one directory up, for test binaries in `target/*/deps`), then
/// `PATH`.
fn find_daemon_binary(config: &DaemonConfig) -> Option<PathBuf> {
    if let Some(b) = &config.binary {
        return Some(b.clone());
    }
    if let Some(b) = std::env::var_os(DAEMON_BIN_ENV) {
        return Some(PathBuf::from(b));
    }
    let name = "softrdmad";
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent();
        for _ in 0..2 {
            if let Some(d) = dir {
                let p = d.join(name);
                if p.is_file() {
                    return Some(p);
                }
                dir = d.parent();
            }
        }
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// How long a started daemon may take to open its socket.
const SPAWN_WAIT: Duration = Duration::from_secs(10);

fn connect_or_spawn(socket: &Path, spawn: bool, config: &DaemonConfig) -> Result<Client> {
    let first = match Client::connect(socket) {
        Ok(c) => return Ok(c),
        Err(e) => e,
    };
    if !spawn {
        return Err(Error::NoDaemon {
            socket: socket.to_path_buf(),
            reason: format!("{first} (starting one is turned off)"),
        });
    }
    let bin = find_daemon_binary(config).ok_or_else(|| Error::NoDaemon {
        socket: socket.to_path_buf(),
        reason: format!(
            "{first}; no softrdmad binary to start (set {DAEMON_BIN_ENV} or put it on PATH)"
        ),
    })?;
    let args: Vec<String> = match &config.args {
        Some(a) => a.clone(),
        None => std::env::var(DAEMON_ARGS_ENV)
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
    };
    tracing::info!(binary = %bin.display(), socket = %socket.display(), ?args, "starting softrdmad");
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(&args)
        .arg("--socket")
        .arg(socket)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // Its own process group: a Ctrl-C meant for this program does not stop the host's
    // daemon, which other processes may be using by then.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().map_err(|e| Error::NoDaemon {
        socket: socket.to_path_buf(),
        reason: format!("{first}; starting {} failed: {e}", bin.display()),
    })?;
    let deadline = Instant::now() + SPAWN_WAIT;
    let mut exited = None;
    loop {
        if let Ok(c) = Client::connect(socket) {
            if exited.is_none() {
                // Reap it when it ends, whenever that is.
                std::thread::spawn(move || {
                    let _ = child.wait();
                });
            }
            return Ok(c);
        }
        if exited.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                // Another process may have started one at the same moment (ours then
                // found the socket taken): keep trying to connect until the deadline.
                exited = Some(status);
            }
        }
        if Instant::now() >= deadline {
            if exited.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            return Err(Error::NoDaemon {
                socket: socket.to_path_buf(),
                reason: match exited {
                    Some(s) => format!("started {} but it exited ({s})", bin.display()),
                    None => format!(
                        "started {} but its socket did not come up in {SPAWN_WAIT:?}",
                        bin.display()
                    ),
                },
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a thread that looked for work and found none gives its core away
/// ([`Backend::relax`]): `SOFTRDMA_POLL_YIELD=1` on either backend, `0` never; by default on
/// the daemon when this process may use fewer than four CPUs.
fn yields_when_idle(kind: BackendKind) -> bool {
    static FORCED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    static FEW_CPUS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        match std::env::var("SOFTRDMA_POLL_YIELD")
            .as_deref()
            .map(str::trim)
        {
            Ok("1") => Some(true),
            Ok("0") => Some(false),
            _ => None,
        }
    });
    forced.unwrap_or_else(|| {
        // Read once: the count comes from cgroup files, several system calls each time.
        kind == BackendKind::Daemon
            && *FEW_CPUS
                .get_or_init(|| std::thread::available_parallelism().map_or(true, |n| n.get() < 4))
    })
}

impl Backend {
    /// Called by a thread that looked (at a CQ, at memory) and found nothing, before it
    /// looks again. On the daemon the completion it waits for is produced by the daemon's
    /// progress thread: with fewer cores than spinning threads (two busy-polling processes
    /// and the daemon on a 2-CPU host), that thread would wait for a time slice
    /// (milliseconds) unless the pollers give the core away at each empty look.
    pub(crate) fn relax(&self) {
        if yields_when_idle(self.kind()) {
            std::thread::yield_now();
        }
    }

    pub(crate) fn kind(&self) -> BackendKind {
        match self {
            Backend::Embedded(_) => BackendKind::Embedded,
            Backend::Daemon(_) => BackendKind::Daemon,
        }
    }

    pub(crate) fn runtime(&self) -> Option<&Runtime> {
        match self {
            Backend::Embedded(rt) => Some(rt),
            Backend::Daemon(_) => None,
        }
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        match self {
            Backend::Embedded(rt) => rt.local_addr(),
            Backend::Daemon(d) => {
                let ip = d
                    .gids
                    .first()
                    .map(|g| g.to_ip())
                    .or_else(|| d.info.addrs.first().copied())
                    .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into());
                SocketAddr::new(ip, d.info.port)
            }
        }
    }

    pub(crate) fn query_device(&self) -> DeviceAttr {
        match self {
            Backend::Embedded(rt) => rt.lock().query_device(),
            Backend::Daemon(d) => d.attr.clone(),
        }
    }

    pub(crate) fn query_port(&self) -> Result<PortAttr> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().query_port(1)?),
            Backend::Daemon(d) => Ok(d.port),
        }
    }

    pub(crate) fn gid(&self, index: u32) -> Result<Gid> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().query_gid(1, index)?),
            Backend::Daemon(d) => d
                .gids
                .get(index as usize)
                .copied()
                .ok_or(Error::Verbs(engine::VerbsError::InvalidGidIndex(index))),
        }
    }

    pub(crate) fn gids(&self) -> Vec<Gid> {
        match self {
            Backend::Embedded(rt) => {
                let e = rt.lock();
                (0..).map_while(|i| e.query_gid(1, i).ok()).collect()
            }
            Backend::Daemon(d) => d.gids.clone(),
        }
    }

    pub(crate) fn counters(&self) -> Result<engine::Counters> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().counters().clone()),
            Backend::Daemon(_) => {
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
        }
    }

    pub(crate) fn counter_values(&self) -> Result<Vec<(String, u64)>> {
        match self {
            Backend::Embedded(rt) => Ok(rt
                .lock()
                .counters()
                .iter()
                .map(|(c, n)| (c.name().to_string(), n))
                .collect()),
            Backend::Daemon(d) => {
                let prefix = format!("{}.", d.info.name);
                Ok(d.c()
                    .stat()?
                    .into_iter()
                    .filter_map(|(n, v)| n.strip_prefix(&prefix).map(|n| (n.to_string(), v)))
                    .collect())
            }
        }
    }

    pub(crate) fn alloc_pd(&self) -> Result<PdHandle> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().alloc_pd()?),
            Backend::Daemon(d) => Ok(PdHandle(d.c().alloc_pd(d.dev)?)),
        }
    }

    pub(crate) fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().dealloc_pd(pd)?),
            Backend::Daemon(d) => Ok(d.c().dealloc_pd(pd.0)?),
        }
    }

    /// Register `len` bytes at `addr`; returns (handle, lkey, rkey).
    ///
    /// # Safety
    ///
    /// `addr..addr + len` stays valid until [`Backend::dereg_mr`] succeeds, and is reached
    /// by the application only in ways the device's own accesses cannot invalidate.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn reg_mr(
        &self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<(u32, u32, u32)> {
        match self {
            Backend::Embedded(rt) => {
                // SAFETY: forwarded from this function's contract.
                let k = unsafe { rt.lock().reg_mr(pd, addr, len, access)? };
                Ok((k.handle.0, k.lkey, k.rkey))
            }
            Backend::Daemon(d) => {
                // Memory of a shared-memory Buffer goes with its file: the daemon maps it.
                let m = match crate::mr::shared_file_of(addr as usize, len) {
                    Some((fd, offset)) => d.c().reg_mr_shared(
                        pd.0,
                        addr as u64,
                        len as u64,
                        access,
                        std::os::fd::AsFd::as_fd(&fd),
                        offset,
                    )?,
                    None => d.c().reg_mr_at(pd.0, addr as u64, len as u64, access)?,
                };
                Ok((m.handle, m.lkey, m.rkey))
            }
        }
    }

    /// Change region `handle` in place (`ibv_rereg_mr`); returns its (lkey, rkey).
    ///
    /// # Safety
    ///
    /// With `CHANGE_TRANSLATION`, `addr..addr + len` meets [`Backend::reg_mr`]'s contract.
    #[allow(unsafe_code, clippy::too_many_arguments)]
    pub(crate) unsafe fn rereg_mr(
        &self,
        handle: u32,
        flags: engine::ReregFlags,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<(u32, u32)> {
        match self {
            Backend::Embedded(rt) => {
                let mr = engine::MrHandle(handle);
                // SAFETY: forwarded from this function's contract.
                let k = unsafe { rt.lock().rereg_mr(mr, flags, pd, addr, len, access)? };
                Ok((k.lkey, k.rkey))
            }
            Backend::Daemon(d) => {
                let m = d
                    .c()
                    .rereg_mr(handle, flags, pd.0, addr as u64, len as u64, access)?;
                Ok((m.lkey, m.rkey))
            }
        }
    }

    pub(crate) fn dereg_mr(&self, handle: u32) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().dereg_mr(engine::MrHandle(handle))?),
            Backend::Daemon(d) => Ok(d.c().dereg_mr(handle)?),
        }
    }

    /// Deregister, and make sure the device can no longer reach the memory even if that
    /// fails: on the daemon, a failed deregistration (connection broken, or refused) ends
    /// this connection and waits until the daemon has reclaimed everything it held (the
    /// daemon closes its end only after that). The device is unusable afterwards.
    pub(crate) fn dereg_mr_for_good(&self, handle: u32) {
        if let Err(e) = self.dereg_mr(handle) {
            tracing::warn!(error = %e, "dereg_mr failed");
            if let Backend::Daemon(d) = self {
                tracing::warn!("closing the softrdmad connection so it releases the memory");
                d.c().close_and_wait();
            }
        }
    }

    pub(crate) fn create_cq(&self, depth: u32) -> Result<(CqHandle, Notifier)> {
        match self {
            Backend::Embedded(rt) => {
                let h = rt.lock().create_cq(depth)?;
                match rt.cq_notifier(h) {
                    Ok(n) => Ok((h, Notifier::Embedded(n))),
                    Err(e) => {
                        let _ = rt.lock().destroy_cq(h);
                        Err(e.into())
                    }
                }
            }
            Backend::Daemon(d) => {
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
                    let ring = c.attach_cq_ring(h, capacity.min(MAX_CQ_RING), doorbell)?;
                    let ring = Arc::new(Mutex::new(ring));
                    lock(&d.cq_rings).insert(h, Arc::downgrade(&ring));
                    Ok(Notifier::Daemon { channel, ring })
                });
                match setup {
                    Ok(n) => Ok((CqHandle(h), n)),
                    Err(e) => {
                        let _ = c.destroy_cq(h);
                        Err(e.into())
                    }
                }
            }
        }
    }

    pub(crate) fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().destroy_cq(cq)?),
            Backend::Daemon(d) => {
                d.c().destroy_cq(cq.0)?;
                lock(&d.cq_rings).remove(&cq.0);
                Ok(())
            }
        }
    }

    /// Up to `max` completions; on the daemon from the CQ's ring, with no system call.
    pub(crate) fn poll_cq(
        &self,
        cq: CqHandle,
        state: &Notifier,
        max: usize,
    ) -> Result<Vec<WorkCompletion>> {
        // In turns of a small stack buffer: a large `max` with few completions waiting
        // costs no large zeroed allocation on every poll.
        let mut wcs = Vec::new();
        let mut buf = [WorkCompletion::default(); 32];
        while wcs.len() < max {
            let want = (max - wcs.len()).min(buf.len());
            let n = self.take_completions(cq, state, &mut buf[..want])?;
            wcs.extend_from_slice(&buf[..n]);
            if n < want {
                break;
            }
        }
        if wcs.is_empty() {
            self.relax();
        }
        Ok(wcs)
    }

    /// Completions into `out`, as many as wait and fit; returns how many. Allocates
    /// nothing: on the daemon the completions are read from the CQ's ring in place.
    pub(crate) fn poll_cq_into(
        &self,
        cq: CqHandle,
        state: &Notifier,
        out: &mut [WorkCompletion],
    ) -> Result<usize> {
        let n = self.take_completions(cq, state, out)?;
        if n == 0 {
            self.relax();
        }
        Ok(n)
    }

    /// Completions into `out`; no yielding when there are none.
    fn take_completions(
        &self,
        cq: CqHandle,
        state: &Notifier,
        out: &mut [WorkCompletion],
    ) -> Result<usize> {
        match (self, state) {
            (Backend::Embedded(rt), _) => Ok(rt.lock().poll_cq_into(cq, out)?),
            (Backend::Daemon(d), Notifier::Daemon { ring, .. }) => {
                let n = lock(ring).poll_into(out).map_err(ring_error)?;
                d.retire(&out[..n]);
                Ok(n)
            }
            (Backend::Daemon(_), Notifier::Embedded(_)) => Err(unsupported("a foreign CQ")),
        }
    }

    /// Completions waiting: on the daemon, those in the ring plus those the daemon holds
    /// until the ring has room.
    pub(crate) fn cq_len(&self, cq: CqHandle, state: &Notifier) -> Result<usize> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().cq_len(cq)?),
            Backend::Daemon(d) => {
                let held = usize::try_from(d.c().cq_len(cq.0)?).unwrap_or(usize::MAX);
                Ok(held.saturating_add(state.ring_len()?))
            }
        }
    }

    /// `ibv_resize_cq`: room for `cqe` completions; returns the size the CQ has now.
    /// Refused (EINVAL) while more completions wait than that: on the daemon those in its
    /// ring count too.
    pub(crate) fn resize_cq(&self, cq: CqHandle, state: &Notifier, cqe: u32) -> Result<u32> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().resize_cq(cq, cqe)?),
            Backend::Daemon(d) => {
                let waiting = self.cq_len(cq, state)?;
                if waiting > cqe as usize {
                    return Err(engine::VerbsError::CqTooSmall {
                        requested: cqe,
                        waiting,
                    }
                    .into());
                }
                let n = d.c().resize_cq(cq.0, cqe)?;
                Ok(u32::try_from(n).unwrap_or(cqe))
            }
        }
    }

    pub(crate) fn arm_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.arm_cq_with(cq, solicited_only)?),
            Backend::Daemon(d) => Ok(d.c().req_notify_cq(cq.0, solicited_only)?),
        }
    }

    /// Sleep until `cq` has a completion or `timeout` passes. `notifier` is the CQ's own.
    pub(crate) fn wait_cq(
        &self,
        cq: CqHandle,
        notifier: &Notifier,
        timeout: Option<Duration>,
    ) -> Result<()> {
        match self {
            Backend::Embedded(rt) => {
                rt.wait_cq(cq, timeout)?;
                Ok(())
            }
            Backend::Daemon(d) => {
                // Arming a CQ that already holds completions signals its channel at once, so
                // a completion that came before the arm is not slept through; one already
                // moved into the ring is seen by looking there after arming.
                d.c().req_notify_cq(cq.0, false)?;
                if notifier.ring_len()? > 0 {
                    return Ok(());
                }
                runtime::wait_readable(notifier.as_fd(), timeout)?;
                notifier.clear();
                Ok(())
            }
        }
    }

    /// Create a QP; returns (handle, QPN). The embedded handle is the QPN.
    pub(crate) fn create_qp(
        &self,
        init: &QpInitAttr,
        srq: Option<SrqHandle>,
    ) -> Result<(u32, u32)> {
        match self {
            Backend::Embedded(rt) => {
                let qpn = match srq {
                    Some(s) => rt.lock().create_qp_with_srq(init, s)?,
                    None => rt.lock().create_qp(init)?,
                };
                Ok((qpn, qpn))
            }
            Backend::Daemon(d) => {
                let mut c = d.c();
                let q = match srq {
                    Some(s) => c.create_qp_with_srq(init, s.0)?,
                    None => c.create_qp(init)?,
                };
                let sq = d
                    .attach(&mut c, wq::SQ, q.handle, init.cap.max_send_wr)
                    .map(Mutex::new);
                // A QP on an SRQ has no receive queue of its own.
                let rq = match srq {
                    Some(_) => None,
                    None => d
                        .attach(&mut c, wq::RQ, q.handle, init.cap.max_recv_wr)
                        .map(Mutex::new),
                };
                drop(c);
                let rings = QpRings {
                    qpn: q.qpn,
                    cqs: [init.send_cq.0, init.recv_cq.0],
                    qp_type: init.qp_type,
                    pd: init.pd.0,
                    cap: init.cap,
                    state: Mutex::new(QpState::Reset),
                    sq,
                    rq,
                    rq_outstanding: AtomicU32::new(0),
                    sq_sig_all: init.sq_sig_all,
                    sq_slots: Mutex::new(SendSlots::default()),
                };
                let rings = Arc::new(rings);
                lock(&d.qps_by_qpn).insert(q.qpn, rings.clone());
                lock(&d.qps).insert(q.handle, rings);
                Ok((q.handle, q.qpn))
            }
        }
    }

    pub(crate) fn destroy_qp(&self, qp: u32) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().destroy_qp(qp)?),
            Backend::Daemon(d) => {
                d.c().destroy_qp(qp)?;
                if let Some(q) = lock(&d.qps).remove(&qp) {
                    lock(&d.qps_by_qpn).retain(|_, r| !Arc::ptr_eq(r, &q));
                }
                Ok(())
            }
        }
    }

    pub(crate) fn modify_qp(&self, qp: u32, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().modify_qp(qp, attr, mask)?),
            Backend::Daemon(d) => {
                d.c().modify_qp(qp, attr, mask)?;
                if mask.contains(QpAttrMask::STATE) {
                    if let Some(q) = d.qp_rings(qp) {
                        *lock(&q.state) = attr.qp_state;
                        if attr.qp_state == QpState::Reset {
                            // RESET empties the queues without completions, and the daemon
                            // removed the QP's completions it still held: those already in
                            // the rings go too.
                            q.rq_outstanding.store(0, Ordering::Relaxed);
                            for cq in q.cqs {
                                let ring = lock(&d.cq_rings).get(&cq).and_then(Weak::upgrade);
                                if let Some(r) = ring {
                                    lock(&r).discard(q.qpn).map_err(ring_error)?;
                                }
                            }
                        }
                        lock(&q.sq_slots).moved(attr.qp_state);
                    }
                }
                Ok(())
            }
        }
    }

    pub(crate) fn query_qp(&self, qp: u32) -> Result<QpAttr> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().query_qp(qp)?),
            Backend::Daemon(d) => Ok(d.c().query_qp(qp)?),
        }
    }

    pub(crate) fn post_send(&self, qp: u32, wr: SendWr) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().post_send(qp, wr)?),
            Backend::Daemon(d) => {
                let signaled = wr.flags.contains(SendFlags::SIGNALED);
                d.post_counted(qp, signaled, |q| {
                    let ring = q.filter(|q| q.send_ok(&wr, false));
                    if let Some(sq) = ring.and_then(|q| q.sq.as_ref()) {
                        if ring_post(sq, |r| r.post_send(&wr, None)) {
                            return Ok(());
                        }
                    }
                    Ok(d.c().post_send(qp, &wr)?)
                })
            }
        }
    }

    pub(crate) fn post_send_ud(&self, qp: u32, wr: SendWr, dest: UdDest) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().post_send_ud(qp, wr, dest)?),
            Backend::Daemon(d) => {
                let ah_pd = lock(&d.ah_pds).get(&dest.ah.0).copied();
                let signaled = wr.flags.contains(SendFlags::SIGNALED);
                d.post_counted(qp, signaled, |q| {
                    let ring = q.filter(|q| Some(q.pd) == ah_pd && q.send_ok(&wr, true));
                    if let Some(sq) = ring.and_then(|q| q.sq.as_ref()) {
                        if ring_post(sq, |r| r.post_send(&wr, Some(&dest))) {
                            return Ok(());
                        }
                    }
                    Ok(d.c().post_send_ud(qp, &wr, &dest)?)
                })
            }
        }
    }

    pub(crate) fn post_recv(&self, qp: u32, wr: RecvWr) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().post_recv(qp, wr)?),
            Backend::Daemon(d) => {
                let rings = d.qp_rings(qp);
                if let Some(q) = &rings {
                    if q.rq.is_some()
                        && q.rq_outstanding.load(Ordering::Relaxed) >= q.cap.max_recv_wr
                    {
                        return Err(Error::Verbs(engine::VerbsError::QueueFull));
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
                    if ring_post(rq, |r| r.post_recv(&wr)) {
                        return counted(Ok(()));
                    }
                }
                counted(d.c().post_recv(qp, &wr).map_err(Error::from))
            }
        }
    }

    pub(crate) fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().create_srq(pd, attr)?),
            Backend::Daemon(d) => {
                let mut c = d.c();
                let h = c.create_srq(pd.0, attr)?;
                if let Some(ring) = d.attach(&mut c, wq::SRQ, h, attr.max_wr) {
                    let r = SrqRing {
                        max_sge: attr.max_sge,
                        ring: Mutex::new(ring),
                    };
                    lock(&d.srqs).insert(h, Arc::new(r));
                }
                Ok(SrqHandle(h))
            }
        }
    }

    pub(crate) fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().destroy_srq(srq)?),
            Backend::Daemon(d) => {
                d.c().destroy_srq(srq.0)?;
                lock(&d.srqs).remove(&srq.0);
                Ok(())
            }
        }
    }

    pub(crate) fn post_srq_recv(&self, srq: SrqHandle, wr: RecvWr) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().post_srq_recv(srq, wr)?),
            Backend::Daemon(d) => {
                let ring = lock(&d.srqs).get(&srq.0).cloned();
                if let Some(r) = ring.filter(|r| wr.sg_list.len() <= r.max_sge as usize) {
                    if ring_post(&r.ring, |ring| ring.post_recv(&wr)) {
                        return Ok(());
                    }
                }
                Ok(d.c().post_srq_recv(srq.0, &wr)?)
            }
        }
    }

    pub(crate) fn modify_srq(
        &self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().modify_srq(srq, attr, mask)?),
            Backend::Daemon(d) => Ok(d.c().modify_srq(srq.0, attr, mask)?),
        }
    }

    pub(crate) fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().query_srq(srq)?),
            Backend::Daemon(d) => Ok(d.c().query_srq(srq.0)?),
        }
    }

    pub(crate) fn srq_len(&self, srq: SrqHandle) -> Result<usize> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().srq_len(srq)?),
            Backend::Daemon(d) => Ok(usize::try_from(d.c().srq_len(srq.0)?).unwrap_or(usize::MAX)),
        }
    }

    pub(crate) fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().create_ah(pd, attr)?),
            Backend::Daemon(d) => {
                let h = d.c().create_ah(pd.0, attr)?;
                lock(&d.ah_pds).insert(h, pd.0);
                Ok(AhHandle(h))
            }
        }
    }

    pub(crate) fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().destroy_ah(ah)?),
            Backend::Daemon(d) => {
                d.c().destroy_ah(ah.0)?;
                lock(&d.ah_pds).remove(&ah.0);
                Ok(())
            }
        }
    }

    /// A new memory window; returns its handle and rkey.
    pub(crate) fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> Result<(MwHandle, u32)> {
        match self {
            Backend::Embedded(rt) => {
                let k = rt.lock().alloc_mw(pd, mw_type)?;
                Ok((k.handle, k.rkey))
            }
            Backend::Daemon(d) => {
                let (h, rkey) = d.c().alloc_mw(pd.0, mw_type)?;
                Ok((MwHandle(h), rkey))
            }
        }
    }

    pub(crate) fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().dealloc_mw(mw)?),
            Backend::Daemon(d) => Ok(d.c().dealloc_mw(mw.0)?),
        }
    }

    /// The window's current rkey and whether it is bound.
    pub(crate) fn query_mw(&self, mw: MwHandle) -> Result<(u32, bool)> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().query_mw(mw)?),
            Backend::Daemon(d) => Ok(d.c().query_mw(mw.0)?),
        }
    }

    /// Post the bind verb of a type 1 window on QP `qp`; returns the rkey it will have.
    pub(crate) fn bind_mw(
        &self,
        qp: u32,
        wr_id: u64,
        mw: MwHandle,
        bind: MwBind,
        signaled: bool,
    ) -> Result<u32> {
        match self {
            Backend::Embedded(rt) => Ok(rt.lock().bind_mw(qp, wr_id, mw, bind, signaled)?),
            // A bind is a send queue WR: it takes a slot, and its completion retires WRs.
            Backend::Daemon(d) => d.post_counted(qp, signaled, |_| {
                Ok(d.c().bind_mw(qp, wr_id, mw.0, bind, signaled)?)
            }),
        }
    }

    /// The next asynchronous event, without blocking.
    pub(crate) fn async_event(&self) -> Result<Option<AsyncEvent>> {
        match self {
            Backend::Embedded(rt) => Ok(rt.get_async_event()),
            Backend::Daemon(d) => {
                let mut q = lock(&d.events);
                if q.is_empty() {
                    q.extend(d.c().async_events()?);
                }
                Ok(q.pop_front())
            }
        }
    }

    /// Sleep until an asynchronous event may be there, at most `timeout`.
    pub(crate) fn wait_async_event(&self, timeout: Option<Duration>) -> Result<()> {
        match self {
            Backend::Embedded(rt) => Ok(runtime::wait_readable(rt.async_event_fd(), timeout)?),
            Backend::Daemon(d) => {
                runtime::wait_readable(d.event_channel.as_fd(), timeout)?;
                // Clear it (non-blocking: the flag travels with the open file); the caller
                // asks the daemon next, and an event of another connection was a spurious
                // wakeup.
                let mut b = [0u8; 8];
                let _ = rustix::io::read(&d.event_channel, &mut b);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_parse_and_anything_else_is_a_config_error() {
        assert_eq!(BackendKind::parse("").unwrap(), None);
        assert_eq!(
            BackendKind::parse(" Daemon\n").unwrap(),
            Some(BackendKind::Daemon)
        );
        assert_eq!(
            BackendKind::parse("embedded").unwrap(),
            Some(BackendKind::Embedded)
        );
        assert!(matches!(
            BackendKind::parse("kernel"),
            Err(Error::Config(_))
        ));
    }

    /// RC SEND/RECV, UD SEND and SRQ receives between two connections of one in-process
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

    #[test]
    fn spawning_is_on_unless_turned_off() {
        for off in ["0", "no", "FALSE", " off "] {
            assert!(!spawn_allowed(off), "{off}");
        }
        for on in ["1", "yes", "true", ""] {
            assert!(spawn_allowed(on), "{on}");
        }
    }
}
