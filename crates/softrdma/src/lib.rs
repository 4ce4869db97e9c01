//! # softrdma: RDMA in software, as a safe Rust API
//!
//! The verbs model (devices, protection domains, memory regions, completion queues, queue
//! pairs) over a soft RNIC that speaks standard RoCEv2 on UDP port 4791. This crate is the
//! layer applications use; underneath, a [`runtime::Runtime`] hosts the sans-IO engine on a
//! progress thread with a real UDP socket (the embedded device; a host-daemon backend comes
//! later behind the same types).
//!
//! ```no_run
//! use softrdma::{AccessFlags, Buffer, Device};
//! # fn main() -> Result<(), softrdma::Error> {
//! let dev = Device::open("127.0.0.1".parse().unwrap())?;
//! let pd = dev.alloc_pd()?;
//! let cq = dev.create_cq(64)?;
//! let mr = pd.register(Buffer::zeroed(4096), AccessFlags::LOCAL_WRITE)?;
//! let qp = pd.qp_builder(&cq, &cq).build()?;
//! let stream = std::net::TcpStream::connect("127.0.0.1:18515")?;
//! let _peer = qp.handshake(stream, None)?; // exchange QPN/PSN/GID/MTU, walk to RTS
//! mr.write(0, b"hello")?;
//! qp.send(1, &[mr.sge(0..5)?])?;
//! let wc = cq.wait_ok(None)?;
//! assert_eq!(wc.wr_id, 1);
//! # Ok(()) }
//! ```
//!
//! ## Safety of registered memory
//!
//! The device reads and writes registered memory from its own thread, whenever a peer's
//! operation or a posted work request says so. A [`MemoryRegion`] therefore *owns* its buffer
//! (a [`Buffer`], `Vec<u8>` or `Box<[u8]>`; see [`RegisterableBuffer`]) and never lends it out
//! as a plain reference while registered: reads and writes go through [`MemoryRegion::read`],
//! [`MemoryRegion::write`], [`MemoryRegion::with`] and friends, which hold the device lock
//! (the device touches memory only under that lock). Dropping the region, or
//! [`MemoryRegion::into_inner`], deregisters it first: afterwards the device can never touch
//! the buffer again, and a work request still naming its keys completes with a protection
//! error. Work requests name memory by [`Sge`] (address, length, lkey) and are checked by the
//! device against the registration when they execute, so posting them is safe.
//! `mem::forget` on a region leaks the buffer (still registered), which is safe. Memory the
//! crate cannot own goes through the `unsafe` [`Pd::register_raw`].
//!
//! ## UD and SRQ
//!
//! A UD QP ([`QpBuilder::qp_type`] with [`QpType::Ud`]) is ready to send once built; it sends
//! single-packet messages with [`Qp::send_ud`] to an [`AddressHandle`] ([`Pd::create_ah`]) and a
//! remote QPN and Q_Key; every receive buffer starts with [`GRH_LEN`] bytes of GRH. A
//! [`Srq`] ([`Pd::create_srq`], [`QpBuilder::srq`]) feeds the receives of several QPs.
//!
//! ## UC
//!
//! A UC QP ([`QpBuilder::qp_type`] with [`QpType::Uc`]) connects like an RC one and carries
//! SEND and RDMA WRITE (with immediate), without acknowledgements or retransmission.
//!
//! ## Memory windows and invalidation
//!
//! A [`MemoryWindow`] ([`Pd::alloc_mw`]) exposes part of a region that allows
//! [`AccessFlags::MW_BIND`] to peers, with its own rights and rkey: type 1 is bound with
//! [`Qp::bind_mw`], type 2 with a bind work request, [`Qp::post_bind_mw`], and freed again by
//! [`Qp::local_inv`] or a peer's [`Qp::send_with_inv`] (which also invalidate regions).
//!
//! ## What is not here yet
//!
//! XRC, and fast-registration MRs (the engine has neither: any region can be invalidated,
//! none re-validated).

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod cq;
mod device;
pub mod handshake;
mod mr;
mod mw;
mod qp;
mod ud;

pub use backend::{
    BackendKind, BACKEND_ENV, DAEMON_ARGS_ENV, DAEMON_BIN_ENV, SOCKET_ENV, SPAWN_ENV,
};
pub use cq::Cq;
pub use device::{Device, DeviceBuilder, DEVICE_ENV};
pub use handshake::{Endpoint, HandshakeError, RemoteMr};
pub use mr::{Buffer, MemoryRegion, RawMemoryRegion, RegisterableBuffer};
pub use mw::MemoryWindow;
pub use qp::{ConnectOptions, Pd, Qp, QpBuilder, DEFAULT_QKEY};
pub use ud::{AddressHandle, Srq};

pub use engine::qp_attr::Mtu;
pub use engine::MwType;
pub use engine::{
    AccessFlags, AhAttr, AsyncEvent, Counter, Counters, DeviceAttr, Gid, PortAttr, QpAttr,
    QpAttrMask, QpCap, QpState, QpType, RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge,
    VerbsError, WcFlags, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};
pub use runtime::{RuntimeConfig, RuntimeError, RxPath, SrcPortPolicy};

/// Everything that can go wrong in this API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device (its socket or progress thread) failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// A verb was refused (bad handle, limits, wrong QP state...).
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// An I/O error outside the device (the handshake's TCP stream, a wait).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The connection handshake failed.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// A wait ended before anything arrived.
    #[error("timed out")]
    Timeout,
    /// A work request completed with an error status.
    #[error("work request {wr_id} completed with {status}")]
    Completion {
        /// The `wr_id` of the failed work request.
        wr_id: u64,
        /// Its status.
        status: WcStatus,
    },
    /// The host daemon's connection failed, or the daemon refused a request (its errno and
    /// reason).
    #[error(transparent)]
    Daemon(#[from] daemon::client::ClientError),
    /// No daemon answers on the control socket, and none could be started.
    #[error("no softrdmad on {}: {reason}", socket.display())]
    NoDaemon {
        /// The control socket tried.
        socket: std::path::PathBuf,
        /// Why connecting (and starting one) failed.
        reason: String,
    },
    /// The daemon answered with something that cannot be right (an unknown status...).
    #[error("bad answer from softrdmad: {0}")]
    BadAnswer(String),
    /// What was asked for is not offered on this device's backend.
    #[error("not supported on this backend: {0}")]
    Unsupported(&'static str),
    /// The configuration (environment or builder options) does not hold together.
    #[error("configuration: {0}")]
    Config(String),
    /// An offset range outside a memory region.
    #[error("range {offset}..{offset}+{len} is outside the region of {size} bytes")]
    OutOfBounds {
        /// Start offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Size of the region.
        size: usize,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
