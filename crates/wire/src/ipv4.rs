//! IPv4 header as RoCEv2 carries it: 20 bytes, no options, never fragmented, protocol UDP.

use core::net::Ipv4Addr;

use crate::bytes::{check_len, set_u16, u16_at};
use crate::error::{HeaderKind, WireError};

/// Length of an IPv4 header without options, the only kind RoCEv2 uses.
pub const IPV4_HEADER_LEN: usize = 20;
/// IP protocol number of UDP.
pub const IP_PROTO_UDP: u8 = 17;

mod field {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const TOTAL_LEN: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: core::ops::Range<usize> = 12..16;
    pub const DST: core::ops::Range<usize> = 16..20;
}

/// Offset just past the identification field: how the ICRC locates the bytes that follow it
/// ([`crate::icrc::ipv4_ident_for_icrc`]).
pub(crate) const IDENT_END: usize = field::IDENT + 2;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const FRAG_OFFSET: u16 = 0x1fff;

/// A zero-copy view of an IPv4 header at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Ipv4<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv4<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 20 bytes.
    #[inline]
    pub const fn new_unchecked(buf: T) -> Ipv4<T> {
        Ipv4 { buf }
    }

    /// Wrap a buffer that holds at least the 20-byte fixed header.
    #[inline]
    pub fn new_checked(buf: T) -> Result<Ipv4<T>, WireError> {
        check_len(buf.as_ref().len(), IPV4_HEADER_LEN, HeaderKind::Ipv4)?;
        Ok(Ipv4 { buf })
    }

    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// Version nibble (4 for IPv4).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buf.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in 32-bit words.
    #[inline]
    pub fn ihl(&self) -> u8 {
        self.buf.as_ref()[field::VER_IHL] & 0x0f
    }

    /// Header length in bytes.
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.ihl()) * 4
    }

    /// Type of service byte (DSCP and ECN).
    #[inline]
    pub fn tos(&self) -> u8 {
        self.buf.as_ref()[field::TOS]
    }

    /// DSCP, the top six bits of TOS.
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.tos() >> 2
    }

    /// ECN, the low two bits of TOS.
    #[inline]
    pub fn ecn(&self) -> u8 {
        self.tos() & 3
    }

    /// Total length of the IP packet in bytes.
    #[inline]
    pub fn total_len(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::TOTAL_LEN)
    }

    /// Identification field.
    #[inline]
    pub fn ident(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::IDENT)
    }

    /// Don't Fragment flag.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        u16_at(self.buf.as_ref(), field::FLAGS_FRAG) & FLAG_DF != 0
    }

    /// More Fragments flag.
    #[inline]
    pub fn more_frags(&self) -> bool {
        u16_at(self.buf.as_ref(), field::FLAGS_FRAG) & FLAG_MF != 0
    }

    /// Fragment offset in 8-byte units.
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::FLAGS_FRAG) & FRAG_OFFSET
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buf.as_ref()[field::TTL]
    }

    /// Protocol of the payload (17 for UDP).
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buf.as_ref()[field::PROTOCOL]
    }

    /// Header checksum as stored.
    #[inline]
    pub fn checksum(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::CHECKSUM)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        let b = &self.buf.as_ref()[field::SRC];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let b = &self.buf.as_ref()[field::DST];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    /// True when the header checksum verifies (over the 20-byte header).
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum(&self.buf.as_ref()[..IPV4_HEADER_LEN]) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4<T> {
    #[inline]
    fn b(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }

    /// Set version 4 and IHL 5 (20 bytes, no options).
    #[inline]
    pub fn set_version_ihl(&mut self) {
        self.b()[field::VER_IHL] = 0x45;
    }

    /// Set the type of service byte.
    #[inline]
    pub fn set_tos(&mut self, v: u8) {
        self.b()[field::TOS] = v;
    }

    /// Set the total length.
    #[inline]
    pub fn set_total_len(&mut self, v: u16) {
        set_u16(self.b(), field::TOTAL_LEN, v);
    }

    /// Set the identification.
    #[inline]
    pub fn set_ident(&mut self, v: u16) {
        set_u16(self.b(), field::IDENT, v);
    }

    /// Set flags and fragment offset: DF as given, MF clear, offset 0.
    #[inline]
    pub fn set_dont_frag(&mut self, df: bool) {
        set_u16(self.b(), field::FLAGS_FRAG, if df { FLAG_DF } else { 0 });
    }

    /// Set the time to live.
    #[inline]
    pub fn set_ttl(&mut self, v: u8) {
        self.b()[field::TTL] = v;
    }

    /// Set the protocol.
    #[inline]
    pub fn set_protocol(&mut self, v: u8) {
        self.b()[field::PROTOCOL] = v;
    }

    /// Set the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.b()[field::SRC].copy_from_slice(&a.octets());
    }

    /// Set the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.b()[field::DST].copy_from_slice(&a.octets());
    }

    /// Compute and store the header checksum.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.clear_checksum();
        let c = checksum(&self.buf.as_ref()[..IPV4_HEADER_LEN]);
        set_u16(self.b(), field::CHECKSUM, c);
    }

    /// Zero the header checksum field.
    #[inline]
    pub fn clear_checksum(&mut self) {
        set_u16(self.b(), field::CHECKSUM, 0);
    }
}

/// The internet checksum (RFC 1071) of `data`: 0 when a header with its checksum verifies.
/// Sums 32-bit big-endian words (2^16 is 1 in one's complement arithmetic, so their sum
/// folds to the sum of the 16-bit words): five additions for an IPv4 header.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let (words, mut rest) = data.as_chunks::<4>();
    for w in words {
        sum += u64::from(u32::from_be_bytes(*w));
    }
    if let [a, b, tail @ ..] = rest {
        sum += u64::from(u16::from_be_bytes([*a, *b]));
        rest = tail;
    }
    if let [last] = rest {
        sum += u64::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The fields of a RoCEv2 IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Type of service (DSCP << 2 | ECN); masked out of the ICRC.
    pub tos: u8,
    /// Identification; covered by the ICRC.
    pub ident: u16,
    /// Don't Fragment flag; covered by the ICRC.
    pub dont_frag: bool,
    /// Time to live; masked out of the ICRC.
    pub ttl: u8,
    /// Bytes after the IPv4 header (UDP header onwards).
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Header length in bytes.
    pub const LEN: usize = IPV4_HEADER_LEN;
    /// Largest `payload_len` the 16-bit total length can describe.
    pub const MAX_PAYLOAD: usize = 0xffff - IPV4_HEADER_LEN;

    /// Parse and validate a RoCEv2 IPv4 header: version 4, no options, valid checksum, not a
    /// fragment, UDP inside, total length within the buffer. Bytes after the total length
    /// (link-layer padding) are allowed and ignored.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Ipv4<&T>) -> Result<Ipv4Repr, WireError> {
        Self::parse_with(p, true)
    }

    /// [`Ipv4Repr::parse`], with the header checksum checked or not (an internal segment,
    /// built in this process and never on a wire, has none: see
    /// [`crate::packet::PacketLayout::finish_internal`]).
    #[inline]
    pub fn parse_with<T: AsRef<[u8]> + ?Sized>(
        p: &Ipv4<&T>,
        verify_checksum: bool,
    ) -> Result<Ipv4Repr, WireError> {
        if p.version() != 4 {
            return Err(WireError::BadIpVersion {
                version: p.version(),
            });
        }
        if p.ihl() != 5 {
            return Err(WireError::Ipv4Options { ihl: p.ihl() });
        }
        if verify_checksum && !p.verify_checksum() {
            return Err(WireError::BadIpChecksum);
        }
        if p.more_frags() || p.frag_offset() != 0 {
            return Err(WireError::Ipv4Fragmented);
        }
        let total = usize::from(p.total_len());
        let have = p.buf.as_ref().len();
        if total < IPV4_HEADER_LEN || total > have {
            return Err(WireError::LengthMismatch {
                header: HeaderKind::Ipv4,
                claimed: total,
                actual: have,
            });
        }
        if p.protocol() != IP_PROTO_UDP {
            return Err(WireError::NotUdp {
                protocol: p.protocol(),
            });
        }
        Ok(Ipv4Repr {
            src: p.src_addr(),
            dst: p.dst_addr(),
            tos: p.tos(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            ttl: p.ttl(),
            payload_len: total - IPV4_HEADER_LEN,
        })
    }

    /// Bytes of header this Repr emits.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        IPV4_HEADER_LEN
    }

    /// Write the header (protocol UDP, no options, checksum filled). `payload_len` must be at
    /// most [`Ipv4Repr::MAX_PAYLOAD`] (the packet emitter checks this; larger values are
    /// clamped here rather than wrapped).
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Ipv4<&mut T>) {
        self.emit_unchecksummed(p);
        p.fill_checksum();
    }

    /// [`Ipv4Repr::emit`] without the checksum (left 0): for a packet whose checksum is
    /// filled once it is finished ([`crate::packet::PacketLayout::finish`]), or that never
    /// needs one.
    #[inline]
    pub fn emit_unchecksummed<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Ipv4<&mut T>) {
        p.set_version_ihl();
        p.set_tos(self.tos);
        let total = self.payload_len.min(Self::MAX_PAYLOAD) + IPV4_HEADER_LEN;
        p.set_total_len(total as u16);
        p.set_ident(self.ident);
        p.set_dont_frag(self.dont_frag);
        p.set_ttl(self.ttl);
        p.set_protocol(IP_PROTO_UDP);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.clear_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 1071 as written: the one's complement sum of 16-bit words.
    fn checksum_by_halfwords(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in data.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    proptest::proptest! {
        #[test]
        fn the_word_sum_checksum_is_rfc_1071s(data in proptest::collection::vec(
            proptest::prelude::any::<u8>(), 0..64)) {
            proptest::prop_assert_eq!(checksum(&data), checksum_by_halfwords(&data));
        }
    }

    #[test]
    fn the_word_sum_checksum_folds_every_carry() {
        for len in 0..64 {
            for fill in [0xff, 0x80, 0x00] {
                let data = vec![fill; len];
                assert_eq!(
                    checksum(&data),
                    checksum_by_halfwords(&data),
                    "{len} x {fill:#x}"
                );
            }
        }
    }

    // An IPv4 header shaped like the ones rxe sends (DF, TTL 64, UDP), checksum zeroed.
    const RXE_HDR: [u8; 20] = [
        0x45, 0x00, 0x04, 0x3c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 50, 0, 11, 10,
        50, 0, 12,
    ];

    fn sample() -> [u8; 64] {
        let mut b = [0u8; 64];
        let r = Ipv4Repr {
            src: Ipv4Addr::new(10, 50, 0, 11),
            dst: Ipv4Addr::new(10, 50, 0, 12),
            tos: 0x02,
            ident: 0x1234,
            dont_frag: true,
            ttl: 64,
            payload_len: 44,
        };
        r.emit(&mut Ipv4::new_unchecked(&mut b[..]));
        b
    }

    #[test]
    fn emit_then_parse() {
        let b = sample();
        let v = Ipv4::new_checked(&b[..]).unwrap();
        assert_eq!(v.total_len(), 64);
        assert!(v.verify_checksum());
        let r = Ipv4Repr::parse(&v).unwrap();
        assert_eq!(r.ident, 0x1234);
        assert!(r.dont_frag);
        assert_eq!(r.payload_len, 44);
        assert_eq!(v.dscp(), 0);
        assert_eq!(v.ecn(), 2);
    }

    #[test]
    fn checksum_matches_known_header() {
        let mut h = RXE_HDR;
        let mut v = Ipv4::new_unchecked(&mut h[..]);
        v.fill_checksum();
        assert!(v.verify_checksum());
        assert_eq!(checksum(&h), 0);
    }

    #[test]
    fn rejects_each_malformation() {
        let good = sample();
        assert_eq!(
            Ipv4::new_checked(&good[..19]).unwrap_err(),
            WireError::Truncated {
                header: HeaderKind::Ipv4,
                needed: 20,
                available: 19
            }
        );
        let parse = |b: &[u8]| Ipv4Repr::parse(&Ipv4::new_checked(b).unwrap());
        let mut b = good;
        b[0] = 0x65;
        assert_eq!(parse(&b), Err(WireError::BadIpVersion { version: 6 }));
        let mut b = good;
        b[0] = 0x46;
        assert_eq!(parse(&b), Err(WireError::Ipv4Options { ihl: 6 }));
        let mut b = good;
        b[12] ^= 1;
        assert_eq!(parse(&b), Err(WireError::BadIpChecksum));
        let mut b = good;
        b[6] |= 0x20;
        Ipv4::new_unchecked(&mut b[..]).fill_checksum();
        assert_eq!(parse(&b), Err(WireError::Ipv4Fragmented));
        let mut b = good;
        b[9] = 6;
        Ipv4::new_unchecked(&mut b[..]).fill_checksum();
        assert_eq!(parse(&b), Err(WireError::NotUdp { protocol: 6 }));
        let mut b = good;
        b[3] = 65;
        Ipv4::new_unchecked(&mut b[..]).fill_checksum();
        assert_eq!(
            parse(&b),
            Err(WireError::LengthMismatch {
                header: HeaderKind::Ipv4,
                claimed: 65,
                actual: 64
            })
        );
        // link-layer padding after total length is fine
        assert_eq!(parse(&good).unwrap().payload_len, 44);
        let mut longer = [0u8; 70];
        longer[..64].copy_from_slice(&good);
        assert_eq!(parse(&longer).unwrap().payload_len, 44);
    }
}
