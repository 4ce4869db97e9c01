//! RDMA Extended Transport Header (IBA 9.3.3): virtual address, R_Key and DMA length of an
//! RDMA WRITE (first/only) or RDMA READ REQUEST.

use crate::bytes::{check_len, set_u32, set_u64, u32_at, u64_at};
use crate::error::{HeaderKind, WireError};
use crate::types::Rkey;

/// RETH length.
pub const RETH_LEN: usize = 16;

mod field {
    pub const VA: usize = 0;
    pub const RKEY: usize = 8;
    pub const DMA_LEN: usize = 12;
}

/// A zero-copy view of a RETH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Reth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Reth<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 16 bytes.
    pub const fn new_unchecked(buf: T) -> Reth<T> {
        Reth { buf }
    }

    /// Wrap a buffer that holds at least 16 bytes.
    pub fn new_checked(buf: T) -> Result<Reth<T>, WireError> {
        check_len(buf.as_ref().len(), RETH_LEN, HeaderKind::Reth)?;
        Ok(Reth { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        u64_at(self.buf.as_ref(), field::VA)
    }

    /// Remote key.
    pub fn rkey(&self) -> Rkey {
        Rkey(u32_at(self.buf.as_ref(), field::RKEY))
    }

    /// Length of the whole RDMA operation in bytes.
    pub fn dma_len(&self) -> u32 {
        u32_at(self.buf.as_ref(), field::DMA_LEN)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Reth<T> {
    /// Set the virtual address.
    pub fn set_va(&mut self, v: u64) {
        set_u64(self.buf.as_mut(), field::VA, v);
    }

    /// Set the remote key.
    pub fn set_rkey(&mut self, k: Rkey) {
        set_u32(self.buf.as_mut(), field::RKEY, k.0);
    }

    /// Set the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        set_u32(self.buf.as_mut(), field::DMA_LEN, v);
    }
}

/// The fields of a RETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: Rkey,
    /// Length of the whole RDMA operation in bytes.
    pub dma_len: u32,
}

impl RethRepr {
    /// Header length in bytes.
    pub const LEN: usize = RETH_LEN;

    /// Read the fields (every value is valid).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Reth<&T>) -> Result<RethRepr, WireError> {
        Ok(RethRepr {
            va: p.va(),
            rkey: p.rkey(),
            dma_len: p.dma_len(),
        })
    }

    /// Bytes of header this Repr emits.
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }

    /// Write the fields.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Reth<&mut T>) {
        p.set_va(self.va);
        p.set_rkey(self.rkey);
        p.set_dma_len(self.dma_len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_round_trip() {
        let r = RethRepr {
            va: 0x0102_0304_0506_0708,
            rkey: Rkey(0xa0b0_c0d0),
            dma_len: 4096,
        };
        let mut b = [0u8; 16];
        r.emit(&mut Reth::new_unchecked(&mut b[..]));
        assert_eq!(
            b,
            [1, 2, 3, 4, 5, 6, 7, 8, 0xa0, 0xb0, 0xc0, 0xd0, 0, 0, 0x10, 0]
        );
        assert_eq!(RethRepr::parse(&Reth::new_checked(&b[..]).unwrap()), Ok(r));
        assert_eq!(
            Reth::new_checked(&b[..15]).unwrap_err(),
            WireError::Truncated {
                header: HeaderKind::Reth,
                needed: 16,
                available: 15
            }
        );
    }
}
