//! `ibv_close_device` ends the device's reach into the memory of the regions a program left
//! registered, as a NIC's close ends its DMA: a C program built against Debian's libibverbs
//! (tests/programs/close_with_regions.c) closes a context whose region a second context's
//! QP keeps writing with RDMA WRITEs, then checks that no WRITE lands after the close
//! returned, that every byte stayed, that the pages are the program's private memory again
//! (softrdmad had adopted them into shared memory), and that a device opened afterwards
//! adopts them again.
//!
//! On softrdmad only: the drop-in's contexts on the embedded device share one engine, where
//! closing one context leaves its objects to the others.

mod common;

use std::time::Duration;

use common::{describe, run, verbs_command, On, TestDaemon};

#[test]
fn closing_a_device_ends_its_reach_into_regions_left_registered() {
    let prog = common::verbs_program("close_with_regions", &["-lpthread"]);
    let mut d = TestDaemon::start(&["127.0.0.1"]);
    let before = d.counters();
    let o = run(
        verbs_command(
            prog.to_str().expect("UTF-8 path"),
            &[],
            On::Daemon {
                daemon: &d,
                addr: "127.0.0.1",
            },
        ),
        Duration::from_secs(60),
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("CLOSE OK: adopted"),
        "{}",
        describe(&o)
    );
    let count = |c: &std::collections::BTreeMap<String, u64>, k: &str| c.get(k).copied();
    let after = d.counters();
    assert!(
        count(&after, "reclaimed_mrs") > count(&before, "reclaimed_mrs"),
        "the closed context's region was reclaimed: {before:?} -> {after:?}"
    );
    d.assert_alive();
}
