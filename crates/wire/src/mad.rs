//! Management datagrams (IBA 13.4): the 256-byte MADs that the general services interface
//! (QP1, the GSI) exchanges, and the 24-byte common header every MAD starts with.
//!
//! ```text
//!  byte 0         1          2             3               4..5    6..7
//!  BaseVersion | MgmtClass | ClassVersion | R Method(7) | Status | ClassSpecific
//!  8..15 TransactionID | 16..17 AttributeID | 18..19 reserved | 20..23 AttributeModifier
//! ```
//!
//! On RoCEv2 a MAD travels as the payload of a UD SEND ONLY packet to QP1 whose DETH carries
//! the GSI's well-known Q_Key ([`GSI_QKEY`]) and source QP 1 ([`gsi_transport`]); a receiver's
//! buffer holds the 40-byte GRH in front of it, as for any UD receive (IBA 11.4.1.2).

use crate::bth::BthRepr;
use crate::bytes::{check_len, set_u16, set_u32, set_u64, u16_at, u32_at, u64_at};
use crate::deth::DethRepr;
use crate::error::{HeaderKind, WireError};
use crate::opcode::Opcode;
use crate::packet::TransportRepr;
use crate::types::{Psn, Qkey, Qpn};

/// Every MAD on the GSI is exactly this long (IBA 13.4.2).
pub const MAD_LEN: usize = 256;
/// The common MAD header's length.
pub const MAD_HEADER_LEN: usize = 24;
/// The base version of every MAD this crate speaks (IBA 13.4.3: 1 for 256-byte MADs).
pub const MAD_BASE_VERSION: u8 = 1;
/// The Q_Key of QP1 (IBA 13.5.1: well-known, so every node can reach every GSI).
pub const GSI_QKEY: Qkey = Qkey(0x8001_0000);

mod field {
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: usize = 4;
    pub const CLASS_SPECIFIC: usize = 6;
    pub const TRANSACTION_ID: usize = 8;
    pub const ATTRIBUTE_ID: usize = 16;
    pub const RESERVED: usize = 18;
    pub const ATTRIBUTE_MODIFIER: usize = 20;
}

/// A MAD method byte (IBA 13.4.5): the top bit marks a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MadMethod(pub u8);

impl MadMethod {
    /// Get: read an attribute.
    pub const GET: MadMethod = MadMethod(0x01);
    /// Set: write an attribute.
    pub const SET: MadMethod = MadMethod(0x02);
    /// Send: a datagram that needs no response (every CM message, IBA 12.6).
    pub const SEND: MadMethod = MadMethod(0x03);
    /// The response to a Get or Set.
    pub const GET_RESP: MadMethod = MadMethod(0x81);

    /// True when the response bit (R) is set.
    pub const fn is_response(self) -> bool {
        self.0 & 0x80 != 0
    }
}

/// A zero-copy view of a MAD common header at the start of a buffer.
#[derive(Debug, Clone)]
pub struct MadHeader<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> MadHeader<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 24 bytes.
    pub const fn new_unchecked(buf: T) -> MadHeader<T> {
        MadHeader { buf }
    }

    /// Wrap a buffer that holds at least the 24-byte header.
    pub fn new_checked(buf: T) -> Result<MadHeader<T>, WireError> {
        check_len(buf.as_ref().len(), MAD_HEADER_LEN, HeaderKind::Mad)?;
        Ok(MadHeader { buf })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// Base version (1 for the MADs of IBA 13.4).
    pub fn base_version(&self) -> u8 {
        self.buf.as_ref()[field::BASE_VERSION]
    }

    /// Management class (0x07 for the CM).
    pub fn mgmt_class(&self) -> u8 {
        self.buf.as_ref()[field::MGMT_CLASS]
    }

    /// Version of the class's attribute formats.
    pub fn class_version(&self) -> u8 {
        self.buf.as_ref()[field::CLASS_VERSION]
    }

    /// Method, response bit included.
    pub fn method(&self) -> MadMethod {
        MadMethod(self.buf.as_ref()[field::METHOD])
    }

    /// Status (meaningful in responses).
    pub fn status(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::STATUS)
    }

    /// Class-specific word.
    pub fn class_specific(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::CLASS_SPECIFIC)
    }

    /// Transaction ID: pairs a response (or a retransmission) with its request.
    pub fn transaction_id(&self) -> u64 {
        u64_at(self.buf.as_ref(), field::TRANSACTION_ID)
    }

    /// Which attribute (for the CM: which message) the MAD carries.
    pub fn attribute_id(&self) -> u16 {
        u16_at(self.buf.as_ref(), field::ATTRIBUTE_ID)
    }

    /// Attribute modifier.
    pub fn attribute_modifier(&self) -> u32 {
        u32_at(self.buf.as_ref(), field::ATTRIBUTE_MODIFIER)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> MadHeader<T> {
    /// Write every field of the header, the reserved word as zero.
    fn write(&mut self, r: &MadHeaderRepr) {
        let b = self.buf.as_mut();
        b[field::BASE_VERSION] = r.base_version;
        b[field::MGMT_CLASS] = r.mgmt_class;
        b[field::CLASS_VERSION] = r.class_version;
        b[field::METHOD] = r.method.0;
        set_u16(b, field::STATUS, r.status);
        set_u16(b, field::CLASS_SPECIFIC, r.class_specific);
        set_u64(b, field::TRANSACTION_ID, r.transaction_id);
        set_u16(b, field::ATTRIBUTE_ID, r.attribute_id);
        set_u16(b, field::RESERVED, 0);
        set_u32(b, field::ATTRIBUTE_MODIFIER, r.attribute_modifier);
    }
}

/// The fields of a MAD common header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadHeaderRepr {
    /// Base version.
    pub base_version: u8,
    /// Management class.
    pub mgmt_class: u8,
    /// Class version.
    pub class_version: u8,
    /// Method.
    pub method: MadMethod,
    /// Status.
    pub status: u16,
    /// Class-specific word.
    pub class_specific: u16,
    /// Transaction ID.
    pub transaction_id: u64,
    /// Attribute ID.
    pub attribute_id: u16,
    /// Attribute modifier.
    pub attribute_modifier: u32,
}

impl MadHeaderRepr {
    /// Header length in bytes.
    pub const LEN: usize = MAD_HEADER_LEN;

    /// Read the fields (the reserved word is ignored). Any class and version parse here;
    /// the class's own parser (e.g. [`crate::CmMadRepr::parse`]) decides what it accepts.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &MadHeader<&T>) -> MadHeaderRepr {
        MadHeaderRepr {
            base_version: p.base_version(),
            mgmt_class: p.mgmt_class(),
            class_version: p.class_version(),
            method: p.method(),
            status: p.status(),
            class_specific: p.class_specific(),
            transaction_id: p.transaction_id(),
            attribute_id: p.attribute_id(),
            attribute_modifier: p.attribute_modifier(),
        }
    }

    /// Write the header at the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let Some(b) = buf.get_mut(..MAD_HEADER_LEN) else {
            return Err(WireError::BufferTooSmall {
                needed: MAD_HEADER_LEN,
                available: buf.len(),
            });
        };
        MadHeader::new_unchecked(b).write(self);
        Ok(())
    }
}

/// The transport headers of a MAD sent to a GSI on RoCEv2: UD SEND ONLY to `dest_qp` (1,
/// unless the peer redirected its CM) with a DETH naming QP1 and the GSI Q_Key. AckReq is
/// set, as Linux rxe sets it on the last packet of every message (UD ones included).
pub fn gsi_transport(pkey: u16, dest_qp: Qpn, psn: Psn) -> TransportRepr {
    let mut bth = BthRepr::new(Opcode::UdSendOnly, dest_qp, psn);
    bth.pkey = pkey;
    bth.ack_req = true;
    let mut t = TransportRepr::new(bth);
    t.deth = Some(DethRepr {
        qkey: GSI_QKEY,
        src_qp: Qpn::GSI,
    });
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_and_round_trip() {
        let r = MadHeaderRepr {
            base_version: 1,
            mgmt_class: 7,
            class_version: 2,
            method: MadMethod::SEND,
            status: 0x0102,
            class_specific: 0x0304,
            transaction_id: 0x0000_0002_0563_b747,
            attribute_id: 0x0010,
            attribute_modifier: 0x0a0b_0c0d,
        };
        let mut b = [0xffu8; 24];
        r.emit(&mut b).unwrap();
        assert_eq!(
            b,
            [
                1, 7, 2, 3, 1, 2, 3, 4, 0, 0, 0, 2, 5, 0x63, 0xb7, 0x47, 0, 0x10, 0, 0, 0x0a, 0x0b,
                0x0c, 0x0d
            ]
        );
        assert_eq!(
            MadHeaderRepr::parse(&MadHeader::new_checked(&b[..]).unwrap()),
            r
        );
        assert!(MadHeader::new_checked(&b[..23]).is_err());
        assert!(r.emit(&mut [0u8; 23]).is_err());
    }

    #[test]
    fn the_response_bit_is_the_top_one() {
        assert!(MadMethod::GET_RESP.is_response());
        assert!(!MadMethod::SEND.is_response());
    }

    #[test]
    fn gsi_packets_are_ud_send_only_from_qp1_with_the_gsi_qkey() {
        let t = gsi_transport(0xffff, Qpn::GSI, Psn::new(0));
        t.check().unwrap();
        assert_eq!(t.bth.opcode, Opcode::UdSendOnly);
        assert_eq!(t.deth.unwrap().qkey.0, 0x8001_0000);
        assert_eq!(t.deth.unwrap().src_qp, Qpn::GSI);
    }
}
