//! The queue pair object: its attributes, its two work queues, and the transport state each
//! NIC function (`req`, `comp`, `resp`) keeps in it; and the QP verbs (create, modify, query,
//! destroy, `post_send`, `post_recv`).

use std::collections::VecDeque;
use std::net::IpAddr;

use wire::Psn;

use crate::counters::Counters;
use crate::cq::CqHandle;
use crate::device::{EngineConfig, Gid, MAX_INTERNAL_MTU};
use crate::error::VerbsError;
use crate::memory::{MemOwner, Memory};
use crate::pd::PdHandle;
use crate::qp_attr::{PathMtu, QpAttr, QpAttrMask, QpCap, QpState, QpType};
use crate::time::Instant;
use crate::wr::{RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge};
use crate::{comp, ctx, qp_state, req, resp, srq, uc, Ctx, Engine, WcStatus, FIRST_QPN};

/// What `create_qp` needs (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitAttr {
    /// The protection domain of the QP.
    pub pd: crate::PdHandle,
    /// CQ for send completions.
    pub send_cq: CqHandle,
    /// CQ for receive completions.
    pub recv_cq: CqHandle,
    /// Queue sizes.
    pub cap: QpCap,
    /// Transport service.
    pub qp_type: QpType,
    /// Every send WR is signaled, whatever its flags say.
    pub sq_sig_all: bool,
}

/// The path of a connected QP, fixed when it enters RTR (from `ah_attr`, `dest_qp_num`,
/// `path_mtu`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Path {
    pub(crate) src_ip: IpAddr,
    pub(crate) dst_ip: IpAddr,
    pub(crate) dest_qpn: u32,
    pub(crate) mtu: u32,
    pub(crate) hop_limit: u8,
    pub(crate) traffic_class: u8,
    /// The 20-bit flow label ([`crate::AhAttr::grh_flow_label`]).
    pub(crate) flow_label: u32,
    pub(crate) udp_src_port: u16,
    /// The destination is served by the host's own process (`EngineConfig::internal_addresses`):
    /// packets are sealed without an ICRC and are only accepted from `handle_internal`.
    pub(crate) internal: bool,
}

impl Path {
    /// Seal a packet laid out for this path (pad, and the ICRC unless the path is internal);
    /// returns its length.
    pub(crate) fn seal(
        &self,
        layout: &wire::PacketLayout,
        buf: &mut [u8],
    ) -> Result<usize, wire::WireError> {
        if self.internal {
            layout.finish_internal(buf)
        } else {
            layout.finish(buf)
        }
    }
}

/// A send WR once accepted, plus what the requester and completer track about it.
#[derive(Debug)]
pub(crate) struct SendWqe {
    pub(crate) wr_id: u64,
    pub(crate) op: SendOp,
    pub(crate) payload: SendPayload,
    pub(crate) flags: SendFlags,
    pub(crate) signaled: bool,
    /// Message length in bytes.
    pub(crate) len: u64,
    /// PSNs are assigned when the first packet is sent; retransmissions reuse them.
    pub(crate) started: bool,
    pub(crate) first_psn: Psn,
    pub(crate) last_psn: Psn,
    /// Packets (PSNs) of the message: READ responses count, the READ request does not.
    pub(crate) npkts: u32,
    /// A local error found when the WR was executed; it completes with it once it is oldest.
    pub(crate) local_error: Option<WcStatus>,
    /// Owners of the local SGEs, checked when the WR started (same order as the SGEs).
    pub(crate) owners: Owners,
}

/// The owners of a WR's SGEs, in place for as many SGEs as a WR holds in place.
pub(crate) type Owners = smallvec::SmallVec<[MemOwner; crate::INLINE_SGES]>;

impl SendWqe {
    pub(crate) fn sges(&self) -> &[Sge] {
        match &self.payload {
            SendPayload::Sges(s) => s,
            SendPayload::Inline(_) => &[],
        }
    }
}

/// A receive WR once accepted.
#[derive(Debug)]
pub(crate) struct RecvWqe {
    pub(crate) wr_id: u64,
    pub(crate) sges: crate::SgeList,
    pub(crate) len: u64,
}

/// Requester and completer state (IBA 9.7.4 / 9.7.5.1).
#[derive(Debug, Default)]
pub(crate) struct ReqState {
    /// Index in the SQ of the WQE being (re)transmitted.
    pub(crate) cur: usize,
    /// Packet index within that WQE.
    pub(crate) cur_pkt: u32,
    /// PSN of the next packet to transmit.
    pub(crate) next_psn: Psn,
    /// One past the highest PSN ever assigned: anything at or after it was never sent.
    pub(crate) psn_hw: Psn,
    /// One past the highest PSN actually transmitted (a READ request covers all its
    /// response PSNs): responses beyond it are ghosts.
    pub(crate) sent_hw: Psn,
    /// Oldest unacknowledged PSN.
    pub(crate) una: Psn,
    /// READ / ATOMIC WQEs sent and not yet completed.
    pub(crate) rd_atomic_outstanding: u32,
    /// Retries left before RETRY_EXC_ERR (reset on forward progress).
    pub(crate) retry_left: u8,
    /// RNR retries left before RNR_RETRY_EXC_ERR (7 = infinite).
    pub(crate) rnr_retry_left: u8,
    /// Local ACK timer deadline.
    pub(crate) ack_deadline: Option<Instant>,
    /// After an RNR NAK: resend from `rnr_psn` at this time.
    pub(crate) rnr_until: Option<Instant>,
    pub(crate) rnr_psn: Psn,
    /// The PSN we last went back to without progress since: suppresses a second go-back for
    /// the same loss (duplicated NAKs, further out-of-order responses).
    pub(crate) last_rewind: Option<Psn>,
    /// Packets since the last one with AckReq.
    pub(crate) since_ack_req: u32,
    /// The headers of the last MIDDLE packet built, for the next one to copy (see
    /// [`MiddleHeaders`]); forgotten whenever the path changes.
    pub(crate) middle: Option<Box<MiddleHeaders>>,
}

/// What a MIDDLE packet's headers were: IBA 9.2 gives the MIDDLE packets of one message,
/// and of the next message of the same opcode on the same path, the same header bytes but
/// the BTH's PSN and AckReq, so the requester copies them instead of laying each packet out
/// afresh (`wire::PacketLayout::emit_headers_like`). A NIC does the same with a QP context's
/// header template.
#[derive(Debug)]
pub(crate) struct MiddleHeaders {
    /// The layout they were written by. Its lengths hold for every packet that copies
    /// them; its PSN and AckReq are the first packet's.
    layout: wire::PacketLayout,
    /// IP, UDP and BTH headers as `emit_headers` wrote them (a MIDDLE packet has no other),
    /// in the first `layout.header_len()` bytes.
    bytes: [u8; MIDDLE_HEADERS_MAX],
}

/// IPv6 (40) + UDP (8) + BTH (12), rounded up.
const MIDDLE_HEADERS_MAX: usize = 64;

impl MiddleHeaders {
    /// The headers (`Path::emit_headers` keeps only those that fit).
    fn headers(&self) -> &[u8] {
        &self.bytes[..self.layout.header_len()]
    }

    /// Whether they serve a packet of `opcode` with `payload_len` bytes on the same path.
    fn fits(&self, opcode: wire::Opcode, payload_len: usize) -> bool {
        self.layout.transport().bth.opcode == opcode
            && self.layout.payload_range().len() == payload_len
    }
}

impl Path {
    /// Step 1 of building a packet of `t` with `payload_len` bytes on this path: lay it out
    /// and write its headers into `buf`. A MIDDLE packet copies the ones `cache` holds when
    /// they fit (see [`MiddleHeaders`]), else leaves its own there for the next. Returns the
    /// layout to fill and seal, held in `cache` or in `fresh`; `None` when the packet cannot
    /// be laid out or `buf` is too small.
    pub(crate) fn emit_headers<'a>(
        &self,
        t: &wire::TransportRepr,
        payload_len: usize,
        buf: &mut [u8],
        cache: &'a mut Option<Box<MiddleHeaders>>,
        fresh: &'a mut Option<wire::PacketLayout>,
    ) -> Option<&'a wire::PacketLayout> {
        let middle = t.bth.opcode.is_middle();
        if middle
            && cache
                .as_ref()
                .is_some_and(|m| m.fits(t.bth.opcode, payload_len))
        {
            let m = cache.as_deref()?;
            m.layout
                .emit_headers_like(m.headers(), buf, t.bth.psn, t.bth.ack_req)
                .ok()?;
            return Some(&m.layout);
        }
        let ip = crate::req::ip_repr(self);
        let layout = wire::PacketLayout::new(
            &ip,
            self.udp_src_port,
            wire::ROCEV2_UDP_PORT,
            t,
            payload_len,
        )
        .ok()?;
        layout.emit_headers(buf).ok()?;
        let hl = layout.header_len();
        if middle && hl <= MIDDLE_HEADERS_MAX {
            let mut bytes = [0; MIDDLE_HEADERS_MAX];
            bytes[..hl].copy_from_slice(&buf[..hl]);
            let m = cache.insert(Box::new(MiddleHeaders { layout, bytes }));
            return Some(&m.layout);
        }
        Some(fresh.insert(layout))
    }
}

/// A READ or ATOMIC the responder executed, kept to answer its duplicates (IBA 9.7.5.2.5 /
/// 9.7.5.2.6: responder resources, `max_dest_rd_atomic` of them).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Resource {
    Read { first_psn: Psn, last_psn: Psn },
    Atomic { psn: Psn, orig: u64 },
}

/// One thing the responder has to send, in order.
#[derive(Debug, Clone, Copy)]
pub(crate) enum RespOut {
    /// A plain ACK (cumulative). Last in the queue, it waits until `held.due` (see
    /// [`crate::ack`]); anything queued behind it sends it first.
    Ack {
        psn: Psn,
        msn: u32,
        held: crate::ack::Held,
    },
    /// NAK or RNR NAK: never waits.
    Nak {
        psn: Psn,
        syndrome: wire::Syndrome,
        msn: u32,
    },
    /// RDMA READ RESPONSE packets still to send for one request.
    Read {
        /// PSN of the first response of this request (FIRST/ONLY).
        first_psn: Psn,
        /// Next PSN to send.
        psn: Psn,
        owner: MemOwner,
        rkey: u32,
        /// Address of the first byte of the request.
        va: u64,
        /// Total bytes of the request.
        len: u64,
        /// Bytes already sent.
        done: u64,
        msn: u32,
    },
    /// ATOMIC ACKNOWLEDGE.
    Atomic { psn: Psn, orig: u64, msn: u32 },
}

/// The message the responder is in the middle of.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InProgress {
    /// A multi-packet SEND filling the receive WQE at the head of the RQ.
    Send { offset: u64 },
    /// A multi-packet RDMA WRITE.
    Write {
        owner: MemOwner,
        va: u64,
        remaining: u64,
        total: u64,
    },
}

/// Responder state (IBA 9.7.5.2).
#[derive(Debug, Default)]
pub(crate) struct RespState {
    /// The headers of the last MIDDLE READ response built, for the next one to copy (see
    /// [`MiddleHeaders`]); forgotten whenever the path changes.
    pub(crate) middle: Option<Box<MiddleHeaders>>,
    /// Expected PSN.
    pub(crate) epsn: Psn,
    /// Message sequence number: messages completed (24 bits).
    pub(crate) msn: u32,
    pub(crate) in_progress: Option<InProgress>,
    /// A NAK sequence error was sent for the current gap (IBA 9.7.5.2.2: only one per gap).
    pub(crate) nak_sent: bool,
    pub(crate) resources: VecDeque<Resource>,
    pub(crate) out: VecDeque<RespOut>,
    /// Whether the peer waits for our ACKs (when ACKs in `out` are due).
    pub(crate) patience: crate::ack::Patience,
}

/// A queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) pd: PdHandle,
    pub(crate) send_cq: CqHandle,
    pub(crate) recv_cq: CqHandle,
    pub(crate) cap: QpCap,
    pub(crate) sq_sig_all: bool,
    pub(crate) attr: QpAttr,
    pub(crate) path: Option<Path>,
    pub(crate) sq: VecDeque<SendWqe>,
    pub(crate) rq: VecDeque<RecvWqe>,
    pub(crate) req: ReqState,
    pub(crate) resp: RespState,
    pub(crate) counters: Counters,
    /// State of the UC / UD / SRQ functions.
    pub(crate) ext: crate::qp_ext::QpExt,
    /// Its entries in the engine's requester timers and held-back ACKs, as last filed.
    pub(crate) filed: FiledTimers,
}

/// A QP's own record of what the engine's [`crate::timers::Timers`] and its queue of active
/// QPs hold for it.
#[derive(Debug, Default)]
pub(crate) struct FiledTimers {
    /// In `Engine::timers` (local ACK timeout, RNR wait).
    pub(crate) timer: crate::timers::Filed,
    /// In `Engine::acks` (a plain ACK held back until due).
    pub(crate) ack: crate::timers::Filed,
    /// In `Engine::active` (something to send that need not wait).
    pub(crate) active: bool,
}

impl Qp {
    pub(crate) fn state(&self) -> QpState {
        self.attr.qp_state
    }

    /// Whether `poll_transmit` may find something to send on this QP.
    pub(crate) fn may_transmit(&self) -> bool {
        !self.resp.out.is_empty() || self.req.cur < self.sq.len()
    }

    /// Whether it may have something to send that need not wait: a request, or a responder
    /// packet other than a plain ACK waiting alone (the engine files that one by when it is
    /// due, `resp::ack_due`).
    pub(crate) fn urgent(&self) -> bool {
        self.req.cur < self.sq.len()
            || (!self.resp.out.is_empty() && crate::resp::ack_due(self).is_none())
    }
}

/// The UDP source port of a connected QP's packets, as Linux computes it for RoCEv2
/// (`rdma_get_udp_sport`, used by rxe since 5.x and seen in our rxe captures): the GRH flow
/// label, or if it is 0 one derived from both QPNs, folded into the dynamic port range
/// 0xC000..=0xFFFF. One port per connection keeps its packets on one ECMP path, in order.
pub(crate) fn udp_src_port(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label & 0xf_ffff != 0 {
        flow_label & 0xf_ffff
    } else {
        let mut v = u64::from(lqpn) * u64::from(rqpn);
        v ^= v >> 20;
        v ^= v >> 40;
        (v & 0xf_ffff) as u32
    };
    let low = (fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14);
    0xc000 | low as u16
}

/// Local ACK timeout: 4.096 µs × 2^timeout (IBA 9.7.6.1.3); 0 means no timer.
pub(crate) fn ack_timeout(code: u8) -> Option<core::time::Duration> {
    if code == 0 {
        return None;
    }
    let ns = 4096u64 << code.min(31);
    Some(core::time::Duration::from_nanos(ns))
}

/// The RNR NAK timer of IBA table 45 (9.7.5.2.8), in microseconds, by 5-bit code.
pub(crate) fn rnr_timer(code: u8) -> core::time::Duration {
    const US: [u32; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560,
        3_840, 5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880,
        163_840, 245_760, 327_680, 491_520,
    ];
    core::time::Duration::from_micros(u64::from(US[usize::from(code & 31)]))
}

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_create_qp`: a QP in RESET. Returns its QP number.
    pub fn create_qp(&mut self, init: &QpInitAttr) -> Result<u32, VerbsError> {
        if self.pds.get(init.pd.0).is_none() {
            return Err(VerbsError::InvalidPd);
        }
        if self.cqs.get(init.send_cq.0).is_none() || self.cqs.get(init.recv_cq.0).is_none() {
            return Err(VerbsError::InvalidCq);
        }
        let d = &self.config.device;
        let cap = init.cap;
        for (what, requested, max) in [
            ("max_send_wr", cap.max_send_wr, d.max_qp_wr),
            ("max_recv_wr", cap.max_recv_wr, d.max_qp_wr),
            ("max_send_sge", cap.max_send_sge, d.max_sge),
            ("max_recv_sge", cap.max_recv_sge, d.max_sge),
            ("max_inline_data", cap.max_inline_data, d.max_inline_data),
        ] {
            if requested > max {
                return Err(VerbsError::CapExceeded {
                    what,
                    requested,
                    max,
                });
            }
        }
        if self.qps.len() >= d.max_qp as usize {
            return Err(VerbsError::TooMany("queue pairs"));
        }
        // QPNs are 24 bits; skip the special ones (QP0, QP1, the multicast QPN) and any
        // still in use.
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) || qpn < FIRST_QPN || qpn == crate::MULTICAST_QPN {
            qpn = (qpn + 1) & 0xff_ffff;
        }
        self.next_qpn = (qpn + 1) & 0xff_ffff;
        let attr = QpAttr {
            cap,
            ..QpAttr::default()
        };
        let qp = Qp {
            qpn,
            qp_type: init.qp_type,
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            cap,
            sq_sig_all: init.sq_sig_all,
            attr,
            path: None,
            sq: VecDeque::new(),
            rq: VecDeque::new(),
            req: ReqState::default(),
            resp: RespState::default(),
            counters: Counters::default(),
            ext: Default::default(),
            filed: FiledTimers::default(),
        };
        self.qps.insert(qpn, qp);
        // `handle_timeout` lists at most one entry per QP: room for all of them now, so the
        // first timer that ever fires (a local ACK timeout after a stall) allocates nothing.
        self.due.reserve(self.qps.len());
        // Likewise the set of QPs with something to send.
        self.active.reserve(self.qps.len());
        if let Some(p) = self.pds.get_mut(init.pd.0) {
            p.users += 1;
        }
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.cqs.get_mut(cq.0) {
                c.users += 1;
            }
        }
        Ok(qpn)
    }

    /// `ibv_destroy_qp`. Its WRs vanish without completions, as in verbs.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), VerbsError> {
        let qp = self.qps.remove(&qpn).ok_or(VerbsError::InvalidQp)?;
        self.active.remove(qpn, qp.filed.active);
        self.acks.file(qpn, None);
        self.timers.file(qpn, None);
        // The ACK it still owed its peer leaves on its behalf: the requests it acknowledges
        // were executed, and the peer would retry them into a QP that is gone.
        self.parting.extend(resp::parting_ack(&qp));
        self.mws.release_qp(qpn);
        // ibv_destroy_qp leaves every multicast group (rxe_drop_all_mcast_groups).
        self.mcast.detach_all(qpn);
        if let Some(p) = self.pds.get_mut(qp.pd.0) {
            p.users = p.users.saturating_sub(1);
        }
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.cqs.get_mut(cq.0) {
                c.users = c.users.saturating_sub(1);
            }
        }
        Ok(())
    }

    /// `ibv_query_qp`: the attributes as last set (with the current state and capacities).
    pub fn query_qp(&self, qpn: u32) -> Result<QpAttr, VerbsError> {
        let qp = self.qps.get(&qpn).ok_or(VerbsError::InvalidQp)?;
        let mut a = qp.attr;
        a.cap = qp.cap;
        a.cur_qp_state = a.qp_state;
        Ok(a)
    }

    /// The transport service QP `qpn` was created with.
    pub fn qp_type(&self, qpn: u32) -> Result<QpType, VerbsError> {
        Ok(self.qps.get(&qpn).ok_or(VerbsError::InvalidQp)?.qp_type)
    }

    fn limits(&self) -> qp_state::QpLimits {
        let d = &self.config.device;
        qp_state::QpLimits {
            max_rd_atomic: d.max_qp_init_rd_atom.min(255) as u8,
            max_dest_rd_atomic: d.max_qp_rd_atom.min(255) as u8,
            max_path_mtu: self.config.mtu,
            port_count: 1,
            pkey_table_len: 1,
            gid_table_len: self.gids.len().clamp(1, 0xffff) as u16,
            alt_path_supported: false,
        }
    }

    /// `ibv_modify_qp`: check the transition and attributes against the IBA table
    /// ([`qp_state::check_modify`]), then apply them. Entering ERR flushes both queues.
    pub fn modify_qp(
        &mut self,
        qpn: u32,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<(), VerbsError> {
        let limits = self.limits();
        let qp = self.qps.get(&qpn).ok_or(VerbsError::InvalidQp)?;
        let current = qp.state();
        let next = qp_state::check_modify(qp.qp_type, current, attr, mask, &limits)?;
        qp_state::check_sq_drained(current, next, qp.attr.sq_draining)?;
        let mut merged = qp.attr;
        merged.apply(attr, mask);
        // The path is fixed when the QP becomes able to receive (RTR) or when AV changes.
        // UD has no path: each WR names its destination (an address handle).
        let path = if !qp.qp_type.is_connected() {
            None
        } else if mask.contains(QpAttrMask::AV) || (next == QpState::Rtr && current != QpState::Rtr)
        {
            Some(self.path_of(qpn, &merged)?)
        } else {
            None
        };
        let mut overflowed = Vec::new();
        {
            let mut ctx = ctx!(self, Instant::default(), overflowed);
            let Some(qp) = self.qps.get_mut(&qpn) else {
                return Err(VerbsError::InvalidQp);
            };
            qp.attr = merged;
            qp.attr.qp_state = next;
            qp.attr.cur_qp_state = next;
            if let Some(p) = path {
                qp.path = Some(p);
                // Headers copied from packets of the old path would carry its addresses.
                qp.req.middle = None;
                qp.resp.middle = None;
            }
            if mask.contains(QpAttrMask::RETRY_CNT) {
                qp.req.retry_left = merged.retry_cnt;
            }
            if mask.contains(QpAttrMask::RNR_RETRY) {
                qp.req.rnr_retry_left = merged.rnr_retry;
            }
            if next != current {
                match next {
                    QpState::Reset => {
                        // IBA 10.3.1: RESET empties the work queues without completions.
                        // An ACK owed for executed requests still leaves (as on destroy).
                        self.parting.extend(resp::parting_ack(qp));
                        qp.sq.clear();
                        qp.rq.clear();
                        qp.req = ReqState::default();
                        qp.resp = RespState::default();
                        qp.path = None;
                        qp.attr = QpAttr {
                            cap: qp.cap,
                            ..QpAttr::default()
                        };
                    }
                    QpState::Rtr => {
                        qp.resp = RespState {
                            epsn: Psn::new(merged.rq_psn),
                            ..RespState::default()
                        };
                    }
                    QpState::Rts if current == QpState::Rtr => {
                        let psn = Psn::new(merged.sq_psn);
                        qp.req = ReqState {
                            next_psn: psn,
                            psn_hw: psn,
                            sent_hw: psn,
                            una: psn,
                            retry_left: merged.retry_cnt,
                            rnr_retry_left: merged.rnr_retry,
                            ..ReqState::default()
                        };
                    }
                    QpState::Err => {
                        srq::entered_error(qp, &mut ctx);
                        comp::enter_error(qp, &mut ctx);
                    }
                    QpState::Sqd => {
                        qp.attr.sq_draining = true;
                        comp::check_drained(qp, &mut ctx);
                    }
                    _ => {}
                }
            }
            // The path MTU may change in RTR -> RTS and later: keep the path in step.
            if let Some(p) = qp.path.as_mut() {
                p.mtu = segment_size(&self.config, qp.attr.path_mtu, p.internal);
                p.dest_qpn = qp.attr.dest_qp_num.value();
            }
        }
        if next == QpState::Reset && current != QpState::Reset {
            self.clean_cqs(qpn);
        }
        self.refile(qpn);
        self.error_overflowed(overflowed);
        Ok(())
    }

    /// Remove the completions of QP `qpn` that wait in its CQs: a QP that was reset starts
    /// afresh, and the completions of the WRs it had (flushes, mostly) must not be taken
    /// for the new WRs' (mlx4 and mlx5 clean the CQs on RESET the same way; pyverbs' tests
    /// that reset an erred QP and go on rely on it).
    fn clean_cqs(&mut self, qpn: u32) {
        let Some(qp) = self.qps.get(&qpn) else {
            return;
        };
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.cqs.get_mut(cq.0) {
                c.entries.retain(|wc| wc.qp_num.value() != qpn);
            }
        }
    }

    fn path_of(&self, qpn: u32, a: &QpAttr) -> Result<Path, VerbsError> {
        let sgid = self
            .gids
            .get(usize::from(a.ah_attr.sgid_index))
            .ok_or(VerbsError::InvalidGidIndex(u32::from(a.ah_attr.sgid_index)))?;
        let src_ip = sgid.to_ip();
        let dst_ip = Gid(a.ah_attr.dgid).to_ip();
        if src_ip.is_ipv4() != dst_ip.is_ipv4() {
            // RoCEv2 cannot mix families: the GRH becomes one IP header.
            return Err(VerbsError::InvalidGidIndex(u32::from(a.ah_attr.sgid_index)));
        }
        let internal = self.config.internal_addresses.contains(&dst_ip);
        Ok(Path {
            src_ip,
            dst_ip,
            dest_qpn: a.dest_qp_num.value(),
            mtu: segment_size(&self.config, a.path_mtu, internal),
            internal,
            hop_limit: a.ah_attr.hop_limit,
            traffic_class: a.ah_attr.traffic_class,
            flow_label: a.ah_attr.grh_flow_label(),
            udp_src_port: self.config.udp_src_port.unwrap_or_else(|| {
                udp_src_port(a.ah_attr.grh_flow_label(), qpn, a.dest_qp_num.value())
            }),
        })
    }

    /// `ibv_post_send` of one WR. Checks what verbs checks at post time (state, queue room,
    /// SGE count, inline size); keys are checked when the WR executes, and their failures
    /// come back as LOC_PROT_ERR / LOC_LEN_ERR completions.
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), VerbsError> {
        let mut overflowed = Vec::new();
        let r = {
            let mut ctx = ctx!(self, Instant::default(), overflowed);
            let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::InvalidQp)?;
            uc::check_op(qp.qp_type, &wr.op)?;
            let r = req::post(qp, &mut ctx, wr);
            crate::refile(&mut self.active, &mut self.acks, &mut self.timers, qp);
            r
        };
        self.error_overflowed(overflowed);
        r
    }

    /// `ibv_post_recv` of one WR.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), VerbsError> {
        let mut overflowed = Vec::new();
        let r = {
            let mut ctx = ctx!(self, Instant::default(), overflowed);
            let qp = self.qps.get_mut(&qpn).ok_or(VerbsError::InvalidQp)?;
            if qp.ext.srq.is_some() {
                // IBA 10.2.9: a QP with an SRQ has no receive queue of its own.
                return Err(VerbsError::OpNotSupported);
            }
            resp::post_recv(qp, &mut ctx, wr)
        };
        self.error_overflowed(overflowed);
        r
    }
}

/// Payload bytes per packet of a connected QP: its path MTU within the port's, or on an
/// internal path the internal segment size.
fn segment_size(config: &EngineConfig, path_mtu: PathMtu, internal: bool) -> u32 {
    let mtu = path_mtu.bytes().min(config.mtu.bytes()) as u32;
    if internal {
        config.internal_mtu.clamp(mtu, MAX_INTERNAL_MTU.max(mtu))
    } else {
        mtu
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryError;

    #[test]
    fn udp_source_ports_match_linux_rxe_captures() {
        // shared/testdata/rxe-verbs-suite.pcap: QPs 0x11..0x14 talking to peers of the same
        // number use ports 49441, 49476, 49513, 49552.
        assert_eq!(udp_src_port(0, 0x11, 0x11), 49441);
        assert_eq!(udp_src_port(0, 0x12, 0x12), 49476);
        assert_eq!(udp_src_port(0, 0x13, 0x13), 49513);
        assert_eq!(udp_src_port(0, 0x14, 0x14), 49552);
        assert!(udp_src_port(0xf_ffff, 1, 2) >= 0xc000);
    }

    struct NoMemory;

    impl Memory for NoMemory {
        fn read(&mut self, _: MemOwner, addr: u64, b: &mut [u8]) -> Result<(), MemoryError> {
            Err(MemoryError::Fault { addr, len: b.len() })
        }
        fn write(&mut self, _: MemOwner, addr: u64, d: &[u8]) -> Result<(), MemoryError> {
            Err(MemoryError::Fault { addr, len: d.len() })
        }
        fn compare_swap(
            &mut self,
            _: MemOwner,
            addr: u64,
            _: u64,
            _: u64,
        ) -> Result<u64, MemoryError> {
            Err(MemoryError::Fault { addr, len: 8 })
        }
        fn fetch_add(&mut self, _: MemOwner, addr: u64, _: u64) -> Result<u64, MemoryError> {
            Err(MemoryError::Fault { addr, len: 8 })
        }
    }

    #[test]
    fn qpns_wrap_past_the_multicast_qpn_and_the_special_qps() {
        let ip = IpAddr::from([10, 0, 0, 1]);
        let mut e = Engine::new(EngineConfig::new(vec![ip], 1), Box::new(NoMemory));
        let pd = e.alloc_pd().unwrap();
        let cq = e.create_cq(16).unwrap();
        let init = QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap: QpCap::default(),
            qp_type: QpType::Ud,
            sq_sig_all: false,
        };
        e.next_qpn = 0xff_fffe;
        let qpns: Vec<u32> = (0..3).map(|_| e.create_qp(&init).unwrap()).collect();
        assert_eq!(qpns, [0xff_fffe, FIRST_QPN, FIRST_QPN + 1]);
    }

    #[test]
    fn timers_follow_iba() {
        assert_eq!(ack_timeout(0), None);
        assert_eq!(ack_timeout(1), Some(core::time::Duration::from_nanos(8192)));
        assert_eq!(
            ack_timeout(14),
            Some(core::time::Duration::from_nanos(4096 << 14))
        );
        assert_eq!(rnr_timer(0), core::time::Duration::from_micros(655_360));
        assert_eq!(rnr_timer(1), core::time::Duration::from_micros(10));
        assert_eq!(rnr_timer(31), core::time::Duration::from_micros(491_520));
    }
}
