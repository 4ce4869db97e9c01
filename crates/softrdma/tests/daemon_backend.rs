//! What is particular to the daemon backend: starting a missing `softrdmad`, two client
//! processes through one daemon, selection by environment, and the clear refusals.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;

use common::{all_access, open_on, WAIT};
use softrdma::{
    AccessFlags, AsyncEvent, BackendKind, Buffer, Device, Error, MwType, VerbsError, WcOpcode,
    WcStatus,
};

/// Set in the child process of the two-process test: the parent's TCP address.
const CHILD_ENV: &str = "SOFTRDMA_TEST_CHILD_TCP";

#[test]
fn a_missing_daemon_is_a_clear_error_when_starting_one_is_off() {
    let socket = std::env::temp_dir().join(format!("softrdma-none-{}.sock", std::process::id()));
    let r = Device::builder("127.0.0.1".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(&socket)
        .spawn_daemon(false)
        .open();
    match r {
        Err(Error::NoDaemon { socket: s, .. }) => assert_eq!(s, socket),
        other => panic!("expected NoDaemon, got {other:?}"),
    }
}

#[test]
fn options_of_an_embedded_engine_are_refused_on_the_daemon() {
    let r = Device::builder("127.0.0.1".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(&common::test_daemon().socket)
        .rng_seed(7)
        .open();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    let r = Device::builder("127.0.0.1".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(&common::test_daemon().socket)
        .port(common::test_daemon().port.wrapping_add(1))
        .open();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
    // The daemon's own port is fine.
    let d = Device::builder("127.0.0.1".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(&common::test_daemon().socket)
        .port(common::test_daemon().port)
        .open()
        .unwrap();
    assert_eq!(d.local_addr().port(), common::test_daemon().port);
    assert!(d.try_runtime().is_none());
    assert!(d.daemon_info().is_some());
}

#[test]
fn an_address_the_daemon_does_not_serve_is_a_clear_error() {
    let r = Device::builder("127.0.0.9".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(&common::test_daemon().socket)
        .open();
    assert!(matches!(r, Err(Error::Config(_))), "{r:?}");
}

#[test]
fn the_daemon_engine_counters_follow_traffic_and_match_the_named_ones() {
    let (a, b) = common::pair_v4_on(BackendKind::Daemon, 64);
    // The daemon drives its devices itself: polling progress here does nothing.
    assert_eq!(a.dev.poll_progress(), 0);
    let before = b
        .dev
        .counters()
        .unwrap()
        .get(softrdma::Counter::RespAcksSent);
    b.qp.recv(1, &[b.mr.sge(..).unwrap()]).unwrap();
    a.qp.send(2, &[a.mr.sge(..8).unwrap()]).unwrap();
    a.cq.wait_ok(common::WAIT).unwrap();
    b.cq.wait_ok(common::WAIT).unwrap();
    let c = b.dev.counters().unwrap();
    // The device is the daemon's, shared with other clients: it counts at least ours.
    assert!(c.get(softrdma::Counter::RespAcksSent) > before, "{c:?}");
    let v = b.dev.counter_values().unwrap();
    let named = |name: &str| v.iter().find(|(n, _)| n == name).map(|&(_, x)| x);
    assert!(named("rx_packets").is_some(), "{v:?}");
    assert!(c.get(softrdma::Counter::RxPackets) <= named("rx_packets").unwrap());
}

/// `Cq::req_notify` through the daemon is a doorbell, as on a NIC: the daemon counts the
/// arm taken from the CQ's ring, the descriptor turns readable at the next completion, and
/// not before it.
#[test]
fn a_cq_is_armed_through_the_daemon_with_no_request() {
    let (a, b) = common::pair_v4_on(BackendKind::Daemon, 64);
    let arms = |d: &Device| {
        let v = d.counter_values().unwrap();
        v.iter()
            .find(|(n, _)| n == "ring_arms")
            .map(|&(_, x)| x)
            .unwrap()
    };
    let before = arms(&b.dev);
    b.cq.req_notify().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!b.cq.clear_notification(), "armed, nothing completed");
    assert!(arms(&b.dev) > before, "the arm came through the ring");
    b.qp.recv(1, &[b.mr.sge(..).unwrap()]).unwrap();
    a.qp.send(2, &[a.mr.sge(..8).unwrap()]).unwrap();
    let t = std::time::Instant::now();
    while !b.cq.clear_notification() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "no notification"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(b.cq.wait_ok(common::WAIT).unwrap().wr_id, 1);
    a.cq.wait_ok(common::WAIT).unwrap();
}

on_both_backends! {
    fn a_queried_qp_reports_what_it_was_built_and_connected_with(backend: BackendKind) {
        let (a, b) = common::pair_v4_on(backend, 64);
        let q = a.qp.query().unwrap();
        assert_eq!(q.qp_state, softrdma::QpState::Rts);
        assert_eq!(q.dest_qp_num, b.qp.qpn());
        assert_eq!(q.rq_psn, b.qp.initial_psn());
        assert!(q.cap.max_send_wr >= 128 && q.cap.max_recv_sge >= 4, "{:?}", q.cap);
        assert_eq!(q.ah_attr.dgid, b.dev.gid(0).unwrap().0);
        assert_eq!((q.retry_cnt, q.rnr_retry, q.timeout), (7, 7, 14));
    }

    fn objects_of_another_device_are_refused_before_they_are_named(backend: BackendKind) {
        // Two devices (on the daemon: two connections, whose handle numbers overlap).
        let (d1, d2) = common::open_pair_on(backend, "127.0.0.1", "127.0.0.2");
        let pd = d1.alloc_pd().unwrap();
        let cq1 = d1.create_cq(4).unwrap();
        let cq2 = d2.create_cq(4).unwrap();
        let r = pd.qp_builder(&cq1, &cq2).build();
        assert!(matches!(r, Err(Error::Verbs(VerbsError::InvalidCq))), "{r:?}");
        let srq2 = d2.alloc_pd().unwrap().create_srq(4, 1).unwrap();
        let r = pd.qp_builder(&cq1, &cq1).srq(&srq2).build();
        assert!(matches!(r, Err(Error::Verbs(VerbsError::InvalidSrq))), "{r:?}");
        let ud = pd
            .qp_builder(&cq1, &cq1)
            .qp_type(softrdma::QpType::Ud)
            .build()
            .unwrap();
        let pd2 = d2.alloc_pd().unwrap();
        let ah2 = pd2.create_ah(d1.gid(0).unwrap()).unwrap();
        let r = ud.send_ud(1, &[], &ah2, ud.qpn(), softrdma::DEFAULT_QKEY);
        assert!(matches!(r, Err(Error::Verbs(VerbsError::InvalidAh))), "{r:?}");
    }

    fn a_peer_reaches_memory_through_windows_until_they_are_invalidated_or_unbound(
        backend: BackendKind
    ) {
        let (a, b) = common::pair_v4_on(backend, 4096);
        let mr = b
            .pd
            .register(Buffer::zeroed(4096), AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
            .unwrap();
        let rw = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        // Type 2: a bind WR, a WRITE through it, then LOCAL_INV closes it.
        let t2 = b.pd.alloc_mw(MwType::Type2).unwrap();
        let remote = b.qp.post_bind_mw(1, &t2, &mr, 100..200, rw).unwrap();
        assert_eq!(b.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::BindMw);
        assert!(t2.is_bound().unwrap());
        assert_eq!(t2.rkey().unwrap(), remote.rkey);
        a.mr.write(0, b"through a window").unwrap();
        a.qp.write(2, &[a.mr.sge(..16).unwrap()], &remote).unwrap();
        a.cq.wait_ok(WAIT).unwrap();
        assert_eq!(&mr.to_vec()[100..116], b"through a window");
        b.qp.local_inv(3, remote.rkey).unwrap();
        assert_eq!(b.cq.wait_ok(WAIT).unwrap().opcode, WcOpcode::LocalInv);
        a.qp.write(4, &[a.mr.sge(..16).unwrap()], &remote).unwrap();
        match a.cq.wait_ok(WAIT) {
            Err(Error::Completion { status, .. }) => assert_eq!(status, WcStatus::RemAccessErr),
            other => panic!("expected a remote access error, got {other:?}"),
        }
        // Type 1 (on a fresh pair: the failed WRITE moved a's QP to ERR): the bind verb,
        // a READ through it, then an unbind.
        let (a, b) = common::pair_v4_on(backend, 4096);
        let mr = b
            .pd
            .register(Buffer::from_slice(&[7; 4096]), AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)
            .unwrap();
        let t1 = b.pd.alloc_mw(MwType::Type1).unwrap();
        assert!(matches!(
            b.qp.post_bind_mw(5, &t1, &mr, 0..64, rw),
            Err(Error::Verbs(VerbsError::InvalidMw))
        ));
        let remote = b.qp.bind_mw(6, &t1, &mr, 0..64, rw).unwrap();
        b.cq.wait_ok(WAIT).unwrap();
        a.qp.read(7, &[a.mr.sge(..64).unwrap()], &remote).unwrap();
        a.cq.wait_ok(WAIT).unwrap();
        assert_eq!(a.mr.to_vec()[..64], [7; 64]);
        b.qp.unbind_mw(8, &t1).unwrap();
        b.cq.wait_ok(WAIT).unwrap();
        assert!(!t1.is_bound().unwrap());
    }

    fn device_attributes_agree_with_the_port(backend: BackendKind) {
        let d = open_on(backend, "127.0.0.2");
        let attr = d.query_device();
        assert!(attr.max_qp > 0 && attr.max_cqe > 0);
        let port = d.query_port().unwrap();
        assert_eq!(port.active_mtu.bytes(), 4096);
        assert_eq!(
            d.gid(0).unwrap().to_ip(),
            "127.0.0.2".parse::<std::net::IpAddr>().unwrap()
        );
        assert_eq!(d.gids().len() as u32, port.gid_tbl_len);
        assert!(d.gid(port.gid_tbl_len).is_err());
    }

    fn registered_memory_written_by_the_device_reads_back_through_every_accessor(
        backend: BackendKind
    ) {
        let (a, mut b) = common::pair_v4_on(backend, 4096);
        a.mr.write(0, &[0xab; 64]).unwrap();
        a.qp.write(1, &[a.mr.sge(..64).unwrap()], &b.mr.remote(100..).unwrap())
            .unwrap();
        a.cq.wait_ok(WAIT).unwrap();
        assert!(b.mr.with(|s| s[100..164].iter().all(|&x| x == 0xab)));
        assert_eq!(b.mr.to_vec()[99], 0);
        // with_mut changes only what the closure changed.
        b.mr.with_mut(|s| s[0] = 1);
        let all = b.mr.to_vec();
        assert_eq!((all[0], all[100], all[164]), (1, 0xab, 0));
    }
}

/// The `softrdmad` binary cargo built for this workspace (`target/<profile>/softrdmad`).
fn built_daemon() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let profile_dir = exe.parent()?.parent()?;
    let p = profile_dir.join("softrdmad");
    p.is_file().then_some(p)
}

#[test]
fn a_client_starts_the_daemon_it_misses_and_a_second_process_uses_the_same_one() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return; // the child runs only `child_process_side`
    }
    let Some(bin) = built_daemon() else {
        eprintln!(
            "SKIPPED: no softrdmad next to the test binaries; run \
             `cargo test -p softrdma -p softrdma-daemon` (which builds it)"
        );
        return;
    };
    let pid = std::process::id();
    let port = 20000 + ((pid.wrapping_mul(13) + 5000) % 12000) as u16;
    let dir = std::env::temp_dir().join(format!("softrdma-spawn-{pid}"));
    let socket = dir.join("softrdmad.sock");
    let dev = Device::builder("127.0.0.1".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(&socket)
        .spawn_daemon(true)
        .daemon_binary(&bin)
        .daemon_args(["--addr", "127.0.0.1", "--port", &port.to_string()])
        .open()
        .expect("start softrdmad and open its device");
    let (name, daemon_pid) = dev.daemon_info().unwrap();
    assert_eq!(name, "srxe0");
    assert_ne!(daemon_pid, pid, "the daemon is a process of its own");

    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parent_side(&dev, &socket)));
    // This test started the daemon: stop it again (by its pid) whatever happened.
    let _ = Command::new("kill").arg(daemon_pid.to_string()).status();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

fn parent_side(dev: &Device, socket: &std::path::Path) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let exe = std::env::current_exe().unwrap();
    // The child finds the daemon through the environment only.
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "child_process_side",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, listener.local_addr().unwrap().to_string())
        .env(softrdma::BACKEND_ENV, "daemon")
        .env(softrdma::SOCKET_ENV, socket)
        .env(softrdma::SPAWN_ENV, "0")
        .env(softrdma::DEVICE_ENV, "127.0.0.1")
        .spawn()
        .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build().unwrap();
    let mr = pd.register(Buffer::zeroed(8192), all_access()).unwrap();
    qp.recv(1, &[mr.sge(4096..).unwrap()]).unwrap();
    let (mut stream, _) = listener.accept().unwrap();
    let peer = qp
        .handshake(&mut stream, Some(mr.remote(..4096).unwrap()))
        .unwrap();
    // The child WRITEs into our first page, then SENDs into the second.
    let wc = cq.wait_ok(WAIT).unwrap();
    assert_eq!((wc.wr_id, wc.opcode, wc.byte_len), (1, WcOpcode::Recv, 20));
    let all = mr.to_vec();
    assert_eq!(&all[4096..4116], b"sent by the child...");
    assert!(all[..3000]
        .iter()
        .enumerate()
        .all(|(i, &x)| x == (i % 251) as u8));
    // READ the child's region and do an atomic on it.
    let remote = peer.mr.expect("the child offered its region");
    qp.read(
        2,
        &[mr.sge(5000..5100).unwrap()],
        &remote.offset(0).unwrap(),
    )
    .unwrap();
    cq.wait_ok(WAIT).unwrap();
    assert_eq!(&mr.to_vec()[5000..5100], &[0x5c; 100][..]);
    qp.fetch_add(
        3,
        mr.sge(6000..6008).unwrap(),
        &remote.offset(200).unwrap(),
        5,
    )
    .unwrap();
    cq.wait_ok(WAIT).unwrap();
    assert_eq!(mr.read_u64(6000).unwrap(), u64::from_ne_bytes([0x5c; 8]));
    // Let the child check its word and go.
    stream.write_all(b"B").unwrap();
    let mut verdict = [0u8; 1];
    stream.read_exact(&mut verdict).unwrap();
    assert_eq!(&verdict, b"K", "the child saw the fetch-and-add");
    assert!(child.wait().unwrap().success(), "the child process failed");
}

/// The second process (started by the test above; does nothing in a normal run).
#[test]
fn child_process_side() {
    let Ok(tcp) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dev = Device::open_default().unwrap();
    assert_eq!(dev.backend(), BackendKind::Daemon);
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build().unwrap();
    let mr = pd
        .register(Buffer::from_slice(&[0x5c; 4096]), all_access())
        .unwrap();
    let mut stream = TcpStream::connect(tcp).unwrap();
    let peer = qp
        .handshake(&mut stream, Some(mr.remote(..).unwrap()))
        .unwrap();
    let remote = peer.mr.expect("the parent offered its region");
    let src = pd.register(Buffer::zeroed(4096), all_access()).unwrap();
    let data: Vec<u8> = (0..3000usize).map(|i| (i % 251) as u8).collect();
    src.write(0, &data).unwrap();
    qp.write(1, &[src.sge(..3000).unwrap()], &remote).unwrap();
    cq.wait_ok(WAIT).unwrap();
    src.write(0, b"sent by the child...").unwrap();
    qp.send(2, &[src.sge(..20).unwrap()]).unwrap();
    cq.wait_ok(WAIT).unwrap();
    let mut b = [0u8; 1];
    stream.read_exact(&mut b).unwrap();
    let word = mr.read_u64(200).unwrap();
    let ok = word == u64::from_ne_bytes([0x5c; 8]).wrapping_add(5);
    stream.write_all(if ok { b"K" } else { b"X" }).unwrap();
    assert!(ok, "word {word:#x}");
}

#[test]
fn the_examples_run_unchanged_on_a_daemon_chosen_by_the_environment() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let Some(bin) = built_daemon() else {
        eprintln!("SKIPPED: no softrdmad next to the test binaries");
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let examples = exe.parent().unwrap().parent().unwrap().join("examples");
    let pid = std::process::id();
    let port = 20000 + ((pid.wrapping_mul(17) + 9000) % 12000) as u16;
    let dir = std::env::temp_dir().join(format!("softrdma-examples-{pid}"));
    let socket = dir.join("softrdmad.sock");
    let mut ran = 0;
    let mut failures = Vec::new();
    for ex in [
        "rc_send_recv",
        "rdma_write",
        "rdma_read",
        "atomics",
        "srq",
        "ud_send_recv",
        "mw",
        "cm_send_recv",
    ] {
        let path = examples.join(ex);
        if !path.is_file() {
            eprintln!("SKIPPED example {ex}: not built");
            continue;
        }
        // The first one starts the daemon; the others find it.
        let out = Command::new(&path)
            .env(softrdma::BACKEND_ENV, "daemon")
            .env(softrdma::SOCKET_ENV, &socket)
            .env(softrdma::DAEMON_BIN_ENV, &bin)
            .env(
                softrdma::DAEMON_ARGS_ENV,
                format!("--addr 127.0.0.1 --addr 127.0.0.2 --port {port}"),
            )
            .output()
            .unwrap();
        ran += 1;
        if !out.status.success() {
            failures.push(format!(
                "{ex}: {}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    // Stop the daemon the first example started: ask it for its pid, then signal that pid.
    if let Ok(d) = Device::builder("127.0.0.1".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(&socket)
        .spawn_daemon(false)
        .open()
    {
        if let Some((_, daemon_pid)) = d.daemon_info() {
            let _ = Command::new("kill").arg(daemon_pid.to_string()).status();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{ran} examples ran through softrdmad");
}

/// A device on a softrdmad of its own (started by the library from the built binary, on a
/// socket in a temp folder named after `tag`), so that a test may kill it; the folder to
/// remove afterwards. `None` (the test skips) without a built softrdmad, or in the child
/// process of the two-process test.
fn device_on_own_daemon(tag: &str) -> Option<(Device, PathBuf)> {
    if std::env::var_os(CHILD_ENV).is_some() {
        return None;
    }
    let Some(bin) = built_daemon() else {
        eprintln!("SKIPPED: no softrdmad next to the test binaries");
        return None;
    };
    let pid = std::process::id();
    // Tags hash to ports apart, so that the tests of this binary never share one.
    let salt = tag
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let port = 20000 + (pid.wrapping_mul(19).wrapping_add(salt) % 12000) as u16;
    let dir = std::env::temp_dir().join(format!("softrdma-{tag}-{pid}"));
    let dev = Device::builder("127.0.0.1".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(dir.join("softrdmad.sock"))
        .daemon_binary(&bin)
        .daemon_args(["--addr", "127.0.0.1", "--port", &port.to_string()])
        .open()
        .unwrap();
    Some((dev, dir))
}

/// SIGKILL softrdmad `pid` (a crash), as a test that started it may.
fn kill_daemon(pid: u32) {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
}

#[test]
fn when_the_daemon_dies_verbs_fail_cleanly_and_regions_still_release_their_memory() {
    let Some((dev, dir)) = device_on_own_daemon("dies") else {
        return;
    };
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build().unwrap();
    let mr = pd.register(Buffer::zeroed(4096), all_access()).unwrap();
    let (_, daemon_pid) = dev.daemon_info().unwrap();
    // Ended by its pid; then the test waits until it is gone.
    kill_daemon(daemon_pid);
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while Command::new("kill")
        .args(["-0", &daemon_pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
    {
        assert!(std::time::Instant::now() < gone, "softrdmad did not die");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Verbs are errors, not panics; local memory still works.
    assert!(matches!(qp.send(1, &[]), Err(Error::Daemon(_))));
    assert!(matches!(dev.alloc_pd(), Err(Error::Daemon(_))));
    // The CQ's ring is still mapped here and says nothing: the poll looks at the connection
    // and fails, rather than find an empty ring forever.
    let polled = cq.poll(4);
    assert!(
        matches!(&polled, Err(e @ Error::Daemon(_)) if e.errno() == 104),
        "{polled:?}"
    );
    // One DeviceFatal says the device is gone, as a NIC that failed says it; then nothing.
    assert_eq!(dev.async_event().unwrap(), Some(AsyncEvent::DeviceFatal));
    assert_eq!(dev.async_event().unwrap(), None);
    mr.write(0, b"still mine").unwrap();
    // Deregistration fails; the region then ends the connection and waits for the daemon's
    // side to close (at once: it is dead) before the buffer is freed.
    let buf = mr.into_inner();
    assert_eq!(&buf.as_slice()[..10], b"still mine");
    drop((qp, cq, pd, dev));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_wait_on_a_cq_ends_with_an_error_when_the_daemon_dies() {
    let Some((dev, dir)) = device_on_own_daemon("dies-waiting") else {
        return;
    };
    let cq = dev.create_cq(8).unwrap();
    let (_, daemon_pid) = dev.daemon_info().unwrap();
    // Killed while the main thread sleeps on the CQ.
    let killer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        kill_daemon(daemon_pid);
    });
    let waited = cq.wait(1, Some(std::time::Duration::from_secs(60)));
    killer.join().unwrap();
    assert!(
        matches!(&waited, Err(e @ Error::Daemon(_)) if e.errno() == 104),
        "the wait ended with {waited:?}, not with the daemon's connection reset"
    );
    drop((cq, dev));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn large_buffers_are_shared_with_the_daemon_and_move_intact_to_and_from_heap_memory() {
    use std::sync::atomic::Ordering;
    let stats = &common::test_daemon().daemon.stats;
    let mapped_before = stats.mapped_registrations.load(Ordering::Relaxed);
    // Two connections on one device: their QPs talk over the device's internal path.
    let (a, b) = common::pair_v6_on(BackendKind::Daemon, 1 << 20);
    assert!(Buffer::zeroed(Buffer::SHARED_MIN).is_shared());
    assert!(
        Buffer::zeroed(4096).is_shared(),
        "small buffers share slabs"
    );
    assert!(stats.mapped_registrations.load(Ordering::Relaxed) >= mapped_before + 2);
    // B also has plain heap memory, reached with process_vm_*.
    let heap = b.pd.register(vec![0u8; 1 << 20], all_access()).unwrap();
    let len = 300_000usize;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    a.mr.write(0, &data).unwrap();

    // Shared -> heap (WRITE), heap -> shared (READ), heap -> shared (WRITE by B).
    a.qp.write(
        1,
        &[a.mr.sge(..len).unwrap()],
        &heap.remote(1000..).unwrap(),
    )
    .unwrap();
    assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, 1);
    assert_eq!(&heap.to_vec()[1000..1000 + len], &data[..]);
    a.qp.read(
        2,
        &[a.mr.sge(400_000..400_000 + len).unwrap()],
        &heap.remote(1000..).unwrap(),
    )
    .unwrap();
    assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, 2);
    assert_eq!(&a.mr.to_vec()[400_000..400_000 + len], &data[..]);
    b.qp.write(
        3,
        &[heap.sge(1000..1000 + len).unwrap()],
        &a.mr.remote(700_000..).unwrap(),
    )
    .unwrap();
    assert_eq!(b.cq.wait_ok(WAIT).unwrap().wr_id, 3);
    assert_eq!(&a.mr.to_vec()[700_000..700_000 + len], &data[..]);
    // Nothing around the written ranges moved.
    assert_eq!(heap.to_vec()[999], 0);
    assert_eq!(a.mr.to_vec()[700_000 + len], 0);

    // Atomics on a word of shared memory, from B.
    a.mr.write_u64(8, 40).unwrap();
    b.qp.fetch_add(4, heap.sge(0..8).unwrap(), &a.mr.remote(8..16).unwrap(), 2)
        .unwrap();
    assert_eq!(b.cq.wait_ok(WAIT).unwrap().wr_id, 4);
    b.qp.compare_swap(
        5,
        heap.sge(8..16).unwrap(),
        &a.mr.remote(8..16).unwrap(),
        42,
        7,
    )
    .unwrap();
    assert_eq!(b.cq.wait_ok(WAIT).unwrap().wr_id, 5);
    assert_eq!(heap.read_u64(0).unwrap(), 40);
    assert_eq!(heap.read_u64(8).unwrap(), 42);
    assert_eq!(a.mr.read_u64(8).unwrap(), 7);
}

/// The path of the mapping that holds `addr` in this process's `/proc/self/maps` (empty for
/// anonymous memory).
fn mapping_path_at(addr: usize) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    for line in maps.lines() {
        let mut f = line.splitn(6, ' ');
        let (a, b) = f.next().unwrap().split_once('-').unwrap();
        let (a, b) = (
            usize::from_str_radix(a, 16).unwrap(),
            usize::from_str_radix(b, 16).unwrap(),
        );
        if (a..b).contains(&addr) {
            return f.nth(4).unwrap_or("").trim().to_string();
        }
    }
    panic!("{addr:#x} is not mapped");
}

#[test]
#[allow(unsafe_code)]
fn memory_a_program_allocated_itself_is_shared_with_the_daemon_while_registered() {
    const PAGE: usize = 4096;
    let (a, b) = common::pair_v4_on(BackendKind::Daemon, 1 << 16);
    let layout = std::alloc::Layout::from_size_align(3 * PAGE, PAGE).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!p.is_null());
    let at = |i: usize| p as usize + i;
    let mut expect: Vec<u8> = (0..3 * PAGE).map(|i| (i * 13 + 1) as u8).collect();
    // The middle page stays zero, as untouched memory is.
    expect[PAGE..2 * PAGE].fill(0);
    // SAFETY: within the allocation, which nothing else uses yet.
    unsafe { std::ptr::copy_nonoverlapping(expect.as_ptr(), p, 3 * PAGE) };
    let held = || {
        // SAFETY: within the live allocation; the test reads it only between operations.
        unsafe { std::slice::from_raw_parts(p, 3 * PAGE).to_vec() }
    };
    // Anonymous memory: the heap's, or a mapping of malloc's.
    let private = |i: usize| matches!(mapping_path_at(at(i)).as_str(), "" | "[heap]");
    assert!(private(0), "heap memory to begin with");

    // SAFETY: the allocation outlives both regions (freed at the end, after they went),
    // and the test touches it only between operations.
    let whole = unsafe { b.pd.register_raw(p, 3 * PAGE, all_access()) }.unwrap();
    assert!(
        mapping_path_at(at(PAGE)).starts_with("/memfd:softrdma-registered"),
        "registered whole pages are moved into shared memory: {}",
        mapping_path_at(at(PAGE))
    );
    assert_eq!(held(), expect, "the bytes stayed at their addresses");

    // The daemon writes them with memory copies: a WRITE across the page boundaries.
    let data: Vec<u8> = (0..PAGE + 200).map(|i| (i * 7 + 3) as u8).collect();
    a.mr.write(0, &data).unwrap();
    a.qp.write(
        1,
        &[a.mr.sge(..data.len()).unwrap()],
        &whole.remote(PAGE - 100..).unwrap(),
    )
    .unwrap();
    assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, 1);
    expect[PAGE - 100..2 * PAGE + 100].copy_from_slice(&data);
    assert_eq!(held(), expect);

    // A child made by fork gets its own copy: its writes do not reach the parent's region.
    // SAFETY: the child only stores one byte and exits (the fork handler copies the pages
    // in it first).
    match unsafe { libc::fork() } {
        0 => unsafe {
            p.add(PAGE).write(0xee);
            libc::_exit(i32::from(p.add(PAGE).read() != 0xee))
        },
        child => {
            assert!(child > 0, "fork");
            let mut status = 0;
            // SAFETY: waits for our own child.
            assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        }
    }
    assert_eq!(held()[PAGE], expect[PAGE], "the child wrote its own copy");
    assert!(mapping_path_at(at(PAGE)).starts_with("/memfd:softrdma-registered"));

    // A second region over part of it shares the same file; the first going keeps it.
    // SAFETY: as above.
    let part = unsafe { b.pd.register_raw(p.add(PAGE), PAGE, all_access()) }.unwrap();
    drop(whole);
    assert!(mapping_path_at(at(PAGE)).starts_with("/memfd:softrdma-registered"));
    a.qp.read(
        2,
        &[a.mr.sge(8192..8192 + PAGE).unwrap()],
        &part.remote(..).unwrap(),
    )
    .unwrap();
    assert_eq!(a.cq.wait_ok(WAIT).unwrap().wr_id, 2);
    assert_eq!(a.mr.to_vec()[8192..8192 + PAGE], expect[PAGE..2 * PAGE]);

    // The last region going gives private memory back, with every byte.
    drop(part);
    assert!(private(0) && private(PAGE) && private(2 * PAGE));
    assert_eq!(held(), expect);
    // SAFETY: allocated above with this layout; no region names it any more.
    unsafe { std::alloc::dealloc(p, layout) };
}

#[test]
#[allow(unsafe_code)]
fn pages_a_live_registration_reaches_are_not_adopted() {
    const PAGE: usize = 4096;
    let (_a, b) = common::pair_v4_on(BackendKind::Daemon, 4096);
    let layout = std::alloc::Layout::from_size_align(2 * PAGE, PAGE).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!p.is_null());
    let adopted = || mapping_path_at(p as usize).starts_with("/memfd:softrdma-registered");
    // SAFETY (all three): the allocation outlives the regions, and the test does not touch
    // it while they live.
    // Not whole pages: reached through the process file, and the pages stay private.
    let plain = unsafe { b.pd.register_raw(p.add(100), 1000, all_access()) }.unwrap();
    assert!(!adopted());
    // Whole pages that the first region reaches: the daemon may be writing them.
    let over = unsafe { b.pd.register_raw(p, 2 * PAGE, all_access()) }.unwrap();
    assert!(!adopted(), "adopting would copy pages a region reaches");
    drop((plain, over));
    let alone = unsafe { b.pd.register_raw(p, 2 * PAGE, all_access()) }.unwrap();
    assert!(adopted(), "nothing reaches them now");
    // A region inside adopted pages uses the same file; the pages come back when the last
    // region that touches them goes.
    let inside = unsafe { b.pd.register_raw(p.add(100), 1000, all_access()) }.unwrap();
    drop(alone);
    assert!(adopted());
    drop(inside);
    assert!(!adopted());
    // SAFETY: allocated above with this layout; no region names it any more.
    unsafe { std::alloc::dealloc(p, layout) };
}

/// A signal handler that writes a registered buffer, run on the very thread that registers
/// it: adopting the pages (and giving them back) holds writers of the range off until that
/// thread has finished the copy, so a handler run there meanwhile would wait for good. The
/// thread's signals wait instead, and every write the handler makes is kept. Another thread
/// sends SIGUSR1 to the registering one every 50 us through 20 registrations of 4 MiB.
#[test]
#[allow(unsafe_code)]
fn signal_handlers_on_the_registering_thread_neither_deadlock_nor_lose_writes() {
    use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
    use std::sync::Arc;
    const LEN: usize = 4 << 20;
    static TARGET: AtomicPtr<u64> = AtomicPtr::new(std::ptr::null_mut());
    static HANDLED: AtomicU64 = AtomicU64::new(0);
    extern "C" fn on_usr1(_: libc::c_int) {
        let p = TARGET.load(Ordering::Relaxed);
        if !p.is_null() {
            // SAFETY: the test's buffer, alive while TARGET names it; only handlers on the
            // registering thread write it.
            unsafe { p.write_volatile(p.read_volatile() + 1) };
            HANDLED.fetch_add(1, Ordering::Relaxed);
        }
    }
    let (_a, b) = common::pair_v4_on(BackendKind::Daemon, 4096);
    let layout = std::alloc::Layout::from_size_align(LEN, 4096).unwrap();
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!p.is_null());
    // Bytes in every page, so that each copy takes a while: the signals arrive during it.
    // SAFETY: within the allocation, which nothing else uses yet.
    unsafe { std::ptr::write_bytes(p.add(8), 1, LEN - 8) };
    TARGET.store(p.cast(), Ordering::Relaxed);
    // SAFETY: a handler that only touches atomics and the test's buffer; SA_RESTART so that
    // the test's own system calls go on.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as usize;
        act.sa_flags = libc::SA_RESTART;
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &act, std::ptr::null_mut()),
            0
        );
    }
    // SAFETY: no preconditions.
    let me = unsafe { libc::pthread_self() };
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: the test thread, alive until it has stopped this one.
                unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        })
    };
    let finished = Arc::new(AtomicBool::new(false));
    {
        let finished = finished.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(60));
            if !finished.load(Ordering::Relaxed) {
                // Straight to stderr: the harness's capture of this test dies with it.
                let msg = b"FAIL: registration deadlocked under a signal handler that writes \
                            the range\n";
                // SAFETY: writes the message's bytes to descriptor 2.
                unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
                std::process::abort();
            }
        });
    }
    let mut adopted = 0;
    for _ in 0..20 {
        // SAFETY: the allocation outlives the region; only the handler writes it meanwhile.
        let mr = unsafe { b.pd.register_raw(p, LEN, all_access()) }.unwrap();
        if mapping_path_at(p as usize).starts_with("/memfd:softrdma-registered") {
            adopted += 1;
        }
        drop(mr);
    }
    stop.store(true, Ordering::Relaxed);
    sender.join().unwrap();
    finished.store(true, Ordering::Relaxed);
    TARGET.store(std::ptr::null_mut(), Ordering::Relaxed);
    let handled = HANDLED.load(Ordering::Relaxed);
    // SAFETY: within the allocation; the handler no longer writes it.
    let counted = unsafe { p.cast::<u64>().read_volatile() };
    assert_eq!(adopted, 20, "every registration adopted the pages");
    assert!(handled > 0, "no signal arrived");
    assert_eq!(counted, handled, "writes the handler made were lost");
    // SAFETY: allocated above with this layout; no region names it any more.
    unsafe { std::alloc::dealloc(p, layout) };
}
