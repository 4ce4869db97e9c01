//! Asynchronous events through the drop-in (`ibv_get_async_event`, `ibv_ack_async_event`,
//! `context->async_fd`), driven by rdma-core's own pyverbs test resources: an SRQ armed with a
//! limit falls below it, the context's async descriptor becomes readable, the event names the
//! SRQ's limit, and the descriptor is quiet again once it is taken. On a `softrdmad` of the
//! test's own and on the embedded device.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{configure, describe, free_udp_port, run, suite_copy, On, TestDaemon, PYTHON};

fn srq_limit_event(device: &str, on: On<'_>) {
    let suite = suite_copy();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scripts/srq_limit_event.py");
    let root = suite.parent().expect("suite has a parent");
    let mut c = Command::new(PYTHON);
    c.arg(script)
        .arg(device)
        .current_dir(root)
        // The suite's modules import each other both as `tests.x` and as `x`.
        .env(
            "PYTHONPATH",
            format!("{}:{}", root.display(), suite.display()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    configure(&mut c, on);
    let o = run(c, Duration::from_secs(60));
    assert!(o.status.success(), "{}", describe(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("SRQ limit event OK"),
        "{}",
        describe(&o)
    );
}

#[test]
fn an_srq_limit_event_reaches_ibv_get_async_event_through_the_daemon() {
    let mut d = TestDaemon::start(&["127.0.0.1"]);
    srq_limit_event(
        "srxe0",
        On::Daemon {
            daemon: &d,
            addr: "127.0.0.1",
        },
    );
    d.assert_alive();
}

#[test]
fn an_srq_limit_event_reaches_ibv_get_async_event_on_the_embedded_device() {
    srq_limit_event(
        "softrdma0",
        On::Embedded {
            addr: "127.0.0.1",
            port: free_udp_port(),
        },
    );
}
