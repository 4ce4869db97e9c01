//! Internal paths (`EngineConfig::internal_addresses`): two RC QPs of one engine, connected
//! through the engine's own address, exchange large segments without an ICRC, every verb
//! still behaves as over the network, and neither kind of packet is accepted as the other.

mod common;

use core::time::Duration;

use common::{instant, pattern, Pair, PairConfig, OWNER};
use engine::{Counter, PathMtu, RecvWr, SendOp, SendWr, WcOpcode, WcStatus, MAX_INTERNAL_MTU};

const DEADLINE: Duration = Duration::from_secs(10);

fn one_host() -> Pair {
    Pair::new(PairConfig {
        one_host: true,
        mtu: PathMtu::Mtu1024,
        mem_len: 1 << 20,
        ..PairConfig::default()
    })
}

#[test]
fn every_operation_between_two_qps_of_one_engine_moves_the_right_bytes_in_large_segments() {
    let mut p = one_host();
    let (a, b) = (p.a, p.b);
    assert_eq!(a.node, b.node, "both QPs live in one engine");
    let len = 100_000u32;
    let data = pattern(3, len as usize);
    p.mem(&a).set(OWNER, a.addr(0), &data);
    let tx_before = p.engine(&a).counters().get(Counter::TxPackets);

    // WRITE A -> B.
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, len)], b.addr(4096), b.mr.rkey),
    );
    let wc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    assert_eq!(p.mem(&b).get(OWNER, b.addr(4096), len as usize), data);
    // 100 000 bytes in segments of the internal size, not of the 1024-byte path MTU (98
    // packets), plus one ACK.
    let segments = len.div_ceil(MAX_INTERNAL_MTU) as u64;
    let tx = p.engine(&a).counters().get(Counter::TxPackets) - tx_before;
    assert_eq!(tx, segments + 1, "{tx} packets for a {len}-byte WRITE");

    // READ B -> A, into another place.
    p.post_send(
        &a,
        SendWr::rdma_read(2, vec![a.sge(300_000, len)], b.addr(4096), b.mr.rkey),
    );
    let wc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::Success));
    assert_eq!(p.mem(&a).get(OWNER, a.addr(300_000), len as usize), data);

    // SEND B -> A with immediate, into a posted receive.
    p.post_recv(&a, RecvWr::new(30, vec![a.sge(600_000, len)]));
    p.post_send(
        &b,
        SendWr::new(
            3,
            SendOp::SendWithImm { imm: 0xfeed },
            vec![b.sge(4096, len)],
        ),
    );
    let rc = p.wait_cq(&a, a.recv_cq, 1, DEADLINE).unwrap();
    assert_eq!(
        (rc[0].wr_id, rc[0].status, rc[0].opcode, rc[0].byte_len),
        (30, WcStatus::Success, WcOpcode::Recv, len)
    );
    assert_eq!(rc[0].imm_data, 0xfeed);
    assert_eq!(p.mem(&a).get(OWNER, a.addr(600_000), len as usize), data);
    assert_eq!(p.wait_cq(&b, b.send_cq, 1, DEADLINE).unwrap()[0].wr_id, 3);

    // Both atomics.
    p.mem(&b).set_word(OWNER, b.addr(0), 40);
    p.post_send(
        &a,
        SendWr::new(
            4,
            SendOp::AtomicFetchAdd {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey,
                add: 2,
            },
            vec![a.sge(900_000, 8)],
        ),
    );
    p.post_send(
        &a,
        SendWr::new(
            5,
            SendOp::AtomicCmpSwap {
                remote_addr: b.addr(0),
                rkey: b.mr.rkey,
                compare: 42,
                swap: 7,
            },
            vec![a.sge(900_008, 8)],
        ),
    );
    let wc = p.wait_cq(&a, a.send_cq, 2, DEADLINE).unwrap();
    assert!(wc.iter().all(|w| w.status == WcStatus::Success));
    assert_eq!(p.mem(&a).word(OWNER, a.addr(900_000)), 40);
    assert_eq!(p.mem(&a).word(OWNER, a.addr(900_008)), 42);
    assert_eq!(p.mem(&b).word(OWNER, b.addr(0)), 7);

    // A bad rkey still fails as a remote access error.
    p.post_send(
        &a,
        SendWr::rdma_write(
            6,
            vec![a.sge(0, 10)],
            b.addr(0),
            engine::Rkey::new(b.mr.rkey.value() ^ 0x100),
        ),
    );
    let wc = p.wait_cq(&a, a.send_cq, 1, DEADLINE).unwrap();
    assert_eq!(wc[0].status, WcStatus::RemAccessErr);

    // Nothing of this went onto the network, and verbs still see the path MTU they set.
    assert_eq!(p.sim.stats().delivered, 0);
    let qpn = b.qpn;
    assert_eq!(
        p.engine(&b).query_qp(qpn).unwrap().path_mtu,
        PathMtu::Mtu1024
    );
}

#[test]
fn internal_packets_are_refused_from_a_socket_and_network_packets_from_the_host() {
    // Take one internal packet out of a one-host pair before its engine gets it back.
    let mut p = one_host();
    let (a, b) = (p.a, p.b);
    p.post_send(
        &a,
        SendWr::rdma_write(1, vec![a.sge(0, 20_000)], b.addr(0), b.mr.rkey),
    );
    let mut buf = vec![0u8; MAX_INTERNAL_MTU as usize + 256];
    let now = instant(Duration::ZERO);
    let t = p.engine(&a).poll_transmit(now, &mut buf).unwrap();
    assert!(t.internal);
    assert!(t.len > 20_000, "one segment carries the whole message");
    let internal = buf[..t.len].to_vec();
    // As if it came from a socket: neither its IPv4 header checksum nor its ICRC is
    // there, so it is dropped as malformed.
    let malformed = p.engine(&a).counters().get(Counter::RxMalformed);
    p.engine(&a).handle_datagram(now, &internal);
    assert_eq!(
        p.engine(&a).counters().get(Counter::RxMalformed),
        malformed + 1
    );
    assert!(p.mem(&b).get(OWNER, b.addr(0), 4).iter().all(|&x| x == 0));
    // Handed back as the host would: it lands.
    p.engine(&a).handle_internal(now, &internal);
    assert_eq!(
        p.mem(&b).get(OWNER, b.addr(0), 20_000),
        p.mem(&a).get(OWNER, a.addr(0), 20_000)
    );

    // A network pair's packet handed to the internal entry is refused by its QP.
    let mut net = Pair::new(PairConfig::default());
    let (na, nb) = (net.a, net.b);
    net.post_send(
        &na,
        SendWr::rdma_write(1, vec![na.sge(0, 64)], nb.addr(0), nb.mr.rkey),
    );
    let t = net.engine(&na).poll_transmit(now, &mut buf).unwrap();
    assert!(!t.internal);
    let refused = net.engine(&nb).counters().get(Counter::RxAddressMismatch);
    net.engine(&nb).handle_internal(now, &buf[..t.len]);
    assert_eq!(
        net.engine(&nb).counters().get(Counter::RxAddressMismatch),
        refused + 1
    );
    // The same bytes from the network are fine.
    net.engine(&nb).handle_datagram(now, &buf[..t.len]);
    assert_eq!(
        net.engine(&nb).counters().get(Counter::RxAddressMismatch),
        refused + 1
    );
}
