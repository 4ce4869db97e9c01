//! rdma-core's `rping` on the runtime's connection manager, either role, to prove the CM
//! against an unmodified `rping` (and the kernel's rdma_cm behind it).
//!
//! rping's exchange after the connection is up (facts from rdma-core's
//! `librdmacm/examples/rping.c`): the client SENDs `struct rping_rdma_info { be64 buf; be32
//! rkey; be32 size; }` naming its source buffer, the server RDMA READs it and SENDs back
//! (any 16 bytes: a go-ahead); the client SENDs the info of its sink buffer, the server RDMA
//! WRITEs the string it read (up to its NUL) into it and SENDs again; the client compares.
//! After `count` pings the client disconnects. Both sides ask for one READ each way.
//!
//! Usage: `rping -c LOCAL_IP SERVER_IP [PORT [COUNT [SIZE]]]` (port 7174, 3 pings of 64
//! bytes by default), or `rping -s LOCAL_IP [PORT]` (serves one client, until it
//! disconnects). Against kernel rxe in the rxe-vm (`shared/tools/rxe-vm`, as root):
//!
//! ```text
//! run-vm.sh hostpeer 'rping -s -v -a 10.50.0.11 -C 3' \
//!   'target/debug/examples/rping -c 10.50.0.1 10.50.0.11'
//! run-vm.sh hostpeer 'for i in 1 2 3 4 5 6; do rping -c -v -a 10.50.0.1 -C 3 && break; sleep 1; done' \
//!   'target/debug/examples/rping -s 10.50.0.1'
//! ```
//!
//! The client retries its connection (with a fresh QP) while the server is not listening
//! yet (the VM boots meanwhile).

use std::net::IpAddr;
use std::time::{Duration, Instant};

use engine::{
    AccessFlags, CqHandle, Lkey, PdHandle, QpCap, QpInitAttr, QpType, RecvWr, Rkey, SendWr, Sge,
    WcOpcode, WcStatus,
};
use runtime::{
    CmChannel, CmEvent, CommId, ConnParam, PortSpace, Runtime, RuntimeConfig, RuntimeError,
    ServiceId,
};

/// The registered area: one MR holding rping's four buffers.
const AREA: usize = 64 * 1024;
const SEND_AT: usize = 0;
const RECV_AT: usize = 64;
const START_AT: usize = 1024;

/// How long the whole run may take (the VM boots meanwhile): a hang guard.
const LIMIT: Duration = Duration::from_secs(240);

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let usage = || -> ! {
        eprintln!("usage: rping -c LOCAL_IP SERVER_IP [PORT [COUNT [SIZE]]] | -s LOCAL_IP [PORT]");
        std::process::exit(2)
    };
    let ip = |i: usize| -> IpAddr {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| usage())
    };
    let r = match args.get(1).map(String::as_str) {
        Some("-c") => {
            let port: u16 = arg(4, "7174").parse().unwrap_or_else(|_| usage());
            let count: u32 = arg(5, "3").parse().unwrap_or_else(|_| usage());
            let size: usize = arg(6, "64").parse().unwrap_or_else(|_| usage());
            if !(16..=(AREA - START_AT) / 2).contains(&size) {
                usage();
            }
            client(ip(2), ip(3), port, count, size)
                .map(|()| format!("{count} pings of {size} bytes passed"))
        }
        Some("-s") => {
            let port: u16 = arg(3, "7174").parse().unwrap_or_else(|_| usage());
            server(ip(2), port).map(|n| format!("served {n} pings"))
        }
        _ => usage(),
    };
    match r {
        Ok(done) => println!("rping: {done}"),
        Err(e) => {
            eprintln!("rping: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

/// A device with rping's buffers registered, its CQ and a CM event channel.
struct Device {
    rt: Runtime,
    pd: PdHandle,
    cq: CqHandle,
    /// Registered; read and written only under the engine lock (see `reg_mr`).
    area: Vec<u8>,
    lkey: Lkey,
    rkey: Rkey,
    channel: CmChannel,
}

impl Device {
    fn open(local: IpAddr) -> Result<Device> {
        let rt = Runtime::start(RuntimeConfig::new(local))?;
        let mut area = vec![0u8; AREA];
        let (pd, cq, keys) = {
            let mut g = rt.lock();
            let pd = g.alloc_pd()?;
            let cq = g.create_cq(64)?;
            let access =
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
            // SAFETY: `area` is neither moved nor freed while the runtime lives (`Device`
            // drops `rt` first), and it is touched only under the engine lock.
            let keys = unsafe { g.reg_mr(pd, area.as_mut_ptr(), AREA, access)? };
            (pd, cq, keys)
        };
        Ok(Device {
            rt,
            pd,
            cq,
            area,
            lkey: keys.lkey,
            rkey: keys.rkey,
            channel: CmChannel::new()?,
        })
    }

    /// An RC QP in RESET: the CM moves it from here.
    fn qp(&self) -> std::result::Result<u32, RuntimeError> {
        Ok(self.rt.lock().create_qp(&QpInitAttr {
            pd: self.pd,
            send_cq: self.cq,
            recv_cq: self.cq,
            cap: QpCap {
                max_send_wr: 8,
                max_recv_wr: 8,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })?)
    }

    fn addr(&self, at: usize) -> u64 {
        self.area.as_ptr() as u64 + at as u64
    }

    fn sge(&self, at: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr(at),
            length: len as u32,
            lkey: self.lkey,
        }
    }

    fn event(&self) -> Result<CmEvent> {
        Ok(self.channel.wait_event(Some(LIMIT))?.ok_or("no CM event")?)
    }

    fn post_recv(&self, qp: u32) -> std::result::Result<(), RuntimeError> {
        let wr = RecvWr::new(1, &[self.sge(RECV_AT, 64)][..]);
        Ok(self.rt.lock().post_recv(qp, wr)?)
    }

    fn post_send(&self, qp: u32, wr: SendWr) -> std::result::Result<(), RuntimeError> {
        Ok(self.rt.lock().post_send(qp, wr)?)
    }

    /// SEND rping's 16-byte info naming `size` bytes at `at`.
    fn send_info(&mut self, qp: u32, at: usize, size: usize) -> Result<()> {
        let (addr, rkey) = (self.addr(at), self.rkey);
        {
            let _g = self.rt.lock();
            let info = &mut self.area[SEND_AT..SEND_AT + 16];
            info[..8].copy_from_slice(&addr.to_be_bytes());
            info[8..12].copy_from_slice(&rkey.value().to_be_bytes());
            info[12..].copy_from_slice(&(size as u32).to_be_bytes());
        }
        self.post_send(qp, SendWr::send(2, &[self.sge(SEND_AT, 16)][..]))?;
        Ok(())
    }

    /// Bytes of the registered area.
    fn read(&self, at: usize, len: usize) -> Vec<u8> {
        let _g = self.rt.lock();
        self.area[at..at + len].to_vec()
    }

    /// Wait for one successful completion of each kind in `want` (in any order); a failed
    /// one is an error, a flushed receive (the peer disconnected) is `Ok(false)`.
    fn completions(&self, want: &[WcOpcode]) -> Result<bool> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = vec![false; want.len()];
        while seen.contains(&false) {
            // One at a time: what is not waited for now stays for the next call.
            for wc in self.rt.lock().poll_cq(self.cq, 1)? {
                match wc.status {
                    WcStatus::Success => {}
                    WcStatus::WrFlushErr => return Ok(false),
                    _ => return Err(format!("completion failed: {wc:?}").into()),
                }
                if let Some(i) = want.iter().position(|&w| w == wc.opcode) {
                    seen[i] = true;
                }
            }
            if seen.contains(&false) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(format!("no completion of {want:?} in 30 s").into());
                }
                self.rt.wait_cq(self.cq, Some(left))?;
            }
        }
        Ok(true)
    }
}

fn client(local: IpAddr, server: IpAddr, port: u16, count: u32, size: usize) -> Result<()> {
    let mut d = Device::open(local)?;
    let (qp, id) = connect(&d, server, port, Instant::now() + LIMIT)?;
    println!("rping: connected (QP {qp:#x})");
    let (start, sink) = (START_AT, START_AT + size);
    for ping in 0..count {
        // rping's pattern: the ping number, then printable characters, NUL-terminated.
        let mut text = format!("rdma-ping-{ping}: ").into_bytes();
        let mut ch = b'A' + (ping % 26) as u8;
        while text.len() < size - 1 {
            text.push(ch);
            ch = if ch == b'z' { b'A' } else { ch + 1 };
        }
        text.truncate(size - 1);
        text.push(0);
        {
            let _g = d.rt.lock();
            d.area[start..start + size].copy_from_slice(&text);
            d.area[sink..sink + size].fill(0);
        }
        // The server READs the start buffer, then says go ahead; WRITEs the sink, then
        // says done.
        for at in [start, sink] {
            d.send_info(qp, at, size)?;
            if !d.completions(&[WcOpcode::Send, WcOpcode::Recv])? {
                return Err("the server went away".into());
            }
            d.post_recv(qp)?;
        }
        let echoed = d.read(sink, size);
        if echoed != text {
            return Err(format!(
                "ping {ping}: wrote {:?}, got back {:?}",
                String::from_utf8_lossy(&text),
                String::from_utf8_lossy(&echoed)
            )
            .into());
        }
        println!(
            "rping: ping {ping} ok: {}",
            String::from_utf8_lossy(&text[..size - 1])
        );
    }
    d.rt.lock().cm_disconnect(&d.channel, id, &[])?;
    match d.event()? {
        CmEvent::Disconnected { .. } => {}
        other => return Err(format!("expected the disconnection, got {other:?}").into()),
    }
    println!("rping: CM counters {:?}", d.rt.cm_counters());
    Ok(())
}

/// Connect a fresh QP until the server accepts (it may not listen yet: the VM boots).
fn connect(d: &Device, server: IpAddr, port: u16, deadline: Instant) -> Result<(u32, CommId)> {
    let service = ServiceId::rdma_cm(PortSpace::TCP, port);
    loop {
        let qp = d.qp()?;
        let mut param = ConnParam::default();
        param.responder_resources = 1;
        param.initiator_depth = 1;
        let id =
            d.rt.lock()
                .cm_connect(&d.channel, Some(qp), server, service, &param)?;
        // The QP is in INIT now: the receive for the server's first SEND goes first.
        d.post_recv(qp)?;
        match d.event()? {
            CmEvent::Established { .. } => return Ok((qp, id)),
            CmEvent::Rejected { reason, .. } => {
                println!("rping: rejected (reason {}); trying again", reason.0)
            }
            CmEvent::Unreachable { .. } => println!("rping: no answer; trying again"),
            other => return Err(format!("unexpected CM event {other:?}").into()),
        }
        d.rt.lock().destroy_qp(qp)?;
        if Instant::now() >= deadline {
            return Err("the server never accepted".into());
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// rping's server info: where the client's buffer is.
fn parse_info(b: &[u8]) -> (u64, Rkey, u32) {
    let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let addr = u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
    (addr, Rkey::new(u32_at(8)), u32_at(12))
}

fn server(local: IpAddr, port: u16) -> Result<u32> {
    let mut d = Device::open(local)?;
    let service = ServiceId::rdma_cm(PortSpace::TCP, port);
    d.rt.lock().cm_listen(&d.channel, service)?;
    let CmEvent::ConnectRequest(req) = d.event()? else {
        return Err("expected a connect request".into());
    };
    println!("rping: request from {}:{}", req.peer, req.peer_port);
    let qp = d.qp()?;
    let mut param = ConnParam::default();
    param.responder_resources = 1;
    param.initiator_depth = 1;
    d.rt.lock()
        .cm_accept(&d.channel, req.id, Some(qp), &param)?;
    d.post_recv(qp)?;
    match d.event()? {
        CmEvent::Established { .. } => println!("rping: established (QP {qp:#x})"),
        other => return Err(format!("expected the connection, got {other:?}").into()),
    }
    let rdma_at = START_AT;
    let mut pings = 0;
    loop {
        // The client's source buffer, or the end: the client disconnects after its last
        // ping, which flushes the receive.
        if !d.completions(&[WcOpcode::Recv])? {
            break;
        }
        let (addr, rkey, len) = parse_info(&d.read(RECV_AT, 16));
        let len = (len as usize).min(AREA - rdma_at);
        d.post_recv(qp)?;
        let read = SendWr::new(
            3,
            engine::SendOp::RdmaRead {
                remote_addr: addr,
                rkey,
            },
            &[d.sge(rdma_at, len)][..],
        );
        d.post_send(qp, read)?;
        d.completions(&[WcOpcode::RdmaRead])?;
        let data = d.read(rdma_at, len);
        let text_len = data.iter().position(|&b| b == 0).map_or(len, |n| n + 1);
        println!(
            "rping: server ping data: {}",
            String::from_utf8_lossy(&data[..text_len.saturating_sub(1)])
        );
        // Go ahead: the client names its sink.
        d.send_info(qp, rdma_at, len)?;
        if !d.completions(&[WcOpcode::Send, WcOpcode::Recv])? {
            return Err("the client went away mid-ping".into());
        }
        let (addr, rkey, _) = parse_info(&d.read(RECV_AT, 16));
        d.post_recv(qp)?;
        let write = SendWr::rdma_write(4, &[d.sge(rdma_at, text_len)][..], addr, rkey);
        d.post_send(qp, write)?;
        d.completions(&[WcOpcode::RdmaWrite])?;
        // Done: the client compares and starts the next ping.
        d.send_info(qp, rdma_at, len)?;
        d.completions(&[WcOpcode::Send])?;
        pings += 1;
    }
    match d.event()? {
        CmEvent::Disconnected { .. } => {}
        other => return Err(format!("expected the disconnection, got {other:?}").into()),
    }
    println!("rping: CM counters {:?}", d.rt.cm_counters());
    Ok(pings)
}
