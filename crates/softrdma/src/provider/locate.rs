//! Finding the host daemon, and starting one: the control socket, the probe the implicit
//! choice of a backend makes, and the start of a missing `softrdmad`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use abi::client::{Client, ClientError};
use abi::proto::DeviceInfo;

use super::BACKEND_ENV;
use crate::{Error, Result};

/// Environment variable turning the start of a missing daemon off (`0`, `no`, `false`, `off`)
/// or on (anything else).
pub const SPAWN_ENV: &str = "SOFTRDMA_DAEMON_SPAWN";
/// Environment variable naming the `softrdmad` binary to start.
pub const DAEMON_BIN_ENV: &str = "SOFTRDMA_DAEMON_BIN";
/// Environment variable with extra arguments (split at whitespace) for a started daemon,
/// e.g. `--addr 127.0.0.1 --port 4791`.
pub const DAEMON_ARGS_ENV: &str = "SOFTRDMA_DAEMON_ARGS";
pub use abi::client::SOCKET_ENV;

/// Whether a missing daemon may be started: `$SOFTRDMA_DAEMON_SPAWN`, default yes.
pub(crate) fn spawn_from_env() -> bool {
    std::env::var(SPAWN_ENV).map_or(true, |v| spawn_allowed(&v))
}

fn spawn_allowed(v: &str) -> bool {
    !matches!(
        v.trim().to_ascii_lowercase().as_str(),
        "0" | "no" | "false" | "off"
    )
}

/// How to reach (and if need be start) the daemon.
#[derive(Debug, Clone)]
pub(crate) struct DaemonConfig {
    pub(crate) socket: Option<PathBuf>,
    pub(crate) spawn: Option<bool>,
    pub(crate) binary: Option<PathBuf>,
    pub(crate) args: Option<Vec<String>>,
}

impl DaemonConfig {
    /// The control socket: the configured one, else `$SOFTRDMA_DAEMON_SOCKET`, else the
    /// default.
    pub(crate) fn socket_path(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(abi::client::socket_path)
    }
}

/// The device of `devices` serving `addr` (any device when `addr` is `None`).
pub(crate) fn serving(
    devices: Vec<DeviceInfo>,
    addr: Option<std::net::IpAddr>,
) -> Option<DeviceInfo> {
    match addr {
        None => devices.into_iter().next(),
        Some(a) => devices.into_iter().find(|d| d.addrs.contains(&a)),
    }
}

/// What a look at the control socket found, for the implicit choice of a backend.
pub(crate) enum Probe {
    /// No daemon answers: the socket file (or a directory on its path) is missing, or
    /// nothing listens on it (a file a stopped daemon left behind).
    Nobody,
    /// A daemon answered, with these devices; the connection is kept for the open that
    /// follows.
    Answers {
        client: Client,
        devices: Vec<DeviceInfo>,
    },
}

/// Look for a daemon on `socket` without starting one: connect, greet it, list its
/// devices. Only a missing socket or a refused connect means that none answers; a daemon
/// that is there but cannot be used (permissions, another protocol version, a broken
/// answer) is an error, since falling back to an embedded device would then fight it for
/// its addresses.
pub(crate) fn probe(socket: &Path) -> Result<Probe> {
    let unusable = |e: ClientError| Error::NoDaemon {
        socket: socket.to_path_buf(),
        reason: format!(
            "a daemon is there but cannot be used ({e}); choose a backend with \
             {BACKEND_ENV}=embedded or =daemon"
        ),
    };
    let mut client = match Client::connect(socket) {
        Ok(c) => c,
        Err(ClientError::Io(e)) if nobody_listens(&e) => return Ok(Probe::Nobody),
        Err(e) => return Err(unusable(e)),
    };
    let devices = client.list_devices().map_err(unusable)?;
    Ok(Probe::Answers { client, devices })
}

/// Whether a failed connect to a Unix socket means that no daemon is there.
fn nobody_listens(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
    ) || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
}

/// Where to look for `softrdmad`: `$SOFTRDMA_DAEMON_BIN`, the configured path, next to the
/// current executable (and one directory up, for test binaries in `target/*/deps`), then
/// `PATH`.
fn find_daemon_binary(config: &DaemonConfig) -> Option<PathBuf> {
    if let Some(b) = &config.binary {
        return Some(b.clone());
    }
    if let Some(b) = std::env::var_os(DAEMON_BIN_ENV) {
        return Some(PathBuf::from(b));
    }
    let name = "softrdmad";
    if let Ok(exe) = std::env::current_exe() {
        let mut dir = exe.parent();
        for _ in 0..2 {
            if let Some(d) = dir {
                let p = d.join(name);
                if p.is_file() {
                    return Some(p);
                }
                dir = d.parent();
            }
        }
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// How long a started daemon may take to open its socket.
const SPAWN_WAIT: Duration = Duration::from_secs(10);

/// Connect to the daemon on `socket`; if none answers and `spawn` allows it, start one and
/// wait for its socket.
pub(crate) fn connect_or_spawn(
    socket: &Path,
    spawn: bool,
    config: &DaemonConfig,
) -> Result<Client> {
    let first = match Client::connect(socket) {
        Ok(c) => return Ok(c),
        Err(e) => e,
    };
    if !spawn {
        return Err(Error::NoDaemon {
            socket: socket.to_path_buf(),
            reason: format!("{first} (starting one is turned off)"),
        });
    }
    let bin = find_daemon_binary(config).ok_or_else(|| Error::NoDaemon {
        socket: socket.to_path_buf(),
        reason: format!(
            "{first}; no softrdmad binary to start (set {DAEMON_BIN_ENV} or put it on PATH)"
        ),
    })?;
    let args: Vec<String> = match &config.args {
        Some(a) => a.clone(),
        None => std::env::var(DAEMON_ARGS_ENV)
            .map(|s| s.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
    };
    tracing::info!(binary = %bin.display(), socket = %socket.display(), ?args, "starting softrdmad");
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(&args)
        .arg("--socket")
        .arg(socket)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // Its own process group: a Ctrl-C meant for this program does not stop the host's
    // daemon, which other processes may be using by then.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().map_err(|e| Error::NoDaemon {
        socket: socket.to_path_buf(),
        reason: format!("{first}; starting {} failed: {e}", bin.display()),
    })?;
    let deadline = Instant::now() + SPAWN_WAIT;
    let mut exited = None;
    loop {
        if let Ok(c) = Client::connect(socket) {
            if exited.is_none() {
                // Reap it when it ends, whenever that is.
                std::thread::spawn(move || {
                    let _ = child.wait();
                });
            }
            return Ok(c);
        }
        if exited.is_none() {
            if let Ok(Some(status)) = child.try_wait() {
                // Another process may have started one at the same moment (ours then
                // found the socket taken): keep trying to connect until the deadline.
                exited = Some(status);
            }
        }
        if Instant::now() >= deadline {
            if exited.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            return Err(Error::NoDaemon {
                socket: socket.to_path_buf(),
                reason: match exited {
                    Some(s) => format!("started {} but it exited ({s})", bin.display()),
                    None => format!(
                        "started {} but its socket did not come up in {SPAWN_WAIT:?}",
                        bin.display()
                    ),
                },
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawning_is_on_unless_turned_off() {
        for off in ["0", "no", "FALSE", " off "] {
            assert!(!spawn_allowed(off), "{off}");
        }
        for on in ["1", "yes", "true", ""] {
            assert!(spawn_allowed(on), "{on}");
        }
    }
}
