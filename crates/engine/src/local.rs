//! Work requests the HCA executes without sending a packet (memory window binds, local
//! invalidations), and the send-queue error of the unreliable services.
//!
//! A local operation runs once it reaches the head of the send queue, i.e. after every
//! earlier WR of the QP has completed: the strongest ordering IBA 10.8.3 allows, so a bind
//! is never visible before the messages posted ahead of it.

use crate::counters::Counter;
use crate::cq::WorkCompletion;
use crate::memory::Memory;
use crate::mw;
use crate::qp::{Qp, SendWqe};
use crate::qp_attr::{QpState, QpType};
use crate::wr::SendOp;
use crate::{comp, Ctx, WcStatus};

/// Whether `op` executes inside the HCA.
pub(crate) fn is_local(op: &SendOp) -> bool {
    matches!(op, SendOp::BindMw { .. } | SendOp::LocalInv { .. })
}

/// Run the local operations at the head of the send queue. Returns whether the requester
/// may go on to the WQE at `req.cur` (false while a local operation waits for earlier WRs,
/// or after one failed).
pub(crate) fn run_head<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) -> bool {
    loop {
        let idx = qp.req.cur;
        let Some(w) = qp.sq.get(idx) else {
            return true;
        };
        if !is_local(&w.op) {
            return true;
        }
        if idx != 0 || !qp.state().starts_new_requests() {
            return false;
        }
        let Some(w) = qp.sq.pop_front() else {
            return true;
        };
        qp.req.cur_pkt = 0;
        match execute(qp, ctx, &w) {
            Ok(()) => {
                if w.signaled {
                    let wc =
                        WorkCompletion::new(w.wr_id, WcStatus::Success, w.op.wc_opcode(), qp.qpn);
                    let cq = qp.send_cq;
                    ctx.push_cqe(qp, cq, wc);
                }
            }
            Err(status) => {
                ctx.count(qp, Counter::ReqLocalError);
                fail_send(qp, ctx, &w, status);
                return false;
            }
        }
    }
}

fn execute<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    w: &SendWqe,
) -> Result<(), WcStatus> {
    match w.op {
        SendOp::BindMw { mw, rkey, bind } => {
            mw::bind(ctx.mrs, ctx.mws, qp.pd, qp.qpn, mw, rkey.value(), &bind)
                .map_err(|()| WcStatus::MwBindErr)
        }
        // IBA 10.6.7.2.2 / 10.8.2.2: LOCAL_INV of a key this QP may not invalidate is a
        // memory management operation error (`IBV_WC_MW_BIND_ERR` in verbs).
        SendOp::LocalInv { rkey } => mw::invalidate(ctx.mrs, ctx.mws, qp.pd, None, rkey.value())
            .map_err(|()| WcStatus::MwBindErr),
        _ => Ok(()),
    }
}

/// A send WR that was already removed from the queue failed: complete it with `status` and
/// stop the send queue. RC goes to ERR (IBA 10.3.1); UC and UD go to SQE, where the receive
/// side keeps working (IBA 10.3.1 Send Queue Error state): the other send WRs are flushed.
pub(crate) fn fail_send<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    w: &SendWqe,
    status: WcStatus,
) {
    let mut wc = WorkCompletion::new(w.wr_id, status, w.op.wc_opcode(), qp.qpn);
    wc.byte_len = w.len as u32;
    let cq = qp.send_cq;
    ctx.push_cqe(qp, cq, wc);
    if qp.qp_type == QpType::Rc {
        comp::enter_error(qp, ctx);
        return;
    }
    ctx.count(qp, Counter::QpErrors);
    qp.attr.qp_state = QpState::Sqe;
    qp.attr.cur_qp_state = QpState::Sqe;
    while let Some(w) = qp.sq.pop_front() {
        comp::flush_one(qp, ctx, &w);
    }
    qp.ext.ud_dests.clear();
    qp.req.cur = 0;
    qp.req.cur_pkt = 0;
}

/// Complete the WQE at the head of the send queue of a UC / UD QP once its last packet left
/// (IBA 9.8: no acknowledgement will come).
pub(crate) fn complete_sent<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    let Some(w) = qp.sq.pop_front() else { return };
    if qp.qp_type == QpType::Ud {
        qp.ext.ud_dests.pop_front();
    }
    qp.req.cur = 0;
    qp.req.cur_pkt = 0;
    if w.signaled {
        let mut wc = WorkCompletion::new(w.wr_id, WcStatus::Success, w.op.wc_opcode(), qp.qpn);
        wc.byte_len = w.len as u32;
        let cq = qp.send_cq;
        ctx.push_cqe(qp, cq, wc);
    }
    // In SQD the queue has drained once the started message is out (IBA 10.3.1).
    comp::check_drained(qp, ctx);
}
