//! SEND / RECV between two devices over real UDP on loopback.

#[macro_use]
mod common;

use common::{all_access, connect, open_pair_on, pair_v4_on, pair_v6_on, Side, WAIT};
use softrdma::Buffer;
use softrdma::{WcOpcode, WcStatus};

on_both_backends! {
fn a_send_lands_in_the_posted_receive_intact(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 8192);
    b.qp.recv(7, &[b.mr.sge(..).unwrap()]).unwrap();
    let msg: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
    a.mr.write(0, &msg).unwrap();
    a.qp.send(1, &[a.mr.sge(..msg.len()).unwrap()]).unwrap();
    let wc = a.cq.wait_ok(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.opcode), (1, WcOpcode::Send));
    let wc = b.cq.wait_ok(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.opcode), (7, WcOpcode::Recv));
    assert_eq!(wc.byte_len as usize, msg.len());
    let mut got = vec![0u8; msg.len()];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(got, msg);
}
}

on_both_backends! {
fn over_ipv6_too(backend: BackendKind) {
    let (a, b) = pair_v6_on(backend, 4096);
    b.qp.recv(7, &[b.mr.sge(..).unwrap()]).unwrap();
    a.mr.write(0, b"over ipv6").unwrap();
    a.qp.send(1, &[a.mr.sge(..9).unwrap()]).unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    let wc = b.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.byte_len, 9);
    let mut got = [0u8; 9];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(&got, b"over ipv6");
}
}

on_both_backends! {
fn send_with_immediate_and_scatter_gather(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 4096);
    // Scatter into two pieces of the receive region, gather from three of the send region.
    b.qp.recv(
        9,
        &[b.mr.sge(100..103).unwrap(), b.mr.sge(200..210).unwrap()],
    )
    .unwrap();
    a.mr.write(0, b"abcdefghijklm").unwrap();
    let sges = [
        a.mr.sge(0..4).unwrap(),
        a.mr.sge(4..8).unwrap(),
        a.mr.sge(8..13).unwrap(),
    ];
    a.qp.send_with_imm(2, &sges, 0xdead_beef).unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    let wc = b.cq.wait_ok(WAIT).unwrap();
    assert_eq!(wc.imm_data, 0xdead_beef);
    assert_eq!(wc.byte_len, 13);
    let all = b.mr.to_vec();
    assert_eq!(&all[100..103], b"abc");
    assert_eq!(&all[200..210], b"defghijklm");
}
}

on_both_backends! {
fn many_messages_arrive_in_order(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 64 * 64);
    for i in 0..64u64 {
        let off = (i * 64) as usize;
        b.qp.recv(i, &[b.mr.sge(off..off + 64).unwrap()]).unwrap();
    }
    for i in 0..64u64 {
        let off = (i * 64) as usize;
        a.mr.write(off, &[i as u8; 64]).unwrap();
        a.qp.send(i, &[a.mr.sge(off..off + 64).unwrap()]).unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 64 {
        for wc in b.cq.wait(64, WAIT).unwrap() {
            assert_eq!(wc.status, WcStatus::Success);
            got.push(wc.wr_id);
        }
    }
    assert_eq!(got, (0..64).collect::<Vec<_>>());
    let all = b.mr.to_vec();
    for i in 0..64usize {
        assert!(all[i * 64..(i + 1) * 64].iter().all(|&x| x == i as u8));
    }
    let mut sent = 0;
    while sent < 64 {
        sent += a.cq.wait(64, WAIT).unwrap().len();
    }
}
}

on_both_backends! {
fn a_full_receive_queue_refuses_one_more_until_a_completion_is_polled(backend: BackendKind) {
    let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
    let side = |dev: softrdma::Device, max_recv_wr: u32| {
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(64).unwrap();
        let qp = pd
            .qp_builder(&cq, &cq)
            .max_recv_wr(max_recv_wr)
            .build()
            .unwrap();
        let mr = pd.register(Buffer::zeroed(64), all_access()).unwrap();
        Side { dev, pd, cq, qp, mr }
    };
    let (a, b) = (side(da, 16), side(db, 4));
    connect(&a, &b);
    for i in 0..4 {
        b.qp.recv(i, &[b.mr.sge(..).unwrap()]).unwrap();
    }
    // ibv_post_recv on a full receive queue: ENOMEM, and nothing is queued.
    let e = b.qp.recv(4, &[b.mr.sge(..).unwrap()]).unwrap_err();
    assert_eq!(e.errno(), 12, "{e}");
    a.qp.send(1, &[a.mr.sge(..8).unwrap()]).unwrap();
    a.cq.wait_ok(WAIT).unwrap();
    let wc = b.cq.wait_ok(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.opcode), (0, WcOpcode::Recv));
    // The polled completion freed its slot: one more fits, and then no more.
    b.qp.recv(5, &[b.mr.sge(..).unwrap()]).unwrap();
    assert!(b.qp.recv(6, &[b.mr.sge(..).unwrap()]).is_err());
}
}
