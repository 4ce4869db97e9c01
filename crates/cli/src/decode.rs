//! One tcpdump-style line per packet: addresses, the RoCEv2 transport headers field by field,
//! payload length and the ICRC verdict; or, for anything else, a short line saying what it is.
//!
//! The line for a RoCEv2 packet reads
//! `IP 10.0.0.1.49152 > 10.0.0.2.4791: RC Send Only (0x04) qpn=0x000011 psn=7 ack_req=1 payload=64 icrc=ok`;
//! every field after the opcode is a `key=value` token so scripts (and our tests) can pick
//! them out.

use core::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use wire::packet::{RoceV2Packet, TransportRepr};
use wire::{OpKind, Syndrome, WireError};

use crate::link::{self, Network, NotIp};

/// IANA protocol numbers this tool names.
const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;
/// Stands for "a non-first IPv4 fragment" (IPv6's Fragment header number, never an IPv4
/// protocol in practice).
const PROTO_FRAGMENT: u8 = 44;

/// How a packet was classified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A well-formed RoCEv2 packet whose ICRC verifies.
    RoceOk,
    /// A well-formed RoCEv2 packet whose ICRC does not verify.
    RoceBadIcrc,
    /// UDP to port 4791 that is not a valid RoCEv2 packet.
    Malformed(WireError),
    /// Not RoCEv2 at all (TCP, ARP, other UDP, ...).
    NotRoce,
}

/// One decoded packet: the line to print and what it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The text after the index and timestamp (no trailing newline).
    pub text: String,
    /// The classification.
    pub verdict: Verdict,
}

/// The addresses and upper protocol of an IP packet, read leniently for display only.
struct IpSummary {
    family: &'static str,
    src: IpAddr,
    dst: IpAddr,
    protocol: u8,
    /// Offset of the transport header.
    l4: usize,
    /// The packet length the IP header claims (header included).
    total_len: usize,
}

fn ip_summary(ip: &[u8]) -> Option<IpSummary> {
    let version = ip.first()? >> 4;
    match version {
        4 if ip.len() >= 20 => {
            let ihl = usize::from(ip[0] & 0x0f) * 4;
            if ihl < 20 {
                return None;
            }
            // A later fragment has no transport header to show.
            let frag_offset = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
            let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
            let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
            Some(IpSummary {
                family: "IP",
                src: src.into(),
                dst: dst.into(),
                protocol: if frag_offset == 0 {
                    ip[9]
                } else {
                    PROTO_FRAGMENT
                },
                l4: ihl,
                total_len: usize::from(u16::from_be_bytes([ip[2], ip[3]])),
            })
        }
        6 if ip.len() >= 40 => {
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&ip[8..24]);
            d.copy_from_slice(&ip[24..40]);
            Some(IpSummary {
                family: "IP6",
                src: Ipv6Addr::from(s).into(),
                dst: Ipv6Addr::from(d).into(),
                protocol: ip[6],
                l4: 40,
                total_len: 40 + usize::from(u16::from_be_bytes([ip[4], ip[5]])),
            })
        }
        _ => None,
    }
}

fn protocol_name(p: u8) -> String {
    match p {
        PROTO_ICMP => "ICMP".to_owned(),
        PROTO_TCP => "TCP".to_owned(),
        PROTO_UDP => "UDP".to_owned(),
        PROTO_ICMPV6 => "ICMPv6".to_owned(),
        PROTO_FRAGMENT => "IP fragment".to_owned(),
        other => format!("IP protocol {other}"),
    }
}

/// Decodes one captured frame of link type `linktype`.
pub fn decode_frame(linktype: u32, frame: &[u8]) -> Decoded {
    match link::strip(linktype, frame) {
        Network::Ip(ip) => decode_ip(ip),
        Network::Other(why) => not_ip(&why),
    }
}

/// Decodes one captured frame into its packets: one, or for a GSO train the capture saw
/// uncut, each packet of the train (see [`decode_ip_packets`]).
pub fn decode_frame_packets(linktype: u32, frame: &[u8]) -> Vec<Decoded> {
    match link::strip(linktype, frame) {
        Network::Ip(ip) => decode_ip_packets(ip),
        Network::Other(why) => vec![not_ip(&why)],
    }
}

/// Decodes one IP packet into its packets. `tcpdump` on `lo`, or on a veth that cuts UDP
/// GSO trains in software, sees a sender's train (`wire::train`: softrdma sends runs of
/// full-size packets of a message as one) before it is cut: one frame whose UDP payload is
/// several RoCEv2 packets. Each is then decoded with the headers it has on the wire (the
/// train's, with its own lengths, and for IPv4 its own ID), and its line ends in
/// `segment=k/n`. Anything else is one packet, as [`decode_ip`] decodes it.
pub fn decode_ip_packets(ip: &[u8]) -> Vec<Decoded> {
    let Some(packets) = train_packets(ip) else {
        return vec![decode_ip(ip)];
    };
    let n = packets.len();
    packets
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let mut d = decode_ip(p);
            let _ = write!(d.text, " segment={}/{n}", k + 1);
            d
        })
        .collect()
}

/// The packets of `ip`, rebuilt as they are on the wire, if it is a GSO train to the RoCEv2
/// port.
fn train_packets(ip: &[u8]) -> Option<Vec<Vec<u8>>> {
    let d = wire::Datagram::parse(ip).ok()?;
    if d.dst.port() != wire::ROCEV2_UDP_PORT {
        return None;
    }
    wire::train::cut(ip)
}

fn not_ip(why: &NotIp) -> Decoded {
    Decoded {
        text: format!("not RoCEv2: {why}"),
        verdict: Verdict::NotRoce,
    }
}

/// Decodes one IP packet (IPv4 or IPv6, starting at the IP header).
pub fn decode_ip(ip: &[u8]) -> Decoded {
    let Some(sum) = ip_summary(ip) else {
        // Too short to show addresses: let the codec say precisely what is wrong.
        let err = match RoceV2Packet::parse(ip) {
            Err(e) => e,
            Ok(_) => WireError::Truncated {
                header: wire::HeaderKind::Ipv4,
                needed: 20,
                available: ip.len(),
            },
        };
        return Decoded {
            text: format!("malformed IP packet: {err}"),
            verdict: Verdict::NotRoce,
        };
    };
    // Ethernet pads short frames to 60 bytes: trust the IP length when the capture holds more.
    let ip = if sum.total_len >= sum.l4 && sum.total_len < ip.len() {
        &ip[..sum.total_len]
    } else {
        ip
    };
    let ports = ip.get(sum.l4..sum.l4 + 4).map(|p| {
        (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        )
    });
    let has_ports = matches!(sum.protocol, PROTO_TCP | PROTO_UDP);
    let addrs = match (has_ports, ports) {
        (true, Some((sp, dp))) => {
            format!("{} {}.{} > {}.{}: ", sum.family, sum.src, sp, sum.dst, dp)
        }
        _ => format!("{} {} > {}: ", sum.family, sum.src, sum.dst),
    };
    let is_roce_port =
        sum.protocol == PROTO_UDP && matches!(ports, Some((_, dp)) if dp == wire::ROCEV2_UDP_PORT);
    if !is_roce_port {
        let what = match (sum.protocol, ports) {
            (PROTO_UDP, Some(_)) => "UDP (not to port 4791)".to_owned(),
            (p, _) => protocol_name(p),
        };
        let payload = ip.len().saturating_sub(sum.l4);
        return Decoded {
            text: format!("{addrs}not RoCEv2: {what}, {payload} bytes after the IP header"),
            verdict: Verdict::NotRoce,
        };
    }
    match RoceV2Packet::parse(ip) {
        Ok(pkt) => {
            let mut text = addrs;
            format_roce(&mut text, &pkt, ip);
            let verdict = if pkt.icrc_ok {
                Verdict::RoceOk
            } else {
                Verdict::RoceBadIcrc
            };
            Decoded { text, verdict }
        }
        Err(e) => Decoded {
            text: format!("{addrs}malformed RoCEv2: {e}"),
            verdict: Verdict::Malformed(e),
        },
    }
}

fn format_syndrome(out: &mut String, s: Syndrome) {
    // `write!` into a String cannot fail.
    let _ = match s {
        Syndrome::Ack { credits } => write!(out, " aeth=ACK credits={credits}"),
        Syndrome::RnrNak { timer } => write!(out, " aeth=RNR_NAK timer={timer}"),
        Syndrome::Nak(code) => write!(out, " aeth=NAK code={}", nak_name(code)),
    };
}

fn nak_name(code: wire::NakCode) -> &'static str {
    use wire::NakCode as N;
    match code {
        N::PsnSequenceError => "psn_sequence_error",
        N::InvalidRequest => "invalid_request",
        N::RemoteAccessError => "remote_access_error",
        N::RemoteOperationalError => "remote_operational_error",
        N::InvalidRdRequest => "invalid_rd_request",
    }
}

/// Appends the transport fields of a parsed packet to `out`.
fn format_roce(out: &mut String, pkt: &RoceV2Packet<'_>, ip: &[u8]) {
    let t: &TransportRepr = &pkt.transport;
    let bth = &t.bth;
    let op = bth.opcode;
    // `write!` into a String cannot fail.
    let _ = write!(
        out,
        "{} ({:#04x}) qpn={:#08x} psn={} ack_req={}",
        op.name(),
        op.code(),
        bth.dest_qp.value(),
        bth.psn.value(),
        u8::from(bth.ack_req)
    );
    if bth.solicited {
        out.push_str(" se=1");
    }
    if bth.mig_req {
        out.push_str(" mig=1");
    }
    if bth.pad_count != 0 {
        let _ = write!(out, " pad={}", bth.pad_count);
    }
    if bth.fecn {
        out.push_str(" fecn=1");
    }
    if bth.becn {
        out.push_str(" becn=1");
    }
    if bth.pkey != 0xffff {
        let _ = write!(out, " pkey={:#06x}", bth.pkey);
    }
    if let Some(d) = &t.deth {
        let _ = write!(
            out,
            " qkey={:#010x} src_qp={:#08x}",
            d.qkey.value(),
            d.src_qp.value()
        );
    }
    if let Some(r) = &t.reth {
        let _ = write!(
            out,
            " va={:#018x} rkey={:#010x} dma_len={}",
            r.va,
            r.rkey.value(),
            r.dma_len
        );
    }
    if let Some(a) = &t.atomic_eth {
        let operand = if op.kind() == OpKind::FetchAdd {
            "add"
        } else {
            "swap"
        };
        let _ = write!(
            out,
            " va={:#018x} rkey={:#010x} {operand}={:#018x} compare={:#018x}",
            a.va,
            a.rkey.value(),
            a.swap_add,
            a.compare
        );
    }
    if let Some(a) = &t.aeth {
        let _ = write!(out, " syndrome={:#04x}", a.syndrome.to_u8());
        format_syndrome(out, a.syndrome);
        let _ = write!(out, " msn={}", a.msn.value());
    }
    if let Some(a) = &t.atomic_ack_eth {
        let _ = write!(out, " orig={:#018x}", a.orig);
    }
    if let Some(imm) = t.immdt {
        let _ = write!(out, " imm={imm:#010x}");
    }
    if let Some(rkey) = t.ieth {
        let _ = write!(out, " inv_rkey={:#010x}", rkey.value());
    }
    let _ = write!(out, " payload={}", pkt.payload.len());
    if pkt.icrc_ok {
        out.push_str(" icrc=ok");
    } else {
        let computed = ip
            .len()
            .checked_sub(4)
            .and_then(|n| wire::icrc::compute(&ip[..n]).ok());
        let _ = match computed {
            Some(c) => write!(
                out,
                " icrc=BAD (carried {:#010x}, computed {c:#010x})",
                pkt.icrc
            ),
            None => write!(out, " icrc=BAD (carried {:#010x})", pkt.icrc),
        };
    }
}
