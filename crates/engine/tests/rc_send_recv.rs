//! RC SEND and SEND with immediate, over a perfect network.

mod common;

use core::time::Duration;

use common::{pattern, Pair, PairConfig, OWNER};
use engine::{QpState, RecvWr, SendOp, SendWr, WcFlags, WcOpcode, WcStatus};

const DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn send_only_delivers_bytes_and_completes_both_sides() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let data = pattern(1, 100);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    p.post_recv(&b, RecvWr::new(77, vec![b.sge(0, 4096)]));
    p.post_send(&a, SendWr::send(5, vec![a.sge(0, 100)]));

    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(sc.len(), 1);
    assert_eq!(
        (sc[0].wr_id, sc[0].status, sc[0].opcode),
        (5, WcStatus::Success, WcOpcode::Send)
    );
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!(rc.len(), 1);
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].opcode),
        (77, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(rc[0].byte_len, 100);
    assert_eq!(p.mem(&b).get(OWNER, b.addr(0), 100), data);
    assert_eq!(p.qp_state(&a), QpState::Rts);
}

#[test]
fn multi_packet_send_with_immediate_reassembles_across_sges() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    // 10 000 bytes at MTU 1024: ten packets, gathered from two SGEs, scattered into three.
    let data = pattern(2, 10_000);
    p.mem(&a).set(OWNER, a.addr(0), &data[..6000]);
    p.mem(&a).set(OWNER, a.addr(100_000), &data[6000..]);
    p.post_recv(
        &b,
        RecvWr::new(
            1,
            vec![b.sge(0, 3000), b.sge(50_000, 3000), b.sge(90_000, 5000)],
        ),
    );
    p.post_send(
        &a,
        SendWr::new(
            9,
            SendOp::SendWithImm { imm: 0xdead_beef },
            vec![a.sge(0, 6000), a.sge(100_000, 4000)],
        ),
    );
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!(rc[0].status, WcStatus::Success);
    assert_eq!(rc[0].byte_len, 10_000);
    assert!(rc[0].wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(rc[0].imm_data, 0xdead_beef);
    let m = p.mem(&b);
    let mut got = m.get(OWNER, b.addr(0), 3000);
    got.extend(m.get(OWNER, b.addr(50_000), 3000));
    got.extend(m.get(OWNER, b.addr(90_000), 4000));
    assert_eq!(got, data);
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((sc[0].wr_id, sc[0].status), (9, WcStatus::Success));
}

#[test]
fn zero_length_send_consumes_a_receive_and_completes() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.post_recv(&b, RecvWr::new(3, vec![b.sge(0, 16)]));
    p.post_send(&a, SendWr::send(4, vec![]));
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].byte_len),
        (3, WcStatus::Success, 0)
    );
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((sc[0].wr_id, sc[0].status), (4, WcStatus::Success));
}

#[test]
fn inline_send_carries_its_own_bytes() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let data = pattern(3, 200);
    p.post_recv(&b, RecvWr::new(1, vec![b.sge(0, 256)]));
    p.post_send(&a, SendWr::send(2, vec![]).inline(data.clone()));
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!((rc[0].status, rc[0].byte_len), (WcStatus::Success, 200));
    assert_eq!(p.mem(&b).get(OWNER, b.addr(0), 200), data);
}

#[test]
fn sends_complete_in_post_order_on_both_sides() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    for i in 0..50u64 {
        p.post_recv(&b, RecvWr::new(1000 + i, vec![b.sge(i * 4096, 4096)]));
    }
    for i in 0..50u64 {
        let len = (i * 83 % 4000) as u32;
        p.mem(&a)
            .set(OWNER, a.addr(i * 4096), &pattern(i, len as usize));
        p.post_send(&a, SendWr::send(i, vec![a.sge(i * 4096, len)]));
    }
    let sc = p.wait_cq(&a, a.send_cq, 50, DEADLINE).unwrap();
    let rc = p.wait_cq(&b, b.recv_cq, 50, DEADLINE).unwrap();
    assert_eq!(
        sc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..50).collect::<Vec<_>>()
    );
    assert_eq!(
        rc.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (1000..1050).collect::<Vec<_>>()
    );
    for (i, c) in rc.iter().enumerate() {
        let len = (i as u64 * 83 % 4000) as usize;
        assert_eq!(c.byte_len as usize, len);
        assert_eq!(
            p.mem(&b).get(OWNER, b.addr(i as u64 * 4096), len),
            pattern(i as u64, len)
        );
    }
}

#[test]
fn a_send_larger_than_the_receive_buffer_fails_with_a_length_error() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    p.post_recv(&b, RecvWr::new(1, vec![b.sge(0, 100)]));
    p.post_send(&a, SendWr::send(2, vec![a.sge(0, 200)]));
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!((rc[0].wr_id, rc[0].status), (1, WcStatus::LocLenErr));
    let sc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((sc[0].wr_id, sc[0].status), (2, WcStatus::RemInvReqErr));
}

#[test]
fn a_send_gathers_from_the_device_maximum_of_sges_and_scatters_into_as_many() {
    let cfg = PairConfig {
        max_sge: 32,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let max = p.engine(&a).query_device().max_sge;
    assert_eq!(max, 32);
    // 32 pieces of 1..=100 bytes, each at its own place, on both sides.
    let lens: Vec<u32> = (0..32).map(|i| 1 + (i * 37 % 100)).collect();
    let total: u32 = lens.iter().sum();
    let data = pattern(4, total as usize);
    let mut at = 0usize;
    let mut send_sges = Vec::new();
    let mut recv_sges = Vec::new();
    for (i, &l) in lens.iter().enumerate() {
        let off = i as u64 * 1000;
        p.mem(&a)
            .set(OWNER, a.addr(off), &data[at..at + l as usize]);
        send_sges.push(a.sge(off, l));
        // The receive side splits differently: reversed lengths.
        recv_sges.push(b.sge(off, lens[31 - i]));
        at += l as usize;
    }
    p.post_recv(&b, RecvWr::new(1, recv_sges));
    p.post_send(&a, SendWr::send(2, send_sges));
    let rc = p.wait_cq(&b, b.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!((rc[0].status, rc[0].byte_len), (WcStatus::Success, total));
    let mut got = Vec::new();
    for i in 0..32 {
        got.extend(
            p.mem(&b)
                .get(OWNER, b.addr(i as u64 * 1000), lens[31 - i] as usize),
        );
    }
    assert_eq!(got, data);
}

#[test]
fn more_sges_than_the_qp_allows_are_refused_at_post_time() {
    let mut p = Pair::new(PairConfig::default());
    let a = p.a;
    let sges: Vec<_> = (0..5).map(|i| a.sge(i * 10, 10)).collect();
    let qpn = a.qpn;
    let r = p.engine(&a).post_send(qpn, SendWr::send(1, sges));
    assert!(
        matches!(r, Err(engine::VerbsError::TooManySge { sges: 5, max: 4 })),
        "{r:?}"
    );
}
