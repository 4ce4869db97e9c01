//! Timers on a warm device allocate nothing: the first local ACK timeout that ever fires
//! (a peer that stalls once, after thousands of messages that were ACKed in time) and the
//! retransmission it causes cost no heap allocation in the engine.
//!
//! Its own test binary: the counting allocator is global to the process.

mod common;

use std::alloc::System;

use common::{instant, Pair, PairConfig};
use engine::SendWr;
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn the_first_local_ack_timeout_allocates_nothing() {
    let mut p = Pair::new(PairConfig::default());
    let (a, b) = (p.a, p.b);
    // A WRITE leaves and is never ACKed: its timer is the only one, and it has never fired.
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 8)], b.addr(0), b.mr.rkey),
    );
    let engine = p.engine(&a);
    let mut buf = vec![0u8; 8192];
    let sent = engine
        .poll_transmit(instant(std::time::Duration::ZERO), &mut buf)
        .expect("the WRITE left");
    let first = buf[..sent.len].to_vec();
    let due = engine.poll_timeout().expect("the local ACK timer runs");

    let region = Region::new(GLOBAL);
    engine.handle_timeout(due);
    // It fired: the WRITE goes out again.
    let resent = engine.poll_transmit(due, &mut buf);
    let stats = region.change();
    let resent = resent.expect("retransmitted");
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "the timeout and the retransmission allocated"
    );

    // The responder got the first copy (its ACK was what got lost); the second is a
    // duplicate, answered with an ACK again, and that allocates nothing either.
    let again = buf[..resent.len].to_vec();
    let engine = p.engine(&b);
    engine.handle_datagram(due, &first);
    let mut out = vec![0u8; 8192];
    let later = due + std::time::Duration::from_millis(1);
    while engine.poll_transmit(later, &mut out).is_some() {}
    let region = Region::new(GLOBAL);
    engine.handle_datagram(later, &again);
    let mut acks = 0;
    let even_later = later + std::time::Duration::from_millis(1);
    while engine.poll_transmit(even_later, &mut out).is_some() {
        acks += 1;
    }
    let stats = region.change();
    assert_eq!(acks, 1, "the duplicate is ACKed");
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "answering the duplicate allocated"
    );
}
