//! Running the `softrdma` binary in tests: processes with a time limit, in network
//! namespaces, and the checks on captures every suite shares.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_softrdma")
}

/// A scratch path for this test run.
pub fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softrdma-cli-tools");
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    dir.join(name)
}

/// A `softrdmad` served from this test process on control socket `socket`: one device per
/// `(name, address)`, all on one UDP port found free (found again when another test takes
/// it before the devices bind it). Returns the port.
pub fn serve_daemon(devices: &[(String, &str)], socket: &Path) -> u16 {
    use daemon::host::{Device, DeviceConfig};
    use daemon::server::{self, Daemon, Stats};
    let regions = daemon::memory::SharedRegions::default();
    for _ in 0..20 {
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .and_then(|s| s.local_addr())
            .expect("free udp port")
            .port();
        let started: Result<Vec<Device>, _> = devices
            .iter()
            .map(|(name, addr)| {
                let config = DeviceConfig {
                    name: name.clone(),
                    addrs: vec![addr.parse().expect("an IP address")],
                    port,
                    remote_port: port,
                    ..Default::default()
                };
                Device::start(config, regions.clone())
            })
            .collect();
        let Ok(devices) = started else {
            continue;
        };
        let listener = server::bind_control_socket(socket).expect("control socket");
        let daemon = std::sync::Arc::new(Daemon {
            devices,
            regions,
            stats: Stats::default(),
        });
        std::thread::spawn(move || server::serve(daemon, listener));
        return port;
    }
    panic!("no UDP port free on every address of the test daemon");
}

/// A child process that is killed if the test ends (or panics) before it exits.
pub struct Proc {
    pub what: String,
    child: Option<Child>,
}

impl Proc {
    /// Start `cmd` with captured output.
    pub fn spawn(what: &str, mut cmd: Command) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Proc {
            what: what.to_string(),
            child: Some(child),
        }
    }

    /// Wait for the exit, at most `limit` (then kill it and fail the test). The output is
    /// read while waiting, so a chatty child never blocks on a full pipe.
    pub fn wait(mut self, limit: Duration) -> Output {
        let mut child = self.child.take().expect("waited once");
        let drain = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut v);
                }
                v
            })
        };
        let out_t = drain(
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let err_t = drain(
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        );
        let t0 = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if t0.elapsed() < limit => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
            }
        };
        let stdout = out_t.join().unwrap_or_default();
        let stderr = err_t.join().unwrap_or_default();
        match status {
            Some(status) => Output {
                status,
                stdout,
                stderr,
            },
            None => panic!(
                "{} did not finish within {limit:?}\nstdout:\n{}\nstderr:\n{}",
                self.what,
                String::from_utf8_lossy(&stdout),
                String::from_utf8_lossy(&stderr)
            ),
        }
    }

    /// Wait and require exit status 0; returns stdout.
    pub fn success(self, limit: Duration) -> String {
        let what = self.what.clone();
        succeeded(&what, &self.wait(limit))
    }

    /// Whether it has exited (it is then waited for, its output still to collect).
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// The OS process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `softrdma ARGS` as a command.
pub fn softrdma(args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args);
    c
}

/// Run `softrdma ARGS` to completion within `limit`; returns its output.
pub fn run(args: &[&str], limit: Duration) -> Output {
    Proc::spawn(&format!("softrdma {}", args.join(" ")), softrdma(args)).wait(limit)
}

/// Run and require success; returns stdout.
pub fn run_ok(args: &[&str], limit: Duration) -> String {
    Proc::spawn(&format!("softrdma {}", args.join(" ")), softrdma(args)).success(limit)
}

/// `softrdma decode FILE`: (stdout, the summary line) after requiring success.
pub fn decode(pcap: &Path) -> (String, String) {
    let out = run(
        &["decode", pcap.to_str().expect("utf-8 path")],
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "decode failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// Parse decode's summary "N packets: G RoCEv2 with good ICRC, B with bad ICRC, M malformed
/// RoCEv2, X not RoCEv2" into (N, G, B, M, X).
pub fn decode_counts(summary: &str) -> (u64, u64, u64, u64, u64) {
    let parse = || -> Option<(u64, u64, u64, u64, u64)> {
        let (total, rest) = summary.split_once(" packets: ")?;
        let v: Vec<u64> = rest
            .split(", ")
            .map(|p| p.split(' ').next().and_then(|n| n.parse().ok()))
            .collect::<Option<_>>()?;
        Some((
            total.parse().ok()?,
            *v.first()?,
            *v.get(1)?,
            *v.get(2)?,
            *v.get(3)?,
        ))
    };
    parse().unwrap_or_else(|| panic!("unexpected decode summary {summary:?}"))
}

/// tshark options for captures of benchmark traffic: the heuristic dissectors Wireshark
/// tries on InfiniBand payload would read benchmark bytes as their own protocols (they
/// judge application bytes, not the transport under test), and RoCEv2 over IPv6 carries a
/// zero UDP checksum as rxe does.
pub const TSHARK_OPTS: [&str; 20] = [
    "-o",
    "udp.ignore_ipv6_zero_checksum:TRUE",
    "--disable-heuristic",
    "rpcrdma_infiniband",
    "--disable-heuristic",
    "mellanox_eoib",
    "--disable-heuristic",
    "eth_over_ib",
    "--disable-heuristic",
    "smb_direct_infiniband",
    "--disable-heuristic",
    "smcr_infiniband",
    "--disable-heuristic",
    "sdp_infiniband",
    "--disable-heuristic",
    "iser_infiniband",
    "--disable-heuristic",
    "lnet_ib",
    "--disable-heuristic",
    "nvme_rdma",
];

/// Run tshark on `pcap` with [`TSHARK_OPTS`] and `args`; fails the test if tshark is
/// missing or fails.
pub fn tshark(pcap: &Path, args: &[&str]) -> String {
    let mut c = Command::new("tshark");
    c.arg("-r").arg(pcap).args(TSHARK_OPTS).args(args);
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("tshark is required (apt-get install -y tshark): {e}"));
    assert!(
        out.status.success(),
        "tshark {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// tshark reads every packet of `pcap` as InfiniBand (RoCEv2) with none malformed and no
/// expert warning or error; returns the number of packets.
pub fn assert_tshark_clean(pcap: &Path) -> usize {
    let all = tshark(pcap, &["-T", "fields", "-e", "frame.number"]);
    let total = all.lines().count();
    assert!(total > 0, "{} holds no packets", pcap.display());
    let ib = tshark(
        pcap,
        &["-Y", "infiniband", "-T", "fields", "-e", "frame.number"],
    );
    assert_eq!(
        ib.lines().count(),
        total,
        "every packet should dissect as InfiniBand"
    );
    let malformed = tshark(
        pcap,
        &["-Y", "_ws.malformed", "-T", "fields", "-e", "frame.number"],
    );
    assert!(
        malformed.trim().is_empty(),
        "tshark finds malformed packets (frames {})",
        malformed.replace('\n', " ")
    );
    let expert = tshark(pcap, &["-q", "-z", "expert,warn"]);
    assert!(
        !expert.contains("Warns (") && !expert.contains("Errors ("),
        "tshark -z expert reports problems:\n{expert}"
    );
    total
}

/// Require exit status 0 of `what`'s `out` (failing with both outputs); returns stdout.
pub fn succeeded(what: &str, out: &Output) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
