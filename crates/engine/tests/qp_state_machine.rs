//! The QP state machine, tested exhaustively through `engine::qp_attr`.
//!
//! The expected transition table below is written out independently of the engine's own table
//! (from IBA vol. 1 and Linux's `qp_state_table`), so a wrong entry in either one
//! makes a test fail. For every QP type × from-state × to-state × attribute bit it checks that a
//! missing required attribute, a present optional one and a present forbidden one are handled
//! as IBA says, and that transitions not in the table are rejected.

use std::collections::HashMap;

use engine::qp_attr::{
    check_modify, check_sq_drained, AccessFlags, AhAttr, MigState, ModifyError, Mtu, QpAttr,
    QpAttrMask, QpLimits, QpState, QpType,
};

/// Every transition that exists, per QP type, with its required and optional attributes
/// (`STATE` is implied). Anything not listed must fail with `InvalidTransition`.
const EXPECTED_TABLE: &str = "
# type from  -> to    | required                                                      | optional
RC  RESET -> RESET | -                                                             | -
UC  RESET -> RESET | -                                                             | -
UD  RESET -> RESET | -                                                             | -
RC  RESET -> INIT  | PKEY_INDEX PORT ACCESS_FLAGS                                  | -
UC  RESET -> INIT  | PKEY_INDEX PORT ACCESS_FLAGS                                  | -
UD  RESET -> INIT  | PKEY_INDEX PORT QKEY                                          | -

RC  INIT  -> INIT  | -                                                             | PKEY_INDEX PORT ACCESS_FLAGS
UC  INIT  -> INIT  | -                                                             | PKEY_INDEX PORT ACCESS_FLAGS
UD  INIT  -> INIT  | -                                                             | PKEY_INDEX PORT QKEY
RC  INIT  -> RTR   | AV PATH_MTU DEST_QPN RQ_PSN MAX_DEST_RD_ATOMIC MIN_RNR_TIMER | ALT_PATH ACCESS_FLAGS PKEY_INDEX
UC  INIT  -> RTR   | AV PATH_MTU DEST_QPN RQ_PSN                                   | ALT_PATH ACCESS_FLAGS PKEY_INDEX
UD  INIT  -> RTR   | -                                                             | PKEY_INDEX QKEY

RC  RTR   -> RTS   | TIMEOUT RETRY_CNT RNR_RETRY SQ_PSN MAX_QP_RD_ATOMIC          | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
UC  RTR   -> RTS   | SQ_PSN                                                        | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
UD  RTR   -> RTS   | SQ_PSN                                                        | CUR_STATE QKEY

RC  RTS   -> RTS   | -                                                             | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE MIN_RNR_TIMER
UC  RTS   -> RTS   | -                                                             | CUR_STATE ACCESS_FLAGS ALT_PATH PATH_MIG_STATE
UD  RTS   -> RTS   | -                                                             | CUR_STATE QKEY
RC  RTS   -> SQD   | -                                                             | EN_SQD_ASYNC_NOTIFY
UC  RTS   -> SQD   | -                                                             | EN_SQD_ASYNC_NOTIFY
UD  RTS   -> SQD   | -                                                             | EN_SQD_ASYNC_NOTIFY

RC  SQD   -> RTS   | -                                                             | CUR_STATE ALT_PATH ACCESS_FLAGS MIN_RNR_TIMER PATH_MIG_STATE
UC  SQD   -> RTS   | -                                                             | CUR_STATE ALT_PATH ACCESS_FLAGS PATH_MIG_STATE
UD  SQD   -> RTS   | -                                                             | CUR_STATE QKEY
RC  SQD   -> SQD   | -                                                             | PORT AV TIMEOUT RETRY_CNT RNR_RETRY MAX_QP_RD_ATOMIC MAX_DEST_RD_ATOMIC ALT_PATH ACCESS_FLAGS PKEY_INDEX MIN_RNR_TIMER PATH_MIG_STATE
UC  SQD   -> SQD   | -                                                             | AV ALT_PATH ACCESS_FLAGS PKEY_INDEX PATH_MIG_STATE
UD  SQD   -> SQD   | -                                                             | PKEY_INDEX QKEY

# RC never enters SQE; Linux still lists SQE -> RTS for it, taking nothing.
RC  SQE   -> RTS   | -                                                             | -
UC  SQE   -> RTS   | -                                                             | CUR_STATE ACCESS_FLAGS
UD  SQE   -> RTS   | -                                                             | CUR_STATE QKEY

# Every state but RESET may go to ERR; every state may go to RESET; both take nothing.
RC  INIT  -> ERR   | - | -
UC  INIT  -> ERR   | - | -
UD  INIT  -> ERR   | - | -
RC  RTR   -> ERR   | - | -
UC  RTR   -> ERR   | - | -
UD  RTR   -> ERR   | - | -
RC  RTS   -> ERR   | - | -
UC  RTS   -> ERR   | - | -
UD  RTS   -> ERR   | - | -
RC  SQD   -> ERR   | - | -
UC  SQD   -> ERR   | - | -
UD  SQD   -> ERR   | - | -
RC  SQE   -> ERR   | - | -
UC  SQE   -> ERR   | - | -
UD  SQE   -> ERR   | - | -
RC  ERR   -> ERR   | - | -
UC  ERR   -> ERR   | - | -
UD  ERR   -> ERR   | - | -
RC  INIT  -> RESET | - | -
UC  INIT  -> RESET | - | -
UD  INIT  -> RESET | - | -
RC  RTR   -> RESET | - | -
UC  RTR   -> RESET | - | -
UD  RTR   -> RESET | - | -
RC  RTS   -> RESET | - | -
UC  RTS   -> RESET | - | -
UD  RTS   -> RESET | - | -
RC  SQD   -> RESET | - | -
UC  SQD   -> RESET | - | -
UD  SQD   -> RESET | - | -
RC  SQE   -> RESET | - | -
UC  SQE   -> RESET | - | -
UD  SQE   -> RESET | - | -
RC  ERR   -> RESET | - | -
UC  ERR   -> RESET | - | -
UD  ERR   -> RESET | - | -
";

const TYPES: [QpType; 3] = [QpType::Rc, QpType::Uc, QpType::Ud];

/// (required, optional) per (type, from, to).
type Expected = HashMap<(QpType, QpState, QpState), (QpAttrMask, QpAttrMask)>;

fn parse_type(s: &str) -> QpType {
    match s {
        "RC" => QpType::Rc,
        "UC" => QpType::Uc,
        "UD" => QpType::Ud,
        _ => panic!("bad QP type {s:?} in EXPECTED_TABLE"),
    }
}

fn parse_state(s: &str) -> QpState {
    match s {
        "RESET" => QpState::Reset,
        "INIT" => QpState::Init,
        "RTR" => QpState::Rtr,
        "RTS" => QpState::Rts,
        "SQD" => QpState::Sqd,
        "SQE" => QpState::Sqe,
        "ERR" => QpState::Err,
        _ => panic!("bad state {s:?} in EXPECTED_TABLE"),
    }
}

fn parse_mask(s: &str) -> QpAttrMask {
    let s = s.trim();
    if s == "-" {
        return QpAttrMask::empty();
    }
    s.split_whitespace()
        .map(|name| {
            QpAttrMask::from_name(name)
                .unwrap_or_else(|| panic!("bad attribute {name:?} in EXPECTED_TABLE"))
        })
        .fold(QpAttrMask::empty(), |acc, m| acc | m)
}

fn expected_table() -> Expected {
    let mut table = Expected::new();
    for line in EXPECTED_TABLE.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.split('|').collect();
        assert_eq!(cols.len(), 3, "bad line {line:?}");
        let head: Vec<&str> = cols[0].split_whitespace().collect();
        assert_eq!(head.len(), 4, "bad line {line:?}");
        assert_eq!(head[2], "->", "bad line {line:?}");
        let key = (
            parse_type(head[0]),
            parse_state(head[1]),
            parse_state(head[3]),
        );
        let value = (parse_mask(cols[1]), parse_mask(cols[2]));
        assert!(table.insert(key, value).is_none(), "{line:?} listed twice");
    }
    table
}

/// Limits with every optional feature on, so that only the table decides.
fn permissive_limits() -> QpLimits {
    QpLimits {
        alt_path_supported: true,
        ..QpLimits::default()
    }
}

/// An attribute set in which every field holds a value any HCA accepts.
fn valid_attr(from: QpState, to: QpState) -> QpAttr {
    let path = AhAttr {
        dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2],
        sgid_index: 1,
        hop_limit: 64,
        traffic_class: 0,
        flow_label: 0x1234,
        dlid: 0,
        sl: 3,
        static_rate: 0,
        port_num: 1,
        is_global: true,
    };
    QpAttr {
        qp_state: to,
        cur_qp_state: from,
        path_mtu: Mtu::Mtu1024,
        path_mig_state: MigState::Migrated,
        qkey: 0x1111_1111,
        rq_psn: 0x00ab_cdef,
        sq_psn: 0x0012_3456,
        dest_qp_num: engine::Qpn::new(0x11),
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        ah_attr: path,
        alt_ah_attr: path,
        pkey_index: 0,
        alt_pkey_index: 0,
        en_sqd_async_notify: true,
        max_rd_atomic: 1,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        port_num: 1,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        alt_port_num: 1,
        alt_timeout: 14,
        ..QpAttr::default()
    }
}

/// Every bit of the 32-bit mask except `STATE`: the 22 libibverbs defines and the rest.
fn every_non_state_bit() -> impl Iterator<Item = QpAttrMask> {
    (1..32).map(|i| QpAttrMask::from_bits_retain(1 << i))
}

#[test]
fn expected_table_has_every_transition_for_every_type() {
    let table = expected_table();
    // 22 transitions (RESET→RESET, RESET→INIT, INIT→INIT, INIT→RTR, RTR→RTS, RTS→RTS,
    // RTS→SQD, SQD→RTS, SQD→SQD, SQE→RTS, 6 × →ERR, 6 × →RESET) for each of 3 types.
    assert_eq!(table.len(), 22 * 3);
}

#[test]
fn every_transition_and_attribute_bit_behaves_as_iba_says() {
    let table = expected_table();
    let limits = permissive_limits();
    let mut checked = 0usize;
    for qp_type in TYPES {
        for from in QpState::ALL {
            for to in QpState::ALL {
                let attr = valid_attr(from, to);
                let case = format!("{qp_type} {from} -> {to}");
                let Some(&(required, optional)) = table.get(&(qp_type, from, to)) else {
                    let invalid = Err(ModifyError::InvalidTransition { from, to });
                    let with_state = QpAttrMask::STATE;
                    assert_eq!(
                        check_modify(qp_type, from, &attr, with_state, &limits),
                        invalid,
                        "{case}"
                    );
                    for bit in every_non_state_bit() {
                        assert_eq!(
                            check_modify(qp_type, from, &attr, with_state | bit, &limits),
                            invalid,
                            "{case} with {bit:?}"
                        );
                        if from == to {
                            // No STATE bit: the target is the current state.
                            assert_eq!(
                                check_modify(qp_type, from, &attr, bit, &limits),
                                invalid,
                                "{case} (implicit) with {bit:?}"
                            );
                        }
                        checked += 1;
                    }
                    continue;
                };
                let base = QpAttrMask::STATE | required;
                assert_eq!(
                    check_modify(qp_type, from, &attr, base, &limits),
                    Ok(to),
                    "{case} with exactly the required attributes"
                );
                assert_eq!(
                    check_modify(qp_type, from, &attr, base | optional, &limits),
                    Ok(to),
                    "{case} with every optional attribute"
                );
                for bit in every_non_state_bit() {
                    let (mask, want) = if required.contains(bit) {
                        (base - bit, Err(ModifyError::MissingAttribute(bit)))
                    } else if optional.contains(bit) {
                        (base | bit, Ok(to))
                    } else {
                        (base | bit, Err(ModifyError::ForbiddenAttribute(bit)))
                    };
                    assert_eq!(
                        check_modify(qp_type, from, &attr, mask, &limits),
                        want,
                        "{case}: mask {mask:?}"
                    );
                    checked += 1;
                }
                if from == to {
                    // Without STATE the QP stays where it is, under the same rule.
                    assert!(required.is_empty(), "{case}");
                    assert_eq!(
                        check_modify(qp_type, from, &attr, optional, &limits),
                        Ok(from),
                        "{case} without STATE"
                    );
                }
            }
        }
    }
    assert_eq!(checked, 3 * 7 * 7 * 31);
}

#[test]
fn named_invalid_transitions_are_rejected() {
    let limits = QpLimits::default();
    let cases = [
        (QpType::Rc, QpState::Reset, QpState::Err),
        (QpType::Rc, QpState::Reset, QpState::Rtr),
        (QpType::Uc, QpState::Init, QpState::Rts),
        (QpType::Ud, QpState::Rts, QpState::Sqe),
        (QpType::Rc, QpState::Err, QpState::Init),
        (QpType::Rc, QpState::Rtr, QpState::Rtr),
        (QpType::Ud, QpState::Sqe, QpState::Sqe),
        (QpType::Rc, QpState::Sqd, QpState::Init),
    ];
    for (qp_type, from, to) in cases {
        let attr = valid_attr(from, to);
        assert_eq!(
            check_modify(qp_type, from, &attr, QpAttrMask::STATE, &limits),
            Err(ModifyError::InvalidTransition { from, to }),
            "{qp_type} {from} -> {to}"
        );
    }
    // An attribute-only modify in RTR means RTR -> RTR, which does not exist.
    let attr = valid_attr(QpState::Rtr, QpState::Rtr);
    assert_eq!(
        check_modify(
            QpType::Rc,
            QpState::Rtr,
            &attr,
            QpAttrMask::ACCESS_FLAGS,
            &limits
        ),
        Err(ModifyError::InvalidTransition {
            from: QpState::Rtr,
            to: QpState::Rtr
        })
    );
}

#[test]
fn a_typical_rc_connection_walks_reset_to_rts_and_back() {
    let limits = QpLimits::default();
    type M = QpAttrMask;
    let steps = [
        (
            QpState::Init,
            M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        ),
        (
            QpState::Rtr,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER,
        ),
        (
            QpState::Rts,
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
        ),
        (QpState::Sqd, M::STATE | M::EN_SQD_ASYNC_NOTIFY),
        (QpState::Rts, M::STATE),
        (QpState::Err, M::STATE),
        (QpState::Reset, M::STATE),
    ];
    let mut stored = QpAttr::default();
    for (to, mask) in steps {
        let from = stored.qp_state;
        let attr = valid_attr(from, to);
        let next = check_modify(QpType::Rc, from, &attr, mask, &limits);
        assert_eq!(next, Ok(to), "{from} -> {to}");
        stored.apply(&attr, mask);
        assert_eq!(stored.qp_state, to);
    }
    // What was set is what a query returns.
    assert_eq!(stored.rq_psn, 0x00ab_cdef);
    assert_eq!(stored.sq_psn, 0x0012_3456);
    assert_eq!(stored.dest_qp_num, engine::Qpn::new(0x11));
    assert_eq!(stored.path_mtu, Mtu::Mtu1024);
    assert_eq!(stored.timeout, 14);
    assert_eq!(stored.min_rnr_timer, 12);
    assert!(stored.en_sqd_async_notify);
}

/// Runs `check_modify` on a valid attribute set changed by `edit`, for `(from → to, mask)`.
fn modify_with(
    qp_type: QpType,
    from: QpState,
    to: QpState,
    mask: QpAttrMask,
    limits: &QpLimits,
    edit: impl FnOnce(&mut QpAttr),
) -> Result<QpState, ModifyError> {
    let mut attr = valid_attr(from, to);
    edit(&mut attr);
    check_modify(qp_type, from, &attr, mask, limits)
}

fn rc_init_to_rtr(
    limits: &QpLimits,
    edit: impl FnOnce(&mut QpAttr),
) -> Result<QpState, ModifyError> {
    type M = QpAttrMask;
    let mask = M::STATE
        | M::AV
        | M::PATH_MTU
        | M::DEST_QPN
        | M::RQ_PSN
        | M::MAX_DEST_RD_ATOMIC
        | M::MIN_RNR_TIMER;
    modify_with(QpType::Rc, QpState::Init, QpState::Rtr, mask, limits, edit)
}

fn rc_rtr_to_rts(
    extra: QpAttrMask,
    limits: &QpLimits,
    edit: impl FnOnce(&mut QpAttr),
) -> Result<QpState, ModifyError> {
    type M = QpAttrMask;
    let mask =
        M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
    modify_with(
        QpType::Rc,
        QpState::Rtr,
        QpState::Rts,
        mask | extra,
        limits,
        edit,
    )
}

fn rc_reset_to_init(
    limits: &QpLimits,
    edit: impl FnOnce(&mut QpAttr),
) -> Result<QpState, ModifyError> {
    type M = QpAttrMask;
    let mask = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
    modify_with(
        QpType::Rc,
        QpState::Reset,
        QpState::Init,
        mask,
        limits,
        edit,
    )
}

fn invalid(
    attr: QpAttrMask,
    field: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<QpState, ModifyError> {
    Err(ModifyError::InvalidValue {
        attr,
        field,
        value,
        min,
        max,
    })
}

#[test]
fn timers_and_retry_counts_are_range_checked() {
    let l = QpLimits::default();
    let none = QpAttrMask::empty();
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.timeout = 31),
        Ok(QpState::Rts)
    );
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.timeout = 32),
        invalid(QpAttrMask::TIMEOUT, "timeout", 32, 0, 31)
    );
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.retry_cnt = 7),
        Ok(QpState::Rts)
    );
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.retry_cnt = 8),
        invalid(QpAttrMask::RETRY_CNT, "retry_cnt", 8, 0, 7)
    );
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.rnr_retry = 7),
        Ok(QpState::Rts)
    );
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.rnr_retry = 8),
        invalid(QpAttrMask::RNR_RETRY, "rnr_retry", 8, 0, 7)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.min_rnr_timer = 31),
        Ok(QpState::Rtr)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.min_rnr_timer = 32),
        invalid(QpAttrMask::MIN_RNR_TIMER, "min_rnr_timer", 32, 0, 31)
    );
    // MIN_RNR_TIMER is also checked where it is optional.
    assert_eq!(
        rc_rtr_to_rts(QpAttrMask::MIN_RNR_TIMER, &l, |a| a.min_rnr_timer = 255),
        invalid(QpAttrMask::MIN_RNR_TIMER, "min_rnr_timer", 255, 0, 31)
    );
}

#[test]
fn psns_and_the_destination_qpn_must_fit_24_bits() {
    let l = QpLimits::default();
    let none = QpAttrMask::empty();
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.rq_psn = 0xff_ffff),
        Ok(QpState::Rtr)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.rq_psn = 0x100_0000),
        invalid(QpAttrMask::RQ_PSN, "rq_psn", 0x100_0000, 0, 0xff_ffff)
    );
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.sq_psn = 0xff_ffff),
        Ok(QpState::Rts)
    );
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.sq_psn = u32::MAX),
        invalid(QpAttrMask::SQ_PSN, "sq_psn", u32::MAX.into(), 0, 0xff_ffff)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.dest_qp_num = engine::Qpn::MULTICAST),
        Ok(QpState::Rtr)
    );
    // A dest_qp_num over 24 bits cannot be written: `Qpn::try_new` refuses it where it
    // comes in (the C drop-in answers EINVAL, the daemon's protocol decoder an error).
    assert_eq!(engine::Qpn::try_new(0x100_0000), None);
    // UD checks sq_psn too.
    assert_eq!(
        modify_with(
            QpType::Ud,
            QpState::Rtr,
            QpState::Rts,
            QpAttrMask::STATE | QpAttrMask::SQ_PSN,
            &l,
            |a| a.sq_psn = 0x100_0000
        ),
        invalid(QpAttrMask::SQ_PSN, "sq_psn", 0x100_0000, 0, 0xff_ffff)
    );
}

#[test]
fn path_mtu_is_limited_by_the_port() {
    let l = QpLimits {
        max_path_mtu: Mtu::Mtu1024,
        ..QpLimits::default()
    };
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.path_mtu = Mtu::Mtu256),
        Ok(QpState::Rtr)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.path_mtu = Mtu::Mtu1024),
        Ok(QpState::Rtr)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.path_mtu = Mtu::Mtu2048),
        invalid(QpAttrMask::PATH_MTU, "path_mtu", 2048, 256, 1024)
    );
}

#[test]
fn read_atomic_depths_are_limited_by_the_device() {
    let l = QpLimits {
        max_rd_atomic: 4,
        max_dest_rd_atomic: 8,
        ..QpLimits::default()
    };
    let none = QpAttrMask::empty();
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.max_rd_atomic = 4),
        Ok(QpState::Rts)
    );
    assert_eq!(
        rc_rtr_to_rts(none, &l, |a| a.max_rd_atomic = 5),
        invalid(QpAttrMask::MAX_QP_RD_ATOMIC, "max_rd_atomic", 5, 0, 4)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.max_dest_rd_atomic = 8),
        Ok(QpState::Rtr)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.max_dest_rd_atomic = 9),
        invalid(
            QpAttrMask::MAX_DEST_RD_ATOMIC,
            "max_dest_rd_atomic",
            9,
            0,
            8
        )
    );
}

#[test]
fn port_and_pkey_index_must_exist() {
    let l = QpLimits::default();
    assert_eq!(
        rc_reset_to_init(&l, |a| a.port_num = 0),
        invalid(QpAttrMask::PORT, "port_num", 0, 1, 1)
    );
    assert_eq!(
        rc_reset_to_init(&l, |a| a.port_num = 2),
        invalid(QpAttrMask::PORT, "port_num", 2, 1, 1)
    );
    assert_eq!(
        rc_reset_to_init(&l, |a| a.pkey_index = 1),
        invalid(QpAttrMask::PKEY_INDEX, "pkey_index", 1, 0, 0)
    );
    let bigger = QpLimits {
        port_count: 2,
        pkey_table_len: 4,
        ..QpLimits::default()
    };
    assert_eq!(
        rc_reset_to_init(&bigger, |a| a.port_num = 2),
        Ok(QpState::Init)
    );
    assert_eq!(
        rc_reset_to_init(&bigger, |a| a.pkey_index = 3),
        Ok(QpState::Init)
    );
    assert_eq!(
        rc_reset_to_init(&bigger, |a| a.pkey_index = 4),
        invalid(QpAttrMask::PKEY_INDEX, "pkey_index", 4, 0, 3)
    );
    // The UD path checks them the same way.
    let ud_mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
    assert_eq!(
        modify_with(
            QpType::Ud,
            QpState::Reset,
            QpState::Init,
            ud_mask,
            &l,
            |a| a.port_num = 9
        ),
        invalid(QpAttrMask::PORT, "port_num", 9, 1, 1)
    );
    // Any Q_Key value is legal.
    assert_eq!(
        modify_with(
            QpType::Ud,
            QpState::Reset,
            QpState::Init,
            ud_mask,
            &l,
            |a| a.qkey = u32::MAX
        ),
        Ok(QpState::Init)
    );
}

#[test]
fn the_address_vector_must_be_a_valid_roce_path() {
    let l = QpLimits {
        gid_table_len: 4,
        ..QpLimits::default()
    };
    type M = QpAttrMask;
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.ah_attr.sgid_index = 3),
        Ok(QpState::Rtr)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.ah_attr.sgid_index = 4),
        invalid(M::AV, "ah_attr.grh.sgid_index", 4, 0, 3)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.ah_attr.is_global = false),
        invalid(M::AV, "ah_attr.is_global", 0, 1, 1)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.ah_attr.port_num = 2),
        invalid(M::AV, "ah_attr.port_num", 2, 1, 1)
    );
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.ah_attr.flow_label = 0xf_ffff),
        Ok(QpState::Rtr)
    );
    // Linux keeps the low 20 bits of any flow label (UCX passes `~path_index`).
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.ah_attr.flow_label = 0xffff_ffff),
        Ok(QpState::Rtr)
    );
    assert_eq!(rc_init_to_rtr(&l, |a| a.ah_attr.sl = 15), Ok(QpState::Rtr));
    assert_eq!(
        rc_init_to_rtr(&l, |a| a.ah_attr.sl = 16),
        invalid(M::AV, "ah_attr.sl", 16, 0, 15)
    );
}

#[test]
fn alternate_paths_are_rejected_on_roce_and_checked_where_supported() {
    let roce = QpLimits::default();
    let alt = QpAttrMask::ALT_PATH;
    assert_eq!(
        rc_rtr_to_rts(alt, &roce, |_| {}),
        Err(ModifyError::Unsupported(QpAttrMask::ALT_PATH))
    );
    let apm = QpLimits {
        alt_path_supported: true,
        ..QpLimits::default()
    };
    assert_eq!(rc_rtr_to_rts(alt, &apm, |_| {}), Ok(QpState::Rts));
    assert_eq!(
        rc_rtr_to_rts(alt, &apm, |a| a.alt_port_num = 0),
        invalid(alt, "alt_port_num", 0, 1, 1)
    );
    assert_eq!(
        rc_rtr_to_rts(alt, &apm, |a| a.alt_timeout = 32),
        invalid(alt, "alt_timeout", 32, 0, 31)
    );
    assert_eq!(
        rc_rtr_to_rts(alt, &apm, |a| a.alt_pkey_index = 1),
        invalid(alt, "alt_pkey_index", 1, 0, 0)
    );
    assert_eq!(
        rc_rtr_to_rts(alt, &apm, |a| a.alt_ah_attr.is_global = false),
        invalid(alt, "alt_ah_attr.is_global", 0, 1, 1)
    );
    // The primary path's fields are not checked when only ALT_PATH is given.
    assert_eq!(
        rc_rtr_to_rts(alt, &apm, |a| a.ah_attr.port_num = 0),
        Ok(QpState::Rts)
    );
}

#[test]
fn qp_access_flags_take_only_remote_access_rights_and_local_write() {
    let l = QpLimits::default();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    assert_eq!(
        rc_reset_to_init(&l, |a| a.qp_access_flags = all),
        Ok(QpState::Init)
    );
    assert_eq!(
        rc_reset_to_init(&l, |a| a.qp_access_flags = AccessFlags::empty()),
        Ok(QpState::Init)
    );
    assert_eq!(
        rc_reset_to_init(&l, |a| a.qp_access_flags = all | AccessFlags::MW_BIND),
        Err(ModifyError::InvalidAccessFlags(AccessFlags::MW_BIND))
    );
    let unknown = AccessFlags::from_bits_retain(1 << 30);
    assert_eq!(
        rc_reset_to_init(&l, |a| a.qp_access_flags = unknown),
        Err(ModifyError::InvalidAccessFlags(unknown))
    );
}

#[test]
fn cur_state_must_name_the_state_the_qp_is_in() {
    let l = QpLimits::default();
    let cur = QpAttrMask::CUR_STATE;
    assert_eq!(
        rc_rtr_to_rts(cur, &l, |a| a.cur_qp_state = QpState::Rtr),
        Ok(QpState::Rts)
    );
    assert_eq!(
        rc_rtr_to_rts(cur, &l, |a| a.cur_qp_state = QpState::Rts),
        Err(ModifyError::CurStateMismatch {
            actual: QpState::Rtr,
            claimed: QpState::Rts
        })
    );
    // UD: SQE -> RTS asserting SQE is the documented recovery path.
    let mask = QpAttrMask::STATE | QpAttrMask::CUR_STATE;
    assert_eq!(
        modify_with(QpType::Ud, QpState::Sqe, QpState::Rts, mask, &l, |a| {
            a.cur_qp_state = QpState::Sqe
        }),
        Ok(QpState::Rts)
    );
    assert_eq!(
        modify_with(QpType::Ud, QpState::Sqe, QpState::Rts, mask, &l, |a| {
            a.cur_qp_state = QpState::Rts
        }),
        Err(ModifyError::CurStateMismatch {
            actual: QpState::Sqe,
            claimed: QpState::Rts
        })
    );
    // Outside the transitions that allow it, CUR_STATE is simply forbidden.
    assert_eq!(
        modify_with(
            QpType::Rc,
            QpState::Init,
            QpState::Err,
            QpAttrMask::STATE | QpAttrMask::CUR_STATE,
            &l,
            |_| {},
        ),
        Err(ModifyError::ForbiddenAttribute(QpAttrMask::CUR_STATE))
    );
}

#[test]
fn value_checks_skip_fields_outside_the_mask() {
    let l = QpLimits::default();
    // Garbage everywhere, but only STATE in the mask: moving to ERR succeeds.
    let mut attr = valid_attr(QpState::Rts, QpState::Err);
    attr.timeout = 200;
    attr.rq_psn = u32::MAX;
    attr.port_num = 0;
    attr.ah_attr.is_global = false;
    attr.qp_access_flags = AccessFlags::all();
    assert_eq!(
        check_modify(QpType::Rc, QpState::Rts, &attr, QpAttrMask::STATE, &l),
        Ok(QpState::Err)
    );
}

#[test]
fn a_draining_sqd_qp_may_only_go_to_err_or_reset() {
    use QpState::{Reset, Rts, Sqd};
    assert_eq!(
        check_sq_drained(Sqd, Rts, true),
        Err(ModifyError::SqDraining)
    );
    assert_eq!(
        check_sq_drained(Sqd, Sqd, true),
        Err(ModifyError::SqDraining)
    );
    assert_eq!(check_sq_drained(Sqd, QpState::Err, true), Ok(()));
    assert_eq!(check_sq_drained(Sqd, Reset, true), Ok(()));
    assert_eq!(check_sq_drained(Sqd, Rts, false), Ok(()));
    assert_eq!(check_sq_drained(Sqd, Sqd, false), Ok(()));
    assert_eq!(check_sq_drained(Rts, Sqd, false), Ok(()));
}

#[test]
fn every_modify_error_reaches_libibverbs_as_einval() {
    let l = QpLimits::default();
    let results = [
        check_modify(
            QpType::Rc,
            QpState::Reset,
            &valid_attr(QpState::Reset, QpState::Rts),
            QpAttrMask::STATE,
            &l,
        ),
        rc_init_to_rtr(&l, |a| a.rq_psn = u32::MAX),
        rc_rtr_to_rts(QpAttrMask::ALT_PATH, &l, |_| {}),
        rc_rtr_to_rts(QpAttrMask::CAP, &l, |_| {}),
        rc_reset_to_init(&l, |a| a.qp_access_flags = AccessFlags::ZERO_BASED),
        rc_rtr_to_rts(QpAttrMask::CUR_STATE, &l, |a| a.cur_qp_state = QpState::Sqd),
    ];
    for r in results {
        let e = r.expect_err("each of these modifies is invalid");
        assert_eq!(e.errno(), 22, "{e}");
    }
}

#[test]
fn what_each_state_allows_follows_iba() {
    // state, post_send, post_recv, flush SQ, flush RQ, start requests, responses, incoming
    let expected = [
        (
            QpState::Reset,
            false,
            false,
            false,
            false,
            false,
            false,
            false,
        ),
        (
            QpState::Init,
            false,
            true,
            false,
            false,
            false,
            false,
            false,
        ),
        (QpState::Rtr, false, true, false, false, false, false, true),
        (QpState::Rts, true, true, false, false, true, true, true),
        (QpState::Sqd, true, true, false, false, false, true, true),
        (QpState::Sqe, true, true, true, false, false, false, true),
        (QpState::Err, true, true, true, true, false, false, false),
    ];
    for (s, send, recv, flush_sq, flush_rq, start, responses, incoming) in expected {
        assert_eq!(s.can_post_send(), send, "{s} can_post_send");
        assert_eq!(s.can_post_recv(), recv, "{s} can_post_recv");
        assert_eq!(s.flushes_send_queue(), flush_sq, "{s} flushes_send_queue");
        assert_eq!(s.flushes_recv_queue(), flush_rq, "{s} flushes_recv_queue");
        assert_eq!(s.starts_new_requests(), start, "{s} starts_new_requests");
        assert_eq!(
            s.processes_responses(),
            responses,
            "{s} processes_responses"
        );
        assert_eq!(s.processes_incoming(), incoming, "{s} processes_incoming");
    }
}

#[test]
fn mask_and_flag_bits_are_libibverbs_values() {
    let mask_bits = [
        ("STATE", 1 << 0),
        ("CUR_STATE", 1 << 1),
        ("EN_SQD_ASYNC_NOTIFY", 1 << 2),
        ("ACCESS_FLAGS", 1 << 3),
        ("PKEY_INDEX", 1 << 4),
        ("PORT", 1 << 5),
        ("QKEY", 1 << 6),
        ("AV", 1 << 7),
        ("PATH_MTU", 1 << 8),
        ("TIMEOUT", 1 << 9),
        ("RETRY_CNT", 1 << 10),
        ("RNR_RETRY", 1 << 11),
        ("RQ_PSN", 1 << 12),
        ("MAX_QP_RD_ATOMIC", 1 << 13),
        ("ALT_PATH", 1 << 14),
        ("MIN_RNR_TIMER", 1 << 15),
        ("SQ_PSN", 1 << 16),
        ("MAX_DEST_RD_ATOMIC", 1 << 17),
        ("PATH_MIG_STATE", 1 << 18),
        ("CAP", 1 << 19),
        ("DEST_QPN", 1 << 20),
        ("RATE_LIMIT", 1 << 25),
    ];
    for (name, bits) in mask_bits {
        assert_eq!(
            QpAttrMask::from_name(name).map(|m| m.bits()),
            Some(bits),
            "{name}"
        );
    }
    assert_eq!(QpAttrMask::all().iter().count(), mask_bits.len());
    let access_bits = [
        ("LOCAL_WRITE", 1),
        ("REMOTE_WRITE", 2),
        ("REMOTE_READ", 4),
        ("REMOTE_ATOMIC", 8),
        ("MW_BIND", 16),
        ("ZERO_BASED", 32),
        ("ON_DEMAND", 64),
        ("HUGETLB", 128),
        ("FLUSH_GLOBAL", 256),
        ("FLUSH_PERSISTENT", 512),
        ("RELAXED_ORDERING", 1 << 20),
    ];
    for (name, bits) in access_bits {
        assert_eq!(
            AccessFlags::from_name(name).map(|f| f.bits()),
            Some(bits),
            "{name}"
        );
    }
    let states = [
        (QpState::Reset, 0),
        (QpState::Init, 1),
        (QpState::Rtr, 2),
        (QpState::Rts, 3),
        (QpState::Sqd, 4),
        (QpState::Sqe, 5),
        (QpState::Err, 6),
    ];
    for (s, n) in states {
        assert_eq!(s.to_ibv(), n);
        assert_eq!(QpState::try_from(n), Ok(s));
    }
    assert_eq!(QpType::Rc.to_ibv(), 2);
    assert_eq!(QpType::Uc.to_ibv(), 3);
    assert_eq!(QpType::Ud.to_ibv(), 4);
}
