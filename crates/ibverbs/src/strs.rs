//! The `ibv_*_str` calls: the words libibverbs prints for a completion status, an async event,
//! a port state and a node type. Programs put them in their logs (UCX, perftest), so they are
//! rdma-core's words exactly, and `"unknown"` for a value outside the enum.

use core::ffi::{c_char, CStr};

/// The entry of `table` for the enum value `v`, or `"unknown"`.
fn word(table: &[&'static CStr], v: u32) -> *const c_char {
    table
        .get(v as usize)
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// `ibv_wc_status_str(enum ibv_wc_status)`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    word(
        &[
            c"success",
            c"local length error",
            c"local QP operation error",
            c"local EE context operation error",
            c"local protection error",
            c"Work Request Flushed Error",
            c"memory management operation error",
            c"bad response error",
            c"local access error",
            c"remote invalid request error",
            c"remote access error",
            c"remote operation error",
            c"transport retry counter exceeded",
            c"RNR retry counter exceeded",
            c"local RDD violation error",
            c"remote invalid RD request",
            c"aborted error",
            c"invalid EE context number",
            c"invalid EE context state",
            c"fatal error",
            c"response timeout error",
            c"general error",
            c"TM error",
            c"TM software rendezvous",
        ],
        status,
    )
}

/// `ibv_event_type_str(enum ibv_event_type)`.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: u32) -> *const c_char {
    word(
        &[
            c"CQ error",
            c"local work queue catastrophic error",
            c"invalid request local work queue error",
            c"local access violation work queue error",
            c"communication established",
            c"send queue drained",
            c"path migrated",
            c"path migration request error",
            c"local catastrophic error",
            c"port active",
            c"port error",
            c"LID change",
            c"P_Key change",
            c"SM change",
            c"SRQ catastrophic error",
            c"SRQ limit reached",
            c"last WQE reached",
            c"client reregistration",
            c"GID table change",
            c"WQ fatal",
        ],
        event,
    )
}

/// `ibv_port_state_str(enum ibv_port_state)`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(state: u32) -> *const c_char {
    word(
        &[
            c"no state change (NOP)",
            c"down",
            c"init",
            c"armed",
            c"active",
            c"active defer",
        ],
        state,
    )
}

/// `ibv_node_type_str(enum ibv_node_type)`: the enum starts at `IBV_NODE_CA` = 1
/// (`IBV_NODE_UNKNOWN` is -1), so 0 is "unknown" too.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: i32) -> *const c_char {
    let Some(v) = u32::try_from(node_type).ok().filter(|&v| v >= 1) else {
        return c"unknown".as_ptr();
    };
    word(
        &[
            c"InfiniBand channel adapter",
            c"InfiniBand switch",
            c"InfiniBand router",
            c"iWARP NIC",
            c"usNIC",
            c"usNIC UDP",
            c"unspecified",
        ],
        v - 1,
    )
}

symver!(
    ibv_wc_status_str,
    ibv_event_type_str,
    ibv_port_state_str,
    ibv_node_type_str,
);
