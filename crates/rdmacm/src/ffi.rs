//! The C types of `<rdma/rdma_cma.h>` (and the few of `<infiniband/verbs.h>` and
//! `<infiniband/sa.h>` librdmacm reads or writes), laid out exactly as rdma-core's headers
//! say; `tests/layout.rs` compiles the real headers and compares every offset and size.
//!
//! librdmacm does not link the verbs crate (its `ibv_*` exports would be re-exported from
//! this library), so the verbs types it needs are declared here again; objects it only
//! passes along (contexts, PDs, CQs, channels, SRQs) stay opaque.

#![allow(non_camel_case_types)]

use core::ffi::{c_int, c_void};

/// `union ibv_gid`: 16 bytes, 8-byte aligned (it also reads as two `__be64`).
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ibv_gid {
    /// The raw GID, network order.
    pub raw: [u8; 16],
}

/// `struct ibv_context` (opaque here).
#[repr(C)]
pub struct ibv_context {
    _opaque: [u8; 0],
}
/// `struct ibv_pd` (opaque here).
#[repr(C)]
pub struct ibv_pd {
    /// Owning context.
    pub context: *mut ibv_context,
}
/// `struct ibv_cq` (opaque here).
#[repr(C)]
pub struct ibv_cq {
    _opaque: [u8; 0],
}
/// `struct ibv_comp_channel` (opaque here).
#[repr(C)]
pub struct ibv_comp_channel {
    _opaque: [u8; 0],
}
/// `struct ibv_srq` (opaque here).
#[repr(C)]
pub struct ibv_srq {
    _opaque: [u8; 0],
}

/// `struct ibv_qp`: the fields up to `qp_type` (librdmacm reads no further).
#[repr(C)]
pub struct ibv_qp {
    /// Owning context.
    pub context: *mut ibv_context,
    /// The user's pointer.
    pub qp_context: *mut c_void,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ, if any.
    pub srq: *mut ibv_srq,
    /// Handle.
    pub handle: u32,
    /// QP number.
    pub qp_num: u32,
    /// `enum ibv_qp_state`.
    pub state: u32,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_cap {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send.
    pub max_send_sge: u32,
    /// SGEs per receive.
    pub max_recv_sge: u32,
    /// Inline bytes.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_qp_init_attr {
    /// The user's pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut ibv_srq,
    /// Capacities (written back).
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Signal every send.
    pub sq_sig_all: c_int,
}

/// `struct ibv_qp_init_attr_ex`: the fields up to `pd` (those rdma_create_qp_ex honours;
/// the rest must be unused, see `comp_mask`). The classic fields are repeated rather than
/// nested: `comp_mask` follows `sq_sig_all` with no padding.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_qp_init_attr_ex_head {
    /// The user's pointer.
    pub qp_context: *mut c_void,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut ibv_srq,
    /// Capacities (written back).
    pub cap: ibv_qp_cap,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Signal every send.
    pub sq_sig_all: c_int,
    /// `IBV_QP_INIT_ATTR_*`.
    pub comp_mask: u32,
    /// The PD (`IBV_QP_INIT_ATTR_PD`).
    pub pd: *mut ibv_pd,
}

impl ibv_qp_init_attr_ex_head {
    /// The classic attributes with `comp_mask` and `pd`.
    pub fn new(a: ibv_qp_init_attr, comp_mask: u32, pd: *mut ibv_pd) -> Self {
        ibv_qp_init_attr_ex_head {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
            comp_mask,
            pd,
        }
    }

    /// The classic attributes.
    pub fn base(&self) -> ibv_qp_init_attr {
        ibv_qp_init_attr {
            qp_context: self.qp_context,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            srq: self.srq,
            cap: self.cap,
            qp_type: self.qp_type,
            sq_sig_all: self.sq_sig_all,
        }
    }
}

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;

/// `struct ibv_srq_init_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ibv_srq_init_attr {
    /// The user's pointer.
    pub srq_context: *mut c_void,
    /// `struct ibv_srq_attr`: max_wr, max_sge, srq_limit.
    pub attr: [u32; 3],
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Flow label.
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_ah_attr {
    /// Global route.
    pub grh: ibv_global_route,
    /// Destination LID.
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// `grh` is valid.
    pub is_global: u8,
    /// Port.
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_qp_attr {
    /// State.
    pub qp_state: u32,
    /// Current state.
    pub cur_qp_state: u32,
    /// `enum ibv_mtu`.
    pub path_mtu: u32,
    /// Migration state.
    pub path_mig_state: u32,
    /// Q_Key.
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Remote QPN.
    pub dest_qp_num: u32,
    /// Access flags.
    pub qp_access_flags: u32,
    /// Capacities.
    pub cap: ibv_qp_cap,
    /// Primary path.
    pub ah_attr: ibv_ah_attr,
    /// Alternate path.
    pub alt_ah_attr: ibv_ah_attr,
    /// P_Key index.
    pub pkey_index: u16,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// SQD event.
    pub en_sqd_async_notify: u8,
    /// SQ draining.
    pub sq_draining: u8,
    /// Outstanding READ/ATOMIC as initiator.
    pub max_rd_atomic: u8,
    /// Outstanding READ/ATOMIC as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer.
    pub min_rnr_timer: u8,
    /// Port.
    pub port_num: u8,
    /// Local ACK timeout.
    pub timeout: u8,
    /// Retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate timeout.
    pub alt_timeout: u8,
    /// Rate limit.
    pub rate_limit: u32,
}

/// `enum ibv_qp_state` values librdmacm uses.
pub mod qps {
    /// RESET.
    pub const RESET: u32 = 0;
    /// INIT.
    pub const INIT: u32 = 1;
    /// RTR.
    pub const RTR: u32 = 2;
    /// RTS.
    pub const RTS: u32 = 3;
}

/// `enum ibv_qp_attr_mask` bits librdmacm uses.
pub mod qp_mask {
    /// `IBV_QP_STATE`.
    pub const STATE: c_int = 1;
    /// `IBV_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: c_int = 1 << 3;
    /// `IBV_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: c_int = 1 << 4;
    /// `IBV_QP_PORT`.
    pub const PORT: c_int = 1 << 5;
    /// `IBV_QP_QKEY`.
    pub const QKEY: c_int = 1 << 6;
    /// `IBV_QP_SQ_PSN`.
    pub const SQ_PSN: c_int = 1 << 16;
    use core::ffi::c_int;
}

/// `enum ibv_qp_type` values librdmacm uses.
pub mod qpt {
    /// Reliable connection.
    pub const RC: u32 = 2;
    /// Unreliable datagram.
    pub const UD: u32 = 4;
}

/// `IBV_ACCESS_*` flags librdmacm grants a connected QP in INIT.
pub const ACCESS_LOCAL_WRITE: u32 = 1;
/// `IBV_ACCESS_REMOTE_WRITE`.
pub const ACCESS_REMOTE_WRITE: u32 = 2;
/// `IBV_ACCESS_REMOTE_READ`.
pub const ACCESS_REMOTE_READ: u32 = 4;
/// `IBV_ACCESS_REMOTE_ATOMIC`.
pub const ACCESS_REMOTE_ATOMIC: u32 = 8;

/// `struct ibv_ece`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_ece {
    /// IEEE OUI of the vendor.
    pub vendor_id: u32,
    /// Vendor options.
    pub options: u32,
    /// Must be 0.
    pub comp_mask: u32,
}

/// `struct ibv_sa_path_rec` (`<infiniband/sa.h>`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct ibv_sa_path_rec {
    /// Destination GID.
    pub dgid: ibv_gid,
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Source LID (0 on RoCE).
    pub slid: u16,
    /// Raw traffic.
    pub raw_traffic: c_int,
    /// Flow label, big endian.
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Reversible.
    pub reversible: c_int,
    /// Number of paths.
    pub numb_path: u8,
    /// P_Key, big endian.
    pub pkey: u16,
    /// Service level.
    pub sl: u8,
    /// MTU selector (2 = exactly).
    pub mtu_selector: u8,
    /// `enum ibv_mtu`.
    pub mtu: u8,
    /// Rate selector.
    pub rate_selector: u8,
    /// Rate.
    pub rate: u8,
    /// Packet life time selector.
    pub packet_life_time_selector: u8,
    /// Packet life time.
    pub packet_life_time: u8,
    /// Preference.
    pub preference: u8,
}

/// `enum rdma_cm_event_type`.
pub mod ev {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    pub const ADDR_RESOLVED: u32 = 0;
    /// `RDMA_CM_EVENT_ADDR_ERROR`.
    pub const ADDR_ERROR: u32 = 1;
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    pub const ROUTE_RESOLVED: u32 = 2;
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    pub const ROUTE_ERROR: u32 = 3;
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    pub const CONNECT_REQUEST: u32 = 4;
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
    pub const CONNECT_RESPONSE: u32 = 5;
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    pub const CONNECT_ERROR: u32 = 6;
    /// `RDMA_CM_EVENT_UNREACHABLE`.
    pub const UNREACHABLE: u32 = 7;
    /// `RDMA_CM_EVENT_REJECTED`.
    pub const REJECTED: u32 = 8;
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    pub const ESTABLISHED: u32 = 9;
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    pub const DISCONNECTED: u32 = 10;
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    pub const DEVICE_REMOVAL: u32 = 11;
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`.
    pub const MULTICAST_JOIN: u32 = 12;
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`.
    pub const MULTICAST_ERROR: u32 = 13;
    /// `RDMA_CM_EVENT_ADDR_CHANGE`.
    pub const ADDR_CHANGE: u32 = 14;
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
    pub const TIMEWAIT_EXIT: u32 = 15;
}

/// `enum rdma_port_space`.
pub mod ps {
    /// `RDMA_PS_IPOIB`.
    pub const IPOIB: u32 = 0x0002;
    /// `RDMA_PS_TCP`.
    pub const TCP: u32 = 0x0106;
    /// `RDMA_PS_UDP`.
    pub const UDP: u32 = 0x0111;
    /// `RDMA_PS_IB`.
    pub const IB: u32 = 0x013f;
}

/// `RDMA_UDP_QKEY`: the Q_Key of QPs on UDP-port-space ids.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// `RAI_PASSIVE`.
pub const RAI_PASSIVE: c_int = 1;
/// `RAI_NUMERICHOST`.
pub const RAI_NUMERICHOST: c_int = 2;
/// `RAI_NOROUTE`.
pub const RAI_NOROUTE: c_int = 4;
/// `RAI_FAMILY`.
pub const RAI_FAMILY: c_int = 8;

/// Option levels and names of `rdma_set_option`.
pub mod opt {
    /// `RDMA_OPTION_ID`.
    pub const LEVEL_ID: i32 = 0;
    /// `RDMA_OPTION_IB`.
    pub const LEVEL_IB: i32 = 1;
    /// `RDMA_OPTION_ID_TOS` (uint8_t).
    pub const ID_TOS: i32 = 0;
    /// `RDMA_OPTION_ID_REUSEADDR` (int).
    pub const ID_REUSEADDR: i32 = 1;
    /// `RDMA_OPTION_ID_AFONLY` (int).
    pub const ID_AFONLY: i32 = 2;
    /// `RDMA_OPTION_ID_ACK_TIMEOUT` (uint8_t).
    pub const ID_ACK_TIMEOUT: i32 = 3;
    /// `RDMA_OPTION_IB_PATH` (struct ibv_path_data[]).
    pub const IB_PATH: i32 = 1;
}

/// `struct rdma_ib_addr`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rdma_ib_addr {
    /// Source GID.
    pub sgid: ibv_gid,
    /// Destination GID.
    pub dgid: ibv_gid,
    /// P_Key, big endian.
    pub pkey: u16,
}

/// `struct rdma_addr`: the unions of socket addresses as `sockaddr_storage`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_addr {
    /// `src_addr` / `src_sin` / `src_sin6` / `src_storage`.
    pub src: libc::sockaddr_storage,
    /// `dst_addr` / `dst_sin` / `dst_sin6` / `dst_storage`.
    pub dst: libc::sockaddr_storage,
    /// `addr.ibaddr`.
    pub ibaddr: rdma_ib_addr,
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_route {
    /// Addresses.
    pub addr: rdma_addr,
    /// The paths (one, once resolved).
    pub path_rec: *mut ibv_sa_path_rec,
    /// How many.
    pub num_paths: c_int,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    /// Readable while events wait.
    pub fd: c_int,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct rdma_cm_id {
    /// The device, once bound or resolved.
    pub verbs: *mut ibv_context,
    /// Where its events go.
    pub channel: *mut rdma_event_channel,
    /// The user's pointer.
    pub context: *mut c_void,
    /// The QP rdma_create_qp made.
    pub qp: *mut ibv_qp,
    /// Addresses and path.
    pub route: rdma_route,
    /// `enum rdma_port_space`.
    pub ps: u32,
    /// Port of the device.
    pub port_num: u8,
    /// The last event of a synchronous id.
    pub event: *mut rdma_cm_event,
    /// Send CQ's channel (made by rdma_create_qp).
    pub send_cq_channel: *mut ibv_comp_channel,
    /// Send CQ.
    pub send_cq: *mut ibv_cq,
    /// Receive CQ's channel.
    pub recv_cq_channel: *mut ibv_comp_channel,
    /// Receive CQ.
    pub recv_cq: *mut ibv_cq,
    /// SRQ.
    pub srq: *mut ibv_srq,
    /// PD.
    pub pd: *mut ibv_pd,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rdma_conn_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// READ/ATOMIC accepted outstanding from the peer.
    pub responder_resources: u8,
    /// READ/ATOMIC outstanding at the peer.
    pub initiator_depth: u8,
    /// Flow control.
    pub flow_control: u8,
    /// Retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// SRQ in use.
    pub srq: u8,
    /// QP number.
    pub qp_num: u32,
}

/// `struct rdma_ud_param`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rdma_ud_param {
    /// Private data.
    pub private_data: *const c_void,
    /// Its length.
    pub private_data_len: u8,
    /// The peer's address.
    pub ah_attr: ibv_ah_attr,
    /// Its QP.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
}

/// `union { struct rdma_conn_param conn; struct rdma_ud_param ud; }`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union rdma_cm_event_param {
    /// Connected port spaces.
    pub conn: rdma_conn_param,
    /// Datagram port spaces.
    pub ud: rdma_ud_param,
}

/// `struct rdma_cm_event`.
#[repr(C)]
pub struct rdma_cm_event {
    /// The id it is about.
    pub id: *mut rdma_cm_id,
    /// CONNECT_REQUEST: the listening id.
    pub listen_id: *mut rdma_cm_id,
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    /// 0, a negative errno, or the REJ reason.
    pub status: c_int,
    /// Parameters.
    pub param: rdma_cm_event_param,
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct rdma_addrinfo {
    /// `RAI_*`.
    pub ai_flags: c_int,
    /// Address family.
    pub ai_family: c_int,
    /// `enum ibv_qp_type`.
    pub ai_qp_type: c_int,
    /// `enum rdma_port_space`.
    pub ai_port_space: c_int,
    /// Source address length.
    pub ai_src_len: libc::socklen_t,
    /// Destination address length.
    pub ai_dst_len: libc::socklen_t,
    /// Source address.
    pub ai_src_addr: *mut libc::sockaddr,
    /// Destination address.
    pub ai_dst_addr: *mut libc::sockaddr,
    /// Source name.
    pub ai_src_canonname: *mut libc::c_char,
    /// Destination name.
    pub ai_dst_canonname: *mut libc::c_char,
    /// Route length.
    pub ai_route_len: usize,
    /// Route.
    pub ai_route: *mut c_void,
    /// Connect data length.
    pub ai_connect_len: usize,
    /// Connect data.
    pub ai_connect: *mut c_void,
    /// Next.
    pub ai_next: *mut rdma_addrinfo,
}

/// `struct rdma_cm_join_mc_attr_ex`.
#[repr(C)]
pub struct rdma_cm_join_mc_attr_ex {
    /// `RDMA_CM_JOIN_MC_ATTR_*`.
    pub comp_mask: u32,
    /// `RDMA_MC_JOIN_FLAG_*`.
    pub join_flags: u32,
    /// The group.
    pub addr: *mut libc::sockaddr,
}

/// Private data a REQ carries after rdma_cm's 36-byte IP header (92 − 36).
pub const REQ_PRIVATE_DATA_MAX: usize = 56;
/// Private data of a REP.
pub const REP_PRIVATE_DATA_MAX: usize = 196;
/// Private data of a REJ.
pub const REJ_PRIVATE_DATA_MAX: usize = 148;
/// Private data a UDP id's `rdma_connect` may send: a SIDR_REQ's 216 bytes less the IP CM
/// header.
pub const SIDR_REQ_PRIVATE_DATA_MAX: usize = 180;
/// Private data a UDP id's `rdma_accept` may send (a SIDR_REP's).
pub const SIDR_REP_PRIVATE_DATA_MAX: usize = 136;

/// Offset of `max_qp_rd_atom` (an `int`) in `struct ibv_device_attr`, which librdmacm
/// reads from a byte buffer rather than declaring the whole struct again.
pub const DEVICE_ATTR_MAX_QP_RD_ATOM: usize = 144;
/// Offset of `max_qp_init_rd_atom` (an `int`) in `struct ibv_device_attr`.
pub const DEVICE_ATTR_MAX_QP_INIT_RD_ATOM: usize = 156;
/// Offset of `active_mtu` (`enum ibv_mtu`) in `struct ibv_port_attr`.
pub const PORT_ATTR_ACTIVE_MTU: usize = 8;
/// Offset of `gid_tbl_len` (an `int`) in `struct ibv_port_attr`.
pub const PORT_ATTR_GID_TBL_LEN: usize = 12;
