//! What the UC, UD and SRQ functions keep per QP, beside the RC state of [`crate::qp`].

use std::collections::VecDeque;

use crate::srq::SrqHandle;
use crate::ud::UdPath;

/// Per-QP state of the non-RC functions.
#[derive(Debug, Default)]
pub(crate) struct QpExt {
    /// The SRQ the QP takes its receive WQEs from (set at creation).
    pub(crate) srq: Option<SrqHandle>,
    /// UD: where each send WQE goes, in send queue order (one per WQE).
    pub(crate) ud_dests: VecDeque<UdPath>,
}
