//! One daemon device: an [`engine::Engine`] over [`ClientMemory`], UDP sockets on the
//! device's addresses, and a progress thread.
//!
//! Why not `runtime::Runtime`: a runtime builds its engine over *its own* process memory
//! and offers no way to give it another [`engine::Memory`]; the daemon must reach client
//! memory with `process_vm_*`. Until the runtime accepts a memory (requested in
//! `plan/runtime-needs.txt`), this module is a small host of its own: one unconnected socket
//! per address (IPv4 with `IP_PMTUDISC_DO`, so datagrams leave with DF and ID 0, the header
//! the engine's ICRC assumed), every packet sent from the receiving port (the engine is told
//! that port, so its ICRC matches), received datagrams rebuilt into the IP packet the sender
//! emitted (ID 0, DF, destination port 4791: the runtime's receive policy), one progress
//! thread sleeping in `ppoll` on the sockets and an `eventfd` doorbell until the engine's
//! next timer. The port offers the MTU its links carry ([`port_mtu`]).
//!
//! Work rings ([`crate::wq`]): the progress thread takes WQEs from every client's rings while
//! it is busy, and keeps looking for a short while (the idle spin) after the last work, so
//! a client posting in a stream never needs a system call. Before it sleeps it sets every
//! ring's wakeup word and looks once more; a client that finds the word set after pushing
//! writes the device's doorbell eventfd. Any request on the control socket takes what waits
//! in the rings first, so a post followed by a verb on the socket keeps its order.
//!
//! Packets between two QPs of the same device never touch a socket: they go straight back
//! into the engine (`local_packets` counts them, `udp_sent` the ones that left as UDP).
//! Devices of one daemon joined by [`link_devices`] hand each other their packets the same
//! way, through the receiving device's inbox and doorbell (`peer_packets`).

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;

use std::collections::{HashMap, VecDeque};

use engine::qp_attr::Mtu;
use engine::{AsyncEvent, CqHandle, Engine, EngineConfig, Instant};
use nix::sys::eventfd::{EfdFlags, EventFd};
use wire::{Ipv4, Ipv4Repr, Ipv6, Ipv6Repr, Udp, UdpRepr};

use crate::memory::{ClientMemory, SharedRegions};
use crate::ring::{Ring, RingError};
use crate::wq::{Drained, Queue, WorkRing, WqStats};

/// Room in front of a received datagram for the IP and UDP headers rebuilt there.
const HEADROOM: usize = wire::IPV6_HEADER_LEN + wire::UDP_HEADER_LEN;
/// Largest UDP payload.
const MAX_DATAGRAM: usize = 65536;
/// Socket buffer sizes asked for (as the embedded runtime asks for its own socket).
const SOCKET_BUFFER: usize = 4 << 20;
/// How long the progress thread keeps looking for work after the last it found, unless
/// [`Device::set_idle_spin`] says otherwise.
pub const DEFAULT_IDLE_SPIN: std::time::Duration = std::time::Duration::from_micros(50);
/// Rounds of same-device packet exchange one pump runs before leaving the rest for later
/// (so a control request that pumps does not move a whole transfer).
const LOCAL_ROUNDS: usize = 32;

/// Why a device could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// A socket could not be bound or configured.
    #[error("{addr}: {source}")]
    Socket {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// Another system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

/// How to start a [`Device`].
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Name (`srxe0`...).
    pub name: String,
    /// Local addresses: one socket each, GID table in this order.
    pub addrs: Vec<IpAddr>,
    /// UDP port to receive on (and send from).
    pub port: u16,
    /// UDP port of peers.
    pub remote_port: u16,
}

/// What lives under the device lock.
pub struct Core {
    /// The engine.
    pub engine: Engine<ClientMemory>,
    txbuf: Vec<u8>,
    /// CQs whose completions go to a shared-memory ring.
    rings: HashMap<CqHandle, Ring>,
    /// Completion channels: signalled when an armed notification of their CQ fires.
    channels: HashMap<CqHandle, EventFd>,
    /// Asynchronous events not yet taken by the connection owning their object.
    events: VecDeque<AsyncEvent>,
    /// Connections' event channels, signalled on every asynchronous event (a connection
    /// that ended leaves a dead reference, pruned then).
    event_channels: Vec<Weak<EventFd>>,
    /// Clients' SQ, RQ and SRQ rings.
    work: Vec<WorkRing>,
    /// The progress thread sleeps (new work rings start with their wakeup word set).
    asleep: bool,
    /// Packets addressed to this device, waiting to go back into the engine.
    local_rx: VecDeque<LocalPacket>,
    /// Spare transmit buffers (as long as `txbuf`): a packet for this device leaves in the
    /// buffer it was built in, and a spare takes its place.
    local_free: Vec<Vec<u8>>,
}

/// A packet one of the device's QPs sent another.
struct LocalPacket {
    /// The buffer it was built in (`bytes[..len]` is the packet).
    bytes: Vec<u8>,
    len: usize,
    /// Built for an internal path ([`engine::Transmit::internal`]): no ICRC to check.
    internal: bool,
}

/// Most asynchronous events kept for clients to take; the oldest go first.
const MAX_EVENTS: usize = 1024;

struct Shared {
    core: Mutex<Core>,
    socks: Vec<(IpAddr, UdpSocket)>,
    remote_port: u16,
    doorbell: EventFd,
    stop: AtomicBool,
    origin: std::time::Instant,
    addrs: Vec<IpAddr>,
    /// Work ring counters.
    wq_stats: WqStats,
    /// Same-device packets delivered without a socket.
    local_packets: AtomicU64,
    /// Datagrams sent on the sockets.
    udp_sent: AtomicU64,
    /// Datagrams received on the sockets.
    udp_received: AtomicU64,
    /// Idle spin in nanoseconds.
    idle_spin_ns: AtomicU64,
    /// The engine memory's epoch ([`ClientMemory::epoch`]).
    mem_epoch: Arc<AtomicU64>,
    /// The engine memory's held-back writes ([`ClientMemory::write_behind`]).
    behind: crate::memory::WriteBehind,
    /// The other devices of this daemon, by address ([`link_devices`]).
    peers: OnceLock<Vec<(IpAddr, Weak<Shared>)>>,
    /// Packets other devices of this daemon addressed to this one. A leaf lock: nothing
    /// else is taken while it is held.
    inbox: Mutex<VecDeque<Vec<u8>>>,
    /// Packets handed to another device of this daemon.
    peer_packets: AtomicU64,
}

impl Shared {
    fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        // The engine keeps its invariants per call; a panicking verb must not take the whole
        // device down with a poisoned lock.
        let core = self.core.lock().unwrap_or_else(|e| e.into_inner());
        // Whatever came in before this point is served from client memory read after it.
        self.mem_epoch.fetch_add(1, Ordering::Release);
        core
    }

    /// Take what waits in the work rings into the engine; returns how many WQEs.
    fn drain_work(&self, core: &mut Core) -> usize {
        let Core { engine, work, .. } = core;
        let mut took = 0;
        work.retain_mut(|w| match w.drain(engine, &self.wq_stats) {
            Drained::Took(n) => {
                took += n;
                true
            }
            Drained::Broken => false,
        });
        took
    }

    /// Send everything the engine has to send (packets for this device's own addresses go
    /// straight back into it), keep its asynchronous events for their owners (bounded), and
    /// signal the channels of CQs whose notification fired. Returns whether it moved any
    /// packet.
    fn pump(&self, core: &mut Core, now: Instant) -> bool {
        let mut moved = false;
        for _ in 0..LOCAL_ROUNDS {
            moved |= self.pump_once(core, now);
            if core.local_rx.is_empty() {
                break;
            }
            while let Some(p) = core.local_rx.pop_front() {
                let pkt = &p.bytes[..p.len];
                if p.internal {
                    core.engine.handle_internal(now, pkt);
                } else {
                    core.engine.handle_datagram(now, pkt);
                }
                core.local_free.push(p.bytes);
            }
        }
        self.behind.flush();
        moved
    }

    fn pump_once(&self, core: &mut Core, now: Instant) -> bool {
        // A completion says the data is in memory, and a packet may tell a peer so: the
        // writes held back land first.
        self.behind.flush();
        let Core {
            engine,
            txbuf,
            rings,
            channels,
            events,
            event_channels,
            local_rx,
            local_free,
            ..
        } = core;
        let mut moved = false;
        let mut any = false;
        while let Some(ev) = engine.get_async_event() {
            tracing::debug!(event = ?ev, "async event");
            if events.len() >= MAX_EVENTS {
                // Nobody took it: acknowledge it, or its SRQ could never be destroyed.
                if let Some(old) = events.pop_front() {
                    engine.ack_async_event(&old);
                }
            }
            events.push_back(ev);
            any = true;
        }
        if any {
            event_channels.retain(|w| match w.upgrade() {
                Some(fd) => {
                    let _ = fd.write(1);
                    true
                }
                None => false,
            });
        }
        while let Some(cq) = engine.get_cq_event() {
            if let Some(fd) = channels.get(&cq) {
                let _ = fd.write(1);
            }
        }
        rings.retain(|&cq, ring| match fill_ring(engine, cq, ring) {
            Ok(()) => true,
            Err(e) => {
                // The client broke its own ring: detach it; its CQ keeps the completions.
                tracing::warn!(?cq, error = %e, "CQ ring detached");
                false
            }
        });
        // Devices handed packets, woken once when this pump is done.
        let mut woken: Vec<Arc<Shared>> = Vec::new();
        while let Some(t) = engine.poll_transmit(now, txbuf) {
            moved = true;
            if self.addrs.contains(&t.dst) {
                // Both ends on this device: the engine takes its own packet back, as a NIC
                // loops back traffic between its own QPs, with no socket on the way (and, on
                // the internal paths it knows of, in large segments without an ICRC). The
                // packet keeps its buffer; a spare one becomes the transmit buffer.
                let spare = local_free.pop().unwrap_or_else(|| vec![0; txbuf.len()]);
                local_rx.push_back(LocalPacket {
                    bytes: std::mem::replace(txbuf, spare),
                    len: t.len,
                    internal: t.internal,
                });
                self.local_packets.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if t.internal {
                // Only this device's own addresses are internal; nothing else can take it.
                tracing::warn!(dst = %t.dst, "internal packet for another device dropped");
                continue;
            }
            let pkt = &txbuf[..t.len];
            if let Some(peer) = self.peer(t.dst) {
                // Another device of this daemon: hand it over, no socket either.
                lock_inbox(&peer.inbox).push_back(pkt.to_vec());
                if !woken.iter().any(|w| Arc::ptr_eq(w, &peer)) {
                    woken.push(peer);
                }
                self.peer_packets.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let (hl, src) = match pkt.first().map(|b| b >> 4) {
                Some(4) if pkt.len() >= 20 => (
                    wire::IPV4_HEADER_LEN,
                    IpAddr::from([pkt[12], pkt[13], pkt[14], pkt[15]]),
                ),
                Some(6) if pkt.len() >= 40 => {
                    let mut a = [0u8; 16];
                    a.copy_from_slice(&pkt[8..24]);
                    (wire::IPV6_HEADER_LEN, IpAddr::from(a))
                }
                _ => continue,
            };
            let Some(payload) = pkt.get(hl + wire::UDP_HEADER_LEN..) else {
                continue;
            };
            let sock = self
                .socks
                .iter()
                .find(|(a, _)| *a == src)
                .or_else(|| self.socks.first());
            if let Some((_, s)) = sock {
                match s.send_to(payload, SocketAddr::new(t.dst, self.remote_port)) {
                    Ok(_) => {
                        self.udp_sent.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::debug!(error = %e, dst = %t.dst, "send failed"),
                }
            }
        }
        for peer in woken {
            let _ = peer.doorbell.write(1);
        }
        moved
    }

    /// The other device of this daemon that serves `dst`, if one does.
    fn peer(&self, dst: IpAddr) -> Option<Arc<Shared>> {
        self.peers
            .get()?
            .iter()
            .find(|(a, _)| *a == dst)
            .and_then(|(_, w)| w.upgrade())
    }

    /// Take posted WQEs, receive everything pending, run timers, send. Returns whether
    /// anything happened (the progress thread keeps looking while it does).
    fn drive(&self, rxbuf: &mut [u8]) -> bool {
        let mut core = self.lock();
        let mut busy = self.drain_work(&mut core) > 0;
        let now = self.now();
        let handed = std::mem::take(&mut *lock_inbox(&self.inbox));
        for p in handed {
            busy = true;
            core.engine.handle_datagram(now, &p);
        }
        for (local, sock) in &self.socks {
            while let Ok((n, from)) = sock.recv_from(&mut rxbuf[HEADROOM..]) {
                busy = true;
                self.udp_received.fetch_add(1, Ordering::Relaxed);
                if let Some(start) = rebuild_headers(rxbuf, n, from, *local) {
                    core.engine
                        .handle_datagram(now, &rxbuf[start..HEADROOM + n]);
                }
            }
        }
        if core.engine.poll_timeout().is_some_and(|t| t <= now) {
            core.engine.handle_timeout(now);
        }
        busy |= self.pump(&mut core, now);
        busy || !core.local_rx.is_empty()
    }

    /// Tell every work ring whether its client must ring the doorbell.
    fn set_asleep(core: &mut Core, asleep: bool) {
        core.asleep = asleep;
        for w in &core.work {
            w.set_sleeping(asleep);
        }
    }
}

fn lock_inbox(m: &Mutex<VecDeque<Vec<u8>>>) -> MutexGuard<'_, VecDeque<Vec<u8>>> {
    // Only pushes and takes of whole packets happen under it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Let the devices of one daemon hand each other the packets addressed to one another
/// instead of sending them as UDP (a NIC's ports on one host do not need the wire either).
/// Call once, after every device started.
pub fn link_devices(devices: &[Device]) {
    for d in devices {
        let others = devices
            .iter()
            .filter(|o| !Arc::ptr_eq(&o.shared, &d.shared))
            .flat_map(|o| o.addrs.iter().map(|a| (*a, Arc::downgrade(&o.shared))))
            .collect();
        let _ = d.shared.peers.set(others);
    }
}

/// Move as many of `cq`'s completions into its ring as fit. Those that do not fit wait in
/// the CQ, and the ring's backlog word asks the client to ring the device's doorbell when it
/// frees slots (so the progress thread may sleep meanwhile).
fn fill_ring(
    engine: &mut Engine<ClientMemory>,
    cq: CqHandle,
    ring: &mut Ring,
) -> Result<(), RingError> {
    loop {
        if engine.cq_len(cq).map_or(true, |n| n == 0) {
            ring.set_backlog(false);
            return Ok(());
        }
        let free = ring.free()? as usize;
        if free > 0 {
            let wcs = engine.poll_cq(cq, free).unwrap_or_default();
            if wcs.is_empty() {
                // Not expected while `cq_len` counts some; never loop on it.
                return Ok(());
            }
            for c in &wcs {
                let m = crate::convert::wc_to_msg(c);
                // `free` slots were checked above and only this thread (under the lock)
                // produces.
                ring.push(&m.to_entry())?;
            }
            continue;
        }
        // Full with completions left: ask for a doorbell, then look once more (a client
        // that popped before it could see the word did not ring; see `Ring::set_backlog`).
        ring.set_backlog(true);
        if ring.free()? == 0 {
            return Ok(());
        }
    }
}

/// Put the IP and UDP headers the sender emitted in front of a datagram at
/// `buf[HEADROOM..HEADROOM + len]`: IPv4 ID 0 with DF, UDP destination port 4791 (the port
/// the ICRC was computed with), checksum 0. Returns where the packet starts.
fn rebuild_headers(buf: &mut [u8], len: usize, from: SocketAddr, local: IpAddr) -> Option<usize> {
    let udp_len = len + wire::UDP_HEADER_LEN;
    let udp = UdpRepr {
        src_port: from.port(),
        dst_port: wire::ROCEV2_UDP_PORT,
        length: u16::try_from(udp_len).ok()?,
        checksum: 0,
    };
    let udp_start = HEADROOM - wire::UDP_HEADER_LEN;
    udp.emit(&mut Udp::new_unchecked(&mut buf[udp_start..HEADROOM]));
    let src = match from.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match (src, local) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let start = udp_start - wire::IPV4_HEADER_LEN;
            Ipv4Repr {
                src: s,
                dst: d,
                tos: 0,
                ident: 0,
                dont_frag: true,
                ttl: 64,
                payload_len: udp_len,
            }
            .emit(&mut Ipv4::new_unchecked(&mut buf[start..udp_start]));
            Some(start)
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let start = udp_start - wire::IPV6_HEADER_LEN;
            Ipv6Repr {
                src: s,
                dst: d,
                traffic_class: 0,
                flow_label: 0,
                hop_limit: 64,
                payload_len: udp_len,
            }
            .emit(&mut Ipv6::new_unchecked(&mut buf[start..udp_start]));
            Some(start)
        }
        _ => None,
    }
}

fn socket_for(addr: SocketAddr) -> Result<UdpSocket, HostError> {
    let err = |source| HostError::Socket { addr, source };
    let sock = UdpSocket::bind(addr).map_err(err)?;
    sock.set_nonblocking(true).map_err(err)?;
    // Room for a burst from every client's QPs at once: a full receive buffer drops
    // datagrams, and RC then goes back N (measured between two daemons over veth with the
    // default buffer: half the packets retransmitted, 87 MB/s against 250 MB/s of UDP).
    // The kernel caps these at net.core.{r,w}mem_max; best effort.
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&sock, SOCKET_BUFFER);
    let _ = rustix::net::sockopt::set_socket_send_buffer_size(&sock, SOCKET_BUFFER);
    if addr.is_ipv4() {
        rustix::net::sockopt::set_ip_mtu_discover(
            &sock,
            rustix::net::sockopt::Ipv4PathMtuDiscovery::DO,
        )
        .map_err(|e| err(e.into()))?;
    }
    Ok(sock)
}

/// One soft RNIC served by the daemon. Dropping it stops its progress thread.
pub struct Device {
    /// Its name.
    pub name: String,
    /// Its addresses.
    pub addrs: Vec<IpAddr>,
    /// The UDP port it receives on.
    pub port: u16,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl core::fmt::Debug for Device {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("addrs", &self.addrs)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// The port MTU of a device on `addrs` asked to offer `wanted`: the largest IB MTU whose
/// RoCEv2 packets fit the link under every one of its addresses (a port offers one MTU for
/// all its GIDs, and a path through the smallest link must not lose its packets to DF).
/// Addresses on no interface leave `wanted`.
pub fn port_mtu(addrs: &[IpAddr], wanted: Mtu) -> Mtu {
    addrs
        .iter()
        .map(|a| runtime::link::port_mtu(*a, wanted))
        .min_by_key(|m| m.bytes())
        .unwrap_or(wanted)
}

fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is keyed from the OS's randomness: unpredictable keys, as MR keys must be.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish()
}

impl Device {
    /// Bind the sockets, build the engine and start the progress thread.
    pub fn start(config: DeviceConfig, regions: SharedRegions) -> Result<Device, HostError> {
        let socks = config
            .addrs
            .iter()
            .map(|a| Ok((*a, socket_for(SocketAddr::new(*a, config.port))?)))
            .collect::<Result<Vec<_>, HostError>>()?;
        let mut ec = EngineConfig::new(config.addrs.clone(), random_seed());
        // QPs of this device talking to each other never leave the process.
        ec.internal_addresses = config.addrs.clone();
        ec.mtu = port_mtu(&config.addrs, ec.mtu);
        // Every packet leaves from the receiving port: the engine computes its ICRC over it.
        ec.udp_src_port = Some(config.port);
        let memory = ClientMemory::new(regions);
        let mem_epoch = memory.epoch();
        let behind = memory.write_behind();
        let engine = Engine::with_memory(ec, Box::new(memory));
        let doorbell = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| HostError::Io {
                what: "eventfd",
                source: e.into(),
            })?;
        let shared = Arc::new(Shared {
            core: Mutex::new(Core {
                engine,
                txbuf: vec![0; MAX_DATAGRAM + HEADROOM],
                rings: HashMap::new(),
                channels: HashMap::new(),
                events: VecDeque::new(),
                event_channels: Vec::new(),
                work: Vec::new(),
                asleep: false,
                local_rx: VecDeque::new(),
                local_free: Vec::new(),
            }),
            socks,
            remote_port: config.remote_port,
            doorbell,
            stop: AtomicBool::new(false),
            origin: std::time::Instant::now(),
            addrs: config.addrs.clone(),
            wq_stats: WqStats::default(),
            local_packets: AtomicU64::new(0),
            udp_sent: AtomicU64::new(0),
            udp_received: AtomicU64::new(0),
            idle_spin_ns: AtomicU64::new(DEFAULT_IDLE_SPIN.as_nanos() as u64),
            mem_epoch,
            behind,
            peers: OnceLock::new(),
            inbox: Mutex::new(VecDeque::new()),
            peer_packets: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(config.name.clone())
            .spawn(move || progress(&s))
            .map_err(|source| HostError::Io {
                what: "spawn",
                source,
            })?;
        Ok(Device {
            name: config.name,
            addrs: config.addrs,
            port: config.port,
            shared,
            thread: Some(thread),
        })
    }

    /// Run `f` on the engine under the device lock, then send what it queued and wake the
    /// progress thread so it re-reads the engine's next timer.
    /// What waits in the work rings goes into the engine first, so a verb sees every post
    /// made before it.
    pub fn with<R>(&self, f: impl FnOnce(&mut Engine<ClientMemory>) -> R) -> R {
        let mut core = self.shared.lock();
        self.shared.drain_work(&mut core);
        let r = f(&mut core.engine);
        let now = self.shared.now();
        self.shared.pump(&mut core, now);
        drop(core);
        let _ = self.shared.doorbell.write(1);
        r
    }

    /// Deliver `cq`'s completions into `ring` from now on (those already queued first).
    pub fn attach_ring(&self, cq: CqHandle, ring: Ring) -> Result<(), engine::VerbsError> {
        let mut core = self.shared.lock();
        core.engine.cq_len(cq)?;
        core.rings.insert(cq, ring);
        let now = self.shared.now();
        self.shared.pump(&mut core, now);
        Ok(())
    }

    /// Stop delivering `cq`'s completions into a ring (before destroying the CQ).
    pub fn detach_ring(&self, cq: CqHandle) {
        self.shared.lock().rings.remove(&cq);
    }

    /// A completion channel for `cq`: an eventfd the device signals whenever an armed
    /// notification of the CQ fires. Returns a descriptor of it to hand to the client.
    pub fn channel(&self, cq: CqHandle) -> Result<std::os::fd::OwnedFd, HostError> {
        let io = |what| {
            move |e: nix::errno::Errno| HostError::Io {
                what,
                source: e.into(),
            }
        };
        let mut core = self.shared.lock();
        if let Some(fd) = core.channels.get(&cq) {
            return fd
                .as_fd()
                .try_clone_to_owned()
                .map_err(|source| HostError::Io {
                    what: "dup",
                    source,
                });
        }
        let fd = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(io("eventfd"))?;
        let out = fd
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| HostError::Io {
                what: "dup",
                source,
            })?;
        core.channels.insert(cq, fd);
        Ok(out)
    }

    /// Signal `cq`'s completion channel now if it has one and the CQ holds completions
    /// (`ibv_req_notify_cq` on a CQ that is not empty: "arm, then wait" must not sleep
    /// through completions that came first).
    pub fn signal_if_pending(&self, cq: CqHandle) {
        let core = self.shared.lock();
        if core.engine.cq_len(cq).is_ok_and(|n| n > 0) {
            if let Some(fd) = core.channels.get(&cq) {
                let _ = fd.write(1);
            }
        }
    }

    /// Forget `cq`'s completion channel (before destroying the CQ).
    pub fn drop_channel(&self, cq: CqHandle) {
        self.shared.lock().channels.remove(&cq);
    }

    /// Signal `channel` whenever this device raises an asynchronous event, for as long as
    /// it lives.
    pub fn add_event_channel(&self, channel: &Arc<EventFd>) {
        let mut core = self.shared.lock();
        core.event_channels.retain(|w| w.strong_count() > 0);
        core.event_channels.push(Arc::downgrade(channel));
    }

    /// Take the asynchronous events `mine` recognizes (turned into what it returns), oldest
    /// first; the others stay for their owners.
    ///
    /// Taking an event acknowledges it in the engine (`ibv_ack_async_event`), as the API's
    /// own `async_event` does: the client holds an owned copy, so nothing can still refer
    /// to it, and the SRQ it names can be destroyed.
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
        out
    }

    /// Drop the events `gone` recognizes (their objects are being reclaimed with no client
    /// left to take them), acknowledging them so the objects can be destroyed.
    pub fn discard_events(&self, gone: impl Fn(&AsyncEvent) -> bool) {
        let mut core = self.shared.lock();
        let Core { engine, events, .. } = &mut *core;
        events.retain(|ev| {
            if gone(ev) {
                engine.ack_async_event(ev);
                false
            } else {
                true
            }
        });
    }

    /// Whether `cq` delivers into a ring.
    pub fn has_ring(&self, cq: CqHandle) -> bool {
        self.shared.lock().rings.contains_key(&cq)
    }

    /// Run `f` on the engine under the device lock, for reads that change nothing (after
    /// taking what waits in the work rings, so that a read sees every earlier post).
    pub fn read<R>(&self, f: impl FnOnce(&Engine<ClientMemory>) -> R) -> R {
        let mut core = self.shared.lock();
        if self.shared.drain_work(&mut core) > 0 {
            let now = self.shared.now();
            self.shared.pump(&mut core, now);
        }
        f(&core.engine)
    }

    /// Take posts for `ring`'s queue from it from now on.
    pub fn attach_work_ring(&self, ring: WorkRing) {
        let mut core = self.shared.lock();
        // Under the lock the progress thread sets and clears every ring's word: a ring
        // added while it sleeps asks for doorbells from the start.
        ring.set_sleeping(core.asleep);
        core.work.push(ring);
        drop(core);
        let _ = self.shared.doorbell.write(1);
    }

    /// Stop taking posts for the queues `gone` matches (before destroying their QP or SRQ).
    /// Returns how many rings went.
    pub fn detach_work_rings(&self, gone: impl Fn(Queue) -> bool) -> usize {
        let mut core = self.shared.lock();
        let before = core.work.len();
        core.work.retain(|w| !gone(w.queue()));
        before - core.work.len()
    }

    /// Whether a work ring of `queue` holds back a WQE for room in the engine (a post by
    /// request would overtake it).
    pub fn backlogged(&self, queue: Queue) -> bool {
        let core = self.shared.lock();
        core.work
            .iter()
            .any(|w| w.queue() == queue && w.backlogged())
    }

    /// Whether a work ring feeds `queue`.
    pub fn has_work_ring(&self, queue: Queue) -> bool {
        self.shared.lock().work.iter().any(|w| w.queue() == queue)
    }

    /// The device's doorbell, to hand to a client: writing it wakes the progress thread.
    pub fn doorbell(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.shared.doorbell.as_fd().try_clone_to_owned()
    }

    /// How long the progress thread keeps looking for work after the last it found before
    /// it sleeps (zero: sleep at once).
    pub fn set_idle_spin(&self, spin: std::time::Duration) {
        self.shared.idle_spin_ns.store(
            spin.as_nanos().min(u64::MAX.into()) as u64,
            Ordering::Relaxed,
        );
    }

    /// The host's own counters of this device: work rings, doorbells, same-device packets,
    /// UDP datagrams.
    pub fn host_counters(&self) -> Vec<(&'static str, u64)> {
        let s = &self.shared;
        let mut v = s.wq_stats.snapshot();
        v.push(("local_packets", s.local_packets.load(Ordering::Relaxed)));
        v.push(("udp_sent", s.udp_sent.load(Ordering::Relaxed)));
        v.push(("udp_received", s.udp_received.load(Ordering::Relaxed)));
        v.push(("peer_packets", s.peer_packets.load(Ordering::Relaxed)));
        v.push(("live_work_rings", s.lock().work.len() as u64));
        v.push(("held_back_writes_failed", s.behind.failed()));
        v
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let _ = self.shared.doorbell.write(1);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn progress(shared: &Shared) {
    use nix::poll::{ppoll, PollFd, PollFlags};
    use nix::sys::time::TimeSpec;
    let mut rxbuf = vec![0u8; MAX_DATAGRAM + HEADROOM];
    let mut last_work = std::time::Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.drive(&mut rxbuf) {
            last_work = std::time::Instant::now();
            // Let connection threads at the device lock between rounds.
            std::thread::yield_now();
            continue;
        }
        let spin = std::time::Duration::from_nanos(shared.idle_spin_ns.load(Ordering::Relaxed));
        if last_work.elapsed() < spin {
            std::thread::yield_now();
            continue;
        }
        let deadline = {
            let mut core = shared.lock();
            // Ask for doorbells, then look once more: a client that pushed before it could
            // see the word is found here (see `Ring::set_need_wakeup`).
            Shared::set_asleep(&mut core, true);
            if !core.local_rx.is_empty()
                || core.work.iter().any(WorkRing::waiting)
                || !lock_inbox(&shared.inbox).is_empty()
            {
                Shared::set_asleep(&mut core, false);
                continue;
            }
            // Completions that wait for room in a CQ ring need no timer: the client rings
            // the doorbell when it frees slots (`fill_ring` asked it to).
            core.engine.poll_timeout()
        };
        shared
            .wq_stats
            .progress_sleeps
            .fetch_add(1, Ordering::Relaxed);
        let timeout = deadline
            .map(|t| t.saturating_duration_since(shared.now()))
            .map(TimeSpec::from_duration);
        let mut fds: Vec<PollFd<'_>> = shared
            .socks
            .iter()
            .map(|(_, s)| PollFd::new(s.as_fd(), PollFlags::POLLIN))
            .collect();
        fds.push(PollFd::new(shared.doorbell.as_fd(), PollFlags::POLLIN));
        if let Err(e) = ppoll(&mut fds, timeout, None) {
            if e != nix::errno::Errno::EINTR {
                tracing::warn!(error = %e, "ppoll failed");
            }
        }
        let _ = shared.doorbell.read();
        {
            let mut core = shared.lock();
            Shared::set_asleep(&mut core, false);
            if core.work.iter().any(WorkRing::waiting) {
                shared
                    .wq_stats
                    .doorbell_wakeups
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        last_work = std::time::Instant::now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_device_offers_the_largest_mtu() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(port_mtu(&[lo], Mtu::Mtu4096), Mtu::Mtu4096);
        // Never more than asked for.
        assert_eq!(port_mtu(&[lo], Mtu::Mtu2048), Mtu::Mtu2048);
    }

    #[test]
    fn addresses_on_no_interface_keep_the_configured_mtu() {
        // TEST-NET-1 and -2: on no interface of a test machine.
        let a: IpAddr = "192.0.2.9".parse().unwrap();
        let b: IpAddr = "198.51.100.9".parse().unwrap();
        assert_eq!(port_mtu(&[a, b], Mtu::Mtu1024), Mtu::Mtu1024);
        assert_eq!(port_mtu(&[], Mtu::Mtu4096), Mtu::Mtu4096);
    }

    #[test]
    fn a_started_device_reports_its_links_mtu_in_query_port() {
        let dev = Device::start(
            DeviceConfig {
                name: "srxe-test".into(),
                addrs: vec!["127.0.0.1".parse().unwrap()],
                port: 0,
                remote_port: 0,
            },
            SharedRegions::default(),
        )
        .unwrap();
        let p = dev.read(|e| e.query_port(1)).unwrap();
        assert_eq!(p.active_mtu, Mtu::Mtu4096);
        assert_eq!(p.max_mtu, Mtu::Mtu4096);
    }
}
