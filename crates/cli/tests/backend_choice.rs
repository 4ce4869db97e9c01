//! The device tools choose their backend as the API does: softrdmad's device when a daemon
//! answers on its control socket and serves the address (so no bind error where it holds
//! the port), an embedded one otherwise; `--backend` and `SOFTRDMA_BACKEND` win, and
//! `--capture` asks for an embedded device. Every tool says in its header which backend it
//! uses. The daemon is served from this test process on a control socket of its own, which
//! `SOFTRDMA_DAEMON_SOCKET` points the tools at; its addresses are this file's own.

mod tools;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use tools::{decode, decode_counts, scratch, serve_daemon, softrdma, Proc};

const LIMIT: Duration = Duration::from_secs(120);

/// The addresses the test daemon serves, one device each: `srxe0` is the first.
const ADDRS: [&str; 9] = [
    "127.0.4.1",
    "127.0.4.2",
    "127.0.4.3",
    "127.0.4.4",
    "127.0.4.5",
    "127.0.4.6",
    "127.0.4.7",
    "127.0.0.1",
    "127.0.0.2",
];

/// The daemon of this test process.
struct TestDaemon {
    socket: PathBuf,
    /// The UDP port every device of it serves.
    port: u16,
}

fn test_daemon() -> &'static TestDaemon {
    static D: OnceLock<TestDaemon> = OnceLock::new();
    D.get_or_init(start_daemon)
}

fn start_daemon() -> TestDaemon {
    let devices: Vec<(String, &str)> = ADDRS
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("srxe{i}"), *a))
        .collect();
    let socket = scratch(&format!("backend-choice-{}.sock", std::process::id()));
    let port = serve_daemon(&devices, &socket);
    TestDaemon { socket, port }
}

/// The name of the test daemon's device on `addr`.
fn device_of(addr: &str) -> String {
    let i = ADDRS
        .iter()
        .position(|a| *a == addr)
        .expect("a served address");
    format!("srxe{i}")
}

/// How the tools word the test daemon's device on `addr`.
fn on_daemon(addr: &str) -> String {
    format!(
        "softrdmad ({}, pid {})",
        device_of(addr),
        std::process::id()
    )
}

/// `softrdma ARGS` with the test daemon as the one on the control socket, and nothing in
/// the environment choosing a backend.
fn tool(args: &[&str]) -> Command {
    let mut c = softrdma(args);
    c.env("SOFTRDMA_DAEMON_SOCKET", &test_daemon().socket)
        .env("SOFTRDMA_DAEMON_SPAWN", "0")
        .env_remove("SOFTRDMA_BACKEND")
        .env_remove("SOFTRDMA_CAPTURE");
    c
}

/// Run `cmd` to completion; (exit code, stdout, stderr).
fn output(what: &str, cmd: Command) -> (Option<i32>, String, String) {
    let o = Proc::spawn(what, cmd).wait(LIMIT);
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Run `cmd`, require success; stdout.
fn ok(what: &str, cmd: Command) -> String {
    Proc::spawn(what, cmd).success(LIMIT)
}

#[test]
fn write_bw_between_two_processes_uses_the_daemon_serving_their_addresses() {
    let port = test_daemon().port.to_string();
    // The server leaves the port to the daemon; the client names the daemon's, where an
    // embedded device could not bind.
    let server = Proc::spawn(
        "write_bw server",
        tool(&["write_bw", "-p", "27201", "-B", "127.0.4.1"]),
    );
    let client = ok(
        "write_bw client",
        tool(&[
            "write_bw",
            "127.0.4.1",
            "-p",
            "27201",
            "-B",
            "127.0.4.2",
            "--udp-port",
            &port,
            "-s",
            "16384",
            "-n",
            "200",
        ]),
    );
    let server = server.success(LIMIT);
    let want = format!(" Backend         : {}", on_daemon("127.0.4.2"));
    assert!(client.contains(&want), "{want:?} missing:\n{client}");
    let want = format!(" Device          : srxe1 (UDP 127.0.4.2:{port})");
    assert!(client.contains(&want), "{want:?} missing:\n{client}");
    let want = format!(" Backend         : {}", on_daemon("127.0.4.1"));
    assert!(server.contains(&want), "{want:?} missing:\n{server}");
    assert!(
        client
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["16384", "200"])),
        "no 16384-byte row:\n{client}"
    );
}

#[test]
fn pingpong_uses_the_daemon_and_says_so() {
    let server = Proc::spawn(
        "pingpong server",
        tool(&[
            "pingpong",
            "-p",
            "27202",
            "-B",
            "127.0.4.3",
            "-n",
            "50",
            "--chk",
        ]),
    );
    let client = ok(
        "pingpong client",
        tool(&[
            "pingpong",
            "127.0.4.3",
            "-p",
            "27202",
            "-B",
            "127.0.4.4",
            "-n",
            "50",
            "--chk",
        ]),
    );
    let server = server.success(LIMIT);
    for (out, addr) in [(&client, "127.0.4.4"), (&server, "127.0.4.3")] {
        let want = format!("Backend: {}", on_daemon(addr));
        assert!(out.contains(&want), "{want:?} missing:\n{out}");
        assert!(out.contains("50 iters in "), "{out}");
    }
}

#[test]
fn devinfo_reports_the_daemon_device_and_an_explicit_choice_wins() {
    let port = test_daemon().port.to_string();
    let out = ok("devinfo", tool(&["devinfo", "--addr", "127.0.4.5"]));
    let want = format!("hca_id:\tsrxe4 (UDP 127.0.4.5:{port})");
    assert!(out.contains(&want), "{want:?} missing:\n{out}");
    let want = format!("\tbackend:\t\t\t{}", on_daemon("127.0.4.5"));
    assert!(out.contains(&want), "{want:?} missing:\n{out}");

    // Embedded, though the daemon serves the address: asked for by flag, by the
    // environment, or by a port the daemon does not serve.
    let mut by_env = tool(&["devinfo", "--addr", "127.0.4.5"]);
    by_env.env("SOFTRDMA_BACKEND", "embedded");
    for (what, cmd) in [
        (
            "--backend embedded",
            tool(&["devinfo", "--addr", "127.0.4.5", "--backend", "embedded"]),
        ),
        ("SOFTRDMA_BACKEND=embedded", by_env),
        (
            "--udp-port 0",
            tool(&["devinfo", "--addr", "127.0.4.5", "--udp-port", "0"]),
        ),
    ] {
        let out = ok(what, cmd);
        assert!(out.contains("\tbackend:\t\t\tembedded"), "{what}:\n{out}");
        assert!(
            out.contains("hca_id:\tsoftrdma0 (UDP 127.0.4.5:"),
            "{what}:\n{out}"
        );
    }
    // The flag wins over the environment.
    let mut cmd = tool(&["devinfo", "--addr", "127.0.4.5", "--backend", "daemon"]);
    cmd.env("SOFTRDMA_BACKEND", "embedded");
    let out = ok("--backend daemon over the environment", cmd);
    assert!(out.contains(&on_daemon("127.0.4.5")), "{out}");

    // An embedded device asked for where the daemon holds the port fails to bind, as asked,
    // and says what to do.
    let (code, _, err) = output(
        "devinfo --backend embedded on the daemon's port",
        tool(&[
            "devinfo",
            "--addr",
            "127.0.4.5",
            "--backend",
            "embedded",
            "--udp-port",
            &port,
        ]),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("Address already in use") && err.contains("--backend daemon"),
        "{err}"
    );

    // With no daemon answering: embedded, unless the daemon is asked for.
    let missing = scratch("backend-choice-nobody.sock");
    let mut cmd = tool(&["devinfo", "--addr", "127.0.4.5"]);
    cmd.env("SOFTRDMA_DAEMON_SOCKET", &missing);
    let out = ok("devinfo without a daemon", cmd);
    assert!(out.contains("\tbackend:\t\t\tembedded"), "{out}");
    let mut cmd = tool(&["devinfo", "--addr", "127.0.4.5", "--backend", "daemon"]);
    cmd.env("SOFTRDMA_DAEMON_SOCKET", &missing);
    let (code, _, err) = output("devinfo --backend daemon without a daemon", cmd);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no softrdmad on"), "{err}");
}

#[test]
fn a_capture_asks_for_an_embedded_device_where_the_daemon_serves_the_address() {
    let pcap = scratch("backend-choice-capture.pcap");
    let _ = std::fs::remove_file(&pcap);
    let server = Proc::spawn(
        "pingpong server",
        tool(&[
            "pingpong",
            "-p",
            "27203",
            "-B",
            "127.0.4.6",
            "-n",
            "20",
            "--backend",
            "embedded",
        ]),
    );
    let client = ok(
        "pingpong client",
        tool(&[
            "pingpong",
            "127.0.4.6",
            "-p",
            "27203",
            "-B",
            "127.0.4.7",
            "-n",
            "20",
            "--capture",
            pcap.to_str().unwrap(),
        ]),
    );
    let server = server.success(LIMIT);
    for out in [&client, &server] {
        assert!(out.contains("Backend: embedded"), "{out}");
    }
    let (_, summary) = decode(&pcap);
    let (total, good, ..) = decode_counts(&summary);
    assert!(total > 0 && good == total, "{summary}");
    // A capture of softrdmad's device is refused before anything starts.
    let (code, _, err) = output(
        "write_bw --backend daemon --capture",
        tool(&[
            "write_bw",
            "--loopback",
            "-p",
            "0",
            "--backend",
            "daemon",
            "--capture",
            pcap.to_str().unwrap(),
        ]),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("--capture records an embedded device"),
        "{err}"
    );
}

#[test]
fn the_demo_runs_on_the_daemon_serving_both_of_its_addresses() {
    let out = ok("demo", tool(&["demo"]));
    for want in [
        "two devices of softrdmad".to_string(),
        format!(
            "Backend: A {}, B {}",
            on_daemon("127.0.0.1"),
            on_daemon("127.0.0.2")
        ),
        "compare_swap(105 -> 7): returned 105, B's word is now 7".to_string(),
        "127.0.0.1 -> 127.0.0.2".to_string(),
        "by softrdmad's device counters".to_string(),
        "--loopback -s 65536 -n 3000 --baseline --backend daemon".to_string(),
        format!(" Backend         : {}", on_daemon("127.0.0.1")),
        "BW average[MB/sec]".to_string(),
        "t_typical[usec]".to_string(),
        "demo done: every step checked its result.".to_string(),
    ] {
        assert!(
            out.contains(&want),
            "{want:?} missing from the demo:\n{out}"
        );
    }
}
