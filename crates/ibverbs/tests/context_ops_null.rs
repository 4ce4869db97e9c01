//! The calls programs reach through an open context's tables rather than by symbol
//! (`context->ops`: polling, posting, notification, memory windows; the `verbs_context`
//! ops behind `ibv_create_qp_ex` and `ibv_create_cq_ex`) refuse NULL arguments with an
//! error, never a crash. The library is loaded with dlopen and opens an embedded device.
//! One test in this file: it sets the environment the library reads.

mod common;

use std::ffi::{c_int, c_void, CString};

type P = *mut c_void;

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// `*(base + offset)` as a function pointer of type `F`, checked non-NULL.
///
/// # Safety
/// `base + offset` is a readable pointer-sized slot holding a function of type `F` or NULL.
unsafe fn slot<F: Copy>(base: *const u8, offset: usize, what: &str) -> F {
    // SAFETY: the caller's contract.
    let p = unsafe { base.add(offset).cast::<usize>().read() };
    assert_ne!(p, 0, "{what} is NULL");
    assert_eq!(size_of::<F>(), size_of::<usize>());
    // SAFETY: a non-NULL function pointer of type F (the caller's contract).
    unsafe { std::mem::transmute_copy(&p) }
}

#[test]
fn context_ops_and_extended_verbs_refuse_null_arguments() {
    // SAFETY: the only test of this process, before the library is loaded: no other thread
    // reads the environment meanwhile.
    unsafe {
        std::env::set_var("SOFTRDMA_BACKEND", "embedded");
        std::env::set_var("SOFTRDMA_DEVICE", "127.0.0.1");
        std::env::set_var("SOFTRDMA_PORT", common::free_udp_port().to_string());
    }
    let path = CString::new(common::built_library().to_string_lossy().into_owned()).unwrap();
    // SAFETY: a valid C string; the library's constructors are Rust statics only.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null(), "dlopen failed");
    let sym = |name: &str| {
        let n = CString::new(name).unwrap();
        // SAFETY: a live handle and a valid C string.
        let p = unsafe { libc::dlsym(lib, n.as_ptr()) };
        assert!(!p.is_null(), "{name} not exported");
        p
    };
    // SAFETY (the transmutes below): each symbol has the C signature written next to it.
    let get_list: unsafe extern "C" fn(*mut c_int) -> *mut P =
        unsafe { std::mem::transmute(sym("ibv_get_device_list")) };
    let free_list: unsafe extern "C" fn(*mut P) =
        unsafe { std::mem::transmute(sym("ibv_free_device_list")) };
    let open: unsafe extern "C" fn(P) -> P = unsafe { std::mem::transmute(sym("ibv_open_device")) };
    let close: unsafe extern "C" fn(P) -> c_int =
        unsafe { std::mem::transmute(sym("ibv_close_device")) };
    let get_event: unsafe extern "C" fn(P, P) -> c_int =
        unsafe { std::mem::transmute(sym("ibv_get_async_event")) };

    let mut n: c_int = 0;
    // SAFETY: a valid out pointer.
    let list = unsafe { get_list(&mut n) };
    assert!(!list.is_null() && n == 1, "one embedded device listed");
    // SAFETY: the list has n >= 1 entries.
    let ctx = unsafe { open(*list) };
    assert!(!ctx.is_null(), "ibv_open_device: errno {}", errno());
    let c = ctx as *const u8;
    let null = std::ptr::null_mut::<c_void>();

    // context->ops (at offset 8 of struct ibv_context).
    // SAFETY (each call): a slot of the live context's ops table, of the signature verbs.h
    // gives it; every object argument is NULL, which is what is being tested.
    unsafe {
        let alloc_mw: unsafe extern "C" fn(P, u32) -> P = slot(c, 8 + 56, "alloc_mw");
        assert!(alloc_mw(null, 1).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let bind_mw: unsafe extern "C" fn(P, P, P) -> c_int = slot(c, 8 + 64, "bind_mw");
        assert_eq!(bind_mw(null, null, null), libc::EINVAL);
        let dealloc_mw: unsafe extern "C" fn(P) -> c_int = slot(c, 8 + 72, "dealloc_mw");
        assert_eq!(dealloc_mw(null), libc::EINVAL);
        let poll_cq: unsafe extern "C" fn(P, c_int, P) -> c_int = slot(c, 8 + 88, "poll_cq");
        assert_eq!(poll_cq(null, 1, null), -libc::EINVAL);
        let notify: unsafe extern "C" fn(P, c_int) -> c_int = slot(c, 8 + 96, "req_notify_cq");
        assert_eq!(notify(null, 0), libc::EINVAL);
        type Post = unsafe extern "C" fn(P, P, P) -> c_int;
        let post_srq_recv: Post = slot(c, 8 + 160, "post_srq_recv");
        assert_eq!(post_srq_recv(null, null, null), libc::EINVAL);
        let post_send: Post = slot(c, 8 + 200, "post_send");
        assert_eq!(post_send(null, null, null), libc::EINVAL);
        let post_recv: Post = slot(c, 8 + 208, "post_recv");
        assert_eq!(post_recv(null, null, null), libc::EINVAL);

        // The verbs_context around it (the context is its last member, at 320).
        let v = c.sub(320);
        let create_cq_ex: unsafe extern "C" fn(P, P) -> P = slot(v, 200, "create_cq_ex");
        assert!(create_cq_ex(ctx, null).is_null());
        assert_eq!(errno(), libc::EINVAL);
        let create_qp_ex: unsafe extern "C" fn(P, P) -> P = slot(v, 264, "create_qp_ex");
        assert!(create_qp_ex(ctx, null).is_null());
        assert_eq!(errno(), libc::EINVAL);
        assert!(create_qp_ex(null, null).is_null());
        assert_eq!(errno(), libc::EINVAL);

        // A real context with no event struct.
        assert_eq!(get_event(ctx, null), -1);
        assert_eq!(errno(), libc::EINVAL);

        assert_eq!(close(ctx), 0);
        free_list(list);
    }
}
