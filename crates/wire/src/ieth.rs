//! Invalidate Extended Transport Header (IBA 9.3.6): the R_Key a SEND WITH INVALIDATE asks
//! the responder to invalidate.

use crate::bytes::{check_len, set_u32, u32_at};
use crate::error::{HeaderKind, WireError};
use crate::types::Rkey;

/// IETH length.
pub const IETH_LEN: usize = 4;

/// A zero-copy view of an IETH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Ieth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ieth<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 4 bytes.
    pub const fn new_unchecked(buf: T) -> Ieth<T> {
        Ieth { buf }
    }

    /// Wrap a buffer that holds at least 4 bytes.
    pub fn new_checked(buf: T) -> Result<Ieth<T>, WireError> {
        check_len(buf.as_ref().len(), IETH_LEN, HeaderKind::Ieth)?;
        Ok(Ieth { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// The R_Key to invalidate.
    pub fn rkey(&self) -> Rkey {
        Rkey(u32_at(self.buf.as_ref(), 0))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ieth<T> {
    /// Set the R_Key to invalidate.
    pub fn set_rkey(&mut self, k: Rkey) {
        set_u32(self.buf.as_mut(), 0, k.0);
    }
}

/// The IETH as a Repr (the R_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IethRepr(pub Rkey);

impl IethRepr {
    /// Header length in bytes.
    pub const LEN: usize = IETH_LEN;

    /// Read the R_Key.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Ieth<&T>) -> Result<IethRepr, WireError> {
        Ok(IethRepr(p.rkey()))
    }

    /// Bytes of header this Repr emits.
    pub const fn buffer_len(&self) -> usize {
        IETH_LEN
    }

    /// Write the R_Key.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Ieth<&mut T>) {
        p.set_rkey(self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut b = [0u8; 4];
        IethRepr(Rkey(0x0102_0304)).emit(&mut Ieth::new_unchecked(&mut b[..]));
        assert_eq!(b, [1, 2, 3, 4]);
        assert_eq!(
            IethRepr::parse(&Ieth::new_checked(&b[..]).unwrap()),
            Ok(IethRepr(Rkey(0x0102_0304)))
        );
        assert!(Ieth::new_checked(&b[..2]).is_err());
    }
}
