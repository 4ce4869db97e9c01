//! Unmodified verbs programs under valgrind's memcheck, as C developers debug theirs: perftest
//! through the drop-in library on both backends runs to its result row, and memcheck finds
//! no error in it (`--error-exitcode`).
//!
//! Valgrind runs a program with an auxiliary vector of its own and no vDSO of the kernel's:
//! the library must take what it needs from libc (`getauxval`, `sysconf`), not from the
//! kernel's copy of the vector (`PR_GET_AUXV`), whose vDSO address is not mapped there.

mod common;

use std::time::Duration;

use common::{assert_side_succeeded, describe, free_tcp_port, require, server_client, Backend};

/// Generous: memcheck runs a program 20-50 times slower.
const LIMIT: Duration = Duration::from_secs(300);
const ITERS: &str = "100";
const SIZE: &str = "64";

fn under_memcheck(backend: Backend) {
    require("valgrind", "valgrind");
    require("ib_send_bw", "perftest");
    let port = free_tcp_port().to_string();
    let memcheck = ["-q", "--error-exitcode=99", "ib_send_bw"];
    let args = ["-s", SIZE, "-n", ITERS, "-p", &port];
    let server: Vec<&str> = memcheck.iter().chain(&args).copied().collect();
    let client: Vec<&str> = server.iter().copied().chain(["127.0.0.1"]).collect();
    let (so, co) = server_client("valgrind", &server, &client, backend, LIMIT);
    for (o, other) in [(&so, &co), (&co, &so)] {
        assert_side_succeeded(o, other);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!err.contains("=="), "memcheck reported: {}", describe(o));
        let text = String::from_utf8_lossy(&o.stdout);
        let row = text.lines().any(|l| {
            let mut f = l.split_whitespace();
            f.next() == Some(SIZE) && f.next() == Some(ITERS)
        });
        assert!(row, "no result row: {}", describe(o));
    }
}

#[test]
fn perftest_runs_clean_under_memcheck_on_the_daemon() {
    under_memcheck(Backend::Daemon);
}

#[test]
fn perftest_runs_clean_under_memcheck_on_embedded_devices() {
    under_memcheck(Backend::Embedded);
}
