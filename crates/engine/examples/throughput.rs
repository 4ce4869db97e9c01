//! How fast is the protocol logic? Two engines in one thread, packets handed from one to the
//! other in a loop (no network, no sockets), memory as plain vectors. Prints operations and
//! payload bytes per second of CPU on one core, per operation and message size.
//!
//! `cargo run --release -p softrdma-engine --example throughput [seconds-per-case]`

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::Instant as WallClock;

use engine::{
    AccessFlags, AhAttr, CqHandle, Engine, EngineConfig, Gid, Instant, MemOwner, Memory,
    MemoryError, MrKeys, PathMtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr,
    SendOp, SendWr, Sge, WcStatus, WorkCompletion,
};

const BASE: u64 = 0x1000_0000;
const MEM: usize = 64 << 20;

#[derive(Clone)]
struct Mem(Rc<RefCell<Vec<u8>>>);

impl Mem {
    fn span(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, MemoryError> {
        let s = addr
            .checked_sub(BASE)
            .ok_or(MemoryError::Fault { addr, len })? as usize;
        if s + len > MEM {
            return Err(MemoryError::Fault { addr, len });
        }
        Ok(s..s + len)
    }
}

impl Memory for Mem {
    fn read(&mut self, _: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let r = self.span(addr, buf.len())?;
        buf.copy_from_slice(&self.0.borrow()[r]);
        Ok(())
    }
    fn write(&mut self, _: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let r = self.span(addr, data.len())?;
        self.0.borrow_mut()[r].copy_from_slice(data);
        Ok(())
    }
    fn compare_swap(&mut self, _: MemOwner, addr: u64, c: u64, s: u64) -> Result<u64, MemoryError> {
        let r = self.span(addr, 8)?;
        let mut m = self.0.borrow_mut();
        let old = u64::from_ne_bytes(m[r.clone()].try_into().unwrap_or([0; 8]));
        if old == c {
            m[r].copy_from_slice(&s.to_ne_bytes());
        }
        Ok(old)
    }
    fn fetch_add(&mut self, _: MemOwner, addr: u64, a: u64) -> Result<u64, MemoryError> {
        let r = self.span(addr, 8)?;
        let mut m = self.0.borrow_mut();
        let old = u64::from_ne_bytes(m[r.clone()].try_into().unwrap_or([0; 8]));
        m[r].copy_from_slice(&old.wrapping_add(a).to_ne_bytes());
        Ok(old)
    }
}

struct Host {
    e: Engine,
    cq: CqHandle,
    mr: MrKeys,
    qpn: u32,
    ip: IpAddr,
}

fn host(ip: &str) -> Host {
    let ip: IpAddr = ip.parse().expect("an IP address");
    let mem = Mem(Rc::new(RefCell::new(vec![0x5a; MEM])));
    let mut e = Engine::new(EngineConfig::new(vec![ip], 1), Box::new(mem));
    let pd = e.alloc_pd().expect("pd");
    let cq = e.create_cq(16_384).expect("cq");
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = e
        .reg_mr(pd, MemOwner(1), BASE, MEM as u64, all)
        .expect("mr");
    let cap = QpCap {
        max_send_wr: 4096,
        max_recv_wr: 4096,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let init = QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap,
        qp_type: QpType::Rc,
        sq_sig_all: true,
    };
    let qpn = e.create_qp(&init).expect("qp");
    Host { e, cq, mr, qpn, ip }
}

fn connect(h: &mut Host, peer_qpn: u32, peer_ip: IpAddr) {
    use QpAttrMask as M;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    h.e.modify_qp(
        h.qpn,
        &a,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
    )
    .expect("init");
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr {
        dgid: Gid::from_ip(peer_ip).0,
        ..AhAttr::default()
    };
    a.path_mtu = PathMtu::Mtu4096;
    a.dest_qp_num = engine::Qpn::new(peer_qpn);
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    let m = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
    h.e.modify_qp(h.qpn, &a, m | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER)
        .expect("rtr");
    a.qp_state = QpState::Rts;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    let m = M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
    h.e.modify_qp(h.qpn, &a, m).expect("rts");
}

#[derive(Clone, Copy)]
enum Op {
    Write,
    Read,
    Send,
    FetchAdd,
}

fn wr(op: Op, id: u64, size: u32, a: &Host, b: &Host) -> SendWr {
    let stride = u64::from(size.max(8));
    let slot = (id % (MEM as u64 / stride).clamp(1, 256)) * stride;
    let sge = Sge::new(BASE + slot, size, a.mr.lkey);
    let remote = BASE + slot;
    match op {
        Op::Write => SendWr::rdma_write(id, vec![sge], remote, b.mr.rkey),
        Op::Read => SendWr::rdma_read(id, vec![sge], remote, b.mr.rkey),
        Op::Send => SendWr::send(id, vec![sge]),
        Op::FetchAdd => SendWr::new(
            id,
            SendOp::AtomicFetchAdd {
                remote_addr: BASE,
                rkey: b.mr.rkey,
                add: 1,
            },
            vec![Sge::new(BASE + slot, 8, a.mr.lkey)],
        ),
    }
}

/// CPU time of this thread in seconds (Linux `schedstat`), so that other processes sharing
/// the machine do not distort the figures; wall-clock time where it is not available.
fn cpu_seconds(wall: &WallClock) -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(|ns| ns as f64 / 1e9)
        .unwrap_or_else(|| wall.elapsed().as_secs_f64())
}

/// Run one case for about `secs` CPU seconds; returns (operations, payload bytes, seconds).
fn run(op: Op, size: u32, secs: f64) -> (u64, u64, f64) {
    let mut a = host("10.9.0.1");
    let mut b = host("10.9.0.2");
    let (qa, qb, ia, ib) = (a.qpn, b.qpn, a.ip, b.ip);
    connect(&mut a, qb, ib);
    connect(&mut b, qa, ia);
    let depth = 128u64;
    let mut posted = 0u64;
    let mut done = 0u64;
    let mut buf = vec![0u8; 8192];
    let mut wcs = vec![WorkCompletion::default(); 256];
    let now = Instant::from_nanos(1);
    let wall = WallClock::now();
    let start = cpu_seconds(&wall);
    loop {
        while posted - done < depth {
            if let Op::Send = op {
                let stride = u64::from(size.max(8));
                let slot = (posted % (MEM as u64 / stride).clamp(1, 256)) * stride;
                let r = Sge::new(BASE + slot, size, b.mr.lkey);
                b.e.post_recv(b.qpn, RecvWr::new(posted, vec![r]))
                    .expect("post_recv");
            }
            a.e.post_send(a.qpn, wr(op, posted, size, &a, &b))
                .expect("post_send");
            posted += 1;
        }
        // Shuttle until both sides are quiet.
        loop {
            let mut moved = false;
            while let Some(t) = a.e.poll_transmit(now, &mut buf) {
                b.e.handle_datagram(now, &buf[..t.len]);
                moved = true;
            }
            while let Some(t) = b.e.poll_transmit(now, &mut buf) {
                a.e.handle_datagram(now, &buf[..t.len]);
                moved = true;
            }
            if !moved {
                break;
            }
        }
        loop {
            let n = a.e.poll_cq_into(a.cq, &mut wcs).expect("poll");
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success);
            }
            done += n as u64;
        }
        while b.e.poll_cq_into(b.cq, &mut wcs).expect("poll") > 0 {}
        let el = cpu_seconds(&wall) - start;
        if el >= secs {
            let bytes = if let Op::FetchAdd = op {
                8 * done
            } else {
                u64::from(size) * done
            };
            return (done, bytes, el);
        }
    }
}

/// The baseline: copying `size` bytes from one buffer to another with `copy_from_slice`
/// (memcpy) for `secs`, in MB/s. Every byte a WRITE, READ or SEND moves is copied at least
/// twice in the engine (source memory into the packet, packet into destination memory).
fn memcpy_mb_per_s(size: u32, secs: f64) -> f64 {
    let size = size as usize;
    let src: Vec<u8> = (0..size).map(|i| i as u8).collect();
    let mut dst = vec![0u8; size];
    let start = WallClock::now();
    let mut copies = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        for _ in 0..64 {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        }
        copies += 64;
    }
    copies as f64 * size as f64 / start.elapsed().as_secs_f64() / 1e6
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    println!("two engines, one thread, MTU 4096, 128 WRs in flight; per second of CPU:");
    println!(
        "{:<10} {:>8} {:>14} {:>12} {:>14} {:>14} {:>10}",
        "op", "size", "ops/s", "MB/s", "packets/op", "memcpy MB/s", "ratio"
    );
    let cases: &[(Op, &str, &[u32])] = &[
        (Op::Write, "WRITE", &[64, 4096, 65_536, 1 << 20]),
        (Op::Read, "READ", &[64, 4096, 65_536, 1 << 20]),
        (Op::Send, "SEND", &[64, 4096, 65_536]),
        (Op::FetchAdd, "FETCH_ADD", &[8]),
    ];
    for &(op, name, sizes) in cases {
        for &size in sizes {
            let (ops, bytes, el) = run(op, size, secs);
            let pkts = u64::from(size).div_ceil(4096).max(1);
            let mb = bytes as f64 / el / 1e6;
            let base = memcpy_mb_per_s(size, secs.min(0.5));
            println!(
                "{:<10} {:>8} {:>14.0} {:>12.1} {:>14} {:>14.1} {:>10.2}",
                name,
                size,
                ops as f64 / el,
                mb,
                pkts,
                base,
                mb / base
            );
        }
    }
}
