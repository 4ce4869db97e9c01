//! What the device cannot do yet, failing cleanly: multicast (the engine has no multicast
//! groups) and rsockets (not implemented). The rsockets stubs take no parameters: on x86-64
//! a callee may ignore the arguments it is passed, and `-1` in `rax` reads as `-1` whether
//! the caller expects an `int`, an `ssize_t` or an `off_t`.

use core::ffi::{c_int, c_void};

use crate::cma::ret;
use crate::ffi::{rdma_cm_id, rdma_cm_join_mc_attr_ex};

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
    _context: *mut c_void,
) -> c_int {
    ret(Err(libc::EOPNOTSUPP))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut rdma_cm_join_mc_attr_ex,
    _context: *mut c_void,
) -> c_int {
    ret(Err(libc::EOPNOTSUPP))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(
    _id: *mut rdma_cm_id,
    _addr: *mut libc::sockaddr,
) -> c_int {
    // Nothing was joined.
    ret(Err(libc::EADDRNOTAVAIL))
}

symver!(
    rdma_join_multicast,
    rdma_join_multicast_ex,
    rdma_leave_multicast
);

/// rsockets calls: `-1` with `errno = ENOSYS`.
macro_rules! rsocket_enosys {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub unsafe extern "C" fn $name() -> isize {
            crate::cma::set_errno(libc::ENOSYS);
            -1
        }
        symver!($name);
    )*};
}

rsocket_enosys!(
    rsocket,
    rbind,
    rlisten,
    raccept,
    rconnect,
    rshutdown,
    rclose,
    rrecv,
    rrecvfrom,
    rrecvmsg,
    rsend,
    rsendto,
    rsendmsg,
    rread,
    rreadv,
    rwrite,
    rwritev,
    rpoll,
    rselect,
    rgetpeername,
    rgetsockname,
    rsetsockopt,
    rgetsockopt,
    rfcntl,
    riomap,
    riounmap,
    riowrite,
);
