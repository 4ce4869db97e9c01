//! The soft HCA of softrdma, sans-IO.
//!
//! This crate is what a hardware vendor puts in silicon: the verbs objects (protection
//! domains, memory regions, completion queues, queue pairs), the IBA QP state machine
//! ([`qp_state`], over the QP vocabulary of [`qp_attr`]) and the RoCEv2 RC transport, split
//! the way a NIC splits it (one file per function, as Linux rxe does):
//!
//! - [`pd`], [`mr`], [`cq`], [`qp`]: the verbs objects. Each file holds its object's state and
//!   its verbs (`alloc_pd` in `pd`, `reg_mr` in `mr`, `poll_cq` in `cq`, `modify_qp` and
//!   `post_send` in `qp`, ...), as `impl Engine` blocks; this file keeps the [`Engine`] itself,
//!   the calls that drive it and the device queries;
//! - `recv`: ingress checks (ICRC, destination address, QP, QP state, opcode for the QP type,
//!   P_Key, source address) and dispatch;
//! - `req`: the requester, turning send WQEs into packets (segmentation by path MTU, PSNs,
//!   AckReq, the unacknowledged-PSN window, `max_rd_atomic`, fences, go-back-N);
//! - `comp`: the completer, turning ACKs, NAKs, RNR NAKs, READ responses and ATOMIC ACKs into
//!   completions in posting order, running the local ACK and RNR timers, and flushing on error;
//! - `resp`: the responder, executing requests against memory (PSN checks, one NAK per gap,
//!   duplicates re-ACKed, READ/ATOMIC replayed from the responder resources, key / PD / bounds
//!   / rights checks, RNR NAKs, receive completions), and `ack`, its policy for when a plain
//!   ACK leaves (coalescing, and peers that wait for their ACKs);
//! - `uc` and [`ud`]: the unreliable services, requester and responder each (no ACKs, no
//!   retransmission; UC resynchronises on the next FIRST / ONLY, UD checks Q_Keys and writes
//!   the GRH);
//! - [`srq`], [`mw`], [`ah`]: shared receive queues, memory windows (and invalidation),
//!   address handles; `local` runs binds and local invalidations at the send queue head;
//! - [`mcast`]: UD multicast groups and the copy of a multicast datagram each attached QP
//!   receives;
//! - [`counters`]: a counter for every drop and error reason, per QP and per device.
//!
//! # Driving it
//!
//! The engine does no I/O, reads no clock and starts no thread. Its host (the `sim` in tests,
//! the runtime in production) calls:
//!
//! - [`Engine::handle_datagram`] with every received packet, a whole IP packet (IPv4 or IPv6
//!   header, UDP to port 4791, BTH, ..., ICRC). The ICRC is verified over the IP header too,
//!   so the host must hand in the header as it arrived; packets that fail are counted
//!   ([`Counter::RxBadIcrc`]) and dropped. A host that cannot see the sender's IPv4
//!   identification (a UDP socket) may set [`EngineConfig::ipv4_ident`] to
//!   [`Ipv4IdentPolicy::Recover`]: the engine then finds the ID in the ICRC, at the cost of
//!   half its protection.
//! - [`Engine::poll_transmit`] until it returns `None`, sending `buf[..len]` to
//!   [`Transmit::dst`]. IPv4 packets carry ID 0 and DF, as an unconnected UDP socket with
//!   `IP_PMTUDISC_DO` sends them, so the ICRC computed here is the one the peer checks. The UDP
//!   source port is derived from the QPNs and flow label as Linux rxe derives it, or fixed by
//!   [`EngineConfig::udp_src_port`]. The engine decides when each plain ACK leaves (see
//!   [`Engine::poll_transmit`]); the host only has to honour [`Engine::poll_timeout`].
//! - [`Engine::handle_timeout`] once the time [`Engine::poll_timeout`] returned has come,
//!   then [`Engine::poll_transmit`] (re-read `poll_timeout` after every call: sending arms
//!   timers, and receiving queues ACKs). A host about to stop calls
//!   [`Engine::flush_acks`] before its last `poll_transmit`.
//! - The verbs, below.
//!
//! Time is an [`Instant`] handed in by the caller. Registered memory is reached through the
//! [`Memory`] trait, after the engine checked keys, protection domains, bounds and rights;
//! message data is never gathered into a buffer: each packet's payload is read from memory
//! straight into the transmit buffer, and each received payload is written straight to memory.
//!
//! # Verbs
//!
//! | libibverbs | here |
//! |---|---|
//! | `ibv_query_device` / `_port` / `_gid` | [`Engine::query_device`], [`Engine::query_port`], [`Engine::query_gid`] (RoCEv2 GIDs: `::ffff:a.b.c.d` for IPv4) |
//! | `ibv_alloc_pd` / `ibv_dealloc_pd` | [`Engine::alloc_pd`], [`Engine::dealloc_pd`] |
//! | `ibv_reg_mr` / `ibv_dereg_mr` | [`Engine::reg_mr`] (with a [`MemOwner`] token passed back to [`Memory`]), [`Engine::dereg_mr`] |
//! | `ibv_rereg_mr` | [`Engine::rereg_mr`] ([`ReregFlags`]; the handle and both keys stay) |
//! | `ibv_create_cq` / `ibv_destroy_cq` / `ibv_poll_cq` | [`Engine::create_cq`], [`Engine::destroy_cq`], [`Engine::poll_cq_into`] (or [`Engine::poll_cq`]) |
//! | `ibv_req_notify_cq` / `ibv_get_cq_event` | [`Engine::req_notify_cq`], [`Engine::get_cq_event`] |
//! | `ibv_create_qp` / `ibv_modify_qp` / `ibv_query_qp` / `ibv_destroy_qp` | [`Engine::create_qp`], [`Engine::modify_qp`], [`Engine::query_qp`], [`Engine::destroy_qp`] |
//! | `ibv_post_send` / `ibv_post_recv` | [`Engine::post_send`] ([`SendWr`]), [`Engine::post_recv`] ([`RecvWr`]) |
//! | `ibv_get_async_event` / `ibv_ack_async_event` | [`Engine::get_async_event`], [`Engine::ack_async_event`] ([`Engine::set_port_state`] raises the port events) |
//! | `ibv_create_srq` / `_modify_` / `_query_` / `_destroy_` / `ibv_post_srq_recv` | [`Engine::create_srq`], [`Engine::modify_srq`], [`Engine::query_srq`], [`Engine::destroy_srq`], [`Engine::post_srq_recv`]; QPs on an SRQ: [`Engine::create_qp_with_srq`] |
//! | `ibv_create_ah` / `ibv_destroy_ah` | [`Engine::create_ah`], [`Engine::destroy_ah`] |
//! | `ibv_post_send` on UD (`wr.ud`) | [`Engine::post_send_ud`] ([`UdDest`]) |
//! | `ibv_attach_mcast` / `ibv_detach_mcast` | [`Engine::attach_mcast`], [`Engine::detach_mcast`] (send to a group: an AH with its GID, [`MULTICAST_QPN`]) |
//! | `ibv_alloc_mw` / `ibv_bind_mw` / `ibv_dealloc_mw` | [`Engine::alloc_mw`], [`Engine::bind_mw`] (type 1), [`SendOp::BindMw`] (type 2), [`Engine::dealloc_mw`] |
//! | `IBV_WR_LOCAL_INV` / `IBV_WR_SEND_WITH_INV` | [`SendOp::LocalInv`] (type 2 windows and MRs), [`SendOp::SendWithInv`] |
//!
//! Verb failures are [`VerbsError`]s with [`VerbsError::errno`]; failures of accepted work
//! requests come back as completions with a [`WcStatus`] (numbered as `ibv_wc_status`).
//!
//! # What is not here yet
//!
//! Congestion control (CNPs are counted and ignored), selective retransmission (go-back-N
//! only), XRC, and fast-registration MRs (any MR can be invalidated, none re-validated).
//! UC, UD, SRQs, address handles and memory windows are in their own files (`uc`, [`ud`],
//! [`srq`], [`ah`], [`mw`], `local`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod counters;
pub mod cq;
pub mod device;
pub mod error;
pub mod gsi;
pub mod memory;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod qp_attr;
pub mod qp_state;
pub mod time;
pub mod wr;

pub mod ah;
pub mod mcast;
pub mod mw;
pub mod srq;
pub mod ud;

mod ack;
mod comp;
mod events;
mod local;
mod qp_ext;
mod recv;
mod recv_wqe;
mod req;
mod resp;
mod rng;
mod sched;
mod table;
mod timers;
mod uc;

use std::collections::VecDeque;
use std::net::IpAddr;

pub use counters::{Counter, Counters};
pub use cq::{CqHandle, NetworkHdr, WcFlags, WcOpcode, WcStatus, WorkCompletion};
pub use device::{
    AtomicCap, DeviceAttr, EngineConfig, Gid, Ipv4IdentPolicy, LinkLayer, PortAttr, PortState,
    DEFAULT_ACK_COALESCE, MAX_INTERNAL_MTU,
};
pub use error::VerbsError;
pub use memory::{MemOwner, Memory, MemoryError};
pub use mr::{MrHandle, MrKeys, ReregFlags};
pub use pd::PdHandle;
pub use qp::QpInitAttr;
pub use qp_attr::{AccessFlags, AhAttr, PathMtu, QpAttr, QpAttrMask, QpCap, QpState, QpType};
pub use qp_state::ModifyError;
pub use time::Instant;
pub use uc::check_op as check_send_op;
pub use wr::{
    InlineData, RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge, SgeList, INLINE_BYTES,
    INLINE_SGES,
};

pub use ah::AhHandle;
pub use mcast::MULTICAST_QPN;
pub use mw::{inc_rkey, MwBind, MwHandle, MwKeys, MwType};
pub use srq::{SrqAttr, SrqAttrMask, SrqHandle};
pub use ud::{UdDest, GRH_LEN};
/// The numbers the verbs structs carry, typed so a QPN, an L_Key and an R_Key cannot be mixed.
pub use wire::types::{Lkey, Qpn, Rkey};

use cq::Push;
use mr::MrTable;
use pd::Pd;
use qp::{Path, Qp};
use rng::Rng;
use table::Table;

/// A packet `poll_transmit` wrote: `buf[..len]` is a whole IP packet for `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// Bytes written at the start of the buffer.
    pub len: usize,
    /// Where to send it (the IP destination of the packet). A multicast address (a UD send
    /// through an address handle whose DGID is a multicast group, to [`MULTICAST_QPN`]) is
    /// for every device that joined the group, this one included: the host delivers the
    /// packet to the network's members and, when a QP of this engine is attached
    /// ([`Engine::attach_mcast`]), back to this engine's [`Engine::handle_datagram`] too.
    pub dst: IpAddr,
    /// The packet is for an internal path ([`EngineConfig::internal_addresses`]): it has no
    /// ICRC and may exceed the port MTU, so it must go to [`Engine::handle_internal`] of the
    /// engine serving `dst`, never onto the network.
    pub internal: bool,
}

/// An asynchronous event (`ibv_async_event`), read with [`Engine::get_async_event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// A CQ overflowed (`IBV_EVENT_CQ_ERR`); the QPs feeding it were moved to ERR.
    CqErr {
        /// The CQ.
        cq: CqHandle,
    },
    /// A QP in SQD finished the messages it had started (`IBV_EVENT_SQ_DRAINED`; only if
    /// `en_sqd_async_notify` was set).
    SqDrained {
        /// The QP number.
        qpn: Qpn,
    },
    /// A QP hit an error it cannot report through a completion (`IBV_EVENT_QP_FATAL`), e.g.
    /// its CQ overflowed; it is in ERR.
    QpFatal {
        /// The QP number.
        qpn: Qpn,
    },
    /// An SRQ fell below its armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`); the limit is
    /// disarmed until `modify_srq` sets it again.
    SrqLimitReached {
        /// The SRQ.
        srq: SrqHandle,
    },
    /// A QP attached to an SRQ entered ERR and will consume no more WQEs
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED`, IBA 11.6.3.1).
    QpLastWqeReached {
        /// The QP number.
        qpn: Qpn,
    },
    /// The port became active (`IBV_EVENT_PORT_ACTIVE`).
    PortActive {
        /// The port number.
        port: u8,
    },
    /// The port went down (`IBV_EVENT_PORT_ERR`).
    PortErr {
        /// The port number.
        port: u8,
    },
    /// The device failed for good (`IBV_EVENT_DEVICE_FATAL`): nothing on it works any
    /// more. Never raised by an engine: a client of softrdmad raises it, once, when the
    /// daemon died.
    DeviceFatal,
}

/// First QPN handed out: QP0 and QP1 are the special QPs of IBA 10.2.5 (SMI, GSI).
const FIRST_QPN: u32 = 0x11;

/// What the transport functions share while one call runs (split borrows of the engine).
pub(crate) struct Ctx<'a, M: Memory + ?Sized> {
    pub(crate) now: Instant,
    pub(crate) mem: &'a mut M,
    pub(crate) mrs: &'a mut MrTable,
    pub(crate) mws: &'a mut mw::MwTable,
    pub(crate) srqs: &'a mut Table<srq::Srq>,
    pub(crate) cqs: &'a mut cq::CqTable,
    pub(crate) counters: &'a mut Counters,
    pub(crate) events: &'a mut VecDeque<AsyncEvent>,
    /// Completion events of armed CQs (`req_notify_cq`), for `get_cq_event`.
    pub(crate) cq_events: &'a mut VecDeque<CqHandle>,
    /// CQs that overflowed during this call: their QPs go to ERR afterwards.
    pub(crate) overflowed: &'a mut Vec<CqHandle>,
    pub(crate) ack_req_every: u32,
    pub(crate) max_unacked: u32,
    /// `EngineConfig::ack_coalesce`.
    pub(crate) ack_coalesce: core::time::Duration,
}

impl<M: Memory + ?Sized> Ctx<'_, M> {
    /// Count an event against the QP and the device.
    pub(crate) fn count(&mut self, qp: &mut Qp, c: Counter) {
        qp.counters.inc(c);
        self.counters.inc(c);
    }

    /// Count `n` against the QP and the device.
    pub(crate) fn count_n(&mut self, qp: &mut Qp, c: Counter, n: u64) {
        qp.counters.add(c, n);
        self.counters.add(c, n);
    }

    /// Store a completion; an overflow errors the CQ (IBA 11.4.2.1) once.
    pub(crate) fn push_cqe(&mut self, qp: &mut Qp, cq: CqHandle, wc: WorkCompletion) {
        self.push_cqe_se(qp, cq, wc, false);
    }

    /// Store a completion of a message that carried the solicited-event bit or not: an
    /// armed CQ raises its completion event (IBA 11.4.2.2: a solicited-only CQ fires for
    /// solicited and for error completions).
    pub(crate) fn push_cqe_se(
        &mut self,
        qp: &mut Qp,
        cq: CqHandle,
        wc: WorkCompletion,
        solicited: bool,
    ) {
        let Some(c) = self.cqs.get_mut(cq.0) else {
            return;
        };
        if let Some(solicited_only) = c.armed {
            if !solicited_only || solicited || wc.status != WcStatus::Success {
                c.armed = None;
                self.cq_events.push_back(cq);
            }
        }
        if let Push::Overflow { first } = self.cqs.push(cq, wc) {
            self.count(qp, Counter::CqOverflow);
            if first {
                self.events.push_back(AsyncEvent::CqErr { cq });
                self.overflowed.push(cq);
            }
        }
    }
}

/// The QPs by number: a hash map, one look-up per packet, post and timer whatever the
/// number of QPs (a B-tree cost a walk through cold nodes at ten thousand). Nothing may
/// depend on its iteration order: the one pass that acts on many QPs sorts them first.
pub(crate) type QpTable = foldhash::HashMap<u32, Qp>;

/// One soft HCA with one RoCEv2 port.
///
/// `M` is how it reaches memory: `dyn Memory` by default ([`Engine::new`]); a host that
/// needs the engine to be `Send` uses `Engine<dyn Memory + Send>` or a concrete type
/// ([`Engine::with_memory`]), which also lets the compiler inline the memory accesses.
pub struct Engine<M: Memory + ?Sized = dyn Memory> {
    config: EngineConfig,
    gids: Vec<Gid>,
    mem: Box<M>,
    rng: Rng,
    pds: Table<Pd>,
    mrs: MrTable,
    cqs: cq::CqTable,
    qps: QpTable,
    srqs: Table<srq::Srq>,
    mws: mw::MwTable,
    ahs: Table<ah::Ah>,
    port_state: PortState,
    /// Delivered events that must be acknowledged (`ack_async_event`).
    unacked_events: Vec<AsyncEvent>,
    /// QPs with something to send that need not wait (see `Qp::urgent`): `poll_transmit`
    /// looks only at these, so idle QPs cost nothing.
    active: sched::Active,
    /// QPs whose responder holds a plain ACK alone, by when it is due: they are not in
    /// `active`, so that a pass looks at none of them before it is due (with many QPs each
    /// holding one, a pass that scanned them cost a look at every one per packet sent).
    acks: timers::Timers,
    /// QPs whose ACK came due, served one a `poll_transmit`, earliest last.
    due_acks: Vec<u32>,
    next_qpn: u32,
    counters: Counters,
    events: VecDeque<AsyncEvent>,
    cq_events: VecDeque<CqHandle>,
    /// ACKs that destroyed or reset QPs still owed their peers: sent at the next
    /// `poll_transmit`.
    parting: VecDeque<resp::Parting>,
    /// The QPs' requester timers by deadline.
    timers: timers::Timers,
    /// The QPs whose timers `handle_timeout` runs, kept between calls for its capacity.
    due: Vec<u32>,
    /// QP1.
    gsi: gsi::Gsi,
    /// The multicast groups QPs are attached to.
    mcast: mcast::Groups,
}

impl<M: Memory + ?Sized> core::fmt::Debug for Engine<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Engine")
            .field("gids", &self.gids)
            .field("qps", &self.qps.len())
            .field("mrs", &self.mrs.len())
            .finish_non_exhaustive()
    }
}

macro_rules! ctx {
    ($self:ident, $now:expr, $overflowed:ident) => {
        Ctx {
            now: $now,
            mem: &mut *$self.mem,
            mrs: &mut $self.mrs,
            mws: &mut $self.mws,
            srqs: &mut $self.srqs,
            cqs: &mut $self.cqs,
            counters: &mut $self.counters,
            events: &mut $self.events,
            cq_events: &mut $self.cq_events,
            overflowed: &mut $overflowed,
            ack_req_every: $self.config.ack_req_every.max(1),
            max_unacked: $self.config.max_unacked_psns.clamp(1, 1 << 22),
            ack_coalesce: $self.config.ack_coalesce,
        }
    };
}
pub(crate) use ctx;

impl Engine<dyn Memory> {
    /// A device with the port addresses, limits and RNG seed of `config`, reaching registered
    /// memory through `memory`.
    pub fn new(config: EngineConfig, memory: Box<dyn Memory>) -> Engine {
        Engine::with_memory(config, memory)
    }
}

impl<M: Memory + ?Sized> Engine<M> {
    /// Like [`Engine::new`] for any memory type (e.g. `dyn Memory + Send`, or a concrete
    /// type).
    pub fn with_memory(config: EngineConfig, memory: Box<M>) -> Engine<M> {
        let gids = config
            .addresses
            .iter()
            .map(|&ip| Gid::from_ip(ip))
            .collect();
        let rng = Rng::new(config.rng_seed);
        Engine {
            config,
            gids,
            mem: memory,
            rng,
            pds: Table::default(),
            mrs: MrTable::default(),
            cqs: cq::CqTable::default(),
            qps: QpTable::default(),
            srqs: Table::default(),
            mws: mw::MwTable::default(),
            ahs: Table::default(),
            port_state: PortState::Active,
            unacked_events: Vec::new(),
            active: sched::Active::default(),
            acks: timers::Timers::default(),
            due_acks: Vec::new(),
            next_qpn: FIRST_QPN,
            counters: Counters::default(),
            events: VecDeque::new(),
            cq_events: VecDeque::new(),
            parting: VecDeque::new(),
            timers: timers::Timers::default(),
            due: Vec::new(),
            gsi: gsi::Gsi::default(),
            mcast: mcast::Groups::default(),
        }
    }

    /// Serve `addrs` inside this process from now on, as [`EngineConfig::internal_addresses`]
    /// does: paths to them made after this call are internal (another device of the host
    /// this engine was linked with; its engine must list this one's addresses too, as only
    /// internal QPs take internal packets).
    pub fn add_internal_addresses(&mut self, addrs: &[IpAddr]) {
        for a in addrs {
            if !self.config.internal_addresses.contains(a) {
                self.config.internal_addresses.push(*a);
            }
        }
    }

    // ----- driving calls -----

    /// Process one received packet (a whole IP packet). Bad packets are counted and dropped.
    pub fn handle_datagram(&mut self, now: Instant, packet: &[u8]) {
        self.handle_packet(now, packet, false);
    }

    /// Process a packet that an engine of this process built for an internal path
    /// ([`Transmit::internal`]): no ICRC is checked, and only QPs whose own path is internal
    /// accept it (as they accept nothing else). Never call it with bytes from a socket.
    pub fn handle_internal(&mut self, now: Instant, packet: &[u8]) {
        self.handle_packet(now, packet, true);
    }

    fn handle_packet(&mut self, now: Instant, packet: &[u8], internal: bool) {
        if self.port_state == PortState::Down {
            return;
        }
        let ident = self.config.ipv4_ident;
        let mut overflowed = Vec::new();
        let touched = {
            let mut ctx = ctx!(self, now, overflowed);
            recv::handle(
                &mut ctx,
                recv::Addresses {
                    gids: &self.gids,
                    groups: &self.mcast,
                },
                &mut self.qps,
                &mut self.gsi,
                packet,
                internal,
                ident,
            )
        };
        if let Some(qp) = touched {
            refile(&mut self.active, &mut self.acks, &mut self.timers, qp);
        }
        self.error_overflowed(overflowed);
    }

    /// [`refile`] `qpn`, looked up.
    fn refile(&mut self, qpn: u32) {
        if let Some(qp) = self.qps.get_mut(&qpn) {
            refile(&mut self.active, &mut self.acks, &mut self.timers, qp);
        }
    }

    /// Run the timers that are due at `now` (local ACK timeout, RNR wait).
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut overflowed = Vec::new();
        let mut due = std::mem::take(&mut self.due);
        self.timers.take_due(now, &mut due);
        {
            let mut ctx = ctx!(self, now, overflowed);
            for &qpn in &due {
                let Some(qp) = self.qps.get_mut(&qpn) else {
                    continue;
                };
                // Taken out of `timers`: what the QP knew of its entry is wrong now.
                qp.filed.timer.forget();
                if comp::next_timeout(qp).is_some_and(|t| t <= now) {
                    comp::handle_timers(qp, &mut ctx);
                }
            }
        }
        for &qpn in &due {
            self.refile(qpn);
        }
        due.clear();
        self.due = due;
        self.error_overflowed(overflowed);
    }

    /// Write the next packet to send into `buf`; `None` when nothing is ready at `now`, or
    /// when `buf` is too small for the next packet (a buffer of path MTU + 128 bytes always
    /// suffices). QPs take turns.
    ///
    /// Requests and the responses that never wait (NAKs, RNR NAKs, READ responses, ATOMIC
    /// ACKs) come first; a plain ACK only once it is due at `now`. A plain ACK made while
    /// handling packets at time T is never due at T: a host that handles a packet and sends
    /// at once sends the reply its application posts next before the ACK. It is due at the
    /// next pass (T + 1 ns) when the peer waits for our ACKs, otherwise
    /// [`EngineConfig::ack_coalesce`] later; newer ACKs of the QP replace it meanwhile (ACKs
    /// are cumulative) and keep its deadline. [`Engine::poll_timeout`] includes those
    /// deadlines, so a host that calls `poll_transmit` when that time comes sends every ACK
    /// on time.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if self.port_state == PortState::Down {
            return None;
        }
        if let Some(p) = self.parting.front() {
            if let Some(len) = resp::transmit_parting(p, buf) {
                let dst = p.dst();
                let internal = p.internal();
                self.parting.pop_front();
                self.counters.inc(Counter::RespAcksSent);
                self.counters.inc(Counter::TxPackets);
                self.counters.add(Counter::TxBytes, len as u64);
                return Some(Transmit { len, dst, internal });
            }
            return None;
        }
        if let Some(t) = self.gsi.transmit(&mut self.counters, buf) {
            self.counters.inc(Counter::TxPackets);
            self.counters.add(Counter::TxBytes, t.len as u64);
            return Some(t);
        }
        self.transmit_pass(now, buf)
            .or_else(|| self.transmit_due_ack(now, buf))
    }

    /// The oldest MAD received on QP1 (the GSI), for the device's connection manager.
    pub fn poll_mad(&mut self) -> Option<gsi::Mad> {
        self.gsi.poll()
    }

    /// Send a MAD from QP1 at local address `src` to QP `dest_qp` (1 for the connection
    /// manager) at `dst`; it leaves through [`Engine::poll_transmit`]. Fails with
    /// `InvalidAh` when `src` is not this port's or the families differ, and `QueueFull`
    /// when the host queued more than the GSI holds.
    pub fn send_mad(
        &mut self,
        src: IpAddr,
        dst: IpAddr,
        dest_qp: u32,
        mad: &[u8; gsi::MAD_LEN],
    ) -> Result<(), VerbsError> {
        self.gsi.send(&self.gids, src, dst, dest_qp, mad)
    }

    /// One round-robin pass over the QPs with something urgent to send, for the first packet.
    fn transmit_pass(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        let mut overflowed = Vec::new();
        let mut result = None;
        {
            let mut ctx = ctx!(self, now, overflowed);
            // Round robin among the active QPs: each looked at once, the one that sent
            // goes last.
            let mut found = None;
            for _ in 0..self.active.len() {
                let Some(qpn) = self.active.next() else {
                    break;
                };
                let Some(qp) = self.qps.get_mut(&qpn) else {
                    // Not expected (`destroy_qp` takes a QP out of the queue); not given
                    // back.
                    continue;
                };
                let sent = transmit_one(qp, &mut ctx, buf, Pass::Urgent);
                // What it sent may leave a plain ACK alone in its queue, to wait until due.
                let ack = resp::ack_due(qp);
                self.acks.file_known(&mut qp.filed.ack, qpn, ack);
                if let Some(t) = sent {
                    self.active.served(qpn, &mut qp.filed.active, true);
                    // Sending starts the local ACK timer.
                    let deadline = comp::next_timeout(qp);
                    self.timers.file_known(&mut qp.filed.timer, qpn, deadline);
                    found = Some(t);
                    break;
                }
                let busy = qp.urgent();
                self.active.served(qpn, &mut qp.filed.active, busy);
            }
            if let Some(t) = found {
                ctx.counters.inc(Counter::TxPackets);
                ctx.counters.add(Counter::TxBytes, t.len as u64);
                result = Some(t);
            }
        }
        self.error_overflowed(overflowed);
        result
    }

    /// The next plain ACK that is due at `now`, from the QPs `acks` has filed by then.
    fn transmit_due_ack(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if self.due_acks.is_empty() {
            self.acks.take_due(now, &mut self.due_acks);
            // Earliest last: `pop` serves it first.
            self.due_acks.reverse();
            // Taken out of `acks`: what each QP knew of its entry is wrong now.
            for qpn in &self.due_acks {
                if let Some(qp) = self.qps.get_mut(qpn) {
                    qp.filed.ack.forget();
                }
            }
        }
        let mut overflowed = Vec::new();
        let mut result = None;
        {
            let mut ctx = ctx!(self, now, overflowed);
            while let Some(qpn) = self.due_acks.pop() {
                let Some(qp) = self.qps.get_mut(&qpn) else {
                    continue;
                };
                if let Some(t) = transmit_one(qp, &mut ctx, buf, Pass::DueAcks) {
                    ctx.counters.inc(Counter::TxPackets);
                    ctx.counters.add(Counter::TxBytes, t.len as u64);
                    result = Some(t);
                    break;
                }
                // Filed earlier than its ACK is due (a newer one took its place), or sent
                // already (something queued behind it made it leave): file it as it is.
                let ack = resp::ack_due(qp);
                self.acks.file_known(&mut qp.filed.ack, qpn, ack);
            }
        }
        self.error_overflowed(overflowed);
        result
    }

    /// The earliest time something is due that needs no new packet or verb: a timer for
    /// `handle_timeout` (local ACK timeout, RNR wait) or a plain ACK `poll_transmit` holds
    /// back. Call `handle_timeout`, then `poll_transmit`, when it comes.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let timers = self.timers.first();
        debug_assert!(
            self.qps
                .values()
                .filter_map(comp::next_timeout)
                .min()
                .is_none_or(|t| timers.is_some_and(|f| f <= t)),
            "a QP's timer is filed later than it falls due"
        );
        debug_assert!(
            !self.due_acks.is_empty()
                || self
                    .qps
                    .values()
                    .filter_map(resp::ack_due)
                    .min()
                    .is_none_or(|t| self.acks.first().is_some_and(|f| f <= t)),
            "a QP's ACK is filed later than it is due"
        );
        if self.port_state == PortState::Down {
            // Nothing leaves a port that is down: held ACKs wait for it to come up.
            return timers;
        }
        let acks = if self.parting.is_empty() && self.due_acks.is_empty() {
            self.acks.first()
        } else {
            Some(Instant::default())
        };
        match (timers, acks) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Make every plain ACK the responders hold back due now, for a host about to stop
    /// driving the engine: its next `poll_transmit` passes send them, so no peer waits for
    /// an ACK that would never leave.
    pub fn flush_acks(&mut self) {
        for (&qpn, qp) in self.qps.iter_mut() {
            resp::release_ack(qp);
            let ack = resp::ack_due(qp);
            self.acks.file_known(&mut qp.filed.ack, qpn, ack);
        }
    }

    /// Move every QP that feeds an overflowed CQ to ERR (IBA 11.4.2.1: CQ overrun is an
    /// affiliated asynchronous error of the QPs using it). Every verb and packet ends here,
    /// nearly always with nothing: that much is inlined.
    #[inline]
    fn error_overflowed(&mut self, overflowed: Vec<CqHandle>) {
        if !overflowed.is_empty() {
            self.error_overflowed_cqs(overflowed);
        }
    }

    #[inline(never)]
    fn error_overflowed_cqs(&mut self, mut overflowed: Vec<CqHandle>) {
        while !overflowed.is_empty() {
            let cqs = std::mem::take(&mut overflowed);
            let now = Instant::default();
            let mut ctx = ctx!(self, now, overflowed);
            // In QPN order, whatever the table's: the events and the flushed completions
            // come out the same on every run.
            let mut failed: Vec<u32> = self
                .qps
                .iter()
                .filter(|(_, qp)| {
                    (cqs.contains(&qp.send_cq) || cqs.contains(&qp.recv_cq))
                        && qp.state() != QpState::Err
                })
                .map(|(&qpn, _)| qpn)
                .collect();
            failed.sort_unstable();
            for &qpn in &failed {
                let Some(qp) = self.qps.get_mut(&qpn) else {
                    continue;
                };
                ctx.events.push_back(AsyncEvent::QpFatal {
                    qpn: crate::Qpn::new(qp.qpn),
                });
                comp::enter_error(qp, &mut ctx);
            }
            for qpn in failed {
                // Entering ERR makes an ACK waiting alone due at once.
                self.refile(qpn);
            }
        }
    }

    // ----- device, port, GIDs -----

    /// `ibv_query_device`.
    pub fn query_device(&self) -> DeviceAttr {
        self.config.device.clone()
    }

    /// `ibv_query_port` (the device has port 1 only).
    pub fn query_port(&self, port: u8) -> Result<PortAttr, VerbsError> {
        if port != 1 {
            return Err(VerbsError::InvalidPort(port));
        }
        Ok(PortAttr {
            state: self.port_state,
            max_mtu: self.config.mtu,
            active_mtu: self.config.mtu,
            gid_tbl_len: self.gids.len() as u32,
            pkey_tbl_len: 1,
            max_msg_sz: MAX_MSG_SIZE,
            link_layer: LinkLayer::Ethernet,
        })
    }

    /// `ibv_query_gid`: the RoCEv2 GID at `index` of port 1.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid, VerbsError> {
        if port != 1 {
            return Err(VerbsError::InvalidPort(port));
        }
        self.gids
            .get(index as usize)
            .copied()
            .ok_or(VerbsError::InvalidGidIndex(index))
    }

    /// Device-wide counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: u32) -> Result<&Counters, VerbsError> {
        self.qps
            .get(&qpn)
            .map(|q| &q.counters)
            .ok_or(VerbsError::InvalidQp)
    }

    /// The next asynchronous event, if any (`ibv_get_async_event`). SRQ limit and last WQE
    /// reached events must be acknowledged ([`Engine::ack_async_event`]) before their SRQ
    /// can be destroyed; the others need no acknowledgement.
    pub fn get_async_event(&mut self) -> Option<AsyncEvent> {
        let ev = self.events.pop_front();
        if let Some(e) = ev {
            self.note_delivered(e);
        }
        ev
    }

    /// The memory the engine accesses (for the host: it is the host's own object).
    pub fn memory_mut(&mut self) -> &mut M {
        &mut self.mem
    }
}

/// Serve `qp` after a call that may have given it something to send or started or stopped
/// one of its timers (this runs after every packet received and every WR posted): a request
/// or an urgent response joins `active`, a plain ACK waiting alone is filed in `acks` by
/// when it is due, and the requester timers are filed again in `timers`. The caller holds
/// the QP already: no look-up.
fn refile(
    active: &mut sched::Active,
    acks: &mut timers::Timers,
    timers: &mut timers::Timers,
    qp: &mut Qp,
) {
    let qpn = qp.qpn;
    if qp.urgent() {
        active.insert(qpn, &mut qp.filed.active);
    }
    let (ack, timer) = (resp::ack_due(qp), comp::next_timeout(qp));
    acks.file_known(&mut qp.filed.ack, qpn, ack);
    timers.file_known(&mut qp.filed.timer, qpn, timer);
}

/// Largest message (IBA: 2^31 bytes).
pub const MAX_MSG_SIZE: u32 = 1 << 31;

/// What a pass of `poll_transmit` over the QPs looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Requests, and responses that need not wait.
    Urgent,
    /// Plain ACKs due now.
    DueAcks,
}

fn transmit_one<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    buf: &mut [u8],
    pass: Pass,
) -> Option<Transmit> {
    if !qp.may_transmit() {
        return None;
    }
    if qp.qp_type == QpType::Ud && pass != Pass::DueAcks {
        // UD addresses each WR with its own AH: no path.
        return ud::transmit(qp, ctx, buf);
    }
    let Path {
        dst_ip, internal, ..
    } = qp.path?;
    let sent = |len| Transmit {
        len,
        dst: dst_ip,
        internal,
    };
    if pass == Pass::DueAcks {
        return resp::transmit_due_ack(qp, ctx, buf).map(sent);
    }
    if qp.qp_type == QpType::Uc {
        return uc::transmit(qp, ctx, buf).map(sent);
    }
    if let Some(len) = resp::transmit(qp, ctx, buf) {
        return Some(sent(len));
    }
    // Binds and local invalidations run at the head of the send queue.
    if !local::run_head(qp, ctx) {
        return None;
    }
    req::transmit(qp, ctx, buf).map(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn an_engine_over_send_memory_is_send() {
        assert_send::<Engine<dyn Memory + Send>>();
    }
}
