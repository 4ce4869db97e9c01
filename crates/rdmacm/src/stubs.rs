//! What the device cannot do yet, failing cleanly: rsockets (not implemented). The stubs
//! take no parameters: on x86-64 a callee may ignore the arguments it is passed, and `-1`
//! in `rax` reads as `-1` whether the caller expects an `int`, an `ssize_t` or an `off_t`.

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
