//! RC RDMA WRITE and WRITE with immediate, including a partial retry in a long WRITE.

mod common;

use core::time::Duration;
use std::cell::Cell;
use std::rc::Rc;

use common::{pattern, psn_plus, transport_of, Pair, PairConfig, Wiretap, OWNER};
use engine::{Counter, PathMtu, RecvWr, SendOp, SendWr, WcFlags, WcOpcode, WcStatus};
use wire::OpKind;

const DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn rdma_write_places_bytes_at_the_remote_address_and_completes() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let data = pattern(10, 3000);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 3000)], b.addr(1000), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode),
        (1, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    let m = p.mem(&b);
    assert_eq!(m.get(OWNER, b.addr(1000), 3000), data);
    assert_eq!(
        m.get(OWNER, b.addr(999), 1),
        vec![0],
        "the byte before is untouched"
    );
    assert_eq!(
        m.get(OWNER, b.addr(4000), 1),
        vec![0],
        "the byte after is untouched"
    );
    assert!(
        p.poll(&b, b.recv_cq).is_empty(),
        "a plain WRITE consumes no receive"
    );
}

#[test]
fn rdma_write_with_immediate_consumes_a_receive_and_carries_the_immediate() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let data = pattern(11, 2500);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    p.post_recv(&b, RecvWr::new(70, vec![]));
    p.post_send(
        &a,
        SendWr::new(
            2,
            SendOp::RdmaWriteWithImm {
                remote_addr: b.addr(64),
                rkey: b.mr.rkey,
                imm: 0x1234_5678,
            },
            vec![a.sge(0, 2500)],
        ),
    );
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].opcode),
        (70, WcStatus::Success, WcOpcode::RecvRdmaWithImm)
    );
    assert!(rc[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(rc[0].imm_data, 0x1234_5678);
    assert_eq!(rc[0].byte_len, 2500);
    assert_eq!(p.mem(&b).get(OWNER, b.addr(64), 2500), data);
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
}

#[test]
fn zero_length_rdma_write_completes_without_touching_memory() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.post_send(&a, SendWr::rdma_write(3, vec![], b.addr(0), b.mr.rkey));
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((sc[0].wr_id, sc[0].status), (3, WcStatus::Success));
    assert!(p
        .mem(&b)
        .get(OWNER, b.addr(0), 4096)
        .iter()
        .all(|&x| x == 0));
}

#[test]
fn a_lost_middle_packet_of_a_write_is_resent_from_that_packet_on() {
    let cfg = PairConfig {
        mtu: PathMtu::Mtu256,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg.clone());
    let (a, b) = (p.a, p.b);
    let tap = Wiretap::install(&mut p.sim);
    // Drop the first transmission of the fifth packet (PSN + 4) of a ten-packet WRITE.
    let lost = psn_plus(cfg.psn_a, 4);
    let dropped = Rc::new(Cell::new(false));
    let d2 = Rc::clone(&dropped);
    let an = a.node;
    p.sim.set_filter(Box::new(move |f| {
        let t = transport_of(f.packet);
        if f.from == an && !d2.get() && t.is_some_and(|t| t.bth.psn.value() == lost) {
            d2.set(true);
            return sim::Verdict::Drop;
        }
        sim::Verdict::Pass
    }));
    let data = pattern(12, 2560);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    p.post_send(
        &a,
        SendWr::rdma_write(4, vec![a.sge(0, 2560)], b.addr(0), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((sc[0].wr_id, sc[0].status), (4, WcStatus::Success));
    assert!(dropped.get());
    assert_eq!(p.mem(&b).get(OWNER, b.addr(0), 2560), data);
    let sent = tap.psns(a.node, cfg.psn_a, |o| o.kind() == OpKind::RdmaWrite);
    assert_eq!(&sent[..10], &(0..10).collect::<Vec<_>>()[..]);
    assert_eq!(
        sent[10], 4,
        "go-back-N restarts at the lost packet, not at the message start"
    );
    assert!(
        sent[10..].iter().all(|&x| x >= 4),
        "packets before the loss are not resent: {sent:?}"
    );
    // The responder asked for it with one PSN sequence error NAK.
    let naks = p.engine(&b).counters().get(Counter::RespSeqErrNakSent);
    assert_eq!(naks, 1);
}

#[test]
fn writes_and_sends_interleave_in_post_order() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    for i in 0..20u64 {
        p.mem(&a)
            .set(OWNER, a.addr(i * 8192), &pattern(100 + i, 5000));
        if i % 2 == 0 {
            p.post_recv(&b, RecvWr::new(i, vec![b.sge(i * 8192, 8192)]));
            p.post_send(&a, SendWr::send(i, vec![a.sge(i * 8192, 5000)]));
        } else {
            p.post_send(
                &a,
                SendWr::rdma_write(i, vec![a.sge(i * 8192, 5000)], b.addr(i * 8192), b.mr.rkey),
            );
        }
    }
    let sc = p.wait_cq(&a, a.send_cq, 20, DEADLINE).unwrap();
    assert_eq!(
        sc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );
    assert!(sc.iter().all(|c| c.status == WcStatus::Success));
    for i in 0..20u64 {
        assert_eq!(
            p.mem(&b).get(OWNER, b.addr(i * 8192), 5000),
            pattern(100 + i, 5000)
        );
    }
}

#[test]
fn a_sixteen_mebibyte_write_arrives_intact() {
    let len = 16 << 20;
    let cfg = PairConfig {
        mtu: PathMtu::Mtu4096,
        mem_len: len + 4096,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let data = pattern(13, len);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, len as u32)], b.addr(0), b.mr.rkey),
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((sc[0].wr_id, sc[0].status), (1, WcStatus::Success));
    assert!(p.mem(&b).get(OWNER, b.addr(0), len) == data);
}
