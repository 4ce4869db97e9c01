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
}
