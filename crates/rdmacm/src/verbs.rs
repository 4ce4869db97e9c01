//! The drop-in `libibverbs.so.1`, reached at run time: its public `ibv_*` calls and the
//! private `softrdma_cm_*` interface ([`abi::cm_ffi`]).
//!
//! Why `dlopen` rather than a link-time dependency: the cdylib would need the built
//! `libibverbs.so` at link time, which cargo does not order between two cdylib crates of a
//! workspace (one cannot depend on the other without linking its `ibv_*` exports into this
//! library). At run time the program has loaded libibverbs already (every rdma_cm program
//! links it), so `dlopen("libibverbs.so.1")` returns that very copy. If it is another
//! libibverbs (rdma-core's), the private symbols are missing: every call then fails with
//! `ENODEV`, and one line on stderr says why.

use core::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use abi::cm_ffi::{self, CmAddr, CmEventRec, CmParam};

use crate::ffi::*;

/// The functions of libibverbs librdmacm calls.
pub(crate) struct Verbs {
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub open_device: unsafe extern "C" fn(*mut c_void) -> *mut ibv_context,
    pub query_device: unsafe extern "C" fn(*mut ibv_context, *mut c_void) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut ibv_context, u8, *mut c_void) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp,
    pub modify_qp: unsafe extern "C" fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut ibv_qp) -> c_int,
    pub attach_mcast: unsafe extern "C" fn(*mut ibv_qp, *const ibv_gid, u16) -> c_int,
    pub detach_mcast: unsafe extern "C" fn(*mut ibv_qp, *const ibv_gid, u16) -> c_int,
    pub create_srq: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
    pub destroy_srq: unsafe extern "C" fn(*mut ibv_srq) -> c_int,
    pub cm: Cm,
}

/// The private CM interface (see [`abi::cm_ffi`] for each call).
pub(crate) struct Cm {
    pub open: unsafe extern "C" fn(*mut ibv_context) -> c_int,
    pub listen: unsafe extern "C" fn(*mut ibv_context, u64) -> c_int,
    pub unlisten: unsafe extern "C" fn(*mut ibv_context, u64) -> c_int,
    pub connect: unsafe extern "C" fn(
        *mut ibv_context,
        *mut ibv_qp,
        *const CmAddr,
        u64,
        *const CmParam,
        *mut u32,
    ) -> c_int,
    pub resolve: unsafe extern "C" fn(
        *mut ibv_context,
        *const CmAddr,
        u64,
        *const CmParam,
        *mut u32,
    ) -> c_int,
    pub accept: unsafe extern "C" fn(*mut ibv_context, u32, *mut ibv_qp, *const CmParam) -> c_int,
    pub reject: unsafe extern "C" fn(*mut ibv_context, u32, u16, *const c_void, u8) -> c_int,
    pub disconnect: unsafe extern "C" fn(*mut ibv_context, u32, *const c_void, u8) -> c_int,
    pub destroy_id: unsafe extern "C" fn(*mut ibv_context, u32) -> c_int,
    pub get_event: unsafe extern "C" fn(*mut ibv_context, *mut CmEventRec) -> c_int,
    pub establish: unsafe extern "C" fn(*mut ibv_context, u32) -> c_int,
    pub init_qp_attr:
        unsafe extern "C" fn(*mut ibv_context, u32, *mut ibv_qp_attr, *mut c_int) -> c_int,
}

/// libibverbs' functions, or the errno every call fails with when it is not softrdma's.
pub(crate) fn verbs() -> Result<&'static Verbs, c_int> {
    static V: OnceLock<Result<Verbs, c_int>> = OnceLock::new();
    V.get_or_init(|| {
        load().map_err(|why| {
            eprintln!("librdmacm (softrdma): {why}; every rdma_* call fails with ENODEV");
            libc::ENODEV
        })
    })
    .as_ref()
    .map_err(|e| *e)
}

fn cstr(s: &str) -> std::ffi::CString {
    std::ffi::CString::new(s).expect("symbol names have no NUL")
}

/// `name` in `handle`, at `version` if given.
fn sym(handle: *mut c_void, name: &str, version: Option<&str>) -> Result<*mut c_void, String> {
    let n = cstr(name);
    // SAFETY: `handle` is a live dlopen handle; the names are NUL-terminated.
    let p = unsafe {
        match version {
            Some(v) => {
                let v = cstr(v);
                libc::dlvsym(handle, n.as_ptr(), v.as_ptr())
            }
            None => libc::dlsym(handle, n.as_ptr()),
        }
    };
    if p.is_null() {
        Err(match version {
            Some(v) => format!("{name}@{v} missing"),
            None => format!("{name} missing"),
        })
    } else {
        Ok(p)
    }
}

// Each transmute's target is the field it fills, whose type spells the C signature once.
#[allow(clippy::missing_transmute_annotations)]
fn load() -> Result<Verbs, String> {
    let lib = cstr("libibverbs.so.1");
    // SAFETY: a NUL-terminated name; the handle is kept for the life of the process.
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated message.
        let why = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                String::from("unknown error")
            } else {
                std::ffi::CStr::from_ptr(e as *const c_char)
                    .to_string_lossy()
                    .into_owned()
            }
        };
        return Err(format!("cannot load libibverbs.so.1: {why}"));
    }
    let private = Some(cm_ffi::VERSION_NODE);
    let not_ours = |e: String| {
        format!(
            "the loaded libibverbs.so.1 is not softrdma's ({e}): put softrdma's \
             libibverbs.so.1 beside this librdmacm.so.1 on LD_LIBRARY_PATH"
        )
    };
    let version = sym(h, cm_ffi::SYM_ABI_VERSION, private).map_err(not_ours)?;
    // SAFETY: the symbol is `uint32_t softrdma_cm_abi_version(void)` (abi::cm_ffi).
    let version: unsafe extern "C" fn() -> u32 = unsafe { std::mem::transmute(version) };
    // SAFETY: a function of no arguments.
    let got = unsafe { version() };
    if got != cm_ffi::ABI_VERSION {
        return Err(format!(
            "libibverbs.so.1 speaks private CM interface {got}, this librdmacm {}: \
             use the two libraries of one build",
            cm_ffi::ABI_VERSION
        ));
    }
    macro_rules! get {
        ($name:expr, $ver:expr) => {{
            let p = sym(h, $name, $ver)?;
            // SAFETY: the symbol has the C signature of the field it fills (verbs.h for
            // the public calls, abi::cm_ffi for the private ones).
            unsafe { std::mem::transmute::<*mut c_void, _>(p) }
        }};
    }
    let cm = Cm {
        open: get!(cm_ffi::SYM_OPEN, private),
        listen: get!(cm_ffi::SYM_LISTEN, private),
        unlisten: get!(cm_ffi::SYM_UNLISTEN, private),
        connect: get!(cm_ffi::SYM_CONNECT, private),
        resolve: get!(cm_ffi::SYM_RESOLVE, private),
        accept: get!(cm_ffi::SYM_ACCEPT, private),
        reject: get!(cm_ffi::SYM_REJECT, private),
        disconnect: get!(cm_ffi::SYM_DISCONNECT, private),
        destroy_id: get!(cm_ffi::SYM_DESTROY_ID, private),
        get_event: get!(cm_ffi::SYM_GET_EVENT, private),
        establish: get!(cm_ffi::SYM_ESTABLISH, private),
        init_qp_attr: get!(cm_ffi::SYM_INIT_QP_ATTR, private),
    };
    let v11 = Some("IBVERBS_1.1");
    Ok(Verbs {
        get_device_list: get!("ibv_get_device_list", v11),
        free_device_list: get!("ibv_free_device_list", v11),
        open_device: get!("ibv_open_device", v11),
        query_device: get!("ibv_query_device", v11),
        query_gid: get!("ibv_query_gid", v11),
        attach_mcast: get!("ibv_attach_mcast", v11),
        detach_mcast: get!("ibv_detach_mcast", v11),
        query_port: get!("ibv_query_port", v11),
        alloc_pd: get!("ibv_alloc_pd", v11),
        create_comp_channel: get!("ibv_create_comp_channel", Some("IBVERBS_1.0")),
        destroy_comp_channel: get!("ibv_destroy_comp_channel", Some("IBVERBS_1.0")),
        create_cq: get!("ibv_create_cq", v11),
        destroy_cq: get!("ibv_destroy_cq", v11),
        create_qp: get!("ibv_create_qp", v11),
        modify_qp: get!("ibv_modify_qp", v11),
        destroy_qp: get!("ibv_destroy_qp", v11),
        create_srq: get!("ibv_create_srq", v11),
        destroy_srq: get!("ibv_destroy_srq", v11),
        cm,
    })
}
