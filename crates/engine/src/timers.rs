//! The QPs' requester timers (local ACK timeout, RNR wait), ordered by deadline, so that
//! [`crate::Engine::poll_timeout`] and [`crate::Engine::handle_timeout`] cost the same with
//! ten thousand QPs as with one.
//!
//! The engine files a QP again ([`Timers::file`]) after every call that can start or stop
//! one of its timers. An entry may be *earlier* than the QP's real deadline (a timer
//! stopped by a path that did not file the QP again): it makes a host look once too early,
//! and `handle_timeout` files the QP again. It is never later.

use std::collections::{BTreeSet, HashMap};

use crate::Instant;

/// Deadlines by QP, and QPs by deadline.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    by_time: BTreeSet<(Instant, u32)>,
    of_qp: HashMap<u32, Instant>,
}

impl Timers {
    /// Record `qpn`'s earliest deadline (`None`: no timer runs).
    pub(crate) fn file(&mut self, qpn: u32, deadline: Option<Instant>) {
        match deadline {
            Some(t) => {
                if let Some(old) = self.of_qp.insert(qpn, t) {
                    if old == t {
                        return;
                    }
                    self.by_time.remove(&(old, qpn));
                }
                self.by_time.insert((t, qpn));
            }
            None => {
                if let Some(old) = self.of_qp.remove(&qpn) {
                    self.by_time.remove(&(old, qpn));
                }
            }
        }
    }

    /// The earliest deadline.
    pub(crate) fn first(&self) -> Option<Instant> {
        self.by_time.first().map(|&(t, _)| t)
    }

    /// The QPs with a deadline at or before `now`, earliest first.
    pub(crate) fn due(&self, now: Instant) -> Vec<u32> {
        self.by_time
            .iter()
            .take_while(|&&(t, _)| t <= now)
            .map(|&(_, q)| q)
            .collect()
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
        // Refiling moves a QP; it never appears twice.
        t.file(3, Some(at(40)));
        assert_eq!(t.len(), 3);
        assert_eq!(t.due(at(30)), vec![9, 7]);
        t.file(9, None);
        t.file(9, None);
        assert_eq!(t.due(at(100)), vec![7, 3]);
        assert_eq!(t.first(), Some(at(30)));
        t.file(7, Some(at(30)));
        assert_eq!(t.len(), 2);
    }
}
