//! Two clients drive RC QPs through one `softrdmad`: SEND/RECV, WRITE, READ and both atomics,
//! with the data checked in each client's own memory.

mod common;

use common::{connected_pair, Daemon};
use engine::{RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge};

const SIGNALED: u32 = 2;

#[test]
fn two_clients_exchange_send_write_read_and_atomics_through_one_daemon() {
    let d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 8192);

    // SEND / RECV: 3000 bytes, three packets at MTU 1024.
    let msg: Vec<u8> = (0..3000u32).map(|i| (i * 7 + 3) as u8).collect();
    a.buf.write(0, &msg);
    b.client
        .post_recv(
            b.qp,
            &RecvWr::new(
                11,
                vec![Sge {
                    addr: b.buf.addr() + 4096,
                    length: 4096,
                    lkey: b.lkey,
                }],
            ),
        )
        .unwrap();
    a.client
        .post_send(
            a.qp,
            &SendWr {
                wr_id: 1,
                op: SendOp::Send,
                flags: SendFlags::from_bits_truncate(SIGNALED),
                payload: SendPayload::Sges(
                    vec![Sge {
                        addr: a.buf.addr(),
                        length: 3000,
                        lkey: a.lkey,
                    }]
                    .into(),
                ),
            },
        )
        .unwrap();
    let wa = a.wait(1);
    assert_eq!((wa[0].wr_id, wa[0].status), (1, 0), "{wa:?}");
    let wb = b.wait(1);
    assert_eq!((wb[0].wr_id, wb[0].status, wb[0].byte_len), (11, 0, 3000));
    assert_eq!(b.buf.read(4096, 3000), msg);

    // RDMA WRITE from a's buffer into b's, then READ it back into a's second half.
    let data: Vec<u8> = (0..2500u32).map(|i| (i ^ 0x5a) as u8).collect();
    a.buf.write(100, &data);
    a.client
        .post_send(
            a.qp,
            &SendWr {
                wr_id: 2,
                op: SendOp::RdmaWrite {
                    remote_addr: b.buf.addr() + 10,
                    rkey: b.rkey,
                },
                flags: SendFlags::from_bits_truncate(SIGNALED),
                payload: SendPayload::Sges(
                    vec![Sge {
                        addr: a.buf.addr() + 100,
                        length: 2500,
                        lkey: a.lkey,
                    }]
                    .into(),
                ),
            },
        )
        .unwrap();
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (2, 0), "{w:?}");
    assert_eq!(b.buf.read(10, 2500), data);

    // b writes something of its own, a READs it.
    b.buf.write(6000, b"read me from the other process");
    a.client
        .post_send(
            a.qp,
            &SendWr {
                wr_id: 3,
                op: SendOp::RdmaRead {
                    remote_addr: b.buf.addr() + 6000,
                    rkey: b.rkey,
                },
                flags: SendFlags::from_bits_truncate(SIGNALED),
                payload: SendPayload::Sges(
                    vec![Sge {
                        addr: a.buf.addr() + 5000,
                        length: 30,
                        lkey: a.lkey,
                    }]
                    .into(),
                ),
            },
        )
        .unwrap();
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status, w[0].byte_len), (3, 0, 30));
    assert_eq!(a.buf.read(5000, 30), b"read me from the other process");

    // Atomics on an 8-byte word of b: fetch-add, then compare-swap hit and miss.
    let word = 7000usize;
    b.buf.write(word, &40u64.to_ne_bytes());
    let result_addr = a.buf.addr() + 7000;
    let a_lkey = a.lkey;
    let atomic = |wr_id, op| SendWr {
        wr_id,
        op,
        flags: SendFlags::from_bits_truncate(SIGNALED),
        payload: SendPayload::Sges(
            vec![Sge {
                addr: result_addr,
                length: 8,
                lkey: a_lkey,
            }]
            .into(),
        ),
    };
    let remote_addr = b.buf.addr() + word as u64;
    a.client
        .post_send(
            a.qp,
            &atomic(
                4,
                SendOp::AtomicFetchAdd {
                    remote_addr,
                    rkey: b.rkey,
                    add: 2,
                },
            ),
        )
        .unwrap();
    assert_eq!(a.wait(1)[0].status, 0);
    assert_eq!(a.buf.read_u64(7000), 40, "fetch-add returns the old value");
    assert_eq!(b.buf.read_u64(word), 42);
    a.client
        .post_send(
            a.qp,
            &atomic(
                5,
                SendOp::AtomicCmpSwap {
                    remote_addr,
                    rkey: b.rkey,
                    compare: 42,
                    swap: 1000,
                },
            ),
        )
        .unwrap();
    assert_eq!(a.wait(1)[0].status, 0);
    assert_eq!(a.buf.read_u64(7000), 42);
    assert_eq!(b.buf.read_u64(word), 1000);
    a.client
        .post_send(
            a.qp,
            &atomic(
                6,
                SendOp::AtomicCmpSwap {
                    remote_addr,
                    rkey: b.rkey,
                    compare: 42,
                    swap: 5,
                },
            ),
        )
        .unwrap();
    assert_eq!(a.wait(1)[0].status, 0);
    assert_eq!(
        a.buf.read_u64(7000),
        1000,
        "a miss returns the current value"
    );
    assert_eq!(b.buf.read_u64(word), 1000, "and leaves it");

    // Inline SEND the other way round, b to a.
    a.client
        .post_recv(
            a.qp,
            &RecvWr::new(
                21,
                vec![Sge {
                    addr: a.buf.addr() + 7100,
                    length: 64,
                    lkey: a.lkey,
                }],
            ),
        )
        .unwrap();
    b.client
        .post_send(
            b.qp,
            &SendWr {
                wr_id: 7,
                op: SendOp::SendWithImm { imm: 0xfeed },
                flags: SendFlags::from_bits_truncate(SIGNALED),
                payload: SendPayload::Inline(b"inline hello".to_vec().into()),
            },
        )
        .unwrap();
    assert_eq!(b.wait(1)[0].status, 0);
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status, w[0].byte_len), (21, 0, 12));
    assert_eq!(w[0].imm_data, 0xfeed);
    assert_eq!(a.buf.read(7100, 12), b"inline hello");

    // An explicit teardown leaves nothing to reclaim.
    for s in [&mut a, &mut b] {
        s.client.destroy_qp(s.qp).unwrap();
        s.client.dereg_mr(s.mr).unwrap();
        s.client.destroy_cq(s.cq).unwrap();
        s.client.dealloc_pd(s.pd).unwrap();
    }
    drop((a, b));
    // Every connection but the monitor has ended.
    let s = d.wait_until("a and b disconnected", |s| {
        s.get("connections_closed") + 1 == s.get("connections_accepted")
    });
    assert_eq!(s.get("clients_reclaimed"), 0);
    for c in [
        "live_qps",
        "live_mrs",
        "live_cqs",
        "live_pds",
        "registered_ranges",
    ] {
        assert_eq!(s.get(c), 0, "{c}");
    }
}

#[test]
fn a_remote_write_with_a_wrong_rkey_fails_without_touching_memory() {
    let d = Daemon::start();
    let (mut a, b) = connected_pair(&d, 4096);
    a.buf.write(0, &[0xaa; 64]);
    a.client
        .post_send(
            a.qp,
            &SendWr {
                wr_id: 9,
                op: SendOp::RdmaWrite {
                    remote_addr: b.buf.addr(),
                    rkey: engine::Rkey::new(b.rkey.value() ^ 0x55),
                },
                flags: SendFlags::from_bits_truncate(SIGNALED),
                payload: SendPayload::Sges(
                    vec![Sge {
                        addr: a.buf.addr(),
                        length: 64,
                        lkey: a.lkey,
                    }]
                    .into(),
                ),
            },
        )
        .unwrap();
    let w = a.wait(1);
    assert_eq!(w[0].wr_id, 9);
    assert_ne!(w[0].status, 0, "a bad rkey must fail: {w:?}");
    assert_eq!(b.buf.read(0, 64), vec![0; 64]);
}
