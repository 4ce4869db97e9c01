//! UDP header. RoCEv2 uses destination port 4791 and sends a zero checksum (the ICRC
//! protects the packet instead).

use crate::bytes::{check_len, set_u16, u16_at};
use crate::error::{HeaderKind, WireError};

/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;
/// The IANA port of RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
}

/// A zero-copy view of a UDP header at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Udp<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Udp<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 8 bytes.
    pub const fn new_unchecked(buf: T) -> Udp<T> {
        Udp { buf }
    }

    /// Wrap a buffer that holds at least the 8-byte header.
    pub fn new_checked(buf: T) -> Result<Udp<T>, WireError> {
        check_len(buf.as_ref().len(), UDP_HEADER_LEN, HeaderKind::Udp)?;
        Ok(Udp { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// Source port.
    pub fn src_port(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::SRC_PORT)
    }

    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::DST_PORT)
    }

    /// Length of header plus payload.
    pub fn length(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::LENGTH)
    }

    /// Checksum as stored (0 = none).
    pub fn checksum(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::CHECKSUM)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Udp<T> {
    /// Set the source port.
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), field::SRC_PORT, v);
    }

    /// Set the destination port.
    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), field::DST_PORT, v);
    }

    /// Set the length.
    pub fn set_length(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), field::LENGTH, v);
    }

    /// Set the checksum.
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), field::CHECKSUM, v);
    }
}

/// The fields of a UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port (RoCEv2 senders derive it from the QPN for ECMP entropy).
    pub src_port: u16,
    /// Destination port (4791 for RoCEv2).
    pub dst_port: u16,
    /// Length of header plus payload, as on the wire.
    pub length: u16,
    /// Checksum as on the wire (RoCEv2 sends 0; masked out of the ICRC).
    pub checksum: u16,
}

impl UdpRepr {
    /// Header length in bytes.
    pub const LEN: usize = UDP_HEADER_LEN;

    /// Parse a UDP header whose length must be at least 8 and fit the buffer. The port is not
    /// checked here (the packet parser checks 4791).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Udp<&T>) -> Result<UdpRepr, WireError> {
        let claimed = usize::from(p.length());
        let actual = p.buf.as_ref().len();
        if claimed < UDP_HEADER_LEN || claimed > actual {
            return Err(WireError::LengthMismatch {
                header: HeaderKind::Udp,
                claimed,
                actual,
            });
        }
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            length: p.length(),
            checksum: p.checksum(),
        })
    }

    /// Bytes of header this Repr emits.
    pub const fn buffer_len(&self) -> usize {
        UDP_HEADER_LEN
    }

    /// Bytes of UDP payload the length field describes.
    pub const fn payload_len(&self) -> usize {
        (self.length as usize).saturating_sub(UDP_HEADER_LEN)
    }

    /// Write the four fields as they are.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Udp<&mut T>) {
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_length(self.length);
        p.set_checksum(self.checksum);
    }
}

/// Ones-complement sum of `data` as 16-bit big-endian words (odd tail padded with zero),
/// not yet folded: add several with `+` and fold with [`fold_checksum`].
#[inline]
pub fn checksum_sum(data: &[u8]) -> u64 {
    // Summing 32-bit words into 64 bits and folding later gives the same ones-complement
    // result as 16-bit words (2^16 = 1 mod 0xffff), with a quarter of the additions.
    let mut sum = 0u64;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        sum += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    sum + u64::from(u32::from_be_bytes(tail))
}

/// Fold a [`checksum_sum`] to 16 bits and complement it: the value to store in a header.
#[inline]
pub const fn fold_checksum(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The UDP checksum of `segment` (UDP header with a zero checksum field, then the payload)
/// over IPv6, pseudo-header included (RFC 8200 8.1). A result of 0 is sent as 0xffff.
pub fn checksum_ipv6(src: &core::net::Ipv6Addr, dst: &core::net::Ipv6Addr, segment: &[u8]) -> u16 {
    let sum = checksum_sum(&src.octets())
        + checksum_sum(&dst.octets())
        + segment.len() as u64
        + u64::from(crate::ipv4::IP_PROTO_UDP)
        + checksum_sum(segment);
    match fold_checksum(sum) {
        0 => 0xffff,
        c => c,
    }
}

/// The UDP source port of a UD QP (or a QP not yet connected), derived the way Linux rxe
/// does at QP creation: a 14-bit multiplicative hash (`hash_32`, golden ratio) of the QPN
/// added to 0xC000.
pub const fn src_port_for_qpn(qpn: crate::types::Qpn) -> u16 {
    const GOLDEN_RATIO_32: u32 = 0x61c8_8647;
    let h = qpn.value().wrapping_mul(GOLDEN_RATIO_32) >> (32 - 14);
    0xc000 + (h & 0x3fff) as u16
}

/// The 20-bit flow label Linux derives for a connected QP pair when the path has none
/// (`rdma_calc_flow_label`): the product of the QPNs folded down.
pub const fn flow_label_for_qpns(local: crate::types::Qpn, remote: crate::types::Qpn) -> u32 {
    let mut v = local.value() as u64 * remote.value() as u64;
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0x000f_ffff) as u32
}

/// The UDP source port for a flow label (`rdma_flow_label_to_udp_sport`): 14 bits of entropy
/// in the range 0xC000..=0xFFFF.
pub const fn src_port_for_flow_label(flow_label: u32) -> u16 {
    let fl = flow_label & 0x000f_ffff;
    (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000) as u16
}

/// The UDP source port of a connected (RC/UC) QP, as Linux rxe sets it when the QP learns its
/// destination QPN: from the flow label of the QPN pair. Every packet of the QP then takes
/// the same ECMP path, and different QP pairs spread out.
pub const fn src_port_for_connection(local: crate::types::Qpn, remote: crate::types::Qpn) -> u16 {
    src_port_for_flow_label(flow_label_for_qpns(local, remote))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = UdpRepr {
            src_port: 0xc011,
            dst_port: ROCEV2_UDP_PORT,
            length: 20,
            checksum: 0,
        };
        let mut b = [0u8; 20];
        r.emit(&mut Udp::new_unchecked(&mut b[..]));
        assert_eq!(&b[..8], &[0xc0, 0x11, 0x12, 0xb7, 0, 20, 0, 0]);
        let v = Udp::new_checked(&b[..]).unwrap();
        assert_eq!(UdpRepr::parse(&v), Ok(r));
        assert_eq!(r.payload_len(), 12);
    }

    #[test]
    fn ipv6_checksum_verifies() {
        let src: core::net::Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: core::net::Ipv6Addr = "fe80::2".parse().unwrap();
        for len in [8usize, 9, 10, 11, 12, 13, 100] {
            let mut seg: Vec<u8> = (0..len).map(|i| (i * 37 + 1) as u8).collect();
            seg[6] = 0;
            seg[7] = 0;
            let c = checksum_ipv6(&src, &dst, &seg);
            seg[6..8].copy_from_slice(&c.to_be_bytes());
            // With the checksum in place the complement of the sum is zero (or all ones).
            let sum = checksum_sum(&src.octets())
                + checksum_sum(&dst.octets())
                + len as u64
                + 17
                + checksum_sum(&seg);
            assert!(matches!(fold_checksum(sum), 0 | 0xffff), "len {len}");
            // 16-bit reference
            let mut s16: u32 = 0;
            for c in seg.chunks(2) {
                s16 += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
            for a in [src.octets(), dst.octets()] {
                for c in a.chunks(2) {
                    s16 += u32::from(u16::from_be_bytes([c[0], c[1]]));
                }
            }
            s16 += len as u32 + 17;
            while s16 > 0xffff {
                s16 = (s16 & 0xffff) + (s16 >> 16);
            }
            assert_eq!(s16, 0xffff);
        }
    }

    #[test]
    fn source_ports_like_rxe() {
        use crate::types::Qpn;
        // QP 0x11 talking to QP 0x11: flow label 0x121, port 0xc121 (seen in rxe captures).
        assert_eq!(flow_label_for_qpns(Qpn::new(0x11), Qpn::new(0x11)), 0x121);
        assert_eq!(
            src_port_for_connection(Qpn::new(0x11), Qpn::new(0x11)),
            49441
        );
        for q in [0u32, 1, 0x11, 0xff_ffff] {
            assert!(src_port_for_qpn(Qpn::new(q)) >= 0xc000);
        }
    }

    #[test]
    fn length_errors() {
        assert_eq!(
            Udp::new_checked(&[0u8; 7][..]).unwrap_err(),
            WireError::Truncated {
                header: HeaderKind::Udp,
                needed: 8,
                available: 7
            }
        );
        let mut b = [0u8; 16];
        Udp::new_unchecked(&mut b[..]).set_length(17);
        assert_eq!(
            UdpRepr::parse(&Udp::new_checked(&b[..]).unwrap()),
            Err(WireError::LengthMismatch {
                header: HeaderKind::Udp,
                claimed: 17,
                actual: 16
            })
        );
        Udp::new_unchecked(&mut b[..]).set_length(7);
        assert!(UdpRepr::parse(&Udp::new_checked(&b[..]).unwrap()).is_err());
    }
}
