//! The verbs vocabulary of QPs: QP types and states, `IBV_QP_*` attribute mask bits,
//! `IBV_ACCESS_*` flags, address vectors, QP capabilities and the full `ibv_qp_attr` that
//! `modify_qp` takes and `query_qp` returns.
//!
//! Numeric values of every enum and bit mirror rdma-core's `<infiniband/verbs.h>`, so the C ABI
//! layer converts with `to_ibv` / `TryFrom<u32>` (`Mtu::from_ibv` for the MTU,
//! `from_bits_retain` for the masks).
//!
//! Which of these a `modify_qp` may carry, from which state to which, is the state machine's
//! business: [`crate::qp_state`]. Its items are re-exported here too, so
//! `engine::qp_attr::check_modify` still names them.
//!
//! This module is pure: no state, no I/O, no allocation. The QP object owns a [`QpAttr`] and calls
//! [`check_modify`], then [`QpAttr::apply`].

use core::fmt;

use bitflags::bitflags;
use wire::Qpn;

/// The path MTU type (`enum ibv_mtu`), shared with the wire codec.
pub use wire::Mtu;

pub use crate::qp_state::{
    check_modify, check_sq_drained, transition_rule, ModifyError, QpLimits, TransitionRule,
};

/// The verbs name for a QP's path MTU: the same type as [`Mtu`].
pub type PathMtu = Mtu;

/// A numeric value that has no meaning in the libibverbs enum it was converted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{value} is not a valid {kind}")]
pub struct UnknownValue {
    /// Which enum the value was meant for (`"ibv_qp_state"`, ...).
    pub kind: &'static str,
    /// The rejected number.
    pub value: u32,
}

/// The transport service of a QP (`enum ibv_qp_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u32)]
pub enum QpType {
    /// Reliable Connected (`IBV_QPT_RC`).
    Rc = 2,
    /// Unreliable Connected (`IBV_QPT_UC`).
    Uc = 3,
    /// Unreliable Datagram (`IBV_QPT_UD`).
    Ud = 4,
}

impl QpType {
    /// The libibverbs number of this type (`IBV_QPT_*`).
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// Whether the QP talks to exactly one remote QP (RC, UC) rather than to any (UD).
    pub const fn is_connected(self) -> bool {
        matches!(self, QpType::Rc | QpType::Uc)
    }
}

impl TryFrom<u32> for QpType {
    type Error = UnknownValue;

    /// Converts an `IBV_QPT_*` number; types softrdma does not implement are rejected.
    fn try_from(value: u32) -> Result<Self, Self::Error> {
        match value {
            2 => Ok(QpType::Rc),
            3 => Ok(QpType::Uc),
            4 => Ok(QpType::Ud),
            _ => Err(UnknownValue {
                kind: "ibv_qp_type",
                value,
            }),
        }
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
        })
    }
}

/// The state of a QP (`enum ibv_qp_state`; IBA ch. 10, QP state machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(u32)]
pub enum QpState {
    /// Just created or reset: no queue is processed, nothing may be posted (`IBV_QPS_RESET`).
    #[default]
    Reset = 0,
    /// Initialized: receives may be posted but nothing is processed (`IBV_QPS_INIT`).
    Init = 1,
    /// Ready To Receive: the responder works, the requester does not (`IBV_QPS_RTR`).
    Rtr = 2,
    /// Ready To Send: fully operational (`IBV_QPS_RTS`).
    Rts = 3,
    /// Send Queue Drain: messages in progress finish, no new ones start (`IBV_QPS_SQD`).
    Sqd = 4,
    /// Send Queue Error (UC/UD only): a send failed; the RQ still works (`IBV_QPS_SQE`).
    Sqe = 5,
    /// Error: every WR, outstanding or newly posted, completes with a flush error (`IBV_QPS_ERR`).
    Err = 6,
}

impl QpState {
    /// Every state, in libibverbs order.
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    /// The libibverbs number of this state (`IBV_QPS_*`).
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// Whether `post_send` is accepted (IBA: from RTS on; in SQD the WR waits, in SQE and
    /// ERR it completes with a flush error). RESET, INIT and RTR reject it with an immediate error.
    pub const fn can_post_send(self) -> bool {
        matches!(
            self,
            QpState::Rts | QpState::Sqd | QpState::Sqe | QpState::Err
        )
    }

    /// Whether `post_recv` is accepted (IBA: from INIT on; in ERR the WR is flushed).
    /// Only RESET rejects it.
    pub const fn can_post_recv(self) -> bool {
        !matches!(self, QpState::Reset)
    }

    /// Whether send WRs (queued and newly posted) complete with `WR_FLUSH_ERR` instead of running.
    pub const fn flushes_send_queue(self) -> bool {
        matches!(self, QpState::Sqe | QpState::Err)
    }

    /// Whether receive WRs (queued and newly posted) complete with `WR_FLUSH_ERR`.
    pub const fn flushes_recv_queue(self) -> bool {
        matches!(self, QpState::Err)
    }

    /// Whether the requester may start a new message from the send queue (only RTS: SQD lets
    /// messages in progress finish but starts none).
    pub const fn starts_new_requests(self) -> bool {
        matches!(self, QpState::Rts)
    }

    /// Whether the requester still processes responses (ACK/NAK, READ and ATOMIC responses) and
    /// retransmits for messages already started: RTS and SQD.
    pub const fn processes_responses(self) -> bool {
        matches!(self, QpState::Rts | QpState::Sqd)
    }

    /// Whether incoming request packets are processed by the responder (RTR, RTS, SQD, and SQE,
    /// where the receive side of a UC/UD QP keeps working). In RESET, INIT and ERR they are
    /// silently dropped.
    pub const fn processes_incoming(self) -> bool {
        matches!(
            self,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }
}

impl TryFrom<u32> for QpState {
    type Error = UnknownValue;

    /// Converts an `IBV_QPS_*` number (`IBV_QPS_UNKNOWN` is rejected).
    fn try_from(value: u32) -> Result<Self, Self::Error> {
        QpState::ALL
            .get(value as usize)
            .copied()
            .ok_or(UnknownValue {
                kind: "ibv_qp_state",
                value,
            })
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        })
    }
}

/// Automatic path migration state (`enum ibv_mig_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum MigState {
    /// Running on the primary path with no alternate armed (`IBV_MIG_MIGRATED`).
    #[default]
    Migrated = 0,
    /// The consumer asks the HCA to arm the alternate path (`IBV_MIG_REARM`).
    Rearm = 1,
    /// The alternate path is armed (`IBV_MIG_ARMED`).
    Armed = 2,
}

impl MigState {
    /// The libibverbs number of this state (`IBV_MIG_*`).
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }
}

impl TryFrom<u32> for MigState {
    type Error = UnknownValue;

    /// Converts an `IBV_MIG_*` number.
    fn try_from(value: u32) -> Result<Self, Self::Error> {
        match value {
            0 => Ok(MigState::Migrated),
            1 => Ok(MigState::Rearm),
            2 => Ok(MigState::Armed),
            _ => Err(UnknownValue {
                kind: "ibv_mig_state",
                value,
            }),
        }
    }
}

bitflags! {
    /// Which fields of a [`QpAttr`] a modify sets (`enum ibv_qp_attr_mask`, same bit values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct QpAttrMask: u32 {
        /// `qp_state`: the state to move to (`IBV_QP_STATE`).
        const STATE = 1 << 0;
        /// `cur_qp_state`: the state the caller believes the QP is in (`IBV_QP_CUR_STATE`).
        const CUR_STATE = 1 << 1;
        /// `en_sqd_async_notify`: raise an event once SQD has drained
        /// (`IBV_QP_EN_SQD_ASYNC_NOTIFY`).
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `qp_access_flags`: which remote operations the responder allows (`IBV_QP_ACCESS_FLAGS`).
        const ACCESS_FLAGS = 1 << 3;
        /// `pkey_index` (`IBV_QP_PKEY_INDEX`).
        const PKEY_INDEX = 1 << 4;
        /// `port_num` (`IBV_QP_PORT`).
        const PORT = 1 << 5;
        /// `qkey`, for UD (`IBV_QP_QKEY`).
        const QKEY = 1 << 6;
        /// `ah_attr`: the primary path to the remote QP (`IBV_QP_AV`).
        const AV = 1 << 7;
        /// `path_mtu` (`IBV_QP_PATH_MTU`).
        const PATH_MTU = 1 << 8;
        /// `timeout`: the local ACK timeout code (`IBV_QP_TIMEOUT`).
        const TIMEOUT = 1 << 9;
        /// `retry_cnt` (`IBV_QP_RETRY_CNT`).
        const RETRY_CNT = 1 << 10;
        /// `rnr_retry` (`IBV_QP_RNR_RETRY`).
        const RNR_RETRY = 1 << 11;
        /// `rq_psn`: the first PSN the responder expects (`IBV_QP_RQ_PSN`).
        const RQ_PSN = 1 << 12;
        /// `max_rd_atomic`: outstanding READ/ATOMIC as initiator (`IBV_QP_MAX_QP_RD_ATOMIC`).
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `alt_ah_attr`, `alt_pkey_index`, `alt_port_num`, `alt_timeout` (`IBV_QP_ALT_PATH`).
        const ALT_PATH = 1 << 14;
        /// `min_rnr_timer`: the RNR NAK timer code we advertise (`IBV_QP_MIN_RNR_TIMER`).
        const MIN_RNR_TIMER = 1 << 15;
        /// `sq_psn`: the first PSN the requester sends (`IBV_QP_SQ_PSN`).
        const SQ_PSN = 1 << 16;
        /// `max_dest_rd_atomic`: READ/ATOMIC resources as responder (`IBV_QP_MAX_DEST_RD_ATOMIC`).
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `path_mig_state` (`IBV_QP_PATH_MIG_STATE`).
        const PATH_MIG_STATE = 1 << 18;
        /// `cap`: queue sizes; never modifiable on RC/UC/UD (`IBV_QP_CAP`).
        const CAP = 1 << 19;
        /// `dest_qp_num`: the remote QPN (`IBV_QP_DEST_QPN`).
        const DEST_QPN = 1 << 20;
        /// `rate_limit`: packet pacing, raw packet QPs only (`IBV_QP_RATE_LIMIT`).
        const RATE_LIMIT = 1 << 25;
    }
}

bitflags! {
    /// Memory and QP access rights (`enum ibv_access_flags`, same bit values); used by QPs
    /// (`qp_access_flags`), MRs and MWs.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The HCA may write local memory (receives, READ responses) (`IBV_ACCESS_LOCAL_WRITE`).
        const LOCAL_WRITE = 1 << 0;
        /// Remote peers may RDMA WRITE (`IBV_ACCESS_REMOTE_WRITE`).
        const REMOTE_WRITE = 1 << 1;
        /// Remote peers may RDMA READ (`IBV_ACCESS_REMOTE_READ`).
        const REMOTE_READ = 1 << 2;
        /// Remote peers may perform ATOMIC operations (`IBV_ACCESS_REMOTE_ATOMIC`).
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to the MR (`IBV_ACCESS_MW_BIND`).
        const MW_BIND = 1 << 4;
        /// Addresses are offsets from the MR start (`IBV_ACCESS_ZERO_BASED`).
        const ZERO_BASED = 1 << 5;
        /// On-demand paging (`IBV_ACCESS_ON_DEMAND`).
        const ON_DEMAND = 1 << 6;
        /// The memory is backed by huge pages (`IBV_ACCESS_HUGETLB`).
        const HUGETLB = 1 << 7;
        /// Remote FLUSH to global visibility (`IBV_ACCESS_FLUSH_GLOBAL`).
        const FLUSH_GLOBAL = 1 << 8;
        /// Remote FLUSH to persistence (`IBV_ACCESS_FLUSH_PERSISTENT`).
        const FLUSH_PERSISTENT = 1 << 9;
        /// Relaxed PCI ordering hint, ignored by a soft RNIC (`IBV_ACCESS_RELAXED_ORDERING`).
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl AccessFlags {
    /// The flags that mean something in a QP's `qp_access_flags` (IBA Modify QP: remote write,
    /// read and atomic enables; local write is tolerated, as verbs programs commonly pass it).
    pub const QP_ALLOWED: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);

    /// Whether these flags may register an MR: no unknown bits, and the IBA rule (enforced by
    /// Linux's `ib_check_mr_access`) that remote write or remote atomic access requires local
    /// write; otherwise `ibv_reg_mr` fails with EINVAL.
    pub const fn is_valid_for_mr(self) -> bool {
        let known = self.bits() & !AccessFlags::all().bits() == 0;
        let needs_local =
            self.intersects(AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_ATOMIC));
        known && (!needs_local || self.contains(AccessFlags::LOCAL_WRITE))
    }
}

/// An address vector (`struct ibv_ah_attr` with its GRH): how to reach the remote port. On RoCE
/// every packet carries an IP header built from the GRH fields, so `is_global` must be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID (a RoCEv2 GID is an IPv6 or IPv4-mapped address), network byte order.
    pub dgid: [u8; 16],
    /// Index of the local GID (source address) in the port's GID table.
    pub sgid_index: u8,
    /// IP TTL / hop limit.
    pub hop_limit: u8,
    /// IP traffic class (DSCP and ECN bits).
    pub traffic_class: u8,
    /// IPv6 flow label. The GRH holds 20 bits; the higher bits of the `u32` are accepted and
    /// ignored, as Linux does (UCX passes `~path_index` here, see [`AhAttr::grh_flow_label`]).
    pub flow_label: u32,
    /// Destination LID; unused on RoCE.
    pub dlid: u16,
    /// Service level (4 bits); on RoCE it selects the Ethernet priority.
    pub sl: u8,
    /// Static rate limit (`enum ibv_rate`); 0 means the port's current rate.
    pub static_rate: u8,
    /// Local port the path leaves from (1-based).
    pub port_num: u8,
    /// Whether the GRH fields above are valid; RoCE requires it.
    pub is_global: bool,
}

/// The 20 bits of an IPv6 / GRH flow label.
pub const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

impl AhAttr {
    /// The flow label the packets carry: the low 20 bits of [`AhAttr::flow_label`]. Linux
    /// takes any `u32` from `ibv_modify_qp` and `ibv_create_ah` and keeps 20 of them on the
    /// wire and in the UDP source port (`rdma_get_udp_sport`); UCX relies on it, setting
    /// `~(path factor × path index)` on RoCE.
    pub const fn grh_flow_label(&self) -> u32 {
        self.flow_label & FLOW_LABEL_MASK
    }
}

impl Default for AhAttr {
    /// A RoCE-ready vector: port 1, GRH on, hop limit 64, everything else zero.
    fn default() -> Self {
        AhAttr {
            dgid: [0; 16],
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
            dlid: 0,
            sl: 0,
            static_rate: 0,
            port_num: 1,
            is_global: true,
        }
    }
}

/// Queue sizes of a QP (`struct ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct QpCap {
    /// Send queue depth in WRs.
    pub max_send_wr: u32,
    /// Receive queue depth in WRs.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Bytes of inline data per send WR.
    pub max_inline_data: u32,
}

/// Every QP attribute softrdma supports (`struct ibv_qp_attr`): the input of `modify_qp` (fields
/// selected by a [`QpAttrMask`]) and the output of `query_qp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QpAttr {
    /// The state to move to (modify) or the current state (query).
    pub qp_state: QpState,
    /// The state the caller asserts the QP is in (modify with `CUR_STATE`).
    pub cur_qp_state: QpState,
    /// Path MTU (RC/UC).
    pub path_mtu: Mtu,
    /// Path migration state.
    pub path_mig_state: MigState,
    /// Q_Key checked on UD receives and used for UD sends whose WR has none.
    pub qkey: u32,
    /// First expected receive PSN (24 bits).
    pub rq_psn: u32,
    /// First send PSN (24 bits).
    pub sq_psn: u32,
    /// Remote QP number (RC/UC).
    pub dest_qp_num: Qpn,
    /// Remote operations the responder allows (RC/UC).
    pub qp_access_flags: AccessFlags,
    /// Queue sizes (query only; never modifiable).
    pub cap: QpCap,
    /// Primary path (RC/UC).
    pub ah_attr: AhAttr,
    /// Alternate path for automatic path migration (RC/UC).
    pub alt_ah_attr: AhAttr,
    /// Index of the primary P_Key in the port's P_Key table.
    pub pkey_index: u16,
    /// Index of the alternate path's P_Key.
    pub alt_pkey_index: u16,
    /// Raise an async event when the SQ has drained (RTS → SQD).
    pub en_sqd_async_notify: bool,
    /// Whether the QP is in SQD and still draining (query only).
    pub sq_draining: bool,
    /// READ/ATOMIC requests this QP may have outstanding as initiator (RC).
    pub max_rd_atomic: u8,
    /// READ/ATOMIC requests this QP accepts outstanding as responder (RC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (0..=31) advertised to the requester (RC).
    pub min_rnr_timer: u8,
    /// Local port (1-based).
    pub port_num: u8,
    /// Local ACK timeout code (0..=31): 4.096 µs × 2^timeout; 0 means infinite (RC).
    pub timeout: u8,
    /// Transport retries after a timeout or NAK sequence error (0..=7; RC).
    pub retry_cnt: u8,
    /// RNR NAK retries (0..=7, 7 = infinite; RC).
    pub rnr_retry: u8,
    /// Local port of the alternate path.
    pub alt_port_num: u8,
    /// Local ACK timeout code of the alternate path.
    pub alt_timeout: u8,
    /// Packet pacing rate in kbps (raw packet QPs only).
    pub rate_limit: u32,
}

impl Default for QpAttr {
    /// A QP in RESET: zeroes everywhere, except port 1, path MTU 256 and a RoCE-ready [`AhAttr`].
    fn default() -> Self {
        QpAttr {
            qp_state: QpState::Reset,
            cur_qp_state: QpState::Reset,
            path_mtu: Mtu::Mtu256,
            path_mig_state: MigState::default(),
            qkey: 0,
            rq_psn: 0,
            sq_psn: 0,
            dest_qp_num: Qpn::new(0),
            qp_access_flags: AccessFlags::empty(),
            cap: QpCap::default(),
            ah_attr: AhAttr::default(),
            alt_ah_attr: AhAttr::default(),
            pkey_index: 0,
            alt_pkey_index: 0,
            en_sqd_async_notify: false,
            sq_draining: false,
            max_rd_atomic: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            port_num: 1,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            alt_port_num: 1,
            alt_timeout: 0,
            rate_limit: 0,
        }
    }
}

impl QpAttr {
    /// Records a successful modify: copies every field `mask` selects from `new` into `self`
    /// (`STATE` also sets `cur_qp_state`, so a later query reports the state in both). Call it
    /// only after [`check_modify`] accepted `(new, mask)`. `sq_draining` is the engine's to set.
    pub fn apply(&mut self, new: &QpAttr, mask: QpAttrMask) {
        type M = QpAttrMask;
        if mask.contains(M::STATE) {
            self.qp_state = new.qp_state;
            self.cur_qp_state = new.qp_state;
        }
        if mask.contains(M::EN_SQD_ASYNC_NOTIFY) {
            self.en_sqd_async_notify = new.en_sqd_async_notify;
        }
        if mask.contains(M::ACCESS_FLAGS) {
            self.qp_access_flags = new.qp_access_flags;
        }
        if mask.contains(M::PKEY_INDEX) {
            self.pkey_index = new.pkey_index;
        }
        if mask.contains(M::PORT) {
            self.port_num = new.port_num;
        }
        if mask.contains(M::QKEY) {
            self.qkey = new.qkey;
        }
        if mask.contains(M::AV) {
            self.ah_attr = new.ah_attr;
        }
        if mask.contains(M::PATH_MTU) {
            self.path_mtu = new.path_mtu;
        }
        if mask.contains(M::TIMEOUT) {
            self.timeout = new.timeout;
        }
        if mask.contains(M::RETRY_CNT) {
            self.retry_cnt = new.retry_cnt;
        }
        if mask.contains(M::RNR_RETRY) {
            self.rnr_retry = new.rnr_retry;
        }
        if mask.contains(M::RQ_PSN) {
            self.rq_psn = new.rq_psn;
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) {
            self.max_rd_atomic = new.max_rd_atomic;
        }
        if mask.contains(M::ALT_PATH) {
            self.alt_ah_attr = new.alt_ah_attr;
            self.alt_pkey_index = new.alt_pkey_index;
            self.alt_port_num = new.alt_port_num;
            self.alt_timeout = new.alt_timeout;
        }
        if mask.contains(M::MIN_RNR_TIMER) {
            self.min_rnr_timer = new.min_rnr_timer;
        }
        if mask.contains(M::SQ_PSN) {
            self.sq_psn = new.sq_psn;
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) {
            self.max_dest_rd_atomic = new.max_dest_rd_atomic;
        }
        if mask.contains(M::PATH_MIG_STATE) {
            self.path_mig_state = new.path_mig_state;
        }
        if mask.contains(M::CAP) {
            self.cap = new.cap;
        }
        if mask.contains(M::DEST_QPN) {
            self.dest_qp_num = new.dest_qp_num;
        }
        if mask.contains(M::RATE_LIMIT) {
            self.rate_limit = new.rate_limit;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_values_match_libibverbs() {
        assert_eq!(QpAttrMask::STATE.bits(), 1);
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(QpAttrMask::RATE_LIMIT.bits(), 1 << 25);
        assert_eq!(AccessFlags::ON_DEMAND.bits(), 64);
        assert_eq!(QpState::Err.to_ibv(), 6);
        assert_eq!(QpType::Ud.to_ibv(), 4);
        assert_eq!(Mtu::Mtu4096.to_ibv(), 5);
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(MigState::Armed.to_ibv(), 2);
    }

    #[test]
    fn conversions_from_ibv_numbers_round_trip_and_reject_unknowns() {
        for s in QpState::ALL {
            assert_eq!(QpState::try_from(s.to_ibv()), Ok(s));
        }
        assert!(QpState::try_from(7).is_err());
        assert_eq!(QpType::try_from(2), Ok(QpType::Rc));
        assert!(QpType::try_from(8).is_err());
        assert_eq!(MigState::try_from(1), Ok(MigState::Rearm));
        assert!(MigState::try_from(3).is_err());
    }

    #[test]
    fn apply_copies_only_masked_fields_and_reports_the_state_in_both_fields() {
        let mut stored = QpAttr {
            qp_state: QpState::Init,
            cur_qp_state: QpState::Init,
            qkey: 7,
            ..QpAttr::default()
        };
        let new = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu1024,
            rq_psn: 0x00ab_cdef,
            qkey: 99,
            ..QpAttr::default()
        };
        stored.apply(
            &new,
            QpAttrMask::STATE | QpAttrMask::PATH_MTU | QpAttrMask::RQ_PSN,
        );
        assert_eq!(stored.qp_state, QpState::Rtr);
        assert_eq!(stored.cur_qp_state, QpState::Rtr);
        assert_eq!(stored.rq_psn, 0x00ab_cdef);
        assert_eq!(stored.path_mtu, Mtu::Mtu1024);
        assert_eq!(stored.qkey, 7, "QKEY was not in the mask");
    }

    #[test]
    fn mr_access_needs_local_write_for_remote_write_and_atomic() {
        assert!(AccessFlags::empty().is_valid_for_mr());
        assert!(AccessFlags::REMOTE_READ.is_valid_for_mr());
        assert!(!AccessFlags::REMOTE_WRITE.is_valid_for_mr());
        assert!(!AccessFlags::REMOTE_ATOMIC.is_valid_for_mr());
        assert!((AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC).is_valid_for_mr());
        assert!(!AccessFlags::from_bits_retain(1 << 12).is_valid_for_mr());
    }
}
