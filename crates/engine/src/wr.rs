//! Work requests as applications post them (`ibv_send_wr`, `ibv_recv_wr`, `ibv_sge`).

use bitflags::bitflags;
use smallvec::SmallVec;

use crate::cq::WcOpcode;
use crate::{Lkey, Rkey};

/// One scatter/gather element: `length` bytes at `addr` of the MR whose lkey is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Virtual address of the first byte.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the memory region holding the range.
    pub lkey: Lkey,
}

impl Sge {
    /// An SGE covering `length` bytes at `addr` in the MR with `lkey`.
    pub const fn new(addr: u64, length: u32, lkey: Lkey) -> Sge {
        Sge { addr, length, lkey }
    }
}

bitflags! {
    /// `ibv_send_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Wait for every earlier RDMA READ and ATOMIC of this QP to complete first.
        const FENCE = 1 << 0;
        /// Produce a completion even if the QP does not signal all sends.
        const SIGNALED = 1 << 1;
        /// Set the solicited-event bit on the last packet (the receiver's CQ event wakes).
        const SOLICITED = 1 << 2;
        /// The data travels in the WR itself ([`SendPayload::Inline`]); set automatically.
        const INLINE = 1 << 3;
    }
}

/// The operation of a send work request, with its operation-specific fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SendOp {
    /// SEND: the message lands in the next receive WQE of the peer.
    Send,
    /// SEND with 32-bit immediate data (host order) delivered in the peer's completion.
    SendWithImm {
        /// Immediate data.
        imm: u32,
    },
    /// SEND with invalidate: the peer's completion names `rkey` as invalidated.
    SendWithInv {
        /// The remote key to invalidate.
        rkey: Rkey,
    },
    /// RDMA WRITE to `remote_addr` in the peer MR `rkey`.
    RdmaWrite {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// RDMA WRITE with immediate: also consumes a receive WQE of the peer.
    RdmaWriteWithImm {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ from `remote_addr` in the peer MR `rkey` into the local SGEs.
    RdmaRead {
        /// Remote virtual address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// ATOMIC compare-and-swap of the 8-byte word at `remote_addr`; the original word lands
    /// in the local SGE (8 bytes).
    AtomicCmpSwap {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Value to compare with.
        compare: u64,
        /// Value stored when equal.
        swap: u64,
    },
    /// ATOMIC fetch-and-add on the 8-byte word at `remote_addr`; the original word lands in
    /// the local SGE (8 bytes).
    AtomicFetchAdd {
        /// Remote virtual address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Value to add.
        add: u64,
    },
    /// Bind a memory window (`IBV_WR_BIND_MW`): a type 2 window gets `rkey` (same index,
    /// new tag, e.g. `ibv_inc_rkey` of the current one) and the range of `bind`.
    BindMw {
        /// The window.
        mw: crate::mw::MwHandle,
        /// The window's rkey once bound.
        rkey: Rkey,
        /// What it exposes.
        bind: crate::mw::MwBind,
    },
    /// Invalidate a type 2 window or a memory region by key (`IBV_WR_LOCAL_INV`).
    LocalInv {
        /// The window's rkey, or the region's lkey or rkey.
        rkey: Rkey,
    },
}

impl SendOp {
    /// The completion opcode this WR produces.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => {
                WcOpcode::Send
            }
            SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            SendOp::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
            SendOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::BindMw { .. } => WcOpcode::BindMw,
            SendOp::LocalInv { .. } => WcOpcode::LocalInv,
        }
    }

    /// READ and ATOMIC: operations whose answer carries data and that use responder
    /// resources (limited by `max_rd_atomic`).
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::RdmaRead { .. } | SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }

    /// ATOMIC compare-and-swap or fetch-and-add.
    pub const fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::AtomicCmpSwap { .. } | SendOp::AtomicFetchAdd { .. }
        )
    }
}

/// SGEs a work request holds without a heap allocation: posting a WR of up to this many
/// SGEs allocates nothing (a NIC's WQE has room for a few SGEs in place too).
pub const INLINE_SGES: usize = 4;

/// Inline-data bytes a work request holds without a heap allocation.
pub const INLINE_BYTES: usize = 64;

/// A WR's scatter/gather list: [`INLINE_SGES`] entries in place, more on the heap.
pub type SgeList = SmallVec<[Sge; INLINE_SGES]>;

/// A WR's inline data: [`INLINE_BYTES`] bytes in place, more on the heap.
pub type InlineData = SmallVec<[u8; INLINE_BYTES]>;

/// Where the bytes of a send come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SendPayload {
    /// Gathered from registered memory when the packets are built (lkeys checked then).
    Sges(SgeList),
    /// Copied into the WR at post time (`IBV_SEND_INLINE`): no lkey, at most `max_inline_data`.
    Inline(InlineData),
}

impl SendPayload {
    /// Total length in bytes (saturating, so absurd SGE lists fail the length check).
    pub fn len(&self) -> u64 {
        match self {
            SendPayload::Sges(s) => s.iter().map(|s| u64::from(s.length)).sum(),
            SendPayload::Inline(d) => d.len() as u64,
        }
    }

    /// No bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A send work request (`ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// The local buffers (data to send, or where READ / ATOMIC results land).
    pub payload: SendPayload,
    /// Signaled, fenced, solicited...
    pub flags: SendFlags,
}

impl SendWr {
    /// A signaled WR of `op` over `sges`.
    pub fn new(wr_id: u64, op: SendOp, sges: impl Into<SgeList>) -> SendWr {
        SendWr {
            wr_id,
            op,
            payload: SendPayload::Sges(sges.into()),
            flags: SendFlags::SIGNALED,
        }
    }

    /// A signaled SEND over `sges`.
    pub fn send(wr_id: u64, sges: impl Into<SgeList>) -> SendWr {
        SendWr::new(wr_id, SendOp::Send, sges)
    }

    /// A signaled RDMA WRITE of `sges` to `remote_addr` / `rkey`.
    pub fn rdma_write(
        wr_id: u64,
        sges: impl Into<SgeList>,
        remote_addr: u64,
        rkey: Rkey,
    ) -> SendWr {
        SendWr::new(wr_id, SendOp::RdmaWrite { remote_addr, rkey }, sges)
    }

    /// A signaled RDMA READ of `remote_addr` / `rkey` into `sges`.
    pub fn rdma_read(wr_id: u64, sges: impl Into<SgeList>, remote_addr: u64, rkey: Rkey) -> SendWr {
        SendWr::new(wr_id, SendOp::RdmaRead { remote_addr, rkey }, sges)
    }

    /// A signaled bind of window `mw` to `bind`, giving it `rkey`.
    pub fn bind_mw(
        wr_id: u64,
        mw: crate::mw::MwHandle,
        rkey: Rkey,
        bind: crate::mw::MwBind,
    ) -> SendWr {
        SendWr::new(wr_id, SendOp::BindMw { mw, rkey, bind }, SgeList::new())
    }

    /// A signaled local invalidation of `rkey` (a type 2 window, or a region's key).
    pub fn local_inv(wr_id: u64, rkey: Rkey) -> SendWr {
        SendWr::new(wr_id, SendOp::LocalInv { rkey }, SgeList::new())
    }

    /// Replace the payload with inline bytes (`IBV_SEND_INLINE`).
    pub fn inline(mut self, data: impl Into<InlineData>) -> SendWr {
        self.payload = SendPayload::Inline(data.into());
        self.flags |= SendFlags::INLINE;
        self
    }

    /// Set or clear `IBV_SEND_SIGNALED`.
    pub fn signaled(mut self, on: bool) -> SendWr {
        self.flags.set(SendFlags::SIGNALED, on);
        self
    }

    /// Add flags.
    pub fn with_flags(mut self, flags: SendFlags) -> SendWr {
        self.flags |= flags;
        self
    }
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where incoming SEND data is scattered.
    pub sg_list: SgeList,
}

impl RecvWr {
    /// A receive WR over `sg_list`.
    pub fn new(wr_id: u64, sg_list: impl Into<SgeList>) -> RecvWr {
        RecvWr {
            wr_id,
            sg_list: sg_list.into(),
        }
    }
}
