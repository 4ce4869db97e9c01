//! The requester: accepts send WRs and turns them into request packets (IBA 9.7.4).
//!
//! Each WQE gets its PSNs when its first packet leaves; a retransmission (go-back-N from a
//! PSN, decided by the completer) rewinds `cur`/`cur_pkt`/`next_psn` and rebuilds the same
//! packets from memory. Payload bytes go from registered memory straight into the transmit
//! buffer.

use std::net::IpAddr;

use wire::{
    AtomicEthRepr, BthRepr, IpRepr, Ipv4Repr, Ipv6Repr, Opcode, Psn, Qpn, RethRepr, TransportRepr,
};

use crate::counters::Counter;
use crate::error::VerbsError;
use crate::memory::MemOwner;
use crate::memory::Memory;
use crate::mr::MrTable;
use crate::pd::PdHandle;
use crate::qp::{Path, Qp, SendWqe};
use crate::wr::{SendFlags, SendOp, SendPayload, SendWr};
use crate::{comp, Ctx, WcStatus, MAX_MSG_SIZE};

/// `ibv_post_send` checks (IBA 10.8.2 / 11.4.1.1) and queueing.
pub(crate) fn post<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    wr: SendWr,
) -> Result<(), VerbsError> {
    let state = qp.state();
    if !state.can_post_send() {
        return Err(VerbsError::InvalidState(state));
    }
    match &wr.payload {
        SendPayload::Sges(s) => {
            if s.len() > qp.cap.max_send_sge as usize {
                return Err(VerbsError::TooManySge {
                    sges: s.len(),
                    max: qp.cap.max_send_sge,
                });
            }
        }
        SendPayload::Inline(d) => {
            if wr.op.is_read_or_atomic() {
                return Err(VerbsError::OpNotSupported);
            }
            if d.len() > qp.cap.max_inline_data as usize {
                return Err(VerbsError::InlineTooLarge {
                    len: d.len(),
                    max: qp.cap.max_inline_data,
                });
            }
        }
    }
    if qp.sq.len() >= qp.cap.max_send_wr as usize {
        return Err(VerbsError::QueueFull);
    }
    let signaled = qp.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
    let len = wr.payload.len();
    let wqe = SendWqe {
        wr_id: wr.wr_id,
        op: wr.op,
        payload: wr.payload,
        flags: wr.flags,
        signaled,
        len,
        started: false,
        first_psn: Psn::new(0),
        last_psn: Psn::new(0),
        npkts: 0,
        local_error: None,
        owners: crate::qp::Owners::new(),
    };
    if state.flushes_send_queue() {
        // IBA 10.3.1 (Error state): WRs posted now complete with a flush error, in order
        // behind the ones already flushed.
        comp::flush_one(qp, ctx, &wqe);
        return Ok(());
    }
    qp.sq.push_back(wqe);
    Ok(())
}

/// Packets a message of `len` bytes takes at `mtu` (at least one: zero-length messages are
/// one packet without payload).
pub(crate) fn packets_for(len: u64, mtu: u32) -> u32 {
    let mtu = u64::from(mtu.max(1));
    len.div_ceil(mtu).max(1) as u32
}

/// The execution-time checks of a WQE's local buffers (IBA 10.6.3.2 / C10-?: lkey, PD,
/// bounds, and LOCAL_WRITE where the HCA writes them). Returns the memory owners.
pub(crate) fn validate(
    wqe: &SendWqe,
    pd: PdHandle,
    mrs: &MrTable,
) -> Result<crate::qp::Owners, WcStatus> {
    if wqe.len > u64::from(MAX_MSG_SIZE) {
        return Err(WcStatus::LocLenErr);
    }
    if wqe.op.is_atomic() && wqe.len != 8 {
        // The original value of the remote word lands in exactly 8 local bytes.
        return Err(WcStatus::LocLenErr);
    }
    let write = wqe.op.is_read_or_atomic();
    let mut owners = crate::qp::Owners::with_capacity(wqe.sges().len());
    for sge in wqe.sges() {
        if sge.length == 0 {
            owners.push(MemOwner::default());
            continue;
        }
        let owner = mrs
            .check_local(sge.lkey.value(), pd, sge.addr, u64::from(sge.length), write)
            .map_err(|_| WcStatus::LocProtErr)?;
        owners.push(owner);
    }
    Ok(owners)
}

/// The IP header of a packet on `path`: IPv4 with ID 0 and DF (what an unconnected UDP
/// socket with `IP_PMTUDISC_DO` sends, so the ICRC computed here is the one received), or
/// IPv6.
pub(crate) fn ip_repr(path: &Path) -> IpRepr {
    ip_header(
        path.src_ip,
        path.dst_ip,
        path.traffic_class,
        path.flow_label,
        path.hop_limit,
    )
}

/// The IP header of a MAD from QP1: no path, so what Linux rxe sends its MADs with
/// (traffic class 0, hop limit 64).
pub(crate) fn gsi_ip_repr(src: IpAddr, dst: IpAddr) -> IpRepr {
    ip_header(src, dst, 0, 0, 64)
}

fn ip_header(
    src: IpAddr,
    dst: IpAddr,
    traffic_class: u8,
    flow_label: u32,
    hop_limit: u8,
) -> IpRepr {
    match (src, dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => IpRepr::V4(Ipv4Repr {
            src,
            dst,
            tos: traffic_class,
            ident: 0,
            dont_frag: true,
            ttl: hop_limit,
            payload_len: 0,
        }),
        (src, dst) => IpRepr::V6(Ipv6Repr {
            src: match src {
                IpAddr::V6(a) => a,
                IpAddr::V4(a) => a.to_ipv6_mapped(),
            },
            dst: match dst {
                IpAddr::V6(a) => a,
                IpAddr::V4(a) => a.to_ipv6_mapped(),
            },
            traffic_class,
            flow_label,
            hop_limit,
            payload_len: 0,
        }),
    }
}

/// Gather `out.len()` bytes of the message starting at byte `offset` from its SGEs (or inline
/// data) into `out`.
pub(crate) fn gather<M: Memory + ?Sized>(
    wqe: &SendWqe,
    mem: &mut M,
    mut offset: u64,
    out: &mut [u8],
) -> Result<(), WcStatus> {
    match &wqe.payload {
        SendPayload::Inline(d) => {
            let start = usize::try_from(offset).map_err(|_| WcStatus::LocLenErr)?;
            let src = d.get(start..start + out.len()).ok_or(WcStatus::LocLenErr)?;
            out.copy_from_slice(src);
            Ok(())
        }
        SendPayload::Sges(sges) => {
            let mut filled = 0usize;
            for (i, sge) in sges.iter().enumerate() {
                if filled == out.len() {
                    break;
                }
                let l = u64::from(sge.length);
                if offset >= l {
                    offset -= l;
                    continue;
                }
                let n = ((l - offset) as usize).min(out.len() - filled);
                let owner = wqe.owners.get(i).copied().unwrap_or_default();
                mem.read(owner, sge.addr + offset, &mut out[filled..filled + n])
                    .map_err(|_| WcStatus::LocProtErr)?;
                filled += n;
                offset = 0;
            }
            if filled == out.len() {
                Ok(())
            } else {
                Err(WcStatus::LocLenErr)
            }
        }
    }
}

pub(crate) fn send_opcode(op: &SendOp, first: bool, last: bool) -> Opcode {
    use Opcode::*;
    match (op, first, last) {
        (SendOp::Send, true, true) => RcSendOnly,
        (SendOp::SendWithImm { .. }, true, true) => RcSendOnlyImm,
        (SendOp::SendWithInv { .. }, true, true) => RcSendOnlyInv,
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, true, false) => {
            RcSendFirst
        }
        (SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. }, false, false) => {
            RcSendMiddle
        }
        (SendOp::Send, false, true) => RcSendLast,
        (SendOp::SendWithImm { .. }, false, true) => RcSendLastImm,
        (SendOp::SendWithInv { .. }, false, true) => RcSendLastInv,
        (SendOp::RdmaWrite { .. }, true, true) => RcRdmaWriteOnly,
        // Binds and local invalidations never reach the wire (`local` runs them).
        (SendOp::BindMw { .. } | SendOp::LocalInv { .. }, _, _) => RcRdmaWriteOnly,
        // READ and ATOMIC requests are built elsewhere; they are never segmented.
        (SendOp::RdmaRead { .. }, _, _) => RcRdmaReadRequest,
        (SendOp::AtomicCmpSwap { .. }, _, _) => RcCompareSwap,
        (SendOp::AtomicFetchAdd { .. }, _, _) => RcFetchAdd,
        (SendOp::RdmaWriteWithImm { .. }, true, true) => RcRdmaWriteOnlyImm,
        (_, true, false) => RcRdmaWriteFirst,
        (_, false, false) => RcRdmaWriteMiddle,
        (SendOp::RdmaWriteWithImm { .. }, false, true) => RcRdmaWriteLastImm,
        (_, false, true) => RcRdmaWriteLast,
    }
}

/// Build the next request packet of this QP into `buf`, if the requester may send one now.
pub(crate) fn transmit<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    buf: &mut [u8],
) -> Option<usize> {
    let state = qp.state();
    if !state.processes_responses() || qp.req.rnr_until.is_some() {
        return None;
    }
    let path = qp.path?;
    let mtu = path.mtu;
    let idx = qp.req.cur;
    let max_rd = u32::from(qp.attr.max_rd_atomic.max(1));
    // IBA 9.7.7.1 flow control by a window of unacknowledged PSNs (our own limit).
    if qp.req.next_psn.distance_from(qp.req.una) >= ctx.max_unacked as i32 {
        return None;
    }
    let outstanding = qp.req.rd_atomic_outstanding;
    let wqe = qp.sq.get_mut(idx)?;
    if wqe.local_error.is_some() {
        // Waits for the completer to report it once everything before it completed.
        return None;
    }
    let fresh = !wqe.started;
    if fresh {
        if !state.starts_new_requests() {
            return None;
        }
        // IBA 10.8.3.3: a fenced WR waits for every earlier READ / ATOMIC to complete.
        if wqe.flags.contains(SendFlags::FENCE) && outstanding > 0 {
            return None;
        }
        // IBA 9.7.4.1.7 / 11.2.5: at most max_rd_atomic READ / ATOMIC outstanding.
        if wqe.op.is_read_or_atomic() && outstanding >= max_rd {
            return None;
        }
        match validate(wqe, qp.pd, ctx.mrs) {
            Ok(owners) => wqe.owners = owners,
            Err(status) => {
                wqe.local_error = Some(status);
                ctx.count(qp, Counter::ReqLocalError);
                comp::complete_ready(qp, ctx);
                return None;
            }
        }
    }
    // Lay the packet out before changing any state: a too-small buffer changes nothing.
    let wqe = qp.sq.get(idx)?;
    let npkts = if fresh {
        if wqe.op.is_atomic() {
            1
        } else {
            packets_for(wqe.len, mtu)
        }
    } else {
        wqe.npkts
    };
    let psn = if fresh {
        qp.req.psn_hw
    } else {
        qp.req.next_psn
    };
    let k = if fresh { 0 } else { qp.req.cur_pkt };
    let offset = u64::from(k) * u64::from(mtu);
    let last = k + 1 >= npkts;
    let mut bth = BthRepr::new(Opcode::RcSendOnly, Qpn::new(path.dest_qpn), psn);
    let mut t;
    let mut payload_len = 0usize;
    match wqe.op {
        SendOp::RdmaRead { remote_addr, rkey } => {
            bth.opcode = Opcode::RcRdmaReadRequest;
            bth.ack_req = true;
            t = TransportRepr::new(bth);
            // A retried READ asks only for the part not yet received (IBA 9.7.5.1,
            // as rxe does):
            // the responder answers it as a new request starting at this PSN.
            t.reth = Some(RethRepr {
                va: remote_addr.wrapping_add(offset),
                rkey,
                dma_len: wqe.len.saturating_sub(offset) as u32,
            });
        }
        SendOp::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            bth.opcode = Opcode::RcCompareSwap;
            bth.ack_req = true;
            t = TransportRepr::new(bth);
            t.atomic_eth = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: swap,
                compare,
            });
        }
        SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            bth.opcode = Opcode::RcFetchAdd;
            bth.ack_req = true;
            t = TransportRepr::new(bth);
            t.atomic_eth = Some(AtomicEthRepr {
                va: remote_addr,
                rkey,
                swap_add: add,
                compare: 0,
            });
        }
        op => {
            let first = k == 0;
            bth.opcode = send_opcode(&op, first, last);
            payload_len = wqe.len.saturating_sub(offset).min(u64::from(mtu)) as usize;
            // AckReq on the last packet of a message, every `ack_req_every` packets, and when
            // the window is about to close, so the responder's ACKs keep us moving.
            let window_closing =
                qp.req.next_psn.distance_from(qp.req.una) + 1 >= ctx.max_unacked as i32;
            // Every retransmitted packet asks for an ACK too: after a loss, the sooner the
            // requester hears of progress, the fewer retries a lossy path burns.
            let resend = psn.is_before(qp.req.sent_hw);
            bth.ack_req =
                last || resend || qp.req.since_ack_req + 1 >= ctx.ack_req_every || window_closing;
            bth.solicited = last && wqe.flags.contains(SendFlags::SOLICITED);
            t = TransportRepr::new(bth);
            if first {
                match op {
                    SendOp::RdmaWrite { remote_addr, rkey }
                    | SendOp::RdmaWriteWithImm {
                        remote_addr, rkey, ..
                    } => {
                        t.reth = Some(RethRepr {
                            va: remote_addr,
                            rkey,
                            dma_len: wqe.len as u32,
                        });
                    }
                    _ => {}
                }
            }
            if last {
                match op {
                    SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => {
                        t.immdt = Some(imm);
                    }
                    SendOp::SendWithInv { rkey } => t.ieth = Some(rkey),
                    _ => {}
                }
            }
        }
    }
    let mut laid_out = None;
    let layout = path.emit_headers(&t, payload_len, buf, &mut qp.req.middle, &mut laid_out)?;
    if payload_len > 0 {
        let out = layout.payload_mut(buf).ok()?;
        if let Err(status) = gather(wqe, ctx.mem, offset, out) {
            ctx.count(qp, Counter::MemoryFault);
            // Nothing consistent can follow a message that cannot be read: the WR fails
            // once it is the oldest.
            if let Some(w) = qp.sq.get_mut(idx) {
                w.local_error = Some(status);
            }
            comp::complete_ready(qp, ctx);
            return None;
        }
    }
    let len = path.seal(layout, buf).ok()?;

    // Commit.
    let is_rd_atomic = wqe.op.is_read_or_atomic();
    let is_read = matches!(wqe.op, SendOp::RdmaRead { .. });
    let retransmit = psn.is_before(qp.req.sent_hw);
    let ack_req = t.bth.ack_req;
    let w = qp.sq.get_mut(idx)?;
    if fresh {
        w.started = true;
        w.first_psn = psn;
        w.npkts = npkts;
        w.last_psn = psn.add(npkts - 1);
        qp.req.psn_hw = psn.add(npkts);
        if is_rd_atomic {
            qp.req.rd_atomic_outstanding += 1;
        }
    }
    // A READ request stands for all its response PSNs.
    let advance = if is_read { npkts - k } else { 1 };
    qp.req.next_psn = psn.add(advance);
    if qp.req.next_psn.is_after(qp.req.sent_hw) {
        qp.req.sent_hw = qp.req.next_psn;
    }
    if k + advance >= npkts {
        qp.req.cur = idx + 1;
        qp.req.cur_pkt = 0;
    } else {
        qp.req.cur_pkt = k + advance;
    }
    qp.req.since_ack_req = if ack_req { 0 } else { qp.req.since_ack_req + 1 };
    if retransmit {
        ctx.count(qp, Counter::ReqRetransmittedPackets);
    }
    comp::arm_ack_timer(qp, ctx.now);
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segmentation_counts() {
        assert_eq!(packets_for(0, 1024), 1);
        assert_eq!(packets_for(1, 1024), 1);
        assert_eq!(packets_for(1024, 1024), 1);
        assert_eq!(packets_for(1025, 1024), 2);
        assert_eq!(packets_for(1 << 31, 256), 1 << 23);
    }

    #[test]
    fn opcodes_by_position() {
        assert_eq!(send_opcode(&SendOp::Send, true, true), Opcode::RcSendOnly);
        assert_eq!(
            send_opcode(&SendOp::SendWithImm { imm: 1 }, false, true),
            Opcode::RcSendLastImm
        );
        let w = SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: crate::Rkey::new(0),
            imm: 0,
        };
        assert_eq!(send_opcode(&w, true, false), Opcode::RcRdmaWriteFirst);
        assert_eq!(send_opcode(&w, false, false), Opcode::RcRdmaWriteMiddle);
        assert_eq!(send_opcode(&w, false, true), Opcode::RcRdmaWriteLastImm);
        assert_eq!(send_opcode(&w, true, true), Opcode::RcRdmaWriteOnlyImm);
    }
}
