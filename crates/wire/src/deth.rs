//! Datagram Extended Transport Header (IBA 9.3.2): the Q_Key and source QP of a UD packet.

use crate::bytes::{check_len, set_u24, set_u32, u24_at, u32_at};
use crate::error::{HeaderKind, WireError};
use crate::types::{Qkey, Qpn};

/// DETH length.
pub const DETH_LEN: usize = 8;

mod field {
    pub const QKEY: usize = 0;
    pub const RESERVED: usize = 4;
    pub const SRC_QP: usize = 5;
}

/// A zero-copy view of a DETH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Deth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Deth<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 8 bytes.
    pub const fn new_unchecked(buf: T) -> Deth<T> {
        Deth { buf }
    }

    /// Wrap a buffer that holds at least 8 bytes.
    pub fn new_checked(buf: T) -> Result<Deth<T>, WireError> {
        check_len(buf.as_ref().len(), DETH_LEN, HeaderKind::Deth)?;
        Ok(Deth { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// Queue key.
    pub fn qkey(&self) -> Qkey {
        Qkey(u32_at(self.buf.as_ref(), field::QKEY))
    }

    /// Source QP of the sender.
    pub fn src_qp(&self) -> Qpn {
        Qpn::new(u24_at(self.buf.as_ref(), field::SRC_QP))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Deth<T> {
    /// Set the queue key.
    pub fn set_qkey(&mut self, k: Qkey) {
        set_u32(self.buf.as_mut(), field::QKEY, k.0);
    }

    /// Set the source QP (and clear the reserved byte).
    pub fn set_src_qp(&mut self, q: Qpn) {
        self.buf.as_mut()[field::RESERVED] = 0;
        set_u24(self.buf.as_mut(), field::SRC_QP, q.value());
    }
}

/// The fields of a DETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DethRepr {
    /// Queue key the receiver checks.
    pub qkey: Qkey,
    /// Source QP of the sender.
    pub src_qp: Qpn,
}

impl DethRepr {
    /// Header length in bytes.
    pub const LEN: usize = DETH_LEN;

    /// Read the fields (the reserved byte is ignored).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Deth<&T>) -> Result<DethRepr, WireError> {
        Ok(DethRepr {
            qkey: p.qkey(),
            src_qp: p.src_qp(),
        })
    }

    /// Bytes of header this Repr emits.
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }

    /// Write the fields.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Deth<&mut T>) {
        p.set_qkey(self.qkey);
        p.set_src_qp(self.src_qp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_round_trip() {
        let r = DethRepr {
            qkey: Qkey(0x1111_1111),
            src_qp: Qpn::new(0x12),
        };
        let mut b = [0xffu8; 8];
        r.emit(&mut Deth::new_unchecked(&mut b[..]));
        assert_eq!(b, [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x12]);
        assert_eq!(DethRepr::parse(&Deth::new_checked(&b[..]).unwrap()), Ok(r));
        assert!(Deth::new_checked(&b[..7]).is_err());
    }
}
