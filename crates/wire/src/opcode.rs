//! The BTH opcode table of IBA (chapter 9.2, table 38) for RC, UC and UD, plus the RoCEv2
//! CNP (Annex A17.9.2): which transport, which operation, which packet of a message, and
//! which extension headers follow the BTH.

use crate::error::WireError;
use crate::types::Transport;

/// The operation an opcode performs, independent of transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (with or without immediate / invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ REQUEST.
    RdmaReadRequest,
    /// RDMA READ RESPONSE.
    RdmaReadResponse,
    /// ACKNOWLEDGE (ACK, NAK, RNR NAK).
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE.
    AtomicAcknowledge,
    /// COMPARE SWAP.
    CompareSwap,
    /// FETCH ADD.
    FetchAdd,
    /// Congestion Notification Packet.
    Cnp,
}

/// Which extension headers follow the BTH, in wire order
/// DETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// RDMA Extended Transport Header (16 bytes).
    pub reth: bool,
    /// ACK Extended Transport Header (4 bytes).
    pub aeth: bool,
    /// Datagram Extended Transport Header (8 bytes).
    pub deth: bool,
    /// Immediate data (4 bytes).
    pub immdt: bool,
    /// Invalidate Extended Transport Header (4 bytes).
    pub ieth: bool,
    /// Atomic Extended Transport Header (28 bytes).
    pub atomic_eth: bool,
    /// Atomic ACK Extended Transport Header (8 bytes).
    pub atomic_ack_eth: bool,
}

impl ExtHeaders {
    /// No extension header.
    pub const NONE: ExtHeaders = ExtHeaders {
        reth: false,
        aeth: false,
        deth: false,
        immdt: false,
        ieth: false,
        atomic_eth: false,
        atomic_ack_eth: false,
    };

    /// Total bytes of the extension headers present.
    #[inline]
    pub const fn len(&self) -> usize {
        (self.deth as usize) * crate::deth::DETH_LEN
            + (self.reth as usize) * crate::reth::RETH_LEN
            + (self.atomic_eth as usize) * crate::atomic::ATOMIC_ETH_LEN
            + (self.aeth as usize) * crate::aeth::AETH_LEN
            + (self.atomic_ack_eth as usize) * crate::atomic::ATOMIC_ACK_ETH_LEN
            + (self.immdt as usize) * crate::immdt::IMMDT_LEN
            + (self.ieth as usize) * crate::ieth::IETH_LEN
    }

    /// True when no extension header is present.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// Position of a packet within its message.
const FIRST: u8 = 1;
const MIDDLE: u8 = 2;
const LAST: u8 = 3;
const ONLY: u8 = 4;

#[inline]
const fn ext(
    reth: bool,
    aeth: bool,
    deth: bool,
    immdt: bool,
    ieth: bool,
    atomic_eth: bool,
    atomic_ack_eth: bool,
) -> ExtHeaders {
    ExtHeaders {
        reth,
        aeth,
        deth,
        immdt,
        ieth,
        atomic_eth,
        atomic_ack_eth,
    }
}

const E_NONE: ExtHeaders = ExtHeaders::NONE;
const E_IMM: ExtHeaders = ext(false, false, false, true, false, false, false);
const E_INV: ExtHeaders = ext(false, false, false, false, true, false, false);
const E_RETH: ExtHeaders = ext(true, false, false, false, false, false, false);
const E_RETH_IMM: ExtHeaders = ext(true, false, false, true, false, false, false);
const E_AETH: ExtHeaders = ext(false, true, false, false, false, false, false);
const E_AETH_ATOMICACK: ExtHeaders = ext(false, true, false, false, false, false, true);
const E_ATOMIC: ExtHeaders = ext(false, false, false, false, false, true, false);
const E_DETH: ExtHeaders = ext(false, false, true, false, false, false, false);
const E_DETH_IMM: ExtHeaders = ext(false, false, true, true, false, false, false);

/// One opcode's row of the table, as [`Opcode`]'s accessors read it.
#[derive(Clone, Copy)]
struct Attrs {
    kind: OpKind,
    position: u8,
    ext: ExtHeaders,
    has_payload: bool,
    /// BTH, extension headers and (CNP) the reserved bytes.
    header_len: u8,
}

impl Attrs {
    const FILLER: Attrs = Attrs::new(OpKind::Cnp, 0, ExtHeaders::NONE, false, false);

    const fn new(
        kind: OpKind,
        position: u8,
        ext: ExtHeaders,
        has_payload: bool,
        cnp: bool,
    ) -> Attrs {
        let reserved = if cnp { CNP_RESERVED_LEN } else { 0 };
        Attrs {
            kind,
            position,
            ext,
            has_payload,
            header_len: (crate::bth::BTH_LEN + ext.len() + reserved) as u8,
        }
    }
}

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $var:ident = $code:literal, $name:literal, $kind:ident, $pos:ident, $ext:ident, $payload:literal; )*) => {
        /// A BTH opcode that softrdma understands (RC, UC, UD and CNP). Ordered by code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Opcode {
            $( $(#[$doc])* $var = $code, )*
        }

        /// What each opcode byte stands for, by the byte: every packet built or parsed asks
        /// these several times (header lengths, checks, packet positions), so each is one
        /// load rather than a `match`. Bytes that are no opcode hold filler never read.
        const ATTRS: [Attrs; 256] = {
            let mut t = [Attrs::FILLER; 256];
            $( t[$code] = Attrs::new(OpKind::$kind, $pos, $ext, $payload, matches!(OpKind::$kind, OpKind::Cnp)); )*
            t
        };

        impl Opcode {
            /// Every opcode, in numeric order.
            pub const ALL: &'static [Opcode] = &[ $( Opcode::$var, )* ];

            /// The opcode for a BTH opcode byte, or why there is none.
            #[inline]
            pub const fn from_u8(code: u8) -> Result<Opcode, WireError> {
                match code {
                    $( $code => Ok(Opcode::$var), )*
                    _ => Err(unknown(code)),
                }
            }

            /// The name as Wireshark's InfiniBand dissector spells it (e.g. "RC Send Only").
            #[inline]
            pub const fn name(self) -> &'static str {
                match self { $( Opcode::$var => $name, )* }
            }

            /// The operation, independent of transport.
            #[inline]
            pub const fn kind(self) -> OpKind {
                ATTRS[self as usize].kind
            }


            #[inline]
            const fn position(self) -> u8 {
                ATTRS[self as usize].position
            }

            /// Which extension headers follow the BTH.
            #[inline]
            pub const fn ext(self) -> ExtHeaders {
                ATTRS[self as usize].ext
            }

            /// True when the packet may carry payload bytes after its headers.
            #[inline]
            pub const fn has_payload(self) -> bool {
                ATTRS[self as usize].has_payload
            }
        }
    };
}

opcodes! {
    /// RC SEND FIRST.
    RcSendFirst = 0x00, "RC Send First", Send, FIRST, E_NONE, true;
    /// RC SEND MIDDLE.
    RcSendMiddle = 0x01, "RC Send Middle", Send, MIDDLE, E_NONE, true;
    /// RC SEND LAST.
    RcSendLast = 0x02, "RC Send Last", Send, LAST, E_NONE, true;
    /// RC SEND LAST with Immediate.
    RcSendLastImm = 0x03, "RC Send Last Immediate", Send, LAST, E_IMM, true;
    /// RC SEND ONLY.
    RcSendOnly = 0x04, "RC Send Only", Send, ONLY, E_NONE, true;
    /// RC SEND ONLY with Immediate.
    RcSendOnlyImm = 0x05, "RC Send Only Immediate", Send, ONLY, E_IMM, true;
    /// RC RDMA WRITE FIRST.
    RcRdmaWriteFirst = 0x06, "RC RDMA Write First", RdmaWrite, FIRST, E_RETH, true;
    /// RC RDMA WRITE MIDDLE.
    RcRdmaWriteMiddle = 0x07, "RC RDMA Write Middle", RdmaWrite, MIDDLE, E_NONE, true;
    /// RC RDMA WRITE LAST.
    RcRdmaWriteLast = 0x08, "RC RDMA Write Last", RdmaWrite, LAST, E_NONE, true;
    /// RC RDMA WRITE LAST with Immediate.
    RcRdmaWriteLastImm = 0x09, "RC RDMA Write Last Immediate", RdmaWrite, LAST, E_IMM, true;
    /// RC RDMA WRITE ONLY.
    RcRdmaWriteOnly = 0x0a, "RC RDMA Write Only", RdmaWrite, ONLY, E_RETH, true;
    /// RC RDMA WRITE ONLY with Immediate.
    RcRdmaWriteOnlyImm = 0x0b, "RC RDMA Write Only Immediate", RdmaWrite, ONLY, E_RETH_IMM, true;
    /// RC RDMA READ REQUEST.
    RcRdmaReadRequest = 0x0c, "RC RDMA Read Request", RdmaReadRequest, ONLY, E_RETH, false;
    /// RC RDMA READ RESPONSE FIRST.
    RcRdmaReadResponseFirst = 0x0d, "RC RDMA Read Response First", RdmaReadResponse, FIRST, E_AETH, true;
    /// RC RDMA READ RESPONSE MIDDLE.
    RcRdmaReadResponseMiddle = 0x0e, "RC RDMA Read Response Middle", RdmaReadResponse, MIDDLE, E_NONE, true;
    /// RC RDMA READ RESPONSE LAST.
    RcRdmaReadResponseLast = 0x0f, "RC RDMA Read Response Last", RdmaReadResponse, LAST, E_AETH, true;
    /// RC RDMA READ RESPONSE ONLY.
    RcRdmaReadResponseOnly = 0x10, "RC RDMA Read Response Only", RdmaReadResponse, ONLY, E_AETH, true;
    /// RC ACKNOWLEDGE (ACK, NAK or RNR NAK, by AETH syndrome).
    RcAcknowledge = 0x11, "RC Acknowledge", Acknowledge, ONLY, E_AETH, false;
    /// RC ATOMIC ACKNOWLEDGE.
    RcAtomicAcknowledge = 0x12, "RC Atomic Acknowledge", AtomicAcknowledge, ONLY, E_AETH_ATOMICACK, false;
    /// RC COMPARE SWAP.
    RcCompareSwap = 0x13, "RC Compare Swap", CompareSwap, ONLY, E_ATOMIC, false;
    /// RC FETCH ADD.
    RcFetchAdd = 0x14, "RC Fetch Add", FetchAdd, ONLY, E_ATOMIC, false;
    /// RC SEND LAST with Invalidate.
    RcSendLastInv = 0x16, "RC Send Last Invalidate", Send, LAST, E_INV, true;
    /// RC SEND ONLY with Invalidate.
    RcSendOnlyInv = 0x17, "RC Send Only Invalidate", Send, ONLY, E_INV, true;
    /// UC SEND FIRST.
    UcSendFirst = 0x20, "UC Send First", Send, FIRST, E_NONE, true;
    /// UC SEND MIDDLE.
    UcSendMiddle = 0x21, "UC Send Middle", Send, MIDDLE, E_NONE, true;
    /// UC SEND LAST.
    UcSendLast = 0x22, "UC Send Last", Send, LAST, E_NONE, true;
    /// UC SEND LAST with Immediate.
    UcSendLastImm = 0x23, "UC Send Last Immediate", Send, LAST, E_IMM, true;
    /// UC SEND ONLY.
    UcSendOnly = 0x24, "UC Send Only", Send, ONLY, E_NONE, true;
    /// UC SEND ONLY with Immediate.
    UcSendOnlyImm = 0x25, "UC Send Only Immediate", Send, ONLY, E_IMM, true;
    /// UC RDMA WRITE FIRST.
    UcRdmaWriteFirst = 0x26, "UC RDMA Write First", RdmaWrite, FIRST, E_RETH, true;
    /// UC RDMA WRITE MIDDLE.
    UcRdmaWriteMiddle = 0x27, "UC RDMA Write Middle", RdmaWrite, MIDDLE, E_NONE, true;
    /// UC RDMA WRITE LAST.
    UcRdmaWriteLast = 0x28, "UC RDMA Write Last", RdmaWrite, LAST, E_NONE, true;
    /// UC RDMA WRITE LAST with Immediate.
    UcRdmaWriteLastImm = 0x29, "UC RDMA Write Last Immediate", RdmaWrite, LAST, E_IMM, true;
    /// UC RDMA WRITE ONLY.
    UcRdmaWriteOnly = 0x2a, "UC RDMA Write Only", RdmaWrite, ONLY, E_RETH, true;
    /// UC RDMA WRITE ONLY with Immediate.
    UcRdmaWriteOnlyImm = 0x2b, "UC RDMA Write Only Immediate", RdmaWrite, ONLY, E_RETH_IMM, true;
    /// UD SEND ONLY.
    UdSendOnly = 0x64, "UD Send Only", Send, ONLY, E_DETH, true;
    /// UD SEND ONLY with Immediate.
    UdSendOnlyImm = 0x65, "UD Send Only Immediate", Send, ONLY, E_DETH_IMM, true;
    /// RoCEv2 Congestion Notification Packet (Annex A17.9.2): BTH, 16 reserved bytes, ICRC.
    Cnp = 0x81, "CNP", Cnp, ONLY, E_NONE, false;
}

/// The precise reason a byte is not an opcode of [`Opcode`].
#[inline]
const fn unknown(code: u8) -> WireError {
    match Transport::from_opcode_bits(code) {
        Some(Transport::Rd) | Some(Transport::Xrc) => WireError::UnsupportedTransport { code },
        Some(Transport::Uc) | Some(Transport::Ud) => {
            // The operation exists for RC (0x00..=0x14, 0x16, 0x17) but this transport does
            // not offer it (IBA table 38).
            let op = code & 0x1f;
            if op <= 0x14 || op == 0x16 || op == 0x17 {
                WireError::OpcodeNotValidForTransport { code }
            } else {
                WireError::UnknownOpcode { code }
            }
        }
        _ => WireError::UnknownOpcode { code },
    }
}

impl Opcode {
    /// The opcode byte.
    #[inline]
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The transport service the opcode belongs to.
    #[inline]
    pub const fn transport(self) -> Transport {
        match self.code() >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            3 => Transport::Ud,
            _ => Transport::Cnp,
        }
    }

    /// First packet of a multi-packet message.
    #[inline]
    pub const fn is_first(self) -> bool {
        self.position() == FIRST
    }

    /// Middle packet of a multi-packet message.
    #[inline]
    pub const fn is_middle(self) -> bool {
        self.position() == MIDDLE
    }

    /// Last packet of a multi-packet message.
    #[inline]
    pub const fn is_last(self) -> bool {
        self.position() == LAST
    }

    /// A message of one packet (every non-segmented operation too: READ REQUEST, atomics,
    /// acknowledges, CNP).
    #[inline]
    pub const fn is_only(self) -> bool {
        self.position() == ONLY
    }

    /// The packet starts a message (FIRST or ONLY).
    #[inline]
    pub const fn starts_message(self) -> bool {
        self.is_first() || self.is_only()
    }

    /// The packet ends a message (LAST or ONLY).
    #[inline]
    pub const fn ends_message(self) -> bool {
        self.is_last() || self.is_only()
    }

    /// True for packets a requester sends (SEND, WRITE, READ REQUEST, atomics); false for
    /// responses (READ RESPONSE, ACKNOWLEDGE, ATOMIC ACKNOWLEDGE) and CNP.
    #[inline]
    pub const fn is_request(self) -> bool {
        matches!(
            self.kind(),
            OpKind::Send
                | OpKind::RdmaWrite
                | OpKind::RdmaReadRequest
                | OpKind::CompareSwap
                | OpKind::FetchAdd
        )
    }

    /// True when the opcode carries immediate data.
    #[inline]
    pub const fn has_immediate(self) -> bool {
        self.ext().immdt
    }

    /// True when the opcode carries an IETH (send with invalidate).
    #[inline]
    pub const fn has_invalidate(self) -> bool {
        self.ext().ieth
    }

    /// Bytes of BTH plus extension headers (plus the 16 reserved bytes of a CNP).
    #[inline]
    pub const fn header_len(self) -> usize {
        ATTRS[self as usize].header_len as usize
    }
}

/// Reserved bytes after the BTH of a CNP (Annex A17.9.2).
pub const CNP_RESERVED_LEN: usize = 16;

impl TryFrom<u8> for Opcode {
    type Error = WireError;
    #[inline]
    fn try_from(code: u8) -> Result<Opcode, WireError> {
        Opcode::from_u8(code)
    }
}

impl core::fmt::Display for Opcode {
    #[inline]
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_round_trips_and_no_other_byte_parses() {
        let mut n = 0;
        for code in 0..=255u8 {
            match Opcode::from_u8(code) {
                Ok(op) => {
                    assert_eq!(op.code(), code);
                    n += 1;
                }
                Err(e) => assert!(matches!(
                    e,
                    WireError::UnknownOpcode { .. }
                        | WireError::OpcodeNotValidForTransport { .. }
                        | WireError::UnsupportedTransport { .. }
                )),
            }
        }
        assert_eq!(n, Opcode::ALL.len());
        assert_eq!(n, 23 + 12 + 2 + 1);
        for w in Opcode::ALL.windows(2) {
            assert!(w[0].code() < w[1].code());
        }
    }

    #[test]
    fn iba_numbers_and_headers() {
        assert_eq!(Opcode::RcSendOnly.code(), 0x04);
        assert_eq!(Opcode::RcRdmaReadRequest.code(), 0x0c);
        assert_eq!(Opcode::RcAcknowledge.code(), 0x11);
        assert_eq!(Opcode::RcSendOnlyInv.code(), 0x17);
        assert_eq!(Opcode::UcRdmaWriteOnlyImm.code(), 0x2b);
        assert_eq!(Opcode::UdSendOnlyImm.code(), 0x65);
        assert_eq!(Opcode::Cnp.code(), 0x81);

        let e = Opcode::RcRdmaWriteOnlyImm.ext();
        assert!(e.reth && e.immdt && !e.aeth);
        assert_eq!(Opcode::RcRdmaWriteOnlyImm.header_len(), 12 + 16 + 4);
        assert_eq!(Opcode::RcAtomicAcknowledge.header_len(), 12 + 4 + 8);
        assert_eq!(Opcode::RcCompareSwap.header_len(), 12 + 28);
        assert_eq!(Opcode::UdSendOnlyImm.header_len(), 12 + 8 + 4);
        assert_eq!(Opcode::RcRdmaReadResponseMiddle.header_len(), 12);
        assert_eq!(Opcode::RcRdmaReadResponseFirst.header_len(), 16);
        assert_eq!(Opcode::Cnp.header_len(), 28);
        assert!(Opcode::RcSendLastInv.has_invalidate());
    }

    #[test]
    fn transports_and_positions() {
        assert_eq!(Opcode::UcSendFirst.transport(), Transport::Uc);
        assert_eq!(Opcode::UdSendOnly.transport(), Transport::Ud);
        assert_eq!(Opcode::Cnp.transport(), Transport::Cnp);
        assert_eq!(Opcode::RcFetchAdd.transport(), Transport::Rc);
        assert!(Opcode::RcSendFirst.is_first() && Opcode::RcSendFirst.starts_message());
        assert!(Opcode::RcRdmaWriteMiddle.is_middle());
        assert!(
            Opcode::RcRdmaReadResponseLast.is_last()
                && Opcode::RcRdmaReadResponseLast.ends_message()
        );
        assert!(Opcode::RcRdmaReadRequest.is_only());
        assert!(!Opcode::RcAcknowledge.has_payload());
        assert!(Opcode::RcRdmaReadResponseMiddle.has_payload());
        assert!(Opcode::RcFetchAdd.is_request() && !Opcode::RcAtomicAcknowledge.is_request());
        for op in Opcode::ALL {
            // every opcode's name starts with its transport's name
            assert!(op.name().starts_with(op.transport().name()), "{op:?}");
        }
    }

    #[test]
    fn precise_errors_for_non_opcodes() {
        assert_eq!(
            Opcode::from_u8(0x15),
            Err(WireError::UnknownOpcode { code: 0x15 })
        );
        assert_eq!(
            Opcode::from_u8(0x1f),
            Err(WireError::UnknownOpcode { code: 0x1f })
        );
        assert_eq!(
            Opcode::from_u8(0x2c),
            Err(WireError::OpcodeNotValidForTransport { code: 0x2c })
        );
        assert_eq!(
            Opcode::from_u8(0x64 - 4),
            Err(WireError::OpcodeNotValidForTransport { code: 0x60 })
        );
        assert_eq!(
            Opcode::from_u8(0x44),
            Err(WireError::UnsupportedTransport { code: 0x44 })
        );
        assert_eq!(
            Opcode::from_u8(0xa4),
            Err(WireError::UnsupportedTransport { code: 0xa4 })
        );
        assert_eq!(
            Opcode::from_u8(0x80),
            Err(WireError::UnknownOpcode { code: 0x80 })
        );
        assert_eq!(
            Opcode::from_u8(0xc0),
            Err(WireError::UnknownOpcode { code: 0xc0 })
        );
    }
}
