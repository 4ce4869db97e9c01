//! `softrdma pingpong`: what `ibv_rc_pingpong`, `ibv_uc_pingpong`, `ibv_ud_pingpong` and
//! `ibv_srq_pingpong` do. Server when no peer is given; the client sends a message, the
//! server answers with one, `-n` times; both print the summary lines ibv_*_pingpong print.
//!
//! - `rc`: one RC QP (the default).
//! - `uc`: one UC QP, connected like RC but without ACKs (INIT → RTR → RTS with the UC
//!   attributes only).
//! - `ud`: one UD QP; only the QPN and GID are exchanged, every send goes through an address
//!   handle built from the peer's GID with the fixed Q_Key 0x11111111 (as ibv_ud_pingpong);
//!   a message is one packet (at most the MTU) and every receive buffer starts with the
//!   40-byte GRH.
//! - `srq`: `-q` RC QPs (16 by default) whose receives all come from one shared receive
//!   queue; `-n` counts round trips over all of them together (as ibv_srq_pingpong).

use std::collections::HashMap;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use softrdma::{
    AccessFlags, AhAttr, Buffer, ConnectOptions, Cq, Device, Endpoint, Gid, Mtu, Qp, QpAttr,
    QpAttrMask, QpState, QpType, Qpn, Sge, WcOpcode, WorkCompletion, DEFAULT_QKEY, GRH_LEN,
};

use crate::tool::{
    address_line, backend_description, io_ctx, open_device, parse_mtu, wait_cq, BackendArg, Ctrl,
    DeviceOptions, PollMode, Result, ToolError, DEFAULT_TCP_PORT,
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

/// Options of `softrdma pingpong` (those of ibv_*_pingpong that apply).
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
    /// Message size in bytes [default: 4096; ud: 2048, or the MTU if smaller].
    #[arg(short = 's', long,
          value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    pub size: Option<u64>,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096) [default: 1024; ud: the port's
    /// active MTU, which bounds the message size].
    #[arg(short = 'm', long)]
    pub mtu: Option<u32>,
    /// Receives kept posted (in the SRQ with --mode srq).
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500,
          value_parser = clap::value_parser!(u32).range(1..=16384))]
    pub rx_depth: u32,
    /// Round trips (with --mode srq: over all QPs together).
    #[arg(short = 'n', long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub iters: u64,
    /// QPs sharing the receive queue (--mode srq only).
    #[arg(short = 'q', long = "num-qp", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub num_qp: u32,
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
    /// UDP port both devices use [default: 4791 (RoCEv2), or softrdmad's]. A port
    /// softrdmad does not serve opens an embedded device.
    #[arg(long)]
    pub udp_port: Option<u16>,
    /// Write every packet this side's device sends and receives to a pcap file (an
    /// embedded device).
    #[arg(long, value_name = "FILE.pcap")]
    pub capture: Option<PathBuf>,
    /// Backend: embedded (a device in this process) or daemon (softrdmad's device on the
    /// local address). Default: $SOFTRDMA_BACKEND, else embedded when --capture or a
    /// --udp-port softrdmad does not serve asks for it, else softrdmad when it answers on
    /// its socket and serves the address, else embedded.
    #[arg(long, value_enum, value_name = "KIND")]
    pub backend: Option<BackendArg>,
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

/// Run the ping-pong as server or client; print what ibv_*_pingpong prints to `out`.
pub fn run(args: &PingpongArgs, out: &mut dyn Write) -> Result<PingpongResult> {
    // Checks that need no peer come first, so a bad command line fails at once.
    let mtu = match args.mtu {
        Some(m) => Some(parse_mtu(m)?),
        None => None,
    };
    if args.mode == Mode::Ud {
        // 4096 is the largest MTU there is; the port's own is checked once it is open.
        if let Some(s) = args.size {
            check_ud_size(s, mtu.map_or(Mtu::Mtu4096.bytes(), |m| m.bytes()))?;
        }
    }
    if args.mode == Mode::Srq && args.num_qp > args.rx_depth {
        return Err(ToolError::Usage(format!(
            "--mode srq: rx-depth ({}) must be at least num-qp ({})",
            args.rx_depth, args.num_qp
        )));
    }
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
    let dev = open_device(
        ip,
        &DeviceOptions {
            backend: args.backend.map(Into::into),
            udp_port: args.udp_port,
            capture: args.capture.clone(),
            mode,
            ..DeviceOptions::default()
        },
    )?;
    let _ = writeln!(out, "Backend: {}", backend_description(&dev));
    let s = Session {
        args,
        dev: &dev,
        server,
        mode,
    };
    let r = match args.mode {
        Mode::Rc | Mode::Uc => s.connected(&mut ctrl, mtu.unwrap_or(Mtu::Mtu1024), out)?,
        Mode::Ud => s.datagram(&mut ctrl, mtu, out)?,
        Mode::Srq => s.shared(&mut ctrl, mtu.unwrap_or(Mtu::Mtu1024), out)?,
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

/// A UD message is one packet: at most the MTU.
fn check_ud_size(size: u64, mtu: usize) -> Result<()> {
    if size > mtu as u64 {
        return Err(ToolError::Usage(format!(
            "--mode ud: message size {size} is larger than the MTU ({mtu}); \
             a UD message is one packet"
        )));
    }
    Ok(())
}

const RECV_ID: u64 = 1;
const SEND_ID: u64 = 2;
/// With `--mode srq`, a receive's wr_id is this tag and its buffer slot, a send's is
/// [`SRQ_SEND`] and its QP's index.
const SRQ_RECV: u64 = 1 << 32;
const SRQ_SEND: u64 = 2 << 32;
const STALL: Duration = Duration::from_secs(10);

/// The byte at `k` of message `i` with `--chk`.
fn pattern(i: u64, k: usize) -> u8 {
    (i as usize).wrapping_mul(31).wrapping_add(k) as u8
}

/// What every mode shares.
struct Session<'a> {
    args: &'a PingpongArgs,
    dev: &'a Device,
    server: bool,
    mode: PollMode,
}

impl Session<'_> {
    fn size(&self) -> u64 {
        self.args.size.unwrap_or(4096)
    }

    fn wait(&self, cq: &Cq, max: usize) -> Result<Vec<WorkCompletion>> {
        let v = wait_cq(cq, max, self.mode, STALL)?;
        if v.is_empty() {
            return Err(ToolError::Api(softrdma::Error::Timeout));
        }
        Ok(v)
    }

    fn print_addresses(&self, out: &mut dyn Write, local: &Endpoint, remote: &Endpoint) {
        let _ = writeln!(out, "{}", address_line(" local", local));
        let _ = writeln!(out, "{}", address_line("remote", remote));
        let _ = out.flush();
    }

    /// This QP's endpoint, advertising the GID `-g` selects.
    fn endpoint(&self, qp: &Qp) -> Result<Endpoint> {
        let mut e = qp.endpoint(None)?;
        e.gid = self.dev.gid(u32::from(self.args.gid_idx))?;
        Ok(e)
    }

    /// The ping-pong loop of one QP: the client sends first, the server answers; `send(i)`
    /// posts message `i` (of `size` bytes), `recv(i, wc)` checks and reposts the receive of
    /// message `i`. Send completions are counted while waiting for receives, and the loop
    /// ends once every send has completed too, as ibv_rc_pingpong's does: the QP and its
    /// region go away afterwards, and a send still queued (on softrdmad, in the work ring)
    /// would then fail instead of reaching the peer, which waits for it.
    fn one_qp_loop(
        &self,
        cq: &Cq,
        size: u64,
        send: &dyn Fn(u64) -> Result<()>,
        recv: &dyn Fn(u64, &WorkCompletion) -> Result<()>,
    ) -> Result<PingpongResult> {
        let sent = std::cell::Cell::new(0u64);
        let recv_one = |i: u64| -> Result<()> {
            loop {
                for wc in self.wait(cq, 1)? {
                    if wc.wr_id == RECV_ID {
                        return recv(i, &wc);
                    }
                    sent.set(sent.get() + 1);
                }
            }
        };
        let start = Instant::now();
        for i in 0..self.args.iters {
            if self.server {
                recv_one(i)?;
                send(i)?;
            } else {
                send(i)?;
                recv_one(i)?;
            }
        }
        while sent.get() < self.args.iters {
            for wc in self.wait(cq, 16)? {
                if wc.wr_id == SEND_ID {
                    sent.set(sent.get() + 1);
                }
            }
        }
        Ok(PingpongResult {
            bytes: 2 * size * self.args.iters,
            iters: self.args.iters,
            elapsed: start.elapsed(),
        })
    }

    /// RC (ibv_rc_pingpong) and UC (ibv_uc_pingpong): one connected QP.
    fn connected(&self, ctrl: &mut Ctrl, mtu: Mtu, out: &mut dyn Write) -> Result<PingpongResult> {
        let args = self.args;
        let uc = args.mode == Mode::Uc;
        let pd = self.dev.alloc_pd()?;
        let cq = self.dev.create_cq(args.rx_depth + 2)?;
        let mut b = pd
            .qp_builder(&cq, &cq)
            .max_recv_wr(args.rx_depth)
            .max_send_wr(16);
        if uc {
            // ibv_uc_pingpong gives its QP no remote access.
            b = b.qp_type(QpType::Uc).access(AccessFlags::empty());
        }
        let qp = b.build()?;
        let size = self.size() as usize;
        let mr = pd.register(Buffer::zeroed(2 * size), AccessFlags::LOCAL_WRITE)?;
        // [0, size): what we send; [size, 2 size): where receives land.
        let recv_sge = mr.sge(size..2 * size)?;
        let send_sge = mr.sge(0..size)?;
        for _ in 0..args.rx_depth {
            qp.recv(RECV_ID, &[recv_sge])?;
        }
        let (local, remote) = if uc {
            let local = self.endpoint(&qp)?;
            let remote = exchange(ctrl, &local)?;
            connect_uc(&qp, &remote, mtu, args.gid_idx)?;
            sync(ctrl)?;
            (local, remote)
        } else {
            let mut opts = ConnectOptions::default();
            opts.mtu = mtu;
            opts.sgid_index = args.gid_idx;
            let remote = ctrl.connect_qp(&qp, None, &opts)?;
            (qp.endpoint(None)?, remote)
        };
        self.print_addresses(out, &local, &remote);

        let send = |i: u64| -> Result<()> {
            if args.chk {
                let data: Vec<u8> = (0..size).map(|k| pattern(i, k)).collect();
                mr.write(0, &data)?;
            }
            qp.send(SEND_ID, &[send_sge])?;
            Ok(())
        };
        let recv = |i: u64, wc: &WorkCompletion| -> Result<()> {
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
            Ok(())
        };
        self.one_qp_loop(&cq, size as u64, &send, &recv)
    }

    /// UD (ibv_ud_pingpong): datagrams through an address handle to the peer's GID.
    fn datagram(
        &self,
        ctrl: &mut Ctrl,
        mtu: Option<Mtu>,
        out: &mut dyn Write,
    ) -> Result<PingpongResult> {
        let args = self.args;
        let port_mtu = self.dev.query_port()?.active_mtu.bytes();
        let limit = mtu.map_or(port_mtu, |m| m.bytes().min(port_mtu));
        let size = args.size.unwrap_or(limit.min(2048) as u64);
        check_ud_size(size, limit)?;
        let size = size as usize;
        let pd = self.dev.alloc_pd()?;
        let cq = self.dev.create_cq(args.rx_depth + 2)?;
        let qp = pd
            .qp_builder(&cq, &cq)
            .qp_type(QpType::Ud)
            .qkey(DEFAULT_QKEY)
            .max_recv_wr(args.rx_depth)
            .max_send_wr(16)
            .build()?;
        let mr = pd.register(Buffer::zeroed(2 * size + GRH_LEN), AccessFlags::LOCAL_WRITE)?;
        // [0, size): what we send; [size, 2 size + 40): the GRH, then the message.
        let send_sge = mr.sge(0..size)?;
        let recv_sge = mr.sge(size..2 * size + GRH_LEN)?;
        for _ in 0..args.rx_depth {
            qp.recv(RECV_ID, &[recv_sge])?;
        }
        let local = self.endpoint(&qp)?;
        let remote = exchange(ctrl, &local)?;
        let ah = pd.create_ah_with(&AhAttr {
            dgid: remote.gid.0,
            sgid_index: args.gid_idx,
            ..AhAttr::default()
        })?;
        sync(ctrl)?;
        self.print_addresses(out, &local, &remote);

        let send = |i: u64| -> Result<()> {
            if args.chk {
                let data: Vec<u8> = (0..size).map(|k| pattern(i, k)).collect();
                mr.write(0, &data)?;
            }
            qp.send_ud(SEND_ID, &[send_sge], &ah, remote.qpn, DEFAULT_QKEY)?;
            Ok(())
        };
        let recv = |i: u64, wc: &WorkCompletion| -> Result<()> {
            if wc.byte_len as usize != size + GRH_LEN {
                return Err(ToolError::Verify(format!(
                    "message {i}: {} bytes, expected {size} behind the {GRH_LEN}-byte GRH",
                    wc.byte_len
                )));
            }
            if wc.src_qp != remote.qpn {
                return Err(ToolError::Verify(format!(
                    "message {i} came from QP {:#x}, not the peer's {:#x}",
                    wc.src_qp, remote.qpn
                )));
            }
            qp.recv(RECV_ID, &[recv_sge])?;
            if args.chk {
                let mut got = vec![0u8; size];
                mr.read(size + GRH_LEN, &mut got)?;
                if got.iter().enumerate().any(|(k, &b)| b != pattern(i, k)) {
                    return Err(ToolError::Verify(format!("message {i} has wrong content")));
                }
            }
            Ok(())
        };
        self.one_qp_loop(&cq, size as u64, &send, &recv)
    }

    /// SRQ (ibv_srq_pingpong): `-q` RC QPs, one shared receive queue, one CQ. Each QP sends
    /// its next message once its previous send and the answer to it have completed; `-n`
    /// messages go each way in all.
    fn shared(&self, ctrl: &mut Ctrl, mtu: Mtu, out: &mut dyn Write) -> Result<PingpongResult> {
        let args = self.args;
        let nq = args.num_qp as usize;
        let size = self.size() as usize;
        let iters = args.iters;
        // Every receive and every QP's send gets a buffer of its own with --chk; otherwise all
        // receives share one buffer and all sends another, as in ibv_srq_pingpong.
        let (send_slots, recv_slots) = if args.chk {
            (nq, args.rx_depth as usize)
        } else {
            (1, 1)
        };
        let pd = self.dev.alloc_pd()?;
        let cq = self.dev.create_cq(args.rx_depth + 2 * args.num_qp + 2)?;
        let srq = pd.create_srq(args.rx_depth, 1)?;
        let mr = pd.register(
            Buffer::zeroed((send_slots + recv_slots) * size),
            AccessFlags::LOCAL_WRITE,
        )?;
        let send_at = |j: usize| (j % send_slots) * size;
        let recv_at = |slot: usize| (send_slots + slot) * size;
        let post_recv = |slot: usize| -> Result<()> {
            let at = recv_at(slot % recv_slots);
            srq.recv(SRQ_RECV | slot as u64, &[mr.sge(at..at + size)?])?;
            Ok(())
        };
        for slot in 0..args.rx_depth as usize {
            post_recv(slot)?;
        }
        let mut opts = ConnectOptions::default();
        opts.mtu = mtu;
        opts.sgid_index = args.gid_idx;
        let mut qps = Vec::with_capacity(nq);
        let mut index = HashMap::with_capacity(nq);
        for j in 0..nq {
            let qp = pd.qp_builder(&cq, &cq).srq(&srq).max_send_wr(4).build()?;
            let remote = ctrl.connect_qp(&qp, None, &opts)?;
            self.print_addresses(out, &qp.endpoint(None)?, &remote);
            index.insert(qp.qpn(), j);
            qps.push(qp);
        }
        // A message's pattern seed: its QP and its number on that QP.
        let seed = |j: usize, k: u64| ((j as u64) << 32) | k;
        let sges: Vec<Sge> = (0..send_slots)
            .map(|j| mr.sge(send_at(j)..send_at(j) + size))
            .collect::<softrdma::Result<_>>()?;
        let mut sent_on = vec![0u64; nq];
        let mut recvd_on = vec![0u64; nq];
        let send = |j: usize, k: u64| -> Result<()> {
            if args.chk {
                let data: Vec<u8> = (0..size).map(|b| pattern(seed(j, k), b)).collect();
                mr.write(send_at(j), &data)?;
            }
            qps[j].send(SRQ_SEND | j as u64, &[sges[j % send_slots]])?;
            Ok(())
        };
        const WAIT_RECV: u8 = 1;
        const WAIT_SEND: u8 = 2;
        let mut pending = vec![WAIT_RECV; nq];
        let (mut posted, mut scnt, mut rcnt) = (0u64, 0u64, 0u64);
        let start = Instant::now();
        if !self.server {
            for j in 0..nq.min(iters as usize) {
                send(j, 0)?;
                sent_on[j] = 1;
                posted += 1;
                pending[j] = WAIT_RECV | WAIT_SEND;
            }
        }
        while rcnt < iters || scnt < iters {
            for wc in self.wait(&cq, 16)? {
                let j = if wc.wr_id & SRQ_SEND != 0 {
                    scnt += 1;
                    let j = (wc.wr_id & 0xffff_ffff) as usize;
                    pending[j] &= !WAIT_SEND;
                    j
                } else {
                    let j = *index.get(&wc.qp_num).ok_or_else(|| {
                        ToolError::Verify(format!("a receive on unknown QP {:#x}", wc.qp_num))
                    })?;
                    if wc.opcode != WcOpcode::Recv || wc.byte_len as usize != size {
                        return Err(ToolError::Verify(format!(
                            "QP {j}: a {:?} completion of {} bytes, expected a {size}-byte receive",
                            wc.opcode, wc.byte_len
                        )));
                    }
                    let slot = (wc.wr_id & 0xffff_ffff) as usize;
                    let k = recvd_on[j];
                    if args.chk {
                        let mut got = vec![0u8; size];
                        mr.read(recv_at(slot % recv_slots), &mut got)?;
                        if got
                            .iter()
                            .enumerate()
                            .any(|(b, &v)| v != pattern(seed(j, k), b))
                        {
                            return Err(ToolError::Verify(format!(
                                "message {k} on QP {j} has wrong content"
                            )));
                        }
                    }
                    post_recv(slot)?;
                    recvd_on[j] += 1;
                    rcnt += 1;
                    pending[j] &= !WAIT_RECV;
                    j
                };
                if pending[j] == 0 && posted < iters {
                    send(j, sent_on[j])?;
                    sent_on[j] += 1;
                    posted += 1;
                    pending[j] = WAIT_RECV | WAIT_SEND;
                }
            }
        }
        Ok(PingpongResult {
            bytes: 2 * size as u64 * iters,
            iters,
            elapsed: start.elapsed(),
        })
    }
}

/// Swap endpoints over the control channel: `EP qpn psn gid mtu`, both sides at once.
fn exchange(ctrl: &mut Ctrl, local: &Endpoint) -> Result<Endpoint> {
    let gid: String = local.gid.0.iter().map(|b| format!("{b:02x}")).collect();
    ctrl.send(&format!(
        "EP {} {} {gid} {}",
        local.qpn.value(),
        local.psn,
        local.mtu.bytes()
    ))?;
    let f = ctrl.expect("EP")?;
    let bad = || ToolError::Protocol(format!("bad endpoint line: EP {}", f.join(" ")));
    let [qpn, psn, gid, mtu] = f.as_slice() else {
        return Err(bad());
    };
    let qpn = qpn.parse().ok().and_then(Qpn::try_new).ok_or_else(bad)?;
    let psn: u32 = psn.parse().map_err(|_| bad())?;
    if psn > 0x00ff_ffff || gid.len() != 32 || !gid.is_ascii() {
        return Err(bad());
    }
    let mut g = [0u8; 16];
    for (i, b) in g.iter_mut().enumerate() {
        *b = u8::from_str_radix(&gid[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    let mtu = mtu
        .parse::<u32>()
        .ok()
        .and_then(|m| parse_mtu(m).ok())
        .ok_or_else(bad)?;
    Ok(Endpoint {
        qpn,
        psn,
        gid: Gid(g),
        mtu,
        mr: None,
    })
}

/// Both sides are ready (their QPs can receive): only then may the client send.
fn sync(ctrl: &mut Ctrl) -> Result<()> {
    ctrl.send("READY")?;
    ctrl.expect("READY")?;
    Ok(())
}

/// INIT → RTR → RTS for a UC QP: the path, the remote QPN and PSNs; no timers, retries or
/// READ/ATOMIC resources (UC has no ACKs).
fn connect_uc(qp: &Qp, remote: &Endpoint, mtu: Mtu, sgid_index: u8) -> Result<()> {
    let port_mtu = qp.pd().device().query_port()?.active_mtu;
    let path_mtu = [mtu, port_mtu, remote.mtu]
        .into_iter()
        .min_by_key(|m| m.bytes())
        .unwrap_or(mtu);
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        ah_attr: AhAttr {
            dgid: remote.gid.0,
            sgid_index,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    qp.modify(
        &rtr,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN,
    )?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: qp.initial_psn(),
        ..QpAttr::default()
    };
    qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)?;
    Ok(())
}
