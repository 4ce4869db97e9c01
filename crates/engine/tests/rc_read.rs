//! RC RDMA READ: multi-packet responses, partial retry, and the max_rd_atomic limit.

mod common;

use core::time::Duration;
use std::cell::Cell;
use std::rc::Rc;

use common::{pattern, psn_plus, transport_of, Pair, PairConfig, Wiretap, OWNER};
use engine::{PathMtu, SendWr, WcOpcode, WcStatus};
use wire::OpKind;

const DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn rdma_read_fetches_remote_bytes_into_local_sges() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let data = pattern(20, 7000);
    p.mem(&b).set(OWNER, b.addr(5000), &data);
    p.post_send(
        &a,
        SendWr::rdma_read(
            1,
            vec![a.sge(0, 1000), a.sge(20_000, 6000)],
            b.addr(5000),
            b.mr.rkey,
        ),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode),
        (1, WcStatus::Success, WcOpcode::RdmaRead)
    );
    assert_eq!(sc[0].byte_len, 7000);
    let m = p.mem(&a);
    assert_eq!(m.get(OWNER, a.addr(0), 1000), data[..1000]);
    assert_eq!(m.get(OWNER, a.addr(20_000), 6000), data[1000..]);
    assert_eq!(m.get(OWNER, a.addr(1000), 1), vec![0]);
}

#[test]
fn zero_length_rdma_read_completes() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.post_send(&a, SendWr::rdma_read(2, vec![], b.addr(0), b.mr.rkey));
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].byte_len),
        (2, WcStatus::Success, 0)
    );
}

#[test]
fn a_lost_middle_read_response_is_requested_again_from_that_packet_on() {
    let cfg = PairConfig {
        mtu: PathMtu::Mtu256,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg.clone());
    let (a, b) = (p.a, p.b);
    let tap = Wiretap::install(&mut p.sim);
    let lost = psn_plus(cfg.psn_a, 4);
    let dropped = Rc::new(Cell::new(false));
    let d2 = Rc::clone(&dropped);
    let bn = b.node;
    p.sim.set_filter(Box::new(move |f| {
        let t = transport_of(f.packet);
        if f.from == bn
            && !d2.get()
            && t.is_some_and(|t| {
                t.bth.opcode.kind() == OpKind::RdmaReadResponse && t.bth.psn.value() == lost
            })
        {
            d2.set(true);
            return sim::Verdict::Drop;
        }
        sim::Verdict::Pass
    }));
    let data = pattern(21, 2560);
    p.mem(&b).set(OWNER, b.addr(0), &data);
    p.post_send(
        &a,
        SendWr::rdma_read(3, vec![a.sge(0, 2560)], b.addr(0), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert!(dropped.get());
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].byte_len),
        (3, WcStatus::Success, 2560)
    );
    assert_eq!(p.mem(&a).get(OWNER, a.addr(0), 2560), data);
    // The second READ request asks for the rest only: from PSN + 4, address + 4 × 256.
    let reqs: Vec<_> = tap
        .seen
        .borrow()
        .iter()
        .filter(|s| s.from == a.node && s.t.bth.opcode.kind() == OpKind::RdmaReadRequest)
        .map(|s| s.t)
        .collect();
    assert_eq!(reqs.len(), 2, "one retry: {reqs:?}");
    let retry = reqs[1];
    assert_eq!(retry.bth.psn.value(), lost);
    let reth = retry.reth.expect("a READ request carries a RETH");
    assert_eq!(reth.va, b.addr(4 * 256));
    assert_eq!(reth.dma_len, 2560 - 4 * 256);
}

#[test]
fn reads_beyond_max_rd_atomic_wait_their_turn_and_all_complete_in_order() {
    let cfg = PairConfig {
        max_rd_atomic: 1,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let tap = Wiretap::install(&mut p.sim);
    for i in 0..6u64 {
        p.mem(&b)
            .set(OWNER, b.addr(i * 10_000), &pattern(30 + i, 3000));
        p.post_send(
            &a,
            SendWr::rdma_read(
                i,
                vec![a.sge(i * 10_000, 3000)],
                b.addr(i * 10_000),
                b.mr.rkey,
            ),
        );
    }
    let sc = p.wait_cq(&a, a.send_cq, 6, DEADLINE).unwrap();
    assert_eq!(
        sc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..6).collect::<Vec<_>>()
    );
    for i in 0..6u64 {
        assert_eq!(sc[i as usize].status, WcStatus::Success);
        assert_eq!(
            p.mem(&a).get(OWNER, a.addr(i * 10_000), 3000),
            pattern(30 + i, 3000)
        );
    }
    // With one outstanding READ allowed, each request leaves only after the previous READ's
    // last response arrived.
    let seen = tap.seen.borrow();
    let mut outstanding = 0i32;
    for s in seen.iter() {
        match s.t.bth.opcode.kind() {
            OpKind::RdmaReadRequest if s.from == a.node => {
                outstanding += 1;
                assert!(
                    outstanding <= 1,
                    "two READs outstanding with max_rd_atomic 1"
                );
            }
            OpKind::RdmaReadResponse if s.t.bth.opcode.is_last() || s.t.bth.opcode.is_only() => {
                outstanding -= 1;
            }
            _ => {}
        }
    }
}
