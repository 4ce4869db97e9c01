//! The C structs of `<infiniband/verbs.h>` (rdma-core 44, x86-64) that cross the ABI, with
//! their sizes and the offsets programs rely on asserted at compile time.

#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

/// `IBV_SYSFS_NAME_MAX`.
pub const SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const SYSFS_PATH_MAX: usize = 256;

/// `struct ibv_device`: what `ibv_get_device_list` hands out.
#[repr(C)]
pub struct ibv_device {
    /// `_ops`: two obsolete provider hooks, always NULL.
    pub ops: [usize; 2],
    /// `enum ibv_node_type` (1 = CA).
    pub node_type: c_int,
    /// `enum ibv_transport_type` (0 = IB, also for RoCE).
    pub transport_type: c_int,
    /// Device name (`softrdma0`).
    pub name: [c_char; SYSFS_NAME_MAX],
    /// uverbs device name.
    pub dev_name: [c_char; SYSFS_NAME_MAX],
    /// uverbs sysfs path.
    pub dev_path: [c_char; SYSFS_PATH_MAX],
    /// infiniband sysfs path.
    pub ibdev_path: [c_char; SYSFS_PATH_MAX],
}

type Fp = Option<unsafe extern "C" fn()>;

/// `struct ibv_context_ops`: the data-path calls the inline functions of verbs.h make.
#[repr(C)]
pub struct ibv_context_ops {
    /// Slots 0..=10: obsolete or MW calls (alloc_mw @56, bind_mw @64, dealloc_mw @72).
    pub head: [Fp; 11],
    /// `poll_cq` @88.
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    /// `req_notify_cq` @96.
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    /// Slots 13..=19: obsolete.
    pub mid: [Fp; 7],
    /// `post_srq_recv` @160.
    pub post_srq_recv: Option<
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    >,
    /// Slots 21..=24: obsolete.
    pub mid2: [Fp; 4],
    /// `post_send` @200.
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    /// `post_recv` @208.
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    /// Slots 27..=31: obsolete.
    pub tail: [Fp; 5],
}

/// `pthread_mutex_t` storage (x86-64).
pub type Mutex40 = [u64; 5];
/// `pthread_cond_t` storage (x86-64).
pub type Cond48 = [u64; 6];

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    /// The device it was opened from.
    pub device: *mut ibv_device,
    /// Data-path operations.
    pub ops: ibv_context_ops,
    /// Command fd (a real descriptor: programs may poll it).
    pub cmd_fd: c_int,
    /// Async event fd.
    pub async_fd: c_int,
    /// Completion vectors.
    pub num_comp_vectors: c_int,
    /// Context mutex (zeroed = PTHREAD_MUTEX_INITIALIZER).
    pub mutex: Mutex40,
    /// `__VERBS_ABI_IS_EXTENDED` (UINTPTR_MAX) marks the enclosing `verbs_context`.
    pub abi_compat: *mut c_void,
}

/// `query_port` of `struct verbs_context`.
pub type QueryPortFn =
    unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;

/// `query_device_ex` of `struct verbs_context` (input, attr, attr_size).
pub type QueryDeviceExFn =
    unsafe extern "C" fn(*mut ibv_context, *const c_void, *mut u8, usize) -> c_int;

/// Size of `struct ibv_device_attr_ex`.
pub const DEVICE_ATTR_EX_SIZE: usize = 400;
/// Offset of `phys_port_cnt_ex` in `struct ibv_device_attr_ex`.
pub const PHYS_PORT_CNT_EX_OFFSET: usize = 396;

/// `struct verbs_context`: the extended context; `ibv_context` is its last member.
#[repr(C)]
pub struct verbs_context {
    /// `query_port` (used by the inline `ibv_query_port`).
    pub query_port: Option<QueryPortFn>,
    /// `advise_mr` .. `priv`: 26 slots we leave NULL ("not supported").
    pub other_a: [usize; 26],
    /// `query_device_ex` (used by the inline `ibv_query_device_ex`).
    pub query_device_ex: Option<QueryDeviceExFn>,
    /// `ibv_destroy_flow` .. `_ABI_placeholder3`: 11 slots left NULL.
    pub other_b: [usize; 11],
    /// Bytes of this struct that are valid, counted back from `context`.
    pub sz: usize,
    /// The classic context.
    pub context: ibv_context,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Kernel handle (ours: the engine's).
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Start address.
    pub addr: *mut c_void,
    /// Length.
    pub length: usize,
    /// Handle.
    pub handle: u32,
    /// Local key.
    pub lkey: u32,
    /// Remote key.
    pub rkey: u32,
}

/// `struct ibv_mw`: a memory window.
#[repr(C)]
pub struct ibv_mw {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Current remote key (type 1: set by `ibv_bind_mw`; type 2: the program's).
    pub rkey: u32,
    /// Handle.
    pub handle: u32,
    /// `enum ibv_mw_type` (1 or 2).
    pub mw_type: u32,
}

/// `struct ibv_mw_bind_info`: what a bind exposes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    /// The region (NULL with length 0: unbind a type 1 window).
    pub mr: *mut ibv_mr,
    /// First byte.
    pub addr: u64,
    /// Bytes.
    pub length: u64,
    /// `IBV_ACCESS_REMOTE_*` rights through the window.
    pub mw_access_flags: u32,
}

/// `struct ibv_mw_bind`: `ibv_bind_mw`'s argument (type 1 windows).
#[repr(C)]
pub struct ibv_mw_bind {
    /// Returned in the completion.
    pub wr_id: u64,
    /// `IBV_SEND_SIGNALED`...
    pub send_flags: u32,
    /// The range and rights.
    pub bind_info: ibv_mw_bind_info,
}

/// The `bind_mw` member of `ibv_send_wr` (`IBV_WR_BIND_MW`, type 2 windows).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrBindMw {
    /// The window.
    pub mw: *mut ibv_mw,
    /// The key it gets.
    pub rkey: u32,
    /// The range and rights.
    pub bind_info: ibv_mw_bind_info,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    /// Owning context.
    pub context: *mut ibv_context,
    /// The descriptor `ibv_get_cq_event` waits on.
    pub fd: c_int,
    /// CQs using it.
    pub refcnt: c_int,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    /// Owning context (the inline calls go through its ops).
    pub context: *mut ibv_context,
    /// Completion channel, if any.
    pub channel: *mut ibv_comp_channel,
    /// The user's pointer.
    pub cq_context: *mut c_void,
    /// Handle.
    pub handle: u32,
    /// Capacity.
    pub cqe: c_int,
    /// Mutex.
    pub mutex: Mutex40,
    /// Condition.
    pub cond: Cond48,
    /// Events acknowledged.
    pub comp_events_completed: u32,
    /// Async events acknowledged.
    pub async_events_completed: u32,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    /// Owning context.
    pub context: *mut ibv_context,
    /// The user's pointer.
    pub srq_context: *mut c_void,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
    /// Mutex.
    pub mutex: Mutex40,
    /// Condition.
    pub cond: Cond48,
    /// Events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_qp`.
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
    /// Mutex.
    pub mutex: Mutex40,
    /// Condition.
    pub cond: Cond48,
    /// Events acknowledged.
    pub events_completed: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_sge {
    /// Address.
    pub addr: u64,
    /// Length.
    pub length: u32,
    /// Local key.
    pub lkey: u32,
}

/// `wr.rdma` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrRdma {
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.atomic` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrAtomic {
    /// Remote address.
    pub remote_addr: u64,
    /// Compare (CAS) or add (FETCH_ADD) operand.
    pub compare_add: u64,
    /// Swap value.
    pub swap: u64,
    /// Remote key.
    pub rkey: u32,
}

/// `wr.ud` of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct WrUd {
    /// Address handle.
    pub ah: *mut c_void,
    /// Destination QPN.
    pub remote_qpn: u32,
    /// Q_Key.
    pub remote_qkey: u32,
}

/// The `wr` union of `ibv_send_wr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub union WrUnion {
    /// RDMA WRITE / READ.
    pub rdma: WrRdma,
    /// ATOMIC.
    pub atomic: WrAtomic,
    /// UD.
    pub ud: WrUd,
}

/// `struct ibv_send_wr`.
#[repr(C)]
pub struct ibv_send_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Next WR of the list.
    pub next: *mut ibv_send_wr,
    /// Gather list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
    /// `enum ibv_wr_opcode`.
    pub opcode: u32,
    /// `enum ibv_send_flags`.
    pub send_flags: u32,
    /// `imm_data` (big endian) or `invalidate_rkey`.
    pub imm_data: u32,
    /// Operation fields.
    pub wr: WrUnion,
    /// `qp_type.xrc.remote_srqn`.
    pub xrc_remote_srqn: u32,
    /// `bind_mw` / `tso` union (48 bytes; `tso` is not offered).
    pub bind_mw: WrBindMw,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Next WR of the list.
    pub next: *mut ibv_recv_wr,
    /// Scatter list.
    pub sg_list: *mut ibv_sge,
    /// Its length.
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_wc {
    /// The WR's id.
    pub wr_id: u64,
    /// `enum ibv_wc_status`.
    pub status: u32,
    /// `enum ibv_wc_opcode`.
    pub opcode: u32,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes.
    pub byte_len: u32,
    /// `imm_data` (big endian) or `invalidated_rkey`.
    pub imm_data: u32,
    /// Local QPN.
    pub qp_num: u32,
    /// Remote QPN.
    pub src_qp: u32,
    /// `enum ibv_wc_flags`.
    pub wc_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Path bits.
    pub dlid_path_bits: u8,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
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

/// `struct ibv_qp_init_attr_ex` (the fields up to `send_ops_flags`).
#[repr(C)]
pub struct ibv_qp_init_attr_ex {
    /// The classic attributes (same layout as `ibv_qp_init_attr`, 60 bytes).
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
    /// `IBV_QP_INIT_ATTR_*`: which fields below are valid.
    pub comp_mask: u32,
    /// The PD (`IBV_QP_INIT_ATTR_PD`).
    pub pd: *mut ibv_pd,
    /// XRC domain.
    pub xrcd: *mut c_void,
    /// `IBV_QP_CREATE_*`.
    pub create_flags: u32,
    /// TSO header size.
    pub max_tso_header: u16,
    /// RSS indirection table.
    pub rwq_ind_tbl: *mut c_void,
    /// `struct ibv_rx_hash_conf` (24 bytes).
    pub rx_hash_conf: [u64; 3],
    /// Source QPN (`IBV_QP_CREATE_SOURCE_QPN`).
    pub source_qpn: u32,
    /// `IBV_QP_EX_WITH_*`: the operations the extended post API will be used for.
    pub send_ops_flags: u64,
}

/// The part of `struct ibv_qp_ex` after its `ibv_qp`: the extended post API (`wr_start`,
/// `wr_send`, `wr_set_sge`... `wr_complete`), called as function pointers.
#[repr(C)]
pub struct ibv_qp_ex_tail {
    /// Extensions in use (none).
    pub comp_mask: u64,
    /// `wr_id` of the next work request the program starts.
    pub wr_id: u64,
    /// `IBV_SEND_*` flags of the next work request.
    pub wr_flags: u32,
    /// `wr_atomic_cmp_swp` .. `wr_atomic_write`, in declaration order (21 slots).
    pub ops: [usize; 21],
}

/// `ibv_qp_ex_tail.ops` slots.
pub mod qp_ex_op {
    /// `wr_atomic_cmp_swp`.
    pub const ATOMIC_CMP_SWP: usize = 0;
    /// `wr_atomic_fetch_add`.
    pub const ATOMIC_FETCH_ADD: usize = 1;
    /// `wr_bind_mw`.
    pub const BIND_MW: usize = 2;
    /// `wr_local_inv`.
    pub const LOCAL_INV: usize = 3;
    /// `wr_rdma_read`.
    pub const RDMA_READ: usize = 4;
    /// `wr_rdma_write`.
    pub const RDMA_WRITE: usize = 5;
    /// `wr_rdma_write_imm`.
    pub const RDMA_WRITE_IMM: usize = 6;
    /// `wr_send`.
    pub const SEND: usize = 7;
    /// `wr_send_imm`.
    pub const SEND_IMM: usize = 8;
    /// `wr_send_inv`.
    pub const SEND_INV: usize = 9;
    /// `wr_send_tso`.
    pub const SEND_TSO: usize = 10;
    /// `wr_set_ud_addr`.
    pub const SET_UD_ADDR: usize = 11;
    /// `wr_set_xrc_srqn`.
    pub const SET_XRC_SRQN: usize = 12;
    /// `wr_set_inline_data`.
    pub const SET_INLINE_DATA: usize = 13;
    /// `wr_set_inline_data_list`.
    pub const SET_INLINE_DATA_LIST: usize = 14;
    /// `wr_set_sge`.
    pub const SET_SGE: usize = 15;
    /// `wr_set_sge_list`.
    pub const SET_SGE_LIST: usize = 16;
    /// `wr_start`.
    pub const START: usize = 17;
    /// `wr_complete`.
    pub const COMPLETE: usize = 18;
    /// `wr_abort`.
    pub const ABORT: usize = 19;
    /// `wr_atomic_write`.
    pub const ATOMIC_WRITE: usize = 20;
}

/// `struct ibv_cq_init_attr_ex`.
#[repr(C)]
pub struct ibv_cq_init_attr_ex {
    /// Entries wanted.
    pub cqe: u32,
    /// The user's pointer.
    pub cq_context: *mut c_void,
    /// Completion channel, or NULL.
    pub channel: *mut ibv_comp_channel,
    /// Completion vector.
    pub comp_vector: u32,
    /// `IBV_WC_EX_WITH_*`: what the `read_*` calls will be asked for.
    pub wc_flags: u64,
    /// `IBV_CQ_INIT_ATTR_MASK_*`.
    pub comp_mask: u32,
    /// `IBV_CREATE_CQ_ATTR_*`.
    pub flags: u32,
    /// Parent domain.
    pub parent_domain: *mut ibv_pd,
}

/// The part of `struct ibv_cq_ex` after the fields it shares with `ibv_cq`: the polling
/// API (`start_poll`, `next_poll`, `end_poll`, `read_*`), called as function pointers.
#[repr(C)]
pub struct ibv_cq_ex_tail {
    /// Extensions in use (none).
    pub comp_mask: u32,
    /// `enum ibv_wc_status` of the current completion.
    pub status: u32,
    /// `wr_id` of the current completion.
    pub wr_id: u64,
    /// `start_poll` .. `read_completion_wallclock_ns`, in declaration order (18 slots).
    pub ops: [usize; 18],
}

/// `ibv_cq_ex_tail.ops` slots.
pub mod cq_ex_op {
    /// `start_poll`.
    pub const START_POLL: usize = 0;
    /// `next_poll`.
    pub const NEXT_POLL: usize = 1;
    /// `end_poll`.
    pub const END_POLL: usize = 2;
    /// `read_opcode`.
    pub const READ_OPCODE: usize = 3;
    /// `read_vendor_err`.
    pub const READ_VENDOR_ERR: usize = 4;
    /// `read_byte_len`.
    pub const READ_BYTE_LEN: usize = 5;
    /// `read_imm_data`.
    pub const READ_IMM_DATA: usize = 6;
    /// `read_qp_num`.
    pub const READ_QP_NUM: usize = 7;
    /// `read_src_qp`.
    pub const READ_SRC_QP: usize = 8;
    /// `read_wc_flags`.
    pub const READ_WC_FLAGS: usize = 9;
    /// `read_slid`.
    pub const READ_SLID: usize = 10;
    /// `read_sl`.
    pub const READ_SL: usize = 11;
    /// `read_dlid_path_bits`.
    pub const READ_DLID_PATH_BITS: usize = 12;
}

/// `struct ibv_data_buf` (`wr_set_inline_data_list`).
#[repr(C)]
pub struct ibv_data_buf {
    /// Bytes.
    pub addr: *mut c_void,
    /// How many.
    pub length: usize,
}

/// `struct ibv_global_route`.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct ibv_global_route {
    /// Destination GID.
    pub dgid: [u8; 16],
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
#[derive(Clone, Copy, Default)]
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
#[derive(Clone, Copy, Default)]
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
    /// Draining.
    pub sq_draining: u8,
    /// Initiator depth.
    pub max_rd_atomic: u8,
    /// Responder resources.
    pub max_dest_rd_atomic: u8,
    /// RNR timer.
    pub min_rnr_timer: u8,
    /// Port.
    pub port_num: u8,
    /// ACK timeout.
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

/// `struct ibv_port_attr` (52 bytes; the exported `ibv_query_port` writes the first 48).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_port_attr {
    /// `enum ibv_port_state`.
    pub state: u32,
    /// `enum ibv_mtu`.
    pub max_mtu: u32,
    /// `enum ibv_mtu`.
    pub active_mtu: u32,
    /// GID table length.
    pub gid_tbl_len: c_int,
    /// Capability flags.
    pub port_cap_flags: u32,
    /// Largest message.
    pub max_msg_sz: u32,
    /// Counter.
    pub bad_pkey_cntr: u32,
    /// Counter.
    pub qkey_viol_cntr: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID.
    pub lid: u16,
    /// SM LID.
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// VLs.
    pub max_vl_num: u8,
    /// SM SL.
    pub sm_sl: u8,
    /// Subnet timeout.
    pub subnet_timeout: u8,
    /// Init type reply.
    pub init_type_reply: u8,
    /// Active width.
    pub active_width: u8,
    /// Active speed.
    pub active_speed: u8,
    /// Physical state.
    pub phys_state: u8,
    /// `IBV_LINK_LAYER_*`.
    pub link_layer: u8,
    /// Flags.
    pub flags: u8,
    /// More capability flags.
    pub port_cap_flags2: u16,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    /// Firmware version.
    pub fw_ver: [c_char; 64],
    /// Node GUID (big endian).
    pub node_guid: u64,
    /// System image GUID (big endian).
    pub sys_image_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// Page sizes.
    pub page_size_cap: u64,
    /// Vendor.
    pub vendor_id: u32,
    /// Part.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// The `int` limits from `max_qp` to `max_srq_sge`, in declaration order.
    pub ints: [c_int; 29],
    /// P_Keys.
    pub max_pkeys: u16,
    /// ACK delay.
    pub local_ca_ack_delay: u8,
    /// Ports.
    pub phys_port_cnt: u8,
}

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_gid_entry {
    /// The GID.
    pub gid: [u8; 16],
    /// Index.
    pub gid_index: u32,
    /// Port.
    pub port_num: u32,
    /// `enum ibv_gid_type` (2 = RoCE v2).
    pub gid_type: u32,
    /// Interface index.
    pub ndev_ifindex: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_srq_attr {
    /// Most WRs queued.
    pub max_wr: u32,
    /// Most SGEs per WR.
    pub max_sge: u32,
    /// Limit event threshold.
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    /// The user's pointer.
    pub srq_context: *mut c_void,
    /// Sizes (written back).
    pub attr: ibv_srq_attr,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    /// Owning context.
    pub context: *mut ibv_context,
    /// Its PD.
    pub pd: *mut ibv_pd,
    /// Handle.
    pub handle: u32,
}

/// `struct ibv_async_event`.
#[repr(C)]
pub struct ibv_async_event {
    /// The object concerned (`cq`, `qp`, `srq`, `wq`) or the port number.
    pub element: *mut c_void,
    /// `enum ibv_event_type`.
    pub event_type: u32,
}

const _: () = {
    assert!(size_of::<ibv_async_event>() == 16);
    assert!(size_of::<ibv_mw>() == 32);
    assert!(size_of::<ibv_qp_init_attr_ex>() == 136);
    assert!(offset_of!(ibv_qp_init_attr_ex, comp_mask) == 60);
    assert!(offset_of!(ibv_qp_init_attr_ex, pd) == 64);
    assert!(offset_of!(ibv_qp_init_attr_ex, create_flags) == 80);
    assert!(offset_of!(ibv_qp_init_attr_ex, rx_hash_conf) == 96);
    assert!(offset_of!(ibv_qp_init_attr_ex, send_ops_flags) == 128);
    // ibv_qp (160) + this = struct ibv_qp_ex (352), wr_start @320, wr_complete @328.
    assert!(size_of::<ibv_qp>() + size_of::<ibv_qp_ex_tail>() == 352);
    assert!(size_of::<ibv_qp>() + offset_of!(ibv_qp_ex_tail, ops) + 8 * qp_ex_op::START == 320);
    assert!(size_of::<ibv_data_buf>() == 16);
    assert!(size_of::<ibv_cq_init_attr_ex>() == 56);
    assert!(offset_of!(ibv_cq_init_attr_ex, wc_flags) == 32);
    assert!(offset_of!(ibv_cq_init_attr_ex, parent_domain) == 48);
    // ibv_cq (128) + this = struct ibv_cq_ex (288), start_poll @144.
    assert!(size_of::<ibv_cq>() + size_of::<ibv_cq_ex_tail>() == 288);
    assert!(size_of::<ibv_cq>() + offset_of!(ibv_cq_ex_tail, ops) == 144);
    assert!(size_of::<ibv_mw_bind_info>() == 32);
    assert!(size_of::<ibv_mw_bind>() == 48);
    assert!(offset_of!(ibv_mw_bind, bind_info) == 16);
    assert!(size_of::<WrBindMw>() == 48);
    assert!(offset_of!(WrBindMw, bind_info) == 16);
    assert!(size_of::<ibv_srq_init_attr>() == 24);
    assert!(size_of::<ibv_ah>() == 24);
    assert!(size_of::<ibv_device>() == 664);
    assert!(offset_of!(ibv_device, name) == 24);
    assert!(offset_of!(ibv_device, dev_path) == 152);
    assert!(offset_of!(ibv_device, ibdev_path) == 408);
    assert!(size_of::<ibv_context_ops>() == 256);
    assert!(offset_of!(ibv_context_ops, poll_cq) == 88);
    assert!(offset_of!(ibv_context_ops, req_notify_cq) == 96);
    assert!(offset_of!(ibv_context_ops, post_srq_recv) == 160);
    assert!(offset_of!(ibv_context_ops, post_send) == 200);
    assert!(offset_of!(ibv_context_ops, post_recv) == 208);
    assert!(size_of::<ibv_context>() == 328);
    assert!(offset_of!(ibv_context, ops) == 8);
    assert!(offset_of!(ibv_context, cmd_fd) == 264);
    assert!(offset_of!(ibv_context, async_fd) == 268);
    assert!(offset_of!(ibv_context, num_comp_vectors) == 272);
    assert!(offset_of!(ibv_context, abi_compat) == 320);
    assert!(size_of::<verbs_context>() == 648);
    assert!(offset_of!(verbs_context, sz) == 312);
    assert!(offset_of!(verbs_context, query_device_ex) == 216);
    assert!(offset_of!(verbs_context, context) == 320);
    assert!(size_of::<ibv_pd>() == 16);
    assert!(size_of::<ibv_mr>() == 48);
    assert!(size_of::<ibv_comp_channel>() == 16);
    assert!(size_of::<ibv_cq>() == 128);
    assert!(offset_of!(ibv_cq, comp_events_completed) == 120);
    assert!(size_of::<ibv_srq>() == 128);
    assert!(size_of::<ibv_qp>() == 160);
    assert!(offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_qp, events_completed) == 152);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, wr) == 40);
    assert!(offset_of!(ibv_send_wr, bind_mw) == 80);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(size_of::<ibv_ah_attr>() == 32);
    assert!(size_of::<ibv_qp_attr>() == 144);
    assert!(offset_of!(ibv_qp_attr, ah_attr) == 56);
    assert!(offset_of!(ibv_qp_attr, pkey_index) == 120);
    assert!(offset_of!(ibv_qp_attr, rate_limit) == 136);
    assert!(size_of::<ibv_port_attr>() == 52);
    assert!(offset_of!(ibv_port_attr, link_layer) == 46);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(offset_of!(ibv_device_attr, max_pkeys) == 224);
    assert!(size_of::<ibv_gid_entry>() == 32);
};
