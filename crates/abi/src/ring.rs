//! Single-producer, single-consumer rings in shared memory, the data path between clients
//! and the daemon: per-QP SQ/RQ rings (and per-SRQ rings) the client produces into, per-CQ
//! rings the daemon produces into. The daemon places its rings in its connection's
//! [`crate::arena`] (many rings in one sealed `memfd`, each at a [`RING_ALIGN`]-aligned
//! offset); [`Ring::create`] makes a ring in a file of its own.
//!
//! Layout (native byte order, offsets from the ring's start; each index on its own cache
//! line):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic `RING_MAGIC`, version, entry size, capacity (a power of two) |
//! | 16 | arm word of a CQ ring: written by the consumer to arm its CQ's notification ([`Ring::arm`]); version 1's wakeup word |
//! | 20 | backlog word: non-zero while the producer holds entries waiting for room and wants a doorbell when slots free up |
//! | 24 | the producer index the consumer saw when it last armed |
//! | 64 | producer index (free-running u32) |
//! | 128 | consumer index (free-running u32) |
//! | 192 | `capacity` entries of `entry size` bytes |
//!
//! The other side of a ring is untrusted. Each side keeps its own index privately and only
//! *publishes* it; the index it reads from shared memory is validated (`0 ≤ prod - cons ≤
//! capacity`) before use, and entries are copied out before they are parsed, so a hostile
//! peer can make its own ring report [`RingError::Corrupt`] but can never make the daemon read
//! or write outside the ring. The daemon never reads the header back: it keeps the geometry
//! it wrote. The file is sealed against shrinking, so the peer cannot turn an access into a
//! `SIGBUS`.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crate::arena::Block;
use crate::shm::{SharedMemory, ShmError};

/// First word of a ring: `"SRRG"`.
pub const RING_MAGIC: u32 = u32::from_le_bytes(*b"SRRG");
/// 3: the arm word.
const VERSION: u32 = 3;
const ARM: usize = 16;
const BACKLOG: usize = 20;
const ARM_SEEN: usize = 24;
const PROD: usize = 64;
const CONS: usize = 128;
const ENTRIES: usize = 192;
/// In an arm word ([`Ring::arm_request`]): only solicited and error completions.
pub const ARM_SOLICITED: u32 = 1;
/// Largest ring accepted (entries × entry size).
pub const MAX_RING_BYTES: usize = 64 << 20;
/// Where a ring may start in its mapping: a multiple of this many bytes (a cache line, so
/// that each index keeps a line of its own and every word is aligned).
pub const RING_ALIGN: usize = 64;

/// Why a ring operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The parameters or the mapped header are not a valid ring.
    #[error("invalid ring: {0}")]
    Invalid(&'static str),
    /// The peer published an index that no honest peer could (`prod - cons > capacity`).
    #[error("ring indices corrupt (producer {prod}, consumer {cons})")]
    Corrupt {
        /// Producer index seen.
        prod: u32,
        /// Consumer index seen.
        cons: u32,
    },
    /// A system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}

impl From<ShmError> for RingError {
    fn from(e: ShmError) -> RingError {
        match e {
            ShmError::Os { what, source } => RingError::Io { what, source },
            ShmError::Refused(why) => RingError::Invalid(why),
        }
    }
}

fn io(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> RingError {
    move |e| RingError::Io {
        what,
        source: e.into(),
    }
}

/// Which end of the ring this mapping is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Writes entries, publishes the producer index.
    Producer,
    /// Reads entries, publishes the consumer index.
    Consumer,
}

/// One end of a ring: a view of `len` bytes at byte `base` of a mapping, the ring's own
/// file's or a chunk of a [`crate::arena`] shared with other rings.
#[derive(Debug)]
pub struct Ring {
    /// The mapping (the file is not kept: the creator hands it to the peer).
    mem: Arc<SharedMemory>,
    /// Where the ring starts in the mapping: `base + len <= mem.len()`, and `mem.as_ptr() +
    /// base` is a multiple of [`RING_ALIGN`] (checked by every constructor).
    base: usize,
    /// Header and entries: `ENTRIES + capacity * entry_size`.
    len: usize,
    /// The arena block the ring lives in, given back when the ring goes (the daemon's end
    /// of an arena ring only).
    _block: Option<Block>,
    entry_size: usize,
    capacity: u32,
    role: Role,
    /// This end's own index, never re-read from shared memory.
    mine: u32,
    /// The peer's index as last read (and checked): a producer re-reads the consumer index
    /// only when this says the ring is full, a consumer the producer index only when this
    /// says it is empty. Indices only grow, so a stale value is a safe underestimate, and
    /// the shared line the peer writes is read once per batch instead of once per entry.
    peer: u32,
    /// This end's index as last published: entries staged ([`Ring::stage`]) or taken
    /// ([`Ring::take`]) since are the peer's to see only at the next [`Ring::publish`], so
    /// that a batch costs one store to the line the peer watches, not one per entry.
    shown: u32,
    /// Producer: this end last set the backlog word (the consumer may have cleared it since).
    backlog: bool,
}

impl Ring {
    /// Bytes of a ring of `capacity` entries of `entry_size` bytes (header included), if
    /// that is a valid ring: a power-of-two capacity, entries of a multiple of 8 bytes, at
    /// most [`MAX_RING_BYTES`] of them.
    pub fn bytes_for(capacity: u32, entry_size: usize) -> Result<usize, RingError> {
        if !capacity.is_power_of_two() || entry_size == 0 || !entry_size.is_multiple_of(8) {
            return Err(RingError::Invalid(
                "capacity must be a power of two, entries 8-byte multiples",
            ));
        }
        let bytes = (capacity as usize)
            .checked_mul(entry_size)
            .filter(|&b| b <= MAX_RING_BYTES)
            .ok_or(RingError::Invalid("ring too large"))?;
        Ok(ENTRIES + bytes)
    }

    /// Create a ring of `capacity` entries of `entry_size` bytes in a new sealed memfd; returns
    /// this process's end and the fd to pass to the peer (SCM_RIGHTS).
    pub fn create(
        capacity: u32,
        entry_size: usize,
        role: Role,
    ) -> Result<(Ring, OwnedFd), RingError> {
        let len = Ring::bytes_for(capacity, entry_size)?;
        let mut mem = SharedMemory::create("softrdma-ring", len)?;
        let fd = mem.take_fd().ok_or(RingError::Invalid("no file"))?;
        let ring = Ring::init_at(Arc::new(mem), 0, capacity, entry_size, role, None)?;
        Ok((ring, fd))
    }

    /// The creator's end of a new ring at byte `base` of `mem` (whatever the bytes held
    /// before: a block given back by an earlier ring is reused): writes the header and
    /// zeroes the indices and the backlog word. The peer sees the ring once told where it
    /// is (a message on the socket, after this).
    pub(crate) fn init_at(
        mem: Arc<SharedMemory>,
        base: usize,
        capacity: u32,
        entry_size: usize,
        role: Role,
        block: Option<Block>,
    ) -> Result<Ring, RingError> {
        let len = Ring::bytes_for(capacity, entry_size)?;
        let mut ring = Ring::view(mem, base, len, role)?;
        ring._block = block;
        ring.entry_size = entry_size;
        ring.capacity = capacity;
        ring.word(0).store(RING_MAGIC, Ordering::Relaxed);
        ring.word(4).store(VERSION, Ordering::Relaxed);
        ring.word(8).store(entry_size as u32, Ordering::Relaxed);
        ring.word(ARM).store(0, Ordering::Relaxed);
        ring.word(ARM_SEEN).store(0, Ordering::Relaxed);
        ring.word(BACKLOG).store(0, Ordering::Relaxed);
        ring.word(PROD).store(0, Ordering::Relaxed);
        ring.word(CONS).store(0, Ordering::Relaxed);
        ring.word(12).store(capacity, Ordering::Release);
        Ok(ring)
    }

    /// Map a ring received from the peer (a file of its own) and check its header against
    /// its size.
    pub fn open(fd: &impl AsFd, role: Role) -> Result<Ring, RingError> {
        let st = rustix::fs::fstat(fd).map_err(io("fstat"))?;
        let len = usize::try_from(st.st_size).map_err(|_| RingError::Invalid("size"))?;
        if !(ENTRIES..=ENTRIES + MAX_RING_BYTES).contains(&len) {
            return Err(RingError::Invalid("size"));
        }
        // Refused unless sealed against shrinking: a peer that could shrink the file could
        // turn our accesses into SIGBUS.
        let mem = SharedMemory::map_client(fd, 0, len as u64)?;
        Ring::open_at(Arc::new(mem), 0, len as u64, role)
    }

    /// The ring the peer made at byte `offset` of `mem` (a mapping of a peer's arena chunk,
    /// [`crate::arena`]), `len` bytes long: everything the peer said is checked — the
    /// place against the mapping, the header against `len`.
    pub fn open_at(
        mem: Arc<SharedMemory>,
        offset: u64,
        len: u64,
        role: Role,
    ) -> Result<Ring, RingError> {
        let (Ok(base), Ok(len)) = (usize::try_from(offset), usize::try_from(len)) else {
            return Err(RingError::Invalid("ring place out of range"));
        };
        if !(ENTRIES..=ENTRIES + MAX_RING_BYTES).contains(&len) {
            return Err(RingError::Invalid("size"));
        }
        let mut ring = Ring::view(mem, base, len, role)?;
        let magic = ring.word(0).load(Ordering::Acquire);
        let version = ring.word(4).load(Ordering::Relaxed);
        let entry_size = ring.word(8).load(Ordering::Relaxed) as usize;
        let capacity = ring.word(12).load(Ordering::Relaxed);
        if magic != RING_MAGIC || version != VERSION {
            return Err(RingError::Invalid("magic or version"));
        }
        if Ring::bytes_for(capacity, entry_size).ok() != Some(len) {
            return Err(RingError::Invalid("geometry does not match the size"));
        }
        ring.entry_size = entry_size;
        ring.capacity = capacity;
        ring.mine = match role {
            Role::Producer => ring.word(PROD).load(Ordering::Acquire),
            Role::Consumer => ring.word(CONS).load(Ordering::Acquire),
        };
        // Nothing seen of the peer yet: full for a producer, empty for a consumer, so the
        // first push or pop reads the peer's index.
        ring.peer = match role {
            Role::Producer => ring.mine.wrapping_sub(capacity),
            Role::Consumer => ring.mine,
        };
        Ok(ring)
    }

    /// A view of `len` bytes at `base` of `mem`, no geometry yet: refused unless the bytes
    /// are inside the mapping and start aligned.
    fn view(
        mem: Arc<SharedMemory>,
        base: usize,
        len: usize,
        role: Role,
    ) -> Result<Ring, RingError> {
        if len < ENTRIES || base.checked_add(len).is_none_or(|end| end > mem.len()) {
            return Err(RingError::Invalid("ring place outside the mapping"));
        }
        if !(mem.as_ptr() as usize)
            .wrapping_add(base)
            .is_multiple_of(RING_ALIGN)
        {
            return Err(RingError::Invalid("ring place not aligned"));
        }
        Ok(Ring {
            mem,
            base,
            len,
            _block: None,
            entry_size: 0,
            capacity: 0,
            role,
            mine: 0,
            peer: 0,
            shown: 0,
            backlog: false,
        })
    }

    /// The ring's first byte.
    fn start(&self) -> *mut u8 {
        self.mem.as_ptr().wrapping_add(self.base)
    }

    /// The 32-bit word at byte `off` of the header, as an atomic shared with the peer.
    #[allow(unsafe_code)]
    fn word(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= ENTRIES);
        // SAFETY: `off + 4 <= ENTRIES <= len` and `base + len <= mem.len()` (checked in
        // `view`): the word is inside the mapping, which lives as long as `self`; the ring
        // starts `RING_ALIGN`-aligned, so the word is 4-aligned; and the peer only ever
        // accesses it atomically too.
        unsafe { AtomicU32::from_ptr(self.start().add(off).cast::<u32>()) }
    }

    fn slot(&self, index: u32) -> *mut u8 {
        let i = (index & (self.capacity - 1)) as usize;
        // In bounds: `i < capacity`, and `ENTRIES + capacity * entry_size == len`.
        debug_assert!(ENTRIES + (i + 1) * self.entry_size <= self.len);
        self.start().wrapping_add(ENTRIES + i * self.entry_size)
    }

    /// Entries the ring holds.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Bytes per entry.
    pub fn entry_size(&self) -> usize {
        self.entry_size
    }

    /// Producer: entries that can be pushed now.
    pub fn free(&self) -> Result<u32, RingError> {
        let cons = self.word(CONS).load(Ordering::Acquire);
        Ok(self.capacity - self.check(self.mine, cons)?)
    }

    fn check(&self, prod: u32, cons: u32) -> Result<u32, RingError> {
        let used = prod.wrapping_sub(cons);
        if used > self.capacity {
            return Err(RingError::Corrupt { prod, cons });
        }
        Ok(used)
    }

    /// Producer: append one entry (`entry.len() <= entry_size`; the slot's bytes past its
    /// end are left as they were) and publish it. `Ok(false)` if the ring is full.
    pub fn push(&mut self, entry: &[u8]) -> Result<bool, RingError> {
        let pushed = self.stage(entry)?;
        self.publish();
        Ok(pushed)
    }

    /// Producer: [`Ring::push`] without publishing: the consumer sees the entry, and those
    /// staged with it, at the next [`Ring::publish`] (a producer that writes a batch stores
    /// the index the consumer polls once, not once per entry).
    #[allow(unsafe_code)]
    pub fn stage(&mut self, entry: &[u8]) -> Result<bool, RingError> {
        if self.role != Role::Producer || entry.len() > self.entry_size {
            return Err(RingError::Invalid("push on a consumer, or entry too long"));
        }
        if self.mine.wrapping_sub(self.peer) >= self.capacity {
            let cons = self.word(CONS).load(Ordering::Acquire);
            if self.check(self.mine, cons)? == self.capacity {
                return Ok(false);
            }
            self.peer = cons;
        }
        let slot = self.slot(self.mine).cast::<u64>();
        // Whole words up to the entry's end, the last one zero-padded; bytes past it keep
        // what they held (entries say their own length). A plain indexed loop: a chained
        // iterator here cost about 20 instructions a word.
        let (words, tail) = entry.as_chunks::<8>();
        for (i, w) in words.iter().enumerate() {
            // SAFETY: `slot..slot + entry_size` is inside the ring (see `slot`), so inside
            // the mapping, and 8-aligned (the ring starts `RING_ALIGN`-aligned, the header
            // and every entry size are multiples of 8), and `entry.len() <= entry_size`;
            // volatile because the peer maps the same bytes.
            unsafe { slot.add(i).write_volatile(u64::from_ne_bytes(*w)) };
        }
        if !tail.is_empty() {
            let mut last = [0u8; 8];
            last[..tail.len()].copy_from_slice(tail);
            // SAFETY: as above; this word ends at or before `entry_size` (a multiple of 8
            // no smaller than `entry.len()`).
            unsafe {
                slot.add(words.len())
                    .write_volatile(u64::from_ne_bytes(last))
            };
        }
        self.mine = self.mine.wrapping_add(1);
        Ok(true)
    }

    /// Publish this end's index (the producer's after [`Ring::stage`], the consumer's after
    /// [`Ring::take`]) if it moved since it was last published. The release store orders
    /// the entries written (producer) or read (consumer) before it.
    pub fn publish(&mut self) {
        if self.shown == self.mine {
            return;
        }
        self.shown = self.mine;
        let at = match self.role {
            Role::Producer => PROD,
            Role::Consumer => CONS,
        };
        self.word(at).store(self.mine, Ordering::Release);
    }

    /// Consumer: entries waiting to be popped.
    pub fn len(&self) -> Result<u32, RingError> {
        if self.role != Role::Consumer {
            return Err(RingError::Invalid("len on a producer"));
        }
        let prod = self.word(PROD).load(Ordering::Acquire);
        self.check(prod, self.mine)
    }

    /// Consumer: nothing waiting.
    pub fn is_empty(&self) -> Result<bool, RingError> {
        Ok(self.len()? == 0)
    }

    /// Consumer: copy the oldest entry into `out` (`entry_size` bytes) and release its slot.
    /// `Ok(false)` if the ring is empty. The bytes are the peer's: parse them as untrusted.
    pub fn pop(&mut self, out: &mut [u8]) -> Result<bool, RingError> {
        let popped = self.take(out)?;
        self.publish();
        Ok(popped)
    }

    /// Consumer: [`Ring::pop`] without releasing the slot: the producer may reuse it, and
    /// those taken with it, after the next [`Ring::publish`].
    #[allow(unsafe_code)]
    pub fn take(&mut self, out: &mut [u8]) -> Result<bool, RingError> {
        if self.role != Role::Consumer || out.len() != self.entry_size {
            return Err(RingError::Invalid(
                "pop on a producer, or wrong buffer size",
            ));
        }
        if self.peer == self.mine {
            let prod = self.word(PROD).load(Ordering::Acquire);
            if self.check(prod, self.mine)? == 0 {
                return Ok(false);
            }
            self.peer = prod;
        }
        let slot = self.slot(self.mine).cast::<u64>();
        for (i, o) in out.chunks_exact_mut(8).enumerate() {
            // SAFETY: inside the mapping and 8-aligned (see `push`); `out.len() ==
            // entry_size`, a multiple of 8; volatile because the peer maps it.
            let w = unsafe { slot.add(i).read_volatile() };
            o.copy_from_slice(&w.to_ne_bytes());
        }
        self.mine = self.mine.wrapping_add(1);
        Ok(true)
    }
}

impl Ring {
    /// Producer: say whether entries wait for room in the ring (the consumer must ring the
    /// doorbell after it frees slots). Setting it is followed by a full fence: a producer
    /// that then finds the ring still full may wait for the doorbell, because a consumer
    /// that popped after this store also sees it (the consumer's side is
    /// [`Ring::take_backlog`]). Clearing a word this end did not set costs nothing.
    pub fn set_backlog(&mut self, waiting: bool) {
        if !waiting && !self.backlog {
            return;
        }
        self.backlog = waiting;
        self.word(BACKLOG)
            .store(u32::from(waiting), Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Consumer of a CQ ring: arm the CQ's notification for its next completion (only a
    /// solicited or error one with `solicited_only`), as `ibv_req_notify_cq` does. Writes
    /// the producer index seen now (entries pushed after it came after the arm), then the
    /// arm word, a new value each time (a count in the high 31 bits, `solicited_only` in the
    /// lowest); ring the CQ's doorbell bit after it, whose full fence orders these stores
    /// before the bit ([`crate::doorbell::DoorbellPage::ring`]), so the daemon that takes
    /// the bit reads this arm or a later one.
    pub fn arm(&mut self, solicited_only: bool) {
        let seen = self.word(PROD).load(Ordering::Acquire);
        self.word(ARM_SEEN).store(seen, Ordering::Relaxed);
        let word = self.word(ARM);
        let next = (word.load(Ordering::Relaxed) | 1).wrapping_add(1) | u32::from(solicited_only);
        word.store(next, Ordering::Release);
    }

    /// Producer of a CQ ring: the consumer's last arm ([`Ring::arm`]): its arm word, and how
    /// many entries this end pushed since the producer index the consumer saw when it
    /// armed (entries it could not have seen: they came after the arm). Any value is safe to
    /// read: a word unlike the last one acted on is one arm, of solicited completions only
    /// when [`ARM_SOLICITED`] is set; a count from a lying consumer misleads only its own
    /// notifications.
    pub fn arm_request(&self) -> (u32, u32) {
        let word = self.word(ARM).load(Ordering::Acquire);
        let seen = self.word(ARM_SEEN).load(Ordering::Relaxed);
        (word, self.mine.wrapping_sub(seen))
    }

    /// Consumer, after popping: whether the producer said entries wait for room (ring its
    /// doorbell then). The word is cleared, so one doorbell answers each time the producer
    /// asks. The full fence orders the pops before this load: either the producer sees the
    /// freed slots after it set the word, or this sees the word (no doorbell is lost). The
    /// word is only a hint: any value is safe to read.
    pub fn take_backlog(&self) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        let word = self.word(BACKLOG);
        // Read first: while nothing waits, the shared line is not written.
        word.load(Ordering::SeqCst) != 0 && word.swap(0, Ordering::SeqCst) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_cross_between_two_mappings_in_order_and_wrap() {
        let (mut p, fd) = Ring::create(4, 16, Role::Producer).unwrap();
        let mut c = Ring::open(&fd, Role::Consumer).unwrap();
        assert_eq!((c.capacity(), c.entry_size()), (4, 16));
        let mut out = [0u8; 16];
        assert!(!c.pop(&mut out).unwrap());
        for round in 0u8..10 {
            for i in 0..4u8 {
                assert!(p.push(&[round, i]).unwrap());
            }
            assert!(!p.push(&[9]).unwrap(), "full at capacity");
            assert_eq!(c.len().unwrap(), 4);
            for i in 0..4u8 {
                assert!(c.pop(&mut out).unwrap());
                assert_eq!(&out[..3], &[round, i, 0]);
            }
            assert!(!c.pop(&mut out).unwrap());
            assert!(c.is_empty().unwrap());
        }
        assert!(p.len().is_err(), "len is the consumer's view");
    }

    #[test]
    fn a_batch_crosses_at_its_publication_and_not_before() {
        let (mut p, fd) = Ring::create(4, 8, Role::Producer).unwrap();
        let mut c = Ring::open(&fd, Role::Consumer).unwrap();
        let mut out = [0u8; 8];
        assert!(p.stage(&[1]).unwrap());
        assert!(p.stage(&[2]).unwrap());
        assert!(
            !c.take(&mut out).unwrap(),
            "staged entries are not the consumer's yet"
        );
        assert_eq!(c.len().unwrap(), 0);
        p.publish();
        assert_eq!(c.len().unwrap(), 2);
        assert!(p.stage(&[3]).unwrap());
        assert!(p.stage(&[4]).unwrap());
        assert!(!p.stage(&[5]).unwrap(), "staged entries take their slots");
        p.publish();
        for want in 1..=4u8 {
            assert!(c.take(&mut out).unwrap());
            assert_eq!(out[0], want);
        }
        // Taken but not released: the producer still finds the ring full.
        assert_eq!(p.free().unwrap(), 0);
        assert!(!p.push(&[6]).unwrap());
        c.publish();
        assert_eq!(p.free().unwrap(), 4);
        assert!(p.push(&[6]).unwrap(), "push publishes at once");
        assert!(c.pop(&mut out).unwrap());
        assert_eq!((out[0], p.free().unwrap()), (6, 4), "so does pop");
    }

    #[test]
    fn a_hostile_peer_index_is_reported_not_followed() {
        let (mut p, fd) = Ring::create(8, 8, Role::Producer).unwrap();
        let c = Ring::open(&fd, Role::Consumer).unwrap();
        // The "client" publishes a consumer index ahead of the producer. The producer reads
        // it once its own view says the ring is full: the entries before go into the
        // client's own slots, and the lie is reported, not followed.
        c.word(CONS).store(1000, Ordering::Release);
        for i in 0..8 {
            assert!(p.push(&[i]).unwrap());
        }
        assert!(matches!(p.push(&[1]), Err(RingError::Corrupt { .. })));
        assert!(matches!(p.free(), Err(RingError::Corrupt { .. })));
        drop(c);
        let (p2, fd2) = Ring::create(8, 8, Role::Producer).unwrap();
        let mut c2 = Ring::open(&fd2, Role::Consumer).unwrap();
        p2.word(PROD).store(u32::MAX, Ordering::Release);
        let mut out = [0u8; 8];
        assert!(matches!(c2.pop(&mut out), Err(RingError::Corrupt { .. })));
        let _ = p.push(&[]);
    }

    #[test]
    fn the_backlog_word_crosses_from_producer_to_consumer_once() {
        let (mut p, fd) = Ring::create(2, 8, Role::Producer).unwrap();
        let c = Ring::open(&fd, Role::Consumer).unwrap();
        assert!(!c.take_backlog());
        p.set_backlog(true);
        assert!(c.take_backlog());
        assert!(!c.take_backlog(), "one doorbell per request");
        p.set_backlog(true);
        p.set_backlog(false);
        assert!(!c.take_backlog());
        // A hostile value in the word is only a (spurious) doorbell.
        c.word(BACKLOG).store(0xdead_beef, Ordering::Relaxed);
        assert!(c.take_backlog());
    }

    #[test]
    fn bad_geometry_is_refused_and_the_file_cannot_shrink() {
        assert!(Ring::create(3, 8, Role::Producer).is_err());
        assert!(Ring::create(4, 7, Role::Producer).is_err());
        assert!(Ring::create(1 << 30, 64, Role::Producer).is_err());
        let (_p, fd) = Ring::create(4, 8, Role::Producer).unwrap();
        assert!(
            rustix::fs::ftruncate(&fd, 64).is_err(),
            "sealed against shrinking"
        );
        // A memfd that is not a ring.
        let junk = rustix::fs::memfd_create("junk", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&junk, 4096).unwrap();
        assert!(Ring::open(&junk, Role::Consumer).is_err());
        let tiny = rustix::fs::memfd_create("tiny", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        assert!(Ring::open(&tiny, Role::Consumer).is_err());
    }
}
