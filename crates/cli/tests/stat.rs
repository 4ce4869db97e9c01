//! `softrdma stat` against a running daemon: the counters it prints are the daemon's own,
//! and follow what a client did; without a daemon it fails with a clear message.

mod tools;

use std::process::Command;

use abi::client::Client;

/// A daemon served from this test process on a temp socket, with one device on 127.0.0.1.
fn start_daemon(dir: &std::path::Path) -> std::path::PathBuf {
    let socket = dir.join("softrdmad.sock");
    tools::serve_daemon(&[("srxetest0".into(), "127.0.0.1")], &socket);
    socket
}

fn stat(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("stat")
        .args(args)
        .env_remove("SOFTRDMA_DAEMON_SOCKET")
        .output()
        .expect("run softrdma stat")
}

/// Name → value of every `name value` line.
fn table(out: &std::process::Output) -> Vec<(String, u64)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next().expect("name").to_string();
            let value = f.next().expect("value").parse().expect("number");
            assert!(f.next().is_none(), "extra column in {l:?}");
            (name, value)
        })
        .collect()
}

fn value(t: &[(String, u64)], name: &str) -> u64 {
    t.iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no {name} in {t:?}"))
        .1
}

#[test]
fn stat_shows_what_clients_did() {
    let dir = tempfile::tempdir().unwrap();
    let socket = start_daemon(dir.path());
    let sock = socket.to_str().unwrap();

    let mut client = Client::connect(&socket).expect("connect");
    let pds = [client.alloc_pd(0).unwrap(), client.alloc_pd(0).unwrap()];
    // A handle this connection never got: refused and counted.
    let bogus = pds.iter().max().unwrap() + 1000;
    assert!(client.dealloc_pd(bogus).is_err());

    let out = stat(&["--socket", sock]);
    assert!(out.status.success(), "{out:?}");
    let t = table(&out);
    assert_eq!(value(&t, "live_pds"), 2);
    assert_eq!(value(&t, "foreign_handles"), 1);
    // This client plus the stat command itself.
    assert!(value(&t, "connections_accepted") >= 2);
    assert!(
        t.iter().any(|(n, _)| n.starts_with("srxetest0.")),
        "no device counters in {t:?}"
    );

    // The filter keeps only matching names; --nonzero drops zeros.
    let out = stat(&["--socket", sock, "--filter", "live_"]);
    let t = table(&out);
    assert!(!t.is_empty() && t.iter().all(|(n, _)| n.contains("live_")));
    let out = stat(&["--socket", sock, "--nonzero"]);
    let t = table(&out);
    assert!(t.iter().all(|(_, v)| *v != 0));
    assert_eq!(value(&t, "live_pds"), 2);

    // Freed objects leave the live counters.
    client.dealloc_pd(pds[0]).unwrap();
    let t = table(&stat(&["--socket", sock, "--filter", "live_pds"]));
    assert_eq!(t, vec![("live_pds".to_string(), 1)]);
}

#[test]
fn stat_without_a_daemon_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nobody-here.sock");
    let out = stat(&["--socket", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach softrdmad") && err.contains("nobody-here.sock"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}
