//! Shared receive queues (IBA 10.2.9, 11.2.3): one queue of receive WQEs feeding many QPs
//! (RC, UC and UD), with the limit that raises `SRQ_LIMIT_REACHED` once when it runs low.
//!
//! A QP attached to an SRQ takes a WQE from it when a message that needs one starts (the
//! WQE then belongs to that QP: a SEND that spans packets fills it, and a QP that fails
//! flushes it to its own CQ, as IBA 10.3.1 says for WQEs already consumed). An empty SRQ
//! makes an RC responder send RNR NAKs; UC and UD drop the message.

use std::collections::VecDeque;

use bitflags::bitflags;
use wire::{OpKind, RoceV2Packet};

use crate::counters::Counter;
use crate::error::VerbsError;
use crate::memory::Memory;
use crate::pd::PdHandle;
use crate::qp::{Qp, RecvWqe};
use crate::qp_attr::QpType;
use crate::wr::RecvWr;
use crate::{AsyncEvent, Ctx, Engine, QpInitAttr};

/// Handle of a shared receive queue within one [`crate::Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SrqHandle(pub u32);

/// `struct ibv_srq_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SrqAttr {
    /// Most receive WRs queued at once.
    pub max_wr: u32,
    /// Most SGEs in one receive WR.
    pub max_sge: u32,
    /// When fewer WRs than this remain, raise `SrqLimitReached` once (0: not armed).
    pub srq_limit: u32,
}

bitflags! {
    /// `enum ibv_srq_attr_mask`: what `modify_srq` changes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SrqAttrMask: u32 {
        /// Resize to `max_wr` (`IBV_SRQ_MAX_WR`).
        const MAX_WR = 1 << 0;
        /// Arm the limit event at `srq_limit` (`IBV_SRQ_LIMIT`).
        const LIMIT = 1 << 1;
    }
}

#[derive(Debug)]
pub(crate) struct Srq {
    pd: PdHandle,
    attr: SrqAttr,
    queue: VecDeque<RecvWqe>,
}

/// Take the oldest WQE of `srq`; fire the limit event if the queue fell below an armed
/// limit (IBA 11.5.2.4: the event fires once, then the limit is disarmed).
fn pop<M: Memory + ?Sized>(ctx: &mut Ctx<'_, M>, srq: SrqHandle) -> Option<RecvWqe> {
    let s = ctx.srqs.get_mut(srq.0)?;
    let wqe = s.queue.pop_front()?;
    if s.attr.srq_limit > 0 && (s.queue.len() as u64) < u64::from(s.attr.srq_limit) {
        s.attr.srq_limit = 0;
        ctx.events.push_back(AsyncEvent::SrqLimitReached { srq });
    }
    Some(wqe)
}

/// Before a request packet reaches the responder of a QP with an SRQ: if the packet starts
/// a message that consumes a receive WQE and the QP holds none, move one over from the SRQ.
/// Only a packet the responder will execute now may take one (RC: the expected PSN; UC: not
/// an old PSN; UD: any).
pub(crate) fn prefetch<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    pkt: &RoceV2Packet<'_>,
) {
    let Some(srq) = qp.ext.srq else { return };
    if !qp.rq.is_empty() {
        return;
    }
    let op = pkt.transport.bth.opcode;
    let needs = (op.kind() == OpKind::Send && (op.is_first() || op.is_only()))
        || (op.kind() == OpKind::RdmaWrite && op.has_immediate());
    if !needs {
        return;
    }
    let psn = pkt.transport.bth.psn;
    let now = match qp.qp_type {
        // A WRITE with immediate takes its WQE at its LAST packet, in the middle of the
        // message; a SEND at its FIRST / ONLY, when no message is in progress.
        QpType::Rc => psn == qp.resp.epsn && (qp.resp.in_progress.is_none() || op.has_immediate()),
        QpType::Uc => !psn.is_before(qp.resp.epsn),
        QpType::Ud => true,
    };
    if !now {
        return;
    }
    if let Some(w) = pop(ctx, srq) {
        qp.rq.push_back(w);
    } else {
        ctx.count(qp, Counter::RxSrqEmpty);
    }
}

/// A QP enters ERR (from another state: the callers check): if it takes WQEs from an SRQ, it
/// will consume no more, which IBA 11.6.3.1 reports as the Last WQE Reached event.
pub(crate) fn entered_error<M: Memory + ?Sized>(qp: &Qp, ctx: &mut Ctx<'_, M>) {
    if qp.ext.srq.is_some() {
        ctx.events.push_back(AsyncEvent::QpLastWqeReached {
            qpn: crate::Qpn::new(qp.qpn),
        });
    }
}

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_create_srq` in `pd`.
    pub fn create_srq(&mut self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle, VerbsError> {
        if self.pds.get(pd.0).is_none() {
            return Err(VerbsError::InvalidPd);
        }
        let d = &self.config.device;
        for (what, requested, max) in [
            ("max_wr", attr.max_wr, d.max_srq_wr),
            ("max_sge", attr.max_sge, d.max_srq_sge),
            ("srq_limit", attr.srq_limit, attr.max_wr),
        ] {
            if requested > max {
                return Err(VerbsError::CapExceeded {
                    what,
                    requested,
                    max,
                });
            }
        }
        if attr.max_wr == 0 {
            return Err(VerbsError::InvalidLength);
        }
        if self.srqs.len() >= d.max_srq as usize {
            return Err(VerbsError::TooMany("shared receive queues"));
        }
        let h = self.srqs.insert(Srq {
            pd,
            attr: *attr,
            queue: VecDeque::new(),
        });
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users += 1;
        }
        Ok(SrqHandle(h))
    }

    /// `ibv_modify_srq`: resize (not below the WRs queued) and / or arm the limit.
    pub fn modify_srq(
        &mut self,
        srq: SrqHandle,
        attr: &SrqAttr,
        mask: SrqAttrMask,
    ) -> Result<(), VerbsError> {
        let max_srq_wr = self.config.device.max_srq_wr;
        let s = self.srqs.get_mut(srq.0).ok_or(VerbsError::InvalidSrq)?;
        let max_wr = if mask.contains(SrqAttrMask::MAX_WR) {
            if attr.max_wr > max_srq_wr {
                return Err(VerbsError::CapExceeded {
                    what: "max_wr",
                    requested: attr.max_wr,
                    max: max_srq_wr,
                });
            }
            if (attr.max_wr as usize) < s.queue.len().max(1) {
                return Err(VerbsError::InvalidLength);
            }
            attr.max_wr
        } else {
            s.attr.max_wr
        };
        if mask.contains(SrqAttrMask::LIMIT) && attr.srq_limit > max_wr {
            return Err(VerbsError::CapExceeded {
                what: "srq_limit",
                requested: attr.srq_limit,
                max: max_wr,
            });
        }
        s.attr.max_wr = max_wr;
        if mask.contains(SrqAttrMask::LIMIT) {
            s.attr.srq_limit = attr.srq_limit;
        }
        Ok(())
    }

    /// `ibv_query_srq`: the sizes and the limit (0 once the limit event fired).
    pub fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr, VerbsError> {
        Ok(self.srqs.get(srq.0).ok_or(VerbsError::InvalidSrq)?.attr)
    }

    /// Receive WRs waiting in the SRQ.
    pub fn srq_len(&self, srq: SrqHandle) -> Result<usize, VerbsError> {
        Ok(self
            .srqs
            .get(srq.0)
            .ok_or(VerbsError::InvalidSrq)?
            .queue
            .len())
    }

    /// `ibv_destroy_srq`: fails with `Busy` while QPs use it or an event naming it is not
    /// acknowledged.
    pub fn destroy_srq(&mut self, srq: SrqHandle) -> Result<(), VerbsError> {
        let s = self.srqs.get(srq.0).ok_or(VerbsError::InvalidSrq)?;
        if self.qps.values().any(|q| q.ext.srq == Some(srq)) {
            return Err(VerbsError::Busy("shared receive queue in use"));
        }
        if self.unacked_events_of(AsyncEvent::SrqLimitReached { srq }) > 0 {
            return Err(VerbsError::Busy("unacknowledged SRQ event"));
        }
        let pd = s.pd;
        self.srqs.remove(srq.0);
        if let Some(p) = self.pds.get_mut(pd.0) {
            p.users = p.users.saturating_sub(1);
        }
        Ok(())
    }

    /// `ibv_post_srq_recv` of one WR.
    pub fn post_srq_recv(&mut self, srq: SrqHandle, wr: RecvWr) -> Result<(), VerbsError> {
        let s = self.srqs.get_mut(srq.0).ok_or(VerbsError::InvalidSrq)?;
        if wr.sg_list.len() > s.attr.max_sge as usize {
            return Err(VerbsError::TooManySge {
                sges: wr.sg_list.len(),
                max: s.attr.max_sge,
            });
        }
        if s.queue.len() >= s.attr.max_wr as usize {
            return Err(VerbsError::QueueFull);
        }
        let len = wr.sg_list.iter().map(|g| u64::from(g.length)).sum();
        s.queue.push_back(RecvWqe {
            wr_id: wr.wr_id,
            sges: wr.sg_list,
            len,
        });
        Ok(())
    }

    /// `ibv_create_qp` with `srq` set in the init attributes: the QP (RC, UC or UD, same PD as
    /// the SRQ) takes its receive WQEs from the SRQ, and `post_recv` on it is refused.
    pub fn create_qp_with_srq(
        &mut self,
        init: &QpInitAttr,
        srq: SrqHandle,
    ) -> Result<u32, VerbsError> {
        let s = self.srqs.get(srq.0).ok_or(VerbsError::InvalidSrq)?;
        if s.pd != init.pd {
            return Err(VerbsError::InvalidPd);
        }
        let qpn = self.create_qp(init)?;
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.ext.srq = Some(srq);
        }
        Ok(qpn)
    }

    /// The SRQ a QP was created with, if any.
    pub fn qp_srq(&self, qpn: u32) -> Result<Option<SrqHandle>, VerbsError> {
        Ok(self.qps.get(&qpn).ok_or(VerbsError::InvalidQp)?.ext.srq)
    }
}
