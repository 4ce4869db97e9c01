//! A program blocked in `ibv_get_cq_event` on softrdmad's device when the daemon dies: the
//! wait ends with `ECONNRESET` (the connection hung up) instead of lasting for ever, and
//! `ibv_poll_cq` fails, rather than find an empty ring for ever; `async_fd` wakes and
//! `ibv_get_async_event` gives one `IBV_EVENT_DEVICE_FATAL`, after which `async_fd` is quiet
//! (tests/programs/daemon_gone.c, built against Debian's libibverbs, run on the drop-in).

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{describe, finish, verbs_command, Guard, On, TestDaemon};

#[test]
fn a_program_waiting_on_a_cq_learns_that_softrdmad_died() {
    let prog = common::verbs_program("daemon_gone", &[]);
    let mut d = TestDaemon::start(&["127.0.0.1"]);
    let marker = std::env::temp_dir().join(format!("softrdma-daemon-gone-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let mut c = verbs_command(
        prog.to_str().expect("UTF-8 path"),
        &[marker.to_str().expect("UTF-8 path")],
        On::Daemon {
            daemon: &d,
            addr: "127.0.0.1",
        },
    );
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = Guard(Some(c.spawn().expect("spawn daemon_gone")));
    // The program made the marker right before blocking: then the daemon dies.
    let until = Instant::now() + Duration::from_secs(30);
    while !marker.exists() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    d.kill();
    let (o, timed_out) = finish(child, Duration::from_secs(30));
    let _ = std::fs::remove_file(&marker);
    assert!(
        !timed_out,
        "the program still waited 30 s after the daemon died: {}",
        describe(&o)
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("DAEMON GONE OK"),
        "{}",
        describe(&o)
    );
}
