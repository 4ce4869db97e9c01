//! Which QPs [`crate::Engine::poll_transmit`] looks at, and in which order: the QPs that have
//! something to send that need not wait, served round robin, so that idle QPs cost nothing
//! and a busy one cannot starve the others. (A plain ACK waiting alone is timed apart, in
//! the engine's `acks`.)
//!
//! A queue in arrival order; each QP records whether it is in it (`listed`, the QP's own
//! flag), so that joining costs no look-up (this runs after every packet and every WR
//! posted). The queue keeps its capacity when it empties, so a QP going idle and busy again
//! once per message (a ping-pong) allocates nothing once the device is warm (an ordered set
//! would allocate a node each time it became non-empty).

use std::collections::VecDeque;

/// The QPs that may have something to send, in the order they are served.
#[derive(Debug, Default)]
pub(crate) struct Active {
    /// Each member once, the next to serve first.
    queue: VecDeque<u32>,
}

impl Active {
    /// `qpn` may have something to send: serve it (last, if it was not waiting already).
    /// `listed` is the QP's record of whether it is a member.
    pub(crate) fn insert(&mut self, qpn: u32, listed: &mut bool) {
        if !*listed {
            *listed = true;
            self.queue.push_back(qpn);
        }
    }

    /// `qpn` is gone: never serve it again (so that a QP given its number later is not
    /// served twice).
    pub(crate) fn remove(&mut self, qpn: u32, listed: bool) {
        if listed {
            self.queue.retain(|&q| q != qpn);
        }
    }

    /// How many QPs wait to be served.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Room for `qps` QPs at once, so that the first time a QP becomes active allocates
    /// nothing (a responder's QP is active only now and then: a NAK, a READ response, an
    /// ACK that cannot wait; the first one used to allocate the queue).
    pub(crate) fn reserve(&mut self, qps: usize) {
        self.queue.reserve(qps.saturating_sub(self.queue.len()));
    }

    /// Take the next QP to serve; give it back with [`Active::served`] (a QP that is gone
    /// is simply not given back).
    pub(crate) fn next(&mut self) -> Option<u32> {
        self.queue.pop_front()
    }

    /// The QP [`Active::next`] gave: `busy`, it is served again after the others; otherwise
    /// it leaves until an [`Active::insert`].
    pub(crate) fn served(&mut self, qpn: u32, listed: &mut bool, busy: bool) {
        if busy {
            self.queue.push_back(qpn);
        } else {
            *listed = false;
        }
    }

    /// Every QP waiting, in serving order.
    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = &u32> {
        self.queue.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qps_are_served_round_robin_and_leave_when_idle() {
        let mut a = Active::default();
        // Each QP's own flag, indexed by its number.
        let mut listed = [false; 10];
        for q in [5, 3, 9, 3] {
            a.insert(q, &mut listed[q as usize]);
        }
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), [5, 3, 9]);
        assert!(listed[5] && listed[3] && listed[9] && !listed[1]);
        let q = a.next().unwrap();
        assert_eq!(q, 5);
        a.served(q, &mut listed[5], true);
        let q = a.next().unwrap();
        assert_eq!(q, 3);
        a.served(q, &mut listed[3], false);
        assert!(!listed[3]);
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), [9, 5]);
        // An idle QP that becomes busy again joins at the back.
        a.insert(3, &mut listed[3]);
        a.remove(9, listed[9]);
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), [5, 3]);
        assert_eq!(a.len(), 2);
        // A QP that was not listed leaves nothing to remove.
        a.remove(7, listed[7]);
        assert_eq!(a.len(), 2);
        // Room reserved up front: as many QPs as there are can be active at once.
        let mut b = Active::default();
        b.reserve(40);
        assert!(b.queue.capacity() >= 40);
        b.insert(1, &mut listed[1]);
        b.reserve(40);
        assert!(b.queue.capacity() >= 40);
    }
}
