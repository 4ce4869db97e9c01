//! Asynchronous events through the drop-in (`ibv_get_async_event`, `ibv_ack_async_event`,
//! `context->async_fd`), driven by rdma-core's own pyverbs test resources: an SRQ armed with a
//! limit falls below it, the context's async descriptor becomes readable, the event names the
//! SRQ's limit, and the descriptor is quiet again once it is taken. On a `softrdmad` of the
//! test's own and on the embedded device.

mod common;

use common::{free_udp_port, run_suite_script, On, TestDaemon};

fn srq_limit_event(device: &str, on: On<'_>) {
    run_suite_script("srq_limit_event.py", device, on, "SRQ limit event OK");
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
