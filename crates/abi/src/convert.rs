//! Engine types ↔ protocol messages, in both directions: the server turns requests into
//! verbs and results into answers, the client (the `softrdma` API's daemon backend) does the
//! reverse. Every conversion from a message checks what it reads: numbers that name no
//! value are a [`ConvertError`], never a panic.

use engine::{
    AccessFlags, AhAttr, AsyncEvent, AtomicCap, DeviceAttr, MwBind, PortAttr, PortState, QpAttr,
    QpAttrMask, QpState,
};

use crate::proto::{AhMsg, AsyncEventMsg, DeviceAttrMsg, MwBindMsg, PortAttrMsg, QpAttrMsg};

/// A message field that names no engine value, or an engine value no message can carry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// A number outside the values it may take.
    #[error("invalid {what}: {value}")]
    Invalid {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: u64,
    },
    /// An operation the control protocol does not carry (memory window binds, local
    /// invalidation).
    #[error("{0} is not supported through softrdmad")]
    Unsupported(&'static str),
}

fn invalid(what: &'static str, value: impl Into<u64>) -> ConvertError {
    ConvertError::Invalid {
        what,
        value: value.into(),
    }
}

/// A window bind as the protocol carries it (the region by its handle number as is: on the
/// client, the connection's handle).
pub fn mw_bind_to_msg(b: &MwBind) -> MwBindMsg {
    MwBindMsg {
        mr: b.mr.0,
        addr: b.addr,
        length: b.length,
        access: b.access.bits(),
    }
}

/// A window bind from the protocol, its region handle number kept as is (the server
/// replaces the connection's handle with the engine's).
pub fn mw_bind_from_msg(m: &MwBindMsg) -> Result<MwBind, ConvertError> {
    Ok(MwBind {
        mr: engine::MrHandle(m.mr),
        addr: m.addr,
        length: m.length,
        access: AccessFlags::from_bits(m.access).ok_or(invalid("access flags", m.access))?,
    })
}

/// QP attributes from the protocol; only the fields `mask` selects are checked.
pub fn qp_attr_from_msg(m: &QpAttrMsg, mask: QpAttrMask) -> Result<QpAttr, ConvertError> {
    let mut a = QpAttr::default();
    if mask.contains(QpAttrMask::STATE) {
        a.qp_state = QpState::try_from(m.qp_state).map_err(|_| invalid("QP state", m.qp_state))?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        a.path_mtu =
            wire::Mtu::from_bytes(m.path_mtu as usize).ok_or(invalid("path MTU", m.path_mtu))?;
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        a.qp_access_flags = AccessFlags::from_bits(m.qp_access_flags)
            .ok_or(invalid("access flags", m.qp_access_flags))?;
    }
    a.qkey = m.qkey;
    a.rq_psn = m.rq_psn;
    a.sq_psn = m.sq_psn;
    a.dest_qp_num = m.dest_qp_num;
    a.pkey_index = m.pkey_index;
    if mask.contains(QpAttrMask::PORT) {
        a.port_num = m.port_num;
    }
    a.max_rd_atomic = m.max_rd_atomic;
    a.max_dest_rd_atomic = m.max_dest_rd_atomic;
    a.min_rnr_timer = m.min_rnr_timer;
    a.timeout = m.timeout;
    a.retry_cnt = m.retry_cnt;
    a.rnr_retry = m.rnr_retry;
    a.ah_attr = AhAttr {
        dgid: m.dgid,
        sgid_index: m.sgid_index,
        hop_limit: m.hop_limit,
        traffic_class: m.traffic_class,
        flow_label: m.flow_label,
        is_global: true,
        ..a.ah_attr
    };
    if mask.contains(QpAttrMask::CUR_STATE) {
        a.cur_qp_state = QpState::try_from(m.cur_qp_state)
            .map_err(|_| invalid("current QP state", m.cur_qp_state))?;
    }
    if mask.contains(QpAttrMask::PATH_MIG_STATE) {
        a.path_mig_state = engine::qp_attr::MigState::try_from(m.path_mig_state)
            .map_err(|_| invalid("path migration state", m.path_mig_state))?;
    }
    a.cap = engine::QpCap {
        max_send_wr: m.cap.max_send_wr,
        max_recv_wr: m.cap.max_recv_wr,
        max_send_sge: m.cap.max_send_sge,
        max_recv_sge: m.cap.max_recv_sge,
        max_inline_data: m.cap.max_inline_data,
    };
    a.alt_ah_attr = AhAttr {
        port_num: m.alt_port_num,
        ..ah_from_msg(&m.alt_ah)
    };
    a.alt_pkey_index = m.alt_pkey_index;
    a.alt_port_num = m.alt_port_num;
    a.alt_timeout = m.alt_timeout;
    a.en_sqd_async_notify = m.en_sqd_async_notify;
    a.sq_draining = m.sq_draining;
    a.rate_limit = m.rate_limit;
    Ok(a)
}

/// QP attributes as the protocol carries them (the RoCE RC/UC/UD subset).
pub fn qp_attr_to_msg(a: &QpAttr) -> QpAttrMsg {
    QpAttrMsg {
        qp_state: a.qp_state.to_ibv(),
        path_mtu: a.path_mtu.bytes() as u32,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        pkey_index: a.pkey_index,
        port_num: a.port_num,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        dgid: a.ah_attr.dgid,
        sgid_index: a.ah_attr.sgid_index,
        hop_limit: a.ah_attr.hop_limit,
        traffic_class: a.ah_attr.traffic_class,
        flow_label: a.ah_attr.flow_label,
        cur_qp_state: a.cur_qp_state.to_ibv(),
        path_mig_state: a.path_mig_state.to_ibv(),
        cap: crate::proto::QpCapMsg {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
        alt_ah: ah_to_msg(&a.alt_ah_attr),
        alt_pkey_index: a.alt_pkey_index,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        en_sqd_async_notify: a.en_sqd_async_notify,
        sq_draining: a.sq_draining,
        rate_limit: a.rate_limit,
    }
}

/// An address vector as the protocol carries it.
pub fn ah_to_msg(a: &AhAttr) -> AhMsg {
    AhMsg {
        dgid: a.dgid,
        sgid_index: a.sgid_index,
        hop_limit: a.hop_limit,
        traffic_class: a.traffic_class,
        flow_label: a.flow_label,
    }
}

/// An address vector from the protocol (RoCE: global, port 1).
pub fn ah_from_msg(m: &AhMsg) -> AhAttr {
    AhAttr {
        dgid: m.dgid,
        sgid_index: m.sgid_index,
        hop_limit: m.hop_limit,
        traffic_class: m.traffic_class,
        flow_label: m.flow_label,
        is_global: true,
        port_num: 1,
        ..AhAttr::default()
    }
}

/// Device attributes as the protocol carries them.
pub fn device_attr_to_msg(a: &DeviceAttr) -> DeviceAttrMsg {
    DeviceAttrMsg {
        node_guid: a.node_guid,
        max_mr_size: a.max_mr_size,
        max_qp: a.max_qp,
        max_qp_wr: a.max_qp_wr,
        max_sge: a.max_sge,
        max_cq: a.max_cq,
        max_cqe: a.max_cqe,
        max_mr: a.max_mr,
        max_pd: a.max_pd,
        max_qp_rd_atom: a.max_qp_rd_atom,
        max_qp_init_rd_atom: a.max_qp_init_rd_atom,
        atomic_cap: match a.atomic_cap {
            AtomicCap::Hca => 1,
            AtomicCap::Glob => 2,
            _ => 0,
        },
        phys_port_cnt: a.phys_port_cnt,
        fw_ver: a.fw_ver.clone(),
        sys_image_guid: a.sys_image_guid,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        max_sge_rd: a.max_sge_rd,
        max_res_rd_atom: a.max_res_rd_atom,
        max_inline_data: a.max_inline_data,
        max_srq: a.max_srq,
        max_srq_wr: a.max_srq_wr,
        max_srq_sge: a.max_srq_sge,
        max_mw: a.max_mw,
        max_ah: a.max_ah,
        max_pkeys: a.max_pkeys,
    }
}

/// Device attributes from the protocol (every field the engine has).
pub fn device_attr_from_msg(m: &DeviceAttrMsg) -> DeviceAttr {
    let mut a = DeviceAttr::default();
    a.node_guid = m.node_guid;
    a.fw_ver = m.fw_ver.clone();
    a.sys_image_guid = m.sys_image_guid;
    a.page_size_cap = m.page_size_cap;
    a.vendor_id = m.vendor_id;
    a.vendor_part_id = m.vendor_part_id;
    a.hw_ver = m.hw_ver;
    a.max_sge_rd = m.max_sge_rd;
    a.max_res_rd_atom = m.max_res_rd_atom;
    a.max_inline_data = m.max_inline_data;
    a.max_srq = m.max_srq;
    a.max_srq_wr = m.max_srq_wr;
    a.max_srq_sge = m.max_srq_sge;
    a.max_mw = m.max_mw;
    a.max_ah = m.max_ah;
    a.max_pkeys = m.max_pkeys;
    a.max_mr_size = m.max_mr_size;
    a.max_qp = m.max_qp;
    a.max_qp_wr = m.max_qp_wr;
    a.max_sge = m.max_sge;
    a.max_cq = m.max_cq;
    a.max_cqe = m.max_cqe;
    a.max_mr = m.max_mr;
    a.max_pd = m.max_pd;
    a.max_qp_rd_atom = m.max_qp_rd_atom;
    a.max_qp_init_rd_atom = m.max_qp_init_rd_atom;
    a.atomic_cap = match m.atomic_cap {
        1 => AtomicCap::Hca,
        2 => AtomicCap::Glob,
        _ => AtomicCap::None,
    };
    a.phys_port_cnt = m.phys_port_cnt;
    a
}

/// Port attributes as the protocol carries them.
pub fn port_attr_to_msg(p: &PortAttr) -> PortAttrMsg {
    PortAttrMsg {
        state: if p.state == PortState::Active { 4 } else { 1 },
        max_mtu: p.max_mtu.bytes() as u32,
        active_mtu: p.active_mtu.bytes() as u32,
        gid_tbl_len: p.gid_tbl_len,
        max_msg_sz: p.max_msg_sz,
    }
}

/// Port attributes from the protocol.
pub fn port_attr_from_msg(m: &PortAttrMsg) -> Result<PortAttr, ConvertError> {
    let mtu = |v: u32| wire::Mtu::from_bytes(v as usize).ok_or(invalid("MTU", v));
    let state = if m.state == 4 {
        PortState::Active
    } else {
        PortState::Down
    };
    Ok(PortAttr::roce(
        state,
        mtu(m.max_mtu)?,
        mtu(m.active_mtu)?,
        m.gid_tbl_len,
        m.max_msg_sz,
    ))
}

/// An asynchronous event as the protocol carries it, with the CQ or SRQ named by `handle`
/// (the connection's handle for the engine's). `None` for an event that names an object
/// `handle` does not know.
pub fn async_event_to_msg(
    ev: &AsyncEvent,
    cq_handle: impl Fn(engine::CqHandle) -> Option<u32>,
    srq_handle: impl Fn(engine::SrqHandle) -> Option<u32>,
) -> Option<AsyncEventMsg> {
    let (kind, id) = match *ev {
        AsyncEvent::CqErr { cq } => (AsyncEventMsg::EV_CQ_ERR, cq_handle(cq)?),
        AsyncEvent::SqDrained { qpn } => (AsyncEventMsg::EV_SQ_DRAINED, qpn),
        AsyncEvent::QpFatal { qpn } => (AsyncEventMsg::EV_QP_FATAL, qpn),
        AsyncEvent::SrqLimitReached { srq } => {
            (AsyncEventMsg::EV_SRQ_LIMIT_REACHED, srq_handle(srq)?)
        }
        AsyncEvent::QpLastWqeReached { qpn } => (AsyncEventMsg::EV_QP_LAST_WQE_REACHED, qpn),
        AsyncEvent::PortActive { port } => (AsyncEventMsg::EV_PORT_ACTIVE, u32::from(port)),
        AsyncEvent::PortErr { port } => (AsyncEventMsg::EV_PORT_ERR, u32::from(port)),
        _ => return None,
    };
    Some(AsyncEventMsg { kind, id })
}

/// An asynchronous event from the protocol; CQs and SRQs keep the connection's handle
/// numbers (the daemon backend's handles).
pub fn async_event_from_msg(m: &AsyncEventMsg) -> Result<AsyncEvent, ConvertError> {
    let port = || u8::try_from(m.id).map_err(|_| invalid("port", m.id));
    Ok(match m.kind {
        AsyncEventMsg::EV_CQ_ERR => AsyncEvent::CqErr {
            cq: engine::CqHandle(m.id),
        },
        AsyncEventMsg::EV_SQ_DRAINED => AsyncEvent::SqDrained { qpn: m.id },
        AsyncEventMsg::EV_QP_FATAL => AsyncEvent::QpFatal { qpn: m.id },
        AsyncEventMsg::EV_SRQ_LIMIT_REACHED => AsyncEvent::SrqLimitReached {
            srq: engine::SrqHandle(m.id),
        },
        AsyncEventMsg::EV_QP_LAST_WQE_REACHED => AsyncEvent::QpLastWqeReached { qpn: m.id },
        AsyncEventMsg::EV_PORT_ACTIVE => AsyncEvent::PortActive { port: port()? },
        AsyncEventMsg::EV_PORT_ERR => AsyncEvent::PortErr { port: port()? },
        k => return Err(invalid("async event kind", k)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_qp_attribute_survives_the_trip() {
        let mut a = QpAttr {
            qp_state: QpState::Rts,
            cur_qp_state: QpState::Rtr,
            path_mtu: engine::qp_attr::Mtu::Mtu1024,
            path_mig_state: engine::qp_attr::MigState::Armed,
            qkey: 1,
            rq_psn: 2,
            sq_psn: 3,
            dest_qp_num: 4,
            qp_access_flags: AccessFlags::REMOTE_WRITE,
            pkey_index: 5,
            alt_pkey_index: 6,
            en_sqd_async_notify: true,
            sq_draining: true,
            max_rd_atomic: 7,
            max_dest_rd_atomic: 8,
            min_rnr_timer: 9,
            port_num: 1,
            timeout: 10,
            retry_cnt: 6,
            rnr_retry: 7,
            alt_port_num: 1,
            alt_timeout: 11,
            rate_limit: 12,
            ..QpAttr::default()
        };
        a.cap.max_send_wr = 13;
        a.cap.max_inline_data = 14;
        a.ah_attr = AhAttr {
            dgid: [1; 16],
            hop_limit: 64,
            is_global: true,
            ..AhAttr::default()
        };
        a.alt_ah_attr = AhAttr {
            dgid: [2; 16],
            hop_limit: 3,
            is_global: true,
            port_num: 1,
            ..AhAttr::default()
        };
        let back = qp_attr_from_msg(&qp_attr_to_msg(&a), QpAttrMask::all()).unwrap();
        assert_eq!(back, a);
    }

    #[test]
    fn device_attributes_survive_the_trip() {
        let mut a = DeviceAttr::default();
        a.node_guid = 0x1122;
        a.sys_image_guid = 0x3344;
        a.max_mw = 77;
        a.fw_ver = "9.9".into();
        assert_eq!(device_attr_from_msg(&device_attr_to_msg(&a)), a);
    }

    #[test]
    fn unknown_async_event_kinds_are_errors() {
        assert!(async_event_from_msg(&AsyncEventMsg { kind: 0, id: 1 }).is_err());
        let ev = AsyncEvent::QpFatal { qpn: 0x11 };
        let m = async_event_to_msg(&ev, |_| None, |_| None).unwrap();
        assert_eq!(async_event_from_msg(&m).unwrap(), ev);
    }
}
