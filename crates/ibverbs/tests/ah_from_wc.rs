//! `ibv_create_ah_from_wc` answers a datagram: a C program built against Debian's
//! libibverbs (tests/programs/ah_from_wc.c) runs on the drop-in as two processes. The
//! requester sends "ping" to the responder's UD QP; the responder checks the GRH in front of
//! it, builds the reply's AH from the work completion and the receive buffer
//! (`ibv_init_ah_from_wc` and `ibv_create_ah_from_wc`, compared with the packet's header),
//! and sends "pong" through it; the requester must receive it from the responder's QP and
//! address. The responder then checks that bad input fails with rdma-core's errno; the
//! requester takes the reply's event from a completion channel shared by its two CQs. Over
//! IPv4 (two addresses) and IPv6 (::1, the one IPv6 address a test host surely has), on a
//! `softrdmad` of each test's own and on embedded devices.
//!
//! On the daemon both GRHs carry the requester's hop limit, traffic class and flow label:
//! the reply's AH took them from the ping. An embedded device receives on a UDP socket and
//! rebuilds the IP header (hop limit 64, class 0, label 0: the socket does not report the
//! packet's), so there the values are only checked against the GRH the device wrote.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{describe, finish, free_udp_port, run, verbs_command, Guard, On, TestDaemon};

/// How long each process may take (each finishes in well under a second).
const LIMIT: Duration = Duration::from_secs(30);

/// The C program, compiled once per test process against Debian's libibverbs (the drop-in
/// replaces that library at run time).
fn program() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| common::verbs_program("ah_from_wc", &[]))
        .clone()
}

/// One process of the exchange: its device, its address, and the UDP port it sends to when
/// that is not its own (two embedded devices sharing ::1).
struct Side<'a> {
    on: On<'a>,
    ip: &'a str,
    remote_port: Option<u16>,
}

fn command(side: &Side<'_>, args: &[&str]) -> Command {
    let prog = program();
    let mut c = verbs_command(prog.to_str().expect("UTF-8 path"), args, side.on);
    if let Some(p) = side.remote_port {
        c.env("SOFTRDMA_REMOTE_PORT", p.to_string());
    }
    c
}

/// What the GRHs must say when they are the packets' own headers: the requester's hop
/// limit, traffic class and flow label (none for IPv4).
const V4_GRH: &str = "GRH hop_limit=33 traffic_class=32 flow_label=0x0";
const V6_GRH: &str = "GRH hop_limit=33 traffic_class=32 flow_label=0x12345";

/// Run the responder, then (once it has written its QPN) the requester; both must pass and,
/// given `grh`, print it for the GRH they received.
fn reply_round_trip(responder: Side<'_>, requester: Side<'_>, grh: Option<&str>) {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let ready = program().with_file_name(format!("ready-{n}"));
    let _ = std::fs::remove_file(&ready);
    let ready_s = ready.to_str().expect("UTF-8 path");
    let mut guard = Guard(Some(
        command(&responder, &["responder", requester.ip, ready_s])
            .spawn()
            .expect("spawn the responder"),
    ));
    let start = Instant::now();
    let qpn = loop {
        if let Ok(s) = std::fs::read_to_string(&ready) {
            break s.trim().to_string();
        }
        let child = guard.0.as_mut().expect("the responder");
        let ended = child.try_wait().expect("try_wait").is_some();
        if ended || start.elapsed() > LIMIT {
            let (o, _) = finish(guard, Duration::from_secs(1));
            panic!("the responder never got ready: {}", describe(&o));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let req = run(
        command(&requester, &["requester", responder.ip, &qpn]),
        LIMIT,
    );
    let (resp, timed_out) = finish(guard, LIMIT);
    let _ = std::fs::remove_file(&ready);
    let both = format!(
        "responder: {}\nrequester: {}",
        describe(&resp),
        describe(&req)
    );
    assert!(!timed_out, "the responder timed out\n{both}");
    assert!(
        resp.status.success() && String::from_utf8_lossy(&resp.stdout).contains("RESPONDER OK"),
        "{both}"
    );
    assert!(
        req.status.success() && String::from_utf8_lossy(&req.stdout).contains("REQUESTER OK"),
        "{both}"
    );
    if let Some(grh) = grh {
        for o in [&resp, &req] {
            assert!(
                String::from_utf8_lossy(&o.stdout).contains(grh),
                "want {grh}\n{both}"
            );
        }
    }
}

#[test]
fn a_reply_addressed_from_the_work_completion_reaches_the_sender_over_ipv4_on_the_daemon() {
    let mut d = TestDaemon::start(&["127.0.0.1", "127.0.0.2"]);
    let on = |addr| On::Daemon { daemon: &d, addr };
    reply_round_trip(
        Side {
            on: on("127.0.0.1"),
            ip: "127.0.0.1",
            remote_port: None,
        },
        Side {
            on: on("127.0.0.2"),
            ip: "127.0.0.2",
            remote_port: None,
        },
        Some(V4_GRH),
    );
    d.assert_alive();
}

#[test]
fn a_reply_addressed_from_the_work_completion_reaches_the_sender_over_ipv6_on_the_daemon() {
    let mut d = TestDaemon::start(&["::1"]);
    let side = || Side {
        on: On::Daemon {
            daemon: &d,
            addr: "::1",
        },
        ip: "::1",
        remote_port: None,
    };
    reply_round_trip(side(), side(), Some(V6_GRH));
    d.assert_alive();
}

#[test]
fn a_reply_addressed_from_the_work_completion_reaches_the_sender_over_ipv4_embedded() {
    let port = free_udp_port();
    let side = |addr| Side {
        on: On::Embedded { addr, port },
        ip: addr,
        remote_port: None,
    };
    reply_round_trip(side("127.0.0.1"), side("127.0.0.2"), None);
}

#[test]
fn a_reply_addressed_from_the_work_completion_reaches_the_sender_over_ipv6_embedded() {
    // Both devices are on ::1: each on a port of its own, sending to the other's.
    let a = free_udp_port();
    let b = std::iter::repeat_with(free_udp_port)
        .find(|&b| b != a)
        .expect("a second free port");
    let side = |port, remote| Side {
        on: On::Embedded { addr: "::1", port },
        ip: "::1",
        remote_port: Some(remote),
    };
    reply_round_trip(side(a, b), side(b, a), None);
}
