//! The engine's own end-to-end checks: two engines connected back to back by a loop that
//! carries their packets (optionally dropping some), with a fake clock.

mod common;

use std::cell::RefCell;
use std::net::IpAddr;
use std::rc::Rc;

use engine::{
    AccessFlags, AhAttr, Counter, CqHandle, Engine, EngineConfig, Gid, Instant, MemOwner, Memory,
    MemoryError, MrKeys, PathMtu, PdHandle, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendFlags, SendOp, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

const BASE: u64 = 0x10_0000;

/// One flat memory per engine, shared with the test.
#[derive(Clone)]
struct VecMem(Rc<RefCell<Vec<u8>>>);

impl VecMem {
    fn range(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, MemoryError> {
        let m = self.0.borrow();
        let start = addr
            .checked_sub(BASE)
            .ok_or(MemoryError::Fault { addr, len })? as usize;
        if start + len > m.len() {
            return Err(MemoryError::Fault { addr, len });
        }
        Ok(start..start + len)
    }
}

impl Memory for VecMem {
    fn read(&mut self, _o: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let r = self.range(addr, buf.len())?;
        buf.copy_from_slice(&self.0.borrow()[r]);
        Ok(())
    }
    fn write(&mut self, _o: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let r = self.range(addr, data.len())?;
        self.0.borrow_mut()[r].copy_from_slice(data);
        Ok(())
    }
    fn compare_swap(
        &mut self,
        _o: MemOwner,
        addr: u64,
        c: u64,
        s: u64,
    ) -> Result<u64, MemoryError> {
        let r = self.range(addr, 8)?;
        let mut m = self.0.borrow_mut();
        let old = u64::from_ne_bytes(m[r.clone()].try_into().unwrap());
        if old == c {
            m[r].copy_from_slice(&s.to_ne_bytes());
        }
        Ok(old)
    }
    fn fetch_add(&mut self, _o: MemOwner, addr: u64, a: u64) -> Result<u64, MemoryError> {
        let r = self.range(addr, 8)?;
        let mut m = self.0.borrow_mut();
        let old = u64::from_ne_bytes(m[r.clone()].try_into().unwrap());
        m[r].copy_from_slice(&old.wrapping_add(a).to_ne_bytes());
        Ok(old)
    }
}

struct Side {
    e: Engine,
    mem: VecMem,
    ip: IpAddr,
    pd: PdHandle,
    cq: CqHandle,
    mr: MrKeys,
    qpn: u32,
}

impl Side {
    fn new(ip: &str, seed: u64, mem_size: usize) -> Side {
        let ip: IpAddr = ip.parse().unwrap();
        let mem = VecMem(Rc::new(RefCell::new(vec![0u8; mem_size])));
        let mut e = Engine::new(EngineConfig::new(vec![ip], seed), Box::new(mem.clone()));
        let pd = e.alloc_pd().unwrap();
        let cq = e.create_cq(4096).unwrap();
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let mr = e
            .reg_mr(pd, MemOwner(1), BASE, mem_size as u64, access)
            .unwrap();
        let qpn = e
            .create_qp(&QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap: QpCap {
                    max_send_wr: 256,
                    max_recv_wr: 256,
                    max_send_sge: 4,
                    max_recv_sge: 4,
                    max_inline_data: 64,
                },
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap();
        Side {
            e,
            mem,
            ip,
            pd,
            cq,
            mr,
            qpn,
        }
    }

    fn fill(&self, addr: u64, data: &[u8]) {
        let s = (addr - BASE) as usize;
        self.mem.0.borrow_mut()[s..s + data.len()].copy_from_slice(data);
    }

    fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let s = (addr - BASE) as usize;
        self.mem.0.borrow()[s..s + len].to_vec()
    }

    fn sge(&self, addr: u64, len: u32) -> Sge {
        Sge::new(addr, len, self.mr.lkey)
    }

    fn poll(&mut self) -> Vec<WorkCompletion> {
        self.e.poll_cq(self.cq, 1 << 20).unwrap()
    }
}

fn connect_with(s: &mut Side, peer_qpn: u32, peer_ip: IpAddr, mtu: PathMtu, rd_atomic: u8) {
    connect_qp(&mut s.e, s.qpn, peer_qpn, peer_ip, mtu, rd_atomic);
}

fn connect_qp(
    e: &mut Engine,
    qpn: u32,
    peer_qpn: u32,
    peer_ip: IpAddr,
    mtu: PathMtu,
    rd_atomic: u8,
) {
    let mut a = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    let m =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    e.modify_qp(qpn, &a, m).unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr {
        dgid: Gid::from_ip(peer_ip).0,
        ..AhAttr::default()
    };
    a.path_mtu = mtu;
    a.dest_qp_num = engine::Qpn::new(peer_qpn);
    a.rq_psn = 100;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 1;
    let m = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    e.modify_qp(qpn, &a, m).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = 100;
    a.timeout = 10;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = rd_atomic;
    let m = QpAttrMask::STATE
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::SQ_PSN
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    e.modify_qp(qpn, &a, m).unwrap();
}

type Filter = Box<dyn FnMut(usize, &[u8]) -> usize>;

struct World {
    a: Side,
    b: Side,
    now: u64,
    /// Called with (packet index, bytes); returns how many copies to deliver (0 drops it).
    filter: Option<Filter>,
    sent: usize,
    /// Every packet carried, for `SOFTRDMA_PCAP` dumps.
    log: Vec<Vec<u8>>,
}

impl World {
    fn new(mtu: PathMtu) -> World {
        World::with_rd_atomic(mtu, 4)
    }

    fn with_rd_atomic(mtu: PathMtu, rd_atomic: u8) -> World {
        World::with_addrs(mtu, rd_atomic, "10.0.0.1", "10.0.0.2")
    }

    fn with_addrs(mtu: PathMtu, rd_atomic: u8, ia: &str, ib: &str) -> World {
        let mut a = Side::new(ia, 1, 1 << 22);
        let mut b = Side::new(ib, 2, 1 << 22);
        let (qa, qb, ia, ib) = (a.qpn, b.qpn, a.ip, b.ip);
        connect_with(&mut a, qb, ib, mtu, rd_atomic);
        connect_with(&mut b, qa, ia, mtu, rd_atomic);
        World {
            a,
            b,
            now: 0,
            filter: None,
            sent: 0,
            log: Vec::new(),
        }
    }

    /// Shuttle packets until both engines are idle and no timer is pending, or `max_ns` of
    /// fake time has passed.
    fn run(&mut self, max_ns: u64) {
        let mut buf = vec![0u8; 8192];
        let end = self.now + max_ns;
        loop {
            let mut moved = false;
            for dir in 0..2 {
                let (src, dst) = if dir == 0 {
                    (&mut self.a, &mut self.b)
                } else {
                    (&mut self.b, &mut self.a)
                };
                let now = Instant::from_nanos(self.now);
                while let Some(t) = src.e.poll_transmit(now, &mut buf) {
                    assert_eq!(t.dst, dst.ip);
                    let pkt = &buf[..t.len];
                    let copies = match self.filter.as_mut() {
                        Some(f) => f(self.sent, pkt),
                        None => 1,
                    };
                    self.sent += 1;
                    if std::env::var_os("SOFTRDMA_PCAP").is_some() {
                        self.log.push(pkt.to_vec());
                    }
                    for _ in 0..copies {
                        dst.e.handle_datagram(now, pkt);
                    }
                    moved = true;
                }
            }
            if moved {
                self.now += 1_000;
                continue;
            }
            let next = [self.a.e.poll_timeout(), self.b.e.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t.as_nanos() <= end => {
                    self.now = self.now.max(t.as_nanos());
                    let now = Instant::from_nanos(self.now);
                    self.a.e.handle_timeout(now);
                    self.b.e.handle_timeout(now);
                }
                _ => return,
            }
        }
    }
}

impl Drop for World {
    /// With `SOFTRDMA_PCAP=dir`, write the packets of the test to `dir/<n>.pcap` (raw IP).
    fn drop(&mut self) {
        let Some(dir) = std::env::var_os("SOFTRDMA_PCAP") else {
            return;
        };
        let mut out = Vec::new();
        out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&4u16.to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        out.extend_from_slice(&65535u32.to_le_bytes());
        out.extend_from_slice(&101u32.to_le_bytes()); // LINKTYPE_RAW
        for (i, p) in self.log.iter().enumerate() {
            out.extend_from_slice(&(i as u32).to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.extend_from_slice(p);
        }
        let name = format!(
            "{}.pcap",
            std::thread::current()
                .name()
                .unwrap_or("x")
                .replace("::", "_")
        );
        let _ = std::fs::write(std::path::Path::new(&dir).join(name), out);
    }
}

const SEC: u64 = 1_000_000_000;

fn one(wcs: &[WorkCompletion]) -> WorkCompletion {
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    wcs[0]
}

#[test]
fn send_lands_in_the_posted_receive_with_immediate() {
    let mut w = World::new(PathMtu::Mtu1024);
    let msg: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    w.a.fill(BASE, &msg);
    let rsge = w.b.sge(BASE + 0x1000, 4096);
    w.b.e
        .post_recv(w.b.qpn, RecvWr::new(7, vec![rsge]))
        .unwrap();
    let sge = w.a.sge(BASE, 3000);
    w.a.e
        .post_send(
            w.a.qpn,
            SendWr::new(1, SendOp::SendWithImm { imm: 0xdead }, vec![sge]),
        )
        .unwrap();
    w.run(SEC);
    let s = one(&w.a.poll());
    assert_eq!(
        (s.wr_id, s.status, s.opcode),
        (1, WcStatus::Success, WcOpcode::Send)
    );
    let r = one(&w.b.poll());
    assert_eq!(
        (r.wr_id, r.status, r.opcode, r.byte_len),
        (7, WcStatus::Success, WcOpcode::Recv, 3000)
    );
    assert_eq!(r.imm_data, 0xdead);
    assert!(r.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(r.src_qp.value(), w.a.qpn);
    assert_eq!(w.b.bytes(BASE + 0x1000, 3000), msg);
}

#[test]
fn write_read_and_atomics_move_the_right_bytes() {
    let mut w = World::new(PathMtu::Mtu256);
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    w.a.fill(BASE, &data);
    let rkey = w.b.mr.rkey;
    let sges = vec![w.a.sge(BASE, 4000), w.a.sge(BASE + 4000, 6000)];
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(1, sges, BASE + 0x10000, rkey))
        .unwrap();
    // Read it back into another place of A.
    let back = w.a.sge(BASE + 0x40000, 10_000);
    w.a.e
        .post_send(
            w.a.qpn,
            SendWr::rdma_read(2, vec![back], BASE + 0x10000, rkey),
        )
        .unwrap();
    w.b.fill(BASE + 0x100, &5u64.to_ne_bytes());
    let res = w.a.sge(BASE + 0x200, 8);
    let fa = SendOp::AtomicFetchAdd {
        remote_addr: BASE + 0x100,
        rkey,
        add: 10,
    };
    w.a.e
        .post_send(w.a.qpn, SendWr::new(3, fa, vec![res]))
        .unwrap();
    let res2 = w.a.sge(BASE + 0x208, 8);
    let cs = SendOp::AtomicCmpSwap {
        remote_addr: BASE + 0x100,
        rkey,
        compare: 15,
        swap: 99,
    };
    w.a.e
        .post_send(w.a.qpn, SendWr::new(4, cs, vec![res2]))
        .unwrap();
    w.run(SEC);
    let wcs = w.a.poll();
    let ids: Vec<(u64, WcStatus)> = wcs.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        ids,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    assert_eq!(wcs[1].opcode, WcOpcode::RdmaRead);
    assert_eq!(wcs[1].byte_len, 10_000);
    assert_eq!(w.b.bytes(BASE + 0x10000, 10_000), data);
    assert_eq!(w.a.bytes(BASE + 0x40000, 10_000), data);
    assert_eq!(w.a.bytes(BASE + 0x200, 8), 5u64.to_ne_bytes());
    assert_eq!(w.a.bytes(BASE + 0x208, 8), 15u64.to_ne_bytes());
    assert_eq!(w.b.bytes(BASE + 0x100, 8), 99u64.to_ne_bytes());
    assert!(w.b.poll().is_empty());
}

#[test]
fn lost_packets_are_retransmitted_and_everything_completes_once() {
    let mut w = World::new(PathMtu::Mtu512);
    // Drop every 7th packet either way.
    w.filter = Some(Box::new(|i, _| usize::from(i % 7 != 3)));
    let data: Vec<u8> = (0..50_000u32).map(|i| (i * 13 % 256) as u8).collect();
    w.a.fill(BASE, &data);
    let rkey = w.b.mr.rkey;
    for i in 0..10u64 {
        let off = i * 5000;
        let sge = w.a.sge(BASE + off, 5000);
        let wr = if i % 3 == 2 {
            SendWr::rdma_read(
                i,
                vec![w.a.sge(BASE + 0x100000 + off, 5000)],
                BASE + 0x80000 + off,
                rkey,
            )
        } else {
            SendWr::rdma_write(i, vec![sge], BASE + 0x80000 + off, rkey)
        };
        w.b.fill(
            BASE + 0x80000 + off,
            &data[off as usize..off as usize + 5000],
        );
        w.a.e.post_send(w.a.qpn, wr).unwrap();
    }
    w.run(100 * SEC);
    let wcs = w.a.poll();
    let ids: Vec<u64> = wcs.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>(), "{wcs:?}");
    assert!(wcs.iter().all(|c| c.status == WcStatus::Success), "{wcs:?}");
    for i in 0..10u64 {
        let off = i * 5000;
        if i % 3 == 2 {
            assert_eq!(
                w.a.bytes(BASE + 0x100000 + off, 5000),
                data[off as usize..off as usize + 5000]
            );
        }
    }
    assert_eq!(w.b.bytes(BASE + 0x80000, 50_000), data);
    assert!(w.a.e.counters().get(Counter::ReqRetries) > 0);
}

#[test]
fn rnr_nak_waits_until_a_receive_is_posted() {
    let mut w = World::new(PathMtu::Mtu1024);
    w.a.fill(BASE, b"hello");
    let sge = w.a.sge(BASE, 5);
    w.a.e
        .post_send(w.a.qpn, SendWr::send(1, vec![sge]))
        .unwrap();
    w.run(50_000); // a few RNR rounds with no receive posted
    assert!(w.a.poll().is_empty());
    assert!(w.b.e.counters().get(Counter::RespRnrNakSent) >= 1);
    let r = w.b.sge(BASE + 0x100, 16);
    w.b.e.post_recv(w.b.qpn, RecvWr::new(9, vec![r])).unwrap();
    w.run(SEC);
    assert_eq!(one(&w.a.poll()).status, WcStatus::Success);
    let rc = one(&w.b.poll());
    assert_eq!((rc.wr_id, rc.byte_len), (9, 5));
    assert_eq!(w.b.bytes(BASE + 0x100, 5), b"hello");
}

#[test]
fn bad_rkey_fails_with_remote_access_error_and_flushes_the_rest() {
    let mut w = World::new(PathMtu::Mtu1024);
    let bad = engine::Rkey::new(w.b.mr.rkey.value() ^ 0x5a5);
    let sge = w.a.sge(BASE, 100);
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(1, vec![sge], BASE, bad))
        .unwrap();
    w.a.e
        .post_send(
            w.a.qpn,
            SendWr::rdma_write(2, vec![sge], BASE, w.b.mr.rkey).signaled(false),
        )
        .unwrap();
    w.run(SEC);
    let wcs = w.a.poll();
    assert_eq!(wcs.len(), 2, "{wcs:?}");
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::RemAccessErr));
    assert_eq!((wcs[1].wr_id, wcs[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(w.a.e.query_qp(w.a.qpn).unwrap().qp_state, QpState::Err);
    assert_eq!(w.b.e.query_qp(w.b.qpn).unwrap().qp_state, QpState::Err);
}

#[test]
fn unreachable_peer_ends_in_retry_exceeded() {
    let mut w = World::new(PathMtu::Mtu1024);
    w.filter = Some(Box::new(|_, _| 0));
    let sge = w.a.sge(BASE, 10);
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(1, vec![sge], BASE, w.b.mr.rkey))
        .unwrap();
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(2, vec![sge], BASE, w.b.mr.rkey))
        .unwrap();
    w.run(100 * SEC);
    let wcs = w.a.poll();
    let got: Vec<(u64, WcStatus)> = wcs.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    // retry_cnt 7: the first transmission and seven retries.
    assert_eq!(w.a.e.counters().get(Counter::CompLocalAckTimeout), 8);
}

#[test]
fn bad_lkey_completes_with_local_protection_error() {
    let mut w = World::new(PathMtu::Mtu1024);
    let sge = Sge::new(BASE, 10, engine::Lkey::new(w.a.mr.lkey.value() ^ 1));
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(1, vec![sge], BASE, w.b.mr.rkey))
        .unwrap();
    w.run(SEC);
    let c = one(&w.a.poll());
    assert_eq!(c.status, WcStatus::LocProtErr);
    assert_eq!(w.a.e.query_qp(w.a.qpn).unwrap().qp_state, QpState::Err);
}

#[test]
fn inline_unsignaled_and_zero_length_sends() {
    let mut w = World::new(PathMtu::Mtu1024);
    for i in 0..3 {
        let r = w.b.sge(BASE + 0x100 * i, 0x100);
        w.b.e.post_recv(w.b.qpn, RecvWr::new(i, vec![r])).unwrap();
    }
    w.a.e
        .post_send(
            w.a.qpn,
            SendWr::send(1, vec![])
                .inline(b"inline!".to_vec())
                .signaled(false),
        )
        .unwrap();
    w.a.e.post_send(w.a.qpn, SendWr::send(2, vec![])).unwrap();
    let solicited = SendWr::send(3, vec![])
        .inline(vec![1, 2, 3])
        .with_flags(SendFlags::SOLICITED);
    w.a.e.post_send(w.a.qpn, solicited).unwrap();
    w.run(SEC);
    let ids: Vec<u64> = w.a.poll().iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![2, 3]);
    let r = w.b.poll();
    let lens: Vec<u32> = r.iter().map(|c| c.byte_len).collect();
    assert_eq!(lens, vec![7, 0, 3]);
    assert_eq!(w.b.bytes(BASE, 7), b"inline!");
    let too_big = SendWr::send(4, vec![]).inline(vec![0; 65]);
    assert!(w.a.e.post_send(w.a.qpn, too_big).is_err());
}

#[test]
fn receive_too_small_is_a_local_length_error_there_and_invalid_request_here() {
    let mut w = World::new(PathMtu::Mtu1024);
    let r = w.b.sge(BASE, 10);
    w.b.e.post_recv(w.b.qpn, RecvWr::new(5, vec![r])).unwrap();
    let s = w.a.sge(BASE, 20);
    w.a.e.post_send(w.a.qpn, SendWr::send(1, vec![s])).unwrap();
    w.run(SEC);
    assert_eq!(one(&w.a.poll()).status, WcStatus::RemInvReqErr);
    assert_eq!(one(&w.b.poll()).status, WcStatus::LocLenErr);
}

#[test]
fn duplicated_packets_execute_atomics_once_and_complete_once() {
    let mut w = World::new(PathMtu::Mtu256);
    // Every packet, both ways, arrives twice.
    w.filter = Some(Box::new(|_, _| 2));
    let rkey = w.b.mr.rkey;
    w.b.fill(BASE + 0x100, &0u64.to_ne_bytes());
    for i in 0..20u64 {
        let res = w.a.sge(BASE + 0x1000 + 8 * i, 8);
        let op = SendOp::AtomicFetchAdd {
            remote_addr: BASE + 0x100,
            rkey,
            add: 1,
        };
        w.a.e
            .post_send(w.a.qpn, SendWr::new(i, op, vec![res]))
            .unwrap();
    }
    let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    w.a.fill(BASE + 0x8000, &data);
    let r = w.b.sge(BASE + 0x9000, 4096);
    w.b.e.post_recv(w.b.qpn, RecvWr::new(77, vec![r])).unwrap();
    let s = w.a.sge(BASE + 0x8000, 3000);
    w.a.e.post_send(w.a.qpn, SendWr::send(20, vec![s])).unwrap();
    w.run(SEC);
    let wcs = w.a.poll();
    let ids: Vec<u64> = wcs.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..21).collect::<Vec<_>>());
    assert!(wcs.iter().all(|c| c.status == WcStatus::Success));
    // Each fetch-add saw the value the previous one left: executed exactly once each.
    for i in 0..20u64 {
        assert_eq!(w.a.bytes(BASE + 0x1000 + 8 * i, 8), i.to_ne_bytes());
    }
    assert_eq!(w.b.bytes(BASE + 0x100, 8), 20u64.to_ne_bytes());
    let r = one(&w.b.poll());
    assert_eq!((r.wr_id, r.byte_len), (77, 3000));
    assert_eq!(w.b.bytes(BASE + 0x9000, 3000), data);
    assert!(w.b.e.counters().get(Counter::RespDuplicateRequest) > 0);
    assert!(w.b.e.counters().get(Counter::RespReplayed) > 0);
}

#[test]
fn a_ghost_ack_for_an_unsent_psn_is_ignored() {
    use wire::{AethRepr, BthRepr, IpRepr, Ipv4Repr, Msn, Opcode, Psn, Qpn, TransportRepr};
    let mut w = World::new(PathMtu::Mtu1024);
    let sge = w.a.sge(BASE, 10);
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(1, vec![sge], BASE, w.b.mr.rkey))
        .unwrap();
    // Forge an ACK from B for PSN 100 + 50, far beyond anything A sent, before A sends at all.
    let ip = IpRepr::V4(Ipv4Repr {
        src: "10.0.0.2".parse().unwrap(),
        dst: "10.0.0.1".parse().unwrap(),
        tos: 0,
        ident: 0,
        dont_frag: true,
        ttl: 64,
        payload_len: 0,
    });
    let mut t = TransportRepr::new(BthRepr::new(
        Opcode::RcAcknowledge,
        Qpn::new(w.a.qpn),
        Psn::new(150),
    ));
    t.aeth = Some(AethRepr {
        syndrome: wire::Syndrome::ACK_NO_CREDIT,
        msn: Msn::new(1),
    });
    let mut buf = [0u8; 128];
    let n = wire::emit_packet(&ip, 0xc000, 4791, &t, &[], &mut buf).unwrap();
    w.a.e.handle_datagram(Instant::from_nanos(0), &buf[..n]);
    assert!(w.a.poll().is_empty(), "a ghost ACK completed nothing");
    assert_eq!(w.a.e.counters().get(Counter::CompGhostAck), 1);
    w.run(SEC);
    assert_eq!(one(&w.a.poll()).status, WcStatus::Success);
}

#[test]
fn cq_overflow_raises_an_async_error_and_errors_the_qp() {
    let mut w = World::new(PathMtu::Mtu1024);
    let small = w.a.e.create_cq(2).unwrap();
    // A second QP on A whose send CQ holds two completions.
    let qpn =
        w.a.e
            .create_qp(&QpInitAttr {
                pd: w.a.pd,
                send_cq: small,
                recv_cq: w.a.cq,
                cap: QpCap {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QpType::Rc,
                sq_sig_all: true,
            })
            .unwrap();
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    let m =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    w.a.e.modify_qp(qpn, &a, m).unwrap();
    // Moving to ERR flushes posted receives into the big CQ; post 3 sends after: 3 flushes.
    w.a.e
        .modify_qp(
            qpn,
            &QpAttr {
                qp_state: QpState::Err,
                ..a
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    assert!(w.a.e.post_send(qpn, SendWr::send(1, vec![])).is_ok());
    assert!(w.a.e.post_send(qpn, SendWr::send(2, vec![])).is_ok());
    assert_eq!(w.a.e.get_async_event(), None);
    assert!(w.a.e.post_send(qpn, SendWr::send(3, vec![])).is_ok());
    assert_eq!(
        w.a.e.get_async_event(),
        Some(engine::AsyncEvent::CqErr { cq: small })
    );
    assert_eq!(w.a.e.poll_cq(small, 10).unwrap().len(), 2);
    assert_eq!(w.a.e.counters().get(Counter::CqOverflow), 1);
}

#[test]
fn max_rd_atomic_one_and_fences_still_complete_everything_in_order() {
    let mut w = World::with_rd_atomic(PathMtu::Mtu512, 1);
    let rkey = w.b.mr.rkey;
    let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 3) as u8).collect();
    w.b.fill(BASE + 0x20000, &pattern);
    for i in 0..8u64 {
        let dst = w.a.sge(BASE + 0x40000 + i * 1024, 1024);
        let wr = SendWr::rdma_read(i, vec![dst], BASE + 0x20000 + i * 1024, rkey);
        w.a.e.post_send(w.a.qpn, wr).unwrap();
        let src = w.a.sge(BASE + 0x40000 + i * 1024, 1024);
        // A fenced WRITE copies what the READ just fetched: it must wait for the READ.
        let wr = SendWr::rdma_write(100 + i, vec![src], BASE + 0x60000 + i * 1024, rkey)
            .with_flags(SendFlags::FENCE);
        w.a.e.post_send(w.a.qpn, wr).unwrap();
    }
    w.run(SEC);
    let wcs = w.a.poll();
    assert_eq!(wcs.len(), 16);
    assert!(wcs.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(w.b.bytes(BASE + 0x60000, 8192), pattern);
}

/// Memory that holds nothing: reads produce a pattern of the address, writes check it.
struct Synthetic {
    checked: Rc<RefCell<u64>>,
}

fn pattern(addr: u64) -> u8 {
    (addr ^ (addr >> 9) ^ (addr >> 17)) as u8
}

impl Memory for Synthetic {
    fn read(&mut self, _o: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        for (i, b) in buf.iter_mut().enumerate() {
            *b = pattern(addr + i as u64);
        }
        Ok(())
    }
    fn write(&mut self, _o: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        // The destination sits 4 GiB above the source.
        for (i, b) in data.iter().enumerate() {
            assert_eq!(
                *b,
                pattern(addr - (4 << 30) + i as u64),
                "byte at {:#x}",
                addr + i as u64
            );
        }
        *self.checked.borrow_mut() += data.len() as u64;
        Ok(())
    }
    fn compare_swap(
        &mut self,
        _o: MemOwner,
        _a: u64,
        _c: u64,
        _s: u64,
    ) -> Result<u64, MemoryError> {
        Ok(0)
    }
    fn fetch_add(&mut self, _o: MemOwner, _a: u64, _x: u64) -> Result<u64, MemoryError> {
        Ok(0)
    }
}

#[test]
fn a_two_gib_write_streams_through_without_materializing() {
    let checked = Rc::new(RefCell::new(0u64));
    let mk = |ip: &str, seed| {
        let ip: IpAddr = ip.parse().unwrap();
        let mem = Synthetic {
            checked: checked.clone(),
        };
        (
            Engine::new(EngineConfig::new(vec![ip], seed), Box::new(mem)),
            ip,
        )
    };
    let (mut ea, ia) = mk("10.0.0.1", 1);
    let (mut eb, ib) = mk("10.0.0.2", 2);
    let len: u64 = 1 << 31;
    let setup = |e: &mut Engine| {
        let pd = e.alloc_pd().unwrap();
        let cq = e.create_cq(16).unwrap();
        let all = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = e.reg_mr(pd, MemOwner(0), 1 << 20, 8 << 30, all).unwrap();
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qpn = e
            .create_qp(&QpInitAttr {
                pd,
                send_cq: cq,
                recv_cq: cq,
                cap,
                qp_type: QpType::Rc,
                sq_sig_all: true,
            })
            .unwrap();
        (cq, mr, qpn)
    };
    let (cqa, mra, qa) = setup(&mut ea);
    let (_, mrb, qb) = setup(&mut eb);
    connect_qp(&mut ea, qa, qb, ib, PathMtu::Mtu4096, 4);
    connect_qp(&mut eb, qb, qa, ia, PathMtu::Mtu4096, 4);
    let src = 1u64 << 20;
    let sge = Sge::new(src, len as u32, mra.lkey);
    ea.post_send(
        qa,
        SendWr::rdma_write(1, vec![sge], src + (4 << 30), mrb.rkey),
    )
    .unwrap();
    let mut buf = vec![0u8; 4200];
    let mut now = Instant::from_nanos(0);
    let mut packets = 0u64;
    loop {
        let mut moved = false;
        while let Some(t) = ea.poll_transmit(now, &mut buf) {
            eb.handle_datagram(now, &buf[..t.len]);
            packets += 1;
            moved = true;
        }
        while let Some(t) = eb.poll_transmit(now, &mut buf) {
            ea.handle_datagram(now, &buf[..t.len]);
            moved = true;
        }
        if !moved {
            // The responder's ACKs wait for their deadline (the only timer it has).
            match eb.poll_timeout() {
                Some(t) if t > now => now = t,
                _ => break,
            }
        }
    }
    let c = one(&ea.poll_cq(cqa, 4).unwrap());
    assert_eq!((c.status, c.byte_len), (WcStatus::Success, 1 << 31));
    assert_eq!(*checked.borrow(), len);
    assert_eq!(packets, len / 4096);
}

#[test]
fn armed_cq_fires_once_and_solicited_only_waits_for_the_solicited_message() {
    let mut w = World::new(PathMtu::Mtu1024);
    for i in 0..3 {
        let r = w.b.sge(BASE + 0x100 * i, 0x100);
        w.b.e.post_recv(w.b.qpn, RecvWr::new(i, vec![r])).unwrap();
    }
    w.b.e.req_notify_cq(w.b.cq, true).unwrap();
    w.a.e.post_send(w.a.qpn, SendWr::send(1, vec![])).unwrap();
    w.run(SEC);
    assert_eq!(
        w.b.e.get_cq_event(),
        None,
        "an unsolicited message does not wake"
    );
    let s = SendWr::send(2, vec![]).with_flags(SendFlags::SOLICITED);
    w.a.e.post_send(w.a.qpn, s).unwrap();
    w.run(SEC);
    assert_eq!(w.b.e.get_cq_event(), Some(w.b.cq));
    // Disarmed after firing.
    w.a.e
        .post_send(
            w.a.qpn,
            SendWr::send(3, vec![]).with_flags(SendFlags::SOLICITED),
        )
        .unwrap();
    w.run(SEC);
    assert_eq!(w.b.e.get_cq_event(), None);
    assert_eq!(w.b.poll().len(), 3);
    // Any completion fires a CQ armed without solicited_only.
    w.a.e.req_notify_cq(w.a.cq, false).unwrap();
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(4, vec![], BASE, w.b.mr.rkey))
        .unwrap();
    w.run(SEC);
    assert_eq!(w.a.e.get_cq_event(), Some(w.a.cq));
}

#[test]
fn sqd_finishes_started_messages_then_reports_drained_and_resumes_in_rts() {
    let mut w = World::new(PathMtu::Mtu256);
    let rkey = w.b.mr.rkey;
    let sge = w.a.sge(BASE, 4096);
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(1, vec![sge], BASE, rkey))
        .unwrap();
    // Let the first packets of WR 1 leave, then drain.
    let mut buf = [0u8; 1024];
    let t0 = Instant::from_nanos(0);
    let t = w.a.e.poll_transmit(t0, &mut buf).unwrap();
    w.b.e.handle_datagram(t0, &buf[..t.len]);
    let sqd = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..QpAttr::default()
    };
    let m = QpAttrMask::STATE | QpAttrMask::EN_SQD_ASYNC_NOTIFY;
    w.a.e.modify_qp(w.a.qpn, &sqd, m).unwrap();
    assert!(w.a.e.query_qp(w.a.qpn).unwrap().sq_draining);
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(2, vec![sge], BASE, rkey))
        .unwrap();
    w.run(SEC);
    let ids: Vec<u64> = w.a.poll().iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![1], "WR 2 waits in SQD");
    assert_eq!(
        w.a.e.get_async_event(),
        Some(engine::AsyncEvent::SqDrained {
            qpn: engine::Qpn::new(w.a.qpn)
        })
    );
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    w.a.e.modify_qp(w.a.qpn, &rts, QpAttrMask::STATE).unwrap();
    w.run(SEC);
    let ids: Vec<u64> = w.a.poll().iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![2]);
}

#[test]
fn deregistering_the_mr_under_a_long_read_ends_it_with_remote_access_error() {
    let mut w = World::new(PathMtu::Mtu1024);
    let dst = w.a.sge(BASE, 65_536);
    let rd = SendWr::rdma_read(1, vec![dst], BASE + 0x10_0000, w.b.mr.rkey);
    w.a.e.post_send(w.a.qpn, rd).unwrap();
    let mut buf = [0u8; 2048];
    let t0 = Instant::from_nanos(0);
    let t = w.a.e.poll_transmit(t0, &mut buf).unwrap();
    w.b.e.handle_datagram(t0, &buf[..t.len]);
    let t = w.b.e.poll_transmit(t0, &mut buf).unwrap();
    w.a.e.handle_datagram(t0, &buf[..t.len]);
    w.b.e.dereg_mr(w.b.mr.handle).unwrap();
    w.run(SEC);
    assert_eq!(one(&w.a.poll()).status, WcStatus::RemAccessErr);
    assert_eq!(w.b.e.query_qp(w.b.qpn).unwrap().qp_state, QpState::Err);
}

#[test]
fn ipv6_gids_give_ipv6_packets_that_work_end_to_end() {
    let mut w = World::with_addrs(PathMtu::Mtu1024, 4, "fd00::1", "fd00::2");
    assert_eq!(
        w.a.e.query_gid(1, 0).unwrap(),
        Gid::from_ip("fd00::1".parse().unwrap())
    );
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 11) as u8).collect();
    w.a.fill(BASE, &data);
    let sge = w.a.sge(BASE, 5000);
    w.a.e
        .post_send(
            w.a.qpn,
            SendWr::rdma_write(1, vec![sge], BASE + 0x8000, w.b.mr.rkey),
        )
        .unwrap();
    let back = w.a.sge(BASE + 0x10000, 5000);
    w.a.e
        .post_send(
            w.a.qpn,
            SendWr::rdma_read(2, vec![back], BASE + 0x8000, w.b.mr.rkey),
        )
        .unwrap();
    w.run(SEC);
    let wcs = w.a.poll();
    assert!(
        wcs.len() == 2 && wcs.iter().all(|c| c.status == WcStatus::Success),
        "{wcs:?}"
    );
    assert_eq!(w.a.bytes(BASE + 0x10000, 5000), data);
    // Every packet was IPv6.
    assert!(w.a.e.counters().get(Counter::RxPackets) > 0);
    let mut buf = [0u8; 2048];
    let sge = w.a.sge(BASE, 10);
    w.a.e
        .post_send(w.a.qpn, SendWr::rdma_write(3, vec![sge], BASE, w.b.mr.rkey))
        .unwrap();
    let t =
        w.a.e
            .poll_transmit(Instant::from_nanos(0), &mut buf)
            .unwrap();
    assert_eq!(buf[0] >> 4, 6);
    assert_eq!(t.dst, "fd00::2".parse::<IpAddr>().unwrap());
}

#[test]
fn write_with_immediate_consumes_a_receive_and_send_with_invalidate_reports_the_key() {
    let mut w = World::new(PathMtu::Mtu1024);
    for i in 0..2 {
        let r = w.b.sge(BASE + 0x100 * i, 0x100);
        w.b.e
            .post_recv(w.b.qpn, RecvWr::new(10 + i, vec![r]))
            .unwrap();
    }
    let data: Vec<u8> = (0..2500u32).map(|i| (i * 5) as u8).collect();
    w.a.fill(BASE, &data);
    let sge = w.a.sge(BASE, 2500);
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: BASE + 0x4000,
        rkey: w.b.mr.rkey,
        imm: 0x1234_5678,
    };
    w.a.e
        .post_send(w.a.qpn, SendWr::new(1, op, vec![sge]))
        .unwrap();
    // The key of a second region of B's PD, which the SEND invalidates (IBA 10.6.6).
    let extra =
        w.b.e
            .reg_mr(
                w.b.pd,
                MemOwner(1),
                BASE,
                4096,
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
    let op = SendOp::SendWithInv { rkey: extra.rkey };
    w.a.e
        .post_send(w.a.qpn, SendWr::new(2, op, vec![w.a.sge(BASE, 16)]))
        .unwrap();
    w.run(SEC);
    let a = w.a.poll();
    assert_eq!(
        a.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert_eq!(a[0].opcode, WcOpcode::RdmaWrite);
    let b = w.b.poll();
    assert_eq!(b.len(), 2);
    assert_eq!(
        (b[0].wr_id, b[0].opcode, b[0].byte_len, b[0].imm_data),
        (10, WcOpcode::RecvRdmaWithImm, 2500, 0x1234_5678)
    );
    assert!(b[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(w.b.bytes(BASE + 0x4000, 2500), data);
    assert_eq!(
        (b[1].wr_id, b[1].opcode, b[1].byte_len),
        (11, WcOpcode::Recv, 16)
    );
    assert!(b[1].wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(b[1].invalidated_rkey, extra.rkey);
}

#[test]
fn verbs_reject_what_verbs_reject() {
    let mut w = World::new(PathMtu::Mtu1024);
    let e = &mut w.a.e;
    // post_send before RTS, SGE and queue limits.
    let init = common::one_wr_rc(w.a.pd, w.a.cq);
    let q = e.create_qp(&init).unwrap();
    let err = e.post_send(q, SendWr::send(1, vec![])).unwrap_err();
    assert_eq!(err.errno(), 22);
    assert_eq!(
        e.post_recv(q, RecvWr::new(1, vec![])).unwrap_err().errno(),
        22,
        "RESET rejects receives"
    );
    let sges = vec![
        Sge::new(BASE, 1, engine::Lkey::new(0)),
        Sge::new(BASE, 1, engine::Lkey::new(0)),
    ];
    let a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..QpAttr::default()
    };
    e.modify_qp(
        q,
        &a,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    assert!(matches!(
        e.post_recv(q, RecvWr::new(1, sges)),
        Err(engine::VerbsError::TooManySge { .. })
    ));
    e.post_recv(q, RecvWr::new(1, vec![])).unwrap();
    assert_eq!(
        e.post_recv(q, RecvWr::new(2, vec![])).unwrap_err().errno(),
        12,
        "queue full is ENOMEM"
    );
    // A wrong transition is EINVAL, not a panic.
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..QpAttr::default()
    };
    assert_eq!(
        e.modify_qp(q, &rts, QpAttrMask::STATE).unwrap_err().errno(),
        22
    );
    // PD and CQ in use cannot go away; MR access rules.
    assert_eq!(e.dealloc_pd(w.a.pd).unwrap_err().errno(), 16);
    assert_eq!(e.destroy_cq(w.a.cq).unwrap_err().errno(), 16);
    assert!(e
        .reg_mr(w.a.pd, MemOwner(1), BASE, 10, AccessFlags::REMOTE_WRITE)
        .is_err());
    assert!(e.create_cq(0).is_err());
    assert_eq!(e.query_port(2).unwrap_err().errno(), 22);
    assert!(e.query_gid(1, 5).is_err());
    let port = e.query_port(1).unwrap();
    assert_eq!(
        (port.state, port.link_layer, port.gid_tbl_len),
        (engine::PortState::Active, engine::LinkLayer::Ethernet, 1)
    );
    let d = e.query_device();
    assert!(d.max_qp > 0 && d.max_sge >= 4 && d.max_qp_rd_atom > 0 && d.max_inline_data > 0);
    // Destroy in order, then the PD goes.
    e.destroy_qp(q).unwrap();
    e.destroy_qp(w.a.qpn).unwrap();
    e.dereg_mr(w.a.mr.handle).unwrap();
    e.dealloc_pd(w.a.pd).unwrap();
    e.destroy_cq(w.a.cq).unwrap();
}
