//! The device list, opening a context, and the query verbs.

use core::ffi::{c_char, c_int, c_void};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use engine::{AtomicCap, PortState};
use softrdma::{BackendKind, Device};

use crate::abi::*;
use crate::{fail, set_errno};

/// Marks a [`Ctx`] made here (checked before trusting a context pointer's enclosing object).
const CTX_MAGIC: u64 = 0x736f_6674_7264_6d61;

/// One device of the list, its `ibv_device` alive for the life of the process (it must
/// outlive `ibv_free_device_list`): the embedded device of this process, or one device of
/// the host daemon.
pub(crate) struct DevEntry {
    pub(crate) ibv: ibv_device,
    kind: BackendKind,
    /// Embedded: the address to bind. Daemon: the address that picks the daemon's device.
    pub(crate) addr: IpAddr,
    pub(crate) port: u16,
    /// Embedded only: the UDP port peers receive on.
    remote_port: u16,
    /// Daemon only: the daemon's name for it.
    name: String,
}

// SAFETY: the ibv_device holds only plain bytes and NULL pointers, never written after init.
unsafe impl Sync for DevEntry {}
// SAFETY: as above.
unsafe impl Send for DevEntry {}

fn env_parse<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn copy_str(dst: &mut [c_char], s: &str) {
    let room = dst.len().saturating_sub(1);
    for (d, b) in dst.iter_mut().zip(s.bytes().take(room)) {
        *d = b as c_char;
    }
}

/// The device the environment prefers: `SOFTRDMA_DEVICE` (an IP address, or a daemon
/// device's name), else `SOFTRDMA_ADDR` (the older name, an IP address).
fn preferred_device() -> Option<String> {
    [softrdma::DEVICE_ENV, "SOFTRDMA_ADDR"]
        .iter()
        .filter_map(|n| std::env::var(n).ok())
        .map(|v| v.trim().to_string())
        .find(|v| !v.is_empty())
}

fn make_entry(
    kind: BackendKind,
    name: &str,
    addr: IpAddr,
    port: u16,
    remote_port: u16,
) -> DevEntry {
    let mut ibv = ibv_device {
        ops: [0; 2],
        node_type: 1,
        transport_type: 0,
        name: [0; SYSFS_NAME_MAX],
        dev_name: [0; SYSFS_NAME_MAX],
        dev_path: [0; SYSFS_PATH_MAX],
        ibdev_path: [0; SYSFS_PATH_MAX],
    };
    copy_str(&mut ibv.name, name);
    copy_str(&mut ibv.dev_name, &format!("uverbs_{name}"));
    copy_str(
        &mut ibv.dev_path,
        &format!("/sys/class/infiniband_verbs/uverbs_{name}"),
    );
    copy_str(
        &mut ibv.ibdev_path,
        &format!("/sys/class/infiniband/{name}"),
    );
    DevEntry {
        ibv,
        kind,
        addr,
        port,
        remote_port,
        name: name.to_string(),
    }
}

/// Every entry ever listed (leaked: C may hold an `ibv_device *` for the life of the
/// process). A device listed again (same backend, name, address, port) gets its old entry.
static ENTRIES: Mutex<Vec<&'static DevEntry>> = Mutex::new(Vec::new());

fn intern(e: DevEntry) -> &'static DevEntry {
    let mut all = ENTRIES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(old) = all.iter().find(|o| {
        o.kind == e.kind
            && o.name == e.name
            && o.addr == e.addr
            && o.port == e.port
            && o.remote_port == e.remote_port
    }) {
        return old;
    }
    let leaked: &'static DevEntry = Box::leak(Box::new(e));
    all.push(leaked);
    leaked
}

/// The `softrdmad` to start when no daemon answers, if the environment names none
/// (`SOFTRDMA_DAEMON_BIN`): the one next to this library (as `cargo build` leaves them side
/// by side in `target/<profile>`), found through the path the library was loaded from and,
/// if that is a symlink, the file it points at. `None`: the `softrdma` crate's default
/// search (next to the program, then `PATH`).
fn daemon_binary() -> Option<std::path::PathBuf> {
    if std::env::var_os(softrdma::DAEMON_BIN_ENV).is_some() {
        return None;
    }
    // SAFETY: dladdr only reads the address (one of this library's functions) and fills
    // `info`; the name it points to stays valid while the library is loaded (it is never
    // unloaded while running this code).
    let loaded = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        let f: unsafe extern "C" fn(*mut c_int) -> *mut *mut ibv_device = ibv_get_device_list;
        if libc::dladdr(f as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(info.dli_fname)
            .to_str()
            .ok()?
            .to_string()
    };
    let loaded = std::path::PathBuf::from(loaded);
    let real = std::fs::canonicalize(&loaded).ok();
    [Some(loaded), real]
        .into_iter()
        .flatten()
        .filter_map(|p| p.parent().map(|d| d.join("softrdmad")))
        .find(|p| p.is_file())
}

/// The devices to list now: the backend `SOFTRDMA_BACKEND` names (default: the daemon).
fn current_devices() -> Result<Vec<&'static DevEntry>, softrdma::Error> {
    let kind = BackendKind::from_env()?.unwrap_or(BackendKind::Daemon);
    let preferred = preferred_device();
    match kind {
        BackendKind::Embedded => {
            // One device per process, on SOFTRDMA_DEVICE / SOFTRDMA_ADDR (default
            // 127.0.0.1), UDP port SOFTRDMA_PORT (default 4791), sending to
            // SOFTRDMA_REMOTE_PORT (default: the same).
            let addr = match &preferred {
                Some(v) => v.parse().map_err(|_| {
                    softrdma::Error::Config(format!(
                        "{}={v}: the embedded backend needs an IP address",
                        softrdma::DEVICE_ENV
                    ))
                })?,
                None => IpAddr::from([127, 0, 0, 1]),
            };
            let port = env_parse("SOFTRDMA_PORT").unwrap_or(4791);
            let remote_port = env_parse("SOFTRDMA_REMOTE_PORT").unwrap_or(port);
            Ok(vec![intern(make_entry(
                kind,
                "softrdma0",
                addr,
                port,
                remote_port,
            ))])
        }
        _ => {
            let bin = daemon_binary();
            let mut list: Vec<&'static DevEntry> = softrdma::raw::daemon_devices(bin.as_deref())?
                .into_iter()
                .filter_map(|d| {
                    let addr = *d.addrs.first()?;
                    Some(intern(make_entry(kind, &d.name, addr, d.port, d.port)))
                })
                .collect();
            // The preferred device first: programs without a device option take the first.
            if let Some(p) = preferred {
                let ip: Option<IpAddr> = p.parse().ok();
                if let Some(i) = list.iter().position(|e| e.name == p || Some(e.addr) == ip) {
                    let e = list.remove(i);
                    list.insert(0, e);
                }
            }
            Ok(list)
        }
    }
}

/// Node GUID (host order): "SR" then the port and the address, like a EUI-64 made from a
/// MAC.
pub(crate) fn node_guid(e: &DevEntry) -> u64 {
    let low = match e.addr {
        IpAddr::V4(a) => u64::from(u32::from(a)),
        IpAddr::V6(a) => (u128::from(a) as u64) & 0xffff_ffff,
    };
    0x5352_0000_0000_0000 | (u64::from(e.port) << 32) | low
}

/// Our entry behind a device pointer, if it is one.
fn entry_of(d: *mut ibv_device) -> Option<&'static DevEntry> {
    let all = ENTRIES.lock().unwrap_or_else(|p| p.into_inner());
    all.iter().copied().find(|e| std::ptr::eq(d, &e.ibv))
}

/// What contexts of one open device share (on the embedded backend every context of the
/// process; on the daemon each context has its own connection).
pub(crate) struct Shared {
    pub(crate) dev: Device,
    /// Asynchronous events taken from the device but not yet by the program.
    pub(crate) pending: Mutex<std::collections::VecDeque<engine::AsyncEvent>>,
}

/// An open context: the `verbs_context` first, then what the C side never sees.
#[repr(C)]
pub(crate) struct Ctx {
    pub(crate) vctx: verbs_context,
    magic: u64,
    pub(crate) shared: Arc<Shared>,
    entry: &'static DevEntry,
    _cmd_fd: OwnedFd,
    /// `context->async_fd`: readable while the device's async-event descriptor is.
    pub(crate) async_watch: crate::watch::Watch,
    /// The process that opened it: a child made by `fork` holds a copy of the context, and
    /// of the objects on it, that are not its own to destroy.
    opened_by: u32,
    /// The device's hang-up descriptor (softrdmad's connection), which `async_watch` also
    /// watches until `IBV_EVENT_DEVICE_FATAL` was handed out.
    pub(crate) hangup: Option<std::os::fd::RawFd>,
}

impl Ctx {
    /// Names the open device in the object registry ([`crate::events`]).
    pub(crate) fn device_id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// The open device.
    pub(crate) fn dev(&self) -> &Device {
        &self.shared.dev
    }

    /// Its handle-level verbs.
    pub(crate) fn raw(&self) -> softrdma::RawDevice<'_> {
        self.shared.dev.raw()
    }
}

/// The process's embedded device, shared by every context opened on it (a UDP port binds
/// once per process), with the number of open contexts.
static EMBEDDED: Mutex<(usize, Option<Arc<Shared>>)> = Mutex::new((0, None));

fn new_shared(dev: Device) -> Arc<Shared> {
    Arc::new(Shared {
        dev,
        pending: Mutex::new(std::collections::VecDeque::new()),
    })
}

/// Open `e`: the embedded device (shared), or a connection of its own to the daemon's
/// device (asynchronous events then reach the context owning the object).
fn acquire_device(e: &DevEntry) -> Result<Arc<Shared>, i32> {
    match e.kind {
        BackendKind::Embedded => {
            let mut g = EMBEDDED.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(d) = &g.1 {
                let d = d.clone();
                g.0 += 1;
                return Ok(d);
            }
            let d = Device::builder(e.addr)
                .backend(BackendKind::Embedded)
                .port(e.port)
                .remote_port(e.remote_port)
                .open()
                .map_err(|err| err.errno())?;
            let s = new_shared(d);
            *g = (1, Some(s.clone()));
            Ok(s)
        }
        _ => {
            let mut b = Device::builder(e.addr).backend(BackendKind::Daemon);
            if let Some(bin) = daemon_binary() {
                b = b.daemon_binary(bin);
            }
            b.open().map(new_shared).map_err(|err| err.errno())
        }
    }
}

fn release_device(e: &DevEntry) {
    if e.kind == BackendKind::Embedded {
        let mut g = EMBEDDED.lock().unwrap_or_else(|p| p.into_inner());
        g.0 = g.0.saturating_sub(1);
        if g.0 == 0 {
            g.1 = None;
        }
    }
}

/// The [`Ctx`] around a context pointer, if it is one of ours.
///
/// # Safety
/// `c` is NULL or a pointer a program got from `ibv_open_device` and has not closed.
pub(crate) unsafe fn ctx<'a>(c: *mut ibv_context) -> Option<&'a Ctx> {
    if c.is_null() {
        return None;
    }
    // SAFETY: non-NULL contexts come from ibv_open_device, i.e. sit at offset 320 of a Ctx
    // (verbs_context first, context its last member); the magic confirms it.
    unsafe {
        if (*c).abi_compat as usize != usize::MAX {
            return None;
        }
        let p = (c as *mut u8).sub(core::mem::offset_of!(verbs_context, context)) as *const Ctx;
        if (*p).magic != CTX_MAGIC {
            return None;
        }
        Some(&*p)
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let devices = match current_devices() {
        Ok(d) => d,
        Err(e) => {
            // libibverbs also explains on stderr why it found no device.
            eprintln!("libibverbs (softrdma): no devices: {e}");
            Vec::new()
        }
    };
    // SAFETY: calloc of n + 1 pointers (the last stays NULL); NULL checked.
    let list = unsafe { libc::calloc(devices.len() + 1, size_of::<*mut ibv_device>()) }
        as *mut *mut ibv_device;
    if list.is_null() {
        return fail(libc::ENOMEM);
    }
    for (i, e) in devices.iter().enumerate() {
        // SAFETY: `list` has room for n + 1 entries and i < n. Entries are 'static; C only
        // reads through the pointer.
        unsafe { *list.add(i) = &e.ibv as *const ibv_device as *mut ibv_device };
    }
    if !num.is_null() {
        // SAFETY: non-NULL `num` points to an int the caller provides.
        unsafe { *num = devices.len() as c_int };
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from ibv_get_device_list (calloc) or is NULL (free ignores it).
    unsafe { libc::free(list as *mut c_void) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char {
    if device.is_null() {
        return fail::<c_char>(libc::EINVAL);
    }
    // SAFETY: a non-NULL device comes from our list; name is NUL-terminated.
    unsafe { (*device).name.as_ptr() }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut ibv_device) -> u64 {
    let Some(e) = entry_of(device) else {
        set_errno(libc::EINVAL);
        return 0;
    };
    node_guid(e).to_be()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(device: *mut ibv_device) -> c_int {
    let all = ENTRIES.lock().unwrap_or_else(|p| p.into_inner());
    match all.iter().position(|e| std::ptr::eq(device, &e.ibv)) {
        Some(i) => i as c_int,
        None => -1,
    }
}

unsafe extern "C" fn query_port_op(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: forwarded; query_port_into checks the pointers.
    unsafe { query_port_into(c, port, attr, len.min(size_of::<ibv_port_attr>())) }
}

/// `ibv_query_device_ex`: the classic attributes, no extended capabilities, and
/// `phys_port_cnt_ex`.
unsafe extern "C" fn query_device_ex_op(
    c: *mut ibv_context,
    _input: *const c_void,
    attr: *mut u8,
    attr_size: usize,
) -> c_int {
    if attr.is_null() || attr_size < size_of::<ibv_device_attr>() {
        return libc::EINVAL;
    }
    let n = attr_size.min(DEVICE_ATTR_EX_SIZE);
    // SAFETY: the caller's struct has `attr_size` bytes (>= n).
    unsafe { std::ptr::write_bytes(attr, 0, n) };
    // SAFETY: the first member of ibv_device_attr_ex is an ibv_device_attr.
    let r = unsafe { ibv_query_device(c, attr.cast()) };
    if r != 0 {
        return r;
    }
    if n >= PHYS_PORT_CNT_EX_OFFSET + 4 {
        // SAFETY: in bounds (checked); u32 field of the caller's struct, maybe unaligned.
        unsafe {
            attr.add(PHYS_PORT_CNT_EX_OFFSET)
                .cast::<u32>()
                .write_unaligned(1)
        };
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    let Some(entry) = entry_of(device) else {
        return fail(libc::EINVAL);
    };
    let shared = match acquire_device(entry) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    // A real descriptor for cmd_fd: some programs poll or fcntl it.
    // SAFETY: eventfd has no memory arguments; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        release_device(entry);
        return fail(libc::EMFILE);
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    let cmd_fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // Readable when an asynchronous event may be waiting (ibv_get_async_event takes it).
    let Some(async_watch) = crate::watch::Watch::new() else {
        release_device(entry);
        return fail(libc::EMFILE);
    };
    async_watch.add(shared.dev.async_event_fd().as_raw_fd());
    // softrdmad dying is an asynchronous event too (IBV_EVENT_DEVICE_FATAL).
    let hangup = shared.dev.hangup_fd().map(|h| h.as_raw_fd());
    if let Some(h) = hangup {
        async_watch.add_hangup(h);
    }
    let async_fd = async_watch.raw();
    let ctx = Box::new(Ctx {
        vctx: verbs_context {
            query_port: Some(query_port_op),
            other_a: crate::cq_ex::verbs_context_head(),
            query_device_ex: Some(query_device_ex_op),
            other_b: crate::qp_ex::verbs_context_tail(),
            sz: size_of::<verbs_context>(),
            context: ibv_context {
                device,
                ops: crate::verbs::ops(),
                cmd_fd: cmd_fd.as_raw_fd(),
                async_fd,
                num_comp_vectors: 1,
                mutex: [0; 5],
                abi_compat: usize::MAX as *mut c_void,
            },
        },
        magic: CTX_MAGIC,
        shared,
        entry,
        _cmd_fd: cmd_fd,
        async_watch,
        opened_by: std::process::id(),
        hangup,
    });
    let p = Box::into_raw(ctx);
    // SAFETY: `p` is a live Box allocation; taking a field address does not move it.
    unsafe { &raw mut (*p).vctx.context }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    // SAFETY: the caller passes a context from ibv_open_device (or NULL, refused).
    let Some(cx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    let p = cx as *const Ctx as *mut Ctx;
    let entry = cx.entry;
    // Its CM channel (librdmacm's) closes with it: listens end, connections go down.
    crate::cm::forget(c);
    let left = crate::objects::take_context(cx);
    if Arc::strong_count(&cx.shared) > 1 && std::process::id() == cx.opened_by {
        // Other contexts share the device (the embedded one): destroy what this one left,
        // so that its QPs stop and its regions are out of peers' reach when this returns.
        // (Otherwise the device closes with this context, and the objects with it.)
        // SAFETY: the registry holds live boxes made on `cx`, in destruction order.
        unsafe { crate::verbs::destroy_left(cx, &left) };
    }
    // SAFETY: the same boxes, which the program may not use once its context is closed.
    unsafe { crate::verbs::release_left(&left) };
    // SAFETY: `p` was made by Box::into_raw in ibv_open_device; the caller gives it up.
    drop(unsafe { Box::from_raw(p) });
    release_device(entry);
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(c: *mut ibv_context, out: *mut ibv_device_attr) -> c_int {
    // SAFETY: see `ctx`.
    let Some(cx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if out.is_null() {
        return libc::EINVAL;
    }
    let a = cx.dev().query_device();
    let guid = node_guid(cx.entry).to_be();
    let mut r = ibv_device_attr {
        fw_ver: [0; 64],
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: a.max_mr_size,
        page_size_cap: a.page_size_cap,
        vendor_id: a.vendor_id,
        vendor_part_id: a.vendor_part_id,
        hw_ver: a.hw_ver,
        ints: [0; 29],
        max_pkeys: a.max_pkeys,
        local_ca_ack_delay: 15,
        phys_port_cnt: a.phys_port_cnt,
    };
    copy_str(&mut r.fw_ver, &a.fw_ver);
    let c = |v: u32| v.min(i32::MAX as u32) as c_int;
    // Declaration order of the int fields of struct ibv_device_attr from max_qp.
    let atomic = match a.atomic_cap {
        AtomicCap::None => 0,
        AtomicCap::Hca => 1,
        AtomicCap::Glob => 2,
    };
    // device_cap_flags: RESIZE_MAX_WR | BAD_PKEY_CNTR | BAD_QKEY_CNTR | SYS_IMAGE_GUID |
    // RC_RNR_NAK_GEN | PORT_ACTIVE_EVENT | SRQ_RESIZE | MEM_WINDOW | MEM_MGT_EXTENSIONS
    // (as rxe reports).
    let cap_flags = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 10) | (1 << 12) | (1 << 13);
    let cap_flags = cap_flags | (1 << 14) | (1 << 17) | (1 << 21);
    r.ints = [
        c(a.max_qp),
        c(a.max_qp_wr),
        cap_flags,
        c(a.max_sge),
        c(a.max_sge_rd),
        c(a.max_cq),
        c(a.max_cqe),
        c(a.max_mr),
        c(a.max_pd),
        c(a.max_qp_rd_atom),
        0, // max_ee_rd_atom
        c(a.max_res_rd_atom),
        c(a.max_qp_init_rd_atom),
        0, // max_ee_init_rd_atom
        atomic,
        0, // max_ee
        0, // max_rdd
        c(a.max_mw),
        0, // max_raw_ipv6_qp
        0, // max_raw_ethy_qp
        c(a.max_mcast_grp),
        c(a.max_mcast_qp_attach),
        c(a.max_total_mcast_qp_attach),
        c(a.max_ah),
        0, // max_fmr
        0, // max_map_per_fmr
        c(a.max_srq),
        c(a.max_srq_wr),
        c(a.max_srq_sge),
    ];
    // SAFETY: `out` is non-NULL and points to a struct ibv_device_attr of the caller.
    unsafe { out.write(r) };
    0
}

/// Fill the first `len` bytes of `*attr` with port 1's attributes.
unsafe fn query_port_into(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: see `ctx`.
    let Some(cx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() || port != 1 {
        return libc::EINVAL;
    }
    let p = match cx.dev().query_port() {
        Ok(p) => p,
        Err(e) => return e.errno(),
    };
    let r = ibv_port_attr {
        state: match p.state {
            PortState::Active => 4,
            _ => 1,
        },
        max_mtu: p.max_mtu.to_ibv().into(),
        active_mtu: p.active_mtu.to_ibv().into(),
        gid_tbl_len: p.gid_tbl_len.min(i32::MAX as u32) as c_int,
        // IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS, as rxe.
        port_cap_flags: (1 << 16) | (1 << 26),
        max_msg_sz: p.max_msg_sz,
        pkey_tbl_len: p.pkey_tbl_len,
        max_vl_num: 1,
        subnet_timeout: 0,
        active_width: 2,  // 4X
        active_speed: 32, // EDR
        phys_state: 5,    // LinkUp
        link_layer: 2,    // IBV_LINK_LAYER_ETHERNET
        ..ibv_port_attr::default()
    };
    let n = len.min(size_of::<ibv_port_attr>());
    // SAFETY: the caller's struct has at least `n` bytes (48 for the exported function, the
    // size it passes for the verbs_context op); `r` is a plain value of 52 bytes.
    unsafe { std::ptr::copy_nonoverlapping(&r as *const _ as *const u8, attr as *mut u8, n) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    // The exported symbol gets the old 48-byte struct (struct _compat_ibv_port_attr).
    // SAFETY: forwarded; checked inside.
    unsafe { query_port_into(c, port, attr, 48) }
}

fn gid_of(cx: &Ctx, port: u8, index: c_int) -> Result<[u8; 16], c_int> {
    if port != 1 || index < 0 {
        return Err(libc::EINVAL);
    }
    cx.dev()
        .gid(index as u32)
        .map(|g| g.0)
        .map_err(|e| e.errno())
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    // -1 with errno set, as rdma-core's (EINVAL for a port or index the device has not).
    // SAFETY: see `ctx`.
    let Some(cx) = (unsafe { ctx(c) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if gid.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    match gid_of(cx, port, index) {
        Ok(g) => {
            // SAFETY: non-NULL, points to a union ibv_gid (16 bytes).
            unsafe { gid.write(g) };
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry_out: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: see `ctx`.
    let Some(cx) = (unsafe { ctx(c) }) else {
        return libc::EINVAL;
    };
    if entry_out.is_null() || flags != 0 || entry_size < size_of::<ibv_gid_entry>() {
        return libc::EINVAL;
    }
    let Ok(port8) = u8::try_from(port) else {
        return libc::EINVAL;
    };
    let Ok(idx) = c_int::try_from(index) else {
        return libc::EINVAL;
    };
    match gid_of(cx, port8, idx) {
        Ok(g) => {
            let e = ibv_gid_entry {
                gid: g,
                gid_index: index,
                port_num: port,
                gid_type: 2, // IBV_GID_TYPE_ROCE_V2
                ndev_ifindex: 0,
            };
            // SAFETY: non-NULL and at least sizeof(ibv_gid_entry) bytes (checked).
            unsafe { entry_out.write(e) };
            0
        }
        // libibverbs: an index past the table is ENODATA... no: an empty slot is ENODATA,
        // an index out of range EINVAL; our table has no holes.
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    c: *mut ibv_context,
    entries: *mut ibv_gid_entry,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    // SAFETY: see `ctx`.
    let Some(cx) = (unsafe { ctx(c) }) else {
        return -(libc::EINVAL as isize);
    };
    if flags != 0
        || entry_size < size_of::<ibv_gid_entry>()
        || (entries.is_null() && max_entries > 0)
    {
        return -(libc::EINVAL as isize);
    }
    let gids = cx.dev().gids();
    if gids.len() > max_entries {
        return -(libc::EINVAL as isize);
    }
    for (i, g) in gids.iter().enumerate() {
        let e = ibv_gid_entry {
            gid: g.0,
            gid_index: i as u32,
            port_num: 1,
            gid_type: 2, // IBV_GID_TYPE_ROCE_V2
            ndev_ifindex: 0,
        };
        // SAFETY: the caller's array has `max_entries` entries of `entry_size` bytes each
        // (at least our struct's size), and i < max_entries.
        unsafe {
            (entries as *mut u8)
                .add(i * entry_size)
                .cast::<ibv_gid_entry>()
                .write_unaligned(e)
        };
    }
    gids.len() as isize
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    ty: *mut u32,
) -> c_int {
    // SAFETY: see `ctx`.
    let Some(cx) = (unsafe { ctx(c) }) else {
        return -1;
    };
    let Ok(idx) = c_int::try_from(index) else {
        return -1;
    };
    if ty.is_null() || gid_of(cx, port, idx).is_err() {
        return -1;
    }
    // SAFETY: non-NULL enum ibv_gid_type_sysfs of the caller; 1 = RoCE v2.
    unsafe { ty.write(1) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: see `ctx`.
    if unsafe { ctx(c) }.is_none() || pkey.is_null() || port != 1 || index != 0 {
        return -1;
    }
    // SAFETY: non-NULL __be16 of the caller: the default P_Key 0xffff.
    unsafe { pkey.write(0xffff_u16.to_be()) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(c: *mut ibv_context, port: u8, pkey: u16) -> c_int {
    // SAFETY: see `ctx`.
    if unsafe { ctx(c) }.is_none() || port != 1 {
        return -libc::EINVAL;
    }
    if u16::from_be(pkey) & 0x7fff == 0x7fff {
        0
    } else {
        -libc::ENOENT
    }
}

symver!(
    ibv_get_device_list,
    ibv_free_device_list,
    ibv_get_device_name,
    ibv_get_device_guid,
    ibv_get_device_index,
    ibv_open_device,
    ibv_close_device,
    ibv_query_device,
    ibv_query_port,
    ibv_query_gid,
    _ibv_query_gid_ex,
    _ibv_query_gid_table,
    ibv_query_gid_type,
    ibv_query_pkey,
    ibv_get_pkey_index,
);
