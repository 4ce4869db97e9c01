//! An `rping -c` on the runtime's connection manager: connects to an unmodified `rping -s`
//! (rdma-core's librdmacm example, or the kernel's rdma_cm behind it) and runs its ping
//! loop, to prove the CM against another implementation.
//!
//! rping's exchange after the connection is up (facts from rdma-core's
//! `librdmacm/examples/rping.c`): the client SENDs `struct rping_rdma_info { be64 buf; be32
//! rkey; be32 size; }` naming its source buffer, the server RDMA READs it and SENDs back
//! (any 16 bytes: a go-ahead); the client SENDs the info of its sink buffer, the server RDMA
//! WRITEs the string it read into it and SENDs again; the client compares. After `count`
//! pings the client disconnects.
//!
//! Usage: `rping_client LOCAL_IP SERVER_IP [PORT [COUNT [SIZE]]]` (port 7174, 3 pings of 64
//! bytes by default). Used against kernel rxe in the rxe-vm:
//!
//! ```text
//! run-vm.sh hostpeer 'rping -s -v -a 10.50.0.11 -C 3' \
//!   'target/debug/examples/rping_client 10.50.0.1 10.50.0.11'
//! ```
//!
//! It retries the connection (with a fresh QP) while the server is not listening yet.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use engine::{AccessFlags, QpCap, QpInitAttr, QpType, RecvWr, SendWr, Sge, WcOpcode, WcStatus};
use runtime::{
    CmChannel, CmEvent, ConnParam, PortSpace, Runtime, RuntimeConfig, RuntimeError, ServiceId,
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
    if args.len() < 3 {
        eprintln!("usage: rping_client LOCAL_IP SERVER_IP [PORT [COUNT [SIZE]]]");
        std::process::exit(2);
    }
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let local: IpAddr = args[1].parse().expect("LOCAL_IP");
    let server: IpAddr = args[2].parse().expect("SERVER_IP");
    let port: u16 = arg(3, "7174").parse().expect("PORT");
    let count: u32 = arg(4, "3").parse().expect("COUNT");
    let size: usize = arg(5, "64").parse().expect("SIZE");
    assert!((16..=(AREA - START_AT) / 2).contains(&size), "SIZE");
    match run(local, server, port, count, size) {
        Ok(()) => println!("rping_client: {count} pings of {size} bytes passed"),
        Err(e) => {
            eprintln!("rping_client: FAILED: {e}");
            std::process::exit(1);
        }
    }
}

/// The client's state: the device, its buffers, and the connection's QP.
struct Client {
    rt: Runtime,
    cq: engine::CqHandle,
    area: Vec<u8>,
    lkey: u32,
    rkey: u32,
    channel: CmChannel,
    size: usize,
}

fn run(local: IpAddr, server: IpAddr, port: u16, count: u32, size: usize) -> Result<()> {
    let rt = Runtime::start(RuntimeConfig::new(local))?;
    let mut area = vec![0u8; AREA];
    let (pd, cq, keys) = {
        let mut g = rt.lock();
        let pd = g.alloc_pd()?;
        let cq = g.create_cq(64)?;
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        // SAFETY: `area` is neither moved nor freed while the runtime lives (`Client` drops
        // `rt` first), and it is read only under the engine lock.
        let keys = unsafe { g.reg_mr(pd, area.as_mut_ptr(), AREA, access)? };
        (pd, cq, keys)
    };
    let mut c = Client {
        rt,
        cq,
        area,
        lkey: keys.lkey,
        rkey: keys.rkey,
        channel: CmChannel::new()?,
        size,
    };
    let deadline = Instant::now() + LIMIT;
    let (qp, id) = c.connect(pd, server, port, deadline)?;
    println!("rping_client: connected (QP {qp:#x})");
    for ping in 0..count {
        c.ping(qp, ping)?;
    }
    c.rt.lock().cm_disconnect(id, &[])?;
    match c.channel.wait_event(Some(Duration::from_secs(30)))? {
        Some(CmEvent::Disconnected { .. }) => {}
        other => return Err(format!("expected the disconnection, got {other:?}").into()),
    }
    println!("rping_client: CM counters {:?}", c.rt.cm_counters());
    Ok(())
}

impl Client {
    fn sge(&self, at: usize, len: usize) -> Sge {
        Sge {
            addr: self.area.as_ptr() as u64 + at as u64,
            length: len as u32,
            lkey: self.lkey,
        }
    }

    /// Connect a fresh QP until the server accepts (it may not listen yet: the VM boots).
    fn connect(
        &mut self,
        pd: engine::PdHandle,
        server: IpAddr,
        port: u16,
        deadline: Instant,
    ) -> Result<(u32, runtime::CommId)> {
        let service = ServiceId::rdma_cm(PortSpace::TCP, port);
        loop {
            let qp = self.rt.lock().create_qp(&QpInitAttr {
                pd,
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
            })?;
            // rping's choices: one READ each way.
            let mut param = ConnParam::default();
            param.responder_resources = 1;
            param.initiator_depth = 1;
            let id = self
                .rt
                .lock()
                .cm_connect(&self.channel, qp, server, service, &param)?;
            // The QP is in INIT now: the receive for the server's first SEND goes first.
            self.post_recv(qp)?;
            let left = deadline.saturating_duration_since(Instant::now());
            match self.channel.wait_event(Some(left))? {
                Some(CmEvent::Established { .. }) => return Ok((qp, id)),
                Some(ev @ (CmEvent::Rejected { .. } | CmEvent::Unreachable { .. })) => {
                    println!("rping_client: {ev:?}; trying again");
                    self.rt.lock().destroy_qp(qp)?;
                    if Instant::now() >= deadline {
                        return Err("the server never accepted".into());
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
                other => return Err(format!("unexpected CM event {other:?}").into()),
            }
        }
    }

    fn post_recv(&self, qp: u32) -> std::result::Result<(), RuntimeError> {
        let wr = RecvWr::new(1, &[self.sge(RECV_AT, 64)][..]);
        Ok(self.rt.lock().post_recv(qp, wr)?)
    }

    /// SEND rping's info for the buffer at `at`, then wait for the server's SEND back.
    fn advertise(&mut self, qp: u32, at: usize) -> Result<()> {
        let addr = self.area.as_ptr() as u64 + at as u64;
        {
            let _g = self.rt.lock();
            let info = &mut self.area[SEND_AT..SEND_AT + 16];
            info[..8].copy_from_slice(&addr.to_be_bytes());
            info[8..12].copy_from_slice(&self.rkey.to_be_bytes());
            info[12..].copy_from_slice(&(self.size as u32).to_be_bytes());
        }
        let wr = SendWr::send(2, &[self.sge(SEND_AT, 16)][..]);
        self.rt.lock().post_send(qp, wr)?;
        // Our SEND's completion and the server's SEND may complete in either order.
        self.completions(&[WcOpcode::Send, WcOpcode::Recv])?;
        self.post_recv(qp)?;
        Ok(())
    }

    /// One ping: the server reads our start buffer and writes it back into our sink.
    fn ping(&mut self, qp: u32, ping: u32) -> Result<()> {
        let start = START_AT;
        let sink = START_AT + self.size;
        let text = {
            // rping's pattern: the ping number, then printable characters, NUL-terminated.
            let mut s = format!("rdma-ping-{ping}: ").into_bytes();
            let mut ch = b'A' + (ping % 26) as u8;
            while s.len() < self.size - 1 {
                s.push(ch);
                ch = if ch == b'z' { b'A' } else { ch + 1 };
            }
            s.truncate(self.size - 1);
            s.push(0);
            s
        };
        {
            let _g = self.rt.lock();
            self.area[start..start + self.size].copy_from_slice(&text);
            self.area[sink..sink + self.size].fill(0);
        }
        self.advertise(qp, start)?;
        self.advertise(qp, sink)?;
        let echoed = {
            let _g = self.rt.lock();
            self.area[sink..sink + self.size].to_vec()
        };
        if echoed != text {
            return Err(format!(
                "ping {ping}: wrote {:?}, got back {:?}",
                String::from_utf8_lossy(&text),
                String::from_utf8_lossy(&echoed)
            )
            .into());
        }
        println!(
            "rping_client: ping {ping} ok: {}",
            String::from_utf8_lossy(&text[..text.len() - 1])
        );
        Ok(())
    }

    /// Wait for one successful completion of each kind in `want`; a failed one is an error.
    fn completions(&self, want: &[WcOpcode]) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = vec![false; want.len()];
        while seen.contains(&false) {
            for wc in self.rt.lock().poll_cq(self.cq, 1)? {
                if wc.status != WcStatus::Success {
                    return Err(format!("completion failed: {wc:?}").into());
                }
                if let Some(i) = want.iter().position(|&w| w == wc.opcode) {
                    seen[i] = true;
                }
            }
            if !seen.contains(&false) {
                break;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!("no completion of {want:?} in 30 s").into());
            }
            self.rt.wait_cq(self.cq, Some(left))?;
        }
        Ok(())
    }
}
