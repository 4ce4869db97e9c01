//! The entries of the shared-memory rings: fixed `#[repr(C)]` layouts, as a hardware RNIC and
//! its provider share them (rdma-core's `struct rxe_send_wqe`, mlx5's WQEs and CQEs).
//!
//! Both ends run on one host, so fields are in native byte order. A work ring's entries are
//! a header followed by the work request's scatter/gather list or, for an inline send, its
//! data; the daemon sizes each ring's entries for its queue's capabilities
//! ([`send_entry_len`], [`recv_entry_len`]), so every work request the verb accepts fits.
//! A CQ ring's entries are one [`Cqe`] each.
//!
//! The library builds an entry on its stack and copies it into the ring: no serialization,
//! no allocation. The daemon copies an entry out of the ring before it reads it (the client
//! may rewrite it concurrently) and checks every field: an entry that names an unknown
//! opcode, flag bit or access bit, or more SGEs or inline bytes than the entry holds, is a
//! [`WqeError`], never a panic and never an access outside the entry. The same encodings
//! travel in post requests on the control socket, so a work request has one form whichever
//! way it goes.
//!
//! ```text
//! send entry:  SendWqe (96 bytes) | num_sge × WqeSge (16 bytes) or inline_len bytes
//! recv entry:  RecvWqe (16 bytes) | num_sge × WqeSge
//! CQ entry:    Cqe (64 bytes)
//! ```

use engine::{
    AccessFlags, AhHandle, MrHandle, MwBind, MwHandle, NetworkHdr, RecvWr, SendFlags, SendOp,
    SendPayload, SendWr, Sge, SgeList, UdDest, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};
use wire::types::{Lkey, Qpn, Rkey};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// `ibv_wr_opcode` numbers, as libibverbs defines them.
pub mod opcode {
    /// `IBV_WR_RDMA_WRITE`.
    pub const RDMA_WRITE: u32 = 0;
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// `IBV_WR_SEND`.
    pub const SEND: u32 = 2;
    /// `IBV_WR_SEND_WITH_IMM`.
    pub const SEND_WITH_IMM: u32 = 3;
    /// `IBV_WR_RDMA_READ`.
    pub const RDMA_READ: u32 = 4;
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    /// `IBV_WR_LOCAL_INV`.
    pub const LOCAL_INV: u32 = 7;
    /// `IBV_WR_BIND_MW`.
    pub const BIND_MW: u32 = 8;
    /// `IBV_WR_SEND_WITH_INV`.
    pub const SEND_WITH_INV: u32 = 9;
}

/// One scatter/gather element in an entry (`ibv_sge`).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct WqeSge {
    /// Address in the client's address space.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR holding it.
    pub lkey: u32,
}

/// The header of a send queue entry (`ibv_send_wr` without its lists). Which fields count
/// depends on `opcode`, as in `ibv_send_wr`'s unions; the others are zero.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct SendWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// [`opcode`].
    pub opcode: u32,
    /// `ibv_send_flags` (FENCE 1, SIGNALED 2, SOLICITED 4, INLINE 8).
    pub send_flags: u32,
    /// SGEs after the header (0 with INLINE).
    pub num_sge: u32,
    /// Inline bytes after the header (0 without INLINE).
    pub inline_len: u32,
    /// WRITE, READ, ATOMIC: remote address; BIND_MW: first byte of the window.
    pub remote_addr: u64,
    /// ATOMIC: the value compared (CMP_AND_SWP) or added (FETCH_AND_ADD); BIND_MW: the
    /// window's length.
    pub compare_add: u64,
    /// ATOMIC CMP_AND_SWP: the value stored on a match.
    pub swap: u64,
    /// WRITE, READ, ATOMIC: remote key; BIND_MW: the window's rkey once bound; LOCAL_INV and
    /// SEND_WITH_INV: the key to invalidate.
    pub rkey: u32,
    /// WITH_IMM: immediate data, host order.
    pub imm_data: u32,
    /// BIND_MW: the window's handle on the connection.
    pub mw: u32,
    /// BIND_MW: the region's handle on the connection.
    pub mr: u32,
    /// BIND_MW: `ibv_access_flags` through the window.
    pub bind_access: u32,
    /// 1: a UD send, `ah`, `remote_qpn` and `remote_qkey` count; 0: not.
    pub ud: u32,
    /// UD: the AH's handle on the connection.
    pub ah: u32,
    /// UD: destination QP number.
    pub remote_qpn: u32,
    /// UD: Q_Key (high bit set: the QP's own).
    pub remote_qkey: u32,
    /// Zero.
    pub reserved: [u32; 3],
}

/// The header of a receive queue (or SRQ) entry (`ibv_recv_wr` without its list).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct RecvWqe {
    /// Returned in the completion.
    pub wr_id: u64,
    /// SGEs after the header.
    pub num_sge: u32,
    /// Zero.
    pub reserved: u32,
}

/// One completion in a CQ ring (`ibv_wc`; numbers as libibverbs defines them).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
pub struct Cqe {
    /// The work request's id.
    pub wr_id: u64,
    /// `IBV_WC_*` status (0 = success).
    pub status: u32,
    /// `IBV_WC_*` opcode.
    pub opcode: u32,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes transferred (receives, READ, atomics).
    pub byte_len: u32,
    /// Immediate data (host order).
    pub imm_data: u32,
    /// Key invalidated by SEND with invalidate.
    pub invalidated_rkey: u32,
    /// Local QPN.
    pub qp_num: u32,
    /// Remote QPN (UD).
    pub src_qp: u32,
    /// `ibv_wc_flags`.
    pub wc_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// The network header of a received datagram ([`NET_HDR_NONE`], [`NET_HDR_IPV4`],
    /// [`NET_HDR_IPV6`]).
    pub network_hdr: u8,
    /// Zero.
    pub reserved0: u8,
    /// Zero.
    pub reserved: [u32; 4],
}

/// [`Cqe::network_hdr`] of a completion without a datagram.
pub const NET_HDR_NONE: u8 = 0;
/// [`Cqe::network_hdr`]: the datagram came in IPv4.
pub const NET_HDR_IPV4: u8 = 4;
/// [`Cqe::network_hdr`]: the datagram came in IPv6.
pub const NET_HDR_IPV6: u8 = 6;

/// Bytes of a [`SendWqe`].
pub const SEND_WQE_LEN: usize = size_of::<SendWqe>();
/// Bytes of a [`RecvWqe`].
pub const RECV_WQE_LEN: usize = size_of::<RecvWqe>();
/// Bytes of a [`WqeSge`].
pub const SGE_LEN: usize = size_of::<WqeSge>();
/// Bytes of a [`Cqe`] (a CQ ring's entry size).
pub const CQE_LEN: usize = size_of::<Cqe>();
/// Most SGEs an entry carries (the device's `max_sge`).
pub const MAX_SGE: u32 = 32;
/// Most inline bytes an entry carries (at least the device's `max_inline_data`).
pub const MAX_INLINE: u32 = 512;
/// Largest send entry: what a stack buffer for one must hold.
pub const MAX_SEND_ENTRY: usize = SEND_WQE_LEN + MAX_INLINE as usize;
/// Largest receive entry.
pub const MAX_RECV_ENTRY: usize = RECV_WQE_LEN + MAX_SGE as usize * SGE_LEN;

const _: () = assert!(SEND_WQE_LEN == 96 && RECV_WQE_LEN == 16 && SGE_LEN == 16);
const _: () = assert!(CQE_LEN == 64);
const _: () = assert!(MAX_SGE as usize * SGE_LEN <= MAX_INLINE as usize);

/// Why an entry is not a work request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WqeError {
    /// Shorter than its header.
    #[error("entry of {0} bytes is shorter than its header")]
    Short(usize),
    /// An opcode libibverbs does not define (or this queue does not take).
    #[error("unknown opcode {0}")]
    Opcode(u32),
    /// Flag bits that mean nothing.
    #[error("unknown send flags {0:#x}")]
    Flags(u32),
    /// Access bits that mean nothing.
    #[error("unknown access flags {0:#x}")]
    Access(u32),
    /// More SGEs or inline bytes than the entry holds, or more than the limits.
    #[error("{what} {n} do not fit an entry of {len} bytes")]
    TooLong {
        /// SGEs or inline bytes.
        what: &'static str,
        /// How many.
        n: u32,
        /// The entry's size.
        len: usize,
    },
    /// A UD send's destination QP number does not fit 24 bits: it names no QP, and is
    /// refused rather than masked into the number of another one.
    #[error("destination QP number {0:#x} does not fit 24 bits")]
    Qpn(u32),
    /// The request cannot be written as an entry (an opcode of the engine the ABI lacks).
    #[error("{0} has no entry layout")]
    Unsupported(&'static str),
    /// An unknown completion status or opcode number.
    #[error("completion with unknown {what} {value}")]
    Completion {
        /// Which field.
        what: &'static str,
        /// Its value.
        value: u32,
    },
}

const fn round16(n: usize) -> usize {
    (n + 15) & !15
}

/// Entry size of a send ring for a QP that allows `max_sge` SGEs and `max_inline` inline
/// bytes per work request (both capped at the ABI's limits).
pub fn send_entry_len(max_sge: u32, max_inline: u32) -> usize {
    let sges = max_sge.min(MAX_SGE) as usize * SGE_LEN;
    SEND_WQE_LEN + sges.max(round16(max_inline.min(MAX_INLINE) as usize))
}

/// Entry size of a receive ring (or SRQ ring) that allows `max_sge` SGEs per work request.
pub fn recv_entry_len(max_sge: u32) -> usize {
    RECV_WQE_LEN + max_sge.clamp(1, MAX_SGE) as usize * SGE_LEN
}

fn sge_of(s: &Sge) -> WqeSge {
    WqeSge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey.value(),
    }
}

fn put_sges(sges: &[Sge], out: &mut [u8], at: usize) -> Result<usize, WqeError> {
    let end = at + sges.len() * SGE_LEN;
    if sges.len() > MAX_SGE as usize || end > out.len() {
        return Err(WqeError::TooLong {
            what: "SGEs",
            n: sges.len() as u32,
            len: out.len(),
        });
    }
    for (s, chunk) in sges.iter().zip(out[at..end].chunks_exact_mut(SGE_LEN)) {
        chunk.copy_from_slice(sge_of(s).as_bytes());
    }
    Ok(end)
}

fn take_sges(entry: &[u8], at: usize, n: u32) -> Result<SgeList, WqeError> {
    let too_long = WqeError::TooLong {
        what: "SGEs",
        n,
        len: entry.len(),
    };
    if n > MAX_SGE {
        return Err(too_long);
    }
    let end = at + n as usize * SGE_LEN;
    let bytes = entry.get(at..end).ok_or(too_long)?;
    let mut sges = SgeList::new();
    for c in bytes.chunks_exact(SGE_LEN) {
        // `chunks_exact` hands out exactly SGE_LEN bytes: the read cannot fail.
        let s = WqeSge::read_from_bytes(c).unwrap_or_default();
        sges.push(Sge::new(s.addr, s.length, Lkey::new(s.lkey)));
    }
    Ok(sges)
}

/// Write `wr` (with `ud`'s address for a UD send) as a send entry into `out`; returns the
/// entry's length. Handles inside (`ud.ah`, a bind's window and region) are written as
/// their numbers: on a client, the connection's.
pub fn encode_send(wr: &SendWr, ud: Option<&UdDest>, out: &mut [u8]) -> Result<usize, WqeError> {
    let mut h = SendWqe {
        wr_id: wr.wr_id,
        send_flags: wr.flags.bits(),
        ..SendWqe::default()
    };
    match wr.op {
        SendOp::Send => h.opcode = opcode::SEND,
        SendOp::SendWithImm { imm } => {
            h.opcode = opcode::SEND_WITH_IMM;
            h.imm_data = imm;
        }
        SendOp::SendWithInv { rkey } => {
            h.opcode = opcode::SEND_WITH_INV;
            h.rkey = rkey.value();
        }
        SendOp::RdmaWrite { remote_addr, rkey } => {
            h.opcode = opcode::RDMA_WRITE;
            (h.remote_addr, h.rkey) = (remote_addr, rkey.value());
        }
        SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            h.opcode = opcode::RDMA_WRITE_WITH_IMM;
            (h.remote_addr, h.rkey, h.imm_data) = (remote_addr, rkey.value(), imm);
        }
        SendOp::RdmaRead { remote_addr, rkey } => {
            h.opcode = opcode::RDMA_READ;
            (h.remote_addr, h.rkey) = (remote_addr, rkey.value());
        }
        SendOp::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            h.opcode = opcode::ATOMIC_CMP_AND_SWP;
            (h.remote_addr, h.rkey, h.compare_add, h.swap) =
                (remote_addr, rkey.value(), compare, swap);
        }
        SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            h.opcode = opcode::ATOMIC_FETCH_AND_ADD;
            (h.remote_addr, h.rkey, h.compare_add) = (remote_addr, rkey.value(), add);
        }
        SendOp::BindMw { mw, rkey, bind } => {
            h.opcode = opcode::BIND_MW;
            (h.mw, h.rkey, h.mr) = (mw.0, rkey.value(), bind.mr.0);
            (h.remote_addr, h.compare_add) = (bind.addr, bind.length);
            h.bind_access = bind.access.bits();
        }
        SendOp::LocalInv { rkey } => {
            h.opcode = opcode::LOCAL_INV;
            h.rkey = rkey.value();
        }
        _ => return Err(WqeError::Unsupported("this send opcode")),
    }
    if let Some(d) = ud {
        (h.ud, h.ah, h.remote_qpn, h.remote_qkey) =
            (1, d.ah.0, d.remote_qpn.value(), d.remote_qkey);
    }
    let short = WqeError::Short(out.len());
    let end = match &wr.payload {
        SendPayload::Sges(s) => {
            h.num_sge = s.len() as u32;
            h.send_flags &= !SendFlags::INLINE.bits();
            put_sges(s, out, SEND_WQE_LEN)?
        }
        SendPayload::Inline(d) => {
            h.inline_len = d.len() as u32;
            h.send_flags |= SendFlags::INLINE.bits();
            let end = SEND_WQE_LEN + d.len();
            if d.len() > MAX_INLINE as usize || end > out.len() {
                return Err(WqeError::TooLong {
                    what: "inline bytes",
                    n: d.len() as u32,
                    len: out.len(),
                });
            }
            out[SEND_WQE_LEN..end].copy_from_slice(d);
            end
        }
    };
    out.get_mut(..SEND_WQE_LEN)
        .ok_or(short)?
        .copy_from_slice(h.as_bytes());
    Ok(end)
}

/// The send work request in `entry` (and its UD address, if it is a UD send), every field
/// checked. Handles inside are the numbers as written (the daemon translates them).
pub fn decode_send(entry: &[u8]) -> Result<(SendWr, Option<UdDest>), WqeError> {
    let (h, _) = SendWqe::read_from_prefix(entry).map_err(|_| WqeError::Short(entry.len()))?;
    let mut flags = SendFlags::from_bits(h.send_flags).ok_or(WqeError::Flags(h.send_flags))?;
    let op = match h.opcode {
        opcode::SEND => SendOp::Send,
        opcode::SEND_WITH_IMM => SendOp::SendWithImm { imm: h.imm_data },
        opcode::SEND_WITH_INV => SendOp::SendWithInv {
            rkey: Rkey::new(h.rkey),
        },
        opcode::RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: h.remote_addr,
            rkey: Rkey::new(h.rkey),
        },
        opcode::RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: h.remote_addr,
            rkey: Rkey::new(h.rkey),
            imm: h.imm_data,
        },
        opcode::RDMA_READ => SendOp::RdmaRead {
            remote_addr: h.remote_addr,
            rkey: Rkey::new(h.rkey),
        },
        opcode::ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpSwap {
            remote_addr: h.remote_addr,
            rkey: Rkey::new(h.rkey),
            compare: h.compare_add,
            swap: h.swap,
        },
        opcode::ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAdd {
            remote_addr: h.remote_addr,
            rkey: Rkey::new(h.rkey),
            add: h.compare_add,
        },
        opcode::BIND_MW => SendOp::BindMw {
            mw: MwHandle(h.mw),
            rkey: Rkey::new(h.rkey),
            bind: MwBind {
                mr: MrHandle(h.mr),
                addr: h.remote_addr,
                length: h.compare_add,
                access: AccessFlags::from_bits(h.bind_access)
                    .ok_or(WqeError::Access(h.bind_access))?,
            },
        },
        opcode::LOCAL_INV => SendOp::LocalInv {
            rkey: Rkey::new(h.rkey),
        },
        other => return Err(WqeError::Opcode(other)),
    };
    let payload = if flags.contains(SendFlags::INLINE) {
        let n = h.inline_len;
        let too_long = WqeError::TooLong {
            what: "inline bytes",
            n,
            len: entry.len(),
        };
        // The limit first: the sum below then cannot overflow, whatever the width of usize.
        if n > MAX_INLINE || h.num_sge != 0 {
            return Err(too_long);
        }
        let data = entry
            .get(SEND_WQE_LEN..SEND_WQE_LEN + n as usize)
            .ok_or(too_long)?;
        SendPayload::Inline(data.into())
    } else {
        flags.remove(SendFlags::INLINE);
        SendPayload::Sges(take_sges(entry, SEND_WQE_LEN, h.num_sge)?)
    };
    let ud = match h.ud {
        0 => None,
        1 => Some(UdDest {
            ah: AhHandle(h.ah),
            remote_qpn: Qpn::try_new(h.remote_qpn).ok_or(WqeError::Qpn(h.remote_qpn))?,
            remote_qkey: h.remote_qkey,
        }),
        _ => return Err(WqeError::Flags(h.ud)),
    };
    Ok((
        SendWr {
            wr_id: h.wr_id,
            op,
            payload,
            flags,
        },
        ud,
    ))
}

/// Write `wr` as a receive entry into `out`; returns the entry's length.
pub fn encode_recv(wr: &RecvWr, out: &mut [u8]) -> Result<usize, WqeError> {
    let h = RecvWqe {
        wr_id: wr.wr_id,
        num_sge: wr.sg_list.len() as u32,
        reserved: 0,
    };
    let end = put_sges(&wr.sg_list, out, RECV_WQE_LEN)?;
    out[..RECV_WQE_LEN].copy_from_slice(h.as_bytes());
    Ok(end)
}

/// The receive work request in `entry`, every field checked.
pub fn decode_recv(entry: &[u8]) -> Result<RecvWr, WqeError> {
    let (h, _) = RecvWqe::read_from_prefix(entry).map_err(|_| WqeError::Short(entry.len()))?;
    Ok(RecvWr::new(
        h.wr_id,
        take_sges(entry, RECV_WQE_LEN, h.num_sge)?,
    ))
}

const STATUSES: [WcStatus; 22] = [
    WcStatus::Success,
    WcStatus::LocLenErr,
    WcStatus::LocQpOpErr,
    WcStatus::LocEecOpErr,
    WcStatus::LocProtErr,
    WcStatus::WrFlushErr,
    WcStatus::MwBindErr,
    WcStatus::BadRespErr,
    WcStatus::LocAccessErr,
    WcStatus::RemInvReqErr,
    WcStatus::RemAccessErr,
    WcStatus::RemOpErr,
    WcStatus::RetryExcErr,
    WcStatus::RnrRetryExcErr,
    WcStatus::LocRddViolErr,
    WcStatus::RemInvRdReqErr,
    WcStatus::RemAbortErr,
    WcStatus::InvEecnErr,
    WcStatus::InvEecStateErr,
    WcStatus::FatalErr,
    WcStatus::RespTimeoutErr,
    WcStatus::GeneralErr,
];

const OPCODES: [WcOpcode; 9] = [
    WcOpcode::Send,
    WcOpcode::RdmaWrite,
    WcOpcode::RdmaRead,
    WcOpcode::CompSwap,
    WcOpcode::FetchAdd,
    WcOpcode::BindMw,
    WcOpcode::LocalInv,
    WcOpcode::Recv,
    WcOpcode::RecvRdmaWithImm,
];

impl Cqe {
    /// The entry of completion `c`.
    pub fn of(c: &WorkCompletion) -> Cqe {
        Cqe {
            wr_id: c.wr_id,
            status: c.status.to_ibv(),
            opcode: c.opcode.to_ibv(),
            vendor_err: c.vendor_err,
            byte_len: c.byte_len,
            imm_data: c.imm_data,
            invalidated_rkey: c.invalidated_rkey.value(),
            qp_num: c.qp_num.value(),
            src_qp: c.src_qp.value(),
            wc_flags: c.wc_flags.bits(),
            pkey_index: c.pkey_index,
            network_hdr: match c.network_hdr {
                NetworkHdr::None => NET_HDR_NONE,
                NetworkHdr::Ipv4 => NET_HDR_IPV4,
                NetworkHdr::Ipv6 => NET_HDR_IPV6,
            },
            ..Cqe::default()
        }
    }

    /// The entry's bytes, as a CQ ring holds them.
    pub fn bytes(&self) -> &[u8] {
        self.as_bytes()
    }

    /// The completion this entry holds; unknown status or opcode numbers are errors.
    pub fn completion(&self) -> Result<WorkCompletion, WqeError> {
        let status = STATUSES
            .into_iter()
            .find(|s| s.to_ibv() == self.status)
            .ok_or(WqeError::Completion {
                what: "status",
                value: self.status,
            })?;
        let opcode = OPCODES
            .into_iter()
            .find(|o| o.to_ibv() == self.opcode)
            .ok_or(WqeError::Completion {
                what: "opcode",
                value: self.opcode,
            })?;
        let mut wc = WorkCompletion::default();
        wc.wr_id = self.wr_id;
        wc.status = status;
        wc.opcode = opcode;
        wc.vendor_err = self.vendor_err;
        wc.byte_len = self.byte_len;
        wc.imm_data = self.imm_data;
        wc.invalidated_rkey = Rkey::new(self.invalidated_rkey);
        wc.qp_num = qpn_field("QP number", self.qp_num)?;
        wc.src_qp = qpn_field("source QP number", self.src_qp)?;
        wc.wc_flags = WcFlags::from_bits_truncate(self.wc_flags);
        wc.pkey_index = self.pkey_index;
        wc.network_hdr = match self.network_hdr {
            NET_HDR_NONE => NetworkHdr::None,
            NET_HDR_IPV4 => NetworkHdr::Ipv4,
            NET_HDR_IPV6 => NetworkHdr::Ipv6,
            other => {
                return Err(WqeError::Completion {
                    what: "network header",
                    value: other.into(),
                })
            }
        };
        Ok(wc)
    }
}

/// A QPN field of an entry: a number over 24 bits names no QP and is refused, not masked.
fn qpn_field(what: &'static str, value: u32) -> Result<Qpn, WqeError> {
    Qpn::try_new(value).ok_or(WqeError::Completion { what, value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sges(n: usize) -> Vec<Sge> {
        (0..n as u64)
            .map(|i| Sge::new(0x1000 * i + 7, 100 + i as u32, Lkey::new(0xabc0 + i as u32)))
            .collect()
    }

    fn ops() -> Vec<SendOp> {
        vec![
            SendOp::Send,
            SendOp::SendWithImm { imm: 0xdead_beef },
            SendOp::SendWithInv {
                rkey: Rkey::new(0x1234),
            },
            SendOp::RdmaWrite {
                remote_addr: 0x7f00_0000_1000,
                rkey: Rkey::new(9),
            },
            SendOp::RdmaWriteWithImm {
                remote_addr: 1,
                rkey: Rkey::new(2),
                imm: 3,
            },
            SendOp::RdmaRead {
                remote_addr: 4,
                rkey: Rkey::new(5),
            },
            SendOp::AtomicCmpSwap {
                remote_addr: 8,
                rkey: Rkey::new(6),
                compare: u64::MAX,
                swap: 42,
            },
            SendOp::AtomicFetchAdd {
                remote_addr: 16,
                rkey: Rkey::new(7),
                add: 1,
            },
            SendOp::BindMw {
                mw: MwHandle(3),
                rkey: Rkey::new(0x8000_0101),
                bind: MwBind {
                    mr: MrHandle(4),
                    addr: 0x5000,
                    length: 4096,
                    access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
                },
            },
            SendOp::LocalInv {
                rkey: Rkey::new(0x8000_0101),
            },
        ]
    }

    #[test]
    fn every_send_opcode_round_trips_with_sges_inline_data_and_ud_addresses() {
        let mut buf = [0u8; MAX_SEND_ENTRY];
        let dest = UdDest {
            ah: AhHandle(5),
            remote_qpn: Qpn::new(0x11),
            remote_qkey: 0x8001_0000,
        };
        for op in ops() {
            for payload in [
                SendPayload::Sges(Vec::new().into()),
                SendPayload::Sges(sges(3).into()),
                SendPayload::Sges(sges(MAX_SGE as usize).into()),
                SendPayload::Inline(vec![0x5a; 17].into()),
            ] {
                for ud in [None, Some(&dest)] {
                    let mut wr = SendWr::new(77, op, Vec::new());
                    wr.payload = payload.clone();
                    wr.flags |= SendFlags::FENCE | SendFlags::SOLICITED;
                    if matches!(payload, SendPayload::Inline(_)) {
                        wr.flags |= SendFlags::INLINE;
                    }
                    let n = encode_send(&wr, ud, &mut buf).unwrap();
                    let (back, back_ud) = decode_send(&buf[..n]).unwrap();
                    assert_eq!(back, wr);
                    assert_eq!(back_ud.as_ref(), ud);
                }
            }
        }
    }

    #[test]
    fn receive_entries_round_trip_and_fit_the_size_the_ring_was_made_for() {
        for n in [0, 1, 4, MAX_SGE as usize] {
            let wr = RecvWr::new(9, sges(n));
            let mut buf = vec![0u8; recv_entry_len(n as u32)];
            let len = encode_recv(&wr, &mut buf).unwrap();
            assert_eq!(decode_recv(&buf[..len]).unwrap(), wr);
        }
        let mut small = vec![0u8; recv_entry_len(2)];
        assert!(matches!(
            encode_recv(&RecvWr::new(1, sges(3)), &mut small),
            Err(WqeError::TooLong { .. })
        ));
        assert_eq!(send_entry_len(1, 0), 112);
        assert_eq!(send_entry_len(32, 400), 96 + 512);
        assert_eq!(send_entry_len(2, 64), 160);
    }

    #[test]
    fn entries_that_claim_more_than_they_hold_or_unknown_numbers_are_refused() {
        let mut buf = [0u8; 256];
        let wr = SendWr::send(1, sges(2));
        encode_send(&wr, None, &mut buf).unwrap();
        let mut lie = buf;
        lie[16..20].copy_from_slice(&40u32.to_ne_bytes()); // num_sge
        assert!(matches!(decode_send(&lie), Err(WqeError::TooLong { .. })));
        let mut lie = buf;
        lie[8..12].copy_from_slice(&10u32.to_ne_bytes()); // opcode
        assert_eq!(decode_send(&lie), Err(WqeError::Opcode(10)));
        let mut lie = buf;
        lie[12..16].copy_from_slice(&0x100u32.to_ne_bytes()); // send_flags
        assert_eq!(decode_send(&lie), Err(WqeError::Flags(0x100)));
        let mut lie = buf;
        lie[12..16].copy_from_slice(&8u32.to_ne_bytes()); // INLINE, with SGEs
        assert!(decode_send(&lie).is_err());
        assert_eq!(decode_send(&buf[..40]), Err(WqeError::Short(40)));
        // A UD destination QPN over 24 bits is refused, not masked into another QP's number.
        let dest = UdDest {
            ah: AhHandle(1),
            remote_qpn: Qpn::MULTICAST,
            remote_qkey: 7,
        };
        let n = encode_send(&wr, Some(&dest), &mut buf).unwrap();
        assert_eq!(decode_send(&buf[..n]).unwrap().1, Some(dest));
        let (mut h, _) = SendWqe::read_from_prefix(&buf[..n]).unwrap();
        h.remote_qpn = 0x0100_0011;
        let mut lie = buf;
        lie[..SEND_WQE_LEN].copy_from_slice(h.as_bytes());
        assert_eq!(decode_send(&lie[..n]), Err(WqeError::Qpn(0x0100_0011)));
        let bad = Cqe {
            status: 99,
            ..Cqe::default()
        };
        assert!(bad.completion().is_err());
    }

    #[test]
    fn completions_round_trip_through_ring_entries() {
        let mut wc = WorkCompletion::default();
        wc.wr_id = u64::MAX;
        wc.status = WcStatus::RemAccessErr;
        wc.opcode = WcOpcode::RecvRdmaWithImm;
        wc.byte_len = 4096;
        wc.imm_data = 0x0102_0304;
        wc.qp_num = Qpn::new(0x00ab_cdef);
        wc.src_qp = Qpn::new(3);
        wc.wc_flags = WcFlags::WITH_IMM | WcFlags::GRH;
        for net in [NetworkHdr::None, NetworkHdr::Ipv4, NetworkHdr::Ipv6] {
            wc.network_hdr = net;
            let e = Cqe::of(&wc);
            let back = Cqe::read_from_bytes(e.as_bytes()).unwrap();
            assert_eq!(back.completion().unwrap(), wc);
        }
        let bad = Cqe {
            network_hdr: 5,
            ..Cqe::of(&wc)
        };
        assert!(bad.completion().is_err());
        for bad in [
            Cqe {
                qp_num: 0x0100_0000,
                ..Cqe::of(&wc)
            },
            Cqe {
                src_qp: u32::MAX,
                ..Cqe::of(&wc)
            },
        ] {
            assert!(
                matches!(bad.completion(), Err(WqeError::Completion { .. })),
                "a QPN over 24 bits is refused, not masked"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn arbitrary_entries_never_panic_the_decoders(entry in proptest::collection::vec(any::<u8>(), 0..700)) {
            let _ = decode_send(&entry);
            let _ = decode_recv(&entry);
            if let Ok((c, _)) = Cqe::read_from_prefix(&entry) {
                let _ = c.completion();
            }
        }
    }
}
