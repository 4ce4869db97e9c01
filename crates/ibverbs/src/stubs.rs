//! Exports the programs and provider libraries import but never reach with our device, and
//! the verbs we do not offer yet. Each fails the way libibverbs fails an unsupported call.
//! The stubs take no parameters: on x86-64 a callee may ignore the arguments it is passed.

use core::ffi::{c_char, c_int, c_void};
use std::sync::atomic::AtomicBool;

use crate::{fail, set_errno};

/// `bool verbs_allow_disassociate_destroy` (providers read it; a data object, not a call).
#[no_mangle]
pub static verbs_allow_disassociate_destroy: AtomicBool = AtomicBool::new(false);

/// `int` calls answering `EOPNOTSUPP` (the ibv_cmd_* helpers are provider-internal; no
/// provider runs over our device).
macro_rules! unsupported_int {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name() -> c_int {
            libc::EOPNOTSUPP
        }
        symver!($name);
    )*};
}

/// Pointer-returning calls: NULL with `errno = EOPNOTSUPP`.
macro_rules! unsupported_ptr {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name() -> *mut c_void {
            fail(libc::EOPNOTSUPP)
        }
        symver!($name);
    )*};
}

/// `void` calls that have nothing to do here.
macro_rules! nothing {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name() {}
        symver!($name);
    )*};
}

unsupported_int!(
    execute_ioctl,
    ibv_cmd_advise_mr,
    ibv_cmd_alloc_dm,
    ibv_cmd_alloc_mw,
    ibv_cmd_alloc_pd,
    ibv_cmd_attach_mcast,
    ibv_cmd_close_xrcd,
    ibv_cmd_create_ah,
    ibv_cmd_create_counters,
    ibv_cmd_create_cq_ex,
    ibv_cmd_create_flow,
    ibv_cmd_create_flow_action_esp,
    ibv_cmd_create_qp_ex,
    ibv_cmd_create_qp_ex2,
    ibv_cmd_create_rwq_ind_table,
    ibv_cmd_create_srq,
    ibv_cmd_create_srq_ex,
    ibv_cmd_create_wq,
    ibv_cmd_dealloc_mw,
    ibv_cmd_dealloc_pd,
    ibv_cmd_dereg_mr,
    ibv_cmd_destroy_ah,
    ibv_cmd_destroy_counters,
    ibv_cmd_destroy_cq,
    ibv_cmd_destroy_flow,
    ibv_cmd_destroy_flow_action,
    ibv_cmd_destroy_qp,
    ibv_cmd_destroy_rwq_ind_table,
    ibv_cmd_destroy_srq,
    ibv_cmd_destroy_wq,
    ibv_cmd_detach_mcast,
    ibv_cmd_free_dm,
    ibv_cmd_get_context,
    ibv_cmd_modify_cq,
    ibv_cmd_modify_flow_action_esp,
    ibv_cmd_modify_qp,
    ibv_cmd_modify_qp_ex,
    ibv_cmd_modify_srq,
    ibv_cmd_modify_wq,
    ibv_cmd_open_qp,
    ibv_cmd_open_xrcd,
    ibv_cmd_query_context,
    ibv_cmd_query_device_any,
    ibv_cmd_query_mr,
    ibv_cmd_query_port,
    ibv_cmd_query_qp,
    ibv_cmd_query_srq,
    ibv_cmd_read_counters,
    ibv_cmd_reg_dm_mr,
    ibv_cmd_reg_dmabuf_mr,
    ibv_cmd_reg_mr,
    ibv_cmd_rereg_mr,
    ibv_cmd_resize_cq,
    verbs_init_cq,
    // ECE and L2 resolution: not offered (perftest treats EOPNOTSUPP from ibv_query_ece as
    // "no ECE").
    ibv_query_ece,
    ibv_set_ece,
    ibv_resolve_eth_l2_from_gid,
);

unsupported_ptr!(
    _verbs_init_and_alloc_context,
    verbs_open_device,
    ibv_reg_dmabuf_mr,
    // Sharing objects across processes (by a kernel fd): no kernel objects here.
    ibv_import_device,
    ibv_import_pd,
    ibv_import_mr,
    ibv_import_dm,
);

nothing!(
    // Provider constructors (libmlx5, libefa) register here at load time: harmless.
    verbs_register_driver_34,
    verbs_set_ops,
    verbs_uninit_context,
    __verbs_log,
    ibv_copy_ah_attr_from_kern,
    ibv_copy_path_rec_from_kern,
    ibv_copy_qp_attr_from_kern,
    ibv_unimport_pd,
    ibv_unimport_mr,
    ibv_unimport_dm,
);

/// Fork support: nothing is pinned by a kernel, so fork needs no preparation.
#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `IBV_FORK_UNNEEDED`: fork is always safe with a soft device.
#[no_mangle]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}

/// No data-in-order guarantee is advertised beyond the verbs rules (0: no flags).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    0
}

/// Fork protection: our memory is not pinned by a kernel driver, so there is nothing to
/// protect (success, as libibverbs returns when fork support is not initialized).
#[no_mangle]
pub unsafe extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// See [`ibv_dontfork_range`].
#[no_mangle]
pub unsafe extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// There is no sysfs tree for a soft device.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    std::ptr::null()
}

/// There is no sysfs tree for a soft device: -1 with `ENOENT`.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file() -> c_int {
    set_errno(libc::ENOENT);
    -1
}

symver!(
    ibv_fork_init,
    ibv_is_fork_initialized,
    ibv_query_qp_data_in_order,
    verbs_allow_disassociate_destroy,
    ibv_dontfork_range,
    ibv_dofork_range,
    ibv_get_sysfs_path,
    ibv_read_sysfs_file,
);
