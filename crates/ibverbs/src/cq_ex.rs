//! Extended CQs: `ibv_create_cq_ex` (a `verbs_context` op, reached by the inline function of
//! verbs.h) and the polling calls of `struct ibv_cq_ex`: `start_poll` takes the first
//! completion (`ENOENT` when there is none), `next_poll` the following ones, `end_poll` ends
//! the session; between them the completion's status and `wr_id` are in the struct and the
//! `read_*` calls give its other fields. The CQ stays an ordinary one for `ibv_poll_cq`, its
//! completion channel and `ibv_destroy_cq`.

use core::ffi::{c_int, c_void};

use engine::WorkCompletion;

use crate::abi::*;
use crate::fail;
use crate::verbs::{create_cq, imm_of, verr, Cq};

/// `IBV_WC_STANDARD_FLAGS`: byte length, immediate, QP number, source QP, SLID, SL, DLID
/// path bits; every field a completion of ours has (no timestamps, VLAN, flow tag, TM).
const WC_FLAGS_OFFERED: u64 = 0x7f;
/// `IBV_CQ_INIT_ATTR_MASK_FLAGS`: `flags` is valid.
const INIT_ATTR_MASK_FLAGS: u32 = 1;
/// `IBV_CREATE_CQ_ATTR_SINGLE_THREADED`: a promise we need not use.
const ATTR_SINGLE_THREADED: u32 = 1;
/// `verbs_context.other_a` slot of `create_cq_ex` (@200).
const CREATE_CQ_EX_SLOT: usize = 24;

/// The `verbs_context` slots from `advise_mr` to `priv`, with `create_cq_ex` set.
pub(crate) fn verbs_context_head() -> [usize; 26] {
    let mut t = [0usize; 26];
    let f: unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq =
        create_cq_ex;
    t[CREATE_CQ_EX_SLOT] = f as usize;
    t
}

/// The `ibv_cq_ex` part of a new CQ: the polling calls if `extended`, else all NULL.
pub(crate) fn tail(extended: bool) -> ibv_cq_ex_tail {
    let mut ops = [0usize; 18];
    if extended {
        use cq_ex_op::*;
        type C = *mut ibv_cq;
        ops[START_POLL] = start_poll as unsafe extern "C" fn(C, *mut c_void) -> c_int as usize;
        ops[NEXT_POLL] = next_poll as unsafe extern "C" fn(C) -> c_int as usize;
        ops[END_POLL] = end_poll as unsafe extern "C" fn(C) as usize;
        ops[READ_OPCODE] = read_opcode as unsafe extern "C" fn(C) -> u32 as usize;
        ops[READ_VENDOR_ERR] = read_vendor_err as unsafe extern "C" fn(C) -> u32 as usize;
        ops[READ_BYTE_LEN] = read_byte_len as unsafe extern "C" fn(C) -> u32 as usize;
        ops[READ_IMM_DATA] = read_imm_data as unsafe extern "C" fn(C) -> u32 as usize;
        ops[READ_QP_NUM] = read_qp_num as unsafe extern "C" fn(C) -> u32 as usize;
        ops[READ_SRC_QP] = read_src_qp as unsafe extern "C" fn(C) -> u32 as usize;
        ops[READ_WC_FLAGS] = read_wc_flags as unsafe extern "C" fn(C) -> u32 as usize;
        ops[READ_SLID] = read_zero_u32 as unsafe extern "C" fn(C) -> u32 as usize;
        ops[READ_SL] = read_sl as unsafe extern "C" fn(C) -> u8 as usize;
        ops[READ_DLID_PATH_BITS] = read_zero_u8 as unsafe extern "C" fn(C) -> u8 as usize;
    }
    ibv_cq_ex_tail {
        comp_mask: 0,
        status: 0,
        wr_id: 0,
        ops,
    }
}

/// `verbs_context.create_cq_ex`.
unsafe extern "C" fn create_cq_ex(
    c: *mut ibv_context,
    attr: *mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq {
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's struct.
    let a = unsafe { &*attr };
    let flags = if a.comp_mask & INIT_ATTR_MASK_FLAGS != 0 {
        a.flags
    } else {
        0
    };
    // Timestamps, VLANs, flow tags, ignoring overruns, parent domains: not offered.
    if a.wc_flags & !WC_FLAGS_OFFERED != 0
        || a.comp_mask & !INIT_ATTR_MASK_FLAGS != 0
        || flags & !ATTR_SINGLE_THREADED != 0
    {
        return fail(libc::EOPNOTSUPP);
    }
    let (Ok(cqe), Ok(vector)) = (c_int::try_from(a.cqe), c_int::try_from(a.comp_vector)) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: create_cq checks the context and the sizes; the channel is NULL or ours.
    unsafe { create_cq(c, cqe, a.cq_context, a.channel, vector, true) }
}

/// The CQ behind a `struct ibv_cq_ex *` (its address), if it was made extended.
///
/// # Safety
/// `c` is NULL or an extended CQ of ours.
unsafe fn cq_of<'a>(c: *mut ibv_cq) -> Option<&'a mut Cq> {
    if c.is_null() {
        return None;
    }
    // SAFETY: the caller's contract: a Box<Cq> whose first field is the C struct.
    let cq = unsafe { &mut *(c as *mut Cq) };
    (cq.ex.ops[cq_ex_op::START_POLL] != 0).then_some(cq)
}

/// Take the next completion into the CQ's current one: 0, `ENOENT` when there is none.
fn advance(cq: &mut Cq) -> c_int {
    // SAFETY: the CQ's context is ours (it was made on it).
    let cx = match unsafe { crate::verbs::ctx_ok(cq.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    let next = match cx.raw().poll_cq(&cq.raw, 1) {
        Ok(mut v) => v.pop(),
        Err(e) => return verr(e),
    };
    let found = next.is_some();
    if let Some(w) = &next {
        cq.ex.status = w.status.to_ibv();
        cq.ex.wr_id = w.wr_id;
    }
    *cq.current.lock().unwrap_or_else(|p| p.into_inner()) = next;
    if found {
        0
    } else {
        libc::ENOENT
    }
}

unsafe extern "C" fn start_poll(c: *mut ibv_cq, _attr: *mut c_void) -> c_int {
    // SAFETY: the program's extended CQ.
    match unsafe { cq_of(c) } {
        Some(cq) => advance(cq),
        None => libc::EINVAL,
    }
}

unsafe extern "C" fn next_poll(c: *mut ibv_cq) -> c_int {
    // SAFETY: the program's extended CQ.
    match unsafe { cq_of(c) } {
        Some(cq) => advance(cq),
        None => libc::EINVAL,
    }
}

unsafe extern "C" fn end_poll(c: *mut ibv_cq) {
    // SAFETY: the program's extended CQ.
    if let Some(cq) = unsafe { cq_of(c) } {
        *cq.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// `f` of the current completion (0 when there is none: a program reading outside a poll
/// session).
///
/// # Safety
/// As [`cq_of`].
unsafe fn read<T: Default>(c: *mut ibv_cq, f: impl FnOnce(&WorkCompletion) -> T) -> T {
    // SAFETY: forwarded.
    match unsafe { cq_of(c) } {
        Some(cq) => cq
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(f)
            .unwrap_or_default(),
        None => T::default(),
    }
}

unsafe extern "C" fn read_opcode(c: *mut ibv_cq) -> u32 {
    // SAFETY: the program's extended CQ.
    unsafe { read(c, |w| w.opcode.to_ibv()) }
}

unsafe extern "C" fn read_vendor_err(c: *mut ibv_cq) -> u32 {
    // SAFETY: the program's extended CQ.
    unsafe { read(c, |w| w.vendor_err) }
}

unsafe extern "C" fn read_byte_len(c: *mut ibv_cq) -> u32 {
    // SAFETY: the program's extended CQ.
    unsafe { read(c, |w| w.byte_len) }
}

unsafe extern "C" fn read_imm_data(c: *mut ibv_cq) -> u32 {
    // SAFETY: the program's extended CQ.
    unsafe { read(c, imm_of) }
}

unsafe extern "C" fn read_qp_num(c: *mut ibv_cq) -> u32 {
    // SAFETY: the program's extended CQ.
    unsafe { read(c, |w| w.qp_num.value()) }
}

unsafe extern "C" fn read_src_qp(c: *mut ibv_cq) -> u32 {
    // SAFETY: the program's extended CQ.
    unsafe { read(c, |w| w.src_qp.value()) }
}

unsafe extern "C" fn read_wc_flags(c: *mut ibv_cq) -> u32 {
    // SAFETY: the program's extended CQ.
    unsafe { read(c, |w| w.wc_flags.bits()) }
}

/// SLID: RoCE has no LIDs.
unsafe extern "C" fn read_zero_u32(_c: *mut ibv_cq) -> u32 {
    0
}

unsafe extern "C" fn read_sl(c: *mut ibv_cq) -> u8 {
    // SAFETY: the program's extended CQ.
    unsafe { read(c, crate::verbs::sl_of) }
}

/// DLID path bits: RoCE has none.
unsafe extern "C" fn read_zero_u8(_c: *mut ibv_cq) -> u8 {
    0
}
