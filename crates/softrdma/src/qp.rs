//! Protection domains and queue pairs: the builder that walks RESET → INIT, and `connect`,
//! which walks INIT → RTR → RTS with sensible defaults.

use std::sync::Arc;

use engine::{
    AccessFlags, AhAttr, PdHandle, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr,
    SendOp, SendWr, Sge, VerbsError,
};

use engine::qp_attr::Mtu;

use crate::cq::Cq;
use crate::device::Device;
use crate::handshake::{Endpoint, RemoteMr};
use crate::mr::{MemoryRegion, RawMemoryRegion, RegisterableBuffer};
use crate::provider::{Provider, QpHandle, Qpn, RawQp};
use crate::ud::{AddressHandle, Srq};
use crate::{Error, Result};

/// A protection domain (`ibv_pd`): MRs and QPs in one PD may be used together. Cheap to
/// clone; deallocated when the last clone and everything made in it are gone.
#[derive(Clone, Debug)]
pub struct Pd {
    inner: Arc<PdInner>,
}

#[derive(Debug)]
struct PdInner {
    dev: Device,
    handle: PdHandle,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        if let Err(e) = self.dev.provider().dealloc_pd(self.handle) {
            tracing::warn!(error = %e, "dealloc_pd failed");
        }
    }
}

impl Pd {
    pub(crate) fn new(dev: Device, handle: PdHandle) -> Pd {
        Pd {
            inner: Arc::new(PdInner { dev, handle }),
        }
    }

    pub(crate) fn handle(&self) -> PdHandle {
        self.inner.handle
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// Register `buf` with `access` (`ibv_reg_mr`); the region owns it until
    /// [`MemoryRegion::into_inner`]. Remote write or atomic access requires
    /// `LOCAL_WRITE` too.
    pub fn register<B: RegisterableBuffer>(
        &self,
        buf: B,
        access: AccessFlags,
    ) -> Result<MemoryRegion<B>> {
        MemoryRegion::new(self, buf, access)
    }

    /// Register memory this crate cannot own (for FFI and shared mappings).
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must stay valid for reads and writes until the returned region is
    /// dropped, and must not be accessed through Rust references while the device may touch
    /// it (outstanding receives, READ/ATOMIC results, or peers holding the rkey with remote
    /// write or atomic access).
    #[allow(unsafe_code)]
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<RawMemoryRegion> {
        // SAFETY: the caller's contract is the one `RawMemoryRegion::new` needs.
        unsafe { RawMemoryRegion::new(self, addr, len, access) }
    }

    /// A shared receive queue holding up to `max_wr` receive WRs of up to `max_sge` SGEs
    /// (`ibv_create_srq`).
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<Srq> {
        Srq::new(self, max_wr, max_sge)
    }

    /// An address handle to the port with `gid` (`ibv_create_ah`), for UD sends.
    pub fn create_ah(&self, gid: engine::Gid) -> Result<AddressHandle> {
        AddressHandle::new(self, &AddressHandle::attr_to(gid))
    }

    /// An address handle from a full address vector (source GID index, hop limit, traffic
    /// class, flow label).
    pub fn create_ah_with(&self, attr: &AhAttr) -> Result<AddressHandle> {
        AddressHandle::new(self, attr)
    }

    /// Start building an RC queue pair with these CQs.
    pub fn qp_builder(&self, send_cq: &Cq, recv_cq: &Cq) -> QpBuilder {
        QpBuilder {
            pd: self.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
            qp_type: QpType::Rc,
            cap: QpCap {
                max_send_wr: 128,
                max_recv_wr: 128,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            sq_sig_all: false,
            srq: None,
            qkey: DEFAULT_QKEY,
        }
    }
}

/// The Q_Key a UD QP gets unless [`QpBuilder::qkey`] says otherwise (the value the
/// rdma-core examples use).
pub const DEFAULT_QKEY: u32 = 0x1111_1111;

/// Builds a QP (`ibv_create_qp`) and moves it to INIT.
#[derive(Debug, Clone)]
pub struct QpBuilder {
    pd: Pd,
    send_cq: Cq,
    recv_cq: Cq,
    qp_type: QpType,
    cap: QpCap,
    access: AccessFlags,
    sq_sig_all: bool,
    srq: Option<Srq>,
    qkey: u32,
}

impl QpBuilder {
    /// Take receive WRs from `srq` instead of the QP's own receive queue.
    pub fn srq(mut self, srq: &Srq) -> Self {
        self.srq = Some(srq.clone());
        self
    }

    /// The Q_Key of a UD QP (default [`DEFAULT_QKEY`]).
    pub fn qkey(mut self, qkey: u32) -> Self {
        self.qkey = qkey;
        self
    }

    /// Transport service (default RC). A UD QP is moved all the way to RTS by
    /// [`QpBuilder::build`] (it needs no peer); UC is connected like RC, with
    /// [`Qp::handshake`] or [`Qp::connect`].
    pub fn qp_type(mut self, t: QpType) -> Self {
        self.qp_type = t;
        self
    }

    /// Send queue depth (default 128).
    pub fn max_send_wr(mut self, n: u32) -> Self {
        self.cap.max_send_wr = n;
        self
    }

    /// Receive queue depth (default 128).
    pub fn max_recv_wr(mut self, n: u32) -> Self {
        self.cap.max_recv_wr = n;
        self
    }

    /// SGEs per send WR (default 4).
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.cap.max_send_sge = n;
        self
    }

    /// SGEs per receive WR (default 4).
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.cap.max_recv_sge = n;
        self
    }

    /// Inline bytes per send WR (default 64).
    pub fn max_inline_data(mut self, n: u32) -> Self {
        self.cap.max_inline_data = n;
        self
    }

    /// Remote operations the QP accepts as responder (default: write, read, atomic).
    pub fn access(mut self, access: AccessFlags) -> Self {
        self.access = access;
        self
    }

    /// Signal every send WR, ignoring `SendFlags::SIGNALED` (default false).
    pub fn sq_sig_all(mut self, on: bool) -> Self {
        self.sq_sig_all = on;
        self
    }

    /// Create the QP and move it RESET → INIT (port 1, P_Key index 0, the access flags).
    pub fn build(self) -> Result<Qp> {
        // Handles mean something only on the device that made them: another device's CQ or
        // SRQ would name an unrelated one of this device (or a daemon connection's).
        let dev = self.pd.device();
        if !dev.same(&self.send_cq.inner.dev) || !dev.same(&self.recv_cq.inner.dev) {
            return Err(Error::Verbs(VerbsError::InvalidCq));
        }
        if self
            .srq
            .as_ref()
            .is_some_and(|s| !dev.same(s.pd().device()))
        {
            return Err(Error::Verbs(VerbsError::InvalidSrq));
        }
        let init = QpInitAttr {
            pd: self.pd.handle(),
            send_cq: self.send_cq.handle(),
            recv_cq: self.recv_cq.handle(),
            cap: self.cap,
            qp_type: self.qp_type,
            sq_sig_all: self.sq_sig_all,
        };
        let raw = self
            .pd
            .device()
            .provider()
            .create_qp(&init, self.srq.as_ref().map(|s| s.inner.handle))?;
        let qp = Qp {
            inner: Arc::new(QpInner {
                pd: self.pd.clone(),
                _send_cq: self.send_cq,
                _recv_cq: self.recv_cq,
                _srq: self.srq,
                raw,
                psn: initial_psn(raw.qpn.value()),
            }),
        };
        if self.qp_type == QpType::Ud {
            qp.ready_ud(self.qkey)?;
            return Ok(qp);
        }
        let attr = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qp_access_flags: self.access,
            ..QpAttr::default()
        };
        qp.modify(
            &attr,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )?;
        Ok(qp)
    }
}

/// A random-looking 24-bit starting PSN (IBA recommends unpredictable ones).
fn initial_psn(qpn: u32) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(qpn);
    (h.finish() as u32) & 0x00ff_ffff
}

/// The transport parameters [`Qp::connect_with`] sets; the defaults suit most programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectOptions {
    /// Local ACK timeout code: 4.096 µs × 2^timeout (default 14, about 67 ms).
    pub timeout: u8,
    /// Transport retries (default 7).
    pub retry_cnt: u8,
    /// RNR retries; 7 means forever (default 7).
    pub rnr_retry: u8,
    /// RNR NAK timer code advertised to the peer (default 12, 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding READ/ATOMIC as requester (default 16).
    pub max_rd_atomic: u8,
    /// READ/ATOMIC resources as responder (default 16).
    pub max_dest_rd_atomic: u8,
    /// Largest path MTU to use; the smaller of this, the local port's and the peer's wins
    /// (default 4096).
    pub mtu: Mtu,
    /// Source GID index (default 0).
    pub sgid_index: u8,
    /// IP hop limit / TTL (default 64).
    pub hop_limit: u8,
    /// IP traffic class / TOS (default 0).
    pub traffic_class: u8,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            mtu: Mtu::Mtu4096,
            sgid_index: 0,
            hop_limit: 64,
            traffic_class: 0,
        }
    }
}

/// A queue pair (`ibv_qp`). Holds its PD and CQs, so they outlive it; destroyed on drop (its
/// outstanding WRs vanish without completions, as in verbs).
#[derive(Debug)]
pub struct Qp {
    inner: Arc<QpInner>,
}

#[derive(Debug)]
struct QpInner {
    pd: Pd,
    _send_cq: Cq,
    _recv_cq: Cq,
    _srq: Option<Srq>,
    /// Its handle (what the provider names it by) and number.
    raw: RawQp,
    psn: u32,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        if let Err(e) = self.pd.device().provider().destroy_qp(self.raw.handle) {
            tracing::warn!(error = %e, "destroy_qp failed");
        }
    }
}

fn smaller(a: Mtu, b: Mtu) -> Mtu {
    if a.bytes() <= b.bytes() {
        a
    } else {
        b
    }
}

impl Qp {
    fn provider(&self) -> &dyn Provider {
        self.inner.pd.device().provider()
    }

    /// What the provider names this QP by.
    pub(crate) fn handle(&self) -> QpHandle {
        self.inner.raw.handle
    }

    /// RESET → INIT (P_Key index, port, Q_Key) → RTR → RTS (first PSN) for a UD QP.
    fn ready_ud(&self, qkey: u32) -> Result<()> {
        let init = QpAttr {
            qp_state: QpState::Init,
            pkey_index: 0,
            port_num: 1,
            qkey,
            ..QpAttr::default()
        };
        self.modify(
            &init,
            QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
        )?;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        };
        self.modify(&rtr, QpAttrMask::STATE)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.inner.psn,
            ..QpAttr::default()
        };
        self.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
    }

    /// Post a signaled UD SEND of `sges` to QP `remote_qpn` at `ah` ([`Qpn::MULTICAST`] when
    /// `ah` names a multicast group), with `qkey` (one with the high bit set means this QP's
    /// own Q_Key). One packet: at most the path MTU.
    pub fn send_ud(
        &self,
        wr_id: u64,
        sges: &[Sge],
        ah: &AddressHandle,
        remote_qpn: Qpn,
        qkey: u32,
    ) -> Result<()> {
        self.post_send_ud(SendWr::send(wr_id, sges), ah, remote_qpn, qkey)
    }

    /// Post any UD send work request (SEND or SEND with immediate) to `remote_qpn` at `ah`.
    pub fn post_send_ud(
        &self,
        wr: SendWr,
        ah: &AddressHandle,
        remote_qpn: Qpn,
        qkey: u32,
    ) -> Result<()> {
        if !self.inner.pd.device().same(ah.pd().device()) {
            return Err(Error::Verbs(VerbsError::InvalidAh));
        }
        let dest = engine::UdDest {
            ah: ah.handle,
            remote_qpn,
            remote_qkey: qkey,
        };
        self.provider().post_send_ud(self.handle(), wr, dest)
    }

    /// The QP number.
    pub fn qpn(&self) -> Qpn {
        self.inner.raw.qpn
    }

    /// The PSN this QP starts sending with (what the peer's `rq_psn` must be).
    pub fn initial_psn(&self) -> u32 {
        self.inner.psn
    }

    /// The protection domain.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    /// Receive what is sent to multicast group `gid` (`ibv_attach_mcast`; a UD QP only):
    /// each attached QP of the device gets its own copy of a datagram sent to the group
    /// ([`Qpn::MULTICAST`]), Q_Key checked. Groups reach the QPs of this device; on the daemon
    /// that is every process of the host.
    pub fn attach_mcast(&self, gid: engine::Gid) -> Result<()> {
        self.provider().attach_mcast(self.handle(), gid)
    }

    /// Stop receiving group `gid`'s datagrams (`ibv_detach_mcast`).
    pub fn detach_mcast(&self, gid: engine::Gid) -> Result<()> {
        self.provider().detach_mcast(self.handle(), gid)
    }

    /// Current attributes (`ibv_query_qp`).
    pub fn query(&self) -> Result<QpAttr> {
        self.provider().query_qp(self.handle())
    }

    /// Current state.
    pub fn state(&self) -> Result<QpState> {
        Ok(self.query()?.qp_state)
    }

    /// Raw `ibv_modify_qp`: the attributes `mask` selects, checked against the IBA table.
    pub fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.provider().modify_qp(self.handle(), attr, mask)
    }

    /// What the peer needs to connect to this QP (with `mr` advertised if given).
    pub fn endpoint(&self, mr: Option<RemoteMr>) -> Result<Endpoint> {
        let dev = self.inner.pd.device();
        Ok(Endpoint {
            qpn: self.qpn(),
            psn: self.inner.psn,
            gid: dev.gid(0)?,
            mtu: dev.query_port()?.active_mtu,
            mr,
        })
    }

    /// Connect to `remote` with the default [`ConnectOptions`]: INIT → RTR → RTS.
    pub fn connect(&self, remote: &Endpoint) -> Result<()> {
        self.connect_with(remote, &ConnectOptions::default())
    }

    /// Connect to `remote`: INIT → RTR (path, remote QPN and PSN, responder resources) → RTS
    /// (our PSN, timeouts and retries).
    pub fn connect_with(&self, remote: &Endpoint, o: &ConnectOptions) -> Result<()> {
        let port_mtu = self.inner.pd.device().query_port()?.active_mtu;
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: smaller(smaller(o.mtu, port_mtu), remote.mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: o.max_dest_rd_atomic,
            min_rnr_timer: o.min_rnr_timer,
            ah_attr: AhAttr {
                dgid: remote.gid.0,
                sgid_index: o.sgid_index,
                hop_limit: o.hop_limit,
                traffic_class: o.traffic_class,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        self.modify(
            &rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: self.inner.psn,
            timeout: o.timeout,
            retry_cnt: o.retry_cnt,
            rnr_retry: o.rnr_retry,
            max_rd_atomic: o.max_rd_atomic,
            ..QpAttr::default()
        };
        self.modify(
            &rts,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
    }

    /// Exchange endpoints with the peer over `stream` (see [`crate::handshake`]), connect to
    /// it, and wait until the peer has connected too. Returns the peer's endpoint, with the
    /// memory region it advertised, if any. Both sides call this.
    pub fn handshake<S: std::io::Read + std::io::Write>(
        &self,
        mut stream: S,
        mr: Option<RemoteMr>,
    ) -> Result<Endpoint> {
        let local = self.endpoint(mr)?;
        let remote = crate::handshake::exchange(&mut stream, &local)?;
        self.connect(&remote)?;
        crate::handshake::sync(&mut stream)?;
        Ok(remote)
    }

    /// Move the QP to ERR: outstanding WRs complete with `WrFlushErr`.
    pub fn set_error(&self) -> Result<()> {
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..QpAttr::default()
        };
        self.modify(&attr, QpAttrMask::STATE)
    }

    /// Post a send work request (`ibv_post_send`). On the embedded device its packets leave
    /// before this returns when the send queue is free; on softrdmad it is written into the
    /// QP's work ring, and the daemon takes it from there.
    ///
    /// With `max_send_wr` WRs outstanding (unsignaled ones included) it fails with
    /// [`VerbsError::QueueFull`] (`ENOMEM`). A WR's slot is free again once the completion
    /// of it, or of a later signaled WR, has been polled (on the embedded device already
    /// once it is acknowledged): signal now and then.
    pub fn post_send(&self, wr: SendWr) -> Result<()> {
        self.provider().post_send(self.handle(), wr)
    }

    /// Post a receive work request (`ibv_post_recv`).
    pub fn post_recv(&self, wr: RecvWr) -> Result<()> {
        self.provider().post_recv(self.handle(), wr)
    }

    /// Post a receive of `sges` (scatter list).
    pub fn recv(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.post_recv(RecvWr::new(wr_id, sges))
    }

    /// Post a signaled SEND gathering `sges`.
    pub fn send(&self, wr_id: u64, sges: &[Sge]) -> Result<()> {
        self.post_send(SendWr::send(wr_id, sges))
    }

    /// Post a signaled SEND with immediate data.
    pub fn send_with_imm(&self, wr_id: u64, sges: &[Sge], imm: u32) -> Result<()> {
        self.post_send(SendWr::new(wr_id, SendOp::SendWithImm { imm }, sges))
    }

    /// Post a signaled RDMA WRITE of `sges` to `remote`'s address.
    pub fn write(&self, wr_id: u64, sges: &[Sge], remote: &RemoteMr) -> Result<()> {
        self.post_send(SendWr::rdma_write(wr_id, sges, remote.addr, remote.rkey))
    }

    /// Post a signaled RDMA WRITE with immediate (consumes a receive at the peer).
    pub fn write_with_imm(
        &self,
        wr_id: u64,
        sges: &[Sge],
        remote: &RemoteMr,
        imm: u32,
    ) -> Result<()> {
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            imm,
        };
        self.post_send(SendWr::new(wr_id, op, sges))
    }

    /// Post a signaled RDMA READ of `remote` into `sges`.
    pub fn read(&self, wr_id: u64, sges: &[Sge], remote: &RemoteMr) -> Result<()> {
        self.post_send(SendWr::rdma_read(wr_id, sges, remote.addr, remote.rkey))
    }

    /// Post a signaled ATOMIC compare-and-swap on the 8-byte word at `remote.addr`; the
    /// original word lands in `result` (an 8-byte SGE).
    pub fn compare_swap(
        &self,
        wr_id: u64,
        result: Sge,
        remote: &RemoteMr,
        compare: u64,
        swap: u64,
    ) -> Result<()> {
        let op = SendOp::AtomicCmpSwap {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            compare,
            swap,
        };
        self.post_send(SendWr::new(wr_id, op, vec![result]))
    }

    /// Post a signaled ATOMIC fetch-and-add on the 8-byte word at `remote.addr`; the original
    /// word lands in `result` (an 8-byte SGE).
    pub fn fetch_add(&self, wr_id: u64, result: Sge, remote: &RemoteMr, add: u64) -> Result<()> {
        let op = SendOp::AtomicFetchAdd {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            add,
        };
        self.post_send(SendWr::new(wr_id, op, vec![result]))
    }
}
