//! Completions delivered into shared-memory CQ rings (memfd passed over the control socket),
//! polled with no request to the daemon.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::client::CqRing;
use abi::wqe::Cqe;
use common::{connected_pair, Daemon};
use engine::{RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge};

/// Up to `max` completions from `ring`, as their ring entries (numbers as libibverbs').
fn poll(ring: &mut CqRing, max: usize) -> Vec<Cqe> {
    let mut out = vec![engine::WorkCompletion::default(); max];
    let n = ring.poll_into(&mut out).unwrap();
    out[..n].iter().map(Cqe::of).collect()
}

fn wait_ring(ring: &mut CqRing, n: usize) -> Vec<Cqe> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.len() < n {
        got.extend(poll(ring, 16));
        assert!(Instant::now() < deadline, "ring gave {got:?}, want {n}");
        std::hint::spin_loop();
    }
    got
}

#[test]
fn completions_arrive_in_a_shared_memory_ring() {
    let d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let db = Arc::new(a.client.doorbell(0).unwrap());
    let mut ra = a.client.attach_cq_ring(a.cq, 8, db.clone()).unwrap();
    let mut rb = b.client.attach_cq_ring(b.cq, 8, db.clone()).unwrap();
    // The CQ is now the ring's: polling it by request is refused, and so is a second ring.
    assert_eq!(a.client.poll_cq(a.cq, 1).unwrap_err().errno(), Some(22));
    assert_eq!(
        a.client
            .attach_cq_ring(a.cq, 8, db.clone())
            .unwrap_err()
            .errno(),
        Some(22)
    );
    assert_eq!(
        b.client
            .attach_cq_ring(b.cq + 100, 8, db.clone())
            .unwrap_err()
            .errno(),
        Some(22)
    );

    // More messages than the ring holds: the rest wait in the CQ until slots free up.
    post_recvs(&mut b, 20);
    for i in 0..20u64 {
        a.client
            .post_send(
                a.qp,
                &SendWr {
                    wr_id: i,
                    op: SendOp::Send,
                    flags: SendFlags::from_bits_truncate(2),
                    payload: SendPayload::Inline(format!("message {i:02}").into_bytes().into()),
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
    assert!(poll(&mut ra, 4).is_empty());
}

/// `n` receives of 64 bytes each on `side`'s QP, wr_ids 100, 101...
fn post_recvs(side: &mut common::Side, n: u64) {
    for i in 0..n {
        side.client
            .post_recv(
                side.qp,
                &RecvWr::new(
                    100 + i,
                    vec![Sge {
                        addr: side.buf.addr() + i * 64,
                        length: 64,
                        lkey: side.lkey,
                    }],
                ),
            )
            .unwrap();
    }
}

fn send_inline(side: &mut common::Side, wr_id: u64) {
    side.client
        .post_send(
            side.qp,
            &SendWr {
                wr_id,
                op: SendOp::Send,
                flags: SendFlags::from_bits_truncate(2),
                payload: SendPayload::Inline(wr_id.to_le_bytes().to_vec().into()),
            },
        )
        .unwrap();
}

/// A ring of 2 over a burst of 32 completions: 30 wait in the daemon with the ring full. The
/// progress thread sleeps with no timer for them; polling frees slots and rings the doorbell
/// (the ring's backlog word asked for it), and every completion arrives, in order, none lost.
/// With no backlog, polling rings nothing.
#[test]
fn a_ring_smaller_than_the_burst_gets_every_completion_in_order_by_doorbell() {
    let d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let db = Arc::new(a.client.doorbell(0).unwrap());
    let mut ra = a.client.attach_cq_ring(a.cq, 2, db).unwrap();
    let n = 32u64;
    post_recvs(&mut b, n);
    for i in 0..n {
        send_inline(&mut a, i);
    }
    // Everything completed: two in the ring, the rest held by the daemon.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let held = a.client.cq_len(a.cq).unwrap();
        if held + u64::from(ra.len().unwrap()) == n {
            assert_eq!((ra.len().unwrap(), held), (2, n - 2));
            break;
        }
        assert!(Instant::now() < deadline, "{held} held");
        std::thread::sleep(Duration::from_millis(1));
    }
    // One at a time, as a slow consumer takes them.
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < n as usize {
        got.extend(poll(&mut ra, 1));
        assert!(Instant::now() < deadline, "ring gave {} of {n}", got.len());
        std::hint::spin_loop();
    }
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..n).map(|i| (i, 0)).collect::<Vec<_>>()
    );
    assert!(ra.doorbells() >= 1);
    assert_eq!(a.client.cq_len(a.cq).unwrap(), 0);
    assert_eq!(b.wait(n as usize).len(), n as usize);

    // Two more fit the ring: nothing waits, so polling rings no doorbell.
    let rung = ra.doorbells();
    for i in 0..2 {
        b.client
            .post_recv(
                b.qp,
                &RecvWr::new(
                    200 + i,
                    vec![Sge {
                        addr: b.buf.addr(),
                        length: 64,
                        lkey: b.lkey,
                    }],
                ),
            )
            .unwrap();
        send_inline(&mut a, n + i);
    }
    let more = wait_ring(&mut ra, 2);
    assert_eq!(
        more.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![n, n + 1]
    );
    assert_eq!(ra.doorbells(), rung);
}

/// Whether `fd` (a completion channel) becomes readable within `ms` milliseconds; reads it
/// if so (clearing it).
fn signalled(fd: &std::os::fd::OwnedFd, ms: u16) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    if poll(&mut fds, PollTimeout::from(ms)).unwrap() == 0 {
        return false;
    }
    let mut b = [0u8; 8];
    assert_eq!(nix::unistd::read(fd, &mut b).unwrap(), 8);
    true
}

/// `ibv_req_notify_cq` as a NIC's library does it: the client writes its CQ ring's arm word
/// and sets the CQ's bit in its doorbell page, and sends no request. The daemon signals the
/// channel at the next completion; not for one already in the ring when the client armed
/// (it polls after arming, as with a NIC), but at once for one that reached the ring after
/// the arm and before the daemon took it; not at all without an arm, or for an unchanged arm
/// word however often the bit is set; and not for an unsolicited completion when armed for
/// solicited ones only.
#[test]
fn a_cq_armed_through_its_ring_is_signalled_with_no_request() {
    let d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let db = Arc::new(a.client.doorbell(0).unwrap());
    let wd = a.client.work_doorbell(0, db.clone()).unwrap();
    let mut ra = a.client.attach_cq_ring(a.cq, 8, db.clone()).unwrap();
    let chan = a.client.cq_channel(a.cq).unwrap();
    assert!(!ra.arm(false).unwrap(), "no bit yet: arm by request");
    a.client.attach_cq_arm(a.cq, &mut ra, wd.clone()).unwrap();
    let bit = ra.arm_bit().unwrap();
    // Once per CQ, and only for a CQ that has a ring.
    let e = a
        .client
        .attach_cq_arm(a.cq, &mut ra, wd.clone())
        .unwrap_err();
    assert_eq!(e.errno(), Some(22));
    let cq2 = a.client.create_cq(0, 4).unwrap();
    let e = a
        .client
        .attach_cq_arm(cq2, &mut ra, wd.clone())
        .unwrap_err();
    assert_eq!(e.errno(), Some(22), "a CQ with no ring");
    assert_eq!(ra.arm_bit(), Some(bit));
    // Rings the bit and the device's doorbell, as a client would after an arm.
    let ring_bit = || {
        wd.page().ring(bit).unwrap();
        rustix::io::write(&*db, &1u64.to_ne_bytes()).unwrap();
    };

    let arms = d.stat("srxe0.ring_arms");
    post_recvs(&mut b, 5);
    assert!(ra.arm(false).unwrap());
    assert!(!signalled(&chan, 50), "armed, no completion yet");
    send_inline(&mut a, 1);
    assert!(signalled(&chan, 5000), "the next completion signals");
    assert_eq!(wait_ring(&mut ra, 1)[0].wr_id, 1);
    assert!(d.stat("srxe0.ring_arms") > arms);

    // Not armed: a completion reaches the ring and signals nothing; the bit set again with
    // the arm word unchanged is no arm either.
    send_inline(&mut a, 2);
    let unpolled = |ra: &CqRing| {
        let t = Instant::now();
        while ra.len().unwrap() == 0 {
            assert!(t.elapsed() < Duration::from_secs(20));
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    unpolled(&ra);
    ring_bit();
    assert!(!signalled(&chan, 50), "no arm, no event");
    // Armed with that completion in the ring: it came before the arm, so it does not fire
    // it (the client polls after arming); the next completion does.
    assert!(ra.arm(false).unwrap());
    assert!(!signalled(&chan, 50), "a completion from before the arm");
    assert_eq!(wait_ring(&mut ra, 1)[0].wr_id, 2);
    send_inline(&mut a, 3);
    assert!(signalled(&chan, 5000));
    assert_eq!(wait_ring(&mut ra, 1)[0].wr_id, 3);

    // Armed, but the daemon takes the arm only after a completion reached the ring: that
    // completion came after the arm, and fires it at once.
    ra.arm_unrung(false);
    send_inline(&mut a, 4);
    unpolled(&ra);
    assert!(!signalled(&chan, 50), "the daemon has not seen the arm");
    ring_bit();
    assert!(
        signalled(&chan, 5000),
        "a completion between the arm and its doorbell"
    );
    assert_eq!(wait_ring(&mut ra, 1)[0].wr_id, 4);

    // Solicited only: a send completion is neither solicited nor an error.
    assert!(ra.arm(true).unwrap());
    std::thread::sleep(Duration::from_millis(20));
    send_inline(&mut a, 5);
    assert_eq!(wait_ring(&mut ra, 1)[0].wr_id, 5);
    assert!(
        !signalled(&chan, 50),
        "unsolicited completion, solicited-only arm"
    );
    // Re-armed for any completion (the newer arm wins): the next one signals.
    assert!(ra.arm(false).unwrap());
    post_recvs(&mut b, 1);
    send_inline(&mut a, 6);
    assert!(signalled(&chan, 5000));
    assert_eq!(wait_ring(&mut ra, 1)[0].wr_id, 6);
    assert_eq!(b.wait(6).len(), 6);

    // A destroyed CQ's bit names nothing: setting it, and scribbling the arm word of the
    // ring it had, is the client's own noise. The daemon goes on serving.
    let mut r2 = a.client.attach_cq_ring(cq2, 4, db.clone()).unwrap();
    a.client.attach_cq_arm(cq2, &mut r2, wd.clone()).unwrap();
    let bit2 = r2.arm_bit().unwrap();
    a.client.destroy_cq(cq2).unwrap();
    for _ in 0..100 {
        r2.arm_unrung(true);
        wd.page().ring(bit2).unwrap();
    }
    rustix::io::write(&*db, &1u64.to_ne_bytes()).unwrap();
    assert!(ra.arm(false).unwrap());
    post_recvs(&mut b, 1);
    send_inline(&mut a, 7);
    assert!(signalled(&chan, 5000));
    assert_eq!(wait_ring(&mut ra, 1)[0].wr_id, 7);
}
