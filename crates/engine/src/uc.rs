//! Unreliable Connected (IBA 9.8): SEND and RDMA WRITE (with immediate) to one peer
//! QP, segmented by the path MTU, with PSNs but without acknowledgements or retransmission.
//! The requester completes a WR when its last packet leaves. The responder executes packets
//! in PSN order; a gap or an error loses only the message it hit: the responder drops
//! packets until the next FIRST or ONLY, and a receive WQE partly filled by the lost
//! message is reused for the next one, never completed.

use wire::{BthRepr, OpKind, Opcode, PacketLayout, Qpn, RethRepr, RoceV2Packet};
use wire::{TransportRepr, ROCEV2_UDP_PORT};

use crate::counters::Counter;
use crate::cq::{WcFlags, WcOpcode};
use crate::error::VerbsError;
use crate::memory::{MemOwner, Memory};
use crate::mw;
use crate::qp::{InProgress, Qp};
use crate::qp_attr::{AccessFlags, QpType};
use crate::req::{gather, ip_repr, packets_for, send_opcode, validate};
use crate::wr::{SendFlags, SendOp};
use crate::{local, recv_wqe, Ctx, WcStatus};

/// The operations each QP type accepts in `post_send` (IBA 9.8.3 / table of valid opcodes):
/// UC has no READ, ATOMIC or SEND with invalidate; UD goes through `post_send_ud`. Public
/// for hosts that check a WR before handing it over (the daemon's work rings).
pub fn check_op(qp_type: QpType, op: &SendOp) -> Result<(), VerbsError> {
    let ok = match qp_type {
        QpType::Rc => true,
        QpType::Uc => matches!(
            op,
            SendOp::Send
                | SendOp::SendWithImm { .. }
                | SendOp::RdmaWrite { .. }
                | SendOp::RdmaWriteWithImm { .. }
                | SendOp::BindMw { .. }
                | SendOp::LocalInv { .. }
        ),
        QpType::Ud => false,
    };
    if ok {
        Ok(())
    } else {
        Err(VerbsError::OpNotSupported)
    }
}

/// The UC opcode of an RC SEND / WRITE opcode (same position and headers, transport bits
/// 001: IBA 9.2.1 table 38).
fn uc_opcode(rc: Opcode) -> Option<Opcode> {
    Opcode::from_u8(rc.code() | 0x20).ok()
}

/// Build the next packet of the WR at the head of the send queue into `buf`.
pub(crate) fn transmit<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    buf: &mut [u8],
) -> Option<usize> {
    loop {
        if !local::run_head(qp, ctx) {
            return None;
        }
        let state = qp.state();
        let path = qp.path?;
        let mtu = path.mtu;
        let w = qp.sq.front()?;
        if !w.started {
            // SQD lets a started message finish but starts none (IBA 10.3.1).
            if !state.starts_new_requests() {
                return None;
            }
            match validate(w, qp.pd, ctx.mrs) {
                Ok(owners) => {
                    if let Some(w) = qp.sq.front_mut() {
                        w.owners = owners;
                        w.started = true;
                        w.npkts = packets_for(w.len, mtu);
                    }
                    qp.req.cur_pkt = 0;
                }
                Err(status) => {
                    ctx.count(qp, Counter::ReqLocalError);
                    if let Some(w) = qp.sq.pop_front() {
                        local::fail_send(qp, ctx, &w, status);
                    }
                    return None;
                }
            }
        } else if !state.processes_responses() {
            return None;
        }
        let w = qp.sq.front()?;
        let k = qp.req.cur_pkt;
        let first = k == 0;
        let last = k + 1 >= w.npkts;
        let offset = u64::from(k) * u64::from(mtu);
        let opcode = uc_opcode(send_opcode(&w.op, first, last))?;
        let psn = qp.req.next_psn;
        let mut bth = BthRepr::new(opcode, Qpn::new(path.dest_qpn), psn);
        bth.solicited = last && w.flags.contains(SendFlags::SOLICITED);
        let mut t = TransportRepr::new(bth);
        match w.op {
            SendOp::RdmaWrite { remote_addr, rkey }
            | SendOp::RdmaWriteWithImm {
                remote_addr, rkey, ..
            } if first => {
                t.reth = Some(RethRepr {
                    va: remote_addr,
                    rkey,
                    dma_len: w.len as u32,
                });
            }
            _ => {}
        }
        if last {
            if let SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } = w.op {
                t.immdt = Some(imm);
            }
        }
        let plen = w.len.saturating_sub(offset).min(u64::from(mtu)) as usize;
        let ip = ip_repr(&path);
        let layout = PacketLayout::new(&ip, path.udp_src_port, ROCEV2_UDP_PORT, &t, plen).ok()?;
        if buf.len() < layout.len() {
            return None;
        }
        layout.emit_headers(buf).ok()?;
        if plen > 0 {
            let out = layout.payload_mut(buf).ok()?;
            if let Err(status) = gather(w, ctx.mem, offset, out) {
                ctx.count(qp, Counter::MemoryFault);
                if let Some(w) = qp.sq.pop_front() {
                    local::fail_send(qp, ctx, &w, status);
                }
                continue;
            }
        }
        let len = path.seal(&layout, buf).ok()?;
        qp.req.next_psn = psn.next();
        if last {
            local::complete_sent(qp, ctx);
        } else {
            qp.req.cur_pkt = k + 1;
        }
        return Some(len);
    }
}

/// Give up the message in progress: a SEND's receive WQE stays at the head of the queue and
/// the next message fills it from the start.
fn abandon<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>) {
    if qp.resp.in_progress.take().is_some() {
        ctx.count(qp, Counter::UcMessageDropped);
    }
}

/// A UC request packet for this QP (past the ingress checks and SRQ prefetch).
pub(crate) fn handle_request<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &RoceV2Packet<'_>,
) {
    let t = &pkt.transport;
    let psn = t.bth.psn;
    let op = t.bth.opcode;
    let d = psn.distance_from(qp.resp.epsn);
    if d < 0 {
        // Older than expected (a duplicate or a late packet): never executed twice.
        ctx.count(qp, Counter::RespDuplicateRequest);
        return;
    }
    if d > 0 {
        // Packets were lost: the message they belonged to is gone (IBA 9.8:
        // the UC responder resynchronises on the next FIRST or ONLY).
        ctx.count(qp, Counter::RespOutOfSequence);
        abandon(qp, ctx);
    }
    qp.resp.epsn = psn.next();
    let starts = op.is_first() || op.is_only();
    let same = matches!(
        (qp.resp.in_progress, op.kind()),
        (Some(InProgress::Send { .. }), OpKind::Send)
            | (Some(InProgress::Write { .. }), OpKind::RdmaWrite)
    );
    if qp.resp.in_progress.is_some() && (starts || !same) {
        // A message that never ended: its remaining packets were lost.
        abandon(qp, ctx);
    }
    if qp.resp.in_progress.is_none() && !starts {
        ctx.count(qp, Counter::UcPacketDropped);
        return;
    }
    let mtu = qp.path.map_or(256, |p| p.mtu) as usize;
    let plen = pkt.payload.len();
    // IBA 9.7.5.2 length rule, which UC shares: FIRST / MIDDLE carry one MTU, LAST / ONLY
    // at most one.
    let len_ok = if op.is_first() || op.is_middle() {
        plen == mtu
    } else {
        plen <= mtu
    };
    if !len_ok {
        abandon(qp, ctx);
        ctx.count(qp, Counter::UcPacketDropped);
        return;
    }
    match op.kind() {
        OpKind::Send => uc_send(qp, ctx, pkt),
        OpKind::RdmaWrite => uc_write(qp, ctx, pkt),
        _ => ctx.count(qp, Counter::RxBadOpcode),
    }
}

fn uc_send<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &RoceV2Packet<'_>) {
    let t = &pkt.transport;
    let op = t.bth.opcode;
    let offset = match qp.resp.in_progress {
        Some(InProgress::Send { offset }) => offset,
        _ => 0,
    };
    let Some(r) = qp.rq.front() else {
        // No receive WQE: UC has no RNR NAK, the message is dropped (IBA 9.8).
        ctx.count(qp, Counter::RxNoRecvWqe);
        return;
    };
    let plen = pkt.payload.len() as u64;
    let ends = op.is_last() || op.is_only();
    let result = if offset + plen > r.len {
        Err(WcStatus::LocLenErr)
    } else {
        recv_wqe::scatter(r, qp.pd, ctx.mrs, ctx.mem, offset, pkt.payload)
    };
    if let Err(status) = result {
        // The WQE completes in error; the rest of the message is dropped.
        if status == WcStatus::LocLenErr {
            ctx.count(qp, Counter::RespLocalLengthError);
        }
        qp.resp.in_progress = None;
        recv_wqe::complete(qp, ctx, false, |wc| {
            wc.status = status;
            wc.byte_len = (offset + plen) as u32;
        });
        return;
    }
    let total = offset + plen;
    if ends {
        qp.resp.in_progress = None;
        let imm = t.immdt;
        recv_wqe::complete(qp, ctx, t.bth.solicited, |wc| {
            wc.byte_len = total as u32;
            if let Some(imm) = imm {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
        });
    } else {
        qp.resp.in_progress = Some(InProgress::Send { offset: total });
    }
}

fn uc_write<M: Memory + ?Sized>(qp: &mut Qp, ctx: &mut Ctx<'_, M>, pkt: &RoceV2Packet<'_>) {
    let t = &pkt.transport;
    let op = t.bth.opcode;
    if op.is_first() || op.is_only() {
        let Some(reth) = t.reth else { return };
        let len = u64::from(reth.dma_len);
        let checked = if !qp.attr.qp_access_flags.contains(AccessFlags::REMOTE_WRITE) {
            Err(())
        } else if len == 0 {
            Ok(MemOwner::default())
        } else {
            mw::check_remote(
                ctx.mrs,
                ctx.mws,
                reth.rkey.value(),
                qp.pd,
                qp.qpn,
                reth.va,
                len,
                AccessFlags::REMOTE_WRITE,
            )
            .map_err(|_| ())
        };
        let Ok(owner) = checked else {
            // IBA 9.8 / 10.6: a UC request that fails its checks is dropped with its
            // message; no NAK exists on UC.
            ctx.count(qp, Counter::UcRemoteAccessDropped);
            return;
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
        return;
    };
    let plen = pkt.payload.len() as u64;
    let ends = op.is_last() || op.is_only();
    if plen > remaining || (ends && plen != remaining) {
        abandon(qp, ctx);
        ctx.count(qp, Counter::UcPacketDropped);
        return;
    }
    if plen > 0 && ctx.mem.write(owner, va, pkt.payload).is_err() {
        ctx.count(qp, Counter::MemoryFault);
        abandon(qp, ctx);
        return;
    }
    if !ends {
        qp.resp.in_progress = Some(InProgress::Write {
            owner,
            va: va + plen,
            remaining: remaining - plen,
            total,
        });
        return;
    }
    qp.resp.in_progress = None;
    if let Some(imm) = t.immdt {
        if qp.rq.is_empty() {
            ctx.count(qp, Counter::RxNoRecvWqe);
            return;
        }
        recv_wqe::complete(qp, ctx, t.bth.solicited, |wc| {
            wc.opcode = WcOpcode::RecvRdmaWithImm;
            wc.byte_len = total as u32;
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        });
    }
}
