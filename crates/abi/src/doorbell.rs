//! The doorbell page: how a client tells the daemon which of its work rings hold new WQEs,
//! and which of its CQs it armed, so that the daemon looks only at those
//! ([`crate::proto::Request::DoorbellPage`]).
//!
//! One page per connection and device, in a sealed `memfd` the daemon creates and hands to
//! the client (SCM_RIGHTS). Each work ring of that connection on that device has a bit in
//! it (the answer to [`crate::proto::Request::AttachWorkRing`] says which), and so does
//! each CQ armed in place ([`crate::proto::Request::AttachCqArm`]: the client writes the
//! CQ ring's arm word, [`crate::ring::Ring::arm`], where it would push a WQE, and rings
//! the bit the same way).
//!
//! Layout (native byte order; the sleeping word, the waiting words, the summary and the
//! bitmap each on cache lines of their own):
//!
//! | offset | field |
//! |---|---|
//! | 0 | magic [`DOORBELL_MAGIC`], version, bits ([`BITS`]) |
//! | 64 | sleeping word: non-zero while the daemon's progress thread sleeps and wants the device's eventfd written |
//! | 128 | waiter count: the client's threads asleep until completions come ([`DoorbellPage::wait_for_completions`]) |
//! | 132 | wake word: the futex those threads sleep on, bumped by the daemon to wake them |
//! | 192 | summary: [`SUMMARY_WORDS`] words of 64 bits, bit `b` of word `s` for bitmap word `64 s + b` |
//! | 320 | bitmap: [`WORDS`] words of 64 bits, bit `b` of word `w` for ring `64 w + b` |
//!
//! Two levels, so that the daemon looks at [`SUMMARY_WORDS`] words per pass, not [`WORDS`]:
//! after pushing a WQE the client sets its ring's bit, then the summary bit of the ring's
//! word, then reads the sleeping word and writes the device's eventfd doorbell only if it is
//! set. Each bit is read first and not written if it is set, and a ring bit found set ends
//! the post's work on the page (its summary bit was seen to by the post that set it), so a
//! stream of posts writes no shared line the daemon has not cleared since. The daemon swaps
//! each non-zero summary word to zero, then each bitmap word a bit it took names, and drains
//! the rings whose bits were set ([`DoorbellPage::take`]). The page is the client's to
//! scribble on: the daemon reads nothing from it but the summary and the bitmap, a bit that
//! names no ring, or an empty one, only costs it a look at the client's own rings, and a
//! ring bit set without its summary bit only delays that client's own posts. The file is
//! sealed against shrinking.
//!
//! # No doorbell is lost
//!
//! Every access to the summary and the bitmap, on both sides, is sequentially consistent,
//! so they all fall in one total order *S*, together with the full fences that order them
//! against the rings' indices and the sleeping word.
//!
//! - The client's post ([`DoorbellPage::ring`]): publish the ring's producer index (Release);
//!   full fence *F1*; read ring bit `r` of word `w`; if it is clear, set it, then read
//!   summary bit `w` and set it if it is clear; full fence; read the sleeping word.
//! - A daemon pass ([`DoorbellPage::take`]): swap each non-zero summary word to zero; full
//!   fence; swap to zero each bitmap word whose summary bit it took (whatever it holds);
//!   full fence *F2*; drain the rings whose bits it took. A pass that takes no summary bit
//!   stops at once, fences and all: it drains no ring on account of a bit, and the points
//!   below are about the pass that takes one.
//! - The daemon going to sleep: set the sleeping word ([`DoorbellPage::set_sleeping`]);
//!   full fence; read the summary ([`DoorbellPage::rung`]); sleep only if it is all zero.
//!
//! Only the daemon clears bits, and only a ring's producer sets its bit, one post after
//! the other (a ring has one producer). Then:
//!
//! 1. *A post that sets bit `r` is taken by a pass after its F1.* It sets `r` at `t`, after
//!    *F1*; `r` stays set until a daemon swap of word `w` takes it. The post's access to
//!    summary bit `w` comes at `t' > t` in *S* and finds or leaves it set, until a daemon
//!    swap of the summary takes it at `ta > t'`. That pass then swaps word `w` after `ta`:
//!    it takes `r`, unless a swap of word `w` after `t` took it first. Either way a swap
//!    after *F1* takes `r`, and its pass's *F2* follows it.
//! 2. *So is a post that finds bit `r` set.* It reads `r` at `t2`, after its *F1*. The
//!    previous post of the ring set `r` (at `t1`) and then saw to summary bit `w` (point 1),
//!    all before `t2`. Point 1 for that post gives a swap of word `w` that takes `r` after
//!    `t1`; it is not before `t2`, or `r` would be clear at `t2` (no one else sets it in
//!    between). So a swap after `t2`, after this post's *F1*, takes `r`.
//! 3. *That pass sees the WQE.* *F1* precedes *F2* in *S*, so the drain's Acquire read of
//!    the producer index, after *F2*, sees the index the client published before *F1* (or
//!    a later one).
//! 4. *The daemon does not sleep through it* (the store-buffering pattern, fences between
//!    each side's access and its read). If the client's read of the sleeping word misses
//!    the daemon's store, the client's fence precedes the daemon's in *S*, so the daemon's
//!    read of the summary comes after the post's last bit access and finds the bit that
//!    post relies on set — unless the pass of point 1 or 2 took it since. Otherwise the
//!    client reads the word set and writes the eventfd.
//!
//! # Sleeping until completions come
//!
//! A client thread that polls its CQ rings in a loop and finds nothing takes CPU from the
//! daemon that would produce what it waits for; where they share a CPU with other busy
//! threads, the daemon waits for a time slice behind the pollers and the stream all but
//! stops. Such a thread may sleep instead ([`DoorbellPage::wait_for_completions`]): it
//! counts itself in the waiter count, reads the wake word, looks at its CQ once more, and
//! sleeps on the wake word (a futex: shared memory, so the kernel finds it by the file, in
//! both processes) only if it still holds the value read. The daemon, after publishing
//! completions into rings of the connection, reads the waiter count
//! ([`DoorbellPage::wake_waiters`]) and, if it is not zero, bumps the wake word and wakes
//! its sleepers. Both sides put a full fence between their write and their read (the
//! store-buffering pattern, as for the sleeping word): a client whose look missed the
//! daemon's producer index is counted where the daemon reads, so the wake word moves after
//! the client read it and its sleep ends at once or is woken. The sleeps are bounded by
//! the client's own timeout, so a waiter count left set by a dead or hostile client costs
//! the daemon a wake per delivery to that connection, and nothing else.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use rustix::thread::futex;

use crate::ring::RingError;
use crate::shm::SharedMemory;

/// First word of a doorbell page: `"SRDB"`.
pub const DOORBELL_MAGIC: u32 = u32::from_le_bytes(*b"SRDB");
/// 3: the waiting words.
const VERSION: u32 = 3;
/// Bits in a page: the most work rings a connection may have on one device.
pub const BITS: u32 = 1 << 16;
/// Words of the bitmap.
pub const WORDS: usize = BITS as usize / 64;
/// Words of the summary (one bit per bitmap word).
pub const SUMMARY_WORDS: usize = WORDS / 64;

/// Summary words that cover the first `words` bitmap words.
fn summary_words(words: usize) -> usize {
    words.min(WORDS).div_ceil(64)
}
const SLEEPING: usize = 64;
const WAITERS: usize = 128;
const WAKE: usize = 132;
const SUMMARY: usize = 192;
const BITMAP: usize = SUMMARY + 2 * 64;
const LEN: usize = BITMAP + WORDS * 8;

const _: () = assert!(SUMMARY + SUMMARY_WORDS * 8 <= BITMAP);

/// How [`DoorbellPage::wait_for_completions`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// What the caller waits for was there: no sleep.
    Ready,
    /// The daemon delivered completions to the connection (or the sleep was interrupted).
    Woken,
    /// Nothing came in the time given.
    TimedOut,
}

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
        debug_assert!(off.is_multiple_of(4) && off + 4 <= SUMMARY);
        // SAFETY: `off + 4 <= SUMMARY < LEN <= len` (both ends map `LEN` bytes), the mapping
        // is page-aligned so the word is 4-aligned, it lives as long as `self`, and the peer
        // only ever accesses it atomically too.
        unsafe { AtomicU32::from_ptr(self.mem.as_ptr().add(off).cast::<u32>()) }
    }

    /// The 64-bit word at byte `off` (summary or bitmap), as an atomic shared with the peer.
    #[allow(unsafe_code)]
    fn word64(&self, off: usize) -> &AtomicU64 {
        assert!(
            (SUMMARY..LEN).contains(&off) && off.is_multiple_of(8),
            "page word at {off}"
        );
        // SAFETY: `off + 8 <= LEN <= len` (checked above; `LEN` is a multiple of 8);
        // 8-aligned (page-aligned mapping, `off` a multiple of 8); lives as long as `self`;
        // the peer only accesses it atomically.
        unsafe { AtomicU64::from_ptr(self.mem.as_ptr().add(off).cast::<u64>()) }
    }

    /// Word `i` of the bitmap (`i < WORDS`, which every caller ensures: `Option` would only
    /// move the check).
    fn bits(&self, i: usize) -> &AtomicU64 {
        assert!(i < WORDS, "bitmap word {i} of {WORDS}");
        self.word64(BITMAP + 8 * i)
    }

    /// Word `i` of the summary (`i < SUMMARY_WORDS`, ensured by every caller).
    fn summary(&self, i: usize) -> &AtomicU64 {
        assert!(i < SUMMARY_WORDS, "summary word {i} of {SUMMARY_WORDS}");
        self.word64(SUMMARY + 8 * i)
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

    /// Daemon: whether any summary bit of the first `words` bitmap words is set (read
    /// only: nothing is taken). Bits past the words a connection uses name nothing.
    pub fn rung(&self, words: usize) -> bool {
        (0..summary_words(words)).any(|i| self.summary(i).load(Ordering::SeqCst) != 0)
    }

    /// Daemon: take the bits that are set among the first `words` bitmap words (those a
    /// connection's rings use: bits past them name nothing, and are neither read nor
    /// cleared), level by level with a full fence after each, and call `each(w, bits)` for
    /// every bitmap word `w` that held some. A summary word that reads zero is not written
    /// (the client's cache line stays shared). After it returns, the rings the bits name
    /// may be read: a client that found its bits still set published its WQE where this
    /// drain sees it.
    pub fn take(&self, words: usize, mut each: impl FnMut(usize, u64)) {
        let mut taken = [0u64; SUMMARY_WORDS];
        let mut any = false;
        let n = summary_words(words);
        for (i, t) in taken.iter_mut().enumerate().take(n) {
            let s = self.summary(i);
            if s.load(Ordering::SeqCst) != 0 {
                *t = s.swap(0, Ordering::SeqCst);
                any |= *t != 0;
            }
        }
        if !any {
            // Nothing taken, so no ring is drained on its bit's word and there is nothing
            // for the fences to order (see "No doorbell is lost": a post this pass missed
            // leaves its bits set for the next). An idle connection's page costs a pass
            // its summary loads alone, not two full fences.
            return;
        }
        fence(Ordering::SeqCst);
        let words = words.min(WORDS);
        for (i, mut t) in taken.into_iter().enumerate() {
            while t != 0 {
                let w = i * 64 + t.trailing_zeros() as usize;
                t &= t - 1;
                // Swapped whatever it reads: the summary bit was the word's only mark (and a
                // word past those in use, which names nothing, is cleared all the same, so
                // that no stale bit stands in for a later post once a ring uses it).
                let bits = self.bits(w).swap(0, Ordering::SeqCst);
                if bits != 0 && w < words {
                    each(w, bits);
                }
            }
        }
        fence(Ordering::SeqCst);
    }

    /// Client, after a push into the ring of bit `bit` (by that ring's only producer): set
    /// the bit and its summary bit, and say whether the daemon sleeps (write the device's
    /// eventfd then). A bit past [`BITS`] is refused.
    pub fn ring(&self, bit: u32) -> Result<bool, RingError> {
        if bit >= BITS {
            return Err(RingError::Invalid("no such doorbell bit"));
        }
        let w = bit as usize / 64;
        let word = self.bits(w);
        let mask = 1u64 << (bit % 64);
        // Orders the push before the bits (see the module docs).
        fence(Ordering::SeqCst);
        // Read first: while the daemon has not taken a bit, its shared line is not written
        // again. A ring bit found set was set by this ring's previous post, which went on to
        // the summary bit: nothing more to do (see the module docs).
        if word.load(Ordering::SeqCst) & mask == 0 {
            word.fetch_or(mask, Ordering::SeqCst);
            let summary = self.summary(w / 64);
            let smask = 1u64 << (w % 64);
            if summary.load(Ordering::SeqCst) & smask == 0 {
                summary.fetch_or(smask, Ordering::SeqCst);
            }
        }
        Ok(self.daemon_sleeps())
    }

    /// Client: whether the daemon said it sleeps. The full fence orders the bits set before
    /// this read.
    pub fn daemon_sleeps(&self) -> bool {
        fence(Ordering::SeqCst);
        self.word32(SLEEPING).load(Ordering::SeqCst) != 0
    }

    /// Daemon, after publishing completions into CQ rings of this page's connection: wake
    /// the client's threads that sleep until completions come
    /// ([`DoorbellPage::wait_for_completions`]). Returns whether any was counted (then the
    /// wake word moved and one system call woke them). The full fence orders the rings'
    /// producer indices before the read of the count (see "Sleeping until completions
    /// come").
    pub fn wake_waiters(&self) -> bool {
        fence(Ordering::SeqCst);
        if self.word32(WAITERS).load(Ordering::SeqCst) == 0 {
            return false;
        }
        let wake = self.word32(WAKE);
        wake.fetch_add(1, Ordering::SeqCst);
        // Nothing to do about a failure: the sleepers' own timeouts end their sleep.
        let _ = futex::wake(wake, futex::Flags::empty(), u32::MAX);
        true
    }

    /// Client: sleep until the daemon publishes completions into a CQ ring of this
    /// connection, or `timeout` passes, unless `ready` (called after this thread counted
    /// itself as a waiter, so a completion it misses wakes it) says that what the caller
    /// waits for is there already.
    pub fn wait_for_completions(&self, timeout: Duration, ready: impl FnOnce() -> bool) -> Waited {
        let waiters = self.word32(WAITERS);
        let wake = self.word32(WAKE);
        waiters.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let seen = wake.load(Ordering::SeqCst);
        let waited = if ready() {
            Waited::Ready
        } else {
            // A timeout too long for a timespec sleeps until woken.
            let t = futex::Timespec::try_from(timeout).ok();
            match futex::wait(wake, futex::Flags::empty(), seen, t.as_ref()) {
                Err(rustix::io::Errno::TIMEDOUT) => Waited::TimedOut,
                // Woken, or the word moved before the sleep began (a delivery came), or a
                // signal: the caller looks again.
                _ => Waited::Woken,
            }
        };
        waiters.fetch_sub(1, Ordering::SeqCst);
        waited
    }

    /// Client: set bitmap word `i` to `bits` as is, whatever rings they name, and no summary
    /// bit (for tests of a hostile client; `i < WORDS`).
    pub fn scribble(&self, i: usize, bits: u64) {
        self.bits(i).store(bits, Ordering::SeqCst);
    }

    /// Client: set summary word `i` to `bits` as is (for tests of a hostile client;
    /// `i < SUMMARY_WORDS`).
    pub fn scribble_summary(&self, i: usize, bits: u64) {
        self.summary(i).store(bits, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Ring, Role};
    use std::sync::mpsc;
    use std::time::Duration;

    /// What one pass of the daemon takes: (word, bits) in word order.
    fn taken(page: &DoorbellPage) -> Vec<(usize, u64)> {
        let mut v = Vec::new();
        page.take(WORDS, |w, bits| v.push((w, bits)));
        v
    }

    #[test]
    fn a_pass_looks_only_at_the_words_a_connection_uses() {
        let (d, fd) = DoorbellPage::create().unwrap();
        let c = DoorbellPage::open(&fd).unwrap();
        // A connection with 70 rings uses bitmap words 0 and 1 (summary word 0 alone).
        assert!(!c.ring(69).unwrap());
        assert!(
            !c.ring(4096).unwrap(),
            "a bit past its rings: summary word 1"
        );
        assert!(!c.ring(200).unwrap(), "past its words, in summary word 0");
        assert!(d.rung(2));
        let mut v = Vec::new();
        d.take(2, |w, bits| v.push((w, bits)));
        assert_eq!(v, [(1, 1 << 5)], "only the words in use are handed on");
        assert!(!d.rung(2), "summary word 0 was taken whole");
        // Word 3 was cleared with it: a ring given bit 200 later rings as any other.
        assert!(!c.ring(200).unwrap());
        let mut v = Vec::new();
        d.take(4, |w, bits| v.push((w, bits)));
        assert_eq!(v, [(3, 1 << 8)]);
        // Summary word 1 was never read: it still says word 64 holds a bit, for a pass
        // over every word to find.
        assert!(d.rung(WORDS));
        assert_eq!(taken(&d), [(64, 1)]);
        assert!(!d.rung(WORDS));
    }

    #[test]
    fn bits_cross_from_client_to_daemon_once() {
        let (d, fd) = DoorbellPage::create().unwrap();
        let c = DoorbellPage::open(&fd).unwrap();
        assert!(!d.rung(WORDS));
        assert!(!c.ring(0).unwrap());
        assert!(!c.ring(70).unwrap());
        assert!(!c.ring(71).unwrap());
        assert!(!c.ring(4096).unwrap());
        assert!(!c.ring(BITS - 1).unwrap());
        assert!(c.ring(BITS).is_err());
        assert!(d.rung(WORDS));
        assert_eq!(
            taken(&d),
            [(0, 1), (1, 3 << 6), (64, 1), (WORDS - 1, 1 << 63)]
        );
        assert!(!d.rung(WORDS));
        assert!(taken(&d).is_empty(), "taken once");
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

    /// The daemon's progress loop against clients posting while it goes to sleep: each
    /// client posts into its own ring, and waits until the daemon took its posts (after each
    /// one, or only when its ring is full and after the last), so a doorbell lost while the
    /// daemon fell asleep leaves entries in a ring for good (the "eventfd" is a channel).
    /// Two of the rings' bits share a bitmap word (so one client often finds the summary bit
    /// set by the other), the third is in another summary word; streaming clients often find
    /// their own ring bit still set.
    fn posts_race_the_daemon_going_to_sleep(posts: u32, wait_each: bool) {
        const BITS_USED: [u32; 3] = [64 * 5 + 1, 64 * 5 + 2, BITS - 1];
        let (page, page_fd) = DoorbellPage::create().unwrap();
        let (bell, rung) = mpsc::channel::<()>();
        let mut rings = Vec::new();
        let mut clients = Vec::new();
        for (k, bit) in BITS_USED.into_iter().enumerate() {
            let (ring, ring_fd) = Ring::create(64, 8, Role::Consumer).unwrap();
            rings.push((bit, ring, 0u32));
            let page_fd = page_fd.try_clone().unwrap();
            let bell = bell.clone();
            clients.push(std::thread::spawn(move || {
                let page = DoorbellPage::open(&page_fd).unwrap();
                let mut ring = Ring::open(&ring_fd, Role::Producer).unwrap();
                let taken = |ring: &Ring, i: u32, room: u32| {
                    let deadline = std::time::Instant::now() + Duration::from_secs(5);
                    while ring.free().unwrap() < room {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "lost doorbell: post {i} of ring {k} was never taken"
                        );
                        std::thread::yield_now();
                    }
                };
                let mut rang = 0u32;
                for i in 0..posts {
                    if !wait_each {
                        taken(&ring, i, 1);
                    }
                    assert!(ring.push(&u64::from(i).to_ne_bytes()).unwrap());
                    if page.ring(bit).unwrap() {
                        rang += 1;
                        // The daemon may have finished (a failed send is its end).
                        let _ = bell.send(());
                    }
                    if wait_each {
                        taken(&ring, i, 64);
                    }
                    // Post at varying points of the daemon's way to sleep.
                    for _ in 0..i.wrapping_mul(7919).wrapping_add(k as u32 * 31) % 256 {
                        std::hint::spin_loop();
                    }
                }
                taken(&ring, posts, 64);
                rang
            }));
        }
        drop(bell);
        let mut entry = [0u8; 8];
        let mut sleeps = 0u32;
        let done = |rings: &[(u32, Ring, u32)]| rings.iter().all(|r| r.2 == posts);
        let mut passes = 0u32;
        while !done(&rings) {
            let mut words = Vec::new();
            page.take(WORDS, |w, bits| words.push((w, bits)));
            for (bit, ring, next) in &mut rings {
                let named = words
                    .iter()
                    .any(|&(w, bits)| w == *bit as usize / 64 && bits & (1 << (*bit % 64)) != 0);
                if named {
                    while ring.pop(&mut entry).unwrap() {
                        assert_eq!(u64::from_ne_bytes(entry), u64::from(*next));
                        *next += 1;
                    }
                }
            }
            if done(&rings) {
                break;
            }
            passes += 1;
            for _ in 0..passes.wrapping_mul(104_729) % 256 {
                std::hint::spin_loop();
            }
            // Going to sleep: ask for doorbells, then look once more.
            page.set_sleeping(true);
            if page.rung(WORDS) {
                page.set_sleeping(false);
                continue;
            }
            sleeps += 1;
            if rung.recv_timeout(Duration::from_secs(10)).is_err() {
                // Every client gave up (and says why when joined), or a doorbell was lost.
                break;
            }
            page.set_sleeping(false);
        }
        let rang: u32 = clients.into_iter().map(|c| c.join().unwrap()).sum();
        for (bit, _, next) in &rings {
            assert_eq!(*next, posts, "ring of bit {bit}");
        }
        assert!(
            sleeps > 0 && rang > 0,
            "{sleeps} sleeps, {rang} doorbells: never slept"
        );
    }

    #[test]
    fn no_post_is_lost_while_the_daemon_goes_to_sleep() {
        posts_race_the_daemon_going_to_sleep(3_000, true);
    }

    #[test]
    fn no_streamed_post_is_lost_while_the_daemon_goes_to_sleep() {
        posts_race_the_daemon_going_to_sleep(20_000, false);
    }

    #[test]
    fn garbage_in_the_page_is_only_bits() {
        let (d, fd) = DoorbellPage::create().unwrap();
        let c = DoorbellPage::open(&fd).unwrap();
        // Ring bits without their summary bits are not looked at (nor cleared)...
        for i in 0..WORDS {
            c.scribble(i, u64::MAX);
        }
        assert!(!d.rung(WORDS));
        assert!(taken(&d).is_empty());
        // ...until the summary names their words.
        for i in 0..SUMMARY_WORDS {
            c.scribble_summary(i, u64::MAX);
        }
        c.word32(SLEEPING).store(0xdead_beef, Ordering::Relaxed);
        c.word32(0).store(0, Ordering::Relaxed);
        assert!(d.rung(WORDS));
        let t = taken(&d);
        assert_eq!(t.len(), WORDS);
        assert!(t
            .iter()
            .enumerate()
            .all(|(i, &(w, b))| w == i && b == u64::MAX));
        assert!(!d.rung(WORDS));
        // Summary bits naming empty words cost a look and are cleared.
        c.scribble_summary(3, 0b1010);
        assert!(d.rung(WORDS));
        assert!(taken(&d).is_empty());
        assert!(!d.rung(WORDS));
    }

    #[test]
    fn a_client_sleeps_until_completions_come_and_not_when_they_are_there() {
        let (d, fd) = DoorbellPage::create().unwrap();
        let c = DoorbellPage::open(&fd).unwrap();
        // Nobody waits: nothing to wake, no system call.
        assert!(!d.wake_waiters());
        // What the caller waits for is there: no sleep, and no waiter left counted.
        let waited = c.wait_for_completions(Duration::from_secs(5), || true);
        assert_eq!(waited, Waited::Ready);
        assert!(!d.wake_waiters());
        // Nothing comes: the sleep runs out.
        let t0 = std::time::Instant::now();
        let waited = c.wait_for_completions(Duration::from_millis(20), || false);
        assert_eq!(waited, Waited::TimedOut);
        assert!(t0.elapsed() >= Duration::from_millis(20));
        // A delivery wakes a sleeper long before its timeout: the daemon's side keeps
        // waking until the client's thread counted itself and slept.
        let (tx, rx) = mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            let waited = c.wait_for_completions(Duration::from_secs(60), || false);
            tx.send(waited).unwrap();
        });
        let woke = loop {
            if d.wake_waiters() {
                // The wake word moved after the sleeper read it: its sleep ends at once,
                // or it is woken.
                break rx.recv_timeout(Duration::from_secs(10));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(woke, Ok(Waited::Woken));
        sleeper.join().unwrap();
        assert!(!d.wake_waiters(), "the waiter count went back to zero");
    }
}
