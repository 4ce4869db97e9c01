//! The IBA QP state machine, as data.
//!
//! The transition table (which `from → to` transitions exist and which attributes each one
//! requires and allows, per QP type), and [`check_modify`], which applies that table plus the
//! value checks a real HCA makes. The vocabulary it checks (QP types and states, attribute
//! masks, access flags, `ibv_qp_attr`) is in [`crate::qp_attr`].
//!
//! The table follows IBA vol. 1 (ch. 10 QP states, ch. 11 Modify QP) as Linux encodes it
//! (`qp_state_table` in `drivers/infiniband/core/verbs.c`), so a libibverbs program sees the
//! same accept/reject decisions (and `EINVAL` errno) on softrdma as on a kernel-driven RNIC.
//!
//! This module is pure: no state, no I/O, no allocation.

use crate::qp_attr::{AccessFlags, AhAttr, Mtu, QpAttr, QpAttrMask, QpState, QpType};

/// `EINVAL` as Linux numbers it: what `ibv_modify_qp` returns for every rejected modify.
const EINVAL: i32 = 22;

/// Largest value of a 24-bit wire field (PSN, QPN).
const MAX_24_BIT: u32 = 0x00ff_ffff;

/// Largest 5-bit timer code (local ACK timeout, RNR NAK timer): both are 5-bit fields in IBA.
const MAX_TIMER_CODE: u8 = 31;

/// Largest 3-bit retry count (`retry_cnt`, `rnr_retry`; 7 means "infinite" for `rnr_retry`).
const MAX_RETRY: u8 = 7;

/// Largest 4-bit service level.
const MAX_SL: u8 = 15;

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
    // No check of the flow label: the GRH keeps its low 20 bits ([`AhAttr::grh_flow_label`]).
    in_range(attr, names.sl, ah.sl.into(), 0, MAX_SL.into())
}

/// The field names reported for one address vector.
struct AhFieldNames {
    port_num: &'static str,
    is_global: &'static str,
    sgid_index: &'static str,
    sl: &'static str,
}

/// Names for `ah_attr`.
const AH_NAMES: AhFieldNames = AhFieldNames {
    port_num: "ah_attr.port_num",
    is_global: "ah_attr.is_global",
    sgid_index: "ah_attr.grh.sgid_index",
    sl: "ah_attr.sl",
};

/// Names for `alt_ah_attr`.
const ALT_AH_NAMES: AhFieldNames = AhFieldNames {
    port_num: "alt_ah_attr.port_num",
    is_global: "alt_ah_attr.is_global",
    sgid_index: "alt_ah_attr.grh.sgid_index",
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc_rtr_attr() -> QpAttr {
        QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: Mtu::Mtu1024,
            dest_qp_num: crate::Qpn::new(0x12),
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
}
