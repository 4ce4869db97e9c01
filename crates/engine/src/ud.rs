//! Unreliable Datagram (IBA 9.8): single-packet SEND (with immediate) messages to any
//! QP named by an address handle, a destination QPN and a Q_Key; no acknowledgement, no
//! retransmission. The requester completes a WR when its packet leaves; the receiver checks
//! the Q_Key, puts the 40-byte GRH in front of the data and reports the source QP.

use std::net::IpAddr;

use wire::{
    BthRepr, DethRepr, Opcode, PacketLayout, Qkey, Qpn, RoceV2Packet, TransportRepr,
    ROCEV2_UDP_PORT,
};

use crate::ah::AhHandle;
use crate::counters::Counter;
use crate::cq::{NetworkHdr, WcFlags, WcOpcode};
use crate::error::VerbsError;
use crate::memory::Memory;
use crate::qp::{Path, Qp};
use crate::qp_attr::QpType;
use crate::req::{gather, ip_repr, validate};
use crate::wr::{SendFlags, SendOp, SendWr};
use crate::{local, recv_wqe, req, Ctx, Engine, Transmit, WcStatus};

/// Bytes of GRH at the start of every UD receive buffer (IBA 11.4.1.2 / `ibv_post_recv`).
pub const GRH_LEN: usize = 40;

/// Where a UD send goes (`wr.ud` of `ibv_send_wr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The address handle (same PD as the QP).
    pub ah: AhHandle,
    /// Destination QP number.
    pub remote_qpn: Qpn,
    /// Q_Key to send with; one with the high bit set means "the QP's own Q_Key" (the IBA
    /// Q_Key rules of chapter 10, as `ibv_post_send(3)` states them).
    pub remote_qkey: u32,
}

/// A queued UD WR's resolved destination.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdPath {
    pub(crate) path: Path,
    pub(crate) qkey: u32,
}

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_post_send` on a UD QP: a SEND or SEND with immediate to `dest`. A message longer
    /// than the port MTU is accepted and completes with `LOC_LEN_ERR` (IBA 9.8: a UD message
    /// is one packet), moving the QP to SQE.
    pub fn post_send_ud(&mut self, qpn: u32, wr: SendWr, dest: UdDest) -> Result<(), VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::InvalidQp)?;
        if qp.qp_type != QpType::Ud {
            return Err(VerbsError::OpNotSupported);
        }
        if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) {
            return Err(VerbsError::OpNotSupported);
        }
        let qp_pd = qp.pd;
        let own_qkey = qp.attr.qkey;
        let ah_pd = self.ahs.get(dest.ah.0).ok_or(VerbsError::InvalidAh)?.pd;
        if ah_pd != qp_pd {
            return Err(VerbsError::InvalidAh);
        }
        let path = self
            .ud_path(dest.ah, qpn, dest.remote_qpn.value())
            .ok_or(VerbsError::InvalidAh)?;
        let qkey = if dest.remote_qkey & 0x8000_0000 != 0 {
            own_qkey
        } else {
            dest.remote_qkey
        };
        let mut overflowed = Vec::new();
        let r = {
            let mut ctx = crate::ctx!(self, crate::Instant::default(), overflowed);
            let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::InvalidQp)?;
            let before = qp.sq.len();
            let r = req::post(qp, &mut ctx, wr);
            if qp.sq.len() > before {
                qp.ext.ud_dests.push_back(UdPath { path, qkey });
            }
            r
        };
        self.refile(qpn);
        self.error_overflowed(overflowed);
        r
    }
}

/// Build the packet of the UD WR at the head of the send queue into `buf`.
pub(crate) fn transmit<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    buf: &mut [u8],
) -> Option<Transmit> {
    loop {
        if !qp.state().starts_new_requests() {
            return None;
        }
        // WQEs leave the send queue from its head only (completions, flushes on ERR, RESET),
        // and each queued WQE pushed its destination: drop those of WQEs already gone.
        while qp.ext.ud_dests.len() > qp.sq.len() {
            qp.ext.ud_dests.pop_front();
        }
        let dest = *qp.ext.ud_dests.front()?;
        let w = qp.sq.front()?;
        let path = dest.path;
        if w.len > u64::from(path.mtu) {
            // Never truncated: the WR fails (IBA 9.8: a UD message is exactly one packet).
            ctx.count(qp, Counter::ReqLocalError);
            if let Some(w) = qp.sq.pop_front() {
                qp.ext.ud_dests.pop_front();
                local::fail_send(qp, ctx, &w, WcStatus::LocLenErr);
            }
            return None;
        }
        if !w.started {
            match validate(w, qp.pd, ctx.mrs) {
                Ok(owners) => {
                    if let Some(w) = qp.sq.front_mut() {
                        w.owners = owners;
                        w.started = true;
                    }
                }
                Err(status) => {
                    ctx.count(qp, Counter::ReqLocalError);
                    if let Some(w) = qp.sq.pop_front() {
                        qp.ext.ud_dests.pop_front();
                        local::fail_send(qp, ctx, &w, status);
                    }
                    return None;
                }
            }
        }
        let w = qp.sq.front()?;
        let psn = qp.req.next_psn;
        let mut bth = BthRepr::new(Opcode::UdSendOnly, Qpn::new(path.dest_qpn), psn);
        bth.solicited = w.flags.contains(SendFlags::SOLICITED);
        let mut t = TransportRepr::new(bth);
        if let SendOp::SendWithImm { imm } = w.op {
            t.bth.opcode = Opcode::UdSendOnlyImm;
            t.immdt = Some(imm);
        }
        t.deth = Some(DethRepr {
            qkey: Qkey::new(dest.qkey),
            src_qp: Qpn::new(qp.qpn),
        });
        let plen = w.len as usize;
        let ip = ip_repr(&path);
        let layout = PacketLayout::new(&ip, path.udp_src_port, ROCEV2_UDP_PORT, &t, plen).ok()?;
        if buf.len() < layout.len() {
            return None;
        }
        layout.emit_headers(buf).ok()?;
        if plen > 0 {
            let out = layout.payload_mut(buf).ok()?;
            if let Err(status) = gather(w, ctx.mem, 0, out) {
                ctx.count(qp, Counter::MemoryFault);
                if let Some(w) = qp.sq.pop_front() {
                    qp.ext.ud_dests.pop_front();
                    local::fail_send(qp, ctx, &w, status);
                }
                continue;
            }
        }
        let len = layout.finish(buf).ok()?;
        qp.req.next_psn = psn.next();
        local::complete_sent(qp, ctx);
        return Some(Transmit {
            len,
            dst: path.dst_ip,
            internal: false,
        });
    }
}

/// The 40 bytes a UD receive buffer starts with: the IPv6 header as received, or for IPv4
/// the 20-byte IPv4 header in the last 20 bytes (what Linux RoCE drivers write).
fn grh(ip: IpAddr, packet: &[u8]) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    match ip {
        IpAddr::V6(_) => {
            if let Some(h) = packet.get(..GRH_LEN) {
                g.copy_from_slice(h);
            }
        }
        IpAddr::V4(_) => {
            if let Some(h) = packet.get(..20) {
                g[20..].copy_from_slice(h);
            }
        }
    }
    g
}

/// A UD SEND for this QP (already past the ingress checks). Returns whether it took a
/// receive WQE (and so made a completion).
pub(crate) fn handle_request<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &RoceV2Packet<'_>,
    packet: &[u8],
) -> bool {
    let t = &pkt.transport;
    let Some(deth) = t.deth else {
        ctx.count(qp, Counter::RxMalformed);
        return false;
    };
    // IBA Q_Key check (chapter 10): a datagram whose Q_Key differs from the QP's is silently
    // dropped.
    if deth.qkey.value() != qp.attr.qkey {
        ctx.count(qp, Counter::RxQkeyMismatch);
        return false;
    }
    // Only a datagram that passed its checks takes a WQE from the SRQ.
    crate::srq::prefetch(qp, ctx, pkt);
    let Some(r) = qp.rq.front() else {
        // No receive WQE: UD has no RNR NAK, the datagram is lost (IBA 9.8).
        ctx.count(qp, Counter::RxNoRecvWqe);
        return false;
    };
    let g = grh(pkt.ip.src(), packet);
    let net = match pkt.ip.src() {
        IpAddr::V4(_) => NetworkHdr::Ipv4,
        IpAddr::V6(_) => NetworkHdr::Ipv6,
    };
    let total = (GRH_LEN + pkt.payload.len()) as u64;
    let mut status = WcStatus::Success;
    if total > r.len {
        status = WcStatus::LocLenErr;
        ctx.count(qp, Counter::RespLocalLengthError);
    } else if let Err(s) = recv_wqe::scatter(r, qp.pd, ctx.mrs, ctx.mem, 0, &g)
        .and_then(|()| recv_wqe::scatter(r, qp.pd, ctx.mrs, ctx.mem, GRH_LEN as u64, pkt.payload))
    {
        status = s;
    }
    let imm = t.immdt;
    let src_qp = deth.src_qp;
    recv_wqe::complete(qp, ctx, t.bth.solicited, |wc| {
        wc.status = status;
        wc.opcode = WcOpcode::Recv;
        wc.byte_len = total as u32;
        wc.src_qp = src_qp;
        wc.wc_flags |= WcFlags::GRH;
        wc.network_hdr = net;
        if let Some(imm) = imm {
            wc.imm_data = imm;
            wc.wc_flags |= WcFlags::WITH_IMM;
        }
    });
    true
}
