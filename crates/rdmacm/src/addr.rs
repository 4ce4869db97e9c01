//! Socket addresses in and out of C structs, and the kernel's source-address choice.

use core::ffi::c_int;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

/// The IP address and port (host order) of a C socket address, if it is `AF_INET` or
/// `AF_INET6`.
///
/// # Safety
/// `sa` is NULL or points to a socket address of at least the size its family implies.
pub(crate) unsafe fn read_sa(sa: *const libc::sockaddr) -> Option<(IpAddr, u16)> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: non-NULL; the family field is the first of every socket address.
    let family = c_int::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: the caller's AF_INET address is a sockaddr_in.
            let s = unsafe { &*(sa as *const libc::sockaddr_in) };
            Some((
                IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                u16::from_be(s.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the caller's AF_INET6 address is a sockaddr_in6.
            let s = unsafe { &*(sa as *const libc::sockaddr_in6) };
            Some((
                IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                u16::from_be(s.sin6_port),
            ))
        }
        _ => None,
    }
}

/// The family of a C socket address (`AF_UNSPEC` for NULL).
///
/// # Safety
/// `sa` is NULL or points to a socket address.
pub(crate) unsafe fn family(sa: *const libc::sockaddr) -> c_int {
    if sa.is_null() {
        return libc::AF_UNSPEC;
    }
    // SAFETY: non-NULL; the family is the first field.
    c_int::from(unsafe { (*sa).sa_family })
}

/// `ip` and `port` into `out`, as `sockaddr_in` or `sockaddr_in6`.
pub(crate) fn write_sa(out: &mut libc::sockaddr_storage, ip: IpAddr, port: u16) {
    // SAFETY: an all-zero sockaddr_storage is valid.
    *out = unsafe { std::mem::zeroed() };
    match ip {
        IpAddr::V4(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let s = unsafe { &mut *(out as *mut _ as *mut libc::sockaddr_in) };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = port.to_be();
            s.sin_addr.s_addr = u32::from(a).to_be();
        }
        IpAddr::V6(a) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let s = unsafe { &mut *(out as *mut _ as *mut libc::sockaddr_in6) };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = port.to_be();
            s.sin6_addr.s6_addr = a.octets();
        }
    }
}

/// What `out` holds, if it is an IP address.
pub(crate) fn storage_ip(out: &libc::sockaddr_storage) -> Option<(IpAddr, u16)> {
    // SAFETY: a sockaddr_storage is a valid socket address of any family it names.
    unsafe { read_sa(out as *const _ as *const libc::sockaddr) }
}

/// The RoCEv2 GID of an IP address: IPv4-mapped for IPv4.
pub(crate) fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    }
}

/// The IP address a RoCEv2 GID stands for.
pub(crate) fn ip_of_gid(gid: [u8; 16]) -> IpAddr {
    let a = Ipv6Addr::from(gid);
    match a.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(a),
    }
}

/// The source address the kernel picks for `dst` (what `rdma_resolve_addr` uses when the
/// caller names none): connect a UDP socket, which sends nothing, and read its name.
pub(crate) fn kernel_source_for(dst: IpAddr) -> Option<IpAddr> {
    let any: SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = UdpSocket::bind(any).ok()?;
    s.connect((dst, 9)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// A random port of the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), as the
/// kernel's rdma_cm gives an id that binds port 0.
pub(crate) fn ephemeral_port(in_use: impl Fn(u16) -> bool) -> Option<u16> {
    let (lo, hi) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace().map(|v| v.parse::<u16>().ok());
            Some((it.next()??, it.next()??))
        })
        .filter(|(lo, hi)| lo <= hi && *lo > 0)
        .unwrap_or((32768, 60999));
    let span = u32::from(hi - lo) + 1;
    let mut r = [0u8; 4];
    // SAFETY: fills the 4-byte buffer; a short or failed read leaves zeros, still a start.
    unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    let start = u32::from_ne_bytes(r) % span;
    (0..span)
        .map(|i| lo + ((start + i) % span) as u16)
        .find(|p| !in_use(*p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_round_trip() {
        for (ip, port) in [("127.0.0.2", 7471u16), ("fe80::1", 1)] {
            let ip: IpAddr = ip.parse().unwrap();
            // SAFETY: zeroed storage is valid.
            let mut s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            write_sa(&mut s, ip, port);
            assert_eq!(storage_ip(&s), Some((ip, port)));
        }
    }

    #[test]
    fn loopback_source_is_chosen_by_the_kernel() {
        assert_eq!(
            kernel_source_for("127.0.0.1".parse().unwrap()),
            Some("127.0.0.1".parse().unwrap())
        );
    }

    #[test]
    fn gids_are_v4_mapped() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(ip_of_gid(gid_of(ip)), ip);
    }

    #[test]
    fn ephemeral_ports_skip_ports_in_use() {
        let p = ephemeral_port(|_| false).unwrap();
        assert!(p >= 1024);
        assert_eq!(ephemeral_port(|_| true), None);
    }
}
