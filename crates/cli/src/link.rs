//! Link layers: from a captured frame to the IP packet it carries.

/// LINKTYPE_NULL: BSD loopback, a 4-byte address family in the capturing host's byte order.
pub const LINKTYPE_NULL: u32 = 0;
/// LINKTYPE_ETHERNET: Ethernet II (with optional 802.1Q / 802.1ad tags).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// LINKTYPE_RAW: a bare IPv4 or IPv6 packet.
pub const LINKTYPE_RAW: u32 = 101;
/// DLT 12: raw IP as some BSDs number it.
pub const LINKTYPE_RAW_DLT12: u32 = 12;
/// DLT 14: raw IP as OpenBSD numbers it.
pub const LINKTYPE_RAW_DLT14: u32 = 14;
/// LINKTYPE_LOOP: OpenBSD loopback, a 4-byte address family in network byte order.
pub const LINKTYPE_LOOP: u32 = 108;
/// LINKTYPE_LINUX_SLL: Linux "cooked" capture, version 1 (16-byte header).
pub const LINKTYPE_LINUX_SLL: u32 = 113;
/// LINKTYPE_IPV4: a bare IPv4 packet.
pub const LINKTYPE_IPV4: u32 = 228;
/// LINKTYPE_IPV6: a bare IPv6 packet.
pub const LINKTYPE_IPV6: u32 = 229;
/// LINKTYPE_LINUX_SLL2: Linux "cooked" capture, version 2 (20-byte header).
pub const LINKTYPE_LINUX_SLL2: u32 = 276;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_ARP: u16 = 0x0806;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;
/// RoCE v1: the IB GRH directly over Ethernet.
const ETHERTYPE_ROCE_V1: u16 = 0x8915;

/// What a frame carries once its link-layer header is removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network<'a> {
    /// An IPv4 or IPv6 packet (the version nibble tells which).
    Ip(&'a [u8]),
    /// Something that is not IP; the text says what it is.
    Other(NotIp),
}

/// A frame that does not carry IP, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotIp {
    /// A non-IP ethertype (or SLL protocol), e.g. ARP or RoCE v1.
    Ethertype(u16),
    /// The frame is shorter than its link-layer header.
    TruncatedLink {
        /// Which link header.
        link: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes present.
        available: usize,
    },
    /// A loopback address family other than IPv4 / IPv6.
    AddressFamily(u32),
    /// A link type this tool does not decode.
    UnsupportedLinktype(u32),
}

impl core::fmt::Display for NotIp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            NotIp::Ethertype(ETHERTYPE_ARP) => write!(f, "ARP"),
            NotIp::Ethertype(ETHERTYPE_ROCE_V1) => write!(f, "RoCE v1 (ethertype 0x8915)"),
            NotIp::Ethertype(t) => write!(f, "ethertype {t:#06x}"),
            NotIp::TruncatedLink {
                link,
                needed,
                available,
            } => {
                write!(
                    f,
                    "truncated {link} header: need {needed} bytes, have {available}"
                )
            }
            NotIp::AddressFamily(af) => write!(f, "loopback address family {af}"),
            NotIp::UnsupportedLinktype(lt) => write!(f, "unsupported link type {lt}"),
        }
    }
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn need(link: &'static str, frame: &[u8], needed: usize) -> Result<(), NotIp> {
    if frame.len() < needed {
        Err(NotIp::TruncatedLink {
            link,
            needed,
            available: frame.len(),
        })
    } else {
        Ok(())
    }
}

fn by_ethertype(ethertype: u16, rest: &[u8]) -> Network<'_> {
    match ethertype {
        ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => Network::Ip(rest),
        other => Network::Other(NotIp::Ethertype(other)),
    }
}

fn ethernet(frame: &[u8]) -> Result<Network<'_>, NotIp> {
    need("Ethernet", frame, 14)?;
    let mut ethertype = be16(frame, 12);
    let mut at = 14;
    // Up to two VLAN tags (802.1ad outer, 802.1Q inner).
    for _ in 0..2 {
        if ethertype != ETHERTYPE_VLAN && ethertype != ETHERTYPE_QINQ {
            break;
        }
        need("802.1Q", frame, at + 4)?;
        ethertype = be16(frame, at + 2);
        at += 4;
    }
    Ok(by_ethertype(ethertype, &frame[at..]))
}

fn loopback(frame: &[u8], big_endian: bool) -> Result<Network<'_>, NotIp> {
    need("loopback", frame, 4)?;
    let raw = [frame[0], frame[1], frame[2], frame[3]];
    let af = if big_endian {
        u32::from_be_bytes(raw)
    } else {
        u32::from_le_bytes(raw)
    };
    // The capturing host's byte order is unknown for LINKTYPE_NULL: accept both encodings of
    // AF_INET (2) and the AF_INET6 values of the BSDs and Linux (10, 24, 28, 30).
    let af_swapped = af.swap_bytes();
    let is_ip = |v: u32| matches!(v, 2 | 10 | 24 | 28 | 30);
    if is_ip(af) || is_ip(af_swapped) {
        Ok(Network::Ip(&frame[4..]))
    } else {
        Err(NotIp::AddressFamily(af))
    }
}

/// Strips the link-layer header of a frame captured with link type `linktype`.
pub fn strip(linktype: u32, frame: &[u8]) -> Network<'_> {
    let res = match linktype {
        LINKTYPE_ETHERNET => ethernet(frame),
        LINKTYPE_RAW | LINKTYPE_RAW_DLT12 | LINKTYPE_RAW_DLT14 | LINKTYPE_IPV4 | LINKTYPE_IPV6 => {
            Ok(Network::Ip(frame))
        }
        LINKTYPE_LINUX_SLL => {
            need("Linux SLL", frame, 16).map(|()| by_ethertype(be16(frame, 14), &frame[16..]))
        }
        LINKTYPE_LINUX_SLL2 => {
            need("Linux SLL2", frame, 20).map(|()| by_ethertype(be16(frame, 0), &frame[20..]))
        }
        LINKTYPE_NULL => loopback(frame, false),
        LINKTYPE_LOOP => loopback(frame, true),
        other => Err(NotIp::UnsupportedLinktype(other)),
    };
    res.unwrap_or_else(Network::Other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ethernet_with_a_vlan_tag_yields_the_ip_packet() {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05, 0x08, 0x00, 0x45, 0x00]);
        assert_eq!(strip(LINKTYPE_ETHERNET, &f), Network::Ip(&[0x45, 0x00]));
    }

    #[test]
    fn short_frames_and_foreign_protocols_are_named() {
        assert_eq!(
            strip(LINKTYPE_LINUX_SLL2, &[0; 7]),
            Network::Other(NotIp::TruncatedLink {
                link: "Linux SLL2",
                needed: 20,
                available: 7
            })
        );
        let mut sll = vec![0u8; 14];
        sll.extend_from_slice(&[0x08, 0x06]);
        assert_eq!(
            strip(LINKTYPE_LINUX_SLL, &sll),
            Network::Other(NotIp::Ethertype(0x0806))
        );
        assert_eq!(
            strip(LINKTYPE_LINUX_SLL, &sll).to_owned(),
            Network::Other(NotIp::Ethertype(ETHERTYPE_ARP))
        );
        assert_eq!(
            strip(147, &[1, 2]),
            Network::Other(NotIp::UnsupportedLinktype(147))
        );
        assert_eq!(NotIp::Ethertype(0x0806).to_string(), "ARP");
    }

    #[test]
    fn loopback_accepts_either_byte_order() {
        assert_eq!(
            strip(LINKTYPE_NULL, &[2, 0, 0, 0, 0x45]),
            Network::Ip(&[0x45])
        );
        assert_eq!(
            strip(LINKTYPE_NULL, &[0, 0, 0, 30, 0x60]),
            Network::Ip(&[0x60])
        );
        assert_eq!(
            strip(LINKTYPE_LOOP, &[0, 0, 0, 9]),
            Network::Other(NotIp::AddressFamily(9))
        );
    }
}
