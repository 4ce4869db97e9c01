//! The device and its one port: attributes as `ibv_query_device` / `ibv_query_port` report
//! them, the RoCEv2 GID table, and the engine's configuration.

use core::time::Duration;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use wire::Mtu;

/// A 128-bit global identifier. For RoCEv2 it is the IP address of the port: the address
/// itself for IPv6, the IPv4-mapped IPv6 address `::ffff:a.b.c.d` for IPv4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The RoCEv2 GID of an IP address.
    pub fn from_ip(ip: IpAddr) -> Gid {
        match ip {
            IpAddr::V4(v4) => Gid(v4.to_ipv6_mapped().octets()),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }

    /// The IP address packets to this GID go to: IPv4 for an IPv4-mapped GID.
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// The all-zero GID (an unused table entry).
    pub const ZERO: Gid = Gid([0; 16]);

    /// Whether this is a multicast GID: IPv6 `ff00::/8`, or an IPv4 group `224.0.0.0/4`
    /// mapped as RoCEv2 maps IPv4 addresses (`::ffff:224.0.0.0/100`). Only these can be
    /// joined with [`crate::Engine::attach_mcast`].
    pub fn is_multicast(&self) -> bool {
        match self.to_ip() {
            IpAddr::V4(v4) => v4.is_multicast(),
            IpAddr::V6(v6) => v6.is_multicast(),
        }
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Gid {
        Gid::from_ip(ip)
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Gid {
        Gid::from_ip(IpAddr::V4(ip))
    }
}

impl core::fmt::Display for Gid {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // The colon-grouped form `ibv_devinfo -v` prints.
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// `ibv_atomic_cap`: the atomicity guarantee of ATOMIC operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicCap {
    /// No atomics.
    None,
    /// Atomic with respect to other atomics through this device (`IBV_ATOMIC_HCA`).
    Hca,
    /// Atomic with respect to the CPU too (`IBV_ATOMIC_GLOB`).
    Glob,
}

/// Device attributes (`ibv_device_attr` plus the inline limit of `ibv_device_attr_ex`).
/// The defaults follow Linux rxe where it has a value.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest memory region in bytes.
    pub max_mr_size: u64,
    /// Page sizes supported (bit n = 2^n bytes).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most QPs.
    pub max_qp: u32,
    /// Most outstanding WRs on one work queue.
    pub max_qp_wr: u32,
    /// Most SGEs in one send or receive WR.
    pub max_sge: u32,
    /// Most SGEs in one RDMA READ WR.
    pub max_sge_rd: u32,
    /// Most CQs.
    pub max_cq: u32,
    /// Most entries in one CQ.
    pub max_cqe: u32,
    /// Most MRs.
    pub max_mr: u32,
    /// Most PDs.
    pub max_pd: u32,
    /// Most RDMA READ / ATOMIC a QP can serve as responder (max_dest_rd_atomic limit).
    pub max_qp_rd_atom: u32,
    /// Most RDMA READ / ATOMIC a QP can have outstanding as requester (max_rd_atomic limit).
    pub max_qp_init_rd_atom: u32,
    /// Total responder resources of the device.
    pub max_res_rd_atom: u32,
    /// Largest inline send in bytes.
    pub max_inline_data: u32,
    /// Atomic capability.
    pub atomic_cap: AtomicCap,
    /// Most SRQs.
    pub max_srq: u32,
    /// Most WRs in one SRQ.
    pub max_srq_wr: u32,
    /// Most SGEs in one SRQ WR.
    pub max_srq_sge: u32,
    /// Most memory windows.
    pub max_mw: u32,
    /// Most address handles.
    pub max_ah: u32,
    /// P_Key table length.
    pub max_pkeys: u16,
    /// Number of physical ports.
    pub phys_port_cnt: u8,
    /// Most multicast groups with a QP attached ([`crate::Engine::attach_mcast`]).
    pub max_mcast_grp: u32,
    /// Most QPs attached to one multicast group.
    pub max_mcast_qp_attach: u32,
    /// Most attachments (QP, group) of the device in all.
    pub max_total_mcast_qp_attach: u32,
}

impl Default for DeviceAttr {
    fn default() -> Self {
        DeviceAttr {
            fw_ver: "0.1.0".to_string(),
            node_guid: 0,
            sys_image_guid: 0,
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_f000,
            // rxe reports 0xffffff ("no vendor"); a soft device has no IEEE OUI either.
            vendor_id: 0x00ff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            max_qp: 0x1_0000,
            max_qp_wr: 0x4000,
            max_sge: 32,
            max_sge_rd: 32,
            max_cq: 0x4000,
            max_cqe: (1 << 15) - 1,
            max_mr: 0x4_0000,
            max_pd: 0x7ffc,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_res_rd_atom: 0x3f000,
            max_inline_data: 400,
            atomic_cap: AtomicCap::Hca,
            max_srq: 0x4000,
            max_srq_wr: 0x4000,
            max_srq_sge: 27,
            max_mw: 0x4_0000,
            max_ah: 0x4000,
            max_pkeys: 1,
            phys_port_cnt: 1,
            // rxe's RXE_MAX_MCAST_GRP, RXE_MAX_MCAST_QP_ATTACH and their product.
            max_mcast_grp: 8192,
            max_mcast_qp_attach: 56,
            max_total_mcast_qp_attach: 56 * 8192,
        }
    }
}

/// `ibv_port_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortState {
    /// Link down.
    Down,
    /// Up and usable (the only state a soft port is in).
    Active,
}

/// The link layer of the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// RoCE: InfiniBand transport over Ethernet / IP.
    Ethernet,
}

/// Port attributes (`ibv_port_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Logical port state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use (paths may use less).
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// Largest message in bytes.
    pub max_msg_sz: u32,
    /// Link layer.
    pub link_layer: LinkLayer,
}

impl PortAttr {
    /// The attributes of a RoCE port (one P_Key, Ethernet link layer), as `ibv_query_port`
    /// reports them; for hosts that carry port attributes across a boundary.
    pub fn roce(
        state: PortState,
        max_mtu: Mtu,
        active_mtu: Mtu,
        gid_tbl_len: u32,
        max_msg_sz: u32,
    ) -> PortAttr {
        PortAttr {
            state,
            max_mtu,
            active_mtu,
            gid_tbl_len,
            pkey_tbl_len: 1,
            max_msg_sz,
            link_layer: LinkLayer::Ethernet,
        }
    }
}

/// How the ingress ICRC check treats the IPv4 identification: the ICRC covers it, but a host
/// that receives on a UDP socket cannot see it and hands the engine a header it rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Ipv4IdentPolicy {
    /// The IPv4 header handed to [`crate::Engine::handle_datagram`] is the one the sender
    /// built, or one the host rebuilt exactly (ID 0 and DF, as softrdma and any sender on an
    /// unconnected `IP_PMTUDISC_DO` socket send): the ICRC is checked in full, all 32 bits.
    /// For raw sockets, the simulator, captures, and hosts whose peers are softrdma devices.
    #[default]
    AsReceived,
    /// The host cannot see the sender's ID (a UDP socket) and rebuilt the header with some
    /// ID. An IPv4 packet whose ICRC fails with that ID is accepted when another ID makes it
    /// hold, found from the same CRC pass ([`wire::icrc::ipv4_ident_for_icrc`], about 30 ns
    /// per packet) and counted as [`crate::Counter::RxIcrcIdRecovered`]; when no ID does,
    /// it is dropped as [`crate::Counter::RxBadIcrc`]. This is how a host behind a UDP socket
    /// receives from senders that count IDs up, such as Linux rxe.
    ///
    /// The price is protection: 16 of the ICRC's 32 bits go to finding the ID, so a corrupted
    /// IPv4 packet is accepted with probability about 2^-16 instead of 2^-32, and some short
    /// corruptions are never caught (15 of the 255 ways to corrupt the byte at IP offset 121,
    /// for one). The other header fields must still be rebuilt as sent (DF set): a sender
    /// that clears DF fails the check either way. IPv6 packets (no ID) and internal packets
    /// (no ICRC) are unaffected.
    Recover,
}

/// How to build an [`crate::Engine`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EngineConfig {
    /// The port's IP addresses, in GID-table order (index 0 first).
    pub addresses: Vec<IpAddr>,
    /// Attributes reported (and enforced) by the device.
    pub device: DeviceAttr,
    /// The port MTU (largest path MTU a QP may use; the active MTU reported).
    pub mtu: Mtu,
    /// Seed of the generator that picks key tags: random in production, fixed in the sim.
    pub rng_seed: u64,
    /// The requester sets AckReq at least every this many packets of a long message
    /// (besides the last packet of every message), so the responder ACKs progress.
    pub ack_req_every: u32,
    /// The requester never has more than this many PSNs outstanding (unacknowledged).
    pub max_unacked_psns: u32,
    /// The UDP source port of every packet, for hosts that must send from one bound port
    /// (the ICRC covers it, so the engine has to know). `None`: a port per QP derived from
    /// the QPN, as rxe does, for ECMP entropy.
    pub udp_src_port: Option<u16>,
    /// Destinations the host hands to an engine of its own process instead of a socket (a
    /// daemon's own addresses). A connected QP whose path leads there is *internal*: its
    /// packets carry up to `internal_mtu` payload bytes and no ICRC, the host delivers them
    /// with [`crate::Engine::handle_internal`], and they must never be sent. The QP's path
    /// MTU is still what verbs report. Empty: every path is a network path.
    pub internal_addresses: Vec<IpAddr>,
    /// Payload bytes per packet on internal paths (clamped to [`MAX_INTERNAL_MTU`] and to at
    /// least the port MTU).
    pub internal_mtu: u32,
    /// Whether received IPv4 headers carry the sender's identification, or the ICRC check
    /// should find it (see [`Ipv4IdentPolicy`]). Default: as received, the exact check.
    pub ipv4_ident: Ipv4IdentPolicy,
    /// How long a plain ACK may wait for newer ones to replace it (RC ACKs are cumulative),
    /// counted from the oldest it stands for; ACKs to a peer seen waiting for them leave at
    /// the next pass whatever this says. Zero: every ACK leaves at the next pass. An ACK
    /// never leaves in the pass that handled its request (see [`crate::Engine::poll_transmit`]).
    pub ack_coalesce: Duration,
}

/// The default [`EngineConfig::ack_coalesce`]: long enough for a stream of small messages
/// to share ACKs, far below the local ACK timeouts peers use (4.096 µs × 2^timeout: 4 ms at
/// `timeout` 10, 67 ms at the 14 of `ibv_rc_pingpong` and perftest).
pub const DEFAULT_ACK_COALESCE: Duration = Duration::from_micros(50);

/// Largest payload of an internal packet: it still has to fit an IP packet's 16-bit length
/// with every header.
pub const MAX_INTERNAL_MTU: u32 = 32 << 10;

impl EngineConfig {
    /// A configuration with the given port addresses and RNG seed, defaults elsewhere.
    pub fn new(addresses: Vec<IpAddr>, rng_seed: u64) -> EngineConfig {
        EngineConfig {
            addresses,
            device: DeviceAttr::default(),
            mtu: Mtu::Mtu4096,
            rng_seed,
            ack_req_every: 32,
            max_unacked_psns: 512,
            udp_src_port: None,
            internal_addresses: Vec::new(),
            internal_mtu: MAX_INTERNAL_MTU,
            ipv4_ident: Ipv4IdentPolicy::AsReceived,
            ack_coalesce: DEFAULT_ACK_COALESCE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rocev2_gids() {
        let v4: IpAddr = "10.0.0.1".parse().unwrap();
        let g = Gid::from_ip(v4);
        assert_eq!(&g.0[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(&g.0[12..], &[10, 0, 0, 1]);
        assert_eq!(g.to_ip(), v4);
        let v6: IpAddr = "fe80::1".parse().unwrap();
        assert_eq!(Gid::from_ip(v6).to_ip(), v6);
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a00:0001");
    }

    #[test]
    fn multicast_gids_are_ipv6_ff00_and_mapped_ipv4_class_d() {
        let gid = |s: &str| Gid::from_ip(s.parse::<IpAddr>().unwrap());
        for m in [
            "224.0.0.1",
            "239.255.255.255",
            "230.1.2.3",
            "ff02::1",
            "ff0e::1:2",
            "ff00::",
        ] {
            assert!(gid(m).is_multicast(), "{m}");
        }
        for u in [
            "10.0.0.1",
            "223.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "fe80::1",
            "fd00::ff",
            "::",
            "::1",
            // IPv4-compatible (not mapped) 224.0.0.1: not a RoCEv2 IPv4 GID.
            "::e000:1",
        ] {
            assert!(!gid(u).is_multicast(), "{u}");
        }
        assert!(!Gid::ZERO.is_multicast());
    }
}
