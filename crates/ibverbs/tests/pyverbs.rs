//! rdma-core's own test suite (Debian python3-pyverbs, tests under
//! /usr/share/doc/rdma-core/tests) against the drop-in library on a `softrdmad` of each test's
//! own (the default backend): the modules for what we offer end with no failure and no error. Skips are the suite's own, for features not offered
//! (extended QPs, memory windows, device memory, dma-buf, rereg, XRC, EFA/mlx5 specifics).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{configure, describe, run, suite_copy, On, TestDaemon, PYTHON};

fn run_module(module: &str) {
    let dir = suite_copy();
    let mut daemon = TestDaemon::start(&["127.0.0.1"]);
    let mut c = Command::new(PYTHON);
    c.arg(dir.join("run_tests.py"))
        .args(["-v", "-k", module])
        .current_dir(dir.parent().expect("suite has a parent"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    configure(
        &mut c,
        On::Daemon {
            daemon: &daemon,
            addr: "127.0.0.1",
        },
    );
    let o = run(c, Duration::from_secs(300));
    daemon.assert_alive();
    // unittest reports on stderr.
    let report = String::from_utf8_lossy(&o.stderr);
    let ran = report.lines().any(|l| l.starts_with("Ran "));
    let failed = report
        .lines()
        .any(|l| l.starts_with("FAIL:") || l.starts_with("ERROR:") || l.starts_with("FAILED"));
    assert!(
        o.status.success() && ran && !failed,
        "{module}: {}",
        describe(&o)
    );
}

#[test]
fn pyverbs_test_device_passes() {
    run_module("test_device");
}

#[test]
fn pyverbs_test_pd_passes() {
    run_module("test_pd");
}

#[test]
fn pyverbs_test_mr_passes() {
    run_module("test_mr");
}

#[test]
fn pyverbs_test_cq_passes() {
    run_module("test_cq");
}

#[test]
fn pyverbs_test_cq_events_passes() {
    run_module("test_cq_events");
}

#[test]
fn pyverbs_test_qp_passes() {
    run_module("test_qp");
}

#[test]
fn pyverbs_test_atomic_passes() {
    run_module("test_atomic");
}

#[test]
fn pyverbs_test_addr_passes() {
    run_module("test_addr");
}
