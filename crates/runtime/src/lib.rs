//! # softrdma `runtime`: the engine on real I/O
//!
//! The sans-IO [`engine`] knows RoCEv2 but no sockets, threads or clocks. This crate gives it
//! all three: a [`Runtime`] owns one [`engine::Engine`], a UDP socket bound to one local
//! address, and a progress thread that feeds received datagrams to the engine, runs its
//! timers and sends what it emits. Both the embedded device of the `softrdma` API and (later)
//! the host daemon are built on it.
//!
//! ## Threads and locking
//!
//! The engine lives behind one lock, taken with [`Runtime::lock`]. Application threads call
//! verbs through the returned [`EngineGuard`]; when a guard that changed anything is dropped,
//! it sends whatever the engine now has to transmit *on the calling thread* (a `post_send`
//! leaves the host without a thread hop), signals completion waiters, and rings the doorbell
//! (an `eventfd`) only if the engine's next timer is earlier than the one the progress thread
//! sleeps until.
//!
//! The progress thread loops: `recvmmsg` (non-blocking, a batch at a time) → lock →
//! `handle_datagram` for each packet, `handle_timeout` when due, `poll_transmit` until empty →
//! unlock. After the last activity it keeps polling for [`RuntimeConfig::busy_poll`], then
//! sleeps in `ppoll` on the socket and the doorbell with the engine's next timer as timeout
//! (at most 50 ms, so that arming a far timer needs no doorbell), so an idle device uses no
//! CPU.
//!
//! Application threads that poll drive the device themselves: an empty
//! [`EngineGuard::poll_cq`], [`Runtime::poll_progress`] (for loops that poll memory) and
//! [`Runtime::wait_cq`] receive on the calling thread and run the packets through the
//! engine. While they do, the progress thread leaves the socket to them (it keeps running
//! timers), so a busy-polling ping-pong handles each packet on the thread that waits for it
//! with no thread switch at all, as a hardware NIC's polled CQ would; half a millisecond
//! after the last poll (a lease each poll renews) the progress thread takes the socket
//! back, so nothing stalls when the application stops polling. A program that polls a CQ
//! and then waits in a way the runtime cannot see (polling memory for an RDMA WRITE) would
//! leave packets waiting until each lease ran out: when that is seen twice in a short time,
//! CQ polls stop taking the socket for a while ([`Runtime::poll_progress`] always does).
//!
//! Completions are announced per CQ through an `eventfd` ([`CqNotifier`]), armed with
//! [`Runtime::arm_cq`] like `ibv_req_notify_cq`: usable for blocking waits, in an epoll set, or
//! by an async runtime. Asynchronous events (`ibv_get_async_event`) are queued by the runtime
//! and announced on [`Runtime::async_event_fd`].
//!
//! ## Sending: IP ID, DF and the UDP source port
//!
//! The engine emits whole IP packets whose ICRC covers the IPv4 identification and flags and
//! the UDP ports. IPv4 packets leave through *unconnected* sockets with
//! `IP_MTU_DISCOVER = IP_PMTUDISC_DO`, so Linux sends them with DF and IP ID 0, the header the
//! engine assumed. The UDP source port is the one the engine put in the packet (derived from
//! the QPN, for ECMP entropy): with [`SrcPortPolicy::PerQp`] each source port gets its own
//! socket bound to it (opened on first use, `SO_REUSEADDR` so devices sharing an address can
//! share a port). Where a port cannot be bound, or with [`SrcPortPolicy::Fixed`], the packet
//! leaves from the receiving socket's port and the runtime rewrites the source port and
//! recomputes the ICRC, so the peer's check always passes.
//!
//! ## Ports
//!
//! RoCEv2 peers listen on UDP 4791 ([`RuntimeConfig::port`] and
//! [`RuntimeConfig::remote_port`]). Several devices on one address (`::1` in tests) need
//! distinct ports; the engine still builds and checks every packet as if its destination port
//! were 4791, and the runtime maps that to the configured ports. Such traffic interoperates
//! between softrdma devices only, and a capture of it does not ICRC-verify; on 4791 (the
//! default) everything is standard.
//!
//! ## Receive policy
//!
//! The ICRC covers two IPv4 header fields that vary by sender, the identification and the
//! flags, and a UDP socket does not show the IP header. Two receive paths ([`RxPath`]):
//!
//! - **[`RxPath::Udp`] (default, no privileges).** The runtime rebuilds the header as softrdma
//!   (and any sender using an unconnected `IP_PMTUDISC_DO` socket) emits it: **IPv4 ID 0, DF
//!   set**; TTL/TOS/checksum don't matter (masked or not covered); lengths from the datagram;
//!   addresses from the source address and `IP_PKTINFO` / `IPV6_PKTINFO`; UDP destination port
//!   4791, checksum 0. The engine then checks every ICRC in full:
//!   - from softrdma peers, and from *any* IPv6 peer (IPv6 has no ID; its varying fields are
//!     masked), packets are checked exactly and accepted;
//!   - from IPv4 peers that count the ID up (Linux rxe) or clear DF, the rebuilt header differs
//!     from the one they sent, so their packets fail the check, are counted as
//!     `rx_bad_icrc` and dropped: never accepted unchecked. We do not weaken the check
//!     (skipping it, or solving the CRC for the 16-bit ID, would leave 16 bits of protection).
//! - **[`RxPath::Raw`] (opt-in, root or `CAP_NET_RAW`, IPv4).** A `SOCK_RAW`/`IPPROTO_UDP`
//!   socket bound to the device address sees each packet with the header its sender built,
//!   so the ICRC is checked exactly whatever ID the sender used: this is how to receive from
//!   Linux rxe and other stacks with counting IDs. The UDP socket stays bound (it owns the
//!   port, so the kernel sends no ICMP port-unreachable, and it is the fixed source port) but
//!   is never read. IPv6 devices always use the UDP path, which is exact for IPv6.
//!
//! Sending is unaffected by the choice: packets leave with ID 0 and DF, which rxe and
//! hardware RoCE NICs accept.

//! ## `unsafe`
//!
//! Three places, each with a `// SAFETY:` comment: the [`engine::Memory`] implementation over
//! process memory (`memory`), `setsockopt(IP_MTU_DISCOVER)` (`io`), and the `Send` promise of
//! the `recvmmsg` headers (`io`). [`EngineGuard::reg_mr`] is `unsafe`: its caller promises the
//! memory stays valid until it is deregistered.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod acks;
pub mod capture;
mod config;
mod io;
pub mod link;
mod memory;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use acks::nanos;

use engine::{
    AccessFlags, AsyncEvent, CqHandle, Engine, EngineConfig, Instant, MemOwner, Memory, MrHandle,
    MrKeys, PdHandle, VerbsError,
};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::time::TimeSpec;

pub use capture::Capture;
pub use config::{RuntimeConfig, RxPath, SrcPortPolicy};
pub use io::IoCounters;

/// Why a runtime could not start or an operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The receiving socket could not be bound (address not local, port in use...).
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The raw receive path ([`RxPath::Raw`]) could not open its socket (it needs root or
    /// `CAP_NET_RAW`).
    #[error("cannot open the raw receive socket (needs CAP_NET_RAW): {source}")]
    RawSocket {
        /// The OS error.
        source: std::io::Error,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The engine refused a verb.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

fn io_err(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> RuntimeError {
    move |e| RuntimeError::Io {
        what,
        source: e.into(),
    }
}

/// The engine as a runtime hosts it: over memory that may move between threads.
pub type SendEngine = Engine<dyn Memory + Send>;

/// An `eventfd` that announces completions on one CQ (the completion channel of
/// `ibv_req_notify_cq`): readable once after each [`Runtime::arm_cq`] that found or later saw a
/// completion.
#[derive(Debug)]
pub struct CqNotifier {
    fd: EventFd,
}

impl CqNotifier {
    fn new() -> Result<CqNotifier, RuntimeError> {
        let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(io_err("eventfd"))?;
        Ok(CqNotifier { fd })
    }

    fn signal(&self) {
        // An eventfd write fails only when the counter would overflow: it is readable anyway.
        let _ = self.fd.write(1);
    }

    /// Consume a pending notification; true if there was one.
    pub fn clear(&self) -> bool {
        matches!(self.fd.read(), Ok(n) if n > 0)
    }

    /// Block until notified or `timeout` passes (`None`: no limit); consumes the notification.
    /// Returns true if notified.
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool, RuntimeError> {
        if self.clear() {
            return Ok(true);
        }
        wait_readable(self.fd.as_fd(), timeout)?;
        Ok(self.clear())
    }
}

impl AsFd for CqNotifier {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Wait until `fd` is readable or `timeout` passes (`None`: no limit). A signal ends the
/// wait early, as a spurious wakeup.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<(), RuntimeError> {
    use nix::poll::{ppoll, PollFd, PollFlags};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match ppoll(&mut fds, timeout.map(TimeSpec::from_duration), None) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(io_err("ppoll")(e)),
    }
}

/// What lives under the runtime's lock.
struct Core {
    engine: SendEngine,
    tx: io::Tx,
    txbuf: Vec<u8>,
    regions: memory::SharedRegions,
    mr_owners: HashMap<MrHandle, MemOwner>,
    notifiers: HashMap<CqHandle, Arc<CqNotifier>>,
    events: VecDeque<AsyncEvent>,
    rx_counters: IoCounters,
    /// Where every sent and received packet is recorded, if anywhere.
    capture: Option<Arc<Capture>>,
    /// ACKs held back behind requests, and coalesced (see [`Core::pump`]).
    acks: acks::HeldAcks,
    /// ACKs may still wait in the engine (a receive pass left them there: [`Acks::Defer`]).
    acks_in_engine: bool,
}

/// What a pass does with the plain ACKs the engine has for its peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Acks {
    /// Send them (after the requests of the pass), with any held before.
    Send,
    /// Build them after the requests of the pass and hold them (see the `acks` module).
    Hold,
    /// As [`Acks::Hold`]: the engine itself never sends an ACK in the pass that handled its
    /// request, so the reply a thread posts next leaves first.
    Defer,
}

impl Core {
    /// Send everything the engine has to send.
    ///
    /// Requests leave before ACKs (see the `acks` module): the engine emits a plain ACK only
    /// once it is due, never in the pass that handled its request (so [`Acks::Defer`] is
    /// now [`Acks::Hold`]); and with [`Acks::Hold`] they are held
    /// until an application thread polls or waits again (coalesced while the peer keeps
    /// sending), or the progress thread's next pass (within [`HANDOVER`]). ACKs keep their
    /// order among themselves: any other response (a NAK, READ data, an atomic's ACK)
    /// first sends the ACKs held before it.
    fn pump(&mut self, now: Instant, acks: Acks) {
        while let Some(t) = self.engine.poll_transmit(now, &mut self.txbuf) {
            self.route(now, t);
        }
        self.acks_in_engine = false;
        if acks == Acks::Send {
            self.send_held();
        }
    }

    /// Send or hold one packet the engine built in `txbuf`.
    fn route(&mut self, now: Instant, t: engine::Transmit) {
        {
            let (pkt, _) = self.txbuf.split_at_mut(t.len);
            match acks::classify(pkt, t.dst) {
                acks::Kind::Ack(key) => {
                    self.acks.hold(pkt, t.dst, key, now.as_nanos());
                    return;
                }
                acks::Kind::Response => self.send_held(),
                acks::Kind::Request => {}
            }
            let (pkt, _) = self.txbuf.split_at_mut(t.len);
            send_one(&mut self.tx, self.capture.as_deref(), pkt, t.dst);
        }
    }

    /// Send every held ACK.
    fn send_held(&mut self) {
        let (tx, capture) = (&mut self.tx, self.capture.as_deref());
        self.acks
            .send_all(|pkt, dst| send_one(tx, capture, pkt, dst));
    }

    /// Send the held ACKs that are due at `now` (an application thread polls again).
    fn send_due_acks(&mut self, now: Instant) {
        let (tx, capture) = (&mut self.tx, self.capture.as_deref());
        self.acks
            .send_due(now.as_nanos(), |pkt, dst| send_one(tx, capture, pkt, dst));
    }

    /// Signal armed CQs that have completions and queue async events.
    fn notify(&mut self, async_fd: &EventFd) {
        // The engine raises one event per `req_notify_cq` (IBA 11.4.2.2 rules, solicited-only
        // included); each becomes one eventfd signal.
        while let Some(cq) = self.engine.get_cq_event() {
            if let Some(n) = self.notifiers.get(&cq) {
                n.signal();
            }
        }
        let mut any = false;
        while let Some(ev) = self.engine.get_async_event() {
            self.events.push_back(ev);
            any = true;
        }
        if any {
            let _ = async_fd.write(1);
        }
    }
}

/// Send one packet the engine emitted, and record it.
fn send_one(tx: &mut io::Tx, capture: Option<&Capture>, pkt: &mut [u8], dst: std::net::IpAddr) {
    tx.send(pkt, dst);
    if let Some(c) = capture {
        c.record(pkt);
    }
}

/// State shared by the handle and the progress thread.
struct Shared {
    core: Mutex<Core>,
    /// The receive side. Whoever holds this lock receives *and* hands the batch to the engine,
    /// so packets reach the engine in arrival order whichever thread drives. Only ever
    /// `try_lock`ed, by a thread that holds `core`.
    rx: Mutex<io::Rx>,
    /// The socket `rx` reads (the UDP socket, or the raw one), polled without the `rx` lock.
    sock: Arc<socket2::Socket>,
    /// Application threads blocked in [`Runtime::wait_cq`], which receive themselves
    /// meanwhile; the progress thread leaves the socket to them.
    drivers: AtomicUsize,
    /// Until when (engine ns) an application thread drives the socket by polling
    /// ([`Runtime::poll_progress`], an empty [`EngineGuard::poll_cq`], the end of a
    /// [`Runtime::wait_cq`]): the progress thread stays off the socket until then, and takes
    /// it back when the lease runs out without being renewed.
    lease_until: AtomicU64,
    /// When (engine ns) the drivers count last went from 0 to 1.
    driving_since: AtomicU64,
    /// Until when (engine ns) polling a CQ does not take the socket (only
    /// [`Runtime::poll_progress`] does). Set when leases were seen to lapse with packets
    /// waiting, twice in a short time: the application polls a CQ, then waits in a way the
    /// runtime cannot see (a C program polling memory for an RDMA WRITE), and the packets
    /// it waits for would sit in the socket until each lease ran out.
    implicit_off_until: AtomicU64,
    /// The progress thread sleeps without looking back at the socket (a wait has lasted
    /// longer than [`LONG_WAIT`]); the last driver to leave must ring the doorbell.
    parked: AtomicBool,
    /// The progress thread sleeps (or is about to) with the socket in its poll set: a thread
    /// that starts a lease rings the doorbell so that it stops watching.
    watching: AtomicBool,
    doorbell: EventFd,
    async_fd: EventFd,
    stop: AtomicBool,
    /// When (engine ns) the sleeping progress thread wakes by itself; `0` while it is awake
    /// (it reads the engine's timers under the lock before it sleeps again). A change that
    /// arms an earlier timer rings the doorbell; otherwise no wakeup is needed.
    wake_at: AtomicU64,
    origin: std::time::Instant,
    local: SocketAddr,
    busy_poll: Duration,
}

impl Shared {
    fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Receive one batch (if the socket has any) and run it through the engine, with the
    /// timers and transmissions it causes. Returns the packets handled. `hold_acks`: the
    /// calling thread waits for what the packets bring (see [`Core::pump`]).
    ///
    /// The engine lock is taken first and the receive side only tried: a thread that held
    /// the receive side while it waited for the engine lock could be kept from it for long
    /// by a thread polling a CQ in a tight loop (the lock is not fair), and nobody could
    /// receive meanwhile.
    fn drive_rx(&self, hold_acks: bool) -> usize {
        let mut core = self.lock();
        let now = self.now();
        if core.acks_in_engine {
            core.pump(now, if hold_acks { Acks::Hold } else { Acks::Send });
        }
        let Ok(mut rx) = self.rx.try_lock() else {
            // Another thread is receiving: just run the timers and send.
            self.run_timers_and_send(&mut core, now);
            return 0;
        };
        let n = rx.recv_batch();
        self.process(&mut core, &rx, n, hold_acks);
        n
    }

    /// Hand the `n` packets `rx` just received to the engine, run due timers, send what
    /// the engine emits, signal waiters, and wake the progress thread if a timer it does not
    /// know of is now earlier than its wakeup.
    fn process(&self, core: &mut Core, rx: &io::Rx, n: usize, hold_acks: bool) {
        let now = self.now();
        for i in 0..n {
            if let Some(c) = &core.capture {
                c.record(rx.packet(i));
            }
            core.engine.handle_datagram(now, rx.packet(i));
        }
        core.rx_counters = rx.counters;
        if core.engine.poll_timeout().is_some_and(|t| t <= now) {
            core.engine.handle_timeout(now);
        }
        let acks = if hold_acks { Acks::Defer } else { Acks::Send };
        self.after_change(core, now, acks);
    }

    /// Run the engine's timers if due, send everything (held ACKs too), signal waiters.
    fn run_timers_and_send(&self, core: &mut Core, now: Instant) {
        if core.engine.poll_timeout().is_some_and(|t| t <= now) {
            core.engine.handle_timeout(now);
        }
        self.after_change(core, now, Acks::Send);
    }

    /// What every change of engine state is followed by, under the lock: send, signal, and
    /// ring the doorbell only if the progress thread would otherwise sleep past the next
    /// timer, or past [`HANDOVER`] with ACKs held (published under this lock: see
    /// `wake_at`).
    fn after_change(&self, core: &mut Core, now: Instant, acks: Acks) {
        core.pump(now, acks);
        core.notify(&self.async_fd);
        let mut next = core
            .engine
            .poll_timeout()
            .map_or(u64::MAX, Instant::as_nanos);
        if !core.acks.is_empty() || core.acks_in_engine {
            next = next.min(now.as_nanos().saturating_add(nanos(HANDOVER)));
        }
        if next < self.wake_at.load(Ordering::SeqCst) {
            let _ = self.doorbell.write(1);
        }
    }

    /// An application thread that polls drives the device itself for a while: it receives,
    /// the progress thread stays off the socket (one thread handles each packet, no wakeup).
    /// `core` is held, so the receive side is only tried. Returns the packets handled.
    /// `explicit`: the caller promised to keep polling ([`Runtime::poll_progress`]); an
    /// empty `poll_cq` takes the socket only while that has not been seen to stall
    /// packets (see `implicit_off_until`).
    fn drive_polling(&self, core: &mut Core, explicit: bool) -> usize {
        let now = self.now();
        if explicit || self.implicit_leases(now.as_nanos()) {
            self.renew_lease(now);
        }
        // Coming back means the thread has looked at what the last packets brought: the
        // ACKs held for them go now (unless they wait to be coalesced), before this thread
        // waits again.
        if core.acks_in_engine {
            core.pump(now, Acks::Hold);
        }
        core.send_due_acks(now);
        let Ok(mut rx) = self.rx.try_lock() else {
            // The progress thread or a waiting thread is receiving right now.
            return 0;
        };
        // A ping-pong's next packet comes alone: look for one (the cheapest look); while
        // packets keep coming, take them a batch at a time.
        let n = if rx.streaming {
            rx.recv_batch()
        } else {
            rx.recv_one()
        };
        rx.streaming = n > 0;
        if n > 0 {
            self.process(core, &rx, n, true);
        } else if core.engine.poll_timeout().is_some_and(|t| t <= now) {
            core.engine.handle_timeout(now);
            self.after_change(core, now, Acks::Hold);
        }
        n
    }

    /// Keep the socket for polling threads until [`HANDOVER`] from `now`; if the progress
    /// thread sleeps watching the socket, tell it to stop (once per lease, not per poll).
    fn renew_lease(&self, now: Instant) {
        let until = now.as_nanos().saturating_add(nanos(HANDOVER));
        self.lease_until.store(until, Ordering::SeqCst);
        if self.watching.load(Ordering::SeqCst) && self.watching.swap(false, Ordering::SeqCst) {
            let _ = self.doorbell.write(1);
        }
    }

    /// Whether an empty `poll_cq` (and the end of a `wait_cq`) takes the socket from the
    /// progress thread at engine time `now_ns`.
    fn implicit_leases(&self, now_ns: u64) -> bool {
        now_ns >= self.implicit_off_until.load(Ordering::Relaxed)
    }

    /// Whether an application thread drives the socket at engine time `now_ns`.
    fn app_drives(&self, now_ns: u64) -> bool {
        self.drivers.load(Ordering::SeqCst) > 0 || self.lease_until.load(Ordering::SeqCst) > now_ns
    }

    /// The engine lock if it is free. The progress thread only tries it while an
    /// application thread polls: blocking on it would make every unlock of the polling
    /// thread a futex wakeup of the progress thread, which then fails to get the lock
    /// from the spinning thread again and again, on a core the other end of the ping-pong
    /// needs.
    fn try_lock(&self) -> Option<MutexGuard<'_, Core>> {
        match self.core.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // A panic while holding the lock leaves the engine as the panicking verb left it; the
        // engine keeps its own invariants per call, so carry on rather than poison every user.
        self.core.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One engine on a UDP socket with its progress thread. Dropping it stops the thread.
pub struct Runtime {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl core::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Runtime")
            .field("local", &self.shared.local)
            .finish_non_exhaustive()
    }
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is keyed from the OS's randomness once per process and perturbed per
    // instance: unpredictable to a peer, which is all the key tags need.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

impl Runtime {
    /// Bind the socket, build the engine and start the progress thread.
    pub fn start(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let want = SocketAddr::new(config.addr, config.port);
        let bind_err = |source| RuntimeError::Bind { addr: want, source };
        let sock = Arc::new(io::rx_socket(want).map_err(bind_err)?);
        // Port 0 asks the OS for one: learn which.
        let port = sock
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or(config.port, |a| a.port());
        let local = SocketAddr::new(config.addr, port);
        let raw = config.rx_path == RxPath::Raw && config.addr.is_ipv4();
        let rx_sock = if raw {
            // The UDP socket keeps the port (no ICMP port-unreachable, the fixed source
            // port) but is never read: a minimal buffer makes the kernel drop its copies.
            let _ = sock.set_recv_buffer_size(0);
            Arc::new(io::raw_rx_socket(local).map_err(|source| RuntimeError::RawSocket { source })?)
        } else {
            sock.clone()
        };
        let regions = memory::SharedRegions::default();
        let mut ec = EngineConfig::new(
            vec![config.addr],
            config.rng_seed.unwrap_or_else(random_seed),
        );
        ec.device = config.device.clone();
        // The port offers what the link under the address carries (DF is always set).
        ec.mtu = link::port_mtu(config.addr, config.mtu);
        if config.src_port_policy == SrcPortPolicy::Fixed {
            // The engine emits the port the packets leave from: no rewriting needed.
            ec.udp_src_port = Some(port);
        }
        let mem: Box<dyn Memory + Send> = Box::new(memory::ProcessMemory::new(regions.clone()));
        let engine = Engine::with_memory(ec, mem);
        let tx = io::Tx::new(
            config.addr,
            config.remote_port,
            config.src_port_policy,
            sock.clone(),
            port,
        );
        let core = Core {
            engine,
            tx,
            txbuf: vec![0; io::MAX_DATAGRAM + io::HEADROOM],
            regions,
            mr_owners: HashMap::new(),
            notifiers: HashMap::new(),
            events: VecDeque::new(),
            rx_counters: IoCounters::default(),
            capture: Capture::from_env(),
            acks: acks::HeldAcks::default(),
            acks_in_engine: false,
        };
        let flags = EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC;
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            rx: Mutex::new(io::Rx::new(
                rx_sock.clone(),
                config.addr,
                config.rx_batch,
                raw.then_some(port),
            )),
            sock: rx_sock,
            drivers: AtomicUsize::new(0),
            lease_until: AtomicU64::new(0),
            driving_since: AtomicU64::new(0),
            implicit_off_until: AtomicU64::new(0),
            parked: AtomicBool::new(false),
            watching: AtomicBool::new(false),
            doorbell: EventFd::from_flags(flags).map_err(io_err("eventfd"))?,
            async_fd: EventFd::from_flags(flags).map_err(io_err("eventfd"))?,
            stop: AtomicBool::new(false),
            wake_at: AtomicU64::new(0),
            origin: std::time::Instant::now(),
            local,
            busy_poll: config.busy_poll,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("softrdma {local}"))
            .spawn(move || progress(&s))
            .map_err(|source| RuntimeError::Io {
                what: "spawn progress thread",
                source,
            })?;
        Ok(Runtime {
            shared,
            thread: Some(thread),
        })
    }

    /// The address and port the device receives on.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.local
    }

    /// Send to UDP port `port` from now on (see [`RuntimeConfig::remote_port`]); lets two
    /// devices opened on ephemeral ports (port 0) point at each other.
    pub fn set_remote_port(&self, port: u16) {
        self.shared.lock().tx.set_remote_port(port);
    }

    /// The engine's clock: nanoseconds since the runtime started.
    pub fn now(&self) -> Instant {
        self.shared.now()
    }

    /// Take the engine lock to call verbs. Changes made through the guard take effect when it
    /// is dropped (packets sent, waiters signalled, progress thread woken if needed).
    pub fn lock(&self) -> EngineGuard<'_> {
        EngineGuard {
            core: self.shared.lock(),
            shared: &self.shared,
            dirty: false,
        }
    }

    /// The notifier of `cq`, created on first use.
    pub fn cq_notifier(&self, cq: CqHandle) -> Result<Arc<CqNotifier>, RuntimeError> {
        let mut core = self.shared.lock();
        core.engine.cq_len(cq)?;
        if let Some(n) = core.notifiers.get(&cq) {
            return Ok(n.clone());
        }
        let n = Arc::new(CqNotifier::new()?);
        core.notifiers.insert(cq, n.clone());
        Ok(n)
    }

    /// Request one notification on `cq`'s notifier for the next completion
    /// (`ibv_req_notify_cq`). If the CQ already holds completions it is signalled at once, so
    /// "arm, then wait" never misses one.
    pub fn arm_cq(&self, cq: CqHandle) -> Result<(), RuntimeError> {
        self.arm_cq_with(cq, false)
    }

    /// [`Runtime::arm_cq`], optionally for solicited (and error) completions only; with
    /// `solicited_only` a CQ that already holds completions is not signalled at once.
    pub fn arm_cq_with(&self, cq: CqHandle, solicited_only: bool) -> Result<(), RuntimeError> {
        let mut core = self.shared.lock();
        let len = core.engine.cq_len(cq)?;
        let notifier = match core.notifiers.get(&cq) {
            Some(n) => n.clone(),
            None => {
                let n = Arc::new(CqNotifier::new()?);
                core.notifiers.insert(cq, n.clone());
                n
            }
        };
        if len > 0 && !solicited_only {
            notifier.signal();
        } else {
            core.engine.req_notify_cq(cq, solicited_only)?;
        }
        Ok(())
    }

    /// Block until `cq` holds a completion or `timeout` passes (`None`: no limit); true if it
    /// holds one. Meanwhile the calling thread receives and processes packets itself, so a
    /// packet that completes the wait wakes this thread directly, not the progress thread
    /// first (one wakeup instead of two on the latency path).
    pub fn wait_cq(&self, cq: CqHandle, timeout: Option<Duration>) -> Result<bool, RuntimeError> {
        use nix::poll::{ppoll, PollFd, PollFlags};
        let notifier = self.cq_notifier(cq)?;
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        let shared = &*self.shared;
        if shared.drivers.fetch_add(1, Ordering::SeqCst) == 0 {
            shared
                .driving_since
                .store(shared.now().as_nanos(), Ordering::SeqCst);
        }
        let _driving = Driving(shared);
        loop {
            self.arm_cq(cq)?;
            if notifier.clear() {
                return Ok(true);
            }
            // About to sleep: the ACKs held for packets this thread handled go now.
            shared.lock().send_held();
            let left = match deadline {
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return Ok(false);
                    }
                    Some(TimeSpec::from_duration(d - now))
                }
                None => None,
            };
            let mut fds = [
                PollFd::new(notifier.as_fd(), PollFlags::POLLIN),
                PollFd::new(shared.sock.as_fd(), PollFlags::POLLIN),
            ];
            match ppoll(&mut fds, left, None) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io_err("ppoll")(e)),
            }
            if fds[1].revents().is_some_and(|r| !r.is_empty()) {
                shared.drive_rx(true);
            }
            if notifier.clear() {
                return Ok(true);
            }
        }
    }

    /// Drive the device from the calling thread once: receive what the socket holds, run it
    /// through the engine (writing memory, completing work), run due timers and send what
    /// results. Returns the packets handled. For loops that poll memory rather than a CQ
    /// (an RDMA WRITE ping-pong): while a thread keeps calling this (or polling an empty
    /// CQ), the progress thread leaves the socket to it and each packet is handled without
    /// a thread switch; half a millisecond after the last call the progress thread takes
    /// over again.
    pub fn poll_progress(&self) -> usize {
        let mut core = self.shared.lock();
        self.shared.drive_polling(&mut core, true)
    }

    /// The next asynchronous event (QP fatal, CQ error...), if any.
    pub fn get_async_event(&self) -> Option<AsyncEvent> {
        let mut core = self.shared.lock();
        let ev = core.events.pop_front();
        if let Some(e) = &ev {
            // Taking an event acknowledges it (`ibv_ack_async_event`): the API hands out
            // owned copies, so nothing can still refer to it.
            core.engine.ack_async_event(e);
        }
        if core.events.is_empty() {
            let _ = self.shared.async_fd.read();
        }
        ev
    }

    /// Readable while asynchronous events are queued.
    pub fn async_event_fd(&self) -> BorrowedFd<'_> {
        self.shared.async_fd.as_fd()
    }

    /// Record every packet this device sends and receives into `capture` from now on
    /// (`None` stops). Runtimes started with `SOFTRDMA_CAPTURE` set already record.
    pub fn set_capture(&self, capture: Option<Arc<Capture>>) {
        self.shared.lock().capture = capture;
    }

    /// Counters of the socket layer.
    pub fn io_counters(&self) -> IoCounters {
        let core = self.shared.lock();
        let mut c = core.tx.counters;
        c.rx_datagrams = core.rx_counters.rx_datagrams;
        c.rx_dropped = core.rx_counters.rx_dropped;
        c
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        // The last ACKs may still be held (a program that exits right after its last
        // completion): the peer's requester waits for them.
        {
            let mut core = self.shared.lock();
            let now = self.shared.now();
            core.engine.flush_acks();
            core.pump(now, Acks::Send);
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.shared.doorbell.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Marks a thread in `wait_cq`; the last one to leave hands the socket back to the progress
/// thread.
struct Driving<'a>(&'a Shared);

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        // No doorbell after a short wait: waking the progress thread after every wait would
        // cost a context switch per message. The leaving thread leaves a lease behind (a
        // ping-pong loop waits again at once); the progress thread takes the socket back when
        // it runs out. After a long wait it may be parked: then wake it.
        let now = self.0.now().as_nanos();
        if self.0.implicit_leases(now) {
            let until = now.saturating_add(nanos(HANDOVER));
            self.0.lease_until.fetch_max(until, Ordering::SeqCst);
        }
        if self.0.drivers.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.parked.swap(false, Ordering::SeqCst)
        {
            let _ = self.0.doorbell.write(1);
        }
    }
}

/// How long the socket stays with application threads after they last polled (or waited):
/// the progress thread then takes it back. Bounds the extra delay of a packet that arrives
/// when an application thread stopped polling without saying so, and how often the
/// progress thread looks while threads keep polling.
const HANDOVER: Duration = Duration::from_micros(500);

/// Two lapsed leases with packets waiting within this long turn CQ-poll leases off...
const LAPSE_WINDOW: Duration = Duration::from_millis(100);

/// ...for this long (then they are tried again: a lapse costs at most [`HANDOVER`]).
const IMPLICIT_OFF: Duration = Duration::from_secs(1);

/// The longest the progress thread sleeps with no timer due (so that arming a timer further
/// out needs no doorbell).
const IDLE_TICK: Duration = Duration::from_millis(50);

/// After threads have waited this long without a break, the progress thread stops looking
/// every [`HANDOVER`] and parks until the last one leaves (an idle device with a blocked
/// waiter costs nothing).
const LONG_WAIT: Duration = Duration::from_millis(10);

/// The engine, locked. Derefs to the [`Engine`] for every verb; see [`Runtime::lock`].
pub struct EngineGuard<'a> {
    core: MutexGuard<'a, Core>,
    shared: &'a Shared,
    dirty: bool,
}

impl EngineGuard<'_> {
    /// Register `length` bytes at `addr` of this process (`ibv_reg_mr`).
    ///
    /// # Safety
    ///
    /// `addr..addr + length` must be valid for reads and writes until the MR is deregistered
    /// with [`EngineGuard::dereg_mr`] (or the runtime is dropped), and no Rust reference to it
    /// may be used while the device might access it: the device writes it from another thread
    /// whenever the access flags allow (receives, READ responses, remote WRITE and ATOMIC).
    /// Accessing it only while holding this lock is always fine: the device touches
    /// registered memory only under the lock.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr(
        &mut self,
        pd: PdHandle,
        addr: *mut u8,
        length: usize,
        access: AccessFlags,
    ) -> Result<MrKeys, VerbsError> {
        let base = addr as usize;
        if base.checked_add(length).is_none() {
            return Err(VerbsError::InvalidLength);
        }
        let owner = memory::lock(&self.core.regions).insert(base, length);
        match self
            .core
            .engine
            .reg_mr(pd, owner, base as u64, length as u64, access)
        {
            Ok(keys) => {
                self.core.mr_owners.insert(keys.handle, owner);
                Ok(keys)
            }
            Err(e) => {
                memory::lock(&self.core.regions).remove(owner);
                Err(e)
            }
        }
    }

    /// Deregister an MR (`ibv_dereg_mr`). Once this returns the device never touches its
    /// memory again.
    pub fn dereg_mr(&mut self, mr: MrHandle) -> Result<(), VerbsError> {
        self.core.engine.dereg_mr(mr)?;
        if let Some(owner) = self.core.mr_owners.remove(&mr) {
            memory::lock(&self.core.regions).remove(owner);
        }
        Ok(())
    }

    /// Destroy a QP (`ibv_destroy_qp`). ACKs it still owes its peer leave first (a receive
    /// may have left them in the engine: see `Acks::Defer`).
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbsError> {
        self.build_deferred_acks();
        self.dirty = true;
        self.core.engine.destroy_qp(qpn)
    }

    /// Modify a QP (`ibv_modify_qp`). As [`EngineGuard::destroy_qp`], the ACKs the QP owes
    /// are built first, so that a move to ERR or RESET does not drop them.
    pub fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &engine::QpAttr,
        mask: engine::QpAttrMask,
    ) -> Result<(), VerbsError> {
        self.build_deferred_acks();
        self.dirty = true;
        self.core.engine.modify_qp(qpn, attr, mask)
    }

    /// Take the ACKs a receive left in the engine into the held ones (sent when this guard
    /// is dropped, or coalesced as usual).
    fn build_deferred_acks(&mut self) {
        if self.core.acks_in_engine {
            let now = self.shared.now();
            self.core.pump(now, Acks::Hold);
        }
    }

    /// Destroy a CQ (`ibv_destroy_cq`) and forget its notifier.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), VerbsError> {
        self.core.engine.destroy_cq(cq)?;
        self.core.notifiers.remove(&cq);
        Ok(())
    }

    /// Take up to `max` completions from `cq` (`ibv_poll_cq`). If there are none, the calling
    /// thread drives the device itself: it receives what the socket holds and runs it
    /// through the engine, and for a while (half a millisecond) the progress thread leaves
    /// the socket to polling threads, so a busy-polling loop sees each packet without any
    /// thread switch. If that is seen to leave packets waiting (the program polls a CQ, then
    /// waits some other way, as perftest's `ib_write_lat` polls memory), CQ polls stop
    /// taking the socket for a second and only receive what is there.
    pub fn poll_cq(
        &mut self,
        cq: CqHandle,
        max: usize,
    ) -> Result<Vec<engine::WorkCompletion>, VerbsError> {
        let v = self.core.engine.poll_cq(cq, max)?;
        if !v.is_empty() || max == 0 || self.shared.drive_polling(&mut self.core, false) == 0 {
            return Ok(v);
        }
        self.core.engine.poll_cq(cq, max)
    }
}

impl Deref for EngineGuard<'_> {
    type Target = SendEngine;
    fn deref(&self) -> &SendEngine {
        &self.core.engine
    }
}

impl DerefMut for EngineGuard<'_> {
    fn deref_mut(&mut self) -> &mut SendEngine {
        self.dirty = true;
        &mut self.core.engine
    }
}

impl Drop for EngineGuard<'_> {
    fn drop(&mut self) {
        if self.dirty {
            let now = self.shared.now();
            // ACKs held for packets an application thread received stay held (behind the
            // requests this verb may have queued) until it polls again: see `Core::pump`.
            self.shared.after_change(&mut self.core, now, Acks::Hold);
        }
    }
}

/// The progress thread: runs timers always, and receives whenever no application thread
/// drives the socket (see `Shared::lease_until` and `Shared::drivers`).
fn progress(shared: &Shared) {
    let mut last_active = std::time::Instant::now();
    // The last sleep left the socket to polling threads; when the last lease lapsed with
    // packets waiting.
    let (mut handed_over, mut last_lapse) = (false, None::<u64>);
    while !shared.stop.load(Ordering::Relaxed) {
        let now_ns = shared.now().as_nanos();
        let drives = shared.app_drives(now_ns);
        // A pass: receive (unless an application thread does), run due timers, send.
        let n = if drives {
            if let Some(mut core) = shared.try_lock() {
                let now = shared.now();
                shared.run_timers_and_send(&mut core, now);
            }
            0
        } else {
            shared.drive_rx(false)
        };
        if n > 0 {
            last_active = std::time::Instant::now();
            if handed_over && !drives {
                // The socket came back with packets waiting: they sat there since the
                // polling stopped. Twice within LAPSE_WINDOW: the application waits in ways
                // the runtime cannot see after polling a CQ; stop giving the socket away
                // on CQ polls for a while.
                if last_lapse.is_some_and(|t| now_ns.saturating_sub(t) < nanos(LAPSE_WINDOW)) {
                    shared.implicit_off_until.store(
                        now_ns.saturating_add(nanos(IMPLICIT_OFF)),
                        Ordering::Relaxed,
                    );
                }
                last_lapse = Some(now_ns);
            }
        }
        // Keep polling for `busy_poll` after activity, unless an application thread does.
        let spin = !drives && last_active.elapsed() < shared.busy_poll;
        let (rung, handed) = wait(shared, spin);
        handed_over = handed;
        if rung {
            last_active = std::time::Instant::now();
        }
    }
}

/// The progress thread's wait between passes: until the socket is readable (when it is the
/// progress thread's to read), the doorbell rings, the engine's next timer, or a polling
/// thread's lease runs out. With `spin`, just look. Returns whether the doorbell rang and
/// whether the socket was left to application threads.
fn wait(shared: &Shared, spin: bool) -> (bool, bool) {
    use nix::poll::{ppoll, PollFd, PollFlags};
    let (watch, timeout) = if spin {
        (
            !shared.app_drives(shared.now().as_nanos()),
            Some(Duration::ZERO),
        )
    } else {
        // Decided under the lock, so that a verb that arms an earlier timer after this sees
        // `wake_at` and rings. While an application thread drives, the lock is only tried
        // (see `Shared::try_lock`); without it the thread sleeps until the lease may end,
        // and the polling thread runs the timers that fall due meanwhile.
        let drives = shared.app_drives(shared.now().as_nanos());
        let core = if drives {
            shared.try_lock()
        } else {
            Some(shared.lock())
        };
        if let Some(c) = core.as_ref().and_then(|c| c.capture.as_ref()) {
            c.flush();
        }
        let now = shared.now().as_nanos();
        let next = core.as_ref().map_or(u64::MAX, |c| {
            c.engine.poll_timeout().map_or(u64::MAX, Instant::as_nanos)
        });
        // Wake now and then even with no timer: then a verb arming a far timer (a
        // retransmission timeout of milliseconds) needs no doorbell and no context switch.
        let mut wake = next.min(now.saturating_add(nanos(IDLE_TICK)));
        let watch = plan_socket(shared, now, &mut wake);
        shared.wake_at.store(wake, Ordering::SeqCst);
        drop(core);
        (watch, Some(Duration::from_nanos(wake.saturating_sub(now))))
    };
    let mut fds = [
        PollFd::new(shared.doorbell.as_fd(), PollFlags::POLLIN),
        PollFd::new(shared.sock.as_fd(), PollFlags::POLLIN),
    ];
    let n = if watch { 2 } else { 1 };
    if let Err(e) = ppoll(&mut fds[..n], timeout.map(TimeSpec::from_duration), None) {
        if e != nix::errno::Errno::EINTR {
            tracing::warn!(error = %e, "ppoll failed");
        }
    }
    shared.wake_at.store(0, Ordering::SeqCst);
    shared.watching.store(false, Ordering::SeqCst);
    shared.parked.store(false, Ordering::SeqCst);
    let rung = fds[0].revents().is_some_and(|r| !r.is_empty());
    if rung {
        let _ = shared.doorbell.read();
    }
    (rung, !watch)
}

/// Whether the sleeping progress thread watches the socket; if an application thread
/// drives it instead, bring `wake` forward to when the socket may come back.
fn plan_socket(shared: &Shared, now: u64, wake: &mut u64) -> bool {
    let drivers = shared.drivers.load(Ordering::SeqCst);
    if drivers > 0
        && now.saturating_sub(shared.driving_since.load(Ordering::SeqCst)) >= nanos(LONG_WAIT)
    {
        // A thread has been blocked in `wait_cq` for long: park until the last one leaves
        // (it sees `parked` and rings), so that an idle device with a blocked waiter costs
        // nothing. Check again after publishing, as it may have just left.
        shared.parked.store(true, Ordering::SeqCst);
        if shared.drivers.load(Ordering::SeqCst) > 0 {
            return false;
        }
        shared.parked.store(false, Ordering::SeqCst);
    }
    // Publish first, then look at the lease: a poller that renews after this load sees
    // `watching` and rings (both SeqCst).
    shared.watching.store(true, Ordering::SeqCst);
    let lease = shared.lease_until.load(Ordering::SeqCst);
    let drivers = shared.drivers.load(Ordering::SeqCst);
    if drivers == 0 && lease <= now {
        return true;
    }
    shared.watching.store(false, Ordering::SeqCst);
    // Blocked waiters renew no lease: look again every HANDOVER while they wait.
    let back = if drivers > 0 {
        lease.max(now.saturating_add(nanos(HANDOVER)))
    } else {
        lease
    };
    *wake = (*wake).min(back);
    false
}
