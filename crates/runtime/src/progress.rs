//! The progress thread: takes posted work, receives, runs timers and sends whenever no
//! application thread drives the device, keeps looking for [`crate::RuntimeConfig::busy_poll`]
//! (or the polling it learned, [`crate::RuntimeConfig::adaptive_poll`]) after the last
//! activity, and sleeps in `ppoll` on the sockets and the doorbell until the engine's next
//! timer.

use std::sync::atomic::Ordering;
use std::time::Duration;

use engine::Instant;
use nix::sys::time::TimeSpec;
use smallvec::SmallVec;
use std::os::fd::AsFd;

use crate::{
    nanos, Attachment, Shared, HANDOVER, IDLE_TICK, IMPLICIT_OFF, LAPSE_WINDOW, LONG_WAIT,
};

/// The progress thread: runs timers always, and receives whenever no application thread
/// drives the socket (see `Shared::lease_until` and `Shared::drivers`).
pub(crate) fn run<A: Attachment>(shared: &Shared<A>) {
    let mut last_active = std::time::Instant::now();
    let mut learned = Learned::new(shared.adaptive_poll);
    // How long the last wait slept, if it did (rather than poll).
    let mut slept = None;
    // The last sleep left the socket to polling threads; when the last lease lapsed with
    // packets waiting. A `NonZeroU64`, so that `None` is a defined value (0): the optimised
    // `is_some_and` below subtracts before it looks at the tag, which valgrind's memcheck
    // reports as a branch on undefined bytes when `None` leaves them undefined.
    let (mut handed_over, mut last_lapse) = (false, None::<std::num::NonZeroU64>);
    while !shared.stop.load(Ordering::Relaxed) {
        let now_ns = shared.now().as_nanos();
        let drives = shared.app_drives(now_ns);
        // A pass: receive (unless an application thread does), run due timers, send.
        let n = if drives {
            if let Some(mut core) = shared.try_lock() {
                let now = shared.now();
                shared.run_timers_and_send(&mut core, now);
            }
            0
        } else {
            shared.drive_rx()
        };
        if let Some(d) = slept.take() {
            learned.after_sleep(d, n > 0, std::time::Instant::now());
        }
        if n > 0 {
            last_active = std::time::Instant::now();
            if handed_over && !drives {
                // The socket came back with packets waiting: they sat there since the
                // polling stopped. Twice within LAPSE_WINDOW: the application waits in ways
                // the runtime cannot see after polling a CQ; stop giving the socket away
                // on CQ polls for a while.
                if last_lapse.is_some_and(|t| now_ns.saturating_sub(t.get()) < nanos(LAPSE_WINDOW))
                {
                    shared.implicit_off_until.store(
                        now_ns.saturating_add(nanos(IMPLICIT_OFF)),
                        Ordering::Relaxed,
                    );
                }
                last_lapse = std::num::NonZeroU64::new(now_ns.max(1));
            }
        }
        // Keep polling for `busy_poll` after activity, unless an application thread does.
        let busy_poll =
            Duration::from_nanos(shared.busy_poll_ns.load(Ordering::Relaxed)).max(learned.window);
        let spin = !drives && last_active.elapsed() < busy_poll;
        let t0 = std::time::Instant::now();
        // A polling pass that found work looks again at once: that work comes from threads
        // that are running (a client streaming into its ring, a peer's packets), and a
        // yield here would hand the core to a client that finds its queue as full as it left
        // it (perftest's ib_send_bw -s 2 through one softrdmad with all three processes on
        // one CPU: 1.17-1.40 M msg/s yielding after every pass, 1.65-1.73 after empty passes
        // only). A pass that found nothing still gives the core away (see `wait`).
        let (rung, handed) = if spin && n > 0 {
            (false, false)
        } else {
            wait(shared, spin)
        };
        if !spin && !drives {
            slept = Some(t0.elapsed());
        } else if spin && t0.elapsed() > PREEMPTED {
            if learned.window > Duration::ZERO {
                shared.poll_backoffs.fetch_add(1, Ordering::Relaxed);
            }
            learned.preempted();
        }
        handed_over = handed;
        if rung {
            last_active = std::time::Instant::now();
        }
    }
}

/// Polling learned from how soon work follows a sleep ([`crate::RuntimeConfig::adaptive_poll`]),
/// the way a CPU's halt-polling governor learns: a sleep that ends with work sooner than
/// the longest polling allowed cost a wakeup that polling would have saved, so poll longer
/// (from [`LEARN_FROM`], doubling); a sleep that ends with nothing to do, or only after
/// longer than that, says polling would have been wasted, so poll half as long.
///
/// Polling pays only while the thread has a core to itself. When another runnable thread
/// shares it (a CPU-bound neighbour), a polling pass that gives the core away between
/// looks gets it back only after the neighbour's time slice, a millisecond or more, where
/// a thread woken from sleep preempts the neighbour at once: a pass that took longer than
/// [`PREEMPTED`] unlearns all polling, and none is learned for [`HOLD`].
#[derive(Debug)]
struct Learned {
    /// Poll this long after activity.
    window: Duration,
    /// At most this long (zero: learn nothing).
    max: Duration,
    /// Whether the core was found shared: learn nothing before `hold_until`.
    held: bool,
    /// Not an `Option`: a `None` leaves the instant's bytes undefined, and the optimised
    /// comparison then branches on them as far as valgrind's memcheck can tell (a report in
    /// every program run under it on this library).
    hold_until: std::time::Instant,
}

/// The first polling learned.
const LEARN_FROM: Duration = Duration::from_micros(8);

/// A polling pass longer than this was preempted: another thread needs the core.
const PREEMPTED: Duration = Duration::from_micros(500);

/// How long nothing is learned after a polling pass was preempted.
const HOLD: Duration = Duration::from_millis(100);

impl Learned {
    fn new(max: Duration) -> Learned {
        Learned {
            window: Duration::ZERO,
            max,
            held: false,
            hold_until: std::time::Instant::now(),
        }
    }

    /// A polling pass was preempted: sleep between passes from now on, for a while.
    fn preempted(&mut self) {
        self.window = Duration::ZERO;
        self.held = true;
        self.hold_until = std::time::Instant::now() + HOLD;
    }

    /// A sleep of `slept` ended at `now`, with work to do or not.
    fn after_sleep(&mut self, slept: Duration, work: bool, now: std::time::Instant) {
        let held = self.held && now < self.hold_until;
        if work && slept < self.max && !held {
            self.window = (self.window * 2).max(LEARN_FROM).min(self.max);
        } else {
            self.window /= 2;
            if self.window < LEARN_FROM {
                self.window = Duration::ZERO;
            }
        }
    }
}

/// The progress thread's wait between passes: until the socket is readable (when it is the
/// progress thread's to read), the doorbell rings, the engine's next timer, or a polling
/// thread's lease runs out. With `spin`, just look. Returns whether the doorbell rang and
/// whether the socket was left to application threads.
fn wait<A: Attachment>(shared: &Shared<A>, spin: bool) -> (bool, bool) {
    use nix::poll::{ppoll, PollFd, PollFlags};
    let (watch, timeout) = if spin {
        // Polling: the next pass looks at the sockets and the attachment's work itself.
        // Give the core away between passes: on a machine with fewer cores than busy
        // threads, the thread this one waits for (an application posting its next work
        // request, on this core) runs now instead of after a whole busy-poll period
        // (measured through softrdmad on 2 loaded CPUs: write_lat one hop took the
        // busy-poll time, 64 us at 50 us, 1 ms at 1 ms, when the spin did not yield).
        std::thread::yield_now();
        return (false, false);
    } else {
        // Decided under the lock, so that a verb that arms an earlier timer after this sees
        // `wake_at` and rings. While an application thread drives, the lock is only tried
        // (see `Shared::try_lock`); without it the thread sleeps until the lease may end,
        // and the polling thread runs the timers that fall due meanwhile.
        let drives = shared.app_drives(shared.now().as_nanos());
        let mut core = if drives {
            shared.try_lock()
        } else {
            Some(shared.lock())
        };
        if let Some(c) = core.as_mut() {
            if let Some(cap) = c.capture.as_ref() {
                cap.flush();
            }
            // Ask the host's clients for doorbells, then look once more: work posted
            // before they could see that is found here.
            if A::SLEEPS {
                c.attach.set_asleep(true);
            }
            if shared.has_pending(c) {
                if A::SLEEPS {
                    c.attach.set_asleep(false);
                }
                return (false, false);
            }
        }
        let now = shared.now().as_nanos();
        let next = core.as_ref().map_or(u64::MAX, |c| {
            c.poll_timeout().map_or(u64::MAX, Instant::as_nanos)
        });
        // Wake now and then even with no timer: then a verb arming a far timer (a
        // retransmission timeout of milliseconds) needs no doorbell and no context switch.
        let mut wake = next.min(now.saturating_add(nanos(IDLE_TICK)));
        let watch = plan_socket(shared, now, &mut wake);
        shared.wake_at.store(wake, Ordering::SeqCst);
        drop(core);
        (watch, Some(Duration::from_nanos(wake.saturating_sub(now))))
    };
    let mut fds = SmallVec::<[PollFd; 4]>::new();
    fds.push(PollFd::new(shared.doorbell.as_fd(), PollFlags::POLLIN));
    if watch {
        fds.extend(
            shared
                .socks
                .iter()
                .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN)),
        );
        // Readable while any joined multicast group's socket is.
        fds.push(PollFd::new(shared.groups.poll.0.as_fd(), PollFlags::POLLIN));
    }
    if !spin {
        shared.sleeps.fetch_add(1, Ordering::Relaxed);
    }
    if let Err(e) = ppoll(&mut fds, timeout.map(TimeSpec::from_duration), None) {
        if e != nix::errno::Errno::EINTR {
            tracing::warn!(error = %e, "ppoll failed");
        }
    }
    shared.wake_at.store(0, Ordering::SeqCst);
    shared.watching.store(false, Ordering::SeqCst);
    shared.parked.store(false, Ordering::SeqCst);
    let rung = fds[0].revents().is_some_and(|r| !r.is_empty());
    if rung {
        let _ = shared.doorbell.read();
    }
    if A::SLEEPS && !spin {
        shared.lock().attach.set_asleep(false);
    }
    (rung, !watch)
}

/// Whether the sleeping progress thread watches the socket; if an application thread
/// drives it instead, bring `wake` forward to when the socket may come back.
fn plan_socket<A: Attachment>(shared: &Shared<A>, now: u64, wake: &mut u64) -> bool {
    let drivers = shared.drivers.load(Ordering::SeqCst);
    if drivers > 0
        && now.saturating_sub(shared.driving_since.load(Ordering::SeqCst)) >= nanos(LONG_WAIT)
    {
        // A thread has been blocked in `wait_cq` for long: park until the last one leaves
        // (it sees `parked` and rings), so that an idle device with a blocked waiter costs
        // nothing. Check again after publishing, as it may have just left.
        shared.parked.store(true, Ordering::SeqCst);
        if shared.drivers.load(Ordering::SeqCst) > 0 {
            return false;
        }
        shared.parked.store(false, Ordering::SeqCst);
    }
    // Publish first, then look at the lease: a poller that renews after this load sees
    // `watching` and rings (both SeqCst).
    shared.watching.store(true, Ordering::SeqCst);
    let lease = shared.lease_until.load(Ordering::SeqCst);
    let drivers = shared.drivers.load(Ordering::SeqCst);
    if drivers == 0 && lease <= now {
        return true;
    }
    shared.watching.store(false, Ordering::SeqCst);
    if drivers > 0 {
        // Blocked waiters renew no lease and run no timers: look again every HANDOVER
        // while they wait, and run the timers that fall due.
        *wake = (*wake).min(lease.max(now.saturating_add(nanos(HANDOVER))));
    } else {
        // A polling thread runs every timer that falls due while it polls (ACK deadlines
        // come every few tens of microseconds in a stream): wake only when its lease may
        // have lapsed, not for each of them (a wakeup per ACK on a core the polling
        // threads need cost a ping-pong 2.5x its latency).
        *wake = lease;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn short_sleeps_teach_polling_and_long_ones_unlearn_it() {
        let mut l = Learned::new(64 * US);
        let now = std::time::Instant::now();
        l.after_sleep(20 * US, true, now);
        assert_eq!(l.window, LEARN_FROM);
        for _ in 0..10 {
            l.after_sleep(20 * US, true, now);
        }
        assert_eq!(l.window, 64 * US, "capped at the maximum");
        // Work that comes only after longer than polling may last: polling would not have
        // caught it.
        l.after_sleep(65 * US, true, now);
        assert_eq!(l.window, 32 * US);
        // A sleep that ended with nothing to do (a timer, a lease).
        l.after_sleep(US, false, now);
        l.after_sleep(US, false, now);
        assert_eq!(l.window, 8 * US);
        l.after_sleep(US, false, now);
        assert_eq!(l.window, Duration::ZERO, "below the first step: none");
    }

    #[test]
    fn zero_maximum_learns_nothing() {
        let now = std::time::Instant::now();
        let mut l = Learned::new(Duration::ZERO);
        for _ in 0..4 {
            l.after_sleep(US, true, now);
        }
        assert_eq!(l.window, Duration::ZERO);
        // A maximum below the first step is still the cap.
        let mut l = Learned::new(3 * US);
        l.after_sleep(US, true, now);
        assert_eq!(l.window, 3 * US);
    }

    #[test]
    fn a_preempted_poll_unlearns_polling_for_a_while() {
        let mut l = Learned::new(64 * US);
        let now = std::time::Instant::now();
        for _ in 0..4 {
            l.after_sleep(US, true, now);
        }
        assert_eq!(l.window, 64 * US);
        l.preempted();
        assert_eq!(l.window, Duration::ZERO);
        l.after_sleep(US, true, std::time::Instant::now());
        assert_eq!(l.window, Duration::ZERO, "nothing learned while held");
        l.after_sleep(US, true, std::time::Instant::now() + HOLD);
        assert_eq!(l.window, LEARN_FROM, "learning again after the hold");
    }
}
