//! rdma-core's own test suite (Debian python3-pyverbs, tests under
//! /usr/share/doc/rdma-core/tests) against the drop-in library on a `softrdmad` of each test's
//! own (the default backend): the modules for what we offer end with no failure and no error.
//! Skips are the suite's own, for features not offered (atomic write, device memory, dma-buf,
//! resize CQ, XRC, raw packet QPs, EFA/mlx5 specifics). test_mr and test_qpex also run on
//! the embedded device; their memory window, re-registration and extended QP tests must run,
//! not skip.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    configure, describe, free_udp_port, run, run_suite_script, suite_copy, On, TestDaemon, PYTHON,
};

/// Run one module of the suite on `on`'s device; returns unittest's report.
fn run_module_on(module: &str, on: On<'_>) -> String {
    let dir = suite_copy();
    let mut c = Command::new(PYTHON);
    c.arg(dir.join("run_tests.py"))
        .args(["-v", "-k", module])
        .current_dir(dir.parent().expect("suite has a parent"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    configure(&mut c, on);
    let o = run(c, Duration::from_secs(300));
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
    report.into_owned()
}

/// Run one module on a `softrdmad` of its own.
fn run_module(module: &str) -> String {
    let mut daemon = TestDaemon::start(&["127.0.0.1"]);
    let report = run_module_on(
        module,
        On::Daemon {
            daemon: &daemon,
            addr: "127.0.0.1",
        },
    );
    daemon.assert_alive();
    report
}

/// The memory window and re-registration tests of test_mr passed (rather than skipped).
fn assert_memory_windows_ran(report: &str) {
    for t in [
        "test_mr_rereg_access",
        "test_mr_rereg_access_bad_flow",
        "test_mr_rereg_pd",
        "test_mr_rereg_addr",
    ] {
        // unittest prints a test's docstring (when it has one) after its name, then "ok".
        let name = format!("{t} (tests.test_mr.MRTest.{t})");
        let mut lines = report.lines().skip_while(|l| !l.starts_with(&name));
        let passed = match lines.next() {
            Some(l) if l.ends_with("... ok") => true,
            Some(l) if l == name => lines.next().is_some_and(|d| d.ends_with("... ok")),
            _ => false,
        };
        assert!(passed, "{t} did not pass:\n{report}");
    }
    for t in [
        "test_mw_type1",
        "test_mw_type2",
        "test_invalidate_mw_type1",
        "test_mw_type2_invalidate_local",
        "test_mw_type2_invalidate_remote",
        "test_mw_type2_invalidate_dealloc",
    ] {
        let line = format!("{t} (tests.test_mr.MWTest.{t}) ... ok");
        assert!(report.contains(&line), "{t} did not pass:\n{report}");
    }
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
    assert_memory_windows_ran(&run_module("test_mr"));
}

#[test]
fn pyverbs_test_mr_passes_on_the_embedded_device() {
    let on = On::Embedded {
        addr: "127.0.0.1",
        port: free_udp_port(),
    };
    assert_memory_windows_ran(&run_module_on("test_mr", on));
}

#[test]
fn pyverbs_test_qpex_passes_on_the_embedded_device() {
    let on = On::Embedded {
        addr: "127.0.0.1",
        port: free_udp_port(),
    };
    assert_extended_qps_ran(&run_module_on("test_qpex", on));
}

#[test]
fn pyverbs_test_qpex_passes() {
    // The whole module, its full-RQ bad flow (ENOMEM past max_recv_wr) included.
    let report = run_module("test_qpex");
    assert_extended_qps_ran(&report);
    assert!(
        report.contains(
            "test_full_rq_bad_flow (tests.test_qpex.QpExTestCase.test_full_rq_bad_flow) ... ok"
        ),
        "{report}"
    );
}

/// The extended QP traffic tests of test_qpex passed (rather than skipped).
fn assert_extended_qps_ran(report: &str) {
    for t in [
        "test_qp_ex_rc_send",
        "test_qp_ex_rc_rdma_write_imm",
        "test_qp_ex_rc_rdma_read",
        "test_qp_ex_rc_atomic_cmp_swp",
        "test_qp_ex_rc_atomic_fetch_add",
        "test_qp_ex_ud_send_imm",
    ] {
        let line = format!("{t} (tests.test_qpex.QpExTestCase.{t}) ... ok");
        assert!(report.contains(&line), "{t} did not pass:\n{report}");
    }
}

#[test]
fn pyverbs_test_cq_passes() {
    // Also matches test_cqex (and test_cq_events): the extended CQ traffic must run.
    let report = run_module("test_cq");
    for t in ["test_rc_traffic_cq_ex", "test_ud_traffic_cq_ex"] {
        let line = format!("{t} (tests.test_cqex.CqExTestCase.{t}) ... ok");
        assert!(report.contains(&line), "{t} did not pass:\n{report}");
    }
    // ibv_resize_cq: grown, shrunk, and refused below the completions waiting. Its
    // docstring's first line comes between the name and the verdict.
    let mut lines = report
        .lines()
        .skip_while(|l| !l.starts_with("test_resize_cq (tests.test_cq.CQTest.test_resize_cq)"));
    let verdict = lines.nth(1).unwrap_or_default();
    assert!(
        verdict.starts_with("Test resize CQ") && verdict.ends_with("... ok"),
        "test_resize_cq did not pass:\n{report}"
    );
}

#[test]
fn pyverbs_test_cq_events_passes() {
    run_module("test_cq_events");
}

#[test]
fn pyverbs_test_qp_passes() {
    // The module test_qp only (a plain `test_qp` also matches test_qpex).
    run_module("tests.test_qp.");
}

#[test]
fn pyverbs_test_atomic_passes() {
    run_module("test_atomic");
}

#[test]
fn pyverbs_test_addr_passes() {
    run_module("test_addr");
}

#[test]
fn an_inline_send_built_with_the_extended_api_carries_its_bytes() {
    // Through the daemon and on the embedded device; the SGE's key is deliberately wrong:
    // inline data is copied, never fetched by key.
    let mut d = TestDaemon::start(&["127.0.0.1"]);
    let on = On::Daemon {
        daemon: &d,
        addr: "127.0.0.1",
    };
    run_suite_script("qp_ex_inline_send.py", "srxe0", on, "inline ex send OK");
    d.assert_alive();
    let on = On::Embedded {
        addr: "127.0.0.1",
        port: free_udp_port(),
    };
    run_suite_script("qp_ex_inline_send.py", "softrdma0", on, "inline ex send OK");
}

#[test]
fn pyverbs_test_relaxed_ordering_passes() {
    run_module("test_relaxed_ordering");
}

#[test]
fn pyverbs_test_fork_passes() {
    run_module("test_fork");
}
