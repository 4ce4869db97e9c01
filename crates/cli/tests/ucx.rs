//! UCX on softrdma: Debian's `ucx_perftest` (ucx-utils) through `softrdma exec`, server and
//! client as two processes, on one host (both on the device of the test daemon `exec_env`
//! serves) and between two network namespaces (each on the `softrdmad` that `softrdma exec`
//! starts there). UCT tests on `rc_verbs` and `ud_verbs`, UCP tests with `rc_verbs` carrying
//! the data and `ud_verbs` wiring up (UCP wants an auxiliary transport for that, which RC is
//! not). Few iterations: these check that every test runs to its end, not how fast; for
//! figures, `scripts/ucx-bench.sh`.
//!
//! The namespace test needs root (`ip netns`, as CI runs); without it it FAILS saying so.

mod exec_env;
mod hosts;
mod tools;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use exec_env::{describe, exec, in_ns, require, NsDaemon, DEV};
use hosts::Hosts;
use tools::{bin, Proc};

const LIMIT: Duration = Duration::from_secs(120);

/// Measured iterations of every run, and warm-up ones before them.
const ITERS: u64 = 200;
const WARMUP: u64 = 20;

/// One `ucx_perftest` run: its test, `UCX_TLS`, and whether it is a UCT test (on transport
/// `tls`, `-x`) rather than a UCP one; then its further arguments.
struct Case {
    test: &'static str,
    tls: &'static str,
    uct: bool,
    extra: &'static [&'static str],
}

const fn uct(test: &'static str, tls: &'static str) -> Case {
    Case {
        test,
        tls,
        uct: true,
        extra: &[],
    }
}

const fn ucp(test: &'static str) -> Case {
    Case {
        test,
        tls: "rc_verbs,ud_verbs",
        uct: false,
        extra: &[],
    }
}

/// Every test UCX offers on softrdma's transports. Not here, as UCX refuses them: `swap`
/// (rc_verbs has no atomic swap), put, get and atomics on ud_verbs, and `get` with the
/// short layout (the default).
const CASES: [Case; 14] = [
    uct("am_lat", "rc_verbs"),
    uct("am_bw", "rc_verbs"),
    uct("put_lat", "rc_verbs"),
    uct("put_bw", "rc_verbs"),
    uct("add_lat", "rc_verbs"),
    uct("fadd", "rc_verbs"),
    uct("cswap", "rc_verbs"),
    Case {
        extra: &["-D", "bcopy"],
        ..uct("get", "rc_verbs")
    },
    uct("am_lat", "ud_verbs"),
    uct("am_bw", "ud_verbs"),
    ucp("tag_lat"),
    ucp("tag_bw"),
    ucp("stream_lat"),
    ucp("stream_bw"),
];

impl Case {
    /// `ucx_perftest` and its arguments, but the server's host name and the TCP port.
    fn args(&self, dev: &str) -> Vec<String> {
        let mut v: Vec<String> = vec!["ucx_perftest".into(), "-t".into(), self.test.into()];
        if self.uct {
            v.extend([
                "-x".into(),
                self.tls.into(),
                "-d".into(),
                format!("{dev}:1"),
            ]);
        }
        v.extend(self.extra.iter().map(|a| a.to_string()));
        v.extend([
            "-n".into(),
            ITERS.to_string(),
            "-w".into(),
            WARMUP.to_string(),
        ]);
        v
    }

    fn name(&self) -> String {
        format!("{} {} {}", self.test, self.tls, self.extra.join(" "))
            .trim_end()
            .to_string()
    }
}

/// Where the two processes run: the command running `ucx_perftest ARGS` (the program and
/// its arguments given) under `softrdma exec` on the server's side, the one on the client's,
/// and the address the client connects to. Both sides' softrdma device has one name.
struct Pair<'a> {
    server: &'a dyn Fn(&[&str]) -> Command,
    client: &'a dyn Fn(&[&str]) -> Command,
    server_addr: &'a str,
}

/// A TCP port nothing listens on now, for the programs' own exchange (ucx_perftest's
/// default, 13337, may be another run's).
fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("a free TCP port")
        .port()
}

/// The client's `Final:` row: the iterations, then its seven figures (latency: 50%ile, mean
/// since the last progress report, mean overall; bandwidth and message rate: since the last
/// report, overall).
fn final_row(stdout: &str) -> Option<(u64, Vec<f64>)> {
    let row = stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Final:"))?;
    let mut f = row.split_whitespace();
    let iters = f.next()?.parse().ok()?;
    let figures: Vec<f64> = f.map(|x| x.parse().ok()).collect::<Option<_>>()?;
    Some((iters, figures))
}

/// Run `case` on `pair` (the client retried while the server does not listen yet); both
/// must exit 0 and the client must report every iteration with positive figures.
fn run_case(case: &Case, dev: &str, pair: &Pair<'_>) -> Result<(), String> {
    let port = free_tcp_port().to_string();
    let mut args = case.args(dev);
    args.extend(["-p".into(), port]);
    let sargs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cargs = sargs.clone();
    cargs.insert(1, pair.server_addr);
    let name = case.name();
    let ucx = |mut c: Command| {
        c.env("UCX_TLS", case.tls)
            .env("UCX_NET_DEVICES", format!("{dev}:1"));
        c
    };
    let mut server = Proc::spawn(&format!("{name} server"), ucx((pair.server)(&sargs)));
    let start = Instant::now();
    let client = loop {
        let c = ucx((pair.client)(&cargs));
        let o = Proc::spawn(&format!("{name} client"), c).wait(LIMIT);
        // UCX logs to stdout.
        let refused = [&o.stdout, &o.stderr]
            .iter()
            .any(|s| String::from_utf8_lossy(s).contains("connect() failed"));
        if o.status.success() || !refused || start.elapsed() > LIMIT {
            break o;
        }
        if server.exited() {
            // It will never listen: what it said is the story.
            let o = server.wait(LIMIT);
            return Err(describe(&format!("{name} server"), &o));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    if !client.status.success() {
        // Its server would wait for a client forever.
        drop(server);
        return Err(describe(&format!("{name} client"), &client));
    }
    let server = server.wait(LIMIT);
    if !server.status.success() {
        return Err(describe(&format!("{name} server"), &server));
    }
    let stdout = String::from_utf8_lossy(&client.stdout);
    match final_row(&stdout) {
        Some((n, f)) if n == ITERS && f.len() == 7 && f.iter().all(|x| *x > 0.0) => Ok(()),
        row => Err(format!(
            "{name}: want a Final row of {ITERS} iterations and seven positive figures, \
             got {row:?}\n{}",
            describe("client", &client)
        )),
    }
}

/// Run every case on `pair`; fails the test naming each case that failed.
fn run_all(dev: &str, pair: &Pair<'_>) {
    let failed: Vec<String> = CASES
        .iter()
        .filter_map(|c| run_case(c, dev, pair).err())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} ucx_perftest runs failed:\n\n{}",
        failed.len(),
        CASES.len(),
        failed.join("\n\n")
    );
}

#[test]
fn ucx_perftest_runs_between_two_processes_on_one_host() {
    require("ucx_perftest", "ucx-utils");
    run_all(
        DEV,
        &Pair {
            server: &exec,
            client: &exec,
            server_addr: "127.0.0.1",
        },
    );
}

#[test]
fn ucx_perftest_runs_between_two_network_namespaces() {
    require("ucx_perftest", "ucx-utils");
    let daemon = Path::new(bin()).with_file_name("softrdmad");
    assert!(
        daemon.is_file(),
        "{} missing: softrdma exec starts the softrdmad beside it (cargo build -p \
         softrdma-daemon, or cargo build --workspace)",
        daemon.display()
    );
    let h = Hosts::new("ux", 9, 1500);
    // Declared after the namespaces: the daemons stop before the namespaces go.
    let a = NsDaemon::start(&h.a, &h.addr_a);
    let b = NsDaemon::start(&h.b, &h.addr_b);
    assert_eq!(
        a.dev, b.dev,
        "one device name for both hosts' UCX_NET_DEVICES"
    );
    let server = |args: &[&str]| in_ns(&h.a, &a.socket, args);
    let client = |args: &[&str]| in_ns(&h.b, &b.socket, args);
    run_all(
        &a.dev,
        &Pair {
            server: &server,
            client: &client,
            server_addr: &h.addr_a,
        },
    );
    // Every client came and went; both daemons still serve.
    for d in [&a, &b] {
        let up = abi::client::Client::connect(&d.socket).is_ok();
        assert!(up, "the daemon on {} stopped answering", d.socket.display());
    }
}
