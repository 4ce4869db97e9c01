//! The randomized RC sweep: seeds × loss {0, 1 %, 10 %, 30 %} × duplication × reordering ×
//! corruption, random mixes of SEND, SEND_IMM, WRITE, WRITE_IMM, READ, CAS and FETCH_ADD in both
//! directions at once, sizes from 0 B to 1 MiB, late receives (RNR) and partitions.
//!
//! Invariants checked for every scenario:
//! - every WR completes exactly once, and completions come in post order per queue;
//! - at 0 and 1 % loss without a partition, every WR succeeds: destination bytes are exact,
//!   READ data and ATOMIC results are right, receive completions carry the right length, opcode
//!   and immediate, and no byte outside a destination changes;
//! - with a partition that outlasts the retries: the requester completes a prefix with SUCCESS,
//!   then one WR with RETRY_EXC_ERR, then WR_FLUSH_ERR for the rest, and what did succeed is
//!   exact. At 10 and 30 % loss (and during RNR waits under loss) retry_cnt + 1 fruitless local
//!   ACK timeouts in a row are improbable but possible, so the same outcome is accepted there
//!   too, provided the QP did count retry_cnt + 1 timeouts;
//! - nothing hangs: a run that does not finish within the virtual deadline fails.
//!
//! Scenarios also vary the path MTU, timeouts, window and AckReq spacing, the responder's ACK
//! coalescing delay (0 to 100 µs), max_rd_atomic, IPv4/IPv6, PSNs about to wrap, unsignaled,
//! inline and fenced WRs, one to three QP pairs, late receives (RNR), short outages the retries
//! must ride out, a WR with a wrong rkey (its QP pair fails cleanly while the others carry on),
//! and after a partition a reset and reconnection.
//!
//! A failure prints the seed and the command that replays it. Environment:
//! - `SOFTRDMA_SEED=n`: run only seed n (the replay);
//! - `SOFTRDMA_SOAK_SEEDS=N` (optionally `SOFTRDMA_SEED_START=s`): run N fresh seeds, e.g.
//!   `SOFTRDMA_SOAK_SEEDS=10000 cargo test --release -p softrdma-engine --test sweep`;
//! - `SOFTRDMA_SWEEP_VERBOSE=1`: print every scenario's settings and network counters;
//! - `SOFTRDMA_SWEEP_PCAP=file.pcap`: write every packet sent (virtual timestamps) to a pcap
//!   that Wireshark / tshark decode, to study one seed.

mod common;

use core::fmt::Write as _;
use core::time::Duration;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use common::{pattern, Pair, PairConfig, Side, OWNER};
use engine::{
    Counter, PathMtu, RecvWr, SendFlags, SendOp, SendWr, Sge, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};
use sim::seeds::{for_each_seed, Replay};
use sim::{LinkConfig, NetConfig, Rng};

/// Seeds of the default run: each of the 32 fault combinations gets several seeds.
const DEFAULT_SEEDS: u64 = 320;

const LOSS: [f64; 4] = [0.0, 0.01, 0.10, 0.30];

#[test]
fn rc_operations_survive_faults_and_complete_exactly_once() {
    let replay = Replay::new(
        "softrdma-engine",
        "sweep",
        "rc_operations_survive_faults_and_complete_exactly_once",
    );
    let n = for_each_seed(&replay, DEFAULT_SEEDS, run_scenario);
    eprintln!(
        "sweep: {n} scenarios, {} WRs, {} bytes moved, {} partitions, {} retry-exhausted without a \
         partition, {} with a wrong rkey",
        TALLY[0].load(Relaxed),
        TALLY[1].load(Relaxed),
        TALLY[2].load(Relaxed),
        TALLY[3].load(Relaxed),
        TALLY[4].load(Relaxed),
    );
}

#[test]
fn the_same_seed_replays_the_same_run_packet_for_packet() {
    let replay = Replay::new(
        "softrdma-engine",
        "sweep",
        "the_same_seed_replays_the_same_run_packet_for_packet",
    );
    // Seeds with loss, duplication, reordering and corruption all on (combinations 28..32).
    for_each_seed(&replay, 4, |i| {
        let seed = if i < 4 { 28 + i } else { i };
        let first = scenario(seed)?;
        let second = scenario(seed)?;
        if first == second {
            Ok(())
        } else {
            Err(format!(
                "seed {seed}: trace hash {first:#x} then {second:#x}"
            ))
        }
    });
}

/// WRs posted, bytes in them, partitioned scenarios, queues that ended in RETRY_EXC_ERR
/// without a partition, scenarios with a wrong rkey.
static TALLY: [AtomicU64; 5] = [
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
    AtomicU64::new(0),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    Cas,
    Fadd,
}

impl Kind {
    fn consumes_recv(self) -> bool {
        matches!(self, Kind::Send | Kind::SendImm | Kind::WriteImm)
    }
}

/// One planned operation from `req` to its peer.
#[derive(Debug, Clone)]
struct Op {
    kind: Kind,
    wr_id: u64,
    len: usize,
    data: Vec<u8>,
    /// Requester SGEs (source for SEND/WRITE, sink for READ/ATOMIC): (offset, len).
    local: Vec<(u64, usize)>,
    /// Responder range: WRITE destination, READ source, or the ATOMIC word.
    remote: (u64, usize),
    /// Responder receive buffer SGEs (SEND, SEND_IMM, WRITE_IMM).
    recv: Vec<(u64, usize)>,
    recv_wr_id: u64,
    imm: u32,
    compare: u64,
    swap_add: u64,
    /// Produces a completion on success (failures always complete).
    signaled: bool,
    /// SEND / WRITE data travels in the WR (`IBV_SEND_INLINE`).
    inline: bool,
    /// Waits for earlier READ / ATOMIC to complete (`IBV_SEND_FENCE`).
    fence: bool,
    /// Uses a wrong rkey: the responder must refuse it (REM_ACCESS_ERR).
    bad_rkey: bool,
}

/// Bump allocator over one side's memory, with random gaps so neighbours are not adjacent.
struct Layout {
    next: u64,
}

impl Layout {
    fn alloc(&mut self, rng: &mut Rng, len: usize) -> u64 {
        let gap = rng.range_inclusive(0, 3) * 8;
        let off = self.next + gap;
        self.next = (off + len as u64 + 7) & !7;
        off
    }

    /// Splits `len` bytes into 1..=3 separately allocated pieces.
    fn pieces(&mut self, rng: &mut Rng, len: usize, extra: usize) -> Vec<(u64, usize)> {
        let n = if len < 2 {
            1
        } else {
            rng.range_inclusive(1, 3) as usize
        };
        let mut cuts: Vec<usize> = (1..n).map(|_| rng.below(len as u64 + 1) as usize).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut prev = 0;
        for (i, c) in cuts.into_iter().chain([len]).enumerate() {
            let mut l = c - prev;
            if i == n - 1 {
                l += extra;
            }
            out.push((self.alloc(rng, l), l));
            prev = c;
        }
        out
    }
}

/// Size limits of one scenario: the largest message, and the bytes left to spend.
struct Budget {
    max_len: usize,
    left: usize,
}

struct Net {
    loss: f64,
    dup: f64,
    reorder: f64,
    corrupt: f64,
}

impl Net {
    fn from_index(i: u64) -> Net {
        Net {
            loss: LOSS[(i % 4) as usize],
            dup: if (i >> 2) & 1 == 1 { 0.05 } else { 0.0 },
            reorder: if (i >> 3) & 1 == 1 { 0.1 } else { 0.0 },
            corrupt: if (i >> 4) & 1 == 1 { 0.02 } else { 0.0 },
        }
    }
}

fn plan_ops(
    rng: &mut Rng,
    count: usize,
    budget: &mut Budget,
    req: &mut Layout,
    resp: &mut Layout,
    atomic_base: u64,
    wr_base: u64,
) -> Vec<Op> {
    let mut ops = Vec::new();
    for i in 0..count {
        let kind = match rng.below(7) {
            0 => Kind::Send,
            1 => Kind::SendImm,
            2 => Kind::Write,
            3 => Kind::WriteImm,
            4 => Kind::Read,
            5 => Kind::Cas,
            _ => Kind::Fadd,
        };
        let mut len = match rng.below(20) {
            0..=6 => rng.range_inclusive(0, 16) as usize,
            7..=12 => rng.range_inclusive(17, 8192) as usize,
            13..=17 => rng.range_inclusive(8193, 65_536) as usize,
            _ => rng.range_inclusive(65_537, 1 << 20) as usize,
        }
        .min(budget.max_len);
        if len > budget.left {
            len = rng.range_inclusive(0, 64) as usize;
        }
        budget.left = budget.left.saturating_sub(len);
        let wr_id = wr_base + i as u64;
        let mut op = Op {
            kind,
            wr_id,
            len,
            data: Vec::new(),
            local: Vec::new(),
            remote: (0, 0),
            recv: Vec::new(),
            recv_wr_id: wr_id + 500_000,
            imm: rng.next_u64() as u32,
            compare: 0,
            swap_add: rng.next_u64(),
            // The last WR is always signaled, so its completion marks the end of the queue.
            signaled: i + 1 == count || rng.chance(0.8),
            inline: false,
            fence: rng.chance(0.1),
            bad_rkey: false,
        };
        let inline_ok = len <= 256 && !matches!(kind, Kind::Read | Kind::Cas | Kind::Fadd);
        op.inline = inline_ok && rng.chance(0.3);
        match kind {
            Kind::Send | Kind::SendImm => {
                op.data = pattern(rng.next_u64(), len);
                op.local = req.pieces(rng, len, 0);
                let slack = rng.range_inclusive(0, 64) as usize;
                op.recv = resp.pieces(rng, len, slack);
            }
            Kind::Write | Kind::WriteImm => {
                op.data = pattern(rng.next_u64(), len);
                op.local = req.pieces(rng, len, 0);
                op.remote = (resp.alloc(rng, len), len);
                if kind == Kind::WriteImm {
                    // The receive WQE of a WRITE with immediate needs no buffer; give it one
                    // anyway half of the time, which must stay untouched.
                    if rng.chance(0.5) {
                        op.recv = vec![(resp.alloc(rng, 32), 32)];
                    }
                }
            }
            Kind::Read => {
                op.data = pattern(rng.next_u64(), len);
                op.remote = (resp.alloc(rng, len), len);
                op.local = req.pieces(rng, len, 0);
            }
            Kind::Cas | Kind::Fadd => {
                op.len = 8;
                op.remote = (atomic_base + rng.below(4) * 8, 8);
                op.local = vec![(req.alloc(rng, 8), 8)];
            }
        }
        ops.push(op);
    }
    ops
}

/// What one direction (requester `req` → responder `resp`, on one QP pair) expects.
struct Dir {
    /// "A->B #0" and the like, for messages.
    name: String,
    req: Side,
    resp: Side,
    /// Whether the requester is engine A (so its memory image is A's).
    req_is_a: bool,
    /// The responder's four ATOMIC words (offset in its memory) and their initial values.
    atomic_base: u64,
    words: [u64; 4],
    ops: Vec<Op>,
}

/// The images of (requester, responder) for a direction.
fn split(imgs: &mut [Image; 2], req_is_a: bool) -> (&mut Image, &mut Image) {
    let [a, b] = imgs;
    if req_is_a {
        (a, b)
    } else {
        (b, a)
    }
}

fn sges(side: &Side, pieces: &[(u64, usize)]) -> Vec<Sge> {
    pieces.iter().map(|&(o, l)| side.sge(o, l as u32)).collect()
}

fn send_wr(d: &Dir, op: &Op) -> SendWr {
    // Flipping a tag bit keeps the MR index: the key names the right MR but does not match.
    let rkey = engine::Rkey::new(d.resp.mr.rkey.value() ^ u32::from(op.bad_rkey));
    let remote_addr = d.resp.addr(op.remote.0);
    let send_op = match op.kind {
        Kind::Send => SendOp::Send,
        Kind::SendImm => SendOp::SendWithImm { imm: op.imm },
        Kind::Write => SendOp::RdmaWrite { remote_addr, rkey },
        Kind::WriteImm => SendOp::RdmaWriteWithImm {
            remote_addr,
            rkey,
            imm: op.imm,
        },
        Kind::Read => SendOp::RdmaRead { remote_addr, rkey },
        Kind::Cas => SendOp::AtomicCmpSwap {
            remote_addr,
            rkey,
            compare: op.compare,
            swap: op.swap_add,
        },
        Kind::Fadd => SendOp::AtomicFetchAdd {
            remote_addr,
            rkey,
            add: op.swap_add,
        },
    };
    let mut wr = SendWr::new(op.wr_id, send_op, sges(&d.req, &op.local)).signaled(op.signaled);
    if op.inline {
        wr = wr.inline(op.data.clone());
    }
    if op.fence {
        wr = wr.with_flags(SendFlags::FENCE);
    }
    wr
}

/// Completions taken out of the CQs so far, per direction: the requester's send CQ and the
/// responder's receive CQ (every QP has its own pair of CQs).
struct Collected {
    send: Vec<Vec<WorkCompletion>>,
    recv: Vec<Vec<WorkCompletion>>,
}

impl Collected {
    fn new(dirs: usize) -> Collected {
        Collected {
            send: vec![Vec::new(); dirs],
            recv: vec![Vec::new(); dirs],
        }
    }

    fn collect(&mut self, s: &mut sim::Sim<common::Host>, dirs: &[Dir]) {
        let mut take = |side: &Side, cq, into: &mut Vec<WorkCompletion>| {
            // Look before touching: `node_mut` makes the sim poll the node for packets again.
            if s.node(side.node).engine.cq_len(cq).unwrap_or(0) > 0 {
                let e = &mut s.node_mut(side.node).engine;
                into.extend(e.poll_cq(cq, usize::MAX).unwrap_or_default());
            }
        };
        for (d, dir) in dirs.iter().enumerate() {
            take(&dir.req, dir.req.send_cq, &mut self.send[d]);
            take(&dir.resp, dir.resp.recv_cq, &mut self.recv[d]);
        }
    }

    /// Whether direction `d`'s last WR has completed (trivially, when there are no WRs).
    fn finished(&self, d: usize, last: Option<u64>) -> bool {
        last.is_none_or(|id| self.send[d].iter().any(|c| c.wr_id == id))
    }
}

/// The expected memory image of one side, with the bytes whose value is not determined.
struct Image {
    bytes: Vec<u8>,
    care: Vec<bool>,
}

impl Image {
    fn new(len: usize) -> Image {
        Image {
            bytes: vec![0; len],
            care: vec![true; len],
        }
    }
    fn set(&mut self, off: u64, data: &[u8]) {
        let o = off as usize;
        self.bytes[o..o + data.len()].copy_from_slice(data);
    }
    fn dont_care(&mut self, off: u64, len: usize) {
        let o = off as usize;
        self.care[o..o + len].iter_mut().for_each(|c| *c = false);
    }
    fn scatter(&mut self, pieces: &[(u64, usize)], data: &[u8]) {
        let mut at = 0;
        for &(o, l) in pieces {
            let n = l.min(data.len() - at);
            self.set(o, &data[at..at + n]);
            at += n;
        }
    }
    fn dont_care_all(&mut self, pieces: &[(u64, usize)]) {
        for &(o, l) in pieces {
            self.dont_care(o, l);
        }
    }
}

fn first_diff(actual: &[u8], img: &Image) -> Option<usize> {
    (0..actual.len()).find(|&i| img.care[i] && actual[i] != img.bytes[i])
}

/// Runs one seeded scenario; Err describes the first broken invariant.
fn run_scenario(seed: u64) -> Result<(), String> {
    scenario(seed).map(|_| ())
}

/// One seeded scenario; returns the sim's trace hash (every delivery and timeout).
fn scenario(seed: u64) -> Result<u64, String> {
    let mut rng = Rng::new(seed ^ 0x5eed_5eed);
    // The default run walks the 32 fault combinations in order; soak seeds pick at random.
    let combo = if seed < DEFAULT_SEEDS {
        seed % 32
    } else {
        rng.below(32)
    };
    let net = Net::from_index(combo);
    let partition = rng.chance(0.15);
    let late_recv = !partition && rng.chance(0.25);
    // A short outage that the retries must ride out (it may not fail anything).
    let blip = !partition && rng.chance(0.2);
    let mtu = [PathMtu::Mtu256, PathMtu::Mtu1024, PathMtu::Mtu4096][rng.below(3) as usize];
    let max_len = match net.loss {
        l if l <= 0.01 => 1 << 20,
        l if l <= 0.10 => 256 << 10,
        _ => 32 << 10,
    };
    let delay = Duration::from_micros(rng.range_inclusive(1, 50));
    let link = LinkConfig::perfect(delay)
        .with_delay(delay, Duration::from_micros(rng.range_inclusive(0, 10)))
        .with_loss(net.loss)
        .with_duplicate(net.dup)
        .with_reorder(
            net.reorder,
            Duration::from_micros(rng.range_inclusive(1, 200)),
        )
        .with_corrupt(net.corrupt, 3);

    // Plan every direction of every QP pair, and the memory they need.
    let n_pairs = if rng.chance(0.3) {
        rng.range_inclusive(2, 3) as usize
    } else {
        1
    };
    let mut layouts = [Layout { next: 64 }, Layout { next: 64 }];
    let mut budget = Budget {
        max_len,
        left: 3 << 20,
    };
    let mut plans = Vec::new();
    for d in 0..2 * n_pairs {
        let req_is_a = d % 2 == 0;
        let count = if d == 0 {
            rng.range_inclusive(1, 30)
        } else {
            rng.range_inclusive(0, 20)
        } as usize;
        let [la, lb] = &mut layouts;
        let (req_l, resp_l) = if req_is_a { (la, lb) } else { (lb, la) };
        let atomic_base = resp_l.alloc(&mut rng, 32);
        let wr_base = 1_000 * (d as u64 + 1);
        let ops = plan_ops(
            &mut rng,
            count,
            &mut budget,
            req_l,
            resp_l,
            atomic_base,
            wr_base,
        );
        plans.push((req_is_a, atomic_base, ops));
    }
    // After the planned buffers: a spare 16 KiB for the traffic after a reconnection.
    let spare = layouts[0].next.max(layouts[1].next) + 4096;
    let mem_len = spare as usize + 16 * 1024;

    let max_rd_atomic = rng.range_inclusive(1, 16) as u8;
    let cfg = PairConfig {
        seed,
        net: NetConfig::with_link(link),
        mtu,
        // Reordered packets are held up to 200 µs: keep the timeout above that plus the
        // largest round trip and ACK delay (code 7 is 524 µs) so that a reordering alone does
        // not look like a loss. Without reordering, code 6 (262 µs) is just above the largest
        // round trip (2 × (50 + 10) µs) plus the longest ACK coalescing delay (100 µs).
        timeout: if net.reorder > 0.0 {
            rng.range_inclusive(7, 12)
        } else {
            rng.range_inclusive(6, 12)
        } as u8,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: rng.range_inclusive(1, 8) as u8,
        max_rd_atomic,
        max_dest_rd_atomic: rng.range_inclusive(u64::from(max_rd_atomic), 16) as u8,
        ack_req_every: [1, 4, 32, 64][rng.below(4) as usize],
        max_unacked_psns: [8, 64, 512, 4096][rng.below(4) as usize],
        mem_len,
        // A third of the runs start just before the 24-bit PSN wraps.
        psn_a: if rng.chance(0.3) {
            0xff_ffff - rng.below(20_000) as u32
        } else {
            rng.below(1 << 24) as u32
        },
        ipv6: rng.chance(0.3),
        ack_coalesce: Duration::from_micros([0, 10, 50, 100][rng.below(4) as usize]),
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg.clone());
    if let Some(path) = std::env::var_os("SOFTRDMA_SWEEP_PCAP") {
        // Debugging aid: every packet as sent, with virtual timestamps.
        let file = std::fs::File::create(&path).map_err(|e| format!("pcap: {e}"))?;
        let hook = sim::pcap::trace_hook(std::io::BufWriter::new(file), sim::pcap::Capture::Sent)
            .map_err(|e| format!("pcap: {e}"))?;
        p.sim.set_trace(hook);
    }
    let mut blip_window = None;
    if blip {
        // Shorter than retry_cnt - 3 local ACK timeouts: it costs at most retry_cnt - 2 retries
        // (one more for a packet already in flight when it starts), which leaves a margin for
        // the 1 % loss of the strict scenarios.
        let t = Duration::from_nanos(4096 << cfg.timeout);
        let start = Duration::from_micros(rng.range_inclusive(0, 3000));
        let len =
            Duration::from_nanos(rng.below((t * u32::from(cfg.retry_cnt - 3)).as_nanos() as u64));
        p.sim
            .partition_window(p.a.node, p.b.node, start, Some(start + len));
        blip_window = Some((start, start + len));
    }
    let (a, b) = (p.a, p.b);
    let mut pairs = vec![(a, b)];
    for _ in 1..n_pairs {
        pairs.push(p.add_qp_pair());
    }
    let mut dirs: Vec<Dir> = plans
        .into_iter()
        .enumerate()
        .map(|(d, (req_is_a, atomic_base, ops))| {
            let (qa, qb) = pairs[d / 2];
            let (req, resp) = if req_is_a { (qa, qb) } else { (qb, qa) };
            Dir {
                name: format!("{} #{}", if req_is_a { "A->B" } else { "B->A" }, d / 2),
                req,
                resp,
                req_is_a,
                atomic_base,
                words: [0; 4],
                ops,
            }
        })
        .collect();

    // Initial memory: sources filled, atomic words random; the images start identical.
    let mut imgs = [Image::new(mem_len), Image::new(mem_len)];
    for d in dirs.iter_mut() {
        let (req_img, resp_img) = split(&mut imgs, d.req_is_a);
        let req_mem = p.mem(&d.req);
        let resp_mem = p.mem(&d.resp);
        let atomic_base = d.atomic_base;
        for (w, slot) in d.words.iter_mut().enumerate() {
            *slot = rng.next_u64() & 0xffff; // small, so some CAS compares can match
            resp_mem.set_word(OWNER, d.resp.addr(atomic_base + w as u64 * 8), *slot);
            resp_img.set(atomic_base + w as u64 * 8, &slot.to_ne_bytes());
        }
        for op in &d.ops {
            match op.kind {
                Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm => {
                    let mut at = 0;
                    for &(o, l) in &op.local {
                        req_mem.set(OWNER, d.req.addr(o), &op.data[at..at + l]);
                        req_img.set(o, &op.data[at..at + l]);
                        at += l;
                    }
                }
                Kind::Read => {
                    resp_mem.set(OWNER, d.resp.addr(op.remote.0), &op.data);
                    resp_img.set(op.remote.0, &op.data);
                }
                Kind::Cas | Kind::Fadd => {}
            }
        }
    }
    // CAS compares: half of them match the value the word will hold when they execute.
    for d in dirs.iter_mut() {
        let base = d.atomic_base;
        let mut model = d.words;
        for op in d.ops.iter_mut() {
            if !matches!(op.kind, Kind::Cas | Kind::Fadd) {
                continue;
            }
            let w = ((op.remote.0 - base) / 8) as usize;
            if op.kind == Kind::Cas {
                op.compare = if rng.chance(0.5) {
                    model[w]
                } else {
                    rng.next_u64()
                };
                if model[w] == op.compare {
                    model[w] = op.swap_add;
                }
            } else {
                model[w] = model[w].wrapping_add(op.swap_add);
            }
        }
    }

    // One scenario in ten has one WR with a wrong rkey: its QP pair must fail cleanly (the
    // responder NAKs and errors its QP; both send queues then fail and flush) while the other
    // QP pairs carry on.
    let mut broken: Option<(usize, usize)> = None;
    if rng.chance(0.1) {
        let d = rng.below(dirs.len() as u64) as usize;
        let candidates: Vec<usize> = dirs[d]
            .ops
            .iter()
            .enumerate()
            // Not zero-length RDMA: the responder does not check the R_Key of a zero-length
            // WRITE or READ (IBA 9.4.4 / 9.4.5), so that one succeeds.
            .filter(|(_, o)| {
                matches!(o.kind, Kind::Write | Kind::Read | Kind::Cas | Kind::Fadd) && o.len > 0
            })
            .map(|(i, _)| i)
            .collect();
        if !candidates.is_empty() {
            let j = candidates[rng.below(candidates.len() as u64) as usize];
            dirs[d].ops[j].bad_rkey = true;
            broken = Some((d, j));
            TALLY[4].fetch_add(1, Relaxed);
        }
    }
    let broken_pair = broken.map(|(d, _)| d / 2);

    // Post in batches, letting the network run between them.
    let mut posted = vec![0usize; dirs.len()];
    let mut partition_at = None;
    let deadline_span = Duration::from_secs(600);
    while dirs.iter().zip(&posted).any(|(d, &n)| n < d.ops.len()) {
        let mut recvs_later: Vec<(Side, RecvWr)> = Vec::new();
        for (di, d) in dirs.iter().enumerate() {
            let n = rng.range_inclusive(1, 8) as usize;
            let end = (posted[di] + n).min(d.ops.len());
            for op in &d.ops[posted[di]..end] {
                if op.kind.consumes_recv() {
                    let wr = RecvWr::new(op.recv_wr_id, sges(&d.resp, &op.recv));
                    if late_recv {
                        recvs_later.push((d.resp, wr));
                    } else {
                        p.post_recv(&d.resp, wr);
                    }
                }
            }
            for op in &d.ops[posted[di]..end] {
                p.post_send(&d.req, send_wr(d, op));
            }
            posted[di] = end;
        }
        let pause = Duration::from_micros(rng.range_inclusive(0, 2000));
        p.sim
            .advance(pause)
            .map_err(|e| format!("sim error while posting: {e}"))?;
        for (side, wr) in recvs_later {
            p.post_recv(&side, wr);
        }
    }
    let total: Vec<usize> = dirs.iter().map(|d| d.ops.len()).collect();
    // Completions are taken out of the CQs as they arrive (unsignaled WRs make counts
    // meaningless); each direction's last WR is signaled, so its completion ends the queue.
    let mut got = Collected::new(dirs.len());
    let last: Vec<Option<u64>> = dirs.iter().map(|d| d.ops.last().map(|o| o.wr_id)).collect();
    if partition {
        // Cut the link while A still waits for its last completion, for far longer than the
        // retry budget (timeout × (retry_cnt + 1)).
        let want = rng.below(total[0] as u64) as usize;
        let r = p.sim.run_until(
            |s| {
                got.collect(s, &dirs);
                got.send[0].len() > want || got.finished(0, last[0])
            },
            p.sim.now() + deadline_span,
        );
        if r.is_err() {
            return Err(format!("no progress before the partition: {r:?}"));
        }
        if !got.finished(0, last[0]) {
            partition_at = Some(p.sim.now());
            p.sim.partition(a.node, b.node);
        }
    }

    // Run until every send queue has finished (and, when nothing may fail, every receive).
    let recvs: Vec<usize> = dirs
        .iter()
        .map(|d| d.ops.iter().filter(|o| o.kind.consumes_recv()).count())
        .collect();
    let cut = partition_at.is_some();
    // At 10 % and 30 % loss a run of retry_cnt + 1 fruitless timeouts is possible (at 10 %,
    // about 0.2^8 per stall, and a long soak sees millions of stalls): RETRY_EXC_ERR followed by
    // flushes is then a correct outcome, exactly as with a partition.
    let may_fail = cut || net.loss >= 0.1;
    // While a requester waits out RNR NAKs its PSN does not move, so local ACK timeouts from
    // lost packets add up across the RNR NAKs (as in Linux rxe): with late receives and any
    // loss a queue may also end in RETRY_EXC_ERR. Checked below: only if it did get RNR NAKs.
    let rnr_may_fail = late_recv && net.loss > 0.0;
    let deadline = p.sim.now() + deadline_span;
    let r = p.sim.run_until(
        |s| {
            got.collect(s, &dirs);
            (0..last.len()).all(|d| got.finished(d, last[d]))
                && (0..recvs.len()).all(|d| {
                    may_fail
                        || rnr_may_fail
                        || broken_pair == Some(d / 2)
                        || got.recv[d].len() >= recvs[d]
                })
        },
        deadline,
    );
    if let Err(e) = r {
        let mut queues = String::new();
        for (d, dir) in dirs.iter().enumerate() {
            let _ = write!(
                queues,
                "{}: {} send completions (last WR {:?} done: {}), {}/{} receives; ",
                dir.name,
                got.send[d].len(),
                last[d],
                got.finished(d, last[d]),
                got.recv[d].len(),
                recvs[d]
            );
        }
        return Err(format!(
            "{e}: {queues}states A {:?} B {:?}; {}",
            p.qp_state(&a),
            p.qp_state(&b),
            describe(broken, blip_window, &p, &cfg, &net, partition_at, late_recv),
        ));
    }
    if may_fail || rnr_may_fail || broken.is_some() {
        // Let stragglers settle (e.g. flushes of the receive queues).
        p.sim
            .advance(Duration::from_secs(1))
            .map_err(|e| format!("sim error after the partition: {e}"))?;
        got.collect(&mut p.sim, &dirs);
    }

    let ctx = describe(broken, blip_window, &p, &cfg, &net, partition_at, late_recv);
    TALLY[0].fetch_add(total.iter().sum::<usize>() as u64, Relaxed);
    let bytes: usize = dirs.iter().flat_map(|d| d.ops.iter()).map(|o| o.len).sum();
    TALLY[1].fetch_add(bytes as u64, Relaxed);
    if cut {
        TALLY[2].fetch_add(1, Relaxed);
    }
    for (di, d) in dirs.iter().enumerate() {
        let name = &d.name;
        let (req_img, resp_img) = split(&mut imgs, d.req_is_a);
        let wcs = &got.send[di];
        let mut words_known = true;
        // Where the queue failed, if it did: every WR before it succeeded (completions are in
        // order), it and every WR after it complete with an error whether signaled or not.
        let fail_at = wcs
            .iter()
            .find(|c| c.status != WcStatus::Success)
            .and_then(|c| d.ops.iter().position(|o| o.wr_id == c.wr_id));
        let k = fail_at.unwrap_or(d.ops.len());
        // Exactly once, in post order: the signaled successes, then every failed WR.
        let ids: Vec<u64> = wcs.iter().map(|c| c.wr_id).collect();
        let want: Vec<u64> = d.ops[..k]
            .iter()
            .filter(|o| o.signaled)
            .chain(&d.ops[k..])
            .map(|o| o.wr_id)
            .collect();
        if ids != want {
            return Err(format!(
                "{name}: send completions {ids:?}, expected {want:?} ({ctx})"
            ));
        }
        // Status shape.
        let ok = wcs
            .iter()
            .take_while(|c| c.status == WcStatus::Success)
            .count();
        let rnr_naks = {
            let qpn = d.req.qpn;
            p.engine(&d.req)
                .qp_counters(qpn)
                .map_or(0, |c| c.get(Counter::CompRnrNakReceived))
        };
        let dir_may_fail =
            may_fail || broken_pair == Some(di / 2) || (rnr_may_fail && rnr_naks > 0);
        let bad_index = broken.filter(|&(bd, _)| bd == di).map(|(_, j)| j);
        if ok < wcs.len() {
            let first = wcs[ok].status;
            if !dir_may_fail {
                let qpn = d.req.qpn;
                let counters: Vec<String> = p
                    .engine(&d.req)
                    .qp_counters(qpn)
                    .map(|c| {
                        c.iter()
                            .filter(|(_, v)| *v > 0)
                            .map(|(k, v)| format!("{} {v}", k.name()))
                            .collect()
                    })
                    .unwrap_or_default();
                return Err(format!(
                    "{name}: WR {} failed with {first:?} without a partition; requester QP {qpn:#x} \
                     counters: {} ({ctx})",
                    wcs[ok].wr_id,
                    counters.join(", ")
                ));
            }
            // The bad WR fails with REM_ACCESS_ERR, or, when the NAK is lost and the responder
            // has already moved to ERR, with RETRY_EXC_ERR (then possibly on an earlier WR whose
            // ACK was lost too). The reverse direction of that pair sees its peer go to ERR.
            let allowed: &[WcStatus] = if bad_index.is_some() {
                &[WcStatus::RemAccessErr, WcStatus::RetryExcErr]
            } else if broken_pair == Some(di / 2) {
                &[WcStatus::RetryExcErr, WcStatus::WrFlushErr]
            } else {
                &[WcStatus::RetryExcErr]
            };
            if !allowed.contains(&first) {
                return Err(format!(
                    "{name}: first failure is {first:?} on WR {}, expected one of {allowed:?} \
                     (bad WR index {bad_index:?}) ({ctx})",
                    wcs[ok].wr_id
                ));
            }
            if let Some(j) = bad_index {
                if k > j {
                    return Err(format!(
                        "{name}: WR {} with a wrong rkey succeeded ({ctx})",
                        d.ops[j].wr_id
                    ));
                }
                if first == WcStatus::RemAccessErr && k != j {
                    return Err(format!(
                        "{name}: REM_ACCESS_ERR on WR {}, but the bad WR is {} ({ctx})",
                        wcs[ok].wr_id, d.ops[j].wr_id
                    ));
                }
            }
            if first == WcStatus::RetryExcErr {
                if !cut && broken_pair != Some(di / 2) {
                    TALLY[3].fetch_add(1, Relaxed);
                }
                // RETRY_EXC_ERR means retry_cnt retries after as many local ACK timeouts, plus
                // the one that found none left.
                let qpn = d.req.qpn;
                let timeouts = p
                    .engine(&d.req)
                    .qp_counters(qpn)
                    .map_or(0, |c| c.get(Counter::CompLocalAckTimeout));
                if timeouts < u64::from(cfg.retry_cnt) + 1 {
                    return Err(format!(
                        "{name}: RETRY_EXC_ERR after only {timeouts} local ACK timeouts ({ctx})"
                    ));
                }
            }
            if let Some(c) = wcs[ok + 1..]
                .iter()
                .find(|c| c.status != WcStatus::WrFlushErr)
            {
                return Err(format!(
                    "{name}: WR {} after the first error has {:?}, expected WrFlushErr ({ctx})",
                    c.wr_id, c.status
                ));
            }
        } else if cut && di == 0 {
            return Err(format!(
                "A->B: every WR succeeded although A was cut off with WRs outstanding ({ctx})"
            ));
        } else if let Some(j) = bad_index {
            return Err(format!(
                "{name}: WR {} with a wrong rkey succeeded ({ctx})",
                d.ops[j].wr_id
            ));
        }
        // Requester-side results and the responder's image.
        let base = d.atomic_base;
        let mut model = d.words;
        for (i, op) in d.ops.iter().enumerate() {
            let success = i < k;
            let wc = wcs.iter().find(|c| c.wr_id == op.wr_id);
            if let Some(wc) = wc.filter(|_| success) {
                let (want_op, want_len) = match op.kind {
                    Kind::Send | Kind::SendImm => (WcOpcode::Send, None),
                    Kind::Write | Kind::WriteImm => (WcOpcode::RdmaWrite, None),
                    Kind::Read => (WcOpcode::RdmaRead, Some(op.len)),
                    Kind::Cas => (WcOpcode::CompSwap, Some(8)),
                    Kind::Fadd => (WcOpcode::FetchAdd, Some(8)),
                };
                if wc.opcode != want_op {
                    return Err(format!(
                        "{name}: WR {} completed as {:?}, expected {want_op:?} ({ctx})",
                        op.wr_id, wc.opcode
                    ));
                }
                if let Some(l) = want_len {
                    if wc.byte_len as usize != l {
                        return Err(format!(
                            "{name}: WR {} ({:?}) byte_len {}, expected {l} ({ctx})",
                            op.wr_id, op.kind, wc.byte_len
                        ));
                    }
                }
            }
            match op.kind {
                Kind::Send | Kind::SendImm => {
                    if !success {
                        resp_img.dont_care_all(&op.recv);
                    }
                }
                Kind::Write | Kind::WriteImm => {
                    if success {
                        resp_img.set(op.remote.0, &op.data);
                    } else {
                        resp_img.dont_care(op.remote.0, op.len);
                        resp_img.dont_care_all(&op.recv);
                    }
                }
                Kind::Read => {
                    if success {
                        req_img.scatter(&op.local, &op.data);
                    } else {
                        req_img.dont_care_all(&op.local);
                    }
                }
                Kind::Cas | Kind::Fadd => {
                    let w = ((op.remote.0 - base) / 8) as usize;
                    if success && words_known {
                        let orig = model[w];
                        req_img.set(op.local[0].0, &orig.to_ne_bytes());
                        if op.kind == Kind::Cas {
                            if orig == op.compare {
                                model[w] = op.swap_add;
                            }
                        } else {
                            model[w] = orig.wrapping_add(op.swap_add);
                        }
                    } else {
                        // It may or may not have executed at the responder.
                        words_known = false;
                        req_img.dont_care_all(&op.local);
                    }
                }
            }
        }
        for (w, v) in model.iter().enumerate() {
            let off = base + w as u64 * 8;
            if words_known {
                resp_img.set(off, &v.to_ne_bytes());
            } else {
                resp_img.dont_care(off, 8);
            }
        }
        // Receive completions: in post order, each success exact.
        let rops: Vec<&Op> = d.ops.iter().filter(|o| o.kind.consumes_recv()).collect();
        let rwcs = &got.recv[di];
        if rwcs.len() > rops.len() || (!dir_may_fail && rwcs.len() != rops.len()) {
            return Err(format!(
                "{name}: {} receive completions for {} receives ({ctx})",
                rwcs.len(),
                rops.len()
            ));
        }
        let mut flushed = false;
        for (op, wc) in rops.iter().zip(rwcs) {
            if wc.wr_id != op.recv_wr_id {
                return Err(format!(
                    "{name}: receive completion {} where {} was next ({ctx})",
                    wc.wr_id, op.recv_wr_id
                ));
            }
            match wc.status {
                WcStatus::Success if !flushed => {
                    let (want_op, imm) = match op.kind {
                        Kind::Send => (WcOpcode::Recv, None),
                        Kind::SendImm => (WcOpcode::Recv, Some(op.imm)),
                        _ => (WcOpcode::RecvRdmaWithImm, Some(op.imm)),
                    };
                    let got_imm = wc
                        .wc_flags
                        .contains(WcFlags::WITH_IMM)
                        .then_some(wc.imm_data);
                    if wc.opcode != want_op || got_imm != imm || wc.byte_len as usize != op.len {
                        return Err(format!(
                            "{name}: receive for WR {} ({:?}, {} B, imm {:?}) completed as {:?}, \
                             {} B, imm {:?} ({ctx})",
                            op.wr_id, op.kind, op.len, imm, wc.opcode, wc.byte_len, got_imm
                        ));
                    }
                    match op.kind {
                        Kind::Send | Kind::SendImm => resp_img.scatter(&op.recv, &op.data),
                        _ => {
                            // A WRITE with immediate delivered its bytes (even if the requester
                            // did not hear the ACK before the cut).
                            resp_img.set(op.remote.0, &op.data);
                            resp_img.care[op.remote.0 as usize..][..op.len]
                                .iter_mut()
                                .for_each(|c| *c = true);
                        }
                    }
                }
                WcStatus::WrFlushErr if dir_may_fail => flushed = true,
                s => {
                    return Err(format!(
                        "{name}: receive for WR {} completed with {s:?} ({ctx})",
                        op.wr_id
                    ))
                }
            }
        }
        // A send the requester saw succeed must have consumed its receive.
        for (i, op) in rops.iter().enumerate() {
            let sent_ok = d.ops[..k].iter().any(|o| o.wr_id == op.wr_id);
            let recv_ok = rwcs.get(i).is_some_and(|c| c.status == WcStatus::Success);
            if sent_ok && !recv_ok {
                return Err(format!(
                    "{name}: WR {} succeeded but its receive did not complete ({ctx})",
                    op.wr_id
                ));
            }
        }
    }

    // Every byte of both memories is what the completed operations say, and nothing else.
    for (side, img, label) in [(a, &imgs[0], "A"), (b, &imgs[1], "B")] {
        let actual = p.mem(&side).get(OWNER, side.base, mem_len);
        if let Some(i) = first_diff(&actual, img) {
            return Err(format!(
                "memory of {label} differs at offset {i}: {:#04x}, expected {:#04x} ({})",
                actual[i],
                img.bytes[i],
                owner_of(&dirs, i as u64, label == "A") + &format!(" ({ctx})")
            ));
        }
    }
    if cut {
        // The application's way out of a dead connection: heal, reset and reconnect every QP
        // pair, and use it again.
        p.sim.heal(a.node, b.node);
        for &(qa, qb) in &pairs {
            let psn = rng.below(1 << 24) as u32;
            p.reconnect(&qa, &qb, psn);
        }
        let (qa, qb) = pairs[0];
        let data = pattern(rng.next_u64(), 4096);
        p.mem(&qa).set(OWNER, qa.addr(spare), &data);
        p.post_send(
            &qa,
            SendWr::rdma_write(1, vec![qa.sge(spare, 4096)], qb.addr(spare), qb.mr.rkey),
        );
        p.post_send(
            &qa,
            SendWr::rdma_read(
                2,
                vec![qa.sge(spare + 8192, 4096)],
                qb.addr(spare),
                qb.mr.rkey,
            ),
        );
        let node = qa.node;
        let cq = qa.send_cq;
        let mut wcs = Vec::new();
        let r = p.sim.run_until(
            |s| {
                if s.node(node).engine.cq_len(cq).unwrap_or(0) > 0 {
                    let e = &mut s.node_mut(node).engine;
                    wcs.extend(e.poll_cq(cq, usize::MAX).unwrap_or_default());
                }
                wcs.len() >= 2
            },
            p.sim.now() + deadline_span,
        );
        if let Err(e) = r {
            return Err(format!("after reconnecting: {e} ({ctx})"));
        }
        let statuses: Vec<(u64, WcStatus)> = wcs.iter().map(|c| (c.wr_id, c.status)).collect();
        let ok = statuses == [(1, WcStatus::Success), (2, WcStatus::Success)];
        // Under heavy loss the reconnected pair may legitimately run out of retries again:
        // then SUCCESS for a prefix, RETRY_EXC_ERR, and flushes.
        let first_bad = statuses.iter().position(|s| s.1 != WcStatus::Success);
        let tolerated = net.loss >= 0.1
            && first_bad.is_some_and(|i| {
                statuses[i].1 == WcStatus::RetryExcErr
                    && statuses[i + 1..]
                        .iter()
                        .all(|s| s.1 == WcStatus::WrFlushErr)
            });
        if !ok && !tolerated {
            return Err(format!(
                "after reconnecting: completions {statuses:?} ({ctx})"
            ));
        }
        if ok
            && (p.mem(&qb).get(OWNER, qb.addr(spare), 4096) != data
                || p.mem(&qa).get(OWNER, qa.addr(spare + 8192), 4096) != data)
        {
            return Err(format!("after reconnecting: the bytes differ ({ctx})"));
        }
    }
    if std::env::var_os("SOFTRDMA_SWEEP_VERBOSE").is_some() {
        eprintln!("seed {seed}: ok; {ctx}");
    }
    Ok(p.sim.trace_hash())
}

/// Which planned buffer holds offset `off` of side A (`is_a`) or B, for error messages.
fn owner_of(dirs: &[Dir], off: u64, is_a: bool) -> String {
    let inside = |r: &(u64, usize)| off >= r.0 && off < r.0 + r.1 as u64;
    for d in dirs {
        let req_is_a = d.req_is_a;
        for op in &d.ops {
            if req_is_a == is_a && op.local.iter().any(inside) {
                return format!(
                    "requester buffer of WR {} ({:?}, {} B)",
                    op.wr_id, op.kind, op.len
                );
            }
            if req_is_a != is_a && (inside(&op.remote) || op.recv.iter().any(inside)) {
                return format!(
                    "responder buffer of WR {} ({:?}, {} B)",
                    op.wr_id, op.kind, op.len
                );
            }
        }
    }
    "no planned buffer".to_string()
}

fn describe(
    broken: Option<(usize, usize)>,
    blip: Option<(Duration, Duration)>,
    p: &Pair,
    cfg: &PairConfig,
    net: &Net,
    partition_at: Option<Duration>,
    late_recv: bool,
) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "loss {} dup {} reorder {} corrupt {}, mtu {:?}, timeout {}, max_rd_atomic {}/{}, \
         ack_req_every {}, max_unacked {}, ack_coalesce {:?}, blip {blip:?}, \
         wrong rkey {broken:?}, \
         psn_a {:#x}, ipv6 {}, late_recv {late_recv}, partition at {partition_at:?}, now {:?}, \
         net {:?}",
        net.loss,
        net.dup,
        net.reorder,
        net.corrupt,
        cfg.mtu,
        cfg.timeout,
        cfg.max_rd_atomic,
        cfg.max_dest_rd_atomic,
        cfg.ack_req_every,
        cfg.max_unacked_psns,
        cfg.ack_coalesce,
        cfg.psn_a,
        cfg.ipv6,
        p.sim.now(),
        p.sim.stats()
    );
    s
}

#[allow(dead_code)]
fn show(wcs: &[WorkCompletion]) -> String {
    wcs.iter()
        .map(|c| format!("{}:{:?}", c.wr_id, c.status))
        .collect::<Vec<_>>()
        .join(" ")
}
