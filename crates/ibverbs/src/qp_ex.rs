//! The extended QP API: `ibv_create_qp_ex` (a `verbs_context` op, reached by the inline
//! function of verbs.h), `ibv_qp_to_qp_ex`, and the `wr_*` calls of `struct ibv_qp_ex`
//! that build work requests one field at a time: `wr_start`, an operation (`wr_send`,
//! `wr_rdma_write`...; each starts a work request with the `wr_id` and `wr_flags` the
//! program set in the struct), its data (`wr_set_sge`, `wr_set_inline_data`...) and address
//! (`wr_set_ud_addr`), then `wr_complete` posts them all (or `wr_abort` drops them). The
//! calls that build return nothing, so a mistake is kept and `wr_complete` reports it.

use core::ffi::{c_int, c_void};

use engine::{
    InlineData, Lkey, QpType, Qpn, Rkey, SendFlags, SendOp, SendPayload, SendWr, Sge, SgeList,
    UdDest,
};

use crate::abi::*;
use crate::device::ctx;
use crate::fail;
use crate::verbs::{create_qp, ctx_ok, mw_bind_of, verr, Ah, Mw, Qp};

/// Work requests being built between `wr_start` and `wr_complete`.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    open: bool,
    wrs: Vec<(SendWr, Option<UdDest>)>,
    /// The first mistake made while building (reported by `wr_complete`).
    error: Option<c_int>,
}

/// `IBV_SEND_INLINE`: the data is copied when the work request is built.
const IBV_SEND_INLINE: u32 = 8;
/// `IBV_QP_INIT_ATTR_PD`, `_CREATE_FLAGS`, `_SEND_OPS_FLAGS`: the extended attributes taken.
const INIT_ATTR_PD: u32 = 1;
const INIT_ATTR_CREATE_FLAGS: u32 = 4;
const INIT_ATTR_SEND_OPS_FLAGS: u32 = 64;
/// `IBV_QP_EX_WITH_*` offered: RDMA write (with immediate), send (with immediate), RDMA
/// read, both atomics, local invalidate, bind MW, send with invalidate (not TSO, not
/// atomic write).
const SEND_OPS_OFFERED: u64 = 0x3ff;
/// `verbs_context.other_b` slot of `create_qp_ex` (@264).
const CREATE_QP_EX_SLOT: usize = 5;

/// The `verbs_context` slots from `ibv_destroy_flow` to `_ABI_placeholder3`, with
/// `create_qp_ex` set.
pub(crate) fn verbs_context_tail() -> [usize; 11] {
    let mut t = [0usize; 11];
    let f: unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp =
        create_qp_ex;
    t[CREATE_QP_EX_SLOT] = f as usize;
    t
}

/// The `ibv_qp_ex` part of a new QP: the `wr_*` calls if `extended`, else all NULL.
pub(crate) fn tail(extended: bool) -> ibv_qp_ex_tail {
    let mut ops = [0usize; 21];
    if extended {
        use qp_ex_op::*;
        type Q = *mut ibv_qp_ex_tail;
        let set = |ops: &mut [usize; 21], i: usize, f: usize| ops[i] = f;
        set(
            &mut ops,
            ATOMIC_CMP_SWP,
            wr_atomic_cmp_swp as unsafe extern "C" fn(Q, u32, u64, u64, u64) as usize,
        );
        set(
            &mut ops,
            ATOMIC_FETCH_ADD,
            wr_atomic_fetch_add as unsafe extern "C" fn(Q, u32, u64, u64) as usize,
        );
        set(
            &mut ops,
            BIND_MW,
            wr_bind_mw as unsafe extern "C" fn(Q, *mut ibv_mw, u32, *const ibv_mw_bind_info)
                as usize,
        );
        set(
            &mut ops,
            LOCAL_INV,
            wr_local_inv as unsafe extern "C" fn(Q, u32) as usize,
        );
        set(
            &mut ops,
            RDMA_READ,
            wr_rdma_read as unsafe extern "C" fn(Q, u32, u64) as usize,
        );
        set(
            &mut ops,
            RDMA_WRITE,
            wr_rdma_write as unsafe extern "C" fn(Q, u32, u64) as usize,
        );
        set(
            &mut ops,
            RDMA_WRITE_IMM,
            wr_rdma_write_imm as unsafe extern "C" fn(Q, u32, u64, u32) as usize,
        );
        set(&mut ops, SEND, wr_send as unsafe extern "C" fn(Q) as usize);
        set(
            &mut ops,
            SEND_IMM,
            wr_send_imm as unsafe extern "C" fn(Q, u32) as usize,
        );
        set(
            &mut ops,
            SEND_INV,
            wr_send_inv as unsafe extern "C" fn(Q, u32) as usize,
        );
        set(
            &mut ops,
            SEND_TSO,
            wr_unsupported as unsafe extern "C" fn(Q) as usize,
        );
        set(
            &mut ops,
            SET_UD_ADDR,
            wr_set_ud_addr as unsafe extern "C" fn(Q, *mut ibv_ah, u32, u32) as usize,
        );
        set(
            &mut ops,
            SET_XRC_SRQN,
            wr_unsupported as unsafe extern "C" fn(Q) as usize,
        );
        set(
            &mut ops,
            SET_INLINE_DATA,
            wr_set_inline_data as unsafe extern "C" fn(Q, *mut c_void, usize) as usize,
        );
        set(
            &mut ops,
            SET_INLINE_DATA_LIST,
            wr_set_inline_data_list as unsafe extern "C" fn(Q, usize, *const ibv_data_buf) as usize,
        );
        set(
            &mut ops,
            SET_SGE,
            wr_set_sge as unsafe extern "C" fn(Q, u32, u64, u32) as usize,
        );
        set(
            &mut ops,
            SET_SGE_LIST,
            wr_set_sge_list as unsafe extern "C" fn(Q, usize, *const ibv_sge) as usize,
        );
        set(
            &mut ops,
            START,
            wr_start as unsafe extern "C" fn(Q) as usize,
        );
        set(
            &mut ops,
            COMPLETE,
            wr_complete as unsafe extern "C" fn(Q) -> c_int as usize,
        );
        set(
            &mut ops,
            ABORT,
            wr_abort as unsafe extern "C" fn(Q) as usize,
        );
        set(
            &mut ops,
            ATOMIC_WRITE,
            wr_unsupported as unsafe extern "C" fn(Q) as usize,
        );
    }
    ibv_qp_ex_tail {
        comp_mask: 0,
        wr_id: 0,
        wr_flags: 0,
        ops,
    }
}

/// `verbs_context.create_qp_ex`: an RC, UC or UD QP in a PD, with the extended post API.
unsafe extern "C" fn create_qp_ex(
    c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    // SAFETY: see `ctx`.
    if unsafe { ctx(c) }.is_none() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: the caller's struct.
    let a = unsafe { &mut *attr };
    let known = INIT_ATTR_PD | INIT_ATTR_CREATE_FLAGS | INIT_ATTR_SEND_OPS_FLAGS;
    if a.comp_mask & INIT_ATTR_PD == 0 || a.pd.is_null() {
        return fail(libc::EINVAL);
    }
    // XRC domains, RSS, TSO, creation flags, and operations we cannot post.
    if a.comp_mask & !known != 0
        || (a.comp_mask & INIT_ATTR_CREATE_FLAGS != 0 && a.create_flags != 0)
        || (a.comp_mask & INIT_ATTR_SEND_OPS_FLAGS != 0
            && a.send_ops_flags & !SEND_OPS_OFFERED != 0)
    {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: a non-NULL PD is ours; its context must be this one.
    if unsafe { (*a.pd).context } != c {
        return fail(libc::EINVAL);
    }
    let mut ia = ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    };
    if ia.send_cq.is_null() || ia.recv_cq.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: a non-NULL PD of ours.
    let qp = unsafe { create_qp(a.pd, &mut ia, true) };
    if !qp.is_null() {
        a.cap = ia.cap;
    }
    qp
}

/// `ibv_qp_to_qp_ex`: the extended view of a QP made by `ibv_create_qp_ex` (NULL with
/// `EOPNOTSUPP` for one made by `ibv_create_qp`).
#[no_mangle]
pub unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut c_void {
    if qp.is_null() {
        return fail(libc::EOPNOTSUPP);
    }
    // SAFETY: a non-NULL QP comes from ibv_create_qp(_ex): a Box<Qp> starting with it.
    if unsafe { &*(qp as *mut Qp) }.extended {
        qp.cast()
    } else {
        fail(libc::EOPNOTSUPP)
    }
}

/// The QP behind a `struct ibv_qp_ex *` (its address).
///
/// # Safety
/// `q` is NULL or the extended view of a QP of ours.
unsafe fn qp_of<'a>(q: *mut ibv_qp_ex_tail) -> Option<&'a Qp> {
    if q.is_null() {
        return None;
    }
    // SAFETY: the extended view is the QP's own address (ibv_qp_to_qp_ex).
    let qp = unsafe { &*(q as *mut Qp) };
    qp.extended.then_some(qp)
}

/// Run `f` on the QP's batch, if `q` is one of ours.
///
/// # Safety
/// As [`qp_of`].
unsafe fn with_batch(q: *mut ibv_qp_ex_tail, f: impl FnOnce(&Qp, &mut Batch)) {
    // SAFETY: forwarded.
    if let Some(qp) = unsafe { qp_of(q) } {
        let mut b = qp.batch.lock().unwrap_or_else(|p| p.into_inner());
        f(qp, &mut b);
    }
}

impl Batch {
    fn fail(&mut self, e: c_int) {
        self.error.get_or_insert(e);
    }

    /// A new work request of operation `op`, with the `wr_id` and flags the program set.
    fn begin(&mut self, qp: &Qp, op: SendOp) {
        if !self.open {
            self.fail(libc::EINVAL);
            return;
        }
        let mut flags = SendFlags::from_bits_truncate(qp.ex.wr_flags & 0x7);
        if qp.ex.wr_flags & IBV_SEND_INLINE != 0 {
            flags |= SendFlags::INLINE;
        }
        let wr = SendWr {
            wr_id: qp.ex.wr_id,
            op,
            payload: SendPayload::Sges(SgeList::new()),
            flags,
        };
        self.wrs.push((wr, None));
    }

    /// The work request being built (the last begun).
    fn current(&mut self) -> Option<&mut (SendWr, Option<UdDest>)> {
        if !self.open {
            return None;
        }
        self.wrs.last_mut()
    }

    /// Whether the work request being built was started with `IBV_SEND_INLINE`.
    fn current_inline(&mut self) -> bool {
        self.current()
            .is_some_and(|(wr, _)| wr.flags.contains(SendFlags::INLINE))
    }

    /// Its data as `sges` say: by reference, or copied now for an inline send (the
    /// addresses are then the caller's readable memory, no key involved).
    ///
    /// # Safety
    /// For an inline send, each SGE names readable memory.
    unsafe fn set_sges(&mut self, sges: SgeList) {
        if !self.current_inline() {
            self.set_payload(SendPayload::Sges(sges));
            return;
        }
        let mut data = InlineData::new();
        for g in &sges {
            let addr = g.addr as usize as *const c_void;
            // SAFETY: the caller's contract.
            if let Err(e) = unsafe { copy_in(addr, g.length as usize, &mut data) } {
                self.fail(e);
                return;
            }
        }
        self.set_payload(SendPayload::Inline(data));
    }

    fn set_payload(&mut self, payload: SendPayload) {
        match self.current() {
            Some((wr, _)) => {
                if matches!(payload, SendPayload::Inline(_)) {
                    wr.flags |= SendFlags::INLINE;
                }
                wr.payload = payload;
            }
            None => self.fail(libc::EINVAL),
        }
    }
}

/// Start an operation on the batch of `q`.
///
/// # Safety
/// As [`qp_of`].
unsafe fn begin(q: *mut ibv_qp_ex_tail, op: SendOp) {
    // SAFETY: forwarded.
    unsafe { with_batch(q, |qp, b| b.begin(qp, op)) }
}

unsafe extern "C" fn wr_start(q: *mut ibv_qp_ex_tail) {
    // SAFETY: the program's extended QP.
    unsafe {
        with_batch(q, |_, b| {
            *b = Batch {
                open: true,
                ..Batch::default()
            }
        })
    }
}

unsafe extern "C" fn wr_abort(q: *mut ibv_qp_ex_tail) {
    // SAFETY: the program's extended QP.
    unsafe { with_batch(q, |_, b| *b = Batch::default()) }
}

unsafe extern "C" fn wr_complete(q: *mut ibv_qp_ex_tail) -> c_int {
    // SAFETY: the program's extended QP.
    let Some(qp) = (unsafe { qp_of(q) }) else {
        return libc::EINVAL;
    };
    let batch = std::mem::take(&mut *qp.batch.lock().unwrap_or_else(|p| p.into_inner()));
    if !batch.open {
        return libc::EINVAL;
    }
    if let Some(e) = batch.error {
        return e;
    }
    // SAFETY: its context is ours.
    let cx = match unsafe { ctx_ok(qp.ibv.context) } {
        Ok(cx) => cx,
        Err(e) => return e,
    };
    let raw = cx.raw();
    let ud = qp.ibv.qp_type == QpType::Ud.to_ibv();
    for (wr, dest) in batch.wrs {
        let r = match (ud, dest) {
            (true, Some(d)) => raw.post_send_ud(qp.handle, wr, d),
            (true, None) => return libc::EINVAL,
            (false, _) => raw.post_send(qp.handle, wr),
        };
        if let Err(e) = r {
            return verr(e);
        }
    }
    0
}

unsafe extern "C" fn wr_send(q: *mut ibv_qp_ex_tail) {
    // SAFETY: the program's extended QP.
    unsafe { begin(q, SendOp::Send) }
}

unsafe extern "C" fn wr_send_imm(q: *mut ibv_qp_ex_tail, imm: u32) {
    let imm = u32::from_be(imm);
    // SAFETY: the program's extended QP.
    unsafe { begin(q, SendOp::SendWithImm { imm }) }
}

unsafe extern "C" fn wr_send_inv(q: *mut ibv_qp_ex_tail, rkey: u32) {
    // SAFETY: the program's extended QP.
    unsafe {
        begin(
            q,
            SendOp::SendWithInv {
                rkey: Rkey::new(rkey),
            },
        )
    }
}

unsafe extern "C" fn wr_local_inv(q: *mut ibv_qp_ex_tail, rkey: u32) {
    // SAFETY: the program's extended QP.
    unsafe {
        begin(
            q,
            SendOp::LocalInv {
                rkey: Rkey::new(rkey),
            },
        )
    }
}

unsafe extern "C" fn wr_rdma_write(q: *mut ibv_qp_ex_tail, rkey: u32, remote_addr: u64) {
    // SAFETY: the program's extended QP.
    unsafe {
        begin(
            q,
            SendOp::RdmaWrite {
                remote_addr,
                rkey: Rkey::new(rkey),
            },
        )
    }
}

unsafe extern "C" fn wr_rdma_write_imm(
    q: *mut ibv_qp_ex_tail,
    rkey: u32,
    remote_addr: u64,
    imm: u32,
) {
    let imm = u32::from_be(imm);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr,
        rkey: Rkey::new(rkey),
        imm,
    };
    // SAFETY: the program's extended QP.
    unsafe { begin(q, op) }
}

unsafe extern "C" fn wr_rdma_read(q: *mut ibv_qp_ex_tail, rkey: u32, remote_addr: u64) {
    // SAFETY: the program's extended QP.
    unsafe {
        begin(
            q,
            SendOp::RdmaRead {
                remote_addr,
                rkey: Rkey::new(rkey),
            },
        )
    }
}

unsafe extern "C" fn wr_atomic_cmp_swp(
    q: *mut ibv_qp_ex_tail,
    rkey: u32,
    remote_addr: u64,
    compare: u64,
    swap: u64,
) {
    let op = SendOp::AtomicCmpSwap {
        remote_addr,
        rkey: Rkey::new(rkey),
        compare,
        swap,
    };
    // SAFETY: the program's extended QP.
    unsafe { begin(q, op) }
}

unsafe extern "C" fn wr_atomic_fetch_add(
    q: *mut ibv_qp_ex_tail,
    rkey: u32,
    remote_addr: u64,
    add: u64,
) {
    let op = SendOp::AtomicFetchAdd {
        remote_addr,
        rkey: Rkey::new(rkey),
        add,
    };
    // SAFETY: the program's extended QP.
    unsafe { begin(q, op) }
}

unsafe extern "C" fn wr_bind_mw(
    q: *mut ibv_qp_ex_tail,
    mw: *mut ibv_mw,
    rkey: u32,
    info: *const ibv_mw_bind_info,
) {
    // SAFETY: the program's extended QP; a non-NULL window comes from ibv_alloc_mw and the
    // bind info is the caller's (its region NULL or from ibv_reg_mr).
    unsafe {
        with_batch(q, |qp, b| {
            if mw.is_null() || info.is_null() {
                b.fail(libc::EINVAL);
                return;
            }
            match mw_bind_of(&*info) {
                Ok(bind) => {
                    let mw = (*(mw as *mut Mw)).handle;
                    b.begin(
                        qp,
                        SendOp::BindMw {
                            mw,
                            rkey: Rkey::new(rkey),
                            bind,
                        },
                    );
                }
                Err(e) => b.fail(e),
            }
        })
    }
}

/// TSO, XRC and atomic write: not offered (creating a QP for them already fails).
unsafe extern "C" fn wr_unsupported(q: *mut ibv_qp_ex_tail) {
    // SAFETY: the program's extended QP.
    unsafe { with_batch(q, |_, b| b.fail(libc::EOPNOTSUPP)) }
}

unsafe extern "C" fn wr_set_sge(q: *mut ibv_qp_ex_tail, lkey: u32, addr: u64, length: u32) {
    let sges = SgeList::from_slice(&[Sge::new(addr, length, Lkey::new(lkey))]);
    // SAFETY: the program's extended QP; inline data is its readable memory.
    unsafe { with_batch(q, |_, b| b.set_sges(sges)) }
}

unsafe extern "C" fn wr_set_sge_list(q: *mut ibv_qp_ex_tail, n: usize, list: *const ibv_sge) {
    // SAFETY: the program's extended QP; `list` holds `n` SGEs (verbs contract).
    unsafe {
        with_batch(q, |_, b| {
            if n > 0 && list.is_null() {
                b.fail(libc::EINVAL);
                return;
            }
            let s = if n == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(list, n)
            };
            let sges = s
                .iter()
                .map(|e| Sge::new(e.addr, e.length, Lkey::new(e.lkey)))
                .collect();
            b.set_sges(sges);
        })
    }
}

/// Copy `len` bytes at `addr` (the caller's readable memory).
///
/// # Safety
/// `addr` is readable for `len` bytes when `len > 0`.
unsafe fn copy_in(addr: *const c_void, len: usize, out: &mut InlineData) -> Result<(), c_int> {
    if len == 0 {
        return Ok(());
    }
    if addr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's contract.
    out.extend_from_slice(unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) });
    Ok(())
}

unsafe extern "C" fn wr_set_inline_data(q: *mut ibv_qp_ex_tail, addr: *mut c_void, len: usize) {
    // SAFETY: the program's extended QP; inline data is the caller's readable memory.
    unsafe {
        with_batch(q, |_, b| {
            let mut data = InlineData::new();
            match copy_in(addr, len, &mut data) {
                Ok(()) => b.set_payload(SendPayload::Inline(data)),
                Err(e) => b.fail(e),
            }
        })
    }
}

unsafe extern "C" fn wr_set_inline_data_list(
    q: *mut ibv_qp_ex_tail,
    n: usize,
    list: *const ibv_data_buf,
) {
    // SAFETY: the program's extended QP; `list` holds `n` buffers of readable memory.
    unsafe {
        with_batch(q, |_, b| {
            if n > 0 && list.is_null() {
                b.fail(libc::EINVAL);
                return;
            }
            let bufs = if n == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(list, n)
            };
            let mut data = InlineData::new();
            for d in bufs {
                if let Err(e) = copy_in(d.addr, d.length, &mut data) {
                    b.fail(e);
                    return;
                }
            }
            b.set_payload(SendPayload::Inline(data));
        })
    }
}

unsafe extern "C" fn wr_set_ud_addr(
    q: *mut ibv_qp_ex_tail,
    ah: *mut ibv_ah,
    remote_qpn: u32,
    remote_qkey: u32,
) {
    // SAFETY: the program's extended QP; a non-NULL AH comes from ibv_create_ah.
    unsafe {
        with_batch(q, |_, b| {
            if ah.is_null() {
                b.fail(libc::EINVAL);
                return;
            }
            let dest = UdDest {
                ah: (*(ah as *mut Ah)).handle,
                // The low 24 bits, as for `ibv_post_send` (and rxe).
                remote_qpn: Qpn::new(remote_qpn),
                remote_qkey,
            };
            match b.current() {
                Some((_, d)) => *d = Some(dest),
                None => b.fail(libc::EINVAL),
            }
        })
    }
}

symver!(ibv_qp_to_qp_ex);
