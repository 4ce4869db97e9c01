//! How do `poll_timeout` and `handle_timeout` cost with the number of QPs? One engine with N
//! connected RC QPs, each with a few RDMA WRITEs sent and never acknowledged (the peer does
//! not exist), so every QP has its local ACK timer running. Prints nanoseconds per call of
//! `poll_timeout` and of `handle_timeout` at a time when no timer is due (what a host pays on
//! every pass), for 1, 100, 1000 and 10 000 QPs. A measurement, not a test: it asserts
//! nothing about time.
//!
//! `cargo run --release -p softrdma-engine --example timer_scale`

use std::cell::RefCell;
use std::hint::black_box;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant as WallClock};

use engine::{
    AccessFlags, AhAttr, Engine, EngineConfig, Gid, Instant, MemOwner, Memory, MemoryError,
    PathMtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, SendWr, Sge,
};

const BASE: u64 = 0x1000_0000;
const MEM: usize = 1 << 16;
/// RDMA WRITEs per QP, sent and left unacknowledged.
const SENDS: u64 = 3;
/// Local ACK timeout code: 4.096 µs × 2^14 ≈ 67 ms, far beyond the measurement's "now".
const TIMEOUT: u8 = 14;

#[derive(Clone)]
struct Mem(Rc<RefCell<Vec<u8>>>);

impl Mem {
    fn span(addr: u64, len: usize) -> Result<std::ops::Range<usize>, MemoryError> {
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
        let r = Mem::span(addr, buf.len())?;
        buf.copy_from_slice(&self.0.borrow()[r]);
        Ok(())
    }
    fn write(&mut self, _: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let r = Mem::span(addr, data.len())?;
        self.0.borrow_mut()[r].copy_from_slice(data);
        Ok(())
    }
    fn compare_swap(&mut self, _: MemOwner, _: u64, _: u64, _: u64) -> Result<u64, MemoryError> {
        Ok(0)
    }
    fn fetch_add(&mut self, _: MemOwner, _: u64, _: u64) -> Result<u64, MemoryError> {
        Ok(0)
    }
}

/// An engine with `n` RC QPs to a peer that never answers, each with `SENDS` WRITEs sent at
/// time `t0`.
fn engine_with_unacked_qps(n: u32, t0: Instant) -> Engine {
    let me: IpAddr = "10.0.0.1".parse().expect("an address");
    let peer: IpAddr = "10.0.0.2".parse().expect("an address");
    let mem = Mem(Rc::new(RefCell::new(vec![0x5a; MEM])));
    let mut e = Engine::new(EngineConfig::new(vec![me], 1), Box::new(mem));
    let pd = e.alloc_pd().expect("pd");
    let cq = e.create_cq(1024).expect("cq");
    let mr = e
        .reg_mr(pd, MemOwner(1), BASE, MEM as u64, AccessFlags::LOCAL_WRITE)
        .expect("mr");
    for i in 0..n {
        let qpn = e
            .create_qp(&QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .expect("qp");
        connect(&mut e, qpn, peer, 0x100 + i);
        for k in 0..SENDS {
            let sge = Sge::new(BASE + 64 * k, 64, mr.lkey);
            let wr = SendWr::rdma_write(k, vec![sge], 0x2000_0000, engine::Rkey::new(0x1234));
            e.post_send(qpn, wr).expect("post_send");
        }
    }
    let mut buf = vec![0u8; 4096];
    while e.poll_transmit(t0, &mut buf).is_some() {}
    e
}

fn connect(e: &mut Engine, qpn: u32, peer: IpAddr, peer_qpn: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    e.modify_qp(qpn, &init, mask | QpAttrMask::ACCESS_FLAGS)
        .expect("init");
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: PathMtu::Mtu1024,
        dest_qp_num: engine::Qpn::new(peer_qpn),
        max_dest_rd_atomic: 1,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: Gid::from_ip(peer).0,
            is_global: true,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    e.modify_qp(qpn, &rtr, mask).expect("rtr");
    let rts = QpAttr {
        qp_state: QpState::Rts,
        timeout: TIMEOUT,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 1,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    e.modify_qp(qpn, &rts, mask).expect("rts");
}

/// Median over rounds of the nanoseconds one call of `f` takes, `iters` calls per round.
fn ns_per_call(iters: u32, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..7)
        .map(|_| {
            let start = WallClock::now();
            for _ in 0..iters {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(iters)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

fn main() {
    let t0 = Instant::from_nanos(1_000_000);
    let now = t0 + Duration::from_micros(1);
    println!("| QPs | poll_timeout ns/call | handle_timeout ns/call (nothing due) |");
    println!("|---:|---:|---:|");
    for n in [1u32, 100, 1000, 10_000] {
        let mut e = engine_with_unacked_qps(n, t0);
        let first = e.poll_timeout();
        assert!(
            first.is_some_and(|t| t > now),
            "every QP's ACK timer runs and none is due: {first:?}"
        );
        let iters = (2_000_000 / n).clamp(200, 1_000_000);
        let poll = ns_per_call(iters, || {
            black_box(e.poll_timeout());
        });
        let handle = ns_per_call(iters, || {
            e.handle_timeout(black_box(now));
        });
        assert_eq!(e.poll_timeout(), first, "nothing was due");
        println!("| {n} | {poll:.0} | {handle:.0} |");
    }
}
