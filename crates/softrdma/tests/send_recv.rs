//! SEND / RECV between two devices over real UDP on loopback.

#[macro_use]
mod common;

use common::{pair_v4_on, pair_v6_on, WAIT};
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
