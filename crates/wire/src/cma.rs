//! The RDMA IP CM service (IBA Annex A11): how rdma_cm maps IP addresses and ports onto the
//! IB connection manager.
//!
//! - The destination port and the port space (TCP, UDP, IB, IPoIB) travel in the REQ's (or
//!   SIDR_REQ's) service ID: [`ServiceId::rdma_cm`].
//! - The source port and both IP addresses travel in a 36-byte header at the start of the
//!   private data ([`CmaHeader`], [`CmaHeaderRepr`]); the consumer's own private data follows
//!   it, so an rdma_cm REQ carries at most 92 − 36 = 56 bytes of it.
//!
//! ```text
//!  byte 0           1               2..3      4..19            20..35
//!  MajV(4) MinV(4) | IPV(4) resv(4) | SrcPort | SrcIP (128 bits) | DstIP (128 bits)
//! ```
//!
//! An IPv4 address sits in the last 4 bytes of its 16-byte slot, the first 12 zero.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::bytes::{check_len, set_u16, u16_at};
use crate::error::{HeaderKind, WireError};

/// Length of the IP CM header at the start of the private data.
pub const CMA_HEADER_LEN: usize = 36;
/// The only IP CM header version defined (major 0, minor 0).
pub const CMA_VERSION: u8 = 0;

mod field {
    use core::ops::Range;
    pub const VERSION: usize = 0;
    pub const IP_VERSION: usize = 1;
    pub const SRC_PORT: usize = 2;
    pub const SRC_IP: Range<usize> = 4..20;
    pub const DST_IP: Range<usize> = 20..36;
    /// Where an IPv4 address sits within its 16-byte slot.
    pub const V4_IN_SLOT: Range<usize> = 12..16;
}

/// An rdma_cm port space: which socket-like namespace a port number belongs to. It is the
/// upper half of the low 32 bits of an rdma_cm service ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortSpace(pub u16);

impl PortSpace {
    /// `RDMA_PS_IPOIB`.
    pub const IPOIB: PortSpace = PortSpace(0x0002);
    /// `RDMA_PS_TCP`: reliable connections (RC QPs), what most programs use.
    pub const TCP: PortSpace = PortSpace(0x0106);
    /// `RDMA_PS_UDP`: UD QPs, resolved with SIDR rather than connected.
    pub const UDP: PortSpace = PortSpace(0x0111);
    /// `RDMA_PS_IB`: any QP type.
    pub const IB: PortSpace = PortSpace(0x013f);
}

/// A CM service ID (IBA 12.7.3, Annex A3): what a REQ or SIDR_REQ asks to connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ServiceId(pub u64);

impl ServiceId {
    /// The service ID rdma_cm uses for `port` in port space `ps`: the port space in bits
    /// 31..16 and the port in bits 15..0. For TCP, UDP and IB this reads, as Wireshark shows
    /// it, as the prefix 0x0000000001, the IP protocol byte, then the port.
    pub const fn rdma_cm(ps: PortSpace, port: u16) -> ServiceId {
        ServiceId((ps.0 as u64) << 16 | port as u64)
    }

    /// The port space and port of an rdma_cm service ID, if the upper 32 bits are zero as
    /// rdma_cm leaves them.
    pub const fn rdma_cm_parts(self) -> Option<(PortSpace, u16)> {
        if self.0 >> 32 == 0 {
            Some((PortSpace((self.0 >> 16) as u16), self.0 as u16))
        } else {
            None
        }
    }
}

/// The source and destination IP addresses an IP CM header carries, of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmaAddrs {
    /// IPv4 (IP version nibble 4).
    V4 {
        /// The active side's address.
        src: Ipv4Addr,
        /// The passive side's address.
        dst: Ipv4Addr,
    },
    /// IPv6 (IP version nibble 6).
    V6 {
        /// The active side's address.
        src: Ipv6Addr,
        /// The passive side's address.
        dst: Ipv6Addr,
    },
}

impl CmaAddrs {
    /// The pair, if both addresses are of one family.
    pub const fn new(src: IpAddr, dst: IpAddr) -> Option<CmaAddrs> {
        match (src, dst) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => Some(CmaAddrs::V4 { src, dst }),
            (IpAddr::V6(src), IpAddr::V6(dst)) => Some(CmaAddrs::V6 { src, dst }),
            _ => None,
        }
    }

    /// The active side's address.
    pub const fn src(&self) -> IpAddr {
        match *self {
            CmaAddrs::V4 { src, .. } => IpAddr::V4(src),
            CmaAddrs::V6 { src, .. } => IpAddr::V6(src),
        }
    }

    /// The passive side's address.
    pub const fn dst(&self) -> IpAddr {
        match *self {
            CmaAddrs::V4 { dst, .. } => IpAddr::V4(dst),
            CmaAddrs::V6 { dst, .. } => IpAddr::V6(dst),
        }
    }

    /// The IP version nibble.
    pub const fn ip_version(&self) -> u8 {
        match self {
            CmaAddrs::V4 { .. } => 4,
            CmaAddrs::V6 { .. } => 6,
        }
    }
}

/// A zero-copy view of an IP CM header at the start of a private-data buffer.
#[derive(Debug, Clone)]
pub struct CmaHeader<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> CmaHeader<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 36 bytes.
    pub const fn new_unchecked(buf: T) -> CmaHeader<T> {
        CmaHeader { buf }
    }

    /// Wrap a buffer that holds at least 36 bytes.
    pub fn new_checked(buf: T) -> Result<CmaHeader<T>, WireError> {
        check_len(buf.as_ref().len(), CMA_HEADER_LEN, HeaderKind::CmaHeader)?;
        Ok(CmaHeader { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// Version byte: major in the high nibble, minor in the low.
    pub fn version(&self) -> u8 {
        self.buf.as_ref()[field::VERSION]
    }

    /// IP version nibble (4 or 6).
    pub fn ip_version(&self) -> u8 {
        self.buf.as_ref()[field::IP_VERSION] >> 4
    }

    /// The active side's port (the passive side's is in the service ID).
    pub fn src_port(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::SRC_PORT)
    }

    /// The source address slot, 16 bytes as stored.
    pub fn src_slot(&self) -> [u8; 16] {
        slot(&self.buf.as_ref()[field::SRC_IP])
    }

    /// The destination address slot, 16 bytes as stored.
    pub fn dst_slot(&self) -> [u8; 16] {
        slot(&self.buf.as_ref()[field::DST_IP])
    }
}

fn slot(b: &[u8]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(b);
    a
}

fn v4_of(slot: [u8; 16]) -> Ipv4Addr {
    let mut a = [0u8; 4];
    a.copy_from_slice(&slot[field::V4_IN_SLOT]);
    Ipv4Addr::from(a)
}

/// The fields of an IP CM header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHeaderRepr {
    /// The active side's port.
    pub src_port: u16,
    /// Both addresses.
    pub addrs: CmaAddrs,
}

impl CmaHeaderRepr {
    /// Header length in bytes.
    pub const LEN: usize = CMA_HEADER_LEN;

    /// Read the header; version must be 0.0 and the IP version 4 or 6 (as Linux's rdma_cm
    /// checks before it trusts the addresses).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmaHeader<&T>) -> Result<CmaHeaderRepr, WireError> {
        if p.version() != CMA_VERSION {
            return Err(WireError::BadCmaVersion {
                version: p.version(),
            });
        }
        let addrs = match p.ip_version() {
            4 => CmaAddrs::V4 {
                src: v4_of(p.src_slot()),
                dst: v4_of(p.dst_slot()),
            },
            6 => CmaAddrs::V6 {
                src: Ipv6Addr::from(p.src_slot()),
                dst: Ipv6Addr::from(p.dst_slot()),
            },
            version => return Err(WireError::BadIpVersion { version }),
        };
        Ok(CmaHeaderRepr {
            src_port: p.src_port(),
            addrs,
        })
    }

    /// Read the header at the start of `private_data`.
    pub fn parse_bytes(private_data: &[u8]) -> Result<CmaHeaderRepr, WireError> {
        CmaHeaderRepr::parse(&CmaHeader::new_checked(private_data)?)
    }

    /// Write the header at the start of `buf` (at least 36 bytes).
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let Some(b) = buf.get_mut(..CMA_HEADER_LEN) else {
            return Err(WireError::BufferTooSmall {
                needed: CMA_HEADER_LEN,
                available: buf.len(),
            });
        };
        b.fill(0);
        b[field::VERSION] = CMA_VERSION;
        b[field::IP_VERSION] = self.addrs.ip_version() << 4;
        set_u16(b, field::SRC_PORT, self.src_port);
        match self.addrs {
            CmaAddrs::V4 { src, dst } => {
                b[field::SRC_IP][field::V4_IN_SLOT].copy_from_slice(&src.octets());
                b[field::DST_IP][field::V4_IN_SLOT].copy_from_slice(&dst.octets());
            }
            CmaAddrs::V6 { src, dst } => {
                b[field::SRC_IP].copy_from_slice(&src.octets());
                b[field::DST_IP].copy_from_slice(&dst.octets());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rping_service_id_reads_as_wireshark_shows_it() {
        // rxe-cm-rping.pcap: prefix 0000000001, protocol 0x06, port 0x1c06 (7174)
        let sid = ServiceId::rdma_cm(PortSpace::TCP, 7174);
        assert_eq!(sid.0, 0x0000_0000_0106_1c06);
        assert_eq!(sid.rdma_cm_parts(), Some((PortSpace::TCP, 7174)));
        assert_eq!(ServiceId(1 << 32).rdma_cm_parts(), None);
        assert_eq!(
            ServiceId::rdma_cm(PortSpace::UDP, 1).0,
            0x0000_0000_0111_0001
        );
    }

    #[test]
    fn ipv4_header_layout_and_round_trip() {
        let r = CmaHeaderRepr {
            src_port: 0x910f,
            addrs: CmaAddrs::new([10, 50, 0, 12].into(), [10, 50, 0, 11].into()).unwrap(),
        };
        let mut b = [0xffu8; 40];
        r.emit(&mut b).unwrap();
        let mut want = [0u8; 36];
        want[1] = 0x40;
        want[2..4].copy_from_slice(&[0x91, 0x0f]);
        want[16..20].copy_from_slice(&[10, 50, 0, 12]);
        want[32..36].copy_from_slice(&[10, 50, 0, 11]);
        assert_eq!(b[..36], want);
        assert_eq!(b[36..], [0xff; 4]);
        assert_eq!(CmaHeaderRepr::parse_bytes(&b), Ok(r));
    }

    #[test]
    fn ipv6_round_trips_and_bad_versions_are_refused() {
        let r = CmaHeaderRepr {
            src_port: 1,
            addrs: CmaAddrs::new("fe80::1".parse().unwrap(), "fe80::2".parse().unwrap()).unwrap(),
        };
        let mut b = [0u8; 36];
        r.emit(&mut b).unwrap();
        assert_eq!(CmaHeaderRepr::parse_bytes(&b), Ok(r));
        assert_eq!(r.addrs.dst(), "fe80::2".parse::<IpAddr>().unwrap());
        b[1] = 0x50;
        assert_eq!(
            CmaHeaderRepr::parse_bytes(&b),
            Err(WireError::BadIpVersion { version: 5 })
        );
        b[0] = 0x10;
        assert_eq!(
            CmaHeaderRepr::parse_bytes(&b),
            Err(WireError::BadCmaVersion { version: 0x10 })
        );
        assert!(CmaHeaderRepr::parse_bytes(&b[..35]).is_err());
        assert!(r.emit(&mut [0u8; 35]).is_err());
        assert!(CmaAddrs::new("::1".parse().unwrap(), [1, 2, 3, 4].into()).is_none());
    }
}
