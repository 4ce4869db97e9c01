//! Helpers for running the Debian verbs programs on the drop-in library.

#![allow(dead_code)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The built `libibverbs.so`: the newest of target/<profile>/libibverbs.so (`cargo build`)
/// and target/<profile>/deps/libibverbs.so (what `cargo test` builds for the tests, not
/// copied up).
pub fn built_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let profile_dir = deps.parent().expect("target/<profile>");
    let newest = [
        profile_dir.join("libibverbs.so"),
        deps.join("libibverbs.so"),
    ]
    .into_iter()
    .filter_map(|p| {
        let t = std::fs::metadata(&p).and_then(|m| m.modified()).ok()?;
        Some((t, p))
    })
    .max();
    match newest {
        Some((_, p)) => p,
        None => panic!("libibverbs.so not built under {}", profile_dir.display()),
    }
}

/// A folder holding the library as `libibverbs.so.1`, for `LD_LIBRARY_PATH` (made once per
/// test process).
pub fn library_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("softrdma-ibverbs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create library dir");
        let link = dir.join("libibverbs.so.1");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(built_library(), &link).expect("symlink libibverbs.so.1");
        dir
    })
    .clone()
}

fn on_path(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Make sure `prog` is installed, installing Debian `package` with apt-get if not.
pub fn require(prog: &str, package: &str) {
    if on_path(prog) {
        return;
    }
    let st = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status();
    assert!(
        on_path(prog),
        "{prog} missing and `apt-get install {package}` did not provide it ({st:?})"
    );
}

/// A UDP port free right now on every loopback address (the devices bind it).
pub fn free_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("bind udp");
    s.local_addr().expect("addr").port()
}

/// A TCP port free right now (the programs' connection exchange).
pub fn free_tcp_port() -> u16 {
    let s = std::net::TcpListener::bind("0.0.0.0:0").expect("bind tcp");
    s.local_addr().expect("addr").port()
}

/// `prog args` with the drop-in library and the device on `addr`:`port`.
pub fn verbs_command(prog: &str, args: &[&str], addr: &str, port: u16) -> Command {
    let mut c = Command::new(prog);
    c.args(args)
        .env("LD_LIBRARY_PATH", library_dir())
        .env("SOFTRDMA_ADDR", addr)
        .env("SOFTRDMA_PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Kills the child when dropped (a failing test leaves no program behind).
pub struct Guard(pub Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Wait for the child at most `limit`, then collect its output (killed if it overran).
pub fn finish(mut g: Guard, limit: Duration) -> (Output, bool) {
    let mut child = g.0.take().expect("child present");
    // Drain the pipes on threads so a chatty program never blocks on a full pipe.
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let t1 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let t2 = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if start.elapsed() > limit {
            timed_out = true;
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = t1.join().unwrap_or_default();
    let stderr = t2.join().unwrap_or_default();
    (
        Output {
            status,
            stdout,
            stderr,
        },
        timed_out,
    )
}

/// Run to completion with a time limit.
pub fn run(mut c: Command, limit: Duration) -> Output {
    let g = Guard(Some(c.spawn().expect("spawn")));
    let (o, timed_out) = finish(g, limit);
    assert!(!timed_out, "timed out: {}", describe(&o));
    o
}

/// Exit status and both streams, for failure messages.
pub fn describe(o: &Output) -> String {
    format!(
        "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Run a two-process program (server on 127.0.0.1, client on 127.0.0.2, both devices on one
/// fresh UDP port) and return (server, client) output. The client is retried while the
/// server is not yet listening on its TCP port.
pub fn server_client(
    prog: &str,
    server_args: &[&str],
    client_args: &[&str],
    limit: Duration,
) -> (Output, Output) {
    let udp = free_udp_port();
    let server = Guard(Some(
        verbs_command(prog, server_args, "127.0.0.1", udp)
            .spawn()
            .expect("spawn server"),
    ));
    let start = Instant::now();
    let client = loop {
        let o = run(verbs_command(prog, client_args, "127.0.0.2", udp), limit);
        let err = String::from_utf8_lossy(&o.stderr).to_lowercase();
        let not_listening = !o.status.success()
            && (err.contains("couldn't connect")
                || err.contains("unable to open file descriptor")
                || err.contains("connection refused")
                || err.contains("failed to connect"));
        if not_listening && start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        break o;
    };
    let (server, timed_out) = finish(server, limit);
    assert!(
        !timed_out,
        "server timed out: {}\nclient: {}",
        describe(&server),
        describe(&client)
    );
    (server, client)
}
