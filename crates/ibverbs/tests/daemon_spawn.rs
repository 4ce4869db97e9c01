//! With no daemon on the control socket, the drop-in starts the `softrdmad` that sits next to
//! it (as `cargo build` leaves them in `target/<profile>`), so `LD_LIBRARY_PATH=target/release
//! ibv_devinfo` works with nothing else set up.

mod common;

use std::time::{Duration, Instant};

use common::{built_library, daemon_binary, describe, free_udp_port, require, run};
use softrdma::{BackendKind, Device};

/// Stops the started daemon (found by its pid) when the test ends, however it ends.
struct Stop(Option<u32>);

impl Drop for Stop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            // SAFETY: a plain signal to the daemon this test started.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

#[test]
fn a_missing_daemon_is_started_from_next_to_the_library() {
    require("ibv_devices", "ibverbs-utils");
    let dir = std::env::temp_dir().join(format!("softrdma-ibverbs-spawn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(built_library(), dir.join("libibverbs.so.1")).unwrap();
    std::os::unix::fs::symlink(daemon_binary(), dir.join("softrdmad")).unwrap();
    let socket = dir.join("softrdmad.sock");
    let port = free_udp_port();
    let mut c = std::process::Command::new("ibv_devices");
    c.env("LD_LIBRARY_PATH", &dir)
        .env("SOFTRDMA_BACKEND", "daemon")
        .env("SOFTRDMA_DAEMON_SOCKET", &socket)
        .env(
            "SOFTRDMA_DAEMON_ARGS",
            format!("--addr 127.0.0.1 --port {port}"),
        )
        .env_remove("SOFTRDMA_DAEMON_SPAWN")
        .env_remove("SOFTRDMA_DAEMON_BIN")
        .env_remove("SOFTRDMA_DEVICE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let o = run(c, Duration::from_secs(60));

    // Whatever happened, stop a daemon that came up on the socket.
    let mut stop = Stop(None);
    let dev = Device::builder("127.0.0.1".parse().unwrap())
        .backend(BackendKind::Daemon)
        .daemon_socket(&socket)
        .spawn_daemon(false)
        .open();
    if let Ok(d) = &dev {
        stop.0 = d.daemon_info().map(|(_, pid)| pid);
    }
    assert!(o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("srxe0"), "{}", describe(&o));
    let dev = dev.expect("the started daemon answers on its socket");
    assert_eq!(dev.local_addr().port(), port);
    drop(dev);
    let pid = stop.0.expect("daemon pid");
    // SAFETY: a plain signal to the daemon this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
