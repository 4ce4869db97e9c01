//! The RoCEv2 invariant CRC (IBTA Annex A17.3.3).
//!
//! CRC-32 (the IEEE polynomial, as zlib computes it) over: 8 bytes of 0xFF standing in for
//! the InfiniBand LRH, then the IP header with its variant fields set to all ones (IPv4:
//! TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit), the UDP header
//! with its checksum set to all ones, the BTH with byte 4 (FECN, BECN, resv6a) set to all
//! ones, then everything else up to the ICRC. The 4 ICRC bytes on the wire are the CRC
//! value in little-endian order (checked against Linux rxe captures in the tests).
//!
//! The ICRC also covers the IPv4 identification, which a receiver behind a UDP socket cannot
//! see. [`recover_ipv4_ident`] (or [`ipv4_ident_for_icrc`], from a CRC already computed)
//! finds the one ID, if any, for which the carried ICRC holds, at the cost of 16 of its 32
//! bits of protection.
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
    let (body, expected, ip_len) = split_icrc(ip_packet)?;
    let computed = compute_unchecked(body, ip_len);
    if expected == computed {
        Ok(())
    } else {
        Err(WireError::BadIcrc { expected, computed })
    }
}

/// A whole IP packet cut at its IP length into the bytes the ICRC covers and the ICRC it
/// carries, with its IP header length; the packet holds at least IP, UDP and BTH headers.
fn split_icrc(ip_packet: &[u8]) -> Result<(&[u8], u32, usize), WireError> {
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
    Ok((body, read_icrc(tail), ip_len))
}

// ---------------------------------------------------------------------------------------------
// The IPv4 identification a carried ICRC holds for.
//
// A UDP socket hides the IP header, so a receiver rebuilds it, and the identification it puts
// there (0) need not be the sender's (Linux rxe counts it up). CRC-32 is linear over GF(2):
// for two messages of equal length, CRC(a) ^ CRC(b) is the CRC of a ^ b with zero initial
// value and no final XOR. Two packets differing only in their identification differ by the
// 16-bit XOR `d` of the two IDs followed by the `n` bytes after the field, and the register of
// that zero-init CRC is d(x) · x^(8n) · x^32 mod P. Multiplication by x is invertible modulo P
// (P has a constant term), so given computed ^ carried the receiver divides by x^(8n + 32)
// and finds d(x): the carried ICRC holds for exactly one ID when the quotient has degree
// below 16, and for none otherwise. The division is a multiplication by x^-(8(n+4)), looked up
// as the product of two entries of 256-entry tables (one per byte of the 16-bit exponent):
// two multiplications mod P whatever the length, and no second pass over the packet.
//
// Polynomials are in the reflected representation the CRC register uses: bit 31 holds the
// coefficient of x^0 and bit 0 that of x^31.

/// The CRC-32 polynomial without its x^32 term, reflected (as the CRC register holds it).
const POLY: u32 = 0xedb8_8320;
/// The polynomial 1 (x^0), reflected.
const ONE: u32 = 1 << 31;

/// `a · x mod P`: one step of the CRC register (without a branch: the x^31 coefficient
/// becomes a mask).
const fn times_x(a: u32) -> u32 {
    (a >> 1) ^ (POLY & (a & 1).wrapping_neg())
}

/// `a · x^-1 mod P`, undoing [`times_x`]: it shifted out the x^31 coefficient and, when that
/// was set, added `POLY`, whose x^0 bit is set; so the x^0 bit of its result tells which.
const fn div_x(a: u32) -> u32 {
    if a & ONE != 0 {
        ((a ^ POLY) << 1) | 1
    } else {
        a << 1
    }
}

/// `a · b mod P`, one coefficient of `a` at a time: for the tables, at compile time.
const fn mul_mod_p(a: u32, b: u32) -> u32 {
    let mut product = 0;
    let mut b_xk = b; // b · x^k
    let mut k = 0;
    while k < 32 {
        // a's coefficient of x^k as a mask
        let coefficient = (a >> (31 - k)) & 1;
        product ^= b_xk & coefficient.wrapping_neg();
        b_xk = times_x(b_xk);
        k += 1;
    }
    product
}

/// Entry i is x^(8 · step · i) mod P (`step · i` bytes of CRC, zeros fed to the register),
/// or with `inverse` x^-(8 · step · i) mod P (undoing them).
const fn byte_shifts(step: usize, inverse: bool) -> [u32; 256] {
    let mut unit = ONE;
    let mut i = 0;
    while i < 8 * step {
        unit = if inverse { div_x(unit) } else { times_x(unit) };
        i += 1;
    }
    let mut t = [ONE; 256];
    let mut k = 1;
    while k < t.len() {
        t[k] = mul_mod_p(t[k - 1], unit);
        k += 1;
    }
    t
}

/// x^-(8i) mod P for i below 256.
const INV_BYTES_LOW: [u32; 256] = byte_shifts(1, true);
/// x^-(8 · 256 · i) mod P for i below 256.
const INV_BYTES_HIGH: [u32; 256] = byte_shifts(256, true);

/// x^(8i) mod P for i below 256.
const BYTES_LOW: [u32; 256] = byte_shifts(1, false);
/// x^(8 · 256 · i) mod P for i below 256.
const BYTES_HIGH: [u32; 256] = byte_shifts(256, false);

/// Entry i is `i · x^4 mod P` for i holding only the x^28..x^31 coefficients (a register's
/// low four bits): four steps of the CRC register at once.
const TIMES_X4: [u32; 16] = {
    let mut t = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = times_x(times_x(times_x(times_x(i as u32))));
        i += 1;
    }
    t
};

/// `a · b mod P` at run time, four coefficients of `a` at a time (Horner's rule from its
/// highest degree): eight table steps instead of 32 dependent register steps.
fn mul_mod_p_fast(a: u32, b: u32) -> u32 {
    // Entry n: b times the 4-bit polynomial n (x^0 in bit 3, as a's nibbles hold it), built
    // by doubling: each bit, from x^0 down, adds a copy of the entries so far with b · x^j.
    let mut multiples = [0u32; 16];
    let mut b_xj = b;
    let mut bit = 8;
    while bit > 0 {
        for i in (0..16).step_by(2 * bit) {
            multiples[i | bit] = multiples[i] ^ b_xj;
        }
        b_xj = times_x(b_xj);
        bit >>= 1;
    }
    let mut r = 0u32;
    // a's nibble at shift 0 holds x^28..x^31, at shift 28 x^0..x^3.
    for shift in (0..32).step_by(4) {
        r = (r >> 4) ^ TIMES_X4[(r & 0xf) as usize] ^ multiples[((a >> shift) & 0xf) as usize];
    }
    r
}

/// x^-(8n) mod P: undoing `n` bytes of CRC, for `n` below 2^16.
fn inv_byte_shift(n: u16) -> u32 {
    let [high, low] = n.to_be_bytes();
    mul_mod_p_fast(
        INV_BYTES_LOW[usize::from(low)],
        INV_BYTES_HIGH[usize::from(high)],
    )
}

/// x^(8n) mod P: `n` bytes of CRC, for `n` below 2^16.
fn byte_shift(n: u16) -> u32 {
    let [high, low] = n.to_be_bytes();
    mul_mod_p_fast(BYTES_LOW[usize::from(low)], BYTES_HIGH[usize::from(high)])
}

/// Bytes the CRC takes after the IPv4 identification of a packet of IPv4 total length
/// `ip_total_len` (ICRC included), plus 4 for the x^32 factor of the final value: the shift
/// between a change of the ID and the change it makes to the ICRC. `None` outside the
/// lengths a RoCEv2 packet can have.
fn ident_shift(ip_total_len: usize) -> Option<u16> {
    let min = IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_LEN + ICRC_LEN;
    if !(min..=usize::from(u16::MAX)).contains(&ip_total_len) {
        return None;
    }
    u16::try_from(ip_total_len - ICRC_LEN - crate::ipv4::IDENT_END + 4).ok()
}

/// The ICRC an IPv4 RoCEv2 packet of IPv4 total length `ip_total_len` (ICRC included) has
/// with identification `new` when it is `icrc` with identification `old`: the CRC is
/// linear, so a change of the ID changes it by a term that depends only on the change and
/// on how many bytes follow the ID. Two table-driven multiplications mod P, no pass over
/// the packet: what a host that sends a GSO train needs, as the kernel numbers the
/// segments' IDs (see [`crate::train`]). `None` for a length no RoCEv2 packet has.
pub fn icrc_for_ipv4_ident(icrc: u32, ip_total_len: usize, old: u16, new: u16) -> Option<u32> {
    let shift = ident_shift(ip_total_len)?;
    Some(icrc ^ mul_mod_p_fast(ident_in_register(old ^ new), byte_shift(shift)))
}

/// A difference of two IPv4 IDs as the CRC register holds it: the field's first byte (its
/// low bit first) at bits 16..24 of the reflected register, the second at 24..32; as
/// `ipv4_ident_for_icrc` reads it back.
fn ident_in_register(diff: u16) -> u32 {
    let [hi, lo] = diff.to_be_bytes();
    u32::from_le_bytes([0, 0, hi, lo])
}

/// [`icrc_for_ipv4_ident`] for a host that seals many packets of one length, the segments
/// of its GSO trains: the change that each bit of the ID makes to the ICRC depends only on
/// the packet's length, so it is worked out once per length (one multiplication mod P per
/// bit, only for the bits asked for) and each packet then costs a few XORs instead of two
/// multiplications. A packet of another length starts the table over.
#[derive(Debug, Clone, Default)]
pub struct IdentDeltas {
    /// The IPv4 total length the table is for (0: none yet).
    ip_total_len: usize,
    /// x^(8·shift) mod P for that length.
    shift: u32,
    /// Column j: the ICRC change when bit j of the ID flips, valid where `known` has bit j.
    cols: [u32; 16],
    known: u16,
}

impl IdentDeltas {
    /// An empty table: the first packet sets its length.
    pub fn new() -> IdentDeltas {
        IdentDeltas::default()
    }

    /// What [`icrc_for_ipv4_ident`] returns for the same arguments.
    pub fn icrc_for(&mut self, icrc: u32, ip_total_len: usize, old: u16, new: u16) -> Option<u32> {
        if ip_total_len != self.ip_total_len {
            self.shift = byte_shift(ident_shift(ip_total_len)?);
            self.ip_total_len = ip_total_len;
            self.known = 0;
        }
        let mut flips = old ^ new;
        let mut r = icrc;
        while flips != 0 {
            let j = flips.trailing_zeros() as usize;
            flips &= flips - 1;
            if self.known & (1 << j) == 0 {
                self.cols[j] = mul_mod_p_fast(ident_in_register(1 << j), self.shift);
                self.known |= 1 << j;
            }
            r ^= self.cols[j];
        }
        Some(r)
    }
}

/// The IPv4 identification for which an IPv4 RoCEv2 packet's ICRC would be `carried`, from the
/// ICRC `computed` over the packet as it is (showing identification `ident`) and its IPv4
/// total length, ICRC included: `Some(ident)` when the two are equal, else the one ID that
/// makes them equal, or `None` when no ID does (the packet differs elsewhere: corruption, or
/// another field the receiver could not see, such as a cleared DF flag).
///
/// For a receiver whose check just failed (`WireError::BadIcrc { expected, computed }`): no
/// second CRC pass, two table-driven multiplications mod P whatever the length (about 30 ns
/// where the checked parse takes 100 to 300 ns; the `icrc` bench measures both). `computed`
/// and `carried` may be swapped. The ICRC's 32 bits now check the packet and find the 16 bits of the ID at
/// once, so a corrupted packet yields some ID with probability about 2^-16, and CRC-32's
/// promise to catch every burst of up to 32 bits is gone: single-bit errors are still caught
/// up to 26 KiB past the ID, but e.g. 15 of the 255 corruptions of the byte at IP offset 121
/// pass for an ID change (see the tests).
pub fn ipv4_ident_for_icrc(
    ident: u16,
    ip_total_len: usize,
    computed: u32,
    carried: u32,
) -> Option<u16> {
    let shift = ident_shift(ip_total_len)?;
    let d = mul_mod_p_fast(computed ^ carried, inv_byte_shift(shift));
    // d(x) has degree below 16 when it is an ID's difference: the first byte of the field
    // (its low bit first) fills bits 16..24, the second bits 24..32.
    if d & 0xffff != 0 {
        return None;
    }
    let [_, _, hi, lo] = d.to_le_bytes();
    Some(ident ^ u16::from_be_bytes([hi, lo]))
}

/// The IPv4 identification for which the ICRC of a whole IPv4 RoCEv2 packet (IP header
/// first, ICRC included) holds, whatever ID its header shows: what a receiver behind a UDP
/// socket, which rebuilds the header without the sender's ID, needs. `None` when no ID makes
/// it hold, and for IPv6 (no ID) or bytes too short to carry an ICRC. One CRC pass; see
/// [`ipv4_ident_for_icrc`] for the form that reuses a CRC already computed, and for what
/// accepting a packet on the strength of it costs.
pub fn recover_ipv4_ident(ip_packet: &[u8]) -> Option<u16> {
    let (body, carried, ip_len) = split_icrc(ip_packet).ok()?;
    if ip_len != IPV4_HEADER_LEN {
        return None;
    }
    let computed = compute_unchecked(body, ip_len);
    let ident = crate::ipv4::Ipv4::new_unchecked(body).ident();
    ipv4_ident_for_icrc(ident, body.len() + ICRC_LEN, computed, carried)
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

    /// An RC SEND ONLY over IPv4 with identification `ident` and `payload_len` payload bytes.
    fn v4_packet(ident: u16, payload_len: usize) -> Vec<u8> {
        use crate::packet::{emit_packet, IpRepr, TransportRepr};
        let ip = IpRepr::V4(crate::ipv4::Ipv4Repr {
            src: [10, 50, 0, 11].into(),
            dst: [10, 50, 0, 12].into(),
            tos: 0,
            ident,
            dont_frag: true,
            ttl: 64,
            payload_len: 0,
        });
        let t = TransportRepr::new(crate::bth::BthRepr::new(
            crate::opcode::Opcode::RcSendOnly,
            crate::types::Qpn::new(0x11),
            crate::types::Psn::new(7),
        ));
        let payload: Vec<u8> = (0..payload_len).map(|i| (i * 31 + 7) as u8).collect();
        let mut buf = vec![0u8; payload_len + 64];
        let n = emit_packet(&ip, 0xc000, 4791, &t, &payload, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    /// Rewrite the identification of an IPv4 packet (its checksum too, as a rebuilt header has).
    fn set_ident(pkt: &mut [u8], ident: u16) {
        let mut h = crate::ipv4::Ipv4::new_unchecked(pkt);
        h.set_ident(ident);
        h.fill_checksum();
    }

    #[test]
    fn reflected_arithmetic_undoes_itself() {
        for a in [ONE, 1, 0xdead_beef, POLY, 0x0001_0000] {
            assert_eq!(div_x(times_x(a)), a);
            assert_eq!(times_x(div_x(a)), a);
            assert_eq!(mul_mod_p(a, ONE), a);
            assert_eq!(mul_mod_p(ONE, a), a);
            assert_eq!(mul_mod_p(a, 1 << 30), times_x(a)); // 1 << 30 is x
            for b in [ONE, 1, 0x1234_5678, POLY, 0xffff_ffff] {
                assert_eq!(mul_mod_p_fast(a, b), mul_mod_p(a, b), "{a:#x} · {b:#x}");
            }
        }
        // inv_byte_shift(n) undoes 8n steps of the CRC register.
        for n in [0u16, 1, 2, 255, 256, 257, 4133, 0xff00, 0xfff9] {
            let mut a = inv_byte_shift(n);
            for _ in 0..8 * usize::from(n) {
                a = times_x(a);
            }
            assert_eq!(a, ONE, "{n} bytes");
        }
    }

    #[test]
    fn exactly_one_ident_matches_and_it_is_found_from_any_other() {
        // Lengths on both sides of the one-pass / two-pass boundary of `compute_unchecked`.
        for (payload_len, real) in [(0, 0x1234), (5, 0xffff), (1100, 0x8001)] {
            let mut pkt = v4_packet(real, payload_len);
            let n = pkt.len();
            let carried = read_icrc(&pkt[n - ICRC_LEN..]);
            // Every ID the header could show: the CRC over it, and what the recovery makes
            // of it.
            let mut ident_of_icrc = std::collections::BTreeMap::new();
            for seen in 0..=u16::MAX {
                set_ident(&mut pkt, seen);
                let computed = compute(&pkt[..n - ICRC_LEN]).unwrap();
                ident_of_icrc.insert(computed, seen);
                assert_eq!(
                    ipv4_ident_for_icrc(seen, n, computed, carried),
                    Some(real),
                    "payload {payload_len}, header ID {seen:#x}"
                );
                // The two ICRCs may come in either order.
                assert_eq!(ipv4_ident_for_icrc(seen, n, carried, computed), Some(real));
            }
            // Each ID gives its own ICRC, so at most one ID matches any carried value.
            assert_eq!(ident_of_icrc.len(), 1 << 16);
            assert_eq!(ident_of_icrc.get(&carried), Some(&real));
            set_ident(&mut pkt, 0);
            assert_eq!(recover_ipv4_ident(&pkt), Some(real));
            // Carried values one bit off: found by the recovery exactly when some ID gives them.
            let computed = compute(&pkt[..n - ICRC_LEN]).unwrap();
            for bit in 0..32 {
                let off = carried ^ (1 << bit);
                assert_eq!(
                    ipv4_ident_for_icrc(0, n, computed, off),
                    ident_of_icrc.get(&off).copied(),
                    "payload {payload_len}, ICRC bit {bit}"
                );
            }
        }
    }

    #[test]
    fn every_single_bit_error_is_still_caught_in_a_4k_packet() {
        // 16 of the 32 check bits find the ID, but a single flipped bit outside the ID and the
        // masked fields still matches no ID: its syndrome would have to be an ID's, which
        // first happens 26766 bytes past the ID field (x^-j mod P of degree below 16).
        let real = 0x4d2;
        let mut pkt = v4_packet(real, 4096);
        set_ident(&mut pkt, 0);
        assert_eq!(recover_ipv4_ident(&pkt), Some(real));
        let masked = [1, 8, 10, 11, 26, 27, 32];
        let ident = 4..6;
        for i in 0..pkt.len() {
            for bit in 0..8 {
                let mut q = pkt.clone();
                q[i] ^= 1 << bit;
                let got = recover_ipv4_ident(&q);
                if masked.contains(&i) {
                    assert_eq!(got, Some(real), "byte {i}");
                } else if ident.contains(&i) {
                    let flipped = u16::from_be_bytes([q[4], q[5]]);
                    assert_eq!(got, Some(real), "byte {i}: header ID {flipped:#x}");
                } else if (2..4).contains(&i) {
                    // The total length: the packet is cut elsewhere, or not at all.
                    assert_ne!(got, Some(real), "byte {i} bit {bit}");
                } else {
                    assert_eq!(got, None, "byte {i} bit {bit}");
                }
            }
        }
    }

    #[test]
    fn single_byte_errors_escape_only_at_five_offsets_of_a_4k_packet() {
        // Whether a corruption can pass for an ID change depends only on its distance from the
        // ID field: a byte XORed with v at k bytes past the ID's last byte escapes when
        // v(x) · x^-8k mod P has degree below 16. Up to a 4 KiB payload that happens at five
        // offsets, for 21 of the ~1.06 million single-byte errors (facts of the CRC-32
        // polynomial). CRC linearity gives each error's CRC from the CRCs of its bit flips.
        let real = 0x4d2;
        let mut pkt = v4_packet(real, 4096);
        set_ident(&mut pkt, 0);
        let n = pkt.len();
        let syndrome =
            |q: &[u8]| compute(&q[..n - ICRC_LEN]).unwrap() ^ read_icrc(&q[n - ICRC_LEN..]);
        let clean = syndrome(&pkt);
        let masked = [8, 10, 11, 26, 27, 32];
        let mut escaped: Vec<(usize, Vec<u8>)> = Vec::new();
        // From the flags on: the IP length before them decides where the packet ends.
        for i in (6..n).filter(|i| !masked.contains(i)) {
            let mut flips = [0u32; 8];
            for (bit, f) in flips.iter_mut().enumerate() {
                let mut q = pkt.clone();
                q[i] ^= 1 << bit;
                *f = syndrome(&q) ^ clean;
            }
            let values: Vec<u8> = (1..=255u8)
                .filter(|v| {
                    let s = (0..8)
                        .filter(|b| (v >> b) & 1 != 0)
                        .fold(clean, |s, b| s ^ flips[b]);
                    ipv4_ident_for_icrc(0, n, s, 0).is_some()
                })
                .collect();
            if !values.is_empty() {
                escaped.push((i, values));
            }
        }
        let at: Vec<(usize, usize)> = escaped.iter().map(|(i, v)| (*i, v.len())).collect();
        assert_eq!(at, [(121, 15), (1804, 1), (2257, 3), (2564, 1), (3353, 1)]);
        // At byte 121 the escaping values are the nonzero span of 0x11, 0x22, 0x44, 0x78.
        let mut span: Vec<u8> = (1..16u8)
            .map(|c| {
                [0x11, 0x22, 0x44, 0x78]
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| (c >> k) & 1 != 0)
                    .fold(0, |a, (_, b)| a ^ b)
            })
            .collect();
        span.sort_unstable();
        assert_eq!(escaped[0].1, span);
        // Black box, for one of them: the packet passes, for a wrong ID.
        let mut q = pkt.clone();
        q[121] ^= 0x78;
        assert!(recover_ipv4_ident(&q).is_some_and(|id| id != real));
    }

    #[test]
    fn recovery_declines_what_is_not_a_whole_ipv4_packet() {
        let pkt = v4_packet(0x77, 8);
        assert_eq!(recover_ipv4_ident(&pkt), Some(0x77));
        for cut in 0..pkt.len() {
            assert_eq!(recover_ipv4_ident(&pkt[..cut]), None, "cut at {cut}");
        }
        // Link-layer padding after the IP length is ignored.
        let mut padded = pkt.clone();
        padded.extend_from_slice(&[0xaa; 6]);
        assert_eq!(recover_ipv4_ident(&padded), Some(0x77));
        let mut v6 = vec![0u8; 80];
        v6[0] = 0x60;
        v6[5] = 40;
        assert_eq!(recover_ipv4_ident(&v6), None);
        // Lengths no IPv4 packet with an ICRC can have.
        assert_eq!(ipv4_ident_for_icrc(0, 43, 1, 2), None);
        assert_eq!(ipv4_ident_for_icrc(0, 0x1_0000, 1, 2), None);
        assert_eq!(ipv4_ident_for_icrc(9, 44, 5, 5), Some(9));
        assert_eq!(ipv4_ident_for_icrc(9, 0xffff, 5, 5), Some(9));
    }

    #[test]
    fn a_new_ident_moves_the_icrc_as_a_full_pass_computes_it() {
        for len in [0, 1, 3, 200, 1000, 4096, 9000, 65_000] {
            let mut pkt = v4_packet(0, len);
            let total = pkt.len();
            let base = compute(&pkt[..total - ICRC_LEN]).unwrap();
            for (old, new) in [(0, 1), (0, 63), (1, 2), (0x1234, 0xfedc), (0xffff, 0)] {
                set_ident(&mut pkt, old);
                let from = compute(&pkt[..total - ICRC_LEN]).unwrap();
                set_ident(&mut pkt, new);
                let want = compute(&pkt[..total - ICRC_LEN]).unwrap();
                assert_eq!(
                    icrc_for_ipv4_ident(from, total, old, new),
                    Some(want),
                    "len {len}, {old} -> {new}"
                );
                // And the inverse finds the ID back.
                assert_eq!(ipv4_ident_for_icrc(old, total, from, want), Some(new));
            }
            set_ident(&mut pkt, 0);
            assert_eq!(icrc_for_ipv4_ident(base, total, 0, 0), Some(base));
        }
        assert_eq!(icrc_for_ipv4_ident(1, 43, 0, 1), None);
        assert_eq!(icrc_for_ipv4_ident(1, 0x1_0000, 0, 1), None);
    }

    #[test]
    fn a_table_of_ident_deltas_moves_the_icrc_as_the_multiplications_do() {
        let mut table = IdentDeltas::new();
        let mut seed = 0x9e37_79b9u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        // Runs of one length, as a train's segments come, and lengths that change between
        // and within them (a train's shorter last packet), each ID pair checked both ways.
        for len in [44, 45, 1000, 1052, 1052, 1052, 4140, 1052, 9000, 65_535] {
            for _ in 0..40 {
                let (icrc, old, new) = (next(), next() as u16, next() as u16);
                let want = icrc_for_ipv4_ident(icrc, len, old, new);
                assert!(want.is_some());
                assert_eq!(table.icrc_for(icrc, len, old, new), want, "len {len}");
            }
            for k in 0..64u16 {
                assert_eq!(
                    table.icrc_for(7, len, 0, k),
                    icrc_for_ipv4_ident(7, len, 0, k)
                );
            }
        }
        // No table for lengths no RoCEv2 packet has, and the next good one still works.
        assert_eq!(table.icrc_for(1, 43, 0, 1), None);
        assert_eq!(table.icrc_for(1, 0x1_0000, 0, 1), None);
        assert_eq!(
            table.icrc_for(1, 1052, 3, 9),
            icrc_for_ipv4_ident(1, 1052, 3, 9)
        );
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
