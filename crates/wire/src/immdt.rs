//! Immediate Data extended header (IBA 9.3.4): 4 opaque bytes delivered to the receiver's
//! completion. Read and written big-endian, i.e. the `u32` is the network-order value that
//! `ibv_wc.imm_data` / `ibv_send_wr.imm_data` hold.

use crate::bytes::{check_len, set_u32, u32_at};
use crate::error::{HeaderKind, WireError};

/// ImmDt length.
pub const IMMDT_LEN: usize = 4;

/// A zero-copy view of an ImmDt header at the start of a buffer.
#[derive(Debug, Clone)]
pub struct ImmDt<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> ImmDt<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 4 bytes.
    pub const fn new_unchecked(buf: T) -> ImmDt<T> {
        ImmDt { buf }
    }

    /// Wrap a buffer that holds at least 4 bytes.
    pub fn new_checked(buf: T) -> Result<ImmDt<T>, WireError> {
        check_len(buf.as_ref().len(), IMMDT_LEN, HeaderKind::ImmDt)?;
        Ok(ImmDt { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// The immediate value.
    pub fn imm(&self) -> u32 {
        u32_at(self.buf.as_ref(), 0)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDt<T> {
    /// Set the immediate value.
    pub fn set_imm(&mut self, v: u32) {
        set_u32(self.buf.as_mut(), 0, v);
    }
}

/// The immediate data as a Repr (a single `u32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ImmDtRepr(pub u32);

impl ImmDtRepr {
    /// Header length in bytes.
    pub const LEN: usize = IMMDT_LEN;

    /// Read the value.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &ImmDt<&T>) -> Result<ImmDtRepr, WireError> {
        Ok(ImmDtRepr(p.imm()))
    }

    /// Bytes of header this Repr emits.
    pub const fn buffer_len(&self) -> usize {
        IMMDT_LEN
    }

    /// Write the value.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut ImmDt<&mut T>) {
        p.set_imm(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut b = [0u8; 4];
        ImmDtRepr(0xdead_beef).emit(&mut ImmDt::new_unchecked(&mut b[..]));
        assert_eq!(b, [0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(
            ImmDtRepr::parse(&ImmDt::new_checked(&b[..]).unwrap()),
            Ok(ImmDtRepr(0xdead_beef))
        );
        assert!(ImmDt::new_checked(&b[..3]).is_err());
    }
}
