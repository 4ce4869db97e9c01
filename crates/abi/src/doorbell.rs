//! The doorbell page: how a client tells the daemon which of its work rings hold new WQEs,
//! so that the daemon looks only at those ([`crate::proto::Request::DoorbellPage`]).
//!
//! One page per connection and device, in a sealed `memfd` the daemon creates and hands to
//! the client (SCM_RIGHTS). Each work ring of that connection on that device has a bit in
//! it (the answer to [`crate::proto::Request::AttachWorkRing`] says which).
//!
//! Layout (native byte order; the sleeping word and the bitmap each on their own cache
//! lines):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic [`DOORBELL_MAGIC`], version, bits ([`BITS`]) |
//! | 64 | sleeping word: non-zero while the daemon's progress thread sleeps and wants the device's eventfd written |
//! | 128 | bitmap: [`BITS`] / 64 words of 64 bits, bit `b` of word `w` for ring `64 w + b` |
//!
//! After pushing a WQE the client sets its ring's bit, then reads the sleeping word and
//! writes the device's eventfd doorbell only if it is set. The daemon swaps each non-zero
//! word of the bitmap to zero and drains the rings whose bits were set. The page is the
//! client's to scribble on: the daemon reads nothing from it but the bitmap, and a bit that
//! names no ring, or an empty one, only costs it a look at the client's own rings. The file
//! is sealed against shrinking.
//!
//! # No doorbell is lost
//!
//! The client's post is `push` (the ring's producer index, Release), full fence, set the bit
//! (skipped if it reads as set already), full fence, read the sleeping word. The daemon
//! going to sleep is: set the sleeping word, full fence, read the bitmap ([`DoorbellPage::
//! set_sleeping`], [`DoorbellPage::rung`]); taking work is: swap the bitmap's words to zero,
//! full fence, read the rings ([`DoorbellPage::take`], [`DoorbellPage::taken`]). Each pair
//! is the store-buffering pattern with sequentially consistent fences between each side's
//! store and load, so at least one side sees the other's store:
//!
//! - the client finds the word clear, or the daemon finds the bit set before it sleeps (it
//!   then stays awake and takes the WQE);
//! - a client that skipped setting its bit because it read it set read it before the
//!   daemon's swap cleared it, so the daemon, reading the ring after its fence, sees the
//!   producer index the client published before its own fence: that swap's drain takes the
//!   WQE (or leaves the ring for the daemon's next pass if it stopped early).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::ring::RingError;
use crate::shm::SharedMemory;

/// First word of a doorbell page: `"SRDB"`.
pub const DOORBELL_MAGIC: u32 = u32::from_le_bytes(*b"SRDB");
const VERSION: u32 = 1;
/// Bits in a page: the most work rings a connection may have on one device.
pub const BITS: u32 = 4096;
/// Words of the bitmap.
pub const WORDS: usize = BITS as usize / 64;
const SLEEPING: usize = 64;
const BITMAP: usize = 128;
const LEN: usize = BITMAP + WORDS * 8;

/// Which end of the page this mapping is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The daemon: sets the sleeping word, takes the bits.
    Daemon,
    /// The client: sets bits, reads the sleeping word.
    Client,
}

/// One mapping of a doorbell page, used as one end.
#[derive(Debug)]
pub struct DoorbellPage {
    mem: SharedMemory,
    side: Side,
}

impl DoorbellPage {
    /// The daemon's end of a new page in a new sealed memfd, and that file (kept by the
    /// daemon, which may hand a copy of it to its client more than once).
    pub fn create() -> Result<(DoorbellPage, OwnedFd), RingError> {
        let mut mem = SharedMemory::create("softrdma-doorbell", LEN)?;
        let fd = mem.take_fd().ok_or(RingError::Invalid("no file"))?;
        let page = DoorbellPage {
            mem,
            side: Side::Daemon,
        };
        page.word32(0).store(DOORBELL_MAGIC, Ordering::Relaxed);
        page.word32(4).store(VERSION, Ordering::Relaxed);
        page.word32(8).store(BITS, Ordering::Release);
        Ok((page, fd))
    }

    /// The client's end: map a page received from the daemon and check its header.
    pub fn open(fd: &impl AsFd) -> Result<DoorbellPage, RingError> {
        let st = rustix::fs::fstat(fd).map_err(|e| RingError::Io {
            what: "fstat",
            source: e.into(),
        })?;
        if usize::try_from(st.st_size).map_or(true, |n| n < LEN) {
            return Err(RingError::Invalid("doorbell page too short"));
        }
        let page = DoorbellPage {
            mem: SharedMemory::map_client(fd, 0, LEN as u64)?,
            side: Side::Client,
        };
        if page.word32(0).load(Ordering::Acquire) != DOORBELL_MAGIC
            || page.word32(4).load(Ordering::Relaxed) != VERSION
            || page.word32(8).load(Ordering::Relaxed) != BITS
        {
            return Err(RingError::Invalid("not a doorbell page of this version"));
        }
        Ok(page)
    }

    /// Which end this mapping is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The 32-bit word at byte `off` of the header, as an atomic shared with the peer.
    #[allow(unsafe_code)]
    fn word32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= BITMAP);
        // SAFETY: `off + 4 <= BITMAP < LEN <= len` (both ends map `LEN` bytes), the mapping
        // is page-aligned so the word is 4-aligned, it lives as long as `self`, and the peer
        // only ever accesses it atomically too.
        unsafe { AtomicU32::from_ptr(self.mem.as_ptr().add(off).cast::<u32>()) }
    }

    /// Word `i` of the bitmap (`i < WORDS`, which every caller ensures: `Option` would only
    /// move the check).
    #[allow(unsafe_code)]
    fn bits(&self, i: usize) -> &AtomicU64 {
        assert!(i < WORDS, "bitmap word {i} of {WORDS}");
        // SAFETY: `BITMAP + 8 * i + 8 <= LEN <= len`; 8-aligned (page-aligned mapping,
        // `BITMAP` a multiple of 8); lives as long as `self`; the peer only accesses it
        // atomically.
        unsafe { AtomicU64::from_ptr(self.mem.as_ptr().add(BITMAP + 8 * i).cast::<u64>()) }
    }

    /// Daemon: tell the client whether it must write the eventfd after setting a bit (true
    /// before the progress thread sleeps). Followed by a full fence: a daemon that then finds
    /// no bit set ([`DoorbellPage::rung`]) may sleep, because a client that set a bit after
    /// this store also sees it (see the module's "No doorbell is lost").
    pub fn set_sleeping(&self, sleeping: bool) {
        self.word32(SLEEPING)
            .store(u32::from(sleeping), Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Daemon: whether any bit is set (read only: nothing is taken).
    pub fn rung(&self) -> bool {
        (0..WORDS).any(|i| self.bits(i).load(Ordering::SeqCst) != 0)
    }

    /// Daemon: take bitmap word `i` (`i < WORDS`): its bits, cleared in the page. A word
    /// that reads zero is not written (the client's cache line stays shared). Call
    /// [`DoorbellPage::taken`] before reading the rings the bits name.
    pub fn take(&self, i: usize) -> u64 {
        let w = self.bits(i);
        if w.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        w.swap(0, Ordering::SeqCst)
    }

    /// Daemon: after [`DoorbellPage::take`], before reading the rings: a full fence, so that a
    /// client that saw its bit still set (and did not set it again) published its WQE where
    /// this drain sees it.
    pub fn taken(&self) {
        fence(Ordering::SeqCst);
    }

    /// Client, after a push into the ring of bit `bit`: set the bit, and say whether the
    /// daemon sleeps (write the device's eventfd then). A bit past [`BITS`] is refused.
    pub fn ring(&self, bit: u32) -> Result<bool, RingError> {
        if bit >= BITS {
            return Err(RingError::Invalid("no such doorbell bit"));
        }
        let w = self.bits(bit as usize / 64);
        let mask = 1u64 << (bit % 64);
        // Orders the push before the read of the bit (see the module docs).
        fence(Ordering::SeqCst);
        // Read first: while the daemon has not taken the bit, the shared line is not
        // written again.
        if w.load(Ordering::SeqCst) & mask == 0 {
            w.fetch_or(mask, Ordering::SeqCst);
        }
        Ok(self.daemon_sleeps())
    }

    /// Client: whether the daemon said it sleeps. The full fence orders the bit set before
    /// this read.
    pub fn daemon_sleeps(&self) -> bool {
        fence(Ordering::SeqCst);
        self.word32(SLEEPING).load(Ordering::SeqCst) != 0
    }

    /// Client: set bitmap word `i` to `bits` as is, whatever rings they name (for tests of
    /// a hostile client; `i < WORDS`).
    pub fn scribble(&self, i: usize, bits: u64) {
        self.bits(i).store(bits, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Ring, Role};
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn bits_cross_from_client_to_daemon_once() {
        let (d, fd) = DoorbellPage::create().unwrap();
        let c = DoorbellPage::open(&fd).unwrap();
        assert!(!d.rung());
        assert!(!c.ring(0).unwrap());
        assert!(!c.ring(70).unwrap());
        assert!(!c.ring(BITS - 1).unwrap());
        assert!(c.ring(BITS).is_err());
        assert!(d.rung());
        assert_eq!(d.take(0), 1);
        assert_eq!(d.take(1), 1 << 6);
        assert_eq!(d.take(WORDS - 1), 1 << 63);
        assert!(!d.rung());
        assert_eq!(d.take(0), 0, "taken once");
        d.set_sleeping(true);
        assert!(c.daemon_sleeps());
        assert!(c.ring(5).unwrap());
        d.set_sleeping(false);
        assert!(!c.daemon_sleeps());
    }

    #[test]
    fn a_file_that_is_not_a_doorbell_page_is_refused() {
        let junk = rustix::fs::memfd_create("junk", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&junk, 4096).unwrap();
        assert!(DoorbellPage::open(&junk).is_err(), "not sealed");
        let (_ring, ring_fd) = Ring::create(64, 64, Role::Consumer).unwrap();
        assert!(DoorbellPage::open(&ring_fd).is_err(), "a ring, not a page");
    }

    /// The daemon's progress loop against a client posting while it goes to sleep: the
    /// client posts one entry at a time and waits for it to be taken, so a doorbell lost
    /// while the daemon fell asleep leaves the entry in the ring for good (the "eventfd" is
    /// a channel).
    #[test]
    fn no_post_is_lost_while_the_daemon_goes_to_sleep() {
        const POSTS: u32 = 5_000;
        let (page, page_fd) = DoorbellPage::create().unwrap();
        let (mut ring, ring_fd) = Ring::create(64, 8, Role::Consumer).unwrap();
        let (bell, rung) = mpsc::channel::<()>();
        let client = std::thread::spawn(move || {
            let page = DoorbellPage::open(&page_fd).unwrap();
            let mut ring = Ring::open(&ring_fd, Role::Producer).unwrap();
            let mut rang = 0u32;
            for i in 0..POSTS {
                assert!(ring.push(&u64::from(i).to_ne_bytes()).unwrap());
                if page.ring(77).unwrap() {
                    rang += 1;
                    bell.send(()).unwrap();
                }
                let deadline = std::time::Instant::now() + Duration::from_secs(5);
                while ring.free().unwrap() < 64 {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "lost doorbell: post {i} was never taken"
                    );
                    std::thread::yield_now();
                }
                // Post at varying points of the daemon's way to sleep.
                for _ in 0..(i * 7919) % 256 {
                    std::hint::spin_loop();
                }
            }
            rang
        });
        let mut next = 0u32;
        let mut entry = [0u8; 8];
        let mut sleeps = 0u32;
        while next < POSTS {
            let bits = page.take(1);
            page.taken();
            if bits & (1 << 13) != 0 {
                while ring.pop(&mut entry).unwrap() {
                    assert_eq!(u64::from_ne_bytes(entry), u64::from(next));
                    next += 1;
                }
            }
            if next == POSTS {
                break;
            }
            for _ in 0..(next * 104_729) % 256 {
                std::hint::spin_loop();
            }
            // Going to sleep: ask for doorbells, then look once more.
            page.set_sleeping(true);
            if page.rung() {
                page.set_sleeping(false);
                continue;
            }
            sleeps += 1;
            if rung.recv().is_err() {
                // The client gave up (and says why when joined).
                break;
            }
            page.set_sleeping(false);
        }
        let rang = client.join().unwrap();
        assert_eq!(next, POSTS);
        assert!(
            sleeps > 0 && rang > 0,
            "{sleeps} sleeps, {rang} doorbells: never slept"
        );
    }

    #[test]
    fn garbage_in_the_page_is_only_bits() {
        let (d, fd) = DoorbellPage::create().unwrap();
        let c = DoorbellPage::open(&fd).unwrap();
        for i in 0..WORDS {
            c.scribble(i, u64::MAX);
        }
        c.word32(SLEEPING).store(0xdead_beef, Ordering::Relaxed);
        c.word32(0).store(0, Ordering::Relaxed);
        assert!(d.rung());
        assert!((0..WORDS).all(|i| d.take(i) == u64::MAX));
        assert!(!d.rung());
    }
}
