//! What the tests of `softrdma exec` share: a `softrdmad` served from the test process on a
//! control socket of its own (one device, [`DEV`], on 127.0.0.1), the drop-ins this
//! `cargo test` built, `softrdma exec` on them, the Debian programs the tests run, and a
//! `softrdmad` of a network namespace's own ([`NsDaemon`]). Used beside `tools` and `hosts`
//! (as `crate::tools`, `crate::hosts`).

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::hosts::Hosts;
use crate::tools::{bin, scratch, serve_daemon, softrdma, Proc};

/// How long a `softrdma exec` that only starts a daemon may take.
const START_LIMIT: Duration = Duration::from_secs(120);

/// The test daemon's device.
pub const DEV: &str = "srxe0";

/// The daemon of this test process: its control socket and UDP port.
pub fn test_daemon() -> &'static (PathBuf, u16) {
    static D: OnceLock<(PathBuf, u16)> = OnceLock::new();
    D.get_or_init(|| {
        let socket = scratch(&format!("exec-{}.sock", std::process::id()));
        let port = serve_daemon(&[(DEV.into(), "127.0.0.1")], &socket);
        (socket, port)
    })
}

/// A folder holding the drop-ins under their sonames: links to the `.so.1` links the build
/// scripts leave beside the libraries this `cargo test` built (target/<profile>/deps).
pub fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable");
        let deps = exe.parent().expect("target/<profile>/deps");
        let dir = scratch(&format!("exec-libs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the library folder");
        for so in ["libibverbs.so.1", "librdmacm.so.1"] {
            let built = deps.join(so);
            assert!(
                built.is_file(),
                "{} missing: the build script of the drop-in should link it",
                built.display()
            );
            let link = dir.join(so);
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&built, &link).expect("link the drop-in");
        }
        dir
    })
    .clone()
}

/// The arguments of `softrdma exec --lib-dir <the drop-ins> -- PROGRAM ARGS`.
pub fn exec_args(program: &[&str]) -> Vec<String> {
    let dir = lib_dir();
    let mut v: Vec<String> = ["exec", "--lib-dir", dir.to_str().expect("utf-8 path"), "--"]
        .map(String::from)
        .into();
    v.extend(program.iter().map(|a| a.to_string()));
    v
}

/// Point `c` (a `softrdma exec`) at the daemon on `socket`, started there when none
/// answers if `spawn`, whatever the caller's environment says.
pub fn on_daemon(c: &mut Command, socket: &Path, spawn: bool) {
    c.env("SOFTRDMA_DAEMON_SOCKET", socket)
        .env("SOFTRDMA_DAEMON_SPAWN", if spawn { "1" } else { "0" })
        .env_remove("SOFTRDMA_DAEMON_ARGS")
        .env_remove("SOFTRDMA_DAEMON_BIN")
        .env_remove("SOFTRDMA_BACKEND")
        .env_remove("SOFTRDMA_DEVICE");
}

/// `softrdma exec --lib-dir <the drop-ins> -- PROGRAM ARGS` on the test daemon.
pub fn exec(program: &[&str]) -> Command {
    let args = exec_args(program);
    let mut c = softrdma(&args.iter().map(String::as_str).collect::<Vec<_>>());
    on_daemon(&mut c, &test_daemon().0, false);
    c
}

/// Make sure `prog` is installed, installing Debian `package` with apt-get if not.
pub fn require(prog: &str, package: &str) {
    let on_path = || {
        Command::new("sh")
            .args(["-c", &format!("command -v {prog}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if on_path() {
        return;
    }
    let st = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status();
    assert!(
        on_path(),
        "{prog} missing and `apt-get install {package}` did not provide it ({st:?})"
    );
}

pub fn describe(what: &str, o: &Output) -> String {
    format!(
        "{what} ({}):\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The `softrdmad` that `softrdma exec` started in a network namespace, stopped on drop.
pub struct NsDaemon {
    pub socket: PathBuf,
    pid: Option<u32>,
    /// The device serving the namespace's address.
    pub dev: String,
}

impl NsDaemon {
    /// Run a program under `softrdma exec` in `ns` with no daemon on the control socket, as
    /// a user's first program does: exec starts one, in the namespace. It must serve `addr`.
    pub fn start(ns: &str, addr: &str) -> NsDaemon {
        let socket = scratch(&format!("exec-{ns}.sock"));
        let _ = std::fs::remove_file(&socket);
        let o = Proc::spawn(
            &format!("softrdma exec in {ns}"),
            in_ns(ns, &socket, &["true"]),
        )
        .wait(START_LIMIT);
        // Whatever happened, a daemon that answers is ours to stop.
        let client = abi::client::Client::connect(&socket);
        let mut d = NsDaemon {
            pid: client.as_ref().ok().map(|c| c.daemon_pid()),
            socket,
            dev: String::new(),
        };
        assert!(o.status.success(), "{}", describe("softrdma exec true", &o));
        let devices = client
            .and_then(|mut c| c.list_devices())
            .unwrap_or_else(|e| panic!("no daemon answers on {}: {e}", d.socket.display()));
        let ip: std::net::IpAddr = addr.parse().expect("an IP address");
        d.dev = devices
            .iter()
            .find(|x| x.addrs.contains(&ip))
            .unwrap_or_else(|| {
                panic!("the daemon exec started in {ns} serves no {addr}: {devices:?}")
            })
            .name
            .clone();
        d
    }
}

impl Drop for NsDaemon {
    fn drop(&mut self) {
        let Some(pid) = self.pid else { return };
        let pid = pid.to_string();
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
        };
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let t0 = Instant::now();
        while !gone() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !gone() {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// `softrdma exec -- PROGRAM` in namespace `ns`, on the daemon at `socket` (started when
/// none answers).
pub fn in_ns(ns: &str, socket: &Path, program: &[&str]) -> Command {
    let args = exec_args(program);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut c = Hosts::exec(ns, bin(), &args);
    on_daemon(&mut c, socket, true);
    c
}
