//! Ordering guarantees of RC: fences, and completions per queue rather than across queues.

mod common;

use core::time::Duration;

use common::{pattern, Pair, PairConfig, Wiretap, OWNER};
use engine::{PathMtu, RecvWr, SendFlags, SendWr, WcStatus};
use wire::OpKind;

const DEADLINE: Duration = Duration::from_secs(10);

#[test]
fn a_fenced_write_waits_until_the_earlier_read_has_its_data() {
    // The READ covers the region the WRITE then overwrites. Without the fence the WRITE may
    // reach the responder while READ responses are still being built from that memory; with
    // it the WRITE does not even leave until the READ has completed.
    let cfg = PairConfig {
        mtu: PathMtu::Mtu256,
        ..PairConfig::default()
    };
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    let tap = Wiretap::install(&mut p.sim);
    let old = pattern(40, 64 * 1024);
    let new = pattern(41, 64 * 1024);
    p.mem(&b).set(OWNER, b.addr(0), &old);
    p.mem(&a).set(OWNER, a.addr(100_000), &new);
    p.post_send(
        &a,
        SendWr::rdma_read(1, vec![a.sge(0, 64 * 1024)], b.addr(0), b.mr.rkey),
    );
    p.post_send(
        &a,
        SendWr::rdma_write(2, vec![a.sge(100_000, 64 * 1024)], b.addr(0), b.mr.rkey)
            .with_flags(SendFlags::FENCE),
    );
    let sc = p.wait_cq(&a, a.send_cq, 2, DEADLINE).unwrap();
    assert!(sc.iter().all(|c| c.status == WcStatus::Success), "{sc:?}");
    assert!(
        p.mem(&a).get(OWNER, a.addr(0), 64 * 1024) == old,
        "the READ saw bytes of the later, fenced WRITE"
    );
    assert_eq!(p.mem(&b).get(OWNER, b.addr(0), 64 * 1024), new);
    let seen = tap.seen.borrow();
    let last_response = seen
        .iter()
        .filter(|s| s.from == b.node && s.t.bth.opcode.kind() == OpKind::RdmaReadResponse)
        .map(|s| s.time)
        .max()
        .expect("READ responses");
    let first_write = seen
        .iter()
        .filter(|s| s.from == a.node && s.t.bth.opcode.kind() == OpKind::RdmaWrite)
        .map(|s| s.time)
        .min()
        .expect("WRITE packets");
    assert!(
        first_write > last_response,
        "the fenced WRITE left at {first_write:?}, before the last READ response ({last_response:?})"
    );
}

#[test]
fn each_queue_completes_in_its_own_post_order_whatever_the_other_does() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    // A big WRITE from B to A keeps B's send queue busy while A's small SENDs complete.
    p.mem(&b).set(OWNER, b.addr(0), &pattern(42, 512 * 1024));
    p.post_send(
        &b,
        SendWr::rdma_write(100, vec![b.sge(0, 512 * 1024)], a.addr(0), a.mr.rkey),
    );
    for i in 0..10 {
        p.post_recv(&b, RecvWr::new(i, vec![b.sge(600_000 + i * 64, 64)]));
        p.post_send(&a, SendWr::send(i, vec![a.sge(600_000, 8)]));
    }
    let sa = p.wait_cq(&a, a.send_cq, 10, DEADLINE).unwrap();
    assert_eq!(
        sa.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    let rb = p.wait_cq(&b, b.recv_cq, 10, DEADLINE).unwrap();
    assert_eq!(
        rb.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..10).collect::<Vec<_>>()
    );
    let sb = p.wait_cq(&b, b.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((sb[0].wr_id, sb[0].status), (100, WcStatus::Success));
    assert_eq!(
        p.mem(&a).get(OWNER, a.addr(0), 512 * 1024),
        pattern(42, 512 * 1024)
    );
}

#[test]
fn unsignaled_sends_complete_silently_but_still_in_order() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    for i in 0..6u64 {
        p.post_recv(&b, RecvWr::new(i, vec![b.sge(i * 64, 64)]));
        p.post_send(&a, SendWr::send(i, vec![a.sge(0, 16)]).signaled(i % 3 == 2));
    }
    let sc = p.wait_cq(&a, a.send_cq, 2, DEADLINE).unwrap();
    assert_eq!(sc.iter().map(|c| c.wr_id).collect::<Vec<_>>(), vec![2, 5]);
    let rc = p.wait_cq(&b, b.recv_cq, 6, DEADLINE).unwrap();
    assert_eq!(rc.len(), 6, "every receive completes, signaled or not");
}

#[test]
fn a_reply_leaves_before_the_ack_of_the_request_it_answers_and_read_responses_never_wait() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    let now = common::instant(Duration::ZERO);
    let mut buf = vec![0u8; 8192];
    let kind = |pkt: &[u8]| common::transport_of(pkt).unwrap().bth.opcode.kind();
    // A writes to B; B receives it and has an ACK to send, then posts its own WRITE.
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 8)], b.addr(0), b.mr.rkey),
    );
    let t = p.engine(&a).poll_transmit(now, &mut buf).unwrap();
    let write = buf[..t.len].to_vec();
    p.engine(&b).handle_datagram(now, &write);
    p.post_send(
        &b,
        SendWr::rdma_write(2, vec![b.sge(0, 8)], a.addr(0), a.mr.rkey),
    );
    // In the pass that handled the WRITE, B's request comes out and its ACK waits.
    let t = p.engine(&b).poll_transmit(now, &mut buf).unwrap();
    assert_eq!(kind(&buf[..t.len]), OpKind::RdmaWrite);
    assert!(p.engine(&b).poll_transmit(now, &mut buf).is_none());
    // It leaves when poll_timeout says, and not before.
    let due = p.engine(&b).poll_timeout().expect("the ACK's deadline");
    assert_eq!(
        due.saturating_duration_since(now),
        engine::DEFAULT_ACK_COALESCE
    );
    let before = engine::Instant::from_nanos(due.as_nanos() - 1);
    assert!(p.engine(&b).poll_transmit(before, &mut buf).is_none());
    let t = p.engine(&b).poll_transmit(due, &mut buf).unwrap();
    assert_eq!(kind(&buf[..t.len]), OpKind::Acknowledge);
    assert!(p.engine(&b).poll_transmit(due, &mut buf).is_none());

    // A READ request's response never waits.
    p.post_send(
        &a,
        SendWr::rdma_read(3, vec![a.sge(64, 8)], b.addr(0), b.mr.rkey),
    );
    let t = p.engine(&a).poll_transmit(due, &mut buf).unwrap();
    let read = buf[..t.len].to_vec();
    p.engine(&b).handle_datagram(due, &read);
    let t = p.engine(&b).poll_transmit(due, &mut buf).unwrap();
    assert_eq!(kind(&buf[..t.len]), OpKind::RdmaReadResponse);
}
