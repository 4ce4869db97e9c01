//! Test support for the engine's scenario and sweep tests: an engine hosted as a `sim::Node`,
//! test memory backed by `Vec<u8>`, and a builder for two connected RC QPs.
//!
//! Every test file that uses it declares `mod common;`; not every file uses every helper.
#![allow(dead_code)]

use core::time::Duration;
use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr};
use std::rc::Rc;

use engine::{
    AccessFlags, AhAttr, CqHandle, Engine, EngineConfig, Gid, Instant, MemOwner, Memory,
    MemoryError, MrKeys, PathMtu, PdHandle, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    RecvWr, SendWr, Sge, WorkCompletion,
};
use sim::{NetConfig, NodeId, Sim};

/// Virtual time of the sim as the engine's `Instant` (the sim starts at 0).
pub fn instant(now: Duration) -> Instant {
    Instant::from_nanos(u64::try_from(now.as_nanos()).unwrap_or(u64::MAX))
}

/// An engine `Instant` as the sim's virtual time.
pub fn duration(t: Instant) -> Duration {
    Duration::from_nanos(t.as_nanos())
}

/// One contiguous buffer of test memory.
struct Region {
    owner: MemOwner,
    base: u64,
    bytes: Vec<u8>,
}

/// `Vec<u8>`-backed memory shared between a test and the engine that uses it (the test keeps
/// one clone to fill sources and check destinations; the engine gets another).
#[derive(Clone, Default)]
pub struct TestMemory {
    regions: Rc<RefCell<Vec<Region>>>,
}

impl TestMemory {
    /// Adds a zeroed region of `len` bytes at virtual address `base` for `owner`.
    pub fn add_region(&self, owner: MemOwner, base: u64, len: usize) {
        self.regions.borrow_mut().push(Region {
            owner,
            base,
            bytes: vec![0; len],
        });
    }

    fn with_range<R>(
        &self,
        owner: MemOwner,
        addr: u64,
        len: usize,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, MemoryError> {
        let mut regions = self.regions.borrow_mut();
        let fault = MemoryError::Fault { addr, len };
        let r = regions
            .iter_mut()
            .find(|r| {
                r.owner == owner
                    && addr >= r.base
                    && addr
                        .checked_add(len as u64)
                        .is_some_and(|end| end <= r.base + r.bytes.len() as u64)
            })
            .ok_or(fault)?;
        let off = (addr - r.base) as usize;
        Ok(f(&mut r.bytes[off..off + len]))
    }

    /// Copies `len` bytes at `addr` out (panics if the range is not test memory).
    pub fn get(&self, owner: MemOwner, addr: u64, len: usize) -> Vec<u8> {
        self.with_range(owner, addr, len, |b| b.to_vec())
            .expect("test reads its own memory")
    }

    /// Writes `data` at `addr` (panics if the range is not test memory).
    pub fn set(&self, owner: MemOwner, addr: u64, data: &[u8]) {
        self.with_range(owner, addr, data.len(), |b| b.copy_from_slice(data))
            .expect("test writes its own memory")
    }

    /// Reads the native-endian 8-byte word at `addr` (the ATOMIC word format).
    pub fn word(&self, owner: MemOwner, addr: u64) -> u64 {
        let b = self.get(owner, addr, 8);
        u64::from_ne_bytes(b.try_into().expect("8 bytes"))
    }

    /// Writes the native-endian 8-byte word at `addr`.
    pub fn set_word(&self, owner: MemOwner, addr: u64, v: u64) {
        self.set(owner, addr, &v.to_ne_bytes());
    }
}

impl Memory for TestMemory {
    fn read(&mut self, owner: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.with_range(owner, addr, buf.len(), |b| buf.copy_from_slice(b))
    }

    fn write(&mut self, owner: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.with_range(owner, addr, data.len(), |b| b.copy_from_slice(data))
    }

    fn compare_swap(
        &mut self,
        owner: MemOwner,
        addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError> {
        self.with_range(owner, addr, 8, |b| {
            let old = u64::from_ne_bytes(b.try_into().expect("8 bytes"));
            if old == compare {
                b.copy_from_slice(&swap.to_ne_bytes());
            }
            old
        })
    }

    fn fetch_add(&mut self, owner: MemOwner, addr: u64, add: u64) -> Result<u64, MemoryError> {
        self.with_range(owner, addr, 8, |b| {
            let old = u64::from_ne_bytes(b.try_into().expect("8 bytes"));
            b.copy_from_slice(&old.wrapping_add(add).to_ne_bytes());
            old
        })
    }
}

/// An engine hosted in the sim, with the test's handle on its memory.
pub struct Host {
    /// The soft HCA.
    pub engine: Engine,
    /// The memory the engine reaches (shared with the engine).
    pub mem: TestMemory,
}

impl sim::Node for Host {
    fn handle_datagram(&mut self, now: Duration, packet: &[u8]) {
        self.engine.handle_datagram(instant(now), packet);
    }

    fn handle_timeout(&mut self, now: Duration) {
        self.engine.handle_timeout(instant(now));
    }

    fn poll_transmit(&mut self, now: Duration, buf: &mut [u8]) -> Option<sim::Transmit> {
        loop {
            let t = self.engine.poll_transmit(instant(now), buf)?;
            if t.internal {
                // Both ends in this host (a daemon's own QPs): straight back into the engine.
                self.engine.handle_internal(instant(now), &buf[..t.len]);
                continue;
            }
            return Some(sim::Transmit {
                len: t.len,
                dst: t.dst,
            });
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        self.engine.poll_timeout().map(duration)
    }
}

/// The memory owner every test region uses.
pub const OWNER: MemOwner = MemOwner(1);

/// Settings of a connected pair of RC QPs.
#[derive(Debug, Clone)]
pub struct PairConfig {
    /// Seed of the sim (and, derived from it, of the engines' key generators).
    pub seed: u64,
    /// The network.
    pub net: NetConfig,
    /// Path MTU of both QPs.
    pub mtu: PathMtu,
    /// Local ACK timeout code (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code advertised by the responder.
    pub min_rnr_timer: u8,
    /// Outstanding READ/ATOMIC as requester.
    pub max_rd_atomic: u8,
    /// READ/ATOMIC resources as responder.
    pub max_dest_rd_atomic: u8,
    /// Send and receive queue depth.
    pub depth: u32,
    /// CQ depth.
    pub cq_depth: u32,
    /// Bytes of test memory (one MR over all of it) on each side.
    pub mem_len: usize,
    /// Access flags of the MRs.
    pub mr_access: AccessFlags,
    /// Remote operations each QP allows its peer.
    pub qp_access: AccessFlags,
    /// First send PSN of side A (side B uses A's plus 0x80_0000, so PSNs wrap somewhere).
    pub psn_a: u32,
    /// Address the sides with IPv6 (fd00::1, fd00::2) instead of IPv4 (10.0.0.1, 10.0.0.2).
    pub ipv6: bool,
    /// Scatter/gather entries per send and receive WR.
    pub max_sge: u32,
    /// Engine setting: AckReq at least every this many packets.
    pub ack_req_every: u32,
    /// Engine setting: most unacknowledged PSNs per QP.
    pub max_unacked_psns: u32,
    /// [`Pair::new`] puts both sides on one engine (at A's address, which is an internal
    /// address of it: `EngineConfig::internal_addresses`), each with its own memory and MR.
    pub one_host: bool,
    /// Engine setting: how long a plain ACK may wait for newer ones to replace it.
    pub ack_coalesce: Duration,
}

impl Default for PairConfig {
    fn default() -> Self {
        PairConfig {
            seed: 1,
            net: NetConfig::default(),
            mtu: PathMtu::Mtu1024,
            timeout: 10,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            depth: 1024,
            cq_depth: 4096,
            mem_len: 1 << 20,
            mr_access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            qp_access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            psn_a: 0xff_fff0,
            ipv6: false,
            max_sge: 4,
            ack_req_every: 32,
            max_unacked_psns: 512,
            one_host: false,
            ack_coalesce: engine::DEFAULT_ACK_COALESCE,
        }
    }
}

/// One side of a connected pair: its node and the verbs objects on it.
#[derive(Debug, Clone, Copy)]
pub struct Side {
    /// The node in the sim.
    pub node: NodeId,
    /// Its address.
    pub ip: IpAddr,
    /// Protection domain.
    pub pd: PdHandle,
    /// CQ of the send queue.
    pub send_cq: CqHandle,
    /// CQ of the receive queue.
    pub recv_cq: CqHandle,
    /// The RC QP number.
    pub qpn: u32,
    /// The MR over all of the side's test memory.
    pub mr: MrKeys,
    /// First address of the test memory.
    pub base: u64,
    /// Bytes of test memory.
    pub len: u64,
}

impl Side {
    /// An SGE over `len` bytes at offset `off` of this side's memory.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge::new(self.base + off, len, self.mr.lkey)
    }

    /// The address of offset `off`.
    pub fn addr(&self, off: u64) -> u64 {
        self.base + off
    }
}

/// Two engines, each with one RC QP connected to the other's, in one sim.
pub struct Pair {
    /// The sim hosting both.
    pub sim: Sim<Host>,
    /// Side A (10.0.0.1).
    pub a: Side,
    /// Side B (10.0.0.2).
    pub b: Side,
    /// The settings used.
    pub cfg: PairConfig,
}

/// The address of side `n` (1 = A, 2 = B).
pub fn side_ip(ipv6: bool, n: u8) -> IpAddr {
    if ipv6 {
        IpAddr::V6(std::net::Ipv6Addr::new(
            0xfd00,
            0,
            0,
            0,
            0,
            0,
            0,
            u16::from(n),
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
    }
}

/// Adds an engine at `ip` to `sim`, with a PD, one MR over `cfg.mem_len` bytes at `base`, and
/// one RC QP (in RESET) with its own CQs.
pub fn create_side(sim: &mut Sim<Host>, cfg: &PairConfig, ip: IpAddr, base: u64) -> Side {
    let mem = TestMemory::default();
    mem.add_region(OWNER, base, cfg.mem_len);
    // Each side's keys come from the scenario seed, so a seed replays with the same keys.
    let key_seed = sim::rng::mix(cfg.seed ^ base);
    let mut ec = EngineConfig::new(vec![ip], key_seed);
    ec.ack_req_every = cfg.ack_req_every;
    ec.max_unacked_psns = cfg.max_unacked_psns;
    ec.ack_coalesce = cfg.ack_coalesce;
    if cfg.one_host {
        ec.internal_addresses = vec![ip];
    }
    let mut engine = Engine::new(ec, Box::new(mem.clone()));
    let pd = engine.alloc_pd().expect("alloc_pd");
    let mr = engine
        .reg_mr(pd, OWNER, base, cfg.mem_len as u64, cfg.mr_access)
        .expect("reg_mr");
    let (send_cq, recv_cq, qpn) = create_qp(&mut engine, cfg, pd);
    let node = sim.add_node([ip], Host { engine, mem });
    Side {
        node,
        ip,
        pd,
        send_cq,
        recv_cq,
        qpn,
        mr,
        base,
        len: cfg.mem_len as u64,
    }
}

/// Another RC QP (in RESET, with its own CQs) on the engine of `side`, sharing its PD and MR.
pub fn add_qp(sim: &mut Sim<Host>, cfg: &PairConfig, side: &Side) -> Side {
    let pd = side.pd;
    let (send_cq, recv_cq, qpn) = create_qp(&mut sim.node_mut(side.node).engine, cfg, pd);
    Side {
        send_cq,
        recv_cq,
        qpn,
        ..*side
    }
}

/// Another side on the engine of `side`: its own memory region at `base` with an MR over it,
/// and an RC QP (in RESET) with its own CQs, in the same PD.
fn add_side_memory(sim: &mut Sim<Host>, cfg: &PairConfig, side: &Side, base: u64) -> Side {
    let host = sim.node_mut(side.node);
    host.mem.add_region(OWNER, base, cfg.mem_len);
    let mr = host
        .engine
        .reg_mr(side.pd, OWNER, base, cfg.mem_len as u64, cfg.mr_access)
        .expect("reg_mr");
    let (send_cq, recv_cq, qpn) = create_qp(&mut host.engine, cfg, side.pd);
    Side {
        send_cq,
        recv_cq,
        qpn,
        mr,
        base,
        ..*side
    }
}

/// What creates an RC QP in `pd` with room for one WR of one SGE each way, both queues on
/// `cq`.
pub fn one_wr_rc(pd: PdHandle, cq: CqHandle) -> QpInitAttr {
    QpInitAttr {
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    }
}

/// A new RC QP with its own send and receive CQs, in RESET.
fn create_qp(engine: &mut Engine, cfg: &PairConfig, pd: PdHandle) -> (CqHandle, CqHandle, u32) {
    let send_cq = engine.create_cq(cfg.cq_depth).expect("create_cq");
    let recv_cq = engine.create_cq(cfg.cq_depth).expect("create_cq");
    let qpn = engine
        .create_qp(&QpInitAttr {
            pd,
            send_cq,
            recv_cq,
            cap: QpCap {
                max_send_wr: cfg.depth,
                max_recv_wr: cfg.depth,
                max_send_sge: cfg.max_sge,
                max_recv_sge: cfg.max_sge,
                max_inline_data: 256,
            },
            qp_type: QpType::Rc,
            sq_sig_all: false,
        })
        .expect("create_qp");
    (send_cq, recv_cq, qpn)
}

/// Moves `me` through INIT and RTR to RTS, connected to `peer`.
pub fn connect(
    engine: &mut Engine,
    cfg: &PairConfig,
    me: &Side,
    peer: &Side,
    sq_psn: u32,
    rq_psn: u32,
) {
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: cfg.qp_access,
        ..QpAttr::default()
    };
    engine
        .modify_qp(
            me.qpn,
            &init,
            QpAttrMask::STATE
                | QpAttrMask::PKEY_INDEX
                | QpAttrMask::PORT
                | QpAttrMask::ACCESS_FLAGS,
        )
        .expect("RESET -> INIT");
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: cfg.mtu,
        dest_qp_num: engine::Qpn::new(peer.qpn),
        rq_psn,
        max_dest_rd_atomic: cfg.max_dest_rd_atomic,
        min_rnr_timer: cfg.min_rnr_timer,
        ah_attr: AhAttr {
            dgid: Gid::from_ip(peer.ip).0,
            sgid_index: 0,
            is_global: true,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    engine
        .modify_qp(
            me.qpn,
            &rtr,
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER,
        )
        .expect("INIT -> RTR");
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        timeout: cfg.timeout,
        retry_cnt: cfg.retry_cnt,
        rnr_retry: cfg.rnr_retry,
        max_rd_atomic: cfg.max_rd_atomic,
        ..QpAttr::default()
    };
    engine
        .modify_qp(
            me.qpn,
            &rts,
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC,
        )
        .expect("RTR -> RTS");
}

impl Pair {
    /// Builds the sim, both engines and the connected QPs.
    pub fn new(cfg: PairConfig) -> Pair {
        let mut sim = Sim::new(cfg.seed, cfg.net.clone());
        let a = create_side(&mut sim, &cfg, side_ip(cfg.ipv6, 1), 0x1000_0000);
        let b = if cfg.one_host {
            add_side_memory(&mut sim, &cfg, &a, 0x7000_0000)
        } else {
            create_side(&mut sim, &cfg, side_ip(cfg.ipv6, 2), 0x7000_0000)
        };
        let psn_b = cfg.psn_a.wrapping_add(0x80_0000) & 0xff_ffff;
        connect(
            &mut sim.node_mut(a.node).engine,
            &cfg,
            &a,
            &b,
            cfg.psn_a,
            psn_b,
        );
        connect(
            &mut sim.node_mut(b.node).engine,
            &cfg,
            &b,
            &a,
            psn_b,
            cfg.psn_a,
        );
        Pair { sim, a, b, cfg }
    }

    /// Another pair of connected RC QPs between the same two engines (same PD and MRs, own
    /// CQs), returned as (A's side, B's side).
    pub fn add_qp_pair(&mut self) -> (Side, Side) {
        let cfg = self.cfg.clone();
        let mut sides = [self.a, self.b];
        for side in sides.iter_mut() {
            let pd = side.pd;
            let (send_cq, recv_cq, qpn) = create_qp(self.engine(side), &cfg, pd);
            side.send_cq = send_cq;
            side.recv_cq = recv_cq;
            side.qpn = qpn;
        }
        let [a, b] = sides;
        let psn_b = cfg.psn_a.wrapping_add(0x80_0000) & 0xff_ffff;
        connect(self.engine(&a), &cfg, &a, &b, cfg.psn_a, psn_b);
        connect(self.engine(&b), &cfg, &b, &a, psn_b, cfg.psn_a);
        (a, b)
    }

    /// Moves both QPs of the pair (`a`, `b`) to RESET and connects them again, A starting at
    /// send PSN `psn_a` (as an application does after a QP error).
    pub fn reconnect(&mut self, a: &Side, b: &Side, psn_a: u32) {
        let cfg = self.cfg.clone();
        for side in [a, b] {
            self.move_to(side, QpState::Reset);
        }
        let psn_b = psn_a.wrapping_add(0x80_0000) & 0xff_ffff;
        connect(self.engine(a), &cfg, a, b, psn_a, psn_b);
        connect(self.engine(b), &cfg, b, a, psn_b, psn_a);
    }

    /// The engine of `side`.
    pub fn engine(&mut self, side: &Side) -> &mut Engine {
        &mut self.sim.node_mut(side.node).engine
    }

    /// The memory of `side`.
    pub fn mem(&self, side: &Side) -> TestMemory {
        self.sim.node(side.node).mem.clone()
    }

    /// Posts a send WR on `side`'s QP (panics if the engine refuses it).
    pub fn post_send(&mut self, side: &Side, wr: SendWr) {
        let qpn = side.qpn;
        self.engine(side).post_send(qpn, wr).expect("post_send");
    }

    /// Posts a receive WR on `side`'s QP (panics if the engine refuses it).
    pub fn post_recv(&mut self, side: &Side, wr: RecvWr) {
        let qpn = side.qpn;
        self.engine(side).post_recv(qpn, wr).expect("post_recv");
    }

    /// Takes every completion waiting in `cq` of `side`.
    pub fn poll(&mut self, side: &Side, cq: CqHandle) -> Vec<WorkCompletion> {
        self.engine(side).poll_cq(cq, usize::MAX).expect("poll_cq")
    }

    /// Runs the sim until `side`'s `cq` holds at least `n` completions, then takes them all.
    pub fn wait_cq(
        &mut self,
        side: &Side,
        cq: CqHandle,
        n: usize,
        deadline: Duration,
    ) -> Result<Vec<WorkCompletion>, sim::SimError> {
        let node = side.node;
        self.sim.run_until(
            |s| s.node(node).engine.cq_len(cq).unwrap_or(0) >= n,
            deadline,
        )?;
        Ok(self.poll(side, cq))
    }

    /// Moves `side`'s QP to `state` with no other attribute (RESET, ERR...).
    pub fn move_to(&mut self, side: &Side, state: QpState) {
        let qpn = side.qpn;
        let attr = QpAttr {
            qp_state: state,
            ..QpAttr::default()
        };
        self.engine(side)
            .modify_qp(qpn, &attr, QpAttrMask::STATE)
            .expect("modify_qp");
    }

    /// The state of `side`'s QP.
    pub fn qp_state(&mut self, side: &Side) -> QpState {
        let qpn = side.qpn;
        self.engine(side).query_qp(qpn).expect("query_qp").qp_state
    }
}

/// Deterministic test bytes: `len` bytes from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    sim::Rng::new(seed).fill(&mut v);
    v
}

/// The transport headers of a RoCEv2 packet, if it parses.
pub fn transport_of(packet: &[u8]) -> Option<wire::TransportRepr> {
    wire::RoceV2Packet::parse(packet).ok().map(|p| p.transport)
}

/// The 24-bit PSN `base + n`.
pub fn psn_plus(base: u32, n: u32) -> u32 {
    base.wrapping_add(n) & 0xff_ffff
}

/// `packet` re-emitted with its PSN replaced (ICRC recomputed), e.g. to forge a ghost ACK.
pub fn with_psn(packet: &[u8], psn: u32) -> Vec<u8> {
    let p = wire::RoceV2Packet::parse(packet).expect("a RoCEv2 packet");
    let mut t = p.transport;
    t.bth.psn = wire::Psn::new(psn);
    let mut buf = vec![0u8; packet.len() + 64];
    let n = wire::emit_packet(
        &p.ip,
        p.udp.src_port,
        p.udp.dst_port,
        &t,
        p.payload,
        &mut buf,
    )
    .expect("re-emit");
    buf.truncate(n);
    buf
}

/// One packet a node sent, as seen on the wire.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Virtual send time.
    pub time: Duration,
    /// Sender.
    pub from: NodeId,
    /// Transport headers.
    pub t: wire::TransportRepr,
    /// The whole packet.
    pub bytes: Vec<u8>,
}

/// Records every packet sent in the sim (before loss), for scenario assertions.
#[derive(Clone, Default)]
pub struct Wiretap {
    /// Everything sent so far, in order.
    pub seen: Rc<RefCell<Vec<Seen>>>,
}

impl Wiretap {
    /// Installs a wiretap on `sim` (replaces any trace hook).
    pub fn install(sim: &mut Sim<Host>) -> Wiretap {
        let tap = Wiretap::default();
        let seen = Rc::clone(&tap.seen);
        sim.set_trace(Box::new(move |ev| {
            if ev.kind == sim::TraceKind::Sent {
                if let (Some(from), Some(t)) = (ev.from, transport_of(ev.packet)) {
                    seen.borrow_mut().push(Seen {
                        time: ev.time,
                        from,
                        t,
                        bytes: ev.packet.to_vec(),
                    });
                }
            }
        }));
        tap
    }

    /// Relative PSNs (from `base`) of the packets `from` sent whose opcode satisfies `pick`.
    pub fn psns(&self, from: NodeId, base: u32, pick: impl Fn(wire::Opcode) -> bool) -> Vec<u32> {
        self.seen
            .borrow()
            .iter()
            .filter(|s| s.from == from && pick(s.t.bth.opcode))
            .map(|s| s.t.bth.psn.value().wrapping_sub(base) & 0xff_ffff)
            .collect()
    }
}

// ----- Helpers of the UC / UD / SRQ / memory window tests (issue 4) -----

/// A host of the UC / UD / SRQ / MW tests: an engine in the sim with one PD and one MR
/// (local write, remote read / write / atomic, MW bind) over all of its test memory.
#[derive(Debug, Clone, Copy)]
pub struct Host4 {
    /// The node in the sim.
    pub node: NodeId,
    /// Its address.
    pub ip: IpAddr,
    /// Protection domain.
    pub pd: PdHandle,
    /// The MR over all of the test memory.
    pub mr: MrKeys,
    /// First address of the test memory.
    pub base: u64,
    /// Bytes of test memory.
    pub len: u64,
}

impl Host4 {
    /// An SGE over `len` bytes at offset `off` of this host's memory.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge::new(self.base + off, len, self.mr.lkey)
    }

    /// The address of offset `off`.
    pub fn addr(&self, off: u64) -> u64 {
        self.base + off
    }
}

/// QP numbers and CQs of one QP of the issue-4 tests.
#[derive(Debug, Clone, Copy)]
pub struct Qp4 {
    /// The QP number.
    pub qpn: u32,
    /// CQ of the send queue.
    pub send_cq: CqHandle,
    /// CQ of the receive queue.
    pub recv_cq: CqHandle,
}

/// Adds host number `n` (10.0.0.n) with `mem_len` bytes of test memory to `sim`.
pub fn add_host4(sim: &mut Sim<Host>, n: u8, seed: u64, mem_len: usize) -> Host4 {
    let ip = side_ip(false, n);
    let base = u64::from(n) << 28;
    let mem = TestMemory::default();
    mem.add_region(OWNER, base, mem_len);
    let mut engine = Engine::new(
        EngineConfig::new(vec![ip], sim::rng::mix(seed ^ base)),
        Box::new(mem.clone()),
    );
    let pd = engine.alloc_pd().expect("alloc_pd");
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
        | AccessFlags::MW_BIND;
    let mr = engine
        .reg_mr(pd, OWNER, base, mem_len as u64, access)
        .expect("reg_mr");
    let node = sim.add_node([ip], Host { engine, mem });
    Host4 {
        node,
        ip,
        pd,
        mr,
        base,
        len: mem_len as u64,
    }
}

/// A QP of `qp_type` in RESET with its own CQs (or `cqs`), taking receives from `srq` if
/// given.
pub fn new_qp4(
    e: &mut Engine,
    pd: PdHandle,
    qp_type: QpType,
    depth: u32,
    srq: Option<engine::SrqHandle>,
    cqs: Option<(CqHandle, CqHandle)>,
) -> Qp4 {
    let (send_cq, recv_cq) = cqs.unwrap_or_else(|| {
        (
            e.create_cq(4096).expect("create_cq"),
            e.create_cq(4096).expect("create_cq"),
        )
    });
    let init = QpInitAttr {
        pd,
        send_cq,
        recv_cq,
        cap: QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        },
        qp_type,
        sq_sig_all: false,
    };
    let qpn = match srq {
        Some(s) => e.create_qp_with_srq(&init, s),
        None => e.create_qp(&init),
    }
    .expect("create_qp");
    Qp4 {
        qpn,
        send_cq,
        recv_cq,
    }
}

/// Moves a UD QP through INIT and RTR to RTS with Q_Key `qkey`.
pub fn ud_up(e: &mut Engine, qpn: u32, qkey: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey,
        ..QpAttr::default()
    };
    e.modify_qp(
        qpn,
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .expect("UD RESET -> INIT");
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..QpAttr::default()
    };
    e.modify_qp(qpn, &rtr, QpAttrMask::STATE)
        .expect("UD INIT -> RTR");
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 0x12,
        ..QpAttr::default()
    };
    e.modify_qp(qpn, &rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .expect("UD RTR -> RTS");
}

/// Connects a UC or RC QP to `peer_qpn` at `peer_ip` and moves it to RTS (RC: timeout 10,
/// retry 7, rnr_retry 7, min_rnr_timer 1, 16 READ/ATOMIC each way).
#[allow(clippy::too_many_arguments)]
pub fn connect4(
    e: &mut Engine,
    qp_type: QpType,
    qpn: u32,
    peer_ip: IpAddr,
    peer_qpn: u32,
    mtu: PathMtu,
    sq_psn: u32,
    rq_psn: u32,
) {
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    e.modify_qp(
        qpn,
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .expect("RESET -> INIT");
    let rc = qp_type == QpType::Rc;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: mtu,
        dest_qp_num: engine::Qpn::new(peer_qpn),
        rq_psn,
        max_dest_rd_atomic: 16,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid: Gid::from_ip(peer_ip).0,
            sgid_index: 0,
            is_global: true,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let mut mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN;
    if rc {
        mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
    }
    e.modify_qp(qpn, &rtr, mask).expect("INIT -> RTR");
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        max_rd_atomic: 16,
        ..QpAttr::default()
    };
    let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
    if rc {
        mask |= QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC;
    }
    e.modify_qp(qpn, &rts, mask).expect("RTR -> RTS");
}

/// An address handle on `e` (in `pd`) for `peer_ip`.
pub fn ah4(e: &mut Engine, pd: PdHandle, peer_ip: IpAddr) -> engine::AhHandle {
    e.create_ah(
        pd,
        &AhAttr {
            dgid: Gid::from_ip(peer_ip).0,
            sgid_index: 0,
            hop_limit: 64,
            is_global: true,
            ..AhAttr::default()
        },
    )
    .expect("create_ah")
}

/// Runs the sim until `cq` of `node` holds at least `n` completions (or nothing is left to
/// do, or `within` of virtual time passes), then takes them all.
pub fn drain_cq(
    sim: &mut Sim<Host>,
    node: NodeId,
    cq: CqHandle,
    n: usize,
    within: Duration,
) -> Vec<WorkCompletion> {
    let deadline = sim.now() + within;
    let _ = sim.run_until(
        |s| s.node(node).engine.cq_len(cq).unwrap_or(0) >= n,
        deadline,
    );
    sim.node_mut(node)
        .engine
        .poll_cq(cq, usize::MAX)
        .expect("poll_cq")
}
