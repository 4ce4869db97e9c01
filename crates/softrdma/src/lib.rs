//! # softrdma: RDMA in software, as a safe Rust API
//!
//! The verbs model (devices, protection domains, memory regions, completion queues, queue
//! pairs) over a soft RNIC that speaks standard RoCEv2 on UDP port 4791. This crate is the
//! layer applications use; underneath runs one of two backends, behind the same types (see
//! "Backends").
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
//! ## Backends
//!
//! - **Embedded** ([`BackendKind::Embedded`]): a [`runtime::Runtime`] hosts the sans-IO
//!   engine on a progress thread of this process, with its own UDP socket. One process per
//!   address and port; fastest; everything of this API is there.
//! - **Daemon** ([`BackendKind::Daemon`]): the host daemon `softrdmad` (crate
//!   `softrdma-daemon`) runs the engine for every process of the host and owns UDP 4791;
//!   this process drives it over the daemon's Unix control socket, and the daemon reaches
//!   registered memory with `process_vm_readv` / `process_vm_writev`. Control verbs are
//!   requests on the socket; posts and completions go through rings in shared memory.
//!
//! Each is a provider of one interface (rdma-core's `verbs_context_ops` habit), chosen
//! once when the device is opened: no verb asks which backend it runs on.
//!
//! Which one a device uses — an explicit choice first, then the daemon if one answers,
//! else an embedded device:
//!
//! 1. [`DeviceBuilder::backend`], if called;
//! 2. else `SOFTRDMA_BACKEND` (`embedded` or `daemon`; anything else is
//!    [`Error::Config`]);
//! 3. else what the options given imply. Options only an embedded device has —
//!    [`DeviceBuilder::remote_port`], `src_port_policy`, `rx_path`, `busy_poll`,
//!    `adaptive_poll`, `rng_seed`, and a capture file in `SOFTRDMA_CAPTURE` — choose
//!    embedded: whoever set them wants that device, and the daemon would refuse them.
//!    Options only a daemon start uses — [`DeviceBuilder::daemon_binary`], `daemon_args`,
//!    `spawn_daemon(true)` — choose the daemon (started if none answers). Both kinds at once are
//!    [`Error::Config`];
//! 4. else the daemon, if one answers on its control socket and serves the device's
//!    address (and the [`DeviceBuilder::port`] and [`DeviceBuilder::mtu`] asked for, if
//!    any: another port or MTU is one only an embedded device can give). Looking costs one
//!    connect and starts nothing: a missing socket file or a refused connect means no
//!    daemon answers. A daemon that is there but cannot be used (another protocol version,
//!    no permission) is an error rather than a reason to fight it for its addresses;
//! 5. else embedded.
//!
//! [`DeviceBuilder::choose_backend`] tells which one `open` would take, and
//! [`Device::backend`] / [`Device::daemon_info`] which one a device took. A test or program
//! that needs one backend says so (step 1 or 2): the choice otherwise depends on whether a
//! daemon runs on the host. [`Device::open_default`] opens the device `SOFTRDMA_DEVICE`
//! names (an IP address) by the same rule; without one it opens the daemon's first device
//! (an embedded device needs an address).
//!
//! On the daemon, [`Device::open`] picks the daemon's device serving that address. The
//! control socket is [`DeviceBuilder::daemon_socket`], else `SOFTRDMA_DAEMON_SOCKET`, else
//! `/run/softrdma/softrdmad.sock`. When the daemon is chosen explicitly (or by the options
//! that start one, or by `open_default` without an address) and none answers there, the
//! library starts one (`softrdmad --socket <that path>` plus [`DeviceBuilder::daemon_args`]
//! or `SOFTRDMA_DAEMON_ARGS`), found at [`DeviceBuilder::daemon_binary`], else
//! `SOFTRDMA_DAEMON_BIN`, else next to the current executable (or one directory up), else on
//! `PATH`, and waits up to 10 s for its socket. It runs in a process group of its own and
//! outlives this process, like a service. [`DeviceBuilder::spawn_daemon`]`(false)` or
//! `SOFTRDMA_DAEMON_SPAWN=0` turns that off; a missing daemon is then
//! [`Error::NoDaemon`].
//!
//! What the daemon backend does not offer, with the error it gives: the engine's counter set
//! ([`Device::counters`]: [`Error::Unsupported`]; [`Device::counter_values`] reads the
//! daemon's device counters by name), the options that configure an embedded engine
//! ([`DeviceBuilder::remote_port`], `src_port_policy`, `rx_path`, `busy_poll`,
//! `adaptive_poll`, `rng_seed`, and a `port` or `mtu` other than the daemon's:
//! [`Error::Config`]), the raw runtime ([`Device::try_runtime`] is `None`). A verb the daemon refuses fails as on an embedded
//! device: [`Error::Verbs`] when the daemon's engine refused it with a [`VerbsError`] whose
//! text names it completely, else [`Error::Daemon`] with the errno libibverbs would give;
//! [`Error::errno`] is the same on both. Asynchronous events reach only the connection
//! (device) owning their QP, CQ or SRQ.
//!
//! Polling a CQ on the daemon reads its ring in shared memory, with no system call. Another
//! process's thread (the daemon's) produces what a polling thread waits for, so on a host
//! with fewer than four CPUs an empty [`Cq::poll`] (and [`Device::poll_progress`], for loops
//! that watch memory) gives the core away (`sched_yield`) before returning: two
//! busy-polling processes would otherwise leave the daemon waiting for a time slice. A
//! yield gives the core to whoever the scheduler picks, though, and beside one more busy
//! thread that is seldom the daemon; so a thread whose polls of a CQ keep finding nothing
//! (64 in a row, over 20 µs or more) sleeps instead, until softrdmad delivers a completion
//! to any CQ of the device's connection, or 50 µs pass (`SOFTRDMA_POLL_SLEEP_US` sets
//! another bound). Sleeps that run out make the next come later, and completions polled
//! bring it back (a loop that waits for something else, as UCX polling shared memory does,
//! soon stops sleeping). Measured with
//! `HOG=1 scripts/dropin-rate.sh` (a busy loop beside it): perftest's `ib_send_bw -s 2`
//! went from 0.1–0.4 M messages/s to 1.5–1.7 M; without the busy loop, and for UCX's
//! `tag_lat` over shared memory, nothing changed.
//! `SOFTRDMA_POLL_YIELD=0` turns that off, `1` turns it on for both backends.
//!
//! ## Safety of registered memory
//!
//! The device reads and writes registered memory from its own thread (embedded) or from the
//! daemon's process (daemon), whenever a peer's operation or a posted work request says
//! so. A [`MemoryRegion`] therefore *owns* its buffer
//! (a [`Buffer`], `Vec<u8>` or `Box<[u8]>`; see [`RegisterableBuffer`]) and never lends it out
//! as a plain reference while registered: reads and writes go through [`MemoryRegion::read`],
//! [`MemoryRegion::write`], [`MemoryRegion::with`] and friends, which on the embedded
//! backend hold the device lock (the device touches memory only under that lock; the daemon
//! backend is below). Dropping the region, or
//! [`MemoryRegion::into_inner`], deregisters it first: afterwards the device can never touch
//! the buffer again, and a work request still naming its keys completes with a protection
//! error. Work requests name memory by [`Sge`] (address, length, lkey) and are checked by the
//! device against the registration when they execute, so posting them is safe.
//! `mem::forget` on a region leaks the buffer (still registered), which is safe. Memory the
//! crate cannot own goes through the `unsafe` [`Pd::register_raw`].
//!
//! On the daemon backend there is no lock the daemon takes: it writes registered memory
//! with `process_vm_writev` at any moment, like a NIC's DMA. The ownership guarantees stay:
//! the region owns the buffer, so it cannot be freed, moved or resized while registered, and
//! dropping the region deregisters it first with a request the daemon answers only once it
//! will never touch the range again. If that request fails (the connection broke, or the
//! daemon refused), the library ends its connection and waits until the daemon has closed
//! its side, which it does only after reclaiming every object of the connection; the
//! device is unusable afterwards, but the memory is safe to free. What reads and writes mean
//! while the device may be writing:
//!
//! - [`MemoryRegion::read`], [`MemoryRegion::to_vec`], [`MemoryRegion::read_u64`] copy the
//!   bytes with volatile byte reads: each byte is either old or new, and bytes the device is
//!   writing meanwhile may be a mix of both (as a CPU reading a DMA target). The data of a
//!   completed operation is all there once its completion has been polled.
//! - [`MemoryRegion::write`] and [`MemoryRegion::write_u64`] store with volatile byte writes:
//!   a device access at the same time (a peer's READ, a posted SEND) may see part of them.
//!   ATOMIC operations are atomic with respect to other atomics through the daemon, not to
//!   these writes (`IBV_ATOMIC_HCA`).
//! - [`MemoryRegion::with`] hands `f` a copy taken just before; [`MemoryRegion::with_mut`]
//!   hands it a copy and writes back only the bytes `f` changed.
//! - The `unsafe` [`MemoryRegion::as_slice`] keeps its contract: no device write may happen
//!   while the slice lives.
//!
//! ## Numbers that must not be mixed
//!
//! QP numbers and keys are newtypes: a [`Qpn`] (24 bits), an [`Lkey`] and an [`Rkey`] (32
//! bits each), so that a QPN cannot be passed where a key is meant, nor an lkey sent to a
//! peer as an rkey. [`Qp::qpn`], [`MemoryRegion::lkey`](RawMemoryRegion::lkey) and
//! [`MemoryRegion::rkey`](RawMemoryRegion::rkey) hand them out; a number from elsewhere (a
//! command line, another program) becomes one explicitly with [`Qpn::try_new`] (`None` over
//! 24 bits), [`Lkey::new`] or [`Rkey::new`], and `value()` gives the number back. The verbs
//! structures shared with the engine carry them too: an [`Sge`]'s lkey, a [`SendOp`]'s rkey,
//! a [`WorkCompletion`]'s `qp_num`, `src_qp` and `invalidated_rkey`, a [`QpAttr`]'s
//! `dest_qp_num` and an [`AsyncEvent`]'s QPN.
//!
//! ```
//! use softrdma::{Lkey, Qpn, Rkey};
//! assert_eq!(Qpn::try_new(0x12).map(Qpn::value), Some(0x12));
//! assert_eq!(Qpn::try_new(1 << 24), None); // refused, not masked into another QP's number
//! assert_eq!(Rkey::new(0x1234).value(), 0x1234);
//! assert_eq!(format!("{:#x}", Lkey::new(0xab)), "0xab"); // hex as verbs tools print keys
//! ```
//!
//! ## UD and SRQ
//!
//! A UD QP ([`QpBuilder::qp_type`] with [`QpType::Ud`]) is ready to send once built; it sends
//! single-packet messages with [`Qp::send_ud`] to an [`AddressHandle`] ([`Pd::create_ah`]) and a
//! remote QPN and Q_Key ([`Qpn::MULTICAST`] for a multicast group); every receive buffer
//! starts with [`GRH_LEN`] bytes of GRH. A
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

pub mod cm;
mod cq;
mod device;
pub mod handshake;
mod mr;
mod mw;
mod provider;
mod qp;
pub mod raw;
mod ud;

pub use cq::Cq;
pub use device::{Device, DeviceBuilder, DEVICE_ENV};
pub use handshake::{Endpoint, HandshakeError, RemoteMr};
pub use mr::{Buffer, MemoryRegion, RawMemoryRegion, RegisterableBuffer};
pub use mw::MemoryWindow;
pub use provider::locate::{DAEMON_ARGS_ENV, DAEMON_BIN_ENV, SOCKET_ENV, SPAWN_ENV};
/// What [`MemoryRegion::lkey`](RawMemoryRegion::lkey) hands out.
pub use provider::Lkey;
/// What [`Qp::qpn`] and [`Endpoint::qpn`] hold: the number peers and UD sends name a QP
/// by. [`Qpn::try_new`] refuses a number over 24 bits.
pub use provider::Qpn;
/// What [`MemoryRegion::rkey`](RawMemoryRegion::rkey), [`MemoryWindow::rkey`] and
/// [`RemoteMr::rkey`] hold: the key a peer's RDMA and ATOMIC operations name memory by.
pub use provider::Rkey;
pub use provider::{BackendKind, QpHandle, BACKEND_ENV};
pub use qp::{ConnectOptions, Pd, Qp, QpBuilder, DEFAULT_QKEY};
pub use raw::{RawCmChannel, RawCq, RawDevice, RawMr, RawQp};
pub use ud::{AddressHandle, Srq};

pub use engine::qp_attr::Mtu;
pub use engine::{
    AccessFlags, AhAttr, AsyncEvent, Counter, Counters, DeviceAttr, Gid, PortAttr, QpAttr,
    QpAttrMask, QpCap, QpState, QpType, RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge,
    SrqAttr, SrqAttrMask, VerbsError, WcFlags, WcOpcode, WcStatus, WorkCompletion, GRH_LEN,
};
pub use engine::{ModifyError, MwType};
pub use runtime::{RuntimeConfig, RuntimeError, RxPath, SrcPortPolicy};

/// Everything that can go wrong in this API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The device (its socket or progress thread) failed.
    #[error(transparent)]
    Runtime(RuntimeError),
    /// A verb was refused (bad handle, limits, wrong QP state...), on either backend: a
    /// daemon's refusal for one of these is this too.
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
    /// The peer (or its CM, when nothing listens there) rejected a connection request
    /// (`RDMA_CM_EVENT_REJECTED`): 28 when its consumer said no, 8 (invalid service ID) when
    /// nothing listens.
    #[error("the peer rejected the connection (reason {})", reason.0)]
    CmRejected {
        /// The REJ's reason (IBA 12.6.7.2).
        reason: wire::RejectReason,
    },
    /// The peer answered a UD service resolution ([`cm::ConnectionManager::resolve`]) with
    /// a status other than success (`RDMA_CM_EVENT_UNREACHABLE` with that status).
    #[error("the peer did not resolve the UD service (SIDR status {status})")]
    CmUnresolved {
        /// The SIDR_REP's status (IBA 12.11.2): 1 nothing serves the service, 2 the peer's
        /// consumer refused.
        status: u8,
    },
    /// A work request completed with an error status.
    #[error("work request {wr_id} completed with {status}")]
    Completion {
        /// The `wr_id` of the failed work request.
        wr_id: u64,
        /// Its status.
        status: WcStatus,
    },
    /// The host daemon's connection failed, or the daemon refused a request for a reason
    /// that is not a [`VerbsError`] (its errno and reason).
    #[error(transparent)]
    Daemon(abi::client::ClientError),
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

impl From<RuntimeError> for Error {
    /// A verb the embedded runtime refused is [`Error::Verbs`], as on the daemon.
    fn from(e: RuntimeError) -> Error {
        match e {
            RuntimeError::Verbs(v) => Error::Verbs(v),
            other => Error::Runtime(other),
        }
    }
}

impl Error {
    /// The errno a libibverbs user would get for this error, whichever backend failed: the
    /// one mapping the drop-in `libibverbs.so.1` uses. A verb's own, the daemon's (which
    /// sends the one libibverbs returns), an I/O error's, and the closest fit for the rest
    /// (EOPNOTSUPP for what the backend does not offer, ENODEV for a missing daemon,
    /// ETIMEDOUT, EINVAL, EIO).
    pub fn errno(&self) -> i32 {
        const EIO: i32 = 5;
        const ENODEV: i32 = 19;
        const EINVAL: i32 = 22;
        const EOPNOTSUPP: i32 = 95;
        const ETIMEDOUT: i32 = 110;
        const ECONNREFUSED: i32 = 111;
        match self {
            Error::Verbs(v) => v.errno(),
            Error::Runtime(RuntimeError::Verbs(v)) => v.errno(),
            Error::Runtime(RuntimeError::Cm(c)) => c.errno(),
            Error::Runtime(
                RuntimeError::Bind { source, .. }
                | RuntimeError::Io { source, .. }
                | RuntimeError::RawSocket { source },
            ) => source.raw_os_error().unwrap_or(EIO),
            Error::Io(e) => e.raw_os_error().unwrap_or(EIO),
            Error::Daemon(abi::client::ClientError::Refused { errno, .. }) => *errno,
            Error::Daemon(abi::client::ClientError::Io(e)) => e.raw_os_error().unwrap_or(EIO),
            Error::Timeout => ETIMEDOUT,
            Error::CmRejected { .. } | Error::CmUnresolved { .. } => ECONNREFUSED,
            Error::OutOfBounds { .. } | Error::Config(_) => EINVAL,
            Error::Unsupported(_) => EOPNOTSUPP,
            Error::NoDaemon { .. } => ENODEV,
            _ => EIO,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_errno_libibverbs_users_expect() {
        assert_eq!(
            Error::Verbs(VerbsError::InvalidMw).errno(),
            VerbsError::InvalidMw.errno()
        );
        let refused = abi::client::ClientError::Refused {
            errno: 14,
            message: "not mapped".into(),
        };
        assert_eq!(Error::Daemon(refused).errno(), 14);
        assert_eq!(Error::Unsupported("x").errno(), 95);
        assert_eq!(Error::Timeout.errno(), 110);
        assert_eq!(Error::Config("x".into()).errno(), 22);
        let no = Error::NoDaemon {
            socket: "/nowhere".into(),
            reason: "test".into(),
        };
        assert_eq!(no.errno(), 19);
    }
}
