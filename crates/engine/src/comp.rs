//! The completer: turns ACKs, NAKs, RNR NAKs, RDMA READ responses and ATOMIC ACKs into
//! completions, in posting order (IBA 9.7.5.1); runs the local ACK timer and the RNR timer;
//! decides go-back-N retransmissions; and moves the QP to ERR with every remaining WR
//! flushed when an error ends its life.

use wire::{NakCode, OpKind, Psn, RoceV2Packet, Syndrome};

use crate::counters::Counter;
use crate::cq::{WcOpcode, WorkCompletion};
use crate::memory::Memory;
use crate::qp::{ack_timeout, rnr_timer, Qp, SendWqe};
use crate::qp_attr::QpState;
use crate::time::Instant;
use crate::wr::SendOp;
use crate::{Ctx, WcStatus};

/// Complete one send WQE that never ran, with WR_FLUSH_ERR.
pub(crate) fn flush_one<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, wqe: &SendWqe) {
    let wc = WorkCompletion::new(wqe.wr_id, WcStatus::WrFlushErr, wqe.op.wc_opcode(), qp.qpn);
    ctx.count(qp, Counter::WrFlushed);
    let cq = qp.send_cq;
    ctx.push_cqe(qp, cq, wc);
}

/// Move the QP to ERR: every send and receive WR still queued completes with WR_FLUSH_ERR,
/// in order (IBA 10.3.1 Error state, 11.4.2.2).
pub(crate) fn enter_error<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    if qp.attr.qp_state != QpState::Err {
        ctx.count(qp, Counter::QpErrors);
        crate::srq::entered_error(qp, ctx);
    }
    qp.attr.qp_state = QpState::Err;
    qp.attr.cur_qp_state = QpState::Err;
    while let Some(w) = qp.sq.pop_front() {
        flush_one(qp, ctx, &w);
    }
    while let Some(r) = qp.rq.pop_front() {
        let wc = WorkCompletion::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qp.qpn);
        ctx.count(qp, Counter::WrFlushed);
        let cq = qp.recv_cq;
        ctx.push_cqe(qp, cq, wc);
    }
    qp.req.cur = 0;
    qp.req.cur_pkt = 0;
    qp.req.ack_deadline = None;
    qp.req.rnr_until = None;
    qp.req.rd_atomic_outstanding = 0;
    crate::resp::on_error(qp);
    qp.resp.in_progress = None;
}

/// Pop the oldest WQE and produce its completion (always for errors, else if signaled).
fn complete_front<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, status: WcStatus) {
    // What the completion needs, read in place: the WQE itself is dropped, not moved out.
    let Some(w) = qp.sq.front() else { return };
    let (wr_id, op, started, signaled, len) = (w.wr_id, w.op, w.started, w.signaled, w.len);
    qp.sq.pop_front();
    if qp.req.cur > 0 {
        qp.req.cur -= 1;
    } else {
        qp.req.cur_pkt = 0;
    }
    if started && op.is_read_or_atomic() {
        qp.req.rd_atomic_outstanding = qp.req.rd_atomic_outstanding.saturating_sub(1);
    }
    if signaled || status != WcStatus::Success {
        let mut wc = WorkCompletion::new(wr_id, status, op.wc_opcode(), qp.qpn);
        wc.byte_len = len as u32;
        let cq = qp.send_cq;
        ctx.push_cqe(qp, cq, wc);
    }
    check_drained(qp, ctx);
}

/// In SQD, the send queue has drained once no started message is left (IBA 10.3.1 SQD:
/// then the SQ Drained event, if asked for, and modify may leave SQD).
pub(crate) fn check_drained<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    if qp.attr.qp_state == QpState::Sqd
        && qp.attr.sq_draining
        && !qp.sq.front().is_some_and(|w| w.started)
    {
        qp.attr.sq_draining = false;
        if qp.attr.en_sqd_async_notify {
            ctx.events.push_back(crate::AsyncEvent::SqDrained {
                qpn: crate::Qpn::new(qp.qpn),
            });
        }
    }
}

/// The oldest WQE failed: it completes with `status`, and the QP goes to ERR.
fn fail_front<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, status: WcStatus) {
    complete_front(qp, ctx, status);
    enter_error(qp, ctx);
}

/// Complete what can complete without the network: a WQE that failed its local checks, once
/// every WQE before it has completed (completions stay in posting order).
pub(crate) fn complete_ready<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    if let Some(status) = qp.sq.front().and_then(|w| w.local_error) {
        fail_front(qp, ctx, status);
    }
}

/// Start the local ACK timer if packets are outstanding and it is not running.
pub(crate) fn arm_ack_timer(qp: &mut Qp, now: Instant) {
    if qp.req.ack_deadline.is_none() && qp.req.una.is_before(qp.req.sent_hw) {
        qp.req.ack_deadline = ack_timeout(qp.attr.timeout).map(|d| now + d);
    }
}

/// Put the requester at `psn`: the WQE holding it and the packet within.
fn reposition(qp: &mut Qp, psn: Psn) {
    // Never before the oldest unacknowledged PSN: what precedes it is complete (and its WQEs
    // may be gone), and going back there would skip unsent packets of the current WQE.
    let psn = if psn.is_before(qp.req.una) {
        qp.req.una
    } else {
        psn
    };
    for (i, w) in qp.sq.iter().enumerate() {
        if !w.started {
            break;
        }
        if !psn.is_before(w.first_psn) && !psn.is_after(w.last_psn) {
            qp.req.cur = i;
            qp.req.cur_pkt = psn.distance_from(w.first_psn) as u32;
            qp.req.next_psn = psn;
            return;
        }
    }
    qp.req.cur = qp.sq.iter().position(|w| !w.started).unwrap_or(qp.sq.len());
    qp.req.cur_pkt = 0;
    qp.req.next_psn = qp.req.psn_hw;
}

/// Everything before `new_una` is acknowledged: forward progress resets the retry counters
/// and the local ACK timer (IBA 9.7.6.1.3).
fn progress<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, new_una: Psn) {
    if !new_una.is_after(qp.req.una) {
        return;
    }
    qp.req.una = new_una;
    if qp.req.rnr_until.is_some() && new_una.is_after(qp.req.rnr_psn) {
        // The RNR-NAKed packet was accepted after all (a late or reordered ACK): no reason
        // to wait any longer.
        qp.req.rnr_until = None;
    }
    qp.req.retry_left = qp.attr.retry_cnt;
    qp.req.rnr_retry_left = qp.attr.rnr_retry;
    qp.req.last_rewind = None;
    qp.req.ack_deadline = None;
    arm_ack_timer(qp, ctx.now);
    if qp.req.next_psn.is_before(new_una) {
        reposition(qp, new_una);
    }
}

/// Go back to `psn` and send everything from there again (go-back-N). Only local ACK
/// timeouts consume a retry (IBA 9.7.6.1.3); when none is left the oldest WR fails with
/// RETRY_EXC_ERR. A sequence NAK or an implied NAK proves the responder alive, and each
/// can only repeat after progress (one NAK per gap, `last_rewind`), so they go back for
/// free; Linux rxe charges them too, which makes heavy loss end in RETRY_EXC_ERR sooner.
fn go_back<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn, consume_retry: bool) {
    if qp.req.last_rewind == Some(psn) {
        // Already going back to this PSN and no progress since: the same loss, told twice.
        return;
    }
    if consume_retry {
        if qp.req.retry_left == 0 {
            ctx.count(qp, Counter::ReqRetryExceeded);
            fail_front(qp, ctx, WcStatus::RetryExcErr);
            return;
        }
        qp.req.retry_left -= 1;
    }
    ctx.count(qp, Counter::ReqRetries);
    qp.req.last_rewind = Some(psn);
    reposition(qp, psn);
    qp.req.ack_deadline = None;
    arm_ack_timer(qp, ctx.now);
}

/// An ACK or response for a later PSN arrived while the oldest WR is a READ or ATOMIC that
/// got no (complete) response: the response was lost (IBA 9.7.5.1.5, implied NAK).
fn implied_nak<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    ctx.count(qp, Counter::CompImpliedNak);
    let una = qp.req.una;
    go_back(qp, ctx, una, false);
}

/// Complete every WQE whose last PSN is before `upto` (a coalesced ACK acknowledges all
/// earlier PSNs, IBA 9.7.5.1.2). Returns false if processing must stop (implied NAK or an
/// error that ended the QP).
fn ack_up_to<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, upto: Psn) -> bool {
    loop {
        let Some(front) = qp.sq.front() else {
            return true;
        };
        if front.local_error.is_some() {
            complete_ready(qp, ctx);
            return false;
        }
        if !front.started {
            return true;
        }
        if front.last_psn.is_before(upto) {
            if front.op.is_read_or_atomic() {
                implied_nak(qp, ctx);
                return false;
            }
            let next = front.last_psn.next();
            complete_front(qp, ctx, WcStatus::Success);
            progress(qp, ctx, next);
        } else {
            if !front.op.is_read_or_atomic() {
                progress(qp, ctx, upto);
            }
            return true;
        }
    }
}

fn nak_status(code: NakCode) -> WcStatus {
    match code {
        NakCode::PsnSequenceError => WcStatus::RetryExcErr,
        NakCode::InvalidRequest => WcStatus::RemInvReqErr,
        NakCode::RemoteAccessError => WcStatus::RemAccessErr,
        NakCode::RemoteOperationalError => WcStatus::RemOpErr,
        NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
    }
}

/// Write `data` at byte `offset` of the oldest WQE's local buffers (READ response payload,
/// ATOMIC original value); the buffers were checked when the WR started.
fn scatter_into_front<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    mut offset: u64,
    data: &[u8],
) -> bool {
    let Some(w) = qp.sq.front() else { return false };
    let mut rest = data;
    for (i, sge) in w.sges().iter().enumerate() {
        if rest.is_empty() {
            break;
        }
        let l = u64::from(sge.length);
        if offset >= l {
            offset -= l;
            continue;
        }
        let n = ((l - offset) as usize).min(rest.len());
        let owner = w.owners.get(i).copied().unwrap_or_default();
        if ctx.mem.write(owner, sge.addr + offset, &rest[..n]).is_err() {
            return false;
        }
        rest = &rest[n..];
        offset = 0;
    }
    rest.is_empty()
}

/// A response packet (ACK, NAK, READ response, ATOMIC ACK) for this QP's requests.
pub(crate) fn handle_response<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &RoceV2Packet<'_>,
) {
    let t = &pkt.transport;
    let psn = t.bth.psn;
    if !psn.is_before(qp.req.sent_hw) {
        // A response for a PSN never sent (a "ghost" ACK, e.g. from a stale connection):
        // acting on it would complete data that never left, so it is dropped.
        ctx.count(qp, Counter::CompGhostAck);
        return;
    }
    if psn.is_before(qp.req.una) {
        ctx.count(qp, Counter::CompDuplicateResponse);
        return;
    }
    match t.bth.opcode.kind() {
        OpKind::Acknowledge => {
            let Some(aeth) = t.aeth else { return };
            match aeth.syndrome {
                Syndrome::Ack { .. } => {
                    ack_up_to(qp, ctx, psn.next());
                }
                Syndrome::RnrNak { timer } => {
                    ctx.count(qp, Counter::CompRnrNakReceived);
                    if qp.req.rnr_until.is_some() || !ack_up_to(qp, ctx, psn) {
                        return;
                    }
                    // IBA 9.7.5.1.4: wait the responder's RNR timer, then resend from the
                    // NAKed PSN; rnr_retry 7 means forever.
                    if qp.req.rnr_retry_left == 0 {
                        ctx.count(qp, Counter::ReqRnrRetryExceeded);
                        fail_front(qp, ctx, WcStatus::RnrRetryExcErr);
                        return;
                    }
                    if qp.attr.rnr_retry != 7 {
                        qp.req.rnr_retry_left -= 1;
                    }
                    qp.req.rnr_until = Some(ctx.now + rnr_timer(timer));
                    qp.req.rnr_psn = psn;
                    qp.req.ack_deadline = None;
                }
                Syndrome::Nak(NakCode::PsnSequenceError) => {
                    ctx.count(qp, Counter::CompSeqErrNakReceived);
                    // The responder answers: the retries count unanswered rounds only.
                    qp.req.retry_left = qp.attr.retry_cnt;
                    // The NAK acknowledges everything before its PSN (IBA 9.7.5.1.3).
                    if ack_up_to(qp, ctx, psn) {
                        go_back(qp, ctx, psn, false);
                    }
                }
                Syndrome::Nak(code) => {
                    ctx.count(qp, Counter::CompErrorNakReceived);
                    if ack_up_to(qp, ctx, psn) && !qp.sq.is_empty() {
                        fail_front(qp, ctx, nak_status(code));
                    }
                }
            }
        }
        OpKind::RdmaReadResponse => {
            if !ack_up_to(qp, ctx, psn) {
                return;
            }
            let mtu = u64::from(qp.path.map_or(256, |p| p.mtu));
            let Some(w) = qp.sq.front() else { return };
            let in_read = w.started
                && matches!(w.op, SendOp::RdmaRead { .. })
                && !psn.is_before(w.first_psn)
                && !psn.is_after(w.last_psn);
            if !in_read {
                ctx.count(qp, Counter::CompUnexpectedResponse);
                return;
            }
            if psn != qp.req.una {
                // Responses before this one were lost.
                implied_nak(qp, ctx);
                return;
            }
            let offset = psn.distance_from(w.first_psn) as u64 * mtu;
            let expect = w.len.saturating_sub(offset).min(mtu) as usize;
            let ends = offset + mtu >= w.len;
            let op = t.bth.opcode;
            let op_ok = if ends {
                op.is_last() || op.is_only()
            } else {
                op.is_first() || op.is_middle()
            };
            if pkt.payload.len() != expect || !op_ok {
                // IBA 9.7.5.1.6: a response that does not fit the request is a bad response.
                ctx.count(qp, Counter::CompUnexpectedResponse);
                fail_front(qp, ctx, WcStatus::BadRespErr);
                return;
            }
            if !scatter_into_front(qp, ctx, offset, pkt.payload) {
                ctx.count(qp, Counter::MemoryFault);
                fail_front(qp, ctx, WcStatus::LocProtErr);
                return;
            }
            if ends {
                complete_front(qp, ctx, WcStatus::Success);
            }
            progress(qp, ctx, psn.next());
        }
        OpKind::AtomicAcknowledge => {
            if !ack_up_to(qp, ctx, psn) {
                return;
            }
            let Some(w) = qp.sq.front() else { return };
            if !(w.started && w.op.is_atomic() && w.first_psn == psn) {
                ctx.count(qp, Counter::CompUnexpectedResponse);
                return;
            }
            let Some(ack) = t.atomic_ack_eth else { return };
            // The original remote word lands in host byte order, as rxe does.
            if !scatter_into_front(qp, ctx, 0, &ack.orig.to_ne_bytes()) {
                ctx.count(qp, Counter::MemoryFault);
                fail_front(qp, ctx, WcStatus::LocProtErr);
                return;
            }
            complete_front(qp, ctx, WcStatus::Success);
            progress(qp, ctx, psn.next());
        }
        _ => ctx.count(qp, Counter::CompUnexpectedResponse),
    }
}

/// When this QP's next timer is due.
pub(crate) fn next_timeout(qp: &Qp) -> Option<Instant> {
    if !qp.state().processes_responses() {
        return None;
    }
    match (qp.req.ack_deadline, qp.req.rnr_until) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Run this QP's timers that are due.
pub(crate) fn handle_timers<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    if !qp.state().processes_responses() {
        return;
    }
    if let Some(t) = qp.req.rnr_until {
        if ctx.now >= t {
            qp.req.rnr_until = None;
            let psn = qp.req.rnr_psn;
            qp.req.last_rewind = None;
            go_back(qp, ctx, psn, false);
        }
    }
    if let Some(t) = qp.req.ack_deadline {
        if ctx.now >= t {
            qp.req.ack_deadline = None;
            if qp.req.una.is_before(qp.req.sent_hw) {
                // IBA 9.7.6.1.3: local ACK timeout, resend everything unacknowledged.
                ctx.count(qp, Counter::CompLocalAckTimeout);
                qp.req.last_rewind = None;
                let una = qp.req.una;
                go_back(qp, ctx, una, true);
            }
        }
    }
}
