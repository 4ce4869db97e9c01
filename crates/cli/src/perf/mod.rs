//! The perftest-compatible benchmarks: `write_bw read_bw send_bw atomic_bw` and
//! `write_lat read_lat send_lat atomic_lat`.
//!
//! As with perftest, the same command without a peer is the server and with one is the
//! client; here the server follows the client's parameters (size, iterations, depth...), so
//! only the client needs them. The two talk over TCP (`-p`, default 18515): the client sends
//! its parameters as one text line, both run the QP handshake of `softrdma::handshake`, then
//! each message size is one `SIZE` / `READY` / `DONE` exchange around the measured run, and
//! `--baseline` adds raw-socket measurements on the same two addresses (UDP, UDP with
//! GSO/GRO, TCP; see
//! [`crate::baseline`]). `--loopback` runs both sides in this process (server on
//! 127.0.0.2, client on 127.0.0.1).
//!
//! What is measured follows perftest: bandwidth tests keep `-t` work requests outstanding
//! (one signaled every `min(100, t/4)`), from the first post to the last completion;
//! `write_lat` and `send_lat` are ping-pongs reporting half the round trip; `read_lat` and
//! `atomic_lat` report the whole operation. Completions are busy-polled (`-e` sleeps on the
//! completion channel instead).
//!
//! Each side opens the device on its address by the tools' backend rule
//! ([`crate::tool::DeviceOptions`]): `--backend`, else `SOFTRDMA_BACKEND`, else embedded when
//! `--capture`, `--busy-poll` or a `--udp-port` softrdmad does not serve asks for it, else
//! `softrdmad`'s device when a daemon answers and serves the address, else embedded. The
//! header says which (`Backend`). Two processes on the same address of one daemon share its
//! device, and their traffic never leaves the daemon. `--baseline` also prints, for
//! bandwidth tests, a memcpy of message-size buffers in the client process: the in-memory
//! copy rate a same-host transfer is measured against.

pub mod report;

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, Buffer, ConnectOptions, Cq, Device, MemoryRegion, Pd, Qp, RemoteMr, SendFlags,
    SendOp, SendWr, WcStatus, WorkCompletion,
};

use crate::baseline;
use crate::tool::{
    io_ctx, open_device, parse_mtu, progress_bar, wait_cq, BackendArg, Ctrl, DeviceOptions,
    PollMode, Result, ToolError,
};
use report::{BwResult, LatStats, RULE};

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Test {
    /// RDMA WRITE bandwidth (`ib_write_bw`).
    WriteBw,
    /// RDMA READ bandwidth (`ib_read_bw`).
    ReadBw,
    /// SEND bandwidth (`ib_send_bw`).
    SendBw,
    /// ATOMIC bandwidth (`ib_atomic_bw`).
    AtomicBw,
    /// RDMA WRITE ping-pong latency (`ib_write_lat`).
    WriteLat,
    /// RDMA READ latency (`ib_read_lat`).
    ReadLat,
    /// SEND ping-pong latency (`ib_send_lat`).
    SendLat,
    /// ATOMIC latency (`ib_atomic_lat`).
    AtomicLat,
}

impl Test {
    /// Every test.
    pub const ALL: [Test; 8] = [
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
        Test::AtomicBw,
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
        Test::AtomicLat,
    ];

    /// The command name (`write_bw`...).
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
            Test::AtomicBw => "atomic_bw",
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
            Test::AtomicLat => "atomic_lat",
        }
    }

    /// The test named `s`.
    pub fn from_name(s: &str) -> Option<Test> {
        Test::ALL.into_iter().find(|t| t.name() == s)
    }

    /// A latency test (else bandwidth).
    pub fn is_lat(self) -> bool {
        matches!(
            self,
            Test::WriteLat | Test::ReadLat | Test::SendLat | Test::AtomicLat
        )
    }

    fn is_atomic(self) -> bool {
        matches!(self, Test::AtomicBw | Test::AtomicLat)
    }

    fn is_send(self) -> bool {
        matches!(self, Test::SendBw | Test::SendLat)
    }

    /// Ping-pongs report half the round trip.
    fn halves_rtt(self) -> bool {
        matches!(self, Test::WriteLat | Test::SendLat)
    }

    fn title(self, cas: bool) -> String {
        let op = match self {
            Test::WriteBw | Test::WriteLat => "RDMA_Write",
            Test::ReadBw | Test::ReadLat => "RDMA_Read",
            Test::SendBw | Test::SendLat => "Send",
            Test::AtomicBw | Test::AtomicLat if cas => "Atomic CMP_AND_SWAP",
            Test::AtomicBw | Test::AtomicLat => "Atomic FETCH_AND_ADD",
        };
        let kind = if self.is_lat() { "Latency" } else { "BW" };
        format!("{op} {kind} Test")
    }

    /// Bytes of the UDP payload of one RoCEv2 request packet carrying `payload` bytes (BTH,
    /// extension headers, pad, ICRC): the datagram size the raw-socket baseline uses.
    pub fn datagram_len(self, payload: u64) -> usize {
        let pad = |n: u64| ((4 - n % 4) % 4) as usize;
        let p = payload as usize;
        match self {
            Test::WriteBw | Test::WriteLat => 12 + 16 + p + pad(payload) + 4,
            Test::SendBw | Test::SendLat => 12 + p + pad(payload) + 4,
            // READ: the response carries the data (BTH, AETH on first/last/only).
            Test::ReadBw | Test::ReadLat => 12 + 4 + p + pad(payload) + 4,
            Test::AtomicBw | Test::AtomicLat => 12 + 28 + 4,
        }
    }
}

/// Atomic operation of the atomic tests (perftest `-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
#[allow(non_camel_case_types)]
pub enum AtomicType {
    /// Fetch-and-add (perftest's default).
    #[default]
    FETCH_AND_ADD,
    /// Compare-and-swap.
    CMP_AND_SWAP,
}

/// Options of every benchmark (perftest's common ones where they make sense).
#[derive(Debug, Clone, clap::Args)]
pub struct PerfArgs {
    /// The server to connect to; without it this is the server and waits for a client.
    pub peer: Option<String>,
    /// Message size in bytes (default: 65536 for bandwidth, 2 for latency; 8 for atomics).
    #[arg(short = 's', long, conflicts_with = "all")]
    pub size: Option<u64>,
    /// Run every size from 2 to 2^23 bytes (powers of two).
    #[arg(short = 'a', long)]
    pub all: bool,
    /// Iterations per size (default: 5000 for bandwidth, 1000 for latency).
    #[arg(short = 'n', long, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub iters: Option<u64>,
    /// Work requests kept outstanding (bandwidth tests; default 128).
    #[arg(short = 't', long = "tx-depth", alias = "tx_depth",
          value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub tx_depth: Option<u32>,
    /// Connected RC QPs between the two sides (bandwidth tests; perftest's -q): the messages
    /// go round-robin over them, each QP keeps its share of the -t work requests outstanding
    /// (at least one), and all complete on one CQ. -n counts messages over all QPs.
    #[arg(short = 'q', long = "qp", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_QPS)))]
    pub qps: u32,
    /// Run each size for this many seconds instead of a number of iterations (bandwidth).
    #[arg(short = 'D', long, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub duration: Option<u64>,
    /// TCP port of the handshake (0 with --loopback: any free port).
    #[arg(short = 'p', long, default_value_t = crate::tool::DEFAULT_TCP_PORT)]
    pub port: u16,
    /// Report bandwidth in Gb/sec (10^9 bits) instead of MB/sec (2^20 bytes).
    #[arg(long = "report_gbits", alias = "report-gbits")]
    pub report_gbits: bool,
    /// Local address: the device's (and, on the server, the one it listens on). Default:
    /// the address of the TCP connection (server: all addresses).
    #[arg(short = 'B', long)]
    pub bind: Option<IpAddr>,
    /// UDP port both devices use [default: 4791 (RoCEv2), or softrdmad's]. A port
    /// softrdmad does not serve opens an embedded device. Captures of other ports still
    /// decode: they record packets as the engine builds them.
    #[arg(long)]
    pub udp_port: Option<u16>,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096).
    #[arg(short = 'm', long, default_value_t = 4096)]
    pub mtu: u32,
    /// Atomic operation of the atomic tests.
    #[arg(short = 'A', long = "atomic_type", value_enum, default_value_t = AtomicType::FETCH_AND_ADD)]
    pub atomic_type: AtomicType,
    /// Also measure raw sockets on the same path (UDP ping-pong; UDP, UDP GSO/GRO and TCP
    /// streams) and print them and the ratio under the table.
    #[arg(long)]
    pub baseline: bool,
    /// Run server and client in this process on loopback (127.0.0.2 and 127.0.0.1). Each
    /// device follows the backend rule on its own (softrdmad often serves 127.0.0.1 and not
    /// 127.0.0.2), except that --capture makes both embedded.
    #[arg(long, conflicts_with = "peer")]
    pub loopback: bool,
    /// Write every packet this side's device sends and receives to a pcap file (an
    /// embedded device).
    #[arg(long, value_name = "FILE.pcap")]
    pub capture: Option<PathBuf>,
    /// Backend: embedded (a device in this process) or daemon (softrdmad's device on the
    /// local address). Default: $SOFTRDMA_BACKEND, else embedded when --capture,
    /// --busy-poll or a --udp-port softrdmad does not serve asks for it, else softrdmad
    /// when it answers on its socket and serves the address, else embedded.
    #[arg(long, value_enum, value_name = "KIND")]
    pub backend: Option<BackendArg>,
    /// Sleep on the completion channel at once (default: poll briefly, then sleep).
    #[arg(short = 'e', long = "events", conflicts_with = "busy")]
    pub events: bool,
    /// Spin on completions (and on memory, for write_lat) without ever sleeping, as perftest
    /// does; best when the machine has cores to spare for the devices' progress threads.
    #[arg(long)]
    pub busy: bool,
    /// Source GID index (perftest -x).
    #[arg(short = 'x', long = "gid-index", default_value_t = 0)]
    pub gid_index: u8,
    /// Device name, accepted for perftest compatibility: the device is the one on the local
    /// address (softrdmad's or an embedded one).
    #[arg(short = 'd', long = "ib-dev", value_name = "NAME")]
    pub ib_dev: Option<String>,
    /// Port number, accepted for perftest compatibility: a soft device has port 1 only.
    #[arg(short = 'i', long = "ib-port", default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=1))]
    pub ib_port: u8,
    /// Accepted for perftest compatibility (it silences CPU-frequency warnings): no effect.
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// How long each device's progress thread keeps polling its socket after activity
    /// before it sleeps, in microseconds, fixed (default: learned by the runtime, up to
    /// 64 us when packets keep following its sleeps closely). An embedded device's.
    #[arg(long, value_name = "USEC")]
    pub busy_poll: Option<u64>,
    /// The progress-thread polling, in microseconds, of a device that is embedded anyway
    /// when `--busy-poll` is not given: `--loopback` sets it on small machines. Not an
    /// option, since unlike `--busy-poll` it chooses no backend.
    #[arg(skip)]
    pub embedded_busy_poll: Option<u64>,
}

/// What the client asks the server for; one text line on the control channel.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Params {
    test: Test,
    sizes: Vec<u64>,
    iters: u64,
    duration_ms: u64,
    tx_depth: u32,
    mtu: u32,
    cas: bool,
    /// Connected QPs (`-q`).
    qps: u32,
}

/// Most QPs `-q` asks for (perftest's limit); the device's `max_qp` and `max_cqe` may allow
/// fewer, which `Side::new` reports.
pub const MAX_QPS: u32 = 16384;

/// Largest message (perftest's -a limit) and so the largest region each side registers.
const MAX_SIZE: u64 = 1 << 23;
/// Receives kept posted by the side that receives SENDs.
const RX_DEPTH: u32 = 512;
/// Latency loops signal one send in this many, and poll the send CQ once in this many.
const LAT_SIGNAL_EVERY: u64 = 16;
/// How long the default poll mode spins on a CQ before it sleeps (a spinning thread drives
/// the device itself, so it starves no progress thread).
const HYBRID_SPIN: Duration = Duration::from_millis(1);
/// Longest wait for any one completion or memory change before the run is declared stuck.
const STALL: Duration = Duration::from_secs(10);

impl Params {
    fn from_args(test: Test, a: &PerfArgs) -> Result<Params> {
        parse_mtu(a.mtu)?;
        let sizes = if test.is_atomic() {
            vec![8]
        } else if a.all {
            (1..=23).map(|i| 1u64 << i).collect()
        } else {
            let s = a.size.unwrap_or(if test.is_lat() { 2 } else { 65536 });
            if s == 0 || s > MAX_SIZE {
                return Err(ToolError::Usage(format!(
                    "size {s} out of range: 1..={MAX_SIZE}"
                )));
            }
            vec![s]
        };
        if test.is_lat() && a.duration.is_some() {
            return Err(ToolError::Usage(
                "-D is for bandwidth tests; latency tests run -n iterations".into(),
            ));
        }
        if !(1..=MAX_QPS).contains(&a.qps) {
            return Err(ToolError::Usage(format!(
                "-q {}: the number of QPs must be 1..={MAX_QPS}",
                a.qps
            )));
        }
        if test.is_lat() && a.qps > 1 {
            return Err(ToolError::Usage(
                "-q is for bandwidth tests; latency tests run one QP".into(),
            ));
        }
        Ok(Params {
            test,
            sizes,
            iters: a.iters.unwrap_or(if test.is_lat() { 1000 } else { 5000 }),
            duration_ms: a.duration.map_or(0, |d| d * 1000),
            tx_depth: a.tx_depth.unwrap_or(if test.is_lat() { 1 } else { 128 }),
            mtu: a.mtu,
            cas: a.atomic_type == AtomicType::CMP_AND_SWAP,
            qps: a.qps,
        })
    }

    fn to_line(&self) -> String {
        let sizes: Vec<String> = self.sizes.iter().map(u64::to_string).collect();
        format!(
            "PARAMS test={} sizes={} iters={} duration_ms={} tx_depth={} mtu={} cas={} qps={}",
            self.test.name(),
            sizes.join(","),
            self.iters,
            self.duration_ms,
            self.tx_depth,
            self.mtu,
            u8::from(self.cas),
            self.qps
        )
    }

    /// Parse and bound-check a client's line (untrusted input).
    fn from_line(line: &str) -> Result<Params> {
        let bad = |what: &str| ToolError::Protocol(format!("bad PARAMS ({what}): {line:?}"));
        let mut it = line.split_ascii_whitespace();
        if it.next() != Some("PARAMS") {
            return Err(bad("not PARAMS"));
        }
        let mut p = Params {
            test: Test::WriteBw,
            sizes: vec![],
            iters: 0,
            duration_ms: 0,
            tx_depth: 0,
            mtu: 0,
            cas: false,
            // A client that predates -q runs one.
            qps: 1,
        };
        let mut seen_test = false;
        for kv in it {
            let (k, v) = kv.split_once('=').ok_or_else(|| bad(kv))?;
            let num = |v: &str| v.parse::<u64>().map_err(|_| bad(k));
            match k {
                "test" => {
                    p.test = Test::from_name(v).ok_or_else(|| bad("test"))?;
                    seen_test = true;
                }
                "sizes" => {
                    p.sizes = v.split(',').map(num).collect::<Result<_>>()?;
                }
                "iters" => p.iters = num(v)?,
                "duration_ms" => p.duration_ms = num(v)?,
                "tx_depth" => p.tx_depth = u32::try_from(num(v)?).map_err(|_| bad(k))?,
                "mtu" => p.mtu = u32::try_from(num(v)?).map_err(|_| bad(k))?,
                "cas" => p.cas = num(v)? != 0,
                "qps" => p.qps = u32::try_from(num(v)?).map_err(|_| bad(k))?,
                // Later clients may send more; ignore what we do not know.
                _ => {}
            }
        }
        let sizes_ok = !p.sizes.is_empty()
            && p.sizes.len() <= 64
            && p.sizes.iter().all(|&s| (1..=MAX_SIZE).contains(&s));
        if !seen_test
            || !sizes_ok
            || !(1..=1_000_000_000).contains(&p.iters)
            || p.duration_ms > 3_600_000
            || !(1..=8192).contains(&p.tx_depth)
            || !(1..=MAX_QPS).contains(&p.qps)
            || (p.test.is_lat() && p.qps != 1)
            || parse_mtu(p.mtu).is_err()
        {
            return Err(bad("values out of range"));
        }
        Ok(p)
    }

    fn max_size(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(8).max(8)
    }

    /// Work requests one QP may have outstanding: its share of `-t`, at least one. (perftest
    /// gives every QP the whole `-t`; here `-t` is what is outstanding in all, so that every
    /// `-q` puts the same load on the path and 10 000 QPs do not flood it.)
    fn depth_per_qp(&self) -> u32 {
        self.tx_depth.div_ceil(self.qps).max(1)
    }

    /// Receives each QP keeps posted on the side that receives SENDs: its share of
    /// [`RX_DEPTH`], raised to twice what the sender keeps outstanding on it when the share
    /// is smaller, never above `RX_DEPTH` (as with one QP, a deeper sender may meet RNR NAKs).
    fn recvs_per_qp(&self) -> u32 {
        (RX_DEPTH / self.qps)
            .max(2 * self.depth_per_qp())
            .min(RX_DEPTH)
    }
}

/// Everything one side of a benchmark holds.
struct Side {
    dev: Device,
    _pd: Pd,
    /// The send CQ, shared by every QP, as perftest shares one.
    scq: Cq,
    /// The receive CQ, shared likewise.
    rcq: Cq,
    /// The connected QPs (`-q`); latency tests have one.
    qps: Vec<Qp>,
    /// `[0, max)`: what this side sends / where READ results land; `[max, 2 max)`: where the
    /// peer's ping-pong writes land.
    mr: MemoryRegion<Buffer>,
    max: u64,
    /// Receives currently posted, per QP.
    recvs_posted: Vec<u32>,
    /// Receives each QP keeps posted.
    recvs_per_qp: u32,
    mode: PollMode,
    /// The default mode's spinning, given up for a while when another thread took the core.
    spin: Spin,
}

/// When the default poll mode spins. Spinning pays only while the thread has a core to
/// itself: when another runnable thread shares it (a CPU-bound neighbour), a spinning
/// thread that gives its core away gets it back only after the neighbour's time slice,
/// where a thread woken from sleep preempts the neighbour at once. A spin in which two
/// looks lay more than [`PREEMPTED`] apart saw the core taken: sleep at once for
/// [`SPIN_OFF`] (the rule the runtime's progress thread follows for its own polling).
#[derive(Debug, Default)]
struct Spin {
    off_until: std::cell::Cell<Option<Instant>>,
}

/// Two looks of a spin further apart than this: the core was taken meanwhile.
const PREEMPTED: Duration = Duration::from_micros(500);
/// How long a thread that was preempted while spinning sleeps at once instead.
const SPIN_OFF: Duration = Duration::from_millis(100);

impl Spin {
    /// Whether a wait that started at `t0` keeps spinning at `now`, the previous look
    /// having been at `last`: for [`HYBRID_SPIN`] at most, and not while spinning is off.
    fn keeps_on(&self, t0: Instant, last: Instant, now: Instant) -> bool {
        if now.duration_since(last) > PREEMPTED {
            self.off_until.set(Some(now + SPIN_OFF));
            return false;
        }
        now.duration_since(t0) < HYBRID_SPIN
    }

    /// Whether spinning is allowed at all now.
    fn allowed(&self) -> bool {
        self.off_until.get().is_none_or(|t| Instant::now() >= t)
    }
}

/// The device on `ip`, by the tools' backend rule with this benchmark's options.
fn open_perf_device(ip: IpAddr, a: &PerfArgs, mode: PollMode) -> Result<Device> {
    open_device(
        ip,
        &DeviceOptions {
            backend: a.backend.map(Into::into),
            udp_port: a.udp_port,
            capture: a.capture.clone(),
            busy_poll: a.busy_poll.map(Duration::from_micros),
            embedded_busy_poll: a.embedded_busy_poll.map(Duration::from_micros),
            mode,
        },
    )
}

fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

impl Side {
    fn new(p: &Params, ip: IpAddr, a: &PerfArgs) -> Result<Side> {
        let mode = PollMode::from_flags(a.events, a.busy);
        let dev = open_perf_device(ip, a, mode)?;
        let pd = dev.alloc_pd()?;
        let n = p.qps;
        // One QP keeps the room it always had: latency loops leave up to LAT_SIGNAL_EVERY
        // sends unsignaled. Several keep their share of -t, and a signaled one more.
        let send_depth = if n == 1 {
            p.tx_depth.max(128) + 1
        } else {
            p.depth_per_qp() + 1
        };
        let recv_depth = p.recvs_per_qp();
        // Every QP's signaled sends (and posted receives) may complete before one poll.
        let scq_depth = u64::from(n) * u64::from(send_depth) + 64;
        let rcq_depth = u64::from(n) * u64::from(recv_depth) + 64;
        check_limits(
            &dev,
            n,
            send_depth.max(recv_depth),
            scq_depth.max(rcq_depth),
        )?;
        let scq = dev.create_cq(scq_depth as u32)?;
        let rcq = dev.create_cq(rcq_depth as u32)?;
        let mut qps = Vec::with_capacity(n as usize);
        for _ in 0..n {
            qps.push(
                pd.qp_builder(&scq, &rcq)
                    .max_send_wr(send_depth)
                    .max_recv_wr(recv_depth)
                    .build()?,
            );
        }
        let max = p.max_size();
        let mr = pd.register(Buffer::zeroed((2 * max) as usize), all_access())?;
        let mut side = Side {
            dev,
            _pd: pd,
            scq,
            rcq,
            qps,
            mr,
            max,
            recvs_posted: vec![0; n as usize],
            recvs_per_qp: recv_depth,
            spin: Spin::default(),
            mode,
        };
        if p.test.is_send() {
            side.fill_recvs()?;
        }
        Ok(side)
    }

    fn connect_opts(p: &Params, a: &PerfArgs) -> Result<ConnectOptions> {
        let mut o = ConnectOptions::default();
        o.mtu = parse_mtu(p.mtu)?;
        o.sgid_index = a.gid_index;
        Ok(o)
    }

    /// The first QP: the one of latency tests, and the one whose addresses the header shows.
    fn qp(&self) -> &Qp {
        // `Side::new` creates at least one (-q is 1 or more).
        &self.qps[0]
    }

    /// Keep `recvs_per_qp` receives posted on every QP.
    fn fill_recvs(&mut self) -> Result<()> {
        for k in 0..self.qps.len() {
            self.fill_recvs_of(k)?;
        }
        Ok(())
    }

    /// Keep `recvs_per_qp` receives posted on QP `k`, each able to take the largest message;
    /// a receive's `wr_id` is its QP's index.
    fn fill_recvs_of(&mut self, k: usize) -> Result<()> {
        while self.recvs_posted[k] < self.recvs_per_qp {
            self.qps[k].recv(k as u64, &[self.mr.sge(0..self.max as usize)?])?;
            self.recvs_posted[k] += 1;
        }
        Ok(())
    }

    /// Wait for completions on `cq` as the poll mode says. The default mode polls first:
    /// an empty poll drives the device from this thread (it receives the packet that
    /// completes the work itself, with no thread switch), and only a long wait sleeps.
    fn wait(&self, cq: &Cq, max: usize) -> Result<Vec<WorkCompletion>> {
        if self.mode == PollMode::Hybrid && self.spin.allowed() {
            let t0 = Instant::now();
            let mut last = t0;
            let mut n = 0u32;
            let rt = self.dev.try_runtime();
            loop {
                let v = cq.poll(max)?;
                if !v.is_empty() {
                    return check_all(v);
                }
                // An empty poll receives on this thread; saying so explicitly now and then
                // keeps the progress thread off the socket however the runtime judges CQ
                // polls (see `Runtime::poll_progress`).
                if let Some(rt) = rt.filter(|_| n.is_multiple_of(16)) {
                    rt.poll_progress();
                }
                // Reading the clock on every look would cost more than the look.
                n = n.wrapping_add(1);
                if n.is_multiple_of(64) {
                    let now = Instant::now();
                    if !self.spin.keeps_on(t0, last, now) {
                        break;
                    }
                    last = now;
                }
                std::hint::spin_loop();
            }
        }
        wait_cq(cq, max, self.mode, STALL)
    }

    /// The receiving side of send_bw: reap receive completions and repost until the client's
    /// `DONE <n>` says how many messages it sent and all of them came. Returns that count.
    /// Waits as the poll mode says: the default polls (on the embedded device an empty poll
    /// receives on this thread) for [`HYBRID_SPIN`] after the last completion before it
    /// sleeps on the CQ, so that a sender faster than one wakeup per receive queue never
    /// finds the queue empty (an RNR NAK costs the sender its RNR delay and a go-back-N).
    fn receive_all(&mut self, ctrl: &mut Ctrl) -> Result<u64> {
        let (mut got, mut expected) = (0u64, u64::MAX);
        let mut idle_since: Option<Instant> = None;
        let mut last = Instant::now();
        let mut looks = 0u32;
        while got < expected {
            let n = self.reap_recvs()?;
            if n > 0 {
                got += n;
                idle_since = None;
                continue;
            }
            looks = looks.wrapping_add(1);
            // The control socket only while idle, and not on every look (a system call).
            if expected == u64::MAX && looks.is_multiple_of(64) && ctrl.readable()? {
                expected = done_count(&ctrl.expect("DONE")?)?;
                continue;
            }
            let now = Instant::now();
            if idle_since.is_none() {
                // Only the gaps between idle looks say whether the core was taken.
                last = now;
            }
            let idle = *idle_since.get_or_insert(now);
            let spins = match self.mode {
                PollMode::Busy => true,
                PollMode::Hybrid => self.spin.allowed() && self.spin.keeps_on(idle, last, now),
                PollMode::Events => false,
            };
            last = now;
            if spins {
                if looks.is_multiple_of(16) {
                    if let Some(rt) = self.dev.try_runtime() {
                        rt.poll_progress();
                    }
                }
                std::hint::spin_loop();
                continue;
            }
            // Sleep on the receive CQ. Arm first, then look once more: a completion that
            // came between the last look and the arming raises no event.
            self.rcq.req_notify()?;
            let late = self.reap_recvs()?;
            got += late;
            if late == 0 {
                let _ = runtime::wait_readable(
                    std::os::fd::AsFd::as_fd(&self.rcq),
                    Some(Duration::from_millis(1)),
                );
            }
            self.rcq.clear_notification();
            idle_since = None;
            looks = 63;
        }
        Ok(expected)
    }

    /// Take receive completions from the receive CQ (without waiting) and repost on the
    /// QPs they came from.
    fn reap_recvs(&mut self) -> Result<u64> {
        let v = check_all(self.rcq.poll(64)?)?;
        for wc in &v {
            let k = usize::try_from(wc.wr_id)
                .ok()
                .filter(|&k| k < self.qps.len())
                .ok_or_else(|| ToolError::Verify(format!("a receive with wr_id {}", wc.wr_id)))?;
            self.recvs_posted[k] = self.recvs_posted[k].saturating_sub(1);
            self.fill_recvs_of(k)?;
        }
        Ok(v.len() as u64)
    }

    /// Drain send completions without waiting (latency loops signal one send in
    /// [`LAT_SIGNAL_EVERY`]).
    fn drain_sends(&self) -> Result<()> {
        for wc in self.scq.poll(64)? {
            if wc.status != WcStatus::Success {
                return Err(softrdma::Error::Completion {
                    wr_id: wc.wr_id,
                    status: wc.status,
                }
                .into());
            }
        }
        Ok(())
    }

    /// The byte at `off` of the region (one byte read, not the whole region: on the daemon
    /// a look at the whole region copies it).
    fn byte_at(&self, off: usize) -> Result<u8> {
        let mut b = [0u8];
        self.mr.read(off, &mut b)?;
        Ok(b[0])
    }

    /// Busy-wait until the byte at `off` equals `v` (the peer's WRITE landed; its last byte
    /// lands last). Each look also drives the device from this thread, so the WRITE is
    /// received and placed here, with no thread switch.
    fn wait_byte(&self, off: usize, v: u8) -> Result<()> {
        let t0 = Instant::now();
        let rt = self.dev.try_runtime();
        let mut n = 0u32;
        while self.byte_at(off)? != v {
            if let Some(rt) = rt {
                // Look at memory again once packets came in (now and then anyway: the
                // progress thread may have taken over).
                for _ in 0..16 {
                    if rt.poll_progress() > 0 {
                        break;
                    }
                }
            } else {
                // softrdmad's progress thread places the write: on a host with few cores,
                // this gives it the core at every look (measured on 2 CPUs: write_lat 2 B
                // one-way 510 us when yielding only after 1 ms).
                self.dev.poll_progress();
            }
            n = n.wrapping_add(1);
            if n.is_multiple_of(4096) && t0.elapsed() > STALL {
                return Err(ToolError::Verify(format!(
                    "the peer's write (tag {v}) did not arrive within {STALL:?}"
                )));
            }
        }
        Ok(())
    }
}

/// Say clearly when `n` QPs with queues of `wr` entries and CQs of `cqe` entries are more than
/// the device offers, rather than fail on the first QP or CQ past its limit.
fn check_limits(dev: &Device, n: u32, wr: u32, cqe: u64) -> Result<()> {
    let a = dev.query_device();
    if n > a.max_qp {
        return Err(ToolError::Unsupported(format!(
            "-q {n}: the device offers at most {} QPs (max_qp)",
            a.max_qp
        )));
    }
    if wr > a.max_qp_wr {
        return Err(ToolError::Unsupported(format!(
            "a queue of {wr} work requests is more than the device's max_qp_wr {}: lower -t",
            a.max_qp_wr
        )));
    }
    if cqe > u64::from(a.max_cqe) {
        return Err(ToolError::Unsupported(format!(
            "-q {n} needs a CQ of {cqe} entries (each QP's outstanding work requests), more \
             than the device's max_cqe {}: lower -q or -t",
            a.max_cqe
        )));
    }
    Ok(())
}

/// Fail on the first completion that is not a success.
fn check_all(v: Vec<WorkCompletion>) -> Result<Vec<WorkCompletion>> {
    for wc in &v {
        if wc.status != WcStatus::Success {
            return Err(softrdma::Error::Completion {
                wr_id: wc.wr_id,
                status: wc.status,
            }
            .into());
        }
    }
    Ok(v)
}

/// The WR of one operation of `test` on `size` bytes.
fn work_request(
    test: Test,
    cas: bool,
    side: &Side,
    size: u64,
    remote: &RemoteMr,
    wr_id: u64,
    signaled: bool,
) -> Result<SendWr> {
    let sge = side.mr.sge(0..size as usize)?;
    let op = match test {
        Test::WriteBw | Test::WriteLat => SendOp::RdmaWrite {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        },
        Test::ReadBw | Test::ReadLat => SendOp::RdmaRead {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        },
        Test::SendBw | Test::SendLat => SendOp::Send,
        Test::AtomicBw | Test::AtomicLat if cas => SendOp::AtomicCmpSwap {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            compare: 0,
            swap: 0,
        },
        Test::AtomicBw | Test::AtomicLat => SendOp::AtomicFetchAdd {
            remote_addr: remote.addr,
            rkey: remote.rkey,
            add: 1,
        },
    };
    let mut wr = SendWr::new(wr_id, op, vec![sge]);
    if !signaled {
        wr.flags.remove(SendFlags::SIGNALED);
    }
    Ok(wr)
}

/// Where one QP of a bandwidth run stands.
#[derive(Debug, Clone, Copy, Default)]
struct QpRun {
    /// Messages posted.
    posted: u64,
    /// Messages completed (a signaled completion completes every earlier WR of its QP).
    done: u64,
    /// Messages this QP posts in all (`u64::MAX` until a timed run's deadline).
    target: u64,
}

/// A bandwidth WR's `wr_id`: the QP's index above [`WR_SEQ_BITS`], the QP's own message
/// number below.
const WR_SEQ_BITS: u32 = 40;

/// The client's side of one bandwidth run: `p.iters` messages (or `p.duration_ms`), message
/// i on QP i mod n, at most `-t` outstanding in all and each QP's share of it on one QP.
///
/// With more QPs than `-t`, only `-t` of them have a message outstanding at any time: the
/// load is the same for every `-q`, so the cost per message shows what the QPs cost.
fn bw_client(side: &Side, p: &Params, size: u64, remote: &RemoteMr) -> Result<BwResult> {
    let n = side.qps.len();
    let window = u64::from(p.tx_depth);
    let depth = u64::from(p.depth_per_qp());
    // Each QP signals one WR in cq_mod of its own. Its unsignaled tail (< cq_mod) waits for
    // its next signaled WR; the tails of all QPs together stay below the window, so a full
    // window always holds a signaled WR.
    let cq_mod = (depth / 4).clamp(1, 100);
    let timed = p.duration_ms > 0;
    let mut qps: Vec<QpRun> = (0..n as u64)
        .map(|k| QpRun {
            // Round-robin: QP k gets iters / n messages, one more if k < iters mod n.
            target: if timed {
                u64::MAX
            } else {
                p.iters / n as u64 + u64::from(k < p.iters % n as u64)
            },
            ..QpRun::default()
        })
        .collect();
    let mut total = if timed { u64::MAX } else { p.iters };
    let (mut posted, mut done) = (0u64, 0u64);
    let mut next = 0usize;
    // After a timed run's deadline: QPs whose last WR was unsignaled, owed one signaled WR.
    let mut owed: Vec<usize> = Vec::new();
    let mut marks = Vec::new();
    let show = timed || size * p.iters >= 1 << 30;
    let pb = progress_bar(
        if timed { p.duration_ms / 1000 } else { p.iters },
        &format!("{size} B"),
        show,
    );
    let post = |k: usize, q: &mut QpRun| -> Result<()> {
        q.posted += 1;
        let signaled = q.posted.is_multiple_of(cq_mod) || q.posted == q.target;
        side.qps[k].post_send(work_request(
            p.test,
            p.cas,
            side,
            size,
            remote,
            ((k as u64) << WR_SEQ_BITS) | q.posted,
            signaled,
        )?)?;
        Ok(())
    };
    let start = Instant::now();
    let deadline = start + Duration::from_millis(p.duration_ms);
    loop {
        if total == u64::MAX || !timed {
            // Strictly round-robin: the next message waits for its QP to have room.
            while posted < total && posted - done < window {
                let q = &mut qps[next];
                if q.posted - q.done >= depth {
                    break;
                }
                post(next, q)?;
                posted += 1;
                next = (next + 1) % n;
            }
        }
        if total == u64::MAX {
            if Instant::now() >= deadline {
                // Stop: each QP ends on a signaled WR, so that its every message is seen
                // to complete.
                total = 0;
                for (k, q) in qps.iter_mut().enumerate() {
                    q.target = q.posted;
                    if !q.posted.is_multiple_of(cq_mod) {
                        q.target += 1;
                        owed.push(k);
                    }
                    total += q.target;
                }
            }
        } else if timed {
            let mut err = None;
            owed.retain(|&k| {
                let q = &mut qps[k];
                if q.posted - q.done >= depth || err.is_some() {
                    return true;
                }
                match post(k, q) {
                    Ok(()) => false,
                    Err(e) => {
                        err = Some(e);
                        true
                    }
                }
            });
            if let Some(e) = err {
                return Err(e);
            }
        }
        if done >= total && owed.is_empty() {
            break;
        }
        for wc in side.wait(&side.scq, 64)? {
            let k = (wc.wr_id >> WR_SEQ_BITS) as usize;
            let seq = wc.wr_id & ((1 << WR_SEQ_BITS) - 1);
            let q = qps.get_mut(k).ok_or_else(|| {
                ToolError::Verify(format!("a completion with wr_id {:#x}", wc.wr_id))
            })?;
            if seq > q.done {
                done += seq - q.done;
                q.done = seq;
            }
        }
        let t = start.elapsed();
        marks.push((t, done));
        if timed {
            pb.set_position(t.as_secs().min(p.duration_ms / 1000));
        } else {
            pb.set_position(done);
        }
    }
    pb.finish_and_clear();
    let elapsed = start.elapsed();
    Ok(BwResult {
        size,
        iters: done,
        elapsed,
        peak_bytes_per_sec: report::peak_rate(size, &marks, elapsed, done, window),
    })
}

/// The client's side of one latency run: samples in microseconds.
fn lat_client(side: &mut Side, p: &Params, size: u64, remote: &RemoteMr) -> Result<Vec<f64>> {
    let mut samples = Vec::with_capacity(p.iters as usize);
    let pb = progress_bar(p.iters, &format!("{size} B"), p.iters >= 100_000);
    let max = side.max as usize;
    let last = size as usize - 1;
    // Ping-pong writes land in the peer's second half.
    let pong_remote = remote.offset(side.max).unwrap_or(*remote);
    for i in 0..p.iters {
        let tag = (i % 255 + 1) as u8;
        let signaled = (i + 1).is_multiple_of(LAT_SIGNAL_EVERY);
        let t0 = Instant::now();
        match p.test {
            Test::WriteLat => {
                side.mr.write(last, &[tag])?;
                side.qp().post_send(work_request(
                    p.test,
                    p.cas,
                    side,
                    size,
                    &pong_remote,
                    i,
                    signaled,
                )?)?;
                side.wait_byte(max + last, tag)?;
            }
            Test::SendLat => {
                side.qp().post_send(work_request(
                    p.test, p.cas, side, size, remote, i, signaled,
                )?)?;
                // Replace the receive the last answer took while this send is on its way
                // (hundreds stay posted), not between an answer and the next send.
                side.fill_recvs()?;
                let rcq = side.rcq.clone();
                side.wait(&rcq, 1)?;
                side.recvs_posted[0] -= 1;
            }
            _ => {
                side.qp()
                    .post_send(work_request(p.test, p.cas, side, size, remote, i, true)?)?;
                side.wait(&side.scq, 1)?;
            }
        }
        if p.test.halves_rtt() && i % LAT_SIGNAL_EVERY == 0 {
            // The completion of the send signaled last round (an extra poll only now and
            // then: every look at an empty CQ costs a system call).
            side.drain_sends()?;
        }
        let us = t0.elapsed().as_secs_f64() * 1e6;
        samples.push(if p.test.halves_rtt() { us / 2.0 } else { us });
        if i % 1024 == 0 {
            pb.set_position(i);
        }
    }
    pb.finish_and_clear();
    Ok(samples)
}

/// The server's side of one latency ping-pong run.
fn lat_server(side: &mut Side, p: &Params, size: u64, remote: &RemoteMr) -> Result<()> {
    let max = side.max as usize;
    let last = size as usize - 1;
    let pong_remote = remote.offset(side.max).unwrap_or(*remote);
    for i in 0..p.iters {
        let tag = (i % 255 + 1) as u8;
        let signaled = (i + 1).is_multiple_of(LAT_SIGNAL_EVERY);
        match p.test {
            Test::WriteLat => {
                side.wait_byte(max + last, tag)?;
                side.mr.write(last, &[tag])?;
                side.qp().post_send(work_request(
                    p.test,
                    p.cas,
                    side,
                    size,
                    &pong_remote,
                    i,
                    signaled,
                )?)?;
            }
            Test::SendLat => {
                let rcq = side.rcq.clone();
                side.wait(&rcq, 1)?;
                // Answer first: reposting the receive is off the latency path (hundreds
                // more are posted).
                side.qp().post_send(work_request(
                    p.test, p.cas, side, size, remote, i, signaled,
                )?)?;
                side.recvs_posted[0] -= 1;
                side.fill_recvs()?;
            }
            _ => return Ok(()),
        }
        if i % LAT_SIGNAL_EVERY == 0 {
            side.drain_sends()?;
        }
    }
    Ok(())
}

/// What one benchmark run measured (client side).
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Bandwidth rows.
    pub bw: Vec<BwResult>,
    /// Latency rows.
    pub lat: Vec<LatStats>,
    /// Baseline rows, one per size, when `--baseline` was given.
    pub baseline: Vec<BaselineRow>,
    /// Bandwidth tests: the CPU time the measured runs took.
    pub cpu: Option<CpuUse>,
}

/// The raw-socket figures for one size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BaselineRow {
    /// Message size.
    pub size: u64,
    /// Datagram size used.
    pub dgram: usize,
    /// Latency tests: UDP ping-pong statistics (one-way for ping-pong tests, else the round
    /// trip), in microseconds.
    pub udp_lat: Option<LatStats>,
    /// Bandwidth tests: UDP stream, bytes per second received.
    pub udp_bw: Option<f64>,
    /// Bandwidth tests: the UDP stream sent with `UDP_SEGMENT` and received with `UDP_GRO`,
    /// bytes per second received (`None`: the path does not offload).
    pub udp_gso_bw: Option<f64>,
    /// Bandwidth tests: the same stream's datagrams (GRO segments) per second received.
    pub udp_gso_dgrams: Option<f64>,
    /// Bandwidth tests: TCP stream, bytes per second received.
    pub tcp_bw: Option<f64>,
    /// Bandwidth tests: memcpy of message-size buffers in the client process, bytes per
    /// second copied.
    pub memcpy_bw: Option<f64>,
    /// Bandwidth tests: memcpy of 64 MiB buffers (larger than the caches), bytes per second.
    pub memcpy_dram_bw: Option<f64>,
}

/// Bytes per second of `copy_from_slice` between two `size`-byte buffers, repeated for
/// about `dur` (the buffers stay in cache as a benchmark's buffers do).
pub fn memcpy_rate(size: usize, dur: Duration) -> f64 {
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut dst = vec![0u8; size];
    let t0 = Instant::now();
    let mut copied = 0u64;
    loop {
        for _ in 0..16 {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            copied += size as u64;
        }
        let t = t0.elapsed();
        if t >= dur {
            return copied as f64 / t.as_secs_f64();
        }
    }
}

/// Run benchmark `test` with `args`: server, client, or both (`--loopback`). Tables go to
/// `out`.
pub fn run(test: Test, args: &PerfArgs, out: &mut dyn Write) -> Result<Summary> {
    if args.loopback {
        return loopback(test, args, out);
    }
    match &args.peer {
        Some(host) => client(test, args, host, out),
        None => {
            let ip = args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            let listener = TcpListener::bind(SocketAddr::new(ip, args.port)).map_err(io_ctx(
                format!("cannot listen on TCP {ip} port {}", args.port),
            ))?;
            let _ = writeln!(out, "\n************************************");
            let _ = writeln!(out, "* Waiting for client to connect... *");
            let _ = writeln!(out, "************************************");
            let _ = out.flush();
            server(test, args, &listener, out)?;
            Ok(Summary::default())
        }
    }
}

fn loopback(test: Test, args: &PerfArgs, out: &mut dyn Write) -> Result<Summary> {
    // Bad parameters fail here, before a server waits for a client that never comes.
    Params::from_args(test, args)?;
    let server_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let listener = TcpListener::bind(SocketAddr::new(server_ip, args.port)).map_err(io_ctx(
        format!("cannot listen on TCP {server_ip} port {}", args.port),
    ))?;
    let port = listener
        .local_addr()
        .map_err(io_ctx("listener address"))?
        .port();
    let mut args = args.clone();
    if args.capture.is_some() {
        // The client's capture asks for an embedded device; the server follows, so that
        // both listen on and send to the same UDP port (softrdmad's may be another).
        let explicit = match args.backend {
            Some(b) => Some(b.into()),
            None => softrdma::BackendKind::from_env()?,
        };
        crate::tool::capture_backend(explicit)?;
        args.backend = Some(BackendArg::Embedded);
    }
    if cpus() < 4 {
        // Both devices' progress threads and both benchmark threads share this machine: with
        // fewer than four CPUs a progress thread that keeps polling after activity takes the
        // core from the thread that would make progress (measured: write_bw 64 KiB at 0.65x of
        // the UDP stream with 50 us of polling, 0.95x without, on 2 CPUs). Embedded devices
        // only: softrdmad's progress threads are its own.
        args.embedded_busy_poll = Some(0);
    }
    let args = &args;
    let mut sargs = args.clone();
    sargs.loopback = false;
    sargs.peer = None;
    sargs.bind = Some(server_ip);
    sargs.capture = None;
    let server = std::thread::Builder::new()
        .name("benchmark server".into())
        .spawn(move || server(test, &sargs, &listener, &mut std::io::sink()))
        .map_err(io_ctx("spawn the server thread"))?;
    let mut cargs = args.clone();
    cargs.loopback = false;
    cargs.port = port;
    cargs.bind = Some(args.bind.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let res = client(test, &cargs, &server_ip.to_string(), out);
    if res.is_err() {
        // A client that failed before connecting would leave the server in accept():
        // a connection that closes at once ends it.
        let _ = std::net::TcpStream::connect(SocketAddr::new(server_ip, port));
    }
    let srv = server
        .join()
        .map_err(|_| ToolError::Protocol("the server thread panicked".into()))?;
    // The client's error says more when both failed.
    let summary = res?;
    srv?;
    Ok(summary)
}

/// CPUs this process may run on.
fn cpus() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

fn header(
    out: &mut dyn Write,
    p: &Params,
    side: &Side,
    remotes: &[softrdma::Endpoint],
    args: &PerfArgs,
) -> Result<()> {
    let (test, dev, gbits) = (p.test, &side.dev, args.report_gbits);
    // The progress thread's polling is an embedded device's.
    let busy_poll = args
        .busy_poll
        .or(args.embedded_busy_poll)
        .filter(|_| dev.try_runtime().is_some());
    let _ = writeln!(out, "{RULE}");
    let _ = writeln!(out, "                    {}", test.title(p.cas));
    let _ = writeln!(
        out,
        " Device          : {} (UDP {})",
        crate::tool::device_name(dev),
        dev.local_addr()
    );
    let _ = writeln!(
        out,
        " Backend         : {}",
        crate::tool::backend_description(dev)
    );
    let _ = writeln!(out, " Number of qps   : {}\t\tTransport type : IB", p.qps);
    let _ = writeln!(out, " Connection type : RC\t\tUsing SRQ      : OFF");
    if !test.is_lat() && p.qps > 1 {
        let _ = writeln!(
            out,
            " TX depth        : {} ({} per QP)",
            p.tx_depth,
            p.depth_per_qp()
        );
    } else if !test.is_lat() {
        let _ = writeln!(out, " TX depth        : {}", p.tx_depth);
    }
    let _ = writeln!(out, " Mtu             : {}[B]", p.mtu);
    let _ = writeln!(out, " Link type       : Ethernet (RoCEv2)");
    if let Some(us) = busy_poll {
        let _ = writeln!(
            out,
            " Progress poll   : {us} usec after activity, then sleep"
        );
    } else if dev.try_runtime().is_some() {
        let _ = writeln!(
            out,
            " Progress poll   : learned, up to {} usec after activity, then sleep",
            runtime::DEFAULT_ADAPTIVE_POLL.as_micros()
        );
    }
    if p.duration_ms > 0 {
        let _ = writeln!(out, " Duration        : {} [sec]", p.duration_ms / 1000);
    }
    let _ = writeln!(out, "{RULE}");
    // Every pair, as perftest prints them, up to a screenful.
    let shown = side.qps.len().min(ADDRESS_LINES);
    for (qp, remote) in side.qps.iter().zip(remotes).take(shown) {
        let local = qp.endpoint(None)?;
        let _ = writeln!(out, "{}", crate::tool::address_line("local", &local));
        let _ = writeln!(out, "{}", crate::tool::address_line("remote", remote));
    }
    if side.qps.len() > shown {
        let _ = writeln!(out, " ... and {} more pairs of QPs", side.qps.len() - shown);
    }
    let _ = writeln!(out, "{RULE}");
    if test.is_lat() {
        let _ = writeln!(out, "{}", report::lat_header());
    } else {
        let _ = writeln!(out, "{}", report::bw_header(gbits));
    }
    let _ = out.flush();
    Ok(())
}

/// Pairs of QPs whose addresses the header lists.
const ADDRESS_LINES: usize = 8;

/// CPU time this process and this thread used (user + system, `getrusage`).
fn cpu_time() -> (Duration, Duration) {
    use nix::sys::resource::{getrusage, UsageWho};
    use nix::sys::time::TimeValLike;
    let of = |who| {
        getrusage(who).map_or(Duration::ZERO, |u| {
            let us = u.user_time().num_microseconds() + u.system_time().num_microseconds();
            Duration::from_micros(u64::try_from(us).unwrap_or(0))
        })
    };
    (of(UsageWho::RUSAGE_SELF), of(UsageWho::RUSAGE_THREAD))
}

/// CPU time (user + system) process `pid` used, from `/proc/PID/stat` (in clock ticks);
/// `None` where that cannot be read.
fn process_cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name, in parentheses, may hold spaces: fields count from the last ')'.
    let mut after = stat.get(stat.rfind(')')? + 1..)?.split_ascii_whitespace();
    // utime and stime are fields 14 and 15 of proc(5), the 12th and 13th after the name.
    let utime: u64 = after.nth(11)?.parse().ok()?;
    let stime: u64 = after.next()?.parse().ok()?;
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let tick = u64::try_from(tick).ok().filter(|&t| t > 0)?;
    Some(Duration::from_nanos((utime + stime) * 1_000_000_000 / tick))
}

/// CPU times at one instant: this process, this thread, and the device's softrdmad.
#[derive(Debug, Clone, Copy)]
struct CpuMark {
    process: Duration,
    thread: Duration,
    daemon: Option<Duration>,
}

/// CPU time spent on a number of messages: the cost per operation, comparable across `-q`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuUse {
    /// Messages the time was spent on.
    pub messages: u64,
    /// The whole process (its every thread: the benchmark's, and an embedded device's
    /// progress thread; with `--loopback` the server side's too).
    pub process: Duration,
    /// The thread that posts and polls.
    pub thread: Duration,
    /// The device's softrdmad, when it is one (all its clients: on one host, both sides).
    pub daemon: Option<Duration>,
}

impl CpuUse {
    /// Start measuring: call [`CpuUse::stop`] with what this returns.
    fn start(dev: &Device) -> CpuMark {
        let (process, thread) = cpu_time();
        CpuMark {
            process,
            thread,
            daemon: dev.daemon_info().and_then(|(_, pid)| process_cpu_time(pid)),
        }
    }

    /// Add the CPU time since `started` and `messages` more messages.
    fn stop(&mut self, dev: &Device, started: CpuMark, messages: u64) {
        let now = CpuUse::start(dev);
        self.process += now.process.saturating_sub(started.process);
        self.thread += now.thread.saturating_sub(started.thread);
        if let (Some(a), Some(b)) = (started.daemon, now.daemon) {
            *self.daemon.get_or_insert(Duration::ZERO) += b.saturating_sub(a);
        }
        self.messages += messages;
    }

    /// The line under a bandwidth table: CPU per message, and where it went.
    fn line(&self) -> String {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / self.messages.max(1) as f64;
        let others = self.process.saturating_sub(self.thread);
        let mut line = format!(
            " CPU per message : {:.3} usec (getrusage user+sys of this process: {:.3} s for {} \
             messages; posting/polling thread {:.3} usec, other threads {:.3} usec)",
            per(self.process),
            self.process.as_secs_f64(),
            self.messages,
            per(self.thread),
            per(others)
        );
        if let Some(d) = self.daemon {
            line.push_str(&format!(
                "; softrdmad {:.3} usec ({:.3} s, all its clients)",
                per(d),
                d.as_secs_f64()
            ));
        }
        line
    }
}

fn client(test: Test, args: &PerfArgs, host: &str, out: &mut dyn Write) -> Result<Summary> {
    let p = Params::from_args(test, args)?;
    let mut ctrl = Ctrl::connect(host, args.port, Duration::from_secs(10))?;
    ctrl.send(&p.to_line())?;
    ctrl.expect("OK")?;
    let local_ip = match args.bind {
        Some(ip) => ip,
        None => ctrl.local_ip()?,
    };
    let server_ip = ctrl.peer_ip()?;
    let mut side = Side::new(&p, local_ip, args)?;
    let local_mr = side.mr.remote(..)?;
    let remotes = ctrl.connect_qps(&side.qps, Some(local_mr), &Side::connect_opts(&p, args)?)?;
    let rmr = remotes
        .first()
        .and_then(|r| r.mr)
        .ok_or_else(|| ToolError::Protocol("the server advertised no memory region".into()))?;
    // The path MTU the QP got (the smallest of -m, both ports' active MTUs): what the header
    // shows, as perftest does, and the datagram size of the baseline.
    let path_mtu = side.qp().query()?.path_mtu.bytes();
    let p = Params {
        mtu: u32::try_from(path_mtu).unwrap_or(p.mtu),
        ..p
    };
    header(out, &p, &side, &remotes, args)?;
    let mut summary = Summary::default();
    let mut cpu = CpuUse::default();
    for &size in &p.sizes {
        // Clear where the peer's ping-pong writes land, so tags restart cleanly.
        let max = side.max as usize;
        side.mr.write(max, &vec![0u8; size as usize])?;
        ctrl.send(&format!("SIZE {size}"))?;
        ctrl.expect("READY")?;
        if test.is_lat() {
            let mut samples = lat_client(&mut side, &p, size, &rmr)?;
            ctrl.send(&format!("DONE {}", p.iters))?;
            ctrl.expect("DONE")?;
            if let Some(s) = LatStats::from_samples(size, &mut samples) {
                let _ = writeln!(out, "{}", report::lat_row(&s));
                summary.lat.push(s);
            }
        } else {
            let started = CpuUse::start(&side.dev);
            let r = bw_client(&side, &p, size, &rmr)?;
            cpu.stop(&side.dev, started, r.iters);
            ctrl.send(&format!("DONE {}", r.iters))?;
            ctrl.expect("DONE")?;
            let _ = writeln!(out, "{}", report::bw_row(&r, args.report_gbits));
            summary.bw.push(r);
        }
        let _ = out.flush();
    }
    if !test.is_lat() {
        let _ = writeln!(out, "{}", cpu.line());
        summary.cpu = Some(cpu);
    }
    let _ = writeln!(out, "{RULE}");
    if args.baseline {
        for &size in &p.sizes {
            let row = baseline_row(
                &mut ctrl,
                &p,
                size,
                (local_ip, server_ip),
                &summary,
                args.events,
            )?;
            summary.baseline.push(row);
        }
        print_baseline(out, test, &summary, args.report_gbits, args.events);
    }
    ctrl.send("BYE")?;
    Ok(summary)
}

/// The baselines of one size between `local` and `server`; `events`: the test slept on its
/// completion channel (`-e`), so the ping-pong sleeps in `recv`.
fn baseline_row(
    ctrl: &mut Ctrl,
    p: &Params,
    size: u64,
    (local, server): (IpAddr, IpAddr),
    summary: &Summary,
    events: bool,
) -> Result<BaselineRow> {
    let payload = size.min(u64::from(p.mtu));
    let dgram = p.test.datagram_len(payload);
    let mut row = BaselineRow {
        size,
        dgram,
        udp_lat: None,
        udp_bw: None,
        udp_gso_bw: None,
        udp_gso_dgrams: None,
        tcp_bw: None,
        memcpy_bw: None,
        memcpy_dram_bw: None,
    };
    if p.test.is_lat() {
        let mut rtts =
            baseline::udp_pingpong(ctrl, local, server, dgram, p.iters.min(100_000), events)?;
        if p.test.halves_rtt() {
            rtts.iter_mut().for_each(|x| *x /= 2.0);
        }
        row.udp_lat = LatStats::from_samples(size, &mut rtts);
    } else {
        // As long as the RDMA run took, within reason.
        let rdma = summary
            .bw
            .iter()
            .find(|r| r.size == size)
            .map_or(Duration::from_millis(500), |r| r.elapsed);
        let dur = rdma.clamp(Duration::from_millis(300), Duration::from_secs(3));
        row.udp_bw = Some(baseline::udp_stream(ctrl, local, server, dgram, dur)?.rate());
        if let Some(g) = baseline::udp_gso_stream(ctrl, local, server, dgram, dur)? {
            row.udp_gso_bw = Some(g.rate());
            let s = g.span.as_secs_f64();
            row.udp_gso_dgrams = (s > 0.0 && g.datagrams > 0).then(|| g.datagrams as f64 / s);
        }
        let chunk = (size as usize).clamp(1, 1 << 20);
        row.tcp_bw = Some(baseline::tcp_stream(ctrl, server, chunk, dur)?.rate());
        row.memcpy_bw = Some(memcpy_rate(
            (size as usize).max(1),
            dur.min(Duration::from_millis(500)),
        ));
        row.memcpy_dram_bw = Some(memcpy_rate(64 << 20, Duration::from_millis(300)));
    }
    Ok(row)
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}x", a / b)
    } else {
        "-".into()
    }
}

fn print_baseline(out: &mut dyn Write, test: Test, s: &Summary, gbits: bool, events: bool) {
    let _ = writeln!(
        out,
        " Baseline: raw sockets over the same path, in the same run"
    );
    if test.is_lat() {
        let what = if test.halves_rtt() {
            "one-way = round trip / 2"
        } else {
            "round trip"
        };
        let how = if events {
            "both ends sleeping in recv, as -e sleeps on its completion channel"
        } else {
            "busy-polled"
        };
        let _ = writeln!(
            out,
            " UDP ping-pong, {how}, datagrams as large as the RoCEv2 ones ({what}):"
        );
        let _ = writeln!(out, " #bytes  datagram[B]  t_typical[usec]  t_avg[usec]  t_99%[usec]   softrdma/UDP t_typical  t_avg");
        for b in &s.baseline {
            let (Some(u), Some(r)) = (b.udp_lat, s.lat.iter().find(|l| l.size == b.size)) else {
                continue;
            };
            let _ = writeln!(
                out,
                " {:<7} {:<12} {:<16.2} {:<12.2} {:<13.2} {:<23} {}",
                b.size,
                b.dgram,
                u.typical,
                u.avg,
                u.p99,
                ratio(r.typical, u.typical),
                ratio(r.avg, u.avg)
            );
        }
    } else {
        let u = report::bw_unit_label(gbits);
        let _ = writeln!(out, " UDP stream of datagrams as large as the RoCEv2 ones; the same sent in trains of up to {} with UDP_SEGMENT", baseline::GSO_MAX_SEGMENTS);
        let _ = writeln!(
            out,
            " and received with UDP_GRO (UDP GSO); TCP stream of message-size writes:"
        );
        let _ = writeln!(
            out,
            " #bytes     datagram[B]  UDP stream[{u}]  UDP GSO[{u}]  TCP stream[{u}]  softrdma/UDP  softrdma/UDP-GSO  softrdma/TCP"
        );
        for b in &s.baseline {
            let Some(r) = s.bw.iter().find(|r| r.size == b.size) else {
                continue;
            };
            let (ub, tb) = (b.udp_bw.unwrap_or(0.0), b.tcp_bw.unwrap_or(0.0));
            // n/a: the path does not offload (see `baseline::udp_gso_stream`).
            let (gso, gso_ratio) = match b.udp_gso_bw {
                Some(g) => (
                    format!("{:.2}", report::bw_units(g, gbits)),
                    ratio(r.avg_bytes_per_sec(), g),
                ),
                None => ("n/a".to_string(), "-".to_string()),
            };
            let _ = writeln!(
                out,
                " {:<10} {:<12} {:<19.2} {:<16} {:<19.2} {:<13} {:<17} {}",
                b.size,
                b.dgram,
                report::bw_units(ub, gbits),
                gso,
                report::bw_units(tb, gbits),
                ratio(r.avg_bytes_per_sec(), ub),
                gso_ratio,
                ratio(r.avg_bytes_per_sec(), tb)
            );
        }
        // A message of one packet against a datagram of the same size: the rates compare,
        // where bytes per second would set payload against whole datagrams.
        let one_packet: Vec<_> = s
            .baseline
            .iter()
            .filter(|b| test.datagram_len(b.size) == b.dgram)
            .filter_map(|b| Some((b, s.bw.iter().find(|r| r.size == b.size)?, b.udp_bw?)))
            .collect();
        if !one_packet.is_empty() {
            let _ = writeln!(
                out,
                " Message rate (one packet per message) against the UDP stream's datagrams per second:"
            );
            let _ = writeln!(
                out,
                " #bytes     softrdma[Mmsg/s]  UDP stream[Mdgram/s]  softrdma/UDP  UDP GSO[Mdgram/s]  softrdma/UDP-GSO"
            );
            for (b, r, ub) in one_packet {
                let dgrams = ub / b.dgram.max(1) as f64 / 1e6;
                let (gso, gso_ratio) = match b.udp_gso_dgrams {
                    Some(g) => (format!("{:.3}", g / 1e6), ratio(r.mpps(), g / 1e6)),
                    None => ("n/a".to_string(), "-".to_string()),
                };
                let _ = writeln!(
                    out,
                    " {:<10} {:<17.3} {:<21.3} {:<13} {:<18} {}",
                    b.size,
                    r.mpps(),
                    dgrams,
                    ratio(r.mpps(), dgrams),
                    gso,
                    gso_ratio
                );
            }
        }
        let _ = writeln!(
            out,
            " memcpy in this process, of message-size buffers (in cache) and of 64 MiB ones:"
        );
        let _ = writeln!(
            out,
            " #bytes     memcpy[{u}]      softrdma/memcpy  memcpy 64MiB[{u}]  softrdma/memcpy 64MiB"
        );
        for b in &s.baseline {
            let (Some(r), Some(m)) = (s.bw.iter().find(|r| r.size == b.size), b.memcpy_bw) else {
                continue;
            };
            let big = b.memcpy_dram_bw.unwrap_or(0.0);
            let _ = writeln!(
                out,
                " {:<10} {:<18.2} {:<16} {:<18.2} {}",
                b.size,
                report::bw_units(m, gbits),
                ratio(r.avg_bytes_per_sec(), m),
                report::bw_units(big, gbits),
                ratio(r.avg_bytes_per_sec(), big)
            );
        }
    }
    let _ = writeln!(out, "{RULE}");
    let _ = out.flush();
}

fn server(test: Test, args: &PerfArgs, listener: &TcpListener, out: &mut dyn Write) -> Result<()> {
    let mut ctrl = Ctrl::accept(listener)?;
    let line = ctrl.recv()?;
    let p = match Params::from_line(&line) {
        Ok(p) if p.test == test => p,
        Ok(p) => {
            let msg = format!(
                "this server runs {}, the client asked for {}",
                test.name(),
                p.test.name()
            );
            ctrl.send(&format!("ERR {msg}"))?;
            return Err(ToolError::Protocol(msg));
        }
        Err(e) => {
            ctrl.send(&format!("ERR {e}"))?;
            return Err(e);
        }
    };
    let ip = match args.bind {
        Some(ip) if !ip.is_unspecified() => ip,
        _ => ctrl.local_ip()?,
    };
    let mut side = match Side::new(&p, ip, args) {
        Ok(s) => s,
        Err(e) => {
            ctrl.send(&format!("ERR {e}"))?;
            return Err(e);
        }
    };
    ctrl.send("OK")?;
    let local_mr = side.mr.remote(..)?;
    let remotes = ctrl.connect_qps(&side.qps, Some(local_mr), &Side::connect_opts(&p, args)?)?;
    let rmr = remotes
        .first()
        .and_then(|r| r.mr)
        .ok_or_else(|| ToolError::Protocol("the client advertised no memory region".into()))?;
    header(out, &p, &side, &remotes, args)?;
    // The server's own cost per message: the responder's side of the same messages.
    let mut cpu = CpuUse::default();
    loop {
        let line = ctrl.recv()?;
        let words: Vec<String> = line.split_ascii_whitespace().map(str::to_string).collect();
        match words.first().map(String::as_str) {
            Some("SIZE") => {
                let size: u64 = words
                    .get(1)
                    .and_then(|s| s.parse().ok())
                    .filter(|s| (1..=side.max).contains(s))
                    .ok_or_else(|| ToolError::Protocol(format!("bad SIZE line {line:?}")))?;
                let max = side.max as usize;
                side.mr.write(max, &vec![0u8; size as usize])?;
                let started = CpuUse::start(&side.dev);
                ctrl.send("READY")?;
                match test {
                    Test::WriteLat | Test::SendLat => {
                        lat_server(&mut side, &p, size, &rmr)?;
                        ctrl.expect("DONE")?;
                    }
                    Test::SendBw => {
                        let n = side.receive_all(&mut ctrl)?;
                        cpu.stop(&side.dev, started, n);
                    }
                    _ if test.is_lat() => {
                        ctrl.expect("DONE")?;
                    }
                    _ => {
                        let n = done_count(&ctrl.expect("DONE")?)?;
                        cpu.stop(&side.dev, started, n);
                    }
                }
                ctrl.send("DONE")?;
            }
            Some("BASELINE") => baseline::serve(&mut ctrl, &words[1..], ip)?,
            Some("BYE") => break,
            _ => return Err(ToolError::Protocol(format!("unexpected {line:?}"))),
        }
    }
    if !test.is_lat() {
        let _ = writeln!(out, "{}", cpu.line());
    }
    let _ = writeln!(out, "{RULE}");
    Ok(())
}

/// The message count of a `DONE <n>` line's words.
fn done_count(words: &[String]) -> Result<u64> {
    words
        .first()
        .and_then(|x| x.parse().ok())
        .ok_or_else(|| ToolError::Protocol("bad DONE".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_stops_after_its_time_and_pauses_when_the_core_was_taken() {
        let spin = Spin::default();
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        assert!(spin.allowed());
        assert!(spin.keeps_on(t0, us(100), us(150)));
        assert!(
            !spin.keeps_on(t0, us(990), us(1_010)),
            "HYBRID_SPIN is over"
        );
        assert!(spin.allowed(), "an ordinary end leaves spinning on");
        // Two looks 600 us apart: another thread had the core.
        assert!(!spin.keeps_on(t0, us(100), us(700)));
        assert!(!spin.allowed(), "spinning is off for SPIN_OFF");
        assert_eq!(spin.off_until.get(), Some(us(700) + SPIN_OFF));
    }

    #[test]
    fn params_round_trip_and_reject_nonsense() {
        let p = Params {
            test: Test::SendBw,
            sizes: vec![2, 4, 65536],
            iters: 100,
            duration_ms: 0,
            tx_depth: 64,
            mtu: 1024,
            cas: false,
            qps: 100,
        };
        assert_eq!(Params::from_line(&p.to_line()).unwrap(), p);
        for bad in [
            "PARAMS",
            "HELLO test=write_bw",
            "PARAMS test=nope sizes=2 iters=1 tx_depth=1 mtu=1024",
            "PARAMS test=write_bw sizes=0 iters=1 tx_depth=1 mtu=1024",
            "PARAMS test=write_bw sizes=2 iters=0 tx_depth=1 mtu=1024",
            "PARAMS test=write_bw sizes=2 iters=1 tx_depth=1 mtu=1000",
            "PARAMS test=write_bw sizes=99999999999 iters=1 tx_depth=1 mtu=1024",
            "PARAMS test=write_bw sizes=2 iters=1 tx_depth=1 mtu=1024 junk",
            "PARAMS test=write_bw sizes=2 iters=1 tx_depth=1 mtu=1024 qps=0",
            "PARAMS test=write_bw sizes=2 iters=1 tx_depth=1 mtu=1024 qps=16385",
            "PARAMS test=write_lat sizes=2 iters=1 tx_depth=1 mtu=1024 qps=2",
        ] {
            assert!(Params::from_line(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cpu_time_of_a_process_reads_from_proc() {
        // Burn a little CPU so that at least one clock tick is counted.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(t0.elapsed());
        }
        let own = process_cpu_time(std::process::id()).expect("/proc/self/stat");
        assert!(own > Duration::ZERO);
        assert_eq!(process_cpu_time(u32::MAX), None);
    }

    #[test]
    fn qps_share_the_tx_depth_and_receives() {
        let p = |tx_depth, qps| Params {
            test: Test::SendBw,
            sizes: vec![65536],
            iters: 1,
            duration_ms: 0,
            tx_depth,
            mtu: 4096,
            cas: false,
            qps,
        };
        assert_eq!(p(128, 1).depth_per_qp(), 128);
        assert_eq!(p(128, 1).recvs_per_qp(), RX_DEPTH);
        assert_eq!(p(128, 3).depth_per_qp(), 43);
        assert_eq!(p(128, 10000).depth_per_qp(), 1);
        assert_eq!(p(128, 10000).recvs_per_qp(), 2);
        assert_eq!(p(8192, 2).recvs_per_qp(), RX_DEPTH);
    }

    #[test]
    fn datagram_sizes_match_the_rocev2_headers() {
        assert_eq!(Test::SendLat.datagram_len(2), 12 + 2 + 2 + 4);
        assert_eq!(Test::WriteBw.datagram_len(4096), 12 + 16 + 4096 + 4);
        assert_eq!(Test::AtomicLat.datagram_len(8), 44);
    }
}
