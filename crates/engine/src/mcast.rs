//! UD multicast (IBA 10.5, `ibv_attach_mcast` / `ibv_detach_mcast`): which UD QPs receive
//! the datagrams sent to a multicast group, and the fan-out of one such datagram to each of
//! them, as Linux rxe does it (`rxe_mcast.c`, `rxe_rcv_mcast_pkt`).
//!
//! On RoCEv2 a group is a multicast IP address (its GID: the IPv6 address, or the
//! IPv4-mapped one), and a datagram for it is a UD packet to that address with destination
//! QPN [`MULTICAST_QPN`]. Sending needs nothing special: an address handle whose DGID is
//! the group makes a packet to the group's address, and the host sends it to every device
//! that joined, this one included (see [`crate::Transmit::dst`]). Joining the group on the
//! network (IGMP / MLD, a socket's membership) is the host's business too; the engine only
//! keeps which of its QPs are attached, and tells the host which groups have any
//! ([`Engine::mcast_groups`], [`Engine::mcast_epoch`]).

use std::collections::BTreeMap;

use wire::{RoceV2Packet, Transport};

use crate::counters::Counter;
use crate::device::{DeviceAttr, Gid};
use crate::error::VerbsError;
use crate::memory::Memory;
use crate::qp_attr::QpType;
use crate::{recv, ud, Ctx, Engine};

/// The destination QP number of every multicast datagram ([`wire::Qpn::MULTICAST`], as
/// the number the engine's tables use).
pub const MULTICAST_QPN: u32 = wire::Qpn::MULTICAST.value();

/// The groups with at least one QP of this device attached.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    /// Members of each group, in the order they were attached (the order copies are
    /// delivered in). A group without members is removed.
    groups: BTreeMap<Gid, Vec<u32>>,
    /// Attachments in all groups (for `max_total_mcast_qp_attach`).
    attached: usize,
    /// Changes of the set of groups so far (a group gained its first member or lost its
    /// last): a host that joins the groups on the network looks again when it moves.
    epoch: u64,
}

impl Groups {
    /// Attach `qpn` to `gid` within the device limits; attaching twice is not an error.
    fn attach(&mut self, qpn: u32, gid: Gid, limits: &DeviceAttr) -> Result<(), VerbsError> {
        let members = self.groups.get(&gid);
        if members.is_some_and(|m| m.contains(&qpn)) {
            // rxe: a QP already in the group succeeds without a second membership.
            return Ok(());
        }
        if members.is_none() && self.groups.len() >= limits.max_mcast_grp as usize {
            return Err(VerbsError::TooMany("multicast groups"));
        }
        if members.is_some_and(|m| m.len() >= limits.max_mcast_qp_attach as usize) {
            return Err(VerbsError::TooMany("QPs attached to the multicast group"));
        }
        if self.attached >= limits.max_total_mcast_qp_attach as usize {
            return Err(VerbsError::TooMany("multicast attachments"));
        }
        let members = self.groups.entry(gid).or_default();
        if members.is_empty() {
            self.epoch += 1;
        }
        members.push(qpn);
        self.attached += 1;
        Ok(())
    }

    /// Detach `qpn` from `gid`; a group left without members is gone.
    fn detach(&mut self, qpn: u32, gid: Gid) -> Result<(), VerbsError> {
        let members = self.groups.get_mut(&gid).ok_or(VerbsError::NotAttached)?;
        let i = members
            .iter()
            .position(|&q| q == qpn)
            .ok_or(VerbsError::NotAttached)?;
        members.remove(i);
        if members.is_empty() {
            self.groups.remove(&gid);
            self.epoch += 1;
        }
        self.attached -= 1;
        Ok(())
    }

    /// Detach `qpn` from every group (it is being destroyed).
    pub(crate) fn detach_all(&mut self, qpn: u32) {
        if self.attached == 0 {
            return;
        }
        let mut removed = 0;
        let groups = self.groups.len();
        self.groups.retain(|_, members| {
            let before = members.len();
            members.retain(|&q| q != qpn);
            removed += before - members.len();
            !members.is_empty()
        });
        self.attached -= removed;
        if self.groups.len() != groups {
            self.epoch += 1;
        }
    }

    /// The QPs attached to `gid`, if any.
    fn members(&self, gid: &Gid) -> Option<&[u32]> {
        self.groups.get(gid).map(Vec::as_slice)
    }
}

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_attach_mcast`: UD QP `qpn` receives the datagrams sent to multicast group `gid`
    /// (a copy each, alongside any other QP attached). Attaching a QP twice is not an error.
    ///
    /// Fails with `InvalidQp` for an unknown QP, `OpNotSupported` (EINVAL) for a QP that
    /// is not UD, `NotMulticastGid` (EINVAL) for a GID that is not multicast, and
    /// `TooMany` (ENOMEM) beyond `max_mcast_grp`, `max_mcast_qp_attach` or
    /// `max_total_mcast_qp_attach` of [`crate::DeviceAttr`].
    pub fn attach_mcast(&mut self, qpn: u32, gid: Gid) -> Result<(), VerbsError> {
        self.check_mcast(qpn, gid)?;
        let limits = &self.config.device;
        if limits.max_mcast_qp_attach == 0 || limits.max_mcast_grp == 0 {
            // A device configured without multicast (rxe: EINVAL as well).
            return Err(VerbsError::OpNotSupported);
        }
        self.mcast.attach(qpn, gid, limits)
    }

    /// The multicast groups at least one QP of this device is attached to: the groups a
    /// host joins on the network for it (as rxe adds a group's link-layer address on the
    /// first attach and removes it on the last detach).
    pub fn mcast_groups(&self) -> impl Iterator<Item = Gid> + '_ {
        self.mcast.groups.keys().copied()
    }

    /// A number that changes whenever [`Engine::mcast_groups`] does (a group gained its
    /// first QP or lost its last, by a detach or a QP's destruction): a host compares it
    /// after each verb instead of the whole set.
    pub fn mcast_epoch(&self) -> u64 {
        self.mcast.epoch
    }

    /// `ibv_detach_mcast`: QP `qpn` stops receiving the datagrams of group `gid`. Fails as
    /// [`Engine::attach_mcast`] does, and with `NotAttached` (EINVAL) when the QP is not in
    /// the group. Destroying a QP detaches it from every group.
    pub fn detach_mcast(&mut self, qpn: u32, gid: Gid) -> Result<(), VerbsError> {
        self.check_mcast(qpn, gid)?;
        self.mcast.detach(qpn, gid)
    }

    /// The checks `ib_attach_mcast` / `ib_detach_mcast` make before the driver's.
    fn check_mcast(&self, qpn: u32, gid: Gid) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::InvalidQp)?;
        if qp.qp_type != QpType::Ud {
            return Err(VerbsError::OpNotSupported);
        }
        if !gid.is_multicast() {
            return Err(VerbsError::NotMulticastGid);
        }
        Ok(())
    }
}

/// Whether the ingress path should hand `pkt` to [`handle`]: it names the multicast QPN or
/// a multicast destination (both, for a good one).
pub(crate) fn is_for_multicast(pkt: &RoceV2Packet<'_>) -> bool {
    pkt.transport.bth.dest_qp.value() == MULTICAST_QPN || Gid::from_ip(pkt.ip.dst()).is_multicast()
}

/// A packet to the multicast QPN or a multicast address (already past the ICRC): a copy to
/// every attached UD QP, each checking its own state and Q_Key and taking its own receive
/// WQE, as unicast UD does. A QP that fails a check or has no WQE loses its copy alone.
pub(crate) fn handle<M: Memory + ?Sized>(
    ctx: &mut Ctx<'_, M>,
    groups: &Groups,
    qps: &mut crate::QpTable,
    pkt: &RoceV2Packet<'_>,
    bytes: &[u8],
    internal: bool,
) {
    let bth = &pkt.transport.bth;
    let gid = Gid::from_ip(pkt.ip.dst());
    if bth.dest_qp.value() != MULTICAST_QPN
        || !gid.is_multicast()
        || bth.opcode.transport() != Transport::Ud
    {
        ctx.counters.inc(Counter::RxMcastMismatch);
        return;
    }
    if internal {
        // Datagrams always take the network path (see `ah`): nothing internal is multicast.
        ctx.counters.inc(Counter::RxAddressMismatch);
        return;
    }
    if !recv::pkey_matches(bth.pkey, wire::DEFAULT_PKEY) {
        ctx.counters.inc(Counter::RxPkeyMismatch);
        return;
    }
    let Some(members) = groups.members(&gid) else {
        ctx.counters.inc(Counter::RxMcastNoGroup);
        return;
    };
    // The device received one packet; each member QP receives a copy.
    ctx.counters.inc(Counter::RxPackets);
    ctx.counters.add(Counter::RxBytes, bytes.len() as u64);
    for &qpn in members {
        let Some(qp) = qps.get_mut(&qpn) else {
            // Unreachable: destroy_qp detaches first. A missing QP just gets nothing.
            continue;
        };
        if !qp.state().processes_incoming() {
            ctx.count(qp, Counter::RxBadQpState);
            continue;
        }
        qp.counters.inc(Counter::RxPackets);
        qp.counters.add(Counter::RxBytes, bytes.len() as u64);
        if ud::handle_request(qp, ctx, pkt, bytes) {
            ctx.count(qp, Counter::RxMcastDelivered);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: u8) -> Gid {
        Gid::from_ip(std::net::Ipv4Addr::new(239, 0, 0, n).into())
    }

    fn limits(grp: u32, per_grp: u32, total: u32) -> DeviceAttr {
        DeviceAttr {
            max_mcast_grp: grp,
            max_mcast_qp_attach: per_grp,
            max_total_mcast_qp_attach: total,
            ..DeviceAttr::default()
        }
    }

    #[test]
    fn groups_count_members_and_vanish_when_empty() {
        let d = limits(2, 2, 3);
        let mut g = Groups::default();
        g.attach(0x11, group(1), &d).unwrap();
        g.attach(0x11, group(1), &d).unwrap();
        g.attach(0x12, group(1), &d).unwrap();
        assert_eq!(g.members(&group(1)), Some(&[0x11, 0x12][..]));
        assert_eq!(
            g.attach(0x13, group(1), &d),
            Err(VerbsError::TooMany("QPs attached to the multicast group"))
        );
        g.attach(0x13, group(2), &d).unwrap();
        assert_eq!(
            g.attach(0x14, group(3), &d),
            Err(VerbsError::TooMany("multicast groups"))
        );
        assert_eq!(
            g.attach(0x14, group(2), &d),
            Err(VerbsError::TooMany("multicast attachments"))
        );
        g.detach(0x13, group(2)).unwrap();
        assert_eq!(g.members(&group(2)), None);
        assert_eq!(g.detach(0x13, group(2)), Err(VerbsError::NotAttached));
        assert_eq!(g.detach(0x11, group(2)), Err(VerbsError::NotAttached));
        g.attach(0x11, group(2), &d).unwrap();
        g.detach_all(0x11);
        assert_eq!(g.members(&group(1)), Some(&[0x12][..]));
        assert_eq!(g.members(&group(2)), None);
        assert_eq!(g.attached, 1);
    }

    #[test]
    fn the_epoch_moves_when_a_group_comes_or_goes_and_only_then() {
        let d = limits(4, 4, 8);
        let mut g = Groups::default();
        let mut last = g.epoch;
        let mut moved = |g: &Groups| {
            let m = g.epoch != last;
            last = g.epoch;
            m
        };
        g.attach(0x11, group(1), &d).unwrap();
        assert!(moved(&g), "first member");
        g.attach(0x12, group(1), &d).unwrap();
        g.attach(0x12, group(1), &d).unwrap();
        assert!(!moved(&g), "more members of a joined group");
        g.detach(0x12, group(1)).unwrap();
        assert!(!moved(&g), "a member left, one stays");
        g.attach(0x12, group(2), &d).unwrap();
        assert!(moved(&g), "a second group");
        g.detach_all(0x13);
        assert!(!moved(&g), "a QP in no group destroyed");
        g.detach_all(0x12);
        assert!(moved(&g), "its QP destroyed, group 2 is gone");
        g.detach(0x11, group(1)).unwrap();
        assert!(moved(&g), "last member of group 1 detached");
        assert_eq!(g.groups.len(), 0);
    }
}
