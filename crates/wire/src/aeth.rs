//! ACK Extended Transport Header (IBA 9.3.5) and its syndrome (IBA table 44): ACK with a
//! credit count, RNR NAK with a timer code, or NAK with an error code; plus the 24-bit MSN.

use crate::bytes::{check_len, set_u24, u24_at};
use crate::error::{HeaderKind, WireError};
use crate::types::Msn;

/// AETH length.
pub const AETH_LEN: usize = 4;

/// The NAK codes of IBA table 44.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// PSN sequence error: a packet was missing; the requester retransmits from the PSN.
    PsnSequenceError,
    /// Invalid request (e.g. unsupported opcode, length error).
    InvalidRequest,
    /// Remote access error (R_Key, bounds or access rights violated).
    RemoteAccessError,
    /// Remote operational error (the responder could not complete the request).
    RemoteOperationalError,
    /// Invalid RD request (reliable datagram only).
    InvalidRdRequest,
}

impl NakCode {
    /// The 5-bit code.
    #[inline]
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
        }
    }

    /// The NAK code for a 5-bit value; 5..=31 are reserved.
    #[inline]
    pub const fn from_code(c: u8) -> Option<NakCode> {
        match c {
            0 => Some(NakCode::PsnSequenceError),
            1 => Some(NakCode::InvalidRequest),
            2 => Some(NakCode::RemoteAccessError),
            3 => Some(NakCode::RemoteOperationalError),
            4 => Some(NakCode::InvalidRdRequest),
            _ => None,
        }
    }
}

/// An AETH syndrome: what kind of acknowledgement this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Syndrome {
    /// Positive acknowledgement with an end-to-end credit count (0..=31; 31 = invalid, i.e.
    /// the responder does not report credits).
    Ack {
        /// 5-bit credit count code.
        credits: u8,
    },
    /// Receiver not ready: retry after the time named by the 5-bit RNR timer code.
    RnrNak {
        /// 5-bit timer code (IBA table 45).
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
}

impl Syndrome {
    /// ACK without a credit count: syndrome byte 0x1f, what Linux rxe sends.
    pub const ACK_NO_CREDIT: Syndrome = Syndrome::Ack { credits: 0x1f };

    /// The syndrome byte (bit 7 reserved 0, bits 6..5 type, bits 4..0 value). Values wider
    /// than 5 bits are masked.
    #[inline]
    pub const fn to_u8(self) -> u8 {
        match self {
            Syndrome::Ack { credits } => credits & 0x1f,
            Syndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            Syndrome::Nak(code) => 0x60 | code.code(),
        }
    }

    /// The syndrome for a byte, or [`WireError::BadSyndrome`] for the reserved encodings
    /// (bit 7 set, type 0b10, NAK code 5..=31).
    #[inline]
    pub const fn from_u8(b: u8) -> Result<Syndrome, WireError> {
        let v = b & 0x1f;
        match b >> 5 {
            0 => Ok(Syndrome::Ack { credits: v }),
            1 => Ok(Syndrome::RnrNak { timer: v }),
            3 => match NakCode::from_code(v) {
                Some(c) => Ok(Syndrome::Nak(c)),
                None => Err(WireError::BadSyndrome { value: b }),
            },
            _ => Err(WireError::BadSyndrome { value: b }),
        }
    }

    /// The RNR NAK delay in microseconds for a 5-bit timer code (IBA table 45; code 0 is the
    /// longest, 655.36 ms).
    #[inline]
    pub const fn rnr_timer_micros(timer: u8) -> u32 {
        const TABLE: [u32; 32] = [
            655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920,
            2_560, 3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920,
            122_880, 163_840, 245_760, 327_680, 491_520,
        ];
        TABLE[(timer & 0x1f) as usize]
    }
}

/// A zero-copy view of an AETH at the start of a buffer.
#[derive(Debug, Clone)]
pub struct Aeth<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Wrap a buffer without checking it; accessors panic if it is shorter than 4 bytes.
    #[inline]
    pub const fn new_unchecked(buf: T) -> Aeth<T> {
        Aeth { buf }
    }

    /// Wrap a buffer that holds at least 4 bytes.
    #[inline]
    pub fn new_checked(buf: T) -> Result<Aeth<T>, WireError> {
        check_len(buf.as_ref().len(), AETH_LEN, HeaderKind::Aeth)?;
        Ok(Aeth { buf })
    }

    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buf
    }

    /// The syndrome byte as stored.
    #[inline]
    pub fn syndrome_raw(&self) -> u8 {
        self.buf.as_ref()[0]
    }

    /// The syndrome, or why the byte is reserved.
    #[inline]
    pub fn syndrome(&self) -> Result<Syndrome, WireError> {
        Syndrome::from_u8(self.syndrome_raw())
    }

    /// Message sequence number.
    #[inline]
    pub fn msn(&self) -> Msn {
        Msn::new(u24_at(self.buf.as_ref(), 1))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Set the syndrome.
    #[inline]
    pub fn set_syndrome(&mut self, s: Syndrome) {
        self.buf.as_mut()[0] = s.to_u8();
    }

    /// Set the MSN.
    #[inline]
    pub fn set_msn(&mut self, m: Msn) {
        set_u24(self.buf.as_mut(), 1, m.value());
    }
}

/// The fields of an AETH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// ACK, RNR NAK or NAK.
    pub syndrome: Syndrome,
    /// Message sequence number of the last completed message.
    pub msn: Msn,
}

impl AethRepr {
    /// Header length in bytes.
    pub const LEN: usize = AETH_LEN;

    /// Parse; a reserved syndrome is [`WireError::BadSyndrome`].
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Aeth<&T>) -> Result<AethRepr, WireError> {
        Ok(AethRepr {
            syndrome: p.syndrome()?,
            msn: p.msn(),
        })
    }

    /// Bytes of header this Repr emits.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }

    /// Write the fields.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, p: &mut Aeth<&mut T>) {
        p.set_syndrome(self.syndrome);
        p.set_msn(self.msn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_encodings() {
        assert_eq!(Syndrome::ACK_NO_CREDIT.to_u8(), 0x1f);
        assert_eq!(Syndrome::from_u8(0x1f), Ok(Syndrome::ACK_NO_CREDIT));
        assert_eq!(
            Syndrome::from_u8(0x60),
            Ok(Syndrome::Nak(NakCode::PsnSequenceError))
        );
        assert_eq!(
            Syndrome::from_u8(0x64),
            Ok(Syndrome::Nak(NakCode::InvalidRdRequest))
        );
        assert_eq!(Syndrome::from_u8(0x2e), Ok(Syndrome::RnrNak { timer: 14 }));
        assert_eq!(
            Syndrome::from_u8(0x65),
            Err(WireError::BadSyndrome { value: 0x65 })
        );
        assert_eq!(
            Syndrome::from_u8(0x40),
            Err(WireError::BadSyndrome { value: 0x40 })
        );
        assert_eq!(
            Syndrome::from_u8(0x80),
            Err(WireError::BadSyndrome { value: 0x80 })
        );
        // every valid byte round-trips; exactly 32 + 32 + 5 of them
        let mut valid = 0;
        for b in 0..=255u8 {
            if let Ok(s) = Syndrome::from_u8(b) {
                assert_eq!(s.to_u8(), b);
                valid += 1;
            }
        }
        assert_eq!(valid, 69);
        assert_eq!(Syndrome::rnr_timer_micros(0), 655_360);
        assert_eq!(Syndrome::rnr_timer_micros(14), 1_280);
        assert_eq!(Syndrome::rnr_timer_micros(31), 491_520);
    }

    #[test]
    fn round_trip() {
        let r = AethRepr {
            syndrome: Syndrome::RnrNak { timer: 3 },
            msn: Msn::new(0x12_3456),
        };
        let mut b = [0u8; 4];
        r.emit(&mut Aeth::new_unchecked(&mut b[..]));
        assert_eq!(b, [0x23, 0x12, 0x34, 0x56]);
        assert_eq!(AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap()), Ok(r));
        assert!(Aeth::new_checked(&b[..3]).is_err());
    }
}
