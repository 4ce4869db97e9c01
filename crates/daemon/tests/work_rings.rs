//! Posting through shared-memory work rings (issue 6, items 3 and 8): a WQE written into a
//! QP's ring, its bit set in the connection's doorbell page, is taken by a sleeping daemon
//! once the doorbell is rung, and by a busy one with no doorbell at all; rings that lie
//! (impossible indices, garbage or foreign WQEs) put their QP in the error state, and bits
//! that name no ring are ignored, and the daemon serves on.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use abi::arena::RingPlace;
use abi::client::{Posted, WorkDoorbell, WorkQueueRing};
use abi::doorbell::{DoorbellPage, SUMMARY_WORDS, WORDS};
use abi::proto::{wq, Request};
use abi::ring::RingError;
use abi::ring::Role;
use abi::wqe;
use common::{connected_pair, Daemon, Side};
use engine::{AhHandle, RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge, UdDest};

/// A daemon whose progress thread looks for work `spin_us` µs after the last before it
/// sleeps.
fn daemon_with_spin(spin_us: u64) -> Daemon {
    Daemon::start_with(|n| {
        vec![
            "--addr".into(),
            format!("127.0.0.{}", 2 + (n % 200)),
            "--busy-poll-us".into(),
            spin_us.to_string(),
        ]
    })
}

/// What `side`'s work rings on device 0 ring.
fn bell(side: &mut Side) -> WorkDoorbell {
    let eventfd = Arc::new(side.client.doorbell(0).unwrap());
    side.client.work_doorbell(0, eventfd).unwrap()
}

/// Where a ring to write by hand (as a hostile client can) for `queue` of `qp` is in the
/// connection's arena, and its bit in the connection's doorbell page (which must have been
/// asked for before).
fn hand_ring(side: &mut Side, queue: u8, qp: u32) -> (RingPlace, u32) {
    side.client.work_ring_at(queue, qp, 8).unwrap()
}

fn rings(side: &mut Side) -> (WorkQueueRing, WorkQueueRing) {
    let bell = bell(side);
    let sq = side
        .client
        .attach_work_ring(wq::SQ, side.qp, 16, bell.clone())
        .unwrap();
    let rq = side
        .client
        .attach_work_ring(wq::RQ, side.qp, 16, bell)
        .unwrap();
    (sq, rq)
}

/// A work request for one of a side's queues, posted by ring or by request.
enum Wr {
    Send(u32, SendWr),
    Recv(u32, RecvWr),
}

impl Wr {
    /// The post request for it.
    fn request(&self) -> Request {
        let mut e = vec![0u8; wqe::MAX_SEND_ENTRY];
        match self {
            Wr::Send(qp, wr) => {
                let n = wqe::encode_send(wr, None, &mut e).unwrap();
                e.truncate(n);
                Request::PostSend { qp: *qp, wqe: e }
            }
            Wr::Recv(qp, wr) => {
                let n = wqe::encode_recv(wr, &mut e).unwrap();
                e.truncate(n);
                Request::PostRecv { qp: *qp, wqe: e }
            }
        }
    }
}

/// Posting a [`Wr`] into a work ring.
trait PostWr {
    fn post(&mut self, wr: &Wr) -> Result<Posted, RingError>;
}

impl PostWr for WorkQueueRing {
    fn post(&mut self, wr: &Wr) -> Result<Posted, RingError> {
        match wr {
            Wr::Send(_, w) => self.post_send(w, None),
            Wr::Recv(_, w) => self.post_recv(w),
        }
    }
}

/// Posting a [`Wr`] by request.
trait PostByRequest {
    fn post_wr(&mut self, wr: &Wr) -> Result<(), abi::client::ClientError>;
}

impl PostByRequest for abi::client::Client {
    fn post_wr(&mut self, wr: &Wr) -> Result<(), abi::client::ClientError> {
        self.post(&wr.request())
    }
}

fn recv(side: &Side, wr_id: u64, off: u64) -> Wr {
    let sge = Sge::new(side.buf.addr() + off, 64, side.lkey);
    Wr::Recv(side.qp, RecvWr::new(wr_id, vec![sge]))
}

fn send(side: &Side, wr_id: u64, text: &str) -> Wr {
    let mut wr = SendWr::send(wr_id, Vec::new());
    wr.payload = SendPayload::Inline(text.as_bytes().to_vec().into());
    wr.flags |= SendFlags::INLINE;
    Wr::Send(side.qp, wr)
}

/// A signaled RDMA WRITE of `from`'s first `len` bytes to the start of `to`'s buffer.
fn write_all(from: &Side, to: &Side, wr_id: u64, len: usize) -> Wr {
    let sge = Sge::new(from.buf.addr(), len as u32, from.lkey);
    Wr::Send(
        from.qp,
        SendWr::rdma_write(wr_id, vec![sge], to.buf.addr(), to.rkey),
    )
}

/// Wait, looking only at shared memory (no request, which would take the WQEs itself),
/// until the daemon has taken everything from `ring`.
fn wait_taken(ring: &WorkQueueRing) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while ring.unconsumed().unwrap() > 0 {
        assert!(Instant::now() < deadline, "the daemon never took the WQEs");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Wait until the daemon says (in the ring) that it sleeps.
fn wait_asleep(ring: &WorkQueueRing) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ring.daemon_sleeps() {
        assert!(Instant::now() < deadline, "the daemon never went to sleep");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_sleeping_daemon_is_woken_by_the_doorbell_and_takes_the_wqe() {
    let d = daemon_with_spin(0);
    let (mut a, mut b) = connected_pair(&d, 4096);
    let (sq, _) = rings(&mut a);
    let (_, rq) = rings(&mut b);
    let (mut sq, mut rq) = (sq, rq);
    // An engine timer may wake the daemon between our look and our post (then it needs no
    // doorbell): try a few rounds until a post finds it asleep, each one checked.
    let mut rang = 0;
    let mut rounds = 0u64;
    while rang < 2 && rounds < 50 {
        wait_asleep(&rq);
        let p = rq.post(&recv(&b, rounds, 64 * rounds)).unwrap();
        let Posted::Queued { doorbell } = p else {
            panic!("{p:?}")
        };
        rang += usize::from(doorbell);
        wait_taken(&rq);
        wait_asleep(&sq);
        let text = format!("round {rounds:02}");
        let p = sq.post(&send(&a, rounds, &text)).unwrap();
        let Posted::Queued { doorbell } = p else {
            panic!("{p:?}")
        };
        rang += usize::from(doorbell);
        wait_taken(&sq);
        rounds += 1;
    }
    assert!(
        rang >= 2,
        "no post found the daemon asleep in {rounds} rounds"
    );
    assert_eq!(sq.doorbells() + rq.doorbells(), rang as u64);
    let wa = a.wait(rounds as usize);
    let wb = b.wait(rounds as usize);
    for i in 0..rounds {
        assert_eq!((wa[i as usize].wr_id, wa[i as usize].status), (i, 0));
        assert_eq!((wb[i as usize].wr_id, wb[i as usize].status), (i, 0));
        assert_eq!(
            b.buf.read(64 * i as usize, 8),
            format!("round {i:02}").as_bytes()
        );
    }
    let s = d.stats();
    assert_eq!(s.get("srxe0.ring_wqes"), 2 * rounds);
    assert!(s.get("srxe0.doorbell_wakeups") >= 1);
    assert!(s.get("srxe0.progress_sleeps") >= 1);
}

#[test]
fn a_busy_daemon_takes_wqes_with_no_doorbell() {
    // The progress thread keeps looking for a minute after its last work (and since it
    // started): it never sleeps during this test, so no post may ring.
    let d = daemon_with_spin(60_000_000);
    let (mut a, mut b) = connected_pair(&d, 64 * 64);
    let (mut sq, _) = rings(&mut a);
    let (_, mut rq) = rings(&mut b);
    // The progress thread may have slept once, before the spin was set (at start-up on a
    // loaded machine); attaching a ring rang its doorbell, and from then on it stays awake.
    let deadline = Instant::now() + Duration::from_secs(20);
    while sq.daemon_sleeps() || rq.daemon_sleeps() {
        assert!(Instant::now() < deadline, "the daemon never woke");
        std::thread::sleep(Duration::from_millis(1));
    }
    let sleeps = d.stat("srxe0.progress_sleeps");
    let n = 30u64;
    for i in 0..n {
        // Stay within the rings and the QP's 32 WRs: post in two halves.
        if i == n / 2 {
            wait_taken(&rq);
            wait_taken(&sq);
            let _ = a.wait(n as usize / 2);
        }
        let p = rq.post(&recv(&b, i, 64 * i)).unwrap();
        assert_eq!(p, Posted::Queued { doorbell: false });
        let p = sq.post(&send(&a, i, &format!("busy {i:02}"))).unwrap();
        assert_eq!(p, Posted::Queued { doorbell: false });
    }
    wait_taken(&rq);
    wait_taken(&sq);
    let _ = a.wait(n as usize / 2);
    let wb = b.wait(n as usize);
    for (i, w) in wb.iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (i as u64, 0));
        assert_eq!(b.buf.read(64 * i, 7), format!("busy {i:02}").as_bytes());
    }
    assert_eq!(sq.doorbells() + rq.doorbells(), 0);
    let s = d.stats();
    assert_eq!(s.get("srxe0.ring_wqes"), 2 * n);
    assert_eq!(s.get("srxe0.progress_sleeps"), sleeps);
}

/// An RC QP in INIT on `side`'s connection.
fn spare_qp(side: &mut Side) -> u32 {
    let qp = side
        .client
        .create_qp(&common::rc_init(side.pd, side.cq, 8, 2, 64))
        .unwrap()
        .handle;
    to_init(side, qp);
    qp
}

fn to_init(side: &mut Side, qp: u32) {
    side.client
        .modify_qp(
            qp,
            &engine::QpAttr {
                qp_state: engine::QpState::Init,
                port_num: 1,
                qp_access_flags: common::REMOTE_WRITE,
                ..Default::default()
            },
            common::mask::STATE
                | common::mask::PKEY_INDEX
                | common::mask::PORT
                | common::mask::ACCESS_FLAGS,
        )
        .unwrap();
}

/// Store `value` in the 32-bit word at byte `off` of the ring at `place` of `side`'s
/// arena, as a hostile client can.
#[allow(unsafe_code)]
fn scribble(side: &Side, place: RingPlace, off: usize, value: u32) {
    use rustix::mm::{MapFlags, ProtFlags};
    let fd = side.client.arena_fd(place.chunk).unwrap();
    let at = place.offset as usize + off;
    let page = at - at % 4096;
    assert!(off + 4 <= place.len as usize);
    // SAFETY: a fresh shared mapping of the page of the arena chunk that holds the word
    // (the chunk is longer: the ring is in it); unmapped below, and nothing else in this
    // process uses it.
    unsafe {
        let p = rustix::mm::mmap(
            std::ptr::null_mut(),
            4096,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            page as u64,
        )
        .unwrap();
        std::ptr::write_volatile(p.cast::<u8>().add(at - page).cast::<u32>(), value);
        rustix::mm::munmap(p, 4096).unwrap();
    }
}

/// After a ring of `qp` lied: the QP is in ERR, the counter moved, and the daemon serves
/// this connection and others as before.
fn check_survived(d: &mut Daemon, a: &mut Side, b: &mut Side, qp: u32, counter: &str, n: u64) {
    // Any request takes what waits in the rings first: this one finds the lie.
    let st = a.client.query_qp(qp).unwrap().qp_state;
    assert_eq!(d.stat(&format!("srxe0.{counter}")), n);
    assert_eq!(st, engine::QpState::Err, "{counter}");
    assert!(d.alive());
    // The connected pair still moves data, by request and by ring.
    b.client
        .post_recv(
            b.qp,
            &RecvWr::new(7, vec![Sge::new(b.buf.addr(), 64, b.lkey)]),
        )
        .unwrap();
    a.client.post_wr(&send(a, 7, "still here")).unwrap();
    let w = b.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (7, 0));
    assert_eq!(b.buf.read(0, 10), b"still here");
}

#[test]
fn impossible_ring_indices_put_the_qp_in_error_and_the_daemon_serves_on() {
    let mut d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let page = a.client.doorbell_page(0).unwrap();
    // Producer index far ahead of the consumer, and one behind it (wrapped).
    for (n, prod) in [(1u64, 1000u32), (2, u32::MAX)] {
        let qp = spare_qp(&mut a);
        let (place, bit) = hand_ring(&mut a, wq::RQ, qp);
        scribble(&a, place, 64, prod);
        page.ring(bit).unwrap();
        check_survived(&mut d, &mut a, &mut b, qp, "ring_bad_indices", n);
        // The lying ring is gone: the queue may get a new one.
        assert!(a.client.work_ring_at(wq::RQ, qp, 8).is_ok());
    }
}

/// A hostile ring entry for the QP with this handle.
type EntryFor<'a> = Box<dyn Fn(u32) -> Vec<u8> + 'a>;

#[test]
fn garbage_and_foreign_wqes_put_the_qp_in_error_and_the_daemon_serves_on() {
    let mut d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let mut garbage = vec![0u8; wqe::send_entry_len(1, 0)];
    let mut x = 0x9e37_79b9u32;
    for g in &mut garbage {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *g = x as u8;
    }
    let send_entry = |wr: &SendWr, ud: Option<&UdDest>| {
        let mut e = vec![0u8; wqe::MAX_SEND_ENTRY];
        let n = wqe::encode_send(wr, ud, &mut e).unwrap();
        e.truncate(n);
        e
    };
    let recv_entry = || {
        let mut e = vec![0u8; wqe::MAX_RECV_ENTRY];
        let n = wqe::encode_recv(&RecvWr::new(1, Vec::new()), &mut e).unwrap();
        e.truncate(n);
        e
    };
    let plain = SendWr::send(1, Vec::new());
    let page = a.client.doorbell_page(0).unwrap();
    let cases: Vec<(&str, u8, EntryFor<'_>)> = vec![
        ("random bytes", wq::SQ, Box::new(move |_| garbage.clone())),
        (
            "more SGEs than the entry holds",
            wq::RQ,
            Box::new(move |_| {
                let mut e = recv_entry();
                e[8..12].copy_from_slice(&9u32.to_ne_bytes());
                e
            }),
        ),
        (
            "an unknown opcode",
            wq::SQ,
            Box::new(|_| {
                let mut e = send_entry(&plain, None);
                e[8..12].copy_from_slice(&77u32.to_ne_bytes());
                e
            }),
        ),
        (
            "unknown send flags",
            wq::SQ,
            Box::new(|_| {
                let mut e = send_entry(&plain, None);
                e[12..16].copy_from_slice(&0x8000u32.to_ne_bytes());
                e
            }),
        ),
        (
            "a UD send naming an AH the connection does not hold",
            wq::SQ,
            Box::new(|_| {
                let dest = UdDest {
                    ah: AhHandle(999_999),
                    remote_qpn: wire::Qpn::GSI,
                    remote_qkey: 0,
                };
                send_entry(&plain, Some(&dest))
            }),
        ),
        (
            "a UD send whose destination QPN does not fit 24 bits",
            wq::SQ,
            Box::new(|_| {
                let dest = UdDest {
                    ah: AhHandle(0),
                    remote_qpn: wire::Qpn::GSI,
                    remote_qkey: 0,
                };
                let mut e = send_entry(&plain, Some(&dest));
                let at = std::mem::offset_of!(wqe::SendWqe, remote_qpn);
                e[at..at + 4].copy_from_slice(&0x0100_0001u32.to_ne_bytes());
                e
            }),
        ),
        (
            "a bind of a window the connection does not hold",
            wq::SQ,
            Box::new(|_| {
                let mut wr = plain.clone();
                wr.op = SendOp::BindMw {
                    mw: engine::MwHandle(999_999),
                    rkey: engine::Rkey::new(1),
                    bind: engine::MwBind {
                        mr: engine::MrHandle(999_999),
                        addr: 0,
                        length: 0,
                        access: engine::AccessFlags::empty(),
                    },
                };
                send_entry(&wr, None)
            }),
        ),
    ];
    for (n, (what, queue, make)) in cases.iter().enumerate() {
        let qp = spare_qp(&mut a);
        let (place, bit) = hand_ring(&mut a, *queue, qp);
        let mut ring = a.client.ring_at(place, Role::Producer).unwrap();
        assert!(ring.push(&make(qp)).unwrap(), "{what}");
        page.ring(bit).unwrap();
        eprintln!("case: {what}");
        check_survived(&mut d, &mut a, &mut b, qp, "ring_bad_wqes", n as u64 + 1);
    }
    // A well-formed WQE the engine refuses (an RDMA READ with inline data, which has
    // nowhere to land).
    let qp = spare_qp(&mut a);
    let (place, bit) = hand_ring(&mut a, wq::SQ, qp);
    let mut ring = a.client.ring_at(place, Role::Producer).unwrap();
    let mut read = SendWr::rdma_read(1, Vec::new(), b.buf.addr(), b.rkey);
    read.payload = SendPayload::Inline(vec![0; 8].into());
    read.flags |= SendFlags::INLINE;
    let mut e = vec![0u8; wqe::MAX_SEND_ENTRY];
    let n = wqe::encode_send(&read, None, &mut e).unwrap();
    assert!(ring.push(&e[..n]).unwrap());
    page.ring(bit).unwrap();
    check_survived(&mut d, &mut a, &mut b, qp, "ring_refused_wqes", 1);
    // Another connection's QP cannot be given a ring, nor a queue kind that does not exist.
    let mut c = d.client();
    let _ = c.alloc_pd(0).unwrap();
    let _ = c.doorbell_page(0).unwrap();
    assert_eq!(
        c.work_ring_at(wq::SQ, a.qp, 8).unwrap_err().errno(),
        Some(22)
    );
    assert_eq!(c.work_ring_at(7, 1, 8).unwrap_err().errno(), Some(22));
    assert_eq!(
        a.client.work_ring_at(wq::SQ, a.qp, 3).unwrap_err().errno(),
        Some(22)
    );
}

#[test]
fn two_clients_on_one_device_move_data_with_no_udp() {
    let d = Daemon::start();
    let len = 256 * 1024;
    let (mut a, b) = connected_pair(&d, len);
    let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    a.buf.write(0, &pattern);
    let (mut sq, _) = rings(&mut a);
    let p = sq.post(&write_all(&a, &b, 1, len)).unwrap();
    assert!(matches!(p, Posted::Queued { .. }));
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (1, 0));
    assert!(b.buf.read(0, len) == pattern, "the data landed");
    let s = d.stats();
    assert_eq!(s.get("srxe0.tx_datagrams"), 0);
    assert_eq!(s.get("srxe0.rx_datagrams"), 0);
    // 256 KiB between QPs of one device: in internal segments, not 256 packets of the
    // 1024-byte path MTU, and their ACKs, all kept inside.
    let segments = (len / engine::MAX_INTERNAL_MTU as usize) as u64;
    let local = s.get("srxe0.local_packets");
    assert!((segments..256).contains(&local), "{local} packets");
    assert!(s.get("srxe0.tx_packets") >= segments);
}

#[test]
fn two_devices_of_one_daemon_hand_each_other_packets_with_no_udp() {
    let d = Daemon::start_with(|n| {
        let x = 2 + 2 * (n % 100);
        vec![
            "--addr".into(),
            format!("127.0.1.{x}"),
            "--addr".into(),
            format!("127.0.1.{}", x + 1),
        ]
    });
    let len = 128 * 1024;
    let mut a = Side::on(d.client(), 0, len);
    let mut b = Side::on(d.client(), 1, len);
    assert_ne!(a.gid, b.gid);
    let (ga, qa, gb, qb) = (a.gid, a.qpn, b.gid, b.qpn);
    a.connect(gb, qb);
    b.connect(ga, qa);
    let pattern: Vec<u8> = (0..len).map(|i| (i * 13 + i / 1000) as u8).collect();
    a.buf.write(0, &pattern);
    a.client.post_wr(&write_all(&a, &b, 9, len)).unwrap();
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (9, 0));
    assert!(b.buf.read(0, len) == pattern, "the data landed");
    let s = d.stats();
    for dev in ["srxe0", "srxe1"] {
        assert_eq!(s.get(&format!("{dev}.tx_datagrams")), 0, "{dev}");
        assert_eq!(s.get(&format!("{dev}.rx_datagrams")), 0, "{dev}");
    }
    // 128 KiB in internal segments, as between QPs of one device: not 128 requests of the
    // 1024-byte path MTU one way; ACKs the other.
    let segments = (len / engine::MAX_INTERNAL_MTU as usize) as u64;
    let handed = s.get("srxe0.peer_packets");
    assert!((segments..128).contains(&handed), "{handed} packets");
    assert!(s.get("srxe1.peer_packets") >= 1);
    assert!(s.get("srxe1.rx_packets") >= segments);
}

#[test]
fn a_client_that_goes_away_leaves_no_work_ring_behind() {
    let d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let (mut sq, _rq) = rings(&mut a);
    let _ = rings(&mut b);
    let srq = b.client.create_srq(b.pd, &srq_attr(8, 1)).unwrap();
    let bell = bell(&mut b);
    let _srq_ring = b.client.attach_work_ring(wq::SRQ, srq, 8, bell).unwrap();
    assert_eq!(d.stat("srxe0.live_work_rings"), 5);
    // A send posted just before its client goes, taken or not, keeps nothing alive.
    let _ = sq.post(&send(&a, 1, "lost")).unwrap();
    drop(a);
    d.wait_until("a's rings detached", |s| {
        s.get("srxe0.live_work_rings") == 3 && s.get("clients_reclaimed") == 1
    });
    drop(b);
    let s = d.wait_until("b's rings detached", |s| s.get("clients_reclaimed") == 2);
    assert_eq!(s.get("srxe0.live_work_rings"), 0);
    assert_eq!(s.get("live_qps"), 0);
    assert_eq!(s.get("live_srqs"), 0);
}

/// A connection holds at most so many work rings (`--max-work-rings`, here a small one):
/// the one too many is refused with ENOMEM and a reason, and counted, the connection keeps
/// working (by request, and by ring again once it gave rings back), and other connections
/// attach rings and move data as before.
#[test]
fn a_client_past_the_work_ring_limit_gets_a_clear_error_and_everyone_is_served_on() {
    const LIMIT: usize = 64;
    let mut d = Daemon::start_with(|n| {
        vec![
            "--addr".into(),
            format!("127.0.0.{}", 2 + (n % 200)),
            "--max-work-rings".into(),
            LIMIT.to_string(),
        ]
    });
    let (mut a, mut b) = connected_pair(&d, 4096);
    let _page = a.client.doorbell_page(0).unwrap();
    let mut qps = Vec::new();
    while qps.len() * 2 < LIMIT {
        let qp = spare_qp(&mut a);
        for queue in [wq::SQ, wq::RQ] {
            a.client.work_ring_at(queue, qp, 1).unwrap();
        }
        qps.push(qp);
    }
    assert_eq!(d.stat("srxe0.live_work_rings"), LIMIT as u64);
    let extra = spare_qp(&mut a);
    let e = a.client.work_ring_at(wq::SQ, extra, 1).unwrap_err();
    match &e {
        abi::client::ClientError::Refused { errno, message } => {
            assert_eq!(*errno, 12, "{message}");
            assert!(message.contains("too many work rings"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(d.alive());
    assert_eq!(d.stat("srxe0.live_work_rings"), LIMIT as u64);
    assert_eq!(d.stat("ring_refusals"), 1);

    // The other connection: rings as before, and data through them.
    let (mut sq_b, _rq_b) = rings(&mut b);
    a.client.post_wr(&recv(&a, 5, 0)).unwrap();
    assert!(matches!(
        sq_b.post(&send(&b, 6, "over the limit")).unwrap(),
        Posted::Queued { .. }
    ));
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (5, 0));
    assert_eq!(a.buf.read(0, 14), b"over the limit");
    assert_eq!(b.wait(1)[0].wr_id, 6);

    // The same connection: by request still, and by ring once it gave two back.
    b.client.post_wr(&recv(&b, 7, 0)).unwrap();
    a.client.post_wr(&send(&a, 8, "by request")).unwrap();
    let w = b.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (7, 0));
    assert_eq!(b.buf.read(0, 10), b"by request");
    a.client.destroy_qp(qps.pop().unwrap()).unwrap();
    let (mut sq_a, _rq_a) = rings(&mut a);
    assert!(a.client.work_ring_at(wq::SQ, extra, 1).is_err());
    b.client.post_wr(&recv(&b, 9, 0)).unwrap();
    sq_a.post(&send(&a, 10, "by ring")).unwrap();
    let w = b.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (9, 0));
    assert_eq!(b.buf.read(0, 7), b"by ring");
    assert!(d.alive());
}

/// A work ring is attached only to a connection that holds the device's doorbell page (its
/// bit must go somewhere), and a second ask for the page gets the same page.
#[test]
fn a_work_ring_needs_the_doorbell_page_first() {
    let d = Daemon::start();
    let (mut a, _b) = connected_pair(&d, 4096);
    let e = a.client.work_ring_at(wq::SQ, a.qp, 8).unwrap_err();
    assert_eq!(e.errno(), Some(22), "{e:?}");
    let first = a.client.doorbell_page(0).unwrap();
    let qp = a.qp;
    let (_fd, bit) = hand_ring(&mut a, wq::SQ, qp);
    let again = a.client.doorbell_page(0).unwrap();
    again.ring(bit).unwrap();
    assert_eq!(first.daemon_sleeps(), again.daemon_sleeps());
    assert_eq!(a.client.doorbell_page(9).unwrap_err().errno(), Some(22));
}

/// A client that sets every bit of its doorbell page, over and over, names rings that do not
/// exist or are empty: the daemon looks at that client's rings only, never at another
/// connection's (a WQE another client wrote without ringing stays where it is), and serves
/// everyone on.
#[test]
fn garbage_bits_in_a_doorbell_page_touch_only_their_own_connection() {
    let mut d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let (mut sq_a, _rq_a) = rings(&mut a);
    let page_a = a.client.doorbell_page(0).unwrap();
    // b writes a receive into its RQ ring by hand and does not ring its bit.
    let page_b = b.client.doorbell_page(0).unwrap();
    let qp = b.qp;
    let (place, bit) = hand_ring(&mut b, wq::RQ, qp);
    let mut rq_b = b.client.ring_at(place, Role::Producer).unwrap();
    let mut e = vec![0u8; wqe::MAX_RECV_ENTRY];
    let Wr::Recv(_, wr) = recv(&b, 11, 0) else {
        unreachable!()
    };
    let n = wqe::encode_recv(&wr, &mut e).unwrap();
    assert!(rq_b.push(&e[..n]).unwrap());
    let deadline = Instant::now() + Duration::from_millis(200);
    while Instant::now() < deadline {
        scribble_all(&page_a);
        assert_eq!(rq_b.free().unwrap(), 7, "b's unrung ring was looked at");
        std::thread::yield_now();
    }
    scribble_all(&page_a);
    assert!(d.alive());
    // a's own rings and requests work as before, and b's receive goes in once rung.
    assert!(a.client.query_qp(a.qp).is_ok());
    page_b.ring(bit).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while rq_b.free().unwrap() < 8 {
        assert!(Instant::now() < deadline, "b's rung ring was never taken");
        std::thread::sleep(Duration::from_millis(1));
    }
    sq_a.post(&send(&a, 12, "noisy page")).unwrap();
    let w = b.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (11, 0));
    assert_eq!(b.buf.read(0, 10), b"noisy page");
    assert_eq!(a.wait(1)[0].wr_id, 12);
    assert_eq!(d.stat("srxe0.ring_bad_wqes"), 0);
    assert_eq!(d.stat("srxe0.ring_bad_indices"), 0);
}

/// Every bit of `page`, set, summary included.
fn scribble_all(page: &DoorbellPage) {
    for i in 0..WORDS {
        page.scribble(i, u64::MAX);
    }
    for i in 0..SUMMARY_WORDS {
        page.scribble_summary(i, u64::MAX);
    }
}

/// An SRQ of `max_wr` WRs of `max_sge` SGEs, its limit not armed.
fn srq_attr(max_wr: u32, max_sge: u32) -> engine::SrqAttr {
    engine::SrqAttr {
        max_wr,
        max_sge,
        srq_limit: 0,
    }
}

/// Mappings of the daemon process (lines of its `/proc/<pid>/maps`).
fn mappings(d: &Daemon) -> usize {
    std::fs::read_to_string(format!("/proc/{}/maps", d.child.id()))
        .unwrap()
        .lines()
        .count()
}

/// Far more work rings than one bit per ring of a 4096-bit doorbell page could name, on one
/// connection: 5000 QPs with send and receive rings, then the connected QP's rings after
/// them. Posts on those last rings go through the rings, none by request, and the rings
/// cost the daemon (and the client) a handful of arena chunks, not a mapping each.
#[test]
fn ten_thousand_rings_on_one_connection_take_posts_in_a_handful_of_mappings() {
    const QPS: usize = 5000;
    let d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let bell_a = bell(&mut a);
    let before = mappings(&d);
    let mut spare = Vec::new();
    for _ in 0..QPS {
        let qp = spare_qp(&mut a);
        for queue in [wq::SQ, wq::RQ] {
            let r = a
                .client
                .attach_work_ring(queue, qp, 8, bell_a.clone())
                .unwrap();
            spare.push(r);
        }
    }
    let (mut sq, _rq) = rings(&mut a);
    let (_sq_b, mut rq_b) = rings(&mut b);
    assert!(sq.bit() >= 2 * QPS as u32, "bit {}", sq.bit());
    let s = d.stats();
    assert_eq!(s.get("srxe0.live_work_rings"), 2 * QPS as u64 + 4);
    assert_eq!(s.get("ring_refusals"), 0);
    let chunks = s.get("ring_arena_chunks");
    let grew = mappings(&d).saturating_sub(before);
    eprintln!(
        "{} rings: {chunks} arena chunks, the daemon's mappings grew by {grew}",
        2 * QPS + 4
    );
    assert!(chunks <= 16, "{chunks} chunks");
    assert!(grew <= 64, "the daemon's mappings grew by {grew}");
    assert!(a.client.arena_chunks() <= 16);

    let by_request = s.get("posts_by_request");
    let ring_wqes = s.get("srxe0.ring_wqes");
    for i in 0..4u64 {
        assert!(matches!(
            rq_b.post(&recv(&b, i, 64 * i)).unwrap(),
            Posted::Queued { .. }
        ));
        let p = sq.post(&send(&a, i, &format!("ring {i}"))).unwrap();
        assert!(matches!(p, Posted::Queued { .. }), "{p:?}");
    }
    let wb = b.wait(4);
    for (i, w) in wb.iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (i as u64, 0));
        assert_eq!(b.buf.read(64 * i, 6), format!("ring {i}").as_bytes());
    }
    let s = d.stats();
    assert_eq!(
        s.get("posts_by_request"),
        by_request,
        "no post went by request"
    );
    assert_eq!(s.get("srxe0.ring_wqes"), ring_wqes + 8);
}

/// Destroying QPs and making new ones with rings, round after round, reuses the arena's
/// space: after the first round no chunk is added.
#[test]
fn queues_made_and_destroyed_in_a_loop_do_not_grow_the_arena() {
    let d = Daemon::start();
    let (mut a, _b) = connected_pair(&d, 4096);
    let bell_a = bell(&mut a);
    let mut chunks_after_first = None;
    for round in 0..15 {
        let mut qps = Vec::new();
        for k in 0..100u32 {
            // Queues of different depths: blocks of several sizes.
            let depth = 1 << (k % 8);
            let qp = a
                .client
                .create_qp(&common::rc_init(a.pd, a.cq, depth, 2, 64))
                .unwrap()
                .handle;
            to_init(&mut a, qp);
            let sq = a
                .client
                .attach_work_ring(wq::SQ, qp, depth, bell_a.clone())
                .unwrap();
            let rq = a
                .client
                .attach_work_ring(wq::RQ, qp, depth, bell_a.clone())
                .unwrap();
            qps.push((qp, sq, rq));
        }
        for (qp, sq, rq) in qps {
            a.client.destroy_qp(qp).unwrap();
            drop((sq, rq));
        }
        let chunks = d.stat("ring_arena_chunks");
        match chunks_after_first {
            None => chunks_after_first = Some(chunks),
            Some(first) => assert_eq!(chunks, first, "round {round} grew the arena"),
        }
    }
    assert_eq!(d.stat("srxe0.live_work_rings"), 0);
}

/// A client that writes garbage over its whole arena chunk — every ring's header, indices
/// and entries — and sets every bit of its doorbell page breaks only its own rings: the
/// daemon reports them (their QPs go to the error state), never reads outside the chunk nor
/// dies, and another connection's rings carry data as before.
#[test]
fn garbage_over_a_whole_arena_chunk_breaks_only_its_clients_rings() {
    let mut d = Daemon::start();
    let (mut a, mut b) = connected_pair(&d, 4096);
    let (mut sq_b, _rq_b) = rings(&mut b);
    let bell_a = bell(&mut a);
    let mut qps = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..20 {
        let qp = spare_qp(&mut a);
        for queue in [wq::SQ, wq::RQ] {
            kept.push(
                a.client
                    .attach_work_ring(queue, qp, 8, bell_a.clone())
                    .unwrap(),
            );
        }
        qps.push(qp);
    }
    let extra = spare_qp(&mut a);
    let (place, _) = a.client.work_ring_at(wq::SQ, extra, 8).unwrap();
    // Every byte of the chunk up to past the last ring.
    garble(&a, place.chunk, place.offset as usize + place.len as usize);
    scribble_all(page_of(&bell_a));
    // Any request takes what waits in the rings first: this one meets the garbage.
    let _ = a.client.query_qp(a.qp).unwrap();
    assert!(d.alive());
    let s = d.stats();
    let broken = s.get("srxe0.ring_bad_indices") + s.get("srxe0.ring_bad_wqes");
    eprintln!("{broken} of 41 rings reported broken");
    assert!(broken >= 1);
    // b's rings, and a by request, work as before.
    a.client.post_wr(&recv(&a, 21, 0)).unwrap();
    sq_b.post(&send(&b, 22, "after garbage")).unwrap();
    let w = a.wait(1);
    assert_eq!((w[0].wr_id, w[0].status), (21, 0));
    assert_eq!(a.buf.read(0, 13), b"after garbage");
    assert!(d.alive());
}

/// Random bytes over the first `len` bytes of chunk `chunk` of `side`'s arena, as a
/// hostile client can write them.
#[allow(unsafe_code)]
fn garble(side: &Side, chunk: u32, len: usize) {
    use rustix::mm::{MapFlags, ProtFlags};
    let fd = side.client.arena_fd(chunk).unwrap();
    let mut x = 0x9e37_79b9u32;
    // SAFETY: a fresh shared mapping of the start of the chunk (which holds the rings that
    // end before `len`); unmapped below, and nothing else in this process uses it.
    unsafe {
        let p = rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
        .unwrap();
        for i in 0..len {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            std::ptr::write_volatile(p.cast::<u8>().add(i), x as u8);
        }
        rustix::mm::munmap(p, len).unwrap();
    }
}

/// The doorbell page a work doorbell rings.
fn page_of(bell: &WorkDoorbell) -> &DoorbellPage {
    bell.page()
}
