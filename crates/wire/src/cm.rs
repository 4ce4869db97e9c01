//! The communication manager's messages (IBA 12.6): MADs of management class 0x07, class
//! version 2, method Send, whose attribute ID names the message.
//!
//! Each message fills the 232 bytes after the MAD header. A view (`Req<T>`, `Rep<T>`, …)
//! reads the fields of one message from those bytes; a plain Repr (`ReqRepr`, …) parses from
//! the view and emits the whole 232 bytes, reserved bits as zero. [`CmMadRepr`] does both for
//! a whole 256-byte MAD, header included, choosing the message by attribute ID.
//!
//! Fields are where IBA 12.6's tables put them (byte, then bit from the most significant
//! end); a numeric field wider on the wire than in the spec (a 5-bit timeout in a `u8`) is
//! cut to its width on emit. Values that are well-formed on the wire but that a CM would
//! refuse (a path MTU code of 0, an unknown reject reason) parse: deciding to reject them
//! with the right REJ reason is the CM's business, not the parser's.
//!
//! LAP and APR (alternate path migration) and ClassPortInfo are not modeled; their attribute
//! IDs parse as [`WireError::UnsupportedCmAttribute`].
//!
//! ## ECE
//! REQ and REP carry Enhanced Connection Establishment ([`Ece`]) where Linux puts it
//! (`include/rdma/ibta_vol1_c12.h`, `cm_format_req`/`cm_format_rep`): the 24-bit vendor ID in
//! bytes IBA 12.6 reserves (REQ bytes 5–7; REP bytes 15, 19 and 23, high to low) and the
//! vendor's option bits in the MAD header's attribute modifier. That is why a REQ's or REP's
//! Repr is parsed with the header's attribute modifier, and why [`CmMadRepr::header`] takes
//! it from the message. Every other CM message has an attribute modifier of zero.

use core::fmt;

use crate::bytes::{bits_at, check_len, set_bits, Bits};
use crate::cma::ServiceId;
use crate::error::{HeaderKind, WireError};
use crate::mad::{MadHeader, MadHeaderRepr, MadMethod, MAD_BASE_VERSION, MAD_HEADER_LEN, MAD_LEN};
use crate::types::{Mtu, Psn, Qkey, Qpn};

/// Management class of the communication manager.
pub const CM_MGMT_CLASS: u8 = 0x07;
/// The CM class version this crate speaks (IBA 12.6, as Linux sends).
pub const CM_CLASS_VERSION: u8 = 2;
/// Bytes of a CM message after the MAD header.
pub const CM_MSG_LEN: usize = MAD_LEN - MAD_HEADER_LEN;
/// Bytes of one path description in a REQ (primary and alternate).
pub const CM_PATH_LEN: usize = 44;
/// Bytes of additional reject (REJ) or additional information (SIDR_REP) data.
pub const CM_ARI_LEN: usize = 72;

/// Private data bytes of a REQ.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private data bytes of an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Private data bytes of a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Private data bytes of a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private data bytes of an RTU.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Private data bytes of a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Private data bytes of a DREP.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// Private data bytes of a SIDR_REQ.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Private data bytes of a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;

/// The attribute IDs of the CM class (IBA 12.6.3, table 104).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmAttrId(pub u16);

impl CmAttrId {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: CmAttrId = CmAttrId(0x0001);
    /// ConnectRequest.
    pub const REQ: CmAttrId = CmAttrId(0x0010);
    /// MsgRcptAck.
    pub const MRA: CmAttrId = CmAttrId(0x0011);
    /// ConnectReject.
    pub const REJ: CmAttrId = CmAttrId(0x0012);
    /// ConnectReply.
    pub const REP: CmAttrId = CmAttrId(0x0013);
    /// ReadyToUse.
    pub const RTU: CmAttrId = CmAttrId(0x0014);
    /// DisconnectRequest.
    pub const DREQ: CmAttrId = CmAttrId(0x0015);
    /// DisconnectReply.
    pub const DREP: CmAttrId = CmAttrId(0x0016);
    /// ServiceIDResReq.
    pub const SIDR_REQ: CmAttrId = CmAttrId(0x0017);
    /// ServiceIDResReqResp.
    pub const SIDR_REP: CmAttrId = CmAttrId(0x0018);
    /// LoadAlternatePath.
    pub const LAP: CmAttrId = CmAttrId(0x0019);
    /// AlternatePathResponse.
    pub const APR: CmAttrId = CmAttrId(0x001a);
}

/// A fixed-size private data area: what a consumer passes to its peer inside a CM message.
/// The wire carries no length, so a shorter message is zero-padded and the receiver sees
/// all `N` bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PrivateData<const N: usize>(pub [u8; N]);

impl<const N: usize> PrivateData<N> {
    /// Bytes the area holds.
    pub const LEN: usize = N;

    /// `data` followed by zeros, or an error if it does not fit.
    pub fn from_slice(data: &[u8]) -> Result<PrivateData<N>, WireError> {
        let mut a = [0u8; N];
        a.get_mut(..data.len())
            .ok_or(WireError::PrivateDataTooLong {
                len: data.len(),
                max: N,
            })?
            .copy_from_slice(data);
        Ok(PrivateData(a))
    }

    /// All `N` bytes.
    pub const fn as_bytes(&self) -> &[u8; N] {
        &self.0
    }

    fn read(b: &[u8], at: usize) -> PrivateData<N> {
        let mut a = [0u8; N];
        a.copy_from_slice(&b[at..at + N]);
        PrivateData(a)
    }
}

impl<const N: usize> Default for PrivateData<N> {
    fn default() -> Self {
        PrivateData([0; N])
    }
}

impl<const N: usize> fmt::Debug for PrivateData<N> {
    /// The bytes up to the last non-zero one, in hex (the rest is padding).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let used = self.0.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        write!(f, "PrivateData<{N}>[")?;
        for b in &self.0[..used] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("]")
    }
}

/// Enhanced Connection Establishment: which vendor's options a side speaks and which of
/// them it asks for (REQ) or grants (REP), as Linux's CM carries them (`struct
/// rdma_ucm_ece`; rdma-core's `struct ibv_ece`). All zero is "no ECE", what every CM that
/// predates it sends. `#[repr(C)]`: the device's C interface carries it as is.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ece {
    /// The vendor's IEEE OUI (24 bits; the rest is cut on emit).
    pub vendor_id: u32,
    /// The vendor-defined option bits, carried in the MAD header's attribute modifier
    /// (Linux's `ece.attr_mod`, rdma-core's `ibv_ece.options`).
    pub options: u32,
}

/// The transport service a REQ asks for (IBA 12.6.5, 2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ServiceType {
    /// Reliable connection (0).
    #[default]
    Rc,
    /// Unreliable connection (1).
    Uc,
    /// Reliable datagram (2).
    Rd,
    /// The reserved code 3.
    Reserved,
}

impl ServiceType {
    const fn from_bits(v: u64) -> ServiceType {
        match v & 3 {
            0 => ServiceType::Rc,
            1 => ServiceType::Uc,
            2 => ServiceType::Rd,
            _ => ServiceType::Reserved,
        }
    }

    const fn bits(self) -> u64 {
        match self {
            ServiceType::Rc => 0,
            ServiceType::Uc => 1,
            ServiceType::Rd => 2,
            ServiceType::Reserved => 3,
        }
    }
}

/// Which message an MRA acknowledges or a REJ rejects (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CmMsgRef {
    /// The REQ (0).
    #[default]
    Req,
    /// The REP (1).
    Rep,
    /// 2: the LAP for an MRA; for a REJ, no message (a REJ sent on its own, e.g. on a
    /// timeout or a stale connection).
    Other,
    /// The reserved code 3.
    Reserved,
}

impl CmMsgRef {
    const fn from_bits(v: u64) -> CmMsgRef {
        match v & 3 {
            0 => CmMsgRef::Req,
            1 => CmMsgRef::Rep,
            2 => CmMsgRef::Other,
            _ => CmMsgRef::Reserved,
        }
    }

    const fn bits(self) -> u64 {
        match self {
            CmMsgRef::Req => 0,
            CmMsgRef::Rep => 1,
            CmMsgRef::Other => 2,
            CmMsgRef::Reserved => 3,
        }
    }
}

/// Why a REJ rejects (IBA 12.6.7.2, table 107); the names follow Linux's `ib_cm_rej_reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RejectReason(pub u16);

impl RejectReason {
    /// No QP available.
    pub const NO_QP: RejectReason = RejectReason(1);
    /// No EE context available.
    pub const NO_EEC: RejectReason = RejectReason(2);
    /// No resources available.
    pub const NO_RESOURCES: RejectReason = RejectReason(3);
    /// The peer did not answer in time.
    pub const TIMEOUT: RejectReason = RejectReason(4);
    /// Unsupported request.
    pub const UNSUPPORTED: RejectReason = RejectReason(5);
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: RejectReason = RejectReason(6);
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: RejectReason = RejectReason(7);
    /// No one listens on the service ID.
    pub const INVALID_SERVICE_ID: RejectReason = RejectReason(8);
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: RejectReason = RejectReason(9);
    /// Stale connection: the QP is still connected from an earlier exchange.
    pub const STALE_CONN: RejectReason = RejectReason(10);
    /// RDC does not exist.
    pub const RDC_NOT_EXIST: RejectReason = RejectReason(11);
    /// Invalid primary GID.
    pub const INVALID_GID: RejectReason = RejectReason(12);
    /// Invalid primary LID.
    pub const INVALID_LID: RejectReason = RejectReason(13);
    /// Invalid primary SL.
    pub const INVALID_SL: RejectReason = RejectReason(14);
    /// Invalid primary traffic class.
    pub const INVALID_TRAFFIC_CLASS: RejectReason = RejectReason(15);
    /// Invalid primary hop limit.
    pub const INVALID_HOP_LIMIT: RejectReason = RejectReason(16);
    /// Invalid primary packet rate.
    pub const INVALID_PACKET_RATE: RejectReason = RejectReason(17);
    /// Invalid alternate GID.
    pub const INVALID_ALT_GID: RejectReason = RejectReason(18);
    /// Invalid alternate LID.
    pub const INVALID_ALT_LID: RejectReason = RejectReason(19);
    /// Invalid alternate SL.
    pub const INVALID_ALT_SL: RejectReason = RejectReason(20);
    /// Invalid alternate traffic class.
    pub const INVALID_ALT_TRAFFIC_CLASS: RejectReason = RejectReason(21);
    /// Invalid alternate hop limit.
    pub const INVALID_ALT_HOP_LIMIT: RejectReason = RejectReason(22);
    /// Invalid alternate packet rate.
    pub const INVALID_ALT_PACKET_RATE: RejectReason = RejectReason(23);
    /// Port CM redirect (the ARI says where).
    pub const PORT_CM_REDIRECT: RejectReason = RejectReason(24);
    /// Port redirect.
    pub const PORT_REDIRECT: RejectReason = RejectReason(25);
    /// Invalid path MTU.
    pub const INVALID_MTU: RejectReason = RejectReason(26);
    /// Insufficient responder resources.
    pub const INSUFFICIENT_RESP_RESOURCES: RejectReason = RejectReason(27);
    /// The consumer rejected (`rdma_reject`); the private data says why.
    pub const CONSUMER_DEFINED: RejectReason = RejectReason(28);
    /// Invalid RNR retry count.
    pub const INVALID_RNR_RETRY: RejectReason = RejectReason(29);
    /// The local communication ID is already in use by this peer.
    pub const DUPLICATE_LOCAL_COMM_ID: RejectReason = RejectReason(30);
    /// Unsupported class version.
    pub const INVALID_CLASS_VERSION: RejectReason = RejectReason(31);
    /// Invalid primary flow label.
    pub const INVALID_FLOW_LABEL: RejectReason = RejectReason(32);
    /// Invalid alternate flow label.
    pub const INVALID_ALT_FLOW_LABEL: RejectReason = RejectReason(33);
    /// Vendor option not supported.
    pub const VENDOR_OPTION_NOT_SUPPORTED: RejectReason = RejectReason(35);
}

/// The status of a SIDR_REP (IBA 12.11.2, table 121).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SidrStatus(pub u8);

impl SidrStatus {
    /// The QPN and Q_Key are valid.
    pub const SUCCESS: SidrStatus = SidrStatus(0);
    /// No one serves the service ID.
    pub const UNSUPPORTED: SidrStatus = SidrStatus(1);
    /// The service rejected the request.
    pub const REJECT: SidrStatus = SidrStatus(2);
    /// No QP available.
    pub const NO_QP: SidrStatus = SidrStatus(3);
    /// Redirect (the additional information says where).
    pub const REDIRECT: SidrStatus = SidrStatus(4);
    /// Unsupported class version.
    pub const UNSUPPORTED_VERSION: SidrStatus = SidrStatus(5);
}

/// Byte and bit positions, relative to the start of the CM message (MAD byte 24), from
/// IBA 12.6's message tables.
mod field {
    use crate::bytes::Bits;

    /// Local and remote communication IDs open most messages.
    pub const LOCAL_COMM_ID: Bits = Bits::at(0, 32);
    pub const REMOTE_COMM_ID: Bits = Bits::at(4, 32);

    /// REQ (table 99).
    pub mod req {
        use crate::bytes::Bits;
        /// Reserved in IBA 12.6.5; Linux's `CM_REQ_VENDOR_ID` (ECE).
        pub const VENDOR_ID: Bits = Bits::at(5, 24);
        pub const SERVICE_ID: Bits = Bits::at(8, 64);
        pub const LOCAL_CA_GUID: Bits = Bits::at(16, 64);
        pub const LOCAL_QKEY: Bits = Bits::at(28, 32);
        pub const LOCAL_QPN: Bits = Bits::at(32, 24);
        pub const RESPONDER_RESOURCES: Bits = Bits::at(35, 8);
        pub const LOCAL_EECN: Bits = Bits::at(36, 24);
        pub const INITIATOR_DEPTH: Bits = Bits::at(39, 8);
        pub const REMOTE_EECN: Bits = Bits::at(40, 24);
        pub const REMOTE_CM_RESPONSE_TIMEOUT: Bits = Bits::at(43, 5);
        pub const TRANSPORT_SERVICE_TYPE: Bits = Bits::within(43, 5, 2);
        pub const END_TO_END_FLOW_CONTROL: Bits = Bits::within(43, 7, 1);
        pub const STARTING_PSN: Bits = Bits::at(44, 24);
        pub const LOCAL_CM_RESPONSE_TIMEOUT: Bits = Bits::at(47, 5);
        pub const RETRY_COUNT: Bits = Bits::within(47, 5, 3);
        pub const PKEY: Bits = Bits::at(48, 16);
        pub const PATH_MTU: Bits = Bits::at(50, 4);
        pub const RDC_EXISTS: Bits = Bits::within(50, 4, 1);
        pub const RNR_RETRY_COUNT: Bits = Bits::within(50, 5, 3);
        pub const MAX_CM_RETRIES: Bits = Bits::at(51, 4);
        pub const SRQ: Bits = Bits::within(51, 4, 1);
        pub const EXTENDED_TRANSPORT: Bits = Bits::within(51, 5, 3);
        pub const PRIMARY_PATH: usize = 52;
        pub const ALTERNATE_PATH: usize = 96;
        /// In the alternate path's last byte, after its local ACK timeout.
        pub const SAP_SUPPORTED: Bits = Bits::within(139, 5, 1);
        pub const PRIVATE_DATA: usize = 140;
    }

    /// One path of a REQ, relative to its start.
    pub mod path {
        use crate::bytes::Bits;
        use core::ops::Range;
        pub const LOCAL_LID: Bits = Bits::at(0, 16);
        pub const REMOTE_LID: Bits = Bits::at(2, 16);
        pub const LOCAL_GID: Range<usize> = 4..20;
        pub const REMOTE_GID: Range<usize> = 20..36;
        pub const FLOW_LABEL: Bits = Bits::at(36, 20);
        pub const PACKET_RATE: Bits = Bits::within(39, 2, 6);
        pub const TRAFFIC_CLASS: Bits = Bits::at(40, 8);
        pub const HOP_LIMIT: Bits = Bits::at(41, 8);
        pub const SL: Bits = Bits::at(42, 4);
        pub const SUBNET_LOCAL: Bits = Bits::within(42, 4, 1);
        pub const LOCAL_ACK_TIMEOUT: Bits = Bits::at(43, 5);
    }

    /// MRA (table 100).
    pub mod mra {
        use crate::bytes::Bits;
        pub const MESSAGE_MRAED: Bits = Bits::at(8, 2);
        pub const SERVICE_TIMEOUT: Bits = Bits::at(9, 5);
        pub const PRIVATE_DATA: usize = 10;
    }

    /// REJ (table 101).
    pub mod rej {
        use crate::bytes::Bits;
        pub const MESSAGE_REJECTED: Bits = Bits::at(8, 2);
        pub const REJECT_INFO_LEN: Bits = Bits::at(9, 7);
        pub const REASON: Bits = Bits::at(10, 16);
        pub const ARI: usize = 12;
        pub const PRIVATE_DATA: usize = 84;
    }

    /// REP (table 103).
    pub mod rep {
        use crate::bytes::Bits;
        pub const LOCAL_QKEY: Bits = Bits::at(8, 32);
        pub const LOCAL_QPN: Bits = Bits::at(12, 24);
        /// The reserved byte after each of the three 24-bit fields: Linux's
        /// `CM_REP_VENDOR_ID_H`, `_M` and `_L` (ECE).
        pub const VENDOR_ID_H: Bits = Bits::at(15, 8);
        pub const LOCAL_EECN: Bits = Bits::at(16, 24);
        pub const VENDOR_ID_M: Bits = Bits::at(19, 8);
        pub const STARTING_PSN: Bits = Bits::at(20, 24);
        pub const VENDOR_ID_L: Bits = Bits::at(23, 8);
        pub const RESPONDER_RESOURCES: Bits = Bits::at(24, 8);
        pub const INITIATOR_DEPTH: Bits = Bits::at(25, 8);
        pub const TARGET_ACK_DELAY: Bits = Bits::at(26, 5);
        pub const FAILOVER_ACCEPTED: Bits = Bits::within(26, 5, 2);
        pub const END_TO_END_FLOW_CONTROL: Bits = Bits::within(26, 7, 1);
        pub const RNR_RETRY_COUNT: Bits = Bits::at(27, 3);
        pub const SRQ: Bits = Bits::within(27, 3, 1);
        pub const LOCAL_CA_GUID: Bits = Bits::at(28, 64);
        pub const PRIVATE_DATA: usize = 36;
    }

    /// RTU and DREP (tables 104, 106): the two IDs, then private data.
    pub const IDS_THEN_PRIVATE_DATA: usize = 8;

    /// DREQ (table 105).
    pub mod dreq {
        use crate::bytes::Bits;
        pub const REMOTE_QPN_EECN: Bits = Bits::at(8, 24);
        pub const PRIVATE_DATA: usize = 12;
    }

    /// SIDR_REQ (table 120).
    pub mod sidr_req {
        use crate::bytes::Bits;
        pub const REQUEST_ID: Bits = Bits::at(0, 32);
        pub const PKEY: Bits = Bits::at(4, 16);
        pub const SERVICE_ID: Bits = Bits::at(8, 64);
        pub const PRIVATE_DATA: usize = 16;
    }

    /// SIDR_REP (table 121).
    pub mod sidr_rep {
        use crate::bytes::Bits;
        pub const REQUEST_ID: Bits = Bits::at(0, 32);
        pub const STATUS: Bits = Bits::at(4, 8);
        pub const ADD_INFO_LEN: Bits = Bits::at(5, 8);
        pub const QPN: Bits = Bits::at(8, 24);
        pub const SERVICE_ID: Bits = Bits::at(12, 64);
        pub const QKEY: Bits = Bits::at(20, 32);
        pub const ADD_INFO: usize = 24;
        pub const PRIVATE_DATA: usize = 96;
    }
}

/// Declares a zero-copy view over the bytes of one CM structure.
macro_rules! cm_view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buf: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wrap a buffer without checking it; accessors panic if it is too short.
            pub const fn new_unchecked(buf: T) -> Self {
                $name { buf }
            }

            /// Wrap a buffer that holds the whole structure.
            pub fn new_checked(buf: T) -> Result<Self, WireError> {
                check_len(buf.as_ref().len(), $len, HeaderKind::Cm)?;
                Ok($name { buf })
            }

            /// The underlying buffer.
            pub fn into_inner(self) -> T {
                self.buf
            }

            fn get(&self, f: Bits) -> u64 {
                bits_at(self.buf.as_ref(), f)
            }
        }
    };
}

cm_view!(
    /// A zero-copy view of one path (primary or alternate) of a REQ.
    CmPath,
    CM_PATH_LEN
);
cm_view!(
    /// A zero-copy view of a REQ (ConnectRequest) message.
    Req,
    CM_MSG_LEN
);
cm_view!(
    /// A zero-copy view of an MRA (MsgRcptAck) message.
    Mra,
    CM_MSG_LEN
);
cm_view!(
    /// A zero-copy view of a REJ (ConnectReject) message.
    Rej,
    CM_MSG_LEN
);
cm_view!(
    /// A zero-copy view of a REP (ConnectReply) message.
    Rep,
    CM_MSG_LEN
);
cm_view!(
    /// A zero-copy view of an RTU (ReadyToUse) message.
    Rtu,
    CM_MSG_LEN
);
cm_view!(
    /// A zero-copy view of a DREQ (DisconnectRequest) message.
    Dreq,
    CM_MSG_LEN
);
cm_view!(
    /// A zero-copy view of a DREP (DisconnectReply) message.
    Drep,
    CM_MSG_LEN
);
cm_view!(
    /// A zero-copy view of a SIDR_REQ (ServiceIDResReq) message.
    SidrReq,
    CM_MSG_LEN
);
cm_view!(
    /// A zero-copy view of a SIDR_REP (ServiceIDResReqResp) message.
    SidrRep,
    CM_MSG_LEN
);

fn gid_at(b: &[u8], r: core::ops::Range<usize>) -> [u8; 16] {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[r]);
    g
}

impl<T: AsRef<[u8]>> CmPath<T> {
    /// Local port LID (0xffff on RoCE, where LIDs do not exist).
    pub fn local_lid(&self) -> u16 {
        self.get(field::path::LOCAL_LID) as u16
    }
    /// Remote port LID.
    pub fn remote_lid(&self) -> u16 {
        self.get(field::path::REMOTE_LID) as u16
    }
    /// Local port GID (on RoCEv2 the IP address, IPv4 mapped into IPv6).
    pub fn local_gid(&self) -> [u8; 16] {
        gid_at(self.buf.as_ref(), field::path::LOCAL_GID)
    }
    /// Remote port GID.
    pub fn remote_gid(&self) -> [u8; 16] {
        gid_at(self.buf.as_ref(), field::path::REMOTE_GID)
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.get(field::path::FLOW_LABEL) as u32
    }
    /// Packet rate (6 bits, IBA's static rate encoding).
    pub fn packet_rate(&self) -> u8 {
        self.get(field::path::PACKET_RATE) as u8
    }
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        self.get(field::path::TRAFFIC_CLASS) as u8
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.get(field::path::HOP_LIMIT) as u8
    }
    /// Service level (4 bits).
    pub fn sl(&self) -> u8 {
        self.get(field::path::SL) as u8
    }
    /// Subnet local: the peer is on the same subnet (no GRH needed on IB).
    pub fn subnet_local(&self) -> bool {
        self.get(field::path::SUBNET_LOCAL) != 0
    }
    /// Local ACK timeout (5 bits, `4.096 µs × 2^value`).
    pub fn local_ack_timeout(&self) -> u8 {
        self.get(field::path::LOCAL_ACK_TIMEOUT) as u8
    }
}

/// The fields of one path of a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CmPathRepr {
    /// Local port LID.
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID.
    pub local_gid: [u8; 16],
    /// Remote port GID.
    pub remote_gid: [u8; 16],
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits).
    pub local_ack_timeout: u8,
}

impl CmPathRepr {
    /// Read the fields.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &CmPath<&T>) -> CmPathRepr {
        CmPathRepr {
            local_lid: p.local_lid(),
            remote_lid: p.remote_lid(),
            local_gid: p.local_gid(),
            remote_gid: p.remote_gid(),
            flow_label: p.flow_label(),
            packet_rate: p.packet_rate(),
            traffic_class: p.traffic_class(),
            hop_limit: p.hop_limit(),
            sl: p.sl(),
            subnet_local: p.subnet_local(),
            local_ack_timeout: p.local_ack_timeout(),
        }
    }

    /// Write the fields into the 44 bytes at `b[at..]` (reserved bits already zero).
    fn write(&self, b: &mut [u8], at: usize) {
        use field::path::*;
        set_bits(b, LOCAL_LID.shifted(at), self.local_lid.into());
        set_bits(b, REMOTE_LID.shifted(at), self.remote_lid.into());
        b[at + LOCAL_GID.start..at + LOCAL_GID.end].copy_from_slice(&self.local_gid);
        b[at + REMOTE_GID.start..at + REMOTE_GID.end].copy_from_slice(&self.remote_gid);
        set_bits(b, FLOW_LABEL.shifted(at), self.flow_label.into());
        set_bits(b, PACKET_RATE.shifted(at), self.packet_rate.into());
        set_bits(b, TRAFFIC_CLASS.shifted(at), self.traffic_class.into());
        set_bits(b, HOP_LIMIT.shifted(at), self.hop_limit.into());
        set_bits(b, SL.shifted(at), self.sl.into());
        set_bits(b, SUBNET_LOCAL.shifted(at), self.subnet_local.into());
        set_bits(
            b,
            LOCAL_ACK_TIMEOUT.shifted(at),
            self.local_ack_timeout.into(),
        );
    }
}

impl<T: AsRef<[u8]>> Req<T> {
    /// The sender's communication ID for this connection.
    pub fn local_comm_id(&self) -> u32 {
        self.get(field::LOCAL_COMM_ID) as u32
    }
    /// The ECE vendor ID (24 bits; 0 without ECE).
    pub fn vendor_id(&self) -> u32 {
        self.get(field::req::VENDOR_ID) as u32
    }
    /// The service the sender wants to reach.
    pub fn service_id(&self) -> ServiceId {
        ServiceId(self.get(field::req::SERVICE_ID))
    }
    /// The sender's CA GUID.
    pub fn local_ca_guid(&self) -> u64 {
        self.get(field::req::LOCAL_CA_GUID)
    }
    /// The sender's Q_Key (RD only; 0 otherwise).
    pub fn local_qkey(&self) -> Qkey {
        Qkey(self.get(field::req::LOCAL_QKEY) as u32)
    }
    /// The sender's QPN.
    pub fn local_qpn(&self) -> Qpn {
        Qpn::new(self.get(field::req::LOCAL_QPN) as u32)
    }
    /// RDMA READ / ATOMIC operations the sender accepts at once as a responder.
    pub fn responder_resources(&self) -> u8 {
        self.get(field::req::RESPONDER_RESOURCES) as u8
    }
    /// The sender's EE context (RD only).
    pub fn local_eecn(&self) -> u32 {
        self.get(field::req::LOCAL_EECN) as u32
    }
    /// RDMA READ / ATOMIC operations the sender issues at once as a requester.
    pub fn initiator_depth(&self) -> u8 {
        self.get(field::req::INITIATOR_DEPTH) as u8
    }
    /// The receiver's EE context (RD only).
    pub fn remote_eecn(&self) -> u32 {
        self.get(field::req::REMOTE_EECN) as u32
    }
    /// How long the sender's peer may take to answer (5 bits, `4.096 µs × 2^value`).
    pub fn remote_cm_response_timeout(&self) -> u8 {
        self.get(field::req::REMOTE_CM_RESPONSE_TIMEOUT) as u8
    }
    /// The transport service the connection uses.
    pub fn transport_service_type(&self) -> ServiceType {
        ServiceType::from_bits(self.get(field::req::TRANSPORT_SERVICE_TYPE))
    }
    /// End-to-end flow control (credits in AETHs).
    pub fn end_to_end_flow_control(&self) -> bool {
        self.get(field::req::END_TO_END_FLOW_CONTROL) != 0
    }
    /// The PSN the sender starts its send queue at.
    pub fn starting_psn(&self) -> Psn {
        Psn::new(self.get(field::req::STARTING_PSN) as u32)
    }
    /// How long the sender takes to answer a CM message (5 bits).
    pub fn local_cm_response_timeout(&self) -> u8 {
        self.get(field::req::LOCAL_CM_RESPONSE_TIMEOUT) as u8
    }
    /// Transport retries after a local ACK timeout (3 bits).
    pub fn retry_count(&self) -> u8 {
        self.get(field::req::RETRY_COUNT) as u8
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        self.get(field::req::PKEY) as u16
    }
    /// Path MTU code (4 bits; 1 = 256 … 5 = 4096).
    pub fn path_mtu(&self) -> u8 {
        self.get(field::req::PATH_MTU) as u8
    }
    /// RDC exists (RD only).
    pub fn rdc_exists(&self) -> bool {
        self.get(field::req::RDC_EXISTS) != 0
    }
    /// Transport retries after an RNR NAK (3 bits; 7 = forever).
    pub fn rnr_retry_count(&self) -> u8 {
        self.get(field::req::RNR_RETRY_COUNT) as u8
    }
    /// How often the sender resends a CM message that gets no answer (4 bits).
    pub fn max_cm_retries(&self) -> u8 {
        self.get(field::req::MAX_CM_RETRIES) as u8
    }
    /// The sender's QP takes receives from an SRQ.
    pub fn srq(&self) -> bool {
        self.get(field::req::SRQ) != 0
    }
    /// Extended transport type (3 bits; 1 = XRC).
    pub fn extended_transport(&self) -> u8 {
        self.get(field::req::EXTENDED_TRANSPORT) as u8
    }
    /// The primary path.
    pub fn primary_path(&self) -> CmPath<&[u8]> {
        let at = field::req::PRIMARY_PATH;
        CmPath::new_unchecked(&self.buf.as_ref()[at..at + CM_PATH_LEN])
    }
    /// The alternate path (all zero when there is none).
    pub fn alternate_path(&self) -> CmPath<&[u8]> {
        let at = field::req::ALTERNATE_PATH;
        CmPath::new_unchecked(&self.buf.as_ref()[at..at + CM_PATH_LEN])
    }
    /// The sender supports the SAP (IBA 12.6.5).
    pub fn sap_supported(&self) -> bool {
        self.get(field::req::SAP_SUPPORTED) != 0
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::req::PRIVATE_DATA..CM_MSG_LEN]
    }
}

/// The fields of a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReqRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The ECE the sender asks for: the vendor ID in the message, the options in the MAD
    /// header's attribute modifier.
    pub ece: Ece,
    /// The service asked for.
    pub service_id: ServiceId,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender's Q_Key (RD).
    pub local_qkey: Qkey,
    /// The sender's QPN.
    pub local_qpn: Qpn,
    /// Responder resources.
    pub responder_resources: u8,
    /// The sender's EE context (RD).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// The receiver's EE context (RD).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport_service_type: ServiceType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN.
    pub starting_psn: Psn,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU code (4 bits).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport: u8,
    /// The primary path.
    pub primary_path: CmPathRepr,
    /// The alternate path.
    pub alternate_path: CmPathRepr,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data.
    pub private_data: PrivateData<REQ_PRIVATE_DATA_LEN>,
}

impl ReqRepr {
    /// The path MTU, if the code is one IBA defines.
    pub const fn mtu(&self) -> Option<Mtu> {
        Mtu::from_ibv(self.path_mtu)
    }

    /// Read the fields; `attribute_modifier` is the MAD header's, which holds the ECE
    /// options.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Req<&T>, attribute_modifier: u32) -> ReqRepr {
        ReqRepr {
            local_comm_id: p.local_comm_id(),
            ece: Ece {
                vendor_id: p.vendor_id(),
                options: attribute_modifier,
            },
            service_id: p.service_id(),
            local_ca_guid: p.local_ca_guid(),
            local_qkey: p.local_qkey(),
            local_qpn: p.local_qpn(),
            responder_resources: p.responder_resources(),
            local_eecn: p.local_eecn(),
            initiator_depth: p.initiator_depth(),
            remote_eecn: p.remote_eecn(),
            remote_cm_response_timeout: p.remote_cm_response_timeout(),
            transport_service_type: p.transport_service_type(),
            end_to_end_flow_control: p.end_to_end_flow_control(),
            starting_psn: p.starting_psn(),
            local_cm_response_timeout: p.local_cm_response_timeout(),
            retry_count: p.retry_count(),
            pkey: p.pkey(),
            path_mtu: p.path_mtu(),
            rdc_exists: p.rdc_exists(),
            rnr_retry_count: p.rnr_retry_count(),
            max_cm_retries: p.max_cm_retries(),
            srq: p.srq(),
            extended_transport: p.extended_transport(),
            primary_path: CmPathRepr::parse(&p.primary_path()),
            alternate_path: CmPathRepr::parse(&p.alternate_path()),
            sap_supported: p.sap_supported(),
            private_data: PrivateData::read(p.buf.as_ref(), field::req::PRIVATE_DATA),
        }
    }

    /// Write the whole message into `b` (232 bytes, zeroed by the caller).
    fn write(&self, b: &mut [u8]) {
        use field::req::*;
        set_bits(b, field::LOCAL_COMM_ID, self.local_comm_id.into());
        set_bits(b, VENDOR_ID, self.ece.vendor_id.into());
        set_bits(b, SERVICE_ID, self.service_id.0);
        set_bits(b, LOCAL_CA_GUID, self.local_ca_guid);
        set_bits(b, LOCAL_QKEY, self.local_qkey.0.into());
        set_bits(b, LOCAL_QPN, self.local_qpn.value().into());
        set_bits(b, RESPONDER_RESOURCES, self.responder_resources.into());
        set_bits(b, LOCAL_EECN, self.local_eecn.into());
        set_bits(b, INITIATOR_DEPTH, self.initiator_depth.into());
        set_bits(b, REMOTE_EECN, self.remote_eecn.into());
        set_bits(
            b,
            REMOTE_CM_RESPONSE_TIMEOUT,
            self.remote_cm_response_timeout.into(),
        );
        set_bits(
            b,
            TRANSPORT_SERVICE_TYPE,
            self.transport_service_type.bits(),
        );
        set_bits(
            b,
            END_TO_END_FLOW_CONTROL,
            self.end_to_end_flow_control.into(),
        );
        set_bits(b, STARTING_PSN, self.starting_psn.value().into());
        set_bits(
            b,
            LOCAL_CM_RESPONSE_TIMEOUT,
            self.local_cm_response_timeout.into(),
        );
        set_bits(b, RETRY_COUNT, self.retry_count.into());
        set_bits(b, PKEY, self.pkey.into());
        set_bits(b, PATH_MTU, self.path_mtu.into());
        set_bits(b, RDC_EXISTS, self.rdc_exists.into());
        set_bits(b, RNR_RETRY_COUNT, self.rnr_retry_count.into());
        set_bits(b, MAX_CM_RETRIES, self.max_cm_retries.into());
        set_bits(b, SRQ, self.srq.into());
        set_bits(b, EXTENDED_TRANSPORT, self.extended_transport.into());
        self.primary_path.write(b, PRIMARY_PATH);
        self.alternate_path.write(b, ALTERNATE_PATH);
        set_bits(b, SAP_SUPPORTED, self.sap_supported.into());
        b[PRIVATE_DATA..CM_MSG_LEN].copy_from_slice(self.private_data.as_bytes());
    }
}

impl<T: AsRef<[u8]>> Mra<T> {
    /// The sender's communication ID.
    pub fn local_comm_id(&self) -> u32 {
        self.get(field::LOCAL_COMM_ID) as u32
    }
    /// The receiver's communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        self.get(field::REMOTE_COMM_ID) as u32
    }
    /// Which message this acknowledges.
    pub fn message_mraed(&self) -> CmMsgRef {
        CmMsgRef::from_bits(self.get(field::mra::MESSAGE_MRAED))
    }
    /// How long the sender needs before it answers (5 bits, `4.096 µs × 2^value`).
    pub fn service_timeout(&self) -> u8 {
        self.get(field::mra::SERVICE_TIMEOUT) as u8
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::mra::PRIVATE_DATA..CM_MSG_LEN]
    }
}

/// The fields of an MRA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MraRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message this acknowledges.
    pub message_mraed: CmMsgRef,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: PrivateData<MRA_PRIVATE_DATA_LEN>,
}

impl MraRepr {
    /// Read the fields.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Mra<&T>) -> MraRepr {
        MraRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_mraed: p.message_mraed(),
            service_timeout: p.service_timeout(),
            private_data: PrivateData::read(p.buf.as_ref(), field::mra::PRIVATE_DATA),
        }
    }

    fn write(&self, b: &mut [u8]) {
        write_ids(b, self.local_comm_id, self.remote_comm_id);
        set_bits(b, field::mra::MESSAGE_MRAED, self.message_mraed.bits());
        set_bits(b, field::mra::SERVICE_TIMEOUT, self.service_timeout.into());
        b[field::mra::PRIVATE_DATA..].copy_from_slice(self.private_data.as_bytes());
    }
}

fn write_ids(b: &mut [u8], local: u32, remote: u32) {
    set_bits(b, field::LOCAL_COMM_ID, local.into());
    set_bits(b, field::REMOTE_COMM_ID, remote.into());
}

impl<T: AsRef<[u8]>> Rej<T> {
    /// The sender's communication ID (0 if it never allocated one).
    pub fn local_comm_id(&self) -> u32 {
        self.get(field::LOCAL_COMM_ID) as u32
    }
    /// The receiver's communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        self.get(field::REMOTE_COMM_ID) as u32
    }
    /// Which message is rejected.
    pub fn message_rejected(&self) -> CmMsgRef {
        CmMsgRef::from_bits(self.get(field::rej::MESSAGE_REJECTED))
    }
    /// Bytes of the ARI that mean something (7 bits).
    pub fn reject_info_len(&self) -> u8 {
        self.get(field::rej::REJECT_INFO_LEN) as u8
    }
    /// Why.
    pub fn reason(&self) -> RejectReason {
        RejectReason(self.get(field::rej::REASON) as u16)
    }
    /// Additional reject information, all 72 bytes.
    pub fn ari(&self) -> &[u8] {
        &self.buf.as_ref()[field::rej::ARI..field::rej::PRIVATE_DATA]
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::rej::PRIVATE_DATA..CM_MSG_LEN]
    }
}

/// The fields of a REJ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RejRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: CmMsgRef,
    /// Meaningful ARI bytes (7 bits).
    pub reject_info_len: u8,
    /// Why.
    pub reason: RejectReason,
    /// Additional reject information.
    pub ari: PrivateData<CM_ARI_LEN>,
    /// Private data.
    pub private_data: PrivateData<REJ_PRIVATE_DATA_LEN>,
}

impl RejRepr {
    /// Read the fields.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Rej<&T>) -> RejRepr {
        RejRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_rejected: p.message_rejected(),
            reject_info_len: p.reject_info_len(),
            reason: p.reason(),
            ari: PrivateData::read(p.buf.as_ref(), field::rej::ARI),
            private_data: PrivateData::read(p.buf.as_ref(), field::rej::PRIVATE_DATA),
        }
    }

    fn write(&self, b: &mut [u8]) {
        use field::rej::*;
        write_ids(b, self.local_comm_id, self.remote_comm_id);
        set_bits(b, MESSAGE_REJECTED, self.message_rejected.bits());
        set_bits(b, REJECT_INFO_LEN, self.reject_info_len.into());
        set_bits(b, REASON, self.reason.0.into());
        b[ARI..PRIVATE_DATA].copy_from_slice(self.ari.as_bytes());
        b[PRIVATE_DATA..].copy_from_slice(self.private_data.as_bytes());
    }
}

impl<T: AsRef<[u8]>> Rep<T> {
    /// The sender's communication ID.
    pub fn local_comm_id(&self) -> u32 {
        self.get(field::LOCAL_COMM_ID) as u32
    }
    /// The receiver's communication ID (the REQ's local one).
    pub fn remote_comm_id(&self) -> u32 {
        self.get(field::REMOTE_COMM_ID) as u32
    }
    /// The sender's Q_Key (RD).
    pub fn local_qkey(&self) -> Qkey {
        Qkey(self.get(field::rep::LOCAL_QKEY) as u32)
    }
    /// The sender's QPN.
    pub fn local_qpn(&self) -> Qpn {
        Qpn::new(self.get(field::rep::LOCAL_QPN) as u32)
    }
    /// The sender's EE context (RD).
    pub fn local_eecn(&self) -> u32 {
        self.get(field::rep::LOCAL_EECN) as u32
    }
    /// The PSN the sender starts its send queue at.
    pub fn starting_psn(&self) -> Psn {
        Psn::new(self.get(field::rep::STARTING_PSN) as u32)
    }
    /// Responder resources the sender grants.
    pub fn responder_resources(&self) -> u8 {
        self.get(field::rep::RESPONDER_RESOURCES) as u8
    }
    /// Initiator depth the sender uses.
    pub fn initiator_depth(&self) -> u8 {
        self.get(field::rep::INITIATOR_DEPTH) as u8
    }
    /// Target ACK delay (5 bits).
    pub fn target_ack_delay(&self) -> u8 {
        self.get(field::rep::TARGET_ACK_DELAY) as u8
    }
    /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    pub fn failover_accepted(&self) -> u8 {
        self.get(field::rep::FAILOVER_ACCEPTED) as u8
    }
    /// End-to-end flow control.
    pub fn end_to_end_flow_control(&self) -> bool {
        self.get(field::rep::END_TO_END_FLOW_CONTROL) != 0
    }
    /// RNR retry count (3 bits).
    pub fn rnr_retry_count(&self) -> u8 {
        self.get(field::rep::RNR_RETRY_COUNT) as u8
    }
    /// The sender's QP uses an SRQ.
    pub fn srq(&self) -> bool {
        self.get(field::rep::SRQ) != 0
    }
    /// The sender's CA GUID.
    pub fn local_ca_guid(&self) -> u64 {
        self.get(field::rep::LOCAL_CA_GUID)
    }
    /// The ECE vendor ID (24 bits from three reserved bytes; 0 without ECE).
    pub fn vendor_id(&self) -> u32 {
        use field::rep::{VENDOR_ID_H, VENDOR_ID_L, VENDOR_ID_M};
        (self.get(VENDOR_ID_H) << 16 | self.get(VENDOR_ID_M) << 8 | self.get(VENDOR_ID_L)) as u32
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::rep::PRIVATE_DATA..CM_MSG_LEN]
    }
}

/// The fields of a REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RepRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The sender's Q_Key (RD).
    pub local_qkey: Qkey,
    /// The sender's QPN.
    pub local_qpn: Qpn,
    /// The sender's EE context (RD).
    pub local_eecn: u32,
    /// Starting PSN.
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The ECE the sender grants: the vendor ID in the message, the options in the MAD
    /// header's attribute modifier.
    pub ece: Ece,
    /// Private data.
    pub private_data: PrivateData<REP_PRIVATE_DATA_LEN>,
}

impl RepRepr {
    /// Read the fields; `attribute_modifier` is the MAD header's, which holds the ECE
    /// options.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Rep<&T>, attribute_modifier: u32) -> RepRepr {
        RepRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            local_qkey: p.local_qkey(),
            local_qpn: p.local_qpn(),
            local_eecn: p.local_eecn(),
            starting_psn: p.starting_psn(),
            responder_resources: p.responder_resources(),
            initiator_depth: p.initiator_depth(),
            target_ack_delay: p.target_ack_delay(),
            failover_accepted: p.failover_accepted(),
            end_to_end_flow_control: p.end_to_end_flow_control(),
            rnr_retry_count: p.rnr_retry_count(),
            srq: p.srq(),
            local_ca_guid: p.local_ca_guid(),
            ece: Ece {
                vendor_id: p.vendor_id(),
                options: attribute_modifier,
            },
            private_data: PrivateData::read(p.buf.as_ref(), field::rep::PRIVATE_DATA),
        }
    }

    fn write(&self, b: &mut [u8]) {
        use field::rep::*;
        write_ids(b, self.local_comm_id, self.remote_comm_id);
        set_bits(b, LOCAL_QKEY, self.local_qkey.0.into());
        set_bits(b, LOCAL_QPN, self.local_qpn.value().into());
        let vendor = u64::from(self.ece.vendor_id);
        set_bits(b, VENDOR_ID_H, vendor >> 16);
        set_bits(b, VENDOR_ID_M, vendor >> 8);
        set_bits(b, VENDOR_ID_L, vendor);
        set_bits(b, LOCAL_EECN, self.local_eecn.into());
        set_bits(b, STARTING_PSN, self.starting_psn.value().into());
        set_bits(b, RESPONDER_RESOURCES, self.responder_resources.into());
        set_bits(b, INITIATOR_DEPTH, self.initiator_depth.into());
        set_bits(b, TARGET_ACK_DELAY, self.target_ack_delay.into());
        set_bits(b, FAILOVER_ACCEPTED, self.failover_accepted.into());
        set_bits(
            b,
            END_TO_END_FLOW_CONTROL,
            self.end_to_end_flow_control.into(),
        );
        set_bits(b, RNR_RETRY_COUNT, self.rnr_retry_count.into());
        set_bits(b, SRQ, self.srq.into());
        set_bits(b, LOCAL_CA_GUID, self.local_ca_guid);
        b[PRIVATE_DATA..].copy_from_slice(self.private_data.as_bytes());
    }
}

impl<T: AsRef<[u8]>> Rtu<T> {
    /// The sender's communication ID.
    pub fn local_comm_id(&self) -> u32 {
        self.get(field::LOCAL_COMM_ID) as u32
    }
    /// The receiver's communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        self.get(field::REMOTE_COMM_ID) as u32
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::IDS_THEN_PRIVATE_DATA..CM_MSG_LEN]
    }
}

impl<T: AsRef<[u8]>> Drep<T> {
    /// The sender's communication ID.
    pub fn local_comm_id(&self) -> u32 {
        self.get(field::LOCAL_COMM_ID) as u32
    }
    /// The receiver's communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        self.get(field::REMOTE_COMM_ID) as u32
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::IDS_THEN_PRIVATE_DATA..CM_MSG_LEN]
    }
}

/// The fields of an RTU or a DREP: the two communication IDs and private data (both
/// messages have this one layout, IBA 12.6.9 and 12.6.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct IdsRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: PrivateData<RTU_PRIVATE_DATA_LEN>,
}

impl IdsRepr {
    /// Read an RTU's fields.
    pub fn parse_rtu<T: AsRef<[u8]> + ?Sized>(p: &Rtu<&T>) -> IdsRepr {
        IdsRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: PrivateData::read(p.buf.as_ref(), field::IDS_THEN_PRIVATE_DATA),
        }
    }

    /// Read a DREP's fields.
    pub fn parse_drep<T: AsRef<[u8]> + ?Sized>(p: &Drep<&T>) -> IdsRepr {
        IdsRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: PrivateData::read(p.buf.as_ref(), field::IDS_THEN_PRIVATE_DATA),
        }
    }

    fn write(&self, b: &mut [u8]) {
        write_ids(b, self.local_comm_id, self.remote_comm_id);
        b[field::IDS_THEN_PRIVATE_DATA..].copy_from_slice(self.private_data.as_bytes());
    }
}

impl<T: AsRef<[u8]>> Dreq<T> {
    /// The sender's communication ID.
    pub fn local_comm_id(&self) -> u32 {
        self.get(field::LOCAL_COMM_ID) as u32
    }
    /// The receiver's communication ID.
    pub fn remote_comm_id(&self) -> u32 {
        self.get(field::REMOTE_COMM_ID) as u32
    }
    /// The receiver's QPN (or EECN for RD), so it can check the DREQ is for that QP.
    pub fn remote_qpn_eecn(&self) -> Qpn {
        Qpn::new(self.get(field::dreq::REMOTE_QPN_EECN) as u32)
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::dreq::PRIVATE_DATA..CM_MSG_LEN]
    }
}

/// The fields of a DREQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DreqRepr {
    /// The sender's communication ID.
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN (or EECN).
    pub remote_qpn_eecn: Qpn,
    /// Private data.
    pub private_data: PrivateData<DREQ_PRIVATE_DATA_LEN>,
}

impl DreqRepr {
    /// Read the fields.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Dreq<&T>) -> DreqRepr {
        DreqRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            remote_qpn_eecn: p.remote_qpn_eecn(),
            private_data: PrivateData::read(p.buf.as_ref(), field::dreq::PRIVATE_DATA),
        }
    }

    fn write(&self, b: &mut [u8]) {
        write_ids(b, self.local_comm_id, self.remote_comm_id);
        set_bits(
            b,
            field::dreq::REMOTE_QPN_EECN,
            self.remote_qpn_eecn.value().into(),
        );
        b[field::dreq::PRIVATE_DATA..].copy_from_slice(self.private_data.as_bytes());
    }
}

impl<T: AsRef<[u8]>> SidrReq<T> {
    /// The sender's request ID (pairs the SIDR_REP with it).
    pub fn request_id(&self) -> u32 {
        self.get(field::sidr_req::REQUEST_ID) as u32
    }
    /// Partition key.
    pub fn pkey(&self) -> u16 {
        self.get(field::sidr_req::PKEY) as u16
    }
    /// The service to resolve.
    pub fn service_id(&self) -> ServiceId {
        ServiceId(self.get(field::sidr_req::SERVICE_ID))
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::sidr_req::PRIVATE_DATA..CM_MSG_LEN]
    }
}

/// The fields of a SIDR_REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service to resolve.
    pub service_id: ServiceId,
    /// Private data.
    pub private_data: PrivateData<SIDR_REQ_PRIVATE_DATA_LEN>,
}

impl SidrReqRepr {
    /// Read the fields.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &SidrReq<&T>) -> SidrReqRepr {
        SidrReqRepr {
            request_id: p.request_id(),
            pkey: p.pkey(),
            service_id: p.service_id(),
            private_data: PrivateData::read(p.buf.as_ref(), field::sidr_req::PRIVATE_DATA),
        }
    }

    fn write(&self, b: &mut [u8]) {
        use field::sidr_req::*;
        set_bits(b, REQUEST_ID, self.request_id.into());
        set_bits(b, PKEY, self.pkey.into());
        set_bits(b, SERVICE_ID, self.service_id.0);
        b[PRIVATE_DATA..].copy_from_slice(self.private_data.as_bytes());
    }
}

impl<T: AsRef<[u8]>> SidrRep<T> {
    /// The request ID of the SIDR_REQ answered.
    pub fn request_id(&self) -> u32 {
        self.get(field::sidr_rep::REQUEST_ID) as u32
    }
    /// Outcome.
    pub fn status(&self) -> SidrStatus {
        SidrStatus(self.get(field::sidr_rep::STATUS) as u8)
    }
    /// Bytes of the additional information that mean something.
    pub fn add_info_len(&self) -> u8 {
        self.get(field::sidr_rep::ADD_INFO_LEN) as u8
    }
    /// The UD QP that serves the service.
    pub fn qpn(&self) -> Qpn {
        Qpn::new(self.get(field::sidr_rep::QPN) as u32)
    }
    /// The service resolved.
    pub fn service_id(&self) -> ServiceId {
        ServiceId(self.get(field::sidr_rep::SERVICE_ID))
    }
    /// The Q_Key to send to that QP with.
    pub fn qkey(&self) -> Qkey {
        Qkey(self.get(field::sidr_rep::QKEY) as u32)
    }
    /// Additional information, all 72 bytes.
    pub fn add_info(&self) -> &[u8] {
        &self.buf.as_ref()[field::sidr_rep::ADD_INFO..field::sidr_rep::PRIVATE_DATA]
    }
    /// The private data.
    pub fn private_data(&self) -> &[u8] {
        &self.buf.as_ref()[field::sidr_rep::PRIVATE_DATA..CM_MSG_LEN]
    }
}

/// The fields of a SIDR_REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Outcome.
    pub status: SidrStatus,
    /// Meaningful additional information bytes.
    pub add_info_len: u8,
    /// The UD QP that serves the service.
    pub qpn: Qpn,
    /// The service resolved.
    pub service_id: ServiceId,
    /// The Q_Key to use.
    pub qkey: Qkey,
    /// Additional information.
    pub add_info: PrivateData<CM_ARI_LEN>,
    /// Private data.
    pub private_data: PrivateData<SIDR_REP_PRIVATE_DATA_LEN>,
}

impl SidrRepRepr {
    /// Read the fields.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &SidrRep<&T>) -> SidrRepRepr {
        SidrRepRepr {
            request_id: p.request_id(),
            status: p.status(),
            add_info_len: p.add_info_len(),
            qpn: p.qpn(),
            service_id: p.service_id(),
            qkey: p.qkey(),
            add_info: PrivateData::read(p.buf.as_ref(), field::sidr_rep::ADD_INFO),
            private_data: PrivateData::read(p.buf.as_ref(), field::sidr_rep::PRIVATE_DATA),
        }
    }

    fn write(&self, b: &mut [u8]) {
        use field::sidr_rep::*;
        set_bits(b, REQUEST_ID, self.request_id.into());
        set_bits(b, STATUS, self.status.0.into());
        set_bits(b, ADD_INFO_LEN, self.add_info_len.into());
        set_bits(b, QPN, self.qpn.value().into());
        set_bits(b, SERVICE_ID, self.service_id.0);
        set_bits(b, QKEY, self.qkey.0.into());
        b[ADD_INFO..PRIVATE_DATA].copy_from_slice(self.add_info.as_bytes());
        b[PRIVATE_DATA..].copy_from_slice(self.private_data.as_bytes());
    }
}

/// One CM message, whichever it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMessage {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MsgRcptAck.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(IdsRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(IdsRepr),
    /// ServiceIDResReq.
    SidrReq(SidrReqRepr),
    /// ServiceIDResReqResp.
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// The attribute ID that names this message in the MAD header.
    pub const fn attr_id(&self) -> CmAttrId {
        match self {
            CmMessage::Req(_) => CmAttrId::REQ,
            CmMessage::Mra(_) => CmAttrId::MRA,
            CmMessage::Rej(_) => CmAttrId::REJ,
            CmMessage::Rep(_) => CmAttrId::REP,
            CmMessage::Rtu(_) => CmAttrId::RTU,
            CmMessage::Dreq(_) => CmAttrId::DREQ,
            CmMessage::Drep(_) => CmAttrId::DREP,
            CmMessage::SidrReq(_) => CmAttrId::SIDR_REQ,
            CmMessage::SidrRep(_) => CmAttrId::SIDR_REP,
        }
    }

    /// The message's name as IBA spells it.
    pub const fn name(&self) -> &'static str {
        match self {
            CmMessage::Req(_) => "REQ",
            CmMessage::Mra(_) => "MRA",
            CmMessage::Rej(_) => "REJ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu(_) => "RTU",
            CmMessage::Dreq(_) => "DREQ",
            CmMessage::Drep(_) => "DREP",
            CmMessage::SidrReq(_) => "SIDR_REQ",
            CmMessage::SidrRep(_) => "SIDR_REP",
        }
    }

    /// Parse the 232 message bytes after a MAD header carrying attribute `id` and
    /// `attribute_modifier` (a REQ's or REP's ECE options; ignored for the others).
    pub fn parse(
        id: CmAttrId,
        attribute_modifier: u32,
        msg: &[u8],
    ) -> Result<CmMessage, WireError> {
        check_len(msg.len(), CM_MSG_LEN, HeaderKind::Cm)?;
        let m = attribute_modifier;
        Ok(match id {
            CmAttrId::REQ => CmMessage::Req(ReqRepr::parse(&Req::new_unchecked(msg), m)),
            CmAttrId::MRA => CmMessage::Mra(MraRepr::parse(&Mra::new_unchecked(msg))),
            CmAttrId::REJ => CmMessage::Rej(RejRepr::parse(&Rej::new_unchecked(msg))),
            CmAttrId::REP => CmMessage::Rep(RepRepr::parse(&Rep::new_unchecked(msg), m)),
            CmAttrId::RTU => CmMessage::Rtu(IdsRepr::parse_rtu(&Rtu::new_unchecked(msg))),
            CmAttrId::DREQ => CmMessage::Dreq(DreqRepr::parse(&Dreq::new_unchecked(msg))),
            CmAttrId::DREP => CmMessage::Drep(IdsRepr::parse_drep(&Drep::new_unchecked(msg))),
            CmAttrId::SIDR_REQ => {
                CmMessage::SidrReq(SidrReqRepr::parse(&SidrReq::new_unchecked(msg)))
            }
            CmAttrId::SIDR_REP => {
                CmMessage::SidrRep(SidrRepRepr::parse(&SidrRep::new_unchecked(msg)))
            }
            CmAttrId(id) => return Err(WireError::UnsupportedCmAttribute { id }),
        })
    }

    /// The attribute modifier of the MAD header this message goes out with: a REQ's or
    /// REP's ECE options, 0 for every other message.
    pub const fn attribute_modifier(&self) -> u32 {
        match self {
            CmMessage::Req(r) => r.ece.options,
            CmMessage::Rep(r) => r.ece.options,
            _ => 0,
        }
    }

    /// Write the 232 message bytes at the start of `buf`, reserved bits zero (the ECE
    /// options go in the header: [`CmMessage::attribute_modifier`]).
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let Some(b) = buf.get_mut(..CM_MSG_LEN) else {
            return Err(WireError::BufferTooSmall {
                needed: CM_MSG_LEN,
                available: buf.len(),
            });
        };
        b.fill(0);
        match self {
            CmMessage::Req(r) => r.write(b),
            CmMessage::Mra(r) => r.write(b),
            CmMessage::Rej(r) => r.write(b),
            CmMessage::Rep(r) => r.write(b),
            CmMessage::Rtu(r) | CmMessage::Drep(r) => r.write(b),
            CmMessage::Dreq(r) => r.write(b),
            CmMessage::SidrReq(r) => r.write(b),
            CmMessage::SidrRep(r) => r.write(b),
        }
        Ok(())
    }
}

/// A whole CM MAD: the transaction ID and the message (the other header fields of a CM
/// message are fixed — base version 1, class 0x07, class version 2, method Send, status 0 —
/// or the message's: the attribute ID, and a REQ's or REP's ECE options as the attribute
/// modifier).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMadRepr {
    /// Transaction ID; a REP, REJ or MRA answering a REQ carries the REQ's.
    pub transaction_id: u64,
    /// The message.
    pub message: CmMessage,
}

impl CmMadRepr {
    /// Bytes a CM MAD takes.
    pub const LEN: usize = MAD_LEN;

    /// Parse a MAD (the UD payload, GRH already stripped) from untrusted bytes; bytes after
    /// the 256th are ignored. Anything but a version-1 MAD of the CM class, version 2, method
    /// Send, carrying a message this crate models, is an error saying which check failed.
    pub fn parse(mad: &[u8]) -> Result<CmMadRepr, WireError> {
        check_len(mad.len(), MAD_LEN, HeaderKind::Mad)?;
        let h = MadHeaderRepr::parse(&MadHeader::new_unchecked(mad));
        if h.base_version != MAD_BASE_VERSION {
            return Err(WireError::BadMadBaseVersion {
                version: h.base_version,
            });
        }
        if h.mgmt_class != CM_MGMT_CLASS {
            return Err(WireError::WrongMgmtClass {
                class: h.mgmt_class,
                expected: CM_MGMT_CLASS,
            });
        }
        if h.class_version != CM_CLASS_VERSION {
            return Err(WireError::BadClassVersion {
                version: h.class_version,
            });
        }
        if h.method != MadMethod::SEND {
            return Err(WireError::UnexpectedMadMethod { method: h.method.0 });
        }
        let message = CmMessage::parse(
            CmAttrId(h.attribute_id),
            h.attribute_modifier,
            &mad[MAD_HEADER_LEN..MAD_LEN],
        )?;
        Ok(CmMadRepr {
            transaction_id: h.transaction_id,
            message,
        })
    }

    /// The MAD header this message goes out with.
    pub const fn header(&self) -> MadHeaderRepr {
        MadHeaderRepr {
            base_version: MAD_BASE_VERSION,
            mgmt_class: CM_MGMT_CLASS,
            class_version: CM_CLASS_VERSION,
            method: MadMethod::SEND,
            status: 0,
            class_specific: 0,
            transaction_id: self.transaction_id,
            attribute_id: self.message.attr_id().0,
            attribute_modifier: self.message.attribute_modifier(),
        }
    }

    /// Write the 256-byte MAD at the start of `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, WireError> {
        let Some(b) = buf.get_mut(..MAD_LEN) else {
            return Err(WireError::BufferTooSmall {
                needed: MAD_LEN,
                available: buf.len(),
            });
        };
        self.header().emit(b)?;
        self.message.emit(&mut b[MAD_HEADER_LEN..])?;
        Ok(MAD_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_fills_the_mad_exactly() {
        // IBA 12.6: fixed fields plus private data are 232 bytes in every message
        assert_eq!(field::req::PRIVATE_DATA + REQ_PRIVATE_DATA_LEN, CM_MSG_LEN);
        assert_eq!(field::mra::PRIVATE_DATA + MRA_PRIVATE_DATA_LEN, CM_MSG_LEN);
        assert_eq!(field::rej::PRIVATE_DATA + REJ_PRIVATE_DATA_LEN, CM_MSG_LEN);
        assert_eq!(field::rej::ARI + CM_ARI_LEN, field::rej::PRIVATE_DATA);
        assert_eq!(field::rep::PRIVATE_DATA + REP_PRIVATE_DATA_LEN, CM_MSG_LEN);
        assert_eq!(
            field::IDS_THEN_PRIVATE_DATA + RTU_PRIVATE_DATA_LEN,
            CM_MSG_LEN
        );
        assert_eq!(DREP_PRIVATE_DATA_LEN, RTU_PRIVATE_DATA_LEN);
        assert_eq!(
            field::dreq::PRIVATE_DATA + DREQ_PRIVATE_DATA_LEN,
            CM_MSG_LEN
        );
        assert_eq!(
            field::sidr_req::PRIVATE_DATA + SIDR_REQ_PRIVATE_DATA_LEN,
            CM_MSG_LEN
        );
        assert_eq!(
            field::sidr_rep::PRIVATE_DATA + SIDR_REP_PRIVATE_DATA_LEN,
            CM_MSG_LEN
        );
        assert_eq!(
            field::sidr_rep::ADD_INFO + CM_ARI_LEN,
            field::sidr_rep::PRIVATE_DATA
        );
        assert_eq!(
            field::req::PRIMARY_PATH + CM_PATH_LEN,
            field::req::ALTERNATE_PATH
        );
        assert_eq!(
            field::req::ALTERNATE_PATH + CM_PATH_LEN,
            field::req::PRIVATE_DATA
        );
        assert_eq!(field::path::LOCAL_ACK_TIMEOUT.end(), CM_PATH_LEN);
    }

    #[test]
    fn private_data_pads_with_zeros_and_refuses_too_much() {
        let p = PrivateData::<4>::from_slice(&[1, 2]).unwrap();
        assert_eq!(p.as_bytes(), &[1, 2, 0, 0]);
        assert_eq!(format!("{p:?}"), "PrivateData<4>[0102]");
        assert_eq!(
            PrivateData::<4>::from_slice(&[0; 5]),
            Err(WireError::PrivateDataTooLong { len: 5, max: 4 })
        );
    }

    #[test]
    fn req_bit_fields_sit_where_iba_puts_them() {
        let r = ReqRepr {
            remote_cm_response_timeout: 0x14,
            transport_service_type: ServiceType::Uc,
            end_to_end_flow_control: true,
            local_cm_response_timeout: 0x14,
            retry_count: 7,
            path_mtu: 3,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            srq: true,
            starting_psn: Psn::new(0xd9cf53),
            ..ReqRepr::default()
        };
        let mut b = [0u8; CM_MSG_LEN];
        CmMessage::Req(r).emit(&mut b).unwrap();
        // the byte shapes Wireshark shows for rxe-cm-rping.pcap's first REQ
        assert_eq!(b[43], 0b1010_0011);
        assert_eq!(b[44..48], [0xd9, 0xcf, 0x53, 0b1010_0111]);
        assert_eq!(b[50], 0x37);
        assert_eq!(b[51], 0xf8);
        assert_eq!(
            CmMessage::parse(CmAttrId::REQ, 0, &b),
            Ok(CmMessage::Req(r))
        );
    }

    #[test]
    fn ece_sits_where_linux_puts_it_in_a_req() {
        let ece = Ece {
            vendor_id: 0x12_3456,
            options: 0xdead_beef,
        };
        let m = CmMadRepr {
            transaction_id: 7,
            message: CmMessage::Req(ReqRepr {
                local_comm_id: 0xa1a2_a3a4,
                ece,
                service_id: ServiceId(0x0106_0000_0000_1d2f),
                ..ReqRepr::default()
            }),
        };
        let mut b = [0u8; MAD_LEN];
        m.emit(&mut b).unwrap();
        // the attribute modifier (MAD header bytes 20..24) holds the options
        assert_eq!(b[20..24], [0xde, 0xad, 0xbe, 0xef]);
        // REQ bytes 5..8 (MAD bytes 29..32) the vendor ID, byte 4 stays reserved, and the
        // neighbours are untouched
        let msg = &b[MAD_HEADER_LEN..];
        assert_eq!(
            msg[..9],
            [0xa1, 0xa2, 0xa3, 0xa4, 0, 0x12, 0x34, 0x56, 0x01]
        );
        assert_eq!(CmMadRepr::parse(&b), Ok(m));
    }

    #[test]
    fn ece_sits_where_linux_puts_it_in_a_rep() {
        let ece = Ece {
            vendor_id: 0x12_3456,
            options: 0x0102_0304,
        };
        let m = CmMadRepr {
            transaction_id: 7,
            message: CmMessage::Rep(RepRepr {
                local_qpn: Qpn::new(0xaa_aaaa),
                local_eecn: 0xbb_bbbb,
                starting_psn: Psn::new(0xcc_cccc),
                responder_resources: 0xdd,
                ece,
                ..RepRepr::default()
            }),
        };
        let mut b = [0u8; MAD_LEN];
        m.emit(&mut b).unwrap();
        assert_eq!(b[20..24], [1, 2, 3, 4]);
        // REP bytes 15, 19 and 23: high, middle and low byte, each after a 24-bit field
        let msg = &b[MAD_HEADER_LEN..];
        assert_eq!(
            msg[12..25],
            [0xaa, 0xaa, 0xaa, 0x12, 0xbb, 0xbb, 0xbb, 0x34, 0xcc, 0xcc, 0xcc, 0x56, 0xdd]
        );
        assert_eq!(CmMadRepr::parse(&b), Ok(m));
    }

    #[test]
    fn a_vendor_id_wider_than_24_bits_is_cut_and_other_messages_carry_no_modifier() {
        let wide = Ece {
            vendor_id: 0xff12_3456,
            options: 9,
        };
        for message in [
            CmMessage::Req(ReqRepr {
                ece: wide,
                ..ReqRepr::default()
            }),
            CmMessage::Rep(RepRepr {
                ece: wide,
                ..RepRepr::default()
            }),
        ] {
            let mut b = [0u8; MAD_LEN];
            CmMadRepr {
                transaction_id: 1,
                message,
            }
            .emit(&mut b)
            .unwrap();
            let back = match CmMadRepr::parse(&b).unwrap().message {
                CmMessage::Req(r) => r.ece,
                CmMessage::Rep(r) => r.ece,
                other => panic!("{other:?}"),
            };
            assert_eq!(
                back,
                Ece {
                    vendor_id: 0x12_3456,
                    options: 9
                }
            );
        }
        // an RTU with a modifier on the wire parses, and goes out with none
        let rtu = CmMadRepr {
            transaction_id: 1,
            message: CmMessage::Rtu(IdsRepr::default()),
        };
        let mut b = [0u8; MAD_LEN];
        rtu.emit(&mut b).unwrap();
        b[20..24].copy_from_slice(&[0xff; 4]);
        let parsed = CmMadRepr::parse(&b).unwrap();
        assert_eq!(parsed, rtu);
        let mut out = [0xa5u8; MAD_LEN];
        parsed.emit(&mut out).unwrap();
        assert_eq!(out[20..24], [0; 4]);
    }

    #[test]
    fn headers_other_than_cm_version_2_sends_are_refused() {
        let m = CmMadRepr {
            transaction_id: 1,
            message: CmMessage::Rtu(IdsRepr::default()),
        };
        let mut b = [0u8; MAD_LEN];
        m.emit(&mut b).unwrap();
        assert_eq!(CmMadRepr::parse(&b), Ok(m));
        let cases: [(usize, u8, WireError); 4] = [
            (0, 2, WireError::BadMadBaseVersion { version: 2 }),
            (
                1,
                0x03,
                WireError::WrongMgmtClass {
                    class: 3,
                    expected: 7,
                },
            ),
            (2, 1, WireError::BadClassVersion { version: 1 }),
            (3, 0x81, WireError::UnexpectedMadMethod { method: 0x81 }),
        ];
        for (at, v, e) in cases {
            let mut bad = b;
            bad[at] = v;
            assert_eq!(CmMadRepr::parse(&bad), Err(e));
        }
        let mut lap = b;
        lap[17] = 0x19;
        assert_eq!(
            CmMadRepr::parse(&lap),
            Err(WireError::UnsupportedCmAttribute { id: 0x19 })
        );
        assert!(CmMadRepr::parse(&b[..255]).is_err());
        assert!(m.emit(&mut [0u8; 255]).is_err());
    }
}
