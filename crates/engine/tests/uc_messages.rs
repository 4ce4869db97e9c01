//! UC in the simulator: SEND and RDMA WRITE (with immediate) without acknowledgements, a
//! lost packet losing only its message, the responder resynchronising on the next FIRST or
//! ONLY, and the partly filled receive WQE being reused.

mod common;

use core::time::Duration;
use std::cell::Cell;
use std::rc::Rc;

use common::*;
use engine::{Counter, PathMtu, QpState, QpType, RecvWr, SendOp, SendWr, WcOpcode, WcStatus};
use sim::{NetConfig, Sim, Verdict};

const SECOND: Duration = Duration::from_secs(1);

struct Uc {
    sim: Sim<Host>,
    a: Host4,
    b: Host4,
    qa: Qp4,
    qb: Qp4,
}

fn setup(seed: u64) -> Uc {
    let mut sim = Sim::new(seed, NetConfig::default());
    let a = add_host4(&mut sim, 1, seed, 1 << 20);
    let b = add_host4(&mut sim, 2, seed, 1 << 20);
    let qa = new_qp4(
        &mut sim.node_mut(a.node).engine,
        a.pd,
        QpType::Uc,
        256,
        None,
        None,
    );
    let qb = new_qp4(
        &mut sim.node_mut(b.node).engine,
        b.pd,
        QpType::Uc,
        256,
        None,
        None,
    );
    let (psn_a, psn_b) = (0xff_fffe, 0x100);
    connect4(
        &mut sim.node_mut(a.node).engine,
        QpType::Uc,
        qa.qpn,
        b.ip,
        qb.qpn,
        PathMtu::Mtu1024,
        psn_a,
        psn_b,
    );
    connect4(
        &mut sim.node_mut(b.node).engine,
        QpType::Uc,
        qb.qpn,
        a.ip,
        qa.qpn,
        PathMtu::Mtu1024,
        psn_b,
        psn_a,
    );
    Uc { sim, a, b, qa, qb }
}

impl Uc {
    fn post_recv(&mut self, wr_id: u64, off: u64, len: u32) {
        let (b, qb) = (self.b, self.qb);
        self.sim
            .node_mut(b.node)
            .engine
            .post_recv(qb.qpn, RecvWr::new(wr_id, vec![b.sge(off, len)]))
            .unwrap();
    }

    fn post_send(&mut self, wr: SendWr) {
        let (a, qa) = (self.a, self.qa);
        self.sim
            .node_mut(a.node)
            .engine
            .post_send(qa.qpn, wr)
            .unwrap();
    }

    /// Message `i` of `len` bytes at A's offset `i * 0x4000`.
    fn message(&mut self, i: u64, len: usize) -> Vec<u8> {
        let data = pattern(100 + i, len);
        self.sim
            .node(self.a.node)
            .mem
            .set(OWNER, self.a.addr(i * 0x4000), &data);
        data
    }
}

#[test]
fn uc_send_and_write_with_imm_complete_when_sent_without_any_ack() {
    let mut t = setup(1);
    let tap = Wiretap::install(&mut t.sim);
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    let m0 = t.message(0, 3000);
    let m1 = t.message(1, 2500);
    t.post_recv(10, 0, 4096);
    t.post_recv(11, 0x8000, 64);
    t.post_send(SendWr::new(
        1,
        SendOp::SendWithImm { imm: 7 },
        vec![a.sge(0, 3000)],
    ));
    t.post_send(SendWr::new(
        2,
        SendOp::RdmaWriteWithImm {
            remote_addr: b.addr(0x2_0000),
            rkey: b.mr.rkey,
            imm: 8,
        },
        vec![a.sge(0x4000, 2500)],
    ));
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 2, SECOND);
    assert_eq!(sent.len(), 2);
    assert_eq!((sent[0].wr_id, sent[0].status), (1, WcStatus::Success));
    assert_eq!((sent[1].wr_id, sent[1].opcode), (2, WcOpcode::RdmaWrite));
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, 2, SECOND);
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].wr_id, got[0].byte_len, got[0].imm_data),
        (10, 3000, 7)
    );
    assert_eq!(got[0].src_qp.value(), qa.qpn);
    assert_eq!(got[1].opcode, WcOpcode::RecvRdmaWithImm);
    assert_eq!(
        (got[1].wr_id, got[1].byte_len, got[1].imm_data),
        (11, 2500, 8)
    );
    let mem = t.sim.node(b.node).mem.clone();
    assert_eq!(mem.get(OWNER, b.addr(0), 3000), m0);
    assert_eq!(mem.get(OWNER, b.addr(0x2_0000), 2500), m1);
    let seen = tap.seen.borrow();
    assert!(
        seen.iter().all(|s| s.from == a.node),
        "the UC responder never answers"
    );
    assert_eq!(seen.len(), 6, "3 + 3 packets at MTU 1024");
    assert!(seen
        .iter()
        .all(|s| s.t.bth.opcode.transport() == wire::Transport::Uc && !s.t.bth.ack_req));
    // PSNs run on across the 24-bit wrap.
    let psns: Vec<u32> = seen.iter().map(|s| s.t.bth.psn.value()).collect();
    assert_eq!(psns, vec![0xff_fffe, 0xff_ffff, 0, 1, 2, 3]);
}

/// Drops the `k`-th packet (0-based) A sends.
fn drop_packet(sim: &mut Sim<Host>, from: sim::NodeId, k: usize) -> Rc<Cell<usize>> {
    let count = Rc::new(Cell::new(0));
    let c = Rc::clone(&count);
    sim.set_filter(Box::new(move |f| {
        if f.from != from {
            return Verdict::Pass;
        }
        let n = c.get();
        c.set(n + 1);
        if n == k {
            Verdict::Drop
        } else {
            Verdict::Pass
        }
    }));
    count
}

#[test]
fn uc_lost_middle_packet_loses_only_its_message_and_the_wqe_is_reused() {
    let mut t = setup(2);
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    let msgs: Vec<Vec<u8>> = (0..3).map(|i| t.message(i, 3000)).collect();
    for i in 0..3 {
        t.post_recv(20 + i, i * 0x1_0000, 4096);
    }
    // Packets 3, 4, 5 are message 1: lose its MIDDLE.
    drop_packet(&mut t.sim, a.node, 4);
    for i in 0..3 {
        t.post_send(SendWr::send(i, vec![a.sge(i * 0x4000, 3000)]));
    }
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 3, SECOND);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "{sent:?}"
    );
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, 3, SECOND);
    assert_eq!(got.len(), 2, "message 1 is lost, the others arrive");
    let mem = t.sim.node(b.node).mem.clone();
    assert_eq!(got[0].wr_id, 20);
    assert_eq!(mem.get(OWNER, b.addr(0), 3000), msgs[0]);
    // Message 1 partly filled WQE 21; message 2 reuses it from the start.
    assert_eq!((got[1].wr_id, got[1].byte_len), (21, 3000));
    assert_eq!(mem.get(OWNER, b.addr(0x1_0000), 3000), msgs[2]);
    let e = &t.sim.node(b.node).engine;
    let c = e.qp_counters(qb.qpn).unwrap();
    assert_eq!(c.get(Counter::UcMessageDropped), 1);
    assert_eq!(c.get(Counter::UcPacketDropped), 1, "the orphaned LAST");
    assert_eq!(e.query_qp(qb.qpn).unwrap().qp_state, QpState::Rts);
}

#[test]
fn uc_resynchronises_on_the_next_first_packet_after_a_lost_last() {
    let mut t = setup(3);
    let (a, b, qb) = (t.a, t.b, t.qb);
    let msgs: Vec<Vec<u8>> = (0..2).map(|i| t.message(i, 2048 + 100)).collect();
    t.post_recv(30, 0, 4096);
    t.post_recv(31, 0x1_0000, 4096);
    // Message 0 is packets 0..3: lose its LAST.
    drop_packet(&mut t.sim, a.node, 2);
    for i in 0..2 {
        t.post_send(SendWr::send(i, vec![a.sge(i * 0x4000, 2148)]));
    }
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, 2, SECOND);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].wr_id, got[0].byte_len), (30, 2148));
    assert_eq!(t.sim.node(b.node).mem.get(OWNER, b.addr(0), 2148), msgs[1]);
}

#[test]
fn uc_lost_write_packet_loses_that_write_only() {
    let mut t = setup(4);
    let (a, b, qb) = (t.a, t.b, t.qb);
    let m0 = t.message(0, 3000);
    let m1 = t.message(1, 3000);
    t.post_recv(40, 0, 64);
    drop_packet(&mut t.sim, a.node, 1);
    for (i, imm) in [(0u64, 1u32), (1, 2)] {
        t.post_send(SendWr::new(
            i,
            SendOp::RdmaWriteWithImm {
                remote_addr: b.addr(0x2_0000 + i * 0x1_0000),
                rkey: b.mr.rkey,
                imm,
            },
            vec![a.sge(i * 0x4000, 3000)],
        ));
    }
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, 2, SECOND);
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].wr_id, got[0].imm_data),
        (40, 2),
        "only the second write completes"
    );
    let mem = t.sim.node(b.node).mem.clone();
    assert_eq!(mem.get(OWNER, b.addr(0x3_0000), 3000), m1);
    assert_ne!(mem.get(OWNER, b.addr(0x2_0000), 3000), m0);
}

#[test]
fn uc_write_with_a_bad_rkey_is_dropped_and_the_qp_carries_on() {
    let mut t = setup(5);
    let (a, b, qa, qb) = (t.a, t.b, t.qa, t.qb);
    let m = t.message(0, 100);
    t.post_send(SendWr::rdma_write(
        1,
        vec![a.sge(0, 100)],
        b.addr(0),
        engine::Rkey::new(b.mr.rkey.value() ^ 0x55),
    ));
    t.post_send(SendWr::rdma_write(
        2,
        vec![a.sge(0, 100)],
        b.addr(0x100),
        b.mr.rkey,
    ));
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 2, SECOND);
    assert!(
        sent.iter().all(|w| w.status == WcStatus::Success),
        "UC cannot know"
    );
    // The sender completes when the packets leave; let them arrive.
    let _ = t.sim.run_until(|_| false, SECOND);
    let mem = t.sim.node(b.node).mem.clone();
    assert_eq!(mem.get(OWNER, b.addr(0x100), 100), m);
    assert_eq!(mem.get(OWNER, b.addr(0), 100), vec![0; 100]);
    let e = &t.sim.node(b.node).engine;
    assert_eq!(
        e.qp_counters(qb.qpn)
            .unwrap()
            .get(Counter::UcRemoteAccessDropped),
        1
    );
    assert_eq!(e.query_qp(qb.qpn).unwrap().qp_state, QpState::Rts);
}

#[test]
fn uc_refuses_read_atomic_and_send_with_invalidate() {
    let mut t = setup(6);
    let (a, b, qa) = (t.a, t.b, t.qa);
    let e = &mut t.sim.node_mut(a.node).engine;
    let read = SendWr::rdma_read(1, vec![a.sge(0, 8)], b.addr(0), b.mr.rkey);
    assert_eq!(
        e.post_send(qa.qpn, read),
        Err(engine::VerbsError::OpNotSupported)
    );
    let inv = SendWr::new(
        1,
        SendOp::SendWithInv {
            rkey: engine::Rkey::new(1),
        },
        vec![],
    );
    assert_eq!(
        e.post_send(qa.qpn, inv),
        Err(engine::VerbsError::OpNotSupported)
    );
}

#[test]
fn uc_send_without_a_receive_wqe_is_dropped_not_rnr_naked() {
    let mut t = setup(7);
    let (a, b, qb) = (t.a, t.b, t.qb);
    t.message(0, 500);
    t.post_send(SendWr::send(1, vec![a.sge(0, 500)]));
    let _ = drain_cq(&mut t.sim, a.node, t.qa.send_cq, 1, SECOND);
    let _ = t.sim.run_until(|_| false, SECOND);
    t.post_recv(50, 0, 1024);
    let m = t.message(1, 200);
    t.post_send(SendWr::send(2, vec![a.sge(0x4000, 200)]));
    let got = drain_cq(&mut t.sim, b.node, qb.recv_cq, 1, SECOND);
    assert_eq!((got[0].wr_id, got[0].byte_len), (50, 200));
    assert_eq!(t.sim.node(b.node).mem.get(OWNER, b.addr(0), 200), m);
    let c = t
        .sim
        .node(b.node)
        .engine
        .qp_counters(qb.qpn)
        .unwrap()
        .get(Counter::RxNoRecvWqe);
    assert_eq!(c, 1);
}

#[test]
fn uc_writes_through_a_type2_window_bound_on_the_uc_qp() {
    let mut t = setup(8);
    let (a, b, qb) = (t.a, t.b, t.qb);
    let eb = &mut t.sim.node_mut(b.node).engine;
    let mw = eb.alloc_mw(b.pd, engine::MwType::Type2).unwrap();
    let rkey = engine::inc_rkey(mw.rkey);
    let bind = engine::MwBind {
        mr: b.mr.handle,
        addr: b.addr(0x1000),
        length: 0x100,
        access: engine::AccessFlags::REMOTE_WRITE,
    };
    eb.post_send(qb.qpn, SendWr::bind_mw(1, mw.handle, rkey, bind))
        .unwrap();
    let wc = drain_cq(&mut t.sim, b.node, qb.send_cq, 1, SECOND);
    assert_eq!(
        (wc[0].status, wc[0].opcode),
        (WcStatus::Success, WcOpcode::BindMw)
    );
    let m = t.message(0, 0x100);
    t.post_send(SendWr::rdma_write(
        1,
        vec![a.sge(0, 0x100)],
        b.addr(0x1000),
        rkey,
    ));
    t.post_send(SendWr::rdma_write(
        2,
        vec![a.sge(0, 0x100)],
        b.addr(0x1001),
        rkey,
    ));
    let _ = drain_cq(&mut t.sim, a.node, t.qa.send_cq, 2, SECOND);
    let _ = t.sim.run_until(|_| false, SECOND);
    let mem = t.sim.node(b.node).mem.clone();
    assert_eq!(mem.get(OWNER, b.addr(0x1000), 0x100), m);
    assert_eq!(
        mem.get(OWNER, b.addr(0x1100), 1),
        vec![0],
        "one byte past the window"
    );
    let e = &t.sim.node(b.node).engine;
    let c = e.qp_counters(qb.qpn).unwrap();
    assert_eq!(c.get(Counter::UcRemoteAccessDropped), 1);
}

#[test]
fn uc_sqd_drains_the_started_message_and_reports_it() {
    let mut t = setup(9);
    let (a, qa) = (t.a, t.qa);
    t.message(0, 3000);
    let e = &mut t.sim.node_mut(a.node).engine;
    let sqd = engine::QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..Default::default()
    };
    e.post_send(qa.qpn, SendWr::send(1, vec![a.sge(0, 3000)]))
        .unwrap();
    e.post_send(qa.qpn, SendWr::send(2, vec![a.sge(0, 10)]))
        .unwrap();
    // Send the first packet only, then ask for SQD.
    let mut buf = vec![0u8; 9000];
    assert!(e
        .poll_transmit(engine::Instant::from_nanos(0), &mut buf)
        .is_some());
    e.modify_qp(
        qa.qpn,
        &sqd,
        engine::QpAttrMask::STATE | engine::QpAttrMask::EN_SQD_ASYNC_NOTIFY,
    )
    .unwrap();
    let sent = drain_cq(&mut t.sim, a.node, qa.send_cq, 2, SECOND);
    assert_eq!(
        sent.len(),
        1,
        "the started message finishes, the next waits"
    );
    let e = &mut t.sim.node_mut(a.node).engine;
    assert_eq!(
        e.get_async_event(),
        Some(engine::AsyncEvent::SqDrained {
            qpn: engine::Qpn::new(qa.qpn)
        })
    );
}
