//! One daemon device: a [`runtime::Runtime`] over [`ClientMemory`], with the daemon's rings
//! attached.
//!
//! Everything a device does on the network — UDP I/O with batched receive, per-QP source
//! ports, the receive policy, packet capture, ACK scheduling, timers, the idle/spin policy,
//! CQ and async-event notification, same-device and same-process delivery, counters — is
//! the runtime's, exactly as for an embedded device. What the daemon adds is its
//! [`Rings`] attachment:
//!
//! - Work rings ([`crate::wq`]): each connection's rings on the device ring bits of its
//!   doorbell page ([`abi::doorbell`]). At each pass the progress thread takes the bits
//!   that are set (a summary word first, then the words it names) and drains those rings
//!   only (and the rings it must come back to), so a pass costs the rings that have work
//!   plus a look at each connection's summary, however many rings there are. It keeps looking for [`runtime::RuntimeConfig::busy_poll`] after
//!   the last work, so a client posting in a stream never needs a system call. Before it
//!   sleeps it sets every page's sleeping word and looks once more; a client that finds the
//!   word set after setting its bit writes the device's doorbell. Any request on the
//!   control socket takes what waits in the rings first ([`Device::with`]), so a post
//!   followed by a verb on the socket keeps its order.
//! - CQ rings: after every change, completions move into the rings of the CQs that have
//!   one (`fill_ring`): the CQs the engine lists as filled since the last pass
//!   ([`engine::Engine::take_filled_cqs`]) and those whose rings were full, not every CQ.
//!   Each connection that got some then wakes its threads that sleep until completions
//!   come (`abi::doorbell`'s waiting words), if any is counted.
//! - Client memory: reads ahead are forgotten whenever the device lock is taken, and the
//!   writes held back land before any packet leaves or completion is delivered.

use foldhash::{HashMap, HashMapExt};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use engine::{AsyncEvent, CqHandle};
use nix::sys::eventfd::EventFd;
use runtime::{Attachment, Runtime, RuntimeConfig, RxPath, SendEngine};

use crate::memory::{ClientMemory, SharedRegions, WriteBehind};
use crate::wq::{AttachError, ConnRings, Queue, WorkRing, WqStats};
use abi::ring::{Ring, RingError};

/// Which connection of the daemon a device's work rings belong to (numbered by the server).
pub type ConnId = u64;

/// How long the progress thread keeps looking for work after the last it found, unless
/// [`Device::set_busy_poll`] says otherwise.
pub const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(50);

/// Why a device could not start.
pub type HostError = runtime::RuntimeError;

/// How to start a [`Device`].
#[derive(Debug, Clone, Default)]
pub struct DeviceConfig {
    /// Name (`srxe0`...).
    pub name: String,
    /// Local addresses: one socket each, GID table in this order.
    pub addrs: Vec<IpAddr>,
    /// UDP port to receive on (and send from).
    pub port: u16,
    /// UDP port of peers.
    pub remote_port: u16,
    /// Where received packets come from (see `runtime`'s receive policy; softrdmad's default
    /// is [`RxPath::Auto`], the exact check where it may open a raw socket).
    pub rx_path: RxPath,
}

/// The daemon's attachment to its device's runtime: the clients' work and CQ rings, and
/// the client memory's caches.
pub struct Rings {
    /// CQs whose completions go to a shared-memory ring.
    cq_rings: HashMap<CqHandle, CompletionRing>,
    /// CQs with a ring that still have completions to deliver (their rings were full, or
    /// they were just attached), looked at in every pass until they have none.
    unfinished: Vec<CqHandle>,
    /// The CQs one delivery visits (kept to reuse its storage).
    todo: Vec<CqHandle>,
    /// The connections one delivery gave completions (kept to reuse its storage).
    fed: Vec<ConnId>,
    /// The CQs whose arm bits a pass found set (kept to reuse its storage).
    armed: Vec<CqHandle>,
    /// Clients' SQ, RQ and SRQ rings, with their doorbell pages, by connection.
    work: HashMap<ConnId, ConnRings>,
    /// The progress thread sleeps (new doorbell pages start with their sleeping word set).
    asleep: bool,
    stats: Arc<WqStats>,
    /// The engine memory's epoch ([`ClientMemory::epoch`]).
    mem_epoch: Arc<AtomicU64>,
    /// The engine memory's held-back writes ([`ClientMemory::write_behind`]).
    behind: WriteBehind,
}

impl Attachment for Rings {
    const SLEEPS: bool = true;

    fn locked(&mut self) {
        // Whatever came in before this point is served from client memory read after it.
        self.mem_epoch.fetch_add(1, Ordering::Release);
    }

    fn take_work(&mut self, engine: &mut SendEngine) -> usize {
        let (stats, armed) = (&self.stats, &mut self.armed);
        let n: usize = self
            .work
            .values_mut()
            .map(|c| c.take(engine, stats, armed))
            .sum();
        if self.armed.is_empty() {
            n
        } else {
            n + self.arm_rung(engine)
        }
    }

    fn has_work(&self) -> bool {
        self.work.values().any(ConnRings::has_work)
    }

    fn set_asleep(&mut self, asleep: bool) {
        if asleep {
            self.stats.progress_sleeps.fetch_add(1, Ordering::Relaxed);
        } else if self.has_work() {
            self.stats.doorbell_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        self.asleep = asleep;
        for c in self.work.values() {
            c.set_sleeping(asleep);
        }
    }

    fn flush(&mut self) {
        self.behind.flush();
    }

    fn deliver(&mut self, engine: &mut SendEngine) {
        // The CQs that gained completions, and those whose rings were full last time:
        // a pass costs the CQs with something to deliver, not every CQ of the device.
        let mut todo = std::mem::take(&mut self.todo);
        engine.take_filled_cqs(&mut todo);
        for cq in self.unfinished.drain(..) {
            if let Some(c) = self.cq_rings.get_mut(&cq) {
                c.unfinished = false;
            }
            todo.push(cq);
        }
        let mut fed = std::mem::take(&mut self.fed);
        for cq in todo.drain(..) {
            // A CQ without a ring keeps its completions for `PollCq` on the control socket.
            let Some(c) = self.cq_rings.get_mut(&cq) else {
                continue;
            };
            match fill_ring(engine, cq, &mut c.ring) {
                Ok(filled) => {
                    if filled.delivered && !fed.contains(&c.conn) {
                        fed.push(c.conn);
                    }
                    // The ring is full: the client rings the doorbell when it frees slots
                    // (the backlog word), and every pass until then looks again.
                    if filled.full && !c.unfinished {
                        c.unfinished = true;
                        self.unfinished.push(cq);
                    }
                }
                Err(e) => {
                    // The client broke its own ring: detach it; its CQ keeps the completions.
                    tracing::warn!(?cq, error = %e, "CQ ring detached");
                    self.cq_rings.remove(&cq);
                }
            }
        }
        self.todo = todo;
        // The client threads of these connections that sleep until completions come.
        for conn in fed.drain(..) {
            if self.work.get(&conn).is_some_and(ConnRings::wake_waiters) {
                self.stats.completion_wakes.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.fed = fed;
    }
}

/// The daemon's end of a CQ's ring.
struct CompletionRing {
    ring: Ring,
    /// The connection whose CQ it is (whose doorbell page wakes its sleeping pollers).
    conn: ConnId,
    /// The client's arm word last acted on ([`Ring::arm_request`]).
    arm_seen: u32,
    /// Listed in [`Rings::unfinished`].
    unfinished: bool,
}

impl Rings {
    /// Arm the CQs whose arm bits were set, each whose ring's arm word changed since the
    /// last look; returns how many. Completions that reached the ring after the client
    /// armed (it saw an older producer index) fire the arm at once, as do, for an arm of
    /// any completion, those still in the engine.
    fn arm_rung(&mut self, engine: &mut SendEngine) -> usize {
        let mut n = 0;
        for cq in self.armed.drain(..) {
            let Some(c) = self.cq_rings.get_mut(&cq) else {
                continue;
            };
            let (word, since) = c.ring.arm_request();
            if word == c.arm_seen {
                continue;
            }
            c.arm_seen = word;
            let solicited_only = word & abi::ring::ARM_SOLICITED != 0;
            if engine.arm_cq(cq, solicited_only, since != 0).is_ok() {
                n += 1;
            }
        }
        self.stats.ring_arms.fetch_add(n as u64, Ordering::Relaxed);
        n
    }
}

/// One soft RNIC served by the daemon. Dropping it stops its progress thread.
pub struct Device {
    /// Its name.
    pub name: String,
    /// Its addresses.
    pub addrs: Vec<IpAddr>,
    /// The UDP port it receives on.
    pub port: u16,
    rt: Runtime<Rings>,
    stats: Arc<WqStats>,
    behind: WriteBehind,
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

/// Let the devices of one daemon hand each other the packets addressed to one another
/// instead of sending them as UDP. Call once, after every device started.
pub fn link_devices(devices: &[Device]) {
    let rts: Vec<&Runtime<Rings>> = devices.iter().map(|d| &d.rt).collect();
    runtime::link(&rts);
}

impl Device {
    /// Bind the sockets, build the engine over client memory and start the progress thread.
    pub fn start(config: DeviceConfig, regions: SharedRegions) -> Result<Device, HostError> {
        let Some(&first) = config.addrs.first() else {
            return Err(HostError::Io {
                what: "a device needs an address",
                source: std::io::ErrorKind::InvalidInput.into(),
            });
        };
        let mut rc = RuntimeConfig::new(first);
        rc.extra_addrs = config.addrs[1..].to_vec();
        rc.name = Some(config.name.clone());
        rc.port = config.port;
        rc.remote_port = config.remote_port;
        rc.rx_path = config.rx_path;
        rc.busy_poll = DEFAULT_BUSY_POLL;
        // softrdmad's polling is its own fixed knob (`--busy-poll-us`, 0: sleep at once).
        rc.adaptive_poll = Duration::ZERO;
        // QPs of this device talking to each other never leave the process.
        rc.internal_paths = true;
        let memory = ClientMemory::new(regions);
        let stats = Arc::new(WqStats::default());
        let behind = memory.write_behind();
        let rings = Rings {
            cq_rings: HashMap::new(),
            unfinished: Vec::new(),
            todo: Vec::new(),
            fed: Vec::new(),
            armed: Vec::new(),
            work: HashMap::new(),
            asleep: false,
            stats: stats.clone(),
            mem_epoch: memory.epoch(),
            behind: memory.write_behind(),
        };
        let rt = Runtime::start_hosted(rc, Box::new(memory), rings)?;
        Ok(Device {
            name: config.name,
            addrs: rt.addrs().to_vec(),
            port: rt.local_addr().port(),
            rt,
            stats,
            behind,
        })
    }

    /// Run `f` on the engine under the device lock, then send what it queued and deliver
    /// what it completed. What waits in the work rings goes into the engine first, so a
    /// verb sees every post made before it.
    pub fn with<R>(&self, f: impl FnOnce(&mut SendEngine) -> R) -> R {
        let mut g = self.rt.lock();
        g.take_work();
        f(&mut g)
    }

    /// Run `f` with the device's runtime locked, for its connection manager's calls (after
    /// taking what waits in the work rings, so that a connection sees every earlier post).
    pub fn cm<R>(&self, f: impl FnOnce(&mut runtime::EngineGuard<'_, Rings>) -> R) -> R {
        let mut g = self.rt.lock();
        g.take_work();
        f(&mut g)
    }

    /// Run `f` on the engine under the device lock, for reads that change nothing (after
    /// taking what waits in the work rings, so that a read sees every earlier post).
    pub fn read<R>(&self, f: impl FnOnce(&SendEngine) -> R) -> R {
        let mut g = self.rt.lock();
        g.take_work();
        f(&g)
    }

    /// Deliver `cq`'s completions into `ring` from now on (those already queued first); the
    /// CQ is connection `conn`'s.
    pub fn attach_ring(
        &self,
        conn: ConnId,
        cq: CqHandle,
        ring: Ring,
    ) -> Result<(), engine::VerbsError> {
        let mut g = self.rt.lock();
        g.cq_len(cq)?;
        let rings = g.attachment_mut();
        rings.cq_rings.insert(
            cq,
            CompletionRing {
                ring,
                conn,
                arm_seen: 0,
                // What the CQ holds already goes into the ring at the next pass.
                unfinished: true,
            },
        );
        rings.unfinished.push(cq);
        Ok(())
    }

    /// Let connection `conn` arm `cq` through its ring (which it must have): returns the
    /// CQ's bit in the connection's doorbell page.
    pub fn attach_cq_arm(&self, conn: ConnId, cq: CqHandle) -> Result<u32, AttachError> {
        let mut g = self.rt.lock();
        let rings = g.attachment_mut();
        if !rings.cq_rings.contains_key(&cq) {
            return Err(AttachError::NoCqRing);
        }
        let c = rings.work.get_mut(&conn).ok_or(AttachError::NoPage)?;
        if c.has(Queue::CqArm { cq }) {
            return Err(AttachError::Twice);
        }
        c.attach_arm(cq)
    }

    /// Stop delivering `cq`'s completions into a ring, and forget its arm bit in
    /// connection `conn`'s doorbell page (before destroying the CQ).
    pub fn detach_ring(&self, conn: ConnId, cq: CqHandle) {
        let mut g = self.rt.lock();
        let rings = g.attachment_mut();
        rings.cq_rings.remove(&cq);
        if let Some(c) = rings.work.get_mut(&conn) {
            c.detach(Queue::CqArm { cq });
        }
    }

    /// Whether `cq` delivers into a ring.
    pub fn has_ring(&self, cq: CqHandle) -> bool {
        self.rt.lock().attachment().cq_rings.contains_key(&cq)
    }

    /// A completion channel for `cq`: an eventfd the device signals whenever an armed
    /// notification of the CQ fires. Returns a descriptor of it to hand to the client.
    pub fn channel(&self, cq: CqHandle) -> Result<std::os::fd::OwnedFd, HostError> {
        use std::os::fd::AsFd;
        let n = self.rt.cq_notifier(cq)?;
        n.as_fd()
            .try_clone_to_owned()
            .map_err(|source| HostError::Io {
                what: "dup",
                source,
            })
    }

    /// Arm `cq`'s notification (`ibv_req_notify_cq`); its channel is signalled at once if
    /// the CQ already holds completions ("arm, then wait" must not sleep through
    /// completions that came first).
    pub fn arm_cq(&self, cq: CqHandle, solicited_only: bool) -> Result<(), HostError> {
        self.rt.lock().take_work();
        self.rt.arm_cq_with(cq, solicited_only)
    }

    /// Forget `cq`'s completion channel (before destroying the CQ).
    pub fn drop_channel(&self, cq: CqHandle) {
        self.rt.lock().forget_notifier(cq);
    }

    /// Signal `channel` whenever this device raises an asynchronous event, for as long as
    /// it lives.
    pub fn add_event_channel(&self, channel: &Arc<EventFd>) {
        self.rt.add_event_listener(channel);
    }

    /// Take the asynchronous events `mine` recognizes, oldest first, acknowledging them;
    /// the others stay for their owners (see [`Runtime::take_events`]).
    pub fn take_events<T>(&self, mine: impl Fn(&AsyncEvent) -> Option<T>) -> Vec<T> {
        self.rt.take_events(mine)
    }

    /// Drop the events `gone` recognizes (their objects are being reclaimed with no client
    /// left to take them), acknowledging them so the objects can be destroyed.
    pub fn discard_events(&self, gone: impl Fn(&AsyncEvent) -> bool) {
        self.rt.discard_events(gone)
    }

    /// Connection `conn`'s doorbell page on this device (made on the first call), to hand
    /// to the client.
    pub fn doorbell_page(&self, conn: ConnId) -> Result<std::os::fd::OwnedFd, RingError> {
        let mut g = self.rt.lock();
        let rings = g.attachment_mut();
        let asleep = rings.asleep;
        let c = match rings.work.entry(conn) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let c = ConnRings::new()?;
                // Under the lock the progress thread sets and clears every page's word: a
                // page made while it sleeps asks for doorbells from the start.
                c.set_sleeping(asleep);
                e.insert(c)
            }
        };
        c.page_fd().map_err(|source| RingError::Io {
            what: "dup",
            source,
        })
    }

    /// Take posts for `ring`'s queue from it from now on, a ring of connection `conn`;
    /// returns its bit in the connection's doorbell page.
    pub fn attach_work_ring(&self, conn: ConnId, ring: WorkRing) -> Result<u32, AttachError> {
        let mut g = self.rt.lock();
        let c = g
            .attachment_mut()
            .work
            .get_mut(&conn)
            .ok_or(AttachError::NoPage)?;
        c.attach(ring)
    }

    /// Stop taking posts for `queue`, a queue of connection `conn` (before destroying its QP
    /// or SRQ). Returns whether it had a ring.
    pub fn detach_work_ring(&self, conn: ConnId, queue: Queue) -> bool {
        let mut g = self.rt.lock();
        g.attachment_mut()
            .work
            .get_mut(&conn)
            .is_some_and(|c| c.detach(queue))
    }

    /// Forget connection `conn`'s doorbell page and every work ring it still has here (the
    /// connection ended: what the rings still hold is never posted). Returns how many
    /// rings went.
    pub fn close_doorbell_page(&self, conn: ConnId) -> usize {
        let mut g = self.rt.lock();
        g.attachment_mut().work.remove(&conn).map_or(0, |c| c.len())
    }

    /// Whether a work ring of `queue` (of connection `conn`) holds back a WQE for room in
    /// the engine (a post by request would overtake it).
    pub fn backlogged(&self, conn: ConnId, queue: Queue) -> bool {
        let g = self.rt.lock();
        g.attachment()
            .work
            .get(&conn)
            .and_then(|c| c.ring(queue))
            .is_some_and(WorkRing::backlogged)
    }

    /// Whether a work ring feeds `queue` (of connection `conn`).
    pub fn has_work_ring(&self, conn: ConnId, queue: Queue) -> bool {
        let g = self.rt.lock();
        g.attachment()
            .work
            .get(&conn)
            .is_some_and(|c| c.ring(queue).is_some())
    }

    /// The device's doorbell, to hand to a client: writing it wakes the progress thread.
    pub fn doorbell(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        self.rt.doorbell().try_clone_to_owned()
    }

    /// How long the progress thread keeps looking for work after the last it found before
    /// it sleeps (zero: sleep at once).
    pub fn set_busy_poll(&self, d: Duration) {
        self.rt.set_busy_poll(d);
    }

    /// The runtime hosting this device (capture, counters).
    pub fn runtime(&self) -> &Runtime<Rings> {
        &self.rt
    }

    /// The host's own counters of this device: the socket layer and its bypasses, work
    /// rings, doorbells, held-back writes.
    pub fn host_counters(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<(&'static str, u64)> = self.rt.io_counters().named().to_vec();
        v.extend(self.stats.snapshot());
        v.extend(self.rt.cm_counters().named());
        v.push((
            "live_work_rings",
            self.rt
                .lock()
                .attachment()
                .work
                .values()
                .map(|c| c.len() as u64)
                .sum(),
        ));
        v.push(("held_back_writes_failed", self.behind.failed()));
        v
    }
}

/// What [`fill_ring`] did.
#[derive(Debug, Clone, Copy, Default)]
struct Filled {
    /// It published completions (the client may be waiting for them).
    delivered: bool,
    /// Completions are left that the ring had no room for.
    full: bool,
}

/// Move as many of `cq`'s completions into its ring as fit. Those that do not fit wait in
/// the CQ, and the ring's backlog word asks the client to ring the device's doorbell when it
/// frees slots (so the progress thread may sleep meanwhile).
fn fill_ring(engine: &mut SendEngine, cq: CqHandle, ring: &mut Ring) -> Result<Filled, RingError> {
    let mut filled = Filled::default();
    loop {
        if engine.cq_len(cq).map_or(true, |n| n == 0) {
            ring.set_backlog(false);
            return Ok(filled);
        }
        let free = ring.free()? as usize;
        if free > 0 {
            // Straight from the engine's queue into the ring: delivering completions
            // allocates and stages nothing.
            // A completion the ring does not take (the client broke its ring) stays in the
            // engine's queue.
            let mut broken = None;
            let n = engine
                .poll_cq_with(cq, free, |c| {
                    // `free` slots were checked above and only this thread (under the lock)
                    // produces.
                    match ring.stage(abi::wqe::Cqe::of(c).bytes()) {
                        Ok(pushed) => pushed,
                        Err(e) => {
                            broken = Some(e);
                            false
                        }
                    }
                })
                .unwrap_or(0);
            // The batch becomes the client's with one store of the index it polls.
            ring.publish();
            filled.delivered |= n > 0;
            if let Some(e) = broken {
                return Err(e);
            }
            if n == 0 {
                // Not expected while `cq_len` counts some; never loop on it (the next
                // pass tries again).
                filled.full = true;
                return Ok(filled);
            }
            continue;
        }
        // Full with completions left: ask for a doorbell, then look once more (a client
        // that popped before it could see the word did not ring; see `Ring::set_backlog`).
        ring.set_backlog(true);
        if ring.free()? == 0 {
            filled.full = true;
            return Ok(filled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::qp_attr::Mtu;

    #[test]
    fn a_started_device_reports_its_links_mtu_in_query_port() {
        let dev = Device::start(
            DeviceConfig {
                name: "srxe-test".into(),
                addrs: vec!["127.0.0.1".parse().unwrap()],
                ..Default::default()
            },
            SharedRegions::default(),
        )
        .unwrap();
        let p = dev.read(|e| e.query_port(1)).unwrap();
        assert_eq!(p.active_mtu, Mtu::Mtu4096);
        assert_eq!(p.max_mtu, Mtu::Mtu4096);
    }
}
