//! IPv6 header as RoCEv2 carries it: 40 bytes, next header UDP (no extension headers).

use core::net::Ipv6Addr;

use crate::bytes::{check_len, set_u16, u16_at, u32_at};
use crate::error::{HeaderKind, WireError};
use crate::ipv4::IP_PROTO_UDP;

/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;

mod field {
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: core::ops::Range<usize> = 8..24;
    pub const DST: core::ops::Range<usize> = 24..40;
}

/// A zero-copy view of an IPv6 header at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Ipv6<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv6<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 40 bytes.
    pub const fn new_unchecked(buf: T) -> Ipv6<T> {
        Ipv6 { buf }
    }

    /// Wrap a buffer that holds at least the 40-byte header.
    pub fn new_checked(buf: T) -> Result<Ipv6<T>, WireError> {
        check_len(buf.as_ref().len(), IPV6_HEADER_LEN, HeaderKind::Ipv6)?;
        Ok(Ipv6 { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    fn word0(&self) -> u32 {
        u32_at(self.buf.as_ref(), field::VER_TC_FLOW)
    }

    /// Version nibble (6).
    pub fn version(&self) -> u8 {
        (self.word0() >> 28) as u8
    }

    /// Traffic class (DSCP and ECN).
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }

    /// 20-bit flow label.
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }

    /// Payload length (bytes after the 40-byte header).
    pub fn payload_len(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::PAYLOAD_LEN)
    }

    /// Next header (17 for UDP).
    pub fn next_header(&self) -> u8 {
        self.buf.as_ref()[field::NEXT_HEADER]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buf.as_ref()[field::HOP_LIMIT]
    }

    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf.as_ref()[field::SRC]);
        Ipv6Addr::from(a)
    }

    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.buf.as_ref()[field::DST]);
        Ipv6Addr::from(a)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6<T> {
    /// Set version 6, the traffic class and the flow label (masked to 20 bits).
    pub fn set_version_tc_flow(&mut self, tc: u8, flow: u32) {
        let w = (6u32 << 28) | (u32::from(tc) << 20) | (flow & 0x000f_ffff);
        self.buf.as_mut()[..4].copy_from_slice(&w.to_be_bytes());
    }

    /// Set the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), field::PAYLOAD_LEN, v);
    }

    /// Set the next header.
    pub fn set_next_header(&mut self, v: u8) {
        self.buf.as_mut()[field::NEXT_HEADER] = v;
    }

    /// Set the hop limit.
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buf.as_mut()[field::HOP_LIMIT] = v;
    }

    /// Set the source address.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buf.as_mut()[field::SRC].copy_from_slice(&a.octets());
    }

    /// Set the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buf.as_mut()[field::DST].copy_from_slice(&a.octets());
    }
}

/// The fields of a RoCEv2 IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Traffic class; masked out of the ICRC.
    pub traffic_class: u8,
    /// Flow label (20 bits); masked out of the ICRC.
    pub flow_label: u32,
    /// Hop limit; masked out of the ICRC.
    pub hop_limit: u8,
    /// Bytes after the IPv6 header (UDP header onwards).
    pub payload_len: usize,
}

impl Ipv6Repr {
    /// Header length in bytes.
    pub const LEN: usize = IPV6_HEADER_LEN;
    /// Largest `payload_len` the 16-bit payload length can describe.
    pub const MAX_PAYLOAD: usize = 0xffff;

    /// Parse and validate: version 6, UDP directly after the fixed header, payload length
    /// within the buffer (trailing link-layer padding is ignored).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Ipv6<&T>) -> Result<Ipv6Repr, WireError> {
        if p.version() != 6 {
            return Err(WireError::BadIpVersion {
                version: p.version(),
            });
        }
        if p.next_header() != IP_PROTO_UDP {
            return Err(WireError::NotUdp {
                protocol: p.next_header(),
            });
        }
        let claimed = usize::from(p.payload_len());
        let actual = p.buf.as_ref().len() - IPV6_HEADER_LEN;
        if claimed > actual {
            return Err(WireError::LengthMismatch {
                header: HeaderKind::Ipv6,
                claimed,
                actual,
            });
        }
        Ok(Ipv6Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            hop_limit: p.hop_limit(),
            payload_len: claimed,
        })
    }

    /// Bytes of header this Repr emits.
    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN
    }

    /// Write the header (next header UDP). `payload_len` is clamped to 65535.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Ipv6<&mut T>) {
        p.set_version_tc_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(self.payload_len.min(Self::MAX_PAYLOAD) as u16);
        p.set_next_header(IP_PROTO_UDP);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr() -> Ipv6Repr {
        Ipv6Repr {
            src: "fe80::1".parse().unwrap(),
            dst: "2001:db8::42".parse().unwrap(),
            traffic_class: 0xa5,
            flow_label: 0xb_cdef,
            hop_limit: 64,
            payload_len: 24,
        }
    }

    #[test]
    fn emit_then_parse() {
        let mut b = [0u8; 64];
        repr().emit(&mut Ipv6::new_unchecked(&mut b[..]));
        assert_eq!(&b[..8], &[0x6a, 0x5b, 0xcd, 0xef, 0, 24, 17, 64]);
        let v = Ipv6::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv6Repr::parse(&v).unwrap(), repr());
    }

    #[test]
    fn rejects_each_malformation() {
        let mut good = [0u8; 64];
        repr().emit(&mut Ipv6::new_unchecked(&mut good[..]));
        assert_eq!(
            Ipv6::new_checked(&good[..39]).unwrap_err(),
            WireError::Truncated {
                header: HeaderKind::Ipv6,
                needed: 40,
                available: 39
            }
        );
        let parse = |b: &[u8]| Ipv6Repr::parse(&Ipv6::new_checked(b).unwrap());
        let mut b = good;
        b[0] = 0x4a;
        assert_eq!(parse(&b), Err(WireError::BadIpVersion { version: 4 }));
        let mut b = good;
        b[6] = 0; // hop-by-hop options header
        assert_eq!(parse(&b), Err(WireError::NotUdp { protocol: 0 }));
        // trailing link-layer padding is ignored
        let mut padded = [0u8; 70];
        padded[..64].copy_from_slice(&good);
        assert_eq!(parse(&padded), Ok(repr()));
        assert_eq!(
            parse(&good[..60]),
            Err(WireError::LengthMismatch {
                header: HeaderKind::Ipv6,
                claimed: 24,
                actual: 20
            })
        );
    }
}
