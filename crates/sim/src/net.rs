//! Network fault settings and counters.

use core::time::Duration;

/// Fault and timing settings for one direction of a link (or the default for all links).
///
/// Probabilities are per packet, in `0.0..=1.0`. Each fault is drawn independently, in a fixed
/// order (loss, duplication, then per copy: corruption, jitter, reordering), so a seed replays.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkConfig {
    /// Probability that a packet is dropped.
    pub loss: f64,
    /// Probability that a packet is delivered twice (the copy gets its own delay and faults).
    pub duplicate: f64,
    /// Probability that a packet gets an extra random delay in `0..=reorder_delay`, so later
    /// packets can overtake it.
    pub reorder: f64,
    /// Upper bound of the extra delay given to reordered packets.
    pub reorder_delay: Duration,
    /// Probability that a packet has random bits flipped (the receiver's ICRC must catch it).
    pub corrupt: f64,
    /// Most bits flipped in a corrupted packet (at least one is always flipped).
    pub corrupt_max_bits: u32,
    /// Fixed one-way propagation delay.
    pub delay: Duration,
    /// Upper bound of a uniform random delay added to every packet.
    pub jitter: Duration,
    /// Whether the link keeps order despite jitter, as a real link (a queue) does: a packet
    /// never arrives before one sent earlier on the same directed link, unless it was picked
    /// for reordering (`reorder`). With `false`, jitter alone reorders packets sent closer
    /// together than the jitter.
    pub fifo: bool,
    /// Link rate in bits per second; `None` means no serialization delay.
    ///
    /// With a rate, packets on the same directed link queue behind each other.
    pub bandwidth_bps: Option<u64>,
}

impl LinkConfig {
    /// A link with the given fixed delay and no faults.
    pub fn perfect(delay: Duration) -> Self {
        LinkConfig {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            reorder_delay: Duration::ZERO,
            corrupt: 0.0,
            corrupt_max_bits: 1,
            delay,
            jitter: Duration::ZERO,
            fifo: true,
            bandwidth_bps: None,
        }
    }

    /// Sets the loss probability.
    pub fn with_loss(mut self, p: f64) -> Self {
        self.loss = p;
        self
    }

    /// Sets the duplication probability.
    pub fn with_duplicate(mut self, p: f64) -> Self {
        self.duplicate = p;
        self
    }

    /// Sets the reordering probability and the largest extra delay a reordered packet gets.
    pub fn with_reorder(mut self, p: f64, max_extra: Duration) -> Self {
        self.reorder = p;
        self.reorder_delay = max_extra;
        self
    }

    /// Sets the corruption probability and the most bits flipped per corrupted packet.
    pub fn with_corrupt(mut self, p: f64, max_bits: u32) -> Self {
        self.corrupt = p;
        self.corrupt_max_bits = max_bits.max(1);
        self
    }

    /// Sets the fixed delay and the jitter bound.
    pub fn with_delay(mut self, delay: Duration, jitter: Duration) -> Self {
        self.delay = delay;
        self.jitter = jitter;
        self
    }

    /// Sets whether jitter keeps packet order (see [`LinkConfig::fifo`]).
    pub fn with_fifo(mut self, fifo: bool) -> Self {
        self.fifo = fifo;
        self
    }

    /// Sets the link rate in bits per second (`None` for infinite).
    pub fn with_bandwidth(mut self, bps: Option<u64>) -> Self {
        self.bandwidth_bps = bps;
        self
    }
}

impl Default for LinkConfig {
    /// A fault-free link with 10 µs of delay.
    fn default() -> Self {
        LinkConfig::perfect(Duration::from_micros(10))
    }
}

/// Settings of the whole simulated network.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConfig {
    /// Settings of every directed link that has no override.
    pub link: LinkConfig,
    /// Size of the buffer handed to `poll_transmit` (largest packet a node may send).
    pub max_packet: usize,
    /// Most events processed at one virtual instant before the sim reports a livelock
    /// (a node whose timeout never moves forward).
    pub max_events_per_instant: u64,
}

impl NetConfig {
    /// A network whose links all use `link`.
    pub fn with_link(link: LinkConfig) -> Self {
        NetConfig {
            link,
            ..NetConfig::default()
        }
    }
}

impl Default for NetConfig {
    /// Fault-free 10 µs links, 64 KiB packet buffer.
    fn default() -> Self {
        NetConfig {
            link: LinkConfig::default(),
            max_packet: 65_536,
            max_events_per_instant: 1_000_000,
        }
    }
}

/// Why the network dropped a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DropReason {
    /// Random loss.
    Loss,
    /// The pair of nodes was partitioned when the packet was sent or when it would have arrived.
    Partition,
    /// No node owns the destination address.
    Unroutable,
    /// The test's packet filter (see `Sim::set_filter`) dropped it.
    Filter,
}

/// Counters of everything the network did. All counts are packets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Packets nodes handed to the network.
    pub sent: u64,
    /// Packets handed to a receiving node (duplicates included).
    pub delivered: u64,
    /// Packets dropped by random loss.
    pub dropped_loss: u64,
    /// Packets dropped by a partition.
    pub dropped_partition: u64,
    /// Packets dropped because no node owns the destination address.
    pub dropped_unroutable: u64,
    /// Packets dropped by the test's packet filter.
    pub dropped_filter: u64,
    /// Packets the test injected with `Sim::inject`.
    pub injected: u64,
    /// Extra copies made by duplication.
    pub duplicated: u64,
    /// Packets (or copies) with flipped bits.
    pub corrupted: u64,
    /// Packets (or copies) given an extra reordering delay.
    pub delayed: u64,
    /// Packets delivered after a packet that was sent later on the same directed link.
    pub reordered: u64,
    /// Timeouts fired into nodes.
    pub timeouts: u64,
    /// Most packets in flight at once.
    pub max_in_flight: u64,
}

impl Stats {
    /// All dropped packets, whatever the reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_loss + self.dropped_partition + self.dropped_unroutable + self.dropped_filter
    }
}
