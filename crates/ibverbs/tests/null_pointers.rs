//! C callers that pass NULL get an error, never a crash: the library is loaded with dlopen
//! and every verb that takes an object is called with NULL.

mod common;

use std::ffi::{c_int, c_void, CString};

type P = *mut c_void;

struct Lib(P);

impl Lib {
    fn open() -> Lib {
        Lib::open_path(&common::built_library())
    }

    fn open_path(path: &std::path::Path) -> Lib {
        let path = CString::new(path.to_string_lossy().into_owned()).expect("path without NUL");
        // SAFETY: a valid C string; the library's constructors are Rust statics only.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!h.is_null(), "dlopen failed");
        Lib(h)
    }

    fn sym(&self, name: &str) -> P {
        let n = CString::new(name).expect("symbol name");
        // SAFETY: a live handle and a valid C string.
        let p = unsafe { libc::dlsym(self.0, n.as_ptr()) };
        assert!(!p.is_null(), "{name} not exported");
        p
    }
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[test]
fn int_verbs_refuse_null_objects_with_einval() {
    let lib = Lib::open();
    for name in [
        "ibv_close_device",
        "ibv_dealloc_pd",
        "ibv_dereg_mr",
        "ibv_destroy_cq",
        "ibv_destroy_qp",
        "ibv_destroy_srq",
        "ibv_destroy_ah",
        "ibv_destroy_comp_channel",
    ] {
        // SAFETY: each of these is `int f(struct X *)`.
        let f: unsafe extern "C" fn(P) -> c_int = unsafe { std::mem::transmute(lib.sym(name)) };
        // SAFETY: NULL is what is being tested.
        assert_eq!(
            unsafe { f(std::ptr::null_mut()) },
            libc::EINVAL,
            "{name}(NULL)"
        );
    }
    // SAFETY: int ibv_query_device(ctx *, attr *).
    let qd: unsafe extern "C" fn(P, P) -> c_int =
        unsafe { std::mem::transmute(lib.sym("ibv_query_device")) };
    let mut buf = [0u8; 232];
    // SAFETY: NULL context with a real buffer.
    assert_eq!(
        unsafe { qd(std::ptr::null_mut(), buf.as_mut_ptr().cast()) },
        libc::EINVAL
    );
    // SAFETY: int ibv_query_port(ctx *, u8, attr *).
    let qp: unsafe extern "C" fn(P, u8, P) -> c_int =
        unsafe { std::mem::transmute(lib.sym("ibv_query_port")) };
    // SAFETY: NULL context.
    assert_eq!(
        unsafe { qp(std::ptr::null_mut(), 1, buf.as_mut_ptr().cast()) },
        libc::EINVAL
    );
    // SAFETY: int ibv_modify_qp(qp *, attr *, int).
    let mq: unsafe extern "C" fn(P, P, c_int) -> c_int =
        unsafe { std::mem::transmute(lib.sym("ibv_modify_qp")) };
    // SAFETY: NULL QP.
    assert_eq!(
        unsafe { mq(std::ptr::null_mut(), buf.as_mut_ptr().cast(), 1) },
        libc::EINVAL
    );
}

#[test]
fn constructors_return_null_with_errno_for_null_parents() {
    let lib = Lib::open();
    for name in ["ibv_open_device", "ibv_alloc_pd", "ibv_create_comp_channel"] {
        // SAFETY: each of these is `X *f(struct Y *)`.
        let f: unsafe extern "C" fn(P) -> P = unsafe { std::mem::transmute(lib.sym(name)) };
        // SAFETY: NULL is what is being tested.
        let r = unsafe { f(std::ptr::null_mut()) };
        assert!(r.is_null(), "{name}(NULL) returned an object");
        assert_eq!(errno(), libc::EINVAL, "{name}(NULL) errno");
    }
    // SAFETY: struct ibv_mr *ibv_reg_mr(pd *, void *, size_t, int).
    let reg: unsafe extern "C" fn(P, P, usize, c_int) -> P =
        unsafe { std::mem::transmute(lib.sym("ibv_reg_mr")) };
    // SAFETY: NULL PD.
    let r = unsafe { reg(std::ptr::null_mut(), std::ptr::null_mut(), 64, 1) };
    assert!(r.is_null());
    assert_eq!(errno(), libc::EINVAL);
    // SAFETY: struct ibv_cq *ibv_create_cq(ctx *, int, void *, channel *, int).
    let cq: unsafe extern "C" fn(P, c_int, P, P, c_int) -> P =
        unsafe { std::mem::transmute(lib.sym("ibv_create_cq")) };
    // SAFETY: NULL context.
    let r = unsafe {
        cq(
            std::ptr::null_mut(),
            16,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    assert!(r.is_null());
    assert_eq!(errno(), libc::EINVAL);
    // SAFETY: struct ibv_qp *ibv_create_qp(pd *, init_attr *).
    let cqp: unsafe extern "C" fn(P, P) -> P =
        unsafe { std::mem::transmute(lib.sym("ibv_create_qp")) };
    // SAFETY: NULL PD and attributes.
    let r = unsafe { cqp(std::ptr::null_mut(), std::ptr::null_mut()) };
    assert!(r.is_null());
    assert_eq!(errno(), libc::EINVAL);
}

#[test]
fn unsupported_calls_fail_with_eopnotsupp_and_driver_registration_is_harmless() {
    let lib = Lib::open();
    // SAFETY: void verbs_register_driver_34(const struct verbs_device_ops *).
    let reg: unsafe extern "C" fn(P) =
        unsafe { std::mem::transmute(lib.sym("verbs_register_driver_34")) };
    // SAFETY: providers pass their ops table; the call must ignore it.
    unsafe { reg(std::ptr::null_mut()) };
    // SAFETY: int ibv_query_ece(qp *, ece *).
    let ece: unsafe extern "C" fn(P, P) -> c_int =
        unsafe { std::mem::transmute(lib.sym("ibv_query_ece")) };
    // SAFETY: the stub reads nothing.
    assert_eq!(
        unsafe { ece(std::ptr::null_mut(), std::ptr::null_mut()) },
        libc::EOPNOTSUPP
    );
    // SAFETY: struct ibv_qp_ex *ibv_qp_to_qp_ex(qp *).
    let ex: unsafe extern "C" fn(P) -> P =
        unsafe { std::mem::transmute(lib.sym("ibv_qp_to_qp_ex")) };
    // SAFETY: NULL is refused before anything is read.
    assert!(unsafe { ex(std::ptr::null_mut()) }.is_null());
    assert_eq!(errno(), libc::EOPNOTSUPP);
}

#[test]
fn ibv_query_gid_fails_with_minus_one_and_einval() {
    let lib = Lib::open();
    // SAFETY: int ibv_query_gid(struct ibv_context *, uint8_t, int, union ibv_gid *).
    let q: unsafe extern "C" fn(P, u8, c_int, P) -> c_int =
        unsafe { std::mem::transmute(lib.sym("ibv_query_gid")) };
    let mut gid = [0u8; 16];
    // SAFETY: a NULL context is refused before anything is read.
    let r = unsafe { q(std::ptr::null_mut(), 1, 0, gid.as_mut_ptr().cast()) };
    assert_eq!((r, errno()), (-1, libc::EINVAL));
}

#[test]
fn the_string_calls_say_what_debians_libibverbs_says() {
    let debian = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    if !debian.exists() {
        eprintln!("skipped: no libibverbs1 to compare with (apt-get install libibverbs1)");
        return;
    }
    let (ours, theirs) = (Lib::open(), Lib::open_path(debian));
    type Str = unsafe extern "C" fn(c_int) -> *const std::ffi::c_char;
    for name in [
        "ibv_wc_status_str",
        "ibv_event_type_str",
        "ibv_port_state_str",
        "ibv_node_type_str",
    ] {
        // SAFETY: const char *ibv_*_str(enum ...): an int in, a static C string out.
        let (a, b) = unsafe {
            (
                std::mem::transmute::<P, Str>(ours.sym(name)),
                std::mem::transmute::<P, Str>(theirs.sym(name)),
            )
        };
        // Every value of each enum and some either side of it.
        for v in -2..40 {
            // SAFETY: both return static NUL-terminated strings for any value.
            let (x, y) = unsafe {
                (
                    std::ffi::CStr::from_ptr(a(v)),
                    std::ffi::CStr::from_ptr(b(v)),
                )
            };
            assert_eq!(x, y, "{name}({v})");
        }
    }
}

#[test]
fn async_event_calls_refuse_null_and_foreign_pointers() {
    let lib = Lib::open();
    // SAFETY: int ibv_get_async_event(ctx *, struct ibv_async_event *).
    let get: unsafe extern "C" fn(P, P) -> c_int =
        unsafe { std::mem::transmute(lib.sym("ibv_get_async_event")) };
    let mut ev = [0u64; 2];
    // SAFETY: NULL context with a real event struct: refused before anything is read.
    assert_eq!(
        unsafe { get(std::ptr::null_mut(), ev.as_mut_ptr().cast()) },
        -1
    );
    assert_eq!(errno(), libc::EINVAL);
    // SAFETY: void ibv_ack_async_event(struct ibv_async_event *).
    let ack: unsafe extern "C" fn(P) =
        unsafe { std::mem::transmute(lib.sym("ibv_ack_async_event")) };
    // SAFETY: NULL is ignored.
    unsafe { ack(std::ptr::null_mut()) };
    // An event naming an object the library never made (a QP_FATAL at a stack address) is
    // ignored too: nothing is written through its pointer.
    let mut fake = [0u8; 160];
    ev = [fake.as_mut_ptr() as u64, 1];
    // SAFETY: a well-formed event struct whose element is not ours.
    unsafe { ack(ev.as_mut_ptr().cast()) };
    assert!(fake.iter().all(|&b| b == 0));
}
