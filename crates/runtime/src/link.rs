//! The link under a device's address: its MTU decides the largest path MTU the port offers,
//! as Linux Soft-RoCE derives the port's active MTU from its netdev, and its interface is
//! where the device joins multicast groups ([`interface_index`]).
//!
//! A RoCEv2 packet carries, besides its payload, up to 96 bytes of headers (IPv6 40, UDP 8,
//! BTH 12, the largest extension headers 32, ICRC 4; the count rdma-core's `iboe_get_mtu`
//! uses), and softrdma always sets DF: a path MTU whose packets do not fit the link would
//! be dropped by the kernel on every try. On a 1500-byte Ethernet link the port therefore
//! offers 1024, on a 9000-byte link or loopback 4096.

use std::net::IpAddr;

use engine::qp_attr::Mtu;

/// Bytes of a RoCEv2 packet that are not payload, at most.
pub const ROCEV2_OVERHEAD: u32 = 96;

/// The largest IB MTU whose packets fit a link of `link_mtu` bytes; `None` when not even
/// 256 fits.
pub fn ib_mtu_for_link(link_mtu: u32) -> Option<Mtu> {
    let room = link_mtu.checked_sub(ROCEV2_OVERHEAD)?;
    [
        Mtu::Mtu4096,
        Mtu::Mtu2048,
        Mtu::Mtu1024,
        Mtu::Mtu512,
        Mtu::Mtu256,
    ]
    .into_iter()
    .find(|m| m.bytes() <= room as usize)
}

/// The name of the interface holding `addr`; `None` when the address is on no interface
/// (a wildcard).
pub fn interface_name(addr: IpAddr) -> Option<String> {
    let ifaces = nix::ifaddrs::getifaddrs().ok()?;
    ifaces
        .filter_map(|ifa| {
            let a = ifa.address?;
            let ip = if let Some(v4) = a.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else {
                IpAddr::V6(a.as_sockaddr_in6()?.ip())
            };
            (ip == addr).then_some(ifa.interface_name)
        })
        .next()
}

/// The index of the interface holding `addr` (what `IPV6_JOIN_GROUP` and
/// `IPV6_MULTICAST_IF` name an interface by); `None` when it is on no interface.
pub fn interface_index(addr: IpAddr) -> Option<u32> {
    nix::net::if_::if_nametoindex(interface_name(addr)?.as_str()).ok()
}

/// The MTU of the interface holding `addr`, from sysfs; `None` when the address is on no
/// interface (a wildcard) or the MTU cannot be read.
pub fn link_mtu(addr: IpAddr) -> Option<u32> {
    let name = interface_name(addr)?;
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?;
    text.trim().parse().ok()
}

/// The port MTU for a device on `addr` asked to offer `wanted`: `wanted`, or less when the
/// link cannot carry it (and `wanted` when the link is unknown).
pub fn port_mtu(addr: IpAddr, wanted: Mtu) -> Mtu {
    match link_mtu(addr).map(|l| (l, ib_mtu_for_link(l))) {
        Some((link, Some(fits))) if fits.bytes() < wanted.bytes() => {
            tracing::info!(%addr, link_mtu = link, port_mtu = fits.bytes(), "the link is smaller than the configured MTU; the port offers what fits");
            fits
        }
        Some((link, None)) => {
            tracing::warn!(%addr, link_mtu = link, "the link cannot carry even 256-byte RoCEv2 packets; keeping the configured MTU");
            wanted
        }
        _ => wanted,
    }
}

/// The port MTU of a device on `addrs` asked to offer `wanted`: the largest IB MTU whose
/// RoCEv2 packets fit the link under every one of its addresses (a port offers one MTU for
/// all its GIDs, and a path through the smallest link must not lose its packets to DF).
/// Addresses on no interface leave `wanted`.
pub fn port_mtu_of(addrs: &[IpAddr], wanted: Mtu) -> Mtu {
    addrs
        .iter()
        .map(|a| port_mtu(*a, wanted))
        .min_by_key(|m| m.bytes())
        .unwrap_or(wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ethernet_links_map_like_soft_roce() {
        assert_eq!(ib_mtu_for_link(1500), Some(Mtu::Mtu1024));
        assert_eq!(ib_mtu_for_link(9000), Some(Mtu::Mtu4096));
        assert_eq!(ib_mtu_for_link(65536), Some(Mtu::Mtu4096));
        assert_eq!(ib_mtu_for_link(4096 + 96), Some(Mtu::Mtu4096));
        assert_eq!(ib_mtu_for_link(4096 + 95), Some(Mtu::Mtu2048));
        assert_eq!(ib_mtu_for_link(256 + 96), Some(Mtu::Mtu256));
        assert_eq!(ib_mtu_for_link(256 + 95), None);
        assert_eq!(ib_mtu_for_link(0), None);
    }

    #[test]
    fn loopback_carries_the_largest_mtu() {
        assert_eq!(link_mtu("127.0.0.1".parse().unwrap()), Some(65536));
        assert_eq!(
            port_mtu("127.0.0.1".parse().unwrap(), Mtu::Mtu4096),
            Mtu::Mtu4096
        );
    }

    #[test]
    fn a_port_offers_what_its_smallest_link_carries() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(port_mtu_of(&[lo], Mtu::Mtu4096), Mtu::Mtu4096);
        // Never more than asked for.
        assert_eq!(port_mtu_of(&[lo], Mtu::Mtu2048), Mtu::Mtu2048);
        // TEST-NET-1 and -2: on no interface of a test machine.
        let a: IpAddr = "192.0.2.9".parse().unwrap();
        let b: IpAddr = "198.51.100.9".parse().unwrap();
        assert_eq!(port_mtu_of(&[a, b], Mtu::Mtu1024), Mtu::Mtu1024);
        assert_eq!(port_mtu_of(&[], Mtu::Mtu4096), Mtu::Mtu4096);
    }

    #[test]
    fn loopback_addresses_are_on_lo() {
        for a in ["127.0.0.1", "::1"] {
            let a: IpAddr = a.parse().unwrap();
            assert_eq!(interface_name(a).as_deref(), Some("lo"), "{a}");
            assert_eq!(interface_index(a), Some(1), "{a}");
        }
        assert_eq!(interface_index("192.0.2.77".parse().unwrap()), None);
    }

    #[test]
    fn unknown_addresses_keep_the_configured_mtu() {
        // 192.0.2.0/24 is TEST-NET-1: on no interface of a test machine.
        let a: IpAddr = "192.0.2.77".parse().unwrap();
        assert_eq!(link_mtu(a), None);
        assert_eq!(port_mtu(a, Mtu::Mtu2048), Mtu::Mtu2048);
    }
}
