//! The data path allocates nothing (issue 13 item 2): once a connection is warm, posting a
//! WRITE or a SEND and a receive, the device executing them, and polling its completion take no heap allocation
//! anywhere in the process — in the library, and on the daemon backend in the daemon's
//! progress thread too (the test hosts the daemon in this process, so every thread counts).
//!
//! Its own test binary: the counting allocator is global to the process, and no other test
//! may run beside it.

mod common;

use std::alloc::System;

use common::{pair_v4_on, WAIT};
use softrdma::{BackendKind, WcOpcode, WcStatus};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Operations measured after the warm-up.
const OPS: u64 = 2000;

/// Poll `cq` until one completion comes; check it is `wr_id`'s, successful, of `opcode`.
fn wait_one(cq: &softrdma::Cq, wr_id: u64, opcode: WcOpcode) {
    let mut wcs = [softrdma::WorkCompletion::default(); 4];
    let deadline = std::time::Instant::now() + WAIT.unwrap();
    loop {
        let n = cq.poll_into(&mut wcs).unwrap();
        if n > 0 {
            assert_eq!(n, 1);
            assert_eq!(
                (wcs[0].wr_id, wcs[0].opcode, wcs[0].status),
                (wr_id, opcode, WcStatus::Success),
                "{:?}",
                wcs[0]
            );
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "WR {wr_id} never completed"
        );
    }
}

/// `OPS` rounds of a small signaled WRITE and a SEND into a posted receive, each completion
/// polled before the next post; returns the allocations and reallocations the whole process
/// made during the rounds after a warm-up of as many.
fn allocations_per_round(backend: BackendKind) -> (u64, u64) {
    let (a, b) = pair_v4_on(backend, 4096);
    let remote = b.mr.remote(..64).unwrap();
    let sge = a.mr.sge(..8).unwrap();
    let into = b.mr.sge(64..128).unwrap();
    let round = |i: u64| {
        a.qp.write(i, &[sge], &remote).unwrap();
        wait_one(&a.cq, i, WcOpcode::RdmaWrite);
        b.qp.recv(i, &[into]).unwrap();
        a.qp.send(i, &[sge]).unwrap();
        wait_one(&a.cq, i, WcOpcode::Send);
        wait_one(&b.cq, i, WcOpcode::Recv);
    };
    // Warm-up: every queue, slab and table reaches its working size.
    for i in 0..OPS {
        round(i);
    }
    let region = Region::new(GLOBAL);
    for i in OPS..2 * OPS {
        round(i);
    }
    let stats = region.change();
    (stats.allocations as u64, stats.reallocations as u64)
}

/// One test for both backends, one after the other: the count is the whole process's.
#[test]
fn warm_writes_sends_receives_and_their_completions_allocate_nothing_on_either_backend() {
    for backend in [BackendKind::Embedded, BackendKind::Daemon] {
        let (allocs, reallocs) = allocations_per_round(backend);
        assert_eq!(
            (allocs, reallocs),
            (0, 0),
            "{OPS} rounds on the {backend:?} backend allocated {allocs} times and reallocated \
             {reallocs} times",
        );
    }
}
