//! ACKs held back: behind the requests of the same pass, and, while an application thread
//! polls, coalesced for as long as the peer keeps sending.
//!
//! A requester's and a responder's packets are two streams that IBA orders each on its
//! own, so an ACK may leave after requests emitted later. On a ping-pong that takes the ACK
//! off the latency path: the thread that received the data posts its reply before it pays
//! for sending the ACK. Every ACK costs a system call on each host (a few microseconds on
//! loopback, as much as the message itself), so while the peer keeps sending requests on a
//! QP, ACKs to it are coalesced (RC ACKs are cumulative: the newest covers the older ones)
//! and one leaves at most [`PATIENCE`] after the oldest was due. A peer that stops sending
//! until it hears the ACK (it waits for its send completion, as `ibv_rc_pingpong` does) is
//! seen when an ACK waited out its patience with no new request behind it and the peer's
//! next request follows that ACK within [`REACTION`], twice in a row: that QP's ACKs then
//! leave at the next poll for [`IMPATIENT_FOR`]. (A peer that merely paused, say descheduled, comes back
//! whenever it does and stays on coalesced ACKs.)

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// The longest a coalesced ACK waits while its application thread polls.
pub(crate) const PATIENCE: Duration = Duration::from_micros(50);

/// A request this soon after an ACK that waited out its patience alone answers that ACK:
/// its sender was waiting for it.
pub(crate) const REACTION: Duration = Duration::from_micros(25);

/// How long ACKs to a peer seen waiting for them leave without coalescing.
pub(crate) const IMPATIENT_FOR: Duration = Duration::from_millis(10);

/// The QP an ACK goes to: the peer's address and the destination QPN.
pub(crate) type AckKey = (IpAddr, u32);

/// What an emitted packet is, for ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A request (every transport): sent at once.
    Request,
    /// A plain RC ACK (no NAK) to this QP: may wait and coalesce.
    Ack(AckKey),
    /// Any other response (NAK, READ response, atomic ACK): sent at once, after the ACKs
    /// held before it.
    Response,
}

/// Classify a whole IP packet as the engine emitted it (unparsable: a request, so it is
/// sent at once).
pub(crate) fn classify(pkt: &[u8], dst: IpAddr) -> Kind {
    let hl = match pkt.first().map(|b| b >> 4) {
        Some(4) => usize::from(pkt[0] & 0x0f) * 4,
        Some(6) => wire::IPV6_HEADER_LEN,
        _ => return Kind::Request,
    };
    let bth = hl + wire::UDP_HEADER_LEN;
    let Some(Ok(op)) = pkt.get(bth).map(|&b| wire::Opcode::from_u8(b)) else {
        return Kind::Request;
    };
    if op.is_request() {
        return Kind::Request;
    }
    // BTH: destination QP in bytes 5..8; the AETH follows the 12-byte BTH, its first byte
    // the syndrome, whose bits 6:5 are 00 for an ACK (01 RNR NAK, 11 NAK).
    match (op, pkt.get(bth + 5..bth + 8), pkt.get(bth + 12)) {
        (wire::Opcode::RcAcknowledge, Some(q), Some(&syndrome)) if syndrome & 0x60 == 0 => {
            Kind::Ack((dst, u32::from_be_bytes([0, q[0], q[1], q[2]])))
        }
        _ => Kind::Response,
    }
}

/// One held ACK.
#[derive(Debug)]
struct Held {
    key: AckKey,
    pkt: Vec<u8>,
    dst: IpAddr,
    /// When (engine ns) the oldest ACK it stands for was emitted.
    since: u64,
    /// How many older ACKs it replaced (the peer kept sending meanwhile).
    merged: u32,
}

/// The held ACKs of one runtime. (Ordered maps: a handful of peers, looked up on every poll,
/// where SipHash cost more than the search.)
#[derive(Debug, Default)]
pub(crate) struct HeldAcks {
    held: Vec<Held>,
    /// Buffers of sent ACKs, for reuse.
    spare: Vec<Vec<u8>>,
    /// Peer QPs seen waiting for our ACKs, and until when (engine ns) theirs go at once.
    impatient: BTreeMap<AckKey, u64>,
    /// When (engine ns) an ACK that waited out its patience alone went to a peer QP: if its
    /// next request follows within [`REACTION`], the peer was waiting for it.
    probes: BTreeMap<AckKey, u64>,
    /// Peer QPs whose last probe was answered within [`REACTION`], and when.
    suspects: BTreeMap<AckKey, u64>,
}

impl HeldAcks {
    /// Nothing held.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Hold `pkt`, a plain ACK to `key`, emitted at `now` (ns) for a request that just
    /// arrived; it replaces an older one to the same QP. A request that soon after a probe
    /// makes its peer impatient.
    pub(crate) fn hold(&mut self, pkt: &[u8], dst: IpAddr, key: AckKey, now: u64) {
        if let Some(h) = self.held.iter_mut().find(|h| h.key == key) {
            h.pkt.clear();
            h.pkt.extend_from_slice(pkt);
            h.dst = dst;
            h.merged = h.merged.saturating_add(1);
            return;
        }
        if let Some(sent) = self.probes.remove(&key) {
            if now.saturating_sub(sent) >= nanos(REACTION) {
                self.suspects.remove(&key);
            } else if self
                .suspects
                .insert(key, now)
                .is_some_and(|t| now.saturating_sub(t) < nanos(IMPATIENT_FOR))
            {
                // The second quick answer in a row: the peer waits for our ACKs (one could
                // be chance: a peer that paused and came back just then).
                self.suspects.remove(&key);
                if self.impatient.len() >= 4096 {
                    self.impatient.retain(|_, t| *t > now);
                }
                self.impatient
                    .insert(key, now.saturating_add(nanos(IMPATIENT_FOR)));
            } else if self.suspects.len() >= 4096 {
                self.suspects.clear();
            }
        }
        let mut b = self.spare.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(pkt);
        self.held.push(Held {
            key,
            pkt: b,
            dst,
            since: now,
            merged: 0,
        });
    }

    /// Send every held ACK through `send`.
    pub(crate) fn send_all(&mut self, mut send: impl FnMut(&mut [u8], IpAddr)) {
        for mut h in self.held.drain(..) {
            send(&mut h.pkt, h.dst);
            self.spare.push(h.pkt);
        }
    }

    /// Send the ACKs due at `now` (ns): those to impatient peers, and those that waited out
    /// their patience. One that did so with no newer request behind it is a probe: see
    /// [`HeldAcks::hold`].
    pub(crate) fn send_due(&mut self, now: u64, mut send: impl FnMut(&mut [u8], IpAddr)) {
        let patience = nanos(PATIENCE);
        let mut i = 0;
        while i < self.held.len() {
            let h = &self.held[i];
            let impatient = self.impatient.get(&h.key).is_some_and(|&t| t > now);
            let waited_out = now.saturating_sub(h.since) >= patience;
            if !impatient && !waited_out {
                i += 1;
                continue;
            }
            if !impatient && h.merged == 0 {
                if self.probes.len() >= 4096 {
                    self.probes.clear();
                }
                self.probes.insert(h.key, now);
            }
            let mut h = self.held.swap_remove(i);
            send(&mut h.pkt, h.dst);
            self.spare.push(h.pkt);
        }
    }
}

/// A duration in nanoseconds, saturating.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// An IPv4/UDP/BTH/AETH packet with this opcode, destination QP and syndrome.
    fn packet(opcode: u8, qpn: u32, syndrome: u8) -> Vec<u8> {
        let mut p = vec![0u8; 20 + 8 + 12 + 4 + 4];
        p[0] = 0x45;
        p[28] = opcode;
        p[28 + 5..28 + 8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        p[28 + 12] = syndrome;
        p
    }

    const PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn plain_acks_are_held_and_naks_and_requests_are_not() {
        assert_eq!(
            classify(&packet(0x11, 0x12, 0x1f), PEER),
            Kind::Ack((PEER, 0x12))
        );
        // RNR NAK and NAK syndromes.
        assert_eq!(classify(&packet(0x11, 0x12, 0x20), PEER), Kind::Response);
        assert_eq!(classify(&packet(0x11, 0x12, 0x60), PEER), Kind::Response);
        // READ response only, atomic ACK, SEND only, and garbage.
        assert_eq!(classify(&packet(0x10, 0x12, 0), PEER), Kind::Response);
        assert_eq!(classify(&packet(0x12, 0x12, 0), PEER), Kind::Response);
        assert_eq!(classify(&packet(0x04, 0x12, 0), PEER), Kind::Request);
        assert_eq!(classify(&[0xff, 1, 2], PEER), Kind::Request);
        assert_eq!(classify(&[], PEER), Kind::Request);
    }

    #[test]
    fn a_newer_ack_replaces_the_held_one_and_waits_no_longer_than_the_first() {
        let mut h = HeldAcks::default();
        let key = (PEER, 7);
        h.hold(&[1], PEER, key, 0);
        h.hold(&[2], PEER, key, 10_000);
        let mut sent = Vec::new();
        h.send_due(nanos(PATIENCE) - 1, |p, _| sent.push(p.to_vec()));
        assert!(sent.is_empty());
        h.send_due(nanos(PATIENCE), |p, _| sent.push(p.to_vec()));
        assert_eq!(sent, vec![vec![2]]);
        assert!(h.is_empty());
        // The peer kept sending: it is not waiting for ACKs, so the next one waits again.
        h.hold(&[3], PEER, key, nanos(PATIENCE) + 1);
        h.send_due(nanos(PATIENCE) + 2, |p, _| sent.push(p.to_vec()));
        assert_eq!(sent.len(), 1);
    }

    #[test]
    fn a_peer_that_waited_for_its_ack_gets_the_next_ones_at_once() {
        let mut h = HeldAcks::default();
        let key = (PEER, 9);
        let p = nanos(PATIENCE);
        let mut sent = 0;
        // Two ACKs wait out their patience alone, each answered at once by a request.
        h.hold(&[1], PEER, key, 0);
        h.send_due(p, |_, _| sent += 1);
        h.hold(&[2], PEER, key, p + 1);
        h.send_due(p + 2, |_, _| sent += 1);
        assert_eq!(sent, 1, "one quick answer could be chance");
        h.send_due(2 * p + 1, |_, _| sent += 1);
        assert_eq!(sent, 2);
        h.hold(&[3], PEER, key, 2 * p + 2);
        h.send_due(2 * p + 3, |_, _| sent += 1);
        assert_eq!(sent, 3, "the second one was not");
        // Until IMPATIENT_FOR has passed.
        let later = 2 * p + nanos(IMPATIENT_FOR) + 3;
        h.hold(&[4], PEER, key, later);
        h.send_due(later + 1, |_, _| sent += 1);
        assert_eq!(sent, 3);
        h.send_all(|_, _| sent += 1);
        assert_eq!(sent, 4);
    }

    #[test]
    fn a_peer_that_merely_paused_keeps_coalesced_acks() {
        let mut h = HeldAcks::default();
        let key = (PEER, 5);
        let mut sent = 0;
        h.hold(&[1], PEER, key, 0);
        h.send_due(nanos(PATIENCE), |_, _| sent += 1);
        assert_eq!(sent, 1);
        // Its next request comes long after that ACK: it was not waiting for it.
        let back = nanos(PATIENCE) + 10 * nanos(REACTION);
        h.hold(&[2], PEER, key, back);
        h.send_due(back + 1, |_, _| sent += 1);
        assert_eq!(sent, 1);
    }
}
