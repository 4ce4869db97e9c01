//! A whole IP/UDP datagram as a host's socket layer handles it: who sent it to whom, where
//! its UDP payload lies, and the two edits a host makes to a RoCEv2 packet (its UDP
//! destination port, and its UDP source port with the ICRC that covers it).
//!
//! The engine emits and receives whole IP packets; a UDP socket sends and receives only
//! their UDP payloads. These functions are the one place a host learns where that payload
//! starts, so no byte offset of a header lives outside this crate.

use core::ops::Range;
use std::net::SocketAddr;

use crate::error::{HeaderKind, WireError};
use crate::icrc::{self, ICRC_LEN};
use crate::ipv4::Ipv4;
use crate::packet::IpRepr;
use crate::udp::{Udp, UdpRepr, UDP_HEADER_LEN};

/// The addressing of one IP/UDP datagram and where its UDP payload lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Datagram {
    /// Source address and UDP port.
    pub src: SocketAddr,
    /// Destination address and UDP port.
    pub dst: SocketAddr,
    /// The UDP payload (for RoCEv2: BTH … ICRC) within the packet.
    pub payload: Range<usize>,
    /// Where the UDP header starts within the packet.
    udp: usize,
}

impl Datagram {
    /// Parse the IP and UDP headers at the start of `pkt` (IPv4 without options and not a
    /// fragment, or IPv6 with UDP next; lengths within the buffer). Bytes after the IP
    /// length (link padding) are not part of the datagram.
    pub fn parse(pkt: &[u8]) -> Result<Datagram, WireError> {
        let ip = IpRepr::parse(pkt)?;
        let udp = ip.header_len();
        let end = udp + ip.payload_len();
        let u = Udp::new_checked(&pkt[udp..end])?;
        let repr = UdpRepr::parse(&u)?;
        Ok(Datagram {
            src: SocketAddr::new(ip.src(), repr.src_port),
            dst: SocketAddr::new(ip.dst(), repr.dst_port),
            payload: udp + UDP_HEADER_LEN..udp + usize::from(repr.length),
            udp,
        })
    }

    /// The datagram's whole length: IP header, UDP header and payload.
    pub fn len(&self) -> usize {
        self.payload.end
    }

    /// Never true: a datagram has at least its headers.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Write `port` as the UDP destination port of `pkt` (the packet this was parsed from).
    /// RoCEv2 computes the ICRC with destination port 4791 (the port is not masked), so a
    /// host that carried the packet on another port puts 4791 back before the check.
    pub fn set_dst_port(&mut self, pkt: &mut [u8], port: u16) {
        Udp::new_unchecked(&mut pkt[self.udp..self.udp + UDP_HEADER_LEN]).set_dst_port(port);
        self.dst.set_port(port);
    }

    /// Write `port` as the UDP source port of `pkt` (a whole RoCEv2 packet, ICRC last) and
    /// recompute its ICRC, which covers the source port: a host that cannot send from the
    /// port the engine chose sends from another and keeps the packet checkable.
    pub fn set_src_port(&mut self, pkt: &mut [u8], port: u16) -> Result<(), WireError> {
        let end = self.len();
        if end < self.payload.start + ICRC_LEN {
            return Err(WireError::Truncated {
                header: HeaderKind::Icrc,
                needed: self.payload.start + ICRC_LEN,
                available: end,
            });
        }
        Udp::new_unchecked(&mut pkt[self.udp..self.udp + UDP_HEADER_LEN]).set_src_port(port);
        let crc = icrc::compute(&pkt[..end - ICRC_LEN])?;
        pkt[end - ICRC_LEN..end].copy_from_slice(&icrc::icrc_bytes(crc));
        self.src.set_port(port);
        Ok(())
    }
}

impl Datagram {
    /// Write `ident` as the IPv4 identification of `pkt` (the whole IPv4 RoCEv2 packet this
    /// was parsed from, ICRC last), with the header checksum and the ICRC that cover it; the
    /// ICRC is moved, not recomputed ([`icrc::icrc_for_ipv4_ident`]). For a host that sends
    /// the packet as segment `ident` of a GSO train (see [`crate::train`]). Nothing to do for
    /// IPv6, which has no identification.
    pub fn set_ipv4_ident(&self, pkt: &mut [u8], ident: u16) -> Result<(), WireError> {
        self.move_ipv4_ident(pkt, ident, icrc::icrc_for_ipv4_ident)
    }

    /// [`Datagram::set_ipv4_ident`] with the ICRC moved through `deltas`, which keeps what
    /// IDs do to packets of one length: for the segments of a train, which share theirs.
    pub fn set_ipv4_ident_with(
        &self,
        pkt: &mut [u8],
        ident: u16,
        deltas: &mut icrc::IdentDeltas,
    ) -> Result<(), WireError> {
        self.move_ipv4_ident(pkt, ident, |c, len, old, new| {
            deltas.icrc_for(c, len, old, new)
        })
    }

    fn move_ipv4_ident(
        &self,
        pkt: &mut [u8],
        ident: u16,
        icrc_for: impl FnOnce(u32, usize, u16, u16) -> Option<u32>,
    ) -> Result<(), WireError> {
        if self.udp != crate::ipv4::IPV4_HEADER_LEN || !self.src.is_ipv4() {
            return Ok(());
        }
        let end = self.len();
        let short = WireError::Truncated {
            header: HeaderKind::Icrc,
            needed: self.payload.start + ICRC_LEN,
            available: end,
        };
        if end < self.payload.start + ICRC_LEN {
            return Err(short);
        }
        let mut ip = Ipv4::new_checked(&mut pkt[..self.udp])?;
        let old = ip.ident();
        ip.set_ident(ident);
        ip.fill_checksum();
        let tail = &mut pkt[end - ICRC_LEN..end];
        let moved = icrc_for(icrc::read_icrc(tail), end, old, ident).ok_or(short)?;
        tail.copy_from_slice(&icrc::icrc_bytes(moved));
        Ok(())
    }
}

/// IPv6 (40) + UDP (8): the most header bytes [`Datagram::parse`] reads.
const MAX_DATAGRAM_HEADERS: usize = 48;

/// [`Datagram::parse`] for a host that sends runs of packets with the same IP and UDP
/// headers (every MIDDLE packet of a message, every full-size READ response; in a
/// ping-pong, the request and the ACK that rides with it): a packet whose headers are byte
/// for byte those of one of the last two parsed is that datagram again, and is not parsed
/// afresh. Everything `parse` reads lies in those bytes, so the answer is the same.
#[derive(Debug, Clone, Default)]
pub struct DatagramCache {
    /// The last two datagrams parsed; `newest` indexes the later.
    seen: [Seen; 2],
    newest: usize,
}

/// One datagram a [`DatagramCache`] remembers.
#[derive(Debug, Clone)]
struct Seen {
    /// Its header bytes, `len` of them (0: none).
    headers: [u8; MAX_DATAGRAM_HEADERS],
    len: usize,
    datagram: Option<Datagram>,
}

impl Default for Seen {
    fn default() -> Seen {
        Seen {
            headers: [0; MAX_DATAGRAM_HEADERS],
            len: 0,
            datagram: None,
        }
    }
}

impl Seen {
    fn matches(&self, pkt: &[u8]) -> Option<&Datagram> {
        let d = self.datagram.as_ref()?;
        (pkt.len() >= self.len && pkt[..self.len] == self.headers[..self.len]).then_some(d)
    }
}

impl DatagramCache {
    /// An empty cache.
    pub fn new() -> DatagramCache {
        DatagramCache::default()
    }

    /// What [`Datagram::parse`] returns for `pkt`.
    #[inline]
    pub fn parse(&mut self, pkt: &[u8]) -> Result<Datagram, WireError> {
        for i in [self.newest, 1 - self.newest] {
            if let Some(d) = self.seen[i].matches(pkt) {
                let d = d.clone();
                self.newest = i;
                return Ok(d);
            }
        }
        let d = Datagram::parse(pkt)?;
        let len = d.payload.start;
        if len <= MAX_DATAGRAM_HEADERS {
            // The older of the two makes room.
            self.newest = 1 - self.newest;
            let s = &mut self.seen[self.newest];
            s.headers[..len].copy_from_slice(&pkt[..len]);
            s.len = len;
            s.datagram = Some(d.clone());
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::RoceV2Packet;
    use crate::Opcode;

    /// An IPv4 RC SEND ONLY from 10.0.0.1:49152 to 10.0.0.2:4791.
    fn packet() -> Vec<u8> {
        crate::train::tests::packet(Opcode::RcSendOnly, 7, 5, b'h').0
    }

    #[test]
    fn finds_the_addresses_and_the_payload() {
        let p = packet();
        let d = Datagram::parse(&p).unwrap();
        assert_eq!(d.src, "10.0.0.1:49152".parse().unwrap());
        assert_eq!(d.dst, "10.0.0.2:4791".parse().unwrap());
        assert_eq!(d.payload, 28..p.len());
        assert_eq!(d.len(), p.len());
    }

    #[test]
    fn a_new_source_port_keeps_the_icrc_valid() {
        let mut p = packet();
        let mut d = Datagram::parse(&p).unwrap();
        d.set_src_port(&mut p, 4791).unwrap();
        let parsed = RoceV2Packet::parse_checked(&p).unwrap();
        assert_eq!(parsed.udp.src_port, 4791);
        assert_eq!(d.src.port(), 4791);
    }

    #[test]
    fn a_moved_destination_port_is_put_back_for_the_check() {
        let mut p = packet();
        let mut d = Datagram::parse(&p).unwrap();
        d.set_dst_port(&mut p, 5000);
        assert!(RoceV2Packet::parse_checked(&p).is_err());
        d.set_dst_port(&mut p, crate::ROCEV2_UDP_PORT);
        assert!(RoceV2Packet::parse_checked(&p).is_ok());
    }

    #[test]
    fn a_new_ident_keeps_the_icrc_valid_for_the_packet_as_it_goes_out() {
        let mut p = packet();
        let d = Datagram::parse(&p).unwrap();
        let mut deltas = icrc::IdentDeltas::new();
        for (k, id) in [1, 2, 63, 0xffff, 0, 5, 0x8000, 7].into_iter().enumerate() {
            // By the multiplications, and by the table a train keeps, in turns.
            if k % 2 == 0 {
                d.set_ipv4_ident(&mut p, id).unwrap();
            } else {
                d.set_ipv4_ident_with(&mut p, id, &mut deltas).unwrap();
            }
            let parsed = RoceV2Packet::parse_checked(&p).unwrap();
            let IpRepr::V4(v4) = parsed.ip else {
                panic!("not IPv4")
            };
            assert_eq!(v4.ident, id);
            assert!(Ipv4::new_checked(&p[..20]).unwrap().verify_checksum());
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for n in 0..64 {
            let junk: Vec<u8> = (0..n).map(|i| (i * 37 + 0x45) as u8).collect();
            let _ = Datagram::parse(&junk);
        }
        let mut p = packet();
        p.truncate(30);
        assert!(Datagram::parse(&p).is_err());
    }

    #[test]
    fn the_cache_parses_as_parse_does_and_notices_any_header_change() {
        let mut cache = DatagramCache::new();
        let p = packet();
        assert_eq!(cache.parse(&p).unwrap(), Datagram::parse(&p).unwrap());
        // The same headers again: the remembered answer.
        assert_eq!(cache.parse(&p).unwrap(), Datagram::parse(&p).unwrap());
        // Any header byte that differs is parsed afresh, errors included.
        for at in 0..28 {
            let mut q = p.clone();
            q[at] ^= 0x10;
            assert_eq!(cache.parse(&q), Datagram::parse(&q), "byte {at}");
            assert_eq!(cache.parse(&p).unwrap(), Datagram::parse(&p).unwrap());
        }
        // A shorter packet is never matched against longer headers.
        assert_eq!(cache.parse(&p[..20]), Datagram::parse(&p[..20]));
        // Packets of two lengths in turn (a ping-pong's request and ACK) are both
        // remembered, and a third takes the place of the older.
        let ack = crate::train::tests::packet(Opcode::RcSendOnly, 7, 64, 0).0;
        let other = crate::train::tests::packet(Opcode::RcSendOnly, 8, 5, b'x').0;
        for q in [&p, &ack, &p, &ack, &other, &ack, &p, &other] {
            assert_eq!(cache.parse(q).unwrap(), Datagram::parse(q).unwrap());
        }
    }
}
