//! When the responder's plain ACKs leave.
//!
//! RC ACKs are cumulative (IBA 9.7.5.1.2): the newest covers every older one, so while the
//! peer keeps sending, one ACK can stand for many. Each ACK costs both hosts a packet (on a
//! software NIC, a system call each: as much as a small message), so a plain ACK waits in
//! the responder queue, replaced by newer ones, and leaves at most
//! [`crate::EngineConfig::ack_coalesce`] after the oldest ACK it stands for was made (a newer
//! ACK takes the place and the deadline of the one it replaces). NAKs,
//! RNR NAKs, READ responses and ATOMIC ACKs never wait; one queued behind a waiting ACK
//! sends that ACK first (the responder's packets keep their order).
//!
//! An ACK made while handling packets at time T is never due at T itself: a host that
//! handles a packet and sends at once sends the reply its application posts next before it
//! pays for the ACK (requests and responses are ordered each on their own, so the ACK may
//! follow the reply). Only when it replaces one that was due already (the host has not sent
//! that one yet) does it leave at once: the older ACK's deadline comes first.
//!
//! Some peers stop sending until they hear the ACK (they wait for their send completion, as
//! `ibv_rc_pingpong` does); coalescing only delays them. Such a peer shows itself when an
//! ACK that waited out its coalescing delay alone (it stands for one message: no newer one
//! came meanwhile) is answered by the peer's next request within [`REACTION`], twice in a
//! row: its QP is then
//! *impatient* for [`IMPATIENT_FOR`], and its ACKs are due at the next pass, 1 ns after
//! they were made. A peer that merely paused (descheduled, say) comes back whenever it does
//! and keeps coalesced ACKs.

use core::time::Duration;

use crate::time::Instant;

/// A request this soon after an ACK that waited out its delay alone answers that ACK: its
/// sender was waiting for it.
pub(crate) const REACTION: Duration = Duration::from_micros(25);

/// How long the ACKs of a QP whose peer was seen waiting for them leave at the next pass.
pub(crate) const IMPATIENT_FOR: Duration = Duration::from_millis(10);

/// The next pass after `t`: the earliest an ACK made at `t` may leave.
const NEXT_PASS: Duration = Duration::from_nanos(1);

/// The timing of a plain ACK waiting in the responder queue; a newer ACK that replaces it
/// keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    /// When it must leave: set by the oldest ACK it stands for.
    pub(crate) due: Instant,
    /// The MSN before the message the oldest ACK it stands for belongs to: if the newest
    /// one's MSN is further than one message from it, the peer kept sending meanwhile.
    pub(crate) msn_base: u32,
}

/// What the responder of one QP learnt about its peer's patience.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Patience {
    /// When an ACK that waited out its delay alone left: the peer's next request answers
    /// it if it comes within [`REACTION`].
    probe: Option<Instant>,
    /// When the last probe was answered within [`REACTION`] (one quick answer could be
    /// chance: a peer that paused and came back just then).
    suspect: Option<Instant>,
    /// Until when the peer counts as waiting for our ACKs.
    impatient_until: Option<Instant>,
}

impl Patience {
    /// Whether the peer waits for our ACKs at `now`.
    pub(crate) fn impatient(&self, now: Instant) -> bool {
        self.impatient_until.is_some_and(|t| now < t)
    }

    /// A plain ACK made at `now` with none waiting before it, in the message after
    /// `msn_base`: the request it answers may answer our last probe. Returns its timing.
    pub(crate) fn first(&mut self, now: Instant, coalesce: Duration, msn_base: u32) -> Held {
        if let Some(sent) = self.probe.take() {
            if now.saturating_duration_since(sent) >= REACTION {
                self.suspect = None;
            } else if self
                .suspect
                .replace(now)
                .is_some_and(|t| now.saturating_duration_since(t) < IMPATIENT_FOR)
            {
                // The second quick answer in a row: the peer waits for our ACKs.
                self.suspect = None;
                self.impatient_until = Some(now + IMPATIENT_FOR);
            }
        }
        // Never in the pass that made it; at the next one if the peer waits for it.
        let wait = if self.impatient(now) {
            NEXT_PASS
        } else {
            coalesce.max(NEXT_PASS)
        };
        Held {
            due: now + wait,
            msn_base,
        }
    }

    /// The ACK `held`, with MSN `msn`, left at `now` because it was due (not sent ahead of
    /// a later response): if it stood for one message and the peer is not known to wait, it
    /// is a probe.
    pub(crate) fn sent_due(&mut self, held: &Held, msn: u32, now: Instant) {
        let messages = msn.wrapping_sub(held.msn_base) & 0xff_ffff;
        if messages <= 1 && !self.impatient(now) {
            self.probe = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COALESCE: Duration = Duration::from_micros(50);

    fn at(ns: u64) -> Instant {
        Instant::from_nanos(ns)
    }

    fn ns(d: Duration) -> u64 {
        d.as_nanos() as u64
    }

    #[test]
    fn an_ack_is_never_due_in_the_pass_that_made_it() {
        let mut p = Patience::default();
        assert_eq!(p.first(at(1_000), COALESCE, 0).due, at(51_000));
        // No coalescing: every ACK is due at the next pass.
        assert_eq!(p.first(at(7), Duration::ZERO, 0).due, at(8));
    }

    /// One message answered (MSN `m` after `m - 1`), its ACK sent when due, and the next
    /// request after `answer` ns: returns the next ACK's timing.
    fn round(p: &mut Patience, t: u64, m: u32, answer: u64) -> (Held, u64) {
        let h = p.first(at(t), COALESCE, m - 1);
        p.sent_due(&h, m, h.due);
        let next = h.due.as_nanos() + answer;
        (p.first(at(next), COALESCE, m), next)
    }

    #[test]
    fn a_peer_that_answers_two_probes_at_once_gets_its_acks_at_the_next_pass() {
        let mut p = Patience::default();
        let c = ns(COALESCE);
        let (h, t) = round(&mut p, 0, 1, 1_000);
        assert_eq!(h.due, at(t + c), "one quick answer could be chance");
        p.sent_due(&h, 2, h.due);
        let t = h.due.as_nanos() + 1_000;
        let h = p.first(at(t), COALESCE, 2);
        assert_eq!(h.due, at(t + 1), "the second one is not");
        // Its ACKs leave at once for IMPATIENT_FOR, and they are no probes meanwhile.
        p.sent_due(&h, 3, h.due);
        let until = t + ns(IMPATIENT_FOR);
        assert_eq!(p.first(at(until - 1), COALESCE, 3).due, at(until));
        assert_eq!(p.first(at(until), COALESCE, 4).due, at(until + c));
    }

    #[test]
    fn a_peer_that_paused_or_kept_sending_keeps_coalesced_acks() {
        let mut p = Patience::default();
        let c = ns(COALESCE);
        // Its next request comes long after the probe: it was not waiting for it.
        let (h, t) = round(&mut p, 0, 1, 10 * ns(REACTION));
        assert_eq!(h.due, at(t + c));
        // An ACK that stood for two messages is no probe...
        p.sent_due(&h, 3, h.due);
        let (h, t) = round(&mut p, h.due.as_nanos() + 1, 4, 1);
        assert_eq!(h.due, at(t + c), "one quick answer only");
        // ...but one that stood for several ACKs of one long message (MSN 0 -> 1) is.
        let mut p = Patience::default();
        let mut t = 0;
        for _ in 0..2 {
            let h = p.first(at(t), COALESCE, 0);
            p.sent_due(&h, 1, h.due);
            t = h.due.as_nanos() + 1_000;
        }
        assert_eq!(p.first(at(t), COALESCE, 0).due, at(t + 1));
    }
}
