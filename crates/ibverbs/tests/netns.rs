//! The unmodified Debian verbs programs between two hosts: two network namespaces joined by a
//! veth pair with the usual 1500-byte MTU, the server in one and the client in the other,
//! each with the drop-in library on the `softrdmad` of its namespace (one daemon per host,
//! serving the namespace's address on UDP 4791).
//!
//! Needs root (`ip netns`, as CI runs); without it the test FAILS saying so.

mod common;
#[path = "../../cli/tests/hosts/mod.rs"]
mod hosts;
mod netns_host;

use std::process::Output;
use std::time::{Duration, Instant};

use common::{describe, finish, free_tcp_port, perftest_clock_failed, require, Guard};
use hosts::Hosts;
use netns_host::Host;

const LIMIT: Duration = Duration::from_secs(120);

/// Server on host a, client on host b (retried while the server is not listening yet);
/// both must exit 0, and both daemons must still run. Returns (server, client). A pair whose
/// perftest could not calibrate its clock runs again (see `perftest_clock_failed`), twice at
/// most.
fn run_pair(a: &mut Host, b: &mut Host, prog: &str, args: &[&str]) -> (Output, Output) {
    let mut tries = 0;
    loop {
        let (server, client, timed_out) = attempt_pair(a, b, prog, args);
        if !timed_out
            && (perftest_clock_failed(&server) || perftest_clock_failed(&client))
            && tries < 2
        {
            tries += 1;
            eprintln!("{prog}: perftest could not calibrate its clock; running the pair again");
            continue;
        }
        let both = || {
            format!(
                "server: {}\nclient: {}",
                describe(&server),
                describe(&client)
            )
        };
        assert!(!timed_out, "{prog} server timed out: {}", both());
        assert!(server.status.success(), "{prog}: {}", both());
        assert!(client.status.success(), "{prog}: {}", both());
        a.daemon.assert_alive();
        b.daemon.assert_alive();
        return (server, client);
    }
}

/// One run of the pair: (server, client, whether the server timed out).
fn attempt_pair(a: &mut Host, b: &mut Host, prog: &str, args: &[&str]) -> (Output, Output, bool) {
    let port = free_tcp_port().to_string();
    let mut sargs = args.to_vec();
    sargs.extend_from_slice(&["-p", &port]);
    let mut cargs = sargs.clone();
    cargs.push(a.addr);
    let server = Guard(Some(a.command(prog, &sargs).spawn().expect("spawn server")));
    let start = Instant::now();
    let client = loop {
        let g = Guard(Some(b.command(prog, &cargs).spawn().expect("spawn client")));
        let (o, timed_out) = finish(g, LIMIT);
        assert!(!timed_out, "{prog} client timed out: {}", describe(&o));
        let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
        let not_listening = !o.status.success()
            && (err.contains("couldn't connect") || err.contains("unable to open file descriptor"));
        if not_listening && start.elapsed() < LIMIT {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        break o;
    };
    let (server, timed_out) = finish(server, LIMIT);
    (server, client, timed_out)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn verbs_programs_run_between_two_network_namespaces() {
    require("ibv_rc_pingpong", "ibverbs-utils");
    require("ib_write_bw", "perftest");
    let h = Hosts::new("vb", 3, 1500);
    // Declared after the namespaces: the daemons are killed before the namespaces go.
    let mut a = Host::new(&h.a, &h.addr_a);
    let mut b = Host::new(&h.b, &h.addr_b);

    // The pingpongs, data checked (-c) where the program offers it; GID index 0 is the
    // namespace's IPv4 address.
    for (prog, size) in [
        ("ibv_rc_pingpong", "4096"),
        ("ibv_uc_pingpong", "4096"),
        ("ibv_ud_pingpong", "1024"),
        ("ibv_srq_pingpong", "4096"),
    ] {
        let mut args = vec!["-g", "0", "-n", "100", "-s", size];
        if prog != "ibv_srq_pingpong" {
            args.push("-c");
        }
        let (s, c) = run_pair(&mut a, &mut b, prog, &args);
        for o in [&s, &c] {
            let text = stdout(o);
            assert!(text.contains("iters in "), "{prog}: {}", describe(o));
        }
        assert!(
            stdout(&c).contains(&format!("GID ::ffff:{}", h.addr_b)),
            "{prog}: {}",
            describe(&c)
        );
    }

    // perftest at its default sizes: each prints its result row on the client. The port
    // reports the MTU the 1500-byte link carries, so no packet is too big for the veth.
    for (prog, size) in [
        ("ib_write_bw", "65536"),
        ("ib_read_bw", "65536"),
        ("ib_send_bw", "65536"),
        ("ib_atomic_bw", "8"),
        ("ib_write_lat", "2"),
        ("ib_read_lat", "2"),
        ("ib_send_lat", "2"),
        ("ib_atomic_lat", "8"),
    ] {
        let (_, c) = run_pair(&mut a, &mut b, prog, &["-n", "200"]);
        let text = stdout(&c);
        let row = text.lines().find(|l| {
            let mut f = l.split_whitespace();
            f.next() == Some(size) && f.next() == Some("200")
        });
        assert!(row.is_some(), "{prog}: no result row: {}", describe(&c));
        assert!(
            text.contains("Link type       : Ethernet"),
            "{prog}: {}",
            describe(&c)
        );
    }
}
