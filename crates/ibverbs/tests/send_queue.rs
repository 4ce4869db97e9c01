//! `ibv_post_send` on a full send queue fails with `ENOMEM` through the drop-in, on a
//! `softrdmad` of the test's own and on the embedded device: `max_send_wr` outstanding WRs
//! (unsignaled ones included) are taken, one more is not, and a polled completion makes
//! room again. Driven by rdma-core's own pyverbs test resources.

mod common;

use common::{free_udp_port, run_suite_script, On, TestDaemon};

fn send_queue_full(device: &str, on: On<'_>) {
    run_suite_script("send_queue_full.py", device, on, "send queue full OK");
}

#[test]
fn a_full_send_queue_refuses_ibv_post_send_with_enomem_through_the_daemon() {
    let mut d = TestDaemon::start(&["127.0.0.1"]);
    send_queue_full(
        "srxe0",
        On::Daemon {
            daemon: &d,
            addr: "127.0.0.1",
        },
    );
    d.assert_alive();
}

#[test]
fn a_full_send_queue_refuses_ibv_post_send_with_enomem_on_the_embedded_device() {
    send_queue_full(
        "softrdma0",
        On::Embedded {
            addr: "127.0.0.1",
            port: free_udp_port(),
        },
    );
}
