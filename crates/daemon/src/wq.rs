//! Work rings: the daemon's end of the shared-memory send, receive and shared receive queues
//! a client posts into (the "NIC fetches WQEs" step of the data path).
//!
//! Each entry is one work request in the fixed layout of [`abi::wqe`], sized for its queue's
//! capabilities. Everything in the ring is the client's and untrusted: [`Ring`] validates
//! the indices, [`wqe::decode_send`] / [`wqe::decode_recv`] every field of the entry (copied
//! out of shared memory first), and this module that the handles it names are the
//! connection's. A ring that lies (an impossible index, an entry that does not decode or
//! names another queue) is detached and its QP moved to the error state, which flushes what
//! it had queued; a WQE the engine refuses (e.g. too many SGEs, an opcode the QP type does
//! not carry) moves the QP to the error state as well. Nothing a client writes reaches a
//! panic or an access outside the mapping. A WQE the engine has no room for yet waits here,
//! and the ring behind it, until completions free a slot: posting order is kept.
//!
//! A connection's rings on one device are a [`ConnRings`]: they ring bits of the
//! connection's doorbell page ([`abi::doorbell`], two levels: a summary bit per word of ring
//! bits), and the daemon drains only the rings whose bits it finds set, plus those it must come back to (a drain that stopped at its batch's
//! end, a WQE held back for room in the engine), so a pass costs the rings that have work,
//! not every ring. The bits are untrusted too: one that names no ring, or an empty one, is
//! a look at the connection's own rings, nothing more.

use foldhash::{HashMap, HashMapExt};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use engine::{AhHandle, CqHandle, QpAttr, QpAttrMask, QpState, SendWr, SrqHandle, VerbsError};

use abi::doorbell::{DoorbellPage, BITS, SUMMARY_WORDS, WORDS};
use abi::ring::{Ring, RingError};
use abi::wqe;

/// Most WQEs taken from one ring in one go, so that one busy client cannot hold the device
/// lock for long.
const BATCH: usize = 64;

/// The queue a work ring feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Queue {
    /// The send queue of QP `qpn`.
    Sq {
        /// The QP.
        qpn: u32,
    },
    /// The receive queue of QP `qpn`.
    Rq {
        /// The QP.
        qpn: u32,
    },
    /// A shared receive queue.
    Srq {
        /// The SRQ.
        srq: SrqHandle,
    },
    /// Not a queue: the arm doorbell of a CQ whose ring the client arms in place
    /// ([`ConnRings::attach_arm`]).
    CqArm {
        /// The CQ.
        cq: CqHandle,
    },
}

impl Queue {
    /// The QP whose queue this is (none for an SRQ).
    pub fn qpn(&self) -> Option<u32> {
        match *self {
            Queue::Sq { qpn } | Queue::Rq { qpn } => Some(qpn),
            Queue::Srq { .. } | Queue::CqArm { .. } => None,
        }
    }
}

/// How the connection's handle numbers inside a WQE become the engine's: a WQE may name an
/// AH (UD sends) and, for BIND_MW, a window and a region, all of its own connection only.
pub trait Handles: Send + Sync {
    /// The engine's AH the connection calls `ah`, if it holds one on this ring's device.
    fn ah(&self, ah: u32) -> Option<AhHandle>;
    /// Replace the windows and regions `wr` names by the engine's; false if the connection
    /// does not hold them on this ring's device (`wr` is then left half-translated).
    fn send_wr(&self, wr: &mut SendWr) -> bool;
}

/// Counters of the work rings of one device (`stat` shows them per device).
#[derive(Debug, Default)]
pub struct WqStats {
    /// WQEs taken from work rings into the engine.
    pub ring_wqes: AtomicU64,
    /// Entries that did not decode or named another queue or a foreign handle (ring
    /// detached, QP to error).
    pub ring_bad_wqes: AtomicU64,
    /// Rings whose published producer index was impossible (ring detached, QP to error).
    pub ring_bad_indices: AtomicU64,
    /// WQEs the engine refused (QP to error).
    pub ring_refused_wqes: AtomicU64,
    /// Times the progress thread went to sleep asking for doorbells.
    pub progress_sleeps: AtomicU64,
    /// Times the progress thread woke and found WQEs waiting in a ring.
    pub doorbell_wakeups: AtomicU64,
    /// CQs armed through their rings (`ibv_req_notify_cq` with no request).
    pub ring_arms: AtomicU64,
    /// Deliveries of completions that woke client threads asleep until they came
    /// (`abi::doorbell::DoorbellPage::wake_waiters`).
    pub completion_wakes: AtomicU64,
}

impl WqStats {
    /// Every counter with its name.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("ring_wqes", g(&self.ring_wqes)),
            ("ring_bad_wqes", g(&self.ring_bad_wqes)),
            ("ring_bad_indices", g(&self.ring_bad_indices)),
            ("ring_refused_wqes", g(&self.ring_refused_wqes)),
            ("progress_sleeps", g(&self.progress_sleeps)),
            ("doorbell_wakeups", g(&self.doorbell_wakeups)),
            ("ring_arms", g(&self.ring_arms)),
            ("completion_wakes", g(&self.completion_wakes)),
        ]
    }
}

/// Why an entry is not a WQE of this ring.
#[derive(Debug)]
struct BadWqe(String);

/// The daemon's end of one work ring.
pub struct WorkRing {
    ring: Ring,
    queue: Queue,
    /// The connection's handle of the QP or SRQ: every entry must name it.
    handle: u32,
    handles: Arc<dyn Handles>,
    /// `entry` holds a popped WQE the engine had no room for: decoded and posted first when
    /// room comes (kept as the entry's bytes, so a post never copies a WR to keep it).
    stash: bool,
    entry: Vec<u8>,
}

impl core::fmt::Debug for WorkRing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("WorkRing")
            .field("queue", &self.queue)
            .field("handle", &self.handle)
            .field("capacity", &self.ring.capacity())
            .field("stashed", &self.stash)
            .finish_non_exhaustive()
    }
}

/// What one [`WorkRing::drain`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// This many WQEs went into the engine (the ring stays).
    Took(usize),
    /// The ring lied and must be detached (its QP is in the error state now).
    Broken,
}

impl WorkRing {
    /// The daemon's end of a ring feeding `queue`, whose entries must name `handle`.
    pub fn new(ring: Ring, queue: Queue, handle: u32, handles: Arc<dyn Handles>) -> WorkRing {
        WorkRing {
            entry: vec![0; ring.entry_size()],
            ring,
            queue,
            handle,
            handles,
            stash: false,
        }
    }

    /// The queue it feeds.
    pub fn queue(&self) -> Queue {
        self.queue
    }

    /// Whether WQEs wait: in the ring, or held back for room in the engine. A corrupt index
    /// counts as waiting, so the next drain finds and reports it.
    pub fn pending(&self) -> bool {
        self.stash || !matches!(self.ring.is_empty(), Ok(true))
    }

    /// Whether WQEs wait in the ring that the daemon could take now (not behind a WQE held
    /// back for room in the engine, which only engine progress releases). A corrupt index
    /// counts as waiting, so the next drain finds and reports it.
    pub fn waiting(&self) -> bool {
        !self.stash && !matches!(self.ring.is_empty(), Ok(true))
    }

    /// Whether a WQE is held back because the engine's queue is full.
    pub fn backlogged(&self) -> bool {
        self.stash
    }

    /// Move waiting WQEs into `engine`, in order, until the ring is empty, the engine's
    /// queue is full, or a batch is done.
    pub fn drain(&mut self, engine: &mut runtime::SendEngine, stats: &WqStats) -> Drained {
        let mut took = 0;
        let drained = self.drain_counting(engine, stats, &mut took);
        // The slots taken go back to the client with one store of the index it reads.
        self.ring.publish();
        // One count per drain, not per WQE: the counters are shared with `stat`'s thread.
        stats.ring_wqes.fetch_add(took as u64, Ordering::Relaxed);
        drained
    }

    /// [`WorkRing::drain`], counting the WQEs the engine took in `took`.
    fn drain_counting(
        &mut self,
        engine: &mut runtime::SendEngine,
        stats: &WqStats,
        took: &mut usize,
    ) -> Drained {
        while *took < BATCH {
            // A stashed entry is still in `entry`: it goes first.
            let popped = if self.stash {
                Ok(true)
            } else {
                self.ring.take(&mut self.entry)
            };
            match popped {
                Ok(true) => self.stash = false,
                Ok(false) => break,
                Err(e) => {
                    let RingError::Corrupt { prod, cons } = e else {
                        tracing::warn!(queue = ?self.queue, error = %e, "work ring unusable");
                        self.poison(engine);
                        return Drained::Broken;
                    };
                    stats.ring_bad_indices.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(queue = ?self.queue, prod, cons, "work ring index corrupt");
                    self.poison(engine);
                    return Drained::Broken;
                }
            }
            let posted = match self.decode_and_post(engine) {
                Ok(r) => r,
                Err(BadWqe(why)) => {
                    stats.ring_bad_wqes.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(queue = ?self.queue, why, "bad WQE in a work ring");
                    self.poison(engine);
                    return Drained::Broken;
                }
            };
            match self.posted(engine, posted, stats) {
                Ok(true) => *took += 1,
                Ok(false) => break,
                Err(()) => return Drained::Broken,
            }
        }
        Drained::Took(*took)
    }

    /// Decode the popped entry as a WQE of this ring's queue, with the engine's handles, and
    /// post it: `Err` when it is no such WQE, else what the engine said. One step, so that a
    /// WR (some 200 bytes) goes from the decoder to the engine without moves in between.
    fn decode_and_post(
        &self,
        engine: &mut runtime::SendEngine,
    ) -> Result<Result<(), VerbsError>, BadWqe> {
        let bad = |e: wqe::WqeError| BadWqe(e.to_string());
        match self.queue {
            Queue::Sq { qpn } => {
                let (mut wr, ud) = wqe::decode_send(&self.entry).map_err(bad)?;
                if !self.handles.send_wr(&mut wr) {
                    return Err(BadWqe("names a window or region it does not hold".into()));
                }
                Ok(match ud {
                    None => engine.post_send(qpn, wr),
                    Some(mut dest) => {
                        let ah = dest.ah.0;
                        dest.ah = self
                            .handles
                            .ah(ah)
                            .ok_or_else(|| BadWqe(format!("no AH {ah} on this connection")))?;
                        engine.post_send_ud(qpn, wr, dest)
                    }
                })
            }
            Queue::Rq { qpn } => {
                Ok(engine.post_recv(qpn, wqe::decode_recv(&self.entry).map_err(bad)?))
            }
            Queue::Srq { srq } => {
                Ok(engine.post_srq_recv(srq, wqe::decode_recv(&self.entry).map_err(bad)?))
            }
            Queue::CqArm { .. } => Err(BadWqe("a CQ's arm bit has no ring of work".into())),
        }
    }

    /// What the engine said of a posted WQE: `Ok(true)` taken, `Ok(false)` stashed (the
    /// engine's queue is full), `Err` the QP was moved to the error state and the ring must
    /// go.
    fn posted(
        &mut self,
        engine: &mut runtime::SendEngine,
        r: Result<(), VerbsError>,
        stats: &WqStats,
    ) -> Result<bool, ()> {
        match r {
            Ok(()) => Ok(true),
            Err(VerbsError::QueueFull) => {
                self.stash = true;
                Ok(false)
            }
            Err(e) => {
                // The client library checks what verbs checks at post time before it writes
                // a WQE, so only a client that bypassed it gets here. The verb cannot fail
                // any more (it returned long ago): the QP fails instead, as a NIC's does on
                // a malformed WQE.
                stats.ring_refused_wqes.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(queue = ?self.queue, error = %e, "WQE refused; QP to error");
                self.poison(engine);
                Err(())
            }
        }
    }

    /// Move the ring's QP to the error state (its queued WQEs complete with flush errors). A
    /// QP still in RESET stays there (the engine allows no RESET → ERR): it has nothing
    /// queued, and its ring is detached all the same.
    fn poison(&mut self, engine: &mut runtime::SendEngine) {
        self.stash = false;
        if let Some(qpn) = self.queue.qpn() {
            let err = QpAttr {
                qp_state: QpState::Err,
                ..QpAttr::default()
            };
            let _ = engine.modify_qp(qpn, &err, QpAttrMask::STATE);
        }
    }
}

/// Why a work ring could not be attached to a connection's rings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The connection has no doorbell page on the device to ring the ring's bit in.
    #[error("no doorbell page on this device: ask for it first")]
    NoPage,
    /// Every bit of the page names a ring already.
    #[error("every bit of the doorbell page is taken")]
    Full,
    /// A CQ armed in place needs the ring its arm word is in.
    #[error("this CQ has no ring: attach one first")]
    NoCqRing,
    /// The queue has a bit already.
    #[error("this CQ is armed through its ring already")]
    Twice,
}

/// A set of ring bits kept by the daemon alone, two levels as the doorbell page's: bit
/// `w` of the summary says word `w` may be non-zero, so that walking it costs the words
/// that have bits, not all of them.
struct Bits {
    /// Which summary words are not zero: an empty set is one load to find so (a pass looks
    /// at three sets per connection, idle ones included).
    top: u64,
    summary: [u64; SUMMARY_WORDS],
    words: Box<[u64; WORDS]>,
}

const _: () = assert!(SUMMARY_WORDS <= 64, "one bit of `top` per summary word");

impl Bits {
    fn new() -> Bits {
        Bits {
            top: 0,
            summary: [0; SUMMARY_WORDS],
            words: Box::new([0; WORDS]),
        }
    }

    fn is_empty(&self) -> bool {
        self.top == 0
    }

    /// Add `bits` to word `w` (`w < WORDS`).
    fn add(&mut self, w: usize, bits: u64) {
        if bits != 0 {
            self.words[w] |= bits;
            self.summary[w / 64] |= 1 << (w % 64);
            self.top |= 1 << (w / 64);
        }
    }

    fn insert(&mut self, bit: u32) {
        self.add(bit as usize / 64, 1 << (bit % 64));
    }

    /// Remove `bit` (its summary bit may stay: a hint, not a promise).
    fn remove(&mut self, bit: u32) {
        self.words[bit as usize / 64] &= !(1 << (bit % 64));
    }

    /// Move every bit of `other` into this set.
    fn absorb(&mut self, other: &mut Bits) {
        other.drain_words(|w, bits| self.add(w, bits));
    }

    /// Take every non-zero word out of the set, `f(w, bits)` for each.
    fn drain_words(&mut self, mut f: impl FnMut(usize, u64)) {
        let mut top = std::mem::take(&mut self.top);
        while top != 0 {
            let i = top.trailing_zeros() as usize;
            top &= top - 1;
            let mut t = std::mem::take(&mut self.summary[i]);
            while t != 0 {
                let w = i * 64 + t.trailing_zeros() as usize;
                t &= t - 1;
                let bits = std::mem::take(&mut self.words[w]);
                if bits != 0 {
                    f(w, bits);
                }
            }
        }
    }
}

/// What a bit of the doorbell page names.
enum Slot {
    /// A work ring to drain.
    Work(WorkRing),
    /// A CQ the client arms through its ring ([`ConnRings::attach_arm`]).
    Arm(CqHandle),
}

impl Slot {
    fn queue(&self) -> Queue {
        match self {
            Slot::Work(r) => r.queue(),
            Slot::Arm(cq) => Queue::CqArm { cq: *cq },
        }
    }
}

/// One connection's work rings on one device, and the doorbell page they ring.
pub struct ConnRings {
    page: DoorbellPage,
    /// The page's file, kept to hand it to the client again.
    fd: OwnedFd,
    /// The rings and CQ arms, by bit.
    rings: Vec<Option<Slot>>,
    /// Bits below `rings.len()` that name no ring, to give out again first.
    free_bits: Vec<u32>,
    by_queue: HashMap<Queue, u32>,
    /// Rings whose last drain left WQEs the daemon could take now (it stopped at a batch's
    /// end): looked at again next pass, rung or not.
    again: Bits,
    /// Rings holding a WQE back for room in the engine: looked at every pass (engine
    /// progress releases them), but not work to stay awake for.
    stashed: Bits,
    /// The rings a pass looks at (kept to reuse its storage; empty between passes).
    look: Bits,
}

impl core::fmt::Debug for ConnRings {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ConnRings")
            .field("rings", &self.by_queue.len())
            .field("again", &!self.again.is_empty())
            .finish_non_exhaustive()
    }
}

impl ConnRings {
    /// No rings yet, and a new doorbell page.
    pub fn new() -> Result<ConnRings, RingError> {
        let (page, fd) = DoorbellPage::create()?;
        Ok(ConnRings {
            page,
            fd,
            rings: Vec::new(),
            free_bits: Vec::new(),
            by_queue: HashMap::new(),
            again: Bits::new(),
            stashed: Bits::new(),
            look: Bits::new(),
        })
    }

    /// A descriptor of the doorbell page, to hand to the client.
    pub fn page_fd(&self) -> std::io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Take posts from `ring` from now on; returns its bit in the doorbell page.
    pub fn attach(&mut self, ring: WorkRing) -> Result<u32, AttachError> {
        self.attach_slot(Slot::Work(ring))
    }

    /// Report `cq` ([`ConnRings::take`]) whenever the client sets the returned bit, after
    /// writing the arm word of the CQ's ring ([`abi::ring::Ring::arm`]).
    pub fn attach_arm(&mut self, cq: CqHandle) -> Result<u32, AttachError> {
        self.attach_slot(Slot::Arm(cq))
    }

    fn attach_slot(&mut self, slot: Slot) -> Result<u32, AttachError> {
        let bit = match self.free_bits.pop() {
            Some(free) => free as usize,
            None if self.rings.len() < BITS as usize => {
                self.rings.push(None);
                self.rings.len() - 1
            }
            None => return Err(AttachError::Full),
        };
        // A bit reused from a detached ring may still be set, or be set by the client at any
        // time: either way only a look at this ring.
        self.by_queue.insert(slot.queue(), bit as u32);
        self.rings[bit] = Some(slot);
        Ok(bit as u32)
    }

    /// Forget the ring of `bit` (detached, or broken).
    fn forget(&mut self, bit: u32) {
        if let Some(r) = self.rings.get_mut(bit as usize).and_then(Option::take) {
            self.by_queue.remove(&r.queue());
            self.free_bits.push(bit);
        }
        self.again.remove(bit);
        self.stashed.remove(bit);
    }

    /// Stop taking posts for `queue`; whether it had a ring.
    pub fn detach(&mut self, queue: Queue) -> bool {
        let Some(&bit) = self.by_queue.get(&queue) else {
            return false;
        };
        self.forget(bit);
        true
    }

    /// The ring feeding `queue`, if any.
    pub fn ring(&self, queue: Queue) -> Option<&WorkRing> {
        let bit = *self.by_queue.get(&queue)?;
        match self.rings.get(bit as usize)? {
            Some(Slot::Work(r)) => Some(r),
            _ => None,
        }
    }

    /// Whether `queue` (a work ring's or a CQ's arm) has a bit.
    pub fn has(&self, queue: Queue) -> bool {
        self.by_queue.contains_key(&queue)
    }

    /// How many work rings (CQ arms not counted).
    pub fn len(&self) -> usize {
        self.by_queue
            .keys()
            .filter(|q| !matches!(q, Queue::CqArm { .. }))
            .count()
    }

    /// No rings and no CQ arms.
    pub fn is_empty(&self) -> bool {
        self.by_queue.is_empty()
    }

    /// Tell the client whether it must write the device's eventfd after ringing a bit.
    pub fn set_sleeping(&self, sleeping: bool) {
        self.page.set_sleeping(sleeping);
    }

    /// After completions went into rings of this connection: wake its threads that sleep
    /// until they come ([`abi::doorbell::DoorbellPage::wake_waiters`]); whether any did.
    pub fn wake_waiters(&self) -> bool {
        self.page.wake_waiters()
    }

    /// Whether WQEs may wait that the daemon could take now: a bit is set, or a drain
    /// stopped at its batch's end. Rings holding a WQE back for room in the engine do not
    /// count: only engine progress releases them.
    pub fn has_work(&self) -> bool {
        !self.again.is_empty() || self.page.rung(self.rings.len().div_ceil(64))
    }

    /// Drain the rings whose bits are set, and those left to come back to, into `engine`,
    /// and add the CQs whose arm bits are set to `armed`. Returns how many WQEs went in.
    /// Rings that lied are detached (their QPs are in the error state now).
    pub fn take(
        &mut self,
        engine: &mut runtime::SendEngine,
        stats: &WqStats,
        armed: &mut Vec<CqHandle>,
    ) -> usize {
        // Both levels taken, then a fence, before any ring is read (see `abi::doorbell`: no
        // post is lost). Only the words this connection's rings use are handed on.
        let words = self.rings.len().div_ceil(64);
        let look = &mut self.look;
        self.page.take(words, |w, bits| look.add(w, bits));
        look.absorb(&mut self.again);
        look.absorb(&mut self.stashed);
        let mut took = 0;
        let mut broken = Vec::new();
        let (rings, again, stashed) = (&mut self.rings, &mut self.again, &mut self.stashed);
        look.drain_words(|w, mut bits| {
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                let bit = (w * 64) as u32 + b;
                // A bit that names no ring is the client's own noise.
                let r = match rings.get_mut(bit as usize) {
                    Some(Some(Slot::Work(r))) => r,
                    Some(Some(Slot::Arm(cq))) => {
                        armed.push(*cq);
                        continue;
                    }
                    _ => continue,
                };
                match r.drain(engine, stats) {
                    Drained::Took(n) => {
                        took += n;
                        if r.backlogged() {
                            stashed.insert(bit);
                        } else if r.waiting() {
                            again.insert(bit);
                        }
                    }
                    Drained::Broken => broken.push(bit),
                }
            }
        });
        for bit in broken {
            self.forget(bit);
        }
        took
    }
}
