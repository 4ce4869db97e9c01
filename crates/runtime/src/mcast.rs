//! Multicast groups on the network, as Linux does it for RoCEv2: while at least one QP of
//! the device is attached to a group (`ibv_attach_mcast`, `rdma_join_multicast`), the device
//! is a member of the group's IP address (the GID's IPv4-mapped address, or the IPv6 group)
//! on the interfaces holding its addresses, and receives what is sent there (rdma_cm's
//! `cma_iboe_join_multicast` sends the IGMP join, rxe's `rxe_mcast_add` adds the link-layer
//! address). The last detach (or the destruction of the last attached QP, or the device's
//! closing) leaves the group.
//!
//! Each joined group is one more receive side of the device ([`io::Rx::for_group`] over
//! [`io::group_socket`]): the same batched receive, rebuilt headers (or the raw path's real
//! ones), ICRC check, capture and counters as unicast datagrams. Its socket sits in an
//! epoll set the waiting threads poll beside the device's own sockets, so that joining
//! needs no change to the poll sets.
//!
//! A datagram this process sent to a group comes back from the network too (the kernel
//! loops multicast back to the host's members; on `lo` the datagram itself comes back,
//! whatever `IP_MULTICAST_LOOP` says). The devices of this process already had their copies
//! from `route_multicast`, so each group side drops datagrams whose source is an address of
//! this device or of a device linked with it ([`IoCounters::rx_mcast_own`]); other
//! processes on the host, and other hosts, receive them as usual. Loop cannot simply be
//! turned off: other processes on this host would lose them.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use engine::Gid;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};

use crate::{io, Attachment, Core, IoCounters, Shared};

/// How a device receives its multicast groups; fixed when it starts.
pub(crate) struct Groups {
    /// The UDP port the device receives on (datagrams to a group are sent to it as well).
    pub(crate) port: u16,
    /// IPv4 groups are received through raw sockets (the device's IPv4 addresses are).
    pub(crate) raw: bool,
    /// Datagrams per receive call.
    pub(crate) batch: usize,
    /// Readable while a group socket is: polled beside the device's own sockets.
    pub(crate) poll: Epoll,
}

impl Groups {
    pub(crate) fn new(port: u16, raw: bool, batch: usize) -> nix::Result<Groups> {
        Ok(Groups {
            port,
            raw,
            batch,
            poll: Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?,
        })
    }
}

/// Add what receive side `side` counted to `into` (the device's totals; a group side that
/// goes leaves its counts in `Core::rx_retired`).
pub(crate) fn add_rx_counters(into: &mut IoCounters, side: &io::Rx) {
    into.rx_datagrams += side.counters.rx_datagrams;
    into.rx_trains += side.counters.rx_trains;
    into.rx_dropped += side.counters.rx_dropped;
    into.rx_mcast_own += side.counters.rx_mcast_own;
}

impl<A: Attachment> Shared<A> {
    /// Join the groups the engine's QPs were attached to since the last look, and leave the
    /// ones that lost their last QP. Called under the engine lock after every change of
    /// engine state; one comparison when the set of groups did not change.
    pub(crate) fn sync_groups(&self, core: &mut Core<A>) {
        let epoch = core.engine.mcast_epoch();
        if epoch == core.groups_epoch {
            return;
        }
        // Only a thread holding the engine lock takes the receive side: if it is taken, it
        // is this thread, in the middle of a receive pass (which attaches nothing). The next
        // change looks again.
        let Ok(mut rx) = self.rx.try_lock() else {
            return;
        };
        core.groups_epoch = epoch;
        let want: BTreeSet<IpAddr> = core.engine.mcast_groups().map(Gid::to_ip).collect();
        let poll = &self.groups.poll;
        let retired = &mut core.rx_retired;
        rx.retain(|side| match side.group() {
            Some(g) if !want.contains(&g) => {
                let _ = poll.delete(side.socket());
                add_rx_counters(retired, side);
                tracing::debug!(group = %g, "left multicast group");
                false
            }
            _ => true,
        });
        let joined: BTreeSet<IpAddr> = rx.iter().filter_map(io::Rx::group).collect();
        let own = self.own_sources();
        for &g in want.difference(&joined) {
            let Some(side) = self.join(g, &own) else {
                continue;
            };
            if let Err(e) = poll.add(side.socket(), EpollEvent::new(EpollFlags::EPOLLIN, 0)) {
                tracing::warn!(group = %g, error = %e, "cannot watch the group's socket; its datagrams are not received");
                continue;
            }
            tracing::debug!(group = %g, "joined multicast group");
            rx.push(side);
        }
    }

    /// A receive side for group `g`, joined on the device's interfaces; `None` (logged)
    /// when the group cannot be joined: its QPs then get what this process sends it only.
    fn join(&self, g: IpAddr, own: &[IpAddr]) -> Option<io::Rx> {
        let Groups {
            port, raw, batch, ..
        } = self.groups;
        let raw = raw && g.is_ipv4();
        let sock = match io::group_socket(g, port, &self.addrs, raw) {
            Ok(s) => Some((s, raw)),
            Err(e) if raw => {
                tracing::warn!(group = %g, error = %e, "cannot join the group on a raw socket; joining on a UDP socket (datagrams with a non-zero IPv4 ID then fail the ICRC check)");
                None
            }
            Err(e) => {
                tracing::warn!(group = %g, error = %e, "cannot join the multicast group on the network");
                return None;
            }
        };
        let (sock, raw) = match sock {
            Some(s) => s,
            None => match io::group_socket(g, port, &self.addrs, false) {
                Ok(s) => (s, false),
                Err(e) => {
                    tracing::warn!(group = %g, error = %e, "cannot join the multicast group on the network");
                    return None;
                }
            },
        };
        Some(io::Rx::for_group(
            Arc::new(sock),
            g,
            batch,
            raw.then_some(port),
            own.to_vec(),
        ))
    }

    /// The addresses whose datagrams to a group this device already had from
    /// `route_multicast`: its own and those of the devices of this process linked with it.
    fn own_sources(&self) -> Vec<IpAddr> {
        let mut v = self.addrs.clone();
        v.extend(self.net.peers.get().into_iter().flatten().map(|(a, _)| *a));
        v.sort();
        v.dedup();
        v
    }

    /// The multicast groups the device is a member of on the network now.
    pub(crate) fn joined_groups(&self) -> Vec<IpAddr> {
        let _core = self.lock();
        // Under the engine lock the receive side is free (see `sync_groups`).
        match self.rx.try_lock() {
            Ok(rx) => rx.iter().filter_map(io::Rx::group).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Leave every group (the device closes).
    pub(crate) fn leave_groups(&self) {
        let mut core = self.lock();
        let Ok(mut rx) = self.rx.try_lock() else {
            return;
        };
        let poll = &self.groups.poll;
        let retired = &mut core.rx_retired;
        rx.retain(|side| {
            if side.group().is_none() {
                return true;
            }
            let _ = poll.delete(side.socket());
            add_rx_counters(retired, side);
            false
        });
    }
}
