//! What the tests of `softrdma exec` share: a `softrdmad` served from the test process on a
//! control socket of its own (one device, [`DEV`], on 127.0.0.1), the drop-ins this
//! `cargo test` built, `softrdma exec` on them, and the Debian programs the tests run. Used
//! beside `tools` (as `crate::tools`).

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};

use daemon::host::{Device, DeviceConfig};
use daemon::memory::SharedRegions;
use daemon::server::{self, Daemon, Stats};

use crate::tools::{scratch, softrdma};

/// The test daemon's device.
pub const DEV: &str = "srxe0";

/// The daemon of this test process: its control socket and UDP port.
pub fn test_daemon() -> &'static (PathBuf, u16) {
    static D: OnceLock<(PathBuf, u16)> = OnceLock::new();
    D.get_or_init(|| {
        let regions = SharedRegions::default();
        // A port found free can be taken by another test before the device binds it.
        for _ in 0..20 {
            let port = std::net::UdpSocket::bind("127.0.0.1:0")
                .and_then(|s| s.local_addr())
                .expect("free udp port")
                .port();
            let config = DeviceConfig {
                name: DEV.into(),
                addrs: vec!["127.0.0.1".parse().unwrap()],
                port,
                remote_port: port,
                ..Default::default()
            };
            let Ok(dev) = Device::start(config, regions.clone()) else {
                continue;
            };
            let socket = scratch(&format!("exec-{}.sock", std::process::id()));
            let listener = server::bind_control_socket(&socket).expect("control socket");
            let daemon = Arc::new(Daemon {
                devices: vec![dev],
                regions,
                stats: Stats::default(),
            });
            std::thread::spawn(move || server::serve(daemon, listener));
            return (socket, port);
        }
        panic!("no UDP port free for the test daemon");
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
