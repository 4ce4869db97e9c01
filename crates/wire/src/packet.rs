//! Whole RoCEv2 packets: IP / UDP / BTH / extension headers / payload / pad / ICRC.
//!
//! [`RoceV2Packet::parse`] validates untrusted bytes completely and reports the ICRC result;
//! [`RoceV2Packet::parse_checked`] also rejects a bad ICRC, as a NIC does on ingress;
//! [`RoceV2Packet::parse_checked_recovering_ipv4_ident`] does too, for a receiver that cannot
//! see the sender's IPv4 identification.
//! [`emit_packet`] builds a packet in one call; [`PacketLayout`] does it in two steps so the
//! caller can write the payload straight into the output buffer (zero copy).

use core::net::IpAddr;
use core::ops::Range;

use crate::aeth::{Aeth, AethRepr, AETH_LEN};
use crate::atomic::{
    AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN,
};
use crate::bth::{Bth, BthRepr, BTH_LEN};
use crate::deth::{Deth, DethRepr, DETH_LEN};
use crate::error::{HeaderKind, WireError};
use crate::icrc::{self, ICRC_LEN};
use crate::ieth::{Ieth, IETH_LEN};
use crate::immdt::{ImmDt, IMMDT_LEN};
use crate::ipv4::{Ipv4, Ipv4Repr, IPV4_HEADER_LEN};
use crate::ipv6::{Ipv6, Ipv6Repr, IPV6_HEADER_LEN};
use crate::opcode::{ExtHeaders, Opcode, CNP_RESERVED_LEN};
use crate::reth::{Reth, RethRepr, RETH_LEN};
use crate::types::Psn;
use crate::types::Rkey;
use crate::udp::{Udp, UdpRepr, ROCEV2_UDP_PORT, UDP_HEADER_LEN};

/// The IP header of a RoCEv2 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4 (20 bytes, no options).
    V4(Ipv4Repr),
    /// IPv6 (40 bytes, UDP next).
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Bytes of IP header (20 or 40).
    #[inline]
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => IPV4_HEADER_LEN,
            IpRepr::V6(_) => IPV6_HEADER_LEN,
        }
    }

    /// Bytes after the IP header.
    #[inline]
    pub const fn payload_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.payload_len,
            IpRepr::V6(r) => r.payload_len,
        }
    }

    /// The same header with another payload length.
    #[inline]
    pub const fn with_payload_len(&self, payload_len: usize) -> IpRepr {
        match *self {
            IpRepr::V4(r) => IpRepr::V4(Ipv4Repr { payload_len, ..r }),
            IpRepr::V6(r) => IpRepr::V6(Ipv6Repr { payload_len, ..r }),
        }
    }

    /// Largest payload (UDP header onwards) the IP length field can describe.
    #[inline]
    pub const fn max_payload_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => Ipv4Repr::MAX_PAYLOAD,
            IpRepr::V6(_) => Ipv6Repr::MAX_PAYLOAD,
        }
    }

    /// Source address.
    #[inline]
    pub fn src(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => IpAddr::V4(r.src),
            IpRepr::V6(r) => IpAddr::V6(r.src),
        }
    }

    /// Destination address.
    #[inline]
    pub fn dst(&self) -> IpAddr {
        match self {
            IpRepr::V4(r) => IpAddr::V4(r.dst),
            IpRepr::V6(r) => IpAddr::V6(r.dst),
        }
    }

    /// Parse and validate the IP header at the start of `bytes` (see [`Ipv4Repr::parse`],
    /// [`Ipv6Repr::parse`]).
    #[inline]
    pub fn parse(bytes: &[u8]) -> Result<IpRepr, WireError> {
        Self::parse_with(bytes, true)
    }

    /// [`IpRepr::parse`], with an IPv4 header checksum checked or not (see
    /// [`Ipv4Repr::parse_with`]).
    #[inline]
    pub fn parse_with(bytes: &[u8], verify_checksum: bool) -> Result<IpRepr, WireError> {
        let Some(&b0) = bytes.first() else {
            return Err(WireError::Truncated {
                header: HeaderKind::Ipv4,
                needed: IPV4_HEADER_LEN,
                available: 0,
            });
        };
        match b0 >> 4 {
            4 => Ok(IpRepr::V4(Ipv4Repr::parse_with(
                &Ipv4::new_checked(bytes)?,
                verify_checksum,
            )?)),
            6 => Ok(IpRepr::V6(Ipv6Repr::parse(&Ipv6::new_checked(bytes)?)?)),
            v => Err(WireError::BadIpVersion { version: v }),
        }
    }

    /// Write the header at the start of `buf` (at least [`IpRepr::header_len`] bytes).
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        self.emit_with(buf, true)
    }

    /// [`IpRepr::emit`], with an IPv4 header checksum filled or left 0.
    #[inline]
    fn emit_with(&self, buf: &mut [u8], checksum: bool) -> Result<(), WireError> {
        let need = self.header_len();
        let Some(b) = buf.get_mut(..need) else {
            return Err(WireError::BufferTooSmall {
                needed: need,
                available: buf.len(),
            });
        };
        match self {
            IpRepr::V4(r) if checksum => r.emit(&mut Ipv4::new_unchecked(b)),
            IpRepr::V4(r) => r.emit_unchecksummed(&mut Ipv4::new_unchecked(b)),
            IpRepr::V6(r) => r.emit(&mut Ipv6::new_unchecked(b)),
        }
        Ok(())
    }
}

/// The transport headers of a packet: the BTH and the extension headers its opcode carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// RETH (RDMA WRITE FIRST/ONLY, READ REQUEST).
    pub reth: Option<RethRepr>,
    /// AETH (ACKNOWLEDGE, READ RESPONSE FIRST/LAST/ONLY, ATOMIC ACKNOWLEDGE).
    pub aeth: Option<AethRepr>,
    /// DETH (UD).
    pub deth: Option<DethRepr>,
    /// Immediate data (… with Immediate).
    pub immdt: Option<u32>,
    /// R_Key to invalidate (SEND … with Invalidate).
    pub ieth: Option<Rkey>,
    /// AtomicETH (COMPARE SWAP, FETCH ADD).
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AtomicAckETH (ATOMIC ACKNOWLEDGE).
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
}

impl TransportRepr {
    /// A transport header with this BTH and no extension header (fill those in to match the
    /// opcode).
    #[inline]
    pub const fn new(bth: BthRepr) -> TransportRepr {
        TransportRepr {
            bth,
            reth: None,
            aeth: None,
            deth: None,
            immdt: None,
            ieth: None,
            atomic_eth: None,
            atomic_ack_eth: None,
        }
    }

    /// Which extension headers are present.
    #[inline]
    pub const fn ext_present(&self) -> ExtHeaders {
        ExtHeaders {
            reth: self.reth.is_some(),
            aeth: self.aeth.is_some(),
            deth: self.deth.is_some(),
            immdt: self.immdt.is_some(),
            ieth: self.ieth.is_some(),
            atomic_eth: self.atomic_eth.is_some(),
            atomic_ack_eth: self.atomic_ack_eth.is_some(),
        }
    }

    /// Ok when exactly the extension headers of the opcode are present.
    #[inline]
    pub fn check(&self) -> Result<(), WireError> {
        let want = self.bth.opcode.ext();
        let have = self.ext_present();
        if want == have {
            Ok(())
        } else {
            Err(WireError::ExtHeaderMismatch {
                opcode: self.bth.opcode,
            })
        }
    }

    /// Bytes of BTH plus extension headers (plus the 16 reserved bytes of a CNP).
    #[inline]
    pub const fn header_len(&self) -> usize {
        self.bth.opcode.header_len()
    }

    /// Parse the BTH and the extension headers its opcode calls for from the start of
    /// `buf` (the UDP payload). The headers' total length is [`TransportRepr::header_len`].
    #[inline]
    pub fn parse(buf: &[u8]) -> Result<TransportRepr, WireError> {
        let bth = BthRepr::parse(&Bth::new_checked(buf)?)?;
        let ext = bth.opcode.ext();
        let mut t = TransportRepr::new(bth);
        let mut at = BTH_LEN;
        // IBA 9.2 order: DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
        if ext.deth {
            t.deth = Some(DethRepr::parse(&Deth::new_checked(rest(buf, at))?)?);
            at += DETH_LEN;
        }
        if ext.reth {
            t.reth = Some(RethRepr::parse(&Reth::new_checked(rest(buf, at))?)?);
            at += RETH_LEN;
        }
        if ext.atomic_eth {
            t.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEth::new_checked(rest(
                buf, at,
            ))?)?);
            at += ATOMIC_ETH_LEN;
        }
        if ext.aeth {
            t.aeth = Some(AethRepr::parse(&Aeth::new_checked(rest(buf, at))?)?);
            at += AETH_LEN;
        }
        if ext.atomic_ack_eth {
            t.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(rest(
                buf, at,
            ))?)?);
            at += ATOMIC_ACK_ETH_LEN;
        }
        if ext.immdt {
            t.immdt = Some(ImmDt::new_checked(rest(buf, at))?.imm());
            at += IMMDT_LEN;
        }
        if ext.ieth {
            t.ieth = Some(Ieth::new_checked(rest(buf, at))?.rkey());
            at += IETH_LEN;
        }
        if bth.opcode == Opcode::Cnp && buf.len() < at + CNP_RESERVED_LEN {
            return Err(WireError::Truncated {
                header: HeaderKind::CnpReserved,
                needed: CNP_RESERVED_LEN,
                available: buf.len().saturating_sub(at),
            });
        }
        Ok(t)
    }

    /// Write the headers at the start of `buf`; returns their length. The BTH pad count is
    /// written as given (the packet emitters set it). Fails when the extension headers do not
    /// match the opcode or `buf` is too short.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.check()?;
        let len = self.header_len();
        if buf.len() < len {
            return Err(WireError::BufferTooSmall {
                needed: len,
                available: buf.len(),
            });
        }
        let buf = &mut buf[..len];
        self.bth.emit(&mut Bth::new_unchecked(&mut buf[..BTH_LEN]));
        let mut at = BTH_LEN;
        if let Some(d) = &self.deth {
            d.emit(&mut Deth::new_unchecked(&mut buf[at..at + DETH_LEN]));
            at += DETH_LEN;
        }
        if let Some(r) = &self.reth {
            r.emit(&mut Reth::new_unchecked(&mut buf[at..at + RETH_LEN]));
            at += RETH_LEN;
        }
        if let Some(a) = &self.atomic_eth {
            a.emit(&mut AtomicEth::new_unchecked(
                &mut buf[at..at + ATOMIC_ETH_LEN],
            ));
            at += ATOMIC_ETH_LEN;
        }
        if let Some(a) = &self.aeth {
            a.emit(&mut Aeth::new_unchecked(&mut buf[at..at + AETH_LEN]));
            at += AETH_LEN;
        }
        if let Some(a) = &self.atomic_ack_eth {
            a.emit(&mut AtomicAckEth::new_unchecked(
                &mut buf[at..at + ATOMIC_ACK_ETH_LEN],
            ));
            at += ATOMIC_ACK_ETH_LEN;
        }
        if let Some(i) = self.immdt {
            ImmDt::new_unchecked(&mut buf[at..at + IMMDT_LEN]).set_imm(i);
            at += IMMDT_LEN;
        }
        if let Some(k) = self.ieth {
            Ieth::new_unchecked(&mut buf[at..at + IETH_LEN]).set_rkey(k);
            at += IETH_LEN;
        }
        // CNP: 16 reserved bytes, sent as zero.
        buf[at..].fill(0);
        Ok(len)
    }
}

/// `buf[at..]`, or empty when `at` is past the end (the view's length check then reports
/// the truncation).
#[inline]
fn rest(buf: &[u8], at: usize) -> &[u8] {
    buf.get(at..).unwrap_or(&[])
}

/// The transport part of a RoCEv2 packet (the UDP payload: BTH … ICRC), parsed and
/// structurally validated. Used where the IP and UDP headers are not at hand (a UDP socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportPacket<'a> {
    /// BTH and extension headers.
    pub transport: TransportRepr,
    /// Payload bytes without the pad.
    pub payload: &'a [u8],
    /// The ICRC as read from the last 4 bytes (not verified: see
    /// [`icrc::compute_with_headers`]).
    pub icrc: u32,
}

impl<'a> TransportPacket<'a> {
    /// Parse a UDP payload: headers by opcode, pad count within the payload, payload plus pad
    /// a multiple of 4, no payload on opcodes that carry none, 4 ICRC bytes at the end.
    #[inline]
    pub fn parse(udp_payload: &'a [u8]) -> Result<TransportPacket<'a>, WireError> {
        let transport = TransportRepr::parse(udp_payload)?;
        let hdr = transport.header_len();
        let Some(body_len) = udp_payload.len().checked_sub(hdr + ICRC_LEN) else {
            return Err(WireError::Truncated {
                header: HeaderKind::Icrc,
                needed: ICRC_LEN,
                available: udp_payload.len().saturating_sub(hdr),
            });
        };
        let body = &udp_payload[hdr..hdr + body_len];
        let pad = transport.bth.pad_count;
        if usize::from(pad) > body.len() {
            return Err(WireError::PadTooLarge {
                pad,
                payload: body.len(),
            });
        }
        if body.len() & 3 != 0 {
            return Err(WireError::PayloadNotAligned { len: body.len() });
        }
        let opcode = transport.bth.opcode;
        if !opcode.has_payload() && !body.is_empty() {
            return Err(WireError::UnexpectedPayload {
                opcode,
                len: body.len(),
            });
        }
        let payload = &body[..body.len() - usize::from(pad)];
        let icrc = icrc::read_icrc(&udp_payload[hdr + body_len..]);
        Ok(TransportPacket {
            transport,
            payload,
            icrc,
        })
    }
}

/// A parsed RoCEv2 packet, borrowing its payload from the input bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceV2Packet<'a> {
    /// IP header.
    pub ip: IpRepr,
    /// UDP header.
    pub udp: UdpRepr,
    /// BTH and extension headers.
    pub transport: TransportRepr,
    /// Payload bytes without the pad.
    pub payload: &'a [u8],
    /// The ICRC as read from the packet.
    pub icrc: u32,
    /// Whether the ICRC matches the one computed over the packet.
    pub icrc_ok: bool,
}

impl<'a> RoceV2Packet<'a> {
    /// Parse a whole IP packet (starting at the IP header) with every structural check, and
    /// compute the ICRC. A wrong ICRC is not an error here (`icrc_ok` is false) so that a
    /// decoder can still show the packet. Bytes after the IP length (link-layer padding) are
    /// ignored.
    #[inline]
    pub fn parse(bytes: &'a [u8]) -> Result<RoceV2Packet<'a>, WireError> {
        Self::parse_inner(bytes).map(|(p, _)| p)
    }

    /// [`RoceV2Packet::parse`], and a wrong ICRC is [`WireError::BadIcrc`]: what a NIC uses on
    /// ingress.
    #[inline]
    pub fn parse_checked(bytes: &'a [u8]) -> Result<RoceV2Packet<'a>, WireError> {
        let (p, computed) = Self::parse_inner(bytes)?;
        if p.icrc_ok {
            Ok(p)
        } else {
            Err(WireError::BadIcrc {
                expected: p.icrc,
                computed,
            })
        }
    }

    /// [`RoceV2Packet::parse_checked`] for a receiver that cannot see the IPv4 identification
    /// its sender used (a UDP socket hides the IP header, so `bytes` holds a rebuilt one): an
    /// IPv4 packet whose ICRC fails with the ID in `bytes` is accepted when another ID makes it
    /// hold ([`icrc::ipv4_ident_for_icrc`], from the same CRC pass). Returns the packet, whose
    /// `ip` then carries that ID, and `Some(id)` when the ID was recovered (`None`: the ICRC
    /// held as received). IPv6 has no ID and is checked as [`RoceV2Packet::parse_checked`]
    /// does. The price: a corrupted IPv4 packet passes with probability about 2^-16 instead
    /// of 2^-32, as 16 of the ICRC's 32 bits go to finding the ID.
    #[inline]
    pub fn parse_checked_recovering_ipv4_ident(
        bytes: &'a [u8],
    ) -> Result<(RoceV2Packet<'a>, Option<u16>), WireError> {
        let (mut p, computed) = Self::parse_inner(bytes)?;
        if p.icrc_ok {
            return Ok((p, None));
        }
        if let IpRepr::V4(v4) = &mut p.ip {
            let total = IPV4_HEADER_LEN + v4.payload_len;
            if let Some(id) = icrc::ipv4_ident_for_icrc(v4.ident, total, computed, p.icrc) {
                v4.ident = id;
                p.icrc_ok = true;
                return Ok((p, Some(id)));
            }
        }
        Err(WireError::BadIcrc {
            expected: p.icrc,
            computed,
        })
    }

    /// Parse a packet that never left this host (sealed by [`PacketLayout::finish_internal`]):
    /// every structural check of [`RoceV2Packet::parse`], but no ICRC is computed (`icrc_ok`
    /// is false). Only for packets the caller built itself; anything from a socket goes
    /// through [`RoceV2Packet::parse_checked`].
    #[inline]
    pub fn parse_internal(bytes: &'a [u8]) -> Result<RoceV2Packet<'a>, WireError> {
        Self::parse_inner_with(bytes, false).map(|(p, _)| p)
    }

    #[inline]
    fn parse_inner(bytes: &'a [u8]) -> Result<(RoceV2Packet<'a>, u32), WireError> {
        Self::parse_inner_with(bytes, true)
    }

    // Always inlined: the packet (about 220 bytes) is then built where the caller keeps
    // it, not built here and copied out through each wrapper's `Result`.
    #[inline(always)]
    fn parse_inner_with(
        bytes: &'a [u8],
        compute_icrc: bool,
    ) -> Result<(RoceV2Packet<'a>, u32), WireError> {
        // An internal segment (no ICRC) has no IPv4 header checksum either.
        let ip = IpRepr::parse_with(bytes, compute_icrc)?;
        let ip_len = ip.header_len();
        // The IP parsers checked that the claimed length fits the buffer.
        let end = ip_len + ip.payload_len();
        let pkt = bytes.get(..end).ok_or(WireError::LengthMismatch {
            header: HeaderKind::Ipv4,
            claimed: end,
            actual: bytes.len(),
        })?;
        let udp_bytes = &pkt[ip_len..];
        let udp = UdpRepr::parse(&Udp::new_checked(udp_bytes)?)?;
        if usize::from(udp.length) != udp_bytes.len() {
            return Err(WireError::LengthMismatch {
                header: HeaderKind::Udp,
                claimed: usize::from(udp.length),
                actual: udp_bytes.len(),
            });
        }
        if udp.dst_port != ROCEV2_UDP_PORT {
            return Err(WireError::WrongUdpPort { port: udp.dst_port });
        }
        let t = TransportPacket::parse(&udp_bytes[UDP_HEADER_LEN..])?;
        let computed = if compute_icrc {
            icrc::compute_unchecked(&pkt[..pkt.len() - ICRC_LEN], ip_len)
        } else {
            // Differs from the field whatever it holds, so `icrc_ok` is false.
            !t.icrc
        };
        let packet = RoceV2Packet {
            ip,
            udp,
            transport: t.transport,
            payload: t.payload,
            icrc: t.icrc,
            icrc_ok: t.icrc == computed,
        };
        Ok((packet, computed))
    }

    /// Bytes the packet takes when emitted.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        let pad = pad_for(self.payload.len());
        self.ip.header_len()
            + UDP_HEADER_LEN
            + self.transport.header_len()
            + self.payload.len()
            + pad
            + ICRC_LEN
    }

    /// Emit the packet again (lengths, pad, IPv4 checksum, UDP checksum 0 and ICRC freshly
    /// computed); returns the length.
    #[inline]
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        emit_packet(
            &self.ip,
            self.udp.src_port,
            self.udp.dst_port,
            &self.transport,
            self.payload,
            buf,
        )
    }
}

/// Pad bytes that align `payload_len` to 4.
#[inline]
pub const fn pad_for(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}

/// Where every part of a packet goes, computed once; then written in two steps so that the
/// payload can be produced in place: [`PacketLayout::emit_headers`], fill
/// [`PacketLayout::payload_mut`], [`PacketLayout::finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketLayout {
    ip: IpRepr,
    udp: UdpRepr,
    transport: TransportRepr,
    payload_len: usize,
}

impl PacketLayout {
    /// Lay out a packet. `ip.payload_len`, the UDP length and the BTH pad count are computed
    /// here; the UDP checksum is 0 over IPv4 and computed by [`PacketLayout::finish`] over IPv6. Fails when the extension headers do not match the opcode,
    /// when an opcode without payload is given one, or when the packet would not fit the IP
    /// length field.
    #[inline]
    pub fn new(
        ip: &IpRepr,
        src_port: u16,
        dst_port: u16,
        t: &TransportRepr,
        payload_len: usize,
    ) -> Result<PacketLayout, WireError> {
        t.check()?;
        let opcode = t.bth.opcode;
        if !opcode.has_payload() && payload_len != 0 {
            return Err(WireError::UnexpectedPayload {
                opcode,
                len: payload_len,
            });
        }
        let fixed = UDP_HEADER_LEN + t.header_len() + ICRC_LEN;
        let max = ip.max_payload_len() - fixed;
        // Keep payload + pad within the IP length field.
        let max = max - max % 4;
        if payload_len > max {
            return Err(WireError::PayloadTooLarge {
                len: payload_len,
                max,
            });
        }
        let pad = pad_for(payload_len);
        let udp_len = fixed + payload_len + pad;
        let mut transport = *t;
        transport.bth.pad_count = pad as u8;
        Ok(PacketLayout {
            ip: ip.with_payload_len(udp_len),
            udp: UdpRepr {
                src_port,
                dst_port,
                length: udp_len as u16,
                checksum: 0,
            },
            transport,
            payload_len,
        })
    }

    /// Total bytes of the packet.
    #[inline]
    pub const fn len(&self) -> usize {
        self.ip.header_len() + self.ip.payload_len()
    }

    /// Never true: a packet has at least its headers.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        false
    }

    /// Bytes of IP, UDP and transport headers.
    #[inline]
    pub const fn header_len(&self) -> usize {
        self.ip.header_len() + UDP_HEADER_LEN + self.transport.header_len()
    }

    /// Where the payload goes in the packet.
    #[inline]
    pub const fn payload_range(&self) -> Range<usize> {
        self.header_len()..self.header_len() + self.payload_len
    }

    /// The IP header as it will be written (with its length filled in).
    #[inline]
    pub const fn ip(&self) -> &IpRepr {
        &self.ip
    }

    /// The transport headers as they will be written (with the pad count filled in).
    #[inline]
    pub const fn transport(&self) -> &TransportRepr {
        &self.transport
    }

    #[inline]
    fn check_buf(&self, buf: &[u8]) -> Result<(), WireError> {
        if buf.len() < self.len() {
            Err(WireError::BufferTooSmall {
                needed: self.len(),
                available: buf.len(),
            })
        } else {
            Ok(())
        }
    }

    /// Step 1: write IP, UDP and transport headers into `buf[..header_len()]`. The IPv4
    /// header checksum is left 0 until step 3: [`PacketLayout::finish`] fills it, and a
    /// packet that never leaves the process ([`PacketLayout::finish_internal`]) goes without.
    #[inline]
    pub fn emit_headers(&self, buf: &mut [u8]) -> Result<(), WireError> {
        self.check_buf(buf)?;
        let ip_len = self.ip.header_len();
        self.ip.emit_with(&mut buf[..ip_len], false)?;
        self.udp.emit(&mut Udp::new_unchecked(
            &mut buf[ip_len..ip_len + UDP_HEADER_LEN],
        ));
        self.transport.emit(&mut buf[ip_len + UDP_HEADER_LEN..])?;
        Ok(())
    }

    /// Step 1 for the next packet of a run whose packets share every header byte but the
    /// BTH's PSN and AckReq (the MIDDLE packets of one message, IBA 9.2): copy `headers`, the
    /// [`PacketLayout::header_len`] bytes an earlier [`PacketLayout::emit_headers`] of this
    /// layout wrote, and set those two fields. Copying costs a fraction of laying the headers
    /// out again, which a message's every packet would otherwise pay.
    #[inline]
    pub fn emit_headers_like(
        &self,
        headers: &[u8],
        buf: &mut [u8],
        psn: Psn,
        ack_req: bool,
    ) -> Result<(), WireError> {
        self.check_buf(buf)?;
        let len = self.header_len();
        if headers.len() != len {
            return Err(WireError::LengthMismatch {
                header: HeaderKind::Bth,
                claimed: len,
                actual: headers.len(),
            });
        }
        buf[..len].copy_from_slice(headers);
        let mut bth = Bth::new_checked(&mut buf[self.ip.header_len() + UDP_HEADER_LEN..len])?;
        bth.set_psn(psn);
        bth.set_ack_req(ack_req);
        Ok(())
    }

    /// Step 2: the payload area of `buf`, for the caller to fill.
    #[inline]
    pub fn payload_mut<'b>(&self, buf: &'b mut [u8]) -> Result<&'b mut [u8], WireError> {
        self.check_buf(buf)?;
        Ok(&mut buf[self.payload_range()])
    }

    /// Step 3 for a packet that never leaves this host (one engine hands it to another in
    /// the same process, see [`RoceV2Packet::parse_internal`]): the zero pad and a zero
    /// ICRC field, no checksum computed (neither the ICRC nor the IPv4 header's); returns
    /// the packet length. Such a packet must not be sent: a peer would drop it.
    #[inline]
    pub fn finish_internal(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.check_buf(buf)?;
        let len = self.len();
        buf[self.payload_range().end..len].fill(0);
        Ok(len)
    }

    /// Step 3: write the zero pad, the ICRC over everything before it and (IPv6) the UDP
    /// checksum; returns the packet length. The headers and payload must already be in `buf`.
    #[inline]
    pub fn finish(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        self.check_buf(buf)?;
        let len = self.len();
        let icrc_at = len - ICRC_LEN;
        buf[self.payload_range().end..icrc_at].fill(0);
        let ip_len = self.ip.header_len();
        let icrc = icrc::compute_unchecked(&buf[..icrc_at], ip_len);
        buf[icrc_at..len].copy_from_slice(&icrc::icrc_bytes(icrc));
        // The ICRC masks the IPv4 header checksum, so it is filled after.
        if let IpRepr::V4(_) = &self.ip {
            Ipv4::new_unchecked(&mut buf[..ip_len]).fill_checksum();
        }
        // IPv6 forbids a zero UDP checksum (RFC 8200 8.1; Linux drops such datagrams unless
        // told otherwise), so it is computed there, over everything including the ICRC.
        // IPv4 keeps 0 as rxe sends. The ICRC masks the field either way.
        if let IpRepr::V6(v6) = &self.ip {
            let c = crate::udp::checksum_ipv6(&v6.src, &v6.dst, &buf[ip_len..len]);
            Udp::new_unchecked(&mut buf[ip_len..ip_len + UDP_HEADER_LEN]).set_checksum(c);
        }
        Ok(len)
    }
}

/// Emit a whole RoCEv2 packet into `buf` and return its length: IP header (length and IPv4
/// checksum filled), UDP header (length filled; checksum 0 over IPv4, computed over IPv6),
/// transport headers (pad count filled), payload, zero pad, ICRC.
#[inline]
pub fn emit_packet(
    ip: &IpRepr,
    src_port: u16,
    dst_port: u16,
    t: &TransportRepr,
    payload: &[u8],
    buf: &mut [u8],
) -> Result<usize, WireError> {
    let layout = PacketLayout::new(ip, src_port, dst_port, t, payload.len())?;
    layout.emit_headers(buf)?;
    layout.payload_mut(buf)?.copy_from_slice(payload);
    layout.finish(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aeth::{NakCode, Syndrome};
    use crate::types::{Msn, Psn, Qkey, Qpn};
    use core::net::Ipv4Addr;

    fn v4() -> IpRepr {
        IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            tos: 0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            payload_len: 0,
        })
    }

    fn v6() -> IpRepr {
        IpRepr::V6(Ipv6Repr {
            src: "::ffff:10.0.0.1".parse().unwrap(),
            dst: "::ffff:10.0.0.2".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0x121,
            hop_limit: 64,
            payload_len: 0,
        })
    }

    fn send_only() -> TransportRepr {
        TransportRepr::new(BthRepr::new(
            Opcode::RcSendOnly,
            Qpn::new(0x11),
            Psn::new(5),
        ))
    }

    fn build(ip: &IpRepr, t: &TransportRepr, payload: &[u8]) -> ([u8; 256], usize) {
        let mut buf = [0u8; 256];
        let n = emit_packet(ip, 0xc121, ROCEV2_UDP_PORT, t, payload, &mut buf).unwrap();
        (buf, n)
    }

    /// Re-seal a hand-edited IPv4 packet: fix the IP checksum and the ICRC.
    fn reseal(b: &mut [u8]) {
        Ipv4::new_unchecked(&mut b[..]).fill_checksum();
        let n = b.len();
        let c = icrc::compute(&b[..n - 4]).unwrap();
        b[n - 4..].copy_from_slice(&c.to_le_bytes());
    }

    #[test]
    fn emit_fills_lengths_pad_and_icrc() {
        for ip in [v4(), v6()] {
            for len in 0..=8 {
                let payload = [0xabu8; 8];
                let (buf, n) = build(&ip, &send_only(), &payload[..len]);
                let pad = pad_for(len);
                assert_eq!(n, ip.header_len() + 8 + 12 + len + pad + 4);
                let p = RoceV2Packet::parse_checked(&buf[..n]).unwrap();
                assert_eq!(p.payload, &payload[..len]);
                assert_eq!(usize::from(p.transport.bth.pad_count), pad);
                match ip {
                    IpRepr::V4(_) => assert_eq!(p.udp.checksum, 0),
                    IpRepr::V6(r) => {
                        let mut seg = buf[40..n].to_vec();
                        seg[6..8].fill(0);
                        assert_eq!(
                            p.udp.checksum,
                            crate::udp::checksum_ipv6(&r.src, &r.dst, &seg)
                        );
                    }
                }
                assert_eq!(usize::from(p.udp.length), n - ip.header_len());
                assert_eq!(p.ip.payload_len(), n - ip.header_len());
                // pad bytes are zero
                assert!(buf[n - 4 - pad..n - 4].iter().all(|&b| b == 0));
            }
        }
    }

    #[test]
    fn every_opcode_round_trips_with_its_headers() {
        for &op in Opcode::ALL {
            let mut t =
                TransportRepr::new(BthRepr::new(op, Qpn::new(0xabcdef), Psn::new(0xffffff)));
            let e = op.ext();
            if e.reth {
                t.reth = Some(RethRepr {
                    va: 0x1122_3344_5566_7788,
                    rkey: Rkey(9),
                    dma_len: 3,
                });
            }
            if e.aeth {
                t.aeth = Some(AethRepr {
                    syndrome: Syndrome::Nak(NakCode::RemoteAccessError),
                    msn: Msn::new(4),
                });
            }
            if e.deth {
                t.deth = Some(DethRepr {
                    qkey: Qkey(0x1111_1111),
                    src_qp: Qpn::new(0x12),
                });
            }
            if e.immdt {
                t.immdt = Some(0x0102_0304);
            }
            if e.ieth {
                t.ieth = Some(Rkey(0x55));
            }
            if e.atomic_eth {
                t.atomic_eth = Some(AtomicEthRepr {
                    va: 8,
                    rkey: Rkey(1),
                    swap_add: 2,
                    compare: 3,
                });
            }
            if e.atomic_ack_eth {
                t.atomic_ack_eth = Some(AtomicAckEthRepr { orig: 77 });
            }
            let payload: &[u8] = if op.has_payload() { b"abcde" } else { b"" };
            for ip in [v4(), v6()] {
                let (buf, n) = build(&ip, &t, payload);
                let p = RoceV2Packet::parse_checked(&buf[..n]).unwrap();
                let mut want = t;
                want.bth.pad_count = pad_for(payload.len()) as u8;
                assert_eq!(p.transport, want, "{op:?}");
                assert_eq!(p.payload, payload);
                assert_eq!(
                    n,
                    ip.header_len()
                        + 8
                        + op.header_len()
                        + payload.len()
                        + pad_for(payload.len())
                        + 4
                );
            }
        }
    }

    #[test]
    fn two_step_layout_equals_one_call() {
        let (one, n) = build(&v6(), &send_only(), b"zero copy!");
        let l = PacketLayout::new(&v6(), 0xc121, ROCEV2_UDP_PORT, &send_only(), 10).unwrap();
        assert_eq!(l.len(), n);
        let mut two = [0xffu8; 256];
        l.emit_headers(&mut two).unwrap();
        l.payload_mut(&mut two)
            .unwrap()
            .copy_from_slice(b"zero copy!");
        assert_eq!(l.finish(&mut two), Ok(n));
        assert_eq!(one[..n], two[..n]);
        let mut small = [0u8; 10];
        assert_eq!(
            l.emit_headers(&mut small),
            Err(WireError::BufferTooSmall {
                needed: n,
                available: 10
            })
        );
        assert!(l.payload_mut(&mut small).is_err());
        assert!(l.finish(&mut small).is_err());
    }

    #[test]
    fn copied_middle_headers_make_the_packet_a_fresh_layout_makes() {
        for ip in [v4(), v6()] {
            let middle = |psn, ack_req| {
                let mut b = BthRepr::new(Opcode::RcRdmaWriteMiddle, Qpn::new(0x11), Psn::new(psn));
                b.ack_req = ack_req;
                TransportRepr::new(b)
            };
            let payload = [0x3cu8; 64];
            let first =
                PacketLayout::new(&ip, 0xc121, ROCEV2_UDP_PORT, &middle(5, false), 64).unwrap();
            let mut headers = [0u8; 256];
            first.emit_headers(&mut headers).unwrap();
            let headers = &headers[..first.header_len()];
            for (psn, ack_req) in [(6, false), (7, true), (0xff_ffff, false)] {
                let (fresh, n) = build(&ip, &middle(psn, ack_req), &payload);
                let mut copied = [0xffu8; 256];
                first
                    .emit_headers_like(headers, &mut copied, Psn::new(psn), ack_req)
                    .unwrap();
                first
                    .payload_mut(&mut copied)
                    .unwrap()
                    .copy_from_slice(&payload);
                assert_eq!(first.finish(&mut copied), Ok(n));
                assert_eq!(fresh[..n], copied[..n], "psn {psn}");
            }
            // Headers of another length are refused, not half copied.
            assert!(first
                .emit_headers_like(&headers[1..], &mut [0u8; 256], Psn::new(6), false)
                .is_err());
        }
    }

    #[test]
    fn internal_packets_parse_without_an_icrc_and_fail_the_checked_parse() {
        for ip in [v4(), v6()] {
            let payload = vec![0x5au8; 32 << 10];
            let l = PacketLayout::new(&ip, 0xc121, ROCEV2_UDP_PORT, &send_only(), payload.len())
                .unwrap();
            let mut buf = vec![0xffu8; l.len()];
            l.emit_headers(&mut buf).unwrap();
            l.payload_mut(&mut buf).unwrap().copy_from_slice(&payload);
            assert_eq!(l.finish_internal(&mut buf), Ok(l.len()));
            let p = RoceV2Packet::parse_internal(&buf).unwrap();
            assert_eq!(p.payload, &payload[..]);
            assert_eq!(p.transport, send_only());
            assert_eq!(p.icrc, 0);
            assert!(!p.icrc_ok);
            // Never good enough for ingress from a socket: over IPv4 not even the header
            // checksum is there.
            let checked = RoceV2Packet::parse_checked(&buf);
            match ip {
                IpRepr::V4(_) => assert_eq!(checked, Err(WireError::BadIpChecksum)),
                IpRepr::V6(_) => assert!(matches!(checked, Err(WireError::BadIcrc { .. }))),
            }
            // Structural checks still apply.
            assert!(RoceV2Packet::parse_internal(&buf[..buf.len() - 1]).is_err());
        }
    }

    #[test]
    fn emit_rejects_inconsistent_requests() {
        let mut buf = [0u8; 256];
        let mut t = send_only();
        t.reth = Some(RethRepr::default());
        assert_eq!(
            emit_packet(&v4(), 1, ROCEV2_UDP_PORT, &t, b"", &mut buf),
            Err(WireError::ExtHeaderMismatch {
                opcode: Opcode::RcSendOnly
            })
        );
        let mut ack = TransportRepr::new(BthRepr::new(
            Opcode::RcAcknowledge,
            Qpn::new(1),
            Psn::new(1),
        ));
        assert_eq!(
            emit_packet(&v4(), 1, ROCEV2_UDP_PORT, &ack, b"", &mut buf),
            Err(WireError::ExtHeaderMismatch {
                opcode: Opcode::RcAcknowledge
            })
        );
        ack.aeth = Some(AethRepr {
            syndrome: Syndrome::ACK_NO_CREDIT,
            msn: Msn::new(0),
        });
        assert_eq!(
            emit_packet(&v4(), 1, ROCEV2_UDP_PORT, &ack, b"x", &mut buf),
            Err(WireError::UnexpectedPayload {
                opcode: Opcode::RcAcknowledge,
                len: 1
            })
        );
        assert_eq!(
            emit_packet(
                &v4(),
                1,
                ROCEV2_UDP_PORT,
                &send_only(),
                &[0u8; 100],
                &mut [0u8; 50]
            ),
            Err(WireError::BufferTooSmall {
                needed: 20 + 8 + 12 + 100 + 4,
                available: 50
            })
        );
        let too_big = 0xffff;
        assert!(matches!(
            PacketLayout::new(&v4(), 1, ROCEV2_UDP_PORT, &send_only(), too_big),
            Err(WireError::PayloadTooLarge { .. })
        ));
        // The largest payload that fits is accepted, and the lengths stay in range.
        let max = 0xffff - 20 - 8 - 12 - 4;
        let max = max - max % 4;
        let l = PacketLayout::new(&v4(), 1, ROCEV2_UDP_PORT, &send_only(), max).unwrap();
        assert!(l.len() <= 0xffff);
        assert!(PacketLayout::new(&v4(), 1, ROCEV2_UDP_PORT, &send_only(), max + 1).is_err());
    }

    #[test]
    fn parse_reports_each_malformation_precisely() {
        let (good, n) = build(&v4(), &send_only(), b"hello!");
        let good = &good[..n]; // 20 + 8 + 12 + 6 + 2 + 4 = 52
        assert_eq!(n, 52);
        let p = |b: &[u8]| RoceV2Packet::parse(b).map(|_| ());
        let pc = |b: &[u8]| RoceV2Packet::parse_checked(b).map(|_| ());

        assert_eq!(
            p(&[]),
            Err(WireError::Truncated {
                header: HeaderKind::Ipv4,
                needed: 20,
                available: 0
            })
        );
        assert_eq!(
            p(&good[..10]),
            Err(WireError::Truncated {
                header: HeaderKind::Ipv4,
                needed: 20,
                available: 10
            })
        );
        assert_eq!(
            p(&good[..51]),
            Err(WireError::LengthMismatch {
                header: HeaderKind::Ipv4,
                claimed: 52,
                actual: 51
            })
        );
        // Link-layer padding after the IP packet is ignored.
        let mut padded = [0u8; 60];
        padded[..52].copy_from_slice(good);
        assert_eq!(pc(&padded), Ok(()));

        let mut b = good.to_vec();
        b[0] = 0x46;
        assert_eq!(p(&b), Err(WireError::Ipv4Options { ihl: 6 }));
        b[0] = 0x35;
        assert_eq!(p(&b), Err(WireError::BadIpVersion { version: 3 }));

        let mut b = good.to_vec();
        b[6] = 0x20; // MF
        reseal(&mut b);
        assert_eq!(p(&b), Err(WireError::Ipv4Fragmented));

        let mut b = good.to_vec();
        b[9] = 6;
        reseal(&mut b);
        assert_eq!(p(&b), Err(WireError::NotUdp { protocol: 6 }));

        let mut b = good.to_vec();
        b[15] ^= 1; // address changed, checksum not fixed
        assert_eq!(p(&b), Err(WireError::BadIpChecksum));

        let mut b = good.to_vec();
        b[22..24].copy_from_slice(&4792u16.to_be_bytes());
        reseal(&mut b);
        assert_eq!(p(&b), Err(WireError::WrongUdpPort { port: 4792 }));

        for udp_len in [31u16, 33, 7] {
            let mut b = good.to_vec();
            b[24..26].copy_from_slice(&udp_len.to_be_bytes());
            reseal(&mut b);
            assert_eq!(
                p(&b),
                Err(WireError::LengthMismatch {
                    header: HeaderKind::Udp,
                    claimed: usize::from(udp_len),
                    actual: 32
                })
            );
        }

        let mut b = good.to_vec();
        b[28] = 0x15;
        reseal(&mut b);
        assert_eq!(p(&b), Err(WireError::UnknownOpcode { code: 0x15 }));
        b[28] = 0x2c;
        reseal(&mut b);
        assert_eq!(
            p(&b),
            Err(WireError::OpcodeNotValidForTransport { code: 0x2c })
        );
        b[28] = 0x44;
        reseal(&mut b);
        assert_eq!(p(&b), Err(WireError::UnsupportedTransport { code: 0x44 }));

        let mut b = good.to_vec();
        b[29] |= 0x01;
        reseal(&mut b);
        assert_eq!(p(&b), Err(WireError::BadTver { tver: 1 }));

        let mut b = good.to_vec();
        b[29] = (b[29] & !0x30) | 0x30; // pad 3 where 2 is right: 8 - 3 = 5 bytes of payload
        reseal(&mut b);
        assert_eq!(pc(&b), Ok(()));
        assert_eq!(RoceV2Packet::parse(&b).unwrap().payload, b"hello");

        // A packet whose payload is shorter than its pad count.
        let ack = TransportRepr {
            aeth: Some(AethRepr {
                syndrome: Syndrome::ACK_NO_CREDIT,
                msn: Msn::new(1),
            }),
            ..TransportRepr::new(BthRepr::new(
                Opcode::RcAcknowledge,
                Qpn::new(1),
                Psn::new(1),
            ))
        };
        let (abuf, an) = build(&v4(), &ack, b"");
        let mut b = abuf[..an].to_vec();
        b[29] |= 0x20;
        reseal(&mut b);
        assert_eq!(p(&b), Err(WireError::PadTooLarge { pad: 2, payload: 0 }));

        // Payload on an opcode that carries none.
        let mut b = abuf[..an].to_vec();
        b.splice(an - 4..an - 4, [0u8; 4]);
        let total = b.len() as u16;
        b[2..4].copy_from_slice(&total.to_be_bytes());
        b[24..26].copy_from_slice(&(total - 20).to_be_bytes());
        reseal(&mut b);
        assert_eq!(
            p(&b),
            Err(WireError::UnexpectedPayload {
                opcode: Opcode::RcAcknowledge,
                len: 4
            })
        );

        // Payload plus pad not a multiple of 4.
        let mut b = good.to_vec();
        b.insert(45, 0);
        let total = b.len() as u16;
        b[2..4].copy_from_slice(&total.to_be_bytes());
        b[24..26].copy_from_slice(&(total - 20).to_be_bytes());
        reseal(&mut b);
        assert_eq!(p(&b), Err(WireError::PayloadNotAligned { len: 9 }));

        // Extension header cut short: an ACK whose AETH is missing.
        let mut b = abuf[..an].to_vec();
        b.truncate(20 + 8 + 12 + 2);
        let total = b.len() as u16;
        b[2..4].copy_from_slice(&total.to_be_bytes());
        b[24..26].copy_from_slice(&(total - 20).to_be_bytes());
        Ipv4::new_unchecked(&mut b[..]).fill_checksum();
        assert_eq!(
            p(&b),
            Err(WireError::Truncated {
                header: HeaderKind::Aeth,
                needed: 4,
                available: 2
            })
        );

        // Headers complete but no room for the ICRC.
        let mut b = good[..20 + 8 + 12 + 2].to_vec();
        let total = b.len() as u16;
        b[2..4].copy_from_slice(&total.to_be_bytes());
        b[24..26].copy_from_slice(&(total - 20).to_be_bytes());
        Ipv4::new_unchecked(&mut b[..]).fill_checksum();
        assert_eq!(
            p(&b),
            Err(WireError::Truncated {
                header: HeaderKind::Icrc,
                needed: 4,
                available: 2
            })
        );

        // Bad ICRC: parse reports it, parse_checked refuses it.
        let mut b = good.to_vec();
        b[41] ^= 0x80;
        let r = RoceV2Packet::parse(&b).unwrap();
        assert!(!r.icrc_ok);
        assert!(matches!(pc(&b), Err(WireError::BadIcrc { expected, .. }) if expected == r.icrc));
    }

    #[test]
    fn a_hidden_ipv4_ident_is_recovered_by_the_checked_parse() {
        let IpRepr::V4(mut r) = v4() else {
            unreachable!("v4() is IPv4")
        };
        r.ident = 0x1234;
        let (sent, n) = build(&IpRepr::V4(r), &send_only(), b"hello!");
        let sent = &sent[..n];
        // As sent: checked as is, nothing recovered.
        let (p, recovered) = RoceV2Packet::parse_checked_recovering_ipv4_ident(sent).unwrap();
        assert_eq!(
            (p, recovered),
            (RoceV2Packet::parse_checked(sent).unwrap(), None)
        );
        // As a UDP socket's receiver rebuilds it: ID 0 (and its checksum).
        let mut seen = sent.to_vec();
        Ipv4::new_unchecked(&mut seen[..]).set_ident(0);
        Ipv4::new_unchecked(&mut seen[..]).fill_checksum();
        assert!(matches!(
            RoceV2Packet::parse_checked(&seen),
            Err(WireError::BadIcrc { .. })
        ));
        let (p, recovered) = RoceV2Packet::parse_checked_recovering_ipv4_ident(&seen).unwrap();
        assert_eq!(recovered, Some(0x1234));
        assert_eq!(p, RoceV2Packet::parse_checked(sent).unwrap());
        // A corrupted payload byte: the same error the exact check gives.
        seen[42] ^= 0x10;
        let exact = RoceV2Packet::parse_checked(&seen).unwrap_err();
        assert!(matches!(exact, WireError::BadIcrc { .. }));
        assert_eq!(
            RoceV2Packet::parse_checked_recovering_ipv4_ident(&seen),
            Err(exact)
        );
        // Structural errors are the parser's.
        assert_eq!(
            RoceV2Packet::parse_checked_recovering_ipv4_ident(&seen[..30]),
            Err(RoceV2Packet::parse_checked(&seen[..30]).unwrap_err())
        );
        // IPv6 has no ID: the exact check.
        let (v6pkt, n) = build(&v6(), &send_only(), b"hello!");
        let mut v6pkt = v6pkt[..n].to_vec();
        assert_eq!(
            RoceV2Packet::parse_checked_recovering_ipv4_ident(&v6pkt),
            Ok((RoceV2Packet::parse_checked(&v6pkt).unwrap(), None))
        );
        v6pkt[62] ^= 1;
        assert_eq!(
            RoceV2Packet::parse_checked_recovering_ipv4_ident(&v6pkt),
            Err(RoceV2Packet::parse_checked(&v6pkt).unwrap_err())
        );
    }

    #[test]
    fn cnp_has_sixteen_reserved_bytes() {
        let t = TransportRepr::new(BthRepr::new(Opcode::Cnp, Qpn::new(0x11), Psn::new(0)));
        let (buf, n) = build(&v4(), &t, b"");
        assert_eq!(n, 20 + 8 + 12 + 16 + 4);
        assert!(buf[40..56].iter().all(|&b| b == 0));
        assert_eq!(RoceV2Packet::parse_checked(&buf[..n]).unwrap().transport, t);
        let mut b = buf[..n].to_vec();
        b.truncate(20 + 8 + 12 + 10);
        let total = b.len() as u16;
        b[2..4].copy_from_slice(&total.to_be_bytes());
        b[24..26].copy_from_slice(&(total - 20).to_be_bytes());
        Ipv4::new_unchecked(&mut b[..]).fill_checksum();
        assert_eq!(
            RoceV2Packet::parse(&b),
            Err(WireError::Truncated {
                header: HeaderKind::CnpReserved,
                needed: 16,
                available: 10
            })
        );
    }

    #[test]
    fn transport_packet_parses_a_udp_payload() {
        let (buf, n) = build(&v4(), &send_only(), b"hello!");
        let t = TransportPacket::parse(&buf[28..n]).unwrap();
        assert_eq!(t.payload, b"hello!");
        let ip = RoceV2Packet::parse(&buf[..n]).unwrap();
        assert_eq!(t.icrc, ip.icrc);
        // The ICRC rebuilt from the known headers matches the real one.
        assert_eq!(
            icrc::compute_with_headers(&ip.ip, &ip.udp, &buf[28..n - 4]),
            Ok(ip.icrc)
        );
    }
}
