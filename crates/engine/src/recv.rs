//! Ingress: validate a received packet and hand it to the completer (responses) or the
//! responder (requests). Every rejected packet is counted by reason and dropped, as a NIC
//! does; nothing here can panic on any input.

use wire::{OpKind, RoceV2Packet, Transport, WireError};

use crate::counters::Counter;
use crate::device::{Gid, Ipv4IdentPolicy};
use crate::memory::Memory;
use crate::qp_attr::QpType;
use crate::{comp, mcast, resp, srq, uc, ud, Ctx};

/// P_Keys match when their low 15 bits are equal and at least one is a full member
/// (IBA 10.9.3); RoCE ports carry only the default 0xffff.
pub(crate) fn pkey_matches(a: u16, b: u16) -> bool {
    (a & 0x7fff) == (b & 0x7fff) && (a & 0x8000 != 0 || b & 0x8000 != 0)
}

/// What a packet's destination address is checked against: the port's unicast GIDs, and
/// the multicast groups its QPs joined.
pub(crate) struct Addresses<'a> {
    pub(crate) gids: &'a [Gid],
    pub(crate) groups: &'a mcast::Groups,
}

/// Returns the QP the packet was handed to, if any (to be filed again). `internal`: the packet was built by an
/// engine of this process for an internal path (no ICRC; see `EngineConfig::internal_addresses`).
/// `ipv4_ident`: whether the IPv4 header's identification is the sender's.
pub(crate) fn handle<'q, M: Memory + ?Sized>(
    ctx: &mut Ctx<'_, M>,
    addresses: Addresses<'_>,
    qps: &'q mut crate::QpTable,
    gsi: &mut crate::gsi::Gsi,
    bytes: &[u8],
    internal: bool,
    ipv4_ident: Ipv4IdentPolicy,
) -> Option<&'q mut crate::qp::Qp> {
    let parsed = match (internal, ipv4_ident) {
        (true, _) => RoceV2Packet::parse_internal(bytes),
        (false, Ipv4IdentPolicy::AsReceived) => RoceV2Packet::parse_checked(bytes),
        // One CRC pass either way: the recovery reuses the CRC the check computed.
        (false, Ipv4IdentPolicy::Recover) => {
            RoceV2Packet::parse_checked_recovering_ipv4_ident(bytes).map(|(p, recovered)| {
                if recovered.is_some() {
                    ctx.counters.inc(Counter::RxIcrcIdRecovered);
                }
                p
            })
        }
    };
    let pkt = match parsed {
        Ok(p) => p,
        Err(WireError::BadIcrc { .. }) => {
            ctx.counters.inc(Counter::RxBadIcrc);
            return None;
        }
        Err(_) => {
            ctx.counters.inc(Counter::RxMalformed);
            return None;
        }
    };
    if mcast::is_for_multicast(&pkt) {
        // A group address is none of the port's GIDs: the group's members decide.
        mcast::handle(ctx, addresses.groups, qps, &pkt, bytes, internal);
        return None;
    }
    let dst = Gid::from_ip(pkt.ip.dst());
    if !addresses.gids.contains(&dst) {
        ctx.counters.inc(Counter::RxNotOurAddress);
        return None;
    }
    let bth = &pkt.transport.bth;
    if bth.opcode.kind() == OpKind::Cnp {
        // Congestion control is not implemented: a CNP is accepted and ignored.
        ctx.counters.inc(Counter::RxCnp);
        return None;
    }
    if bth.dest_qp == wire::Qpn::GSI {
        // QP1 is the device's: its MADs go to the host, whatever the QP table holds.
        if internal {
            // MADs travel as ordinary packets, never on an internal path.
            ctx.counters.inc(Counter::RxAddressMismatch);
            return None;
        }
        if !pkey_matches(bth.pkey, wire::DEFAULT_PKEY) {
            ctx.counters.inc(Counter::RxPkeyMismatch);
            return None;
        }
        ctx.counters.inc(Counter::RxPackets);
        ctx.counters.add(Counter::RxBytes, bytes.len() as u64);
        gsi.receive(
            ctx.counters,
            pkt.ip.src(),
            pkt.ip.dst(),
            &pkt.transport,
            pkt.payload,
        );
        return None;
    }
    let Some(qp) = qps.get_mut(&bth.dest_qp.value()) else {
        ctx.counters.inc(Counter::RxUnknownQp);
        return None;
    };
    let transport_ok = match qp.qp_type {
        QpType::Rc => bth.opcode.transport() == Transport::Rc,
        QpType::Uc => bth.opcode.transport() == Transport::Uc,
        QpType::Ud => bth.opcode.transport() == Transport::Ud,
    };
    if !transport_ok {
        ctx.count(qp, Counter::RxBadOpcode);
        return None;
    }
    if !pkey_matches(bth.pkey, wire::DEFAULT_PKEY) {
        ctx.count(qp, Counter::RxPkeyMismatch);
        return None;
    }
    let is_response = matches!(
        bth.opcode.kind(),
        OpKind::Acknowledge | OpKind::AtomicAcknowledge | OpKind::RdmaReadResponse
    );
    let state = qp.state();
    let state_ok = if is_response {
        state.processes_responses()
    } else {
        state.processes_incoming()
    };
    if !state_ok {
        ctx.count(qp, Counter::RxBadQpState);
        return None;
    }
    // An internal path and its packets go together: a QP on one takes nothing from a socket
    // (its segments are not the wire's), and internal packets reach no other QP.
    if qp.path.is_some_and(|p| p.internal) != internal {
        ctx.count(qp, Counter::RxAddressMismatch);
        return None;
    }
    if qp.qp_type == QpType::Ud {
        // Datagrams come from anyone: the Q_Key is the check (in `ud`).
        ctx.count(qp, Counter::RxPackets);
        ctx.count_n(qp, Counter::RxBytes, bytes.len() as u64);
        let _took_wqe = ud::handle_request(qp, ctx, &pkt, bytes);
        return Some(qp);
    }
    // A connected QP talks to one peer only (IBA 9.6.1.5.1 for RC: the source must be the
    // path's destination).
    match qp.path {
        Some(p) if p.dst_ip == pkt.ip.src() => {}
        _ => {
            ctx.count(qp, Counter::RxAddressMismatch);
            return None;
        }
    }
    ctx.count(qp, Counter::RxPackets);
    ctx.count_n(qp, Counter::RxBytes, bytes.len() as u64);
    if is_response {
        comp::handle_response(qp, ctx, &pkt);
    } else {
        srq::prefetch(qp, ctx, &pkt);
        if qp.qp_type == QpType::Uc {
            uc::handle_request(qp, ctx, &pkt);
        } else {
            resp::handle_request(qp, ctx, &pkt);
        }
    }
    Some(qp)
}

#[cfg(test)]
mod tests {
    use super::pkey_matches;

    #[test]
    fn pkey_rule() {
        assert!(pkey_matches(0xffff, 0xffff));
        assert!(pkey_matches(0x7fff, 0xffff));
        assert!(!pkey_matches(0x7fff, 0x7fff));
        assert!(!pkey_matches(0x8001, 0xffff));
    }
}
