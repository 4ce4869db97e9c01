//! The RDMA connection manager, as a Rust API: listen, accept and connect by socket address,
//! the way `rdma_cm` programs do, and interoperable with them (the device speaks the IB CM
//! protocol to the peer's QP1, the rdma_cm IP header included, as the Linux kernel does).
//!
//! The other way to connect is [`crate::Qp::handshake`]: a TCP exchange of QPN, PSN and GID
//! that both sides must run. With the connection manager only an address and a port are
//! needed, and the peer may be any rdma_cm program (`rping`, perftest's `-R`, a kernel or
//! hardware RNIC):
//!
//! ```no_run
//! use std::time::Duration;
//! use softrdma::cm::ConnParam;
//! use softrdma::Device;
//! # fn main() -> Result<(), softrdma::Error> {
//! let dev = Device::open("127.0.0.1".parse().unwrap())?;
//! let pd = dev.alloc_pd()?;
//! let cq = dev.create_cq(16)?;
//! // Server: listen on rdma_cm TCP port 7471 and accept the first request.
//! let listener = dev.connection_manager()?.listen(7471)?;
//! let request = listener.next_request(None)?;
//! let qp = pd.qp_builder(&cq, &cq).build()?;
//! let conn = request.accept(&qp, &ConnParam::default(), Some(Duration::from_secs(5)))?;
//! // ... the QP is in RTS: post, poll ...
//! conn.disconnect()?;
//! # Ok(()) }
//! ```
//!
//! The device's CM moves the QP through its states (RESET → INIT → RTR → RTS on connect
//! and accept, ERR on disconnect or rejection), as the kernel's rdma_cm does: hand it a new
//! RC QP.
//!
//! UD services have no connection: a side asks the peer which UD QP serves an rdma_cm UDP
//! port ([`ConnectionManager::resolve`], SIDR on the wire, as `udaddy` does), and the
//! peer's listener ([`ConnectionManager::listen_datagram`]) answers with one of its UD QPs
//! ([`Request::accept_datagram`]). The asker gets the QPN and Q_Key to address datagrams
//! to ([`UdService`]). Events of one [`ConnectionManager`] (its listens and its connections) arrive in
//! one place; each call here waits for the event it is about and keeps the others for the
//! calls that wait for them. The blocking calls take a timeout; with the `tokio` feature
//! the `*_async` ones wait on the runtime instead.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use runtime::{CmEvent, CommId, ConnParam, ConnectRequest, Ece};
pub use wire::{PortSpace, RejectReason, ServiceId};

use crate::device::Device;
use crate::qp::Qp;
use crate::raw::RawCmChannel;
use crate::{Error, Qpn, Result};

/// One consumer of a device's connection manager (an `rdma_event_channel`): it listens and
/// connects, and every event of its listens and connections arrives here. Cheap to clone.
/// Dropped with its last listener and connection: its listens end and its connections are
/// torn down (peers see them disconnected).
#[derive(Debug, Clone)]
pub struct ConnectionManager {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    device: Device,
    channel: RawCmChannel,
    /// Events taken from the channel that no waiter wanted yet, oldest first.
    stash: Mutex<VecDeque<CmEvent>>,
}

impl Device {
    /// A connection manager on this device (see [`crate::cm`]).
    pub fn connection_manager(&self) -> Result<ConnectionManager> {
        Ok(ConnectionManager {
            inner: Arc::new(Inner {
                channel: self.raw().cm_channel()?,
                device: self.clone(),
                stash: Mutex::new(VecDeque::new()),
            }),
        })
    }
}

impl ConnectionManager {
    /// Listen for connection requests on rdma_cm TCP port `port` (`rdma_listen` on an id
    /// bound to the port): every address of the device. `EADDRINUSE` if another listener
    /// on the device has the port.
    pub fn listen(&self, port: u16) -> Result<Listener> {
        self.listen_on(ServiceId::rdma_cm(PortSpace::TCP, port))
    }

    /// Listen for UD service resolutions on rdma_cm UDP port `port` (`rdma_listen` on a
    /// UDP id): its requests are answered with [`Request::accept_datagram`].
    pub fn listen_datagram(&self, port: u16) -> Result<Listener> {
        self.listen_on(ServiceId::rdma_cm(PortSpace::UDP, port))
    }

    /// Ask `peer` (its IP address and rdma_cm UDP port) which UD QP serves it, and wait up
    /// to `timeout` (`None`: as long as the CM retries) for the answer. `private_data` in
    /// `param` reaches the listener (at most 180 bytes). A refusal is
    /// [`Error::CmUnresolved`], no answer [`Error::Timeout`].
    pub fn resolve(
        &self,
        peer: SocketAddr,
        param: &ConnParam,
        timeout: Option<Duration>,
    ) -> Result<UdService> {
        let id = self.start_resolve(peer, param)?;
        let ev = self.wait_for(timeout, |e| e.id() == id);
        self.resolved(id, peer, ev)
    }

    /// [`ConnectionManager::resolve`], waiting on the tokio runtime.
    #[cfg(feature = "tokio")]
    pub async fn resolve_async(&self, peer: SocketAddr, param: &ConnParam) -> Result<UdService> {
        let id = self.start_resolve(peer, param)?;
        let ev = self.wait_for_async(|e| e.id() == id).await;
        self.resolved(id, peer, ev)
    }

    fn start_resolve(&self, peer: SocketAddr, param: &ConnParam) -> Result<CommId> {
        let service_id = ServiceId::rdma_cm(PortSpace::UDP, peer.port());
        self.inner.channel.resolve(peer.ip(), service_id, param)
    }

    fn resolved(&self, id: CommId, peer: SocketAddr, ev: Result<CmEvent>) -> Result<UdService> {
        // Nothing more happens to the request: let it go whatever the answer (one that
        // failed is gone already, and that is no error).
        let _ = self.inner.channel.destroy_id(id);
        match ev? {
            CmEvent::Resolved {
                qpn,
                qkey,
                private_data,
                ..
            } => Ok(UdService {
                peer,
                // A 24-bit field of the SIDR_REP.
                qpn: Qpn::new(qpn),
                qkey,
                private_data,
            }),
            CmEvent::Unresolved { status, .. } => Err(Error::CmUnresolved { status }),
            CmEvent::Unreachable { .. } => Err(Error::Timeout),
            other => Err(Error::Config(format!(
                "unexpected connection-manager event {other:?}"
            ))),
        }
    }

    /// Listen on any service ID (another port space, or a native IB service).
    pub fn listen_on(&self, service_id: ServiceId) -> Result<Listener> {
        self.inner.channel.listen(service_id)?;
        Ok(Listener {
            cm: self.clone(),
            service_id,
        })
    }

    /// Connect `qp` (a new RC QP of this device, in RESET or INIT) to the listener at
    /// `peer` (its IP address and rdma_cm TCP port), and wait up to `timeout` (`None`: as
    /// long as the CM retries) for the connection to come up. `private_data` in `param`
    /// reaches the listener (at most 56 bytes).
    pub fn connect(
        &self,
        qp: &Qp,
        peer: SocketAddr,
        param: &ConnParam,
        timeout: Option<Duration>,
    ) -> Result<Connection> {
        let (id, conn) = self.start_connect(qp, peer, param)?;
        let ev = self.wait_for(timeout, |e| e.id() == id);
        conn.connected(ev)
    }

    /// [`ConnectionManager::connect`], waiting on the tokio runtime.
    #[cfg(feature = "tokio")]
    pub async fn connect_async(
        &self,
        qp: &Qp,
        peer: SocketAddr,
        param: &ConnParam,
    ) -> Result<Connection> {
        let (id, conn) = self.start_connect(qp, peer, param)?;
        let ev = self.wait_for_async(|e| e.id() == id).await;
        conn.connected(ev)
    }

    fn start_connect(
        &self,
        qp: &Qp,
        peer: SocketAddr,
        param: &ConnParam,
    ) -> Result<(CommId, Connection)> {
        self.check_qp(qp)?;
        let service_id = ServiceId::rdma_cm(PortSpace::TCP, peer.port());
        let id = self
            .inner
            .channel
            .connect(Some(qp.handle()), peer.ip(), service_id, param)?;
        Ok((
            id,
            Connection {
                cm: self.clone(),
                id,
                peer: peer.ip(),
                private_data: Vec::new(),
                ece: Ece::default(),
            },
        ))
    }

    fn check_qp(&self, qp: &Qp) -> Result<()> {
        if qp.pd().device().same(&self.inner.device) {
            Ok(())
        } else {
            Err(Error::Config(
                "the QP is on another device than the connection manager".into(),
            ))
        }
    }

    /// The oldest event no call here is waiting for (a connection's disconnection, or a
    /// request a [`Listener`] has not taken yet), without blocking.
    pub fn poll_event(&self) -> Result<Option<CmEvent>> {
        if let Some(ev) = self.stash().pop_front() {
            return Ok(Some(ev));
        }
        self.inner.channel.get_event()
    }

    fn stash(&self) -> std::sync::MutexGuard<'_, VecDeque<CmEvent>> {
        crate::provider::lock(&self.inner.stash)
    }

    /// The first event `want` accepts: from the stash, else from the channel (stashing
    /// what it does not accept), `None` if nothing waits.
    fn take(&self, want: &mut impl FnMut(&CmEvent) -> bool) -> Result<Option<CmEvent>> {
        let mut stash = self.stash();
        if let Some(at) = stash.iter().position(&mut *want) {
            return Ok(stash.remove(at));
        }
        while let Some(ev) = self.inner.channel.get_event()? {
            if want(&ev) {
                return Ok(Some(ev));
            }
            stash.push_back(ev);
        }
        Ok(None)
    }

    /// Wait up to `timeout` for an event `want` accepts ([`Error::Timeout`] if none comes).
    fn wait_for(
        &self,
        timeout: Option<Duration>,
        mut want: impl FnMut(&CmEvent) -> bool,
    ) -> Result<CmEvent> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(ev) = self.take(&mut want)? {
                return Ok(ev);
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Err(Error::Timeout),
                },
                None => None,
            };
            // Readable while the channel holds events: one another waiter stashes wakes
            // this one only when it is its (the stash is looked at first on every turn).
            runtime::wait_readable(self.inner.channel.fd(), left.map(|l| l.min(POLL_SLICE)))?;
        }
    }

    #[cfg(feature = "tokio")]
    async fn wait_for_async(&self, mut want: impl FnMut(&CmEvent) -> bool) -> Result<CmEvent> {
        use tokio::io::unix::AsyncFd;
        use tokio::io::Interest;
        let fd = ChannelFd(self.inner.clone());
        // SAFETY: `ChannelFd` holds the channel (and so its descriptor) alive for as long as
        // the AsyncFd lives, and always reports that same descriptor.
        #[allow(unsafe_code)]
        let afd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
            .map_err(|e| Error::Io(std::io::Error::from(e)))?;
        loop {
            if let Some(ev) = self.take(&mut want)? {
                return Ok(ev);
            }
            // Bounded, as the blocking wait: an event another waiter stashed for this one
            // leaves the descriptor quiet.
            if let Ok(guard) = tokio::time::timeout(POLL_SLICE, afd.readable()).await {
                guard?.clear_ready();
            }
        }
    }
}

/// Longest a waiter sleeps before looking at the stash again: another thread may have
/// taken this waiter's event off the channel.
const POLL_SLICE: Duration = Duration::from_millis(50);

impl AsFd for ConnectionManager {
    /// Readable while events wait on the channel (events already stashed do not count).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.channel.fd()
    }
}

#[cfg(feature = "tokio")]
struct ChannelFd(Arc<Inner>);

#[cfg(feature = "tokio")]
impl std::os::fd::AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.channel.fd().as_raw_fd()
    }
}

/// A listen on a service (`rdma_listen`); ends when dropped (connections made stay).
#[derive(Debug)]
pub struct Listener {
    cm: ConnectionManager,
    service_id: ServiceId,
}

impl Listener {
    /// The service listened on.
    pub fn service_id(&self) -> ServiceId {
        self.service_id
    }

    /// Wait up to `timeout` (`None`: no limit) for the next connection request.
    pub fn next_request(&self, timeout: Option<Duration>) -> Result<Request> {
        let ev = self.cm.wait_for(timeout, |e| self.is_mine(e))?;
        Ok(self.request(ev))
    }

    /// [`Listener::next_request`], waiting on the tokio runtime.
    #[cfg(feature = "tokio")]
    pub async fn next_request_async(&self) -> Result<Request> {
        let ev = self.cm.wait_for_async(|e| self.is_mine(e)).await?;
        Ok(self.request(ev))
    }

    fn is_mine(&self, e: &CmEvent) -> bool {
        matches!(e, CmEvent::ConnectRequest(r) if r.service_id == self.service_id)
    }

    fn request(&self, ev: CmEvent) -> Request {
        let CmEvent::ConnectRequest(req) = ev else {
            unreachable!("is_mine takes connect requests only")
        };
        Request {
            cm: self.cm.clone(),
            req: Some(req),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Err(e) = self.cm.inner.channel.unlisten(self.service_id) {
            tracing::debug!(error = %e, "unlisten");
        }
    }
}

/// A peer's request to connect (`RDMA_CM_EVENT_CONNECT_REQUEST`): accept or reject it;
/// dropped unanswered, it is rejected.
#[derive(Debug)]
pub struct Request {
    cm: ConnectionManager,
    /// `None` once answered.
    req: Option<Box<ConnectRequest>>,
}

impl Request {
    fn req(&self) -> &ConnectRequest {
        self.req
            .as_ref()
            .expect("present until answered, which consumes the request")
    }

    /// The peer's address and rdma_cm port.
    pub fn peer(&self) -> SocketAddr {
        SocketAddr::new(self.req().peer, self.req().peer_port)
    }

    /// The local address the request came to.
    pub fn local(&self) -> IpAddr {
        self.req().local
    }

    /// The peer's private data (the rdma_cm IP header removed).
    pub fn private_data(&self) -> &[u8] {
        &self.req().private_data
    }

    /// The whole request, as the CM reported it.
    pub fn details(&self) -> &ConnectRequest {
        self.req()
    }

    /// Whether this is a UD service resolution (from [`ConnectionManager::resolve`] or
    /// `udaddy`), answered with [`Request::accept_datagram`].
    pub fn is_datagram(&self) -> bool {
        self.req().datagram
    }

    /// Answer a UD service resolution with `qp`, a UD QP of this device: the peer learns
    /// its QPN and Q_Key (the QP is this side's to bring to RTS and to fill with
    /// receives), and `param`'s private data (at most 136 bytes).
    pub fn accept_datagram(mut self, qp: &Qp, param: &ConnParam) -> Result<()> {
        if !self.is_datagram() {
            return Err(Error::Config(
                "a connection request is answered with accept, not accept_datagram".into(),
            ));
        }
        self.cm.check_qp(qp)?;
        let id = self.req().id;
        self.cm.inner.channel.accept(id, Some(qp.handle()), param)?;
        self.req = None;
        // The answer is the whole exchange: nothing more to keep.
        self.cm.inner.channel.destroy_id(id)
    }

    /// Accept with `qp` (a new RC QP of this device, in RESET or INIT), which is in RTS
    /// when the REP leaves; then wait up to `timeout` for the peer's RTU, which makes the
    /// connection established ([`Error::Timeout`] if it never comes: the CM keeps resending
    /// the REP meanwhile, and the connection is torn down when the returned error drops
    /// the request's state).
    pub fn accept(
        mut self,
        qp: &Qp,
        param: &ConnParam,
        timeout: Option<Duration>,
    ) -> Result<Connection> {
        let conn = self.answer(qp, param)?;
        let id = conn.id;
        let ev = self.cm.wait_for(timeout, |e| e.id() == id);
        conn.connected(ev)
    }

    /// [`Request::accept`], waiting on the tokio runtime.
    #[cfg(feature = "tokio")]
    pub async fn accept_async(mut self, qp: &Qp, param: &ConnParam) -> Result<Connection> {
        let conn = self.answer(qp, param)?;
        let id = conn.id;
        let ev = self.cm.wait_for_async(|e| e.id() == id).await;
        conn.connected(ev)
    }

    fn answer(&mut self, qp: &Qp, param: &ConnParam) -> Result<Connection> {
        if self.is_datagram() {
            return Err(Error::Config(
                "a UD service resolution is answered with accept_datagram".into(),
            ));
        }
        self.cm.check_qp(qp)?;
        let req = self.req();
        let (id, peer) = (req.id, req.peer);
        self.cm.inner.channel.accept(id, Some(qp.handle()), param)?;
        self.req = None;
        Ok(Connection {
            cm: self.cm.clone(),
            id,
            peer,
            private_data: Vec::new(),
            ece: Ece::default(),
        })
    }

    /// Refuse the request; the peer sees it rejected (consumer-defined reason) with
    /// `private_data` (at most 148 bytes).
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        self.reject_with(RejectReason::CONSUMER_DEFINED, private_data)
    }

    /// Refuse the ECE options the request asks for ([`ConnectRequest::ece`]): the peer sees
    /// it rejected with reason 35, vendor option not supported (`rdma_reject_ece`).
    pub fn reject_ece(self, private_data: &[u8]) -> Result<()> {
        self.reject_with(RejectReason::VENDOR_OPTION_NOT_SUPPORTED, private_data)
    }

    fn reject_with(mut self, reason: RejectReason, private_data: &[u8]) -> Result<()> {
        let id = self.req().id;
        self.cm.inner.channel.reject(id, reason, private_data)?;
        self.req = None;
        Ok(())
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(req) = &self.req {
            let reason = RejectReason::CONSUMER_DEFINED;
            if let Err(e) = self.cm.inner.channel.reject(req.id, reason, &[]) {
                tracing::debug!(error = %e, "rejecting a dropped request");
            }
        }
    }
}

/// A peer's UD QP that serves an rdma_cm UDP port ([`ConnectionManager::resolve`]): where
/// to send datagrams (an address handle to `peer`'s IP address, this QPN and Q_Key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdService {
    /// The address and port resolved.
    pub peer: SocketAddr,
    /// The peer's UD QP.
    pub qpn: Qpn,
    /// The Q_Key its datagrams must carry.
    pub qkey: u32,
    /// The listener's private data (the SIDR_REP's whole field, 136 bytes).
    pub private_data: Vec<u8>,
}

/// An established connection: its QP is in RTS. Dropped, it is torn down (the peer sees
/// it disconnected, this side's QP goes to ERR): drop it before its QP.
#[derive(Debug)]
pub struct Connection {
    cm: ConnectionManager,
    id: CommId,
    peer: IpAddr,
    /// The REP's private data, on the connecting side.
    private_data: Vec<u8>,
    /// The REP's ECE, on the connecting side.
    ece: Ece,
}

impl Connection {
    /// What the wait for the connection's first event brought.
    fn connected(mut self, ev: Result<CmEvent>) -> Result<Connection> {
        match ev? {
            CmEvent::Established {
                private_data, ece, ..
            } => {
                self.private_data = private_data;
                self.ece = ece;
                Ok(self)
            }
            CmEvent::Rejected { reason, .. } => Err(Error::CmRejected { reason }),
            CmEvent::Unreachable { .. } => Err(Error::Timeout),
            CmEvent::ConnectError { errno, .. } => {
                Err(Error::Io(std::io::Error::from_raw_os_error(errno)))
            }
            other => Err(Error::Config(format!(
                "unexpected connection-manager event {other:?}"
            ))),
        }
    }

    /// The connection's ID at this side's CM.
    pub fn id(&self) -> CommId {
        self.id
    }

    /// The peer's address.
    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    /// On the connecting side, the private data the listener accepted with (as rdma_cm
    /// delivers it: the REP's whole private-data field); empty on the accepting side.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// On the connecting side, the ECE the listener answered with (`rdma_get_remote_ece`:
    /// the REP's vendor ID and options); all zero on the accepting side, whose peer's ECE
    /// came with the request ([`ConnectRequest::ece`]).
    pub fn remote_ece(&self) -> Ece {
        self.ece
    }

    /// Close the connection (`rdma_disconnect`): the QP goes to ERR (its outstanding WRs
    /// complete flushed) and the peer is told.
    pub fn disconnect(&self) -> Result<()> {
        self.cm.inner.channel.disconnect(self.id, &[])
    }

    /// Wait up to `timeout` for the connection to be closed, by either side.
    pub fn wait_disconnected(&self, timeout: Option<Duration>) -> Result<()> {
        let id = self.id;
        self.cm
            .wait_for(
                timeout,
                |e| matches!(e, CmEvent::Disconnected { id: d } if *d == id),
            )
            .map(drop)
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        if let Err(e) = self.cm.inner.channel.destroy_id(self.id) {
            tracing::debug!(error = %e, "destroying a connection");
        }
        // Events of this connection no longer concern anyone.
        let id = self.id;
        self.cm.stash().retain(|e| e.id() != id);
    }
}
