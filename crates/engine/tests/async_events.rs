//! Asynchronous events of issue 4 through the engine's interface: the SRQ limit (armed,
//! fired once, re-armed), LAST_WQE_REACHED when a QP of an SRQ fails on the wire,
//! acknowledgement before destroying the SRQ, and the port events.

mod common;

use core::time::Duration;

use common::*;
use engine::{
    AsyncEvent, PathMtu, PortState, QpState, QpType, RecvWr, SendWr, SrqAttr, SrqAttrMask,
    VerbsError, WcStatus,
};
use sim::{NetConfig, Sim};

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn srq_limit_fires_once_per_arming_and_must_be_acknowledged() {
    let mut sim = Sim::new(1, NetConfig::default());
    let a = add_host4(&mut sim, 1, 1, 1 << 20);
    let b = add_host4(&mut sim, 2, 1, 1 << 20);
    let eb = &mut sim.node_mut(b.node).engine;
    let srq = eb
        .create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 4,
            },
        )
        .unwrap();
    let qb = new_qp4(eb, b.pd, QpType::Rc, 16, Some(srq), None);
    let qa = new_qp4(
        &mut sim.node_mut(a.node).engine,
        a.pd,
        QpType::Rc,
        16,
        None,
        None,
    );
    connect4(
        &mut sim.node_mut(a.node).engine,
        QpType::Rc,
        qa.qpn,
        b.ip,
        qb.qpn,
        PathMtu::Mtu1024,
        0,
        0,
    );
    connect4(
        &mut sim.node_mut(b.node).engine,
        QpType::Rc,
        qb.qpn,
        a.ip,
        qa.qpn,
        PathMtu::Mtu1024,
        0,
        0,
    );
    let post = |sim: &mut Sim<Host>, n: u64| {
        for i in 0..n {
            let wr = RecvWr::new(i, vec![b.sge(i * 64, 64)]);
            sim.node_mut(b.node).engine.post_srq_recv(srq, wr).unwrap();
        }
    };
    let send = |sim: &mut Sim<Host>, n: u64| {
        for i in 0..n {
            sim.node_mut(a.node)
                .engine
                .post_send(qa.qpn, SendWr::send(i, vec![a.sge(0, 8)]))
                .unwrap();
        }
        drain_cq(sim, a.node, qa.send_cq, n as usize, SECOND)
    };
    post(&mut sim, 6);
    // 6 -> 5 -> 4: not below the limit yet.
    send(&mut sim, 2);
    assert!(!sim.node(b.node).engine.has_async_event());
    // 4 -> 3: below 4, the event fires; further consumption is silent.
    send(&mut sim, 2);
    let eb = &mut sim.node_mut(b.node).engine;
    let ev = eb.get_async_event().expect("the limit event");
    assert_eq!(ev, AsyncEvent::SrqLimitReached { srq });
    assert_eq!(eb.get_async_event(), None);
    // Re-armed at 2 with 2 left: the next WQE taken fires it again.
    eb.modify_srq(
        srq,
        &SrqAttr {
            srq_limit: 2,
            ..Default::default()
        },
        SrqAttrMask::LIMIT,
    )
    .unwrap();
    send(&mut sim, 1);
    let eb = &mut sim.node_mut(b.node).engine;
    assert_eq!(
        eb.get_async_event(),
        Some(AsyncEvent::SrqLimitReached { srq })
    );
    assert_eq!(eb.unacked_async_events(), 2);
    // The SRQ cannot go while QPs use it or events about it are unacknowledged.
    eb.destroy_qp(qb.qpn).unwrap();
    assert!(matches!(eb.destroy_srq(srq), Err(VerbsError::Busy(_))));
    eb.ack_async_event(&ev);
    eb.ack_async_event(&ev);
    eb.destroy_srq(srq).unwrap();
}

#[test]
fn a_qp_of_an_srq_failing_on_the_wire_reports_last_wqe_reached() {
    let mut sim = Sim::new(2, NetConfig::default());
    let a = add_host4(&mut sim, 1, 2, 1 << 20);
    let b = add_host4(&mut sim, 2, 2, 1 << 20);
    let eb = &mut sim.node_mut(b.node).engine;
    let srq = eb
        .create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 4,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let qb = new_qp4(eb, b.pd, QpType::Rc, 4, Some(srq), None);
    let qa = new_qp4(
        &mut sim.node_mut(a.node).engine,
        a.pd,
        QpType::Rc,
        4,
        None,
        None,
    );
    connect4(
        &mut sim.node_mut(a.node).engine,
        QpType::Rc,
        qa.qpn,
        b.ip,
        qb.qpn,
        PathMtu::Mtu1024,
        0,
        0,
    );
    connect4(
        &mut sim.node_mut(b.node).engine,
        QpType::Rc,
        qb.qpn,
        a.ip,
        qa.qpn,
        PathMtu::Mtu1024,
        0,
        0,
    );
    // A WRITE with a wrong rkey fails B's QP (remote access error).
    let wr = SendWr::rdma_write(
        1,
        vec![a.sge(0, 8)],
        b.addr(0),
        engine::Rkey::new(b.mr.rkey.value() ^ 1),
    );
    sim.node_mut(a.node).engine.post_send(qa.qpn, wr).unwrap();
    let wc = drain_cq(&mut sim, a.node, qa.send_cq, 1, SECOND);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr);
    let eb = &mut sim.node_mut(b.node).engine;
    assert_eq!(eb.query_qp(qb.qpn).unwrap().qp_state, QpState::Err);
    assert_eq!(
        eb.get_async_event(),
        Some(AsyncEvent::QpLastWqeReached {
            qpn: engine::Qpn::new(qb.qpn)
        })
    );
    assert_eq!(eb.get_async_event(), None);
}

#[test]
fn port_state_changes_raise_port_events_once() {
    let mut sim = Sim::new(3, NetConfig::default());
    let b = add_host4(&mut sim, 2, 3, 1 << 16);
    let e = &mut sim.node_mut(b.node).engine;
    e.set_port_state(PortState::Active);
    assert_eq!(e.get_async_event(), None, "already active");
    e.set_port_state(PortState::Down);
    e.set_port_state(PortState::Down);
    e.set_port_state(PortState::Active);
    assert_eq!(e.get_async_event(), Some(AsyncEvent::PortErr { port: 1 }));
    assert_eq!(
        e.get_async_event(),
        Some(AsyncEvent::PortActive { port: 1 })
    );
    assert_eq!(e.get_async_event(), None);
    assert_eq!(
        e.unacked_async_events(),
        0,
        "port events need no acknowledgement"
    );
}
