//! Which backend a device opens when the program does not say: softrdmad's device when a
//! daemon answers on the control socket and serves the address, else an embedded one; an
//! explicit choice (the builder, `SOFTRDMA_BACKEND`) wins, and options only one backend has
//! choose it.
//!
//! The rule reads the environment, so each scenario runs in a child process of this test
//! binary with an environment of its own. The daemon is this process's test daemon (on a
//! control socket of its own), so the child reports this process's pid as the daemon's.

mod common;

use std::ffi::OsString;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;

use softrdma::{BackendKind, Device, Error, Mtu, RxPath, SrcPortPolicy};

/// Set in a child process: the scenario it runs is the one named by `--exact`.
const CHILD_ENV: &str = "SOFTRDMA_TEST_BACKEND_CHILD";
/// The parent's pid (the test daemon's), for the child to check what it reports.
const PARENT_ENV: &str = "SOFTRDMA_TEST_BACKEND_PARENT";

/// Every variable the backend rule (or a daemon start) reads.
const RULE_VARS: [&str; 7] = [
    softrdma::BACKEND_ENV,
    softrdma::SOCKET_ENV,
    softrdma::SPAWN_ENV,
    softrdma::DAEMON_BIN_ENV,
    softrdma::DAEMON_ARGS_ENV,
    softrdma::DEVICE_ENV,
    "SOFTRDMA_CAPTURE",
];

/// Run the child scenario `name` with exactly `env` of the rule's variables (no daemon can be
/// started: its binary does not exist); it must pass.
fn run_child(name: &str, env: &[(&str, OsString)]) {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env(PARENT_ENV, std::process::id().to_string());
    for v in RULE_VARS {
        c.env_remove(v);
    }
    c.env(softrdma::DAEMON_BIN_ENV, "/nonexistent/softrdmad");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child scenario {name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether this process is a child running a scenario.
fn in_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A scratch directory of this process.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("softrdma-choice-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn daemon_socket() -> (&'static str, OsString) {
    (
        softrdma::SOCKET_ENV,
        common::test_daemon().socket.clone().into_os_string(),
    )
}

#[test]
fn with_no_daemon_answering_a_device_is_embedded_and_no_daemon_is_started() {
    if in_child() {
        return;
    }
    let dir = scratch("none");
    // A socket file nothing listens on any more, as a stopped daemon leaves it.
    let stale = dir.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    // A path through a regular file.
    let file = dir.join("file");
    std::fs::write(&file, b"").unwrap();
    run_child(
        "child_no_daemon",
        &[(softrdma::SOCKET_ENV, dir.join("missing.sock").into())],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn child_no_daemon() {
    if !in_child() {
        return;
    }
    let missing = PathBuf::from(std::env::var_os(softrdma::SOCKET_ENV).unwrap());
    let dir = missing.parent().unwrap().to_path_buf();
    let plain = Device::builder(ip("127.0.0.1"));
    assert_eq!(plain.choose_backend().unwrap(), BackendKind::Embedded);
    let dev = Device::builder(ip("127.0.0.1")).port(0).open().unwrap();
    assert_eq!(dev.backend(), BackendKind::Embedded);
    assert!(dev.daemon_info().is_none() && dev.try_runtime().is_some());
    for socket in [
        dir.join("stale.sock"),
        dir.join("no-such-dir/softrdmad.sock"),
        dir.join("file/softrdmad.sock"),
    ] {
        let k = Device::builder(ip("127.0.0.1"))
            .daemon_socket(&socket)
            .choose_backend();
        assert_eq!(k.unwrap(), BackendKind::Embedded, "{}", socket.display());
    }
    // Looking started nothing: the socket is still missing.
    assert!(!missing.exists());
    // Options that start a daemon choose it: here none can be started, which is an error,
    // not an embedded device.
    let b = Device::builder(ip("127.0.0.1")).daemon_binary("/nonexistent/softrdmad");
    assert_eq!(b.choose_backend().unwrap(), BackendKind::Daemon);
    assert!(matches!(b.open(), Err(Error::NoDaemon { .. })));
}

#[test]
fn a_daemon_that_answers_and_serves_the_address_is_used_and_reported() {
    if in_child() {
        return;
    }
    run_child(
        "child_daemon_answers",
        &[daemon_socket(), (softrdma::DEVICE_ENV, "127.0.0.2".into())],
    );
}

#[test]
fn child_daemon_answers() {
    if !in_child() {
        return;
    }
    let parent: u32 = std::env::var(PARENT_ENV).unwrap().parse().unwrap();
    let a = Device::open(ip("127.0.0.1")).unwrap();
    assert_eq!(a.backend(), BackendKind::Daemon);
    assert_eq!(a.daemon_info(), Some(("srxe0".to_string(), parent)));
    assert!(a.try_runtime().is_none());
    let port = a.local_addr().port();
    // The daemon's own port is one it serves.
    let b = Device::builder(ip("127.0.0.2")).port(port).open().unwrap();
    assert_eq!(b.daemon_info(), Some(("srxe1".to_string(), parent)));
    // The devices work: a SEND from one to the other.
    let (sa, sb) = common::pair_on(a, b, 64);
    sb.qp.recv(1, &[sb.mr.sge(..).unwrap()]).unwrap();
    sa.mr.write(0, b"implicit").unwrap();
    sa.qp.send(2, &[sa.mr.sge(..8).unwrap()]).unwrap();
    sa.cq.wait_ok(common::WAIT).unwrap();
    assert_eq!(sb.cq.wait_ok(common::WAIT).unwrap().byte_len, 8);
    assert_eq!(&sb.mr.to_vec()[..8], b"implicit");
    // The device the environment names, by the same rule.
    let d = Device::open_default().unwrap();
    assert_eq!(d.daemon_info(), Some(("srxe1".to_string(), parent)));
    // Saying nothing against it keeps the daemon.
    let b = Device::builder(ip("::1"))
        .spawn_daemon(false)
        .wait_spin(Default::default());
    assert_eq!(b.choose_backend().unwrap(), BackendKind::Daemon);
}

#[test]
fn what_the_daemon_cannot_give_chooses_an_embedded_device() {
    if in_child() {
        return;
    }
    run_child("child_daemon_cannot_give", &[daemon_socket()]);
}

#[test]
fn child_daemon_cannot_give() {
    if !in_child() {
        return;
    }
    let b = || Device::builder(ip("127.0.0.1"));
    let daemon_dev = b().open().unwrap();
    assert_eq!(daemon_dev.backend(), BackendKind::Daemon);
    let port = daemon_dev.local_addr().port();
    let mtu = daemon_dev.query_port().unwrap().active_mtu;
    let other_mtu = if mtu == Mtu::Mtu1024 {
        Mtu::Mtu2048
    } else {
        Mtu::Mtu1024
    };
    let cases = [
        (
            "an address it does not serve",
            Device::builder(ip("127.0.0.9")),
        ),
        ("another port", b().port(port.wrapping_add(1))),
        ("another MTU", b().mtu(other_mtu)),
        ("remote_port", b().remote_port(port)),
        ("src_port_policy", b().src_port_policy(SrcPortPolicy::Fixed)),
        ("rx_path", b().rx_path(RxPath::Udp)),
        ("busy_poll", b().busy_poll(Default::default())),
        ("adaptive_poll", b().adaptive_poll(Default::default())),
        ("rng_seed", b().rng_seed(7)),
    ];
    for (what, builder) in cases {
        assert_eq!(
            builder.choose_backend().unwrap(),
            BackendKind::Embedded,
            "{what}"
        );
    }
    // What the daemon does give keeps it.
    assert_eq!(
        b().port(port).mtu(mtu).choose_backend().unwrap(),
        BackendKind::Daemon
    );
    // And an embedded device is what opens (a port of its own: the daemon holds its own).
    let e = b().port(0).rng_seed(7).open().unwrap();
    assert_eq!(e.backend(), BackendKind::Embedded);
    // Options of both backends at once: say which.
    let r = b()
        .busy_poll(Default::default())
        .daemon_args(["--addr", "127.0.0.1"]);
    assert!(matches!(r.choose_backend(), Err(Error::Config(_))));
    assert!(matches!(r.open(), Err(Error::Config(_))));
    // Unless the backend is given.
    let r = b()
        .busy_poll(Default::default())
        .daemon_args(["--addr", "127.0.0.1"])
        .backend(BackendKind::Embedded);
    assert_eq!(r.choose_backend().unwrap(), BackendKind::Embedded);
}

#[test]
fn an_explicit_choice_wins_over_a_daemon_that_answers_or_none() {
    if in_child() {
        return;
    }
    // The environment says embedded, a daemon answers.
    run_child(
        "child_environment_says_embedded",
        &[daemon_socket(), (softrdma::BACKEND_ENV, "embedded".into())],
    );
    // The environment says daemon, none answers (and none may be started).
    let dir = scratch("explicit");
    run_child(
        "child_environment_says_daemon",
        &[
            (softrdma::SOCKET_ENV, dir.join("missing.sock").into()),
            (softrdma::BACKEND_ENV, "daemon".into()),
            (softrdma::SPAWN_ENV, "0".into()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn child_environment_says_embedded() {
    if !in_child() {
        return;
    }
    let b = || Device::builder(ip("127.0.0.1"));
    assert_eq!(b().choose_backend().unwrap(), BackendKind::Embedded);
    let e = b().port(0).open().unwrap();
    assert_eq!(e.backend(), BackendKind::Embedded);
    // The builder's choice wins over the environment's.
    let d = b().backend(BackendKind::Daemon).open().unwrap();
    assert_eq!(d.backend(), BackendKind::Daemon);
    // An explicit embedded device where softrdmad serves that very address and port is
    // tried, and fails to bind as asked.
    let port = d.local_addr().port();
    let r = Device::builder(ip("127.0.0.1"))
        .backend(BackendKind::Embedded)
        .port(port)
        .open();
    assert!(
        matches!(r, Err(Error::Runtime(softrdma::RuntimeError::Bind { .. }))),
        "{r:?}"
    );
}

#[test]
fn child_environment_says_daemon() {
    if !in_child() {
        return;
    }
    let b = Device::builder(ip("127.0.0.1"));
    assert_eq!(b.choose_backend().unwrap(), BackendKind::Daemon);
    // No falling back to embedded: the daemon was asked for.
    assert!(matches!(b.open(), Err(Error::NoDaemon { .. })));
    // The builder's choice wins over the environment's.
    let e = Device::builder(ip("127.0.0.1"))
        .backend(BackendKind::Embedded)
        .port(0)
        .open()
        .unwrap();
    assert_eq!(e.backend(), BackendKind::Embedded);
}

#[test]
fn a_capture_file_in_the_environment_chooses_an_embedded_device() {
    if in_child() {
        return;
    }
    let dir = scratch("capture");
    run_child(
        "child_capture_in_the_environment",
        &[
            daemon_socket(),
            ("SOFTRDMA_CAPTURE", dir.join("c.pcap").into()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn child_capture_in_the_environment() {
    if !in_child() {
        return;
    }
    let b = || Device::builder(ip("127.0.0.1"));
    assert_eq!(b().choose_backend().unwrap(), BackendKind::Embedded);
    // Asked for explicitly, the daemon still opens (it records nothing).
    let d = b().backend(BackendKind::Daemon).open().unwrap();
    assert_eq!(d.backend(), BackendKind::Daemon);
}
