//! When the responder's plain ACKs leave (the engine's `ack` policy), proved in the sim, whose
//! hosts call `handle_timeout` and `poll_transmit` exactly when `poll_timeout` says:
//!
//! - on clean links, with random mixes of every operation, pauses, late receives and every
//!   coalescing delay, each request that asks for an ACK is answered within the delay (at the
//!   next pass when it is 0), no ACK leaves in the pass that handled its request unless a
//!   response queued behind it sends it first, and a QP's responses never go back in PSN
//!   order (an older held ACK never follows a NAK, READ response or ATOMIC ACK);
//! - under loss, duplication, reordering and corruption, messages in both directions arrive
//!   exactly once and in order whatever the delay;
//! - a peer that keeps sending gets far fewer ACKs than messages;
//! - a ping-pong peer that waits for its send completion is found out within three round
//!   trips and then gets its ACK at the next pass;
//! - a QP destroyed, reset or moved to ERR right after a receive still acknowledges it.
//!
//! Randomized tests print the seed and the command that replays it (`SOFTRDMA_SEED=n`).

mod common;

use core::time::Duration;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use common::{pattern, Host, Pair, PairConfig, Side, OWNER};
use engine::{
    Counter, PathMtu, QpAttr, QpAttrMask, QpState, RecvWr, SendOp, SendWr, WcOpcode, WcStatus,
    DEFAULT_ACK_COALESCE,
};
use sim::seeds::{for_each_seed, Replay};
use sim::{LinkConfig, NetConfig, NodeId, Rng, Sim, TraceKind, Verdict};
use wire::{NakCode, OpKind, Psn, Syndrome};

const DEADLINE: Duration = Duration::from_secs(5);

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

fn replay(name: &str) -> Replay<'_> {
    Replay::new("softrdma-engine", "rc_acks", name)
}

/// One packet sent or delivered (intact) in the sim.
#[derive(Debug, Clone)]
struct Ev {
    time: Duration,
    sent: bool,
    from: NodeId,
    to: NodeId,
    t: wire::TransportRepr,
}

impl Ev {
    fn psn(&self) -> Psn {
        self.t.bth.psn
    }

    fn dest_qp(&self) -> u32 {
        self.t.bth.dest_qp.value()
    }
}

fn is_plain_ack(t: &wire::TransportRepr) -> bool {
    t.bth.opcode.kind() == OpKind::Acknowledge
        && matches!(t.aeth.map(|a| a.syndrome), Some(Syndrome::Ack { .. }))
}

/// Records every packet sent and every intact packet delivered.
#[derive(Clone, Default)]
struct Tap {
    evs: Rc<RefCell<Vec<Ev>>>,
}

impl Tap {
    fn install(sim: &mut Sim<Host>) -> Tap {
        let tap = Tap::default();
        let evs = Rc::clone(&tap.evs);
        sim.set_trace(Box::new(move |ev| {
            let sent = match ev.kind {
                TraceKind::Sent => true,
                TraceKind::Delivered { corrupted: false } => false,
                _ => return,
            };
            if let (Some(from), Some(to), Some(t)) =
                (ev.from, ev.to, common::transport_of(ev.packet))
            {
                evs.borrow_mut().push(Ev {
                    time: ev.time,
                    sent,
                    from,
                    to,
                    t,
                });
            }
        }));
        tap
    }

    /// Requests from `req` delivered to `resp`'s QP, in delivery order.
    fn requests(&self, req: &Side, resp: &Side) -> Vec<Ev> {
        self.evs
            .borrow()
            .iter()
            .filter(|e| {
                !e.sent
                    && (e.from, e.to) == (req.node, resp.node)
                    && e.dest_qp() == resp.qpn
                    && e.t.bth.opcode.is_request()
            })
            .cloned()
            .collect()
    }

    /// Responses `resp` sent to `req`'s QP, in sending order.
    fn responses(&self, req: &Side, resp: &Side) -> Vec<Ev> {
        self.evs
            .borrow()
            .iter()
            .filter(|e| {
                e.sent
                    && (e.from, e.to) == (resp.node, req.node)
                    && e.dest_qp() == req.qpn
                    && !e.t.bth.opcode.is_request()
            })
            .cloned()
            .collect()
    }
}

/// The ACK timing and ordering rules, on a clean link, for the requests `req` sent to `resp`.
fn check_responder(tap: &Tap, req: &Side, resp: &Side, coalesce: Duration) -> Result<(), String> {
    let reqs = tap.requests(req, resp);
    let resps = tap.responses(req, resp);
    let who = format!("QP {:#x} -> {:#x}", req.qpn, resp.qpn);
    // The responder's packets keep their order: PSNs never go back.
    for w in resps.windows(2) {
        if w[1].psn().is_before(w[0].psn()) {
            return Err(format!(
                "{who}: response PSN {} at {:?} after {} at {:?} ({:?} after {:?})",
                w[1].psn(),
                w[1].time,
                w[0].psn(),
                w[0].time,
                w[1].t.bth.opcode,
                w[0].t.bth.opcode
            ));
        }
    }
    // On a clean link a PSN arrives again only after an RNR NAK: its last arrival is the one
    // the responder executed.
    let mut last = BTreeMap::new();
    for (i, r) in reqs.iter().enumerate() {
        last.insert(r.psn().value(), i);
    }
    let bound = coalesce.max(Duration::from_nanos(1));
    for (i, r) in reqs.iter().enumerate() {
        if !r.t.bth.ack_req || last[&r.psn().value()] != i {
            continue;
        }
        let cover = resps
            .iter()
            .find(|s| s.time >= r.time && !s.psn().is_before(r.psn()));
        match cover {
            None => return Err(format!("{who}: request PSN {} never answered", r.psn())),
            Some(s) if s.time > r.time + bound => {
                return Err(format!(
                "{who}: request PSN {} arrived at {:?}, first answered at {:?} (delay {bound:?})",
                r.psn(),
                r.time,
                s.time
            ))
            }
            Some(_) => {}
        }
    }
    for (j, s) in resps.iter().enumerate() {
        if !is_plain_ack(&s.t) {
            continue;
        }
        let Some(&i) = last.get(&s.psn().value()) else {
            return Err(format!("{who}: ACK of PSN {} that never arrived", s.psn()));
        };
        let made = reqs[i].time;
        let released = resps
            .get(j + 1)
            .is_some_and(|n| n.time == s.time && !is_plain_ack(&n.t));
        // Or it took the place of an older one that was due then (the newest ACK keeps the
        // oldest one's deadline): a request after the previous response arrived earlier.
        let prev = j.checked_sub(1).map(|k| resps[k].psn());
        let rode_along = reqs.iter().enumerate().any(|(k, r)| {
            last[&r.psn().value()] == k
                && r.t.bth.ack_req
                && r.time < s.time
                && r.psn().is_before(s.psn())
                && prev.is_none_or(|q| r.psn().is_after(q))
        });
        if made > s.time || (made == s.time && !released && !rode_along) {
            return Err(format!(
                "{who}: ACK of PSN {} left at {:?}, its request arrived at {made:?}",
                s.psn(),
                s.time
            ));
        }
    }
    Ok(())
}

/// What a planned work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    WriteImm,
    Read,
    FetchAdd,
}

/// A work request to post at a virtual time, or the receives a direction needs.
enum Action {
    Post(usize, SendWr),
    Receives(usize, u64),
}

/// Offsets in each side's memory (1 MiB).
const SRC: u64 = 0;
const READ_SINK: u64 = 0x1_0000;
const WRITE_AT: u64 = 0x4_0000;
const RECV_AT: u64 = 0x8_0000;
const WORD: u64 = 0xc_0000;
const MAX_LEN: u64 = 12 << 10;

fn wr_for(kind: Kind, id: u64, len: u32, req: &Side, resp: &Side) -> SendWr {
    let rkey = resp.mr.rkey;
    match kind {
        Kind::Send => SendWr::send(id, vec![req.sge(SRC, len)]),
        Kind::Write => SendWr::rdma_write(id, vec![req.sge(SRC, len)], resp.addr(WRITE_AT), rkey),
        Kind::WriteImm => SendWr::new(
            id,
            SendOp::RdmaWriteWithImm {
                remote_addr: resp.addr(WRITE_AT),
                rkey,
                imm: id as u32,
            },
            vec![req.sge(SRC, len)],
        ),
        Kind::Read => SendWr::rdma_read(id, vec![req.sge(READ_SINK, len)], resp.addr(SRC), rkey),
        Kind::FetchAdd => SendWr::new(
            id,
            SendOp::AtomicFetchAdd {
                remote_addr: resp.addr(WORD),
                rkey,
                add: 1,
            },
            vec![req.sge(READ_SINK, 8)],
        ),
    }
}

/// Clean links, random traffic: the timing and ordering rules hold for every QP.
fn clean_scenario(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed ^ 0xac4_0001);
    let delay = us(rng.range_inclusive(1, 40));
    let jitter = us(rng.range_inclusive(0, 10));
    let coalesce = [0, 1_000, 20_000, 50_000, 200_000][rng.below(5) as usize];
    let coalesce = Duration::from_nanos(coalesce);
    let cfg = PairConfig {
        seed,
        net: NetConfig::with_link(LinkConfig::perfect(delay).with_delay(delay, jitter)),
        mtu: [PathMtu::Mtu256, PathMtu::Mtu1024, PathMtu::Mtu4096][rng.below(3) as usize],
        // No local ACK timeout: on a clean link every PSN but an RNR NAKed one arrives once.
        timeout: 0,
        min_rnr_timer: rng.range_inclusive(1, 4) as u8,
        ack_req_every: [1, 4, 32][rng.below(3) as usize],
        psn_a: if rng.chance(0.3) {
            0xff_ffff - rng.below(200) as u32
        } else {
            rng.below(1 << 24) as u32
        },
        ack_coalesce: coalesce,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let tap = Tap::install(&mut p.sim);
    // Up to a dozen QP pairs, so that many QPs hold an ACK at once (the engine times them
    // apart from the QPs with urgent work).
    let mut pairs = vec![(p.a, p.b)];
    for _ in 1..rng.range_inclusive(1, 12) {
        pairs.push(p.add_qp_pair());
    }
    // Every direction of every pair: (requester, responder).
    let dirs: Vec<(Side, Side)> = pairs.iter().flat_map(|&(a, b)| [(a, b), (b, a)]).collect();
    let mut plan: Vec<(Duration, Action)> = Vec::new();
    let mut expected = vec![0usize; dirs.len()];
    for (d, (req, resp)) in dirs.iter().enumerate() {
        let mut at = Duration::ZERO;
        let mut receives = 0;
        for i in 0..rng.range_inclusive(0, 25) {
            if rng.chance(0.5) {
                at += us(rng.range_inclusive(0, 150));
            }
            let kind = [
                Kind::Send,
                Kind::Write,
                Kind::WriteImm,
                Kind::Read,
                Kind::FetchAdd,
            ][rng.below(5) as usize];
            if matches!(kind, Kind::Send | Kind::WriteImm) {
                receives += 1;
            }
            let len = rng.below(MAX_LEN + 1) as u32;
            plan.push((at, Action::Post(d, wr_for(kind, i, len, req, resp))));
            expected[d] += 1;
        }
        // Some responders post their receives late: RNR NAKs.
        let recv_at = if rng.chance(0.3) {
            us(rng.range_inclusive(0, 300))
        } else {
            Duration::ZERO
        };
        plan.push((recv_at, Action::Receives(d, receives)));
    }
    plan.sort_by_key(|(t, _)| *t);
    for (t, action) in plan {
        p.sim.advance_to(t).map_err(|e| e.to_string())?;
        match action {
            Action::Post(d, wr) => p.post_send(&dirs[d].0, wr),
            Action::Receives(d, n) => {
                let resp = dirs[d].1;
                for i in 0..n {
                    p.post_recv(&resp, RecvWr::new(i, vec![resp.sge(RECV_AT, 16 << 10)]));
                }
            }
        }
    }
    let until = p.sim.now() + DEADLINE;
    p.sim
        .run_until(
            |s| {
                dirs.iter().enumerate().all(|(d, (req, _))| {
                    s.node(req.node).engine.cq_len(req.send_cq).unwrap_or(0) >= expected[d]
                })
            },
            until,
        )
        .map_err(|e| format!("{e}"))?;
    for (d, (req, _)) in dirs.iter().enumerate() {
        let done = p.poll(req, req.send_cq);
        if let Some(bad) = done.iter().find(|c| c.status != WcStatus::Success) {
            return Err(format!("direction {d}: {bad:?}"));
        }
    }
    // Whatever ACKs are left leave, and then nothing is pending.
    let _ = p.sim.run_until(|_| false, p.sim.now() + DEADLINE);
    for (req, resp) in &dirs {
        check_responder(&tap, req, resp, coalesce)?;
    }
    Ok(())
}

#[test]
fn acks_leave_by_their_deadline_and_in_order_on_clean_links() {
    let r = replay("acks_leave_by_their_deadline_and_in_order_on_clean_links");
    for_each_seed(&r, 60, clean_scenario);
}

/// Messages both ways over a faulty network: each arrives exactly once, in order, intact.
fn lossy_scenario(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed ^ 0xac4_0002);
    let loss = [0.0, 0.01, 0.05][rng.below(3) as usize];
    let link = LinkConfig::perfect(us(rng.range_inclusive(1, 30)))
        .with_loss(loss)
        .with_duplicate(if rng.chance(0.5) { 0.05 } else { 0.0 })
        .with_reorder(
            if rng.chance(0.5) { 0.05 } else { 0.0 },
            us(rng.range_inclusive(1, 100)),
        )
        .with_corrupt(if rng.chance(0.5) { 0.01 } else { 0.0 }, 3);
    let coalesce = Duration::from_nanos([0, 10_000, 50_000, 500_000][rng.below(4) as usize]);
    let cfg = PairConfig {
        seed,
        net: NetConfig::with_link(link),
        mtu: [PathMtu::Mtu256, PathMtu::Mtu1024][rng.below(2) as usize],
        // 4 ms: above the longest round trip, reordering and ACK delay together.
        timeout: 10,
        ack_req_every: [1, 4, 32][rng.below(3) as usize],
        ack_coalesce: coalesce,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    const SLOT: u64 = 8 << 10;
    let mut msgs = Vec::new();
    for (d, (req, resp)) in [(a, b), (b, a)].into_iter().enumerate() {
        let n = rng.range_inclusive(10, 60);
        for i in 0..n {
            p.post_recv(
                &resp,
                RecvWr::new(i, vec![resp.sge(RECV_AT + i * SLOT, SLOT as u32)]),
            );
        }
        let mut sends = Vec::new();
        for i in 0..n {
            let len = rng.below(SLOT + 1) as usize;
            let data = pattern(seed ^ ((d as u64) << 32) ^ i, len);
            p.mem(&req).set(OWNER, req.addr(SRC + i * SLOT), &data);
            let sge = vec![req.sge(SRC + i * SLOT, len as u32)];
            let imm = ((d as u32) << 16) | i as u32;
            let op = if rng.chance(0.5) {
                SendOp::SendWithImm { imm }
            } else {
                SendOp::RdmaWriteWithImm {
                    remote_addr: resp.addr(RECV_AT + i * SLOT),
                    rkey: resp.mr.rkey,
                    imm,
                }
            };
            sends.push(SendWr::new(i, op, sge));
            msgs.push((d, i, data, op));
        }
        let paced = rng.chance(0.5);
        for wr in sends {
            if paced {
                p.sim
                    .advance(us(rng.range_inclusive(0, 40)))
                    .map_err(|e| e.to_string())?;
            }
            p.post_send(&req, wr);
        }
    }
    let count = |d: usize| msgs.iter().filter(|m| m.0 == d).count();
    let (na, nb) = (count(0), count(1));
    let until = p.sim.now() + DEADLINE;
    p.sim
        .run_until(
            |s| {
                let len = |n: NodeId, cq| s.node(n).engine.cq_len(cq).unwrap_or(0);
                len(a.node, a.send_cq) >= na
                    && len(b.node, b.recv_cq) >= na
                    && len(b.node, b.send_cq) >= nb
                    && len(a.node, a.recv_cq) >= nb
            },
            until,
        )
        .map_err(|e| format!("{e}"))?;
    for (d, (req, resp)) in [(a, b), (b, a)].into_iter().enumerate() {
        let sent = p.poll(&req, req.send_cq);
        let got = p.poll(&resp, resp.recv_cq);
        let mine: Vec<_> = msgs.iter().filter(|m| m.0 == d).collect();
        if sent.len() != mine.len() || got.len() != mine.len() {
            return Err(format!(
                "direction {d}: {} sends and {} receives completed for {} messages",
                sent.len(),
                got.len(),
                mine.len()
            ));
        }
        for ((s, r), (_, i, data, op)) in sent.iter().zip(&got).zip(mine) {
            let imm = ((d as u32) << 16) | *i as u32;
            let opcode = match op {
                SendOp::SendWithImm { .. } => WcOpcode::Recv,
                _ => WcOpcode::RecvRdmaWithImm,
            };
            if (s.wr_id, s.status) != (*i, WcStatus::Success)
                || (r.wr_id, r.status, r.imm_data, r.opcode, r.byte_len as usize)
                    != (*i, WcStatus::Success, imm, opcode, data.len())
            {
                return Err(format!(
                    "direction {d} message {i}: sent {s:?}, received {r:?}"
                ));
            }
            if p.mem(&resp)
                .get(OWNER, resp.addr(RECV_AT + i * SLOT), data.len())
                != *data
            {
                return Err(format!("direction {d} message {i}: wrong bytes"));
            }
        }
    }
    Ok(())
}

#[test]
fn messages_arrive_exactly_once_and_in_order_with_coalesced_acks_under_faults() {
    let r = replay("messages_arrive_exactly_once_and_in_order_with_coalesced_acks_under_faults");
    for_each_seed(&r, 80, lossy_scenario);
}

/// A stream of small SENDs, all posted at once or a few microseconds apart.
fn stream_scenario(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed ^ 0xac4_0003);
    let delay = us(rng.range_inclusive(1, 20));
    let mut p = Pair::new(PairConfig {
        seed,
        net: NetConfig::with_link(LinkConfig::perfect(delay)),
        ..PairConfig::default()
    });
    let (a, b) = (p.a, p.b);
    let tap = Tap::install(&mut p.sim);
    let n = rng.range_inclusive(200, 400);
    for i in 0..n {
        p.post_recv(&b, RecvWr::new(i, vec![b.sge(RECV_AT, 256)]));
    }
    let gap = rng.range_inclusive(0, 10);
    for i in 0..n {
        let len = rng.below(257) as u32;
        p.post_send(&a, SendWr::send(i, vec![a.sge(SRC, len)]));
        p.sim
            .advance(Duration::from_nanos(rng.below(gap * 1_000 + 1)))
            .map_err(|e| e.to_string())?;
    }
    let sc = p
        .wait_cq(&a, a.send_cq, n as usize, p.sim.now() + DEADLINE)
        .map_err(|e| e.to_string())?;
    if sc.len() != n as usize || sc.iter().any(|c| c.status != WcStatus::Success) {
        return Err(format!("{} of {n} sends completed well", sc.len()));
    }
    let _ = p.sim.run_until(|_| false, p.sim.now() + DEADLINE);
    let acks = tap
        .responses(&a, &b)
        .iter()
        .filter(|e| is_plain_ack(&e.t))
        .count() as u64;
    if acks * 4 > n {
        return Err(format!("{acks} ACKs for {n} messages (gap up to {gap} µs)"));
    }
    // Every message asked for an ACK: each was sent or stood in for by a newer one.
    let c = p.sim.node(b.node).engine.counters();
    let (sent, coalesced) = (
        c.get(Counter::RespAcksSent),
        c.get(Counter::RespAcksCoalesced),
    );
    if (sent, sent + coalesced) != (acks, n) {
        return Err(format!(
            "counters: {sent} ACKs sent + {coalesced} coalesced, for {acks} seen and {n} messages"
        ));
    }
    Ok(())
}

#[test]
fn a_peer_that_keeps_sending_gets_far_fewer_acks_than_messages() {
    let r = replay("a_peer_that_keeps_sending_gets_far_fewer_acks_than_messages");
    for_each_seed(&r, 20, stream_scenario);
}

/// A ping-pong whose requester waits for its send completion before each next message.
fn ping_pong_scenario(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed ^ 0xac4_0004);
    // Round trips below the 25 µs in which a waiting peer's next request answers an ACK.
    let delay = us(rng.range_inclusive(1, 10));
    let jitter = Duration::from_nanos(rng.below(2_001));
    let mut p = Pair::new(PairConfig {
        seed,
        net: NetConfig::with_link(LinkConfig::perfect(delay).with_delay(delay, jitter)),
        ..PairConfig::default()
    });
    let (a, b) = (p.a, p.b);
    let tap = Tap::install(&mut p.sim);
    // Short messages, and long ones that ask for ACKs mid-message too (32 packets of 1 KiB).
    let len = [8, 2_000, 40_000][rng.below(3) as usize];
    const ROUNDS: u64 = 30;
    for i in 0..ROUNDS {
        p.post_recv(&b, RecvWr::new(i, vec![b.sge(RECV_AT, 64 << 10)]));
    }
    for i in 0..ROUNDS {
        p.post_send(&a, SendWr::send(i, vec![a.sge(SRC, len)]));
        let c = p
            .wait_cq(&a, a.send_cq, 1, p.sim.now() + DEADLINE)
            .map_err(|e| e.to_string())?;
        if c.len() != 1 || c[0].status != WcStatus::Success {
            return Err(format!("round {i}: {c:?}"));
        }
    }
    // How long the ACK of each message's last packet waited after that packet arrived.
    let resps = tap.responses(&a, &b);
    let waits: Vec<Duration> = tap
        .requests(&a, &b)
        .iter()
        .filter(|r| r.t.bth.opcode.is_last() || r.t.bth.opcode.is_only())
        .filter_map(|r| {
            let s = resps
                .iter()
                .find(|s| is_plain_ack(&s.t) && s.psn() == r.psn())?;
            Some(s.time - r.time)
        })
        .collect();
    // The first two ACKs wait to be coalesced (they are the probes); every later one
    // leaves at the next pass (or at once, with the ACK of the message's middle that was due
    // just as its last packet came).
    let next_pass = Duration::from_nanos(1);
    let ok = waits.len() == ROUNDS as usize
        && waits[..2]
            .iter()
            .all(|&w| w > next_pass && w <= DEFAULT_ACK_COALESCE)
        && waits[2..].iter().all(|&w| w <= next_pass);
    if !ok {
        return Err(format!("len {len}, delay {delay:?}: ACK waits {waits:?}"));
    }
    Ok(())
}

#[test]
fn a_ping_pong_peer_is_found_waiting_within_three_round_trips_and_then_acked_at_the_next_pass() {
    let r = replay(
        "a_ping_pong_peer_is_found_waiting_within_three_round_trips_and_then_acked_at_the_next_pass",
    );
    for_each_seed(&r, 40, ping_pong_scenario);
}

/// The second operation of the responder-ordering test, and the response it draws.
#[derive(Debug, Clone, Copy)]
enum Second {
    /// A SEND with no receive posted: RNR NAK.
    Rnr,
    /// A READ: READ response.
    Read,
    /// A FETCH_ADD: ATOMIC ACK.
    Atomic,
    /// A WRITE with a wrong rkey: NAK Remote Access Error.
    BadKey,
    /// A SEND whose predecessor was lost: NAK PSN Sequence Error.
    Gap,
}

#[test]
fn a_held_ack_leaves_just_before_the_responses_queued_after_it() {
    for second in [
        Second::Rnr,
        Second::Read,
        Second::Atomic,
        Second::BadKey,
        Second::Gap,
    ] {
        let mut p = Pair::new(PairConfig {
            timeout: 14,
            ..PairConfig::default()
        });
        let (a, b) = (p.a, p.b);
        let tap = Tap::install(&mut p.sim);
        let receives = match second {
            Second::Rnr => 1,
            Second::Gap => 3,
            _ => 1,
        };
        for i in 0..receives {
            p.post_recv(&b, RecvWr::new(i, vec![b.sge(RECV_AT, 64)]));
        }
        p.post_send(&a, SendWr::send(1, vec![a.sge(SRC, 8)]));
        let (wr, expect) = match second {
            Second::Rnr => (
                SendWr::send(2, vec![a.sge(SRC, 8)]),
                Syndrome::RnrNak { timer: 1 },
            ),
            Second::Read => (wr_for(Kind::Read, 2, 8, &a, &b), Syndrome::ACK_NO_CREDIT),
            Second::Atomic => (
                wr_for(Kind::FetchAdd, 2, 8, &a, &b),
                Syndrome::ACK_NO_CREDIT,
            ),
            Second::BadKey => (
                SendWr::rdma_write(
                    2,
                    vec![a.sge(SRC, 8)],
                    b.addr(WRITE_AT),
                    engine::Rkey::new(b.mr.rkey.value() ^ 0x100),
                ),
                Syndrome::Nak(NakCode::RemoteAccessError),
            ),
            Second::Gap => {
                // The second SEND is lost once; the third one finds the gap.
                let mut dropped = false;
                let lost_psn = common::psn_plus(p.cfg.psn_a, 1);
                p.sim.set_filter(Box::new(move |f| {
                    let lose = common::transport_of(f.packet).is_some_and(|t| {
                        t.bth.psn.value() == lost_psn && t.bth.opcode.is_request()
                    });
                    if lose && !dropped {
                        dropped = true;
                        return Verdict::Drop;
                    }
                    Verdict::Pass
                }));
                p.post_send(&a, SendWr::send(2, vec![a.sge(SRC, 8)]));
                (
                    SendWr::send(3, vec![a.sge(SRC, 8)]),
                    Syndrome::Nak(NakCode::PsnSequenceError),
                )
            }
        };
        p.post_send(&a, wr);
        let n = if matches!(second, Second::Gap) { 3 } else { 2 };
        if matches!(second, Second::Rnr) {
            p.sim.advance(us(100)).unwrap();
            p.post_recv(&b, RecvWr::new(9, vec![b.sge(RECV_AT, 64)]));
        }
        let sc = p.wait_cq(&a, a.send_cq, n, DEADLINE).unwrap();
        let statuses: Vec<_> = sc.iter().map(|c| c.status).collect();
        let want_last = match second {
            Second::BadKey => WcStatus::RemAccessErr,
            _ => WcStatus::Success,
        };
        assert_eq!(statuses[0], WcStatus::Success, "{second:?}: {sc:?}");
        assert_eq!(statuses[n - 1], want_last, "{second:?}: {sc:?}");
        let resps = tap.responses(&a, &b);
        let psn0 = Psn::new(p.cfg.psn_a);
        let (ack, next) = (&resps[0], &resps[1]);
        assert!(
            is_plain_ack(&ack.t) && ack.psn() == psn0,
            "{second:?}: first response {:?}",
            ack.t
        );
        assert_eq!(next.psn(), psn0.next(), "{second:?}: {:?}", next.t);
        assert_eq!(
            next.t.aeth.map(|a| a.syndrome),
            Some(expect),
            "{second:?}: {:?}",
            next.t
        );
        // It did not wait out its delay: the response behind it sent it.
        let arrived = tap.requests(&a, &b)[0].time;
        assert!(
            ack.time == next.time && ack.time < arrived + DEFAULT_ACK_COALESCE,
            "{second:?}: ACK at {:?}, next response at {:?}, request at {arrived:?}",
            ack.time,
            next.time
        );
    }
}

/// What the responder's application does right after the receive.
#[derive(Debug, Clone, Copy)]
enum Then {
    Destroy,
    Reset,
    Error,
    /// The host stops: `flush_acks`.
    Flush,
}

#[test]
fn a_qp_destroyed_reset_or_errored_right_after_a_receive_still_acknowledges_it() {
    for then in [Then::Destroy, Then::Reset, Then::Error, Then::Flush] {
        let mut p = Pair::new(PairConfig {
            timeout: 14,
            ..PairConfig::default()
        });
        let (a, b) = (p.a, p.b);
        let tap = Tap::install(&mut p.sim);
        p.post_recv(&b, RecvWr::new(1, vec![b.sge(RECV_AT, 64)]));
        p.post_send(&a, SendWr::send(1, vec![a.sge(SRC, 8)]));
        p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
        let at = p.sim.now();
        assert!(tap.responses(&a, &b).is_empty(), "{then:?}: the ACK waits");
        let qpn = b.qpn;
        let e = p.engine(&b);
        match then {
            Then::Destroy => e.destroy_qp(qpn).unwrap(),
            Then::Reset | Then::Error => {
                let state = match then {
                    Then::Reset => QpState::Reset,
                    _ => QpState::Err,
                };
                let attr = QpAttr {
                    qp_state: state,
                    ..QpAttr::default()
                };
                e.modify_qp(qpn, &attr, QpAttrMask::STATE).unwrap();
            }
            Then::Flush => e.flush_acks(),
        }
        let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
        assert_eq!(sc[0].status, WcStatus::Success, "{then:?}");
        let resps = tap.responses(&a, &b);
        assert!(
            resps.len() == 1 && is_plain_ack(&resps[0].t) && resps[0].time == at,
            "{then:?}: {resps:?}"
        );
        assert_eq!(
            p.sim
                .node(b.node)
                .engine
                .counters()
                .get(Counter::RespAcksSent),
            1
        );
    }
}

#[test]
fn a_port_that_is_down_keeps_its_acks_without_asking_for_a_wakeup() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let now = common::instant(Duration::ZERO);
    let mut buf = vec![0u8; 8192];
    p.post_recv(&b, RecvWr::new(1, vec![b.sge(RECV_AT, 64)]));
    p.post_send(&a, SendWr::send(1, vec![a.sge(SRC, 8)]));
    let t = p.engine(&a).poll_transmit(now, &mut buf).unwrap();
    let send = buf[..t.len].to_vec();
    let e = p.engine(&b);
    e.handle_datagram(now, &send);
    let due = e.poll_timeout().expect("the ACK's deadline");
    e.set_port_state(engine::PortState::Down);
    // Nothing can leave: a host that slept until the deadline would only spin.
    assert_eq!(e.poll_timeout(), None);
    assert!(e.poll_transmit(due, &mut buf).is_none());
    e.set_port_state(engine::PortState::Active);
    assert_eq!(e.poll_timeout(), Some(due));
    let t = e.poll_transmit(due, &mut buf).unwrap();
    assert!(is_plain_ack(&common::transport_of(&buf[..t.len]).unwrap()));
}
