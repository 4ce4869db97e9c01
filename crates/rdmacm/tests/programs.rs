//! Unmodified Debian rdma_cm programs (rdmacm-utils, perftest `-R`) as two processes on one
//! host through the drop-ins `libibverbs.so.1` + `librdmacm.so.1`: on two embedded devices
//! (server 127.0.0.1, client 127.0.0.2) and on one `softrdmad` of the test's own. Each run
//! asserts both exit statuses and what the programs print about the data they moved.

#[path = "../../ibverbs/tests/common/mod.rs"]
mod common;
mod rdmacm_lib;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{
    describe, finish, free_tcp_port, free_udp_port, library_dir, require, run, verbs_command,
    Backend, Guard, On, TestDaemon,
};

const LIMIT: Duration = Duration::from_secs(60);

/// Run `prog` as server and client on `backend` (`prog` is `server/client` when the two
/// sides are two programs); the client is retried while the server's listen is not up yet
/// (the connection is rejected). Returns (server, client).
fn pair(
    prog: &str,
    server_args: &[&str],
    client_args: &[&str],
    backend: Backend,
    server_exits: bool,
) -> (Output, Output) {
    // One pair at a time: busy-polling programs side by side starve each other on a
    // small machine.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    rdmacm_lib::install_beside(&library_dir());
    let udp = free_udp_port();
    let mut daemon = match backend {
        Backend::Daemon => Some(TestDaemon::start(&["127.0.0.1"])),
        Backend::Embedded => None,
    };
    let on = |addr| match &daemon {
        Some(d) => On::Daemon { daemon: d, addr },
        None => On::Embedded { addr, port: udp },
    };
    let (server_prog, client_prog) = prog.split_once('/').unwrap_or((prog, prog));
    let server = Guard(Some(
        verbs_command(server_prog, server_args, on("127.0.0.1"))
            .spawn()
            .expect("spawn server"),
    ));
    let client_addr = match backend {
        Backend::Daemon => "127.0.0.1",
        Backend::Embedded => "127.0.0.2",
    };
    let start = Instant::now();
    let client = loop {
        let o = run(
            verbs_command(client_prog, client_args, on(client_addr)),
            LIMIT,
        );
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
        .to_lowercase();
        let not_listening = !o.status.success()
            && (text.contains("rejected")
                || text.contains("connection refused")
                || text.contains("failed to connect")
                // perftest -R: "Unexpected CM event ... 8" (REJECTED), then this.
                || text.contains("unable to perform rdma_client function")
                // udaddy: SIDR answered "unsupported" (nothing listens yet).
                || text.contains("rdma_cm_event_unreachable"));
        if not_listening && start.elapsed() < LIMIT {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        break o;
    };
    let server = if server_exits {
        let (o, timed_out) = finish(server, LIMIT);
        assert!(
            !timed_out,
            "server timed out: {}\nclient: {}",
            describe(&o),
            describe(&client)
        );
        o
    } else {
        // A server that serves until killed (cmtime): it must still be running.
        let (o, _) = finish(server, Duration::from_millis(300));
        o
    };
    if let Some(d) = daemon.as_mut() {
        d.assert_alive();
    }
    (server, client)
}

fn ok(o: &Output, other: &Output) {
    assert!(
        o.status.success(),
        "{}\nthe other side: {}",
        describe(o),
        describe(other)
    );
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn rping(backend: Backend) {
    require("rping", "rdmacm-utils");
    let port = free_tcp_port().to_string();
    let (s, c) = pair(
        "rping",
        &["-s", "-v", "-C", "3", "-a", "0.0.0.0", "-p", &port],
        &["-c", "-v", "-C", "3", "-a", "127.0.0.1", "-p", &port],
        backend,
        true,
    );
    ok(&s, &c);
    ok(&c, &s);
    // rping -v prints each ping's data: the client what it read back, the server what it
    // got by RDMA READ from the client.
    for i in 0..3 {
        let line = format!("ping data: rdma-ping-{i}: ");
        assert!(stdout(&c).contains(&line), "{}", describe(&c));
        assert!(
            stdout(&s).contains(&format!("server {line}")),
            "{}",
            describe(&s)
        );
    }
    assert!(
        String::from_utf8_lossy(&s.stderr).contains("DISCONNECT EVENT"),
        "the server saw no DISCONNECTED: {}",
        describe(&s)
    );
}

#[test]
fn rping_passes_three_pings_between_two_embedded_devices() {
    rping(Backend::Embedded);
}

#[test]
fn rping_passes_three_pings_on_the_daemon() {
    rping(Backend::Daemon);
}

fn ucmatose(backend: Backend) {
    require("ucmatose", "rdmacm-utils");
    let port = free_tcp_port().to_string();
    let (s, c) = pair(
        "ucmatose",
        &["-p", &port, "-c", "2", "-C", "5"],
        &["-s", "127.0.0.1", "-p", &port, "-c", "2", "-C", "5"],
        backend,
        true,
    );
    ok(&s, &c);
    ok(&c, &s);
    for o in [&s, &c] {
        let t = stdout(o);
        assert!(t.contains("data transfers complete"), "{}", describe(o));
        assert!(t.contains("return status 0"), "{}", describe(o));
    }
    // The server disconnects and waits for both DISCONNECTED events.
    assert!(stdout(&s).contains("disconnected"), "{}", describe(&s));
}

#[test]
fn ucmatose_moves_data_over_two_connections_between_two_embedded_devices() {
    ucmatose(Backend::Embedded);
}

#[test]
fn ucmatose_moves_data_over_two_connections_on_the_daemon() {
    ucmatose(Backend::Daemon);
}

fn udaddy(backend: Backend) {
    require("udaddy", "rdmacm-utils");
    // udaddy has no port option: it always resolves rdma_cm UDP port 7174 (each test's
    // devices are its own, so tests do not share the listen).
    let (s, c) = pair(
        "udaddy",
        &["-c", "2", "-C", "5"],
        &["-s", "127.0.0.1", "-c", "2", "-C", "5"],
        backend,
        true,
    );
    ok(&s, &c);
    ok(&c, &s);
    for o in [&s, &c] {
        let t = stdout(o);
        assert!(t.contains("data transfers complete"), "{}", describe(o));
        assert!(t.contains("return status 0"), "{}", describe(o));
    }
}

#[test]
fn udaddy_resolves_the_servers_ud_qps_and_exchanges_datagrams_between_two_embedded_devices() {
    udaddy(Backend::Embedded);
}

#[test]
fn udaddy_resolves_the_servers_ud_qps_and_exchanges_datagrams_on_the_daemon() {
    udaddy(Backend::Daemon);
}

/// mckey through one daemon: a receiver joins a group and waits for 5 datagrams; senders
/// (each joins, sends 5, leaves) run until it has them all (what a sender sends before the
/// receiver joined is lost, as on a network). Groups reach the QPs of one device: two
/// embedded devices in two processes do not share them.
#[test]
fn mckey_delivers_a_senders_datagrams_to_a_receiver_that_joined_the_group_on_the_daemon() {
    require("mckey", "rdmacm-utils");
    rdmacm_lib::install_beside(&library_dir());
    let mut daemon = TestDaemon::start(&["127.0.0.1"]);
    let on = || On::Daemon {
        daemon: &daemon,
        addr: "127.0.0.1",
    };
    let group = "239.7.7.7";
    let args = ["-m", group, "-b", "127.0.0.1", "-C", "5"];
    let mut receiver = Guard(Some(
        verbs_command("mckey", &args, on())
            .spawn()
            .expect("spawn receiver"),
    ));
    let start = Instant::now();
    let mut sender;
    loop {
        let mut sargs = args.to_vec();
        sargs.push("-s");
        sender = run(verbs_command("mckey", &sargs, on()), LIMIT);
        let child = receiver.0.as_mut().expect("running");
        if child.try_wait().expect("wait").is_some() || start.elapsed() > LIMIT {
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let (r, timed_out) = finish(receiver, Duration::from_secs(5));
    assert!(
        !timed_out,
        "the receiver never got its datagrams: {}",
        describe(&r)
    );
    ok(&r, &sender);
    ok(&sender, &r);
    for o in [&r, &sender] {
        let t = stdout(o);
        assert!(
            t.contains("joined dgid: ::ffff:239.7.7.7"),
            "{}",
            describe(o)
        );
        assert!(t.contains("return status 0"), "{}", describe(o));
    }
    // The receiver says it received: "receiving data transfers", then completes.
    assert!(
        stdout(&r).contains("data transfers complete"),
        "{}",
        describe(&r)
    );
    daemon.assert_alive();
}

fn rdma_server_client(backend: Backend) {
    require("rdma_server", "rdmacm-utils");
    let port = free_tcp_port().to_string();
    let (s, c) = pair(
        "rdma_server/rdma_client",
        &["-p", &port],
        &["-s", "127.0.0.1", "-p", &port],
        backend,
        true,
    );
    ok(&s, &c);
    ok(&c, &s);
    // Both print "end 0" only after the send and receive completed.
    assert!(
        stdout(&s).contains("rdma_server: end 0"),
        "{}",
        describe(&s)
    );
    assert!(
        stdout(&c).contains("rdma_client: end 0"),
        "{}",
        describe(&c)
    );
}

#[test]
fn rdma_server_and_rdma_client_exchange_a_message_between_two_embedded_devices() {
    rdma_server_client(Backend::Embedded);
}

#[test]
fn rdma_server_and_rdma_client_exchange_a_message_on_the_daemon() {
    rdma_server_client(Backend::Daemon);
}

fn cmtime(backend: Backend) {
    require("cmtime", "rdmacm-utils");
    let port = free_tcp_port().to_string();
    // Debian's cmtime server serves until killed; the client connects and disconnects 20
    // ids and prints its table.
    let (s, c) = pair(
        "cmtime",
        &["-p", &port, "-c", "20"],
        &["-s", "127.0.0.1", "-p", &port, "-c", "20"],
        backend,
        false,
    );
    ok(&c, &s);
    let t = stdout(&c);
    for step in [
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
    ] {
        assert!(t.contains(step), "no {step} row: {}", describe(&c));
    }
    // Still serving (killed by the test), not crashed.
    assert!(
        s.status.code().is_none(),
        "the server exited: {}",
        describe(&s)
    );
}

#[test]
fn cmtime_connects_and_disconnects_twenty_ids_between_two_embedded_devices() {
    cmtime(Backend::Embedded);
}

#[test]
fn cmtime_connects_and_disconnects_twenty_ids_on_the_daemon() {
    cmtime(Backend::Daemon);
}

/// perftest's result row: first column the message size, second the iteration count.
fn has_row(o: &Output, size: &str, iters: &str) -> bool {
    stdout(o).lines().any(|l| {
        let mut f = l.split_whitespace();
        f.next() == Some(size) && f.next() == Some(iters)
    })
}

fn perftest(prog: &str, size: &str, backend: Backend) {
    require(prog, "perftest");
    let port = free_tcp_port().to_string();
    let (s, c) = pair(
        prog,
        &["-R", "-n", "50", "-p", &port],
        &["-R", "-n", "50", "-p", &port, "127.0.0.1"],
        backend,
        true,
    );
    ok(&s, &c);
    ok(&c, &s);
    assert!(has_row(&c, size, "50"), "no result row: {}", describe(&c));
}

#[test]
fn ib_write_bw_with_rdma_cm_between_two_embedded_devices() {
    perftest("ib_write_bw", "65536", Backend::Embedded);
}

#[test]
fn ib_read_bw_with_rdma_cm_between_two_embedded_devices() {
    perftest("ib_read_bw", "65536", Backend::Embedded);
}

#[test]
fn ib_send_lat_with_rdma_cm_between_two_embedded_devices() {
    perftest("ib_send_lat", "2", Backend::Embedded);
}

#[test]
fn ib_write_bw_with_rdma_cm_on_the_daemon() {
    perftest("ib_write_bw", "65536", Backend::Daemon);
}

#[test]
fn ib_read_bw_with_rdma_cm_on_the_daemon() {
    perftest("ib_read_bw", "65536", Backend::Daemon);
}

#[test]
fn ib_send_lat_with_rdma_cm_on_the_daemon() {
    perftest("ib_send_lat", "2", Backend::Daemon);
}

#[test]
fn with_another_libibverbs_every_call_fails_with_one_clear_message() {
    require("rping", "rdmacm-utils");
    // Only librdmacm.so.1 on the path: the program loads Debian's libibverbs.
    let dir = std::env::temp_dir().join(format!("softrdma-rdmacm-only-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let link = dir.join("librdmacm.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(rdmacm_lib::built(), &link).expect("symlink");
    let mut c = Command::new("rping");
    c.args(["-c", "-a", "127.0.0.1", "-p", "1"])
        .env("LD_LIBRARY_PATH", &dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let o = run(c, LIMIT);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!o.status.success(), "{}", describe(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("is not softrdma's").count(),
        1,
        "{}",
        describe(&o)
    );
}
