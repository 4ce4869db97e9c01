//! The RoCEv2 invariant CRC (IBTA Annex A17.3.3).
//!
//! CRC-32 (the IEEE polynomial, as zlib computes it) over: 8 bytes of 0xFF standing in for
//! the InfiniBand LRH, then the IP header with its variant fields set to all ones (IPv4:
//! TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit), the UDP header
//! with its checksum set to all ones, the BTH with byte 4 (FECN, BECN, resv6a) set to all
//! ones, then everything else up to the ICRC. The 4 ICRC bytes on the wire are the CRC
//! value in little-endian order (checked against Linux rxe captures in the tests).
//!
//! Only the first 48 (IPv4) or 64 (IPv6) bytes are copied to a stack buffer to be masked,
//! in whole 16-byte words; the rest is fed to the CRC straight from the packet. Packets of up
//! to 256 bytes are copied whole instead: one CRC call is cheaper there than two.

use crc32fast::Hasher;

use crate::bth::BTH_LEN;
use crate::error::{HeaderKind, WireError};
use crate::ipv4::IPV4_HEADER_LEN;
use crate::ipv6::IPV6_HEADER_LEN;
use crate::packet::IpRepr;
use crate::udp::{UdpRepr, UDP_HEADER_LEN};

/// Bytes of ICRC at the end of every RoCEv2 packet.
pub const ICRC_LEN: usize = 4;

/// Bitwise CRC-32 (reflected polynomial 0xEDB88320) continuing from a finished CRC value
/// `crc` (0 for a fresh start), like zlib's `crc32(crc, data)`. Const so the seed below is
/// computed at compile time; also the tests' independent reference.
pub(crate) const fn crc32_bitwise(crc: u32, data: &[u8]) -> u32 {
    let mut c = !crc;
    let mut i = 0;
    while i < data.len() {
        c ^= data[i] as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
            k += 1;
        }
        i += 1;
    }
    !c
}

/// CRC-32 of the 8 bytes of 0xFF that replace the LRH: the state every ICRC starts from.
const LRH_SEED: u32 = crc32_bitwise(0, &[0xff; 8]);

/// Bytes covered by the masked prefix: IP header + UDP header + BTH.
const V6_PREFIX: usize = IPV6_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN;

/// Byte masks (0xFF = variant field, set to all ones) over IP + UDP + BTH, 64 bytes long.
const fn masks(ipv4: bool) -> [u8; MASK_ARRAY] {
    let mut m = [0u8; MASK_ARRAY];
    let ip_len = if ipv4 {
        m[1] = 0xff; // TOS
        m[8] = 0xff; // TTL
        m[10] = 0xff; // header checksum
        m[11] = 0xff;
        IPV4_HEADER_LEN
    } else {
        m[0] = 0x0f; // traffic class (low nibble of byte 0 …)
        m[1] = 0xff; // … and high nibble of byte 1, with the flow label
        m[2] = 0xff;
        m[3] = 0xff;
        m[7] = 0xff; // hop limit
        IPV6_HEADER_LEN
    };
    m[ip_len + 6] = 0xff; // UDP checksum
    m[ip_len + 7] = 0xff;
    m[ip_len + UDP_HEADER_LEN + 4] = 0xff; // BTH resv8a (FECN, BECN, reserved)
    m
}

/// Bytes that may hold masked fields (IPv6 + UDP + BTH < 64).
const MASK_LEN: usize = 64;
/// The mask arrays: `MASK_LEN` plus 16 zero bytes of slack.
const MASK_ARRAY: usize = MASK_LEN + 16;
const V4_MASK: [u8; MASK_ARRAY] = masks(true);
const V6_MASK: [u8; MASK_ARRAY] = masks(false);

/// Packets up to this many bytes are copied whole (masked) to the stack and CRC'd in one
/// pass: cheaper than a second CRC call. Longer ones are CRC'd in two passes, the masked
/// headers from the stack and the rest straight from the packet.
const SMALL: usize = 256;

/// Mask the variant fields of a prefix (IP + UDP + BTH) in place; `ip_len` is 20 or 40.
#[cfg(test)]
fn mask_prefix(p: &mut [u8], ip_len: usize) {
    let m = if ip_len == IPV4_HEADER_LEN {
        &V4_MASK
    } else {
        &V6_MASK
    };
    for (b, m) in p.iter_mut().zip(m.iter()) {
        *b |= *m;
    }
}

/// `N` bytes of `src` from `at`, each ORed with the mask byte at the same offset (the mask is
/// zero past its 64 bytes). Byte-wise OR of whole arrays compiles to vector load, OR, store.
#[inline(always)]
fn masked_word(src: &[u8], at: usize, mask: &[u8; MASK_ARRAY]) -> [u8; 16] {
    let mut v = [0u8; 16];
    v.copy_from_slice(&src[at..at + 16]);
    if at < MASK_LEN {
        // The mask arrays carry 16 zero bytes of slack, so this window is always in bounds.
        for (b, m) in v.iter_mut().zip(mask[at..at + 16].iter()) {
            *b |= *m;
        }
    }
    v
}

/// Copy `src` (at least 16 bytes) into `dst` with the mask ORed in, using only whole 16-byte
/// stores placed so that every load the CRC kernel makes afterwards lies inside the most
/// recent store covering it: the CPU then forwards from the store instead of stalling (byte
/// stores followed by a 16-byte load would stall it). A tail shorter than 16 bytes is
/// written first as the 16-byte word ending at the end of `src`; the whole words that follow
/// overwrite its front.
#[inline(always)]
fn copy_masked(dst: &mut [u8], src: &[u8], mask: &[u8; MASK_ARRAY]) {
    let len = src.len();
    if len & 15 != 0 {
        let at = len - 16;
        dst[at..len].copy_from_slice(&masked_word(src, at, mask));
    }
    for at in (0..len - len % 16).step_by(16) {
        dst[at..at + 16].copy_from_slice(&masked_word(src, at, mask));
    }
}

/// One CRC pass over a masked copy of `pkt` (16 ..= N bytes) in an N-byte stack buffer.
#[inline(always)]
fn one_pass<const N: usize>(pkt: &[u8], mask: &[u8; MASK_ARRAY]) -> u32 {
    let mut buf = [0u8; N];
    let b = &mut buf[..pkt.len()];
    copy_masked(b, pkt, mask);
    let mut h = Hasher::new_with_initial(LRH_SEED);
    h.update(b);
    h.finalize()
}

/// The ICRC of an IP packet given without its 4 ICRC bytes.
///
/// The IP version comes from the first nibble; an IPv4 header must have no options. The
/// slice must hold at least the IP, UDP and BTH headers.
pub fn compute(ip_packet_without_icrc: &[u8]) -> Result<u32, WireError> {
    let pkt = ip_packet_without_icrc;
    let ip_len = ip_header_len(pkt)?;
    let prefix = ip_len + UDP_HEADER_LEN + BTH_LEN;
    if pkt.len() < prefix {
        let header = if pkt.len() < ip_len + UDP_HEADER_LEN {
            HeaderKind::Udp
        } else {
            HeaderKind::Bth
        };
        return Err(WireError::Truncated {
            header,
            needed: prefix,
            available: pkt.len(),
        });
    }
    Ok(compute_unchecked(pkt, ip_len))
}

/// The IP header length by version nibble (20 for IPv4 without options, 40 for IPv6).
fn ip_header_len(pkt: &[u8]) -> Result<usize, WireError> {
    let Some(&b0) = pkt.first() else {
        return Err(WireError::Truncated {
            header: HeaderKind::Ipv4,
            needed: IPV4_HEADER_LEN,
            available: 0,
        });
    };
    match b0 >> 4 {
        4 if b0 & 0x0f == 5 => Ok(IPV4_HEADER_LEN),
        4 => Err(WireError::Ipv4Options { ihl: b0 & 0x0f }),
        6 => Ok(IPV6_HEADER_LEN),
        v => Err(WireError::BadIpVersion { version: v }),
    }
}

/// ICRC of `pkt` (without ICRC) whose IP header is `ip_len` (20 or 40) bytes long and
/// which holds at least the IP, UDP and BTH headers (the caller has checked).
#[inline]
pub(crate) fn compute_unchecked(pkt: &[u8], ip_len: usize) -> u32 {
    let mask = if ip_len == IPV4_HEADER_LEN {
        &V4_MASK
    } else {
        &V6_MASK
    };
    if pkt.len() <= 128 {
        one_pass::<128>(pkt, mask)
    } else if pkt.len() <= SMALL {
        one_pass::<SMALL>(pkt, mask)
    } else {
        // The masked bytes all lie in the first 48 (IPv4) or 64 (IPv6) bytes: whole words.
        let prefix = if ip_len == IPV4_HEADER_LEN { 48 } else { 64 };
        let mut buf = [0u8; 64];
        copy_masked(&mut buf[..prefix], &pkt[..prefix], mask);
        let mut h = Hasher::new_with_initial(LRH_SEED);
        h.update(&buf[..prefix]);
        h.update(&pkt[prefix..]);
        h.finalize()
    }
}

/// Check the ICRC of a whole IP packet (ICRC included). The IP length field decides where
/// the packet ends (link-layer padding after it is ignored).
pub fn verify(ip_packet: &[u8]) -> Result<(), WireError> {
    let ip_len = ip_header_len(ip_packet)?;
    let end = ip_total_len(ip_packet, ip_len)?;
    let pkt = &ip_packet[..end];
    if pkt.len() < ip_len + UDP_HEADER_LEN + BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated {
            header: HeaderKind::Icrc,
            needed: ip_len + UDP_HEADER_LEN + BTH_LEN + ICRC_LEN,
            available: pkt.len(),
        });
    }
    let (body, tail) = pkt.split_at(pkt.len() - ICRC_LEN);
    let expected = read_icrc(tail);
    let computed = compute_unchecked(body, ip_len);
    if expected == computed {
        Ok(())
    } else {
        Err(WireError::BadIcrc { expected, computed })
    }
}

/// The IP packet length from its header (bounded by the slice).
fn ip_total_len(pkt: &[u8], ip_len: usize) -> Result<usize, WireError> {
    if pkt.len() < ip_len {
        let header = if ip_len == IPV4_HEADER_LEN {
            HeaderKind::Ipv4
        } else {
            HeaderKind::Ipv6
        };
        return Err(WireError::Truncated {
            header,
            needed: ip_len,
            available: pkt.len(),
        });
    }
    let claimed = if ip_len == IPV4_HEADER_LEN {
        usize::from(u16::from_be_bytes([pkt[2], pkt[3]]))
    } else {
        IPV6_HEADER_LEN + usize::from(u16::from_be_bytes([pkt[4], pkt[5]]))
    };
    if claimed > pkt.len() || claimed < ip_len {
        let header = if ip_len == IPV4_HEADER_LEN {
            HeaderKind::Ipv4
        } else {
            HeaderKind::Ipv6
        };
        return Err(WireError::LengthMismatch {
            header,
            claimed,
            actual: pkt.len(),
        });
    }
    Ok(claimed)
}

/// The ICRC as stored in the last 4 bytes (little-endian); `tail` must be 4 bytes.
#[inline]
pub(crate) fn read_icrc(tail: &[u8]) -> u32 {
    let mut a = [0u8; ICRC_LEN];
    a.copy_from_slice(tail);
    u32::from_le_bytes(a)
}

/// The 4 wire bytes of an ICRC value.
pub const fn icrc_bytes(icrc: u32) -> [u8; ICRC_LEN] {
    icrc.to_le_bytes()
}

/// The ICRC of a packet whose IP and UDP headers are known but not at hand as bytes: e.g. a
/// datagram read from a UDP socket, where the kernel has stripped them. `transport` is the
/// UDP payload without its last 4 bytes (the BTH onwards, without the ICRC). The IP header
/// is rebuilt from `ip` (its `payload_len` is ignored and recomputed) and the UDP header
/// from `udp` (its length is recomputed; checksum and TTL-like fields are masked anyway).
pub fn compute_with_headers(
    ip: &IpRepr,
    udp: &UdpRepr,
    transport: &[u8],
) -> Result<u32, WireError> {
    if transport.len() < BTH_LEN {
        return Err(WireError::Truncated {
            header: HeaderKind::Bth,
            needed: BTH_LEN,
            available: transport.len(),
        });
    }
    let udp_len = UDP_HEADER_LEN + transport.len() + ICRC_LEN;
    let mut hdr = [0u8; V6_PREFIX];
    let ip_len = ip.header_len();
    let max = match ip {
        IpRepr::V4(_) => crate::ipv4::Ipv4Repr::MAX_PAYLOAD,
        IpRepr::V6(_) => crate::ipv6::Ipv6Repr::MAX_PAYLOAD,
    };
    if udp_len > max {
        return Err(WireError::PayloadTooLarge {
            len: transport.len(),
            max: max - UDP_HEADER_LEN - ICRC_LEN,
        });
    }
    ip.with_payload_len(udp_len).emit(&mut hdr[..ip_len])?;
    let u = UdpRepr {
        length: udp_len as u16,
        ..*udp
    };
    u.emit(&mut crate::udp::Udp::new_unchecked(
        &mut hdr[ip_len..ip_len + UDP_HEADER_LEN],
    ));
    let prefix = ip_len + UDP_HEADER_LEN + BTH_LEN;
    hdr[ip_len + UDP_HEADER_LEN..prefix].copy_from_slice(&transport[..BTH_LEN]);
    let mask = if ip_len == IPV4_HEADER_LEN {
        &V4_MASK
    } else {
        &V6_MASK
    };
    let mut masked = [0u8; V6_PREFIX];
    copy_masked(&mut masked[..prefix], &hdr[..prefix], mask);
    let mut h = Hasher::new_with_initial(LRH_SEED);
    h.update(&masked[..prefix]);
    h.update(&transport[BTH_LEN..]);
    Ok(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitwise_crc_matches_zlib_check_value() {
        // The CRC-32 check value: crc32("123456789") = 0xCBF43926.
        assert_eq!(crc32_bitwise(0, b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
        // Continuing from a finished value equals one pass over the concatenation.
        assert_eq!(
            crc32_bitwise(crc32_bitwise(0, b"1234"), b"56789"),
            0xcbf4_3926
        );
        let mut h = Hasher::new_with_initial(crc32fast::hash(b"1234"));
        h.update(b"56789");
        assert_eq!(h.finalize(), 0xcbf4_3926);
        // rxe's comment on its seed: CRC of 8 bytes 0xff, before final inversion, is 0xdebb20e3.
        assert_eq!(!LRH_SEED, 0xdebb_20e3);
    }

    /// Reference: mask a full copy and CRC it bitwise, the slow obvious way.
    fn reference(pkt: &[u8]) -> u32 {
        let mut v = [0xffu8; 8].to_vec();
        let mut p = pkt.to_vec();
        let ip_len = if p[0] >> 4 == 4 { 20 } else { 40 };
        mask_prefix(&mut p, ip_len);
        v.extend_from_slice(&p);
        crc32_bitwise(0, &v)
    }

    #[test]
    fn fast_path_equals_reference() {
        // 40..=63 and 256/257 cross the copy-whole / two-pass boundary and the word tails.
        for len in (40..70).chain([200, 255, 256, 257, 600]) {
            let mut pkt = vec![0u8; len];
            for (i, b) in pkt.iter_mut().enumerate() {
                *b = (i * 7 + 3) as u8;
            }
            pkt[0] = 0x45;
            assert_eq!(compute(&pkt).unwrap(), reference(&pkt), "v4 len {len}");
            if len >= 60 {
                pkt[0] = 0x60;
                assert_eq!(compute(&pkt).unwrap(), reference(&pkt), "v6 len {len}");
            }
        }
        let mut pkt = [0u8; 200];
        for (i, b) in pkt.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        pkt[0] = 0x45;
        assert_eq!(compute(&pkt).unwrap(), reference(&pkt));
        pkt[0] = 0x60;
        assert_eq!(compute(&pkt).unwrap(), reference(&pkt));
    }

    #[test]
    fn masked_fields_do_not_matter_and_others_do() {
        let mut pkt = [0u8; 120];
        for (i, b) in pkt.iter_mut().enumerate() {
            *b = (i * 13 + 1) as u8;
        }
        pkt[0] = 0x45;
        let base = compute(&pkt).unwrap();
        for i in 1..pkt.len() {
            let mut q = pkt;
            q[i] ^= 0x01;
            let masked = [1, 8, 10, 11, 26, 27, 32].contains(&i);
            assert_eq!(compute(&q).unwrap() == base, masked, "byte {i}");
        }
        pkt[0] = 0x6a;
        let base = compute(&pkt).unwrap();
        for i in 0..pkt.len() {
            let mut q = pkt;
            q[i] ^= 0x01;
            let masked = [0, 1, 2, 3, 7, 46, 47, 52].contains(&i);
            assert_eq!(compute(&q).unwrap() == base, masked, "byte {i}");
        }
        // but the version nibble is covered
        let mut q = pkt;
        q[0] ^= 0x10;
        assert!(compute(&q).is_err() || compute(&q).unwrap() != base);
    }

    #[test]
    fn compute_errors() {
        assert!(matches!(compute(&[]), Err(WireError::Truncated { .. })));
        assert_eq!(compute(&[0x46; 60]), Err(WireError::Ipv4Options { ihl: 6 }));
        assert_eq!(
            compute(&[0x55; 60]),
            Err(WireError::BadIpVersion { version: 5 })
        );
        assert_eq!(
            compute(&[0x45; 39]),
            Err(WireError::Truncated {
                header: HeaderKind::Bth,
                needed: 40,
                available: 39
            })
        );
    }
}
