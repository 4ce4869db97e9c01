//! The provider interface: what a soft RNIC under this API can do, as one table of
//! operations (rdma-core's `verbs_context_ops` habit), filled once when a device is opened.
//! Two providers implement it: the embedded engine ([`embedded::Embedded`], a
//! [`runtime::Runtime`] in this process) and the host daemon `softrdmad`
//! ([`daemon::Daemon`], reached over its control socket with [`abi::client::Client`], posting
//! and polling through rings in shared memory). Nothing above this module asks which one
//! it has, except to say so ([`BackendKind`]).
//!
//! Both providers fail with the one [`Error`] type, and the same failure with the same
//! variant: a verb the device refuses is [`Error::Verbs`] whichever engine refused it (a
//! refusal the daemon sends for one of its engine's verbs errors is turned back into it),
//! and [`Error::errno`] is the one errno mapping every caller uses.
//!
//! Objects are named by the engine's handle newtypes; a QP by a [`QpHandle`], which is not
//! its [`Qpn`] (the embedded engine happens to name its QPs by number, the daemon by the
//! connection's handle).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::time::Duration;

use engine::{
    AccessFlags, AhAttr, AhHandle, AsyncEvent, CqHandle, DeviceAttr, Gid, MrHandle, MwBind,
    MwHandle, MwType, PdHandle, PortAttr, QpAttr, QpAttrMask, QpInitAttr, QpState, RecvWr,
    ReregFlags, SendWr, SrqAttr, SrqAttrMask, SrqHandle, UdDest, WorkCompletion,
};
use runtime::{CmEvent, CommId, ConnParam, EngineGuard, Runtime};
use wire::{RejectReason, ServiceId};

use crate::{Error, Result};

pub(crate) mod daemon;
pub(crate) mod embedded;
pub(crate) mod locate;

pub use wire::types::{Lkey, Qpn, Rkey};

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

/// What a provider names a queue pair by in its QP verbs: the embedded engine's QP number,
/// or the daemon connection's handle for it. Not a [`Qpn`]: peers, completions and
/// asynchronous events name a QP by its number, which only the embedded device also uses
/// as its handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpHandle(pub u32);

/// A registered memory region's handle and keys (`ibv_mr`'s `handle`, `lkey`, `rkey`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawMr {
    /// Names the region in [`crate::RawDevice::dereg_mr`].
    pub handle: MrHandle,
    /// Local key, for SGEs of this process's work requests.
    pub lkey: Lkey,
    /// Remote key, for peers' RDMA operations.
    pub rkey: Rkey,
}

/// A queue pair's handle and number (see [`QpHandle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawQp {
    /// Names the QP in the QP verbs of [`crate::RawDevice`].
    pub handle: QpHandle,
    /// The QP number peers address (and completions and asynchronous events name).
    pub qpn: Qpn,
}

/// The operations of one open device, implemented once per backend. Every verb of the API
/// goes through it; a CQ's own operations go through the [`ProviderCq`] it made.
pub(crate) trait Provider: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// The embedded runtime, if this provider is one.
    fn runtime(&self) -> Option<&Runtime> {
        None
    }

    /// The daemon's device name and pid, if this provider is the daemon's.
    fn daemon_info(&self) -> Option<(String, u32)> {
        None
    }

    /// Lock the device out of registered memory, if it can be: the embedded engine touches
    /// memory only under its lock; a daemon writes it whenever it likes (`None`).
    fn lock_out(&self) -> Option<EngineGuard<'_>>;

    /// The address and UDP port the device receives on.
    fn local_addr(&self) -> SocketAddr;
    /// `ibv_query_device`.
    fn query_device(&self) -> DeviceAttr;
    /// `ibv_query_port` of port 1.
    fn query_port(&self) -> Result<PortAttr>;
    /// `ibv_query_gid` of port 1.
    fn gid(&self, index: u32) -> Result<Gid>;
    /// Every GID of port 1, in table order.
    fn gids(&self) -> Vec<Gid>;
    /// The engine's counters.
    fn counters(&self) -> Result<engine::Counters>;
    /// Device counters by name.
    fn counter_values(&self) -> Result<Vec<(String, u64)>>;
    /// Drive the device once from this thread (for loops that watch memory); returns the
    /// packets handled.
    fn poll_progress(&self) -> usize;

    /// The next asynchronous event, without blocking.
    fn async_event(&self) -> Result<Option<AsyncEvent>>;
    /// Sleep until an asynchronous event may be there, at most `timeout`.
    fn wait_async_event(&self, timeout: Option<Duration>) -> Result<()>;
    /// Readable when an asynchronous event may be waiting.
    fn async_event_fd(&self) -> BorrowedFd<'_>;
    /// A descriptor that hangs up when the device is gone for good (softrdmad died), until
    /// [`AsyncEvent::DeviceFatal`] was taken, for waits on [`Provider::async_event_fd`] to
    /// watch too; `None` where that cannot happen.
    fn hangup_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// `ibv_alloc_pd`.
    fn alloc_pd(&self) -> Result<PdHandle>;
    /// `ibv_dealloc_pd`.
    fn dealloc_pd(&self, pd: PdHandle) -> Result<()>;

    /// Register `len` bytes at `addr` (`ibv_reg_mr`).
    ///
    /// # Safety
    ///
    /// `addr..addr + len` stays valid until [`Provider::dereg_mr`] succeeds, and is reached
    /// by the application only in ways the device's own accesses cannot invalidate.
    #[allow(unsafe_code)]
    unsafe fn reg_mr(
        &self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr>;

    /// Change region `mr` in place (`ibv_rereg_mr`).
    ///
    /// # Safety
    ///
    /// With `CHANGE_TRANSLATION`, `addr..addr + len` meets [`Provider::reg_mr`]'s contract.
    #[allow(unsafe_code, clippy::too_many_arguments)]
    unsafe fn rereg_mr(
        &self,
        mr: MrHandle,
        flags: ReregFlags,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr>;

    /// `ibv_dereg_mr`: once `Ok`, the device never touches the memory again.
    fn dereg_mr(&self, mr: MrHandle) -> Result<()>;

    /// Deregister, and make sure the device can no longer reach the memory even if that
    /// fails (the daemon's connection ends then; see its provider).
    fn dereg_mr_for_good(&self, mr: MrHandle) {
        if let Err(e) = self.dereg_mr(mr) {
            tracing::warn!(error = %e, "dereg_mr failed");
        }
    }

    /// `ibv_create_cq`: the CQ, with what polling and waiting on it need.
    fn create_cq(&self, depth: u32) -> Result<Box<dyn ProviderCq>>;
    /// `ibv_destroy_cq`.
    fn destroy_cq(&self, cq: CqHandle) -> Result<()>;

    /// `ibv_create_qp` (in RESET), fed by `srq` if given.
    fn create_qp(&self, init: &QpInitAttr, srq: Option<SrqHandle>) -> Result<RawQp>;
    /// `ibv_destroy_qp`.
    fn destroy_qp(&self, qp: QpHandle) -> Result<()>;
    /// `ibv_modify_qp`.
    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<()>;
    /// `ibv_query_qp`.
    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr>;
    /// `ibv_attach_mcast`: UD QP `qp` receives what is sent to group `gid`.
    fn attach_mcast(&self, qp: QpHandle, gid: Gid) -> Result<()>;
    /// `ibv_detach_mcast`.
    fn detach_mcast(&self, qp: QpHandle, gid: Gid) -> Result<()>;
    /// `ibv_post_send` on a connected QP. A full send queue is `VerbsError::QueueFull`.
    fn post_send(&self, qp: QpHandle, wr: SendWr) -> Result<()>;
    /// `ibv_post_send` on a UD QP, to `dest`.
    fn post_send_ud(&self, qp: QpHandle, wr: SendWr, dest: UdDest) -> Result<()>;
    /// `ibv_post_recv`. A full receive queue is `VerbsError::QueueFull`.
    fn post_recv(&self, qp: QpHandle, wr: RecvWr) -> Result<()>;

    /// `ibv_create_srq`.
    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle>;
    /// `ibv_destroy_srq`.
    fn destroy_srq(&self, srq: SrqHandle) -> Result<()>;
    /// `ibv_post_srq_recv`.
    fn post_srq_recv(&self, srq: SrqHandle, wr: RecvWr) -> Result<()>;
    /// `ibv_modify_srq`.
    fn modify_srq(&self, srq: SrqHandle, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()>;
    /// `ibv_query_srq`.
    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr>;
    /// Receive WRs waiting in an SRQ.
    fn srq_len(&self, srq: SrqHandle) -> Result<usize>;

    /// `ibv_create_ah`.
    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle>;
    /// `ibv_destroy_ah`.
    fn destroy_ah(&self, ah: AhHandle) -> Result<()>;

    /// `ibv_alloc_mw`: the window's handle and first rkey.
    fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> Result<(MwHandle, Rkey)>;
    /// `ibv_dealloc_mw`.
    fn dealloc_mw(&self, mw: MwHandle) -> Result<()>;
    /// The window's current rkey and whether it is bound.
    fn query_mw(&self, mw: MwHandle) -> Result<(Rkey, bool)>;
    /// A connection-manager channel on this device (`rdma_event_channel`), with the CM
    /// calls made through it.
    fn cm_channel(&self) -> Result<Box<dyn ProviderCmChannel>>;

    /// Post the bind verb of a type 1 window on QP `qp` (`ibv_bind_mw`); returns the rkey it
    /// will have.
    fn bind_mw(
        &self,
        qp: QpHandle,
        wr_id: u64,
        mw: MwHandle,
        bind: MwBind,
        signaled: bool,
    ) -> Result<Rkey>;
}

/// A completion queue as its provider made it: its handle, and what polling and waiting on
/// it need (the embedded runtime's notifier; the daemon's shared-memory ring and completion
/// eventfd). Chosen with the provider, so a CQ is never asked of a backend it is not from.
pub(crate) trait ProviderCq: Send + Sync + fmt::Debug {
    /// Its handle (what QPs and asynchronous events name it by).
    fn handle(&self) -> CqHandle;
    /// Completions into `out`, as many as wait and fit; returns how many. Allocates
    /// nothing, and does not give the core away when there are none.
    fn take(&self, out: &mut [WorkCompletion]) -> Result<usize>;
    /// Completions waiting.
    fn len(&self) -> Result<usize>;
    /// `ibv_resize_cq`: room for `cqe` completions; returns the size the CQ has now.
    /// Refused (`CqTooSmall`, EINVAL) while more completions wait than that.
    fn resize(&self, cqe: u32) -> Result<u32>;
    /// `ibv_req_notify_cq`: one notification on [`ProviderCq::event_fd`] at the next
    /// completion (`solicited_only`: the next solicited or error one).
    fn arm(&self, solicited_only: bool) -> Result<()>;
    /// Sleep until the CQ has a completion or `timeout` passes.
    fn wait(&self, timeout: Option<Duration>) -> Result<()>;
    /// The notification descriptor: readable after [`ProviderCq::arm`] once a completion
    /// is there.
    fn event_fd(&self) -> BorrowedFd<'_>;
    /// Consume a pending notification; true if there was one.
    fn clear_event(&self) -> bool;
    /// A descriptor that hangs up when the device is gone for good (softrdmad died), for
    /// waits on [`ProviderCq::event_fd`] to watch too; `None` where that cannot happen.
    fn hangup_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// Called by a thread whose poll found nothing, before it polls again: see [`relax`].
    fn idle(&self, kind: BackendKind) {
        relax(kind);
    }
}

/// A connection-manager channel as its provider made it: where the events of its listens
/// and connections arrive, and the CM calls on them (the device's CM moves the QPs through
/// their states). A connection is acted on only through the channel its events go to.
/// Dropping the channel closes it: its listens end and the connections it still holds are
/// destroyed (their QPs to ERR, peers told).
pub(crate) trait ProviderCmChannel: Send + Sync + fmt::Debug {
    /// Readable while events wait.
    fn fd(&self) -> BorrowedFd<'_>;
    /// The oldest event, without blocking.
    fn get_event(&self) -> Result<Option<CmEvent>>;
    /// `rdma_listen`: requests for `service_id` arrive here.
    fn listen(&self, service_id: ServiceId) -> Result<()>;
    /// Stop listening on `service_id`.
    fn unlisten(&self, service_id: ServiceId) -> Result<()>;
    /// `rdma_connect`: RC QP `qp` (in RESET or INIT) to `service_id` at `peer`; `None`
    /// when the caller moves its QP itself (`param.qp_num` names it).
    fn connect(
        &self,
        qp: Option<QpHandle>,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId>;
    /// SIDR (`rdma_connect` on a UDP id): which UD QP serves `service_id` at `peer`.
    fn resolve(&self, peer: IpAddr, service_id: ServiceId, param: &ConnParam) -> Result<CommId>;
    /// `rdma_accept` of request `id` with RC QP `qp` (in RESET or INIT; `None` as for
    /// `connect`), or of a SIDR request with UD QP `qp`.
    fn accept(&self, id: CommId, qp: Option<QpHandle>, param: &ConnParam) -> Result<()>;
    /// `rdma_establish`: the RTU of connection `id`, whose QP the caller moves.
    fn establish(&self, id: CommId) -> Result<()>;
    /// `rdma_init_qp_attr`: what takes connection `id`'s QP to `state`.
    fn init_qp_attr(&self, id: CommId, state: QpState) -> Result<(QpAttr, QpAttrMask)>;
    /// `rdma_reject` (reason 28) or `rdma_reject_ece` (35) of request `id`.
    fn reject(&self, id: CommId, reason: RejectReason, private_data: &[u8]) -> Result<()>;
    /// `rdma_disconnect` of connection `id`.
    fn disconnect(&self, id: CommId, private_data: &[u8]) -> Result<()>;
    /// `rdma_destroy_id`: let go of connection `id` in whatever state; one that ended on
    /// its own (rejected, unreachable) is gone already, and that is no error.
    fn destroy_id(&self, id: CommId) -> Result<()>;
}

impl dyn Provider + '_ {
    /// Up to `max` completions of `cq`, oldest first.
    pub(crate) fn poll_cq(&self, cq: &dyn ProviderCq, max: usize) -> Result<Vec<WorkCompletion>> {
        // In turns of a small stack buffer: a large `max` with few completions waiting
        // costs no large zeroed allocation on every poll.
        let mut wcs = Vec::new();
        let mut buf = [WorkCompletion::default(); 32];
        while wcs.len() < max {
            let want = (max - wcs.len()).min(buf.len());
            let n = cq.take(&mut buf[..want])?;
            wcs.extend_from_slice(&buf[..n]);
            if n < want {
                break;
            }
        }
        if wcs.is_empty() {
            cq.idle(self.kind());
        } else {
            idle_run_ended();
        }
        Ok(wcs)
    }

    /// Completions of `cq` into `out`, as many as wait and fit; returns how many. Allocates
    /// nothing.
    pub(crate) fn poll_cq_into(
        &self,
        cq: &dyn ProviderCq,
        out: &mut [WorkCompletion],
    ) -> Result<usize> {
        let n = cq.take(out)?;
        if n == 0 {
            cq.idle(self.kind());
        } else {
            idle_run_ended();
        }
        Ok(n)
    }
}

/// Called by a thread that looked and found nothing, before it looks again. On the daemon
/// the completion it waits for is produced by the daemon's progress thread: with fewer cores
/// than spinning threads (two busy-polling processes and the daemon on a 2-CPU host), that
/// thread would wait for a time slice (milliseconds) unless the pollers give the core away
/// at each empty look. A thread polling a CQ ring goes further when yielding is not enough
/// ([`idle_run_is_long`]): it sleeps until the daemon delivers (`ProviderCq::idle`).
pub(crate) fn relax(kind: BackendKind) {
    if yields_when_idle(kind) {
        std::thread::yield_now();
    }
}

/// Empty CQ polls in a row, and how long they lasted, after which a polling thread on the
/// daemon sleeps until completions come instead of yielding again ([`idle_run_is_long`]).
/// Yielding gives the core to whoever the scheduler picks: beside one more busy thread on
/// a 2-CPU host (a CPU hog, a third polling process), that is rarely the daemon, which then
/// waits for time slices behind threads that only wait for it, and a stream that moves
/// 2 M messages a second falls to a tenth of that. A run this long is a thread that has
/// nothing else to do; a program that polls now and then, between other work, seldom
/// makes one.
const IDLE_RUN_POLLS: u32 = 64;
const IDLE_RUN_TIME: Duration = Duration::from_micros(20);
/// The longest such sleep by default: the daemon wakes the thread when it delivers
/// completions to any CQ of the connection, and this bounds the sleep of one that waits for
/// something else (memory a peer writes, another transport of a library that polls
/// several). `SOFTRDMA_POLL_SLEEP_US` sets another ([`longest_idle_sleep`]).
const LONGEST_IDLE_SLEEP: Duration = Duration::from_micros(50);

/// The longest sleep of a thread whose polls keep finding nothing: `SOFTRDMA_POLL_SLEEP_US`
/// microseconds (1 to 10 000 000), else [`LONGEST_IDLE_SLEEP`].
pub(crate) fn longest_idle_sleep() -> Duration {
    static SET: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SET.get_or_init(|| {
        std::env::var("SOFTRDMA_POLL_SLEEP_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|us| (1..=10_000_000).contains(us))
            .map_or(LONGEST_IDLE_SLEEP, Duration::from_micros)
    })
}
/// A thread whose sleep ran out needs this many times longer a run before its next sleep;
/// each completion it polls halves that again, and a sleep that ends by a delivery undoes
/// it. A loop that waits on something the daemon does not deliver (a library that polls
/// shared memory too, as UCX does) soon stops sleeping, even if some completions still
/// come now and then; one that only waits for the daemon, late as it may be beside other
/// busy threads, keeps sleeping.
const IDLE_BACKOFF: u32 = 4;

/// A thread's run of empty polls.
#[derive(Debug, Clone, Copy)]
struct IdleRun {
    /// Empty polls in the run.
    polls: u32,
    /// When its first was.
    since: Option<std::time::Instant>,
    /// The polls a run needs before the thread sleeps.
    needs: u32,
}

std::thread_local! {
    static IDLE_RUN: std::cell::Cell<IdleRun> = const {
        std::cell::Cell::new(IdleRun { polls: 0, since: None, needs: IDLE_RUN_POLLS })
    };
}

/// Count one more empty poll of this thread; whether its run is long enough to sleep on
/// (at least [`IDLE_RUN_POLLS`] polls, more after sleeps that ran out, over at least
/// [`IDLE_RUN_TIME`]).
pub(crate) fn idle_run_is_long() -> bool {
    IDLE_RUN.with(|r| {
        let mut run = r.get();
        run.polls = run.polls.saturating_add(1);
        let since = *run.since.get_or_insert_with(std::time::Instant::now);
        r.set(run);
        run.polls >= run.needs && since.elapsed() >= IDLE_RUN_TIME
    })
}

/// This thread's run of empty polls ended: a poll found something. What it polls for does
/// come, so a longer run asked after a sleep ran out halves ([`IDLE_BACKOFF`]).
pub(crate) fn idle_run_ended() {
    IDLE_RUN.with(|r| {
        let run = r.get();
        if run.polls != 0 || run.needs != IDLE_RUN_POLLS {
            r.set(IdleRun {
                polls: 0,
                since: None,
                needs: (run.needs / 2).max(IDLE_RUN_POLLS),
            });
        }
    });
}

/// This thread slept on its run of empty polls, and the sleep ended as `waited` says: a
/// new run starts, and one that ran out makes the next run longer.
pub(crate) fn idle_run_slept(waited: abi::doorbell::Waited) {
    IDLE_RUN.with(|r| {
        let run = r.get();
        let needs = match waited {
            abi::doorbell::Waited::TimedOut => run.needs.saturating_mul(IDLE_BACKOFF),
            _ => IDLE_RUN_POLLS,
        };
        r.set(IdleRun {
            polls: 0,
            since: None,
            needs,
        });
    });
}

/// Whether a thread that looked for work and found none gives its core away ([`relax`]):
/// `SOFTRDMA_POLL_YIELD=1` on either backend, `0` never; by default on the daemon when this
/// process may use fewer than four CPUs.
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

/// The error of every CQ of a softrdmad that died (its connection hung up): ECONNRESET.
fn daemon_gone() -> Error {
    Error::Daemon(abi::client::ClientError::Io(
        std::io::Error::from_raw_os_error(rustix::io::Errno::CONNRESET.raw_os_error()),
    ))
}

/// The error of a CQ whose device was closed (only a CQ a C program kept can be asked):
/// ENOTCONN.
fn device_closed() -> Error {
    Error::Io(std::io::Error::from_raw_os_error(
        rustix::io::Errno::NOTCONN.raw_os_error(),
    ))
}

/// Lock `m`, poisoned or not: a panic while a caller held it leaves what it guards usable
/// (every call is one request and its whole answer, or one ring operation).
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
}
