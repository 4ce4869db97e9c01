//! Ring arenas: many rings in a few large sealed memfds, so that a connection with tens of
//! thousands of rings costs each process a handful of mappings, not one per ring (mappings
//! are a per-process budget, `vm.max_map_count`, that every client of the daemon shares).
//!
//! The daemon makes one [`RingArena`] per connection and carves every work ring and CQ ring
//! of that connection out of it. The arena is a list of *chunks*, each one sealed memfd
//! mapped once by each side; a ring is named by its [`RingPlace`] — chunk number, byte
//! offset, length — and the client maps each chunk once, on the first answer that names it
//! (the answer carries the chunk's file, SCM_RIGHTS), keeping the chunks in an [`ArenaMap`].
//! Inside a ring the layout is [`crate::ring`]'s, unchanged.
//!
//! Space is handed out in blocks of a power of two bytes, from [`MIN_BLOCK`] up, each aligned
//! to its size (to a page at most) within its chunk: a ring takes the smallest block that
//! holds it. Free blocks wait in one list per size and are reused first, so destroying and
//! creating queues in a loop does not grow the arena; new blocks are cut from the end of the
//! newest chunk, and when it has no room a new chunk is made, each twice as large as the one
//! before, from [`FIRST_CHUNK`] up to [`MAX_CHUNK`] (untouched pages of a memfd cost no
//! memory, only address space). What is left at the end of a chunk, and the gaps alignment
//! leaves, go to the free lists as smaller blocks. Blocks are never merged: the arena stays
//! within what the connection held at its peak, per size, and within its byte limit.
//!
//! Everything in a chunk is writable by the client, who can corrupt only its own rings: the
//! daemon keeps each ring's geometry and its own index privately and validates every index it
//! reads ([`crate::ring`]), the chunks are sealed against shrinking (no `SIGBUS`), and a
//! client's arena holds only that client's rings. The client checks what the daemon names: a
//! place outside the chunk, misaligned, or with a header that does not match its length is
//! an error.

use std::collections::HashMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ring::{Ring, RingError, Role};
use crate::shm::SharedMemory;

/// Smallest block: a ring of one 64-byte entry (header and entry) fits.
pub const MIN_BLOCK: usize = 256;
/// Size of a connection's first chunk; each next one is twice the size of the one before.
pub const FIRST_CHUNK: usize = 1 << 20;
/// Largest chunk (the largest ring's block fits: `MAX_RING_BYTES` plus the header, rounded
/// up to a power of two).
pub const MAX_CHUNK: usize = 256 << 20;
/// Block sizes: `MIN_BLOCK << k` for `k < CLASSES`, up to `MAX_CHUNK`.
const CLASSES: usize = (MAX_CHUNK / MIN_BLOCK).trailing_zeros() as usize + 1;
/// Alignment of blocks of a page or more.
const PAGE: usize = 4096;

const _: () = assert!(MIN_BLOCK.is_power_of_two() && MIN_BLOCK.is_multiple_of(64));
const _: () = assert!((crate::ring::MAX_RING_BYTES + 192).next_power_of_two() <= MAX_CHUNK);

/// Where a ring lives in its connection's arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingPlace {
    /// The chunk (numbered from 0 in the order the daemon made them).
    pub chunk: u32,
    /// Byte offset of the ring in the chunk.
    pub offset: u64,
    /// Bytes of the ring (header and entries).
    pub len: u64,
}

/// The daemon's arena of one connection: the chunks and the free blocks. Rings made here
/// give their block back when they are dropped, wherever that happens.
#[derive(Debug, Clone)]
pub struct RingArena {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    /// The chunks, by number (each one mapping, the file kept to hand to the client).
    chunks: Vec<Arc<SharedMemory>>,
    /// Free blocks by size class: (chunk, offset).
    free: [Vec<(u32, usize)>; CLASSES],
    /// The first byte of the newest chunk not cut into blocks yet.
    end: usize,
    /// Bytes of all chunks together.
    bytes: usize,
    /// The most bytes the chunks may take together.
    max_bytes: usize,
    /// Blocks in use.
    live: usize,
}

fn lock(m: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // Every change under the lock is a push or a pop: a panic elsewhere cannot leave the
    // lists half-made.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A block of an arena, given back to its free list on drop (a [`Ring`] made in the arena
/// holds its block).
#[derive(Debug)]
pub struct Block {
    arena: Arc<Mutex<Inner>>,
    chunk: u32,
    offset: usize,
    class: usize,
}

impl Drop for Block {
    fn drop(&mut self) {
        let mut a = lock(&self.arena);
        a.free[self.class].push((self.chunk, self.offset));
        a.live -= 1;
    }
}

/// The size class of a block for `len` bytes.
fn class_of(len: usize) -> Option<usize> {
    let size = len.max(MIN_BLOCK).checked_next_power_of_two()?;
    let k = (size / MIN_BLOCK).trailing_zeros() as usize;
    (k < CLASSES).then_some(k)
}

fn block_len(class: usize) -> usize {
    MIN_BLOCK << class
}

impl Inner {
    /// Cut `start..end` of chunk `chunk` into free blocks, each as large as its alignment
    /// allows.
    fn give_back(&mut self, chunk: u32, mut start: usize, end: usize) {
        while start + MIN_BLOCK <= end {
            let k = (0..CLASSES)
                .rev()
                .find(|&k| {
                    let n = block_len(k);
                    start.is_multiple_of(n.min(PAGE)) && start + n <= end
                })
                .unwrap_or(0);
            self.free[k].push((chunk, start));
            start += block_len(k);
        }
    }

    /// A free block of class `k`: (chunk, offset).
    fn take(&mut self, k: usize) -> Result<(u32, usize), RingError> {
        if let Some(b) = self.free[k].pop() {
            return Ok(b);
        }
        let n = block_len(k);
        let align = n.min(PAGE);
        if let Some(last) = self.chunks.len().checked_sub(1) {
            let at = self.end.next_multiple_of(align);
            if at + n <= self.chunks[last].len() {
                self.give_back(last as u32, self.end, at);
                self.end = at + n;
                return Ok((last as u32, at));
            }
        }
        // A new chunk: twice the last, or what the limit leaves, and at least the block.
        let size = self
            .chunks
            .last()
            .map_or(FIRST_CHUNK, |c| (c.len() * 2).min(MAX_CHUNK))
            .min(self.max_bytes.saturating_sub(self.bytes))
            .max(n);
        if self.bytes + size > self.max_bytes || self.chunks.len() >= u32::MAX as usize {
            return Err(RingError::Invalid("the ring arena is full"));
        }
        let mem = SharedMemory::create("softrdma-rings", size)?;
        if let Some(last) = self.chunks.len().checked_sub(1) {
            let len = self.chunks[last].len();
            self.give_back(last as u32, self.end, len);
        }
        self.chunks.push(Arc::new(mem));
        self.bytes += size;
        self.end = n;
        Ok((self.chunks.len() as u32 - 1, 0))
    }
}

impl RingArena {
    /// An empty arena whose chunks may take `max_bytes` together.
    pub fn new(max_bytes: usize) -> RingArena {
        RingArena {
            inner: Arc::new(Mutex::new(Inner {
                chunks: Vec::new(),
                free: std::array::from_fn(|_| Vec::new()),
                end: 0,
                bytes: 0,
                max_bytes,
                live: 0,
            })),
        }
    }

    /// A new ring of `capacity` entries of `entry_size` bytes (see [`Ring::bytes_for`]) in
    /// the arena: this process's end, and where the peer finds it.
    pub fn create_ring(
        &self,
        capacity: u32,
        entry_size: usize,
        role: Role,
    ) -> Result<(Ring, RingPlace), RingError> {
        let len = Ring::bytes_for(capacity, entry_size)?;
        let class = class_of(len).ok_or(RingError::Invalid("ring too large"))?;
        let (chunk, offset, mem) = {
            let mut a = lock(&self.inner);
            let (chunk, offset) = a.take(class)?;
            a.live += 1;
            (chunk, offset, a.chunks[chunk as usize].clone())
        };
        // From here the block goes back to the lists whatever happens.
        let block = Block {
            arena: self.inner.clone(),
            chunk,
            offset,
            class,
        };
        let ring = Ring::init_at(mem, offset, capacity, entry_size, role, Some(block))?;
        let place = RingPlace {
            chunk,
            offset: offset as u64,
            len: len as u64,
        };
        Ok((ring, place))
    }

    /// A descriptor of chunk `chunk`'s file, to hand to the client.
    pub fn chunk_fd(&self, chunk: u32) -> std::io::Result<OwnedFd> {
        let a = lock(&self.inner);
        let fd = a
            .chunks
            .get(chunk as usize)
            .and_then(|c| c.fd())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        fd.try_clone_to_owned()
    }

    /// How many chunks (mappings) the arena has.
    pub fn chunks(&self) -> usize {
        lock(&self.inner).chunks.len()
    }

    /// Bytes of all chunks together.
    pub fn bytes(&self) -> usize {
        lock(&self.inner).bytes
    }

    /// Rings alive in the arena.
    pub fn live(&self) -> usize {
        lock(&self.inner).live
    }
}

/// The client's mappings of its connection's arena chunks, each mapped once, by number.
#[derive(Debug, Default)]
pub struct ArenaMap {
    chunks: HashMap<u32, (Arc<SharedMemory>, OwnedFd)>,
}

impl ArenaMap {
    /// Whether chunk `chunk` is mapped.
    pub fn has(&self, chunk: u32) -> bool {
        self.chunks.contains_key(&chunk)
    }

    /// Map chunk `chunk` from its file (the daemon's, sealed against shrinking, at most
    /// [`MAX_CHUNK`] bytes). A chunk mapped already is kept as it is.
    pub fn insert(&mut self, chunk: u32, fd: OwnedFd) -> Result<(), RingError> {
        if self.has(chunk) {
            return Ok(());
        }
        let st = rustix::fs::fstat(&fd).map_err(|e| RingError::Io {
            what: "fstat",
            source: e.into(),
        })?;
        let len = u64::try_from(st.st_size)
            .ok()
            .filter(|&n| n > 0 && n <= MAX_CHUNK as u64)
            .ok_or(RingError::Invalid("arena chunk size"))?;
        let mem = SharedMemory::map_client(&fd, 0, len)?;
        self.chunks.insert(chunk, (Arc::new(mem), fd));
        Ok(())
    }

    /// This end of the ring at `place` (its chunk mapped before): the place and the
    /// header are checked ([`Ring::open_at`]).
    pub fn open(&self, place: RingPlace, role: Role) -> Result<Ring, RingError> {
        let (mem, _) = self
            .chunks
            .get(&place.chunk)
            .ok_or(RingError::Invalid("no such arena chunk"))?;
        Ring::open_at(mem.clone(), place.offset, place.len, role)
    }

    /// The file of chunk `chunk` (tools and tests that write rings by hand).
    pub fn fd(&self, chunk: u32) -> Option<BorrowedFd<'_>> {
        self.chunks.get(&chunk).map(|(_, fd)| fd.as_fd())
    }

    /// How many chunks are mapped.
    pub fn len(&self) -> usize {
        self.chunks.len()
    }

    /// No chunk mapped.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The daemon's arena and the client's map of it, every chunk handed over.
    fn pair(max: usize) -> (RingArena, ArenaMap) {
        (RingArena::new(max), ArenaMap::default())
    }

    fn share(a: &RingArena, m: &mut ArenaMap, place: RingPlace) {
        if !m.has(place.chunk) {
            m.insert(place.chunk, a.chunk_fd(place.chunk).unwrap())
                .unwrap();
        }
    }

    #[test]
    fn rings_of_an_arena_carry_entries_between_two_mappings() {
        let (a, mut m) = pair(1 << 30);
        let mut ends = Vec::new();
        for i in 0..100u32 {
            let cap = 1 << (i % 6);
            let (p, place) = a
                .create_ring(cap, 8 * (1 + i as usize % 5), Role::Producer)
                .unwrap();
            share(&a, &mut m, place);
            let c = m.open(place, Role::Consumer).unwrap();
            assert_eq!(
                (c.capacity(), c.entry_size()),
                (p.capacity(), p.entry_size())
            );
            assert_eq!(place.offset % 64, 0);
            ends.push((p, c, i));
        }
        assert_eq!(a.chunks(), 1, "a hundred small rings in the first chunk");
        assert_eq!(m.len(), 1);
        for (p, c, i) in &mut ends {
            assert!(p.push(&i.to_ne_bytes()).unwrap());
            let _ = c;
        }
        // Each ring holds its own entry: no two overlap.
        for (_, c, i) in &mut ends {
            let mut out = vec![0u8; c.entry_size()];
            assert!(c.pop(&mut out).unwrap());
            assert_eq!(&out[..4], &i.to_ne_bytes());
            assert!(!c.pop(&mut out).unwrap());
        }
        assert_eq!(a.live(), 100);
        drop(ends);
        assert_eq!(a.live(), 0);
    }

    /// Destroying and creating rings in a loop, of mixed sizes, reuses the blocks given
    /// back: the arena stops growing after the first round.
    #[test]
    fn freed_blocks_are_reused_and_the_arena_does_not_grow() {
        let a = RingArena::new(1 << 34);
        let sizes = [
            (1u32, 64usize),
            (128, 112),
            (128, 32),
            (4096, 112),
            (16, 64),
            (8192, 608),
        ];
        let round = |a: &RingArena| {
            let rings: Vec<_> = (0..300)
                .map(|i| {
                    let (cap, entry) = sizes[i % sizes.len()];
                    a.create_ring(cap, entry, Role::Consumer).unwrap()
                })
                .collect();
            let mut places: Vec<_> = rings.iter().map(|(_, p)| *p).collect();
            places.sort_by_key(|p| (p.chunk, p.offset));
            for w in places.windows(2) {
                assert!(
                    w[0].chunk != w[1].chunk || w[0].offset + w[0].len <= w[1].offset,
                    "{:?} overlaps {:?}",
                    w[0],
                    w[1]
                );
            }
            drop(rings);
        };
        round(&a);
        let (chunks, bytes) = (a.chunks(), a.bytes());
        for _ in 0..20 {
            round(&a);
        }
        assert_eq!((a.chunks(), a.bytes()), (chunks, bytes));
        assert_eq!(a.live(), 0);
    }

    #[test]
    fn a_reused_block_starts_as_a_new_ring() {
        let (a, mut m) = pair(1 << 30);
        let (mut p, place) = a.create_ring(8, 64, Role::Producer).unwrap();
        share(&a, &mut m, place);
        let mut c = m.open(place, Role::Consumer).unwrap();
        for i in 0..5u8 {
            assert!(p.push(&[i]).unwrap());
        }
        let mut out = [0u8; 64];
        assert!(c.pop(&mut out).unwrap());
        p.set_backlog(true);
        drop((p, c));
        let (mut p2, place2) = a.create_ring(8, 64, Role::Producer).unwrap();
        assert_eq!(place2, place, "the same block, reused");
        let mut c2 = m.open(place2, Role::Consumer).unwrap();
        assert!(c2.is_empty().unwrap(), "indices start over");
        assert!(!c2.take_backlog(), "so does the backlog word");
        assert!(p2.push(&[42]).unwrap());
        assert!(c2.pop(&mut out).unwrap());
        assert_eq!(out[0], 42);
    }

    #[test]
    fn chunks_grow_to_the_limit_and_no_further() {
        let a = RingArena::new(3 * FIRST_CHUNK);
        // 1 MiB rings (block 2 MiB: the first chunk is too small, the second has room).
        let big = |a: &RingArena| a.create_ring(1 << 14, 64, Role::Consumer);
        let r1 = big(&a).unwrap();
        assert_eq!(a.chunks(), 1);
        assert_eq!(a.bytes(), 2 * FIRST_CHUNK, "a chunk as large as the block");
        // A small ring gets a chunk of what the limit leaves.
        let r2 = a.create_ring(1, 64, Role::Consumer).unwrap();
        assert_eq!((a.chunks(), a.bytes()), (2, 3 * FIRST_CHUNK));
        assert!(
            matches!(big(&a), Err(RingError::Invalid(_))),
            "over the limit"
        );
        drop(r1);
        let r3 = big(&a).unwrap();
        assert_eq!(a.chunks(), 2, "the block given back");
        drop((r2, r3));
        assert!(RingArena::new(0)
            .create_ring(1, 64, Role::Consumer)
            .is_err());
    }

    /// Write `value` at byte `at` of `mem`, as a hostile client can.
    #[allow(unsafe_code)]
    fn scribble(mem: &SharedMemory, at: usize, value: u8) {
        assert!(at < mem.len());
        // SAFETY: inside the mapping (checked above); the rings only use atomic or volatile
        // accesses of these bytes, and no Rust reference points into them.
        unsafe { mem.as_ptr().add(at).write_volatile(value) };
    }

    /// A client that scribbles anywhere in a chunk breaks its own rings: the ring made there
    /// reports it, and views named by a hostile daemon are refused.
    #[test]
    fn garbage_in_a_chunk_and_bad_places_are_errors() {
        let (a, mut m) = pair(1 << 30);
        let (mut d, place) = a.create_ring(8, 64, Role::Consumer).unwrap();
        share(&a, &mut m, place);
        // Bad places.
        for bad in [
            RingPlace {
                offset: place.offset + 8,
                ..place
            },
            RingPlace {
                len: place.len + 64,
                ..place
            },
            RingPlace { len: 100, ..place },
            RingPlace {
                offset: u64::MAX - 64,
                ..place
            },
            RingPlace {
                offset: FIRST_CHUNK as u64 - 192,
                len: 192 + 64 * 8,
                ..place
            },
            RingPlace { chunk: 9, ..place },
        ] {
            assert!(m.open(bad, Role::Producer).is_err(), "{bad:?}");
        }
        // Garbage over the whole ring: the header no longer matches, and the daemon's end
        // sees an impossible index.
        let p = m.open(place, Role::Producer).unwrap();
        let fd = m.fd(place.chunk).unwrap();
        let junk = SharedMemory::map_client(&fd, 0, FIRST_CHUNK as u64).unwrap();
        let mut x = 0x2545_f491u32;
        for i in 0..place.len as usize {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            scribble(&junk, place.offset as usize + i, x as u8);
        }
        drop(p);
        assert!(m.open(place, Role::Producer).is_err(), "garbage header");
        let mut out = [0u8; 64];
        let r = d.pop(&mut out);
        assert!(
            matches!(r, Err(RingError::Corrupt { .. }) | Ok(_)),
            "never a panic: {r:?}"
        );
        // A file too large to be a chunk, and a file that can shrink, are refused.
        let loose = rustix::fs::memfd_create("loose", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&loose, 4096).unwrap();
        assert!(m.insert(5, loose).is_err());
    }
}
