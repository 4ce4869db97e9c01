//! The randomized mixed-service sweep: RC (receiving from an SRQ, writing partly through a
//! type 2 memory window), UC and UD traffic at once between two engines, over seeds × loss
//! {0, 1 %, 5 %, 10 %} × duplication × reordering × corruption, with an SRQ that may start
//! short (RC waits on RNR NAKs, UD datagrams are dropped) and is replenished later.
//!
//! Invariants checked for every scenario:
//! - RC: every WR succeeds; every SEND lands exactly once, in order, intact, in a WQE of the
//!   SRQ; every WRITE's bytes are exact;
//! - UC: every WR completes (with success) when sent; what arrives is intact, in order and
//!   never twice, each receive carrying exactly one whole message; a WRITE with immediate
//!   that completes has all its bytes; without loss or reordering everything arrives;
//! - UD: every WR completes when sent; what arrives is a whole datagram behind a 40-byte GRH
//!   naming the sender's QP, never corrupted; without faults every datagram arrives in order;
//! - every receive WQE is used at most once, and nothing hangs.
//!
//! A failure prints the seed and the replay command (`SOFTRDMA_SEED=n`); `SOFTRDMA_SOAK_SEEDS=N`
//! runs N fresh seeds.

mod common;

use core::time::Duration;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use common::*;
use engine::{
    PathMtu, QpType, RecvWr, SendOp, SendWr, SrqAttr, UdDest, WcFlags, WcOpcode, WcStatus,
    WorkCompletion, GRH_LEN,
};
use sim::seeds::{for_each_seed, Replay};
use sim::{LinkConfig, NetConfig, Rng, Sim};

const DEFAULT_SEEDS: u64 = 64;

/// Totals over the run: RC receives completed, UC messages sent / delivered, UD datagrams sent /
/// delivered, RNR NAKs sent by B, UC messages given up by B.
static TALLY: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];
const LOSS: [f64; 4] = [0.0, 0.01, 0.05, 0.10];
const QKEY: u32 = 0x0bad_cafe;
/// Bytes of each receive buffer (largest message + GRH fits).
const SLOT: u64 = 8192 + 64;

#[test]
fn rc_uc_ud_and_srq_traffic_mixed_under_faults() {
    let replay = Replay::new(
        "softrdma-engine",
        "sweep_mixed",
        "rc_uc_ud_and_srq_traffic_mixed_under_faults",
    );
    let n = for_each_seed(&replay, DEFAULT_SEEDS, scenario);
    let t: Vec<u64> = TALLY.iter().map(|a| a.load(Relaxed)).collect();
    eprintln!(
        "sweep_mixed: {n} scenarios; RC receives {}; UC {} of {} arrived; UD {} of {} arrived; \
         {} RNR NAKs; {} UC messages given up",
        t[0], t[2], t[1], t[4], t[3], t[5], t[6]
    );
    assert!(
        n < 8 || (t[0] > 0 && t[2] > 0 && t[4] > 0),
        "the sweep moved nothing"
    );
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    RcSend,
    RcWrite,
    RcWriteImm,
    UcSend,
    UcWriteImm,
    UdSend,
}

#[derive(Debug, Clone)]
struct Msg {
    kind: Kind,
    /// Sequence number within its service (RC, UC, UD).
    seq: u64,
    len: usize,
    /// Source offset in A's memory.
    src: u64,
    /// WRITE: destination offset in B's memory.
    dst: u64,
}

/// The bytes of message `seq` of `kind`: a 16-byte header naming it (when it fits) and
/// pseudo-random bytes.
fn body(seed: u64, kind: Kind, seq: u64, len: usize) -> Vec<u8> {
    let mut v = pattern(seed ^ (seq << 8) ^ kind as u64, len);
    if len >= 16 {
        v[..8].copy_from_slice(&(kind as u64).to_le_bytes());
        v[8..16].copy_from_slice(&seq.to_le_bytes());
    }
    v
}

#[test]
fn the_same_seed_replays_the_mixed_run_packet_for_packet() {
    let replay = Replay::new(
        "softrdma-engine",
        "sweep_mixed",
        "the_same_seed_replays_the_mixed_run_packet_for_packet",
    );
    for_each_seed(&replay, 3, |seed| {
        let (first, second) = (run(seed)?, run(seed)?);
        if first == second {
            Ok(())
        } else {
            Err(format!("trace hashes differ: {first:#x} vs {second:#x}"))
        }
    });
}

fn scenario(seed: u64) -> Result<(), String> {
    run(seed).map(|_| ())
}

/// One scenario; returns the sim's trace hash (every packet event of the run).
fn run(seed: u64) -> Result<u64, String> {
    let mut rng = Rng::new(seed);
    let loss = LOSS[(seed % 4) as usize];
    let dup = if seed / 4 % 2 == 1 { 0.02 } else { 0.0 };
    let reorder = if seed / 8 % 2 == 1 { 0.02 } else { 0.0 };
    let corrupt = if seed / 16 % 2 == 1 { 0.01 } else { 0.0 };
    let link = LinkConfig::perfect(Duration::from_micros(5))
        .with_loss(loss)
        .with_duplicate(dup)
        .with_reorder(reorder, Duration::from_micros(30))
        .with_corrupt(corrupt, 3);
    let faults = loss > 0.0 || dup > 0.0 || reorder > 0.0 || corrupt > 0.0;
    let mtu = [PathMtu::Mtu1024, PathMtu::Mtu2048, PathMtu::Mtu4096][rng.below(3) as usize];
    let mut sim = Sim::new(seed, NetConfig::with_link(link));
    let a = add_host4(&mut sim, 1, seed, 8 << 20);
    let b = add_host4(&mut sim, 2, seed, 8 << 20);

    // B: an SRQ feeding the RC QP and the UD QP; the UC QP has its own receive queue.
    let eb = &mut sim.node_mut(b.node).engine;
    let srq = eb
        .create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 1024,
                max_sge: 2,
                srq_limit: 0,
            },
        )
        .map_err(|e| e.to_string())?;
    let rc_b = new_qp4(eb, b.pd, QpType::Rc, 512, Some(srq), None);
    let ud_b = new_qp4(
        eb,
        b.pd,
        QpType::Ud,
        512,
        Some(srq),
        Some((rc_b.send_cq, rc_b.recv_cq)),
    );
    let uc_b = new_qp4(eb, b.pd, QpType::Uc, 512, None, None);
    ud_up(eb, ud_b.qpn, QKEY);
    let ea = &mut sim.node_mut(a.node).engine;
    let rc_a = new_qp4(ea, a.pd, QpType::Rc, 512, None, None);
    let uc_a = new_qp4(ea, a.pd, QpType::Uc, 512, None, None);
    let ud_a = new_qp4(ea, a.pd, QpType::Ud, 512, None, None);
    ud_up(ea, ud_a.qpn, QKEY);
    let ah = ah4(ea, a.pd, b.ip);
    let psn = rng.below(1 << 24) as u32;
    connect4(
        ea,
        QpType::Rc,
        rc_a.qpn,
        b.ip,
        rc_b.qpn,
        mtu,
        psn,
        psn ^ 0x80_0000,
    );
    connect4(
        ea,
        QpType::Uc,
        uc_a.qpn,
        b.ip,
        uc_b.qpn,
        mtu,
        psn ^ 0x40_0000,
        psn,
    );
    let eb = &mut sim.node_mut(b.node).engine;
    connect4(
        eb,
        QpType::Rc,
        rc_b.qpn,
        a.ip,
        rc_a.qpn,
        mtu,
        psn ^ 0x80_0000,
        psn,
    );
    connect4(
        eb,
        QpType::Uc,
        uc_b.qpn,
        a.ip,
        uc_a.qpn,
        mtu,
        psn,
        psn ^ 0x40_0000,
    );
    // A type 2 window over the WRITE destinations, bound on B's RC QP: every other RC WRITE
    // goes through it (and its retransmissions are checked against it again).
    let mw = eb
        .alloc_mw(b.pd, engine::MwType::Type2)
        .map_err(|e| e.to_string())?;
    let mw_rkey = engine::inc_rkey(mw.rkey);
    let bind = engine::MwBind {
        mr: b.mr.handle,
        addr: b.addr(0x40_0000),
        length: 0x40_0000,
        access: engine::AccessFlags::REMOTE_WRITE,
    };
    eb.post_send(
        rc_b.qpn,
        SendWr::bind_mw(u64::MAX, mw.handle, mw_rkey, bind).signaled(false),
    )
    .map_err(|e| e.to_string())?;

    // The traffic.
    let n = 40 + rng.below(120) as usize;
    let mut msgs = Vec::new();
    let mut seqs = [0u64; 3];
    let mut src = 0u64;
    let mut dst = 0x40_0000u64;
    for _ in 0..n {
        let kind = match rng.below(11) {
            0..=2 => Kind::RcSend,
            3 => Kind::RcWrite,
            4 => Kind::RcWriteImm,
            5..=6 => Kind::UcSend,
            7 => Kind::UcWriteImm,
            _ => Kind::UdSend,
        };
        let max = match kind {
            Kind::UdSend => 4096,
            _ => 8192,
        };
        let len = 16 + rng.below(max - 16 + 1) as usize;
        let svc = match kind {
            Kind::RcSend | Kind::RcWrite | Kind::RcWriteImm => 0,
            Kind::UcSend | Kind::UcWriteImm => 1,
            Kind::UdSend => 2,
        };
        let seq = seqs[svc];
        seqs[svc] += 1;
        let m = Msg {
            kind,
            seq,
            len,
            src,
            dst,
        };
        sim.node(a.node)
            .mem
            .set(OWNER, a.addr(src), &body(seed, kind, seq, len));
        src += 8192;
        if matches!(kind, Kind::RcWrite | Kind::RcWriteImm | Kind::UcWriteImm) {
            dst += 8192;
        }
        msgs.push(m);
    }
    let srq_needed = msgs
        .iter()
        .filter(|m| matches!(m.kind, Kind::RcSend | Kind::RcWriteImm | Kind::UdSend))
        .count() as u64;
    let uc_needed = msgs
        .iter()
        .filter(|m| matches!(m.kind, Kind::UcSend | Kind::UcWriteImm))
        .count() as u64;
    // Receive buffers: SRQ WQEs from slot 0, UC WQEs after them. Duplicated datagrams
    // consume WQEs too: the SRQ gets one spare per datagram, so RC never starves for good.
    let srq_total = srq_needed + seqs[2];
    let short = rng.chance(0.5);
    let first_batch = if short { srq_total / 3 } else { srq_total };
    let post_srq = |sim: &mut Sim<Host>, from: u64, to: u64| -> Result<(), String> {
        for i in from..to {
            let wr = RecvWr::new(i, vec![b.sge(i * SLOT, SLOT as u32)]);
            sim.node_mut(b.node)
                .engine
                .post_srq_recv(srq, wr)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    post_srq(&mut sim, 0, first_batch)?;
    for i in 0..uc_needed {
        let slot = srq_total + i;
        let wr = RecvWr::new(slot, vec![b.sge(slot * SLOT, SLOT as u32)]);
        sim.node_mut(b.node)
            .engine
            .post_recv(uc_b.qpn, wr)
            .map_err(|e| e.to_string())?;
    }
    for (i, m) in msgs.iter().enumerate() {
        let sge = vec![a.sge(m.src, m.len as u32)];
        let id = i as u64;
        let e = &mut sim.node_mut(a.node).engine;
        let r = match m.kind {
            Kind::RcSend => e.post_send(rc_a.qpn, SendWr::send(id, sge)),
            Kind::RcWrite => e.post_send(
                rc_a.qpn,
                SendWr::rdma_write(
                    id,
                    sge,
                    b.addr(m.dst),
                    if m.seq % 2 == 0 { mw_rkey } else { b.mr.rkey },
                ),
            ),
            Kind::RcWriteImm => e.post_send(
                rc_a.qpn,
                SendWr::new(
                    id,
                    SendOp::RdmaWriteWithImm {
                        remote_addr: b.addr(m.dst),
                        rkey: if m.seq % 2 == 0 { mw_rkey } else { b.mr.rkey },
                        imm: m.seq as u32,
                    },
                    sge,
                ),
            ),
            Kind::UcSend => e.post_send(uc_a.qpn, SendWr::send(id, sge)),
            Kind::UcWriteImm => e.post_send(
                uc_a.qpn,
                SendWr::new(
                    id,
                    SendOp::RdmaWriteWithImm {
                        remote_addr: b.addr(m.dst),
                        rkey: b.mr.rkey,
                        imm: m.seq as u32,
                    },
                    sge,
                ),
            ),
            Kind::UdSend => e.post_send_ud(
                ud_a.qpn,
                SendWr::new(id, SendOp::SendWithImm { imm: m.seq as u32 }, sge),
                UdDest {
                    ah,
                    remote_qpn: engine::Qpn::new(ud_b.qpn),
                    remote_qkey: 0x8000_0000,
                },
            ),
        };
        r.map_err(|e| format!("post {i} {:?}: {e}", m.kind))?;
    }
    if short {
        let _ = sim.run_until(|_| false, sim.now() + Duration::from_millis(1));
        post_srq(&mut sim, first_batch, srq_total)?;
    }
    let rc_count = seqs[0] as usize;
    let deadline = sim.now() + Duration::from_secs(20);
    let _ = sim.run_until(
        |s| {
            let e = &s.node(a.node).engine;
            e.cq_len(rc_a.send_cq).unwrap_or(0) >= rc_count
                && e.cq_len(uc_a.send_cq).unwrap_or(0) >= seqs[1] as usize
                && e.cq_len(ud_a.send_cq).unwrap_or(0) >= seqs[2] as usize
        },
        deadline,
    );
    // Let the last unreliable packets arrive.
    let _ = sim.run_until(|_| false, sim.now() + Duration::from_millis(5));

    let poll = |sim: &mut Sim<Host>, node, cq| -> Vec<WorkCompletion> {
        sim.node_mut(node)
            .engine
            .poll_cq(cq, usize::MAX)
            .unwrap_or_default()
    };
    // Requesters: every WR completes once, in order, with success.
    for (qp, kinds) in [
        (rc_a, &[Kind::RcSend, Kind::RcWrite, Kind::RcWriteImm][..]),
        (uc_a, &[Kind::UcSend, Kind::UcWriteImm][..]),
        (ud_a, &[Kind::UdSend][..]),
    ] {
        let want: Vec<u64> = (0..msgs.len() as u64)
            .filter(|&i| kinds.contains(&msgs[i as usize].kind))
            .collect();
        let got = poll(&mut sim, a.node, qp.send_cq);
        let ids: Vec<u64> = got.iter().map(|w| w.wr_id).collect();
        if ids != want {
            return Err(format!(
                "{kinds:?}: send completions {ids:?}, want {want:?}"
            ));
        }
        if let Some(w) = got.iter().find(|w| w.status != WcStatus::Success) {
            return Err(format!("{kinds:?}: WR {} ended {:?}", w.wr_id, w.status));
        }
    }
    let mem = sim.node(b.node).mem.clone();
    let by_seq = |kind: Kind, seq: u64| msgs.iter().find(|m| m.kind == kind && m.seq == seq);
    let mut used = BTreeSet::new();

    // B's SRQ completions: RC sends exactly once in order; UD datagrams intact.
    let srq_wcs = poll(&mut sim, b.node, rc_b.recv_cq);
    let mut rc_next = 0u64;
    let mut ud_seen: BTreeMap<u64, u32> = BTreeMap::new();
    let mut ud_last = None;
    for wc in &srq_wcs {
        if !used.insert(wc.wr_id) || wc.wr_id >= srq_total {
            return Err(format!("WQE {} used twice or not an SRQ WQE", wc.wr_id));
        }
        if wc.status != WcStatus::Success {
            return Err(format!("SRQ receive {} ended {:?}", wc.wr_id, wc.status));
        }
        let at = b.addr(wc.wr_id * SLOT);
        if wc.qp_num.value() == rc_b.qpn {
            // RC receives (SENDs and WRITEs with immediate) complete in posting order.
            let (kind, seq) = if wc.opcode == WcOpcode::RecvRdmaWithImm {
                (Kind::RcWriteImm, u64::from(wc.imm_data))
            } else {
                let buf = mem.get(OWNER, at, wc.byte_len.max(16) as usize);
                (
                    Kind::RcSend,
                    u64::from_le_bytes(buf[8..16].try_into().unwrap_or_default()),
                )
            };
            let want = msgs
                .iter()
                .filter(|m| matches!(m.kind, Kind::RcSend | Kind::RcWriteImm))
                .nth(rc_next as usize)
                .map(|m| (m.kind, m.seq));
            if Some((kind, seq)) != want {
                return Err(format!("RC {kind:?} {seq} arrived, expected {want:?}"));
            }
            rc_next += 1;
            let m = by_seq(kind, seq).ok_or(format!("RC receive of unknown seq {seq}"))?;
            if wc.byte_len as usize != m.len {
                return Err(format!("RC {kind:?} {seq}: byte_len {}", wc.byte_len));
            }
            let data = match kind {
                Kind::RcSend => mem.get(OWNER, at, m.len),
                _ => mem.get(OWNER, b.addr(m.dst), m.len),
            };
            if data != body(seed, kind, seq, m.len) {
                return Err(format!("RC {kind:?} {seq} corrupted"));
            }
        } else if wc.qp_num.value() == ud_b.qpn {
            if !wc.wc_flags.contains(WcFlags::GRH) || wc.src_qp.value() != ud_a.qpn {
                return Err(format!("UD completion without GRH / source QP: {wc:?}"));
            }
            let m = by_seq(Kind::UdSend, u64::from(wc.imm_data))
                .ok_or(format!("UD immediate {} names no datagram", wc.imm_data))?;
            if wc.byte_len as usize != GRH_LEN + m.len {
                return Err(format!("UD {} byte_len {}", m.seq, wc.byte_len));
            }
            let grh = mem.get(OWNER, at, GRH_LEN);
            if grh[20] != 0x45 || grh[20 + 12..20 + 16] != [10, 0, 0, 1] {
                return Err(format!("UD {} GRH {grh:?}", m.seq));
            }
            if mem.get(OWNER, at + GRH_LEN as u64, m.len) != body(seed, Kind::UdSend, m.seq, m.len)
            {
                return Err(format!("UD datagram {} corrupted", m.seq));
            }
            *ud_seen.entry(m.seq).or_default() += 1;
            if dup == 0.0 && reorder == 0.0 {
                if ud_last.is_some_and(|l| m.seq <= l) {
                    return Err(format!("UD {} after {ud_last:?} without reordering", m.seq));
                }
                ud_last = Some(m.seq);
            }
        } else {
            return Err(format!("SRQ completion for QP {}", wc.qp_num));
        }
    }
    if rc_next != seqs[0] - msgs.iter().filter(|m| m.kind == Kind::RcWrite).count() as u64 {
        return Err(format!("{rc_next} RC receives completed"));
    }
    if !faults && !short && ud_seen.len() as u64 != seqs[2] {
        return Err(format!(
            "{} of {} datagrams arrived without faults",
            ud_seen.len(),
            seqs[2]
        ));
    }
    for m in msgs.iter().filter(|m| m.kind == Kind::RcWrite) {
        if mem.get(OWNER, b.addr(m.dst), m.len) != body(seed, Kind::RcWrite, m.seq, m.len) {
            return Err(format!("RC write {} bytes differ", m.seq));
        }
    }

    // B's UC completions: whole messages, in order, never twice.
    let uc_wcs = poll(&mut sim, b.node, uc_b.recv_cq);
    let mut uc_last: Option<u64> = None;
    for wc in &uc_wcs {
        if !used.insert(wc.wr_id) || wc.wr_id < srq_total {
            return Err(format!("UC WQE {} used twice or not the UC QP's", wc.wr_id));
        }
        if wc.status != WcStatus::Success {
            return Err(format!("UC receive {} ended {:?}", wc.wr_id, wc.status));
        }
        let m = if wc.opcode == WcOpcode::RecvRdmaWithImm {
            let m = by_seq(Kind::UcWriteImm, u64::from(wc.imm_data))
                .ok_or(format!("UC imm {} names no write", wc.imm_data))?;
            if mem.get(OWNER, b.addr(m.dst), m.len) != body(seed, Kind::UcWriteImm, m.seq, m.len) {
                return Err(format!("UC write {} completed but its bytes differ", m.seq));
            }
            m
        } else {
            let buf = mem.get(OWNER, b.addr(wc.wr_id * SLOT), wc.byte_len as usize);
            let seq = u64::from_le_bytes(buf[8..16].try_into().unwrap_or_default());
            let m = by_seq(Kind::UcSend, seq).ok_or(format!("UC receive of unknown seq {seq}"))?;
            if buf != body(seed, Kind::UcSend, seq, m.len) {
                return Err(format!(
                    "UC send {seq} arrived torn or stale ({} bytes)",
                    wc.byte_len
                ));
            }
            m
        };
        if uc_last.is_some_and(|l| m.seq <= l) {
            return Err(format!("UC {} after {uc_last:?}", m.seq));
        }
        uc_last = Some(m.seq);
    }
    if loss == 0.0 && reorder == 0.0 && corrupt == 0.0 && uc_wcs.len() as u64 != uc_needed {
        return Err(format!(
            "{} of {uc_needed} UC messages arrived without loss",
            uc_wcs.len()
        ));
    }
    if sim.node(b.node).engine.query_mw(mw.handle) != Ok((mw_rkey, true)) {
        return Err("the window over the WRITE destinations is not bound".into());
    }
    let c = sim.node(b.node).engine.counters();
    for (i, v) in [
        rc_next,
        uc_needed,
        uc_wcs.len() as u64,
        seqs[2],
        ud_seen.values().map(|&n| u64::from(n)).sum(),
        c.get(engine::Counter::RespRnrNakSent),
        c.get(engine::Counter::UcMessageDropped),
    ]
    .into_iter()
    .enumerate()
    {
        TALLY[i].fetch_add(v, Relaxed);
    }
    Ok(sim.trace_hash())
}
