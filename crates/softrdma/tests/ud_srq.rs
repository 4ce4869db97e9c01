//! UD sends through address handles, and shared receive queues, over loopback UDP.

#[macro_use]
mod common;

use common::{all_access, connect, open_pair_on, Side, WAIT};
use softrdma::{Buffer, Gid, QpType, Qpn, WcOpcode, DEFAULT_QKEY, GRH_LEN};

on_both_backends! {
fn a_ud_send_arrives_behind_a_grh_with_the_source_qp(backend: BackendKind) {
    let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
    let side = |d: &softrdma::Device| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).qp_type(QpType::Ud).build().unwrap();
        let mr = pd.register(Buffer::zeroed(4096), all_access()).unwrap();
        (pd, cq, qp, mr)
    };
    let (pa, ca, qa, ma) = side(&da);
    let (_pb, cb, qb, mb) = side(&db);
    qb.recv(1, &[mb.sge(..GRH_LEN + 100).unwrap()]).unwrap();
    let ah = pa.create_ah(db.gid(0).unwrap()).unwrap();
    ma.write(0, b"datagram").unwrap();
    qa.send_ud(5, &[ma.sge(..8).unwrap()], &ah, qb.qpn(), DEFAULT_QKEY)
        .unwrap();
    assert_eq!(ca.wait_ok(WAIT).unwrap().wr_id, 5);
    let wc = cb.wait_ok(WAIT).unwrap();
    assert_eq!(wc.opcode, WcOpcode::Recv);
    assert_eq!(wc.src_qp, qa.qpn());
    assert_eq!(wc.byte_len as usize, GRH_LEN + 8);
    let mut got = [0u8; 8];
    mb.read(GRH_LEN, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
}
}

on_both_backends! {
fn two_qps_draw_their_receives_from_one_srq(backend: BackendKind) {
    let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
    let pd_b = db.alloc_pd().unwrap();
    let cq_b = db.create_cq(16).unwrap();
    let srq = pd_b.create_srq(16, 1).unwrap();
    let mr_b = pd_b.register(Buffer::zeroed(4096), all_access()).unwrap();
    for i in 0..4u64 {
        let off = i as usize * 64;
        srq.recv(i, &[mr_b.sge(off..off + 64).unwrap()]).unwrap();
    }
    // Two senders on device a, each connected to its own SRQ-fed QP on device b.
    let mut sides = Vec::new();
    for _ in 0..2 {
        let pd = da.alloc_pd().unwrap();
        let cq = da.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).build().unwrap();
        let mr = pd.register(Buffer::zeroed(64), all_access()).unwrap();
        let a = Side {
            dev: da.clone(),
            pd,
            cq,
            qp,
            mr,
        };
        let qp_b = pd_b.qp_builder(&cq_b, &cq_b).srq(&srq).build().unwrap();
        let mr_dummy = pd_b.register(Buffer::zeroed(8), all_access()).unwrap();
        let b = Side {
            dev: db.clone(),
            pd: pd_b.clone(),
            cq: cq_b.clone(),
            qp: qp_b,
            mr: mr_dummy,
        };
        connect(&a, &b);
        sides.push((a, b));
    }
    for (i, (a, _)) in sides.iter().enumerate() {
        a.mr.write(0, &[i as u8 + 1; 10]).unwrap();
        a.qp.send(i as u64, &[a.mr.sge(..10).unwrap()]).unwrap();
        a.cq.wait_ok(WAIT).unwrap();
    }
    let mut qpns = Vec::new();
    for _ in 0..2 {
        let wc = cq_b.wait_ok(WAIT).unwrap();
        assert_eq!(wc.byte_len, 10);
        qpns.push(wc.qp_num);
    }
    qpns.sort_unstable();
    let mut want: Vec<Qpn> = sides.iter().map(|(_, b)| b.qp.qpn()).collect();
    want.sort_unstable();
    assert_eq!(qpns, want);
    assert_eq!(srq.len().unwrap(), 2);
    let all = mr_b.to_vec();
    assert_eq!(all[..10], [1; 10]);
    assert_eq!(all[64..74], [2; 10]);
}
}

on_both_backends! {
    fn an_armed_srq_limit_raises_one_event_when_the_queue_runs_low(backend: BackendKind) {
        let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let pd_b = db.alloc_pd().unwrap();
        let cq_b = db.create_cq(16).unwrap();
        let srq = pd_b.create_srq(16, 1).unwrap();
        let mr_b = pd_b.register(Buffer::zeroed(4096), all_access()).unwrap();
        for i in 0..4u64 {
            let off = i as usize * 64;
            srq.recv(i, &[mr_b.sge(off..off + 64).unwrap()]).unwrap();
        }
        srq.arm_limit(3).unwrap();
        let q = srq.query().unwrap();
        assert_eq!((q.max_sge, q.srq_limit), (1, 3));
        assert!(q.max_wr >= 16);
        let pd_a = da.alloc_pd().unwrap();
        let cq_a = da.create_cq(16).unwrap();
        let qp_a = pd_a.qp_builder(&cq_a, &cq_a).build().unwrap();
        let mr_a = pd_a.register(Buffer::zeroed(64), all_access()).unwrap();
        let qp_b = pd_b.qp_builder(&cq_b, &cq_b).srq(&srq).build().unwrap();
        let a = Side {
            dev: da.clone(),
            pd: pd_a,
            cq: cq_a,
            qp: qp_a,
            mr: mr_a,
        };
        let b = Side {
            dev: db.clone(),
            pd: pd_b.clone(),
            cq: cq_b.clone(),
            qp: qp_b,
            mr: pd_b.register(Buffer::zeroed(8), all_access()).unwrap(),
        };
        connect(&a, &b);
        for i in 0..2u64 {
            a.qp.send(i, &[a.mr.sge(..8).unwrap()]).unwrap();
            a.cq.wait_ok(WAIT).unwrap();
            cq_b.wait_ok(WAIT).unwrap();
        }
        let ev = db.wait_async_event(WAIT).unwrap();
        assert!(matches!(ev, softrdma::AsyncEvent::SrqLimitReached { .. }), "{ev:?}");
        assert_eq!(srq.query().unwrap().srq_limit, 0, "disarmed once it fired");
        assert_eq!(srq.len().unwrap(), 2);
    }
}

on_both_backends! {
fn a_datagram_to_a_group_reaches_every_qp_attached_to_it_and_no_other(backend: BackendKind) {
    // One device: groups reach the QPs of a device (on the daemon, of every process).
    let da = common::open_on(backend, "127.0.0.1");
    let db = da.clone();
    let group = Gid::from_ip("239.1.2.3".parse().unwrap());
    let side = |d: &softrdma::Device| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).qp_type(QpType::Ud).build().unwrap();
        let mr = pd.register(Buffer::zeroed(4096), all_access()).unwrap();
        qp.recv(1, &[mr.sge(..GRH_LEN + 64).unwrap()]).unwrap();
        (pd, cq, qp, mr)
    };
    let (pa, ca, qa, ma) = side(&da);
    let (_p1, c1, q1, m1) = side(&db);
    let (_p2, c2, q2, _m2) = side(&db);
    let (_p3, c3, q3, _m3) = side(&db);
    q1.attach_mcast(group).unwrap();
    q2.attach_mcast(group).unwrap();
    q3.attach_mcast(group).unwrap();
    q3.detach_mcast(group).unwrap();
    // Only UD QPs join; detaching twice is an error.
    assert_eq!(q3.detach_mcast(group).unwrap_err().errno(), 22);

    let ah = pa.create_ah(group).unwrap();
    ma.write(0, b"to all").unwrap();
    qa.send_ud(5, &[ma.sge(..6).unwrap()], &ah, Qpn::MULTICAST, DEFAULT_QKEY)
        .unwrap();
    assert_eq!(ca.wait_ok(WAIT).unwrap().wr_id, 5);
    for cq in [&c1, &c2] {
        let wc = cq.wait_ok(WAIT).unwrap();
        let want = (1, qa.qpn(), GRH_LEN + 6);
        assert_eq!((wc.wr_id, wc.src_qp, wc.byte_len as usize), want);
    }
    let mut got = [0u8; 6];
    m1.read(GRH_LEN, &mut got).unwrap();
    assert_eq!(&got, b"to all");
    // The detached QP got nothing.
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(c3.poll(4).unwrap().is_empty());
    drop((q1, q2, q3));
}
}

/// Two embedded devices that are not linked, as in two processes, on one UDP port (as two
/// hosts use 4791): a datagram to a group crosses the network to the other device, which
/// joined the group's IP address when its QP attached and leaves it on the last detach.
/// The sender's own QP gets one copy: the one the network brings back is dropped.
#[test]
fn a_datagram_to_a_group_reaches_a_device_of_another_process_through_the_network() {
    use softrdma::BackendKind;
    let group_ip: std::net::IpAddr = "239.1.2.9".parse().unwrap();
    let group = Gid::from_ip(group_ip);
    let open = |ip: &str, port: u16| {
        softrdma::Device::builder(ip.parse().unwrap())
            .backend(BackendKind::Embedded)
            .port(port)
            .remote_port(port)
            .open()
            .unwrap()
    };
    let da = open("127.0.0.1", 0);
    let db = open("127.0.0.2", da.local_addr().port());
    let side = |d: &softrdma::Device| {
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).qp_type(QpType::Ud).build().unwrap();
        let mr = pd.register(Buffer::zeroed(4096), all_access()).unwrap();
        for i in 0..4u64 {
            let off = i as usize * 256;
            qp.recv(i, &[mr.sge(off..off + GRH_LEN + 64).unwrap()])
                .unwrap();
        }
        (pd, cq, qp, mr)
    };
    let (pa, ca, qa, ma) = side(&da);
    let (_pb, cb, qb, mb) = side(&db);
    let (ra, rb) = (da.runtime(), db.runtime());
    assert!(rb.joined_groups().is_empty());
    qa.attach_mcast(group).unwrap();
    qb.attach_mcast(group).unwrap();
    assert_eq!(ra.joined_groups(), [group_ip]);
    assert_eq!(rb.joined_groups(), [group_ip]);

    let ah = pa.create_ah(group).unwrap();
    ma.write(2048, b"across").unwrap();
    let send = |wr_id| {
        qa.send_ud(
            wr_id,
            &[ma.sge(2048..2054).unwrap()],
            &ah,
            Qpn::MULTICAST,
            DEFAULT_QKEY,
        )
        .unwrap();
        assert_eq!(ca.wait_ok(WAIT).unwrap().wr_id, wr_id);
    };
    send(10);
    let wc = cb.wait_ok(WAIT).unwrap();
    assert_eq!(
        (wc.wr_id, wc.src_qp, wc.byte_len as usize),
        (0, qa.qpn(), GRH_LEN + 6)
    );
    let mut got = [0u8; 6];
    mb.read(GRH_LEN, &mut got).unwrap();
    assert_eq!(&got, b"across");
    // The sender's QP: its device's own copy.
    let wc = ca.wait_ok(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.src_qp), (0, qa.qpn()));
    // The network brings the datagram back to the sender's device too (on lo the datagram
    // itself returns): dropped there, not a second copy.
    let start = std::time::Instant::now();
    while ra.io_counters().rx_mcast_own == 0 {
        assert!(
            start.elapsed() < WAIT.unwrap(),
            "the sender's own datagram never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(rb.io_counters().rx_mcast_own, 0);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(
        ca.poll(4).unwrap().is_empty(),
        "a second copy for the sender"
    );
    assert!(
        cb.poll(4).unwrap().is_empty(),
        "a second copy for the receiver"
    );

    // The last QP of device b leaves: so does the device, and nothing reaches it.
    qb.detach_mcast(group).unwrap();
    assert!(rb.joined_groups().is_empty());
    let before = rb.io_counters().rx_datagrams;
    send(11);
    assert_eq!(ca.wait_ok(WAIT).unwrap().wr_id, 1);
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(cb.poll(4).unwrap().is_empty());
    assert_eq!(rb.io_counters().rx_datagrams, before);
    // Destroying the last attached QP leaves too.
    drop(qa);
    assert!(ra.joined_groups().is_empty());
}
