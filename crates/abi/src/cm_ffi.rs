//! The private C interface between the drop-in `librdmacm.so.1` and the drop-in
//! `libibverbs.so.1`: how librdmacm reaches the device's connection manager without linking
//! a second copy of the device stack.
//!
//! libibverbs exports the `softrdma_cm_*` functions below under the version node
//! [`VERSION_NODE`]; librdmacm looks them up at run time. Both sides take the `#[repr(C)]`
//! records of this module, so the layout is defined once. Every call returns 0 or a positive
//! `errno` value (as the verbs do), except [`SYM_OPEN`], which returns a descriptor or a
//! negative `errno`.
//!
//! | symbol | C signature |
//! |---|---|
//! | `softrdma_cm_abi_version` | `uint32_t (void)`: [`ABI_VERSION`] |
//! | `softrdma_cm_open` | `int (struct ibv_context *)`: the context's CM channel descriptor, readable while events wait (owned by the context) |
//! | `softrdma_cm_listen` | `int (struct ibv_context *, uint64_t service_id)` |
//! | `softrdma_cm_unlisten` | `int (struct ibv_context *, uint64_t service_id)` |
//! | `softrdma_cm_connect` | `int (struct ibv_context *, struct ibv_qp *, const CmAddr *peer, uint64_t service_id, const CmParam *, uint32_t *comm_id)`: a NULL QP when the caller moves its QP itself (`CmParam::qp_num` names it) |
//! | `softrdma_cm_resolve` | `int (struct ibv_context *, const CmAddr *peer, uint64_t service_id, const CmParam *, uint32_t *comm_id)`: SIDR, for a UDP-port-space id |
//! | `softrdma_cm_accept` | `int (struct ibv_context *, uint32_t comm_id, struct ibv_qp *, const CmParam *)`: an RC QP for a connection (NULL as for connect), a UD QP for a SIDR request |
//! | `softrdma_cm_establish` | `int (struct ibv_context *, uint32_t comm_id)`: the RTU of a connection whose QP the caller moves, after CONNECT_RESPONSE |
//! | `softrdma_cm_init_qp_attr` | `int (struct ibv_context *, uint32_t comm_id, struct ibv_qp_attr *, int *mask)`: the attributes that take the connection's QP to `attr->qp_state` (INIT, RTR, RTS) |
//! | `softrdma_cm_reject` | `int (struct ibv_context *, uint32_t comm_id, uint16_t reason, const void *data, uint8_t len)`: reason 28 (consumer defined; 0 means it too) or 35 (vendor option not supported, `rdma_reject_ece`), `EINVAL` for any other |
//! | `softrdma_cm_disconnect` | `int (struct ibv_context *, uint32_t comm_id, const void *data, uint8_t len)` |
//! | `softrdma_cm_destroy_id` | `int (struct ibv_context *, uint32_t comm_id)` |
//! | `softrdma_cm_get_event` | `int (struct ibv_context *, CmEventRec *)`: 0 with an event, `EAGAIN` without |

use std::net::{IpAddr, Ipv6Addr};

/// The ECE of a REQ or REP, as the records carry it.
pub use wire::Ece;

/// The version node libibverbs binds the private symbols to (standalone, never chained to
/// the public `IBVERBS_1.x` nodes).
pub const VERSION_NODE: &str = "SOFTRDMA_PRIVATE_1";

/// Bumped whenever a record or a signature of this module changes; librdmacm refuses a
/// libibverbs that reports another (4: ECE in [`CmParam`] and [`CmEventRec`], the reject
/// reason in `softrdma_cm_reject`).
pub const ABI_VERSION: u32 = 4;

/// `softrdma_cm_abi_version`.
pub const SYM_ABI_VERSION: &str = "softrdma_cm_abi_version";
/// `softrdma_cm_open`.
pub const SYM_OPEN: &str = "softrdma_cm_open";
/// `softrdma_cm_listen`.
pub const SYM_LISTEN: &str = "softrdma_cm_listen";
/// `softrdma_cm_unlisten`.
pub const SYM_UNLISTEN: &str = "softrdma_cm_unlisten";
/// `softrdma_cm_connect`.
pub const SYM_CONNECT: &str = "softrdma_cm_connect";
/// `softrdma_cm_resolve`.
pub const SYM_RESOLVE: &str = "softrdma_cm_resolve";
/// `softrdma_cm_accept`.
pub const SYM_ACCEPT: &str = "softrdma_cm_accept";
/// `softrdma_cm_reject`.
pub const SYM_REJECT: &str = "softrdma_cm_reject";
/// `softrdma_cm_disconnect`.
pub const SYM_DISCONNECT: &str = "softrdma_cm_disconnect";
/// `softrdma_cm_destroy_id`.
pub const SYM_DESTROY_ID: &str = "softrdma_cm_destroy_id";
/// `softrdma_cm_get_event`.
pub const SYM_GET_EVENT: &str = "softrdma_cm_get_event";
/// `softrdma_cm_establish`.
pub const SYM_ESTABLISH: &str = "softrdma_cm_establish";
/// `softrdma_cm_init_qp_attr`.
pub const SYM_INIT_QP_ATTR: &str = "softrdma_cm_init_qp_attr";

/// Room for private data in a record: more than any CM message carries (a REP's 196 bytes
/// is the most an event delivers, a DREQ's 220 the most a call sends).
pub const PRIVATE_DATA_MAX: usize = 256;

/// An IP address and rdma_cm port: IPv4 as the IPv4-mapped IPv6 address, as a RoCEv2 GID
/// holds it.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmAddr {
    /// The address, IPv4-mapped for IPv4.
    pub addr: [u8; 16],
    /// The port, host byte order (0 when unknown).
    pub port: u16,
    /// Zero.
    pub reserved: [u8; 6],
}

impl CmAddr {
    /// `ip` and `port` as a record.
    pub fn new(ip: IpAddr, port: u16) -> CmAddr {
        let v6 = match ip {
            IpAddr::V4(a) => a.to_ipv6_mapped(),
            IpAddr::V6(a) => a,
        };
        CmAddr {
            addr: v6.octets(),
            port,
            reserved: [0; 6],
        }
    }

    /// The address, IPv4 again when it is IPv4-mapped.
    pub fn ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.addr);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }
}

/// What a side asks for when it connects or accepts (`struct rdma_conn_param`, plus what
/// rdma_cm takes from options and the bound address).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmParam {
    /// Private data for the peer; the first `private_data_len` bytes count.
    pub private_data: [u8; PRIVATE_DATA_MAX],
    /// How many bytes of `private_data` to send.
    pub private_data_len: u16,
    /// READ/ATOMIC requests this side accepts outstanding from the peer.
    pub responder_resources: u8,
    /// READ/ATOMIC requests this side may have outstanding at the peer.
    pub initiator_depth: u8,
    /// Transport retries (3 bits).
    pub retry_count: u8,
    /// RNR retries (3 bits, 7 = infinite).
    pub rnr_retry_count: u8,
    /// Local ACK timeout exponent (`4.096 µs × 2^ack_timeout`); 0 keeps the device default.
    pub ack_timeout: u8,
    /// RNR NAK timer code; 0 keeps the device default.
    pub min_rnr_timer: u8,
    /// The active side's rdma_cm port (the source port of the IP CM header).
    pub src_port: u16,
    /// Zero.
    pub reserved: [u8; 2],
    /// With no QP given: the QP number the REQ or REP announces (the caller moves that QP
    /// itself, `rdma_conn_param.qp_num`).
    pub qp_num: u32,
    /// The ECE the REQ or REP carries (vendor ID 0: none).
    pub ece: Ece,
}

impl Default for CmParam {
    fn default() -> Self {
        CmParam {
            private_data: [0; PRIVATE_DATA_MAX],
            private_data_len: 0,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            ack_timeout: 0,
            min_rnr_timer: 0,
            src_port: 0,
            reserved: [0; 2],
            qp_num: 0,
            ece: Ece::default(),
        }
    }
}

impl CmParam {
    /// The private data that counts (at most [`PRIVATE_DATA_MAX`] bytes, whatever the
    /// length field claims).
    pub fn private_data(&self) -> &[u8] {
        let n = usize::from(self.private_data_len).min(PRIVATE_DATA_MAX);
        &self.private_data[..n]
    }
}

/// What a [`CmEventRec`] reports.
pub mod event {
    /// A peer asks to connect to a service the context listens on (or, for a UDP-port-space
    /// service, which UD QP serves it).
    pub const CONNECT_REQUEST: u32 = 1;
    /// The connection is up, its QP in RTS.
    pub const ESTABLISHED: u32 = 2;
    /// The peer rejected the request (`status`: the REJ reason).
    pub const REJECTED: u32 = 3;
    /// The peer never answered (`status` 0), or answered a SIDR request with a status
    /// other than success (`status`: the SIDR status).
    pub const UNREACHABLE: u32 = 4;
    /// The QP could not be moved to RTR/RTS (`status`: an errno).
    pub const CONNECT_ERROR: u32 = 5;
    /// The connection is closed.
    pub const DISCONNECTED: u32 = 6;
    /// A SIDR request was answered: `remote_qpn` and `qkey` name the peer's UD QP.
    pub const RESOLVED: u32 = 7;
    /// A connection whose QP the caller moves was accepted (`remote_qpn`: the peer's QP):
    /// move the QP to RTR and RTS, then `softrdma_cm_establish`.
    pub const CONNECT_RESPONSE: u32 = 8;
    /// A closed connection's time-wait period ended; the connection is gone.
    pub const TIMEWAIT_EXIT: u32 = 9;
}

/// One event of a context's CM channel.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmEventRec {
    /// One of [`event`].
    pub kind: u32,
    /// The connection it is about.
    pub comm_id: u32,
    /// CONNECT_REQUEST: the service asked for.
    pub service_id: u64,
    /// CONNECT_REQUEST: the peer's address and rdma_cm port.
    pub peer: CmAddr,
    /// CONNECT_REQUEST: the local address the request came to.
    pub local: CmAddr,
    /// CONNECT_REQUEST and CONNECT_RESPONSE: the peer's QP number (0 for a SIDR
    /// request); RESOLVED: the peer's UD QP.
    pub remote_qpn: u32,
    /// REJECTED: the REJ reason; CONNECT_ERROR: an errno; else 0.
    pub status: i32,
    /// CONNECT_REQUEST: READ/ATOMIC requests the peer accepts outstanding.
    pub responder_resources: u8,
    /// CONNECT_REQUEST: READ/ATOMIC requests the peer may have outstanding.
    pub initiator_depth: u8,
    /// How many bytes of `private_data` count.
    pub private_data_len: u16,
    /// The peer's private data (CONNECT_REQUEST without the IP CM header; ESTABLISHED or
    /// CONNECT_RESPONSE on the active side; REJECTED; RESOLVED and a SIDR UNREACHABLE).
    pub private_data: [u8; PRIVATE_DATA_MAX],
    /// RESOLVED: the Q_Key the peer's UD QP takes.
    pub qkey: u32,
    /// CONNECT_REQUEST: the REQ's ECE; ESTABLISHED (active side) and CONNECT_RESPONSE: the
    /// REP's; else none.
    pub ece: Ece,
}

impl Default for CmEventRec {
    fn default() -> Self {
        CmEventRec {
            kind: 0,
            comm_id: 0,
            service_id: 0,
            peer: CmAddr::default(),
            local: CmAddr::default(),
            remote_qpn: 0,
            status: 0,
            responder_resources: 0,
            initiator_depth: 0,
            private_data_len: 0,
            private_data: [0; PRIVATE_DATA_MAX],
            qkey: 0,
            ece: Ece::default(),
        }
    }
}

impl CmEventRec {
    /// Copy `data` in (cut at [`PRIVATE_DATA_MAX`]).
    pub fn set_private_data(&mut self, data: &[u8]) {
        let n = data.len().min(PRIVATE_DATA_MAX);
        self.private_data[..n].copy_from_slice(&data[..n]);
        self.private_data_len = n as u16;
    }

    /// The private data that counts.
    pub fn private_data(&self) -> &[u8] {
        let n = usize::from(self.private_data_len).min(PRIVATE_DATA_MAX);
        &self.private_data[..n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_through_the_v4_mapped_form() {
        for ip in ["127.0.0.2", "fe80::1", "::1"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(CmAddr::new(ip, 7).ip(), ip);
        }
        assert_eq!(
            CmAddr::new("10.0.0.1".parse().unwrap(), 0).addr[10..12],
            [0xff, 0xff]
        );
    }

    #[test]
    fn records_have_a_fixed_size() {
        assert_eq!(size_of::<CmAddr>(), 24);
        assert_eq!(size_of::<CmParam>(), 280);
        assert_eq!(size_of::<CmEventRec>(), 344);
    }

    #[test]
    fn a_lying_length_never_reads_past_the_array() {
        let p = CmParam {
            private_data_len: 999,
            ..CmParam::default()
        };
        assert_eq!(p.private_data().len(), PRIVATE_DATA_MAX);
    }
}
