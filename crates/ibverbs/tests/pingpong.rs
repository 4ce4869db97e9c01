//! The pingpongs of Debian ibverbs-utils (rc, uc, ud, srq; unmodified) as two processes on one
//! host through the drop-in library: both on the device of one `softrdmad` (the default
//! backend), and (rc) each with its own embedded device on 127.0.0.1 and 127.0.0.2.

mod common;

use std::process::Output;
use std::time::Duration;

use common::{describe, free_tcp_port, require, server_client, Backend};

const LIMIT: Duration = Duration::from_secs(120);

fn assert_summary(o: &Output, iters: u32, size: u32) {
    assert!(o.status.success(), "{}", describe(o));
    let text = String::from_utf8_lossy(&o.stdout);
    let bytes = u64::from(iters) * u64::from(size) * 2;
    assert!(
        text.contains(&format!("{bytes} bytes in ")),
        "no byte summary: {}",
        describe(o)
    );
    assert!(
        text.contains(&format!("{iters} iters in ")),
        "no iteration summary: {}",
        describe(o)
    );
    assert!(text.contains("GID ::ffff:127.0.0."), "{}", describe(o));
}

/// On the daemon both processes use its one device: the local and the remote GID are both
/// 127.0.0.1.
fn assert_one_device(o: &Output) {
    let text = String::from_utf8_lossy(&o.stdout);
    for side in ["local address:", "remote address:"] {
        let line = text
            .lines()
            .find(|l| l.contains(side))
            .unwrap_or_else(|| panic!("no {side} line: {}", describe(o)));
        assert!(line.ends_with("GID ::ffff:127.0.0.1"), "{line}");
    }
}

fn pingpong(prog: &str, extra: &[&str], iters: u32, size: u32, backend: Backend) {
    require(prog, "ibverbs-utils");
    let port = free_tcp_port().to_string();
    let n = iters.to_string();
    let s = size.to_string();
    let mut server = vec!["-g", "0", "-p", &port, "-n", &n, "-s", &s];
    server.extend_from_slice(extra);
    let mut client = server.clone();
    client.push("127.0.0.1");
    let (so, co) = server_client(prog, &server, &client, backend, LIMIT);
    assert_summary(&so, iters, size);
    assert_summary(&co, iters, size);
    if backend == Backend::Daemon {
        assert_one_device(&so);
        assert_one_device(&co);
    }
}

#[test]
fn rc_pingpong_completes_between_two_processes_through_one_daemon() {
    // -c: every received buffer is checked against what the peer sent.
    pingpong("ibv_rc_pingpong", &["-c"], 200, 4096, Backend::Daemon);
}

#[test]
fn rc_pingpong_completes_in_event_mode_through_one_daemon() {
    pingpong("ibv_rc_pingpong", &["-e"], 200, 4096, Backend::Daemon);
}

#[test]
fn rc_pingpong_completes_with_large_messages() {
    pingpong("ibv_rc_pingpong", &[], 20, 65536, Backend::Daemon);
}

#[test]
fn rc_pingpong_completes_between_two_embedded_devices() {
    pingpong("ibv_rc_pingpong", &["-c"], 200, 4096, Backend::Embedded);
}

#[test]
fn rc_pingpong_completes_in_event_mode_on_embedded_devices() {
    pingpong("ibv_rc_pingpong", &["-e"], 100, 4096, Backend::Embedded);
}

#[test]
fn uc_pingpong_completes_between_two_processes() {
    pingpong("ibv_uc_pingpong", &["-c"], 200, 4096, Backend::Daemon);
}

#[test]
fn uc_pingpong_completes_in_event_mode() {
    pingpong("ibv_uc_pingpong", &["-e"], 100, 4096, Backend::Daemon);
}

#[test]
fn ud_pingpong_completes_between_two_processes() {
    // UD messages are one packet: at most the MTU (2048 is the program's default).
    pingpong("ibv_ud_pingpong", &["-c"], 200, 2048, Backend::Daemon);
}

#[test]
fn ud_pingpong_completes_in_event_mode() {
    pingpong("ibv_ud_pingpong", &["-e"], 100, 2048, Backend::Daemon);
}

#[test]
fn srq_pingpong_completes_between_two_processes() {
    // 16 QPs sharing one SRQ on each side.
    pingpong("ibv_srq_pingpong", &["-c"], 200, 4096, Backend::Daemon);
}

#[test]
fn srq_pingpong_completes_in_event_mode() {
    pingpong("ibv_srq_pingpong", &["-e"], 100, 4096, Backend::Daemon);
}
