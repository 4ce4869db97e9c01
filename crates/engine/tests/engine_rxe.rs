//! Wire compatibility with Linux Soft-RoCE, checked against real traffic: for each RC flow of
//! `shared/testdata/rxe-verbs-suite.pcap` (perftest WRITE, READ, FETCH_ADD and SEND between two
//! Linux 6.1 rxe hosts), two engines take the places of the two hosts, the requester is given
//! the same work requests, and every packet each engine sends must equal the one rxe sent in
//! its place, byte for byte, except the IPv4 identification (rxe counts it up, we send 0, as
//! an unconnected UDP socket does), the IPv4 header checksum and the ICRC that cover it.
//! Then the completions must be what the programs got.
//!
//! The same flows run again on rxe's own packets, with their IPv4 IDs replaced by 0 as a host
//! receiving on a UDP socket sees them: engines set to `Ipv4IdentPolicy::Recover` find each ID
//! in the ICRC, accept the packets and complete the exchange, while engines checking the
//! header as received drop them, and both drop corrupted packets.

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::rc::Rc;

use engine::{
    AccessFlags, AhAttr, Counter, Engine, EngineConfig, Gid, Instant, Ipv4IdentPolicy, MemOwner,
    Memory, MemoryError, PathMtu, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, RecvWr,
    SendOp, SendWr, Sge, WcStatus,
};
use wire::{Ipv4, OpKind, RoceV2Packet};

const REQUESTER: Ipv4Addr = Ipv4Addr::new(10, 50, 0, 12);
const RESPONDER: Ipv4Addr = Ipv4Addr::new(10, 50, 0, 11);

fn capture(name: &str) -> Option<Vec<u8>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    for dir in ["../shared/testdata", "samples"] {
        if let Ok(b) = std::fs::read(root.join(dir).join(name)) {
            return Some(b);
        }
    }
    // The capture also lives beside the repository in the session layout.
    std::fs::read(PathBuf::from("/work/shared/testdata").join(name)).ok()
}

/// The RoCE packets (whole IP packets) of a classic little-endian Ethernet pcap.
fn roce_packets(pcap: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= pcap.len() {
        let incl = u32::from_le_bytes(pcap[at + 8..at + 12].try_into().unwrap()) as usize;
        let frame = &pcap[at + 16..at + 16 + incl];
        at += 16 + incl;
        if frame.len() < 14 + 28 || frame[12..14] != [0x08, 0x00] {
            continue;
        }
        let ip = &frame[14..];
        if ip[9] == 17 && u16::from_be_bytes([ip[22], ip[23]]) == 4791 {
            out.push(ip.to_vec());
        }
    }
    out
}

/// The packet as a host receiving on a UDP socket hands it to the engine: the IPv4 header
/// rebuilt with ID 0 (and a checksum to match).
fn with_ident_hidden(ip: &[u8]) -> Vec<u8> {
    let mut b = ip.to_vec();
    let mut h = Ipv4::new_unchecked(&mut b[..]);
    h.set_ident(0);
    h.fill_checksum();
    b
}

/// The IPv4 identification of a packet.
fn ident(ip: &[u8]) -> u16 {
    Ipv4::new_checked(ip).unwrap().ident()
}

/// Sparse test memory: regions at chosen virtual addresses.
#[derive(Clone, Default)]
struct Mem(Rc<RefCell<Regions>>);

/// (base address, bytes) of each region.
type Regions = Vec<(u64, Vec<u8>)>;

impl Mem {
    fn add(&self, base: u64, bytes: Vec<u8>) {
        self.0.borrow_mut().push((base, bytes));
    }
    fn with<R>(
        &self,
        addr: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, MemoryError> {
        let mut m = self.0.borrow_mut();
        for (base, bytes) in m.iter_mut() {
            if addr >= *base && addr + len as u64 <= *base + bytes.len() as u64 {
                let o = (addr - *base) as usize;
                return Ok(f(&mut bytes[o..o + len]));
            }
        }
        Err(MemoryError::Fault { addr, len })
    }
}

impl Memory for Mem {
    fn read(&mut self, _: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.with(addr, buf.len(), |b| buf.copy_from_slice(b))
    }
    fn write(&mut self, _: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.with(addr, data.len(), |b| b.copy_from_slice(data))
    }
    fn compare_swap(&mut self, _: MemOwner, addr: u64, c: u64, s: u64) -> Result<u64, MemoryError> {
        self.with(addr, 8, |b| {
            let old = u64::from_ne_bytes(b[..8].try_into().unwrap());
            if old == c {
                b.copy_from_slice(&s.to_ne_bytes());
            }
            old
        })
    }
    fn fetch_add(&mut self, _: MemOwner, addr: u64, a: u64) -> Result<u64, MemoryError> {
        self.with(addr, 8, |b| {
            let old = u64::from_ne_bytes(b[..8].try_into().unwrap());
            b.copy_from_slice(&old.wrapping_add(a).to_ne_bytes());
            old
        })
    }
}

struct Host {
    e: Engine,
    mem: Mem,
    cq: engine::CqHandle,
    lkey: engine::Lkey,
}

const LOCAL: u64 = 0x7000_0000;

/// A host at `ip` whose QP number `qpn` is connected to `peer_qpn`, with one MR over
/// `mr_base..+mr_len` whose rkey is `rkey` (the RNG seed is searched until the key matches
/// the one rxe's peer used: keys are index + random tag, the index of the first MR is 0), and
/// the given policy for the IPv4 IDs of received packets.
fn host(
    ip: Ipv4Addr,
    qpn: u32,
    sq_psn: u32,
    rq_psn: u32,
    mr: (u64, u64, Option<u32>),
    ident: Ipv4IdentPolicy,
) -> Host {
    let mem = Mem::default();
    let (mr_base, mr_len, want_rkey) = mr;
    let mut seed = 0u64;
    let (mut e, pd, keys) = loop {
        let mut config = EngineConfig::new(vec![IpAddr::V4(ip)], seed);
        config.ipv4_ident = ident;
        let mut e = Engine::new(config, Box::new(mem.clone()));
        let pd = e.alloc_pd().unwrap();
        let all = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let keys = e.reg_mr(pd, MemOwner(0), mr_base, mr_len, all).unwrap();
        if want_rkey.is_none_or(|k| k == keys.rkey.value()) {
            break (e, pd, keys);
        }
        seed += 1;
        assert!(seed < 1 << 20, "no seed gives rkey {want_rkey:?}");
    };
    let local = e
        .reg_mr(pd, MemOwner(0), LOCAL, 1 << 20, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let _ = keys;
    let cq = e.create_cq(256).unwrap();
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
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
    // QPNs are handed out from 0x11 up: create QPs until ours has the number rxe's had.
    let mut q = e.create_qp(&init).unwrap();
    while q != qpn {
        q = e.create_qp(&init).unwrap();
    }
    let peer = if ip == REQUESTER {
        RESPONDER
    } else {
        REQUESTER
    };
    use QpAttrMask as M;
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    e.modify_qp(q, &a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
        .unwrap();
    a.qp_state = QpState::Rtr;
    a.ah_attr = AhAttr {
        dgid: Gid::from(peer).0,
        ..AhAttr::default()
    };
    a.path_mtu = PathMtu::Mtu1024;
    a.dest_qp_num = engine::Qpn::new(qpn);
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 12;
    let m = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC;
    e.modify_qp(q, &a, m | M::MIN_RNR_TIMER).unwrap();
    a.qp_state = QpState::Rts;
    a.sq_psn = sq_psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    let m = M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
    e.modify_qp(q, &a, m).unwrap();
    mem.add(LOCAL, vec![0; 1 << 20]);
    Host {
        e,
        mem,
        cq,
        lkey: local.lkey,
    }
}

/// Equal except IPv4 identification, header checksum and ICRC; and once our packet is given
/// rxe's identification, its checksum and ICRC recomputed, equal entirely.
fn assert_same_packet(ours: &[u8], theirs: &[u8], what: &str) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length");
    let n = ours.len();
    for i in 0..n - 4 {
        if matches!(i, 4 | 5 | 10 | 11) {
            continue;
        }
        assert_eq!(ours[i], theirs[i], "{what}: byte {i} differs");
    }
    let mut patched = ours.to_vec();
    patched[4..6].copy_from_slice(&theirs[4..6]);
    patched[10..12].copy_from_slice(&[0, 0]);
    let mut sum = 0u32;
    for w in patched[..20].chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    patched[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    let icrc = wire::icrc::compute(&patched[..n - 4]).unwrap();
    patched[n - 4..].copy_from_slice(&wire::icrc::icrc_bytes(icrc));
    assert!(
        patched == theirs,
        "{what}: not byte-identical once the IP ID is rxe's"
    );
}

/// What each engine of a replay is handed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Feed {
    /// The other engine's packets (ID 0, as we send them), checked as received.
    Ours,
    /// rxe's packets from the capture in their place, with their IPv4 IDs hidden as a UDP
    /// socket hides them, to engines that recover the ID; before the first request, a copy of
    /// it with one payload byte corrupted, which must be dropped.
    RxesWithHiddenIds,
}

/// The WRs a flow's requester posts, and how many receives its responder needs.
type Build = fn(&[RoceV2Packet<'_>], &Host, &Host) -> (Vec<SendWr>, usize);

/// Replays the flow of QP `qpn`: posts `wrs` on a requester, then shuttles packets one at a
/// time (each answer right after its request, as the hosts did), comparing each with rxe's.
/// Returns the requester and the responder.
fn replay(qpn: u32, feed: Feed, build: Build) -> Option<(Host, Host)> {
    let Some(pcap) = capture("rxe-verbs-suite.pcap") else {
        eprintln!("rxe capture not found; skipping");
        return None;
    };
    let raw = roce_packets(&pcap);
    let flow: Vec<RoceV2Packet<'_>> = raw
        .iter()
        .filter_map(|b| RoceV2Packet::parse_checked(b).ok())
        .filter(|p| p.transport.bth.dest_qp.value() == qpn)
        .collect();
    let reqs: Vec<&RoceV2Packet<'_>> = flow
        .iter()
        .filter(|p| p.ip.src() == IpAddr::V4(REQUESTER))
        .collect();
    let resps: Vec<&RoceV2Packet<'_>> = flow
        .iter()
        .filter(|p| p.ip.src() == IpAddr::V4(RESPONDER))
        .collect();
    assert!(!reqs.is_empty() && !resps.is_empty());
    let sq_psn = reqs[0].transport.bth.psn.value();
    let rkey = reqs.iter().find_map(|p| {
        p.transport
            .reth
            .map(|r| r.rkey.value())
            .or(p.transport.atomic_eth.map(|a| a.rkey.value()))
    });
    let target = reqs
        .iter()
        .find_map(|p| {
            p.transport
                .reth
                .map(|r| r.va)
                .or(p.transport.atomic_eth.map(|a| a.va))
        })
        .unwrap_or(0x10_0000)
        & !0xfff;
    let policy = match feed {
        Feed::Ours => Ipv4IdentPolicy::AsReceived,
        Feed::RxesWithHiddenIds => Ipv4IdentPolicy::Recover,
    };
    let mut a = host(REQUESTER, qpn, sq_psn, 1, (0x1000, 0x1000, None), policy);
    let mut b = host(RESPONDER, qpn, 1, sq_psn, (target, 1 << 20, rkey), policy);
    b.mem.add(target, vec![0; 1 << 20]);
    let flow_ref: Vec<RoceV2Packet<'_>> = flow.clone();
    let (wrs, recvs) = build(&flow_ref, &a, &b);
    for i in 0..recvs {
        let sge = Sge::new(LOCAL + 0x4000 * i as u64, 0x4000, b.lkey);
        b.e.post_recv(qpn, RecvWr::new(i as u64, vec![sge]))
            .unwrap();
    }
    let n = wrs.len();
    for wr in wrs {
        a.e.post_send(qpn, wr).unwrap();
    }
    let raw_of = |p: &RoceV2Packet<'_>| -> Vec<u8> {
        raw.iter()
            .find(|r| {
                RoceV2Packet::parse_checked(r)
                    .is_ok_and(|q| q.transport == p.transport && q.ip.src() == p.ip.src())
            })
            .cloned()
            .unwrap()
    };
    let mut now = Instant::from_nanos(0);
    let mut buf = vec![0u8; 4096];
    let (mut ri, mut si) = (0, 0);
    while let Some(t) = a.e.poll_transmit(now, &mut buf) {
        let theirs = raw_of(reqs[ri]);
        assert_same_packet(&buf[..t.len], &theirs, &format!("QP {qpn:#x} request {ri}"));
        match feed {
            Feed::Ours => b.e.handle_datagram(now, &buf[..t.len]),
            Feed::RxesWithHiddenIds => {
                let seen = with_ident_hidden(&theirs);
                if ri == 0 {
                    let mut bad = seen.clone();
                    let last = bad.len() - 5; // the last byte before the ICRC
                    bad[last] ^= 0x40;
                    b.e.handle_datagram(now, &bad);
                    assert!(b.e.poll_transmit(now, &mut buf).is_none());
                    assert_eq!(b.e.counters().get(Counter::RxBadIcrc), 1);
                    assert_eq!(b.e.counters().get(Counter::RxPackets), 0);
                }
                b.e.handle_datagram(now, &seen);
            }
        }
        ri += 1;
        // rxe answered each request before the next came: so do we, once the ACK's
        // deadline (`poll_timeout`) has come.
        loop {
            while let Some(t) = b.e.poll_transmit(now, &mut buf) {
                let theirs = raw_of(resps[si]);
                assert_same_packet(
                    &buf[..t.len],
                    &theirs,
                    &format!("QP {qpn:#x} response {si}"),
                );
                si += 1;
                match feed {
                    Feed::Ours => a.e.handle_datagram(now, &buf[..t.len]),
                    Feed::RxesWithHiddenIds => {
                        a.e.handle_datagram(now, &with_ident_hidden(&theirs))
                    }
                }
            }
            match b.e.poll_timeout() {
                Some(t) if t > now => now = t,
                _ => break,
            }
        }
    }
    assert_eq!(
        (ri, si),
        (reqs.len(), resps.len()),
        "QP {qpn:#x}: packet counts"
    );
    let wcs = a.e.poll_cq(a.cq, 64).unwrap();
    assert_eq!(wcs.len(), n);
    assert!(wcs.iter().all(|c| c.status == WcStatus::Success), "{wcs:?}");
    if feed == Feed::Ours {
        for h in [&a, &b] {
            assert_eq!(h.e.counters().get(Counter::RxBadIcrc), 0);
            assert_eq!(h.e.counters().get(Counter::RxIcrcIdRecovered), 0);
        }
    }
    Some((a, b))
}

/// One WR per message rxe's requester sent in `flow`, its data placed in `a`'s memory (one
/// 16 KiB slot per message): `wr(index, sge)` makes the WR.
fn per_message_wrs(
    flow: &[RoceV2Packet<'_>],
    a: &Host,
    wr: impl Fn(u64, Sge) -> SendWr,
) -> Vec<SendWr> {
    let mut wrs = Vec::new();
    let mut msg = Vec::new();
    for p in flow.iter().filter(|p| p.ip.src() == IpAddr::V4(REQUESTER)) {
        msg.extend_from_slice(p.payload);
        if p.transport.bth.opcode.is_last() || p.transport.bth.opcode.is_only() {
            let at = LOCAL + 0x4000 * wrs.len() as u64;
            a.mem
                .with(at, msg.len(), |b| b.copy_from_slice(&msg))
                .unwrap();
            wrs.push(wr(wrs.len() as u64, Sge::new(at, msg.len() as u32, a.lkey)));
            msg.clear();
        }
    }
    wrs
}

/// RDMA WRITE (QP 0x11): one WR per message rxe's requester wrote, with its data.
fn write_wrs(flow: &[RoceV2Packet<'_>], a: &Host, _b: &Host) -> (Vec<SendWr>, usize) {
    let wrs = per_message_wrs(flow, a, |i, sge| {
        SendWr::rdma_write(i, vec![sge], 0x5635_b307_2000, engine::Rkey::new(0x2a9))
    });
    (wrs, 0)
}

#[test]
fn rdma_write_flow_matches_rxe_byte_for_byte() {
    replay(0x11, Feed::Ours, write_wrs);
}

/// RDMA READ (QP 0x12): the READs rxe's requester made, over memory holding what it read.
fn read_wrs(flow: &[RoceV2Packet<'_>], a: &Host, b: &Host) -> (Vec<SendWr>, usize) {
    let req = flow
        .iter()
        .find(|p| p.transport.bth.opcode.kind() == OpKind::RdmaReadRequest)
        .unwrap();
    let reth = req.transport.reth.unwrap();
    // The responder's memory holds what rxe read (the first READ's responses).
    let data: Vec<u8> = flow
        .iter()
        .filter(|p| p.transport.bth.opcode.kind() == OpKind::RdmaReadResponse)
        .take(3)
        .flat_map(|p| p.payload.iter().copied())
        .collect();
    assert_eq!(data.len(), reth.dma_len as usize);
    b.mem
        .with(reth.va, data.len(), |m| m.copy_from_slice(&data))
        .unwrap();
    let n = flow
        .iter()
        .filter(|p| p.transport.bth.opcode.kind() == OpKind::RdmaReadRequest)
        .count();
    let wrs = (0..n)
        .map(|i| {
            let sge = Sge::new(LOCAL + 0x4000 * i as u64, reth.dma_len, a.lkey);
            SendWr::rdma_read(i as u64, vec![sge], reth.va, reth.rkey)
        })
        .collect();
    (wrs, 0)
}

#[test]
fn rdma_read_flow_matches_rxe_byte_for_byte() {
    replay(0x12, Feed::Ours, read_wrs);
}

/// FETCH_ADD (QP 0x13): rxe's atomics, each word holding what rxe's responder found there.
fn fetch_add_wrs(flow: &[RoceV2Packet<'_>], a: &Host, b: &Host) -> (Vec<SendWr>, usize) {
    let reqs: Vec<_> = flow
        .iter()
        .filter(|p| p.transport.bth.opcode.kind() == OpKind::FetchAdd)
        .collect();
    let acks: Vec<_> = flow
        .iter()
        .filter(|p| p.transport.bth.opcode.kind() == OpKind::AtomicAcknowledge)
        .collect();
    let mut wrs = Vec::new();
    for (i, (r, k)) in reqs.iter().zip(&acks).enumerate() {
        let at = r.transport.atomic_eth.unwrap();
        // Each word holds what rxe's responder found there.
        b.mem
            .with(at.va, 8, |w| {
                w.copy_from_slice(&k.transport.atomic_ack_eth.unwrap().orig.to_ne_bytes())
            })
            .unwrap();
        let sge = Sge::new(LOCAL + 8 * i as u64, 8, a.lkey);
        let op = SendOp::AtomicFetchAdd {
            remote_addr: at.va,
            rkey: at.rkey,
            add: at.swap_add,
        };
        wrs.push(SendWr::new(i as u64, op, vec![sge]));
    }
    (wrs, 0)
}

#[test]
fn fetch_add_flow_matches_rxe_byte_for_byte() {
    replay(0x13, Feed::Ours, fetch_add_wrs);
}

/// SEND (QP 0x14): one WR per message rxe's requester sent, and a receive for each.
fn send_wrs(flow: &[RoceV2Packet<'_>], a: &Host, _b: &Host) -> (Vec<SendWr>, usize) {
    let wrs = per_message_wrs(flow, a, |i, sge| SendWr::send(i, vec![sge]));
    let n = wrs.len();
    (wrs, n)
}

#[test]
fn send_flow_matches_rxe_byte_for_byte() {
    replay(0x14, Feed::Ours, send_wrs);
}

/// The replayed flows: QP, and the WRs its requester posts.
const FLOWS: [(u32, Build); 4] = [
    (0x11, write_wrs),
    (0x12, read_wrs),
    (0x13, fetch_add_wrs),
    (0x14, send_wrs),
];

#[test]
fn every_flow_completes_on_rxe_packets_whose_ids_a_udp_socket_hid() {
    let Some(pcap) = capture("rxe-verbs-suite.pcap") else {
        eprintln!("rxe capture not found; skipping");
        return;
    };
    let raw = roce_packets(&pcap);
    for (qpn, build) in FLOWS {
        let Some((a, mut b)) = replay(qpn, Feed::RxesWithHiddenIds, build) else {
            return;
        };
        // Each engine recovered the ID of every packet rxe sent it with a non-zero one, and
        // dropped only the corrupted copy.
        let from = |src: Ipv4Addr| -> Vec<&Vec<u8>> {
            raw.iter()
                .filter(|r| {
                    RoceV2Packet::parse_checked(r).is_ok_and(|p| {
                        p.transport.bth.dest_qp.value() == qpn && p.ip.src() == IpAddr::V4(src)
                    })
                })
                .collect()
        };
        for (host, sent, bad) in [(&b, from(REQUESTER), 1), (&a, from(RESPONDER), 0)] {
            let nonzero = sent.iter().filter(|r| ident(r) != 0).count() as u64;
            assert!(nonzero > 0, "QP {qpn:#x}: rxe's IDs count up");
            let c = host.e.counters();
            assert_eq!(c.get(Counter::RxIcrcIdRecovered), nonzero, "QP {qpn:#x}");
            assert_eq!(c.get(Counter::RxBadIcrc), bad, "QP {qpn:#x}");
            assert_eq!(c.get(Counter::RxPackets), sent.len() as u64, "QP {qpn:#x}");
        }
        if qpn == 0x14 {
            // The responder received every message.
            let wcs = b.e.poll_cq(b.cq, 64).unwrap();
            assert!(!wcs.is_empty());
            assert!(wcs.iter().all(|c| c.status == WcStatus::Success), "{wcs:?}");
        }
    }
}

#[test]
fn rxe_packets_whose_ids_a_udp_socket_hid_are_dropped_when_checked_as_received() {
    let Some(pcap) = capture("rxe-verbs-suite.pcap") else {
        eprintln!("rxe capture not found; skipping");
        return;
    };
    let raw = roce_packets(&pcap);
    let nonzero = raw.iter().filter(|r| ident(r) != 0).count() as u64;
    assert!(nonzero > 100, "{nonzero}");
    for policy in [Ipv4IdentPolicy::AsReceived, Ipv4IdentPolicy::Recover] {
        // Every packet reaches the ICRC check first, whichever QP and address it is for.
        let mut h = host(RESPONDER, 0x11, 1, 1, (0x1000, 0x1000, None), policy);
        for r in &raw {
            h.e.handle_datagram(Instant::from_nanos(0), &with_ident_hidden(r));
        }
        let c = h.e.counters();
        let (bad, recovered) = match policy {
            Ipv4IdentPolicy::AsReceived => (nonzero, 0),
            _ => (0, nonzero),
        };
        assert_eq!(c.get(Counter::RxBadIcrc), bad, "{policy:?}");
        assert_eq!(c.get(Counter::RxIcrcIdRecovered), recovered, "{policy:?}");
    }
    // The default is the exact check.
    assert_eq!(
        EngineConfig::new(vec![], 0).ipv4_ident,
        Ipv4IdentPolicy::AsReceived
    );
}

#[test]
fn corrupted_rxe_packets_are_dropped_whatever_the_id_policy() {
    let (Some(suite), Some(badicrc)) =
        (capture("rxe-verbs-suite.pcap"), capture("rxe-badicrc.pcap"))
    else {
        eprintln!("rxe captures not found; skipping");
        return;
    };
    // rxe-badicrc's first packet carries a wrong ICRC (one bit flipped by its sender); the
    // others are a payload byte of each suite packet that carries one, changed.
    let mut corrupted = vec![roce_packets(&badicrc)[0].clone()];
    for r in roce_packets(&suite) {
        let p = RoceV2Packet::parse_checked(&r).unwrap();
        if !p.payload.is_empty() {
            let mut bad = r.clone();
            let last = bad.len() - 5;
            bad[last] ^= 0x01;
            corrupted.push(bad);
        }
    }
    assert!(corrupted.len() > 50);
    for policy in [Ipv4IdentPolicy::AsReceived, Ipv4IdentPolicy::Recover] {
        let mut h = host(RESPONDER, 0x11, 1, 1, (0x1000, 0x1000, None), policy);
        let mut buf = vec![0u8; 4096];
        for bad in &corrupted {
            // As sent, and as a UDP socket's receiver sees it.
            for pkt in [bad.clone(), with_ident_hidden(bad)] {
                h.e.handle_datagram(Instant::from_nanos(0), &pkt);
            }
        }
        assert!(h
            .e
            .poll_transmit(Instant::from_nanos(0), &mut buf)
            .is_none());
        let c = h.e.counters();
        let n = 2 * corrupted.len() as u64;
        assert_eq!(c.get(Counter::RxBadIcrc), n, "{policy:?}");
        assert_eq!(c.get(Counter::RxIcrcIdRecovered), 0, "{policy:?}");
        assert_eq!(c.get(Counter::RxPackets), 0, "{policy:?}");
    }
}

/// The MADs (whole IP packets) one host sent to QP1 in a capture, in order.
fn mads_from(pcap: &[u8], src: Ipv4Addr) -> Vec<Vec<u8>> {
    roce_packets(pcap)
        .into_iter()
        .filter(|p| {
            let r = RoceV2Packet::parse_checked(p).unwrap();
            r.ip.src() == IpAddr::V4(src) && r.transport.bth.dest_qp == wire::Qpn::GSI
        })
        .collect()
}

#[test]
fn qp1_takes_rxes_cm_mads_and_sends_its_own_as_rxe_does() {
    let Some(pcap) = capture("rxe-cm-rping.pcap") else {
        eprintln!("rxe-cm-rping.pcap not found: skipped");
        return;
    };
    for (from, to) in [(REQUESTER, RESPONDER), (RESPONDER, REQUESTER)] {
        let theirs = mads_from(&pcap, from);
        assert!(theirs.len() >= 3, "the capture has the CM exchange");
        let mut config = EngineConfig::new(vec![IpAddr::V4(to)], 1);
        config.ipv4_ident = Ipv4IdentPolicy::Recover;
        let mut receiver = Engine::new(config, Box::new(Mem::default()));
        let mut sender = Engine::new(
            EngineConfig::new(vec![IpAddr::V4(from)], 1),
            Box::new(Mem::default()),
        );
        let mut buf = vec![0u8; 2048];
        for (i, rxe) in theirs.iter().enumerate() {
            // rxe's MAD, as a UDP socket delivers it, reaches the host of the receiver's QP1.
            receiver.handle_datagram(Instant::default(), &with_ident_hidden(rxe));
            let got = receiver.poll_mad().expect("a MAD for the host");
            let pkt = RoceV2Packet::parse_checked(rxe).unwrap();
            assert_eq!(
                (got.src, got.dst, got.src_qp),
                (IpAddr::V4(from), IpAddr::V4(to), 1)
            );
            assert_eq!(&got.data[..], pkt.payload);
            // The same MAD sent by our QP1 is rxe's packet but for the IPv4 ID.
            sender
                .send_mad(got.dst, got.src, 1, &got.data)
                .expect_err("only this port's addresses send");
            sender
                .send_mad(IpAddr::V4(from), IpAddr::V4(to), 1, &got.data)
                .unwrap();
            let t = sender.poll_transmit(Instant::default(), &mut buf).unwrap();
            assert_eq!(t.dst, IpAddr::V4(to));
            assert_same_packet(&buf[..t.len], rxe, &format!("MAD {i} from {from}"));
        }
        assert_eq!(receiver.poll_mad(), None);
        let c = receiver.counters();
        assert_eq!(c.get(Counter::RxMads), theirs.len() as u64);
        assert_eq!(sender.counters().get(Counter::TxMads), theirs.len() as u64);
        // Not a MAD: the wrong Q_Key, or a datagram of another size, is dropped and counted.
        let mut other_qkey = with_ident_hidden(&theirs[0]);
        let deth_qkey = 20 + 8 + 12;
        other_qkey[deth_qkey + 3] ^= 1;
        let n = other_qkey.len();
        let icrc = wire::icrc::compute(&other_qkey[..n - 4]).unwrap();
        other_qkey[n - 4..].copy_from_slice(&wire::icrc::icrc_bytes(icrc));
        receiver.handle_datagram(Instant::default(), &other_qkey);
        assert_eq!(receiver.poll_mad(), None);
        assert_eq!(receiver.counters().get(Counter::RxQkeyMismatch), 1);
    }
}
