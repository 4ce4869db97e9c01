//! Opening an embedded device and asking it what it is.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use engine::qp_attr::Mtu;
use engine::{AsyncEvent, Counters, DeviceAttr, Gid, PortAttr};
use runtime::{Runtime, RuntimeConfig, RxPath, SrcPortPolicy};

use crate::cq::Cq;
use crate::qp::Pd;
use crate::{Error, Result};

/// An open soft RDMA device (an `ibv_context`): one RoCEv2 port on one local IP address.
/// Cheap to clone; the device closes when the last clone and every object made from it are
/// dropped.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

#[derive(Debug)]
pub(crate) struct DeviceInner {
    pub(crate) rt: Runtime,
    /// How long a waiting thread polls its CQ before it sleeps.
    pub(crate) wait_spin: Duration,
}

/// Options for [`Device::builder`].
#[derive(Debug, Clone)]
pub struct DeviceBuilder {
    config: RuntimeConfig,
    wait_spin: Duration,
}

impl DeviceBuilder {
    /// UDP port to receive on (default 4791). Give devices that share an address distinct
    /// ports, and point each at the other's with [`DeviceBuilder::remote_port`].
    pub fn port(mut self, port: u16) -> Self {
        self.config.port = port;
        self
    }

    /// UDP port to send to (default 4791).
    pub fn remote_port(mut self, port: u16) -> Self {
        self.config.remote_port = port;
        self
    }

    /// How UDP source ports are chosen (default: per QP).
    pub fn src_port_policy(mut self, policy: SrcPortPolicy) -> Self {
        self.config.src_port_policy = policy;
        self
    }

    /// Receive path (default: the UDP socket; see the runtime docs, "Receive policy").
    /// [`RxPath::Raw`] checks every sender's ICRC exactly (Linux rxe included) and needs
    /// root or `CAP_NET_RAW`.
    pub fn rx_path(mut self, path: RxPath) -> Self {
        self.config.rx_path = path;
        self
    }

    /// How long the progress thread polls after activity before it sleeps (default 0).
    pub fn busy_poll(mut self, d: Duration) -> Self {
        self.config.busy_poll = d;
        self
    }

    /// How long a thread waiting for completions polls before it sleeps (default 0).
    pub fn wait_spin(mut self, d: Duration) -> Self {
        self.wait_spin = d;
        self
    }

    /// Port MTU (default 4096).
    pub fn mtu(mut self, mtu: Mtu) -> Self {
        self.config.mtu = mtu;
        self
    }

    /// Fixed seed for the key generator (tests only: keys must be unpredictable).
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.config.rng_seed = Some(seed);
        self
    }

    /// Bind the socket and start the device.
    pub fn open(self) -> Result<Device> {
        let rt = Runtime::start(self.config)?;
        Ok(Device {
            inner: Arc::new(DeviceInner {
                rt,
                wait_spin: self.wait_spin,
            }),
        })
    }
}

impl Device {
    /// Open a device on `addr` with the defaults (UDP 4791).
    pub fn open(addr: IpAddr) -> Result<Device> {
        Device::builder(addr).open()
    }

    /// Options for a device on `addr`.
    pub fn builder(addr: IpAddr) -> DeviceBuilder {
        DeviceBuilder {
            config: RuntimeConfig::new(addr),
            wait_spin: Duration::ZERO,
        }
    }

    /// The address and UDP port the device receives on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.rt.local_addr()
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> DeviceAttr {
        self.inner.rt.lock().query_device()
    }

    /// Attributes of port 1, the only port (`ibv_query_port`).
    pub fn query_port(&self) -> Result<PortAttr> {
        Ok(self.inner.rt.lock().query_port(1)?)
    }

    /// The GID at `index` of port 1 (`ibv_query_gid`): index 0 is the device's address.
    pub fn gid(&self, index: u32) -> Result<Gid> {
        Ok(self.inner.rt.lock().query_gid(1, index)?)
    }

    /// Every GID of port 1, in table order.
    pub fn gids(&self) -> Vec<Gid> {
        let e = self.inner.rt.lock();
        (0..)
            .map_while(|i| e.query_gid(1, i).ok())
            .collect::<Vec<_>>()
    }

    /// Device-wide counters (packets, bytes, and every drop reason).
    pub fn counters(&self) -> Counters {
        self.inner.rt.lock().counters().clone()
    }

    /// A new protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<Pd> {
        let h = self.inner.rt.lock().alloc_pd()?;
        Ok(Pd::new(self.clone(), h))
    }

    /// A completion queue with room for `depth` completions (`ibv_create_cq`).
    pub fn create_cq(&self, depth: u32) -> Result<Cq> {
        let h = self.inner.rt.lock().create_cq(depth)?;
        Cq::new(self.clone(), h)
    }

    /// The next asynchronous event (`ibv_get_async_event` without blocking).
    pub fn async_event(&self) -> Option<AsyncEvent> {
        self.inner.rt.get_async_event()
    }

    /// Wait for the next asynchronous event, at most `timeout` (`None`: no limit).
    pub fn wait_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(ev) = self.async_event() {
                return Ok(ev);
            }
            let left = match deadline {
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return Err(Error::Timeout);
                    }
                    Some(d - now)
                }
                None => None,
            };
            crate::cq::wait_fd(self.inner.rt.async_event_fd(), left)?;
        }
    }

    /// The runtime underneath, for what this API does not cover yet (raw verbs on the
    /// engine, socket counters).
    pub fn runtime(&self) -> &Runtime {
        &self.inner.rt
    }
}
