//! Handle-level verbs for FFI layers such as the drop-in `libibverbs.so.1`.
//!
//! The typed API ([`crate::Pd`], [`crate::Cq`], [`crate::Qp`]...) owns its objects and
//! destroys them on drop. A C ABI cannot work that way: the C program owns every object and
//! names it by a pointer, so the layer underneath needs plain handles it creates and destroys
//! on request. [`RawDevice`] (from [`Device::raw`]) is that layer: one call per verb, on
//! either backend (embedded engine or `softrdmad`), with the engine's handle newtypes, a
//! [`QpHandle`] for a QP (not its [`Qpn`]), and [`Lkey`] / [`Rkey`] for the keys. Every
//! failure is one [`crate::Error`], the same on both backends; [`crate::Error::errno`]
//! gives the errno libibverbs would.
//!
//! Nothing here checks that a handle belongs to the caller's objects beyond what the device
//! itself checks (a stale or foreign handle is a [`crate::VerbsError`] or a daemon refusal,
//! never undefined behaviour), and nothing is destroyed implicitly: what a caller creates it
//! destroys. The one `unsafe` verb is [`RawDevice::reg_mr`], whose contract is the verbs one.

use std::net::IpAddr;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::Duration;

use engine::{
    AccessFlags, AhAttr, AsyncEvent, Gid, MwType, QpAttr, QpAttrMask, QpState, RecvWr, SendWr,
    SrqAttr, SrqAttrMask, WorkCompletion,
};

pub use crate::cm::{CmEvent, CommId, ConnParam, Ece, RejectReason, ServiceId};
pub use crate::provider::{Lkey, QpHandle, Qpn, RawMr, RawQp, Rkey};
use crate::provider::{Provider, ProviderCq};
use crate::BackendKind;

use crate::device::Device;
use crate::{Error, Result};
/// The handle types and verb arguments of the engine that this interface speaks in.
pub use engine::{
    AhHandle, CqHandle, MrHandle, MwBind, MwHandle, PdHandle, QpInitAttr, SrqHandle, UdDest,
};

/// The handle-level verbs of one open [`Device`] (see the module docs). Borrowed from the
/// device: cheap to make for every call.
#[derive(Debug, Clone, Copy)]
pub struct RawDevice<'a> {
    provider: &'a dyn Provider,
}

/// A completion queue: its handle plus what polling and waiting need (the embedded
/// runtime's notifier, or the daemon's shared-memory ring and completion eventfd). Dropping
/// it does not destroy the CQ: call [`RawDevice::destroy_cq`] first.
#[derive(Debug)]
pub struct RawCq {
    cq: Box<dyn ProviderCq>,
}

impl RawCq {
    /// The CQ's handle (`ibv_cq.handle`; what [`AsyncEvent::CqErr`] names).
    pub fn handle(&self) -> CqHandle {
        self.cq.handle()
    }

    /// The CQ's completion descriptor: readable after [`RawDevice::arm_cq`] once a
    /// completion arrives (an `ibv_comp_channel` fd can be a duplicate of it). Read it, or
    /// call [`RawCq::clear_event`], to consume the notification.
    pub fn event_fd(&self) -> BorrowedFd<'_> {
        self.cq.event_fd()
    }

    /// Consume a pending completion notification without blocking; true if there was one.
    pub fn clear_event(&self) -> bool {
        self.cq.clear_event()
    }

    /// A descriptor that hangs up (`POLLHUP`) when the CQ's device is gone for good: on
    /// softrdmad, when the daemon died. A wait on [`RawCq::event_fd`] that watches it too
    /// does not sleep through that; polling the CQ then fails. `None` on the embedded
    /// device, which lives as long as the process.
    pub fn hangup_fd(&self) -> Option<BorrowedFd<'_>> {
        self.cq.hangup_fd()
    }
}

/// A connection-manager channel of one device (what librdmacm builds an
/// `rdma_event_channel` on): the device's CM sets up and tears down connections with CM
/// messages to peers' QP1, moving the QPs named here through their states, and reports
/// each connection's events here. A connection is acted on only through the channel its
/// events arrive on (a connect's, or the listen's that got its request). Dropping the
/// channel closes it: its listens end, and the connections it still holds are destroyed
/// (QPs to ERR, peers told), on either backend; on the daemon the same happens when the
/// process dies.
#[derive(Debug)]
pub struct RawCmChannel {
    ch: Box<dyn crate::provider::ProviderCmChannel>,
}

impl RawCmChannel {
    /// Readable while events wait ([`RawCmChannel::get_event`] takes them).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.ch.fd()
    }

    /// The oldest event, without blocking.
    pub fn get_event(&self) -> Result<Option<CmEvent>> {
        self.ch.get_event()
    }

    /// `rdma_listen`: requests for `service_id` arrive on this channel; `EADDRINUSE` if
    /// another listener has it.
    pub fn listen(&self, service_id: ServiceId) -> Result<()> {
        self.ch.listen(service_id)
    }

    /// Stop listening on `service_id`; connections made stay.
    pub fn unlisten(&self, service_id: ServiceId) -> Result<()> {
        self.ch.unlisten(service_id)
    }

    /// `rdma_connect`: connect RC QP `qp` (in RESET or INIT) to `service_id` at `peer`.
    /// [`CmEvent::Established`] follows with the QP in RTS, or [`CmEvent::Rejected`],
    /// [`CmEvent::Unreachable`] or [`CmEvent::ConnectError`] with it in ERR.
    ///
    /// With `qp` `None` the caller moves its QP itself (an rdma_cm id without a QP): the
    /// REQ announces `param.qp_num`, [`CmEvent::ConnectResponse`] reports the REP, and the
    /// caller takes the QP to RTR and RTS ([`RawCmChannel::init_qp_attr`]) and then
    /// establishes the connection ([`RawCmChannel::establish`]).
    pub fn connect(
        &self,
        qp: Option<QpHandle>,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId> {
        self.ch.connect(qp, peer, service_id, param)
    }

    /// SIDR (`rdma_connect` on a UDP-port-space id): ask `peer` which UD QP serves
    /// `service_id`, with `param`'s private data and source port. [`CmEvent::Resolved`]
    /// follows (the QPN and Q_Key), or [`CmEvent::Unresolved`] / [`CmEvent::Unreachable`].
    pub fn resolve(
        &self,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId> {
        self.ch.resolve(peer, service_id, param)
    }

    /// `rdma_accept`: answer request `id` with RC QP `qp` (in RESET or INIT), which is in
    /// RTS when this returns; [`CmEvent::Established`] follows the peer's RTU. A SIDR
    /// request ([`ConnectRequest::datagram`](crate::cm::ConnectRequest)) takes a UD QP
    /// instead, whose number and Q_Key the answer carries.
    ///
    /// With `qp` `None` the caller moves its QP itself, and the answer announces
    /// `param.qp_num`.
    pub fn accept(&self, id: CommId, qp: Option<QpHandle>, param: &ConnParam) -> Result<()> {
        self.ch.accept(id, qp, param)
    }

    /// `rdma_establish`: send the RTU of connection `id`, made without a QP, after its
    /// [`CmEvent::ConnectResponse`] (and the caller's QP in RTS).
    pub fn establish(&self, id: CommId) -> Result<()> {
        self.ch.establish(id)
    }

    /// `rdma_init_qp_attr`: the attributes that take connection `id`'s QP to `state`
    /// (INIT, RTR or RTS) as the exchange decided them, and which of them to apply. RTR
    /// and RTS need the request (passive side) or the answer (active side).
    pub fn init_qp_attr(&self, id: CommId, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        self.ch.init_qp_attr(id, state)
    }

    /// Refuse request `id`: `rdma_reject` with [`RejectReason::CONSUMER_DEFINED`] (28),
    /// `rdma_reject_ece` with [`RejectReason::VENDOR_OPTION_NOT_SUPPORTED`] (35); no other
    /// reason is a consumer's to give (`EINVAL`).
    pub fn reject(&self, id: CommId, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        self.ch.reject(id, reason, private_data)
    }

    /// `rdma_disconnect`: close connection `id` (its QP to ERR, then a DREQ);
    /// [`CmEvent::Disconnected`] follows.
    pub fn disconnect(&self, id: CommId, private_data: &[u8]) -> Result<()> {
        self.ch.disconnect(id, private_data)
    }

    /// `rdma_destroy_id`: let go of connection `id` in whatever state (the peer is told if
    /// it is still up); no event for it follows. Call it before destroying its QP.
    pub fn destroy_id(&self, id: CommId) -> Result<()> {
        self.ch.destroy_id(id)
    }
}

/// A device the host daemon serves, as [`daemon_devices`] lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DaemonDeviceInfo {
    /// The daemon's name for it (`srxe0`...).
    pub name: String,
    /// Its addresses, in GID table order (open it with [`Device::builder`] on one of them).
    pub addrs: Vec<IpAddr>,
    /// The UDP port it receives RoCEv2 on.
    pub port: u16,
}

/// The devices of the host daemon at `$SOFTRDMA_DAEMON_SOCKET` (default
/// `/run/softrdma/softrdmad.sock`), in the daemon's order. When no daemon answers, one is
/// started as [`crate::DeviceBuilder::open`] would (`$SOFTRDMA_DAEMON_SPAWN`,
/// `$SOFTRDMA_DAEMON_ARGS`), from `daemon_binary` if given, else as
/// [`crate::DeviceBuilder::daemon_binary`] describes.
pub fn daemon_devices(daemon_binary: Option<&Path>) -> Result<Vec<DaemonDeviceInfo>> {
    let socket = abi::client::socket_path();
    let mut client = match abi::client::Client::connect(&socket) {
        Ok(c) => c,
        Err(first) => {
            // Opening a device starts the daemon (if allowed) and waits for its socket.
            let mut b = Device::builder(std::net::Ipv4Addr::UNSPECIFIED.into())
                .any_daemon_device()
                .backend(BackendKind::Daemon);
            if let Some(bin) = daemon_binary {
                b = b.daemon_binary(bin);
            }
            let dev = b.open()?;
            drop(dev);
            abi::client::Client::connect(&socket).map_err(|e| Error::NoDaemon {
                socket: socket.clone(),
                reason: format!("{first}; after starting it: {e}"),
            })?
        }
    };
    Ok(client
        .list_devices()?
        .into_iter()
        .map(|d| DaemonDeviceInfo {
            name: d.name,
            addrs: d.addrs,
            port: d.port,
        })
        .collect())
}

/// The node GUID (host order) the verbs interface shows for a device on `addr` receiving on
/// UDP `port`: "SR", then the port, then the low 32 bits of the address, as an EUI-64 is
/// made from a MAC. Stable across restarts and distinct for the devices of a host; the
/// engine has no GUID of its own to offer. What `ibv_query_device` and
/// `/sys/class/infiniband/<dev>/node_guid` (under `softrdma exec`) must agree on.
pub fn node_guid(addr: IpAddr, port: u16) -> u64 {
    let low = match addr {
        IpAddr::V4(a) => u64::from(u32::from(a)),
        IpAddr::V6(a) => (u128::from(a) as u64) & 0xffff_ffff,
    };
    0x5352_0000_0000_0000 | (u64::from(port) << 32) | low
}

/// What `ibv_query_port` says about a port's link beyond [`crate::PortAttr`]. A soft port
/// has no physical link to measure: these are the figures the drop-in libibverbs reports
/// (4X EDR, 100 Gb/s; rxe's capability flags), decided here once for every layer that
/// shows them (the drop-in's queries, the sysfs view of `softrdma exec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortLink {
    /// `active_width`: `IB_WIDTH_4X` (2).
    pub active_width: u8,
    /// `active_speed`: `IB_SPEED_EDR` (32), 25 Gb/s per lane.
    pub active_speed: u8,
    /// `phys_state`: 5 (LinkUp) on an active port, 3 (Disabled) on a down one.
    pub phys_state: u8,
    /// `port_cap_flags`: `IBV_PORT_CM_SUP | IBV_PORT_IP_BASED_GIDS`.
    pub cap_flags: u32,
}

impl PortLink {
    /// The link figures of a port in `state`.
    pub fn of(state: engine::PortState) -> PortLink {
        PortLink {
            active_width: 2,
            active_speed: 32,
            phys_state: match state {
                engine::PortState::Active => 5,
                _ => 3,
            },
            cap_flags: (1 << 16) | (1 << 26),
        }
    }
}

impl Device {
    /// The handle-level verbs of this device, for FFI layers (see [`crate::raw`]).
    pub fn raw(&self) -> RawDevice<'_> {
        RawDevice {
            provider: self.provider(),
        }
    }
}

impl RawDevice<'_> {
    /// Which backend the device runs on.
    pub fn kind(&self) -> BackendKind {
        self.provider.kind()
    }

    /// A new protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<PdHandle> {
        self.provider.alloc_pd()
    }

    /// Free a protection domain (`ibv_dealloc_pd`); refused while objects use it.
    pub fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        self.provider.dealloc_pd(pd)
    }

    /// Register `len` bytes at `addr` in `pd` (`ibv_reg_mr`).
    ///
    /// # Safety
    ///
    /// From the moment this returns until [`RawDevice::dereg_mr`] of the region succeeds
    /// (or the device is closed), `addr..addr + len` must stay allocated and mapped, and
    /// the caller must accept that the device reads and writes it at any time, from
    /// another thread (embedded) or another process (`process_vm_writev` from the daemon),
    /// as a NIC's DMA would: the bytes may change under any reference the caller holds, so
    /// the caller must not hold Rust references to that memory across those accesses (C
    /// callers, who only use raw pointers and volatile-free loads of their own choosing,
    /// are in the position verbs has always put them in). If deregistration fails, the
    /// memory must be treated as still registered.
    #[allow(unsafe_code)]
    pub unsafe fn reg_mr(
        &self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr> {
        // SAFETY: this function's contract is the one Provider::reg_mr asks for.
        unsafe { self.provider.reg_mr(pd, addr, len, access) }
    }

    /// Change a region in place (`ibv_rereg_mr`): `CHANGE_TRANSLATION` makes it cover
    /// `len` bytes at `addr` (the old range is no longer reached once this returns),
    /// `CHANGE_PD` moves it to `pd`, `CHANGE_ACCESS` gives it `access`. The handle and keys
    /// stay (the returned region says so). On failure nothing changed.
    ///
    /// # Safety
    ///
    /// With `CHANGE_TRANSLATION`, the new range meets [`RawDevice::reg_mr`]'s contract.
    #[allow(unsafe_code)]
    pub unsafe fn rereg_mr(
        &self,
        mr: MrHandle,
        flags: engine::ReregFlags,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr> {
        // SAFETY: this function's contract is the one Provider::rereg_mr asks for.
        unsafe { self.provider.rereg_mr(mr, flags, pd, addr, len, access) }
    }

    /// Deregister a region (`ibv_dereg_mr`): once this returns `Ok`, the device never touches
    /// its memory again.
    pub fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        self.provider.dereg_mr(mr)
    }

    /// A completion queue with room for `depth` completions (`ibv_create_cq`).
    pub fn create_cq(&self, depth: u32) -> Result<RawCq> {
        Ok(RawCq {
            cq: self.provider.create_cq(depth)?,
        })
    }

    /// A connection-manager channel on this device (see [`RawCmChannel`]).
    pub fn cm_channel(&self) -> Result<RawCmChannel> {
        Ok(RawCmChannel {
            ch: self.provider.cm_channel()?,
        })
    }

    /// Destroy a CQ (`ibv_destroy_cq`); refused while QPs use it. Drop the [`RawCq`] after.
    pub fn destroy_cq(&self, cq: &RawCq) -> Result<()> {
        self.provider.destroy_cq(cq.handle())
    }

    /// Up to `max` completions, oldest first (`ibv_poll_cq`); never blocks (on the daemon it
    /// reads the CQ's shared-memory ring with no system call).
    pub fn poll_cq(&self, cq: &RawCq, max: usize) -> Result<Vec<WorkCompletion>> {
        self.provider.poll_cq(&*cq.cq, max)
    }

    /// Completions into `out`, oldest first, as many as wait and fit; returns how many.
    /// Allocates nothing (on the daemon the completions are read from the CQ's ring).
    pub fn poll_cq_into(&self, cq: &RawCq, out: &mut [WorkCompletion]) -> Result<usize> {
        self.provider.poll_cq_into(&*cq.cq, out)
    }

    /// Room for `cqe` completions from now on (`ibv_resize_cq`); returns the size the CQ
    /// has now. Refused (EINVAL) while more completions than that wait in it.
    pub fn resize_cq(&self, cq: &RawCq, cqe: u32) -> Result<u32> {
        cq.cq.resize(cqe)
    }

    /// Completions waiting in the CQ.
    pub fn cq_len(&self, cq: &RawCq) -> Result<usize> {
        cq.cq.len()
    }

    /// Ask for one notification on [`RawCq::event_fd`] at the next completion
    /// (`ibv_req_notify_cq`; `solicited_only`: only for solicited ones and errors).
    pub fn arm_cq(&self, cq: &RawCq, solicited_only: bool) -> Result<()> {
        cq.cq.arm(solicited_only)
    }

    /// Sleep until the CQ has a completion or `timeout` passes (arms the CQ on the daemon
    /// backend, so a CQ whose events a program consumes may see an extra one).
    pub fn wait_cq(&self, cq: &RawCq, timeout: Option<Duration>) -> Result<()> {
        cq.cq.wait(timeout)
    }

    /// A new QP in RESET (`ibv_create_qp`), fed by `srq` if given.
    pub fn create_qp(&self, init: &QpInitAttr, srq: Option<SrqHandle>) -> Result<RawQp> {
        self.provider.create_qp(init, srq)
    }

    /// Destroy a QP (`ibv_destroy_qp`).
    pub fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        self.provider.destroy_qp(qp)
    }

    /// Change the QP's attributes named by `mask` (`ibv_modify_qp`).
    pub fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.provider.modify_qp(qp, attr, mask)
    }

    /// Every attribute of the QP (`ibv_query_qp`).
    pub fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        self.provider.query_qp(qp)
    }

    /// `ibv_attach_mcast`: UD QP `qp` receives what is sent to group `gid`.
    pub fn attach_mcast(&self, qp: QpHandle, gid: Gid) -> Result<()> {
        self.provider.attach_mcast(qp, gid)
    }

    /// `ibv_detach_mcast`.
    pub fn detach_mcast(&self, qp: QpHandle, gid: Gid) -> Result<()> {
        self.provider.detach_mcast(qp, gid)
    }

    /// Post one send work request on a connected QP (`ibv_post_send`).
    pub fn post_send(&self, qp: QpHandle, wr: SendWr) -> Result<()> {
        self.provider.post_send(qp, wr)
    }

    /// Post one send work request on a UD QP to `dest` (`ibv_post_send` with `wr.ud`).
    pub fn post_send_ud(&self, qp: QpHandle, wr: SendWr, dest: UdDest) -> Result<()> {
        self.provider.post_send_ud(qp, wr, dest)
    }

    /// Post one receive work request (`ibv_post_recv`).
    pub fn post_recv(&self, qp: QpHandle, wr: RecvWr) -> Result<()> {
        self.provider.post_recv(qp, wr)
    }

    /// A shared receive queue (`ibv_create_srq`).
    pub fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle> {
        self.provider.create_srq(pd, attr)
    }

    /// Destroy an SRQ (`ibv_destroy_srq`).
    pub fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        self.provider.destroy_srq(srq)
    }

    /// Post one receive work request to an SRQ (`ibv_post_srq_recv`).
    pub fn post_srq_recv(&self, srq: SrqHandle, wr: RecvWr) -> Result<()> {
        self.provider.post_srq_recv(srq, wr)
    }

    /// Resize an SRQ or arm its limit (`ibv_modify_srq`).
    pub fn modify_srq(&self, srq: SrqHandle, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        self.provider.modify_srq(srq, attr, mask)
    }

    /// An SRQ's size and limit (`ibv_query_srq`).
    pub fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        self.provider.query_srq(srq)
    }

    /// An address handle for UD sends (`ibv_create_ah`).
    pub fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        self.provider.create_ah(pd, attr)
    }

    /// Destroy an address handle (`ibv_destroy_ah`).
    pub fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        self.provider.destroy_ah(ah)
    }

    /// A memory window (`ibv_alloc_mw`); returns its handle and first rkey.
    pub fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> Result<(MwHandle, Rkey)> {
        self.provider.alloc_mw(pd, mw_type)
    }

    /// Free a memory window (`ibv_dealloc_mw`).
    pub fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        self.provider.dealloc_mw(mw)
    }

    /// A window's current rkey and whether it is bound.
    pub fn query_mw(&self, mw: MwHandle) -> Result<(Rkey, bool)> {
        self.provider.query_mw(mw)
    }

    /// Bind a type 1 window through QP `qp` (`ibv_bind_mw`); returns the rkey it will have.
    pub fn bind_mw(
        &self,
        qp: QpHandle,
        wr_id: u64,
        mw: MwHandle,
        bind: MwBind,
        signaled: bool,
    ) -> Result<Rkey> {
        self.provider.bind_mw(qp, wr_id, mw, bind, signaled)
    }

    /// The next asynchronous event, without blocking (`ibv_get_async_event` on a
    /// non-blocking `async_fd`). Events name QPs by QPN, CQs and SRQs by handle.
    pub fn async_event(&self) -> Result<Option<AsyncEvent>> {
        self.provider.async_event()
    }

    /// Sleep until an asynchronous event may be there, at most `timeout` (wakeups can be
    /// spurious: take events with [`RawDevice::async_event`]).
    pub fn wait_async_event(&self, timeout: Option<Duration>) -> Result<()> {
        self.provider.wait_async_event(timeout)
    }
}
