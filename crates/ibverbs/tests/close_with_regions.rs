//! `ibv_close_device` ends the device's reach into the memory of the regions a program left
//! registered, as a NIC's close ends its DMA: a C program built against Debian's libibverbs
//! (tests/programs/close_with_regions.c) closes a context whose region a second context's
//! QP keeps writing with RDMA WRITEs, then checks that no WRITE lands after the close
//! returned, that every byte stayed, that the pages are the program's private memory again
//! (softrdmad had adopted them into shared memory), and that a device opened afterwards
//! adopts them again. Last, a child made by `fork` closes every context it inherited, and
//! must exit cleanly while the parent's device goes on working (the device's threads and
//! connections are the parent's).
//!
//! On the embedded device the drop-in's contexts share one engine: there the close destroys
//! the objects the closed context left, and the program checks the same.

mod common;

use std::time::Duration;

use common::{describe, free_udp_port, run, verbs_command, On, TestDaemon};

/// Run the program on `on`; its output.
fn close_with_regions(on: On<'_>) -> String {
    let prog = common::verbs_program("close_with_regions", &["-lpthread"]);
    let o = run(
        verbs_command(prog.to_str().expect("UTF-8 path"), &[], on),
        Duration::from_secs(60),
    );
    close_ok(o)
}

/// The output of a run that printed "CLOSE OK" and succeeded.
fn close_ok(o: std::process::Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.contains("CLOSE OK"),
        "{}",
        describe(&o)
    );
    out
}

#[test]
fn closing_a_device_ends_its_reach_into_regions_left_registered() {
    let mut d = TestDaemon::start(&["127.0.0.1"]);
    let before = d.counters();
    let out = close_with_regions(On::Daemon {
        daemon: &d,
        addr: "127.0.0.1",
    });
    assert!(out.contains("CLOSE OK: adopted"), "{out}");
    let count = |c: &std::collections::BTreeMap<String, u64>, k: &str| c.get(k).copied();
    let after = d.counters();
    assert!(
        count(&after, "reclaimed_mrs") > count(&before, "reclaimed_mrs"),
        "the closed context's region was reclaimed: {before:?} -> {after:?}"
    );
    d.assert_alive();
}

#[test]
fn closing_one_of_two_embedded_contexts_destroys_what_it_left() {
    let out = close_with_regions(On::Embedded {
        addr: "127.0.0.1",
        port: free_udp_port(),
    });
    assert!(out.contains("CLOSE OK: not adopted"), "{out}");
}

/// Where a sandbox refuses `userfaultfd(2)` (a container's seccomp profile), registration
/// adopts nothing and everything else works the same: regions are reached through
/// `/proc/<pid>/mem`.
#[test]
fn without_userfaultfd_nothing_is_adopted_and_nothing_else_changes() {
    let prog = common::verbs_program("close_with_regions", &["-lpthread"]);
    let sandbox = common::verbs_program("without_userfaultfd", &[]);
    let mut d = TestDaemon::start(&["127.0.0.1"]);
    let o = run(
        verbs_command(
            sandbox.to_str().expect("UTF-8 path"),
            &[prog.to_str().expect("UTF-8 path")],
            On::Daemon {
                daemon: &d,
                addr: "127.0.0.1",
            },
        ),
        Duration::from_secs(60),
    );
    let out = close_ok(o);
    assert!(out.contains("CLOSE OK: not adopted"), "{out}");
    d.assert_alive();
}

/// Run tests/programs/close_leftovers.c on `on`: contexts closed with a PD, CQ, MR and QP
/// left on them, 200 times; the process's descriptors and address space stay flat.
fn close_leftovers(on: On<'_>) {
    let prog = common::verbs_program("close_leftovers", &[]);
    let o = run(
        verbs_command(prog.to_str().expect("UTF-8 path"), &["200"], on),
        Duration::from_secs(120),
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("LEFTOVERS OK"),
        "{}",
        describe(&o)
    );
}

#[test]
fn closing_with_objects_left_releases_what_they_held_on_the_daemon() {
    let mut d = TestDaemon::start(&["127.0.0.1"]);
    close_leftovers(On::Daemon {
        daemon: &d,
        addr: "127.0.0.1",
    });
    d.assert_alive();
}

#[test]
fn closing_with_objects_left_releases_what_they_held_on_the_embedded_device() {
    close_leftovers(On::Embedded {
        addr: "127.0.0.1",
        port: free_udp_port(),
    });
}
