//! Opening a device (embedded or through the host daemon) and asking it what it is.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use engine::qp_attr::Mtu;
use engine::{AsyncEvent, Counters, DeviceAttr, Gid, PortAttr};
use runtime::{Runtime, RuntimeConfig, RxPath, SrcPortPolicy};

use crate::cq::Cq;
use crate::provider::daemon::Daemon;
use crate::provider::embedded::Embedded;
use crate::provider::locate::{self, DaemonConfig, Probe};
use crate::provider::{self, BackendKind, Provider};
use crate::qp::Pd;
use crate::{Error, Result};

/// An open soft RDMA device (an `ibv_context`): one RoCEv2 port on one local IP address,
/// either embedded in this process or served by the host daemon `softrdmad` (see the crate
/// docs, "Backends"). Cheap to clone; the device closes when the last clone and every object
/// made from it are dropped.
#[derive(Clone, Debug)]
pub struct Device {
    pub(crate) inner: Arc<DeviceInner>,
}

#[derive(Debug)]
pub(crate) struct DeviceInner {
    /// The device's operations, chosen once at open.
    pub(crate) provider: Box<dyn Provider>,
    /// How long a waiting thread polls its CQ before it sleeps.
    pub(crate) wait_spin: Duration,
}

/// Options for [`Device::builder`].
#[derive(Debug, Clone)]
pub struct DeviceBuilder {
    addr: Option<IpAddr>,
    config: RuntimeConfig,
    wait_spin: Duration,
    backend: Option<BackendKind>,
    daemon: DaemonConfig,
    /// Options that configure an embedded engine's socket or engine, set explicitly: the
    /// daemon has its own configuration, so they are refused there (except a matching port
    /// or MTU), and without an explicit backend they choose the embedded one.
    embedded_only: Vec<&'static str>,
    /// Options that only starting a daemon uses, set explicitly: without an explicit
    /// backend they choose the daemon.
    daemon_only: Vec<&'static str>,
    port_set: Option<u16>,
    mtu_set: Option<Mtu>,
}

impl DeviceBuilder {
    /// UDP port to receive on (default 4791). Give devices that share an address distinct
    /// ports, and point each at the other's with [`DeviceBuilder::remote_port`]. On the
    /// daemon backend, only the daemon's own port is accepted (so without an explicit
    /// backend, another port chooses an embedded device).
    pub fn port(mut self, port: u16) -> Self {
        self.config.port = port;
        self.port_set = Some(port);
        self
    }

    /// UDP port to send to (default 4791). Embedded backend only.
    pub fn remote_port(mut self, port: u16) -> Self {
        self.config.remote_port = port;
        self.embedded_only.push("remote_port");
        self
    }

    /// How UDP source ports are chosen (default: per QP). Embedded backend only.
    pub fn src_port_policy(mut self, policy: SrcPortPolicy) -> Self {
        self.config.src_port_policy = policy;
        self.embedded_only.push("src_port_policy");
        self
    }

    /// Receive path (default: the UDP socket; see the runtime docs, "Receive policy").
    /// [`RxPath::Raw`] checks every sender's ICRC exactly (Linux rxe included) and needs
    /// root or `CAP_NET_RAW`. Embedded backend only.
    pub fn rx_path(mut self, path: RxPath) -> Self {
        self.config.rx_path = path;
        self.embedded_only.push("rx_path");
        self
    }

    /// How long the progress thread polls after activity before it sleeps, fixed: it then
    /// learns no polling of its own (by default it polls for none, and learns up to 64 us
    /// when work keeps following its sleeps closely; see `runtime::RuntimeConfig::adaptive_poll`).
    /// Embedded backend only.
    pub fn busy_poll(mut self, d: Duration) -> Self {
        self.config.busy_poll = d;
        self.config.adaptive_poll = Duration::ZERO;
        self.embedded_only.push("busy_poll");
        self
    }

    /// The longest polling the progress thread learns on its own (default 64 us; zero:
    /// none): while work keeps arriving soon after it sleeps, such as a peer's READs or
    /// atomics on this device's memory, it polls instead of paying a wakeup for each.
    /// Embedded backend only.
    pub fn adaptive_poll(mut self, max: Duration) -> Self {
        self.config.adaptive_poll = max;
        self.embedded_only.push("adaptive_poll");
        self
    }

    /// How long a thread waiting for completions polls before it sleeps (default 0).
    pub fn wait_spin(mut self, d: Duration) -> Self {
        self.wait_spin = d;
        self
    }

    /// Port MTU (default 4096). On the daemon backend, only the daemon's MTU is accepted
    /// (so without an explicit backend, another MTU chooses an embedded device).
    pub fn mtu(mut self, mtu: Mtu) -> Self {
        self.config.mtu = mtu;
        self.mtu_set = Some(mtu);
        self
    }

    /// Fixed seed for the key generator (tests only: keys must be unpredictable).
    /// Embedded backend only.
    pub fn rng_seed(mut self, seed: u64) -> Self {
        self.config.rng_seed = Some(seed);
        self.embedded_only.push("rng_seed");
        self
    }

    /// Which backend to open. Default: `$SOFTRDMA_BACKEND`, else the one the options
    /// given imply, else the daemon if one answers and serves this address, else embedded
    /// (the crate docs, "Backends", spell the rule out).
    pub fn backend(mut self, kind: BackendKind) -> Self {
        self.backend = Some(kind);
        self
    }

    /// The daemon's control socket (default: `$SOFTRDMA_DAEMON_SOCKET`, else
    /// `/run/softrdma/softrdmad.sock`).
    pub fn daemon_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.daemon.socket = Some(path.into());
        self
    }

    /// Whether a missing daemon may be started, once the daemon backend is chosen
    /// (default: `$SOFTRDMA_DAEMON_SPAWN`, else yes). Without an explicit backend, `true`
    /// chooses the daemon (started if none answers); `false` only forbids starting one.
    pub fn spawn_daemon(mut self, on: bool) -> Self {
        self.daemon.spawn = Some(on);
        if on {
            self.daemon_only.push("spawn_daemon");
        }
        self
    }

    /// The `softrdmad` binary to start if no daemon answers (default:
    /// `$SOFTRDMA_DAEMON_BIN`, else next to this executable, else on `PATH`). Without an
    /// explicit backend, this chooses the daemon.
    pub fn daemon_binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.daemon.binary = Some(path.into());
        self.daemon_only.push("daemon_binary");
        self
    }

    /// Arguments for a started daemon besides `--socket` (default:
    /// `$SOFTRDMA_DAEMON_ARGS` split at whitespace), e.g. `["--addr", "127.0.0.1"]`.
    /// Without an explicit backend, this chooses the daemon.
    pub fn daemon_args<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.daemon.args = Some(args.into_iter().map(Into::into).collect());
        self.daemon_only.push("daemon_args");
        self
    }

    /// On the daemon backend, take the daemon's first device whatever its address (for
    /// [`crate::raw::daemon_devices`], which only needs the daemon up).
    pub(crate) fn any_daemon_device(mut self) -> Self {
        self.addr = None;
        self
    }

    /// Which backend [`DeviceBuilder::open`] would use now, without opening anything (for
    /// programs that set embedded-only tuning, such as [`DeviceBuilder::busy_poll`], only
    /// when the device will be embedded, since setting it would choose embedded). Without
    /// an explicit choice this looks at the daemon's control socket, as `open` does; the
    /// answer holds until the daemon starts or stops. Errors as `open` would: a bad
    /// `$SOFTRDMA_BACKEND`, conflicting options, a daemon that answers but cannot be used.
    pub fn choose_backend(&self) -> Result<BackendKind> {
        Ok(self.choose()?.kind)
    }

    /// The backend rule (crate docs, "Backends"): an explicit choice, else what the options
    /// imply, else the daemon if one answers and serves this address and any port or MTU
    /// asked for, else embedded. A daemon found that way is kept connected for the open.
    fn choose(&self) -> Result<Choice> {
        let embedded = || {
            Ok(Choice {
                kind: BackendKind::Embedded,
                found: None,
            })
        };
        let daemon = || {
            Ok(Choice {
                kind: BackendKind::Daemon,
                found: None,
            })
        };
        if let Some(kind) = self.backend {
            return Ok(Choice { kind, found: None });
        }
        if let Some(kind) = BackendKind::from_env()? {
            return Ok(Choice { kind, found: None });
        }
        // A capture file in the environment asks for what only an embedded device records.
        let capture_env = std::env::var_os(runtime::capture::ENV_VAR)
            .is_some_and(|v| !v.is_empty())
            .then_some(runtime::capture::ENV_VAR);
        let embedded_opt = self.embedded_only.first().copied().or(capture_env);
        match (embedded_opt, self.daemon_only.first()) {
            (Some(e), Some(d)) => {
                return Err(Error::Config(format!(
                    "{e} configures an embedded device and {d} the daemon: choose one with \
                     DeviceBuilder::backend or {}",
                    provider::BACKEND_ENV
                )))
            }
            (Some(_), None) => return embedded(),
            (None, Some(_)) => return daemon(),
            (None, None) => {}
        }
        let Some(addr) = self.addr else {
            // No address (`open_default` without `SOFTRDMA_DEVICE`): only a daemon can
            // serve that, started if none answers.
            return daemon();
        };
        let socket = self.daemon.socket_path();
        let (mut client, devices) = match locate::probe(&socket)? {
            Probe::Nobody => return embedded(),
            Probe::Answers { client, devices } => (client, devices),
        };
        // A daemon that does not serve this address, or not on the port or with the MTU
        // asked for, cannot give what was asked; an embedded device can.
        let Some(info) = locate::serving(devices, Some(addr)) else {
            return embedded();
        };
        if self.port_set.is_some_and(|p| p != info.port) {
            return embedded();
        }
        if let Some(m) = self.mtu_set {
            let port = client.query_port(info.index, 1)?;
            if port.active_mtu != m {
                return embedded();
            }
        }
        Ok(Choice {
            kind: BackendKind::Daemon,
            found: Some((client, info)),
        })
    }

    /// Open the device on the backend the rule picks (see [`DeviceBuilder::backend`]):
    /// bind the socket and start the engine (embedded), or connect to the daemon (starting
    /// it if allowed, when the daemon was chosen explicitly or is the only way) and pick its
    /// device on this address.
    pub fn open(self) -> Result<Device> {
        let choice = self.choose()?;
        let provider: Box<dyn Provider> = match choice.kind {
            BackendKind::Embedded => {
                if self.addr.is_none() {
                    return Err(Error::Config(format!(
                        "the embedded backend needs an address (set {} to an IP address)",
                        DEVICE_ENV
                    )));
                }
                Box::new(Embedded::new(Runtime::start(self.config)?))
            }
            BackendKind::Daemon => {
                if let Some(opt) = self.embedded_only.first() {
                    return Err(Error::Config(format!(
                        "option {opt} configures an embedded device; softrdmad has its own"
                    )));
                }
                let b = match choice.found {
                    Some((client, info)) => Daemon::on(client, info)?,
                    None => Daemon::open(self.addr, &self.daemon)?,
                };
                if let Some(p) = self.port_set {
                    if p != b.local_addr().port() {
                        return Err(Error::Config(format!(
                            "port {p} asked for, but softrdmad serves port {}",
                            b.local_addr().port()
                        )));
                    }
                }
                if let Some(m) = self.mtu_set {
                    let active = b.query_port()?.active_mtu;
                    if m != active {
                        return Err(Error::Config(format!(
                            "MTU {} asked for, but softrdmad's port has {}",
                            m.bytes(),
                            active.bytes()
                        )));
                    }
                }
                Box::new(b)
            }
        };
        Ok(Device {
            inner: Arc::new(DeviceInner {
                provider,
                wait_spin: self.wait_spin,
            }),
        })
    }
}

/// The backend `DeviceBuilder::choose` settled on.
struct Choice {
    kind: BackendKind,
    /// The daemon connection an implicit choice made, and the device it found there.
    found: Option<(abi::client::Client, abi::proto::DeviceInfo)>,
}

/// Environment variable naming the device [`Device::open_default`] opens: an IP address
/// (the embedded device's, or the daemon device serving it). The drop-in `libibverbs.so.1`
/// also takes a daemon device name such as `srxe0` here.
pub const DEVICE_ENV: &str = "SOFTRDMA_DEVICE";

impl Device {
    /// Open a device on `addr` with the defaults: UDP 4791; backend `$SOFTRDMA_BACKEND`,
    /// else softrdmad's device on `addr` if a daemon answers and serves it, else embedded
    /// (crate docs, "Backends").
    pub fn open(addr: IpAddr) -> Result<Device> {
        Device::builder(addr).open()
    }

    /// Open the device the environment names: device `$SOFTRDMA_DEVICE` (an IP address),
    /// backend as [`Device::open`] chooses it. Without `$SOFTRDMA_DEVICE`, the daemon's
    /// first device (started if none answers and `$SOFTRDMA_BACKEND` allows the daemon):
    /// an embedded device needs an address.
    pub fn open_default() -> Result<Device> {
        let addr = match std::env::var(DEVICE_ENV) {
            Ok(v) if !v.trim().is_empty() => Some(
                v.trim()
                    .parse::<IpAddr>()
                    .map_err(|_| Error::Config(format!("{DEVICE_ENV}={v} is not an IP address")))?,
            ),
            _ => None,
        };
        let b = DeviceBuilder {
            addr,
            ..Device::builder(addr.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED.into()))
        };
        b.open()
    }

    /// Options for a device on `addr`.
    pub fn builder(addr: IpAddr) -> DeviceBuilder {
        DeviceBuilder {
            addr: Some(addr),
            config: RuntimeConfig::new(addr),
            wait_spin: Duration::ZERO,
            backend: None,
            daemon: DaemonConfig {
                socket: None,
                spawn: None,
                binary: None,
                args: None,
            },
            embedded_only: Vec::new(),
            daemon_only: Vec::new(),
            port_set: None,
            mtu_set: None,
        }
    }

    /// Whether `other` is this same open device (objects name each other by handles that
    /// mean something only on the device that made them).
    pub(crate) fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The device's operations.
    pub(crate) fn provider(&self) -> &dyn Provider {
        &*self.inner.provider
    }

    /// Which backend this device runs on.
    pub fn backend(&self) -> BackendKind {
        self.provider().kind()
    }

    /// The address and UDP port the device receives on.
    pub fn local_addr(&self) -> SocketAddr {
        self.provider().local_addr()
    }

    /// Device attributes (`ibv_query_device`; on the daemon backend, read when the device
    /// was opened).
    pub fn query_device(&self) -> DeviceAttr {
        self.provider().query_device()
    }

    /// Attributes of port 1, the only port (`ibv_query_port`).
    pub fn query_port(&self) -> Result<PortAttr> {
        self.provider().query_port()
    }

    /// The GID at `index` of port 1 (`ibv_query_gid`): index 0 is the device's address.
    pub fn gid(&self, index: u32) -> Result<Gid> {
        self.provider().gid(index)
    }

    /// Every GID of port 1, in table order.
    pub fn gids(&self) -> Vec<Gid> {
        self.provider().gids()
    }

    /// Device-wide counters of the engine (packets, bytes, and every drop reason); on the
    /// daemon backend those of the daemon's device, which every client of it shares (the
    /// daemon's own counters are in [`Device::counter_values`]).
    pub fn counters(&self) -> Result<Counters> {
        self.provider().counters()
    }

    /// Device-wide counters by name, on either backend (on the daemon: the daemon's device,
    /// which every process using it shares).
    pub fn counter_values(&self) -> Result<Vec<(String, u64)>> {
        self.provider().counter_values()
    }

    /// A new protection domain (`ibv_alloc_pd`).
    pub fn alloc_pd(&self) -> Result<Pd> {
        let h = self.provider().alloc_pd()?;
        Ok(Pd::new(self.clone(), h))
    }

    /// A completion queue with room for `depth` completions (`ibv_create_cq`).
    pub fn create_cq(&self, depth: u32) -> Result<Cq> {
        let cq = self.provider().create_cq(depth)?;
        Ok(Cq::new(self.clone(), cq))
    }

    /// The next asynchronous event (`ibv_get_async_event` without blocking). On the daemon
    /// backend this asks the daemon, and a failed request is an error.
    pub fn async_event(&self) -> Result<Option<AsyncEvent>> {
        self.provider().async_event()
    }

    /// Wait for the next asynchronous event, at most `timeout` (`None`: no limit). Sleeps on
    /// an event descriptor (the runtime's, or the daemon connection's event channel).
    pub fn wait_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            if let Some(ev) = self.async_event()? {
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
            self.provider().wait_async_event(left)?;
        }
    }

    /// A descriptor that becomes readable when an asynchronous event may be waiting (for
    /// callers with their own event loop; then take events with [`Device::async_event`]).
    /// Embedded: the runtime's event descriptor. Daemon: the connection's event channel,
    /// signalled by every event of the daemon's devices (one of another process's objects
    /// makes a spurious wakeup); read 8 bytes from it to clear it.
    pub fn async_event_fd(&self) -> BorrowedFd<'_> {
        self.provider().async_event_fd()
    }

    /// A descriptor that hangs up (`POLLHUP`) when the device is gone for good, until the
    /// [`AsyncEvent::DeviceFatal`] that says so was taken: on softrdmad, when the daemon
    /// died. A wait on [`Device::async_event_fd`] that watches it too wakes for that event.
    /// `None` on the embedded device, which lives as long as the process.
    pub fn hangup_fd(&self) -> Option<BorrowedFd<'_>> {
        self.provider().hangup_fd()
    }

    /// Drive the device from the calling thread once, for loops that poll memory rather
    /// than a CQ (an RDMA WRITE ping-pong); returns the packets handled. Embedded: see
    /// `Runtime::poll_progress`. On the daemon backend the daemon drives its devices itself:
    /// this returns 0, after giving the core to the daemon when the host has few (as an
    /// empty [`crate::Cq::poll`] does; see `SOFTRDMA_POLL_YIELD` in the crate docs).
    pub fn poll_progress(&self) -> usize {
        self.provider().poll_progress()
    }

    /// The embedded runtime underneath, for what this API does not cover (raw verbs on the
    /// engine, socket counters, packet capture); `None` on the daemon backend.
    pub fn try_runtime(&self) -> Option<&Runtime> {
        self.provider().runtime()
    }

    /// The embedded runtime underneath (see [`Device::try_runtime`]).
    ///
    /// # Panics
    ///
    /// On a daemon-backend device, which has no runtime in this process: callers that may
    /// get one (any program that honours `SOFTRDMA_BACKEND`) use [`Device::try_runtime`].
    pub fn runtime(&self) -> &Runtime {
        match self.provider().runtime() {
            Some(rt) => rt,
            None => panic!(
                "Device::runtime() on a softrdmad-backed device: there is no runtime in this \
                 process (use Device::try_runtime)"
            ),
        }
    }

    /// On the daemon backend: the daemon's device name and pid.
    pub fn daemon_info(&self) -> Option<(String, u32)> {
        self.provider().daemon_info()
    }
}
