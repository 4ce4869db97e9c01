//! The one error type of the wire layer.

use core::fmt;

use crate::opcode::Opcode;

/// Which header a [`WireError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HeaderKind {
    /// The IPv4 header.
    Ipv4,
    /// The IPv6 header.
    Ipv6,
    /// The UDP header.
    Udp,
    /// The Base Transport Header.
    Bth,
    /// The RDMA Extended Transport Header.
    Reth,
    /// The ACK Extended Transport Header.
    Aeth,
    /// The Datagram Extended Transport Header.
    Deth,
    /// The Immediate Data header.
    ImmDt,
    /// The Invalidate Extended Transport Header.
    Ieth,
    /// The Atomic Extended Transport Header.
    AtomicEth,
    /// The Atomic ACK Extended Transport Header.
    AtomicAckEth,
    /// The 16 reserved bytes that follow the BTH of a CNP.
    CnpReserved,
    /// The 4-byte invariant CRC at the end of the packet.
    Icrc,
    /// The common header of a management datagram (IBA 13.4.3).
    Mad,
    /// A connection manager message: the 232 bytes after the MAD header (IBA 12.6).
    Cm,
    /// The RDMA IP CM service header at the start of a REQ's private data (IBA Annex A11).
    CmaHeader,
}

impl HeaderKind {
    /// The name of the header as the IBA spec (or the IETF) spells it.
    pub const fn name(self) -> &'static str {
        match self {
            HeaderKind::Ipv4 => "IPv4",
            HeaderKind::Ipv6 => "IPv6",
            HeaderKind::Udp => "UDP",
            HeaderKind::Bth => "BTH",
            HeaderKind::Reth => "RETH",
            HeaderKind::Aeth => "AETH",
            HeaderKind::Deth => "DETH",
            HeaderKind::ImmDt => "ImmDt",
            HeaderKind::Ieth => "IETH",
            HeaderKind::AtomicEth => "AtomicETH",
            HeaderKind::AtomicAckEth => "AtomicAckETH",
            HeaderKind::CnpReserved => "CNP reserved",
            HeaderKind::Icrc => "ICRC",
            HeaderKind::Mad => "MAD",
            HeaderKind::Cm => "CM message",
            HeaderKind::CmaHeader => "IP CM private data header",
        }
    }
}

impl fmt::Display for HeaderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why bytes could not be parsed as (or emitted into) a RoCEv2 packet.
///
/// Every malformed case has its own variant so that a receiver can count drops by reason,
/// the way a NIC's error counters do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The buffer ends before the header does.
    #[error("truncated {header} header: need {needed} bytes, have {available}")]
    Truncated {
        /// The header being read.
        header: HeaderKind,
        /// Bytes the header needs.
        needed: usize,
        /// Bytes that were there.
        available: usize,
    },
    /// The IP version nibble is neither 4 nor 6 (or not the one the caller asked for).
    #[error("bad IP version {version}")]
    BadIpVersion {
        /// The version nibble found.
        version: u8,
    },
    /// The IPv4 header carries options (IHL != 5); RoCEv2 packets never do.
    #[error("IPv4 header with options (IHL {ihl}) is not accepted")]
    Ipv4Options {
        /// The IHL field (header length in 32-bit words).
        ihl: u8,
    },
    /// The IPv4 packet is a fragment (MF set or non-zero offset); RoCEv2 never fragments.
    #[error("IPv4 fragment (MF or fragment offset set)")]
    Ipv4Fragmented,
    /// The IPv4 header checksum does not verify.
    #[error("bad IPv4 header checksum")]
    BadIpChecksum,
    /// The IP payload is not UDP (IPv4 protocol / IPv6 next header is not 17).
    #[error("not UDP: IP protocol {protocol}")]
    NotUdp {
        /// The protocol / next-header number found.
        protocol: u8,
    },
    /// The UDP destination port is not 4791 (RoCEv2).
    #[error("UDP destination port {port} is not RoCEv2 (4791)")]
    WrongUdpPort {
        /// The destination port found.
        port: u16,
    },
    /// A length field disagrees with the bytes present (or with the enclosing header).
    #[error("{header} length mismatch: header claims {claimed} bytes, {actual} present")]
    LengthMismatch {
        /// The header whose length field is wrong.
        header: HeaderKind,
        /// What the length field says.
        claimed: usize,
        /// What is really there.
        actual: usize,
    },
    /// The BTH opcode is not defined by IBA (or is manufacturer specific).
    #[error("unknown BTH opcode {code:#04x}")]
    UnknownOpcode {
        /// The opcode byte.
        code: u8,
    },
    /// The operation exists in IBA but not for the transport that the opcode's top bits name
    /// (e.g. 0x2c, an RDMA READ REQUEST on UC).
    #[error("opcode {code:#04x}: operation not valid for its transport")]
    OpcodeNotValidForTransport {
        /// The opcode byte.
        code: u8,
    },
    /// The opcode belongs to a transport softrdma does not speak (RD, XRC).
    #[error("opcode {code:#04x}: transport (RD/XRC) not supported")]
    UnsupportedTransport {
        /// The opcode byte.
        code: u8,
    },
    /// The BTH transport header version is not 0.
    #[error("bad BTH transport version {tver}")]
    BadTver {
        /// The TVer field found.
        tver: u8,
    },
    /// The BTH pad count is larger than the bytes between the headers and the ICRC.
    #[error("pad count {pad} larger than the payload ({payload} bytes)")]
    PadTooLarge {
        /// The pad count.
        pad: u8,
        /// Bytes of payload including pad.
        payload: usize,
    },
    /// Payload plus pad is not a multiple of 4 bytes (IBA 9.2: the pad aligns it).
    #[error("payload plus pad ({len} bytes) is not a multiple of 4")]
    PayloadNotAligned {
        /// Bytes of payload including pad.
        len: usize,
    },
    /// The opcode carries no payload but bytes were found (or asked to be emitted).
    #[error("{opcode:?} carries no payload but has {len} bytes")]
    UnexpectedPayload {
        /// The opcode.
        opcode: Opcode,
        /// Payload bytes found.
        len: usize,
    },
    /// The packet would not fit the 16-bit IP length field.
    #[error("payload of {len} bytes too large (max {max})")]
    PayloadTooLarge {
        /// Requested payload length.
        len: usize,
        /// Largest payload the packet can carry.
        max: usize,
    },
    /// The extension headers given do not match the ones the opcode carries.
    #[error("extension headers do not match opcode {opcode:?}")]
    ExtHeaderMismatch {
        /// The opcode.
        opcode: Opcode,
    },
    /// The invariant CRC does not match the packet.
    #[error("bad ICRC: packet carries {expected:#010x}, computed {computed:#010x}")]
    BadIcrc {
        /// The ICRC read from the packet.
        expected: u32,
        /// The ICRC computed over the packet.
        computed: u32,
    },
    /// The output buffer is too small for what is being emitted.
    #[error("buffer too small: need {needed} bytes, have {available}")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// The AETH syndrome byte uses a reserved encoding.
    #[error("reserved AETH syndrome {value:#04x}")]
    BadSyndrome {
        /// The syndrome byte.
        value: u8,
    },
    /// The MAD base version is not 1 (IBA 13.4.3), so its layout is not the one we know.
    #[error("MAD base version {version} not supported")]
    BadMadBaseVersion {
        /// The base version found.
        version: u8,
    },
    /// The MAD belongs to another management class than the parser's (0x07 for the CM).
    #[error("MAD of management class {class:#04x}, expected {expected:#04x}")]
    WrongMgmtClass {
        /// The class found.
        class: u8,
        /// The class the parser reads.
        expected: u8,
    },
    /// The class version is not one the parser speaks (the CM speaks version 2).
    #[error("MAD class version {version} not supported")]
    BadClassVersion {
        /// The class version found.
        version: u8,
    },
    /// The MAD method is not one the class uses for this attribute (CM messages are Sends).
    #[error("MAD method {method:#04x} not expected")]
    UnexpectedMadMethod {
        /// The method byte.
        method: u8,
    },
    /// The attribute ID names no CM message this crate models (LAP, APR, vendor ones).
    #[error("CM attribute {id:#06x} not supported")]
    UnsupportedCmAttribute {
        /// The attribute ID.
        id: u16,
    },
    /// More private data than the message carries (IBA 12.6: each message has a fixed area).
    #[error("{len} bytes of private data, the message holds {max}")]
    PrivateDataTooLong {
        /// Bytes offered.
        len: usize,
        /// Bytes the message holds.
        max: usize,
    },
    /// The IP CM header's major version is not 0 (IBA Annex A11.4), or its minor is unknown.
    #[error("IP CM header version {version:#04x} not supported")]
    BadCmaVersion {
        /// The version byte (major in the high nibble).
        version: u8,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_header_and_numbers() {
        let e = WireError::Truncated {
            header: HeaderKind::Reth,
            needed: 16,
            available: 3,
        };
        assert_eq!(
            e.to_string(),
            "truncated RETH header: need 16 bytes, have 3"
        );
        let e = WireError::BadIcrc {
            expected: 1,
            computed: 0xdead_beef,
        };
        assert_eq!(
            e.to_string(),
            "bad ICRC: packet carries 0x00000001, computed 0xdeadbeef"
        );
        assert_eq!(
            WireError::UnknownOpcode { code: 0x1f }.to_string(),
            "unknown BTH opcode 0x1f"
        );
    }
}
