//! # softrdma `cm`: the IB connection manager, sans-IO
//!
//! The connection manager (IBA 12) of one port: it exchanges CM MADs with peers' QP1 to set
//! up and tear down connections, and SIDR to resolve UD services. Like the engine it does no
//! I/O and reads no clock: a host feeds it received MADs with [`Cm::handle_mad`], drives
//! its timers with [`Cm::handle_timeout`] / [`Cm::poll_timeout`], sends what
//! [`Cm::poll_transmit`] hands out (a 256-byte MAD for the peer's QP1, which the host wraps
//! with [`wire::gsi_transport`]), and acts on what [`Cm::poll_event`] reports.
//!
//! ## Who moves the QPs
//! The CM owns no QP. It tells the host when each transition is due, and the host applies it
//! to the engine (as rdma_cm does with `rdma_init_qp_attr` and `ibv_modify_qp`):
//! - passive side, on [`Event::ConnectRequest`]: the REQ carries the peer's QPN, starting
//!   PSN, path and MTU; move the QP to INIT then RTR before [`Cm::accept`], and to RTS on
//!   [`Event::Established`] (the RTU) — or to RTS before [`Cm::accept`] already, as Linux's
//!   rdma_cm (`cma_accept_ib`) and softrdma's runtime do, so a lost RTU does not hold up
//!   the QP;
//! - active side, on [`Event::Established`] with the REP: move the QP to RTR then RTS before
//!   the next [`Cm::poll_transmit`] (the RTU is already queued, and the peer may send as soon
//!   as it has it); or, for a connection made with [`Cm::connect_holding_rtu`] (rdma_cm's
//!   QPs that their consumer moves, `rdma_establish`), on [`Event::Replied`]: the consumer
//!   moves its QP, then [`Cm::send_rtu`];
//! - on [`Event::Disconnected`], [`Event::Rejected`] or [`Event::TimedOut`]: move the QP to
//!   the error state.
//!
//! ## Timers and retries
//! A message that expects an answer (REQ, REP, DREQ, SIDR_REQ) is resent when the peer's
//! CM response timeout (`4.096 µs × 2^timeout`, IBA 12.7.34) plus twice the packet life
//! time passes without one, at most `max_cm_retries` times; then the connection times out
//! (IBA 12.9.3). An MRA extends the wait by the service timeout it announces. Timers sit in
//! one ordered set, so finding the next one never scans the connections.
//!
//! ## Transaction IDs
//! Each exchange a side starts (REQ, DREQ, SIDR_REQ) takes a fresh transaction ID; every
//! message that answers it — REP, REJ, MRA, RTU, DREP, SIDR_REP — carries the same one, as
//! Linux's CM does (see wire's capture tests).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;

mod consumer;

pub use consumer::{CmEvent, ConnParam, ConnectRequest};
pub use engine::Instant;
pub use wire::Ece;
use wire::{
    CmMadRepr, CmMessage, CmMsgRef, DreqRepr, IdsRepr, MraRepr, PrivateData, RejRepr, RejectReason,
    RepRepr, ReqRepr, ServiceId, SidrRepRepr, SidrReqRepr, WireError,
};

/// A local communication ID: names one connection (or SIDR request) of this CM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommId(pub u32);

/// `4.096 µs × 2^timeout` (IBA 12.7.34); exponents above 31 count as 31.
pub fn cm_timeout(timeout: u8) -> Duration {
    Duration::from_nanos(4096u64 << timeout.min(31))
}

/// What a CM of one port is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// This CA's GUID, sent in REQs and REPs.
    pub local_ca_guid: u64,
    /// How long this CM takes to answer (5-bit exponent), announced in REQs.
    pub local_cm_response_timeout: u8,
    /// How long this CM waits for a peer (5-bit exponent) when the peer has not said.
    pub remote_cm_response_timeout: u8,
    /// How often an unanswered message is resent (4 bits).
    pub max_cm_retries: u8,
    /// One-way packet life time, added twice to every wait.
    pub packet_life_time: Duration,
    /// How long a closed connection keeps its IDs so late duplicates find it (IBA 12.9.7).
    pub time_wait: Duration,
    /// The first local communication ID handed out (hosts pick a random one so IDs are not
    /// reused across restarts); 0 is skipped.
    pub first_comm_id: u32,
    /// Upper 32 bits of every transaction ID this CM starts.
    pub tid_prefix: u32,
}

impl Default for CmConfig {
    /// Linux's choices: timeouts of 2^20 × 4.096 µs (about 4.3 s), 15 retries.
    fn default() -> Self {
        CmConfig {
            local_ca_guid: 0,
            local_cm_response_timeout: 20,
            remote_cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: Duration::from_millis(1),
            time_wait: Duration::from_secs(1),
            first_comm_id: 1,
            tid_prefix: 1,
        }
    }
}

/// Something the host must know or act on.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// A peer asks to connect to a service this CM listens on; answer with [`Cm::accept`],
    /// [`Cm::reject`] or, to buy time, [`Cm::mra`].
    ConnectRequest {
        /// The new connection.
        id: CommId,
        /// The peer's address.
        peer: IpAddr,
        /// The REQ, private data included.
        req: Box<ReqRepr>,
    },
    /// The connection is established: on the active side with the peer's REP (the RTU is
    /// queued), on the passive side when the RTU arrived (`reply` is then `None`).
    Established {
        /// The connection.
        id: CommId,
        /// The REP, on the active side.
        reply: Option<Box<RepRepr>>,
    },
    /// Active side of a [`Cm::connect_holding_rtu`] connection: the peer's REP arrived and
    /// the connection waits in [`State::RepRcvd`] for [`Cm::send_rtu`].
    Replied {
        /// The connection.
        id: CommId,
        /// The REP.
        rep: Box<RepRepr>,
    },
    /// The peer rejected the REQ or the REP.
    Rejected {
        /// The connection, now gone.
        id: CommId,
        /// The REJ (reason, ARI, private data).
        rej: Box<RejRepr>,
    },
    /// The connection is closed: a DREQ arrived, our DREQ was answered, or its retries ran
    /// out. Its ID stays reserved for the time-wait period.
    Disconnected {
        /// The connection.
        id: CommId,
    },
    /// A closed connection's time-wait period ended: its IDs are free again, and so is the
    /// QP for another connection (IBA 12.9.7; Linux's `IB_CM_TIMEWAIT_EXIT`).
    TimeWaitExit {
        /// The connection, now gone.
        id: CommId,
    },
    /// The peer never answered a REQ, REP or SIDR_REQ, however often it was resent.
    TimedOut {
        /// The connection (or SIDR request), now gone.
        id: CommId,
    },
    /// A peer asks which UD QP serves a service this CM listens on; answer with
    /// [`Cm::sidr_reply`].
    SidrRequest {
        /// The request.
        id: CommId,
        /// The peer's address.
        peer: IpAddr,
        /// The SIDR_REQ.
        req: Box<SidrReqRepr>,
    },
    /// The answer to a [`Cm::sidr_request`].
    SidrReply {
        /// The request, now done.
        id: CommId,
        /// The SIDR_REP (status, QPN, Q_Key, private data).
        rep: Box<SidrRepRepr>,
    },
}

/// A MAD for the host to send: the bytes are in the buffer given to
/// [`Cm::poll_transmit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The peer whose QP1 gets it.
    pub dst: IpAddr,
    /// Bytes of MAD written (always 256).
    pub len: usize,
}

/// Why a call on the CM failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// No connection has this ID (never had, or it is gone).
    #[error("no connection {0:?}")]
    UnknownId(CommId),
    /// The connection is not in a state where this call makes sense.
    #[error("connection {id:?} is {state:?}, cannot {op}")]
    WrongState {
        /// The connection.
        id: CommId,
        /// Its state.
        state: State,
        /// What was asked.
        op: &'static str,
    },
    /// Another listener already has this service ID.
    #[error("service {0:?} already has a listener")]
    AlreadyListening(ServiceId),
    /// The message could not be built (private data too long, buffer too small).
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A consumer rejected with a reason that is not its to give: only consumer defined
    /// (28) and vendor option not supported (35), as Linux's ucma allows.
    #[error("a consumer may not reject with reason {0:?}")]
    NotAConsumerReason(RejectReason),
}

impl CmError {
    /// The errno librdmacm returns for it: an unknown ID or a call in the wrong state is
    /// `EINVAL`, a service with a listener already `EADDRINUSE`, private data too long or a
    /// reject reason not a consumer's `EINVAL`.
    pub fn errno(&self) -> i32 {
        const EINVAL: i32 = 22;
        const EADDRINUSE: i32 = 98;
        match self {
            CmError::AlreadyListening(_) => EADDRINUSE,
            CmError::UnknownId(_)
            | CmError::WrongState { .. }
            | CmError::Wire(_)
            | CmError::NotAConsumerReason(_) => EINVAL,
        }
    }
}

/// Where a connection is in IBA 12.9's state diagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum State {
    /// Active: REQ sent, waiting for REP, REJ or MRA.
    ReqSent,
    /// Passive: REQ received and reported, the host has not answered.
    ReqRcvd,
    /// Active ([`Cm::connect_holding_rtu`]): REP received and reported, the host has not
    /// sent the RTU.
    RepRcvd,
    /// Passive: MRA sent for the REQ, the host has not answered.
    MraSent,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Both: connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// Closed, keeping the IDs until the time-wait period ends.
    TimeWait,
    /// SIDR_REQ sent, waiting for SIDR_REP.
    SidrReqSent,
    /// SIDR_REQ received and reported, the host has not answered.
    SidrReqRcvd,
}

/// Why a received MAD was dropped; each has a counter in [`Counters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum DropReason {
    /// Not a CM MAD this CM reads (see [`WireError`]).
    Malformed,
    /// Names a local communication ID this CM does not have, or comes from another peer.
    UnknownCommId,
    /// A message the connection's state does not expect (e.g. an RTU while established).
    WrongState,
}

/// Counts of what the CM did with the MADs it received.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// MADs received.
    pub received: u64,
    /// MADs sent, retransmissions included.
    pub sent: u64,
    /// Retransmissions after a timeout.
    pub retransmitted: u64,
    /// Duplicates answered again (REQ while REP sent, REP while established, DREQ in
    /// time-wait).
    pub duplicates_answered: u64,
    /// Drops by reason.
    pub dropped: BTreeMap<DropReason, u64>,
}

/// One connection or SIDR request.
#[derive(Debug, Clone)]
struct Conn {
    state: State,
    peer: IpAddr,
    remote_comm_id: u32,
    /// The transaction ID of the exchange in progress (the REQ's until a DREQ starts one).
    tid: u64,
    /// The last message sent that expects an answer, or is resent when a duplicate arrives.
    last_sent: Option<CmMessage>,
    /// When the wait for an answer ends.
    deadline: Option<Instant>,
    /// How long one wait for an answer lasts.
    wait: Duration,
    retries_left: u8,
    /// The peer's QPN (from REQ or REP), for DREQs.
    remote_qpn: wire::Qpn,
    /// Active: on the REP, wait for the host's [`Cm::send_rtu`] instead of sending the RTU.
    hold_rtu: bool,
}

/// The connection manager of one port.
#[derive(Debug)]
pub struct Cm {
    config: CmConfig,
    conns: BTreeMap<CommId, Conn>,
    /// (peer, the peer's communication ID) of every passive connection, to spot duplicate
    /// REQs (IBA 12.9.8.1).
    by_remote: BTreeMap<(IpAddr, u32), CommId>,
    listeners: BTreeSet<ServiceId>,
    timers: BTreeSet<(Instant, CommId)>,
    next_comm_id: u32,
    next_tid: u32,
    outbox: VecDeque<(IpAddr, CmMadRepr)>,
    events: VecDeque<Event>,
    counters: Counters,
}

impl Cm {
    /// A CM with no connection and no listener.
    pub fn new(config: CmConfig) -> Cm {
        Cm {
            config,
            conns: BTreeMap::new(),
            by_remote: BTreeMap::new(),
            listeners: BTreeSet::new(),
            timers: BTreeSet::new(),
            next_comm_id: config.first_comm_id,
            next_tid: 0,
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            counters: Counters::default(),
        }
    }

    /// What the CM has counted.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Connections (and SIDR requests) this CM tracks, those closing or in time-wait
    /// included.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// The state of a connection, if it exists.
    pub fn state(&self, id: CommId) -> Option<State> {
        self.conns.get(&id).map(|c| c.state)
    }

    /// Accept REQs and SIDR_REQs for `service_id`.
    pub fn listen(&mut self, service_id: ServiceId) -> Result<(), CmError> {
        if !self.listeners.insert(service_id) {
            return Err(CmError::AlreadyListening(service_id));
        }
        Ok(())
    }

    /// Stop accepting requests for `service_id` (connections already made stay).
    pub fn unlisten(&mut self, service_id: ServiceId) {
        self.listeners.remove(&service_id);
    }

    fn alloc_comm_id(&mut self) -> CommId {
        loop {
            let id = CommId(self.next_comm_id);
            self.next_comm_id = self.next_comm_id.wrapping_add(1);
            if id.0 != 0 && !self.conns.contains_key(&id) {
                return id;
            }
        }
    }

    fn alloc_tid(&mut self) -> u64 {
        self.next_tid = self.next_tid.wrapping_add(1);
        u64::from(self.config.tid_prefix) << 32 | u64::from(self.next_tid)
    }

    /// The wait for an answer from a peer whose CM answers within `timeout`.
    fn wait_for(&self, timeout: u8) -> Duration {
        cm_timeout(timeout) + 2 * self.config.packet_life_time
    }

    fn send(&mut self, peer: IpAddr, tid: u64, message: CmMessage) {
        self.outbox.push_back((
            peer,
            CmMadRepr {
                transaction_id: tid,
                message,
            },
        ));
    }

    fn set_timer(&mut self, id: CommId, at: Option<Instant>) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if let Some(old) = c.deadline.take() {
            self.timers.remove(&(old, id));
        }
        c.deadline = at;
        if let Some(at) = at {
            self.timers.insert((at, id));
        }
    }

    /// Send `message` on connection `id`, wait for an answer, and resend it on timeout.
    fn send_expecting_answer(&mut self, now: Instant, id: CommId, message: CmMessage) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        c.last_sent = Some(message);
        c.retries_left = self.config.max_cm_retries;
        let (peer, tid, wait) = (c.peer, c.tid, c.wait);
        self.send(peer, tid, message);
        self.set_timer(id, Some(now + wait));
    }

    fn new_conn(&mut self, state: State, peer: IpAddr, tid: u64, wait: Duration) -> CommId {
        let id = self.alloc_comm_id();
        self.conns.insert(
            id,
            Conn {
                state,
                peer,
                remote_comm_id: 0,
                tid,
                last_sent: None,
                deadline: None,
                wait,
                retries_left: 0,
                remote_qpn: wire::Qpn::new(0),
                hold_rtu: false,
            },
        );
        id
    }

    fn conn(&self, id: CommId) -> Result<&Conn, CmError> {
        self.conns.get(&id).ok_or(CmError::UnknownId(id))
    }

    fn expect_state(&self, id: CommId, ok: &[State], op: &'static str) -> Result<(), CmError> {
        let state = self.conn(id)?.state;
        if ok.contains(&state) {
            Ok(())
        } else {
            Err(CmError::WrongState { id, state, op })
        }
    }

    /// Start connecting to `peer`: send `req` (this CM fills in the local communication ID,
    /// CA GUID, its response timeouts and retry count) and wait for the REP.
    pub fn connect(&mut self, now: Instant, peer: IpAddr, mut req: ReqRepr) -> CommId {
        let tid = self.alloc_tid();
        let wait = self.wait_for(self.config.remote_cm_response_timeout);
        let id = self.new_conn(State::ReqSent, peer, tid, wait);
        req.local_comm_id = id.0;
        req.local_ca_guid = self.config.local_ca_guid;
        req.local_cm_response_timeout = self.config.local_cm_response_timeout;
        req.remote_cm_response_timeout = self.config.remote_cm_response_timeout;
        req.max_cm_retries = self.config.max_cm_retries;
        self.send_expecting_answer(now, id, CmMessage::Req(req));
        id
    }

    /// As [`Cm::connect`], but the REP does not establish the connection: it is reported
    /// as [`Event::Replied`], and the connection waits (no timer, as Linux's REP_RCVD) until
    /// the host sends the RTU with [`Cm::send_rtu`] — rdma_cm's connections whose QP the
    /// consumer moves itself (`rdma_establish`).
    pub fn connect_holding_rtu(&mut self, now: Instant, peer: IpAddr, req: ReqRepr) -> CommId {
        let id = self.connect(now, peer, req);
        self.conns.get_mut(&id).expect("just made").hold_rtu = true;
        id
    }

    /// Send the RTU of a [`Cm::connect_holding_rtu`] connection whose REP arrived: it is
    /// established (no event follows: the host knows).
    pub fn send_rtu(&mut self, id: CommId) -> Result<(), CmError> {
        self.expect_state(id, &[State::RepRcvd], "send_rtu")?;
        let c = self.conns.get_mut(&id).expect("checked above");
        let rtu = CmMessage::Rtu(IdsRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            private_data: PrivateData::default(),
        });
        c.state = State::Established;
        // kept so a duplicate REP (our RTU was lost) gets it again
        c.last_sent = Some(rtu);
        let (peer, tid) = (c.peer, c.tid);
        self.send(peer, tid, rtu);
        Ok(())
    }

    /// Accept a connection request: send `rep` (this CM fills in the communication IDs and
    /// CA GUID) and wait for the RTU. Move the QP to RTR first (see the crate docs).
    pub fn accept(&mut self, now: Instant, id: CommId, mut rep: RepRepr) -> Result<(), CmError> {
        self.expect_state(id, &[State::ReqRcvd, State::MraSent], "accept")?;
        let c = &self.conns[&id];
        rep.local_comm_id = id.0;
        rep.remote_comm_id = c.remote_comm_id;
        rep.local_ca_guid = self.config.local_ca_guid;
        self.conns.get_mut(&id).expect("checked above").state = State::RepSent;
        self.send_expecting_answer(now, id, CmMessage::Rep(rep));
        Ok(())
    }

    /// Reject a connection request with `reason` and `private_data`, or give up a connection
    /// this side requested or accepted before it is established (as Linux's
    /// `ib_destroy_cm_id` does in those states); the connection is gone.
    pub fn reject(
        &mut self,
        id: CommId,
        reason: RejectReason,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.expect_state(
            id,
            &[
                State::ReqRcvd,
                State::MraSent,
                State::ReqSent,
                State::RepSent,
                State::RepRcvd,
            ],
            "reject",
        )?;
        let private_data = PrivateData::from_slice(private_data)?;
        let c = self.remove(id).expect("checked above");
        // Linux's cm_format_rej: a REQ received is what is rejected; otherwise "other".
        let message_rejected = match c.state {
            State::ReqRcvd | State::MraSent => CmMsgRef::Req,
            State::RepRcvd => CmMsgRef::Rep,
            _ => CmMsgRef::Other,
        };
        let ari = if reason == RejectReason::TIMEOUT {
            self.timeout_ari()
        } else {
            RejRepr::default()
        };
        let rej = RejRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            message_rejected,
            reason,
            private_data,
            ..ari
        };
        self.send(c.peer, c.tid, CmMessage::Rej(rej));
        Ok(())
    }

    /// A REJ whose additional information is this CA's GUID, as a REJ with reason Timeout
    /// carries it (IBA 12.6.7.2; Linux finds the connection a REJ names by no ID of its own
    /// through it).
    fn timeout_ari(&self) -> RejRepr {
        let mut ari = [0u8; wire::cm::CM_ARI_LEN];
        ari[..8].copy_from_slice(&self.config.local_ca_guid.to_be_bytes());
        RejRepr {
            reject_info_len: 8,
            ari: PrivateData(ari),
            ..RejRepr::default()
        }
    }

    /// Tell the peer its REQ needs more time than its timeout: it waits `service_timeout`
    /// (5-bit exponent) longer before resending (IBA 12.6.6).
    pub fn mra(&mut self, id: CommId, service_timeout: u8) -> Result<(), CmError> {
        self.expect_state(id, &[State::ReqRcvd, State::MraSent], "mra")?;
        let c = self.conns.get_mut(&id).expect("checked above");
        c.state = State::MraSent;
        let mra = CmMessage::Mra(MraRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            message_mraed: CmMsgRef::Req,
            service_timeout,
            private_data: PrivateData::default(),
        });
        // a duplicate REQ is answered with the MRA again
        c.last_sent = Some(mra);
        let (peer, tid) = (c.peer, c.tid);
        self.send(peer, tid, mra);
        Ok(())
    }

    /// The QP received data before the RTU (IBA 12.9.8.3: that counts as an RTU): the
    /// connection is established.
    pub fn notify_established(&mut self, id: CommId) -> Result<(), CmError> {
        self.expect_state(id, &[State::RepSent], "notify_established")?;
        self.establish_passive(id);
        Ok(())
    }

    fn establish_passive(&mut self, id: CommId) {
        self.set_timer(id, None);
        let c = self.conns.get_mut(&id).expect("caller checked");
        c.state = State::Established;
        c.last_sent = None;
        self.events
            .push_back(Event::Established { id, reply: None });
    }

    /// Close an established connection: send a DREQ and wait for the DREP.
    pub fn disconnect(
        &mut self,
        now: Instant,
        id: CommId,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        self.expect_state(id, &[State::Established], "disconnect")?;
        let private_data = PrivateData::from_slice(private_data)?;
        let tid = self.alloc_tid();
        let c = self.conns.get_mut(&id).expect("checked above");
        c.state = State::DreqSent;
        c.tid = tid;
        let dreq = CmMessage::Dreq(DreqRepr {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            remote_qpn_eecn: c.remote_qpn,
            private_data,
        });
        self.send_expecting_answer(now, id, dreq);
        Ok(())
    }

    /// Ask `peer` which UD QP serves `req.service_id`; the answer comes as
    /// [`Event::SidrReply`] (this CM fills in the request ID).
    pub fn sidr_request(&mut self, now: Instant, peer: IpAddr, mut req: SidrReqRepr) -> CommId {
        let tid = self.alloc_tid();
        let wait = self.wait_for(self.config.remote_cm_response_timeout);
        let id = self.new_conn(State::SidrReqSent, peer, tid, wait);
        req.request_id = id.0;
        self.send_expecting_answer(now, id, CmMessage::SidrReq(req));
        id
    }

    /// Answer a SIDR request with `rep` (this CM fills in the request ID); the request is
    /// done.
    pub fn sidr_reply(&mut self, id: CommId, mut rep: SidrRepRepr) -> Result<(), CmError> {
        self.expect_state(id, &[State::SidrReqRcvd], "sidr_reply")?;
        let c = self.remove(id).expect("checked above");
        rep.request_id = c.remote_comm_id;
        self.send(c.peer, c.tid, CmMessage::SidrRep(rep));
        Ok(())
    }

    /// Give up on a SIDR request this CM sent (its consumer went away): it is no longer
    /// resent, and a late SIDR_REP finds nothing. No message leaves (Linux's
    /// `cm_destroy_id` drops a sent SIDR_REQ silently).
    pub fn sidr_cancel(&mut self, id: CommId) -> Result<(), CmError> {
        self.expect_state(id, &[State::SidrReqSent], "sidr_cancel")?;
        self.remove(id);
        Ok(())
    }

    fn remove(&mut self, id: CommId) -> Option<Conn> {
        self.set_timer(id, None);
        let c = self.conns.remove(&id)?;
        self.by_remote.remove(&(c.peer, c.remote_comm_id));
        Some(c)
    }

    fn enter_time_wait(&mut self, now: Instant, id: CommId) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.state = State::TimeWait;
            c.retries_left = 0;
        }
        let at = now + self.config.time_wait;
        self.set_timer(id, Some(at));
        self.events.push_back(Event::Disconnected { id });
    }

    fn count_drop(&mut self, why: DropReason) {
        *self.counters.dropped.entry(why).or_default() += 1;
    }

    /// Handle a MAD received on QP1 from `src` (the UD payload, GRH stripped). Anything
    /// malformed, unknown or unexpected is counted by reason and dropped.
    pub fn handle_mad(&mut self, now: Instant, src: IpAddr, mad: &[u8]) {
        self.counters.received += 1;
        let Ok(m) = CmMadRepr::parse(mad) else {
            return self.count_drop(DropReason::Malformed);
        };
        let tid = m.transaction_id;
        match m.message {
            CmMessage::Req(req) => self.on_req(src, tid, req),
            CmMessage::SidrReq(req) => self.on_sidr_req(src, tid, req),
            CmMessage::Rep(rep) => self.on_rep(src, rep),
            CmMessage::Rtu(rtu) => self.on_rtu(src, rtu),
            CmMessage::Rej(rej) => self.on_rej(src, rej),
            CmMessage::Mra(mra) => self.on_mra(now, src, mra),
            CmMessage::Dreq(dreq) => self.on_dreq(now, src, tid, dreq),
            CmMessage::Drep(drep) => self.on_drep(now, src, drep),
            CmMessage::SidrRep(rep) => self.on_sidr_rep(src, rep),
        }
    }

    /// The connection a message from `src` names by our communication ID, if it is the
    /// peer's and (once known) the peer's ID matches.
    fn lookup(&mut self, src: IpAddr, ours: u32, theirs: Option<u32>) -> Option<CommId> {
        let id = CommId(ours);
        match self.conns.get(&id) {
            Some(c)
                if c.peer == src
                    && theirs.is_none_or(|t| c.remote_comm_id == 0 || c.remote_comm_id == t) =>
            {
                Some(id)
            }
            _ => {
                self.count_drop(DropReason::UnknownCommId);
                None
            }
        }
    }

    fn on_req(&mut self, src: IpAddr, tid: u64, req: ReqRepr) {
        // IBA 12.9.8.1: a REQ we already have is a retransmission; answer it again.
        if let Some(&id) = self.by_remote.get(&(src, req.local_comm_id)) {
            let c = &self.conns[&id];
            match (c.state, c.last_sent) {
                (State::RepSent | State::MraSent, Some(msg)) => {
                    self.counters.duplicates_answered += 1;
                    self.send(src, tid, msg);
                }
                _ => self.count_drop(DropReason::WrongState),
            }
            return;
        }
        if !self.listeners.contains(&req.service_id) {
            // As Linux answers: REJ with no local ID, reason invalid service ID.
            let rej = RejRepr {
                remote_comm_id: req.local_comm_id,
                message_rejected: CmMsgRef::Req,
                reason: RejectReason::INVALID_SERVICE_ID,
                ..RejRepr::default()
            };
            self.send(src, tid, CmMessage::Rej(rej));
            return;
        }
        let wait = self.wait_for(req.remote_cm_response_timeout);
        let id = self.new_conn(State::ReqRcvd, src, tid, wait);
        let c = self.conns.get_mut(&id).expect("just inserted");
        c.remote_comm_id = req.local_comm_id;
        c.remote_qpn = req.local_qpn;
        self.by_remote.insert((src, req.local_comm_id), id);
        self.events.push_back(Event::ConnectRequest {
            id,
            peer: src,
            req: Box::new(req),
        });
    }

    fn on_rep(&mut self, src: IpAddr, rep: RepRepr) {
        let Some(id) = self.lookup(src, rep.remote_comm_id, None) else {
            return;
        };
        let c = self.conns.get_mut(&id).expect("looked up");
        let rtu = CmMessage::Rtu(IdsRepr {
            local_comm_id: id.0,
            remote_comm_id: rep.local_comm_id,
            private_data: PrivateData::default(),
        });
        match c.state {
            State::ReqSent if c.hold_rtu => {
                c.state = State::RepRcvd;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                c.last_sent = None;
                self.set_timer(id, None);
                self.events.push_back(Event::Replied {
                    id,
                    rep: Box::new(rep),
                });
            }
            State::ReqSent => {
                c.state = State::Established;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_qpn = rep.local_qpn;
                // kept so a duplicate REP (our RTU was lost) gets it again
                c.last_sent = Some(rtu);
                let (peer, tid) = (c.peer, c.tid);
                self.set_timer(id, None);
                self.send(peer, tid, rtu);
                self.events.push_back(Event::Established {
                    id,
                    reply: Some(Box::new(rep)),
                });
            }
            State::Established if c.remote_comm_id == rep.local_comm_id => {
                let (peer, tid) = (c.peer, c.tid);
                self.counters.duplicates_answered += 1;
                self.send(peer, tid, rtu);
            }
            _ => self.count_drop(DropReason::WrongState),
        }
    }

    fn on_rtu(&mut self, src: IpAddr, rtu: IdsRepr) {
        let Some(id) = self.lookup(src, rtu.remote_comm_id, Some(rtu.local_comm_id)) else {
            return;
        };
        if self.conns[&id].state == State::RepSent {
            self.establish_passive(id);
        } else {
            self.count_drop(DropReason::WrongState);
        }
    }

    fn on_rej(&mut self, src: IpAddr, rej: RejRepr) {
        let id = if rej.remote_comm_id == 0 {
            // The peer gave up on its REQ before it learnt our ID: only its own names the
            // connection (Linux finds it the same way, by the peer's ID and CA GUID).
            let found = self.by_remote.get(&(src, rej.local_comm_id)).copied();
            if found.is_none() {
                self.count_drop(DropReason::UnknownCommId);
            }
            found
        } else {
            self.lookup(src, rej.remote_comm_id, None)
        };
        let Some(id) = id else {
            return;
        };
        match self.conns[&id].state {
            // Established too: the peer timed out waiting for our RTU and gave up on it
            State::ReqSent
            | State::RepSent
            | State::MraSent
            | State::ReqRcvd
            | State::RepRcvd
            | State::Established => {
                self.remove(id);
                self.events.push_back(Event::Rejected {
                    id,
                    rej: Box::new(rej),
                });
            }
            _ => self.count_drop(DropReason::WrongState),
        }
    }

    fn on_mra(&mut self, now: Instant, src: IpAddr, mra: MraRepr) {
        let Some(id) = self.lookup(src, mra.remote_comm_id, None) else {
            return;
        };
        let c = &self.conns[&id];
        let acked = matches!(
            (c.state, mra.message_mraed),
            (State::ReqSent, CmMsgRef::Req) | (State::RepSent, CmMsgRef::Rep)
        );
        if !acked {
            return self.count_drop(DropReason::WrongState);
        }
        // IBA 12.6.6: the peer got it and needs service_timeout more; wait that long
        // before resending.
        let at = now + cm_timeout(mra.service_timeout) + c.wait;
        self.set_timer(id, Some(at));
    }

    fn on_dreq(&mut self, now: Instant, src: IpAddr, tid: u64, dreq: DreqRepr) {
        let Some(id) = self.lookup(src, dreq.remote_comm_id, Some(dreq.local_comm_id)) else {
            return;
        };
        let drep = CmMessage::Drep(IdsRepr {
            local_comm_id: id.0,
            remote_comm_id: dreq.local_comm_id,
            private_data: PrivateData::default(),
        });
        match self.conns[&id].state {
            // a DREQ crossing ours closes the connection just the same
            State::Established | State::DreqSent | State::RepSent => {
                self.send(src, tid, drep);
                self.enter_time_wait(now, id);
            }
            // IBA 12.9.7: our DREP was lost; answer again
            State::TimeWait => {
                self.counters.duplicates_answered += 1;
                self.send(src, tid, drep);
            }
            _ => self.count_drop(DropReason::WrongState),
        }
    }

    fn on_drep(&mut self, now: Instant, src: IpAddr, drep: IdsRepr) {
        let Some(id) = self.lookup(src, drep.remote_comm_id, Some(drep.local_comm_id)) else {
            return;
        };
        if self.conns[&id].state == State::DreqSent {
            self.enter_time_wait(now, id);
        } else {
            self.count_drop(DropReason::WrongState);
        }
    }

    fn on_sidr_req(&mut self, src: IpAddr, tid: u64, req: SidrReqRepr) {
        if !self.listeners.contains(&req.service_id) {
            let rep = SidrRepRepr {
                request_id: req.request_id,
                status: wire::SidrStatus::UNSUPPORTED,
                service_id: req.service_id,
                ..SidrRepRepr::default()
            };
            self.send(src, tid, CmMessage::SidrRep(rep));
            return;
        }
        let id = self.new_conn(State::SidrReqRcvd, src, tid, Duration::ZERO);
        self.conns
            .get_mut(&id)
            .expect("just inserted")
            .remote_comm_id = req.request_id;
        self.events.push_back(Event::SidrRequest {
            id,
            peer: src,
            req: Box::new(req),
        });
    }

    fn on_sidr_rep(&mut self, src: IpAddr, rep: SidrRepRepr) {
        let Some(id) = self.lookup(src, rep.request_id, None) else {
            return;
        };
        if self.conns[&id].state == State::SidrReqSent {
            self.remove(id);
            self.events.push_back(Event::SidrReply {
                id,
                rep: Box::new(rep),
            });
        } else {
            self.count_drop(DropReason::WrongState);
        }
    }

    /// When [`Cm::handle_timeout`] next has something to do.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.first().map(|&(at, _)| at)
    }

    /// Resend what is unanswered past its deadline, give up on what has run out of
    /// retries, and end time-wait periods.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&(at, id)) = self.timers.first() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, id));
            let Some(c) = self.conns.get_mut(&id) else {
                continue;
            };
            c.deadline = None;
            match c.state {
                State::TimeWait => {
                    self.remove(id);
                    self.events.push_back(Event::TimeWaitExit { id });
                }
                _ if c.retries_left > 0 => {
                    c.retries_left -= 1;
                    let (peer, tid, wait, msg) = (c.peer, c.tid, c.wait, c.last_sent);
                    if let Some(msg) = msg {
                        self.counters.retransmitted += 1;
                        self.send(peer, tid, msg);
                    }
                    self.set_timer(id, Some(now + wait));
                }
                // IBA 12.9.3: a DREQ nobody answers still closes the connection
                State::DreqSent => self.enter_time_wait(now, id),
                state => {
                    let c = self.remove(id).expect("present above");
                    // IBA 12.6.7.2: tell the peer we gave up, with reason Timeout
                    if matches!(state, State::ReqSent | State::RepSent) {
                        let rej = RejRepr {
                            local_comm_id: id.0,
                            remote_comm_id: c.remote_comm_id,
                            message_rejected: if state == State::ReqSent {
                                CmMsgRef::Other
                            } else {
                                CmMsgRef::Rep
                            },
                            reason: RejectReason::TIMEOUT,
                            ..self.timeout_ari()
                        };
                        self.send(c.peer, c.tid, CmMessage::Rej(rej));
                    }
                    self.events.push_back(Event::TimedOut { id });
                }
            }
        }
    }

    /// Write the next MAD to send into `buf` (at least 256 bytes) and say where it goes.
    pub fn poll_transmit(&mut self, _now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let (dst, mad) = self.outbox.front()?;
        let len = mad.emit(buf).ok()?;
        let dst = *dst;
        self.outbox.pop_front();
        self.counters.sent += 1;
        Some(Transmit { dst, len })
    }

    /// The next event for the host.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_follow_iba_4096_ns_times_a_power_of_two() {
        assert_eq!(cm_timeout(0), Duration::from_nanos(4096));
        // Linux's default 20: about 4.3 s
        assert_eq!(cm_timeout(20), Duration::from_nanos(4096 << 20));
        assert_eq!(cm_timeout(200), cm_timeout(31));
    }
}
