//! RDMA WRITE, READ and ATOMIC between two devices over real UDP on loopback.

#[macro_use]
mod common;

use std::time::Duration;

use common::{pair_on, pair_v4_on, pair_v6_on, WAIT};
use softrdma::{BackendKind, Error, Rkey, WcFlags, WcOpcode, WcStatus};

on_both_backends! {
fn rdma_write_places_bytes_in_the_peer_region_without_a_receive(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 64 * 1024);
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    a.mr.write(0, &data).unwrap();
    let remote = b.mr.remote(1000..).unwrap();
    a.qp.write(1, &[a.mr.sge(..data.len()).unwrap()], &remote)
        .unwrap();
    let wc = a.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.opcode, WcOpcode::RdmaWrite);
    let mut got = vec![0u8; data.len()];
    b.mr.read(1000, &mut got).unwrap();
    assert_eq!(got, data);
    assert!(
        b.cq.poll_one().unwrap().is_none(),
        "a plain WRITE completes nothing at the target"
    );
}
}

on_both_backends! {
fn rdma_write_with_immediate_consumes_a_receive(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 4096);
    b.qp.recv(5, &[]).unwrap();
    a.mr.write(0, b"imm").unwrap();
    let remote = b.mr.remote(..).unwrap();
    a.qp.write_with_imm(1, &[a.mr.sge(..3).unwrap()], &remote, 42)
        .unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    let wc = b.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(wc.imm_data, 42);
    assert!(wc.wc_flags.contains(WcFlags::WITH_IMM));
    let mut got = [0u8; 3];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"imm");
}
}

on_both_backends! {
fn rdma_read_fetches_the_peer_bytes(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 64 * 1024);
    let data: Vec<u8> = (0..30_000u32).map(|i| (i * 13 % 256) as u8).collect();
    b.mr.write(0, &data).unwrap();
    let remote = b.mr.remote(..data.len()).unwrap();
    a.qp.read(3, &[a.mr.sge(100..100 + data.len()).unwrap()], &remote)
        .unwrap();
    let wc = a.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.opcode, WcOpcode::RdmaRead);
    assert_eq!(wc.byte_len as usize, data.len());
    let mut got = vec![0u8; data.len()];
    a.mr.read(100, &mut got).unwrap();
    assert_eq!(got, data);
}
}

on_both_backends! {
fn rdma_read_over_ipv6(backend: BackendKind) {
    let (a, b) = pair_v6_on(backend, 8192);
    b.mr.write(0, b"read me over v6").unwrap();
    a.qp.read(3, &[a.mr.sge(0..15).unwrap()], &b.mr.remote(0..15).unwrap())
        .unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    let mut got = [0u8; 15];
    a.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"read me over v6");
}
}

on_both_backends! {
fn atomics_act_on_the_peer_word_and_return_the_original(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 4096);
    b.mr.write_u64(64, 100).unwrap();
    let word = b.mr.remote(64..72).unwrap();
    a.qp.fetch_add(1, a.mr.sge(0..8).unwrap(), &word, 5)
        .unwrap();
    let wc = a.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.opcode, WcOpcode::FetchAdd);
    assert_eq!(a.mr.read_u64(0).unwrap(), 100);
    assert_eq!(b.mr.read_u64(64).unwrap(), 105);

    // A compare that fails leaves the word; one that matches swaps it.
    a.qp.compare_swap(2, a.mr.sge(8..16).unwrap(), &word, 1, 7)
        .unwrap();
    assert_eq!(a.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::CompSwap);
    assert_eq!(a.mr.read_u64(8).unwrap(), 105);
    assert_eq!(b.mr.read_u64(64).unwrap(), 105);
    a.qp.compare_swap(3, a.mr.sge(16..24).unwrap(), &word, 105, 7)
        .unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    assert_eq!(a.mr.read_u64(16).unwrap(), 105);
    assert_eq!(b.mr.read_u64(64).unwrap(), 7);
}
}

on_both_backends! {
fn a_wrong_rkey_is_a_remote_access_error(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 4096);
    let mut remote = b.mr.remote(..).unwrap();
    remote.rkey = Rkey::new(remote.rkey.value() ^ 0x5a5);
    a.qp.write(1, &[a.mr.sge(..8).unwrap()], &remote).unwrap();
    match a.cq.wait_ok(WAIT) {
        Err(Error::Completion { wr_id: 1, status }) => assert_eq!(status, WcStatus::RemAccessErr),
        other => panic!("expected a remote access error, got {other:?}"),
    }
}
}

on_both_backends! {
fn a_deregistered_region_cannot_be_reached_any_more(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 4096);
    let remote = b.mr.remote(..).unwrap();
    let b_mr = b.mr;
    let buf = b_mr.into_inner();
    assert_eq!(buf.as_slice().len(), 4096);
    a.qp.write(1, &[a.mr.sge(..8).unwrap()], &remote).unwrap();
    match a.cq.wait_ok(WAIT) {
        Err(Error::Completion { status, .. }) => assert_eq!(status, WcStatus::RemAccessErr),
        other => panic!("expected a remote access error, got {other:?}"),
    }
    assert!(
        buf.as_slice().iter().all(|&x| x == 0),
        "the returned buffer was not written"
    );
}
}

/// A device whose application does nothing while a peer reads its memory again and again
/// learns to poll: its progress thread stops paying a wakeup for every request. With no
/// polling learned, it sleeps between any two requests (the requester waits for each
/// answer before it sends the next, so none can arrive while the responder is still up).
#[test]
fn a_responder_read_back_to_back_learns_to_poll_instead_of_sleeping_each_time() {
    const READS: u64 = 400;
    // The responder's sleeps, and its polling back-offs, during READS back-to-back
    // one-byte READs of its memory.
    let responder_sleeps = |learn: Duration| -> (u64, u64) {
        let open = |ip: &str, learn| {
            softrdma::Device::builder(ip.parse().unwrap())
                .backend(BackendKind::Embedded)
                .port(0)
                .adaptive_poll(learn)
                .open()
                .unwrap()
        };
        let (a, b) = (open("127.0.0.1", Duration::ZERO), open("127.0.0.2", learn));
        let (ra, rb) = (a.try_runtime().unwrap(), b.try_runtime().unwrap());
        ra.set_remote_port(b.local_addr().port());
        rb.set_remote_port(a.local_addr().port());
        let (a, b) = pair_on(a, b, 64);
        let remote = b.mr.remote(..1).unwrap();
        let read = |i| {
            a.qp.read(i, &[a.mr.sge(..1).unwrap()], &remote).unwrap();
            assert_eq!(a.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::RdmaRead);
        };
        read(0);
        let rt = b.dev.try_runtime().unwrap();
        let before = (rt.sleeps(), rt.poll_backoffs());
        (1..=READS).for_each(read);
        (rt.sleeps() - before.0, rt.poll_backoffs() - before.1)
    };
    let (fixed, _) = responder_sleeps(Duration::ZERO);
    // One sleep per request, give or take the sleeps at the ends of the count, which may
    // fall just outside it.
    assert!(
        fixed + 2 >= READS,
        "{fixed} sleeps for {READS} READs with no polling"
    );
    // A bound far above any gap between two requests: only the first few requests, while
    // the polling doubles, still find it asleep. A run in which another thread took the
    // responder's core while it polled (other tests run beside this one) unlearns the
    // polling on purpose, as polling on a shared core costs more than sleeping; a back-off
    // is only counted when polling had been learned. Such runs are tried again; on a
    // machine that stays that busy, every run shows polling learned and then given up.
    for run in 1..=5 {
        let (learned, backoffs) = responder_sleeps(Duration::from_secs(1));
        if learned <= READS / 4 {
            return;
        }
        assert!(
            backoffs > 0,
            "{learned} sleeps for {READS} READs with polling learned, and no back-off"
        );
        eprintln!("run {run}: {learned} sleeps after {backoffs} polling back-offs");
    }
    eprintln!("the responder's core was taken from its polling in each of 5 runs");
}

#[test]
fn small_posts_between_two_looks_share_send_calls_and_the_first_leaves_at_once() {
    let (a, b) = pair_v4_on(BackendKind::Embedded, 4096);
    small_writes_leave_together(&a, &b);
}

#[test]
fn small_posts_leave_in_trains_that_the_raw_receive_path_cuts() {
    let open = |ip: &str| {
        softrdma::Device::builder(ip.parse().unwrap())
            .backend(BackendKind::Embedded)
            .port(0)
            .rx_path(softrdma::RxPath::Raw)
            .open()
            .ok()
    };
    let (Some(da), Some(db)) = (open("127.0.0.55"), open("127.0.0.56")) else {
        eprintln!("skipped: the raw receive path needs root or CAP_NET_RAW");
        return;
    };
    da.runtime().set_remote_port(db.local_addr().port());
    db.runtime().set_remote_port(da.local_addr().port());
    let (a, b) = pair_on(da, db, 4096);
    small_writes_leave_together(&a, &b);
}

/// The first small WRITE after a look leaves before the post returns (a ping-pong never
/// waits); a burst of them posted back to back while the poster polls leaves together, as
/// a GSO train the receiver cuts into its packets, every one landing where it should.
fn small_writes_leave_together(a: &common::Side, b: &common::Side) {
    const BURST: u64 = 32;
    let (ra, rb) = (a.dev.try_runtime().unwrap(), b.dev.try_runtime().unwrap());
    let write = |i: u64, tag: u8| {
        let at = 8 * i as usize;
        a.mr.write(at, &[tag; 8]).unwrap();
        let remote = b.mr.remote(at..at + 8).unwrap();
        a.qp.write(i, &[a.mr.sge(at..at + 8).unwrap()], &remote)
            .unwrap();
    };
    for _ in 0..4 {
        ra.poll_progress();
    }
    assert!(a.cq.poll_one().unwrap().is_none());
    let before = ra.io_counters().tx_datagrams;
    write(0, 0xee);
    assert!(
        ra.io_counters().tx_datagrams > before,
        "a lone post after a look was held back"
    );
    a.cq.wait_ok(WAIT).unwrap();
    // After the first, each waits for the next look of this thread. Only a thread
    // descheduled for longer than its lease (other tests run beside this one) sends them
    // one by one: such bursts are tried again.
    for attempt in 1..=5u8 {
        ra.poll_progress();
        let (tx, rx) = (ra.io_counters(), rb.io_counters());
        (1..=BURST).for_each(|i| write(i, attempt.wrapping_mul(16).wrapping_add(i as u8)));
        for _ in 0..BURST {
            a.cq.wait_ok(WAIT).unwrap();
        }
        let mut got = vec![0u8; 8 * (BURST as usize + 1)];
        b.mr.read(0, &mut got).unwrap();
        for i in 1..=BURST as usize {
            let tag = attempt.wrapping_mul(16).wrapping_add(i as u8);
            assert_eq!(
                got[8 * i..8 * i + 8],
                [tag; 8],
                "WRITE {i} of burst {attempt}"
            );
        }
        let (tx2, rx2) = (ra.io_counters(), rb.io_counters());
        let sent = tx2.tx_datagrams - tx.tx_datagrams;
        let calls = tx2.tx_calls - tx.tx_calls;
        assert!(sent >= BURST, "{sent} packets for {BURST} WRITEs");
        if calls * 4 <= sent {
            assert!(tx2.tx_trains > tx.tx_trains, "{calls} calls, no train");
            assert!(
                rx2.rx_trains > rx.rx_trains,
                "the receiver took no train whole"
            );
            return;
        }
        eprintln!("attempt {attempt}: {calls} send calls for {sent} packets");
    }
    panic!("in 5 bursts of {BURST} small WRITEs, the packets never shared send calls");
}
