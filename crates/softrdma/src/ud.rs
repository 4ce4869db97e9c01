//! Shared receive queues and address handles (UD addressing).

use std::sync::Arc;

use engine::{AhAttr, AhHandle, Gid, RecvWr, Sge, SrqAttr, SrqAttrMask, SrqHandle};

use crate::qp::Pd;
use crate::Result;

/// A shared receive queue (`ibv_srq`): receive WRs that several QPs of one PD draw from.
/// Cheap to clone; destroyed when the last clone and every QP using it are gone.
#[derive(Clone, Debug)]
pub struct Srq {
    pub(crate) inner: Arc<SrqInner>,
}

#[derive(Debug)]
pub(crate) struct SrqInner {
    pd: Pd,
    pub(crate) handle: SrqHandle,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        if let Err(e) = self.pd.device().provider().destroy_srq(self.handle) {
            tracing::warn!(error = %e, "destroy_srq failed");
        }
    }
}

impl Srq {
    pub(crate) fn new(pd: &Pd, max_wr: u32, max_sge: u32) -> Result<Srq> {
        let attr = SrqAttr {
            max_wr,
            max_sge,
            srq_limit: 0,
        };
        let handle = pd.device().provider().create_srq(pd.handle(), &attr)?;
        Ok(Srq {
            inner: Arc::new(SrqInner {
                pd: pd.clone(),
                handle,
            }),
        })
    }

    /// Post a receive work request (`ibv_post_srq_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.inner
            .pd
            .device()
            .provider()
            .post_srq_recv(self.inner.handle, wr)
    }

    /// Post a receive of `sges` (scatter list).
    pub fn recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.post_recv(RecvWr::new(wr_id, sges))
    }

    /// Its attributes (`ibv_query_srq`): capacity, SGEs per WR, and the armed limit (0: not
    /// armed).
    pub fn query(&self) -> Result<SrqAttr> {
        self.inner
            .pd
            .device()
            .provider()
            .query_srq(self.inner.handle)
    }

    /// Arm the limit (`ibv_modify_srq` with `IBV_SRQ_LIMIT`): when fewer than `limit`
    /// receive WRs remain, the device raises [`AsyncEvent::SrqLimitReached`] once and
    /// disarms it.
    ///
    /// [`AsyncEvent::SrqLimitReached`]: engine::AsyncEvent::SrqLimitReached
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        let attr = SrqAttr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        self.modify(&attr, SrqAttrMask::LIMIT)
    }

    /// Raw `ibv_modify_srq`: the attributes `mask` selects (a larger `max_wr`, the limit).
    pub fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.inner
            .pd
            .device()
            .provider()
            .modify_srq(self.inner.handle, attr, mask)
    }

    /// Receive WRs waiting.
    pub fn len(&self) -> Result<usize> {
        self.inner.pd.device().provider().srq_len(self.inner.handle)
    }

    /// No receive WRs waiting.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }
}

/// An address handle (`ibv_ah`): the path to a remote port, for UD sends.
#[derive(Debug)]
pub struct AddressHandle {
    pd: Pd,
    pub(crate) handle: AhHandle,
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        if let Err(e) = self.pd.device().provider().destroy_ah(self.handle) {
            tracing::warn!(error = %e, "destroy_ah failed");
        }
    }
}

impl AddressHandle {
    pub(crate) fn new(pd: &Pd, attr: &AhAttr) -> Result<AddressHandle> {
        let handle = pd.device().provider().create_ah(pd.handle(), attr)?;
        Ok(AddressHandle {
            pd: pd.clone(),
            handle,
        })
    }

    /// A RoCE address vector to `dgid` from GID index 0 (hop limit 64).
    pub(crate) fn attr_to(dgid: Gid) -> AhAttr {
        AhAttr {
            dgid: dgid.0,
            ..AhAttr::default()
        }
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.pd
    }
}
