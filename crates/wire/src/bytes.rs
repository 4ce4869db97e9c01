//! Big-endian field access at fixed offsets. Callers have checked the buffer length first
//! (the views' `new_checked`), so these index directly.

#[inline]
pub(crate) fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn u24_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

#[inline]
pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

#[inline]
pub(crate) fn set_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

#[inline]
pub(crate) fn set_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn set_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// A bit field of a big-endian structure, located the way IBA's tables locate fields: the
/// byte it starts in, how many bits after that byte's most significant bit it starts, and
/// its width. It may span up to 8 bytes (so a 64-bit field must start on a byte boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bits {
    pub byte: usize,
    pub bit: u32,
    pub width: u32,
}

impl Bits {
    /// A field starting at the most significant bit of `byte`.
    pub const fn at(byte: usize, width: u32) -> Bits {
        Bits {
            byte,
            bit: 0,
            width,
        }
    }

    /// A field starting `bit` bits into `byte`.
    pub const fn within(byte: usize, bit: u32, width: u32) -> Bits {
        Bits { byte, bit, width }
    }

    /// The same field `by` bytes further on (for structures repeated at two offsets).
    pub const fn shifted(self, by: usize) -> Bits {
        Bits {
            byte: self.byte + by,
            ..self
        }
    }

    /// Bytes the field touches.
    const fn span(self) -> usize {
        (self.bit + self.width).div_ceil(8) as usize
    }

    /// One past the last byte the field touches.
    pub const fn end(self) -> usize {
        self.byte + self.span()
    }

    const fn mask(self) -> u64 {
        if self.width >= 64 {
            u64::MAX
        } else {
            (1u64 << self.width) - 1
        }
    }

    const fn shift(self) -> u32 {
        self.span() as u32 * 8 - self.bit - self.width
    }
}

/// Read a bit field; the caller has checked that `b` reaches `f.end()`.
#[inline]
pub(crate) fn bits_at(b: &[u8], f: Bits) -> u64 {
    let mut v = 0u64;
    for &x in &b[f.byte..f.end()] {
        v = v << 8 | u64::from(x);
    }
    (v >> f.shift()) & f.mask()
}

/// Write a bit field, leaving the other bits of the bytes it shares untouched; bits of `v`
/// above the field's width are dropped.
#[inline]
pub(crate) fn set_bits(b: &mut [u8], f: Bits, v: u64) {
    let (shift, mask) = (f.shift(), f.mask());
    let bytes = &mut b[f.byte..f.end()];
    let n = bytes.len();
    for (i, x) in bytes.iter_mut().enumerate() {
        let at = 8 * (n - 1 - i) as u32;
        // the field's bits that land in this byte, as a byte-wide mask and value
        let m = ((mask << shift) >> at) as u8;
        let bitsv = (((v & mask) << shift) >> at) as u8;
        *x = (*x & !m) | (bitsv & m);
    }
}

/// Length check shared by every view's `new_checked`.
#[inline]
pub(crate) fn check_len(
    have: usize,
    need: usize,
    header: crate::error::HeaderKind,
) -> Result<(), crate::error::WireError> {
    if have < need {
        Err(crate::error::WireError::Truncated {
            header,
            needed: need,
            available: have,
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_endian_round_trip() {
        let mut b = [0u8; 12];
        set_u16(&mut b, 0, 0x1234);
        set_u24(&mut b, 2, 0xab_cdef);
        set_u32(&mut b, 5, 0xdead_beef);
        assert_eq!(
            b[..9],
            [0x12, 0x34, 0xab, 0xcd, 0xef, 0xde, 0xad, 0xbe, 0xef]
        );
        assert_eq!(u16_at(&b, 0), 0x1234);
        assert_eq!(u24_at(&b, 2), 0xab_cdef);
        assert_eq!(u32_at(&b, 5), 0xdead_beef);
        set_u64(&mut b, 4, 0x0102_0304_0506_0708);
        assert_eq!(u64_at(&b, 4), 0x0102_0304_0506_0708);
    }

    #[test]
    fn bit_fields_land_where_iba_tables_put_them() {
        let mut b = [0u8; 10];
        // five bits at the top of byte 1, then two, then one (the REQ's byte 43 shape)
        set_bits(&mut b, Bits::at(1, 5), 0x14);
        set_bits(&mut b, Bits::within(1, 5, 2), 0b01);
        set_bits(&mut b, Bits::within(1, 7, 1), 1);
        assert_eq!(b[1], 0b1010_0011);
        // a 20-bit flow label spanning three bytes, then 6 bits after a 6-bit gap
        set_bits(&mut b, Bits::at(2, 20), 0xabcde);
        set_bits(&mut b, Bits::within(4, 6, 6), 0x3f);
        assert_eq!(b[2..5], [0xab, 0xcd, 0xe0 | 0x03]);
        assert_eq!(b[5], 0xf0);
        assert_eq!(bits_at(&b, Bits::at(2, 20)), 0xabcde);
        assert_eq!(bits_at(&b, Bits::within(4, 6, 6)), 0x3f);
        assert_eq!(bits_at(&b, Bits::at(1, 5)), 0x14);
        // a whole 64-bit field, and a value wider than its field is cut to it
        set_bits(&mut b, Bits::at(2, 64), 0x0102_0304_0506_0708);
        assert_eq!(bits_at(&b, Bits::at(2, 64)), 0x0102_0304_0506_0708);
        set_bits(&mut b, Bits::at(0, 4), 0xff);
        assert_eq!(b[0], 0xf0);
    }
}
