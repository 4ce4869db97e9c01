//! A thread that keeps polling an empty CQ through softrdmad, on a host with few CPUs,
//! sleeps until the daemon delivers completions instead of yielding again and again (a
//! yielding poller takes the CPU from the daemon it waits for, and beside one more busy
//! thread the stream all but stops): the delivery wakes it, and softrdmad counts the wake.
//! One test in its own binary: it forces the few-CPUs policy for the whole process.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma::{BackendKind, Device, WcStatus};

/// softrdmad's count of deliveries that woke sleeping pollers.
fn wakes(d: &Device) -> u64 {
    let v = d.counter_values().unwrap();
    v.iter()
        .find(|(n, _)| n == "completion_wakes")
        .map(|&(_, x)| x)
        .expect("softrdmad counts completion_wakes")
}

/// Whether thread `tid` of this process is blocked in `futex(2)` (`/proc`'s syscall file:
/// the number of the call it sleeps in, or "running").
fn in_futex(tid: &str) -> bool {
    let path = format!("/proc/self/task/{tid}/syscall");
    std::fs::read_to_string(path)
        .is_ok_and(|s| s.split_whitespace().next() == Some(libc::SYS_futex.to_string().as_str()))
}

#[test]
fn a_thread_polling_an_empty_cq_sleeps_until_the_daemon_delivers() {
    // The policy under test, whatever this host's CPUs (set before any poll reads it), with
    // sleeps that only a delivery ends (a sleep of 50 µs could run out before the SEND
    // posted while it lasts is delivered).
    std::env::set_var("SOFTRDMA_POLL_YIELD", "1");
    std::env::set_var("SOFTRDMA_POLL_SLEEP_US", "10000000");
    let (a, b) = common::pair_v4_on(BackendKind::Daemon, 64);
    let before = wakes(&b.dev);
    const MESSAGES: u64 = 10;
    for i in 0..MESSAGES {
        b.qp.recv(i, &[b.mr.sge(..).unwrap()]).unwrap();
    }
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let cq = b.cq.clone();
    let received = Arc::new(AtomicU64::new(0));
    let count = received.clone();
    let poller = std::thread::spawn(move || {
        let me = std::fs::read_link("/proc/thread-self").unwrap();
        tid_tx
            .send(me.file_name().unwrap().to_string_lossy().into_owned())
            .unwrap();
        let mut got = Vec::new();
        while got.len() < MESSAGES as usize {
            got.extend(cq.poll(1).unwrap());
            count.store(got.len() as u64, Ordering::Release);
        }
        got
    });
    let tid = tid_rx.recv().unwrap();
    for i in 0..MESSAGES {
        // Each SEND goes once the poller took the last and, finding nothing since, sleeps.
        let t0 = Instant::now();
        while received.load(Ordering::Acquire) < i || !in_futex(&tid) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the poller never slept before message {i}"
            );
            std::thread::yield_now();
        }
        a.qp.send(100 + i, &[a.mr.sge(..8).unwrap()]).unwrap();
    }
    let got = poller.join().unwrap();
    assert_eq!(got.len(), MESSAGES as usize);
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.status),
            (i as u64, WcStatus::Success),
            "{wc:?}"
        );
    }
    // Every SEND was posted while the poller slept, and each delivery woke it (the test
    // daemon is shared: others' wakes may count too).
    let woke = wakes(&b.dev) - before;
    assert!(
        woke >= MESSAGES,
        "{woke} wakes for {MESSAGES} deliveries to a sleeper"
    );
}
