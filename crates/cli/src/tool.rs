//! What the device tools share: their error type, opening a device (the backend choice,
//! `--backend`, capture), the TCP control channel between server and client, and the
//! progress bar.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use softrdma::{BackendKind, ConnectOptions, Device, Endpoint, Mtu, Qp, RemoteMr};

/// Why a device tool (devinfo, pingpong, the benchmarks, demo) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// The device or a verb failed.
    #[error(transparent)]
    Api(#[from] softrdma::Error),
    /// A socket or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The peer said something this tool does not understand.
    #[error("control channel: {0}")]
    Protocol(String),
    /// The option combination asks for something the engine cannot do yet.
    #[error("{0}")]
    Unsupported(String),
    /// A check of the data moved failed.
    #[error("verification failed: {0}")]
    Verify(String),
    /// Bad command-line input that clap could not catch.
    #[error("{0}")]
    Usage(String),
}

impl From<softrdma::HandshakeError> for ToolError {
    fn from(e: softrdma::HandshakeError) -> Self {
        ToolError::Api(softrdma::Error::Handshake(e))
    }
}

/// `Result` with [`ToolError`].
pub type Result<T, E = ToolError> = std::result::Result<T, E>;

/// Wrap an I/O error with what was being done.
pub fn io_ctx(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ToolError {
    let what = what.into();
    move |source| ToolError::Io { what, source }
}

/// The default TCP port of the connection handshake (perftest's and ibv_*_pingpong's).
pub const DEFAULT_TCP_PORT: u16 = 18515;

/// How a tool waits for completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PollMode {
    /// Poll briefly, then sleep on the completion channel (the API's blocking wait). The
    /// default: a soft RNIC's progress threads share the cores with the application, and a
    /// spinning waiter can starve the very thread that would complete its work.
    #[default]
    Hybrid,
    /// Spin on the CQ without sleeping (perftest's way; best with cores to spare).
    Busy,
    /// Sleep on the completion channel at once (`-e`).
    Events,
}

impl PollMode {
    /// From the `-e` and `--busy` flags.
    pub fn from_flags(events: bool, busy: bool) -> PollMode {
        match (events, busy) {
            (true, _) => PollMode::Events,
            (false, true) => PollMode::Busy,
            _ => PollMode::Hybrid,
        }
    }
}

/// `--backend`: the backend a device tool uses, when the user chooses one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// A device inside the tool's process, on its own UDP socket.
    Embedded,
    /// The host daemon softrdmad's device on the local address.
    Daemon,
}

impl From<BackendArg> for BackendKind {
    fn from(b: BackendArg) -> BackendKind {
        match b {
            BackendArg::Embedded => BackendKind::Embedded,
            BackendArg::Daemon => BackendKind::Daemon,
        }
    }
}

/// How a device tool opens its device: what the user chose, and tuning that applies only
/// if the device is embedded.
///
/// The backend follows the API's rule (`softrdma` crate docs, "Backends"): `--backend`,
/// else `$SOFTRDMA_BACKEND`, else embedded when an option only an embedded device has was
/// given (`--capture`, `--busy-poll`, or a `--udp-port` the daemon does not serve), else
/// softrdmad's device when a daemon answers on its control socket and serves the address,
/// else embedded.
#[derive(Debug, Clone, Default)]
pub struct DeviceOptions {
    /// `--backend`, if given.
    pub backend: Option<BackendKind>,
    /// `--udp-port`, if given: the port to receive on (an embedded device also sends to
    /// it). Default 4791, or the daemon's.
    pub udp_port: Option<u16>,
    /// `--capture`: record the device's packets (an embedded device only).
    pub capture: Option<PathBuf>,
    /// `--busy-poll`, if given: the embedded progress thread's polling after activity.
    pub busy_poll: Option<Duration>,
    /// The tool's own choice of progress-thread polling for an embedded device when
    /// `--busy-poll` is not given. Unlike `busy_poll` it chooses no backend: it applies
    /// only if the device is embedded anyway.
    pub embedded_busy_poll: Option<Duration>,
    /// How completions are waited for.
    pub mode: PollMode,
}

/// Open the device on `ip` as `o` says (see [`DeviceOptions`] for the backend rule).
pub fn open_device(ip: IpAddr, o: &DeviceOptions) -> Result<Device> {
    let mut b = Device::builder(ip);
    let explicit = match o.backend {
        Some(k) => Some(k),
        None => BackendKind::from_env()?,
    };
    if o.capture.is_some() {
        b = b.backend(capture_backend(explicit)?);
    } else if let Some(k) = o.backend {
        b = b.backend(k);
    }
    if let Some(p) = o.udp_port {
        b = b.port(p);
    }
    if let Some(d) = o.busy_poll {
        b = b.busy_poll(d);
    }
    if o.mode == PollMode::Events {
        b = b.wait_spin(Duration::ZERO);
    }
    // What only an embedded device takes is set once that is the choice: set before, it
    // would make the choice.
    let kind = b.choose_backend()?;
    b = b.backend(kind);
    if explicit.is_none() && kind == BackendKind::Daemon {
        // Chosen because a daemon answered: one that went away meanwhile is not started.
        b = b.spawn_daemon(false);
    }
    if kind == BackendKind::Embedded {
        if let Some(p) = o.udp_port {
            b = b.remote_port(p);
        }
        if let (None, Some(d)) = (o.busy_poll, o.embedded_busy_poll) {
            b = b.busy_poll(d);
        }
    }
    let dev = b.open()?;
    if let Some(path) = &o.capture {
        let cap = runtime::Capture::create(path)
            .map_err(io_ctx(format!("cannot create {}", path.display())))?;
        if let Some(rt) = dev.try_runtime() {
            rt.set_capture(Some(cap));
        }
    }
    Ok(dev)
}

/// The backend of a device that records a capture, given the explicit choice (`--backend`,
/// else `$SOFTRDMA_BACKEND`): embedded, since a capture records what an embedded device
/// sends and receives; the daemon asked for is a usage error (softrdmad's traffic is its
/// own).
pub fn capture_backend(explicit: Option<BackendKind>) -> Result<BackendKind> {
    if explicit == Some(BackendKind::Daemon) {
        return Err(ToolError::Usage(
            "--capture records an embedded device; softrdmad's traffic is its own \
             (use --backend embedded)"
                .into(),
        ));
    }
    Ok(BackendKind::Embedded)
}

/// Which backend `dev` runs on, as the tools' headers print it: `embedded`, or
/// `softrdmad (srxe0, pid 1234)`.
pub fn backend_description(dev: &Device) -> String {
    match dev.daemon_info() {
        Some((name, pid)) => format!("softrdmad ({name}, pid {pid})"),
        None => "embedded".to_string(),
    }
}

/// The device's name as `ibv_devices` would list it: the daemon's (`srxe0`...), or
/// `softrdma0` for an embedded device.
pub fn device_name(dev: &Device) -> String {
    dev.daemon_info()
        .map_or_else(|| "softrdma0".to_string(), |(name, _)| name)
}

/// Parse a path MTU in bytes (256, 512, 1024, 2048, 4096).
pub fn parse_mtu(bytes: u32) -> Result<Mtu> {
    match bytes {
        256 => Ok(Mtu::Mtu256),
        512 => Ok(Mtu::Mtu512),
        1024 => Ok(Mtu::Mtu1024),
        2048 => Ok(Mtu::Mtu2048),
        4096 => Ok(Mtu::Mtu4096),
        _ => Err(ToolError::Usage(format!(
            "invalid MTU {bytes}: use 256, 512, 1024, 2048 or 4096"
        ))),
    }
}

/// Resolve `host:port` (a name, an IPv4 or IPv6 address) to socket addresses.
pub fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(io_ctx(format!("cannot resolve {host}")))?
        .collect();
    if addrs.is_empty() {
        return Err(ToolError::Usage(format!("{host} has no address")));
    }
    Ok(addrs)
}

/// The line-based control channel between a tool's server and client (parameters, sync
/// points, results). Lines are short ASCII; a line longer than 4 KiB is a protocol error.
#[derive(Debug)]
pub struct Ctrl {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

const MAX_LINE: u64 = 4096;

impl Ctrl {
    /// Wrap a connected stream.
    pub fn new(s: TcpStream) -> Result<Ctrl> {
        // Control messages are tiny and latency-bound.
        let _ = s.set_nodelay(true);
        let w = s.try_clone().map_err(io_ctx("clone the control stream"))?;
        Ok(Ctrl {
            r: BufReader::new(s),
            w,
        })
    }

    /// Connect to a server at `host:port`, retrying for up to `wait` while it starts.
    pub fn connect(host: &str, port: u16, wait: Duration) -> Result<Ctrl> {
        let addrs = resolve(host, port)?;
        let deadline = std::time::Instant::now() + wait;
        loop {
            match TcpStream::connect(&addrs[..]) {
                Ok(s) => return Ctrl::new(s),
                Err(e) if std::time::Instant::now() < deadline => {
                    tracing_free_sleep(&e);
                }
                Err(e) => {
                    return Err(ToolError::Io {
                        what: format!("cannot connect to {host} port {port}"),
                        source: e,
                    })
                }
            }
        }
    }

    /// Accept one client on `listener`.
    pub fn accept(listener: &TcpListener) -> Result<Ctrl> {
        let (s, _) = listener.accept().map_err(io_ctx("accept"))?;
        Ctrl::new(s)
    }

    /// Our address on this connection (the address the peer reaches us on).
    pub fn local_ip(&self) -> Result<IpAddr> {
        Ok(self
            .w
            .local_addr()
            .map_err(io_ctx("control socket address"))?
            .ip())
    }

    /// The peer's address.
    pub fn peer_ip(&self) -> Result<IpAddr> {
        Ok(self
            .w
            .peer_addr()
            .map_err(io_ctx("control socket peer"))?
            .ip())
    }

    /// Send one line.
    pub fn send(&mut self, line: &str) -> Result<()> {
        let mut b = Vec::with_capacity(line.len() + 1);
        b.extend_from_slice(line.as_bytes());
        b.push(b'\n');
        self.w
            .write_all(&b)
            .map_err(io_ctx("write to the control channel"))
    }

    /// Receive one line (without its newline). End of stream is an error.
    pub fn recv(&mut self) -> Result<String> {
        let mut line = String::new();
        let n = (&mut self.r)
            .take(MAX_LINE)
            .read_line(&mut line)
            .map_err(io_ctx("read from the control channel"))?;
        if n == 0 {
            return Err(ToolError::Protocol("the peer closed the connection".into()));
        }
        if !line.ends_with('\n') {
            return Err(ToolError::Protocol("line too long or cut short".into()));
        }
        line.pop();
        Ok(line)
    }

    /// Receive a line and check it starts with `word`; return the rest, split on spaces.
    pub fn expect(&mut self, word: &str) -> Result<Vec<String>> {
        let line = self.recv()?;
        let mut it = line.split_ascii_whitespace();
        match it.next() {
            Some(w) if w == word => Ok(it.map(str::to_string).collect()),
            Some("ERR") => Err(ToolError::Protocol(format!(
                "the peer failed: {}",
                line.get(4..).unwrap_or("")
            ))),
            _ => Err(ToolError::Protocol(format!(
                "expected {word}, got {line:?}"
            ))),
        }
    }

    /// Exchange endpoints over this channel with the QP handshake of [`softrdma::handshake`],
    /// connect `qp` with `opts`, and wait until the peer is connected too.
    pub fn connect_qp(
        &mut self,
        qp: &Qp,
        mr: Option<RemoteMr>,
        opts: &ConnectOptions,
    ) -> Result<Endpoint> {
        let local = qp.endpoint(mr)?;
        let mut s = Duplex(&mut self.r, &mut self.w);
        let remote = softrdma::handshake::exchange(&mut s, &local)?;
        qp.connect_with(&remote, opts)?;
        softrdma::handshake::sync(&mut s)?;
        Ok(remote)
    }

    /// [`Ctrl::connect_qp`] for several QPs: the peer has as many, and QP `i` here connects
    /// to its QP `i`. The endpoints go in batches, both sides writing one before reading the
    /// peer's, so that thousands take a few round trips and no side blocks on a full socket.
    /// One sync at the end, as for one QP (whose exchange this is, byte for byte).
    pub fn connect_qps(
        &mut self,
        qps: &[Qp],
        mr: Option<RemoteMr>,
        opts: &ConnectOptions,
    ) -> Result<Vec<Endpoint>> {
        /// Endpoints per batch: 256 of at most 54 bytes stay far below any socket buffer.
        const BATCH: usize = 256;
        let mut s = Duplex(&mut self.r, &mut self.w);
        let mut remotes = Vec::with_capacity(qps.len());
        for chunk in qps.chunks(BATCH) {
            let mut msg = Vec::with_capacity(chunk.len() * 64);
            for qp in chunk {
                msg.extend_from_slice(&softrdma::handshake::encode(&qp.endpoint(mr)?));
            }
            s.write_all(&msg)
                .and_then(|()| s.flush())
                .map_err(softrdma::HandshakeError::Io)?;
            for qp in chunk {
                let remote = softrdma::handshake::read_endpoint(&mut s)?;
                qp.connect_with(&remote, opts)?;
                remotes.push(remote);
            }
        }
        softrdma::handshake::sync(&mut s)?;
        Ok(remotes)
    }

    /// Set (or clear) a read timeout.
    pub fn set_read_timeout(&self, t: Option<Duration>) -> Result<()> {
        self.w
            .set_read_timeout(t)
            .map_err(io_ctx("set a read timeout"))
    }

    /// Is a line (or end of stream) waiting? Never blocks.
    pub fn readable(&mut self) -> Result<bool> {
        if !self.r.buffer().is_empty() {
            return Ok(true);
        }
        self.w
            .set_nonblocking(true)
            .map_err(io_ctx("control socket"))?;
        let mut b = [0u8; 1];
        let r = self.w.peek(&mut b);
        self.w
            .set_nonblocking(false)
            .map_err(io_ctx("control socket"))?;
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(io_ctx("control socket")(e)),
        }
    }
}

fn tracing_free_sleep(_e: &std::io::Error) {
    std::thread::sleep(Duration::from_millis(50));
}

/// The buffered reader and the writer of one stream, as one `Read + Write`.
struct Duplex<'a>(&'a mut BufReader<TcpStream>, &'a mut TcpStream);

impl Read for Duplex<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Duplex<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.1.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.1.flush()
    }
}

/// A progress bar over `len` steps, shown only when stdout is a terminal and the run is
/// long enough to deserve one.
pub fn progress_bar(len: u64, label: &str, show: bool) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !show || !std::io::stdout().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    let style = indicatif::ProgressStyle::with_template(
        " {prefix:>10} [{bar:40}] {pos}/{len} {msg} ({eta} left)",
    )
    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
    .progress_chars("=> ");
    pb.set_style(style);
    pb.set_prefix(label.to_string());
    pb
}

/// Format a QP's address line as ibv_rc_pingpong and perftest print it.
pub fn address_line(which: &str, e: &Endpoint) -> String {
    format!(
        " {which} address: LID 0x0000, QPN {:#08x}, PSN {:#08x}, GID {}",
        e.qpn,
        e.psn,
        e.gid.to_ip()
    )
}

/// Wait for one completion on `cq` the way `mode` says, at most `stall`; an error status is an
/// error.
pub fn wait_cq(
    cq: &softrdma::Cq,
    max: usize,
    mode: PollMode,
    stall: Duration,
) -> Result<Vec<softrdma::WorkCompletion>> {
    let v = if mode == PollMode::Busy {
        let t0 = std::time::Instant::now();
        let mut n = 0u32;
        loop {
            let v = cq.poll(max)?;
            if !v.is_empty() {
                break v;
            }
            // Reading the clock on every look cost a fifth of the spinning thread's time.
            n = n.wrapping_add(1);
            if n.is_multiple_of(1024) && t0.elapsed() > stall {
                return Err(softrdma::Error::Timeout.into());
            }
            std::hint::spin_loop();
        }
    } else {
        cq.wait(max, Some(stall))?
    };
    for wc in &v {
        if wc.status != softrdma::WcStatus::Success {
            return Err(softrdma::Error::Completion {
                wr_id: wc.wr_id,
                status: wc.status,
            }
            .into());
        }
    }
    Ok(v)
}
