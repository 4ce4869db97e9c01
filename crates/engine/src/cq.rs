//! Completion queues and the work completions they hold (`ibv_cq`, `ibv_wc`), and the CQ
//! verbs (create, resize, destroy, poll, notify).

use std::collections::VecDeque;

use bitflags::bitflags;

use crate::error::VerbsError;
use crate::memory::Memory;
use crate::table::Table;
use crate::Engine;
use wire::types::{Qpn, Rkey};

/// Handle of a completion queue within one [`crate::Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CqHandle(pub u32);

/// The status of a work completion, with the numeric values of `enum ibv_wc_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u32)]
pub enum WcStatus {
    /// The work request completed.
    Success = 0,
    /// A message did not fit the receive buffer, or a send's length was invalid.
    LocLenErr = 1,
    /// An internal QP consistency error was detected while processing the WR.
    LocQpOpErr = 2,
    /// (RD only, never produced.) Local EE context operation error.
    LocEecOpErr = 3,
    /// A local buffer's lkey, PD, bounds or rights did not allow the access.
    LocProtErr = 4,
    /// The QP was in the error state: the WR was flushed without being executed.
    WrFlushErr = 5,
    /// A memory window bind failed.
    MwBindErr = 6,
    /// The responder answered with an unexpected opcode or length.
    BadRespErr = 7,
    /// A protection error on a local buffer written by an incoming message.
    LocAccessErr = 8,
    /// The responder reported an invalid request (NAK Invalid Request).
    RemInvReqErr = 9,
    /// The responder reported a remote access error (NAK Remote Access Error: rkey, PD,
    /// bounds or rights).
    RemAccessErr = 10,
    /// The responder could not complete the operation (NAK Remote Operational Error).
    RemOpErr = 11,
    /// The transport retry counter was exceeded (local ACK timeouts or sequence NAKs).
    RetryExcErr = 12,
    /// The RNR retry counter was exceeded (the responder never had a receive posted).
    RnrRetryExcErr = 13,
    /// (RD only, never produced.) Local RDD violation.
    LocRddViolErr = 14,
    /// The responder reported an invalid RD request (NAK Invalid RD Request).
    RemInvRdReqErr = 15,
    /// The remote side aborted the operation.
    RemAbortErr = 16,
    /// (RD only, never produced.) Invalid EE context number.
    InvEecnErr = 17,
    /// (RD only, never produced.) Invalid EE context state.
    InvEecStateErr = 18,
    /// A fatal device error.
    FatalErr = 19,
    /// The response timed out.
    RespTimeoutErr = 20,
    /// Any other error.
    GeneralErr = 21,
}

impl WcStatus {
    /// The `ibv_wc_status` number.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }

    /// What `ibv_wc_status_str` prints for it.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "operation aborted",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

impl core::fmt::Display for WcStatus {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a completion is for, with the numeric values of `enum ibv_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[repr(u32)]
pub enum WcOpcode {
    /// A SEND (with or without immediate / invalidate) completed at the requester.
    Send = 0,
    /// An RDMA WRITE (with or without immediate) completed at the requester.
    RdmaWrite = 1,
    /// An RDMA READ completed at the requester.
    RdmaRead = 2,
    /// An ATOMIC compare-and-swap completed at the requester.
    CompSwap = 3,
    /// An ATOMIC fetch-and-add completed at the requester.
    FetchAdd = 4,
    /// A memory window bind completed.
    BindMw = 5,
    /// A local invalidate completed.
    LocalInv = 6,
    /// A receive WQE was consumed by a SEND.
    Recv = 128,
    /// A receive WQE was consumed by an RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// The `ibv_wc_opcode` number.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }
}

bitflags! {
    /// `ibv_wc_flags`: what else a completion carries.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// The receive buffer starts with a 40-byte GRH (UD).
        const GRH = 1 << 0;
        /// `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// The checksum of an IP packet was verified (raw packet QPs; never set here).
        const IP_CSUM_OK = 1 << 2;
        /// `invalidated_rkey` is valid.
        const WITH_INV = 1 << 3;
    }
}

/// The network header a received datagram came in (Linux's `ib_wc.network_hdr_type`): what
/// the 40-byte GRH area of a UD receive buffer holds. A RoCEv2 NIC reports it in the
/// completion; mlx5 puts it in `ibv_wc.sl`, where UCX's `ud_verbs` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum NetworkHdr {
    /// Not a datagram receive (no GRH area).
    #[default]
    None,
    /// An IPv4 header, in the area's last 20 bytes (RoCEv2 annex A17.4.5.2).
    Ipv4,
    /// An IPv6 header, the whole area.
    Ipv6,
}

/// One completion, as `ibv_poll_cq` returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkCompletion {
    /// The `wr_id` of the work request.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was (for flushed or failed WRs: the WR's own kind, which verbs leaves undefined).
    pub opcode: WcOpcode,
    /// A vendor-specific detail for errors (here: 0).
    pub vendor_err: u32,
    /// Bytes transferred: received for receives, read for RDMA READ, 8 for atomics.
    pub byte_len: u32,
    /// Immediate data in host order, valid when `wc_flags` has `WITH_IMM`.
    pub imm_data: u32,
    /// The rkey a SEND with invalidate named, valid when `wc_flags` has `WITH_INV`.
    pub invalidated_rkey: Rkey,
    /// The local QP number.
    pub qp_num: Qpn,
    /// The remote QP number (receives).
    pub src_qp: Qpn,
    /// What else is valid.
    pub wc_flags: WcFlags,
    /// P_Key index of the packet (receives; always 0 here).
    pub pkey_index: u16,
    /// The network header of a received datagram (with [`WcFlags::GRH`]).
    pub network_hdr: NetworkHdr,
}

impl Default for WorkCompletion {
    /// An empty slot for [`crate::Engine::poll_cq_into`] buffers.
    fn default() -> Self {
        WorkCompletion::new(0, WcStatus::Success, WcOpcode::Send, 0)
    }
}

impl WorkCompletion {
    /// A completion with only the identity, status and opcode set.
    pub(crate) fn new(wr_id: u64, status: WcStatus, opcode: WcOpcode, qp_num: u32) -> Self {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: Rkey::new(0),
            qp_num: Qpn::new(qp_num),
            src_qp: Qpn::new(0),
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            network_hdr: NetworkHdr::None,
        }
    }
}

/// A completion queue: a bounded ring of completions.
#[derive(Debug)]
pub(crate) struct Cq {
    pub(crate) depth: usize,
    pub(crate) entries: VecDeque<WorkCompletion>,
    /// Set once a completion found the ring full; the CQ is then unusable (IBA 11.4.2.1:
    /// CQ overrun is an error, the affected QPs go to the error state).
    pub(crate) overflowed: bool,
    /// How many QP work queues feed this CQ (a CQ in use cannot be destroyed).
    pub(crate) users: u32,
    /// Armed by `req_notify_cq`: `Some(solicited_only)` until the next event fires.
    pub(crate) armed: Option<bool>,
    /// In [`CqTable`]'s list of CQs filled since the host last took it.
    listed: bool,
}

/// The CQs, and the ones that gained completions since the host last asked
/// ([`crate::Engine::take_filled_cqs`]): a host that moves completions on (softrdmad, into
/// its clients' rings) visits those, not every CQ of the device, after each pass.
#[derive(Debug, Default)]
pub(crate) struct CqTable {
    table: Table<Cq>,
    filled: Vec<CqHandle>,
}

impl core::ops::Deref for CqTable {
    type Target = Table<Cq>;
    fn deref(&self) -> &Table<Cq> {
        &self.table
    }
}

impl core::ops::DerefMut for CqTable {
    fn deref_mut(&mut self) -> &mut Table<Cq> {
        &mut self.table
    }
}

impl CqTable {
    /// Remove `cq`, and its place in the filled list: a host that never takes the list
    /// (the embedded device) would otherwise keep one stale entry per CQ created, filled
    /// and destroyed.
    pub(crate) fn remove(&mut self, cq: CqHandle) -> Option<Cq> {
        let c = self.table.remove(cq.0)?;
        if c.listed {
            self.filled.retain(|&f| f != cq);
        }
        Some(c)
    }

    /// Store a completion in `cq` (which must exist), listing the CQ as filled.
    pub(crate) fn push(&mut self, cq: CqHandle, wc: WorkCompletion) -> Push {
        let Some(c) = self.table.get_mut(cq.0) else {
            return Push::Ok;
        };
        let pushed = c.push(wc);
        if pushed == Push::Ok && !c.listed {
            c.listed = true;
            self.filled.push(cq);
        }
        pushed
    }
}

/// What pushing a completion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Push {
    /// Stored.
    Ok,
    /// The ring was full (or already overflowed): the completion is lost, the CQ is in error.
    Overflow {
        /// True only for the push that first overflowed the CQ.
        first: bool,
    },
}

impl Cq {
    pub(crate) fn new(depth: usize) -> Cq {
        Cq {
            depth,
            entries: VecDeque::with_capacity(depth.min(4096)),
            overflowed: false,
            users: 0,
            armed: None,
            listed: false,
        }
    }

    pub(crate) fn push(&mut self, wc: WorkCompletion) -> Push {
        if self.overflowed {
            return Push::Overflow { first: false };
        }
        if self.entries.len() >= self.depth {
            self.overflowed = true;
            return Push::Overflow { first: true };
        }
        self.entries.push_back(wc);
        Push::Ok
    }

    /// After completions were taken: an emptied queue starts again at the front of its
    /// buffer. A queue drained at every poll otherwise walks through all of its capacity
    /// (4096 × 48 bytes), each completion in a line not touched since the last lap, and
    /// the host reading it out after the pass that wrote it finds that line gone from its
    /// cache (measured in softrdmad: 14% of the progress thread in that one load).
    fn taken(&mut self) {
        if self.entries.is_empty() {
            // `clear` on an empty queue only moves its head back to the buffer's start.
            self.entries.clear();
        }
    }
}

impl<M: Memory + ?Sized> Engine<M> {
    /// A CQ size the device offers: 1..=`max_cqe`.
    fn check_cqe(&self, cqe: u32) -> Result<(), VerbsError> {
        let max = self.config.device.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(VerbsError::CapExceeded {
                what: "cqe",
                requested: cqe,
                max,
            });
        }
        Ok(())
    }

    /// `ibv_create_cq` with room for `cqe` completions.
    pub fn create_cq(&mut self, cqe: u32) -> Result<CqHandle, VerbsError> {
        self.check_cqe(cqe)?;
        if self.cqs.len() >= self.config.device.max_cq as usize {
            return Err(VerbsError::TooMany("completion queues"));
        }
        Ok(CqHandle(self.cqs.insert(Cq::new(cqe as usize))))
    }

    /// `ibv_resize_cq`: room for `cqe` completions from now on (returned: the size it has
    /// now). Refused while more completions than that wait in it.
    pub fn resize_cq(&mut self, cq: CqHandle, cqe: u32) -> Result<u32, VerbsError> {
        self.check_cqe(cqe)?;
        let c = self.cqs.get_mut(cq.0).ok_or(VerbsError::InvalidCq)?;
        if c.entries.len() > cqe as usize {
            return Err(VerbsError::CqTooSmall {
                requested: cqe,
                waiting: c.entries.len(),
            });
        }
        c.depth = cqe as usize;
        Ok(cqe)
    }

    /// `ibv_destroy_cq`: fails with `Busy` while QPs use it.
    pub fn destroy_cq(&mut self, cq: CqHandle) -> Result<(), VerbsError> {
        let c = self.cqs.get(cq.0).ok_or(VerbsError::InvalidCq)?;
        if c.users > 0 {
            return Err(VerbsError::Busy("completion queue in use"));
        }
        self.cqs.remove(cq);
        Ok(())
    }

    /// `ibv_poll_cq`: take up to `max` completions, oldest first (a convenience that
    /// allocates; the data path should use [`Engine::poll_cq_into`]).
    pub fn poll_cq(&mut self, cq: CqHandle, max: usize) -> Result<Vec<WorkCompletion>, VerbsError> {
        let c = self.cqs.get_mut(cq.0).ok_or(VerbsError::InvalidCq)?;
        let n = max.min(c.entries.len());
        let taken = c.entries.drain(..n).collect();
        c.taken();
        Ok(taken)
    }

    /// `ibv_poll_cq` without allocating: move up to `out.len()` completions, oldest first,
    /// into `out`; returns how many.
    pub fn poll_cq_into(
        &mut self,
        cq: CqHandle,
        out: &mut [WorkCompletion],
    ) -> Result<usize, VerbsError> {
        let c = self.cqs.get_mut(cq.0).ok_or(VerbsError::InvalidCq)?;
        let n = out.len().min(c.entries.len());
        for (slot, wc) in out.iter_mut().zip(c.entries.drain(..n)) {
            *slot = wc;
        }
        c.taken();
        Ok(n)
    }

    /// `ibv_poll_cq` handing each completion to `f` in place, oldest first, up to `max`;
    /// returns how many it took. For a host that copies completions on (into a ring of its
    /// own): nothing is allocated or staged. A completion `f` refuses (returns false) stays
    /// queued, first, and ends the poll.
    pub fn poll_cq_with(
        &mut self,
        cq: CqHandle,
        max: usize,
        mut f: impl FnMut(&WorkCompletion) -> bool,
    ) -> Result<usize, VerbsError> {
        let c = self.cqs.get_mut(cq.0).ok_or(VerbsError::InvalidCq)?;
        let mut n = 0;
        while n < max {
            match c.entries.front() {
                Some(wc) if f(wc) => {
                    c.entries.pop_front();
                    n += 1;
                }
                _ => break,
            }
        }
        c.taken();
        Ok(n)
    }

    /// `ibv_req_notify_cq`: raise one completion event for `cq` when its next completion
    /// arrives (with `solicited_only`: the next solicited or error completion).
    pub fn req_notify_cq(&mut self, cq: CqHandle, solicited_only: bool) -> Result<(), VerbsError> {
        let c = self.cqs.get_mut(cq.0).ok_or(VerbsError::InvalidCq)?;
        c.armed = Some(solicited_only);
        Ok(())
    }

    /// `ibv_req_notify_cq` as a host serves it: like [`Engine::req_notify_cq`], except that
    /// the event is raised at once
    ///
    /// - unless `solicited_only`, if the CQ holds completions, so that "arm, then wait"
    ///   never sleeps through one that came before the arm;
    /// - if `missed`: the host delivered completions where the application polls them (a
    ///   shared-memory ring) after the application asked for the arm and before it reached
    ///   the engine. They came after the arm, so they fire it: with `solicited_only` too, as
    ///   the host cannot tell whether one was solicited (an extra event costs a poll, a lost
    ///   one a hang).
    pub fn arm_cq(
        &mut self,
        cq: CqHandle,
        solicited_only: bool,
        missed: bool,
    ) -> Result<(), VerbsError> {
        let c = self.cqs.get_mut(cq.0).ok_or(VerbsError::InvalidCq)?;
        if missed || (!solicited_only && !c.entries.is_empty()) {
            c.armed = None;
            self.cq_events.push_back(cq);
        } else {
            c.armed = Some(solicited_only);
        }
        Ok(())
    }

    /// `ibv_get_cq_event` without blocking: the next CQ whose armed notification fired.
    pub fn get_cq_event(&mut self) -> Option<CqHandle> {
        self.cq_events.pop_front()
    }

    /// Move into `out` the CQs that gained completions since the last call, each once, in
    /// the order they first did (a destroyed CQ's handle may be among them, or name a CQ
    /// created since: look it up). With this a host that moves completions on visits only
    /// the CQs that have some, whatever the number of CQs.
    pub fn take_filled_cqs(&mut self, out: &mut Vec<CqHandle>) {
        let CqTable { table, filled } = &mut self.cqs;
        for cq in filled.drain(..) {
            if let Some(c) = table.get_mut(cq.0) {
                c.listed = false;
            }
            out.push(cq);
        }
    }

    /// Completions waiting in a CQ.
    pub fn cq_len(&self, cq: CqHandle) -> Result<usize, VerbsError> {
        Ok(self
            .cqs
            .get(cq.0)
            .ok_or(VerbsError::InvalidCq)?
            .entries
            .len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ibv_numbers() {
        assert_eq!(WcStatus::WrFlushErr.to_ibv(), 5);
        assert_eq!(WcStatus::RnrRetryExcErr.to_ibv(), 13);
        assert_eq!(WcStatus::RemInvRdReqErr.to_ibv(), 15);
        assert_eq!(WcOpcode::RecvRdmaWithImm.to_ibv(), 129);
        assert_eq!(WcFlags::WITH_INV.bits(), 8);
    }

    #[test]
    fn overflow_is_sticky() {
        let mut cq = Cq::new(1);
        let wc = WorkCompletion::new(1, WcStatus::Success, WcOpcode::Send, 5);
        assert_eq!(cq.push(wc), Push::Ok);
        assert_eq!(cq.push(wc), Push::Overflow { first: true });
        cq.entries.clear();
        assert_eq!(cq.push(wc), Push::Overflow { first: false });
    }
}
