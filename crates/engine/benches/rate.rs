//! The engine's own cost per message, with no sockets, rings or threads: two RC QPs on one
//! engine (a daemon's own QPs, on its internal path), 2-byte SENDs and WRITEs kept 128 deep
//! the way `softrdma send_bw -s 2` keeps them, every packet handed straight back in, the
//! completions polled. What is left when softrdmad's rings and the clients are taken away,
//! so a change to the transport can be weighed by itself:
//!
//!   cargo bench -p engine --bench rate
//!
//! Prints nanoseconds per message (median and spread of five runs) against a `memcpy` of the
//! same 2 bytes through the same test memory, measured in the same run. `MESSAGES` and
//! `RUNS` in the environment change the 1 000 000 messages per run and the five runs (one
//! short run suits `valgrind --tool=callgrind`, whose instruction counts do not vary).

/// A count from the environment, or `default`.
fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant as StdInstant};

use common::{instant, Pair, PairConfig, Side};
use engine::{Engine, Memory, RecvWr, SendWr, SgeList, WcStatus, WorkCompletion};

const DEPTH: u64 = 128;

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Send,
    Write,
}

/// Hand every packet the engine emits straight back to it, and fire due timers.
fn pump(e: &mut Engine, start: StdInstant, buf: &mut [u8]) {
    let now = instant(start.elapsed());
    if e.poll_timeout().is_some_and(|t| t <= now) {
        e.handle_timeout(now);
    }
    while let Some(t) = e.poll_transmit(now, buf) {
        assert!(t.internal, "both QPs are on this engine");
        e.handle_internal(now, &buf[..t.len]);
    }
}

/// One run of `messages` messages; returns the time per message.
/// `first`: the receive queue is still empty (later SEND runs find the `DEPTH` receives the
/// last one reposted).
fn run(p: &mut Pair, a: &Side, b: &Side, op: Op, first: bool, messages: u64) -> Duration {
    let (qa, qb) = (a.qpn, b.qpn);
    let mut buf = vec![0u8; 16384];
    let mut wcs = vec![WorkCompletion::default(); 64];
    let e = p.engine(a);
    let start = StdInstant::now();
    if op == Op::Send && first {
        for i in 0..DEPTH {
            e.post_recv(qb, RecvWr::new(i, SgeList::from_slice(&[b.sge(0, 2)])))
                .expect("post_recv");
        }
    }
    let (mut posted, mut done) = (0u64, 0u64);
    while done < messages {
        while posted < messages && posted - done < DEPTH {
            let wr = match op {
                Op::Send => SendWr::send(posted, SgeList::from_slice(&[a.sge(0, 2)])),
                Op::Write => SendWr::rdma_write(
                    posted,
                    SgeList::from_slice(&[a.sge(0, 2)]),
                    b.addr(0),
                    b.mr.rkey,
                ),
            };
            e.post_send(qa, wr).expect("post_send");
            posted += 1;
        }
        pump(e, start, &mut buf);
        if op == Op::Send {
            let n = e.poll_cq_into(b.recv_cq, &mut wcs).expect("poll");
            for wc in &wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                e.post_recv(
                    qb,
                    RecvWr::new(wc.wr_id, SgeList::from_slice(&[b.sge(0, 2)])),
                )
                .expect("post_recv");
            }
        }
        let n = e.poll_cq_into(a.send_cq, &mut wcs).expect("poll");
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
        }
        done += n as u64;
    }
    start.elapsed() / messages as u32
}

fn main() {
    let cfg = PairConfig {
        one_host: true,
        depth: 4096,
        cq_depth: 8192,
        ..PairConfig::default()
    };
    let messages = env_or("MESSAGES", 1_000_000).max(1);
    let runs = env_or("RUNS", 5).max(1) as usize;
    let mut p = Pair::new(cfg);
    let (a, b) = (p.a, p.b);
    // The baseline: the same 2 bytes copied through the same test memory, per message.
    let mut mem = p.mem(&a);
    let mut two = [0u8; 2];
    let start = StdInstant::now();
    for i in 0..messages {
        mem.read(common::OWNER, a.addr(i % 64), &mut two)
            .expect("read");
        mem.write(common::OWNER, a.addr(64 + i % 64), &two)
            .expect("write");
    }
    let copy = start.elapsed() / messages as u32;
    println!("engine, one host, 2-byte messages {DEPTH} deep, {messages} per run, {runs} runs");
    println!("| op | ns/message median | min–max | M msg/s | memcpy baseline ns |");
    println!("|---|---|---|---|---|");
    for (name, op) in [("SEND", Op::Send), ("WRITE", Op::Write)] {
        let mut t: Vec<Duration> = (0..runs)
            .map(|i| run(&mut p, &a, &b, op, i == 0, messages))
            .collect();
        t.sort();
        let med = t[runs / 2];
        println!(
            "| {name} | {} | {}–{} | {:.2} | {} |",
            med.as_nanos(),
            t[0].as_nanos(),
            t[runs - 1].as_nanos(),
            1e3 / med.as_nanos() as f64,
            copy.as_nanos()
        );
    }
}
