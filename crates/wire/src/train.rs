//! GSO trains: several RoCEv2 packets in one UDP payload, as a host hands them to the kernel
//! with `UDP_SEGMENT` (one `sendmsg`, cut into equal datagrams) and as the kernel hands them
//! to a receiver with `UDP_GRO`.
//!
//! A train is consecutive packets of one QP: the same destination QP, each PSN one past the
//! one before, every segment as long as the first but the last (which may be shorter), the
//! first a FIRST or MIDDLE packet (whose payload is exactly the path MTU), or an ONLY packet
//! of at most [`MAX_SMALL_SEG`] bytes (small messages posted back to back, each a packet of
//! the same size). The rules let a receiver that is handed a train whole with no segment
//! size (a raw socket, on a path where nothing cut the train: loopback, veth) find where its
//! packets lie ([`segment_len`]), and keep a single packet from ever being read as a train
//! but by data that imitates the next packet's BTH at an MTU boundary, or for a small ONLY
//! packet within its first [`MAX_SMALL_SEG`] bytes (whose pieces then fail their ICRC).
//!
//! Linux numbers the IPv4 identification of a train's segments from the socket's base ID,
//! one up per segment; the base is 0 on an unconnected socket that sets DF (its
//! `ip_select_ident_segs`, then `inet_gso_segment`). The ICRC covers the ID, so a sender
//! seals segment `k` for ID `k` ([`crate::Datagram::set_ipv4_ident`]).

use crate::bth::{Bth, BTH_LEN};
use crate::error::{HeaderKind, WireError};
use crate::icrc::ICRC_LEN;
use crate::ipv4::{Ipv4, IPV4_HEADER_LEN};
use crate::ipv6::{Ipv6, IPV6_HEADER_LEN};
use crate::types::{Mtu, Psn, Qpn};
use crate::udp::{checksum_ipv6, Udp, UDP_HEADER_LEN};

/// Most segments a host puts in one train (Linux takes up to 128 per `sendmsg`).
pub const MAX_SEGMENTS: usize = 64;

/// Longest ONLY packet that leads a train (of small messages); a receiver looks this far
/// for the second packet of a train an ONLY packet leads.
pub const MAX_SMALL_SEG: usize = 256;

/// Most bytes of UDP payload in one train: what an IPv4 datagram can carry.
pub const MAX_BYTES: usize = 65_507;

/// What decides whether a packet rides a train: read from its UDP payload (BTH first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// The destination QP.
    pub dest_qp: Qpn,
    /// The packet's PSN.
    pub psn: Psn,
    /// A FIRST or MIDDLE packet: its payload is a whole path MTU, and a train may start
    /// with it.
    pub may_lead: bool,
    /// An ONLY packet (a whole message): a train of small ones may start with it (see
    /// [`Link::leads`]).
    pub only: bool,
}

impl Link {
    /// The link of the RoCEv2 packet whose UDP payload is `payload`; `None` when it has no
    /// valid BTH (such a packet goes alone).
    pub fn of(payload: &[u8]) -> Option<Link> {
        let bth = Bth::new_checked(payload).ok()?;
        let op = bth.opcode().ok()?;
        Some(Link {
            dest_qp: bth.dest_qp(),
            psn: bth.psn(),
            may_lead: op.is_first() || op.is_middle(),
            only: op.is_only(),
        })
    }

    /// Whether this packet, `len` bytes of UDP payload, may start a train: a FIRST or
    /// MIDDLE packet, or an ONLY packet of at most [`MAX_SMALL_SEG`] bytes.
    pub fn leads(self, len: usize) -> bool {
        self.may_lead || (self.only && len <= MAX_SMALL_SEG)
    }

    /// Whether the packet `next` may follow the packet `self` in a train.
    pub fn is_followed_by(self, next: Link) -> bool {
        next.dest_qp == self.dest_qp && next.psn == self.psn.add(1)
    }
}

/// The length of the first packet in `payload`, a UDP payload handed over whole: all of it
/// when it is one RoCEv2 packet, the segment size when it is a train (see the module docs).
/// A few comparisons: only a FIRST or MIDDLE packet is looked at further, at the five
/// lengths a packet of its opcode can have.
pub fn segment_len(payload: &[u8]) -> usize {
    let Some(first) = Link::of(payload) else {
        return payload.len();
    };
    if first.only {
        return small_segment_len(payload, first);
    }
    if !first.may_lead {
        return payload.len();
    }
    let Ok(op) = Bth::new_unchecked(payload).opcode() else {
        return payload.len();
    };
    Mtu::ALL
        .iter()
        .map(|mtu| op.header_len() + mtu.bytes() + ICRC_LEN)
        .find(|&seg| is_train(payload, seg, first))
        .unwrap_or(payload.len())
}

/// [`segment_len`] of a payload an ONLY packet leads: the first offset, within
/// [`MAX_SMALL_SEG`] bytes, at which the payload cut is a train (the candidates are the
/// 4-byte multiples where the destination QP repeats: every RoCE packet is a whole number
/// of 4-byte words), else all of it.
fn small_segment_len(payload: &[u8], first: Link) -> usize {
    const DEST_QP: core::ops::Range<usize> = 5..8;
    let Some(qp) = payload.get(DEST_QP) else {
        return payload.len();
    };
    let last = MAX_SMALL_SEG.min(payload.len().saturating_sub(BTH_LEN + ICRC_LEN));
    (BTH_LEN + ICRC_LEN..=last)
        .step_by(4)
        .find(|&seg| {
            payload.get(seg + DEST_QP.start..seg + DEST_QP.end) == Some(qp)
                && is_train(payload, seg, first)
        })
        .unwrap_or(payload.len())
}

/// Whether `payload` cut every `seg` bytes is a train led by `first`: every piece after the
/// first starts with the next PSN of the same QP, and the last is long enough for a packet.
fn is_train(payload: &[u8], seg: usize, first: Link) -> bool {
    if seg >= payload.len() || payload.len() > seg * MAX_SEGMENTS {
        return false;
    }
    let mut prev = first;
    let mut at = seg;
    while at < payload.len() {
        let rest = &payload[at..];
        if rest.len() < BTH_LEN + ICRC_LEN {
            return false;
        }
        match Link::of(rest) {
            Some(next) if prev.is_followed_by(next) => prev = next,
            _ => return false,
        }
        at += seg;
    }
    true
}

/// Bytes of IPv4 and UDP header in front of a train that a raw socket hands over uncut.
pub const IPV4_TRAIN_HEADER_LEN: usize = IPV4_HEADER_LEN + UDP_HEADER_LEN;

/// Write into `out` the IPv4 and UDP headers that segment `k` of a train, with `len` bytes
/// of UDP payload, had on the wire, from `train`, the headers the train came with uncut (a
/// raw socket's view): the train's own, with the segment's lengths and IPv4 ID (the
/// train's plus `k`, as Linux numbers the segments), checksum filled in.
pub fn ipv4_segment_header(
    train: &[u8; IPV4_TRAIN_HEADER_LEN],
    out: &mut [u8],
    k: usize,
    len: usize,
) -> Result<(), WireError> {
    let udp_len = UDP_HEADER_LEN + len;
    let (Ok(total), Ok(k)) = (
        u16::try_from(IPV4_HEADER_LEN + udp_len),
        u16::try_from(k % 0x1_0000),
    ) else {
        return Err(WireError::LengthMismatch {
            header: HeaderKind::Udp,
            claimed: udp_len,
            actual: usize::from(u16::MAX),
        });
    };
    let available = out.len();
    let out = out
        .get_mut(..IPV4_TRAIN_HEADER_LEN)
        .ok_or(WireError::Truncated {
            header: HeaderKind::Ipv4,
            needed: IPV4_TRAIN_HEADER_LEN,
            available,
        })?;
    out.copy_from_slice(train);
    let (ip, udp) = out.split_at_mut(IPV4_HEADER_LEN);
    let mut ip = Ipv4::new_checked(ip)?;
    ip.set_total_len(total);
    let ident = ip.ident().wrapping_add(k);
    ip.set_ident(ident);
    ip.fill_checksum();
    Udp::new_checked(udp)?.set_length(total - IPV4_HEADER_LEN as u16);
    Ok(())
}

/// The packets of `ip`, an IPv4 or IPv6 datagram seen before its GSO train was cut (by a
/// raw socket, or in a capture on `lo` or a veth), each as it is on the wire: the train's
/// headers with the packet's own lengths in front of its bytes (for IPv4 also its ID, see
/// [`ipv4_segment_header`]; IPv6 has none). `None` when `ip` is not a UDP datagram without
/// IPv4 options or IPv6 extension headers, or holds one packet only by the train rules. It
/// copies, for tools and tests; the runtime's raw receive path cuts in place.
pub fn cut(ip: &[u8]) -> Option<Vec<Vec<u8>>> {
    let d = crate::Datagram::parse(ip).ok()?;
    let v4 = d.src.is_ipv4();
    let ip_len = if v4 { IPV4_HEADER_LEN } else { IPV6_HEADER_LEN };
    let h = ip_len + UDP_HEADER_LEN;
    if d.payload.start != h {
        return None;
    }
    let payload = ip.get(d.payload)?;
    let seg = segment_len(payload);
    if seg == 0 || seg >= payload.len() {
        return None;
    }
    let header = ip.get(..h)?;
    payload
        .chunks(seg)
        .enumerate()
        .map(|(k, chunk)| {
            let mut p = vec![0; h + chunk.len()];
            p[h..].copy_from_slice(chunk);
            if v4 {
                ipv4_segment_header(header.try_into().ok()?, &mut p, k, chunk.len()).ok()?;
            } else {
                // The train's header with the segment's lengths, and the UDP checksum
                // IPv6 requires (the ICRC does not cover it).
                p[..h].copy_from_slice(header);
                let udp_len = u16::try_from(UDP_HEADER_LEN + chunk.len()).ok()?;
                let (ip6, udp) = p.split_at_mut(ip_len);
                let mut ip6 = Ipv6::new_checked(ip6).ok()?;
                ip6.set_payload_len(udp_len);
                let mut u = Udp::new_checked(&mut *udp).ok()?;
                u.set_length(udp_len);
                u.set_checksum(0);
                let c = checksum_ipv6(&ip6.src_addr(), &ip6.dst_addr(), udp);
                Udp::new_checked(udp).ok()?.set_checksum(c);
            }
            Some(p)
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::packet::{emit_packet, IpRepr, TransportRepr};
    use crate::{BthRepr, Datagram, Ipv4Repr, Opcode, RethRepr, Rkey};

    /// A whole IPv4 RC packet of `op` to QP 0x11 with PSN `psn` and `len` payload bytes of
    /// `fill`, with IPv4 ID 0, and where its UDP payload lies.
    pub(crate) fn packet(op: Opcode, psn: u32, len: usize, fill: u8) -> (Vec<u8>, Datagram) {
        let ip = IpRepr::V4(Ipv4Repr {
            src: [10, 0, 0, 1].into(),
            dst: [10, 0, 0, 2].into(),
            tos: 0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            payload_len: 0,
        });
        packet_over(&ip, op, psn, len, fill)
    }

    /// [`packet`] with the IP header `ip`.
    fn packet_over(ip: &IpRepr, op: Opcode, psn: u32, len: usize, fill: u8) -> (Vec<u8>, Datagram) {
        let mut t = TransportRepr::new(BthRepr::new(op, Qpn::new(0x11), Psn::new(psn)));
        if op.ext().reth {
            t.reth = Some(RethRepr {
                va: 0x1000,
                rkey: Rkey::new(7),
                dma_len: 1 << 16,
            });
        }
        let data = vec![fill; len];
        let mut buf = vec![0u8; len + 128];
        let n = emit_packet(ip, 49152, crate::ROCEV2_UDP_PORT, &t, &data, &mut buf).unwrap();
        buf.truncate(n);
        let d = Datagram::parse(&buf).unwrap();
        (buf, d)
    }

    /// The UDP payload of [`packet`]'s packet.
    fn payload(op: Opcode, psn: u32, len: usize, fill: u8) -> Vec<u8> {
        let (buf, d) = packet(op, psn, len, fill);
        buf[d.payload].to_vec()
    }

    #[test]
    fn a_train_of_middles_and_a_last_is_cut_at_the_middles_length() {
        for mtu in Mtu::ALL {
            let m = mtu.bytes();
            let mut train = Vec::new();
            for i in 0..5 {
                train.extend(payload(
                    Opcode::RcRdmaWriteMiddle,
                    0xff_fffe + i,
                    m,
                    i as u8,
                ));
            }
            train.extend(payload(Opcode::RcRdmaWriteLast, 3, 100, 9));
            assert_eq!(segment_len(&train), BTH_LEN + m + ICRC_LEN, "{mtu:?}");
        }
    }

    #[test]
    fn a_train_of_small_only_packets_is_cut_at_their_length() {
        for (op, len) in [
            (Opcode::RcSendOnly, 2),
            (Opcode::RcRdmaWriteOnly, 2),
            (Opcode::RcSendOnly, 200),
        ] {
            let one = payload(op, 0xff_ffff, len, 1);
            assert_eq!(segment_len(&one), one.len(), "{op:?} alone");
            let mut train = one.clone();
            for i in 0..40u32 {
                train.extend(payload(op, i, len, i as u8));
            }
            // The last may be shorter.
            train.extend(payload(op, 40, len.saturating_sub(1).max(1), 0));
            assert_eq!(segment_len(&train), one.len(), "{op:?} x 42");
        }
        // Larger ONLY packets lead no train: a receiver looks no further.
        let big = payload(Opcode::RcSendOnly, 1, MAX_SMALL_SEG, 1);
        assert!(big.len() > MAX_SMALL_SEG);
        assert!(!Link::of(&big).unwrap().leads(big.len()));
        let mut two = big.clone();
        two.extend(payload(Opcode::RcSendOnly, 2, MAX_SMALL_SEG, 2));
        assert_eq!(segment_len(&two), two.len());
        // A small ONLY packet followed by another QP's, or by a PSN that does not follow, is
        // no train.
        let mut gap = payload(Opcode::RcSendOnly, 1, 2, 1);
        gap.extend(payload(Opcode::RcSendOnly, 3, 2, 2));
        assert_eq!(segment_len(&gap), gap.len());
    }

    #[test]
    fn a_write_first_alone_or_leading_is_cut_at_its_own_length() {
        let first = payload(Opcode::RcRdmaWriteFirst, 7, 1024, 1);
        assert_eq!(segment_len(&first), first.len());
        let mut train = first.clone();
        train.extend(payload(Opcode::RcRdmaWriteLast, 8, 1000, 2));
        assert_eq!(segment_len(&train), first.len());
    }

    #[test]
    fn single_packets_are_whole() {
        for (op, len) in [
            (Opcode::RcSendOnly, 2),
            (Opcode::RcSendOnly, 4096),
            (Opcode::RcSendLast, 3000),
            (Opcode::RcSendMiddle, 4096),
            (Opcode::RcRdmaReadResponseMiddle, 1024),
        ] {
            let p = payload(op, 1, len, 0x5a);
            assert_eq!(segment_len(&p), p.len(), "{op:?}");
        }
        assert_eq!(segment_len(&[]), 0);
        assert_eq!(segment_len(&[0xff; 7]), 7);
    }

    #[test]
    fn pieces_that_skip_a_psn_or_change_qp_are_no_train() {
        let mut gap = payload(Opcode::RcSendMiddle, 1, 256, 0);
        gap.extend(payload(Opcode::RcSendMiddle, 3, 256, 0));
        assert_eq!(segment_len(&gap), gap.len());
        let mut two = payload(Opcode::RcSendMiddle, 1, 256, 0);
        let mut other = payload(Opcode::RcSendLast, 2, 256, 0);
        other[5..8].copy_from_slice(&[0, 0, 0x12]);
        two.extend(other);
        assert_eq!(segment_len(&two), two.len());
    }

    #[test]
    fn links_follow_across_the_psn_wrap() {
        let a = Link::of(&payload(Opcode::RcSendFirst, 0xff_ffff, 256, 0)).unwrap();
        let b = Link::of(&payload(Opcode::RcSendMiddle, 0, 256, 0)).unwrap();
        assert!(a.may_lead && a.is_followed_by(b) && !b.is_followed_by(a));
        assert!(
            !Link::of(&payload(Opcode::RcSendOnly, 0, 2, 0))
                .unwrap()
                .may_lead
        );
    }

    /// A train of `n` WRITE MIDDLE packets of `mtu` bytes and a shorter LAST, each sealed
    /// as segment k (IPv4 ID k), as a sender hands it to the kernel: (the whole train with
    /// the headers of its first packet and the train's lengths, each packet as it goes on
    /// the wire).
    fn sealed_train(n: u32, mtu: usize) -> (Vec<u8>, Vec<Vec<u8>>) {
        let mut wire_packets = Vec::new();
        let mut train = Vec::new();
        for k in 0..=n {
            let (op, len) = if k < n {
                (Opcode::RcRdmaWriteMiddle, mtu)
            } else {
                (Opcode::RcRdmaWriteLast, 40)
            };
            let (mut buf, d) = packet(op, 100 + k, len, k as u8);
            d.set_ipv4_ident(&mut buf, k as u16).unwrap();
            if k == 0 {
                train.extend_from_slice(&buf[..d.payload.start]);
            }
            train.extend_from_slice(&buf[d.payload]);
            wire_packets.push(buf);
        }
        let total = train.len() as u16;
        let mut ip = Ipv4::new_unchecked(&mut train[..]);
        ip.set_total_len(total);
        ip.set_ident(0);
        ip.fill_checksum();
        Udp::new_unchecked(&mut train[IPV4_HEADER_LEN..]).set_length(total - 20);
        (train, wire_packets)
    }

    #[test]
    fn a_train_seen_uncut_becomes_the_packets_that_were_on_the_wire() {
        let (train, on_wire) = sealed_train(6, 1024);
        let h = IPV4_TRAIN_HEADER_LEN;
        assert_eq!(segment_len(&train[h..]), BTH_LEN + 1024 + ICRC_LEN);
        let pieces = cut(&train).unwrap();
        assert_eq!(pieces, on_wire);
        for pkt in &pieces {
            crate::RoceV2Packet::parse_checked(pkt).unwrap();
        }
        // One packet is no train; neither is what is not IP and UDP.
        assert_eq!(cut(&on_wire[0]), None);
        assert_eq!(cut(&train[..h - 1]), None);
        assert_eq!(cut(&train[h..]), None);
        let header: [u8; IPV4_TRAIN_HEADER_LEN] = train[..h].try_into().unwrap();
        let mut short = [0u8; 10];
        assert!(ipv4_segment_header(&header, &mut short, 0, 10).is_err());
        let mut out = [0u8; 28];
        assert!(ipv4_segment_header(&header, &mut out, 0, 70_000).is_err());
    }

    #[test]
    fn an_ipv6_train_seen_uncut_becomes_its_packets() {
        use crate::Ipv6Repr;
        let ip = IpRepr::V6(Ipv6Repr {
            src: "fd00::1".parse().unwrap(),
            dst: "fd00::2".parse().unwrap(),
            traffic_class: 0,
            flow_label: 0x12345,
            hop_limit: 64,
            payload_len: 0,
        });
        let mut on_wire = Vec::new();
        let mut train = Vec::new();
        for k in 0..4u32 {
            let (op, len) = if k < 3 {
                (Opcode::RcSendMiddle, 1024)
            } else {
                (Opcode::RcSendLast, 12)
            };
            let (buf, d) = packet_over(&ip, op, 50 + k, len, k as u8);
            if k == 0 {
                train.extend_from_slice(&buf[..d.payload.start]);
            }
            train.extend_from_slice(&buf[d.payload]);
            on_wire.push(buf);
        }
        let udp_len = (train.len() - IPV6_HEADER_LEN) as u16;
        Ipv6::new_checked(&mut train[..])
            .unwrap()
            .set_payload_len(udp_len);
        Udp::new_checked(&mut train[IPV6_HEADER_LEN..])
            .unwrap()
            .set_length(udp_len);
        let pieces = cut(&train).unwrap();
        assert_eq!(pieces, on_wire);
        for pkt in &pieces {
            crate::RoceV2Packet::parse_checked(pkt).unwrap();
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut x = 0x9e37_79b9u32;
        for n in 0..2000 {
            let junk: Vec<u8> = (0..n % 700)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            assert!(segment_len(&junk) <= junk.len());
        }
    }
}
