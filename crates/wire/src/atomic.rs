//! Atomic Extended Transport Header (IBA 9.3.3.2: VA, R_Key, swap/add, compare) and Atomic
//! ACK Extended Transport Header (IBA 9.3.5.3: original remote data).

use crate::bytes::{check_len, set_u32, set_u64, u32_at, u64_at};
use crate::error::{HeaderKind, WireError};
use crate::types::Rkey;

/// AtomicETH length.
pub const ATOMIC_ETH_LEN: usize = 28;
/// AtomicAckETH length.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const SWAP_ADD: usize = 12;
    pub const COMPARE: usize = 20;
}

/// A zero-copy view of an AtomicETH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct AtomicEth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> AtomicEth<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 28 bytes.
    pub const fn new_unchecked(buf: T) -> AtomicEth<T> {
        AtomicEth { buf }
    }

    /// Wrap a buffer that holds at least 28 bytes.
    pub fn new_checked(buf: T) -> Result<AtomicEth<T>, WireError> {
        check_len(buf.as_ref().len(), ATOMIC_ETH_LEN, HeaderKind::AtomicEth)?;
        Ok(AtomicEth { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// Remote virtual address (8-byte aligned for a valid request).
    pub fn va(&self) -> u64 {
        u64_at(self.buf.as_ref(), field::VA)
    }

    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        Rkey(u32_at(self.buf.as_ref(), field::RKEY))
    }

    /// Swap value (COMPARE SWAP) or addend (FETCH ADD).
    pub fn swap_add(&self) -> u64 {
        u64_at(self.buf.as_ref(), field::SWAP_ADD)
    }

    /// Compare value (COMPARE SWAP; ignored by FETCH ADD).
    pub fn compare(&self) -> u64 {
        u64_at(self.buf.as_ref(), field::COMPARE)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicEth<T> {
    /// Set the virtual address.
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buf.as_mut(), field::VA, v);
    }

    /// Set the remote key.
    pub fn set_rkey(&mut self, k: Rkey) {
        set_u32(self.buf.as_mut(), field::RKEY, k.0);
    }

    /// Set the swap / add value.
    pub fn set_swap_add(&mut self, v: u64) {
        set_u64(self.buf.as_mut(), field::SWAP_ADD, v);
    }

    /// Set the compare value.
    pub fn set_compare(&mut self, v: u64) {
        set_u64(self.buf.as_mut(), field::COMPARE, v);
    }
}

/// The fields of an AtomicETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicEthRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Swap value (COMPARE SWAP) or addend (FETCH ADD).
    pub swap_add: u64,
    /// Compare value (COMPARE SWAP).
    pub compare: u64,
}

impl AtomicEthRepr {
    /// Header length in bytes.
    pub const LEN: usize = ATOMIC_ETH_LEN;

    /// Read the fields (every value is valid on the wire; alignment is the responder's check).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &AtomicEth<&T>) -> Result<AtomicEthRepr, WireError> {
        Ok(AtomicEthRepr {
            va: p.va(),
            rkey: p.rkey(),
            swap_add: p.swap_add(),
            compare: p.compare(),
        })
    }

    /// Bytes of header this Repr emits.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ETH_LEN
    }

    /// Write the fields.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut AtomicEth<&mut T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_swap_add(self.swap_add);
        p.set_compare(self.compare);
    }
}

/// A zero-copy view of an AtomicAckETH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct AtomicAckEth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> AtomicAckEth<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 8 bytes.
    pub const fn new_unchecked(buf: T) -> AtomicAckEth<T> {
        AtomicAckEth { buf }
    }

    /// Wrap a buffer that holds at least 8 bytes.
    pub fn new_checked(buf: T) -> Result<AtomicAckEth<T>, WireError> {
        check_len(
            buf.as_ref().len(),
            ATOMIC_ACK_ETH_LEN,
            HeaderKind::AtomicAckEth,
        )?;
        Ok(AtomicAckEth { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// The remote data before the atomic operation.
    pub fn orig(&self) -> u64 {
        u64_at(self.buf.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> AtomicAckEth<T> {
    /// Set the original remote data.
    pub fn set_orig(&mut self, v: u64) {
        set_u64(self.buf.as_mut(), 0, v);
    }
}

/// The fields of an AtomicAckETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AtomicAckEthRepr {
    /// The remote data before the atomic operation.
    pub orig: u64,
}

impl AtomicAckEthRepr {
    /// Header length in bytes.
    pub const LEN: usize = ATOMIC_ACK_ETH_LEN;

    /// Read the field.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        p: &AtomicAckEth<&T>,
    ) -> Result<AtomicAckEthRepr, WireError> {
        Ok(AtomicAckEthRepr { orig: p.orig() })
    }

    /// Bytes of header this Repr emits.
    pub const fn buffer_len(&self) -> usize {
        ATOMIC_ACK_ETH_LEN
    }

    /// Write the field.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut AtomicAckEth<&mut T>) {
        p.set_orig(self.orig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_eth_layout() {
        let r = AtomicEthRepr {
            va: 0x1000,
            rkey: Rkey(0xabcd),
            swap_add: 7,
            compare: u64::MAX,
        };
        let mut b = [0u8; 28];
        r.emit(&mut AtomicEth::new_unchecked(&mut b[..]));
        assert_eq!(&b[..8], &[0, 0, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(&b[8..12], &[0, 0, 0xab, 0xcd]);
        assert_eq!(&b[12..20], &[0, 0, 0, 0, 0, 0, 0, 7]);
        assert_eq!(&b[20..], &[0xff; 8]);
        assert_eq!(
            AtomicEthRepr::parse(&AtomicEth::new_checked(&b[..]).unwrap()),
            Ok(r)
        );
        assert_eq!(
            AtomicEth::new_checked(&b[..27]).unwrap_err(),
            WireError::Truncated {
                header: HeaderKind::AtomicEth,
                needed: 28,
                available: 27
            }
        );
    }

    #[test]
    fn atomic_ack_eth_layout() {
        let r = AtomicAckEthRepr {
            orig: 0x0102_0304_0506_0708,
        };
        let mut b = [0u8; 8];
        r.emit(&mut AtomicAckEth::new_unchecked(&mut b[..]));
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(
            AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&b[..]).unwrap()),
            Ok(r)
        );
        assert!(AtomicAckEth::new_checked(&b[..7]).is_err());
    }
}
