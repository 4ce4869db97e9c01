//! The connection manager through the public API, on both backends: a listener accepts, a
//! connector connects by address and port, data flows over the QPs the CM brought to RTS,
//! and rejections, disconnections and dropped consumers reach the peer.

#[macro_use]
mod common;

use std::net::SocketAddr;

use common::{all_access, open_pair_on, WAIT};
use softrdma::cm::{CmEvent, ConnParam, Ece, RejectReason};
use softrdma::{BackendKind, Buffer, Device, Error, QpState, QpType, DEFAULT_QKEY, GRH_LEN};

/// What one side needs: a device, a PD, a CQ, a buffer registered on it.
struct End {
    dev: Device,
    pd: softrdma::Pd,
    cq: softrdma::Cq,
    mr: softrdma::MemoryRegion<Buffer>,
}

fn end(dev: Device) -> End {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let mr = pd.register(Buffer::zeroed(256), all_access()).unwrap();
    End { dev, pd, cq, mr }
}

/// Taken by every test here: one counts the process's descriptors, which the others open
/// and close.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A port per test, so that tests running at once on one daemon do not share a listen.
fn peer(b: &End, port: u16) -> SocketAddr {
    SocketAddr::new(b.dev.local_addr().ip(), port)
}

on_both_backends! {
    fn a_listener_accepts_a_connector_and_a_send_crosses_the_connection(backend: BackendKind) {
        let _serial = serial();
        let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let (a, b) = (end(da), end(db));
        let port = 20_000 + if backend == BackendKind::Daemon { 1 } else { 0 };
        let listener = b.dev.connection_manager().unwrap().listen(port).unwrap();
        let a_qp = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
        let b_qp = b.pd.qp_builder(&b.cq, &b.cq).build().unwrap();
        b.mr.write(0, &[0; 8]).unwrap();
        b_qp.recv(7, &[b.mr.sge(0..8).unwrap()]).unwrap();

        let acm = a.dev.connection_manager().unwrap();
        let to = peer(&b, port);
        // ECE each way, as it crosses in the REQ and the REP
        let asked = Ece { vendor_id: 0x00_02c9, options: 5 };
        let granted = Ece { vendor_id: 0x00_02c9, options: 4 };
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                let req = listener.next_request(WAIT).unwrap();
                assert_eq!(req.peer().ip(), a.dev.local_addr().ip());
                assert_eq!(&req.private_data()[..5], b"hello");
                assert_eq!(req.details().remote_qpn, a_qp.qpn());
                assert_eq!(req.details().ece, asked);
                let mut welcome = ConnParam::with_private_data(b"welcome");
                welcome.ece = granted;
                req.accept(&b_qp, &welcome, WAIT).unwrap()
            });
            let mut hello = ConnParam::with_private_data(b"hello");
            hello.ece = asked;
            let conn = acm.connect(&a_qp, to, &hello, WAIT).unwrap();
            assert_eq!(&conn.private_data()[..7], b"welcome");
            assert_eq!(conn.remote_ece(), granted);
            assert_eq!(a_qp.query().unwrap().qp_state, QpState::Rts);
            let b_conn = server.join().unwrap();
            assert_eq!(b_qp.query().unwrap().qp_state, QpState::Rts);

            a.mr.write(0, b"over cm!").unwrap();
            a_qp.send(1, &[a.mr.sge(0..8).unwrap()]).unwrap();
            assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, 1);
            let wc = b.cq.wait_ok(WAIT).unwrap();
            assert_eq!((wc.wr_id, wc.byte_len), (7, 8));
            let mut got = [0u8; 8];
            b.mr.read(0, &mut got).unwrap();
            assert_eq!(&got, b"over cm!");

            // Either side closes; both see it, both QPs are in ERR.
            conn.disconnect().unwrap();
            conn.wait_disconnected(WAIT).unwrap();
            b_conn.wait_disconnected(WAIT).unwrap();
            assert_eq!(a_qp.query().unwrap().qp_state, QpState::Err);
            assert_eq!(b_qp.query().unwrap().qp_state, QpState::Err);
        });
    }

    fn a_rejected_request_fails_the_connect_with_the_reason(backend: BackendKind) {
        let _serial = serial();
        let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let (a, b) = (end(da), end(db));
        let port = 20_010 + if backend == BackendKind::Daemon { 1 } else { 0 };
        let listener = b.dev.connection_manager().unwrap().listen(port).unwrap();
        let a_qp = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
        let acm = a.dev.connection_manager().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| listener.next_request(WAIT).unwrap().reject(b"no").unwrap());
            let e = acm
                .connect(&a_qp, peer(&b, port), &ConnParam::default(), WAIT)
                .unwrap_err();
            assert!(
                matches!(e, Error::CmRejected { reason } if reason == RejectReason::CONSUMER_DEFINED),
                "{e:?}"
            );
            assert_eq!(e.errno(), 111, "ECONNREFUSED");
        });
        assert_eq!(a_qp.query().unwrap().qp_state, QpState::Err);
        // Refusing the ECE asked for says so: reason 35, vendor option not supported.
        let a_qp = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
        std::thread::scope(|s| {
            s.spawn(|| listener.next_request(WAIT).unwrap().reject_ece(b"").unwrap());
            let mut param = ConnParam::default();
            param.ece = Ece { vendor_id: 0x00_02c9, options: 1 };
            let e = acm.connect(&a_qp, peer(&b, port), &param, WAIT).unwrap_err();
            assert!(
                matches!(e, Error::CmRejected { reason } if reason == RejectReason::VENDOR_OPTION_NOT_SUPPORTED),
                "{e:?}"
            );
        });
        // Where nothing listens, the peer's CM itself rejects (invalid service ID).
        drop(listener);
        let a_qp = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
        let e = acm
            .connect(&a_qp, peer(&b, port), &ConnParam::default(), WAIT)
            .unwrap_err();
        assert!(matches!(e, Error::CmRejected { reason } if reason.0 == 8), "{e:?}");
    }

    fn a_second_listener_on_a_port_is_address_in_use(backend: BackendKind) {
        let _serial = serial();
        let dev = common::open_on(backend, "127.0.0.1");
        let port = 20_020 + if backend == BackendKind::Daemon { 1 } else { 0 };
        let first = dev.connection_manager().unwrap().listen(port).unwrap();
        let e = dev.connection_manager().unwrap().listen(port).unwrap_err();
        assert_eq!(e.errno(), 98, "EADDRINUSE: {e}");
        drop(first);
        dev.connection_manager().unwrap().listen(port).unwrap();
    }

    fn a_consumer_that_goes_away_tears_its_connections_down_at_the_peer(backend: BackendKind) {
        let _serial = serial();
        let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let (a, b) = (end(da), end(db));
        let port = 20_030 + if backend == BackendKind::Daemon { 1 } else { 0 };
        let bcm = b.dev.connection_manager().unwrap();
        let listener = bcm.listen(port).unwrap();
        let a_qp = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
        let b_qp = b.pd.qp_builder(&b.cq, &b.cq).build().unwrap();
        let acm = a.dev.connection_manager().unwrap();
        let b_conn = std::thread::scope(|s| {
            let server =
                s.spawn(|| listener.next_request(WAIT).unwrap().accept(&b_qp, &ConnParam::default(), WAIT));
            let conn = acm.connect(&a_qp, peer(&b, port), &ConnParam::default(), WAIT).unwrap();
            let b_conn = server.join().unwrap().unwrap();
            // a's consumer is gone: its connection and its channel are dropped.
            drop(conn);
            drop(acm);
            b_conn
        });
        b_conn.wait_disconnected(WAIT).unwrap();
        assert_eq!(b_qp.query().unwrap().qp_state, QpState::Err);
        assert_eq!(a_qp.query().unwrap().qp_state, QpState::Err);
        // Nothing else is waiting on b's channel.
        assert!(!matches!(bcm.poll_event().unwrap(), Some(CmEvent::ConnectRequest(_))));
    }

    fn a_ud_service_resolves_to_the_listeners_qp_and_a_datagram_reaches_it(backend: BackendKind) {
        let _serial = serial();
        let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let (a, b) = (end(da), end(db));
        let port = 20_050 + if backend == BackendKind::Daemon { 1 } else { 0 };
        let bcm = b.dev.connection_manager().unwrap();
        let listener = bcm.listen_datagram(port).unwrap();
        let ud = |e: &End, qkey| {
            e.pd.qp_builder(&e.cq, &e.cq).qp_type(QpType::Ud).qkey(qkey).build().unwrap()
        };
        let a_qp = ud(&a, DEFAULT_QKEY);
        let b_qp = ud(&b, 0x0123_4567);
        b_qp.recv(9, &[b.mr.sge(0..GRH_LEN + 16).unwrap()]).unwrap();
        let acm = a.dev.connection_manager().unwrap();
        let service = std::thread::scope(|s| {
            s.spawn(|| {
                let req = listener.next_request(WAIT).unwrap();
                assert!(req.is_datagram());
                assert_eq!(req.peer().ip(), a.dev.local_addr().ip());
                assert_eq!(&req.private_data()[..3], b"who");
                req.accept_datagram(&b_qp, &ConnParam::with_private_data(b"me")).unwrap();
            });
            acm.resolve(peer(&b, port), &ConnParam::with_private_data(b"who"), WAIT).unwrap()
        });
        assert_eq!((service.qpn, service.qkey), (b_qp.qpn(), 0x0123_4567));
        assert_eq!(&service.private_data[..2], b"me");

        // The answer is enough to address the listener's QP.
        let ah = a.pd.create_ah(b.dev.gid(0).unwrap()).unwrap();
        a.mr.write(0, b"datagram").unwrap();
        a_qp.send_ud(1, &[a.mr.sge(0..8).unwrap()], &ah, service.qpn, service.qkey).unwrap();
        assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, 1);
        let wc = b.cq.wait_ok(WAIT).unwrap();
        assert_eq!((wc.wr_id, wc.src_qp), (9, a_qp.qpn()));
        let mut got = [0u8; 8];
        b.mr.read(GRH_LEN, &mut got).unwrap();
        assert_eq!(&got, b"datagram");

        // Refused, and nothing listening: the asker hears the status.
        std::thread::scope(|s| {
            s.spawn(|| listener.next_request(WAIT).unwrap().reject(b"").unwrap());
            let e = acm.resolve(peer(&b, port), &ConnParam::default(), WAIT).unwrap_err();
            assert!(matches!(e, Error::CmUnresolved { status: 2 }), "{e:?}");
        });
        drop(listener);
        let e = acm.resolve(peer(&b, port), &ConnParam::default(), WAIT).unwrap_err();
        assert!(matches!(e, Error::CmUnresolved { status: 1 }), "{e:?}");
        // No id is left behind on either side.
        assert_eq!(counter(&a.dev, "cm_connections"), 0);
        assert_eq!(counter(&b.dev, "cm_connections"), 0);
    }
}

#[cfg(feature = "tokio")]
on_both_backends! {
    fn connect_and_accept_wait_on_tokio(backend: BackendKind) {
        let _serial = serial();
        let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let (a, b) = (end(da), end(db));
        let port = 20_040 + if backend == BackendKind::Daemon { 1 } else { 0 };
        let listener = b.dev.connection_manager().unwrap().listen(port).unwrap();
        let a_qp = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
        let b_qp = b.pd.qp_builder(&b.cq, &b.cq).build().unwrap();
        let acm = a.dev.connection_manager().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let server = async {
                let req = listener.next_request_async().await.unwrap();
                req.accept_async(&b_qp, &ConnParam::default()).await.unwrap()
            };
            let param = ConnParam::default();
            let client = acm.connect_async(&a_qp, peer(&b, port), &param);
            let (b_conn, a_conn) = tokio::join!(server, client);
            let a_conn = a_conn.unwrap();
            assert_eq!(a_conn.peer(), b.dev.local_addr().ip());
            assert_eq!(b_conn.peer(), a.dev.local_addr().ip());
            assert_eq!(a_qp.query().unwrap().qp_state, QpState::Rts);
            assert_eq!(b_qp.query().unwrap().qp_state, QpState::Rts);
        });
    }
}

/// A device counter by name (`cm_connections`...).
fn counter(dev: &Device, name: &str) -> u64 {
    let all = dev.counter_values().unwrap();
    all.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no counter {name} in {all:?}"))
        .1
}

/// Descriptors this process has open.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

on_both_backends! {
    fn a_thousand_connections_set_up_and_torn_down_leak_no_connection_qp_or_descriptor(
        backend: BackendKind
    ) {
        let _serial = serial();
        const N: usize = 1000;
        let (da, db) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let (a, b) = (end(da), end(db));
        let port = 20_050 + if backend == BackendKind::Daemon { 1 } else { 0 };
        let (acm, bcm) = (
            a.dev.connection_manager().unwrap(),
            b.dev.connection_manager().unwrap(),
        );
        let listener = bcm.listen(port).unwrap();
        let live_qps = || common::test_daemon().daemon.stats.snapshot();
        let rounds = |n: usize| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    for _ in 0..n {
                        let qp = b.pd.qp_builder(&b.cq, &b.cq).build().unwrap();
                        let req = listener.next_request(WAIT).unwrap();
                        let conn = req.accept(&qp, &ConnParam::default(), WAIT).unwrap();
                        conn.wait_disconnected(WAIT).unwrap();
                    }
                });
                for i in 0..n {
                    let qp = a.pd.qp_builder(&a.cq, &a.cq).build().unwrap();
                    let conn = acm
                        .connect(&qp, peer(&b, port), &ConnParam::default(), WAIT)
                        .unwrap_or_else(|e| panic!("connection {i}: {e}"));
                    conn.disconnect().unwrap();
                    conn.wait_disconnected(WAIT).unwrap();
                }
            })
        };
        // A few first: what is made once (a thread's descriptors, the in-process test
        // daemon that `live_qps` starts when this test runs alone) is not a leak.
        rounds(10);
        live_qps();
        let before = (
            counter(&a.dev, "cm_connections"),
            counter(&b.dev, "cm_connections"),
            open_fds(),
            live_qps(),
        );
        rounds(N);
        let after = (
            counter(&a.dev, "cm_connections"),
            counter(&b.dev, "cm_connections"),
            open_fds(),
            live_qps(),
        );
        eprintln!(
            "{N} connections: cm_connections a {} -> {}, b {} -> {}; open fds {} -> {}",
            before.0, after.0, before.1, after.1, before.2, after.2
        );
        assert_eq!((after.0, after.1), (before.0, before.1), "connections held");
        // Not more (an earlier test's descriptors may still be closing, so fewer is fine).
        assert!(after.2 <= before.2, "open descriptors {} -> {}", before.2, after.2);
        if backend == BackendKind::Daemon {
            // The tests here run one at a time: the daemon's objects are this test's.
            let get = |v: &Vec<(String, u64)>, n: &str| {
                v.iter().find(|(k, _)| k == n).map(|(_, x)| *x)
            };
            for gauge in ["live_qps", "live_cqs", "live_pds", "live_mrs"] {
                eprintln!(
                    "daemon {gauge} {:?} -> {:?}",
                    get(&before.3, gauge),
                    get(&after.3, gauge)
                );
                assert_eq!(get(&before.3, gauge), get(&after.3, gauge), "{gauge}");
            }
        }
        // More than N MADs each way went through both CMs.
        assert!(counter(&b.dev, "cm_received") >= 3 * N as u64);
    }
}

/// Set in the child of the killed-process test: the listener's address.
const CM_CHILD_ENV: &str = "SOFTRDMA_TEST_CM_CHILD";

/// The killed process's side: connect through the daemon, say so, wait to be killed.
#[test]
fn cm_child_connects_and_waits_to_be_killed() {
    let Ok(to) = std::env::var(CM_CHILD_ENV) else {
        return; // run only as the child of the test below
    };
    let to: SocketAddr = to.parse().unwrap();
    let dev = Device::builder("127.0.0.2".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(std::env::var(softrdma::SOCKET_ENV).unwrap())
        .spawn_daemon(false)
        .open()
        .unwrap();
    let e = end(dev);
    let qp = e.pd.qp_builder(&e.cq, &e.cq).build().unwrap();
    let cm = e.dev.connection_manager().unwrap();
    let _conn = cm.connect(&qp, to, &ConnParam::default(), WAIT).unwrap();
    println!("CONNECTED");
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn a_process_killed_with_a_connection_open_is_disconnected_at_its_peer() {
    use std::io::BufRead;
    if std::env::var_os(CM_CHILD_ENV).is_some() {
        return;
    }
    let _serial = serial();
    let daemon = common::test_daemon();
    let b = end(common::open_on(BackendKind::Daemon, "127.0.0.1"));
    let port = 20_060;
    let listener = b.dev.connection_manager().unwrap().listen(port).unwrap();
    let reclaimed = || {
        daemon
            .daemon
            .stats
            .snapshot()
            .into_iter()
            .find(|(n, _)| n == "reclaimed_cm_ids")
            .unwrap()
            .1
    };
    let reclaimed_before = reclaimed();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "cm_child_connects_and_waits_to_be_killed",
            "--exact",
            "--nocapture",
        ])
        .env(CM_CHILD_ENV, peer(&b, port).to_string())
        .env(softrdma::SOCKET_ENV, &daemon.socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let qp = b.pd.qp_builder(&b.cq, &b.cq).build().unwrap();
    let conn = listener
        .next_request(WAIT)
        .unwrap()
        .accept(&qp, &ConnParam::default(), WAIT)
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("CONNECTED") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the child ended first"
        );
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // The daemon tears the dead client's connection down; its peer (here) is told.
    conn.wait_disconnected(WAIT).unwrap();
    assert_eq!(qp.query().unwrap().qp_state, QpState::Err);
    // Counted right after the DREQ left (the peer may see it first).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while reclaimed() == reclaimed_before && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(reclaimed() - reclaimed_before, 1);
}
