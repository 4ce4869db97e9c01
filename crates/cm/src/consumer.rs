//! What consumers of a connection manager see (rdma_cm's vocabulary): the parameters a
//! side asks for ([`ConnParam`]), a peer's request ([`ConnectRequest`]) and the events of a
//! connection ([`CmEvent`]). Defined here, below every host of the CM, so that the runtime
//! that hosts it, the daemon that serves it to clients and the client library that speaks
//! for them share one definition.

use std::net::IpAddr;

use wire::{Ece, Qpn, RejectReason, ServiceId};

use crate::CommId;

/// What a side of a connection asks for (`struct rdma_conn_param`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnParam {
    /// Private data for the peer: at most 56 bytes in a REQ (after rdma_cm's 36-byte IP
    /// header), 196 in a REP, 148 in a REJ, 220 in a DREQ.
    pub private_data: Vec<u8>,
    /// READ/ATOMIC requests this side accepts outstanding from the peer.
    pub responder_resources: u8,
    /// READ/ATOMIC requests this side may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries after a timeout or NAK (3 bits; the REQ's applies to both sides).
    pub retry_count: u8,
    /// RNR retries (3 bits, 7 = infinite); each side announces what the other may use.
    pub rnr_retry_count: u8,
    /// Local ACK timeout (`4.096 µs × 2^ack_timeout`), carried in the REQ's path: both
    /// sides use the active side's.
    pub ack_timeout: u8,
    /// RNR NAK timer code this side's responder advertises.
    pub min_rnr_timer: u8,
    /// The active side's rdma_cm port (the IP CM header's source port); 0 picks an
    /// ephemeral one, as an unbound `rdma_cm_id` gets.
    pub src_port: u16,
    /// The QP number the REQ or REP announces when the consumer moves its QP itself
    /// (`rdma_conn_param.qp_num`, an id without a QP): the CM then touches no QP. Unused
    /// when the CM is given the QP.
    pub qp_num: u32,
    /// The ECE the REQ or REP carries, as given (Linux's CM sends what rdma_cm hands it;
    /// what a side answers with is its consumer's choice, see rdma-core's `rdma_accept`).
    /// All zero: none.
    pub ece: Ece,
}

impl Default for ConnParam {
    /// No private data, the project's connection defaults (`softrdma::ConnectOptions`):
    /// 16 READ/ATOMIC each way, 7 retries of each kind, ACK timeout 14 (67 ms), RNR timer
    /// 12 (0.64 ms).
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            ack_timeout: 14,
            min_rnr_timer: 12,
            src_port: 0,
            qp_num: 0,
            ece: Ece::default(),
        }
    }
}

impl ConnParam {
    /// The defaults with `private_data`.
    pub fn with_private_data(private_data: &[u8]) -> ConnParam {
        ConnParam {
            private_data: private_data.to_vec(),
            ..ConnParam::default()
        }
    }
}

/// A peer's request to connect, as a listener sees it (`RDMA_CM_EVENT_CONNECT_REQUEST`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The new connection: the consumer accepts or rejects it (`rdma_accept`,
    /// `rdma_reject`).
    pub id: CommId,
    /// The service asked for.
    pub service_id: ServiceId,
    /// The peer's address.
    pub peer: IpAddr,
    /// The peer's rdma_cm port (from the IP CM header; 0 without one).
    pub peer_port: u16,
    /// The local address the request came to.
    pub local: IpAddr,
    /// The peer's QP number.
    pub remote_qpn: Qpn,
    /// READ/ATOMIC requests the peer accepts outstanding (cap for our initiator depth).
    pub responder_resources: u8,
    /// READ/ATOMIC requests the peer may have outstanding (cap for our responder resources).
    pub initiator_depth: u8,
    /// The peer's private data, the IP CM header removed (as rdma_cm hands it to users).
    pub private_data: Vec<u8>,
    /// The REQ's ECE (`rdma_get_remote_ece` on the new id); all zero when the peer sent
    /// none, and for a SIDR request.
    pub ece: Ece,
    /// A SIDR request (rdma_cm's UDP port space): the peer asks which UD QP serves the
    /// service. Accepting answers with a UD QP's number and Q_Key; there is no connection
    /// and no QP state to change, and `remote_qpn` and the READ/ATOMIC depths are 0.
    pub datagram: bool,
}

/// What happened to a connection (`struct rdma_cm_event`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CmEvent {
    /// A peer asks to connect to a service the channel listens on.
    ConnectRequest(Box<ConnectRequest>),
    /// The connection is up and its QP in RTS (`RDMA_CM_EVENT_ESTABLISHED`).
    Established {
        /// The connection.
        id: CommId,
        /// The REP's private data on the active side (all 196 bytes, as rdma_cm delivers
        /// them); empty on the passive side.
        private_data: Vec<u8>,
        /// The REP's ECE on the active side; all zero on the passive side (its peer's came
        /// with the request).
        ece: Ece,
    },
    /// Active side of a connection whose QP the consumer moves: the peer accepted
    /// (`RDMA_CM_EVENT_CONNECT_RESPONSE`). The consumer takes its QP to RTR and RTS (the
    /// attributes come from the CM, `rdma_init_qp_attr`), then establishes the connection
    /// (`rdma_establish`: the RTU leaves).
    ConnectResponse {
        /// The connection.
        id: CommId,
        /// The peer's QP number.
        remote_qpn: Qpn,
        /// The REP's private data (all 196 bytes).
        private_data: Vec<u8>,
        /// The REP's ECE (`rdma_get_remote_ece`).
        ece: Ece,
    },
    /// The peer (or its CM, when nothing listens) rejected the request; the QP is in ERR
    /// (`RDMA_CM_EVENT_REJECTED`).
    Rejected {
        /// The connection, now gone.
        id: CommId,
        /// Why (IBA 12.6.7.2): 8, invalid service ID, when nothing listens; 28 when the
        /// peer's consumer said no; 35 when it refused the ECE options asked for
        /// (`rdma_reject_ece`).
        reason: RejectReason,
        /// The REJ's private data (148 bytes).
        private_data: Vec<u8>,
    },
    /// The peer never answered, however often the CM resent (`RDMA_CM_EVENT_UNREACHABLE`);
    /// the QP is in ERR.
    Unreachable {
        /// The connection, now gone.
        id: CommId,
    },
    /// The REP arrived but the QP could not be moved to RTR/RTS with it
    /// (`RDMA_CM_EVENT_CONNECT_ERROR`); the QP is in ERR and the connection is being closed.
    ConnectError {
        /// The connection.
        id: CommId,
        /// Why, as a positive errno (the event's `status` is its negative, as rdma_cm
        /// reports it).
        errno: i32,
    },
    /// The connection is closed, by either side; the QP is in ERR, its WRs flushed
    /// (`RDMA_CM_EVENT_DISCONNECTED`).
    Disconnected {
        /// The connection, now gone.
        id: CommId,
    },
    /// A closed connection's time-wait period ended, and the connection with it
    /// (`RDMA_CM_EVENT_TIMEWAIT_EXIT`): its QP may serve another connection. Not delivered
    /// for a connection destroyed before.
    TimeWaitExit {
        /// The connection, now gone.
        id: CommId,
    },
    /// A SIDR request was answered: the peer's UD QP that serves the service
    /// (`RDMA_CM_EVENT_ESTABLISHED` on a UD id, with `param.ud`).
    Resolved {
        /// The request.
        id: CommId,
        /// The peer's UD QP.
        qpn: u32,
        /// The Q_Key its datagrams must carry.
        qkey: u32,
        /// The SIDR_REP's private data (all 136 bytes, as rdma_cm delivers them).
        private_data: Vec<u8>,
    },
    /// A SIDR request was answered with a status other than success
    /// (`RDMA_CM_EVENT_UNREACHABLE` with that status, as Linux's rdma_cm reports it).
    Unresolved {
        /// The request, now gone.
        id: CommId,
        /// The SIDR_REP's status (IBA 12.11.2): 1 nothing serves the service, 2 the
        /// consumer rejected the request, 3 no QP.
        status: u8,
        /// The SIDR_REP's private data.
        private_data: Vec<u8>,
    },
}

impl CmEvent {
    /// The connection the event is about.
    pub fn id(&self) -> CommId {
        match self {
            CmEvent::ConnectRequest(r) => r.id,
            CmEvent::Established { id, .. }
            | CmEvent::ConnectResponse { id, .. }
            | CmEvent::Rejected { id, .. }
            | CmEvent::Unreachable { id }
            | CmEvent::ConnectError { id, .. }
            | CmEvent::Disconnected { id }
            | CmEvent::TimeWaitExit { id }
            | CmEvent::Resolved { id, .. }
            | CmEvent::Unresolved { id, .. } => *id,
        }
    }
}
