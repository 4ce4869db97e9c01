//! Completions delivered into shared-memory CQ rings (memfd passed over the control socket),
//! polled with no request to the daemon.

mod common;

use std::time::{Duration, Instant};

use common::{connected_pair, Daemon};
use daemon::client::CqRing;
use daemon::proto::{SendOpMsg, SendWrMsg, SgeMsg, WcMsg};

fn wait_ring(ring: &mut CqRing, n: usize) -> Vec<WcMsg> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.len() < n {
        got.extend(ring.poll(16).unwrap());
        assert!(Instant::now() < deadline, "ring gave {got:?}, want {n}");
        std::hint::spin_loop();
    }
    got
}

#[test]
fn completions_arrive_in_a_shared_memory_ring() {
    let d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let mut ra = a.client.attach_cq_ring(a.cq, 8).unwrap();
    let mut rb = b.client.attach_cq_ring(b.cq, 8).unwrap();
    // The CQ is now the ring's: polling it by request is refused, and so is a second ring.
    assert_eq!(a.client.poll_cq(a.cq, 1).unwrap_err().errno(), Some(22));
    assert_eq!(
        a.client.attach_cq_ring(a.cq, 8).unwrap_err().errno(),
        Some(22)
    );
    assert_eq!(
        b.client.attach_cq_ring(b.cq + 100, 8).unwrap_err().errno(),
        Some(22)
    );

    // More messages than the ring holds: the rest wait in the CQ until slots free up.
    for i in 0..20u64 {
        b.client
            .post_recv(
                b.qp,
                100 + i,
                vec![SgeMsg {
                    addr: b.buf.addr() + i * 64,
                    length: 64,
                    lkey: b.lkey,
                }],
            )
            .unwrap();
    }
    for i in 0..20u64 {
        a.client
            .post_send(
                a.qp,
                SendWrMsg {
                    wr_id: i,
                    op: SendOpMsg::Send,
                    flags: 2,
                    sges: vec![],
                    inline: Some(format!("message {i:02}").into_bytes()),
                },
            )
            .unwrap();
    }
    let wa = wait_ring(&mut ra, 20);
    assert_eq!(
        wa.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..20).map(|i| (i, 0)).collect::<Vec<_>>()
    );
    let wb = wait_ring(&mut rb, 20);
    for (i, w) in wb.iter().enumerate() {
        assert_eq!((w.wr_id, w.status, w.byte_len), (100 + i as u64, 0, 10));
        assert_eq!(b.buf.read(i * 64, 10), format!("message {i:02}").as_bytes());
    }
    assert!(ra.poll(4).unwrap().is_empty());
}
