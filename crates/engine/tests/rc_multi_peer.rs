//! One engine talking to two peers: traffic is routed by QP and address, and a dead path to
//! one peer fails only the QP that uses it.

mod common;

use core::time::Duration;

use common::{add_qp, connect, create_side, pattern, side_ip, Host, PairConfig, OWNER};
use engine::{Engine, QpState, SendWr, WcStatus};
use sim::Sim;

const DEADLINE: Duration = Duration::from_secs(10);

fn engine(sim: &mut Sim<Host>, node: sim::NodeId) -> &mut Engine {
    &mut sim.node_mut(node).engine
}

#[test]
fn a_partition_from_one_peer_fails_only_the_qp_that_uses_it() {
    let cfg = PairConfig {
        retry_cnt: 2,
        ..PairConfig::default()
    };
    let mut sim = Sim::new(cfg.seed, cfg.net.clone());
    let a_to_b = create_side(&mut sim, &cfg, side_ip(false, 1), 0x1000_0000);
    let b = create_side(&mut sim, &cfg, side_ip(false, 2), 0x2000_0000);
    let c = create_side(&mut sim, &cfg, side_ip(false, 3), 0x3000_0000);
    // A second QP on A's engine, for C (same PD and MR as A's first QP).
    let a_to_c = add_qp(&mut sim, &cfg, &a_to_b);
    connect(engine(&mut sim, a_to_b.node), &cfg, &a_to_b, &b, 100, 200);
    connect(engine(&mut sim, b.node), &cfg, &b, &a_to_b, 200, 100);
    connect(engine(&mut sim, a_to_c.node), &cfg, &a_to_c, &c, 300, 400);
    connect(engine(&mut sim, c.node), &cfg, &c, &a_to_c, 400, 300);

    sim.partition(a_to_c.node, c.node);
    let data = pattern(50, 3000);
    sim.node(a_to_b.node).mem.set(OWNER, a_to_b.addr(0), &data);
    for (side, peer, id) in [(&a_to_b, &b, 1), (&a_to_c, &c, 2)] {
        let qpn = side.qpn;
        engine(&mut sim, side.node)
            .post_send(
                qpn,
                SendWr::rdma_write(id, vec![side.sge(0, 3000)], peer.addr(0), peer.mr.rkey),
            )
            .unwrap();
    }
    let (an, cq_b, cq_c) = (a_to_b.node, a_to_b.send_cq, a_to_c.send_cq);
    sim.run_until(
        |s| {
            let e = &s.node(an).engine;
            e.cq_len(cq_b).unwrap_or(0) == 1 && e.cq_len(cq_c).unwrap_or(0) == 1
        },
        DEADLINE,
    )
    .unwrap();
    let e = engine(&mut sim, an);
    let wb = e.poll_cq(cq_b, 8).unwrap();
    let wc = e.poll_cq(cq_c, 8).unwrap();
    assert_eq!((wb[0].wr_id, wb[0].status), (1, WcStatus::Success));
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::RetryExcErr));
    assert_eq!(e.query_qp(a_to_b.qpn).unwrap().qp_state, QpState::Rts);
    assert_eq!(e.query_qp(a_to_c.qpn).unwrap().qp_state, QpState::Err);
    assert_eq!(sim.node(b.node).mem.get(OWNER, b.addr(0), 3000), data);
    assert_eq!(
        sim.node(c.node).mem.get(OWNER, c.addr(0), 3000),
        vec![0; 3000]
    );
}
