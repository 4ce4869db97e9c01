//! A hostile or broken peer: well-formed packets with valid ICRCs but arbitrary opcodes, PSNs,
//! keys, addresses, lengths and syndromes, aimed at connected QPs in every role. The engine
//! must never panic, must keep its counters and completions consistent, and must keep serving.
//!
//! `SOFTRDMA_HOSTILE_ROUNDS=N` sets the number of random packets (default 20 000).

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;

use engine::{
    AccessFlags, AhAttr, Engine, EngineConfig, Gid, Instant, MemOwner, Memory, MemoryError,
    PathMtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendOp, SendWr, Sge,
};
use wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, IpRepr, Ipv4Repr, Msn, Opcode, Psn, Qpn,
    RethRepr, Rkey, Syndrome, TransportRepr,
};

const BASE: u64 = 0x1_0000;
const MEM: usize = 1 << 20;

#[derive(Clone)]
struct Mem(Rc<RefCell<Vec<u8>>>);

impl Mem {
    fn span(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, MemoryError> {
        let s = addr
            .checked_sub(BASE)
            .ok_or(MemoryError::Fault { addr, len })? as usize;
        if s.checked_add(len).is_none_or(|e| e > MEM) {
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
    fn compare_swap(
        &mut self,
        _: MemOwner,
        addr: u64,
        _c: u64,
        _s: u64,
    ) -> Result<u64, MemoryError> {
        self.span(addr, 8).map(|_| 0)
    }
    fn fetch_add(&mut self, _: MemOwner, addr: u64, _a: u64) -> Result<u64, MemoryError> {
        self.span(addr, 8).map(|_| 0)
    }
}

/// splitmix64: enough randomness for a reproducible fuzz loop.
struct R(u64);
impl R {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Victim {
    e: Engine,
    qpns: Vec<u32>,
    rkey: engine::Rkey,
    lkey: engine::Lkey,
    cq: engine::CqHandle,
}

const ME: Ipv4Addr = Ipv4Addr::new(10, 7, 0, 1);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 7, 0, 2);

fn connect(e: &mut Engine, q: u32, i: u32) {
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    use QpAttrMask as M;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: all,
        ..QpAttr::default()
    };
    e.modify_qp(q, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr {
        dgid: Gid::from(PEER).0,
        ..AhAttr::default()
    };
    a.path_mtu = PathMtu::Mtu256;
    a.dest_qp_num = engine::Qpn::new(0x100 + i);
    a.rq_psn = 1000;
    a.max_dest_rd_atomic = 2;
    let m = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC;
    e.modify_qp(q, &a, m | M::MIN_RNR_TIMER).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 5000;
    a.timeout = 14;
    a.retry_cnt = 2;
    a.rnr_retry = 1;
    a.max_rd_atomic = 2;
    let m = M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
    e.modify_qp(q, &a, m).unwrap();
}

fn victim() -> Victim {
    let mem = Mem(Rc::new(RefCell::new(vec![0; MEM])));
    let mut e = Engine::new(EngineConfig::new(vec![IpAddr::V4(ME)], 3), Box::new(mem));
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4096).unwrap();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = e.reg_mr(pd, MemOwner(0), BASE, MEM as u64, all).unwrap();
    let mut qpns = Vec::new();
    for i in 0..3u32 {
        let cap = QpCap {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 16,
        };
        let init = QpInitAttr {
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap,
            qp_type: QpType::Rc,
            sq_sig_all: true,
        };
        let q = e.create_qp(&init).unwrap();
        connect(&mut e, q, i);
        qpns.push(q);
    }
    Victim {
        e,
        qpns,
        rkey: mr.rkey,
        lkey: mr.lkey,
        cq,
    }
}

fn random_packet(r: &mut R, v: &Victim, buf: &mut [u8]) -> usize {
    let ops: Vec<Opcode> = Opcode::ALL
        .iter()
        .copied()
        .filter(|o| o.transport() == wire::Transport::Rc)
        .collect();
    let op = ops[r.below(ops.len() as u64) as usize];
    let qpn = match r.below(10) {
        0 => r.below(1 << 24) as u32,
        i => v.qpns[(i % 3) as usize],
    };
    let psn = match r.below(4) {
        0 => r.below(1 << 24) as u32,
        1 => 1000 + r.below(40) as u32,
        2 => 5000 + r.below(40) as u32,
        _ => (1000u32).wrapping_sub(r.below(40) as u32),
    };
    let mut bth = BthRepr::new(op, Qpn::new(qpn), Psn::new(psn));
    bth.ack_req = r.below(2) == 0;
    bth.solicited = r.below(2) == 0;
    let mut t = TransportRepr::new(bth);
    let ext = op.ext();
    let va = match r.below(4) {
        0 => r.next(),
        1 => BASE + r.below(MEM as u64),
        2 => BASE + MEM as u64 - r.below(64),
        _ => BASE + 8 * r.below(1000),
    };
    let rkey = if r.below(3) == 0 {
        Rkey::new(r.next() as u32)
    } else {
        v.rkey
    };
    if ext.reth {
        let dma_len = match r.below(4) {
            0 => r.next() as u32,
            1 => r.below(1024) as u32,
            2 => 0,
            _ => 256,
        };
        t.reth = Some(RethRepr { va, rkey, dma_len });
    }
    if ext.aeth {
        let raw = r.below(256) as u8;
        let syndrome = Syndrome::from_u8(raw).unwrap_or(Syndrome::ACK_NO_CREDIT);
        t.aeth = Some(AethRepr {
            syndrome,
            msn: Msn::new(r.next() as u32),
        });
    }
    if ext.immdt {
        t.immdt = Some(r.next() as u32);
    }
    if ext.ieth {
        t.ieth = Some(Rkey::new(r.next() as u32));
    }
    if ext.atomic_eth {
        t.atomic_eth = Some(AtomicEthRepr {
            va,
            rkey,
            swap_add: r.next(),
            compare: r.next(),
        });
    }
    if ext.atomic_ack_eth {
        t.atomic_ack_eth = Some(AtomicAckEthRepr { orig: r.next() });
    }
    let plen = if op.has_payload() {
        match r.below(4) {
            0 => 0,
            1 => 256,
            2 => r.below(300) as usize,
            _ => r.below(16) as usize,
        }
    } else {
        0
    };
    let payload: Vec<u8> = (0..plen).map(|i| i as u8).collect();
    let src = if r.below(20) == 0 {
        Ipv4Addr::new(10, 7, 0, 9)
    } else {
        PEER
    };
    let ip = IpRepr::V4(Ipv4Repr {
        src,
        dst: ME,
        tos: 0,
        ident: 0,
        dont_frag: true,
        ttl: 64,
        payload_len: 0,
    });
    wire::emit_packet(&ip, 0xc123, 4791, &t, &payload, buf).unwrap_or(0)
}

#[test]
fn random_well_formed_packets_never_break_the_engine() {
    let rounds: u64 = std::env::var("SOFTRDMA_HOSTILE_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let mut r = R(0x5eed);
    let mut v = victim();
    let mut buf = vec![0u8; 2048];
    let mut out = vec![0u8; 8192];
    let mut now = 0u64;
    let mut delivered = 0u64;
    let mut resets = 0u64;
    for i in 0..rounds {
        // Keep the requesters busy so responses have something to hit.
        if i % 50 == 0 {
            for &q in &v.qpns.clone() {
                let sge = Sge::new(BASE + 0x1000, 300, v.lkey);
                let op = match r.below(4) {
                    0 => SendOp::Send,
                    1 => SendOp::RdmaWrite {
                        remote_addr: BASE,
                        rkey: engine::Rkey::new(1),
                    },
                    2 => SendOp::RdmaRead {
                        remote_addr: BASE,
                        rkey: engine::Rkey::new(1),
                    },
                    _ => SendOp::AtomicFetchAdd {
                        remote_addr: BASE,
                        rkey: engine::Rkey::new(1),
                        add: 1,
                    },
                };
                let sges = if matches!(op, SendOp::AtomicFetchAdd { .. }) {
                    vec![Sge::new(BASE + 0x2000, 8, v.lkey)]
                } else {
                    vec![sge]
                };
                let _ = v.e.post_send(q, SendWr::new(i, op, sges));
                let _ = v.e.post_recv(
                    q,
                    RecvWr::new(i, vec![Sge::new(BASE + 0x3000, 512, v.lkey)]),
                );
            }
        }
        let n = random_packet(&mut r, &v, &mut buf);
        if n > 0 {
            v.e.handle_datagram(Instant::from_nanos(now), &buf[..n]);
            delivered += 1;
        }
        while v
            .e
            .poll_transmit(Instant::from_nanos(now), &mut out)
            .is_some()
        {}
        now += 1_000 + r.below(100_000);
        if let Some(t) = v.e.poll_timeout() {
            if t.as_nanos() <= now {
                v.e.handle_timeout(Instant::from_nanos(now));
            }
        }
        let _ = v.e.poll_cq(v.cq, 4096);
        // Bring errored QPs back, so the fuzzing keeps reaching live transport state.
        for (k, &q) in v.qpns.clone().iter().enumerate() {
            if v.e.query_qp(q).unwrap().qp_state == QpState::Err {
                let a = QpAttr {
                    qp_state: QpState::Reset,
                    ..QpAttr::default()
                };
                v.e.modify_qp(q, &a, QpAttrMask::STATE).unwrap();
                connect(&mut v.e, q, k as u32);
                resets += 1;
            }
        }
        while v.e.get_async_event().is_some() {}
    }
    eprintln!(
        "{delivered} packets, {resets} QP resets; {:?}",
        v.e.counters()
            .iter()
            .filter(|c| c.1 > 0)
            .collect::<Vec<_>>()
    );
    assert!(v.e.counters().get(engine::Counter::RxPackets) > delivered / 2);
    assert!(resets > 0, "hostile packets should have errored some QP");
    // Whatever happened, a QP can still be reset and reconnected.
    for &q in &v.qpns {
        let a = QpAttr {
            qp_state: QpState::Reset,
            ..QpAttr::default()
        };
        v.e.modify_qp(q, &a, QpAttrMask::STATE).unwrap();
    }
}
