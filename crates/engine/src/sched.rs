//! Which QPs [`crate::Engine::poll_transmit`] looks at, and in which order: the QPs that have
//! something to send that need not wait, served round robin, so that idle QPs cost nothing
//! and a busy one cannot starve the others. (A plain ACK waiting alone is timed apart, in
//! the engine's `acks`.)
//!
//! A queue in arrival order plus a membership set. Both keep their capacity when they empty,
//! so a QP going idle and busy again once per message (a ping-pong) allocates nothing once
//! the device is warm (an ordered set would allocate a node each time it became non-empty).

use std::collections::VecDeque;

use foldhash::HashSet;

/// The QPs that may have something to send, in the order they are served.
#[derive(Debug, Default)]
pub(crate) struct Active {
    /// Each member once, the next to serve first.
    queue: VecDeque<u32>,
    members: HashSet<u32>,
}

impl Active {
    /// `qpn` may have something to send: serve it (last, if it was not waiting already).
    pub(crate) fn insert(&mut self, qpn: u32) {
        if self.members.insert(qpn) {
            self.queue.push_back(qpn);
        }
    }

    /// `qpn` is gone: never serve it again.
    pub(crate) fn remove(&mut self, qpn: u32) {
        if self.members.remove(&qpn) {
            self.queue.retain(|&q| q != qpn);
        }
    }

    /// How many QPs wait to be served.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Room for `qps` QPs at once, so that the first time a QP becomes active allocates
    /// nothing (a responder's QP is active only now and then: a NAK, a READ response, an
    /// ACK that cannot wait; the first one used to allocate both the set and the queue).
    pub(crate) fn reserve(&mut self, qps: usize) {
        self.members.reserve(qps.saturating_sub(self.members.len()));
        self.queue.reserve(qps.saturating_sub(self.queue.len()));
    }

    /// Take the next QP to serve; give it back with [`Active::served`].
    pub(crate) fn next(&mut self) -> Option<u32> {
        self.queue.pop_front()
    }

    /// The QP [`Active::next`] gave: `busy`, it is served again after the others; otherwise
    /// it leaves until an [`Active::insert`].
    pub(crate) fn served(&mut self, qpn: u32, busy: bool) {
        if busy {
            self.queue.push_back(qpn);
        } else {
            self.members.remove(&qpn);
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
        for q in [5, 3, 9, 3] {
            a.insert(q);
        }
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), [5, 3, 9]);
        let q = a.next().unwrap();
        assert_eq!(q, 5);
        a.served(q, true);
        let q = a.next().unwrap();
        assert_eq!(q, 3);
        a.served(q, false);
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), [9, 5]);
        // An idle QP that becomes busy again joins at the back.
        a.insert(3);
        a.remove(9);
        assert_eq!(a.iter().copied().collect::<Vec<_>>(), [5, 3]);
        assert_eq!(a.len(), 2);
        // Room reserved up front: as many QPs as there are can be active at once.
        let mut b = Active::default();
        b.reserve(40);
        assert!(b.members.capacity() >= 40 && b.queue.capacity() >= 40);
        b.insert(1);
        b.reserve(40);
        assert!(b.members.capacity() >= 40 && b.queue.capacity() >= 40);
    }
}
