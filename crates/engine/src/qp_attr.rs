//! QP attributes and the IBA QP state machine, as data.
//!
//! Everything a `modify_qp` call needs to be checked against lives here: the verbs vocabulary
//! (QP types and states, `IBV_QP_*` attribute mask bits, `IBV_ACCESS_*` flags, address vectors,
//! QP capabilities, the full `ibv_qp_attr`), the transition table (which `from → to` transitions
//! exist and which attributes each one requires and allows, per QP type), and [`check_modify`],
//! which applies that table plus the value checks a real HCA makes.
//!
//! The table follows IBA vol. 1 (ch. 10 QP states, ch. 11 Modify QP) as Linux encodes it
//! (`qp_state_table` in `drivers/infiniband/core/verbs.c`), so a libibverbs program sees the
//! same accept/reject decisions (and `EINVAL` errno) on softrdma as on a kernel-driven RNIC.
//! Numeric values of every enum and bit mirror rdma-core's `<infiniband/verbs.h>`, so the C ABI
//! layer converts with `to_ibv` / `TryFrom<u32>` (`Mtu::from_ibv` for the MTU,
//! `from_bits_retain` for the masks).
//!
//! This module is pure: no state, no I/O, no allocation. The QP object owns a [`QpAttr`] and calls
//! [`check_modify`], then [`QpAttr::apply`].

use core::fmt;

use bitflags::bitflags;

/// The path MTU type (`enum ibv_mtu`), shared with the wire codec.
pub use wire::Mtu;

/// The verbs name for a QP's path MTU: the same type as [`Mtu`].
pub type PathMtu = Mtu;

/// `EINVAL` as Linux numbers it: what `ibv_modify_qp` returns for every rejected modify.
const EINVAL: i32 = 22;

/// Largest value of a 24-bit wire field (PSN, QPN).
const MAX_24_BIT: u32 = 0x00ff_ffff;

/// Largest 5-bit timer code (local ACK timeout, RNR NAK timer): both are 5-bit fields in IBA.
const MAX_TIMER_CODE: u8 = 31;

/// Largest 3-bit retry count (`retry_cnt`, `rnr_retry`; 7 means "infinite" for `rnr_retry`).
const MAX_RETRY: u8 = 7;

/// Largest 20-bit IPv6 / GRH flow label.
const MAX_FLOW_LABEL: u32 = 0x000f_ffff;

/// Largest 4-bit service level.
const MAX_SL: u8 = 15;

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
    /// IPv6 flow label (20 bits).
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
    /// Remote QP number (24 bits; RC/UC).
    pub dest_qp_num: u32,
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
            dest_qp_num: 0,
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

/// The device and port limits a modify is checked against; the engine fills it from its device
/// and port attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpLimits {
    /// Largest `max_rd_atomic` (the device's `max_qp_init_rd_atom`).
    pub max_rd_atomic: u8,
    /// Largest `max_dest_rd_atomic` (the device's `max_qp_rd_atom`).
    pub max_dest_rd_atomic: u8,
    /// Largest path MTU (the port's `max_mtu`).
    pub max_path_mtu: Mtu,
    /// Number of ports; valid port numbers are `1..=port_count`.
    pub port_count: u8,
    /// Entries in the P_Key table; valid indexes are `0..pkey_table_len` (RoCE: one entry).
    pub pkey_table_len: u16,
    /// Entries in the GID table; valid `sgid_index` values are `0..gid_table_len`.
    pub gid_table_len: u16,
    /// Whether alternate paths (APM) are supported. Linux rejects `IBV_QP_ALT_PATH` on RoCE
    /// ports with EINVAL, so a RoCE device leaves this off.
    pub alt_path_supported: bool,
}

impl Default for QpLimits {
    /// One RoCE port: MTU up to 4096, 16 READ/ATOMIC resources each way, 1 P_Key, 16 GIDs, no APM.
    fn default() -> Self {
        QpLimits {
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            max_path_mtu: Mtu::Mtu4096,
            port_count: 1,
            pkey_table_len: 1,
            gid_table_len: 16,
            alt_path_supported: false,
        }
    }
}

/// Why a modify was rejected. Every variant reaches a libibverbs caller as `EINVAL`, as on Linux.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModifyError {
    /// The QP type has no `from → to` transition (RESET → RTR, RTS → SQE, RESET → ERR, ...).
    #[error("no {from} -> {to} transition")]
    InvalidTransition {
        /// The QP's current state.
        from: QpState,
        /// The requested state (the current one when `STATE` is not in the mask).
        to: QpState,
    },
    /// Attributes the transition requires are not in the mask (all the missing bits).
    #[error("required attributes missing: {0:?}")]
    MissingAttribute(QpAttrMask),
    /// Attributes the transition neither requires nor allows are in the mask (all such bits,
    /// including bits libibverbs does not define).
    #[error("attributes not allowed in this transition: {0:?}")]
    ForbiddenAttribute(QpAttrMask),
    /// `CUR_STATE` was given and names a state the QP is not in.
    #[error("cur_qp_state {claimed} given, but the QP is in {actual}")]
    CurStateMismatch {
        /// The QP's real state.
        actual: QpState,
        /// What the caller asserted.
        claimed: QpState,
    },
    /// An attribute's value is outside the range the HCA accepts.
    #[error("{field} = {value} is out of range {min}..={max}")]
    InvalidValue {
        /// The mask bit that selected the field.
        attr: QpAttrMask,
        /// The field's name, as in `struct ibv_qp_attr` (`"ah_attr.sgid_index"`, ...).
        field: &'static str,
        /// The rejected value (a path MTU in bytes, a boolean as 0/1).
        value: u64,
        /// Smallest accepted value.
        min: u64,
        /// Largest accepted value.
        max: u64,
    },
    /// `qp_access_flags` holds flags that mean nothing for a QP (the offending bits).
    #[error("qp_access_flags has flags a QP does not take: {0:?}")]
    InvalidAccessFlags(AccessFlags),
    /// The transition allows the attribute but this device does not implement it (alternate
    /// paths on RoCE).
    #[error("attributes not supported by this device: {0:?}")]
    Unsupported(QpAttrMask),
    /// The QP is in SQD and its send queue has not drained yet; only RESET and ERR are allowed
    /// until the SQ-drained event (IBA, SQD state).
    #[error("the send queue is still draining")]
    SqDraining,
}

impl ModifyError {
    /// The errno `ibv_modify_qp` returns for this error (Linux returns EINVAL for all of them).
    pub const fn errno(&self) -> i32 {
        match self {
            ModifyError::InvalidTransition { .. }
            | ModifyError::MissingAttribute(_)
            | ModifyError::ForbiddenAttribute(_)
            | ModifyError::CurStateMismatch { .. }
            | ModifyError::InvalidValue { .. }
            | ModifyError::InvalidAccessFlags(_)
            | ModifyError::Unsupported(_)
            | ModifyError::SqDraining => EINVAL,
        }
    }
}

/// What one transition demands of one QP type. `STATE` is implied and never listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransitionRule {
    /// Attributes the caller must supply.
    pub required: QpAttrMask,
    /// Attributes the caller may supply; anything else is forbidden.
    pub optional: QpAttrMask,
}

/// One row of the transition table: a `from → to` transition and its rule per QP type.
struct Row {
    from: QpState,
    to: QpState,
    rc: TransitionRule,
    uc: TransitionRule,
    ud: TransitionRule,
}

/// Builds a mask from a list of flags, in const context.
const fn mask(flags: &[QpAttrMask]) -> QpAttrMask {
    let mut bits = 0;
    let mut i = 0;
    while i < flags.len() {
        bits |= flags[i].bits();
        i += 1;
    }
    QpAttrMask::from_bits_retain(bits)
}

/// A rule from its required and optional flag lists.
const fn rule(required: &[QpAttrMask], optional: &[QpAttrMask]) -> TransitionRule {
    TransitionRule {
        required: mask(required),
        optional: mask(optional),
    }
}

/// A transition that takes no attribute besides `STATE` (to RESET, to ERR, RESET → RESET).
const BARE: TransitionRule = rule(&[], &[]);

/// A row whose rule is [`BARE`] for every QP type.
const fn bare(from: QpState, to: QpState) -> Row {
    Row {
        from,
        to,
        rc: BARE,
        uc: BARE,
        ud: BARE,
    }
}

/// The QP state machine (IBA ch. 10 states and the Modify QP attribute rules of ch. 11, as Linux's
/// `qp_state_table` encodes it). A transition not listed here does not exist. Notes:
/// - RESET → ERR does not exist (Linux rejects it); every other state may go to ERR and RESET.
/// - SQE is entered only by the HCA, never by a modify; RC never enters it (an RC send error
///   moves the QP to ERR), so RC's SQE → RTS row is unreachable and, as in Linux, takes nothing.
/// - `CUR_STATE` is optional only where the HCA may have changed the state behind the
///   caller's back (leaving RTR, RTS, SQD or SQE for RTS).
const TABLE: &[Row] = {
    use QpState::{Err, Init, Reset, Rtr, Rts, Sqd, Sqe};
    type M = QpAttrMask;
    &[
        bare(Reset, Reset),
        Row {
            from: Reset,
            to: Init,
            rc: rule(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS], &[]),
            uc: rule(&[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS], &[]),
            ud: rule(&[M::PKEY_INDEX, M::PORT, M::QKEY], &[]),
        },
        bare(Init, Reset),
        bare(Init, Err),
        Row {
            from: Init,
            to: Init,
            rc: rule(&[], &[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS]),
            uc: rule(&[], &[M::PKEY_INDEX, M::PORT, M::ACCESS_FLAGS]),
            ud: rule(&[], &[M::PKEY_INDEX, M::PORT, M::QKEY]),
        },
        Row {
            from: Init,
            to: Rtr,
            rc: rule(
                &[
                    M::AV,
                    M::PATH_MTU,
                    M::DEST_QPN,
                    M::RQ_PSN,
                    M::MAX_DEST_RD_ATOMIC,
                    M::MIN_RNR_TIMER,
                ],
                &[M::ALT_PATH, M::ACCESS_FLAGS, M::PKEY_INDEX],
            ),
            uc: rule(
                &[M::AV, M::PATH_MTU, M::DEST_QPN, M::RQ_PSN],
                &[M::ALT_PATH, M::ACCESS_FLAGS, M::PKEY_INDEX],
            ),
            ud: rule(&[], &[M::PKEY_INDEX, M::QKEY]),
        },
        bare(Rtr, Reset),
        bare(Rtr, Err),
        Row {
            from: Rtr,
            to: Rts,
            rc: rule(
                &[
                    M::TIMEOUT,
                    M::RETRY_CNT,
                    M::RNR_RETRY,
                    M::SQ_PSN,
                    M::MAX_QP_RD_ATOMIC,
                ],
                &[
                    M::CUR_STATE,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::MIN_RNR_TIMER,
                    M::PATH_MIG_STATE,
                ],
            ),
            uc: rule(
                &[M::SQ_PSN],
                &[
                    M::CUR_STATE,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::PATH_MIG_STATE,
                ],
            ),
            ud: rule(&[M::SQ_PSN], &[M::CUR_STATE, M::QKEY]),
        },
        bare(Rts, Reset),
        bare(Rts, Err),
        Row {
            from: Rts,
            to: Rts,
            rc: rule(
                &[],
                &[
                    M::CUR_STATE,
                    M::ACCESS_FLAGS,
                    M::ALT_PATH,
                    M::PATH_MIG_STATE,
                    M::MIN_RNR_TIMER,
                ],
            ),
            uc: rule(
                &[],
                &[
                    M::CUR_STATE,
                    M::ACCESS_FLAGS,
                    M::ALT_PATH,
                    M::PATH_MIG_STATE,
                ],
            ),
            ud: rule(&[], &[M::CUR_STATE, M::QKEY]),
        },
        Row {
            from: Rts,
            to: Sqd,
            rc: rule(&[], &[M::EN_SQD_ASYNC_NOTIFY]),
            uc: rule(&[], &[M::EN_SQD_ASYNC_NOTIFY]),
            ud: rule(&[], &[M::EN_SQD_ASYNC_NOTIFY]),
        },
        bare(Sqd, Reset),
        bare(Sqd, Err),
        Row {
            from: Sqd,
            to: Rts,
            rc: rule(
                &[],
                &[
                    M::CUR_STATE,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::MIN_RNR_TIMER,
                    M::PATH_MIG_STATE,
                ],
            ),
            uc: rule(
                &[],
                &[
                    M::CUR_STATE,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::PATH_MIG_STATE,
                ],
            ),
            ud: rule(&[], &[M::CUR_STATE, M::QKEY]),
        },
        Row {
            from: Sqd,
            to: Sqd,
            rc: rule(
                &[],
                &[
                    M::PORT,
                    M::AV,
                    M::TIMEOUT,
                    M::RETRY_CNT,
                    M::RNR_RETRY,
                    M::MAX_QP_RD_ATOMIC,
                    M::MAX_DEST_RD_ATOMIC,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::PKEY_INDEX,
                    M::MIN_RNR_TIMER,
                    M::PATH_MIG_STATE,
                ],
            ),
            uc: rule(
                &[],
                &[
                    M::AV,
                    M::ALT_PATH,
                    M::ACCESS_FLAGS,
                    M::PKEY_INDEX,
                    M::PATH_MIG_STATE,
                ],
            ),
            ud: rule(&[], &[M::PKEY_INDEX, M::QKEY]),
        },
        bare(Sqe, Reset),
        bare(Sqe, Err),
        Row {
            from: Sqe,
            to: Rts,
            rc: BARE,
            uc: rule(&[], &[M::CUR_STATE, M::ACCESS_FLAGS]),
            ud: rule(&[], &[M::CUR_STATE, M::QKEY]),
        },
        bare(Err, Reset),
        bare(Err, Err),
    ]
};

/// The rule for `from → to` on a QP of type `qp_type`; `None` if the transition does not exist.
pub fn transition_rule(qp_type: QpType, from: QpState, to: QpState) -> Option<TransitionRule> {
    TABLE
        .iter()
        .find(|row| row.from == from && row.to == to)
        .map(|row| match qp_type {
            QpType::Rc => row.rc,
            QpType::Uc => row.uc,
            QpType::Ud => row.ud,
        })
}

/// Checks a `modify_qp(attr, mask)` on a QP of type `qp_type` in state `current`, and returns the
/// state the QP moves to (`attr.qp_state` when `STATE` is in the mask, else `current`).
///
/// In order: the transition must exist; every required attribute must be present; nothing outside
/// required ∪ optional ∪ `STATE` may be present; then each present attribute's value is checked
/// as an HCA does (ranges of timers and retry counts, 24-bit PSNs and QPN, port, P_Key and GID
/// indexes, path MTU and READ/ATOMIC depths against `limits`, GRH on RoCE, `cur_qp_state`).
///
/// Unlike Linux, which masks an oversized PSN to 24 bits with a warning, a PSN above 2^24 - 1 is
/// rejected here; a C ABI layer wanting Linux's leniency masks before calling. Whether the SQ
/// has drained is the QP's runtime state: check it with [`check_sq_drained`] too.
///
/// # Errors
///
/// [`ModifyError::InvalidTransition`], [`ModifyError::MissingAttribute`] and
/// [`ModifyError::ForbiddenAttribute`] when the table says no (each reporting every offending
/// bit); [`ModifyError::Unsupported`] for an alternate path the device lacks; and
/// [`ModifyError::CurStateMismatch`], [`ModifyError::InvalidAccessFlags`] or
/// [`ModifyError::InvalidValue`] for the first bad value, in mask-bit order.
pub fn check_modify(
    qp_type: QpType,
    current: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
    limits: &QpLimits,
) -> Result<QpState, ModifyError> {
    let next = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        current
    };
    let rule = transition_rule(qp_type, current, next).ok_or(ModifyError::InvalidTransition {
        from: current,
        to: next,
    })?;
    let missing = rule.required.difference(mask);
    if !missing.is_empty() {
        return Err(ModifyError::MissingAttribute(missing));
    }
    let allowed = rule.required | rule.optional | QpAttrMask::STATE;
    // `difference` keeps bits libibverbs does not define, so they are reported as forbidden too.
    let forbidden = mask.difference(allowed);
    if !forbidden.is_empty() {
        return Err(ModifyError::ForbiddenAttribute(forbidden));
    }
    check_values(current, attr, mask, limits)?;
    Ok(next)
}

/// Checks the IBA rule that a QP in SQD whose send queue is still draining may only go to ERR or
/// RESET: attributes may change, and RTS may be re-entered, only after the SQ-drained event.
///
/// # Errors
///
/// [`ModifyError::SqDraining`] when the QP is in SQD, still draining, and `next` is neither
/// ERR nor RESET.
pub fn check_sq_drained(
    current: QpState,
    next: QpState,
    sq_draining: bool,
) -> Result<(), ModifyError> {
    if current == QpState::Sqd && sq_draining && !matches!(next, QpState::Reset | QpState::Err) {
        return Err(ModifyError::SqDraining);
    }
    Ok(())
}

/// Fails with [`ModifyError::InvalidValue`] unless `min <= value <= max`.
fn in_range(
    attr: QpAttrMask,
    field: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<(), ModifyError> {
    if value < min || value > max {
        return Err(ModifyError::InvalidValue {
            attr,
            field,
            value,
            min,
            max,
        });
    }
    Ok(())
}

/// Fails unless `index` is below `len` (a table index).
fn index_below(
    attr: QpAttrMask,
    field: &'static str,
    index: u64,
    len: u64,
) -> Result<(), ModifyError> {
    if index >= len {
        return Err(ModifyError::InvalidValue {
            attr,
            field,
            value: index,
            min: 0,
            max: len.saturating_sub(1),
        });
    }
    Ok(())
}

/// Fails unless `port` names one of the device's ports.
fn valid_port(
    attr: QpAttrMask,
    field: &'static str,
    port: u8,
    limits: &QpLimits,
) -> Result<(), ModifyError> {
    in_range(attr, field, port.into(), 1, limits.port_count.into())
}

/// Checks an address vector (the primary or the alternate path, named by `names`).
fn check_ah(
    attr: QpAttrMask,
    ah: &AhAttr,
    names: &AhFieldNames,
    limits: &QpLimits,
) -> Result<(), ModifyError> {
    valid_port(attr, names.port_num, ah.port_num, limits)?;
    // RoCE has no LRH: the IP header of every packet comes from the GRH (Linux: EINVAL without).
    in_range(attr, names.is_global, ah.is_global.into(), 1, 1)?;
    index_below(
        attr,
        names.sgid_index,
        ah.sgid_index.into(),
        limits.gid_table_len.into(),
    )?;
    in_range(
        attr,
        names.flow_label,
        ah.flow_label.into(),
        0,
        MAX_FLOW_LABEL.into(),
    )?;
    in_range(attr, names.sl, ah.sl.into(), 0, MAX_SL.into())
}

/// The field names reported for one address vector.
struct AhFieldNames {
    port_num: &'static str,
    is_global: &'static str,
    sgid_index: &'static str,
    flow_label: &'static str,
    sl: &'static str,
}

/// Names for `ah_attr`.
const AH_NAMES: AhFieldNames = AhFieldNames {
    port_num: "ah_attr.port_num",
    is_global: "ah_attr.is_global",
    sgid_index: "ah_attr.grh.sgid_index",
    flow_label: "ah_attr.grh.flow_label",
    sl: "ah_attr.sl",
};

/// Names for `alt_ah_attr`.
const ALT_AH_NAMES: AhFieldNames = AhFieldNames {
    port_num: "alt_ah_attr.port_num",
    is_global: "alt_ah_attr.is_global",
    sgid_index: "alt_ah_attr.grh.sgid_index",
    flow_label: "alt_ah_attr.grh.flow_label",
    sl: "alt_ah_attr.sl",
};

/// The value checks of [`check_modify`], for the attributes present in `mask`, in bit order.
fn check_values(
    current: QpState,
    attr: &QpAttr,
    mask: QpAttrMask,
    limits: &QpLimits,
) -> Result<(), ModifyError> {
    type M = QpAttrMask;
    if mask.contains(M::CUR_STATE) && attr.cur_qp_state != current {
        return Err(ModifyError::CurStateMismatch {
            actual: current,
            claimed: attr.cur_qp_state,
        });
    }
    if mask.contains(M::ACCESS_FLAGS) {
        let extra = attr.qp_access_flags.difference(AccessFlags::QP_ALLOWED);
        if !extra.is_empty() {
            return Err(ModifyError::InvalidAccessFlags(extra));
        }
    }
    if mask.contains(M::PKEY_INDEX) {
        index_below(
            M::PKEY_INDEX,
            "pkey_index",
            attr.pkey_index.into(),
            limits.pkey_table_len.into(),
        )?;
    }
    if mask.contains(M::PORT) {
        valid_port(M::PORT, "port_num", attr.port_num, limits)?;
    }
    if mask.contains(M::AV) {
        check_ah(M::AV, &attr.ah_attr, &AH_NAMES, limits)?;
    }
    if mask.contains(M::PATH_MTU) {
        // `bytes()` is at most 4096: the casts are lossless.
        in_range(
            M::PATH_MTU,
            "path_mtu",
            attr.path_mtu.bytes() as u64,
            Mtu::Mtu256.bytes() as u64,
            limits.max_path_mtu.bytes() as u64,
        )?;
    }
    if mask.contains(M::TIMEOUT) {
        in_range(
            M::TIMEOUT,
            "timeout",
            attr.timeout.into(),
            0,
            MAX_TIMER_CODE.into(),
        )?;
    }
    if mask.contains(M::RETRY_CNT) {
        in_range(
            M::RETRY_CNT,
            "retry_cnt",
            attr.retry_cnt.into(),
            0,
            MAX_RETRY.into(),
        )?;
    }
    if mask.contains(M::RNR_RETRY) {
        in_range(
            M::RNR_RETRY,
            "rnr_retry",
            attr.rnr_retry.into(),
            0,
            MAX_RETRY.into(),
        )?;
    }
    if mask.contains(M::RQ_PSN) {
        in_range(
            M::RQ_PSN,
            "rq_psn",
            attr.rq_psn.into(),
            0,
            MAX_24_BIT.into(),
        )?;
    }
    if mask.contains(M::MAX_QP_RD_ATOMIC) {
        in_range(
            M::MAX_QP_RD_ATOMIC,
            "max_rd_atomic",
            attr.max_rd_atomic.into(),
            0,
            limits.max_rd_atomic.into(),
        )?;
    }
    if mask.contains(M::ALT_PATH) {
        if !limits.alt_path_supported {
            return Err(ModifyError::Unsupported(M::ALT_PATH));
        }
        check_ah(M::ALT_PATH, &attr.alt_ah_attr, &ALT_AH_NAMES, limits)?;
        valid_port(M::ALT_PATH, "alt_port_num", attr.alt_port_num, limits)?;
        index_below(
            M::ALT_PATH,
            "alt_pkey_index",
            attr.alt_pkey_index.into(),
            limits.pkey_table_len.into(),
        )?;
        in_range(
            M::ALT_PATH,
            "alt_timeout",
            attr.alt_timeout.into(),
            0,
            MAX_TIMER_CODE.into(),
        )?;
    }
    if mask.contains(M::MIN_RNR_TIMER) {
        in_range(
            M::MIN_RNR_TIMER,
            "min_rnr_timer",
            attr.min_rnr_timer.into(),
            0,
            MAX_TIMER_CODE.into(),
        )?;
    }
    if mask.contains(M::SQ_PSN) {
        in_range(
            M::SQ_PSN,
            "sq_psn",
            attr.sq_psn.into(),
            0,
            MAX_24_BIT.into(),
        )?;
    }
    if mask.contains(M::MAX_DEST_RD_ATOMIC) {
        in_range(
            M::MAX_DEST_RD_ATOMIC,
            "max_dest_rd_atomic",
            attr.max_dest_rd_atomic.into(),
            0,
            limits.max_dest_rd_atomic.into(),
        )?;
    }
    if mask.contains(M::DEST_QPN) {
        in_range(
            M::DEST_QPN,
            "dest_qp_num",
            attr.dest_qp_num.into(),
            0,
            MAX_24_BIT.into(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc_rtr_attr() -> QpAttr {
        QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: 0x12,
            rq_psn: 0x00ab_cdef,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 12,
            ..QpAttr::default()
        }
    }

    const RC_RTR_MASK: QpAttrMask = QpAttrMask::STATE
        .union(QpAttrMask::AV)
        .union(QpAttrMask::PATH_MTU)
        .union(QpAttrMask::DEST_QPN)
        .union(QpAttrMask::RQ_PSN)
        .union(QpAttrMask::MAX_DEST_RD_ATOMIC)
        .union(QpAttrMask::MIN_RNR_TIMER);

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
    fn every_transition_row_is_listed_once() {
        for (i, a) in TABLE.iter().enumerate() {
            for b in &TABLE[i + 1..] {
                assert!(
                    !(a.from == b.from && a.to == b.to),
                    "{} -> {} listed twice",
                    a.from,
                    a.to
                );
            }
        }
    }

    #[test]
    fn rules_never_list_state_and_required_and_optional_are_disjoint() {
        for row in TABLE {
            for r in [row.rc, row.uc, row.ud] {
                assert!(!r.required.contains(QpAttrMask::STATE));
                assert!(!r.optional.contains(QpAttrMask::STATE));
                assert!(r.required.intersection(r.optional).is_empty());
            }
        }
    }

    #[test]
    fn rc_init_to_rtr_with_the_required_mask_moves_to_rtr() {
        let got = check_modify(
            QpType::Rc,
            QpState::Init,
            &rc_rtr_attr(),
            RC_RTR_MASK,
            &QpLimits::default(),
        );
        assert_eq!(got, Ok(QpState::Rtr));
    }

    #[test]
    fn several_missing_bits_are_reported_together() {
        let mask = RC_RTR_MASK - QpAttrMask::AV - QpAttrMask::RQ_PSN;
        let got = check_modify(
            QpType::Rc,
            QpState::Init,
            &rc_rtr_attr(),
            mask,
            &QpLimits::default(),
        );
        assert_eq!(
            got,
            Err(ModifyError::MissingAttribute(
                QpAttrMask::AV | QpAttrMask::RQ_PSN
            ))
        );
    }

    #[test]
    fn unknown_mask_bits_are_forbidden() {
        let mask = RC_RTR_MASK | QpAttrMask::from_bits_retain(1 << 22);
        let got = check_modify(
            QpType::Rc,
            QpState::Init,
            &rc_rtr_attr(),
            mask,
            &QpLimits::default(),
        );
        assert_eq!(
            got,
            Err(ModifyError::ForbiddenAttribute(
                QpAttrMask::from_bits_retain(1 << 22)
            ))
        );
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
            qkey: 99,
            ..rc_rtr_attr()
        };
        stored.apply(&new, RC_RTR_MASK);
        assert_eq!(stored.qp_state, QpState::Rtr);
        assert_eq!(stored.cur_qp_state, QpState::Rtr);
        assert_eq!(stored.rq_psn, 0x00ab_cdef);
        assert_eq!(stored.path_mtu, Mtu::Mtu1024);
        assert_eq!(stored.qkey, 7, "QKEY was not in the mask");
    }

    #[test]
    fn every_error_maps_to_einval() {
        let errors = [
            ModifyError::InvalidTransition {
                from: QpState::Reset,
                to: QpState::Rts,
            },
            ModifyError::MissingAttribute(QpAttrMask::AV),
            ModifyError::ForbiddenAttribute(QpAttrMask::CAP),
            ModifyError::CurStateMismatch {
                actual: QpState::Rts,
                claimed: QpState::Sqe,
            },
            ModifyError::InvalidValue {
                attr: QpAttrMask::TIMEOUT,
                field: "timeout",
                value: 32,
                min: 0,
                max: 31,
            },
            ModifyError::InvalidAccessFlags(AccessFlags::MW_BIND),
            ModifyError::Unsupported(QpAttrMask::ALT_PATH),
            ModifyError::SqDraining,
        ];
        for e in errors {
            assert_eq!(e.errno(), 22, "{e}");
        }
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
