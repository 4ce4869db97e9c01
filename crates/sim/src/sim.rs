//! The simulator: nodes, a virtual clock, an event queue and a faulty network between them.

use core::cmp::Reverse;
use core::fmt;
use core::time::Duration;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::IpAddr;

use crate::net::{DropReason, LinkConfig, NetConfig, Stats};
use crate::rng::Rng;

/// A packet a node wants to send: the bytes are `buf[..len]` of the buffer given to
/// [`Node::poll_transmit`], and they form a whole IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Number of bytes written into the buffer.
    pub len: usize,
    /// Address of the node the packet goes to.
    pub dst: IpAddr,
}

/// Something the simulator can drive: a sans-IO protocol endpoint.
///
/// Time is the virtual time since the simulation started. The simulator calls
/// [`Node::poll_transmit`] until it returns `None` after every other call into the node.
pub trait Node {
    /// Hands the node one packet (a whole IP packet, possibly corrupted by the network).
    fn handle_datagram(&mut self, now: Duration, packet: &[u8]);
    /// Tells the node that the time it asked for with [`Node::poll_timeout`] has come.
    fn handle_timeout(&mut self, now: Duration);
    /// Asks the node for the next packet to send, written into `buf`.
    fn poll_transmit(&mut self, now: Duration, buf: &mut [u8]) -> Option<Transmit>;
    /// Returns the earliest virtual time at which the node wants `handle_timeout`, if any.
    fn poll_timeout(&self) -> Option<Duration>;
}

impl<N: Node + ?Sized> Node for Box<N> {
    fn handle_datagram(&mut self, now: Duration, packet: &[u8]) {
        (**self).handle_datagram(now, packet)
    }
    fn handle_timeout(&mut self, now: Duration) {
        (**self).handle_timeout(now)
    }
    fn poll_transmit(&mut self, now: Duration, buf: &mut [u8]) -> Option<Transmit> {
        (**self).poll_transmit(now, buf)
    }
    fn poll_timeout(&self) -> Option<Duration> {
        (**self).poll_timeout()
    }
}

/// Index of a node in a [`Sim`], in the order the nodes were added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(usize);

impl NodeId {
    /// The position of the node in the order of `add_node` calls (0-based).
    pub fn index(self) -> usize {
        self.0
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node{}", self.0)
    }
}

/// Why [`Sim::run_until`] (or [`Sim::advance_to`]) stopped without the condition becoming true.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The virtual deadline passed before the condition held.
    #[error("deadline reached at virtual time {now:?} before the condition held")]
    Deadline {
        /// Virtual time when the run stopped.
        now: Duration,
    },
    /// Nothing is in flight and no node has a timeout: the condition can never become true.
    #[error("simulation idle at virtual time {now:?} (no packets in flight, no timeouts)")]
    Idle {
        /// Virtual time when the run stopped.
        now: Duration,
    },
    /// Too many events happened without virtual time moving (a node keeps asking for a
    /// timeout that is already due, or keeps transmitting).
    #[error("livelock at virtual time {now:?}: {events} events without time advancing")]
    Livelock {
        /// Virtual time that did not advance.
        now: Duration,
        /// Events processed at that instant.
        events: u64,
    },
}

/// What happened to a packet, as reported to a trace hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceKind {
    /// A node handed the packet to the network (bytes as sent).
    Sent,
    /// The packet reached its destination node (bytes as delivered).
    Delivered {
        /// Whether the network flipped bits in this copy.
        corrupted: bool,
    },
    /// The network dropped the packet.
    Dropped(DropReason),
    /// A node's timeout fired (no packet).
    Timeout,
}

/// One event reported to the trace hook set with [`Sim::set_trace`].
#[derive(Debug, Clone, Copy)]
pub struct TraceEvent<'a> {
    /// Virtual time of the event.
    pub time: Duration,
    /// What happened.
    pub kind: TraceKind,
    /// Sending node (`None` for timeouts).
    pub from: Option<NodeId>,
    /// Receiving node (`None` when the destination is unknown).
    pub to: Option<NodeId>,
    /// The packet bytes (empty for timeouts).
    pub packet: &'a [u8],
}

/// Callback that sees every packet event, e.g. to write a pcap.
pub type TraceHook = Box<dyn FnMut(&TraceEvent<'_>)>;

/// A packet offered to the test's filter, which may inspect and rewrite it.
#[derive(Debug)]
pub struct Filtered<'a> {
    /// Virtual time of the send.
    pub time: Duration,
    /// Sending node.
    pub from: NodeId,
    /// Receiving node.
    pub to: NodeId,
    /// The packet as sent; the filter may change it (the receiver sees the change).
    pub packet: &'a mut Vec<u8>,
}

/// What a filter decides about a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Hand the packet (possibly rewritten) to the network and its faults.
    Pass,
    /// Drop it (counted as [`DropReason::Filter`]).
    Drop,
}

/// Callback that sees every routed packet before the network's faults, to drop or rewrite
/// chosen packets in focused tests ("lose the third response").
pub type FilterHook = Box<dyn FnMut(Filtered<'_>) -> Verdict>;

struct Slot<N> {
    addrs: Vec<IpAddr>,
    node: N,
    /// Touched from outside (`node_mut`) since its transmits were last collected.
    dirty: bool,
}

struct Scheduled {
    at: Duration,
    seq: u64,
    from: NodeId,
    to: NodeId,
    link_seq: u64,
    corrupted: bool,
    packet: Vec<u8>,
}

/// Packets in flight, ordered by arrival time and then by the global sequence number (so
/// packets due at the same instant arrive in the order they were sent). The heap holds small
/// keys; the packets sit in a slab, so sifting moves 24 bytes, not whole packets.
#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<(Duration, u64, usize)>>,
    slab: Vec<Option<Scheduled>>,
    free: Vec<usize>,
}

impl Queue {
    fn push(&mut self, ev: Scheduled) {
        let key = (ev.at, ev.seq);
        let slot = match self.free.pop() {
            Some(i) => {
                self.slab[i] = Some(ev);
                i
            }
            None => {
                self.slab.push(Some(ev));
                self.slab.len() - 1
            }
        };
        self.heap.push(Reverse((key.0, key.1, slot)));
    }

    fn peek_at(&self) -> Option<Duration> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    fn pop(&mut self) -> Option<Scheduled> {
        let Reverse((_, _, slot)) = self.heap.pop()?;
        self.free.push(slot);
        self.slab.get_mut(slot).and_then(Option::take)
    }

    fn len(&self) -> usize {
        self.heap.len()
    }
}

#[derive(Default)]
struct LinkState {
    next_seq: u64,
    max_delivered: Option<u64>,
    busy_until: Duration,
    /// Arrival time of the latest packet that kept its place (FIFO links).
    last_arrival: Duration,
}

/// A partition window between two nodes: cut from `start` until `end` (forever if `None`).
#[derive(Debug, Clone, Copy)]
struct Cut {
    start: Duration,
    end: Option<Duration>,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// A deterministic simulation of nodes exchanging packets over a faulty network.
///
/// Everything random comes from one seeded [`Rng`], events at the same instant are ordered by
/// sequence number, and nodes are polled in `NodeId` order, so the same seed and the same node
/// behaviour give the same run, event for event (see [`Sim::trace_hash`]).
pub struct Sim<N> {
    now: Duration,
    rng: Rng,
    cfg: NetConfig,
    nodes: Vec<Slot<N>>,
    routes: BTreeMap<IpAddr, NodeId>,
    links: BTreeMap<(NodeId, NodeId), LinkConfig>,
    cuts: BTreeMap<(NodeId, NodeId), Vec<Cut>>,
    link_state: BTreeMap<(NodeId, NodeId), LinkState>,
    queue: Queue,
    seq: u64,
    stats: Stats,
    hash: u64,
    trace: Option<TraceHook>,
    filter: Option<FilterHook>,
    buf: Vec<u8>,
    instant_events: u64,
}

impl<N> fmt::Debug for Sim<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("now", &self.now)
            .field("nodes", &self.nodes.len())
            .field("in_flight", &self.queue.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn pair(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<N: Node> Sim<N> {
    /// Creates an empty simulation at virtual time zero whose randomness all comes from `seed`.
    pub fn new(seed: u64, cfg: NetConfig) -> Self {
        let buf = vec![0; cfg.max_packet];
        Sim {
            now: Duration::ZERO,
            rng: Rng::new(seed),
            cfg,
            nodes: Vec::new(),
            routes: BTreeMap::new(),
            links: BTreeMap::new(),
            cuts: BTreeMap::new(),
            link_state: BTreeMap::new(),
            queue: Queue::default(),
            seq: 0,
            stats: Stats::default(),
            hash: FNV_OFFSET,
            trace: None,
            filter: None,
            buf,
            instant_events: 0,
        }
    }

    /// Adds a node reachable at each of `addrs` and returns its id.
    ///
    /// # Panics
    /// If an address already belongs to another node (a test setup mistake).
    pub fn add_node(&mut self, addrs: impl IntoIterator<Item = IpAddr>, node: N) -> NodeId {
        let id = NodeId(self.nodes.len());
        let addrs: Vec<IpAddr> = addrs.into_iter().collect();
        for a in &addrs {
            if let Some(other) = self.routes.insert(*a, id) {
                panic!("address {a} given to {id} already belongs to {other}");
            }
        }
        self.nodes.push(Slot {
            addrs,
            node,
            dirty: true,
        });
        id
    }

    /// Shared access to a node.
    ///
    /// # Panics
    /// If `id` did not come from this simulation.
    pub fn node(&self, id: NodeId) -> &N {
        &self.nodes[id.0].node
    }

    /// Mutable access to a node (e.g. to post work); its transmits are polled on the next step.
    ///
    /// # Panics
    /// If `id` did not come from this simulation.
    pub fn node_mut(&mut self, id: NodeId) -> &mut N {
        let slot = &mut self.nodes[id.0];
        slot.dirty = true;
        &mut slot.node
    }

    /// The addresses a node was added with.
    pub fn addrs(&self, id: NodeId) -> &[IpAddr] {
        &self.nodes[id.0].addrs
    }

    /// The node that owns `addr`, if any.
    pub fn node_of(&self, addr: IpAddr) -> Option<NodeId> {
        self.routes.get(&addr).copied()
    }

    /// Ids of all nodes, in the order they were added.
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len()).map(NodeId)
    }

    /// Current virtual time.
    pub fn now(&self) -> Duration {
        self.now
    }

    /// The simulation's random generator (drawing from it changes the rest of the run, but
    /// deterministically).
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// Network counters so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// A hash of every delivery and timeout so far (time, nodes, bytes): equal hashes mean the
    /// runs were the same event for event.
    pub fn trace_hash(&self) -> u64 {
        self.hash
    }

    /// Sets a hook that sees every packet event (send, delivery, drop) and timeout.
    pub fn set_trace(&mut self, hook: TraceHook) {
        self.trace = Some(hook);
    }

    /// Removes the trace hook.
    pub fn clear_trace(&mut self) {
        self.trace = None;
    }

    /// Sets a filter that sees every routed packet before partitions and faults apply, and may
    /// drop or rewrite it.
    pub fn set_filter(&mut self, filter: FilterHook) {
        self.filter = Some(filter);
    }

    /// Removes the packet filter.
    pub fn clear_filter(&mut self) {
        self.filter = None;
    }

    /// Delivers `packet` to `to` as if `from` had sent it now, after the link's fixed delay,
    /// bypassing the filter, partitions and faults (e.g. a forged or replayed packet).
    pub fn inject(&mut self, from: NodeId, to: NodeId, packet: Vec<u8>) {
        self.stats.injected += 1;
        let at = self.now + self.link(from, to).delay;
        let state = self.link_state.entry((from, to)).or_default();
        let link_seq = state.next_seq;
        state.next_seq += 1;
        let seq = self.seq;
        self.seq += 1;
        self.queue.push(Scheduled {
            at,
            seq,
            from,
            to,
            link_seq,
            corrupted: false,
            packet,
        });
    }

    /// Packets in flight (sent, not yet delivered or dropped).
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }

    /// The default settings used by links without an override.
    pub fn default_link(&self) -> &LinkConfig {
        &self.cfg.link
    }

    /// Replaces the default settings for links without an override (applies to packets sent
    /// from now on).
    pub fn set_default_link(&mut self, link: LinkConfig) {
        self.cfg.link = link;
    }

    /// Overrides the settings of the directed link `from -> to`.
    pub fn set_link(&mut self, from: NodeId, to: NodeId, link: LinkConfig) {
        self.links.insert((from, to), link);
    }

    /// Overrides the settings of both directions between `a` and `b`.
    pub fn set_link_pair(&mut self, a: NodeId, b: NodeId, link: LinkConfig) {
        self.links.insert((a, b), link.clone());
        self.links.insert((b, a), link);
    }

    /// Removes the override of the directed link `from -> to`.
    pub fn clear_link(&mut self, from: NodeId, to: NodeId) {
        self.links.remove(&(from, to));
    }

    /// The settings in force on the directed link `from -> to`.
    pub fn link(&self, from: NodeId, to: NodeId) -> &LinkConfig {
        self.links.get(&(from, to)).unwrap_or(&self.cfg.link)
    }

    /// Cuts `a` and `b` apart (both directions) from now until [`Sim::heal`].
    ///
    /// Packets sent while cut, or arriving while cut, are dropped.
    pub fn partition(&mut self, a: NodeId, b: NodeId) {
        let now = self.now;
        self.partition_window(a, b, now, None);
    }

    /// Cuts `a` and `b` apart from `start` until `end` (forever if `None`), in virtual time.
    pub fn partition_window(
        &mut self,
        a: NodeId,
        b: NodeId,
        start: Duration,
        end: Option<Duration>,
    ) {
        self.cuts
            .entry(pair(a, b))
            .or_default()
            .push(Cut { start, end });
    }

    /// Ends every partition between `a` and `b` that is still open now.
    pub fn heal(&mut self, a: NodeId, b: NodeId) {
        let now = self.now;
        self.heal_at(a, b, now);
    }

    /// Ends, at virtual time `at`, every partition between `a` and `b` still open then.
    pub fn heal_at(&mut self, a: NodeId, b: NodeId, at: Duration) {
        if let Some(cuts) = self.cuts.get_mut(&pair(a, b)) {
            for c in cuts.iter_mut() {
                if c.end.is_none_or(|e| e > at) {
                    c.end = Some(at.max(c.start));
                }
            }
        }
    }

    /// Cuts `a` off from every other node until [`Sim::rejoin`].
    pub fn isolate(&mut self, a: NodeId) {
        for b in self.node_ids().collect::<Vec<_>>() {
            if b != a {
                self.partition(a, b);
            }
        }
    }

    /// Heals every partition between `a` and the other nodes.
    pub fn rejoin(&mut self, a: NodeId) {
        for b in self.node_ids().collect::<Vec<_>>() {
            if b != a {
                self.heal(a, b);
            }
        }
    }

    /// Whether `a` and `b` are cut apart at virtual time `t`.
    pub fn is_partitioned_at(&self, a: NodeId, b: NodeId, t: Duration) -> bool {
        self.cuts.get(&pair(a, b)).is_some_and(|cs| {
            cs.iter()
                .any(|c| c.start <= t && c.end.is_none_or(|e| t < e))
        })
    }

    /// Whether `a` and `b` are cut apart now.
    pub fn is_partitioned(&self, a: NodeId, b: NodeId) -> bool {
        self.is_partitioned_at(a, b, self.now)
    }

    /// The virtual time of the next event (packet delivery or timeout), after collecting any
    /// packets the nodes have waiting.
    pub fn next_event_time(&mut self) -> Option<Duration> {
        self.flush_all();
        let packet = self.queue.peek_at();
        let timeout = self.earliest_timeout().map(|(t, _)| t);
        match (packet, timeout) {
            (Some(p), Some(t)) => Some(p.min(t).max(self.now)),
            (p, t) => p.or(t).map(|x| x.max(self.now)),
        }
    }

    /// Processes the next event: delivers the earliest packet or fires the earliest timeout
    /// (a packet wins a tie, then the lowest `NodeId`). Returns false when there is nothing left
    /// to do (idle).
    pub fn step(&mut self) -> bool {
        self.flush_all();
        let packet_at = self.queue.peek_at();
        let timeout = self.earliest_timeout();
        let take_packet = match (packet_at, timeout) {
            (None, None) => return false,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(p), Some((t, _))) => p <= t,
        };
        if take_packet {
            // The heap was just peeked non-empty.
            let Some(ev) = self.queue.pop() else {
                return false;
            };
            self.advance_clock(ev.at);
            self.deliver(ev);
        } else if let Some((t, id)) = timeout {
            self.advance_clock(t);
            self.stats.timeouts += 1;
            self.hash_event(2, None, Some(id), &[]);
            let now = self.now;
            if let Some(hook) = self.trace.as_mut() {
                hook(&TraceEvent {
                    time: now,
                    kind: TraceKind::Timeout,
                    from: None,
                    to: Some(id),
                    packet: &[],
                });
            }
            self.nodes[id.0].node.handle_timeout(now);
            self.drain(id);
        }
        true
    }

    /// Runs until `cond` holds, checking it before every event.
    ///
    /// `deadline` is an absolute virtual time: when the next event lies beyond it, the clock is
    /// set to `deadline` and [`SimError::Deadline`] is returned. [`SimError::Idle`] means nothing
    /// can happen any more; [`SimError::Livelock`] that time stopped advancing.
    pub fn run_until(
        &mut self,
        mut cond: impl FnMut(&mut Self) -> bool,
        deadline: Duration,
    ) -> Result<(), SimError> {
        loop {
            if cond(self) {
                return Ok(());
            }
            self.check_livelock()?;
            let next = self.next_event_time();
            // Collecting transmits calls into the nodes, which may have changed what the
            // condition looks at (e.g. a local error completing a WR): look again.
            if cond(self) {
                return Ok(());
            }
            match next {
                None => return Err(SimError::Idle { now: self.now }),
                Some(t) if t > deadline => {
                    self.now = self.now.max(deadline);
                    return Err(SimError::Deadline { now: self.now });
                }
                Some(_) => {
                    self.step();
                }
            }
        }
    }

    /// Processes every event due at or before the absolute virtual time `t`, then sets the clock
    /// to `t` (if it is later). Running out of events is not an error here.
    pub fn advance_to(&mut self, t: Duration) -> Result<(), SimError> {
        loop {
            self.check_livelock()?;
            match self.next_event_time() {
                Some(next) if next <= t => {
                    self.step();
                }
                _ => break,
            }
        }
        self.now = self.now.max(t);
        Ok(())
    }

    /// Like [`Sim::advance_to`], for a span of virtual time from now.
    pub fn advance(&mut self, by: Duration) -> Result<(), SimError> {
        let t = self.now + by;
        self.advance_to(t)
    }

    fn check_livelock(&self) -> Result<(), SimError> {
        if self.instant_events > self.cfg.max_events_per_instant {
            return Err(SimError::Livelock {
                now: self.now,
                events: self.instant_events,
            });
        }
        Ok(())
    }

    fn advance_clock(&mut self, t: Duration) {
        if t > self.now {
            self.now = t;
            self.instant_events = 0;
        }
        self.instant_events += 1;
    }

    fn earliest_timeout(&self) -> Option<(Duration, NodeId)> {
        let mut best: Option<(Duration, NodeId)> = None;
        for (i, slot) in self.nodes.iter().enumerate() {
            if let Some(t) = slot.node.poll_timeout() {
                // A timeout already in the past fires now: virtual time never goes backwards.
                let t = t.max(self.now);
                if best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, NodeId(i)));
                }
            }
        }
        best
    }

    /// Collects the transmits of every node touched from outside since the last collection
    /// (a node the sim itself called into was drained right after the call).
    fn flush_all(&mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].dirty {
                self.nodes[i].dirty = false;
                self.drain(NodeId(i));
            }
        }
    }

    /// Collects every packet `id` has to send now and puts it on the network.
    fn drain(&mut self, id: NodeId) {
        let mut buf = core::mem::take(&mut self.buf);
        loop {
            if self.instant_events > self.cfg.max_events_per_instant {
                break;
            }
            let now = self.now;
            let Some(tx) = self.nodes[id.0].node.poll_transmit(now, &mut buf) else {
                break;
            };
            self.instant_events += 1;
            let len = tx.len.min(buf.len());
            self.send(id, tx.dst, &buf[..len]);
        }
        self.buf = buf;
    }

    fn trace_packet(
        &mut self,
        kind: TraceKind,
        from: Option<NodeId>,
        to: Option<NodeId>,
        packet: &[u8],
    ) {
        let time = self.now;
        if let Some(hook) = self.trace.as_mut() {
            hook(&TraceEvent {
                time,
                kind,
                from,
                to,
                packet,
            });
        }
    }

    fn send(&mut self, from: NodeId, dst: IpAddr, bytes: &[u8]) {
        self.stats.sent += 1;
        let Some(to) = self.node_of(dst) else {
            self.trace_packet(TraceKind::Sent, Some(from), None, bytes);
            self.stats.dropped_unroutable += 1;
            self.trace_packet(
                TraceKind::Dropped(DropReason::Unroutable),
                Some(from),
                None,
                bytes,
            );
            return;
        };
        self.trace_packet(TraceKind::Sent, Some(from), Some(to), bytes);
        let mut rewritten: Option<Vec<u8>> = None;
        if let Some(filter) = self.filter.as_mut() {
            let mut packet = bytes.to_vec();
            let verdict = filter(Filtered {
                time: self.now,
                from,
                to,
                packet: &mut packet,
            });
            if verdict == Verdict::Drop {
                self.stats.dropped_filter += 1;
                self.trace_packet(
                    TraceKind::Dropped(DropReason::Filter),
                    Some(from),
                    Some(to),
                    bytes,
                );
                return;
            }
            if packet != bytes {
                rewritten = Some(packet);
            }
        }
        let bytes: &[u8] = rewritten.as_deref().unwrap_or(bytes);
        if self.is_partitioned(from, to) {
            self.stats.dropped_partition += 1;
            self.trace_packet(
                TraceKind::Dropped(DropReason::Partition),
                Some(from),
                Some(to),
                bytes,
            );
            return;
        }
        let link = self.link(from, to).clone();
        if self.rng.chance(link.loss) {
            self.stats.dropped_loss += 1;
            self.trace_packet(
                TraceKind::Dropped(DropReason::Loss),
                Some(from),
                Some(to),
                bytes,
            );
            return;
        }
        let copies = if self.rng.chance(link.duplicate) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        let now = self.now;
        let state = self.link_state.entry((from, to)).or_default();
        let link_seq = state.next_seq;
        state.next_seq += 1;
        // Serialization: the packet leaves once the link has finished sending earlier packets.
        let departure = match link.bandwidth_bps {
            Some(bps) if bps > 0 => {
                let bits = (bytes.len() as u128) * 8;
                let tx_ns =
                    u64::try_from(bits * 1_000_000_000 / u128::from(bps)).unwrap_or(u64::MAX);
                let start = state.busy_until.max(now);
                state.busy_until = start + Duration::from_nanos(tx_ns);
                state.busy_until
            }
            _ => now,
        };
        for _ in 0..copies {
            let mut packet = bytes.to_vec();
            let corrupted = self.rng.chance(link.corrupt);
            if corrupted {
                self.stats.corrupted += 1;
                let nbits = self
                    .rng
                    .range_inclusive(1, u64::from(link.corrupt_max_bits.max(1)));
                let total_bits = packet.len() as u64 * 8;
                // Distinct positions, so a corrupted packet always differs in exactly `nbits`
                // bits (a bit flipped twice would undo the corruption).
                let mut chosen: Vec<u64> = Vec::new();
                while (chosen.len() as u64) < nbits.min(total_bits) {
                    let bit = self.rng.below(total_bits);
                    if !chosen.contains(&bit) {
                        chosen.push(bit);
                        packet[(bit / 8) as usize] ^= 1 << (bit % 8);
                    }
                }
            }
            let jitter = self.rng.range_inclusive(0, nanos(link.jitter));
            let reorder = self.rng.chance(link.reorder);
            let extra = if reorder {
                self.stats.delayed += 1;
                self.rng.range_inclusive(0, nanos(link.reorder_delay))
            } else {
                0
            };
            let mut at =
                departure + link.delay + Duration::from_nanos(jitter.saturating_add(extra));
            if link.fifo && !reorder {
                // A queue keeps order: wait behind the previous in-order packet.
                let st = self.link_state.entry((from, to)).or_default();
                at = at.max(st.last_arrival);
                st.last_arrival = at;
            }
            let seq = self.seq;
            self.seq += 1;
            self.queue.push(Scheduled {
                at,
                seq,
                from,
                to,
                link_seq,
                corrupted,
                packet,
            });
            self.stats.max_in_flight = self.stats.max_in_flight.max(self.queue.len() as u64);
        }
    }

    fn deliver(&mut self, ev: Scheduled) {
        if self.is_partitioned(ev.from, ev.to) {
            self.stats.dropped_partition += 1;
            self.trace_packet(
                TraceKind::Dropped(DropReason::Partition),
                Some(ev.from),
                Some(ev.to),
                &ev.packet,
            );
            return;
        }
        let state = self.link_state.entry((ev.from, ev.to)).or_default();
        match state.max_delivered {
            Some(m) if ev.link_seq < m => self.stats.reordered += 1,
            _ => state.max_delivered = Some(ev.link_seq),
        }
        self.stats.delivered += 1;
        self.hash_event(1, Some(ev.from), Some(ev.to), &ev.packet);
        self.trace_packet(
            TraceKind::Delivered {
                corrupted: ev.corrupted,
            },
            Some(ev.from),
            Some(ev.to),
            &ev.packet,
        );
        let now = self.now;
        self.nodes[ev.to.0].node.handle_datagram(now, &ev.packet);
        self.drain(ev.to);
    }

    fn hash_event(&mut self, kind: u8, from: Option<NodeId>, to: Option<NodeId>, bytes: &[u8]) {
        // FNV-1a over 64-bit words (not bytes): the hash sees every delivered byte, and costs
        // little next to the nodes' own work even for 4 KiB packets.
        let mut h = self.hash;
        let mut eat = |w: u64| {
            h ^= w;
            h = h.wrapping_mul(FNV_PRIME);
        };
        eat(u64::from(kind));
        eat(nanos(self.now));
        for id in [from, to] {
            eat(id.map_or(u64::MAX, |n| n.0 as u64));
        }
        eat(bytes.len() as u64);
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut a = [0u8; 8];
            a.copy_from_slice(w);
            eat(u64::from_le_bytes(a));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut a = [0u8; 8];
            a[..rest.len()].copy_from_slice(rest);
            eat(u64::from_le_bytes(a));
        }
        self.hash = h;
    }
}
