//! Errors of the verbs calls, each with the errno a libibverbs user would see.

use crate::qp_state::ModifyError;

/// Why a verbs call failed. Failures of work requests once accepted are not errors of the
/// call: they come back as completions with a [`crate::WcStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// The handle names no PD of this device.
    #[error("no such protection domain")]
    InvalidPd,
    /// The handle names no CQ of this device.
    #[error("no such completion queue")]
    InvalidCq,
    /// The number names no QP of this device.
    #[error("no such queue pair")]
    InvalidQp,
    /// The handle names no MR of this device.
    #[error("no such memory region")]
    InvalidMr,
    /// The GID index is outside the port's GID table.
    #[error("no GID at index {0}")]
    InvalidGidIndex(u32),
    /// The port number is not 1 (the device has one port).
    #[error("no port {0}")]
    InvalidPort(u8),
    /// Access flags that cannot go together (remote write / atomic without local write) or
    /// that are unknown.
    #[error("invalid access flags")]
    InvalidAccess,
    /// A flags argument with bits the verb does not define, or with none where the verb needs
    /// one (`ibv_rereg_mr`).
    #[error("invalid flags")]
    InvalidFlags,
    /// A length or address that is zero where it may not be, wraps, or exceeds a limit.
    #[error("invalid length or address")]
    InvalidLength,
    /// A requested capacity exceeds what the device supports.
    #[error("{what} = {requested} exceeds the device limit {max}")]
    CapExceeded {
        /// Which capacity.
        what: &'static str,
        /// Requested value.
        requested: u32,
        /// Device maximum.
        max: u32,
    },
    /// The device has no room for another object of this kind.
    #[error("too many {0}")]
    TooMany(&'static str),
    /// The object is still used by others (PD with MRs or QPs, CQ with QPs, MR with bound
    /// memory windows when reregistered).
    #[error("resource busy: {0}")]
    Busy(&'static str),
    /// The QP's state does not allow this call (e.g. post_send before RTS).
    #[error("operation not allowed in QP state {0}")]
    InvalidState(crate::qp_attr::QpState),
    /// The work queue is full.
    #[error("work queue full")]
    QueueFull,
    /// A CQ cannot shrink below the completions waiting in it (`ibv_resize_cq`).
    #[error("{waiting} completions wait in the CQ, more than the {requested} asked for")]
    CqTooSmall {
        /// The size asked for.
        requested: u32,
        /// Completions waiting.
        waiting: usize,
    },
    /// More scatter/gather entries than the QP was created with.
    #[error("{sges} SGEs exceed the QP limit {max}")]
    TooManySge {
        /// SGEs in the WR.
        sges: usize,
        /// The QP's limit.
        max: u32,
    },
    /// Inline data longer than the QP's `max_inline_data`.
    #[error("{len} bytes of inline data exceed the QP limit {max}")]
    InlineTooLarge {
        /// Inline bytes in the WR.
        len: usize,
        /// The QP's limit.
        max: u32,
    },
    /// The operation does not exist for this QP type (multicast on a QP that is not UD
    /// included), or inline data on a READ / ATOMIC.
    #[error("operation not supported on this QP")]
    OpNotSupported,
    /// `ibv_attach_mcast` / `ibv_detach_mcast` with a GID that is not a multicast GID
    /// ([`crate::Gid::is_multicast`]).
    #[error("not a multicast GID")]
    NotMulticastGid,
    /// `ibv_detach_mcast` of a QP that is not attached to the group.
    #[error("the QP is not attached to the multicast group")]
    NotAttached,
    /// The handle names no memory window of this device (or the wrong type for the call).
    #[error("no such memory window")]
    InvalidMw,
    /// The handle names no shared receive queue of this device.
    #[error("no such shared receive queue")]
    InvalidSrq,
    /// The handle names no address handle of this device, or one of another PD, or its
    /// attributes are unusable on RoCE.
    #[error("invalid address handle")]
    InvalidAh,
    /// The QP type is not implemented yet.
    #[error("QP type not supported")]
    QpTypeNotSupported,
    /// A modify_qp was rejected by the state machine.
    #[error(transparent)]
    Modify(#[from] ModifyError),
}

const EINVAL: i32 = 22;
const ENOMEM: i32 = 12;
const EBUSY: i32 = 16;
const EOPNOTSUPP: i32 = 95;

impl VerbsError {
    /// The errno libibverbs returns for this failure.
    pub const fn errno(&self) -> i32 {
        match self {
            VerbsError::TooMany(_) | VerbsError::QueueFull => ENOMEM,
            VerbsError::Busy(_) => EBUSY,
            VerbsError::QpTypeNotSupported => EOPNOTSUPP,
            VerbsError::Modify(e) => e.errno(),
            VerbsError::InvalidPd
            | VerbsError::InvalidCq
            | VerbsError::InvalidQp
            | VerbsError::InvalidMr
            | VerbsError::InvalidMw
            | VerbsError::InvalidSrq
            | VerbsError::InvalidAh
            | VerbsError::InvalidGidIndex(_)
            | VerbsError::InvalidPort(_)
            | VerbsError::InvalidAccess
            | VerbsError::InvalidFlags
            | VerbsError::InvalidLength
            | VerbsError::CapExceeded { .. }
            | VerbsError::CqTooSmall { .. }
            | VerbsError::InvalidState(_)
            | VerbsError::TooManySge { .. }
            | VerbsError::InlineTooLarge { .. }
            | VerbsError::OpNotSupported
            | VerbsError::NotMulticastGid
            | VerbsError::NotAttached => EINVAL,
        }
    }
}
