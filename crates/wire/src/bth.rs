//! Base Transport Header (IBA 9.2): 12 bytes that start every RoCEv2 transport packet.
//!
//! ```text
//!  byte 0      1                 2..3    4                5..7     8            9..11
//!  OpCode | SE M Pad(2) TVer(4) | P_Key | FECN BECN resv6 | DestQP | AckReq resv7 | PSN
//! ```

use crate::bytes::{check_len, set_u16, set_u24, u16_at, u24_at};
use crate::error::{HeaderKind, WireError};
use crate::opcode::Opcode;
use crate::types::{Psn, Qpn};

/// BTH length.
pub const BTH_LEN: usize = 12;
/// The default partition key (full membership of the default partition).
pub const DEFAULT_PKEY: u16 = 0xffff;

mod field {
    pub const OPCODE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const PKEY: usize = 2;
    pub const FECN_BECN: usize = 4;
    pub const DEST_QP: usize = 5;
    pub const ACK_REQ: usize = 8;
    pub const PSN: usize = 9;
}

/// A zero-copy view of a BTH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Bth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Bth<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 12 bytes.
    #[inline]
    pub const fn new_unchecked(buf: T) -> Bth<T> {
        Bth { buf }
    }

    /// Wrap a buffer that holds at least 12 bytes.
    #[inline]
    pub fn new_checked(buf: T) -> Result<Bth<T>, WireError> {
        check_len(buf.as_ref().len(), BTH_LEN, HeaderKind::Bth)?;
        Ok(Bth { buf })
    }

    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// The opcode byte as stored.
    #[inline]
    pub fn opcode_raw(&self) -> u8 {
        self.buf.as_ref()[field::OPCODE]
    }

    /// The opcode, or why the byte is not one.
    #[inline]
    pub fn opcode(&self) -> Result<Opcode, WireError> {
        Opcode::from_u8(self.opcode_raw())
    }

    #[inline]
    fn flags(&self) -> u8 {
        self.buf.as_ref()[field::FLAGS]
    }

    /// Solicited event: the receiver should raise a completion event.
    #[inline]
    pub fn solicited(&self) -> bool {
        self.flags() & 0x80 != 0
    }

    /// Migration request (automatic path migration state).
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.flags() & 0x40 != 0
    }

    /// Pad count: bytes (0..=3) added after the payload to align it to 4 bytes.
    #[inline]
    pub fn pad_count(&self) -> u8 {
        (self.flags() >> 4) & 3
    }

    /// Transport header version (0).
    #[inline]
    pub fn tver(&self) -> u8 {
        self.flags() & 0x0f
    }

    /// Partition key.
    #[inline]
    pub fn pkey(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::PKEY)
    }

    /// Forward explicit congestion notification.
    #[inline]
    pub fn fecn(&self) -> bool {
        self.buf.as_ref()[field::FECN_BECN] & 0x80 != 0
    }

    /// Backward explicit congestion notification.
    #[inline]
    pub fn becn(&self) -> bool {
        self.buf.as_ref()[field::FECN_BECN] & 0x40 != 0
    }

    /// Destination queue pair.
    #[inline]
    pub fn dest_qp(&self) -> Qpn {
        Qpn::new(u24_at(self.buf.as_ref(), field::DEST_QP))
    }

    /// Acknowledge request: the responder should ACK this packet.
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.buf.as_ref()[field::ACK_REQ] & 0x80 != 0
    }

    /// Packet sequence number.
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(u24_at(self.buf.as_ref(), field::PSN))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bth<T> {
    /// Set the opcode.
    #[inline]
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buf.as_mut()[field::OPCODE] = op.code();
    }

    /// Set SE, M, pad count (low two bits used) and TVer (low four bits used).
    #[inline]
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad_count: u8, tver: u8) {
        self.buf.as_mut()[field::FLAGS] = (u8::from(solicited) << 7)
            | (u8::from(mig_req) << 6)
            | ((pad_count & 3) << 4)
            | (tver & 0x0f);
    }

    /// Set only the pad count, keeping the other bits of its byte.
    #[inline]
    pub fn set_pad_count(&mut self, pad_count: u8) {
        let b = &mut self.buf.as_mut()[field::FLAGS];
        *b = (*b & !0x30) | ((pad_count & 3) << 4);
    }

    /// Set the partition key.
    #[inline]
    pub fn set_pkey(&mut self, v: u16) {
        set_u16(self.buf.as_mut(), field::PKEY, v);
    }

    /// Set FECN and BECN (the six reserved bits of the byte are cleared).
    #[inline]
    pub fn set_fecn_becn(&mut self, fecn: bool, becn: bool) {
        self.buf.as_mut()[field::FECN_BECN] = (u8::from(fecn) << 7) | (u8::from(becn) << 6);
    }

    /// Set the destination QP.
    #[inline]
    pub fn set_dest_qp(&mut self, q: Qpn) {
        set_u24(self.buf.as_mut(), field::DEST_QP, q.value());
    }

    /// Set the AckReq bit (the seven reserved bits of the byte are cleared).
    #[inline]
    pub fn set_ack_req(&mut self, v: bool) {
        self.buf.as_mut()[field::ACK_REQ] = u8::from(v) << 7;
    }

    /// Set the PSN.
    #[inline]
    pub fn set_psn(&mut self, p: Psn) {
        set_u24(self.buf.as_mut(), field::PSN, p.value());
    }
}

/// The fields of a BTH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Operation, transport and packet position.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad count 0..=3 (the packet emitter computes it from the payload length).
    pub pad_count: u8,
    /// Transport header version; must be 0.
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward ECN (masked out of the ICRC with the rest of byte 4).
    pub fecn: bool,
    /// Backward ECN (masked out of the ICRC with the rest of byte 4).
    pub becn: bool,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// Header length in bytes.
    pub const LEN: usize = BTH_LEN;

    /// A BTH with the given opcode, destination and PSN, and everything else at its usual
    /// value (default P_Key 0xffff, no flags, TVer 0).
    #[inline]
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Parse a BTH: the opcode must be one softrdma knows and TVer must be 0. Reserved bits
    /// are ignored, as IBA requires of receivers.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Bth<&T>) -> Result<BthRepr, WireError> {
        let opcode = p.opcode()?;
        if p.tver() != 0 {
            return Err(WireError::BadTver { tver: p.tver() });
        }
        Ok(BthRepr {
            opcode,
            solicited: p.solicited(),
            mig_req: p.mig_req(),
            pad_count: p.pad_count(),
            tver: p.tver(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            psn: p.psn(),
        })
    }

    /// Bytes of header this Repr emits.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Write the header; reserved bits are written as zero.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Bth<&mut T>) {
        p.set_opcode(self.opcode);
        p.set_flags(self.solicited, self.mig_req, self.pad_count, self.tver);
        p.set_pkey(self.pkey);
        p.set_fecn_becn(self.fecn, self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_layout() {
        let r = BthRepr {
            opcode: Opcode::RcSendLast,
            solicited: true,
            mig_req: true,
            pad_count: 2,
            tver: 0,
            pkey: 0xffff,
            fecn: true,
            becn: false,
            dest_qp: Qpn::new(0x11),
            ack_req: true,
            psn: Psn::new(0xab_cdef),
        };
        let mut b = [0u8; 12];
        r.emit(&mut Bth::new_unchecked(&mut b[..]));
        assert_eq!(
            b,
            [0x02, 0xe0, 0xff, 0xff, 0x80, 0, 0, 0x11, 0x80, 0xab, 0xcd, 0xef]
        );
        assert_eq!(BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()), Ok(r));
    }

    #[test]
    fn errors() {
        assert_eq!(
            Bth::new_checked(&[0u8; 11][..]).unwrap_err(),
            WireError::Truncated {
                header: HeaderKind::Bth,
                needed: 12,
                available: 11
            }
        );
        let mut b = [0u8; 12];
        b[1] = 0x01;
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()),
            Err(WireError::BadTver { tver: 1 })
        );
        b[0] = 0x15;
        assert_eq!(
            BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()),
            Err(WireError::UnknownOpcode { code: 0x15 })
        );
    }

    #[test]
    fn reserved_bits_are_ignored() {
        let mut b = [0x04, 0, 0xff, 0xff, 0x3f, 0, 0, 5, 0x7f, 0, 0, 1];
        let r = BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()).unwrap();
        assert!(!r.fecn && !r.becn && !r.ack_req);
        Bth::new_unchecked(&mut b[..]).set_pad_count(3);
        assert_eq!(b[1], 0x30);
    }
}
