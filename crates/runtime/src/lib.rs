//! # softrdma `runtime`: the engine on real I/O
//!
//! The sans-IO [`engine`] knows RoCEv2 but no sockets, threads or clocks. This crate gives it
//! all three, and is the one host of the engine: a [`Runtime`] owns one [`engine::Engine`]
//! over any [`engine::Memory`], a UDP socket per local address, and a progress thread that
//! feeds received datagrams to the engine, runs its timers and sends what it emits. The
//! embedded device of the `softrdma` API ([`Runtime::start`]: this process's memory) and
//! every device of the host daemon `softrdmad` ([`Runtime::start_hosted`]: client memory,
//! with the daemon's rings as its [`Attachment`]) are the same code, so everything the wire
//! sees — source ports, the receive policy, capture, batching, ACKs — is the same whichever
//! process model a user picks.
//!
//! ## Routes
//!
//! Each packet the engine emits takes one of three routes: back into the same engine when
//! it is for one of the device's own addresses (as a NIC loops back traffic between its own
//! QPs; with [`RuntimeConfig::internal_paths`], in the engine's large internal segments
//! without an ICRC), to another device of the same process when [`link()`] joined them (its
//! inbox and doorbell; over internal paths too when both devices have them), or out of a
//! UDP socket. [`IoCounters`] counts each. A datagram to
//! a multicast group takes all three (see "Multicast groups").
//!
//! ## Multicast groups
//!
//! As Linux does for RoCEv2 (rdma_cm's `cma_iboe_join_multicast` sends the IGMP join,
//! rxe's `rxe_mcast_add` adds the group's link-layer address), a device is a member of a
//! group's IP address on the network while a QP of it is attached to the group: when the
//! first QP attaches (`attach_mcast`, by any caller; the runtime compares the engine's
//! [`Engine::mcast_epoch`] after every change), the runtime joins the group (the GID's
//! IPv4-mapped address with `IP_ADD_MEMBERSHIP` on each interface address of the device,
//! an IPv6 group with `IPV6_JOIN_GROUP` on each interface's index) with a socket bound to
//! the group and the device's port (`SO_REUSEADDR` and `SO_REUSEPORT`: every device and
//! process of the host that joins gets its copy), and leaves it when the last QP detaches
//! or is destroyed, or the device closes. That socket is one more receive side: the same
//! batched receive, header rebuilding (or the raw path's real headers for IPv4 groups on a
//! raw-path device), ICRC check, capture and counters as unicast. Datagrams to a group
//! leave through the interface of the device address they are sent from
//! (`IP_MULTICAST_IF` / `IPV6_MULTICAST_IF`), with the kernel's default multicast TTL of 1:
//! the group spans the link. [`Runtime::joined_groups`] lists the memberships.
//!
//! A datagram this process sends to a group reaches the devices of the process without the
//! network (see `route_multicast`), and the network brings it back as well (the kernel
//! loops multicast back to the host's members; on `lo` the datagram itself returns, with
//! `IP_MULTICAST_LOOP` on or off). Loop stays on, so that other processes on the host
//! receive it; each group side drops the datagrams whose source is an address of its
//! device or of a device [`link()`]ed with it ([`IoCounters::rx_mcast_own`]). Two devices
//! that share one address on distinct ports (a test setup) are not told apart by this:
//! they do not see each other's datagrams to a group unless linked.
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
//! unlock. After the last activity it keeps polling for [`RuntimeConfig::busy_poll`] (or for
//! what it learned, [`RuntimeConfig::adaptive_poll`]: polling when packets keep following
//! its sleeps closely, none when they do not), then sleeps in `ppoll` on the socket and the
//! doorbell with the engine's next timer as timeout (at most 50 ms, so that arming a far
//! timer needs no doorbell), so an idle device uses no CPU.
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
//! ## Connection manager
//!
//! Each device hosts the connection manager of its port ([`rdma_cm`]): the engine serves
//! QP1, every pass that runs the engine also feeds the CM the MADs QP1 received and sends
//! what it answers, and the CM's timers join the engine's. Consumers listen, connect,
//! accept, reject and disconnect through the [`EngineGuard`] (`cm_*`), get [`CmEvent`]s on a
//! [`CmChannel`], and the runtime moves their QPs through INIT, RTR, RTS and ERR as the
//! kernel's rdma_cm does for its users.
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
//! ## GSO trains
//!
//! With [`RuntimeConfig::gso`] (the default), consecutive full-size packets of one QP to one
//! destination wait in a train while the engine emits them (a FIRST or MIDDLE packet
//! starts one; each next PSN of the QP of the same size joins; a shorter one ends it; at
//! most 64 packets and 64 KB, see `wire::train`). At the end of the pass each train
//! leaves in one `sendmsg` with `UDP_SEGMENT`, gathered straight from the packets'
//! buffers, and the kernel (or the NIC) cuts it into the datagrams, numbering their IPv4
//! IDs 0, 1, 2...: the runtime seals packet k's ICRC for ID k
//! (`wire::Datagram::set_ipv4_ident`, no second CRC pass), so every datagram on the wire
//! verifies by itself, for Linux rxe as for any RoCE NIC. Packets that cannot join a train
//! (ACKs, READ requests, one-packet messages) leave alone, as before. A kernel that refuses
//! a train (`EIO`: a device without checksum offload) gets that train packet by packet, and
//! the device stops making trains.
//!
//! The UDP socket has `UDP_GRO`: the kernel hands it a train whole, with its segment size,
//! and the runtime cuts it in place, writing each packet's rebuilt headers over the end of
//! the packet before it, which the engine is done with (no copy); packet k of a train is
//! rebuilt with ID k, what a softrdma sender sealed it for. A raw socket sees a train that
//! crossed `lo` or a veth uncut and with no segment size: the train rules let
//! `wire::train::segment_len` find the cut in at most five looks, and each packet gets the
//! sender's header with its own lengths and ID, so the raw path's check stays exact.
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
//! flags, and a UDP socket does not show the IP header. Three receive paths ([`RxPath`]),
//! the same for the embedded device and for `softrdmad`:
//!
//! - **[`RxPath::Udp`] (the embedded device's default, no privileges).** The runtime rebuilds
//!   the header as softrdma (and any sender using an unconnected `IP_PMTUDISC_DO` socket)
//!   emits it: **IPv4 ID 0, DF set**; TTL/TOS/checksum don't matter (masked or not covered);
//!   lengths from the datagram; addresses from the source address and `IP_PKTINFO` /
//!   `IPV6_PKTINFO`; UDP destination port 4791, checksum 0. The engine then checks every
//!   ICRC in full, and, because the ICRC is linear in the 16-bit ID, an IPv4 packet whose
//!   ICRC fails with ID 0 is accepted if exactly one other ID makes it hold (found from the
//!   same CRC pass: `engine::Ipv4IdentPolicy::Recover`); that is how packets from IPv4
//!   stacks that count the ID up (Linux rxe) are received. The price is protection for
//!   such packets: 16 of the 32 check bits go to finding the ID, so a corrupted packet
//!   passes with probability about 2^-16 (and a few specific one-byte corruptions always
//!   do). Packets from softrdma peers (ID 0) and from any IPv6 peer are checked with all 32
//!   bits. Accepted packets with a recovered ID count as `rx_icrc_id_recovered`; packets for
//!   which no ID holds (and senders that clear DF) count as `rx_bad_icrc` and are dropped:
//!   never accepted unchecked.
//! - **[`RxPath::Raw`] (root or `CAP_NET_RAW`, IPv4).** A `SOCK_RAW`/`IPPROTO_UDP` socket
//!   bound to the device address sees each packet with the header its sender built, so the
//!   ICRC is checked exactly, all 32 bits, whatever ID the sender used. The UDP socket stays
//!   bound (it owns the port, so the kernel sends no ICMP port-unreachable, and it is the
//!   fixed source port) but is never read. IPv6 addresses always use the UDP path, which is
//!   exact for IPv6.
//! - **[`RxPath::Auto`] (`softrdmad`'s default).** Raw where the process may open a raw
//!   socket, else UDP with the ID found as above.
//!
//! Sending is unaffected by the choice: packets leave with DF and ID 0 (ID k for the k-th
//! packet of a GSO train), which rxe and hardware RoCE NICs accept. A capture records a received packet with the ID the engine
//! found, so it decodes with a valid ICRC as it did on the wire.

//! ## `unsafe`
//!
//! Three places, each with a `// SAFETY:` comment: the [`engine::Memory`] implementation over
//! process memory (`memory`), `setsockopt(IP_MTU_DISCOVER)` (`io`), and `recvmmsg` with its
//! headers and control messages (`mmsg`: nix 0.30's leaves a slot's control buffer shrunk
//! after a datagram without one). [`EngineGuard::reg_mr`] is `unsafe`: its caller promises the
//! memory stays valid until it is deregistered.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod attach;
pub mod capture;
mod config;
mod io;
pub mod link;
mod mcast;
mod memory;
mod mmsg;
mod progress;
pub mod rdma_cm;

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use engine::{
    AccessFlags, AsyncEvent, CqHandle, Engine, EngineConfig, Instant, MemOwner, Memory, MrHandle,
    MrKeys, PdHandle, VerbsError,
};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::time::TimeSpec;

pub use attach::{Attachment, Plain};
pub use capture::Capture;
pub use cm::CmError;
pub use config::{RuntimeConfig, RxPath, SrcPortPolicy, DEFAULT_ADAPTIVE_POLL};
pub use io::IoCounters;
pub use rdma_cm::{
    CmChannel, CmConfig, CmCounters, CmEvent, CommId, ConnParam, ConnectRequest, Ece,
};
pub use wire::{PortSpace, RejectReason, ServiceId};

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
    /// The connection manager refused a call (unknown connection, wrong state, private
    /// data too long...).
    #[error(transparent)]
    Cm(#[from] cm::CmError),
    /// The device has no address of the peer's family to connect from.
    #[error("no local address to reach {peer}")]
    NoLocalAddress {
        /// The peer asked for.
        peer: IpAddr,
    },
}

fn io_err(what: &'static str) -> impl FnOnce(nix::errno::Errno) -> RuntimeError {
    move |e| RuntimeError::Io {
        what,
        source: e.into(),
    }
}

/// The engine as a runtime hosts it: over memory that may move between threads.
pub type SendEngine = Engine<dyn Memory + Send>;

/// An `eventfd` that announces something to a waiter: completions on one CQ (the
/// completion channel of `ibv_req_notify_cq`: readable once after each [`Runtime::arm_cq`]
/// that found or later saw a completion), or events queued on a [`CmChannel`].
#[derive(Debug)]
pub struct Notifier {
    fd: EventFd,
}

/// The notifier of one CQ (see [`Runtime::cq_notifier`]).
pub type CqNotifier = Notifier;

impl Notifier {
    fn new() -> Result<Notifier, RuntimeError> {
        let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(io_err("eventfd"))?;
        Ok(Notifier { fd })
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

impl AsFd for Notifier {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Wait until `fd` is readable or `timeout` passes (`None`: no limit). A signal ends the
/// wait early, as a spurious wakeup.
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> Result<(), RuntimeError> {
    wait_readable_or_hangup(fd, None, timeout).map(|_| ())
}

/// [`wait_readable`], also ending when the peer of stream socket `hangup` closed its end
/// (then `Ok(true)`, whether or not `fd` is readable too).
pub fn wait_readable_or_hangup(
    fd: BorrowedFd<'_>,
    hangup: Option<BorrowedFd<'_>>,
    timeout: Option<Duration>,
) -> Result<bool, RuntimeError> {
    use nix::poll::{ppoll, PollFd, PollFlags};
    // Hang-ups are reported whatever is asked: nothing else is asked of `hangup`.
    let mut fds = [
        PollFd::new(fd, PollFlags::POLLIN),
        PollFd::new(hangup.unwrap_or(fd), PollFlags::empty()),
    ];
    let n = if hangup.is_some() { 2 } else { 1 };
    match ppoll(&mut fds[..n], timeout.map(TimeSpec::from_duration), None) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(n == 2 && peer_gone(&fds[1])),
        Err(e) => Err(io_err("ppoll")(e)),
    }
}

/// Whether the peer of stream socket `fd` closed its end (a look, never a wait): a Unix
/// stream socket hangs up when its peer's end is closed, as when the peer process dies.
pub fn hung_up(fd: BorrowedFd<'_>) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(fd, PollFlags::empty())];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1)) && peer_gone(&fds[0])
}

fn peer_gone(p: &nix::poll::PollFd<'_>) -> bool {
    use nix::poll::PollFlags;
    p.revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR))
}

/// What lives under the runtime's lock.
struct Core<A> {
    engine: SendEngine,
    /// What the host attached (the daemon's rings; nothing for the embedded device).
    attach: A,
    tx: io::Tx,
    txbuf: Vec<u8>,
    /// Registered ranges of this process ([`EngineGuard::reg_mr`]); `None` when the engine
    /// runs over memory the host gave it.
    regions: Option<memory::SharedRegions>,
    mr_owners: HashMap<MrHandle, MemOwner>,
    notifiers: HashMap<CqHandle, Arc<CqNotifier>>,
    events: VecDeque<AsyncEvent>,
    /// Event channels signalled on every asynchronous event besides the runtime's own
    /// (a daemon's connections; one that ended leaves a dead reference, pruned then).
    event_listeners: Vec<Weak<EventFd>>,
    rx_counters: IoCounters,
    /// What the receive sides of groups the device left had counted.
    rx_retired: IoCounters,
    /// The engine's [`Engine::mcast_epoch`] when the device last joined and left groups.
    groups_epoch: u64,
    /// Packets one of this device's QPs sent another, waiting to go back into the engine.
    local_rx: VecDeque<LocalPacket>,
    /// Spare transmit buffers: a packet for this device leaves in the buffer it was built
    /// in, and a spare takes its place.
    local_free: Vec<Vec<u8>>,
    /// Where every sent and received packet is recorded, if anywhere.
    capture: Option<Arc<Capture>>,
    /// The port's connection manager, fed from QP1.
    cm: rdma_cm::CmHost,
    /// Posts since a thread last polled a CQ or drove the device ([`EngineGuard::hold_transmit`]).
    posts_since_poll: u32,
    /// Posts whose packets wait for the next pump.
    held: u32,
}

/// A packet one of the device's QPs sent another.
struct LocalPacket {
    /// The buffer it was built in (`bytes[..len]` is the packet).
    bytes: Vec<u8>,
    len: usize,
    /// Built for an internal path ([`engine::Transmit::internal`]): no ICRC to check.
    internal: bool,
}

/// A duration in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Most asynchronous events kept for their owners to take; the oldest go first.
const MAX_EVENTS: usize = 1024;

/// Rounds of same-device packet exchange one pass runs before leaving the rest for the
/// next (so a verb that pumps does not move a whole transfer).
const LOCAL_ROUNDS: usize = 32;

impl<A: Attachment> Core<A> {
    /// Send everything the engine has to send, over the route each packet's destination
    /// takes (see [`Core::route`]); packets for this device go back into the engine, for up
    /// to [`LOCAL_ROUNDS`] rounds. When a plain ACK leaves is the engine's decision
    /// (`engine::EngineConfig::ack_coalesce`): it emits one only once it is due, never in
    /// the pass that handled its request, so a thread that just received what it waits for
    /// posts its reply before anyone pays for the ACK.
    fn pump(&mut self, net: &Net, now: Instant) {
        self.held = 0;
        for _ in 0..LOCAL_ROUNDS {
            self.pump_once(net, now);
            if self.local_rx.is_empty() {
                break;
            }
            while let Some(p) = self.local_rx.pop_front() {
                let pkt = &p.bytes[..p.len];
                if p.internal {
                    self.engine.handle_internal(now, pkt);
                } else {
                    if let Some(c) = &self.capture {
                        c.record(pkt);
                    }
                    self.engine.handle_datagram(now, pkt);
                }
                self.local_free.push(p.bytes);
            }
        }
        self.attach.flush();
    }

    fn pump_once(&mut self, net: &Net, now: Instant) {
        // A completion says the data is in memory, and a packet may tell a peer so: the
        // writes the host held back land first.
        self.attach.flush();
        self.attach.deliver(&mut self.engine);
        // The CM first: the QPs it moves to RTS may send at once, and its MADs leave in
        // this pass.
        self.cm.pump(&mut self.engine, now);
        while let Some(t) = self.engine.poll_transmit(now, &mut self.txbuf) {
            self.route(net, t);
        }
        self.tx.flush();
    }

    /// Deliver one packet the engine built in `txbuf`: back into this engine when it is
    /// for this device, to another device of this process when one serves its destination
    /// ([`link`]), else as a UDP datagram.
    fn route(&mut self, net: &Net, t: engine::Transmit) {
        if net.is_local(t.dst) {
            // Both ends on this device: the engine takes its own packet back, as a NIC
            // loops back traffic between its own QPs (on an internal path: large segments,
            // no ICRC). The packet keeps its buffer; a spare becomes the transmit buffer.
            let spare = self
                .local_free
                .pop()
                .unwrap_or_else(|| vec![0; self.txbuf.len()]);
            let bytes = std::mem::replace(&mut self.txbuf, spare);
            self.local_rx.push_back(LocalPacket {
                bytes,
                len: t.len,
                internal: t.internal,
            });
            self.tx.counters.local_packets += 1;
            return;
        }
        if t.dst.is_multicast() && !t.internal {
            self.route_multicast(net, t);
            return;
        }
        if let Some(peer) = net.peer(t.dst) {
            // Another device of this process: hand it over, no socket either (in internal
            // segments when both devices have internal paths: see [`link`]).
            let pkt = &self.txbuf[..t.len];
            if !t.internal {
                if let Some(c) = &self.capture {
                    c.record(pkt);
                }
            }
            peer.deliver(pkt.to_vec(), t.internal);
            self.tx.counters.peer_packets += 1;
            return;
        }
        if t.internal {
            // Only this device's and its linked devices' addresses are internal.
            tracing::warn!(dst = %t.dst, "internal packet for no device of this process dropped");
            self.tx.counters.tx_errors += 1;
            return;
        }
        self.tx
            .send(&mut self.txbuf, t.len, t.dst, self.capture.as_deref());
    }

    /// A datagram to a multicast group is for every device that joined it: this one (its
    /// QPs attached to the group get a copy each, the sender's included, as a NIC loops
    /// multicast back), the other devices of this process, and the network (the IP
    /// multicast address, which the devices of other processes and hosts joined: see
    /// "Multicast groups" in the crate docs). The copy the network brings back to this
    /// process is dropped on receipt, as these copies were delivered already.
    fn route_multicast(&mut self, net: &Net, t: engine::Transmit) {
        let mut copy = self
            .local_free
            .pop()
            .unwrap_or_else(|| vec![0; self.txbuf.len()]);
        copy[..t.len].copy_from_slice(&self.txbuf[..t.len]);
        self.local_rx.push_back(LocalPacket {
            bytes: copy,
            len: t.len,
            internal: false,
        });
        self.tx.counters.local_packets += 1;
        let pkt = &self.txbuf[..t.len];
        for peer in net.all_peers() {
            peer.deliver(pkt.to_vec(), false);
            self.tx.counters.peer_packets += 1;
        }
        self.tx
            .send(&mut self.txbuf, t.len, t.dst, self.capture.as_deref());
    }

    /// When the engine or the connection manager next has a timer due.
    fn poll_timeout(&self) -> Option<Instant> {
        match (self.engine.poll_timeout(), self.cm.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Run the engine's and the connection manager's timers that are due at `now`;
    /// whether any was.
    fn run_due_timers(&mut self, now: Instant) -> bool {
        let due = |t: Option<Instant>| t.is_some_and(|t| t <= now);
        let engine = due(self.engine.poll_timeout());
        if engine {
            self.engine.handle_timeout(now);
        }
        let cm = due(self.cm.poll_timeout());
        if cm {
            self.cm.handle_timeout(now);
        }
        engine || cm
    }

    /// Signal armed CQs that have completions and queue async events for their owners
    /// (at most [`MAX_EVENTS`]: the oldest are acknowledged and dropped).
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
            tracing::debug!(event = ?ev, "async event");
            if self.events.len() >= MAX_EVENTS {
                // Nobody took it: acknowledge it, or its SRQ could never be destroyed.
                if let Some(old) = self.events.pop_front() {
                    self.engine.ack_async_event(&old);
                }
            }
            self.events.push_back(ev);
            any = true;
        }
        if any {
            let _ = async_fd.write(1);
            self.event_listeners.retain(|w| match w.upgrade() {
                Some(fd) => {
                    let _ = fd.write(1);
                    true
                }
                None => false,
            });
        }
    }
}

/// Record a received packet. A header the socket layer rebuilt carries ID 0: record the
/// IPv4 ID the sender used (the one its ICRC holds for), so the capture shows the packet as
/// it was on the wire and its ICRC verifies.
fn record_received(c: &Capture, pkt: &[u8], rebuilt: bool) {
    match wire::icrc::recover_ipv4_ident(pkt) {
        Some(id) if rebuilt && id != 0 => {
            let mut copy = pkt.to_vec();
            if let Ok(mut ip) = wire::Ipv4::new_checked(&mut copy[..]) {
                ip.set_ident(id);
                ip.fill_checksum();
            }
            c.record(&copy);
        }
        _ => c.record(pkt),
    }
}

/// Where a device's packets can go without a socket: its own addresses, and the devices of
/// this process it was linked with ([`link`]).
struct Net {
    /// The device's addresses, when packets to them come back to it (its remote port is
    /// its own port: several devices sharing an address on distinct ports are reached
    /// through their sockets).
    local: Vec<IpAddr>,
    peers: OnceLock<Vec<(IpAddr, Weak<dyn Inbox>)>>,
}

impl Net {
    fn is_local(&self, dst: IpAddr) -> bool {
        self.local.contains(&dst)
    }

    /// Every other device of this process (a multicast packet is for each).
    fn all_peers(&self) -> impl Iterator<Item = Arc<dyn Inbox>> + '_ {
        self.peers
            .get()
            .into_iter()
            .flatten()
            .filter_map(|(_, w)| w.upgrade())
    }

    fn peer(&self, dst: IpAddr) -> Option<Arc<dyn Inbox>> {
        self.peers
            .get()?
            .iter()
            .find(|(a, _)| *a == dst)
            .and_then(|(_, w)| w.upgrade())
    }
}

/// A device that takes packets from other devices of this process.
trait Inbox: Send + Sync {
    /// Queue `pkt` (a whole IP packet; `internal`: built for an internal path, without an
    /// ICRC) and wake the device.
    fn deliver(&self, pkt: Vec<u8>, internal: bool);
}

/// State shared by the handle and the progress thread.
struct Shared<A> {
    core: Mutex<Core<A>>,
    /// The receive side, one per address. Whoever holds this lock receives *and* hands the
    /// batch to the engine, so packets reach the engine in arrival order whichever thread
    /// drives. Only ever `try_lock`ed, by a thread that holds `core`.
    rx: Mutex<Vec<io::Rx>>,
    /// The sockets `rx` reads (UDP sockets, or raw ones), polled without the `rx` lock.
    socks: Vec<Arc<socket2::Socket>>,
    /// The multicast groups' receive sides (in `rx`, after the device's own) and the epoll
    /// set their sockets are watched in.
    groups: mcast::Groups,
    /// Packets other devices of this process handed this one. A leaf lock: nothing else is
    /// taken while it is held.
    inbox: Mutex<VecDeque<(Vec<u8>, bool)>>,
    /// The device serves its own addresses over internal paths
    /// ([`RuntimeConfig::internal_paths`]).
    internal_paths: bool,
    net: Net,
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
    /// The device's addresses, GID order.
    addrs: Vec<IpAddr>,
    /// How long (ns) the progress thread keeps polling after the last activity.
    busy_poll_ns: AtomicU64,
    /// The longest polling the progress thread learns ([`RuntimeConfig::adaptive_poll`]).
    adaptive_poll: Duration,
    /// Times the progress thread went to sleep.
    sleeps: AtomicU64,
    /// Times learned polling was unlearned because the core was taken while polling.
    poll_backoffs: AtomicU64,
}

impl<A: Attachment> Inbox for Shared<A> {
    fn deliver(&self, pkt: Vec<u8>, internal: bool) {
        lock_leaf(&self.inbox).push_back((pkt, internal));
        let _ = self.doorbell.write(1);
    }
}

/// Lock a mutex that guards only whole-value pushes and takes (a panic cannot leave it
/// half-updated).
fn lock_leaf<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<A: Attachment> Shared<A> {
    fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    /// Receive one batch (if the sockets have any), take posted work and packets handed
    /// over by other devices, and run them through the engine, with the timers and
    /// transmissions they cause. Returns how much was handled.
    ///
    /// The engine lock is taken first and the receive side only tried: a thread that held
    /// the receive side while it waited for the engine lock could be kept from it for long
    /// by a thread polling a CQ in a tight loop (the lock is not fair), and nobody could
    /// receive meanwhile.
    fn drive_rx(&self) -> usize {
        let mut core = self.lock();
        let now = self.now();
        let work = self.take_work(&mut core, now);
        let Ok(mut rx) = self.rx.try_lock() else {
            // Another thread is receiving: just run the timers and send.
            self.run_timers_and_send(&mut core, now);
            return work;
        };
        let n = rx
            .iter_mut()
            .map(io::Rx::recv_batch)
            .collect::<io::PerSocket>();
        self.process(&mut core, &mut rx);
        work + n.iter().sum::<usize>()
    }

    /// Take what the host's attachment and other devices of this process have for the
    /// engine. Returns how many items.
    fn take_work(&self, core: &mut Core<A>, now: Instant) -> usize {
        let Core {
            engine,
            attach,
            capture,
            ..
        } = core;
        let mut n = attach.take_work(engine);
        let handed = std::mem::take(&mut *lock_leaf(&self.inbox));
        for (p, internal) in handed {
            n += 1;
            if internal {
                engine.handle_internal(now, &p);
                continue;
            }
            if let Some(c) = capture {
                c.record(&p);
            }
            engine.handle_datagram(now, &p);
        }
        n
    }

    /// Hand the packets `rx` just received to the engine, run
    /// due timers, send what the engine emits, signal waiters, and wake the progress thread
    /// if a timer it does not know of is now earlier than its wakeup.
    fn process(&self, core: &mut Core<A>, rx: &mut [io::Rx]) {
        let now = self.now();
        let mut counters = core.rx_retired;
        for side in rx.iter_mut() {
            let rebuilt = side.rebuilds_headers();
            while let Some(pkt) = side.next_packet() {
                if let Some(c) = &core.capture {
                    record_received(c, pkt, rebuilt);
                }
                core.engine.handle_datagram(now, pkt);
            }
            mcast::add_rx_counters(&mut counters, side);
        }
        core.rx_counters = counters;
        core.run_due_timers(now);
        self.after_change(core, now);
    }

    /// Run the engine's timers if due, send what is due, signal waiters.
    fn run_timers_and_send(&self, core: &mut Core<A>, now: Instant) {
        core.run_due_timers(now);
        self.after_change(core, now);
    }

    /// What every change of engine state is followed by, under the lock: send, signal, and
    /// ring the doorbell only if the progress thread would otherwise sleep past the next
    /// timer (an ACK's deadline included; published under this lock: see `wake_at`), or
    /// packets for this device wait for another round.
    fn after_change(&self, core: &mut Core<A>, now: Instant) {
        self.after_change_holding(core, now, false);
    }

    /// [`Shared::after_change`], where `hold` leaves what the engine has to send for the
    /// next pump (see [`EngineGuard::hold_transmit`]).
    fn after_change_holding(&self, core: &mut Core<A>, now: Instant, hold: bool) {
        self.sync_groups(core);
        if hold {
            core.held += 1;
        } else {
            core.pump(&self.net, now);
        }
        core.notify(&self.async_fd);
        let mut next = core.poll_timeout().map_or(u64::MAX, Instant::as_nanos);
        if !core.local_rx.is_empty() {
            next = 0;
        }
        // A thread that polls runs the timers that fall due itself (see `drive_polling`):
        // ringing for each (an ACK's deadline comes with every message) would wake the
        // progress thread once per message, on a core the polling threads need.
        if next < self.wake_at.load(Ordering::SeqCst) && !self.polling(now.as_nanos()) {
            let _ = self.doorbell.write(1);
        }
    }

    /// An application thread that polls drives the device itself for a while: it receives,
    /// the progress thread stays off the socket (one thread handles each packet, no wakeup).
    /// `core` is held, so the receive side is only tried. Returns the packets handled.
    /// `explicit`: the caller promised to keep polling ([`Runtime::poll_progress`]); an
    /// empty `poll_cq` takes the socket only while that has not been seen to stall
    /// packets (see `implicit_off_until`).
    fn drive_polling(&self, core: &mut Core<A>, explicit: bool) -> usize {
        let now = self.now();
        if explicit || self.implicit_leases(now.as_nanos()) {
            self.renew_lease(now);
        }
        // ACKs that fell due since the last pass, and packets of posts held back, go now,
        // before this thread looks again.
        core.posts_since_poll = 0;
        if core.run_due_timers(now) || core.held > 0 {
            self.after_change(core, now);
        }
        let Ok(mut rx) = self.rx.try_lock() else {
            // The progress thread or a waiting thread is receiving right now.
            return 0;
        };
        // A ping-pong's next packet comes alone: look for one (the cheapest look); while
        // packets keep coming, take them a batch at a time.
        let n: io::PerSocket = rx
            .iter_mut()
            .map(|side| {
                let n = if side.streaming {
                    side.recv_batch()
                } else {
                    side.recv_one()
                };
                side.streaming = n > 0;
                n
            })
            .collect();
        let total = n.iter().sum();
        if total > 0 {
            self.process(core, &mut rx);
        } else if core.run_due_timers(now) {
            self.after_change(core, now);
        }
        total
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

    /// Whether a thread polls the device at engine time `now_ns` (a lease, and no thread
    /// blocked in `wait_cq`, which runs no timers): it runs due timers itself.
    fn polling(&self, now_ns: u64) -> bool {
        self.drivers.load(Ordering::SeqCst) == 0 && self.lease_until.load(Ordering::SeqCst) > now_ns
    }

    /// Whether an application thread drives the socket at engine time `now_ns`.
    fn app_drives(&self, now_ns: u64) -> bool {
        self.drivers.load(Ordering::SeqCst) > 0 || self.lease_until.load(Ordering::SeqCst) > now_ns
    }

    /// Whether the packets of the post just made may wait for the next pump (see
    /// [`EngineGuard::hold_transmit`]): a pump comes soon, because a thread polls the
    /// device or because the progress thread is awake and nobody drives the socket (it
    /// decides to sleep under this lock, and does not while posts are held: see
    /// `has_pending`); this is not the first post since a thread last looked, so the
    /// poster is not waiting for this one packet alone; and fewer than [`MAX_HELD`] wait.
    fn may_hold(&self, core: &mut Core<A>, now: Instant) -> bool {
        let now_ns = now.as_nanos();
        let pump_soon = self.polling(now_ns)
            || (!self.app_drives(now_ns) && self.wake_at.load(Ordering::SeqCst) == 0);
        let hold = core.posts_since_poll > 0 && core.held < MAX_HELD && pump_soon;
        core.posts_since_poll = core.posts_since_poll.saturating_add(1);
        hold
    }

    /// The engine lock if it is free. The progress thread only tries it while an
    /// application thread polls: blocking on it would make every unlock of the polling
    /// thread a futex wakeup of the progress thread, which then fails to get the lock
    /// from the spinning thread again and again, on a core the other end of the ping-pong
    /// needs.
    fn try_lock(&self) -> Option<MutexGuard<'_, Core<A>>> {
        let mut g = match self.core.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        g.attach.locked();
        Some(g)
    }

    fn lock(&self) -> MutexGuard<'_, Core<A>> {
        // A panic while holding the lock leaves the engine as the panicking verb left it; the
        // engine keeps its own invariants per call, so carry on rather than poison every user.
        let mut g = self.core.lock().unwrap_or_else(|e| e.into_inner());
        g.attach.locked();
        g
    }

    /// Whether the progress thread should not sleep: work or packets wait that a pass
    /// would take.
    fn has_pending(&self, core: &Core<A>) -> bool {
        !core.local_rx.is_empty()
            || core.held > 0
            || core.attach.has_work()
            || !lock_leaf(&self.inbox).is_empty()
    }
}

/// One soft RNIC: an engine on UDP sockets (one per address) with its progress thread,
/// and whatever its host attached (`A`: nothing for the embedded device, the work and
/// completion rings for the daemon). Dropping it stops the thread.
pub struct Runtime<A: Attachment = Plain> {
    shared: Arc<Shared<A>>,
    thread: Option<JoinHandle<()>>,
    /// The process that started it. A child made by `fork` holds a copy of the device whose
    /// progress thread it does not have, and whose sockets (and their multicast
    /// memberships) are its parent's too.
    started_by: u32,
}

impl<A: Attachment> core::fmt::Debug for Runtime<A> {
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

/// Let the devices of one process hand each other the packets addressed to one another
/// instead of sending them as UDP (a NIC's ports on one host do not need the wire either).
/// Between devices that both have [`RuntimeConfig::internal_paths`], connections take
/// internal paths, as between QPs of one device: large segments, no ICRC, no capture. Call
/// once, after every device started and before any QP connects; later calls change nothing.
pub fn link<A: Attachment>(devices: &[&Runtime<A>]) {
    for d in devices {
        if d.shared.net.peers.get().is_some() {
            continue;
        }
        if d.shared.internal_paths {
            let inside: Vec<IpAddr> = devices
                .iter()
                .filter(|o| !Arc::ptr_eq(&o.shared, &d.shared) && o.shared.internal_paths)
                .flat_map(|o| o.addrs().iter().copied())
                .collect();
            d.shared.lock().engine.add_internal_addresses(&inside);
        }
        let others = devices
            .iter()
            .filter(|o| !Arc::ptr_eq(&o.shared, &d.shared))
            .flat_map(|o| {
                let w: Weak<dyn Inbox> = Arc::downgrade(&o.shared) as Weak<dyn Inbox>;
                o.addrs().iter().map(move |a| (*a, w.clone()))
            })
            .collect();
        let _ = d.shared.net.peers.set(others);
    }
}

impl Runtime<Plain> {
    /// Bind the sockets, build the engine over this process's memory and start the
    /// progress thread: an embedded device.
    pub fn start(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let regions = memory::SharedRegions::default();
        let mem: Box<dyn Memory + Send> = Box::new(memory::ProcessMemory::new(regions.clone()));
        Runtime::start_with(config, mem, Some(regions), Plain)
    }
}

impl<A: Attachment> Runtime<A> {
    /// Bind the sockets, build the engine over `memory` (the host registers its ranges
    /// with the engine itself: [`EngineGuard::reg_mr`] is for process memory only) and
    /// start the progress thread, with `attach` added to its passes.
    pub fn start_hosted(
        config: RuntimeConfig,
        memory: Box<dyn Memory + Send>,
        attach: A,
    ) -> Result<Runtime<A>, RuntimeError> {
        Runtime::start_with(config, memory, None, attach)
    }

    fn start_with(
        config: RuntimeConfig,
        mem: Box<dyn Memory + Send>,
        regions: Option<memory::SharedRegions>,
        attach: A,
    ) -> Result<Runtime<A>, RuntimeError> {
        let addrs = config.addrs();
        let mut port = config.port;
        let mut udp = Vec::new();
        for &a in &addrs {
            let want = SocketAddr::new(a, port);
            let sock = io::rx_socket(want, config.gso)
                .map_err(|source| RuntimeError::Bind { addr: want, source })?;
            // Port 0 asks the OS for one: learn which, and bind the other addresses to it.
            port = sock
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .map_or(port, |a| a.port());
            udp.push((a, Arc::new(sock)));
        }
        let local = SocketAddr::new(config.addr, port);
        // Port 0 for peers: the port this device got (devices of one host on one port).
        let remote_port = if config.remote_port == 0 {
            port
        } else {
            config.remote_port
        };
        let mut rx = Vec::new();
        let mut socks = Vec::new();
        let mut all_raw = true;
        for (a, sock) in &udp {
            let raw_sock = match config.rx_path {
                _ if !a.is_ipv4() => None,
                RxPath::Udp => None,
                RxPath::Raw => Some(
                    io::raw_rx_socket(SocketAddr::new(*a, port))
                        .map_err(|source| RuntimeError::RawSocket { source })?,
                ),
                RxPath::Auto => io::raw_rx_socket(SocketAddr::new(*a, port)).ok(),
            };
            let raw = raw_sock.is_some();
            all_raw &= raw || !a.is_ipv4();
            let rx_sock = match raw_sock {
                Some(r) => {
                    // The UDP socket keeps the port (no ICMP port-unreachable, the fixed
                    // source port) but is never read: a minimal buffer makes the kernel drop
                    // its copies.
                    let _ = sock.set_recv_buffer_size(0);
                    Arc::new(r)
                }
                None => sock.clone(),
            };
            rx.push(io::Rx::new(
                rx_sock.clone(),
                *a,
                config.rx_batch,
                raw.then_some(port),
                raw || config.gso,
            ));
            socks.push(rx_sock);
        }
        let mut ec = EngineConfig::new(addrs.clone(), config.rng_seed.unwrap_or_else(random_seed));
        ec.device = config.device.clone();
        ec.ack_coalesce = config.ack_coalesce;
        // The port offers what the links under its addresses carry (DF is always set).
        ec.mtu = link::port_mtu_of(&addrs, config.mtu);
        if config.internal_paths {
            ec.internal_addresses = addrs.clone();
        }
        if !all_raw {
            // A UDP socket hides the sender's IPv4 ID: the engine finds it (see "Receive
            // policy").
            ec.ipv4_ident = engine::Ipv4IdentPolicy::Recover;
        }
        if config.src_port_policy == SrcPortPolicy::Fixed {
            // The engine emits the port the packets leave from: no rewriting needed.
            ec.udp_src_port = Some(port);
        }
        let engine = Engine::with_memory(ec, mem);
        // Keys and CM IDs from one seed when a test fixes it, else fresh randomness.
        let cm_seed = config
            .rng_seed
            .map_or_else(random_seed, |s| s ^ 0x636d_5f73_6565_6421);
        let cm = rdma_cm::CmHost::new(config.cm, &addrs, config.device.node_guid, cm_seed);
        let tx = io::Tx::new(udp, remote_port, config.src_port_policy, port, config.gso);
        // Internal segments are larger than any wire packet.
        let txlen = if config.internal_paths {
            engine::MAX_INTERNAL_MTU as usize + 4096
        } else {
            io::MAX_DATAGRAM + io::HEADROOM
        };
        let core = Core {
            engine,
            attach,
            tx,
            txbuf: vec![0; txlen],
            regions,
            mr_owners: HashMap::new(),
            notifiers: HashMap::new(),
            events: VecDeque::new(),
            event_listeners: Vec::new(),
            rx_counters: IoCounters::default(),
            rx_retired: IoCounters::default(),
            groups_epoch: 0,
            local_rx: VecDeque::new(),
            local_free: Vec::new(),
            posts_since_poll: 0,
            held: 0,
            capture: Capture::from_env(),
            cm,
        };
        let flags = EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC;
        // A device's packets to its own addresses come back to it only when its peers'
        // port is its own (devices sharing an address on distinct ports reach each other
        // through their sockets).
        let loops_back = remote_port == port;
        let shared = Arc::new(Shared {
            core: Mutex::new(core),
            rx: Mutex::new(rx),
            socks,
            // IPv4 groups take the raw path where the device's IPv4 addresses do.
            groups: mcast::Groups::new(
                port,
                all_raw && addrs.iter().any(IpAddr::is_ipv4),
                config.rx_batch,
            )
            .map_err(io_err("epoll_create"))?,
            inbox: Mutex::new(VecDeque::new()),
            internal_paths: config.internal_paths,
            net: Net {
                local: if loops_back {
                    addrs.clone()
                } else {
                    Vec::new()
                },
                peers: OnceLock::new(),
            },
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
            addrs: addrs.clone(),
            busy_poll_ns: AtomicU64::new(nanos(config.busy_poll)),
            adaptive_poll: config.adaptive_poll,
            sleeps: AtomicU64::new(0),
            poll_backoffs: AtomicU64::new(0),
        });
        let s = shared.clone();
        let name = config.name.unwrap_or_else(|| format!("softrdma {local}"));
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || progress::run(&s))
            .map_err(|source| RuntimeError::Io {
                what: "spawn progress thread",
                source,
            })?;
        Ok(Runtime {
            shared,
            thread: Some(thread),
            started_by: std::process::id(),
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
    pub fn lock(&self) -> EngineGuard<'_, A> {
        EngineGuard {
            core: self.shared.lock(),
            shared: &self.shared,
            dirty: false,
            hold: false,
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
        core.engine.cq_len(cq)?;
        if let std::collections::hash_map::Entry::Vacant(e) = core.notifiers.entry(cq) {
            e.insert(Arc::new(CqNotifier::new()?));
        }
        core.engine.arm_cq(cq, solicited_only, false)?;
        core.notify(&self.shared.async_fd);
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
            let mut fds = Vec::with_capacity(2 + shared.socks.len());
            fds.push(PollFd::new(notifier.as_fd(), PollFlags::POLLIN));
            fds.extend(
                shared
                    .socks
                    .iter()
                    .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN)),
            );
            fds.push(PollFd::new(shared.groups.poll.0.as_fd(), PollFlags::POLLIN));
            match ppoll(&mut fds, left, None) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io_err("ppoll")(e)),
            }
            if fds[1..]
                .iter()
                .any(|f| f.revents().is_some_and(|r| !r.is_empty()))
            {
                shared.drive_rx();
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

    /// What the device's connection manager counted (MADs received, sent, resent, dropped
    /// by reason).
    pub fn cm_counters(&self) -> CmCounters {
        self.shared.lock().cm.counters()
    }

    /// Counters of the socket layer and of the routes that bypass it.
    pub fn io_counters(&self) -> IoCounters {
        let core = self.shared.lock();
        let mut c = core.tx.counters;
        c.rx_datagrams = core.rx_counters.rx_datagrams;
        c.rx_trains = core.rx_counters.rx_trains;
        c.rx_dropped = core.rx_counters.rx_dropped;
        c.rx_mcast_own = core.rx_counters.rx_mcast_own;
        c
    }

    /// The multicast groups the device is a member of on the network now: the IP address
    /// of each group a QP of the device is attached to (see "Multicast groups" in the crate
    /// docs), except those it could not join (logged).
    pub fn joined_groups(&self) -> Vec<IpAddr> {
        self.shared.joined_groups()
    }

    /// Every address of the device, GID order (the first is [`Runtime::local_addr`]'s).
    pub fn addrs(&self) -> &[IpAddr] {
        &self.shared.addrs
    }

    /// How long the progress thread keeps polling after the last activity before it sleeps
    /// (see [`RuntimeConfig::busy_poll`]).
    pub fn set_busy_poll(&self, d: Duration) {
        self.shared.busy_poll_ns.store(nanos(d), Ordering::Relaxed);
        let _ = self.shared.doorbell.write(1);
    }

    /// Times the progress thread went to sleep so far.
    pub fn sleeps(&self) -> u64 {
        self.shared.sleeps.load(Ordering::Relaxed)
    }

    /// Times the progress thread unlearned its polling because another thread took its
    /// core while it polled (see [`RuntimeConfig::adaptive_poll`]).
    pub fn poll_backoffs(&self) -> u64 {
        self.shared.poll_backoffs.load(Ordering::Relaxed)
    }

    /// The device's doorbell: writing 1 to it wakes the progress thread (a host hands a
    /// copy to clients that post work while it sleeps: see [`Attachment::set_asleep`]).
    pub fn doorbell(&self) -> BorrowedFd<'_> {
        self.shared.doorbell.as_fd()
    }

    /// Take the asynchronous events `mine` recognizes (turned into what it returns), oldest
    /// first; the others stay queued for their owners. Taking an event acknowledges it in
    /// the engine (`ibv_ack_async_event`): the taker holds an owned copy, so nothing can
    /// still refer to it, and the SRQ it names can be destroyed.
    pub fn take_events<T>(&self, mine: impl Fn(&AsyncEvent) -> Option<T>) -> Vec<T> {
        let mut core = self.shared.lock();
        let Core { engine, events, .. } = &mut *core;
        let mut out = Vec::new();
        events.retain(|ev| match mine(ev) {
            Some(t) => {
                out.push(t);
                engine.ack_async_event(ev);
                false
            }
            None => true,
        });
        if events.is_empty() {
            let _ = self.shared.async_fd.read();
        }
        out
    }

    /// Drop (and acknowledge) the queued events `gone` recognizes: their objects are being
    /// destroyed with nobody left to take them.
    pub fn discard_events(&self, gone: impl Fn(&AsyncEvent) -> bool) {
        self.take_events(|ev| gone(ev).then_some(()));
    }

    /// Signal `listener` on every asynchronous event this device raises, for as long as it
    /// lives (besides [`Runtime::async_event_fd`]).
    pub fn add_event_listener(&self, listener: &Arc<EventFd>) {
        let mut core = self.shared.lock();
        core.event_listeners.retain(|w| w.strong_count() > 0);
        core.event_listeners.push(Arc::downgrade(listener));
    }
}

impl<A: Attachment> Drop for Runtime<A> {
    fn drop(&mut self) {
        if std::process::id() != self.started_by {
            // A copy made by `fork`: its progress thread does not exist here (joining it
            // panics), the engine lock may be held by that thread forever, and what the copy
            // would send, the groups it would leave and the capture it would flush are its
            // parent's. The child leaves the copy alone (its descriptors close when it
            // exits or execs).
            std::mem::forget(self.thread.take());
            std::mem::forget(Arc::clone(&self.shared));
            return;
        }
        // The last ACKs may still be held (a program that exits right after its last
        // completion): the peer's requester waits for them.
        {
            let mut core = self.shared.lock();
            let now = self.shared.now();
            core.engine.flush_acks();
            core.pump(&self.shared.net, now);
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.shared.doorbell.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Whoever still holds the device's state (a peer's link) does not keep its groups.
        self.shared.leave_groups();
    }
}

/// Marks a thread in `wait_cq`; the last one to leave hands the socket back to the progress
/// thread.
struct Driving<'a, A: Attachment>(&'a Shared<A>);

impl<A: Attachment> Drop for Driving<'_, A> {
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

/// Posts whose packets wait for one pump at most ([`EngineGuard::hold_transmit`]).
const MAX_HELD: u32 = 32;

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
pub struct EngineGuard<'a, A: Attachment = Plain> {
    core: MutexGuard<'a, Core<A>>,
    shared: &'a Shared<A>,
    dirty: bool,
    /// The change was a post whose packets may wait ([`EngineGuard::hold_transmit`]).
    hold: bool,
}

impl<A: Attachment> EngineGuard<'_, A> {
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
        let Some(regions) = self.core.regions.clone() else {
            // The engine runs over memory its host manages (the host registers there).
            return Err(VerbsError::OpNotSupported);
        };
        let owner = memory::lock(&regions).insert(base, length);
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
                memory::lock(&regions).remove(owner);
                Err(e)
            }
        }
    }

    /// Change a region in place (`ibv_rereg_mr`): with `CHANGE_TRANSLATION` it covers
    /// `length` bytes at `addr` from now on (the old range is no longer reached once this
    /// returns), with `CHANGE_PD` it moves to `pd`, with `CHANGE_ACCESS` it gets `access`.
    /// The handle and keys stay. On failure nothing changes.
    ///
    /// # Safety
    ///
    /// With `CHANGE_TRANSLATION`, `addr..addr + length` must meet [`Self::reg_mr`]'s
    /// contract from now until the region is deregistered.
    #[allow(unsafe_code)]
    pub unsafe fn rereg_mr(
        &mut self,
        mr: MrHandle,
        flags: engine::ReregFlags,
        pd: PdHandle,
        addr: *mut u8,
        length: usize,
        access: AccessFlags,
    ) -> Result<MrKeys, VerbsError> {
        let old = *self.core.mr_owners.get(&mr).ok_or(VerbsError::InvalidMr)?;
        let regions = self
            .core
            .regions
            .clone()
            .ok_or(VerbsError::OpNotSupported)?;
        let moves = flags.contains(engine::ReregFlags::CHANGE_TRANSLATION);
        let base = addr as usize;
        if moves && base.checked_add(length).is_none() {
            return Err(VerbsError::InvalidLength);
        }
        let owner = if moves {
            memory::lock(&regions).insert(base, length)
        } else {
            old
        };
        let r = self
            .core
            .engine
            .rereg_mr(mr, flags, pd, owner, base as u64, length as u64, access);
        if moves {
            // The engine reaches the region through `owner` only: whichever range it does
            // not use any more goes.
            let gone = if r.is_ok() { old } else { owner };
            memory::lock(&regions).remove(gone);
            if r.is_ok() {
                self.core.mr_owners.insert(mr, owner);
            }
        }
        r
    }

    /// What the host attached to this device.
    pub fn attachment(&self) -> &A {
        &self.core.attach
    }

    /// What the host attached to this device, to change. Changes count as changes of the
    /// device: completions are delivered and packets sent when the guard is dropped.
    pub fn attachment_mut(&mut self) -> &mut A {
        self.dirty = true;
        &mut self.core.attach
    }

    /// Say that the change made under this guard was a post whose packets may wait for
    /// the next pump, with those of the posts that follow: while a thread polls the device
    /// (a CQ or [`Runtime::poll_progress`]), the second and later posts between two of its
    /// looks leave together at the next look (or with the next post that sends, or after
    /// 32 posts), in one `sendmmsg` or GSO train, where each would otherwise pay
    /// a system call of its own. The first post after a look leaves at once: a ping-pong
    /// never waits. Without a polling thread every post leaves at once. A thread that posts
    /// several and then stops calling verbs altogether leaves its last posts waiting until
    /// the progress thread takes the device back, half a millisecond after its last look
    /// at most.
    pub fn hold_transmit(&mut self) {
        self.hold = true;
    }

    /// Take the work the host's attachment has waiting ([`Attachment::take_work`]) into
    /// the engine, so that a verb called next sees every post made before it. Returns how
    /// many work requests.
    pub fn take_work(&mut self) -> usize {
        let now = self.shared.now();
        let n = self.shared.take_work(&mut self.core, now);
        self.dirty |= n > 0;
        n
    }

    /// Stop announcing `cq`'s notifications (before it is destroyed through the engine).
    pub fn forget_notifier(&mut self, cq: CqHandle) {
        self.core.notifiers.remove(&cq);
    }

    /// Deregister an MR (`ibv_dereg_mr`). Once this returns the device never touches its
    /// memory again.
    pub fn dereg_mr(&mut self, mr: MrHandle) -> Result<(), VerbsError> {
        self.core.engine.dereg_mr(mr)?;
        if let (Some(owner), Some(regions)) = (self.core.mr_owners.remove(&mr), &self.core.regions)
        {
            memory::lock(regions).remove(owner);
        }
        Ok(())
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
        self.core.posts_since_poll = 0;
        let v = self.core.engine.poll_cq(cq, max)?;
        if !v.is_empty() || max == 0 || self.shared.drive_polling(&mut self.core, false) == 0 {
            return Ok(v);
        }
        self.core.engine.poll_cq(cq, max)
    }

    /// [`Self::poll_cq`] into `out` (as many as wait and fit; returns how many), allocating
    /// nothing; an empty look drives the device the same way.
    pub fn poll_cq_into(
        &mut self,
        cq: CqHandle,
        out: &mut [engine::WorkCompletion],
    ) -> Result<usize, VerbsError> {
        self.core.posts_since_poll = 0;
        let n = self.core.engine.poll_cq_into(cq, out)?;
        if n > 0 || out.is_empty() || self.shared.drive_polling(&mut self.core, false) == 0 {
            return Ok(n);
        }
        self.core.engine.poll_cq_into(cq, out)
    }
}

impl<A: Attachment> Deref for EngineGuard<'_, A> {
    type Target = SendEngine;
    fn deref(&self) -> &SendEngine {
        &self.core.engine
    }
}

impl<A: Attachment> DerefMut for EngineGuard<'_, A> {
    fn deref_mut(&mut self) -> &mut SendEngine {
        self.dirty = true;
        &mut self.core.engine
    }
}

impl<A: Attachment> Drop for EngineGuard<'_, A> {
    fn drop(&mut self) {
        if self.dirty {
            let now = self.shared.now();
            let hold = self.hold && self.shared.may_hold(&mut self.core, now);
            self.shared.after_change_holding(&mut self.core, now, hold);
        }
    }
}
