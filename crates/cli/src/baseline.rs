//! `--baseline`: raw sockets over the same path in the same run, so every softrdma figure is
//! also a ratio. UDP ping-pong for latency (both ends busy-poll, as perftest polls its CQs);
//! a UDP stream of datagrams as large as the RoCEv2 ones, the same stream sent in trains with
//! segmentation offload (`UDP_SEGMENT`) and received coalesced (`UDP_GRO`), and a TCP stream,
//! for bandwidth.
//!
//! The server side of each measurement runs in the benchmark's server process, on the
//! address its device uses; the client side in the client process. The control channel
//! carries the ports and the receiver's counts.

use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, sockopt, ControlMessage, ControlMessageOwned, MsgFlags,
    SockaddrStorage,
};
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

/// Most segments one `UDP_SEGMENT` send may carry (the kernel's `UDP_MAX_SEGMENTS` was 64
/// before Linux 5.7; 64 works on every kernel with UDP GSO).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most UDP payload one send may carry over IPv4 (65535 less the IPv4 and UDP headers).
const MAX_UDP_PAYLOAD: usize = 65507;

/// What a stream receiver counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SinkCount {
    /// Payload bytes received.
    pub bytes: u64,
    /// Datagrams received (with GRO: the segments of each coalesced read); 0 when the
    /// receiver does not count them (TCP, or a peer that does not send the count).
    pub datagrams: u64,
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

/// How long a blocking echo sleeps in `recv` before it looks whether it was stopped.
const ECHO_TICK: Duration = Duration::from_millis(50);

/// UDP echo until stopped: busy-polling, or (`blocking`) sleeping in `recv`.
fn udp_echo(ip: IpAddr, blocking: bool) -> Result<(u16, Service)> {
    let sock = udp_socket(ip)?;
    if blocking {
        sock.set_read_timeout(Some(ECHO_TICK))
    } else {
        sock.set_nonblocking(true)
    }
    .map_err(io_ctx("UDP echo"))?;
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
            ..SinkCount::default()
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
                c.datagrams += 1;
                c.span = now - f;
            }
        }
        c
    });
    Ok((port, Service { stop, thread }))
}

/// Segments in a read of `len` bytes that GRO coalesced from `gso_size`-byte datagrams (the
/// last one may be shorter); a read without the control message is one datagram.
fn gro_segments(len: usize, gso_size: Option<i32>) -> u64 {
    match gso_size
        .and_then(|g| usize::try_from(g).ok())
        .filter(|&g| g > 0)
    {
        Some(g) => len.div_ceil(g).max(1) as u64,
        None => 1,
    }
}

/// UDP sink with `UDP_GRO`: the kernel hands over trains of datagrams in one read of up to
/// 64 KiB, and says their size in a control message. Counts bytes and datagrams until stopped.
fn udp_gro_sink(ip: IpAddr) -> Result<(u16, Service)> {
    let sock = udp_socket(ip)?;
    setsockopt(&sock, sockopt::UdpGroSegment, &true)
        .map_err(|e| io_ctx("enable UDP_GRO on the baseline sink")(e.into()))?;
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .map_err(io_ctx("UDP GRO sink"))?;
    let port = sock.local_addr().map_err(io_ctx("UDP GRO sink"))?.port();
    let stop = Arc::new(AtomicBool::new(false));
    let st = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut buf = vec![0u8; 65536];
        let mut cmsg = nix::cmsg_space!(i32);
        let mut c = SinkCount::default();
        let mut first: Option<Instant> = None;
        while !st.load(Ordering::Relaxed) {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let Ok(msg) = recvmsg::<()>(
                sock.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg),
                MsgFlags::empty(),
            ) else {
                continue;
            };
            let gso = msg.cmsgs().ok().and_then(|mut it| {
                it.find_map(|m| match m {
                    ControlMessageOwned::UdpGroSegments(g) => Some(g),
                    _ => None,
                })
            });
            let now = Instant::now();
            let f = *first.get_or_insert(now);
            c.bytes += msg.bytes as u64;
            c.datagrams += gro_segments(msg.bytes, gso);
            c.span = now - f;
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
        "udp_pingpong" => udp_echo(ip, false),
        "udp_pingpong_blocking" => udp_echo(ip, true),
        "udp_stream" => udp_sink(ip),
        "udp_gso_stream" => udp_gro_sink(ip),
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
    ctrl.send(&format!(
        "RESULT {} {} {}",
        c.bytes,
        c.span.as_nanos(),
        c.datagrams
    ))
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
        // Absent from a peer that predates the count.
        datagrams: num(2).unwrap_or(0),
    })
}

/// UDP ping-pong with `dgram`-byte datagrams between `local` and the server at `server`:
/// round-trip times in microseconds. Both ends busy-poll, or (`blocking`, the baseline of a
/// test that sleeps on its completion channel) sleep in `recv`. A datagram lost (none
/// expected on these paths) is skipped after a second.
pub fn udp_pingpong(
    ctrl: &mut Ctrl,
    local: IpAddr,
    server: IpAddr,
    dgram: usize,
    iters: u64,
    blocking: bool,
) -> Result<Vec<f64>> {
    let port = ask(
        ctrl,
        if blocking {
            "udp_pingpong_blocking"
        } else {
            "udp_pingpong"
        },
    )?;
    let sock = udp_socket(local)?;
    sock.connect(SocketAddr::new(server, port))
        .map_err(io_ctx("UDP ping-pong connect"))?;
    if blocking {
        sock.set_read_timeout(Some(Duration::from_secs(1)))
    } else {
        sock.set_nonblocking(true)
    }
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

/// Datagrams of `dgram` bytes one `UDP_SEGMENT` send carries: as many as fit in one UDP
/// payload, at most [`GSO_MAX_SEGMENTS`].
pub fn gso_train_len(dgram: usize) -> usize {
    (MAX_UDP_PAYLOAD / dgram.max(1)).clamp(1, GSO_MAX_SEGMENTS)
}

/// The UDP stream of [`udp_stream`] sent with segmentation offload: each `sendmsg` carries
/// a train of [`gso_train_len`] datagrams of `dgram` bytes (`UDP_SEGMENT` = `dgram`), and
/// the receiver reads them coalesced (`UDP_GRO`). What the receiver got, or `Ok(None)` when
/// the path cannot offload (an old kernel, or datagrams larger than the interface's MTU).
pub fn udp_gso_stream(
    ctrl: &mut Ctrl,
    local: IpAddr,
    server: IpAddr,
    dgram: usize,
    dur: Duration,
) -> Result<Option<SinkCount>> {
    let port = ask(ctrl, "udp_gso_stream")?;
    let sock = udp_socket(local)?;
    sock.connect(SocketAddr::new(server, port))
        .map_err(io_ctx("UDP GSO stream connect"))?;
    let dgram = dgram.max(1);
    let train = vec![0xc3u8; dgram * gso_train_len(dgram)];
    let seg = u16::try_from(dgram).unwrap_or(u16::MAX);
    let iov = [IoSlice::new(&train)];
    let cmsg = [ControlMessage::UdpGsoSegments(&seg)];
    let send =
        || sendmsg::<SockaddrStorage>(sock.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None);
    // The first send says whether the path offloads: EINVAL for a segment larger than the
    // MTU, EIO when the device cannot checksum, ENOPROTOOPT before UDP GSO (Linux 4.18).
    let mut offloads = match send() {
        Ok(_) => true,
        Err(Errno::EINVAL | Errno::EIO | Errno::ENOPROTOOPT | Errno::EOPNOTSUPP) => false,
        Err(e) => return Err(io_ctx("UDP GSO stream send")(e.into())),
    };
    let t0 = Instant::now();
    while offloads && t0.elapsed() < dur {
        for _ in 0..8 {
            match send() {
                // ENOBUFS and the like just mean the queue is full: the receiver's count
                // tells.
                Ok(_) | Err(Errno::ENOBUFS | Errno::EAGAIN) => {}
                Err(_) => offloads = false,
            }
        }
    }
    std::thread::sleep(Duration::from_millis(30));
    let got = result(ctrl)?;
    Ok(offloads.then_some(got))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gso_trains_fit_one_udp_payload_and_the_segment_limit() {
        // 64 KiB WRITEs at MTU 4096: 4128-byte datagrams, 15 to a train.
        assert_eq!(gso_train_len(4128), 15);
        assert!(gso_train_len(4128) * 4128 <= MAX_UDP_PAYLOAD);
        assert_eq!(gso_train_len(20), GSO_MAX_SEGMENTS);
        assert_eq!(gso_train_len(MAX_UDP_PAYLOAD), 1);
        assert_eq!(gso_train_len(0), GSO_MAX_SEGMENTS);
    }

    #[test]
    fn gro_reads_count_their_segments() {
        assert_eq!(gro_segments(4128 * 15, Some(4128)), 15);
        // The last segment of a train may be shorter.
        assert_eq!(gro_segments(4128 * 14 + 100, Some(4128)), 15);
        // No control message: the read is one datagram.
        assert_eq!(gro_segments(4128, None), 1);
        assert_eq!(gro_segments(4128, Some(0)), 1);
    }
}
