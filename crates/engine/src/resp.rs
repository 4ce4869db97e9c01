//! The responder: executes incoming requests against registered memory and answers them
//! (IBA 9.7.5.2): PSN checks with one sequence NAK per gap, duplicate detection with
//! re-ACKs and READ / ATOMIC replay from the responder resources, key / PD / bounds / access
//! checks, RNR NAKs when no receive is posted, receive completions, ACK coalescing (when a
//! plain ACK leaves is the policy of [`crate::ack`]), and READ responses built packet by
//! packet straight from memory.

use wire::{
    AethRepr, AtomicAckEthRepr, BthRepr, Msn, NakCode, OpKind, Opcode, PacketLayout, Psn, Qpn,
    RethRepr, RoceV2Packet, Syndrome, TransportRepr, ROCEV2_UDP_PORT,
};

use crate::ack::Held;
use crate::counters::Counter;
use crate::cq::{WcFlags, WcOpcode, WorkCompletion};
use crate::error::VerbsError;
use crate::memory::Memory;
use crate::mr::MrTable;
use crate::pd::PdHandle;
use crate::qp::{InProgress, Path, Qp, RecvWqe, Resource, RespOut};
use crate::qp_attr::AccessFlags;
use crate::req::{ip_repr, packets_for};
use crate::time::Instant;
use crate::wr::RecvWr;
use crate::{comp, Ctx, WcStatus};

/// The ACK syndrome rxe sends (credit field 0x1f: "no end-to-end flow control credits").
const ACK: Syndrome = Syndrome::ACK_NO_CREDIT;

/// `ibv_post_recv` checks and queueing.
pub(crate) fn post_recv<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    wr: RecvWr,
) -> Result<(), VerbsError> {
    let state = qp.state();
    if !state.can_post_recv() {
        return Err(VerbsError::InvalidState(state));
    }
    if wr.sg_list.len() > qp.cap.max_recv_sge as usize {
        return Err(VerbsError::TooManySge {
            sges: wr.sg_list.len(),
            max: qp.cap.max_recv_sge,
        });
    }
    if qp.rq.len() >= qp.cap.max_recv_wr as usize {
        return Err(VerbsError::QueueFull);
    }
    if state.flushes_recv_queue() {
        let wc = WorkCompletion::new(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, qp.qpn);
        ctx.count(qp, Counter::WrFlushed);
        let cq = qp.recv_cq;
        ctx.push_cqe(qp, cq, wc);
        return Ok(());
    }
    let len = wr.sg_list.iter().map(|s| u64::from(s.length)).sum();
    qp.rq.push_back(RecvWqe {
        wr_id: wr.wr_id,
        sges: wr.sg_list,
        len,
    });
    Ok(())
}

/// Queue a plain ACK of everything up to `psn`. ACKs are cumulative (IBA 9.7.5.1.2): one
/// still waiting at the back of the queue is replaced, and the new one leaves when the
/// oldest it stands for was due to (see [`crate::ack`]).
fn queue_ack<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn) {
    let msn = qp.resp.msn;
    let held = match qp.resp.out.back() {
        Some(&RespOut::Ack { held, .. }) => {
            qp.resp.out.pop_back();
            ctx.count(qp, Counter::RespAcksCoalesced);
            held
        }
        _ => {
            // The MSN before the message this ACK belongs to (it may be a long one's first).
            let msn_base = if qp.resp.in_progress.is_some() {
                msn
            } else {
                msn.wrapping_sub(1) & 0xff_ffff
            };
            // An internal path costs no system call per packet: nothing to save by
            // waiting, so its ACKs leave at the next pass.
            let coalesce = if qp.path.is_some_and(|p| p.internal) {
                core::time::Duration::ZERO
            } else {
                ctx.ack_coalesce
            };
            qp.resp.patience.first(ctx.now, coalesce, msn_base)
        }
    };
    qp.resp.out.push_back(RespOut::Ack { psn, msn, held });
}

/// Queue a NAK or RNR NAK (it sends any ACK waiting before it first).
fn queue_nak(qp: &mut Qp, psn: Psn, syndrome: Syndrome) {
    let msn = qp.resp.msn;
    qp.resp.out.push_back(RespOut::Nak { psn, syndrome, msn });
}

/// A class C / D error (IBA 9.9, responder error behaviour on RC): NAK the packet and move the QP to
/// ERR; the NAK is the last thing it sends.
fn fatal_nak<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn, code: NakCode) {
    ctx.count(
        qp,
        match code {
            NakCode::InvalidRequest => Counter::RespInvalidRequestNakSent,
            NakCode::RemoteAccessError => Counter::RespRemoteAccessNakSent,
            _ => Counter::RespRemoteOpNakSent,
        },
    );
    comp::enter_error(qp, ctx);
    queue_nak(qp, psn, Syndrome::Nak(code));
}

/// Complete the receive WQE at the head of the RQ (`solicited`: the message's last packet
/// carried the solicited-event bit).
fn complete_recv<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    solicited: bool,
    wc_fill: impl FnOnce(&mut WorkCompletion),
) {
    let Some(r) = qp.rq.pop_front() else {
        return;
    };
    let mut wc = WorkCompletion::new(r.wr_id, WcStatus::Success, WcOpcode::Recv, qp.qpn);
    wc.src_qp = qp.attr.dest_qp_num;
    wc_fill(&mut wc);
    let cq = qp.recv_cq;
    ctx.push_cqe_se(qp, cq, wc, solicited);
}

/// Scatter `data` at byte `offset` of a receive WQE, checking each local key as it is used
/// (IBA 10.6.3.2; LOCAL_WRITE is required).
fn scatter_recv<M: Memory + ?Sized>(
    r: &RecvWqe,
    pd: PdHandle,
    mrs: &MrTable,
    mem: &mut M,
    mut offset: u64,
    data: &[u8],
) -> Result<(), WcStatus> {
    let mut rest = data;
    for sge in &r.sges {
        if rest.is_empty() {
            break;
        }
        let l = u64::from(sge.length);
        if offset >= l {
            offset -= l;
            continue;
        }
        let n = ((l - offset) as usize).min(rest.len());
        let addr = sge.addr + offset;
        let owner = mrs
            .check_local(sge.lkey.value(), pd, addr, n as u64, true)
            .map_err(|_| WcStatus::LocProtErr)?;
        mem.write(owner, addr, &rest[..n])
            .map_err(|_| WcStatus::LocProtErr)?;
        rest = &rest[n..];
        offset = 0;
    }
    if rest.is_empty() {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

fn rnr_nak<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, psn: Psn) {
    ctx.count(qp, Counter::RespRnrNakSent);
    let timer = qp.attr.min_rnr_timer & 0x1f;
    queue_nak(qp, psn, Syndrome::RnrNak { timer });
    // Later packets of the gap are dropped quietly until the NAKed one comes back
    // (IBA 9.7.5.2.2 applies the one-NAK-per-gap rule to RNR NAKs too).
    qp.resp.nak_sent = true;
}

/// A request packet for this QP.
pub(crate) fn handle_request<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &RoceV2Packet<'_>,
) {
    let t = &pkt.transport;
    let psn = t.bth.psn;
    let d = psn.distance_from(qp.resp.epsn);
    if d > 0 {
        // A gap: an earlier packet was lost. NAK once, at the PSN expected (IBA 9.7.5.2.2).
        ctx.count(qp, Counter::RespOutOfSequence);
        if !qp.resp.nak_sent {
            qp.resp.nak_sent = true;
            ctx.count(qp, Counter::RespSeqErrNakSent);
            let epsn = qp.resp.epsn;
            queue_nak(qp, epsn, Syndrome::Nak(NakCode::PsnSequenceError));
        }
        return;
    }
    if d < 0 {
        duplicate(qp, ctx, pkt);
        return;
    }
    qp.resp.nak_sent = false;
    let op = t.bth.opcode;
    let kind = op.kind();
    let starts = op.is_first() || op.is_only();
    let continues = op.is_middle() || op.is_last();
    // IBA 9.7.5.2 (opcode sequence check): a message in progress must continue with the same operation;
    // otherwise only FIRST / ONLY or a READ / ATOMIC may come.
    let seq_ok = match (qp.resp.in_progress, kind) {
        (Some(InProgress::Send { .. }), OpKind::Send) => continues,
        (Some(InProgress::Write { .. }), OpKind::RdmaWrite) => continues,
        (Some(_), _) => false,
        (None, OpKind::Send | OpKind::RdmaWrite) => starts,
        (None, OpKind::RdmaReadRequest | OpKind::CompareSwap | OpKind::FetchAdd) => true,
        (None, _) => false,
    };
    if !seq_ok {
        fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
        return;
    }
    let need = match kind {
        OpKind::RdmaWrite => AccessFlags::REMOTE_WRITE,
        OpKind::RdmaReadRequest => AccessFlags::REMOTE_READ,
        OpKind::CompareSwap | OpKind::FetchAdd => AccessFlags::REMOTE_ATOMIC,
        _ => AccessFlags::empty(),
    };
    if !qp.attr.qp_access_flags.contains(need) {
        // The QP does not enable this remote operation (IBA 11.2.5.2 qp_access_flags).
        fatal_nak(qp, ctx, psn, NakCode::RemoteAccessError);
        return;
    }
    let mtu = qp.path.map_or(256, |p| p.mtu) as usize;
    let plen = pkt.payload.len();
    // IBA 9.7.5.2 (length check): FIRST and MIDDLE carry exactly one MTU, LAST and ONLY at most one.
    let len_ok = if op.is_first() || op.is_middle() {
        plen == mtu
    } else {
        plen <= mtu
    };
    if !len_ok {
        fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
        return;
    }
    match kind {
        OpKind::Send => {
            if !do_send(qp, ctx, pkt) {
                return;
            }
        }
        OpKind::RdmaWrite => {
            if !do_write(qp, ctx, pkt) {
                return;
            }
        }
        OpKind::RdmaReadRequest => {
            do_read(qp, ctx, pkt);
            return;
        }
        OpKind::CompareSwap | OpKind::FetchAdd => {
            do_atomic(qp, ctx, pkt);
            return;
        }
        _ => {
            fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
            return;
        }
    }
    qp.resp.epsn = psn.next();
    if t.bth.ack_req {
        queue_ack(qp, ctx, psn);
    }
}

fn end_message(qp: &mut Qp) {
    qp.resp.in_progress = None;
    qp.resp.msn = (qp.resp.msn + 1) & 0xff_ffff;
}

/// SEND FIRST / MIDDLE / LAST / ONLY into the receive WQE at the head of the RQ.
fn do_send<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &RoceV2Packet<'_>) -> bool {
    let t = &pkt.transport;
    let psn = t.bth.psn;
    let offset = match qp.resp.in_progress {
        Some(InProgress::Send { offset }) => offset,
        _ => {
            if qp.rq.is_empty() {
                rnr_nak(qp, ctx, psn);
                return false;
            }
            0
        }
    };
    let Some(r) = qp.rq.front() else { return false };
    let plen = pkt.payload.len() as u64;
    if offset + plen > r.len {
        // The message does not fit: LOC_LEN_ERR here, Invalid Request at the requester.
        ctx.count(qp, Counter::RespLocalLengthError);
        complete_recv(qp, ctx, false, |wc| {
            wc.status = WcStatus::LocLenErr;
            wc.byte_len = (offset + plen) as u32;
        });
        fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
        return false;
    }
    if let Err(status) = scatter_recv(r, qp.pd, ctx.mrs, ctx.mem, offset, pkt.payload) {
        // A local error of the responder: the requester sees Remote Operational Error.
        complete_recv(qp, ctx, false, |wc| wc.status = status);
        fatal_nak(qp, ctx, psn, NakCode::RemoteOperationalError);
        return false;
    }
    let total = offset + plen;
    if t.bth.opcode.is_last() || t.bth.opcode.is_only() {
        let imm = t.immdt;
        let inv = t.ieth;
        if let Some(rkey) = inv {
            // IBA 10.6.7.2.2 / 9.4: SEND with Invalidate frees a type 2 window bound on this
            // QP, or invalidates a region of this PD; a key it may not invalidate fails the
            // receive (REM_INV_REQ_ERR, as rxe) and the QP, and the requester is NAKed.
            if crate::mw::invalidate(ctx.mrs, ctx.mws, qp.pd, Some(qp.qpn), rkey.value()).is_err() {
                complete_recv(qp, ctx, false, |wc| {
                    wc.status = WcStatus::RemInvReqErr;
                    wc.byte_len = total as u32;
                });
                fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
                return false;
            }
        }
        complete_recv(qp, ctx, t.bth.solicited, |wc| {
            wc.byte_len = total as u32;
            if let Some(imm) = imm {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
            if let Some(rkey) = inv {
                // Invalidated above.
                wc.invalidated_rkey = rkey;
                wc.wc_flags |= WcFlags::WITH_INV;
            }
        });
        end_message(qp);
    } else {
        qp.resp.in_progress = Some(InProgress::Send { offset: total });
    }
    true
}

/// RDMA WRITE FIRST / MIDDLE / LAST / ONLY (with immediate: also consumes a receive WQE).
fn do_write<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &RoceV2Packet<'_>) -> bool {
    let t = &pkt.transport;
    let psn = t.bth.psn;
    let op = t.bth.opcode;
    if op.has_immediate() && qp.rq.is_empty() {
        rnr_nak(qp, ctx, psn);
        return false;
    }
    if op.is_first() || op.is_only() {
        let Some(reth) = t.reth else { return false };
        let len = u64::from(reth.dma_len);
        // IBA 9.4.4: a zero-length RDMA WRITE carries no address to check.
        let owner = if len == 0 {
            crate::MemOwner::default()
        } else {
            match ctx.check_rkey(
                qp.qpn,
                reth.rkey.value(),
                qp.pd,
                reth.va,
                len,
                AccessFlags::REMOTE_WRITE,
            ) {
                Ok(o) => o,
                Err(_) => {
                    fatal_nak(qp, ctx, psn, NakCode::RemoteAccessError);
                    return false;
                }
            }
        };
        qp.resp.in_progress = Some(InProgress::Write {
            owner,
            va: reth.va,
            remaining: len,
            total: len,
        });
    }
    let Some(InProgress::Write {
        owner,
        va,
        remaining,
        total,
    }) = qp.resp.in_progress
    else {
        return false;
    };
    let plen = pkt.payload.len() as u64;
    let ends = op.is_last() || op.is_only();
    // The packets must carry exactly the DMA length of the RETH (IBA 9.7.5.2, length check).
    if plen > remaining || (ends && plen != remaining) {
        fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
        return false;
    }
    if plen > 0 && ctx.mem.write(owner, va, pkt.payload).is_err() {
        ctx.count(qp, Counter::MemoryFault);
        fatal_nak(qp, ctx, psn, NakCode::RemoteOperationalError);
        return false;
    }
    if ends {
        if let Some(imm) = t.immdt {
            complete_recv(qp, ctx, t.bth.solicited, |wc| {
                wc.opcode = WcOpcode::RecvRdmaWithImm;
                wc.byte_len = total as u32;
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            });
        }
        end_message(qp);
    } else {
        qp.resp.in_progress = Some(InProgress::Write {
            owner,
            va: va + plen,
            remaining: remaining - plen,
            total,
        });
    }
    true
}

/// Whether a new READ / ATOMIC would exceed what this responder serves at once. A peer
/// that respects our `max_dest_rd_atomic` never gets here; one that does not must not make
/// the responder queue grow without bound.
fn over_rd_atomic_limit(qp: &Qp) -> bool {
    let cap = usize::from(qp.attr.max_dest_rd_atomic.max(1));
    let queued = qp
        .resp
        .out
        .iter()
        .filter(|o| matches!(o, RespOut::Read { .. } | RespOut::Atomic { .. }))
        .count();
    queued >= 2 * cap
}

fn remember(qp: &mut Qp, r: Resource) {
    let cap = usize::from(qp.attr.max_dest_rd_atomic.max(1));
    while qp.resp.resources.len() >= cap {
        qp.resp.resources.pop_front();
    }
    qp.resp.resources.push_back(r);
}

/// The owner of the memory a READ request names, once its R_Key, PD, bounds and REMOTE_READ
/// right check out; `None` when they do not. A zero-length READ names no memory, so its R_Key
/// is not checked (IBA: zero-length RDMA validates no R_Key). Shared by first execution and
/// duplicate replay, which must judge the same request the same way.
fn read_target<M: Memory + ?Sized>(
    qp: &Qp,
    ctx: &Ctx<'_, M>,
    reth: &RethRepr,
) -> Option<crate::MemOwner> {
    if reth.dma_len == 0 {
        return Some(crate::MemOwner::default());
    }
    ctx.check_rkey(
        qp.qpn,
        reth.rkey.value(),
        qp.pd,
        reth.va,
        u64::from(reth.dma_len),
        AccessFlags::REMOTE_READ,
    )
    .ok()
}

/// RDMA READ REQUEST: check, remember, and queue the responses (built at transmit time).
fn do_read<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &RoceV2Packet<'_>) {
    let t = &pkt.transport;
    let psn = t.bth.psn;
    if over_rd_atomic_limit(qp) {
        fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
        return;
    }
    let Some(reth) = t.reth else { return };
    let len = u64::from(reth.dma_len);
    let Some(owner) = read_target(qp, ctx, &reth) else {
        fatal_nak(qp, ctx, psn, NakCode::RemoteAccessError);
        return;
    };
    let mtu = qp.path.map_or(256, |p| p.mtu);
    let n = packets_for(len, mtu);
    remember(
        qp,
        Resource::Read {
            first_psn: psn,
            last_psn: psn.add(n - 1),
        },
    );
    end_message(qp);
    let msn = qp.resp.msn;
    qp.resp.out.push_back(RespOut::Read {
        first_psn: psn,
        psn,
        owner,
        rkey: reth.rkey.value(),
        va: reth.va,
        len,
        done: 0,
        msn,
    });
    // The READ occupies one PSN per response packet (IBA 9.7.5.2.1).
    qp.resp.epsn = psn.add(n);
}

/// COMPARE SWAP / FETCH ADD on an 8-byte aligned word (IBA 9.4.5).
fn do_atomic<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &RoceV2Packet<'_>) {
    let t = &pkt.transport;
    let psn = t.bth.psn;
    if over_rd_atomic_limit(qp) {
        fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
        return;
    }
    let Some(a) = t.atomic_eth else { return };
    if a.va % 8 != 0 {
        // IBA 9.4.5: a misaligned atomic is an invalid request.
        fatal_nak(qp, ctx, psn, NakCode::InvalidRequest);
        return;
    }
    let owner = match ctx.check_rkey(
        qp.qpn,
        a.rkey.value(),
        qp.pd,
        a.va,
        8,
        AccessFlags::REMOTE_ATOMIC,
    ) {
        Ok(o) => o,
        Err(_) => {
            fatal_nak(qp, ctx, psn, NakCode::RemoteAccessError);
            return;
        }
    };
    let r = if t.bth.opcode == Opcode::RcCompareSwap {
        ctx.mem.compare_swap(owner, a.va, a.compare, a.swap_add)
    } else {
        ctx.mem.fetch_add(owner, a.va, a.swap_add)
    };
    let Ok(orig) = r else {
        ctx.count(qp, Counter::MemoryFault);
        fatal_nak(qp, ctx, psn, NakCode::RemoteOperationalError);
        return;
    };
    remember(qp, Resource::Atomic { psn, orig });
    end_message(qp);
    let msn = qp.resp.msn;
    qp.resp.out.push_back(RespOut::Atomic { psn, orig, msn });
    qp.resp.epsn = psn.next();
}

/// A request with a PSN already executed (IBA 9.7.5.2, duplicate requests): SEND and WRITE are
/// ACKed again without executing; READ and ATOMIC are answered again from the responder
/// resources (an ATOMIC is never executed twice).
fn duplicate<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &RoceV2Packet<'_>) {
    ctx.count(qp, Counter::RespDuplicateRequest);
    let t = &pkt.transport;
    let psn = t.bth.psn;
    match t.bth.opcode.kind() {
        OpKind::Send | OpKind::RdmaWrite => {
            let last = qp.resp.epsn.sub(1);
            queue_ack(qp, ctx, last);
        }
        OpKind::RdmaReadRequest => {
            let Some(reth) = t.reth else { return };
            let found = qp.resp.resources.iter().find_map(|r| match *r {
                Resource::Read {
                    first_psn,
                    last_psn,
                } if !psn.is_before(first_psn) && !psn.is_after(last_psn) => {
                    Some((first_psn, last_psn))
                }
                _ => None,
            });
            let Some((first, last)) = found else {
                ctx.count(qp, Counter::RespReplayMissing);
                return;
            };
            let len = u64::from(reth.dma_len);
            let Some(owner) = read_target(qp, ctx, &reth) else {
                fatal_nak(qp, ctx, psn, NakCode::RemoteAccessError);
                return;
            };
            ctx.count(qp, Counter::RespReplayed);
            let msn = qp.resp.msn;
            let job = RespOut::Read {
                first_psn: psn,
                psn,
                owner,
                rkey: reth.rkey.value(),
                va: reth.va,
                len,
                done: 0,
                msn,
            };
            // The retried READ supersedes what is still queued for the same request, in its
            // place: moving it behind later ACKs would make them imply its loss.
            let queued = qp.resp.out.iter().position(|o| {
                matches!(*o, RespOut::Read { first_psn, .. }
                    if !first_psn.is_before(first) && !first_psn.is_after(last))
            });
            match queued {
                Some(i) => qp.resp.out[i] = job,
                None => qp.resp.out.push_back(job),
            }
        }
        OpKind::CompareSwap | OpKind::FetchAdd => {
            let found = qp.resp.resources.iter().find_map(|r| match *r {
                Resource::Atomic { psn: p, orig } if p == psn => Some(orig),
                _ => None,
            });
            match found {
                Some(orig) => {
                    ctx.count(qp, Counter::RespReplayed);
                    let msn = qp.resp.msn;
                    qp.resp.out.push_back(RespOut::Atomic { psn, orig, msn });
                }
                None => ctx.count(qp, Counter::RespReplayMissing),
            }
        }
        _ => {}
    }
}

/// When the plain ACK waiting alone in the responder queue is due, if one is (anything
/// else queued can leave at once).
pub(crate) fn ack_due(qp: &Qp) -> Option<Instant> {
    match qp.resp.out.front() {
        Some(RespOut::Ack { held, .. }) if qp.resp.out.len() == 1 => Some(held.due),
        _ => None,
    }
}

/// The responder queue of a QP entering ERR: what it had to send is dropped, except a plain
/// ACK with nothing before it, which becomes due at once. The requests it acknowledges were
/// executed, and nothing will coalesce with it any more; without it the peer would retry
/// them into a QP that no longer answers.
pub(crate) fn on_error(qp: &mut Qp) {
    let keep = match qp.resp.out.front() {
        Some(&RespOut::Ack { psn, msn, held }) => Some(RespOut::Ack {
            psn,
            msn,
            held: Held {
                due: Instant::default(),
                ..held
            },
        }),
        _ => None,
    };
    qp.resp.out.clear();
    qp.resp.out.extend(keep);
}

/// Make the plain ACK waiting last in the queue due at once (the host is about to stop).
pub(crate) fn release_ack(qp: &mut Qp) {
    if let Some(RespOut::Ack { held, .. }) = qp.resp.out.back_mut() {
        held.due = Instant::default();
    }
}

/// A plain ACK a QP still owed its peer when it was destroyed or reset: the engine sends it
/// on the QP's behalf (see [`parting_ack`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parting {
    path: Path,
    psn: Psn,
    msn: u32,
}

impl Parting {
    /// Where it goes.
    pub(crate) fn dst(&self) -> std::net::IpAddr {
        self.path.dst_ip
    }

    /// Whether it goes on an internal path (see `Transmit::internal`).
    pub(crate) fn internal(&self) -> bool {
        self.path.internal
    }
}

/// The plain ACK at the front of the queue of a QP about to be destroyed or reset, if any.
pub(crate) fn parting_ack(qp: &Qp) -> Option<Parting> {
    match (qp.resp.out.front(), qp.path) {
        (Some(&RespOut::Ack { psn, msn, .. }), Some(path)) => Some(Parting { path, psn, msn }),
        _ => None,
    }
}

/// Build a parting ACK into `buf`.
pub(crate) fn transmit_parting(p: &Parting, buf: &mut [u8]) -> Option<usize> {
    emit_ack(&p.path, p.psn, ACK, p.msn, buf)
}

/// Build an ACK / NAK packet with this syndrome on `path` into `buf`.
fn emit_ack(path: &Path, psn: Psn, syndrome: Syndrome, msn: u32, buf: &mut [u8]) -> Option<usize> {
    let ip = ip_repr(path);
    let dest = Qpn::new(path.dest_qpn);
    let mut t = TransportRepr::new(BthRepr::new(Opcode::RcAcknowledge, dest, psn));
    t.aeth = Some(AethRepr {
        syndrome,
        msn: Msn::new(msn),
    });
    let layout = PacketLayout::new(&ip, path.udp_src_port, ROCEV2_UDP_PORT, &t, 0).ok()?;
    layout.emit_headers(buf).ok()?;
    path.seal(&layout, buf).ok()
}

/// Build the plain ACK waiting alone in the queue into `buf`, if it is due at `ctx.now`.
pub(crate) fn transmit_due_ack<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    buf: &mut [u8],
) -> Option<usize> {
    let path = qp.path?;
    let (psn, msn, held) = match qp.resp.out.front() {
        Some(&RespOut::Ack { psn, msn, held }) if qp.resp.out.len() == 1 => (psn, msn, held),
        _ => return None,
    };
    if held.due > ctx.now {
        return None;
    }
    let len = emit_ack(&path, psn, ACK, msn, buf)?;
    qp.resp.out.pop_front();
    qp.resp.patience.sent_due(&held, msn, ctx.now);
    ctx.count(qp, Counter::RespAcksSent);
    Some(len)
}

/// Build the next responder packet that need not wait into `buf`: a NAK or RNR NAK, an
/// ATOMIC ACK, one READ response, or a plain ACK something is queued behind. A plain ACK
/// last in the queue waits until it is due ([`transmit_due_ack`]).
pub(crate) fn transmit<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    buf: &mut [u8],
) -> Option<usize> {
    let path = qp.path?;
    let ip = ip_repr(&path);
    let dest = Qpn::new(path.dest_qpn);
    loop {
        let front = *qp.resp.out.front()?;
        match front {
            RespOut::Ack { psn, msn, .. } => {
                if qp.resp.out.len() == 1 {
                    return None;
                }
                let len = emit_ack(&path, psn, ACK, msn, buf)?;
                qp.resp.out.pop_front();
                ctx.count(qp, Counter::RespAcksSent);
                return Some(len);
            }
            RespOut::Nak { psn, syndrome, msn } => {
                let len = emit_ack(&path, psn, syndrome, msn, buf)?;
                qp.resp.out.pop_front();
                ctx.count(qp, Counter::RespAcksSent);
                return Some(len);
            }
            RespOut::Atomic { psn, orig, msn } => {
                let mut t =
                    TransportRepr::new(BthRepr::new(Opcode::RcAtomicAcknowledge, dest, psn));
                t.aeth = Some(AethRepr {
                    syndrome: ACK,
                    msn: Msn::new(msn),
                });
                t.atomic_ack_eth = Some(AtomicAckEthRepr { orig });
                let layout =
                    PacketLayout::new(&ip, path.udp_src_port, ROCEV2_UDP_PORT, &t, 0).ok()?;
                layout.emit_headers(buf).ok()?;
                let len = path.seal(&layout, buf).ok()?;
                qp.resp.out.pop_front();
                return Some(len);
            }
            RespOut::Read {
                first_psn,
                psn,
                owner,
                rkey,
                va,
                len,
                done,
                msn,
            } => {
                let mtu = u64::from(path.mtu);
                let plen = (len - done).min(mtu);
                let first = psn == first_psn;
                let last = done + plen >= len;
                let opcode = match (first, last) {
                    (true, true) => Opcode::RcRdmaReadResponseOnly,
                    (true, false) => Opcode::RcRdmaReadResponseFirst,
                    (false, false) => Opcode::RcRdmaReadResponseMiddle,
                    (false, true) => Opcode::RcRdmaReadResponseLast,
                };
                // The MR may have been deregistered since the request was checked.
                if plen > 0
                    && ctx
                        .check_rkey(
                            qp.qpn,
                            rkey,
                            qp.pd,
                            va + done,
                            plen,
                            AccessFlags::REMOTE_READ,
                        )
                        .is_err()
                {
                    // The requester learns it the way it would have at request time.
                    fatal_nak(qp, ctx, psn, NakCode::RemoteAccessError);
                    continue;
                }
                let mut t = TransportRepr::new(BthRepr::new(opcode, dest, psn));
                if first || last {
                    t.aeth = Some(AethRepr {
                        syndrome: ACK,
                        msn: Msn::new(msn),
                    });
                }
                let mut laid_out = None;
                let layout =
                    path.emit_headers(&t, plen as usize, buf, &mut qp.resp.middle, &mut laid_out)?;
                if plen > 0 {
                    let out = layout.payload_mut(buf).ok()?;
                    if ctx.mem.read(owner, va + done, out).is_err() {
                        ctx.count(qp, Counter::MemoryFault);
                        fatal_nak(qp, ctx, psn, NakCode::RemoteOperationalError);
                        continue;
                    }
                }
                let n = path.seal(layout, buf).ok()?;
                if last {
                    qp.resp.out.pop_front();
                } else if let Some(RespOut::Read {
                    psn: p, done: d, ..
                }) = qp.resp.out.front_mut()
                {
                    *p = psn.next();
                    *d = done + plen;
                }
                return Some(n);
            }
        }
    }
}
