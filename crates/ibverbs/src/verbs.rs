//! PD, MR, CQ, completion channels, QPs, and the data path of `context->ops`.

use core::ffi::{c_int, c_void};
use std::mem::ManuallyDrop;
use std::os::fd::AsRawFd;
use std::sync::Mutex;

use engine::{
    AccessFlags, AhAttr, AhHandle, InlineData, Lkey, MrHandle, MwBind, MwHandle, MwType, PdHandle,
    QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, Rkey, SendFlags, SendOp,
    SendPayload, SendWr, Sge, SgeList, SrqAttr, SrqHandle, UdDest,
};
use softrdma::raw::{QpHandle, Qpn};
use softrdma::RawCq;

use crate::abi::*;
use crate::device::{ctx, Ctx};
use crate::fail;
use crate::objects::{register, unregister, Kind};

/// A PD: the C struct, then its engine handle.
#[repr(C)]
struct Pd {
    ibv: ibv_pd,
    handle: PdHandle,
}

/// An MR.
#[repr(C)]
struct Mr {
    ibv: ibv_mr,
    handle: MrHandle,
}

/// A CQ: its completions are polled through `raw` (on the daemon, a shared-memory ring).
/// `ibv` and `ex` together are a `struct ibv_cq_ex`; `ex` is filled for CQs made by
/// `ibv_create_cq_ex` (see [`crate::cq_ex`]), whose current completion is `current`.
#[repr(C)]
pub(crate) struct Cq {
    pub(crate) ibv: ibv_cq,
    pub(crate) ex: ibv_cq_ex_tail,
    pub(crate) current: Mutex<Option<engine::WorkCompletion>>,
    /// Dropped by `ibv_destroy_cq` with the rest, or alone when the CQ's context closes
    /// with it left on it ([`release_left`]: its event descriptor and ring mapping go, the
    /// C struct stays).
    pub(crate) raw: ManuallyDrop<RawCq>,
}

/// A completion channel: its fd is a real descriptor. The first CQ attached makes it a
/// duplicate of that CQ's notifier, so the fd itself becomes readable on that CQ's events.
#[repr(C)]
struct Channel {
    ibv: ibv_comp_channel,
    /// `ibv.fd`: readable while one of its CQs has an event.
    watch: crate::watch::Watch,
    cqs: Mutex<Vec<usize>>,
}

/// A QP: `handle` names it to the device (on the daemon, the connection's number for it).
/// `ibv` and `ex` together are a `struct ibv_qp_ex`; `ex` is filled for QPs made by
/// `ibv_create_qp_ex` (see [`crate::qp_ex`]).
#[repr(C)]
pub(crate) struct Qp {
    pub(crate) ibv: ibv_qp,
    pub(crate) ex: ibv_qp_ex_tail,
    pub(crate) extended: bool,
    pub(crate) batch: Mutex<crate::qp_ex::Batch>,
    pub(crate) handle: QpHandle,
    qpn: Qpn,
    sq_sig_all: bool,
}

/// An SRQ.
#[repr(C)]
pub(crate) struct Srq {
    pub(crate) ibv: ibv_srq,
    handle: SrqHandle,
}

/// An address handle.
#[repr(C)]
pub(crate) struct Ah {
    ibv: ibv_ah,
    pub(crate) handle: AhHandle,
}

/// A memory window.
#[repr(C)]
pub(crate) struct Mw {
    ibv: ibv_mw,
    pub(crate) handle: MwHandle,
}

/// The ops table every context carries.
pub(crate) fn ops() -> ibv_context_ops {
    let mut head: [Option<unsafe extern "C" fn()>; 11] = [None; 11];
    // SAFETY (the three slots): the C side calls each through a pointer of the type verbs.h
    // gives the slot, which is the function's own type; the table only stores it erased.
    unsafe {
        head[ALLOC_MW_SLOT] = Some(std::mem::transmute::<
            unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw,
            unsafe extern "C" fn(),
        >(alloc_mw));
        head[BIND_MW_SLOT] = Some(std::mem::transmute::<
            unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut ibv_mw_bind) -> c_int,
            unsafe extern "C" fn(),
        >(bind_mw));
        head[DEALLOC_MW_SLOT] = Some(std::mem::transmute::<
            unsafe extern "C" fn(*mut ibv_mw) -> c_int,
            unsafe extern "C" fn(),
        >(dealloc_mw));
    }
    ibv_context_ops {
        head,
        poll_cq: Some(poll_cq),
        req_notify_cq: Some(req_notify_cq),
        mid: [None; 7],
        post_srq_recv: Some(post_srq_recv),
        mid2: [None; 4],
        post_send: Some(post_send),
        post_recv: Some(post_recv),
        tail: [None; 5],
    }
}

/// Slots of `ibv_context_ops` (in 8-byte words): `alloc_mw` @56, `bind_mw` @64,
/// `dealloc_mw` @72.
const ALLOC_MW_SLOT: usize = 7;
const BIND_MW_SLOT: usize = 8;
const DEALLOC_MW_SLOT: usize = 9;

/// The context of an object whose C struct starts with `context`.
///
/// # Safety
/// `c` is the `context` field of a live object of ours.
pub(crate) unsafe fn ctx_ok<'a>(c: *mut ibv_context) -> Result<&'a Ctx, c_int> {
    // SAFETY: forwarded.
    unsafe { ctx(c) }.ok_or(libc::EINVAL)
}

/// The CQ behind `cq` and its context; EINVAL for NULL or a context not ours.
///
/// # Safety
/// `cq` is NULL or a CQ made by `ibv_create_cq` / `ibv_create_cq_ex`, not yet destroyed.
unsafe fn cq_ok<'a>(cq: *mut ibv_cq) -> Result<(&'a Cq, &'a Ctx), c_int> {
    if cq.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: a non-NULL CQ comes from ibv_create_cq (the caller's contract).
    let q = unsafe { &*(cq as *mut Cq) };
    // SAFETY: its context is ours.
    let cx = unsafe { ctx_ok(q.ibv.context) }?;
    Ok((q, cx))
}

/// The errno a failed verb returns. It is left in `errno` too, as rdma-core's verbs leave the
/// failed system call's: programs print it with `%m` (UCX does, after `ibv_modify_qp`).
pub(crate) fn verr(e: softrdma::Error) -> c_int {
    let errno = e.errno();
    crate::set_errno(errno);
    errno
}

// ---- PD ----

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    // SAFETY: see `ctx`.
    let cx = match unsafe { ctx_ok(c) } {
        Ok(cx) => cx,
        Err(e) => return fail(e),
    };
    let h = match cx.raw().alloc_pd() {
        Ok(h) => h,
        Err(e) => return fail(verr(e)),
    };
    let pd = Box::new(Pd {
        ibv: ibv_pd {
            context: c,
            handle: h.0,
        },
        handle: h,
    });
    let pd = Box::into_raw(pd);
    register(cx, Kind::Pd, h.0, pd as usize);
    pd as *mut ibv_pd
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL PD comes from ibv_alloc_pd: a Box<Pd> whose first field it is.
    let p = unsafe { &*(pd as *mut Pd) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(p.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    if let Err(e) = cx.raw().dealloc_pd(p.handle) {
        return verr(e);
    }
    unregister(cx, Kind::Pd, p.handle.0);
    // SAFETY: made by Box::into_raw in ibv_alloc_pd; the caller gives it up.
    drop(unsafe { Box::from_raw(pd as *mut Pd) });
    0
}

// ---- MR ----

unsafe fn reg_mr(pd: *mut ibv_pd, addr: *mut c_void, len: usize, access: c_int) -> *mut ibv_mr {
    if pd.is_null() || (addr.is_null() && len != 0) {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL PD comes from ibv_alloc_pd.
    let p = unsafe { &*(pd as *mut Pd) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(p.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return fail(e),
    };
    let Some(flags) = AccessFlags::from_bits(access as u32) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: ibv_reg_mr's contract: the caller keeps addr..addr+len valid until
    // ibv_dereg_mr, and the device may access it from its thread meanwhile (that is what
    // registering memory means in verbs).
    let keys = unsafe { cx.raw().reg_mr(p.handle, addr as *mut u8, len, flags) };
    let keys = match keys {
        Ok(k) => k,
        Err(e) => return fail(verr(e)),
    };
    let mr = Box::new(Mr {
        ibv: ibv_mr {
            context: p.ibv.context,
            pd,
            addr,
            length: len,
            handle: keys.handle.0,
            lkey: keys.lkey.value(),
            rkey: keys.rkey.value(),
        },
        handle: keys.handle,
    });
    let mr = Box::into_raw(mr);
    register(cx, Kind::Mr, keys.handle.0, mr as usize);
    mr as *mut ibv_mr
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded; checked inside.
    unsafe { reg_mr(pd, addr, len, access) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    // IBV_ACCESS_OPTIONAL_RANGE (bits 20..29) are hints a provider may ignore.
    let access = access & !(0x3ff << 20);
    if iova != addr as u64 {
        // The engine addresses regions by their virtual address only.
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: forwarded; checked inside.
    unsafe { reg_mr(pd, addr, len, access as c_int) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL MR comes from reg_mr: a Box<Mr> whose first field it is.
    let m = unsafe { &*(mr as *mut Mr) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(m.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    if let Err(e) = cx.raw().dereg_mr(m.handle) {
        return verr(e);
    }
    unregister(cx, Kind::Mr, m.handle.0);
    // SAFETY: made by Box::into_raw in reg_mr; the caller gives it up.
    drop(unsafe { Box::from_raw(mr as *mut Mr) });
    0
}

/// `IBV_REREG_MR_ERR_INPUT`: the region is still valid and unchanged (every failure here
/// leaves it so: the device changes a region only when it can change all that was asked).
const REREG_MR_ERR_INPUT: c_int = -1;

/// `ibv_rereg_mr`: change a region's translation, PD or access in place, keeping its
/// handle and keys. Fails with `IBV_REREG_MR_ERR_INPUT` and `errno` set.
#[no_mangle]
pub unsafe extern "C" fn ibv_rereg_mr(
    mr: *mut ibv_mr,
    flags: c_int,
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> c_int {
    let refuse = |e: c_int| {
        crate::set_errno(e);
        REREG_MR_ERR_INPUT
    };
    if mr.is_null() {
        return refuse(libc::EINVAL);
    }
    let (Some(flags), Some(access)) = (
        u32::try_from(flags)
            .ok()
            .and_then(engine::ReregFlags::from_bits),
        u32::try_from(access).ok().and_then(AccessFlags::from_bits),
    ) else {
        return refuse(libc::EINVAL);
    };
    let moves = flags.contains(engine::ReregFlags::CHANGE_TRANSLATION);
    // As libibverbs checks before the provider sees the call.
    if flags.is_empty() || (moves && (addr.is_null() || length == 0)) {
        return refuse(libc::EINVAL);
    }
    let new_pd = flags.contains(engine::ReregFlags::CHANGE_PD);
    if new_pd && pd.is_null() {
        return refuse(libc::EINVAL);
    }
    // SAFETY: a non-NULL MR comes from reg_mr: a Box<Mr> whose first field it is; the
    // caller may not use it from another thread during this call (verbs' rule).
    let m = unsafe { &mut *(mr as *mut Mr) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(m.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return refuse(e),
    };
    let pd_handle = if new_pd {
        // SAFETY: a non-NULL PD comes from ibv_alloc_pd.
        let p = unsafe { &*(pd as *mut Pd) };
        if p.ibv.context != m.ibv.context {
            return refuse(libc::EINVAL);
        }
        p.handle
    } else {
        engine::PdHandle(u32::MAX)
    };
    // SAFETY: ibv_rereg_mr's contract with a new translation is ibv_reg_mr's for the new
    // range.
    let r = unsafe {
        cx.raw()
            .rereg_mr(m.handle, flags, pd_handle, addr as *mut u8, length, access)
    };
    match r {
        Ok(k) => {
            (m.ibv.lkey, m.ibv.rkey) = (k.lkey.value(), k.rkey.value());
            if new_pd {
                m.ibv.pd = pd;
            }
            if moves {
                (m.ibv.addr, m.ibv.length) = (addr, length);
            }
            0
        }
        Err(e) => refuse(verr(e)),
    }
}

// ---- memory windows (reached through context->ops, as verbs.h's inline calls do) ----

/// `ibv_alloc_mw`: a type 1 or type 2 window in `pd`.
unsafe extern "C" fn alloc_mw(pd: *mut ibv_pd, mw_type: u32) -> *mut ibv_mw {
    if pd.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL PD comes from ibv_alloc_pd.
    let p = unsafe { &*(pd as *mut Pd) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(p.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return fail(e),
    };
    let t = match mw_type {
        1 => MwType::Type1,
        2 => MwType::Type2,
        // No such window type (the kernel's answer too).
        _ => return fail(libc::EINVAL),
    };
    let (h, rkey) = match cx.raw().alloc_mw(p.handle, t) {
        Ok(k) => k,
        Err(e) => return fail(verr(e)),
    };
    let mw = Box::new(Mw {
        ibv: ibv_mw {
            context: p.ibv.context,
            pd,
            rkey: rkey.value(),
            handle: h.0,
            mw_type,
        },
        handle: h,
    });
    let mw = Box::into_raw(mw);
    register(cx, Kind::Mw, h.0, mw as usize);
    mw as *mut ibv_mw
}

/// `ibv_dealloc_mw`.
unsafe extern "C" fn dealloc_mw(mw: *mut ibv_mw) -> c_int {
    if mw.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL window comes from alloc_mw: a Box<Mw> whose first field it is.
    let w = unsafe { &*(mw as *mut Mw) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(w.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    if let Err(e) = cx.raw().dealloc_mw(w.handle) {
        return verr(e);
    }
    unregister(cx, Kind::Mw, w.handle.0);
    // SAFETY: made by Box::into_raw in alloc_mw; the caller gives it up.
    drop(unsafe { Box::from_raw(mw as *mut Mw) });
    0
}

/// The engine's bind of a C `ibv_mw_bind_info` (a NULL region only for a zero-length
/// unbind).
///
/// # Safety
/// `b.mr` is NULL or a region from `ibv_reg_mr`.
pub(crate) unsafe fn mw_bind_of(b: &ibv_mw_bind_info) -> Result<MwBind, c_int> {
    let mr = if b.mr.is_null() {
        if b.length != 0 {
            return Err(libc::EINVAL);
        }
        MrHandle(0)
    } else {
        // SAFETY: a non-NULL region comes from reg_mr: a Box<Mr> whose first field it is.
        unsafe { &*(b.mr as *mut Mr) }.handle
    };
    // A window grants remote rights only; the local write bit that programs pass along
    // (rdma-core's own tests do) means nothing for it, and providers ignore it.
    let access =
        AccessFlags::from_bits(b.mw_access_flags).ok_or(libc::EINVAL)? - AccessFlags::LOCAL_WRITE;
    Ok(MwBind {
        mr,
        addr: b.addr,
        length: b.length,
        access,
    })
}

/// `ibv_bind_mw`: bind a type 1 window through `qp` (posted like a send; the window's rkey
/// is the one it will have).
unsafe extern "C" fn bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, bind: *mut ibv_mw_bind) -> c_int {
    if qp.is_null() || mw.is_null() || bind.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: non-NULL objects of ours and the caller's bind struct.
    let (q, w, b) = unsafe { (&*(qp as *mut Qp), &mut *(mw as *mut Mw), &*bind) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    // SAFETY: the region is NULL or the caller's from ibv_reg_mr.
    let mb = match unsafe { mw_bind_of(&b.bind_info) } {
        Ok(m) => m,
        Err(e) => return e,
    };
    let signaled = b.send_flags & IBV_SEND_SIGNALED != 0;
    match cx.raw().bind_mw(q.handle, b.wr_id, w.handle, mb, signaled) {
        Ok(rkey) => {
            w.ibv.rkey = rkey.value();
            0
        }
        Err(e) => verr(e),
    }
}

/// `IBV_SEND_SIGNALED`.
const IBV_SEND_SIGNALED: u32 = 2;

// ---- completion channels and CQs ----

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    // SAFETY: see `ctx`.
    if let Err(e) = unsafe { ctx_ok(c) } {
        return fail(e);
    }
    let Some(watch) = crate::watch::Watch::new() else {
        return fail(libc::EMFILE);
    };
    let ch = Box::new(Channel {
        ibv: ibv_comp_channel {
            context: c,
            fd: watch.raw(),
            refcnt: 0,
        },
        watch,
        cqs: Mutex::new(Vec::new()),
    });
    Box::into_raw(ch) as *mut ibv_comp_channel
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    if ch.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL channel comes from ibv_create_comp_channel.
    let chan = unsafe { &*(ch as *mut Channel) };
    if !chan
        .cqs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .is_empty()
    {
        return libc::EBUSY;
    }
    // SAFETY: made by Box::into_raw; the caller gives it up.
    drop(unsafe { Box::from_raw(ch as *mut Channel) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    // SAFETY: forwarded; checked inside.
    unsafe { create_cq(c, cqe, cq_context, channel, comp_vector, false) }
}

/// `ibv_create_cq`, and `ibv_create_cq_ex` when `extended`.
///
/// # Safety
/// `c` is NULL or a context; `channel` NULL or a channel of ours.
pub(crate) unsafe fn create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
    extended: bool,
) -> *mut ibv_cq {
    // SAFETY: see `ctx`.
    let cx = match unsafe { ctx_ok(c) } {
        Ok(cx) => cx,
        Err(e) => return fail(e),
    };
    // One completion vector; at least one entry, at most the device's max_cqe (as rxe).
    let max_cqe = cx.dev().query_device().max_cqe;
    let depth = match u32::try_from(cqe) {
        Ok(d) if d >= 1 && d <= max_cqe && comp_vector == 0 => d,
        _ => return fail(libc::EINVAL),
    };
    let raw = match cx.raw().create_cq(depth) {
        Ok(r) => r,
        Err(e) => return fail(verr(e)),
    };
    let handle = raw.handle().0;
    let cq = Box::into_raw(Box::new(Cq {
        ibv: ibv_cq {
            context: c,
            channel,
            cq_context,
            handle,
            cqe,
            mutex: [0; 5],
            cond: [0; 6],
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        ex: crate::cq_ex::tail(extended),
        current: Mutex::new(None),
        raw: ManuallyDrop::new(raw),
    }));
    register(cx, Kind::Cq, handle, cq as usize);
    if !channel.is_null() {
        // SAFETY: a non-NULL channel comes from ibv_create_comp_channel; `cq` is live.
        unsafe {
            let chan = &*(channel as *mut Channel);
            let mut cqs = chan.cqs.lock().unwrap_or_else(|p| p.into_inner());
            // The channel's fd is readable on this CQ's events (and its other CQs').
            chan.watch.add((*cq).raw.event_fd().as_raw_fd());
            cqs.push(cq as usize);
            (*channel).refcnt += 1;
        }
    }
    cq as *mut ibv_cq
}

/// `ibv_resize_cq`: room for `cqe` completions; `cq->cqe` says the size it has now.
/// EINVAL for a size out of range or below the completions waiting.
#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, cqe: c_int) -> c_int {
    // SAFETY: forwarded: NULL or a CQ of ours.
    let (q, cx) = match unsafe { cq_ok(cq) } {
        Ok(v) => v,
        Err(e) => return e,
    };
    // The device checks the range (1..=max_cqe).
    let Ok(depth) = u32::try_from(cqe) else {
        return libc::EINVAL;
    };
    match cx.raw().resize_cq(&q.raw, depth) {
        Ok(n) => {
            // SAFETY: `cq` is live; `cqe` is the caller's to read, as after ibv_create_cq.
            unsafe { (*cq).cqe = c_int::try_from(n).unwrap_or(cqe) };
            0
        }
        Err(e) => verr(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    // SAFETY: forwarded: NULL or a CQ of ours.
    let (q, cx) = match unsafe { cq_ok(cq) } {
        Ok(v) => v,
        Err(e) => return e,
    };
    if let Err(e) = cx.raw().destroy_cq(&q.raw) {
        return verr(e);
    }
    unregister(cx, Kind::Cq, q.ibv.handle);
    // SAFETY: `cq` is the live CQ `q`.
    unsafe { unlink_from_channel(cq, q) };
    // SAFETY: made by Box::into_raw in ibv_create_cq; the caller gives it up, and `raw` was
    // not dropped (only a close of its context does that, after which it may not be used).
    unsafe {
        let mut b = Box::from_raw(cq as *mut Cq);
        ManuallyDrop::drop(&mut b.raw);
    }
    0
}

/// Take destroyed CQ `q` (at `cq`) out of its completion channel, if it has one.
///
/// # Safety
/// `cq` is `q`'s address; its channel is NULL or live.
unsafe fn unlink_from_channel(cq: *mut ibv_cq, q: &Cq) {
    if q.ibv.channel.is_null() {
        return;
    }
    // SAFETY: the channel outlives its CQs (destroy_comp_channel refuses while used).
    unsafe {
        let chan = &*(q.ibv.channel as *mut Channel);
        chan.watch.remove(q.raw.event_fd().as_raw_fd());
        chan.cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&x| x != cq as usize);
        (*q.ibv.channel).refcnt -= 1;
    }
}

/// Destroy on the device the objects a context being closed left behind (from
/// [`crate::objects::take_context`], in that order), as a NIC's close does. Their C structs
/// stay allocated, as rdma-core leaves them: the program may still hold the pointers, and
/// may not use them. A failure leaves that object to the device (there is no one to tell).
///
/// # Safety
/// Each address is a live box of its kind, made on `cx`.
pub(crate) unsafe fn destroy_left(cx: &Ctx, left: &[(Kind, usize)]) {
    let raw = cx.raw();
    for &(kind, ptr) in left {
        // SAFETY (every arm): `ptr` is a live box of `kind` (the caller's contract).
        let _ = match kind {
            Kind::Qp => raw.destroy_qp(unsafe { &*(ptr as *const Qp) }.handle),
            Kind::Mw => raw.dealloc_mw(unsafe { &*(ptr as *const Mw) }.handle),
            Kind::Ah => raw.destroy_ah(unsafe { &*(ptr as *const Ah) }.handle),
            Kind::Srq => raw.destroy_srq(unsafe { &*(ptr as *const Srq) }.handle),
            // Its channel lets go of it in `release_left`.
            Kind::Cq => raw.destroy_cq(&unsafe { &*(ptr as *const Cq) }.raw),
            Kind::Mr => raw.dereg_mr(unsafe { &*(ptr as *const Mr) }.handle),
            Kind::Pd => raw.dealloc_pd(unsafe { &*(ptr as *const Pd) }.handle),
        };
    }
}

/// Free what the objects a closed context left hold besides their C structs: a CQ's event
/// descriptor and, on softrdmad, the mapping of its ring. Without this, a program that
/// closes contexts with CQs on them, again and again, runs out of descriptors (and address
/// space: half a megabyte of mapping per CQ on softrdmad). A CQ leaves its completion
/// channel first: the channel is the program's, and may still be waited on or destroyed.
///
/// # Safety
/// Each address is a live box of its kind whose context is being closed (after
/// [`destroy_left`], which still uses them); nothing uses them after this.
pub(crate) unsafe fn release_left(left: &[(Kind, usize)]) {
    for &(kind, ptr) in left {
        if kind == Kind::Cq {
            // SAFETY: a live CQ box no one else uses now (the caller's contract), whose
            // channel, if any, outlives it; `raw` is dropped once (ibv_destroy_cq cannot
            // come after the close).
            unsafe {
                unlink_from_channel(ptr as *mut ibv_cq, &*(ptr as *const Cq));
                ManuallyDrop::drop(&mut (*(ptr as *mut Cq)).raw);
            }
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    if ch.is_null() || cq_out.is_null() || ctx_out.is_null() {
        return -1;
    }
    // SAFETY: a non-NULL channel comes from ibv_create_comp_channel.
    let chan = unsafe { &*(ch as *mut Channel) };
    // A CQ's softrdmad hung up in the last wait: no event will come any more.
    let mut gone = false;
    loop {
        let cqs: Vec<usize> = chan.cqs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut fds = Vec::with_capacity(cqs.len());
        for &p in &cqs {
            // SAFETY: CQs in the list are live (destroy_cq removes them first).
            let q = unsafe { &*(p as *const Cq) };
            if q.raw.clear_event() {
                // SAFETY: the out pointers are non-NULL (checked).
                unsafe {
                    *cq_out = p as *mut ibv_cq;
                    *ctx_out = q.ibv.cq_context;
                }
                return 0;
            }
            fds.push(libc::pollfd {
                fd: q.raw.event_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            // A softrdmad that died signals no CQ again: its connection hanging up ends the
            // wait (asked for nothing, it reports only that).
            if let Some(h) = q.raw.hangup_fd() {
                fds.push(libc::pollfd {
                    fd: h.as_raw_fd(),
                    events: 0,
                    revents: 0,
                });
            }
        }
        if gone {
            crate::set_errno(libc::ECONNRESET);
            return -1;
        }
        if chan.watch.nonblocking() {
            // rdma-core reads the channel's descriptor: no event and O_NONBLOCK is EAGAIN.
            crate::set_errno(libc::EAGAIN);
            return -1;
        }
        if fds.is_empty() {
            fds.push(libc::pollfd {
                fd: chan.watch.raw(),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a valid array of its length.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return -1;
        }
        // Events that came before the hang-up are still taken first (the next pass).
        gone = fds
            .iter()
            .any(|p| p.events == 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0);
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: u32) {
    if cq.is_null() {
        return;
    }
    // SAFETY: a non-NULL CQ comes from ibv_create_cq; the counter is informational.
    unsafe {
        (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(n);
    }
}

unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: forwarded: NULL or a CQ of ours.
    let (q, cx) = match unsafe { cq_ok(cq) } {
        Ok(v) => v,
        Err(e) => return e,
    };
    match cx.raw().arm_cq(&q.raw, solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => verr(e),
    }
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    if cq.is_null() || (wc.is_null() && n > 0) {
        return -libc::EINVAL;
    }
    let Ok(n) = usize::try_from(n) else {
        return -libc::EINVAL;
    };
    // SAFETY: forwarded: a CQ of ours (NULL was refused above).
    let (q, cx) = match unsafe { cq_ok(cq) } {
        Ok(v) => v,
        Err(e) => return -e,
    };
    let raw = cx.raw();
    // Completions come in turns of a stack buffer: polling allocates nothing.
    let mut buf = [engine::WorkCompletion::default(); 16];
    let mut done = 0;
    while done < n {
        let want = (n - done).min(buf.len());
        let got = match raw.poll_cq_into(&q.raw, &mut buf[..want]) {
            Ok(got) => got,
            Err(_) if done > 0 => break,
            Err(e) => return -verr(e),
        };
        for (i, w) in buf[..got].iter().enumerate() {
            let out = ibv_wc {
                wr_id: w.wr_id,
                status: w.status.to_ibv(),
                opcode: w.opcode.to_ibv(),
                vendor_err: w.vendor_err,
                byte_len: w.byte_len,
                imm_data: imm_of(w),
                qp_num: w.qp_num.value(),
                src_qp: w.src_qp.value(),
                wc_flags: w.wc_flags.bits(),
                pkey_index: w.pkey_index,
                slid: 0,
                sl: sl_of(w),
                dlid_path_bits: 0,
            };
            // SAFETY: the caller's array holds `n` entries and done + i < done + got <= n.
            unsafe { wc.add(done + i).write(out) };
        }
        done += got;
        if got < want {
            break;
        }
    }
    done as c_int
}

/// `ibv_wc.imm_data`: the immediate (network order), or the invalidated rkey (host order).
pub(crate) fn imm_of(w: &engine::WorkCompletion) -> u32 {
    if w.wc_flags.contains(engine::WcFlags::WITH_INV) {
        w.invalidated_rkey.value()
    } else {
        w.imm_data.to_be()
    }
}

/// `ibv_wc.sl`. RoCE has no service levels; for a received datagram a RoCE NIC reports the
/// packet type there instead (mlx5: bit 3 for a UDP-encapsulated RoCEv2 frame, bits 2:0 the
/// L3 header, 1 IPv6 or 2 IPv4). UCX's `ud_verbs` reads it to find the destination GID in
/// the GRH area, and drops every datagram whose GID it cannot find.
pub(crate) fn sl_of(w: &engine::WorkCompletion) -> u8 {
    const ROCE_V2: u8 = 0x8;
    match w.network_hdr {
        engine::NetworkHdr::None => 0,
        engine::NetworkHdr::Ipv6 => ROCE_V2 | 1,
        engine::NetworkHdr::Ipv4 => ROCE_V2 | 2,
    }
}

// ---- QPs ----

fn qp_type_of(t: QpType) -> u32 {
    t.to_ibv()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    if pd.is_null() || init.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL PD of ours and the caller's init struct.
    unsafe { create_qp(pd, &mut *init, false) }
}

/// `ibv_create_qp`, and `ibv_create_qp_ex` when `extended` (its attributes start with the
/// classic ones): the QP, its capacities written back into `ia`.
///
/// # Safety
/// `pd` is a non-NULL PD from `ibv_alloc_pd`.
pub(crate) unsafe fn create_qp(
    pd: *mut ibv_pd,
    ia: &mut ibv_qp_init_attr,
    extended: bool,
) -> *mut ibv_qp {
    // SAFETY: a non-NULL PD of ours (the caller's contract).
    let p = unsafe { &*(pd as *mut Pd) };
    if ia.send_cq.is_null() || ia.recv_cq.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(p.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return fail(e),
    };
    let Ok(qp_type) = QpType::try_from(ia.qp_type) else {
        return fail(libc::EOPNOTSUPP);
    };
    // SAFETY: the CQs are ours (non-NULL, from ibv_create_cq).
    let (scq, rcq) = unsafe { (&*(ia.send_cq as *mut Cq), &*(ia.recv_cq as *mut Cq)) };
    let attr = QpInitAttr {
        pd: p.handle,
        send_cq: scq.raw.handle(),
        recv_cq: rcq.raw.handle(),
        cap: QpCap {
            max_send_wr: ia.cap.max_send_wr,
            max_recv_wr: ia.cap.max_recv_wr,
            max_send_sge: ia.cap.max_send_sge,
            max_recv_sge: ia.cap.max_recv_sge,
            max_inline_data: ia.cap.max_inline_data,
        },
        qp_type,
        sq_sig_all: ia.sq_sig_all != 0,
    };
    let srq = if ia.srq.is_null() {
        None
    } else {
        // SAFETY: a non-NULL SRQ comes from ibv_create_srq.
        Some(unsafe { &*(ia.srq as *mut Srq) }.handle)
    };
    let raw = cx.raw();
    let created = match raw.create_qp(&attr, srq) {
        Ok(q) => q,
        Err(e) => return fail(verr(e)),
    };
    // Write back the real capacities (perftest and rc_pingpong read them).
    if let Ok(a) = raw.query_qp(created.handle) {
        ia.cap = ibv_qp_cap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        };
    }
    let qp = Box::new(Qp {
        ibv: ibv_qp {
            context: p.ibv.context,
            qp_context: ia.qp_context,
            pd,
            send_cq: ia.send_cq,
            recv_cq: ia.recv_cq,
            srq: ia.srq,
            handle: created.handle.0,
            qp_num: created.qpn.value(),
            state: QpState::Reset.to_ibv(),
            qp_type: qp_type_of(qp_type),
            mutex: [0; 5],
            cond: [0; 6],
            events_completed: 0,
        },
        ex: crate::qp_ex::tail(extended),
        extended,
        batch: Mutex::new(crate::qp_ex::Batch::default()),
        handle: created.handle,
        qpn: created.qpn,
        sq_sig_all: ia.sq_sig_all != 0,
    });
    let qp = Box::into_raw(qp);
    register(cx, Kind::Qp, created.qpn.value(), qp as usize);
    qp as *mut ibv_qp
}

/// The engine's view of a C `ibv_qp_attr` (fields outside `mask` are left at defaults).
fn qp_attr_from_c(a: &ibv_qp_attr, mask: QpAttrMask) -> Result<QpAttr, c_int> {
    let mut r = QpAttr::default();
    if mask.contains(QpAttrMask::STATE) {
        r.qp_state = QpState::try_from(a.qp_state).map_err(|_| libc::EINVAL)?;
    }
    if mask.contains(QpAttrMask::CUR_STATE) {
        r.cur_qp_state = QpState::try_from(a.cur_qp_state).map_err(|_| libc::EINVAL)?;
    }
    if mask.contains(QpAttrMask::PATH_MTU) {
        let m = u8::try_from(a.path_mtu).map_err(|_| libc::EINVAL)?;
        r.path_mtu = engine::qp_attr::Mtu::from_ibv(m).ok_or(libc::EINVAL)?;
    }
    if mask.contains(QpAttrMask::PATH_MIG_STATE) {
        r.path_mig_state =
            engine::qp_attr::MigState::try_from(a.path_mig_state).map_err(|_| libc::EINVAL)?;
    }
    r.qkey = a.qkey;
    r.rq_psn = a.rq_psn;
    r.sq_psn = a.sq_psn;
    if mask.contains(QpAttrMask::DEST_QPN) {
        // A number over 24 bits names no QP: EINVAL, as the kernel's modify_qp answers.
        r.dest_qp_num = Qpn::try_new(a.dest_qp_num).ok_or(libc::EINVAL)?;
    }
    if mask.contains(QpAttrMask::ACCESS_FLAGS) {
        r.qp_access_flags = AccessFlags::from_bits(a.qp_access_flags).ok_or(libc::EINVAL)?;
    }
    r.cap = QpCap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    r.ah_attr = ah_from_c(&a.ah_attr);
    r.alt_ah_attr = ah_from_c(&a.alt_ah_attr);
    r.pkey_index = a.pkey_index;
    r.alt_pkey_index = a.alt_pkey_index;
    r.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    r.max_rd_atomic = a.max_rd_atomic;
    r.max_dest_rd_atomic = a.max_dest_rd_atomic;
    r.min_rnr_timer = a.min_rnr_timer;
    r.port_num = a.port_num;
    r.timeout = a.timeout;
    r.retry_cnt = a.retry_cnt;
    r.rnr_retry = a.rnr_retry;
    r.alt_port_num = a.alt_port_num;
    r.alt_timeout = a.alt_timeout;
    r.rate_limit = a.rate_limit;
    Ok(r)
}

fn ah_from_c(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        dgid: a.grh.dgid,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        flow_label: a.grh.flow_label,
        dlid: a.dlid,
        sl: a.sl,
        static_rate: a.static_rate,
        port_num: a.port_num,
        is_global: a.is_global != 0,
    }
}

/// An engine QP's attributes as `struct ibv_qp_attr` (`ibv_query_qp`, and the attributes
/// the connection manager hands out for `rdma_init_qp_attr`).
pub(crate) fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    let cap = ibv_qp_cap {
        max_send_wr: a.cap.max_send_wr,
        max_recv_wr: a.cap.max_recv_wr,
        max_send_sge: a.cap.max_send_sge,
        max_recv_sge: a.cap.max_recv_sge,
        max_inline_data: a.cap.max_inline_data,
    };
    ibv_qp_attr {
        qp_state: a.qp_state.to_ibv(),
        cur_qp_state: a.qp_state.to_ibv(),
        path_mtu: a.path_mtu.to_ibv().into(),
        path_mig_state: a.path_mig_state.to_ibv(),
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num.value(),
        qp_access_flags: a.qp_access_flags.bits(),
        cap,
        ah_attr: ah_to_c(&a.ah_attr),
        alt_ah_attr: ah_to_c(&a.alt_ah_attr),
        pkey_index: a.pkey_index,
        alt_pkey_index: a.alt_pkey_index,
        en_sqd_async_notify: u8::from(a.en_sqd_async_notify),
        sq_draining: u8::from(a.sq_draining),
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: a.alt_port_num,
        alt_timeout: a.alt_timeout,
        rate_limit: a.rate_limit,
    }
}

fn ah_to_c(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: a.dgid,
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: 0,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL QP comes from ibv_create_qp; attr is the caller's struct.
    let (q, a) = unsafe { (&mut *(qp as *mut Qp), &*attr) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    let Some(mask) = QpAttrMask::from_bits(mask as u32) else {
        return libc::EINVAL;
    };
    let ea = match qp_attr_from_c(a, mask) {
        Ok(x) => x,
        Err(e) => return e,
    };
    if let Err(e) = cx.raw().modify_qp(q.handle, &ea, mask) {
        return verr(e);
    }
    if mask.contains(QpAttrMask::STATE) {
        q.ibv.state = ea.qp_state.to_ibv();
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL QP comes from ibv_create_qp.
    let q = unsafe { &mut *(qp as *mut Qp) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    let a = match cx.raw().query_qp(q.handle) {
        Ok(a) => a,
        Err(e) => return verr(e),
    };
    let out = qp_attr_to_c(&a);
    q.ibv.state = out.qp_state;
    // SAFETY: non-NULL caller structs.
    unsafe {
        attr.write(out);
        if !init.is_null() {
            init.write(ibv_qp_init_attr {
                qp_context: q.ibv.qp_context,
                send_cq: q.ibv.send_cq,
                recv_cq: q.ibv.recv_cq,
                srq: q.ibv.srq,
                cap: out.cap,
                qp_type: q.ibv.qp_type,
                sq_sig_all: c_int::from(q.sq_sig_all),
            });
        }
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL QP comes from ibv_create_qp.
    let q = unsafe { &*(qp as *mut Qp) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    if let Err(e) = cx.raw().destroy_qp(q.handle) {
        return verr(e);
    }
    unregister(cx, Kind::Qp, q.qpn.value());
    // SAFETY: made by Box::into_raw in ibv_create_qp; the caller gives it up.
    drop(unsafe { Box::from_raw(qp as *mut Qp) });
    0
}

/// The SGEs of a C list.
///
/// # Safety
/// `sg` points to `n` SGEs when `n > 0`.
unsafe fn sges(sg: *const ibv_sge, n: c_int) -> Result<SgeList, c_int> {
    let n = usize::try_from(n).map_err(|_| libc::EINVAL)?;
    if n == 0 {
        return Ok(SgeList::new());
    }
    if sg.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's list has `n` entries (ibv_post_* contract).
    let s = unsafe { std::slice::from_raw_parts(sg, n) };
    Ok(s.iter()
        .map(|e| Sge::new(e.addr, e.length, Lkey::new(e.lkey)))
        .collect())
}

/// One C send WR as the engine's.
///
/// # Safety
/// `w` is a valid `ibv_send_wr` whose SGEs (and, for inline sends, their bytes) are readable.
unsafe fn send_wr(w: &ibv_send_wr) -> Result<SendWr, c_int> {
    // SAFETY: the union member read is the one the opcode names.
    let op = unsafe {
        match w.opcode {
            0 => SendOp::RdmaWrite {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: Rkey::new(w.wr.rdma.rkey),
            },
            1 => SendOp::RdmaWriteWithImm {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: Rkey::new(w.wr.rdma.rkey),
                imm: u32::from_be(w.imm_data),
            },
            2 => SendOp::Send,
            3 => SendOp::SendWithImm {
                imm: u32::from_be(w.imm_data),
            },
            4 => SendOp::RdmaRead {
                remote_addr: w.wr.rdma.remote_addr,
                rkey: Rkey::new(w.wr.rdma.rkey),
            },
            5 => SendOp::AtomicCmpSwap {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: Rkey::new(w.wr.atomic.rkey),
                compare: w.wr.atomic.compare_add,
                swap: w.wr.atomic.swap,
            },
            6 => SendOp::AtomicFetchAdd {
                remote_addr: w.wr.atomic.remote_addr,
                rkey: Rkey::new(w.wr.atomic.rkey),
                add: w.wr.atomic.compare_add,
            },
            7 => SendOp::LocalInv {
                rkey: Rkey::new(w.imm_data),
            },
            8 => {
                // IBV_WR_BIND_MW (type 2 windows): the program picked the new key.
                let b = w.bind_mw;
                if b.mw.is_null() {
                    return Err(libc::EINVAL);
                }
                // (Inside the block's unsafe:) a non-NULL window comes from alloc_mw; the
                // region is NULL or the caller's from ibv_reg_mr.
                let (mw, bind) = ((*(b.mw as *mut Mw)).handle, mw_bind_of(&b.bind_info)?);
                SendOp::BindMw {
                    mw,
                    rkey: Rkey::new(b.rkey),
                    bind,
                }
            }
            9 => SendOp::SendWithInv {
                rkey: Rkey::new(w.imm_data),
            },
            _ => return Err(libc::EINVAL),
        }
    };
    // SAFETY: forwarded from the caller.
    let list = unsafe { sges(w.sg_list, w.num_sge)? };
    let flags = SendFlags::from_bits_truncate(w.send_flags & 0x7);
    let payload = if w.send_flags & 0x8 != 0 {
        // IBV_SEND_INLINE: the bytes are copied now, no lkey involved.
        let mut data = InlineData::new();
        for s in &list {
            if s.length > 0 {
                // SAFETY: for inline sends the SGE addresses are the caller's readable memory.
                let b = unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                };
                data.extend_from_slice(b);
            }
        }
        SendPayload::Inline(data)
    } else {
        SendPayload::Sges(list)
    };
    let flags = if matches!(payload, SendPayload::Inline(_)) {
        flags | SendFlags::INLINE
    } else {
        flags
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        payload,
        flags,
    })
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL QP comes from ibv_create_qp.
    let q = unsafe { &*(qp as *mut Qp) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    let raw = cx.raw();
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: each WR of the caller's list is valid until post_send returns.
        let w = unsafe { &*cur };
        // SAFETY: the WR's SGE list is valid (verbs contract); for UD QPs the `ud` member
        // of the union is the one the caller filled, and its AH is NULL or ours.
        let r = unsafe { send_wr(w) }.and_then(|sw| {
            if q.ibv.qp_type == QpType::Ud.to_ibv() {
                // SAFETY: on a UD QP the caller fills the `ud` member of the union.
                let ud = unsafe { w.wr.ud };
                if ud.ah.is_null() {
                    return Err(libc::EINVAL);
                }
                // SAFETY: a non-NULL AH comes from ibv_create_ah.
                let ah = unsafe { &*(ud.ah as *mut Ah) };
                let dest = UdDest {
                    ah: ah.handle,
                    // The low 24 bits, as rxe puts `wr.ud.remote_qpn` into the BTH.
                    remote_qpn: Qpn::new(ud.remote_qpn),
                    remote_qkey: ud.remote_qkey,
                };
                raw.post_send_ud(q.handle, sw, dest).map_err(verr)
            } else {
                raw.post_send(q.handle, sw).map_err(verr)
            }
        });
        if let Err(e) = r {
            if !bad.is_null() {
                // SAFETY: non-NULL out pointer of the caller.
                unsafe { *bad = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

unsafe fn recv_list(
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
    mut post: impl FnMut(RecvWr) -> Result<(), c_int>,
) -> c_int {
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: each WR of the caller's list is valid until the post returns.
        let w = unsafe { &*cur };
        // SAFETY: its SGE list is valid (verbs contract).
        let r = unsafe { sges(w.sg_list, w.num_sge) }.and_then(|s| post(RecvWr::new(w.wr_id, s)));
        if let Err(e) = r {
            if !bad.is_null() {
                // SAFETY: non-NULL out pointer of the caller.
                unsafe { *bad = cur };
            }
            return e;
        }
        cur = w.next;
    }
    0
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL QP comes from ibv_create_qp.
    let q = unsafe { &*(qp as *mut Qp) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    let raw = cx.raw();
    // SAFETY: the caller's list (checked inside).
    unsafe { recv_list(wr, bad, |w| raw.post_recv(q.handle, w).map_err(verr)) }
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL SRQ comes from ibv_create_srq.
    let q = unsafe { &*(srq as *mut Srq) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    let raw = cx.raw();
    // SAFETY: the caller's list (checked inside).
    unsafe { recv_list(wr, bad, |w| raw.post_srq_recv(q.handle, w).map_err(verr)) }
}

// ---- SRQs and address handles ----

#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || init.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL PD is ours; init is the caller's struct.
    let (p, ia) = unsafe { (&*(pd as *mut Pd), &mut *init) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(p.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return fail(e),
    };
    let attr = SrqAttr {
        max_wr: ia.attr.max_wr,
        max_sge: ia.attr.max_sge,
        srq_limit: ia.attr.srq_limit,
    };
    let raw = cx.raw();
    let h = match raw.create_srq(p.handle, &attr) {
        Ok(h) => h,
        Err(e) => return fail(verr(e)),
    };
    if let Ok(a) = raw.query_srq(h) {
        ia.attr.max_wr = a.max_wr;
        ia.attr.max_sge = a.max_sge;
    }
    let srq = Box::new(Srq {
        ibv: ibv_srq {
            context: p.ibv.context,
            srq_context: ia.srq_context,
            pd,
            handle: h.0,
            mutex: [0; 5],
            cond: [0; 6],
            events_completed: 0,
        },
        handle: h,
    });
    let srq = Box::into_raw(srq);
    register(cx, Kind::Srq, h.0, srq as usize);
    srq as *mut ibv_srq
}

#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL SRQ comes from ibv_create_srq; attr is the caller's struct.
    let (q, a) = unsafe { (&*(srq as *mut Srq), &*attr) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    let Some(mask) = engine::SrqAttrMask::from_bits(mask as u32) else {
        return libc::EINVAL;
    };
    let ea = SrqAttr {
        max_wr: a.max_wr,
        max_sge: a.max_sge,
        srq_limit: a.srq_limit,
    };
    match cx.raw().modify_srq(q.handle, &ea, mask) {
        Ok(()) => 0,
        Err(e) => verr(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL SRQ comes from ibv_create_srq.
    let q = unsafe { &*(srq as *mut Srq) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    match cx.raw().query_srq(q.handle) {
        Ok(a) => {
            // SAFETY: non-NULL caller struct.
            unsafe {
                attr.write(ibv_srq_attr {
                    max_wr: a.max_wr,
                    max_sge: a.max_sge,
                    srq_limit: a.srq_limit,
                })
            };
            0
        }
        Err(e) => verr(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL SRQ comes from ibv_create_srq.
    let q = unsafe { &*(srq as *mut Srq) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    if let Err(e) = cx.raw().destroy_srq(q.handle) {
        return verr(e);
    }
    unregister(cx, Kind::Srq, q.handle.0);
    // SAFETY: made by Box::into_raw in ibv_create_srq; the caller gives it up.
    drop(unsafe { Box::from_raw(srq as *mut Srq) });
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL PD is ours; attr is the caller's struct.
    let (p, a) = unsafe { (&*(pd as *mut Pd), &*attr) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(p.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return fail(e),
    };
    let h = match cx.raw().create_ah(p.handle, &ah_from_c(a)) {
        Ok(h) => h,
        Err(e) => return fail(verr(e)),
    };
    let ah = Box::new(Ah {
        ibv: ibv_ah {
            context: p.ibv.context,
            pd,
            handle: h.0,
        },
        handle: h,
    });
    let ah = Box::into_raw(ah);
    register(cx, Kind::Ah, h.0, ah as usize);
    ah as *mut ibv_ah
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL AH comes from ibv_create_ah.
    let a = unsafe { &*(ah as *mut Ah) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(a.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    if let Err(e) = cx.raw().destroy_ah(a.handle) {
        return verr(e);
    }
    unregister(cx, Kind::Ah, a.handle.0);
    // SAFETY: made by Box::into_raw in ibv_create_ah; the caller gives it up.
    drop(unsafe { Box::from_raw(ah as *mut Ah) });
    0
}

/// `ibv_attach_mcast` / `ibv_detach_mcast`: the QP's device does it (the LID is not used
/// on RoCE).
///
/// # Safety
/// `qp` is NULL or a QP of ours; `gid` NULL or 16 readable bytes.
unsafe fn mcast(qp: *mut ibv_qp, gid: *const [u8; 16], attach: bool) -> c_int {
    if qp.is_null() || gid.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a non-NULL QP comes from ibv_create_qp.
    let q = unsafe { &*(qp as *const Qp) };
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(q.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    // SAFETY: the caller's 16-byte GID (union ibv_gid).
    let gid = engine::Gid(unsafe { *gid });
    let r = if attach {
        cx.raw().attach_mcast(q.handle, gid)
    } else {
        cx.raw().detach_mcast(q.handle, gid)
    };
    match r {
        Ok(()) => 0,
        Err(e) => verr(e),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    gid: *const [u8; 16],
    _lid: u16,
) -> c_int {
    // SAFETY: the caller's QP and GID, checked for NULL.
    unsafe { mcast(qp, gid, true) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    gid: *const [u8; 16],
    _lid: u16,
) -> c_int {
    // SAFETY: as in ibv_attach_mcast.
    unsafe { mcast(qp, gid, false) }
}

symver!(
    ibv_attach_mcast,
    ibv_detach_mcast,
    ibv_rereg_mr,
    ibv_create_srq,
    ibv_destroy_srq,
    ibv_modify_srq,
    ibv_query_srq,
    ibv_create_ah,
    ibv_destroy_ah,
    ibv_alloc_pd,
    ibv_dealloc_pd,
    ibv_reg_mr,
    ibv_reg_mr_iova2,
    ibv_dereg_mr,
    ibv_create_comp_channel,
    ibv_destroy_comp_channel,
    ibv_create_cq,
    ibv_resize_cq,
    ibv_destroy_cq,
    ibv_get_cq_event,
    ibv_ack_cq_events,
    ibv_create_qp,
    ibv_modify_qp,
    ibv_query_qp,
    ibv_destroy_qp,
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dest_qpn_over_24_bits_is_einval_and_ignored_outside_the_mask() {
        let a = ibv_qp_attr {
            dest_qp_num: 0x0100_0011,
            ..ibv_qp_attr::default()
        };
        assert_eq!(
            qp_attr_from_c(&a, QpAttrMask::DEST_QPN).map(|r| r.dest_qp_num),
            Err(libc::EINVAL)
        );
        // Outside the mask the field is not read: a program need not clear it.
        assert!(qp_attr_from_c(&a, QpAttrMask::empty()).is_ok());
        let a = ibv_qp_attr {
            dest_qp_num: 0xff_ffff,
            ..ibv_qp_attr::default()
        };
        assert_eq!(
            qp_attr_from_c(&a, QpAttrMask::DEST_QPN).map(|r| r.dest_qp_num),
            Ok(Qpn::MULTICAST)
        );
        assert_eq!(qp_attr_to_c(&QpAttr::default()).dest_qp_num, 0);
    }
}
