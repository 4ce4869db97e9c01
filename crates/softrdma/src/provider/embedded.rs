//! The embedded provider: the engine hosted by a [`Runtime`] in this process, on its own
//! UDP socket. Every verb is the engine's, under the runtime's lock; a QP's handle is its
//! number.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Weak};
use std::time::Duration;

use engine::{
    AccessFlags, AhAttr, AhHandle, AsyncEvent, CqHandle, DeviceAttr, Gid, MrHandle, MwBind,
    MwHandle, MwType, PdHandle, PortAttr, QpAttr, QpAttrMask, QpInitAttr, QpState, RecvWr,
    ReregFlags, SendWr, SrqAttr, SrqAttrMask, SrqHandle, UdDest, WorkCompletion,
};
use runtime::{CmChannel, CmEvent, CommId, ConnParam, CqNotifier, EngineGuard, Runtime};
use wire::{RejectReason, ServiceId};

use super::{
    device_closed, BackendKind, Provider, ProviderCmChannel, ProviderCq, QpHandle, Qpn, RawMr,
    RawQp, Rkey,
};
use crate::Result;

/// Sends of at most this many bytes (a packet or a few) may wait for the next pump, to
/// leave with the posts that follow ([`EngineGuard::hold_transmit`]); a larger message's
/// packets already share their system calls (GSO trains).
const HOLD_BYTES: u64 = 4096;

/// The embedded engine of one open device.
#[derive(Debug)]
pub(crate) struct Embedded {
    /// Its CQs poll and wait through it (with a weak reference: a CQ a C program leaves
    /// behind does not keep the engine, its thread and its socket, after the device closed).
    rt: Arc<Runtime>,
    /// What this device's registrations are named by in `crate::mr::Registry`. After `rt`:
    /// they are forgotten once the engine's thread has stopped.
    serial: crate::mr::DeviceSerial,
}

impl Embedded {
    /// The provider over a started runtime.
    pub(crate) fn new(rt: Runtime) -> Embedded {
        Embedded {
            rt: Arc::new(rt),
            serial: crate::mr::DeviceSerial::new(),
        }
    }
}

/// The engine names its QPs by number: that number is the handle.
fn qpn(qp: QpHandle) -> u32 {
    qp.0
}

/// A region's keys as the engine hands them out.
fn raw_mr(k: engine::MrKeys) -> RawMr {
    RawMr {
        handle: k.handle,
        lkey: k.lkey,
        rkey: k.rkey,
    }
}

impl Provider for Embedded {
    fn kind(&self) -> BackendKind {
        BackendKind::Embedded
    }

    fn runtime(&self) -> Option<&Runtime> {
        Some(&self.rt)
    }

    fn lock_out(&self) -> Option<EngineGuard<'_>> {
        Some(self.rt.lock())
    }

    fn local_addr(&self) -> SocketAddr {
        self.rt.local_addr()
    }

    fn query_device(&self) -> DeviceAttr {
        self.rt.lock().query_device()
    }

    fn query_port(&self) -> Result<PortAttr> {
        Ok(self.rt.lock().query_port(1)?)
    }

    fn gid(&self, index: u32) -> Result<Gid> {
        Ok(self.rt.lock().query_gid(1, index)?)
    }

    fn gids(&self) -> Vec<Gid> {
        let e = self.rt.lock();
        (0..).map_while(|i| e.query_gid(1, i).ok()).collect()
    }

    fn counters(&self) -> Result<engine::Counters> {
        Ok(self.rt.lock().counters().clone())
    }

    fn counter_values(&self) -> Result<Vec<(String, u64)>> {
        let mut v: Vec<(String, u64)> = self
            .rt
            .lock()
            .counters()
            .iter()
            .map(|(c, n)| (c.name().to_string(), n))
            .collect();
        // The connection manager's, under the names the daemon shows them by.
        v.extend(
            self.rt
                .cm_counters()
                .named()
                .into_iter()
                .map(|(name, n)| (name.to_string(), n)),
        );
        Ok(v)
    }

    fn poll_progress(&self) -> usize {
        self.rt.poll_progress()
    }

    fn async_event(&self) -> Result<Option<AsyncEvent>> {
        Ok(self.rt.get_async_event())
    }

    fn wait_async_event(&self, timeout: Option<Duration>) -> Result<()> {
        Ok(runtime::wait_readable(self.rt.async_event_fd(), timeout)?)
    }

    fn async_event_fd(&self) -> BorrowedFd<'_> {
        self.rt.async_event_fd()
    }

    fn alloc_pd(&self) -> Result<PdHandle> {
        Ok(self.rt.lock().alloc_pd()?)
    }

    fn dealloc_pd(&self, pd: PdHandle) -> Result<()> {
        Ok(self.rt.lock().dealloc_pd(pd)?)
    }

    #[allow(unsafe_code)]
    unsafe fn reg_mr(
        &self,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr> {
        // Recorded so that no adoption copies pages this device may write.
        let mut registry = crate::mr::registry();
        // SAFETY: forwarded from this function's contract.
        let k = unsafe { self.rt.lock().reg_mr(pd, addr, len, access)? };
        registry.registered(self.serial.get(), k.handle.0, addr as usize, len, None);
        Ok(raw_mr(k))
    }

    #[allow(unsafe_code)]
    unsafe fn rereg_mr(
        &self,
        mr: MrHandle,
        flags: ReregFlags,
        pd: PdHandle,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMr> {
        let mut registry = crate::mr::registry();
        // SAFETY: forwarded from this function's contract.
        let k = unsafe { self.rt.lock().rereg_mr(mr, flags, pd, addr, len, access)? };
        if flags.contains(ReregFlags::CHANGE_TRANSLATION) {
            registry.registered(self.serial.get(), mr.0, addr as usize, len, None);
        }
        Ok(raw_mr(k))
    }

    fn dereg_mr(&self, mr: MrHandle) -> Result<()> {
        self.rt.lock().dereg_mr(mr)?;
        crate::mr::registry().deregistered(self.serial.get(), mr.0);
        Ok(())
    }

    fn create_cq(&self, depth: u32) -> Result<Box<dyn ProviderCq>> {
        let handle = self.rt.lock().create_cq(depth)?;
        match self.rt.cq_notifier(handle) {
            Ok(notifier) => Ok(Box::new(EmbeddedCq {
                rt: Arc::downgrade(&self.rt),
                handle,
                notifier,
            })),
            Err(e) => {
                let _ = self.rt.lock().destroy_cq(handle);
                Err(e.into())
            }
        }
    }

    fn destroy_cq(&self, cq: CqHandle) -> Result<()> {
        Ok(self.rt.lock().destroy_cq(cq)?)
    }

    fn create_qp(&self, init: &QpInitAttr, srq: Option<SrqHandle>) -> Result<RawQp> {
        let qpn = match srq {
            Some(s) => self.rt.lock().create_qp_with_srq(init, s)?,
            None => self.rt.lock().create_qp(init)?,
        };
        Ok(RawQp {
            handle: QpHandle(qpn),
            qpn: Qpn::new(qpn),
        })
    }

    fn destroy_qp(&self, qp: QpHandle) -> Result<()> {
        Ok(self.rt.lock().destroy_qp(qpn(qp))?)
    }

    fn modify_qp(&self, qp: QpHandle, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        Ok(self.rt.lock().modify_qp(qpn(qp), attr, mask)?)
    }

    fn query_qp(&self, qp: QpHandle) -> Result<QpAttr> {
        Ok(self.rt.lock().query_qp(qpn(qp))?)
    }

    fn attach_mcast(&self, qp: QpHandle, gid: Gid) -> Result<()> {
        Ok(self.rt.lock().attach_mcast(qpn(qp), gid)?)
    }

    fn detach_mcast(&self, qp: QpHandle, gid: Gid) -> Result<()> {
        Ok(self.rt.lock().detach_mcast(qpn(qp), gid)?)
    }

    fn post_send(&self, qp: QpHandle, wr: SendWr) -> Result<()> {
        let mut g = self.rt.lock();
        let small = wr.payload.len() <= HOLD_BYTES;
        g.post_send(qpn(qp), wr)?;
        if small {
            g.hold_transmit();
        }
        Ok(())
    }

    fn post_send_ud(&self, qp: QpHandle, wr: SendWr, dest: UdDest) -> Result<()> {
        let mut g = self.rt.lock();
        let small = wr.payload.len() <= HOLD_BYTES;
        g.post_send_ud(qpn(qp), wr, dest)?;
        if small {
            g.hold_transmit();
        }
        Ok(())
    }

    fn post_recv(&self, qp: QpHandle, wr: RecvWr) -> Result<()> {
        Ok(self.rt.lock().post_recv(qpn(qp), wr)?)
    }

    fn create_srq(&self, pd: PdHandle, attr: &SrqAttr) -> Result<SrqHandle> {
        Ok(self.rt.lock().create_srq(pd, attr)?)
    }

    fn destroy_srq(&self, srq: SrqHandle) -> Result<()> {
        Ok(self.rt.lock().destroy_srq(srq)?)
    }

    fn post_srq_recv(&self, srq: SrqHandle, wr: RecvWr) -> Result<()> {
        Ok(self.rt.lock().post_srq_recv(srq, wr)?)
    }

    fn modify_srq(&self, srq: SrqHandle, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        Ok(self.rt.lock().modify_srq(srq, attr, mask)?)
    }

    fn query_srq(&self, srq: SrqHandle) -> Result<SrqAttr> {
        Ok(self.rt.lock().query_srq(srq)?)
    }

    fn srq_len(&self, srq: SrqHandle) -> Result<usize> {
        Ok(self.rt.lock().srq_len(srq)?)
    }

    fn create_ah(&self, pd: PdHandle, attr: &AhAttr) -> Result<AhHandle> {
        Ok(self.rt.lock().create_ah(pd, attr)?)
    }

    fn destroy_ah(&self, ah: AhHandle) -> Result<()> {
        Ok(self.rt.lock().destroy_ah(ah)?)
    }

    fn alloc_mw(&self, pd: PdHandle, mw_type: MwType) -> Result<(MwHandle, Rkey)> {
        let k = self.rt.lock().alloc_mw(pd, mw_type)?;
        Ok((k.handle, k.rkey))
    }

    fn dealloc_mw(&self, mw: MwHandle) -> Result<()> {
        Ok(self.rt.lock().dealloc_mw(mw)?)
    }

    fn query_mw(&self, mw: MwHandle) -> Result<(Rkey, bool)> {
        let (rkey, bound) = self.rt.lock().query_mw(mw)?;
        Ok((rkey, bound))
    }

    fn cm_channel(&self) -> Result<Box<dyn ProviderCmChannel>> {
        Ok(Box::new(EmbeddedCmChannel {
            rt: Arc::downgrade(&self.rt),
            ch: CmChannel::new()?,
        }))
    }

    fn bind_mw(
        &self,
        qp: QpHandle,
        wr_id: u64,
        mw: MwHandle,
        bind: MwBind,
        signaled: bool,
    ) -> Result<Rkey> {
        let rkey = self.rt.lock().bind_mw(qpn(qp), wr_id, mw, bind, signaled)?;
        Ok(rkey)
    }
}

/// A CQ of the embedded engine, with the runtime's notifier for it.
#[derive(Debug)]
struct EmbeddedCq {
    rt: Weak<Runtime>,
    handle: CqHandle,
    notifier: Arc<CqNotifier>,
}

impl EmbeddedCq {
    /// The runtime, while the device is open.
    fn rt(&self) -> Result<Arc<Runtime>> {
        self.rt.upgrade().ok_or_else(device_closed)
    }
}

impl ProviderCq for EmbeddedCq {
    fn handle(&self) -> CqHandle {
        self.handle
    }

    fn take(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        Ok(self.rt()?.lock().poll_cq_into(self.handle, out)?)
    }

    fn len(&self) -> Result<usize> {
        Ok(self.rt()?.lock().cq_len(self.handle)?)
    }

    fn resize(&self, cqe: u32) -> Result<u32> {
        Ok(self.rt()?.lock().resize_cq(self.handle, cqe)?)
    }

    fn arm(&self, solicited_only: bool) -> Result<()> {
        Ok(self.rt()?.arm_cq_with(self.handle, solicited_only)?)
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        self.rt()?.wait_cq(self.handle, timeout)?;
        Ok(())
    }

    fn event_fd(&self) -> BorrowedFd<'_> {
        self.notifier.as_fd()
    }

    fn clear_event(&self) -> bool {
        self.notifier.clear()
    }
}

/// A CM channel of the embedded device: the runtime's own.
#[derive(Debug)]
struct EmbeddedCmChannel {
    /// Weak, as a CQ's: a channel left behind does not keep the device.
    rt: Weak<Runtime>,
    ch: CmChannel,
}

impl EmbeddedCmChannel {
    fn rt(&self) -> Result<Arc<Runtime>> {
        self.rt.upgrade().ok_or_else(device_closed)
    }
}

impl ProviderCmChannel for EmbeddedCmChannel {
    fn fd(&self) -> BorrowedFd<'_> {
        self.ch.as_fd()
    }

    fn get_event(&self) -> Result<Option<CmEvent>> {
        Ok(self.ch.get_event())
    }

    fn listen(&self, service_id: ServiceId) -> Result<()> {
        Ok(self.rt()?.lock().cm_listen(&self.ch, service_id)?)
    }

    fn unlisten(&self, service_id: ServiceId) -> Result<()> {
        self.rt()?.lock().cm_unlisten(&self.ch, service_id);
        Ok(())
    }

    fn connect(
        &self,
        qp: Option<QpHandle>,
        peer: IpAddr,
        service_id: ServiceId,
        param: &ConnParam,
    ) -> Result<CommId> {
        let rt = self.rt()?;
        let id = rt
            .lock()
            .cm_connect(&self.ch, qp.map(qpn), peer, service_id, param)?;
        Ok(id)
    }

    fn resolve(&self, peer: IpAddr, service_id: ServiceId, param: &ConnParam) -> Result<CommId> {
        let rt = self.rt()?;
        let id = rt.lock().cm_resolve(&self.ch, peer, service_id, param)?;
        Ok(id)
    }

    fn accept(&self, id: CommId, qp: Option<QpHandle>, param: &ConnParam) -> Result<()> {
        Ok(self
            .rt()?
            .lock()
            .cm_accept(&self.ch, id, qp.map(qpn), param)?)
    }

    fn establish(&self, id: CommId) -> Result<()> {
        Ok(self.rt()?.lock().cm_establish(&self.ch, id)?)
    }

    fn init_qp_attr(&self, id: CommId, state: QpState) -> Result<(QpAttr, QpAttrMask)> {
        Ok(self.rt()?.lock().cm_init_qp_attr(&self.ch, id, state)?)
    }

    fn reject(&self, id: CommId, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        Ok(self
            .rt()?
            .lock()
            .cm_reject(&self.ch, id, reason, private_data)?)
    }

    fn disconnect(&self, id: CommId, private_data: &[u8]) -> Result<()> {
        Ok(self
            .rt()?
            .lock()
            .cm_disconnect(&self.ch, id, private_data)?)
    }

    fn destroy_id(&self, id: CommId) -> Result<()> {
        match self.rt()?.lock().cm_destroy_id(&self.ch, id) {
            Ok(()) | Err(runtime::RuntimeError::Cm(runtime::CmError::UnknownId(_))) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

impl Drop for EmbeddedCmChannel {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.upgrade() {
            rt.lock().cm_close_channel(&self.ch);
        }
    }
}
