//! `--baseline`: raw sockets over the same path in the same run, so every softrdma figure is
//! also a ratio. UDP ping-pong for latency (both ends busy-poll, as perftest polls its CQs);
//! a UDP stream of datagrams as large as the RoCEv2 ones, and a TCP stream, for bandwidth.
//!
//! The server side of each measurement runs in the benchmark's server process, on the
//! address its device uses; the client side in the client process. The control channel
//! carries the ports and the receiver's counts.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::tool::{io_ctx, Ctrl, Result, ToolError};

/// Socket buffers as large as the runtime asks for its own socket, so neither side of the
/// comparison is starved.
const SOCKET_BUFFER: usize = 4 << 20;

fn udp_socket(ip: IpAddr) -> Result<UdpSocket> {
    let s = Socket::new(
        Domain::for_address(SocketAddr::new(ip, 0)),
        Type::DGRAM,
        Some(Protocol::UDP),
    )
    .map_err(io_ctx("baseline UDP socket"))?;
    let _ = s.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = s.set_send_buffer_size(SOCKET_BUFFER);
    s.bind(&SocketAddr::new(ip, 0).into())
        .map_err(io_ctx(format!("bind a baseline UDP socket on {ip}")))?;
    Ok(s.into())
}

/// What a stream receiver counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SinkCount {
    /// Payload bytes received.
    pub bytes: u64,
    /// Time from the first to the last byte.
    pub span: Duration,
}

impl SinkCount {
    /// Bytes per second over the span.
    pub fn rate(&self) -> f64 {
        let s = self.span.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s
        } else {
            0.0
        }
    }
}

/// A running server-side helper: stopped and joined by [`Service::finish`].
struct Service {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<SinkCount>,
}

impl Service {
    fn finish(self) -> SinkCount {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or_default()
    }
}

/// UDP echo, busy-polling, until stopped.
fn udp_echo(ip: IpAddr) -> Result<(u16, Service)> {
    let sock = udp_socket(ip)?;
    sock.set_nonblocking(true).map_err(io_ctx("UDP echo"))?;
    let port = sock.local_addr().map_err(io_ctx("UDP echo"))?.port();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut n = 0u64;
        while !st.load(Ordering::Relaxed) {
            match sock.recv_from(&mut buf) {
                Ok((len, from)) => {
                    let _ = sock.send_to(&buf[..len], from);
                    n += len as u64;
                }
                Err(_) => std::hint::spin_loop(),
            }
        }
        SinkCount {
            bytes: n,
            span: Duration::ZERO,
        }
    });
    Ok((port, Service { stop, thread }))
}

/// UDP sink: count what arrives until stopped.
fn udp_sink(ip: IpAddr) -> Result<(u16, Service)> {
    let sock = udp_socket(ip)?;
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .map_err(io_ctx("UDP sink"))?;
    let port = sock.local_addr().map_err(io_ctx("UDP sink"))?.port();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut c = SinkCount::default();
        let mut first: Option<Instant> = None;
        while !st.load(Ordering::Relaxed) {
            if let Ok(len) = sock.recv(&mut buf) {
                let now = Instant::now();
                let f = *first.get_or_insert(now);
                c.bytes += len as u64;
                c.span = now - f;
            }
        }
        c
    });
    Ok((port, Service { stop, thread }))
}

/// TCP sink: accept one connection and count its bytes until it closes.
fn tcp_sink(ip: IpAddr) -> Result<(u16, Service)> {
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(io_ctx("TCP sink"))?;
    let port = l.local_addr().map_err(io_ctx("TCP sink"))?.port();
    let stop = Arc::new(AtomicBool::new(false));
    let thread = std::thread::spawn(move || {
        let mut c = SinkCount::default();
        let Ok((mut s, _)) = l.accept() else { return c };
        let mut buf = vec![0u8; 1 << 20];
        let mut first: Option<Instant> = None;
        while let Ok(len) = s.read(&mut buf) {
            if len == 0 {
                break;
            }
            let now = Instant::now();
            let f = *first.get_or_insert(now);
            c.bytes += len as u64;
            c.span = now - f;
        }
        c
    });
    Ok((port, Service { stop, thread }))
}

/// Serve one `BASELINE` request read from `ctrl` (its words after `BASELINE`), on `ip`.
pub fn serve(ctrl: &mut Ctrl, words: &[String], ip: IpAddr) -> Result<()> {
    let kind = words.first().map(String::as_str).unwrap_or("");
    let started = match kind {
        "udp_pingpong" => udp_echo(ip),
        "udp_stream" => udp_sink(ip),
        "tcp_stream" => tcp_sink(ip),
        _ => {
            ctrl.send("ERR unknown baseline")?;
            return Err(ToolError::Protocol(format!("unknown baseline {kind:?}")));
        }
    };
    let (port, svc) = match started {
        Ok(x) => x,
        Err(e) => {
            ctrl.send(&format!("ERR {e}"))?;
            return Err(e);
        }
    };
    ctrl.send(&format!("PORT {port}"))?;
    ctrl.expect("END")?;
    let c = svc.finish();
    ctrl.send(&format!("RESULT {} {}", c.bytes, c.span.as_nanos()))
}

fn ask(ctrl: &mut Ctrl, request: &str) -> Result<u16> {
    ctrl.send(&format!("BASELINE {request}"))?;
    let w = ctrl.expect("PORT")?;
    w.first()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| ToolError::Protocol("bad PORT line".into()))
}

fn result(ctrl: &mut Ctrl) -> Result<SinkCount> {
    ctrl.send("END")?;
    let w = ctrl.expect("RESULT")?;
    let num = |i: usize| -> Result<u64> {
        w.get(i)
            .and_then(|x| x.parse().ok())
            .ok_or_else(|| ToolError::Protocol("bad RESULT line".into()))
    };
    Ok(SinkCount {
        bytes: num(0)?,
        span: Duration::from_nanos(num(1)?),
    })
}

/// UDP ping-pong with `dgram`-byte datagrams between `local` and the server at `server`:
/// round-trip times in microseconds. A datagram lost (none expected on these paths) is
/// skipped after a second.
pub fn udp_pingpong(
    ctrl: &mut Ctrl,
    local: IpAddr,
    server: IpAddr,
    dgram: usize,
    iters: u64,
) -> Result<Vec<f64>> {
    let port = ask(ctrl, "udp_pingpong")?;
    let sock = udp_socket(local)?;
    sock.connect(SocketAddr::new(server, port))
        .map_err(io_ctx("UDP ping-pong connect"))?;
    sock.set_nonblocking(true)
        .map_err(io_ctx("UDP ping-pong"))?;
    let msg = vec![0x5au8; dgram.max(1)];
    let mut buf = vec![0u8; 65536];
    let mut rtts = Vec::with_capacity(iters as usize);
    // A few unmeasured rounds first, as perftest warms up.
    let warmup = 10.min(iters);
    for i in 0..iters + warmup {
        let t0 = Instant::now();
        let _ = sock.send(&msg);
        loop {
            match sock.recv(&mut buf) {
                Ok(_) => {
                    if i >= warmup {
                        rtts.push(t0.elapsed().as_secs_f64() * 1e6);
                    }
                    break;
                }
                Err(_) if t0.elapsed() > Duration::from_secs(1) => break,
                Err(_) => std::hint::spin_loop(),
            }
        }
    }
    result(ctrl)?;
    Ok(rtts)
}

/// A UDP stream of `dgram`-byte datagrams for `dur`: what the receiver got.
pub fn udp_stream(
    ctrl: &mut Ctrl,
    local: IpAddr,
    server: IpAddr,
    dgram: usize,
    dur: Duration,
) -> Result<SinkCount> {
    let port = ask(ctrl, "udp_stream")?;
    let sock = udp_socket(local)?;
    sock.connect(SocketAddr::new(server, port))
        .map_err(io_ctx("UDP stream connect"))?;
    let msg = vec![0xa5u8; dgram.max(1)];
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        for _ in 0..64 {
            // ENOBUFS and the like just mean the queue is full: the receiver's count tells.
            let _ = sock.send(&msg);
        }
    }
    // Let the last datagrams arrive before the receiver stops counting.
    std::thread::sleep(Duration::from_millis(30));
    result(ctrl)
}

/// A TCP stream written `chunk` bytes at a time for `dur`: what the receiver got.
pub fn tcp_stream(
    ctrl: &mut Ctrl,
    server: IpAddr,
    chunk: usize,
    dur: Duration,
) -> Result<SinkCount> {
    let port = ask(ctrl, "tcp_stream")?;
    let mut s =
        TcpStream::connect(SocketAddr::new(server, port)).map_err(io_ctx("TCP stream connect"))?;
    let msg = vec![0x3cu8; chunk.max(1)];
    let t0 = Instant::now();
    while t0.elapsed() < dur {
        s.write_all(&msg).map_err(io_ctx("TCP stream write"))?;
    }
    drop(s);
    // The sink counts until end of stream; give it the tail.
    std::thread::sleep(Duration::from_millis(30));
    result(ctrl)
}
