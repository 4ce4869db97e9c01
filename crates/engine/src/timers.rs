//! The QPs' requester timers (local ACK timeout, RNR wait), ordered by deadline, so that
//! [`crate::Engine::poll_timeout`] and [`crate::Engine::handle_timeout`] cost the same with
//! ten thousand QPs as with one.
//!
//! The engine files a QP again ([`Timers::file`]) after every call that can start or stop
//! one of its timers. An entry may be *earlier* than the QP's real deadline (a timer
//! stopped by a path that did not file the QP again, or pushed back: a later deadline does
//! not replace an earlier one): it makes a host look once too early, and `handle_timeout`
//! files the QP again. It is never later.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use foldhash::HashMap;
use std::collections::hash_map::Entry;

use crate::Instant;

/// Deadlines by QP, and QPs by deadline.
///
/// The order is a heap that keeps its capacity, so filing and clearing a timer once per
/// message allocates nothing once the device is warm. Filing a QP again leaves its old
/// entry behind as stale (its deadline is no longer the QP's); stale entries are dropped
/// when they reach the top, so the top is always a live deadline.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    by_time: BinaryHeap<Reverse<(Instant, u32)>>,
    of_qp: HashMap<u32, Instant>,
}

/// What a QP's entry in one [`Timers`] is, as the QP itself remembers it, so that filing
/// what is filed already (the same deadline, a later one, or none again: after every packet
/// and every post) costs no look-up at all. Unknown until the QP is first filed through
/// [`Timers::file_known`], and again once [`Timers::take_due`] took the QP (the engine
/// forgets it then).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Filed(Option<Option<Instant>>);

impl Filed {
    /// Nothing known: the next filing looks.
    pub(crate) fn forget(&mut self) {
        self.0 = None;
    }
}

impl Timers {
    /// Record `qpn`'s earliest deadline (`None`: no timer runs). Returns the deadline filed
    /// for it now (an earlier one filed before stays).
    pub(crate) fn file(&mut self, qpn: u32, deadline: Option<Instant>) -> Option<Instant> {
        match deadline {
            Some(t) => {
                // An earlier deadline filed already stays: the QP is looked at then, finds
                // its timer not yet due and is filed again (see the module's comment). A
                // timer pushed back on every ACK then costs one look-up per message, not
                // a heap push and pop.
                match self.of_qp.entry(qpn) {
                    Entry::Occupied(e) if *e.get() <= t => return Some(*e.get()),
                    Entry::Occupied(mut e) => {
                        e.insert(t);
                    }
                    Entry::Vacant(e) => {
                        e.insert(t);
                    }
                }
                self.by_time.push(Reverse((t, qpn)));
            }
            None => {
                // Nothing filed, nothing to clear.
                self.of_qp.remove(&qpn)?;
            }
        }
        self.drop_stale();
        deadline
    }

    /// [`Timers::file`] for a QP that keeps `filed` (its own record of its entry here):
    /// nothing is looked up when the filing would change nothing.
    #[inline]
    pub(crate) fn file_known(&mut self, filed: &mut Filed, qpn: u32, deadline: Option<Instant>) {
        match (filed.0, deadline) {
            (Some(None), None) => return,
            (Some(Some(held)), Some(t)) if held <= t => return,
            _ => {}
        }
        filed.0 = Some(self.file(qpn, deadline));
    }

    /// The earliest deadline.
    pub(crate) fn first(&self) -> Option<Instant> {
        self.by_time.peek().map(|&Reverse((t, _))| t)
    }

    /// Move the QPs with a deadline at or before `now` into `due`, earliest first; they have
    /// no timer filed any more (the engine files each again once it has run them).
    pub(crate) fn take_due(&mut self, now: Instant, due: &mut Vec<u32>) {
        while let Some(&Reverse((t, qpn))) = self.by_time.peek() {
            if t > now {
                break;
            }
            self.by_time.pop();
            if self.of_qp.get(&qpn) == Some(&t) {
                self.of_qp.remove(&qpn);
                due.push(qpn);
            }
        }
        self.drop_stale();
    }

    /// Pop entries that are no longer their QP's deadline off the top.
    fn drop_stale(&mut self) {
        while let Some(&Reverse((t, qpn))) = self.by_time.peek() {
            if self.of_qp.get(&qpn) == Some(&t) {
                break;
            }
            self.by_time.pop();
        }
    }

    /// How many QPs have a timer filed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.of_qp.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(us: u64) -> Instant {
        Instant::default() + Duration::from_micros(us)
    }

    #[test]
    fn deadlines_are_kept_one_per_qp_in_time_order() {
        let mut t = Timers::default();
        assert_eq!(t.first(), None);
        t.file(7, Some(at(30)));
        t.file(3, Some(at(10)));
        t.file(9, Some(at(20)));
        assert_eq!(t.first(), Some(at(10)));
        // Refiling earlier moves a QP; later leaves it where it was (looked at too early,
        // then filed again). It never appears twice.
        t.file(3, Some(at(5)));
        t.file(3, Some(at(40)));
        assert_eq!((t.len(), t.first()), (3, Some(at(5))));
        let mut due = Vec::new();
        t.take_due(at(30), &mut due);
        assert_eq!(due, vec![3, 9, 7]);
        assert_eq!((t.first(), t.len()), (None, 0));
        // What the engine does with a QP looked at too early: files its real deadline.
        t.file(3, Some(at(40)));
        assert_eq!(t.first(), Some(at(40)));
        t.file(9, Some(at(35)));
        t.file(9, None);
        t.file(9, None);
        t.file(7, Some(at(50)));
        t.file(7, Some(at(45)));
        assert_eq!(t.first(), Some(at(40)));
        due.clear();
        t.take_due(at(100), &mut due);
        assert_eq!(due, vec![3, 7]);
        assert_eq!((t.first(), t.len()), (None, 0));
    }

    #[test]
    fn a_timer_filed_and_cleared_each_message_leaves_nothing_behind() {
        let mut t = Timers::default();
        for i in 0..1000 {
            t.file(1, Some(at(10 + i)));
            t.file(1, None);
        }
        assert_eq!((t.first(), t.len(), t.by_time.len()), (None, 0, 0));
    }

    #[test]
    fn a_timer_pushed_back_each_message_stays_one_entry() {
        let mut t = Timers::default();
        for i in 0..1000 {
            t.file(1, Some(at(10 + i)));
        }
        assert_eq!((t.first(), t.len(), t.by_time.len()), (Some(at(10)), 1, 1));
    }
}
