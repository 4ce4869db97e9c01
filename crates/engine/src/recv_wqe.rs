//! Receive WQEs of the unreliable services (UC, UD): scattering a message into the WQE at
//! the head of the QP's receive queue and completing it. (An SRQ's WQE has been moved to the
//! QP's queue by [`crate::srq::prefetch`] before.)

use crate::cq::{WcOpcode, WorkCompletion};
use crate::memory::Memory;
use crate::mr::MrTable;
use crate::pd::PdHandle;
use crate::qp::{Qp, RecvWqe};
use crate::{Ctx, WcStatus};

/// Scatter `data` at byte `offset` of `r`, checking each local key as it is used (IBA
/// 10.6.3.2: LOCAL_WRITE is required). `Err` is the completion status.
pub(crate) fn scatter<M: Memory + ?Sized>(
    r: &RecvWqe,
    pd: PdHandle,
    mrs: &MrTable,
    mem: &mut M,
    mut offset: u64,
    data: &[u8],
) -> Result<(), WcStatus> {
    let mut rest = data;
    for sge in &r.sges {
        if rest.is_empty() {
            break;
        }
        let l = u64::from(sge.length);
        if offset >= l {
            offset -= l;
            continue;
        }
        let n = ((l - offset) as usize).min(rest.len());
        let addr = sge.addr.wrapping_add(offset);
        let owner = mrs
            .check_local(sge.lkey.value(), pd, addr, n as u64, true)
            .map_err(|_| WcStatus::LocProtErr)?;
        mem.write(owner, addr, &rest[..n])
            .map_err(|_| WcStatus::LocProtErr)?;
        rest = &rest[n..];
        offset = 0;
    }
    if rest.is_empty() {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

/// Complete the receive WQE at the head of the QP's queue (`solicited`: the message asked
/// for a solicited event).
pub(crate) fn complete<M: Memory + ?Sized>(
    qp: &mut Qp,
    ctx: &mut Ctx<'_, M>,
    solicited: bool,
    fill: impl FnOnce(&mut WorkCompletion),
) {
    let Some(r) = qp.rq.pop_front() else { return };
    let mut wc = WorkCompletion::new(r.wr_id, WcStatus::Success, WcOpcode::Recv, qp.qpn);
    wc.src_qp = qp.attr.dest_qp_num;
    fill(&mut wc);
    let cq = qp.recv_cq;
    ctx.push_cqe_se(qp, cq, wc, solicited);
}
