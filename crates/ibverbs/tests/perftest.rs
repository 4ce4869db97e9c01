//! perftest (Debian package perftest, unmodified) as two processes on one host through the
//! drop-in library, both on one `softrdmad` (the default backend; two on embedded devices
//! too): each benchmark completes on both sides and prints its result row.
//! Figures are not asserted (a loaded 2-core machine decides them); only that they exist.

mod common;

use std::process::Output;
use std::time::Duration;

use common::{assert_side_succeeded, describe, free_tcp_port, require, server_client, Backend};

const LIMIT: Duration = Duration::from_secs(180);
const ITERS: &str = "50";

/// The result row: first column the message size, second the iteration count.
fn result_row<'a>(text: &'a str, size: &str) -> Option<&'a str> {
    text.lines().find(|l| {
        let mut f = l.split_whitespace();
        f.next() == Some(size) && f.next() == Some(ITERS)
    })
}

fn check(o: &Output, other: &Output, size: &str, client: bool, backend: Backend) {
    assert_side_succeeded(o, other);
    let text = String::from_utf8_lossy(&o.stdout);
    // The daemon's device, or the embedded one.
    let device = match backend {
        Backend::Daemon => "Device         : srxe0",
        Backend::Embedded => "Device         : softrdma0",
    };
    assert!(text.contains(device), "{}", describe(o));
    assert!(
        text.contains("Link type       : Ethernet"),
        "{}",
        describe(o)
    );
    // The latency tests print their table on the client only; the bandwidth tests on both.
    if client {
        assert!(
            result_row(&text, size).is_some(),
            "no result row: {}",
            describe(o)
        );
    }
}

fn bench(prog: &str, size: &str, server_prints_results: bool, backend: Backend) {
    require(prog, "perftest");
    let port = free_tcp_port().to_string();
    let server = ["-n", ITERS, "-p", &port];
    let client = ["-n", ITERS, "-p", &port, "127.0.0.1"];
    let (so, co) = server_client(prog, &server, &client, backend, LIMIT);
    check(&co, &so, size, true, backend);
    check(&so, &co, size, server_prints_results, backend);
}

/// `-a`: every size from 2 bytes to 8 MiB, a few iterations each; every row is printed.
fn bench_all_sizes(prog: &str) {
    require(prog, "perftest");
    let port = free_tcp_port().to_string();
    let n = "5";
    let server = ["-a", "-n", n, "-p", &port];
    let client = ["-a", "-n", n, "-p", &port, "127.0.0.1"];
    let (so, co) = server_client(prog, &server, &client, Backend::Daemon, LIMIT);
    let both = || format!("server: {}\nclient: {}", describe(&so), describe(&co));
    assert!(so.status.success(), "{}", both());
    assert!(co.status.success(), "{}", both());
    let text = String::from_utf8_lossy(&co.stdout);
    for shift in 1..=23 {
        let size = (1u64 << shift).to_string();
        let found = text.lines().any(|l| {
            let mut f = l.split_whitespace();
            f.next() == Some(size.as_str()) && f.next() == Some(n)
        });
        assert!(found, "no row for {size} bytes: {}", describe(&co));
    }
}

#[test]
fn ib_write_bw_runs_every_size() {
    bench_all_sizes("ib_write_bw");
}

#[test]
fn ib_read_bw_runs_every_size() {
    bench_all_sizes("ib_read_bw");
}

#[test]
fn ib_send_bw_runs_every_size() {
    bench_all_sizes("ib_send_bw");
}

#[test]
fn ib_write_bw_completes_at_the_default_size() {
    bench("ib_write_bw", "65536", true, Backend::Daemon);
}

#[test]
fn ib_send_bw_completes_at_the_default_size() {
    bench("ib_send_bw", "65536", true, Backend::Daemon);
}

#[test]
fn ib_read_bw_completes_at_the_default_size() {
    bench("ib_read_bw", "65536", true, Backend::Daemon);
}

#[test]
fn ib_atomic_bw_completes() {
    bench("ib_atomic_bw", "8", true, Backend::Daemon);
}

#[test]
fn ib_write_lat_completes_at_the_default_size() {
    bench("ib_write_lat", "2", false, Backend::Daemon);
}

#[test]
fn ib_read_lat_completes_at_the_default_size() {
    bench("ib_read_lat", "2", false, Backend::Daemon);
}

#[test]
fn ib_send_lat_completes_at_the_default_size() {
    bench("ib_send_lat", "2", false, Backend::Daemon);
}

#[test]
fn ib_atomic_lat_completes() {
    bench("ib_atomic_lat", "8", false, Backend::Daemon);
}

#[test]
fn ib_write_bw_completes_on_embedded_devices() {
    bench("ib_write_bw", "65536", true, Backend::Embedded);
}

#[test]
fn ib_write_lat_completes_on_embedded_devices() {
    bench("ib_write_lat", "2", false, Backend::Embedded);
}

// The latency programs take `-a` too. The atomic ones have no sizes: perftest itself
// refuses `-a` for them ("Message size cannot be changed for Atomic tests").

#[test]
fn ib_write_lat_runs_every_size() {
    bench_all_sizes("ib_write_lat");
}

#[test]
fn ib_read_lat_runs_every_size() {
    bench_all_sizes("ib_read_lat");
}

#[test]
fn ib_send_lat_runs_every_size() {
    bench_all_sizes("ib_send_lat");
}
