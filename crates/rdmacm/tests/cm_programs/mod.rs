//! The unmodified Debian rdma_cm programs as server and client, and what each run must show:
//! both exit statuses and what the programs print about the data they moved. Where the two
//! sides run is the caller's [`Sides`]: one host (programs.rs) or two network namespaces
//! (netns.rs). Included beside `common` and `rdmacm_lib` (used as `crate::common` and
//! `crate::rdmacm_lib`).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::common::{
    c_program, describe, finish, finish_server, free_tcp_port, library_dir, perftest_clock_failed,
    require, run, threads_of, too_early, Guard, TooEarly,
};
use crate::rdmacm_lib;

/// How long one side of a program may take.
pub const LIMIT: Duration = Duration::from_secs(60);

/// Where the two sides of a program run.
pub trait Sides {
    /// `prog args` on the server's side, the drop-ins on its device, its output piped.
    fn server(&self, prog: &str, args: &[&str]) -> Command;
    /// `prog args` on the client's side, likewise.
    fn client(&self, prog: &str, args: &[&str]) -> Command;
    /// The address the client connects to.
    fn server_addr(&self) -> &str;
    /// The address of the client's device (what it binds where a program asks for one).
    fn client_addr(&self) -> &str;
    /// Fails the test if a daemon the sides use has exited (it must outlive every program).
    fn assert_alive(&mut self);
    /// How many services the server's device listens on now, where that can be read (a
    /// daemon's `cm_listens`); `None` on an embedded device.
    fn server_listens(&self) -> Option<u64>;
    /// What the sides recorded of the run so far (their packet captures, decoded), for the
    /// message of a failure; empty where they record nothing.
    fn evidence(&self) -> String {
        String::new()
    }
}

/// Stands for the rdma_cm port in a program's arguments: [`pair`] puts a free port there, a
/// new one whenever it starts the server again.
pub const PORT: &str = "{port}";

/// `args` with [`PORT`] replaced by `port`.
fn on_port<'a>(args: &[&'a str], port: &'a str) -> Vec<&'a str> {
    args.iter()
        .map(|&a| if a == PORT { port } else { a })
        .collect()
}

/// Wait until the number of services the server's device listens on satisfies `done`, the
/// server (if given) exits, or [`LIMIT`] passes; at once where the number cannot be read.
fn await_listens(sides: &impl Sides, mut server: Option<&mut Guard>, done: impl Fn(u64) -> bool) {
    let start = Instant::now();
    while let Some(n) = sides.server_listens() {
        let exited = server
            .as_mut()
            .and_then(|g| g.0.as_mut())
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        if done(n) || exited || start.elapsed() > LIMIT {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Run `prog` as server and client (`prog` is `server+client` when the two sides are two
/// programs), [`PORT`] in their arguments replaced by the port; while the client failed
/// only because it came too early ([`TooEarly`]), both run again, and so they do (twice at
/// most) when perftest could not calibrate its clock (`perftest_clock_failed`). A server
/// that serves until killed (`server_exits` false) must still be running at the end.
/// Returns (server, client).
pub fn pair(
    sides: &mut impl Sides,
    prog: &str,
    server_args: &[&str],
    client_args: &[&str],
    server_exits: bool,
) -> (Output, Output) {
    rdmacm_lib::install_beside(&library_dir());
    let (server_prog, client_prog) = prog.split_once('+').unwrap_or((prog, prog));
    let start = Instant::now();
    // A pair whose perftest could not calibrate its clock runs again, twice at most.
    let mut clock_retries = 0;
    loop {
        let (server, client) = 'server: loop {
            let port = free_tcp_port().to_string();
            // Where the listens can be read, the client starts only once the server listens.
            // Retrying is not enough: ucmatose -c 2 too early may have its first REQ rejected
            // and its second accepted; its exit then rejects that one (REJ, timeout), and the
            // server's rdma_accept fails with EINVAL, as over the kernel's CM. A previous
            // server's listens go first.
            await_listens(sides, None, |n| n == 0);
            let mut server = Guard(Some(
                sides
                    .server(server_prog, &on_port(server_args, &port))
                    .spawn()
                    .expect("spawn server"),
            ));
            await_listens(sides, Some(&mut server), |n| n > 0);
            let spawned = sides
                .client(client_prog, &on_port(client_args, &port))
                .spawn()
                .expect("spawn client");
            let (client, timed_out) = finish(Guard(Some(spawned)), LIMIT);
            if timed_out {
                let server_threads = server
                    .0
                    .as_ref()
                    .map_or(String::new(), |c| threads_of(c.id()));
                panic!(
                    "{prog}: the client timed out: {}\nthe server's threads:\n{server_threads}{}",
                    describe(&client),
                    sides.evidence()
                );
            }
            match too_early(&client).filter(|_| start.elapsed() < LIMIT) {
                Some(why) => {
                    let why = match why {
                        TooEarly::ServerNotListening => "the client came before the listen",
                        TooEarly::PerftestServerListenedLate => "the server listened late",
                    };
                    eprintln!("{prog}: {why}, starting both again");
                    std::thread::sleep(Duration::from_millis(200));
                    // The server is killed as its guard goes.
                    continue 'server;
                }
                None => break 'server (server, client),
            }
        };
        let server = if server_exits {
            finish_server(prog, server, LIMIT, &client)
        } else {
            let (o, _) = finish(server, Duration::from_millis(300));
            o
        };
        if (perftest_clock_failed(&server) || perftest_clock_failed(&client)) && clock_retries < 2 {
            clock_retries += 1;
            eprintln!("{prog}: perftest could not calibrate its clock; starting both again");
            continue;
        }
        sides.assert_alive();
        return (server, client);
    }
}

/// Fails the test unless `o` exited 0.
fn ok(prog: &str, o: &Output, other: &Output) {
    assert!(
        o.status.success(),
        "{prog}: {}\nthe other side: {}",
        describe(o),
        describe(other)
    );
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// rping, three pings; the server binds `bind` (the wildcard listens on every device).
pub fn rping(sides: &mut impl Sides, bind: &str) {
    require("rping", "rdmacm-utils");
    let server = sides.server_addr().to_string();
    let (s, c) = pair(
        sides,
        "rping",
        &["-s", "-v", "-C", "3", "-a", bind, "-p", PORT],
        &["-c", "-v", "-C", "3", "-a", &server, "-p", PORT],
        true,
    );
    ok("rping", &s, &c);
    ok("rping", &c, &s);
    // rping -v prints each ping's data: the client what it read back, the server what it
    // got by RDMA READ from the client.
    for i in 0..3 {
        let line = format!("ping data: rdma-ping-{i}: ");
        assert!(stdout(&c).contains(&line), "rping: {}", describe(&c));
        assert!(
            stdout(&s).contains(&format!("server {line}")),
            "rping: {}",
            describe(&s)
        );
    }
    assert!(
        String::from_utf8_lossy(&s.stderr).contains("DISCONNECT EVENT"),
        "rping: the server saw no DISCONNECTED: {}",
        describe(&s)
    );
}

/// ucmatose, two connections of five messages each way.
/// udaddy: SIDR resolves the server's UD QPs (two), then datagrams both ways (the server
/// answers through address handles made from its completions). It has no port option: it
/// always resolves rdma_cm UDP port 7174 (each test's devices are its own).
pub fn udaddy(sides: &mut impl Sides) {
    require("udaddy", "rdmacm-utils");
    let server = sides.server_addr().to_string();
    let (s, c) = pair(
        sides,
        "udaddy",
        &["-c", "2", "-C", "5"],
        &["-s", &server, "-c", "2", "-C", "5"],
        true,
    );
    ok("udaddy", &s, &c);
    ok("udaddy", &c, &s);
    for o in [&s, &c] {
        let t = stdout(o);
        assert!(
            t.contains("data transfers complete"),
            "udaddy: {}",
            describe(o)
        );
        assert!(t.contains("return status 0"), "udaddy: {}", describe(o));
    }
}

pub fn ucmatose(sides: &mut impl Sides) {
    require("ucmatose", "rdmacm-utils");
    let server = sides.server_addr().to_string();
    let (s, c) = pair(
        sides,
        "ucmatose",
        &["-p", PORT, "-c", "2", "-C", "5"],
        &["-s", &server, "-p", PORT, "-c", "2", "-C", "5"],
        true,
    );
    ok("ucmatose", &s, &c);
    ok("ucmatose", &c, &s);
    for o in [&s, &c] {
        let t = stdout(o);
        assert!(
            t.contains("data transfers complete"),
            "ucmatose: {}",
            describe(o)
        );
        assert!(t.contains("return status 0"), "ucmatose: {}", describe(o));
    }
    // The server disconnects and waits for both DISCONNECTED events.
    assert!(
        stdout(&s).contains("disconnected"),
        "ucmatose: {}",
        describe(&s)
    );
}

/// rdma_server and rdma_client: one message each way on an endpoint (`rdma_create_ep`).
pub fn rdma_server_client(sides: &mut impl Sides) {
    require("rdma_server", "rdmacm-utils");
    let server = sides.server_addr().to_string();
    let (s, c) = pair(
        sides,
        "rdma_server+rdma_client",
        &["-p", PORT],
        &["-s", &server, "-p", PORT],
        true,
    );
    ok("rdma_server", &s, &c);
    ok("rdma_client", &c, &s);
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

/// cmtime: the client connects and disconnects 20 ids and prints its table.
pub fn cmtime(sides: &mut impl Sides) {
    require("cmtime", "rdmacm-utils");
    let server = sides.server_addr().to_string();
    // Debian's cmtime server serves until killed.
    let (s, c) = pair(
        sides,
        "cmtime",
        &["-p", PORT, "-c", "20"],
        &["-s", &server, "-p", PORT, "-c", "20"],
        false,
    );
    ok("cmtime", &c, &s);
    let t = stdout(&c);
    for step in [
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
    ] {
        assert!(t.contains(step), "cmtime: no {step} row: {}", describe(&c));
    }
    // Still serving (killed by the test), not crashed.
    assert!(
        s.status.code().is_none(),
        "cmtime: the server exited: {}",
        describe(&s)
    );
}

/// mckey: a receiver on the server's side joins `group` and waits for 5 datagrams; senders
/// on the client's side (each joins, sends 5, leaves) run until it has them all (what a
/// sender sends before the receiver joined is lost, as on a network). Each binds its own
/// device's address.
pub fn mckey(sides: &mut impl Sides, group: &str) {
    require("mckey", "rdmacm-utils");
    rdmacm_lib::install_beside(&library_dir());
    let server = sides.server_addr().to_string();
    let client = sides.client_addr().to_string();
    let mut receiver = Guard(Some(
        sides
            .server("mckey", &["-m", group, "-b", &server, "-C", "5"])
            .spawn()
            .expect("spawn receiver"),
    ));
    let start = Instant::now();
    let mut senders = 0;
    let sender = loop {
        let sender = run(
            sides.client("mckey", &["-m", group, "-b", &client, "-C", "5", "-s"]),
            LIMIT,
        );
        senders += 1;
        let child = receiver.0.as_mut().expect("running");
        if child.try_wait().expect("wait").is_some() || start.elapsed() > LIMIT {
            break sender;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let (r, timed_out) = finish(receiver, Duration::from_secs(5));
    assert!(
        !timed_out,
        "mckey: the receiver never got its datagrams ({senders} senders ran): {}\nthe last sender: {}",
        describe(&r),
        describe(&sender)
    );
    ok("mckey", &r, &sender);
    ok("mckey", &sender, &r);
    let joined = format!("joined dgid: ::ffff:{group}");
    for o in [&r, &sender] {
        let t = stdout(o);
        assert!(t.contains(&joined), "mckey: {}", describe(o));
        assert!(t.contains("return status 0"), "mckey: {}", describe(o));
    }
    // Printed once the receiver has all 5 (after "receiving data transfers").
    let t = stdout(&r);
    assert!(
        t.contains("receiving data transfers") && t.contains("data transfers complete"),
        "mckey: {}",
        describe(&r)
    );
    sides.assert_alive();
}

/// perftest's result row: first column the message size, second the iteration count.
fn has_row(o: &Output, size: &str, iters: &str) -> bool {
    stdout(o).lines().any(|l| {
        let mut f = l.split_whitespace();
        f.next() == Some(size) && f.next() == Some(iters)
    })
}

/// A perftest program with `-R` (connected by rdma_cm), 50 iterations; the client prints
/// its result row for messages of `size` bytes.
pub fn perftest(sides: &mut impl Sides, prog: &str, size: &str) {
    require(prog, "perftest");
    let server = sides.server_addr().to_string();
    let (s, c) = pair(
        sides,
        prog,
        &["-R", "-n", "50", "-p", PORT],
        &["-R", "-n", "50", "-p", PORT, &server],
        true,
    );
    ok(prog, &s, &c);
    ok(prog, &c, &s);
    assert!(
        has_row(&c, size, "50"),
        "{prog}: no result row: {}",
        describe(&c)
    );
}

/// `tests/programs/{name}.c`, compiled once per test process against Debian's librdmacm
/// and libibverbs (the drop-ins replace both at run time).
fn test_program(name: &'static str) -> PathBuf {
    static BINS: Mutex<BTreeMap<&str, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut bins = BINS.lock().unwrap_or_else(|p| p.into_inner());
    bins.entry(name)
        .or_insert_with(|| {
            let src = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/programs")
                .join(format!("{name}.c"));
            c_program(
                &src,
                &["-lrdmacm", "-libverbs"],
                ("/usr/include/rdma/rdma_cma.h", "librdmacm-dev"),
            )
        })
        .clone()
}

/// A connection whose QPs the programs move themselves (`tests/programs/managed_qp.c`:
/// QPs from `ibv_create_qp`, `conn_param.qp_num`, every transition from
/// `rdma_init_qp_attr`, CONNECT_RESPONSE answered with `rdma_establish`), one SEND each
/// way, then a disconnect both sides see, and the end of its time-wait (both print
/// "done" only after TIMEWAIT_EXIT).
pub fn managed_qp(sides: &mut impl Sides) {
    let bin = test_program("managed_qp");
    let bin = bin.to_str().expect("a UTF-8 temporary path");
    let server = sides.server_addr().to_string();
    let (s, c) = pair(
        sides,
        bin,
        &["-s", "-p", PORT],
        &["-c", "-a", &server, "-p", PORT],
        true,
    );
    ok("managed_qp", &s, &c);
    ok("managed_qp", &c, &s);
    let (st, ct) = (stdout(&s), stdout(&c));
    assert!(
        st.contains("received: ping from the client") && st.contains("server: done"),
        "managed_qp: {}",
        describe(&s)
    );
    assert!(
        ct.contains("received: pong from the server") && ct.contains("client: done"),
        "managed_qp: {}",
        describe(&c)
    );
    // Each side's RTR names the other's QP, and each sends from the PSN the other expects.
    let field = |t: &str, key: &str| -> u64 {
        let at = t.find(key).unwrap_or_else(|| panic!("no {key} in {t}")) + key.len();
        t[at..]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no number after {key} in {t}"))
    };
    let (s_qp, c_qp) = (field(&st, "local QP "), field(&ct, "local QP "));
    assert_eq!(field(&st, "request from QP "), c_qp);
    assert_eq!(field(&st, "dest_qp_num "), c_qp);
    assert_eq!(field(&ct, "response from QP "), s_qp);
    assert_eq!(field(&ct, "dest_qp_num "), s_qp);
    assert_eq!(field(&st, "sq_psn "), field(&ct, "rq_psn "));
    assert_eq!(field(&ct, "sq_psn "), field(&st, "rq_psn "));
}

/// ECE between two rdma_cm programs (`tests/programs/ece.c`, ids without a QP as rdma-core
/// requires): the client's `rdma_set_local_ece` reaches the server's `rdma_get_remote_ece`
/// in the REQ, the server's options come back in the REP with the REQ's vendor ID, and a
/// second request refused with `rdma_reject_ece` is REJECTED with status 35 at the client.
pub fn ece(sides: &mut impl Sides) {
    let bin = test_program("ece");
    let bin = bin.to_str().expect("a UTF-8 temporary path");
    let server = sides.server_addr().to_string();
    let (s, c) = pair(
        sides,
        bin,
        &["-s", "-p", PORT],
        &["-c", "-a", &server, "-p", PORT],
        true,
    );
    ok("ece", &s, &c);
    ok("ece", &c, &s);
    let (st, ct) = (stdout(&s), stdout(&c));
    for (out, want) in [
        (
            &st,
            "request ece: vendor 0x00c0de options 0x5eed0001 comp_mask 0",
        ),
        (
            &st,
            "second request ece: vendor 0x00c0de options 0xbad comp_mask 0",
        ),
        (&st, "ece server: done"),
        (
            &ct,
            "ece before the answer: vendor 0x000000 options 0x0 comp_mask 0",
        ),
        (&ct, "reply ece: vendor 0x00c0de options 0xacce comp_mask 0"),
        (&ct, "second connection refused: status 35"),
        (&ct, "ece client: done"),
    ] {
        assert!(
            out.contains(want),
            "ece: no \"{want}\" in\nserver: {}\nclient: {}",
            describe(&s),
            describe(&c)
        );
    }
}
