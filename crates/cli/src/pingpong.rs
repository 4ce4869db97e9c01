//! `softrdma pingpong`: what `ibv_rc_pingpong` does. Server when no peer is given; the
//! client sends a message, the server answers with one, `-n` times; both print the
//! summary lines ibv_*_pingpong print.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use softrdma::{AccessFlags, Buffer, ConnectOptions, Cq, WorkCompletion};

use crate::tool::{
    address_line, io_ctx, open_device_with, parse_mtu, wait_cq, Ctrl, PollMode, Result, ToolError,
    DEFAULT_TCP_PORT,
};

/// Transport of the ping-pong (which ibv_*_pingpong it mimics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Reliable Connected (`ibv_rc_pingpong`).
    Rc,
    /// Unreliable Connected (`ibv_uc_pingpong`).
    Uc,
    /// Unreliable Datagram (`ibv_ud_pingpong`).
    Ud,
    /// RC with a shared receive queue (`ibv_srq_pingpong`).
    Srq,
}

/// Options of `softrdma pingpong` (those of ibv_rc_pingpong that apply).
#[derive(Debug, Clone, clap::Args)]
pub struct PingpongArgs {
    /// The server to connect to; without it this is the server and waits for a client.
    pub peer: Option<String>,
    /// Transport.
    #[arg(long, value_enum, default_value_t = Mode::Rc)]
    pub mode: Mode,
    /// TCP port of the handshake.
    #[arg(short = 'p', long, default_value_t = DEFAULT_TCP_PORT)]
    pub port: u16,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 4096,
          value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    pub size: u64,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long, default_value_t = 1024)]
    pub mtu: u32,
    /// Receives kept posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub rx_depth: u32,
    /// Round trips.
    #[arg(short = 'n', long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub iters: u64,
    /// Source GID index.
    #[arg(short = 'g', long = "gid-idx", default_value_t = 0)]
    pub gid_idx: u8,
    /// Sleep on completion events at once (default: poll briefly, then sleep).
    #[arg(short = 'e', long = "events", conflicts_with = "busy")]
    pub events: bool,
    /// Spin on completions without ever sleeping.
    #[arg(long)]
    pub busy: bool,
    /// Check the content of every message received.
    #[arg(short = 'c', long = "chk")]
    pub chk: bool,
    /// Local address for the device (and the server's listening socket). Default: the
    /// address of the TCP connection.
    #[arg(short = 'B', long)]
    pub bind: Option<IpAddr>,
    /// UDP port both devices use (RoCEv2: 4791).
    #[arg(long, default_value_t = wire::ROCEV2_UDP_PORT)]
    pub udp_port: u16,
    /// Write every packet this side's device sends and receives to a pcap file.
    #[arg(long, value_name = "FILE.pcap")]
    pub capture: Option<PathBuf>,
    /// Keep the device and its connected QP open this many seconds after the run (to watch
    /// an idle device's CPU use).
    #[arg(long, value_name = "SECS", default_value_t = 0)]
    pub hold: u64,
}

/// What a ping-pong measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PingpongResult {
    /// Bytes moved both ways.
    pub bytes: u64,
    /// Round trips.
    pub iters: u64,
    /// Wall time of the loop.
    pub elapsed: Duration,
}

impl PingpongResult {
    /// The two summary lines of ibv_rc_pingpong.
    pub fn lines(&self) -> [String; 2] {
        let secs = self.elapsed.as_secs_f64();
        let usec = secs * 1e6;
        let mbit = if usec > 0.0 {
            self.bytes as f64 * 8.0 / usec
        } else {
            0.0
        };
        [
            format!(
                "{} bytes in {secs:.2} seconds = {mbit:.2} Mbit/sec",
                self.bytes
            ),
            format!(
                "{} iters in {secs:.2} seconds = {:.2} usec/iter",
                self.iters,
                usec / self.iters as f64
            ),
        ]
    }
}

/// Run the ping-pong as server or client; print what ibv_rc_pingpong prints to `out`.
pub fn run(args: &PingpongArgs, out: &mut dyn Write) -> Result<PingpongResult> {
    match args.mode {
        Mode::Rc => {}
        Mode::Uc => return Err(unsupported("UC (unreliable connected) QPs")),
        Mode::Ud => return Err(unsupported("UD (unreliable datagram) QPs")),
        Mode::Srq => return Err(unsupported("shared receive queues (SRQ)")),
    }
    let mtu = parse_mtu(args.mtu)?;
    let (mut ctrl, server) = match &args.peer {
        Some(host) => (
            Ctrl::connect(host, args.port, Duration::from_secs(10))?,
            false,
        ),
        None => {
            let ip = args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            let l = TcpListener::bind(SocketAddr::new(ip, args.port)).map_err(io_ctx(format!(
                "cannot listen on TCP {ip} port {}",
                args.port
            )))?;
            (Ctrl::accept(&l)?, true)
        }
    };
    let ip = match args.bind {
        Some(ip) if !ip.is_unspecified() => ip,
        _ => ctrl.local_ip()?,
    };
    let mode = PollMode::from_flags(args.events, args.busy);
    let dev = open_device_with(ip, args.udp_port, args.capture.as_deref(), None, mode)?;
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(args.rx_depth + 2)?;
    let qp = pd
        .qp_builder(&cq, &cq)
        .max_recv_wr(args.rx_depth)
        .max_send_wr(16)
        .build()?;
    let size = args.size as usize;
    let mr = pd.register(Buffer::zeroed(2 * size), AccessFlags::LOCAL_WRITE)?;
    // [0, size): what we send; [size, 2 size): where receives land.
    let recv_sge = mr.sge(size..2 * size)?;
    let send_sge = mr.sge(0..size)?;
    for _ in 0..args.rx_depth {
        qp.recv(RECV_ID, &[recv_sge])?;
    }
    let mut opts = ConnectOptions::default();
    opts.mtu = mtu;
    opts.sgid_index = args.gid_idx;
    let remote = ctrl.connect_qp(&qp, None, &opts)?;
    let _ = writeln!(out, "{}", address_line(" local", &qp.endpoint(None)?));
    let _ = writeln!(out, "{}", address_line("remote", &remote));
    let _ = out.flush();

    let wait = |cq: &Cq| -> Result<WorkCompletion> {
        let mut v = wait_cq(cq, 1, mode, STALL)?;
        v.pop().ok_or(ToolError::Api(softrdma::Error::Timeout))
    };
    // Wait for our receive, taking the send completion that may come first or after.
    let recv_one = |i: u64| -> Result<()> {
        loop {
            let wc = wait(&cq)?;
            if wc.wr_id == RECV_ID {
                if wc.byte_len as usize != size {
                    return Err(ToolError::Verify(format!(
                        "message {i}: {} bytes, expected {size}",
                        wc.byte_len
                    )));
                }
                qp.recv(RECV_ID, &[recv_sge])?;
                if args.chk {
                    let mut got = vec![0u8; size];
                    mr.read(size, &mut got)?;
                    if got.iter().enumerate().any(|(k, &b)| b != pattern(i, k)) {
                        return Err(ToolError::Verify(format!("message {i} has wrong content")));
                    }
                }
                return Ok(());
            }
        }
    };
    let send_one = |i: u64| -> Result<()> {
        if args.chk {
            let data: Vec<u8> = (0..size).map(|k| pattern(i, k)).collect();
            mr.write(0, &data)?;
        }
        qp.send(SEND_ID, &[send_sge])?;
        Ok(())
    };
    // Send completions are taken (and ignored) while waiting for receives.
    let start = Instant::now();
    for i in 0..args.iters {
        if server {
            recv_one(i)?;
            send_one(i)?;
        } else {
            send_one(i)?;
            recv_one(i)?;
        }
    }
    let elapsed = start.elapsed();
    let r = PingpongResult {
        bytes: 2 * args.size * args.iters,
        iters: args.iters,
        elapsed,
    };
    for l in r.lines() {
        let _ = writeln!(out, "{l}");
    }
    let _ = out.flush();
    // Let the last ACKs go out before the device closes.
    ctrl.send("BYE")?;
    let _ = ctrl.recv();
    if args.hold > 0 {
        std::thread::sleep(Duration::from_secs(args.hold));
    }
    Ok(r)
}

const RECV_ID: u64 = 1;
const SEND_ID: u64 = 2;
const STALL: Duration = Duration::from_secs(10);

/// The byte at `k` of message `i` with `--chk`.
fn pattern(i: u64, k: usize) -> u8 {
    (i as usize).wrapping_mul(31).wrapping_add(k) as u8
}

fn unsupported(what: &str) -> ToolError {
    ToolError::Unsupported(format!(
        "pingpong: {what} are not supported yet by the engine (it implements RC only); use --mode rc"
    ))
}
