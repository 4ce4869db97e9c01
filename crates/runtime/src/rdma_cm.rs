//! The device's connection manager, hosted: what the kernel's rdma_cm does for its users,
//! over the sans-IO [`cm::Cm`].
//!
//! Every runtime owns one [`cm::Cm`] for its port. Wherever the runtime runs the engine (the
//! progress thread, a polling or waiting application thread, a verb's guard being dropped),
//! it also pumps the CM: MADs the engine received on QP1 go to [`cm::Cm::handle_mad`], what
//! the CM has to send goes to [`engine::Engine::send_mad`] (from the local address the
//! peer's MADs arrive on, or the device's first address of the peer's family), and the CM's
//! timers join the engine's in the progress thread's wait.
//!
//! ## Who does what
//! Consumers (the Rust API, the daemon for its clients) call [`EngineGuard::cm_listen`],
//! [`EngineGuard::cm_connect`], [`EngineGuard::cm_resolve`] (SIDR, for UD services),
//! [`EngineGuard::cm_accept`], [`EngineGuard::cm_reject`] and
//! [`EngineGuard::cm_disconnect`], and take [`CmEvent`]s from a [`CmChannel`] (an `eventfd`
//! readable while events wait, like `rdma_event_channel`). The consumer creates the QP; the
//! runtime moves it through its states, as the kernel's rdma_cm does for librdmacm users
//! (`cma_modify_qp_rtr`/`_rts`/`_err`), so no consumer repeats that logic:
//! - connect: a QP in RESET goes to INIT (a QP in INIT stays as the consumer set it up);
//!   on the REP the QP goes to RTR and RTS (peer's QPN, PSN and GID, the REQ's path MTU)
//!   before the RTU leaves, then [`CmEvent::Established`] is delivered;
//! - accept: RESET → INIT, then RTR and RTS from the REQ, before the REP leaves (Linux's
//!   `cma_accept_ib` does both before `ib_send_cm_rep`: the QP may answer the active side's
//!   first packets even if the RTU is lost); the RTU brings [`CmEvent::Established`];
//! - disconnect: the QP goes to ERR first (its outstanding WRs flush, as `rdma_disconnect`
//!   does), then the DREQ leaves; a DREQ received moves the QP to ERR too (the kernel leaves
//!   that to the user's `rdma_disconnect`: here a QP whose peer is gone is flushed at once);
//! - a REJ, a timeout or a failed transition move the QP to ERR.
//!
//! A consumer may instead move its QP itself (rdma_cm ids without a QP, as UCX and
//! libfabric use them): it connects or accepts with no QP and [`ConnParam::qp_num`], takes
//! the QP through its states with [`EngineGuard::cm_init_qp_attr`] (the attributes computed
//! by the same code that moves the runtime's QPs), and on the active side answers
//! [`CmEvent::ConnectResponse`] with [`EngineGuard::cm_establish`], which sends the RTU.
//! The runtime then touches no QP, not even on a REJ or a disconnect.
//!
//! ## ECE
//! [`ConnParam::ece`] goes into the REQ (connect) or the REP (accept) exactly as given, as
//! Linux's CM sends what rdma_cm hands it; the peer's arrives as [`ConnectRequest::ece`]
//! and, on the active side, with [`CmEvent::Established`] or [`CmEvent::ConnectResponse`].
//! Choosing what to answer (rdma-core's `rdma_accept` echoes the REQ's vendor ID with its
//! own options) and refusing options ([`EngineGuard::cm_reject`] with reason 35) is the
//! consumer's business: the runtime negotiates nothing.
//!
//! ## Whose PSN is whose
//! A REQ's or REP's starting PSN is the first PSN its *sender* expects to receive: the
//! peer starts sending from it. That is how Linux's CM reads both (`ib_send_cm_req` keeps
//! the REQ's PSN as the active side's `rq_psn`, `cm_req_handler` makes it the passive
//! side's `sq_psn`, and the REP the other way round), as the kernel-to-kernel captures in
//! `shared/testdata/rxe-cm-*.pcap` show: the active side's first SEND carries the REP's
//! PSN. Reading them the other way works between two softrdma devices and fails against
//! anything else (kernel rxe answers our first SEND as a duplicate).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cm::{Cm, CmError, Event, State};
use engine::{AccessFlags, AhAttr, Gid, Instant, QpAttr, QpAttrMask, QpState, QpType, VerbsError};
use wire::{
    CmPathRepr, CmaAddrs, CmaHeaderRepr, Mtu, PrivateData, Psn, Qpn, RejectReason, RepRepr,
    ReqRepr, ServiceId, ServiceType, SidrRepRepr, SidrReqRepr, SidrStatus, CMA_HEADER_LEN, MAD_LEN,
};

pub use cm::{CmConfig, CmEvent, CommId, ConnParam, ConnectRequest, Ece};

use crate::{lock_leaf, Attachment, EngineGuard, Notifier, RuntimeError, SendEngine};

/// What a device's connection manager counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CmCounters {
    /// The CM's own: MADs received, sent, resent, answered again, dropped by reason.
    pub cm: cm::Counters,
    /// MADs the CM sent that QP1 could not queue (its send queue full, or no local address
    /// of the peer's family); lost as on a wire, what expects an answer is resent.
    pub tx_not_queued: u64,
    /// Connections consumers hold now (from a connect, or a request not yet answered or
    /// destroyed): what must come back to its earlier value when they are all destroyed.
    pub connections: u64,
    /// Connections the CM itself still tracks, those closing or in time-wait included.
    pub cm_connections: u64,
    /// Services listened on.
    pub listens: u64,
}

impl CmCounters {
    /// Every counter with its name (`cm_received`, `cm_dropped_malformed`...), as the
    /// daemon's `stat` shows them.
    pub fn named(&self) -> Vec<(&'static str, u64)> {
        let dropped = |r: cm::DropReason| self.cm.dropped.get(&r).copied().unwrap_or(0);
        vec![
            ("cm_received", self.cm.received),
            ("cm_sent", self.cm.sent),
            ("cm_retransmitted", self.cm.retransmitted),
            ("cm_duplicates_answered", self.cm.duplicates_answered),
            ("cm_dropped_malformed", dropped(cm::DropReason::Malformed)),
            (
                "cm_dropped_unknown_comm_id",
                dropped(cm::DropReason::UnknownCommId),
            ),
            (
                "cm_dropped_wrong_state",
                dropped(cm::DropReason::WrongState),
            ),
            ("cm_tx_not_queued", self.tx_not_queued),
            ("cm_connections", self.connections),
            ("cm_tracked_connections", self.cm_connections),
            ("cm_listens", self.listens),
        ]
    }
}

/// Where a consumer's CM events arrive (`rdma_event_channel`): a queue and an `eventfd`
/// that is readable while the queue holds events. Clones share the channel.
#[derive(Debug, Clone)]
pub struct CmChannel(Arc<ChannelInner>);

#[derive(Debug)]
struct ChannelInner {
    notifier: Notifier,
    /// A leaf lock; the notifier is set and cleared under it, so the fd is readable
    /// exactly while events wait.
    queue: Mutex<VecDeque<CmEvent>>,
}

impl CmChannel {
    /// A channel with no event.
    pub fn new() -> Result<CmChannel, RuntimeError> {
        Ok(CmChannel(Arc::new(ChannelInner {
            notifier: Notifier::new()?,
            queue: Mutex::new(VecDeque::new()),
        })))
    }

    fn push(&self, ev: CmEvent) {
        tracing::debug!(event = ?ev, "cm event");
        let mut q = lock_leaf(&self.0.queue);
        q.push_back(ev);
        self.0.notifier.signal();
    }

    /// The oldest event, if any (`rdma_get_cm_event` without blocking).
    pub fn get_event(&self) -> Option<CmEvent> {
        let mut q = lock_leaf(&self.0.queue);
        let ev = q.pop_front();
        if q.is_empty() {
            self.0.notifier.clear();
        }
        ev
    }

    /// The oldest event, waiting up to `timeout` (`None`: no limit) for one.
    pub fn wait_event(&self, timeout: Option<Duration>) -> Result<Option<CmEvent>, RuntimeError> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(ev) = self.get_event() {
                return Ok(Some(ev));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(None),
                },
                None => None,
            };
            crate::wait_readable(self.as_fd(), left)?;
        }
    }

    fn same(&self, other: &CmChannel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl AsFd for CmChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.notifier.as_fd()
    }
}

/// One connection the runtime hosts for a consumer.
#[derive(Debug)]
struct Conn {
    channel: CmChannel,
    /// The consumer's QP, which the CM moves; `None` on the passive side until it accepts,
    /// and for a QP the consumer moves itself.
    qpn: Option<u32>,
    /// The consumer moves its QP itself (`rdma_conn_param.qp_num`): the CM touches no QP,
    /// reports the REP as [`CmEvent::ConnectResponse`] and sends the RTU on
    /// [`EngineGuard::cm_establish`].
    managed: bool,
    local: IpAddr,
    peer: IpAddr,
    /// The PSN this side announced in its REQ or REP: the first it expects to receive.
    psn: Psn,
    /// The path MTU the REQ carries (active side).
    mtu: Mtu,
    param: ConnParam,
    /// The REQ, on the passive side (kept: the QP attributes come from it).
    req: Option<Box<ReqRepr>>,
    /// The REP, on the active side once it arrived.
    rep: Option<Box<RepRepr>>,
    /// A SIDR request (UD service resolution), either side: no QP of the consumer's is
    /// ever moved, and the entry stays until the consumer destroys it.
    datagram: bool,
    /// The service asked for.
    service_id: ServiceId,
}

impl Conn {
    /// A SIDR request, asked (`param` as given) or received, between `local` and `peer`.
    fn datagram(
        channel: &CmChannel,
        (local, peer): (IpAddr, IpAddr),
        service_id: ServiceId,
        param: ConnParam,
    ) -> Conn {
        Conn {
            channel: channel.clone(),
            qpn: None,
            managed: false,
            local,
            peer,
            psn: Psn::new(0),
            mtu: Mtu::Mtu256,
            param,
            req: None,
            rep: None,
            datagram: true,
            service_id,
        }
    }
}

/// The CM of one device and the connections its consumers made through it.
#[derive(Debug)]
pub(crate) struct CmHost {
    cm: Cm,
    /// The device's addresses, GID order.
    addrs: Vec<IpAddr>,
    listeners: HashMap<ServiceId, CmChannel>,
    conns: HashMap<CommId, Conn>,
    /// The local address each peer talks to (its MADs arrived there, or we connected from
    /// it): what we send that peer leaves from it.
    local_for: HashMap<IpAddr, IpAddr>,
    /// splitmix64 state for starting PSNs and ephemeral ports.
    rng: u64,
    /// MADs the GSI could not queue (the CM resends what expects an answer).
    tx_not_queued: u64,
    /// Where the CM writes a MAD to send (kept: every pass looks, most find nothing).
    txbuf: [u8; MAD_LEN],
}

/// Peers whose local address is remembered (see `CmHost::local_for`).
const MAX_PEERS: usize = 4096;

/// rdma_cm's IP port spaces carry the IP CM header in the REQ's private data.
fn is_rdma_cm(service_id: ServiceId) -> bool {
    service_id.rdma_cm_parts().is_some()
}

impl CmHost {
    /// A CM for a device with `addrs`; `seed` draws the communication IDs, transaction
    /// IDs and PSNs, so they differ across restarts (IBA 12.9.8.1 stale connections).
    pub(crate) fn new(mut config: CmConfig, addrs: &[IpAddr], node_guid: u64, seed: u64) -> Self {
        let mut rng = seed;
        if config.local_ca_guid == 0 {
            config.local_ca_guid = if node_guid != 0 {
                node_guid
            } else {
                guid_of(addrs[0])
            };
        }
        config.first_comm_id = splitmix(&mut rng) as u32;
        config.tid_prefix = splitmix(&mut rng) as u32;
        CmHost {
            cm: Cm::new(config),
            addrs: addrs.to_vec(),
            listeners: HashMap::new(),
            conns: HashMap::new(),
            local_for: HashMap::new(),
            rng,
            tx_not_queued: 0,
            txbuf: [0; MAD_LEN],
        }
    }

    /// What the CM and its host counted.
    pub(crate) fn counters(&self) -> CmCounters {
        CmCounters {
            cm: self.cm.counters().clone(),
            tx_not_queued: self.tx_not_queued,
            connections: self.conns.len() as u64,
            cm_connections: self.cm.connections() as u64,
            listens: self.listeners.len() as u64,
        }
    }

    /// When [`CmHost::handle_timeout`] next has something to do.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.cm.poll_timeout()
    }

    /// Run the CM's due timers (resends, time-outs, time-wait ends).
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        self.cm.handle_timeout(now);
    }

    /// Feed the CM the MADs the engine received, apply what it reports to the QPs and the
    /// consumers, and queue what it sends on QP1.
    pub(crate) fn pump(&mut self, engine: &mut SendEngine, now: Instant) {
        while let Some(m) = engine.poll_mad() {
            // Answers to this peer leave from the address it talks to. Senders are not
            // authenticated: a flood from many addresses must not grow this without bound
            // (forgotten peers are answered from the first address of their family).
            if self.local_for.len() >= MAX_PEERS && !self.local_for.contains_key(&m.src) {
                self.local_for.clear();
            }
            self.local_for.insert(m.src, m.dst);
            self.cm.handle_mad(now, m.src, &m.data);
        }
        // Events before transmissions: on the active side the QP must be in RTS before the
        // RTU (queued with the Established event) reaches the peer.
        while let Some(ev) = self.cm.poll_event() {
            self.on_event(engine, now, ev);
        }
        while let Some(t) = self.cm.poll_transmit(now, &mut self.txbuf) {
            let Some(src) = self.local_addr_for(t.dst) else {
                tracing::warn!(dst = %t.dst, "no local address for a CM peer");
                self.tx_not_queued += 1;
                continue;
            };
            // The GSI sends to the peer's QP1 (the CM's redirect is not supported).
            if let Err(e) = engine.send_mad(src, t.dst, Qpn::GSI.value(), &self.txbuf) {
                // As a MAD lost on the wire: what expects an answer is resent on timeout.
                tracing::debug!(error = %e, dst = %t.dst, "MAD not queued");
                self.tx_not_queued += 1;
            }
        }
    }

    fn local_addr_for(&self, peer: IpAddr) -> Option<IpAddr> {
        self.local_for.get(&peer).copied().or_else(|| {
            self.addrs
                .iter()
                .copied()
                .find(|a| a.is_ipv4() == peer.is_ipv4())
        })
    }

    fn sgid_index(&self, local: IpAddr) -> u8 {
        self.addrs
            .iter()
            .position(|&a| a == local)
            .and_then(|i| u8::try_from(i).ok())
            .unwrap_or(0)
    }

    fn on_event(&mut self, engine: &mut SendEngine, now: Instant, ev: Event) {
        match ev {
            Event::ConnectRequest { id, peer, req } => self.on_connect_request(id, peer, req),
            Event::Established { id, reply } => {
                let Some(channel) = self.conns.get(&id).map(|c| c.channel.clone()) else {
                    return;
                };
                let (private_data, ece) = match reply {
                    // Active: the REP names the peer's QP; RTR and RTS before the RTU goes.
                    Some(rep) => {
                        let private_data = rep.private_data.as_bytes().to_vec();
                        let ece = rep.ece;
                        if let Some(c) = self.conns.get_mut(&id) {
                            c.rep = Some(rep);
                        }
                        if let Err(error) = self.ready_active(engine, id) {
                            if let Some(qpn) = self.conns.get(&id).and_then(|c| c.qpn) {
                                to_err(engine, qpn);
                            }
                            tracing::warn!(%error, "the REP's parameters could not be applied to the QP");
                            channel.push(CmEvent::ConnectError {
                                id,
                                errno: error.errno(),
                            });
                            // The RTU is already queued; close the connection right after.
                            let _ = self.cm.disconnect(now, id, &[]);
                            return;
                        }
                        (private_data, ece)
                    }
                    None => (Vec::new(), Ece::default()),
                };
                channel.push(CmEvent::Established {
                    id,
                    private_data,
                    ece,
                });
            }
            // Active, the consumer moves its QP: it reads the attributes, moves the QP and
            // establishes (the RTU leaves then).
            Event::Replied { id, rep } => {
                let Some(c) = self.conns.get_mut(&id) else {
                    return;
                };
                let event = CmEvent::ConnectResponse {
                    id,
                    remote_qpn: rep.local_qpn,
                    private_data: rep.private_data.as_bytes().to_vec(),
                    ece: rep.ece,
                };
                c.rep = Some(rep);
                c.channel.push(event);
            }
            Event::Rejected { id, rej } => {
                if let Some(c) = self.end(engine, id) {
                    c.channel.push(CmEvent::Rejected {
                        id,
                        reason: rej.reason,
                        private_data: rej.private_data.as_bytes().to_vec(),
                    });
                }
            }
            Event::TimedOut { id } => {
                if let Some(c) = self.end(engine, id) {
                    c.channel.push(CmEvent::Unreachable { id });
                }
            }
            // The entry stays for the time-wait period (the consumer may still destroy
            // it): its end is the consumer's TIMEWAIT_EXIT.
            Event::Disconnected { id } => {
                if let Some(c) = self.conns.get_mut(&id) {
                    if let Some(qpn) = c.qpn.take() {
                        to_err(engine, qpn);
                    }
                    c.channel.push(CmEvent::Disconnected { id });
                }
            }
            Event::TimeWaitExit { id } => {
                if let Some(c) = self.conns.remove(&id) {
                    c.channel.push(CmEvent::TimeWaitExit { id });
                }
            }
            Event::SidrRequest { id, peer, req } => self.on_sidr_request(id, peer, req),
            Event::SidrReply { id, rep } => {
                let Some(c) = self.conns.get(&id) else {
                    return;
                };
                let private_data = rep.private_data.as_bytes().to_vec();
                if rep.status == SidrStatus::SUCCESS {
                    // Kept until destroyed: the consumer's id lives on, as rdma_cm's does.
                    c.channel.push(CmEvent::Resolved {
                        id,
                        qpn: rep.qpn.value(),
                        qkey: rep.qkey.0,
                        private_data,
                    });
                } else if let Some(c) = self.conns.remove(&id) {
                    c.channel.push(CmEvent::Unresolved {
                        id,
                        status: rep.status.0,
                        private_data,
                    });
                }
            }
            // Later kinds are not hosted yet.
            _ => {}
        }
    }

    /// A peer asks which UD QP serves a service a consumer listens on: the consumer
    /// answers with `accept` (its UD QP) or `reject`.
    fn on_sidr_request(&mut self, id: CommId, peer: IpAddr, req: Box<SidrReqRepr>) {
        let Some(channel) = self.listeners.get(&req.service_id).cloned() else {
            // The CM only reports requests for services it listens on.
            return;
        };
        let (peer_port, private_data) =
            self.split_cma_header(req.service_id, req.private_data.as_bytes());
        let local = self.local_addr_for(peer).unwrap_or(self.addrs[0]);
        let event = ConnectRequest {
            id,
            service_id: req.service_id,
            peer,
            peer_port,
            local,
            remote_qpn: Qpn::new(0),
            responder_resources: 0,
            initiator_depth: 0,
            private_data,
            ece: Ece::default(),
            datagram: true,
        };
        let conn = Conn::datagram(
            &channel,
            (local, peer),
            req.service_id,
            ConnParam::default(),
        );
        self.conns.insert(id, conn);
        channel.push(CmEvent::ConnectRequest(Box::new(event)));
    }

    /// The peer's rdma_cm port and the consumer's private data: rdma_cm's services carry
    /// the IP CM header in front of it (Linux hands users what follows).
    fn split_cma_header(&self, service_id: ServiceId, pd: &[u8]) -> (u16, Vec<u8>) {
        match CmaHeaderRepr::parse_bytes(pd) {
            Ok(h) if is_rdma_cm(service_id) => (h.src_port, pd[CMA_HEADER_LEN..].to_vec()),
            _ => (0, pd.to_vec()),
        }
    }

    /// A connection ends: its QP goes to ERR and its entry away.
    fn end(&mut self, engine: &mut SendEngine, id: CommId) -> Option<Conn> {
        let c = self.conns.remove(&id)?;
        if let Some(qpn) = c.qpn {
            to_err(engine, qpn);
        }
        Some(c)
    }

    fn on_connect_request(&mut self, id: CommId, peer: IpAddr, req: Box<ReqRepr>) {
        let Some(channel) = self.listeners.get(&req.service_id).cloned() else {
            // The CM only reports requests for services it listens on.
            return;
        };
        if req.transport_service_type != ServiceType::Rc {
            // Only RC connections are hosted so far.
            let _ = self
                .cm
                .reject(id, RejectReason::INVALID_TRANSPORT_TYPE, &[]);
            return;
        }
        let (peer_port, private_data) =
            self.split_cma_header(req.service_id, req.private_data.as_bytes());
        let local = self.local_addr_for(peer).unwrap_or(self.addrs[0]);
        let event = ConnectRequest {
            id,
            service_id: req.service_id,
            peer,
            peer_port,
            local,
            remote_qpn: req.local_qpn,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            private_data,
            ece: req.ece,
            datagram: false,
        };
        let service_id = req.service_id;
        // Until the consumer answers, the REQ's numbers from this side's point of view (as
        // Linux's cm_req_handler keeps them for rdma_init_qp_attr).
        let mut param = ConnParam::default();
        param.responder_resources = req.initiator_depth;
        param.initiator_depth = req.responder_resources;
        // Chosen now: RTR (rdma_init_qp_attr before rdma_accept) already needs it.
        let psn = Psn::new(splitmix(&mut self.rng) as u32);
        self.conns.insert(
            id,
            Conn {
                channel: channel.clone(),
                qpn: None,
                managed: false,
                local,
                peer,
                psn,
                mtu: req.mtu().unwrap_or(Mtu::Mtu256),
                param,
                req: Some(req),
                rep: None,
                datagram: false,
                service_id,
            },
        );
        channel.push(CmEvent::ConnectRequest(Box::new(event)));
    }

    /// Active side, REP in hand: RTR and RTS with the peer's QPN and PSN.
    fn ready_active(&self, engine: &mut SendEngine, id: CommId) -> Result<(), VerbsError> {
        let qpn = self.conns[&id].qpn.ok_or(VerbsError::InvalidQp)?;
        // With the REP stored, only the engine can refuse.
        let (path, rtr, rts) = self.attrs(engine, id).map_err(|e| match e {
            RuntimeError::Verbs(e) => e,
            _ => VerbsError::InvalidQp,
        })?;
        to_rts(engine, qpn, &path, &rtr, &rts)
    }

    /// What takes connection `id`'s QP to RTR and RTS, as the exchange so far decided it
    /// (Linux's `cm_init_qp_rtr_attr`/`_rts_attr`): the active side's from its REQ and the
    /// REP; the passive side's from the REQ and, once it accepted, its own answer.
    fn attrs(&self, engine: &SendEngine, id: CommId) -> Result<(Path, Rtr, Rts), RuntimeError> {
        let c = self.conns.get(&id).ok_or(CmError::UnknownId(id))?;
        let sgid_index = self.sgid_index(c.local);
        let (local, peer) = (c.local, c.peer);
        match (&c.req, &c.rep) {
            (_, Some(rep)) => {
                let path = Path {
                    local,
                    peer,
                    sgid_index,
                    mtu: c.mtu,
                };
                // Kernel cm_rep_handler: the REP's responder resources bound our initiator
                // depth, its initiator depth our responder resources.
                let rtr = Rtr {
                    dest_qpn: rep.local_qpn,
                    rq_psn: c.psn.value(),
                    max_dest_rd_atomic: rep.initiator_depth.min(c.param.responder_resources),
                    min_rnr_timer: c.param.min_rnr_timer,
                };
                let rts = Rts {
                    sq_psn: rep.starting_psn.value(),
                    timeout: c.param.ack_timeout,
                    retry_cnt: c.param.retry_count,
                    rnr_retry: rep.rnr_retry_count,
                    max_rd_atomic: rep.responder_resources.min(c.param.initiator_depth),
                };
                Ok((path, rtr, rts))
            }
            (Some(req), None) => {
                let port_mtu = engine.query_port(1)?.active_mtu;
                let path = Path {
                    local,
                    peer,
                    sgid_index,
                    mtu: req.mtu().map_or(port_mtu, |m| m.min(port_mtu)),
                };
                let rtr = Rtr {
                    dest_qpn: req.local_qpn,
                    rq_psn: c.psn.value(),
                    max_dest_rd_atomic: c.param.responder_resources,
                    min_rnr_timer: c.param.min_rnr_timer,
                };
                // The REQ's retry counts and ACK timeout are the connection's (kernel
                // cm_format_paths_from_req / cm_req_handler).
                let rts = Rts {
                    sq_psn: req.starting_psn.value(),
                    timeout: req.primary_path.local_ack_timeout,
                    retry_cnt: req.retry_count,
                    rnr_retry: req.rnr_retry_count,
                    max_rd_atomic: c.param.initiator_depth,
                };
                Ok((path, rtr, rts))
            }
            (None, None) => {
                let state = self.cm.state(id).ok_or(CmError::UnknownId(id))?;
                let op = "init_qp_attr";
                Err(CmError::WrongState { id, state, op }.into())
            }
        }
    }

    /// The attributes that take connection `id`'s QP to `state` and which of them count
    /// (`rdma_init_qp_attr`): INIT as the CM sets a QP up, RTR and RTS as
    /// [`CmHost::attrs`] decides them.
    fn init_qp_attr(
        &self,
        engine: &SendEngine,
        id: CommId,
        state: QpState,
    ) -> Result<(QpAttr, QpAttrMask), RuntimeError> {
        let c = self.conns.get(&id).ok_or(CmError::UnknownId(id))?;
        if c.datagram {
            let state = self.cm.state(id).ok_or(CmError::UnknownId(id))?;
            let op = "init_qp_attr";
            return Err(CmError::WrongState { id, state, op }.into());
        }
        match state {
            QpState::Init => Ok((
                init_attr(&c.param),
                rc_required(QpState::Reset, QpState::Init),
            )),
            QpState::Rtr => {
                let (path, rtr, _) = self.attrs(engine, id)?;
                Ok((
                    rtr_attr(&path, &rtr),
                    rc_required(QpState::Init, QpState::Rtr),
                ))
            }
            QpState::Rts => {
                let (_, _, rts) = self.attrs(engine, id)?;
                Ok((rts_attr(&rts), rc_required(QpState::Rtr, QpState::Rts)))
            }
            other => Err(VerbsError::InvalidState(other).into()),
        }
    }

    /// The RTU of connection `id`, whose consumer moves its QP and has its REP
    /// (`rdma_establish`).
    fn establish(&mut self, id: CommId) -> Result<(), CmError> {
        if !self.conns.get(&id).is_some_and(|c| c.managed) {
            let state = self.cm.state(id).ok_or(CmError::UnknownId(id))?;
            let op = "establish";
            return Err(CmError::WrongState { id, state, op });
        }
        self.cm.send_rtu(id)
    }

    fn listen(&mut self, channel: &CmChannel, service_id: ServiceId) -> Result<(), CmError> {
        self.cm.listen(service_id)?;
        self.listeners.insert(service_id, channel.clone());
        Ok(())
    }

    fn unlisten(&mut self, channel: &CmChannel, service_id: ServiceId) {
        if self
            .listeners
            .get(&service_id)
            .is_some_and(|c| c.same(channel))
        {
            self.listeners.remove(&service_id);
            self.cm.unlisten(service_id);
        }
    }

    fn connect(
        &mut self,
        engine: &mut SendEngine,
        now: Instant,
        channel: &CmChannel,
        qp: Option<u32>,
        (peer, service_id): (IpAddr, ServiceId),
        param: &ConnParam,
    ) -> Result<CommId, RuntimeError> {
        let local = self.local_for_new_peer(peer)?;
        // Checked before the QP changes: a REQ that cannot be built leaves it as it was.
        let private_data = self.cma_private_data(local, peer, service_id, param)?;
        let qpn = match qp {
            Some(qpn) => {
                if engine.qp_type(qpn)? != QpType::Rc {
                    return Err(VerbsError::InvalidQp.into());
                }
                to_init(engine, qpn, param)?;
                qpn
            }
            None => param.qp_num & 0xff_ffff,
        };
        let mtu = engine.query_port(1)?.active_mtu;
        let psn = Psn::new(splitmix(&mut self.rng) as u32);
        // The fields Linux's rdma_cm sets for RoCE (see wire's capture tests): LIDs
        // permissive, GIDs from the IP addresses, hop limit 64, P_Key default.
        let req = ReqRepr {
            service_id,
            local_qpn: Qpn::new(qpn),
            responder_resources: param.responder_resources,
            initiator_depth: param.initiator_depth,
            transport_service_type: ServiceType::Rc,
            starting_psn: psn,
            retry_count: param.retry_count.min(7),
            pkey: wire::DEFAULT_PKEY,
            path_mtu: mtu.to_ibv(),
            rnr_retry_count: param.rnr_retry_count.min(7),
            primary_path: CmPathRepr {
                local_lid: 0xffff,
                remote_lid: 0xffff,
                local_gid: Gid::from_ip(local).0,
                remote_gid: Gid::from_ip(peer).0,
                hop_limit: 64,
                local_ack_timeout: param.ack_timeout.min(31),
                ..CmPathRepr::default()
            },
            ece: param.ece,
            private_data,
            ..ReqRepr::default()
        };
        let id = if qp.is_some() {
            self.cm.connect(now, peer, req)
        } else {
            self.cm.connect_holding_rtu(now, peer, req)
        };
        self.local_for.insert(peer, local);
        self.conns.insert(
            id,
            Conn {
                channel: channel.clone(),
                qpn: qp,
                managed: qp.is_none(),
                local,
                peer,
                psn,
                mtu,
                param: param.clone(),
                req: None,
                rep: None,
                datagram: false,
                service_id,
            },
        );
        Ok(id)
    }

    /// Ask `peer` which UD QP serves `service_id` (SIDR, rdma_cm's `rdma_connect` on a UDP
    /// id); the answer comes as [`CmEvent::Resolved`] or [`CmEvent::Unresolved`], no
    /// answer as [`CmEvent::Unreachable`].
    fn resolve(
        &mut self,
        now: Instant,
        channel: &CmChannel,
        (peer, service_id): (IpAddr, ServiceId),
        param: &ConnParam,
    ) -> Result<CommId, RuntimeError> {
        let local = self.local_for_new_peer(peer)?;
        let req = SidrReqRepr {
            service_id,
            pkey: wire::DEFAULT_PKEY,
            private_data: self.cma_private_data(local, peer, service_id, param)?,
            ..SidrReqRepr::default()
        };
        let id = self.cm.sidr_request(now, peer, req);
        self.local_for.insert(peer, local);
        let conn = Conn::datagram(channel, (local, peer), service_id, param.clone());
        self.conns.insert(id, conn);
        Ok(id)
    }

    /// The device's address a new connection to `peer` leaves from: the first of its
    /// family.
    fn local_for_new_peer(&self, peer: IpAddr) -> Result<IpAddr, RuntimeError> {
        self.addrs
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == peer.is_ipv4())
            .ok_or(RuntimeError::NoLocalAddress { peer })
    }

    /// rdma_cm's REQ or SIDR_REQ private data: the IP CM header (both addresses, our
    /// port), then the consumer's bytes (`cma_format_hdr`); other service IDs carry the
    /// bytes alone.
    fn cma_private_data<const N: usize>(
        &mut self,
        local: IpAddr,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<PrivateData<N>, CmError> {
        if !is_rdma_cm(service_id) {
            return Ok(PrivateData::from_slice(&param.private_data)?);
        }
        let mut pd = vec![0u8; CMA_HEADER_LEN];
        let src_port = match param.src_port {
            // Linux's default ephemeral range, 32768..=60999.
            0 => 32768 + (splitmix(&mut self.rng) % 28232) as u16,
            p => p,
        };
        let addrs = CmaAddrs::new(local, peer).expect("both of the same family");
        CmaHeaderRepr { src_port, addrs }.emit(&mut pd)?;
        pd.extend_from_slice(&param.private_data);
        Ok(PrivateData::from_slice(&pd).map_err(|e| match e {
            // Say how much the consumer may send, not the whole area.
            wire::WireError::PrivateDataTooLong { max, .. } => {
                wire::WireError::PrivateDataTooLong {
                    len: param.private_data.len(),
                    max: max - CMA_HEADER_LEN,
                }
            }
            e => e,
        })?)
    }

    fn accept(
        &mut self,
        engine: &mut SendEngine,
        now: Instant,
        id: CommId,
        qp: Option<u32>,
        param: &ConnParam,
    ) -> Result<(), RuntimeError> {
        let state = self.cm.state(id).ok_or(CmError::UnknownId(id))?;
        let c = self.conns.get(&id).ok_or(CmError::UnknownId(id))?;
        if c.datagram {
            let qpn = qp.ok_or(VerbsError::InvalidQp)?;
            return self.accept_sidr(engine, id, qpn, param);
        }
        if let Some(qpn) = qp {
            if engine.qp_type(qpn)? != QpType::Rc {
                return Err(VerbsError::InvalidQp.into());
            }
        }
        let req = match (&c.req, state) {
            (Some(req), State::ReqRcvd | State::MraSent) => req.clone(),
            _ => {
                let op = "accept";
                return Err(CmError::WrongState { id, state, op }.into());
            }
        };
        let private_data = PrivateData::from_slice(&param.private_data).map_err(CmError::from)?;
        let before = c.param.clone();
        // The consumer's answer, bounded by what the REQ offers.
        let mut answer = param.clone();
        answer.responder_resources = param.responder_resources.min(req.initiator_depth);
        answer.initiator_depth = param.initiator_depth.min(req.responder_resources);
        self.conns.get_mut(&id).expect("looked up above").param = answer.clone();
        let (path, rtr, rts) = self.attrs(engine, id)?;
        if let Some(qpn) = qp {
            let moved =
                to_init(engine, qpn, &answer).and_then(|()| to_rts(engine, qpn, &path, &rtr, &rts));
            if let Err(e) = moved {
                // Still a request to answer, as it was.
                self.conns.get_mut(&id).expect("looked up above").param = before;
                return Err(e.into());
            }
        }
        let c = self.conns.get_mut(&id).expect("looked up above");
        let rep = RepRepr {
            local_qpn: Qpn::new(qp.unwrap_or(param.qp_num & 0xff_ffff)),
            starting_psn: c.psn,
            responder_resources: answer.responder_resources,
            initiator_depth: answer.initiator_depth,
            // rxe's local CA ACK delay (what Linux sends from rxe, see wire's captures)
            target_ack_delay: 15,
            rnr_retry_count: param.rnr_retry_count.min(7),
            ece: param.ece,
            private_data,
            ..RepRepr::default()
        };
        c.qpn = qp;
        c.managed = qp.is_none();
        c.mtu = path.mtu;
        self.cm.accept(now, id, rep)?;
        Ok(())
    }

    /// Answer SIDR request `id` with UD QP `qpn` and its Q_Key (Linux's `cma_accept` on a
    /// UD id: `cma_send_sidr_rep` with success). The QP is the consumer's to set up.
    fn accept_sidr(
        &mut self,
        engine: &mut SendEngine,
        id: CommId,
        qpn: u32,
        param: &ConnParam,
    ) -> Result<(), RuntimeError> {
        if engine.qp_type(qpn)? != QpType::Ud {
            return Err(VerbsError::InvalidQp.into());
        }
        let qkey = engine.query_qp(qpn)?.qkey;
        let service_id = self.conns[&id].service_id;
        let rep = SidrRepRepr {
            status: SidrStatus::SUCCESS,
            qpn: Qpn::new(qpn),
            qkey: wire::Qkey(qkey),
            service_id,
            private_data: PrivateData::from_slice(&param.private_data).map_err(CmError::from)?,
            ..SidrRepRepr::default()
        };
        self.cm.sidr_reply(id, rep)?;
        Ok(())
    }

    /// Refuse SIDR request `id` (`cma_send_sidr_rep` with `IB_SIDR_REJECT`).
    fn reject_sidr(&mut self, id: CommId, private_data: &[u8]) -> Result<(), CmError> {
        let rep = SidrRepRepr {
            status: SidrStatus::REJECT,
            service_id: self.conns[&id].service_id,
            private_data: PrivateData::from_slice(private_data)?,
            ..SidrRepRepr::default()
        };
        self.cm.sidr_reply(id, rep)
    }

    /// `Ok` if connection `id` delivers its events to `channel`; a connection of another
    /// channel (another consumer's) is as unknown as one that never was.
    fn owned(&self, channel: &CmChannel, id: CommId) -> Result<(), CmError> {
        match self.conns.get(&id) {
            Some(c) if c.channel.same(channel) => Ok(()),
            _ => Err(CmError::UnknownId(id)),
        }
    }

    /// Stop `channel`'s listens and destroy its connections; returns how many.
    fn close_channel(
        &mut self,
        engine: &mut SendEngine,
        now: Instant,
        channel: &CmChannel,
    ) -> usize {
        let services: Vec<ServiceId> = self
            .listeners
            .iter()
            .filter(|(_, c)| c.same(channel))
            .map(|(s, _)| *s)
            .collect();
        for s in services {
            self.unlisten(channel, s);
        }
        let ids: Vec<CommId> = self
            .conns
            .iter()
            .filter(|(_, c)| c.channel.same(channel))
            .map(|(id, _)| *id)
            .collect();
        for id in &ids {
            let _ = self.destroy(engine, now, *id);
        }
        ids.len()
    }

    fn reject(
        &mut self,
        id: CommId,
        reason: RejectReason,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        // Linux's ucma_reject: a consumer says "no" (28) or "not those ECE options" (35);
        // the other reasons are the CM's own.
        if ![
            RejectReason::CONSUMER_DEFINED,
            RejectReason::VENDOR_OPTION_NOT_SUPPORTED,
        ]
        .contains(&reason)
        {
            return Err(CmError::NotAConsumerReason(reason));
        }
        if self.conns.get(&id).is_some_and(|c| c.datagram) {
            // A SIDR_REP has a status, not a reason (Linux's cma_send_sidr_rep with
            // IB_SIDR_REJECT whatever the reason).
            self.reject_sidr(id, private_data)?;
        } else {
            self.cm.reject(id, reason, private_data)?;
        }
        self.conns.remove(&id);
        Ok(())
    }

    /// Let go of connection `id` (`rdma_destroy_id`): its QP goes to ERR and is never
    /// touched again, the peer is told as Linux's `cm_destroy_id` tells it (DREQ when
    /// established, REJ before), and no further event is delivered for it.
    fn destroy(
        &mut self,
        engine: &mut SendEngine,
        now: Instant,
        id: CommId,
    ) -> Result<(), CmError> {
        let c = self.conns.get(&id).ok_or(CmError::UnknownId(id))?;
        if c.datagram {
            // Linux's cm_destroy_id: a SIDR request received is refused, one sent dropped.
            let r = match self.cm.state(id) {
                Some(State::SidrReqRcvd) => self.reject_sidr(id, &[]),
                Some(State::SidrReqSent) => self.cm.sidr_cancel(id),
                _ => Ok(()),
            };
            self.conns.remove(&id);
            return r;
        }
        let c = self.conns.remove(&id).expect("looked up above");
        if let Some(qpn) = c.qpn {
            to_err(engine, qpn);
        }
        match self.cm.state(id) {
            Some(State::Established) => self.cm.disconnect(now, id, &[]),
            Some(State::ReqSent) => self.cm.reject(id, RejectReason::TIMEOUT, &[]),
            Some(State::ReqRcvd | State::MraSent | State::RepSent) => {
                self.cm.reject(id, RejectReason::CONSUMER_DEFINED, &[])
            }
            // Closing or closed already: the CM finishes on its own.
            _ => Ok(()),
        }
    }

    fn disconnect(
        &mut self,
        engine: &mut SendEngine,
        now: Instant,
        id: CommId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let state = self.cm.state(id).ok_or(CmError::UnknownId(id))?;
        if state != State::Established {
            let op = "disconnect";
            return Err(CmError::WrongState { id, state, op });
        }
        // rdma_disconnect: flush the QP first, then tell the peer.
        if let Some(qpn) = self.conns.get(&id).and_then(|c| c.qpn) {
            to_err(engine, qpn);
        }
        self.cm.disconnect(now, id, private_data)
    }
}

/// Where a connected QP's packets go.
struct Path {
    local: IpAddr,
    peer: IpAddr,
    sgid_index: u8,
    mtu: Mtu,
}

/// The RTR attributes the CM exchange decided.
struct Rtr {
    dest_qpn: Qpn,
    rq_psn: u32,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
}

/// The RTS attributes the CM exchange decided.
struct Rts {
    sq_psn: u32,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    max_rd_atomic: u8,
}

/// RESET → INIT as `ib_cm_init_qp_attr` sets it up: remote WRITE, and READ and ATOMIC
/// when the QP answers any; a QP already in INIT is left as its consumer set it up.
fn to_init(engine: &mut SendEngine, qpn: u32, param: &ConnParam) -> Result<(), VerbsError> {
    match engine.query_qp(qpn)?.qp_state {
        QpState::Init => Ok(()),
        QpState::Reset => engine.modify_qp(
            qpn,
            &init_attr(param),
            rc_required(QpState::Reset, QpState::Init),
        ),
        other => Err(VerbsError::InvalidState(other)),
    }
}

/// INIT → RTR → RTS along `path`.
fn to_rts(
    engine: &mut SendEngine,
    qpn: u32,
    path: &Path,
    rtr: &Rtr,
    rts: &Rts,
) -> Result<(), VerbsError> {
    engine.modify_qp(
        qpn,
        &rtr_attr(path, rtr),
        rc_required(QpState::Init, QpState::Rtr),
    )?;
    engine.modify_qp(qpn, &rts_attr(rts), rc_required(QpState::Rtr, QpState::Rts))
}

/// The INIT attributes of a connected QP (`ib_cm_init_qp_attr`): remote WRITE, and READ
/// and ATOMIC when the QP answers any; P_Key index 0, port 1.
fn init_attr(param: &ConnParam) -> QpAttr {
    let mut access = AccessFlags::REMOTE_WRITE;
    if param.responder_resources > 0 {
        access |= AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    }
    QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: access,
        ..QpAttr::default()
    }
}

/// RTR along `path`.
fn rtr_attr(path: &Path, rtr: &Rtr) -> QpAttr {
    debug_assert_eq!(path.local.is_ipv4(), path.peer.is_ipv4());
    QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: path.mtu,
        dest_qp_num: rtr.dest_qpn,
        rq_psn: rtr.rq_psn & 0xff_ffff,
        max_dest_rd_atomic: rtr.max_dest_rd_atomic,
        min_rnr_timer: rtr.min_rnr_timer,
        ah_attr: AhAttr {
            dgid: Gid::from_ip(path.peer).0,
            sgid_index: path.sgid_index,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    }
}

/// RTS.
fn rts_attr(rts: &Rts) -> QpAttr {
    QpAttr {
        qp_state: QpState::Rts,
        sq_psn: rts.sq_psn & 0xff_ffff,
        timeout: rts.timeout,
        retry_cnt: rts.retry_cnt.min(7),
        rnr_retry: rts.rnr_retry.min(7),
        max_rd_atomic: rts.max_rd_atomic,
        ..QpAttr::default()
    }
}

/// The attributes an RC QP's `from → to` transition requires (IBA 11.2.5, the engine's
/// table), with the state: exactly what the CM sets.
fn rc_required(from: QpState, to: QpState) -> QpAttrMask {
    let rule = engine::qp_state::transition_rule(QpType::Rc, from, to)
        .expect("the CM's transitions are in the IBA table");
    rule.required | QpAttrMask::STATE
}

/// Move a QP to ERR (its WRs flush); a QP already gone or in ERR is fine.
fn to_err(engine: &mut SendEngine, qpn: u32) {
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    if let Err(e) = engine.modify_qp(qpn, &attr, QpAttrMask::STATE) {
        tracing::debug!(qpn, error = %e, "QP not moved to ERR");
    }
}

/// splitmix64: a well-mixed 64-bit value per call.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A CA GUID for a device configured without a node GUID: a locally administered EUI-64
/// from its first address, so devices on distinct addresses differ.
fn guid_of(addr: IpAddr) -> u64 {
    let bits = match addr {
        IpAddr::V4(a) => u64::from(u32::from(a)),
        IpAddr::V6(a) => {
            let o = a.octets();
            u64::from_be_bytes(o[8..].try_into().expect("8 bytes")) & 0xffff_ffff_ffff
        }
    };
    0x0200_0000_0000_0000 | bits
}

impl<A: Attachment> EngineGuard<'_, A> {
    /// Deliver connection requests for `service_id` (e.g. `ServiceId::rdma_cm(PortSpace::TCP,
    /// port)`) to `channel` (`rdma_listen`).
    pub fn cm_listen(
        &mut self,
        channel: &CmChannel,
        service_id: ServiceId,
    ) -> Result<(), RuntimeError> {
        Ok(self.core.cm.listen(channel, service_id)?)
    }

    /// Stop `channel`'s listening on `service_id`; connections made stay.
    pub fn cm_unlisten(&mut self, channel: &CmChannel, service_id: ServiceId) {
        self.core.cm.unlisten(channel, service_id);
    }

    /// Connect RC QP `qpn` (in RESET or INIT) to the service `service_id` at `peer`
    /// (`rdma_connect`): the REQ carries the QP's number, a fresh starting PSN, the port's
    /// MTU and `param`. Events for the connection arrive on `channel`: [`CmEvent::Established`]
    /// with the QP in RTS, or [`CmEvent::Rejected`] / [`CmEvent::Unreachable`].
    ///
    /// With `qpn` `None` the consumer moves its QP itself (an rdma_cm id without a QP): the
    /// REQ announces `param.qp_num`, the REP comes as [`CmEvent::ConnectResponse`], the
    /// consumer takes its QP to RTR and RTS with [`EngineGuard::cm_init_qp_attr`] and sends
    /// the RTU with [`EngineGuard::cm_establish`].
    pub fn cm_connect(
        &mut self,
        channel: &CmChannel,
        qpn: Option<u32>,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId, RuntimeError> {
        let now = self.shared.now();
        self.dirty = true;
        let core = &mut *self.core;
        core.cm.connect(
            &mut core.engine,
            now,
            channel,
            qpn,
            (peer, service_id),
            param,
        )
    }

    /// Ask `peer` which UD QP serves `service_id` (SIDR: `rdma_connect` on a UDP-port-space
    /// id), with `param`'s private data and source port. The answer arrives on `channel`:
    /// [`CmEvent::Resolved`] (QPN and Q_Key), [`CmEvent::Unresolved`] (the peer's status),
    /// or [`CmEvent::Unreachable`] when the peer never answers.
    pub fn cm_resolve(
        &mut self,
        channel: &CmChannel,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId, RuntimeError> {
        let now = self.shared.now();
        self.dirty = true;
        self.core
            .cm
            .resolve(now, channel, (peer, service_id), param)
    }

    /// Accept connection request `id`, delivered on `channel`, with QP `qpn` (`rdma_accept`).
    /// An RC request takes an RC QP in RESET or INIT: the QP goes to RTR and RTS with the
    /// peer's parameters and the REP leaves; [`CmEvent::Established`] follows when the RTU
    /// arrives. With `qpn` `None` the consumer moves its QP itself (to RTR and RTS with
    /// [`EngineGuard::cm_init_qp_attr`], before or after accepting) and the REP announces
    /// `param.qp_num`. A SIDR request ([`ConnectRequest::datagram`]) takes a UD QP, whose
    /// number and Q_Key the SIDR_REP carries. On failure the request is still there to
    /// reject.
    pub fn cm_accept(
        &mut self,
        channel: &CmChannel,
        id: CommId,
        qpn: Option<u32>,
        param: &ConnParam,
    ) -> Result<(), RuntimeError> {
        self.core.cm.owned(channel, id)?;
        let now = self.shared.now();
        self.dirty = true;
        let core = &mut *self.core;
        core.cm.accept(&mut core.engine, now, id, qpn, param)
    }

    /// Send the RTU of connection `id` of `channel`, made with no QP for the runtime to move,
    /// once its [`CmEvent::ConnectResponse`] arrived (`rdma_establish`): the connection is
    /// established (no further event; the passive side sees [`CmEvent::Established`]).
    pub fn cm_establish(&mut self, channel: &CmChannel, id: CommId) -> Result<(), RuntimeError> {
        self.core.cm.owned(channel, id)?;
        self.dirty = true;
        Ok(self.core.cm.establish(id)?)
    }

    /// The attributes that take connection `id`'s QP to `state` — INIT, RTR or RTS — and
    /// which of them to apply (`rdma_init_qp_attr`, for a consumer that moves its QP
    /// itself): the peer's QPN, both PSNs, the path and MTU, the READ/ATOMIC depths, timeouts
    /// and retries as the exchange decided them. RTR and RTS need the REQ (passive side) or
    /// the REP (active side).
    pub fn cm_init_qp_attr(
        &mut self,
        channel: &CmChannel,
        id: CommId,
        state: QpState,
    ) -> Result<(QpAttr, QpAttrMask), RuntimeError> {
        self.core.cm.owned(channel, id)?;
        let core = &*self.core;
        core.cm.init_qp_attr(&core.engine, id, state)
    }

    /// Reject connection request `id` of `channel` with `reason` and `private_data`:
    /// [`RejectReason::CONSUMER_DEFINED`] (28) for `rdma_reject`,
    /// [`RejectReason::VENDOR_OPTION_NOT_SUPPORTED`] (35) for `rdma_reject_ece`; any other
    /// reason is refused ([`cm::CmError::NotAConsumerReason`]), as Linux's ucma refuses it.
    /// A SIDR request is refused with status "rejected", whichever of the two.
    pub fn cm_reject(
        &mut self,
        channel: &CmChannel,
        id: CommId,
        reason: RejectReason,
        private_data: &[u8],
    ) -> Result<(), RuntimeError> {
        self.core.cm.owned(channel, id)?;
        self.dirty = true;
        Ok(self.core.cm.reject(id, reason, private_data)?)
    }

    /// Close established connection `id` of `channel` (`rdma_disconnect`): its QP goes to
    /// ERR, the DREQ leaves, and [`CmEvent::Disconnected`] follows when the peer answers (or
    /// gives up).
    pub fn cm_disconnect(
        &mut self,
        channel: &CmChannel,
        id: CommId,
        private_data: &[u8],
    ) -> Result<(), RuntimeError> {
        self.core.cm.owned(channel, id)?;
        let now = self.shared.now();
        self.dirty = true;
        let core = &mut *self.core;
        Ok(core
            .cm
            .disconnect(&mut core.engine, now, id, private_data)?)
    }

    /// Let go of connection `id` of `channel` (`rdma_destroy_id`), in whatever state it is:
    /// its QP goes to ERR and the runtime never touches it again, the peer is told (a DREQ,
    /// or a REJ before the connection is up), and no further event for `id` is delivered.
    /// Call it before destroying the QP: QP numbers are reused, and a connection still
    /// holding one would move its next owner to ERR on a late DREQ or REJ. A connection that
    /// ended on its own (rejected, unreachable) is gone already: [`cm::CmError::UnknownId`].
    pub fn cm_destroy_id(&mut self, channel: &CmChannel, id: CommId) -> Result<(), RuntimeError> {
        self.core.cm.owned(channel, id)?;
        let now = self.shared.now();
        self.dirty = true;
        let core = &mut *self.core;
        Ok(core.cm.destroy(&mut core.engine, now, id)?)
    }

    /// Close `channel` (`rdma_destroy_event_channel`, or its consumer gone): it stops
    /// listening, and every connection whose events it receives is destroyed as by
    /// [`EngineGuard::cm_destroy_id`]. Returns how many connections that was.
    pub fn cm_close_channel(&mut self, channel: &CmChannel) -> usize {
        let now = self.shared.now();
        self.dirty = true;
        let core = &mut *self.core;
        core.cm.close_channel(&mut core.engine, now, channel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{ProcessMemory, SharedRegions};
    use engine::{Engine, EngineConfig, QpCap, QpInitAttr};
    use wire::{CmMadRepr, CmMessage, PortSpace};

    /// One device, sans IO: an engine, its CM host, a channel and an RC QP in RESET.
    struct Side {
        engine: SendEngine,
        host: CmHost,
        channel: CmChannel,
        qpn: u32,
    }

    fn side(ip: IpAddr, seed: u64) -> Side {
        let mem = Box::new(ProcessMemory::new(SharedRegions::default()));
        let mut engine: SendEngine = Engine::with_memory(EngineConfig::new(vec![ip], seed), mem);
        let pd = engine.alloc_pd().unwrap();
        let cq = engine.create_cq(16).unwrap();
        let qpn = engine
            .create_qp(&QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap {
                    max_send_wr: 4,
                    max_recv_wr: 4,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap();
        Side {
            engine,
            host: CmHost::new(CmConfig::default(), &[ip], 0, seed),
            channel: CmChannel::new().unwrap(),
            qpn,
        }
    }

    /// Bytes before a GSI packet's MAD: IPv4, UDP, BTH, DETH.
    const MAD_AT: usize = 20 + 8 + 12 + 8;

    /// Pump both sides and carry every packet across until both are quiet; returns the CM
    /// MADs that crossed, in order.
    fn shuttle(a: &mut Side, b: &mut Side) -> Vec<CmMessage> {
        let now = Instant::from_nanos(0);
        let mut buf = vec![0u8; 9000];
        let mut mads = Vec::new();
        for _ in 0..16 {
            let mut moved = false;
            for a_sends in [true, false] {
                let (from, to) = if a_sends {
                    (&mut *a, &mut *b)
                } else {
                    (&mut *b, &mut *a)
                };
                from.host.pump(&mut from.engine, now);
                while let Some(t) = from.engine.poll_transmit(now, &mut buf) {
                    moved = true;
                    let pkt = &buf[..t.len];
                    if let Some(m) = pkt.get(MAD_AT..MAD_AT + MAD_LEN) {
                        if let Ok(m) = CmMadRepr::parse(m) {
                            mads.push(m.message);
                        }
                    }
                    to.engine.handle_datagram(now, pkt);
                }
            }
            if !moved {
                return mads;
            }
        }
        panic!("the exchange never settles");
    }

    #[test]
    fn each_side_sends_from_the_psn_its_peer_announced_as_linux_reads_them() {
        let (ip_a, ip_b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let (mut a, mut b) = (side(ip_a, 1), side(ip_b, 2));
        let service = ServiceId::rdma_cm(PortSpace::TCP, 7174);
        b.host.listen(&b.channel, service).unwrap();
        let now = Instant::from_nanos(0);
        a.host
            .connect(
                &mut a.engine,
                now,
                &a.channel,
                Some(a.qpn),
                (ip_b, service),
                &ConnParam::default(),
            )
            .unwrap();
        let mut mads = shuttle(&mut a, &mut b);
        let Some(CmEvent::ConnectRequest(req)) = b.channel.get_event() else {
            panic!("no connect request")
        };
        b.host
            .accept(
                &mut b.engine,
                now,
                req.id,
                Some(b.qpn),
                &ConnParam::default(),
            )
            .unwrap();
        mads.extend(shuttle(&mut a, &mut b));
        let names: Vec<_> = mads.iter().map(|m| m.name()).collect();
        assert_eq!(names, ["REQ", "REP", "RTU"]);
        let (CmMessage::Req(req), CmMessage::Rep(rep)) = (mads[0], mads[1]) else {
            unreachable!("checked above")
        };
        let qa = a.engine.query_qp(a.qpn).unwrap();
        let qb = b.engine.query_qp(b.qpn).unwrap();
        assert_eq!((qa.qp_state, qb.qp_state), (QpState::Rts, QpState::Rts));
        // The REQ's PSN is the active side's to receive, the passive side's to send from
        // (kernel rxe, which reads it so, answered the other reading as a duplicate).
        assert_eq!(qa.rq_psn, req.starting_psn.value());
        assert_eq!(qb.sq_psn, req.starting_psn.value());
        assert_eq!(qb.rq_psn, rep.starting_psn.value());
        assert_eq!(qa.sq_psn, rep.starting_psn.value());
        assert_eq!(qa.dest_qp_num.value(), b.qpn);
        assert_eq!(qb.dest_qp_num.value(), a.qpn);
    }

    /// A UD QP of `s` in RTS with Q_Key `qkey`.
    fn ud_qp(s: &mut Side, qkey: u32) -> u32 {
        let pd = s.engine.alloc_pd().unwrap();
        let cq = s.engine.create_cq(4).unwrap();
        let qpn = s
            .engine
            .create_qp(&QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap {
                    max_send_wr: 2,
                    max_recv_wr: 2,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Ud,
                sq_sig_all: false,
            })
            .unwrap();
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
        s.engine.modify_qp(qpn, &init, mask).unwrap();
        qpn
    }

    #[test]
    fn sidr_answers_with_the_ud_qp_and_its_qkey_and_a_refusal_with_its_status() {
        let (ip_a, ip_b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let (mut a, mut b) = (side(ip_a, 1), side(ip_b, 2));
        let service = ServiceId::rdma_cm(PortSpace::UDP, 7174);
        b.host.listen(&b.channel, service).unwrap();
        let ud = ud_qp(&mut b, 0x0123_4567);
        let now = Instant::from_nanos(0);
        let ask = |a: &mut Side, data: &[u8]| {
            let mut param = ConnParam::with_private_data(data);
            param.src_port = 4242;
            a.host
                .resolve(now, &a.channel, (ip_b, service), &param)
                .unwrap()
        };

        let id = ask(&mut a, b"who serves?");
        let mads = shuttle(&mut a, &mut b);
        assert_eq!(
            mads.iter().map(|m| m.name()).collect::<Vec<_>>(),
            ["SIDR_REQ"]
        );
        let Some(CmEvent::ConnectRequest(req)) = b.channel.get_event() else {
            panic!("no request")
        };
        // The consumer sees its peer's port and bytes, not the IP CM header.
        assert!(req.datagram);
        assert_eq!((req.peer, req.peer_port), (ip_a, 4242));
        assert_eq!(&req.private_data[..11], b"who serves?");
        // An RC QP cannot answer a SIDR request; the request is still there after.
        assert!(b
            .host
            .accept(
                &mut b.engine,
                now,
                req.id,
                Some(b.qpn),
                &ConnParam::default()
            )
            .is_err());
        b.host
            .accept(
                &mut b.engine,
                now,
                req.id,
                Some(ud),
                &ConnParam::with_private_data(b"here"),
            )
            .unwrap();
        let mads = shuttle(&mut a, &mut b);
        assert_eq!(
            mads.iter().map(|m| m.name()).collect::<Vec<_>>(),
            ["SIDR_REP"]
        );
        match a.channel.get_event() {
            Some(CmEvent::Resolved {
                id: got,
                qpn,
                qkey,
                private_data,
            }) => {
                assert_eq!((got, qpn, qkey), (id, ud, 0x0123_4567));
                assert_eq!(&private_data[..4], b"here");
            }
            other => panic!("{other:?}"),
        }
        // Both ids live until destroyed; the UD QP is untouched.
        assert_eq!(
            (a.host.counters().connections, b.host.counters().connections),
            (1, 1)
        );
        assert_eq!(b.engine.query_qp(ud).unwrap().qp_state, QpState::Init);
        a.host.destroy(&mut a.engine, now, id).unwrap();
        b.host.destroy(&mut b.engine, now, req.id).unwrap();
        assert_eq!(
            (a.host.counters().connections, b.host.counters().connections),
            (0, 0)
        );

        // Refused: the asker learns the status (2, rejected) and the id is gone.
        let id = ask(&mut a, b"");
        shuttle(&mut a, &mut b);
        let Some(CmEvent::ConnectRequest(req)) = b.channel.get_event() else {
            panic!("no request")
        };
        b.host
            .reject(req.id, RejectReason::CONSUMER_DEFINED, b"no")
            .unwrap();
        shuttle(&mut a, &mut b);
        match a.channel.get_event() {
            Some(CmEvent::Unresolved {
                id: got, status, ..
            }) => assert_eq!((got, status), (id, SidrStatus::REJECT.0)),
            other => panic!("{other:?}"),
        }
        assert_eq!(a.host.counters().connections, 0);

        // Nothing listens: the peer's CM says so (status 1).
        b.host.unlisten(&b.channel, service);
        let id = ask(&mut a, b"");
        shuttle(&mut a, &mut b);
        match a.channel.get_event() {
            Some(CmEvent::Unresolved {
                id: got, status, ..
            }) => assert_eq!((got, status), (id, SidrStatus::UNSUPPORTED.0)),
            other => panic!("{other:?}"),
        }
    }
}
