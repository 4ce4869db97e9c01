//! Helpers for running the Debian verbs programs on the drop-in library, on either backend:
//! a `softrdmad` of the test's own (temp control socket, its own UDP port, killed on drop),
//! or an embedded device per process.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
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

/// Compile the C test program `src` (a path under the calling crate) into a temporary
/// folder of this test process, linked with `libs` (`-libverbs`...), against Debian's
/// headers: `header` must exist, else its `dev_package` is installed first. The drop-ins
/// replace Debian's libraries at run time.
pub fn c_program(src: &Path, libs: &[&str], (header, dev_package): (&str, &str)) -> PathBuf {
    if !Path::new(header).exists() {
        let _ = Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends", dev_package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
    require("cc", "gcc");
    let name = src.file_stem().expect("a file name");
    let dir = std::env::temp_dir().join(format!("softrdma-cprog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create program dir");
    let bin = dir.join(name);
    // Built under a name of its own and renamed into place: tests of one binary that build
    // the same program at once never write a file another is executing (ETXTBSY, exit
    // status 126) or exec one half written.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{}.build{n}", name.to_string_lossy()));
    let o = Command::new("cc")
        .args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&tmp)
        .arg(src)
        .args(libs)
        .output()
        .expect("cc runs");
    assert!(
        o.status.success(),
        "compiling {} failed (needs {dev_package}): {}",
        src.display(),
        describe(&o)
    );
    std::fs::rename(&tmp, &bin).expect("move the program into place");
    bin
}

/// Test program `tests/programs/{name}.c` of this crate, compiled against Debian's
/// libibverbs (the drop-in replaces that library at run time) and `libs`.
pub fn verbs_program(name: &str, libs: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{name}.c"));
    let mut all = vec!["-libverbs"];
    all.extend_from_slice(libs);
    c_program(
        &src,
        &all,
        ("/usr/include/infiniband/verbs.h", "libibverbs-dev"),
    )
}

/// Fails unless the build left drop-in `lib{name}.so` under its soname: a relative
/// `lib{name}.so.1 -> lib{name}.so` link in both folders cargo puts the library, the
/// profile's (`cargo build -p` copies it there) and deps (where it is linked, and where the
/// link must name the library the calling test loads).
pub fn assert_left_under_soname(name: &str) {
    let (file, soname) = (format!("lib{name}.so"), format!("lib{name}.so.1"));
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("target/<profile>/deps");
    let profile = deps.parent().expect("target/<profile>");
    for dir in [profile, deps] {
        let link = dir.join(&soname);
        assert_eq!(
            std::fs::read_link(&link).ok(),
            Some(PathBuf::from(&file)),
            "{}",
            link.display()
        );
    }
    let canon = |p: PathBuf| std::fs::canonicalize(&p).unwrap_or(p);
    assert_eq!(canon(deps.join(&soname)), canon(deps.join(&file)));
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

/// Where a program's device is.
#[derive(Clone, Copy)]
pub enum On<'a> {
    /// An embedded device of the process on `addr`, UDP port `port`.
    Embedded { addr: &'a str, port: u16 },
    /// The device on `addr` of a test daemon (listed first; the daemon is never spawned).
    Daemon {
        daemon: &'a TestDaemon,
        addr: &'a str,
    },
}

/// Which backend a two-process run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Server on 127.0.0.1, client on 127.0.0.2, each with its own embedded device.
    Embedded,
    /// One `softrdmad` serving 127.0.0.1; server and client both use its device.
    Daemon,
}

/// Point `c` at the drop-in library and the device `on` names.
pub fn configure(c: &mut Command, on: On<'_>) {
    c.env("LD_LIBRARY_PATH", library_dir())
        .env_remove("SOFTRDMA_ADDR")
        .env_remove("SOFTRDMA_PORT")
        .env_remove("SOFTRDMA_REMOTE_PORT");
    match on {
        On::Embedded { addr, port } => {
            c.env("SOFTRDMA_BACKEND", "embedded")
                .env("SOFTRDMA_DEVICE", addr)
                .env("SOFTRDMA_PORT", port.to_string());
        }
        On::Daemon { daemon, addr } => {
            c.env("SOFTRDMA_BACKEND", "daemon")
                .env("SOFTRDMA_DAEMON_SOCKET", &daemon.socket)
                .env("SOFTRDMA_DAEMON_SPAWN", "0")
                .env("SOFTRDMA_DEVICE", addr);
        }
    }
}

/// `prog args` with the drop-in library and the device `on` names. Its output is line
/// buffered (coreutils' `stdbuf`), so that a program killed at a time limit still shows
/// what it printed.
pub fn verbs_command(prog: &str, args: &[&str], on: On<'_>) -> Command {
    let mut c = Command::new("stdbuf");
    c.args(["-oL", "-eL", prog])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    configure(&mut c, on);
    c
}

/// The `softrdmad` binary of this build (target/<profile>/softrdmad), never older than its
/// sources: see [`workspace_binary`].
pub fn daemon_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        workspace_binary(
            "softrdma-daemon",
            "softrdmad",
            &["daemon", "runtime", "engine", "wire"],
        )
    })
    .clone()
}

/// The `softrdma` command-line tool of this build (target/<profile>/softrdma: `stat`,
/// `decode`), never older than its sources: see [`workspace_binary`].
pub fn cli_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        workspace_binary(
            "softrdma-cli",
            "softrdma",
            &["cli", "softrdma", "daemon", "runtime", "engine", "wire"],
        )
    })
    .clone()
}

/// Binary `bin` of workspace package `package` in target/<profile>, built now with the
/// profile of this test binary when a source file of the crates it is built from (`crates`,
/// folder names under crates/) or Cargo.lock is newer than it. `cargo test --workspace` has
/// built it already; then nothing is run.
fn workspace_binary(package: &str, bin: &str, crates: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf();
    let path = profile_dir.join(bin);
    if !sources_newer_than(&path, crates) {
        return path;
    }
    let target_dir = profile_dir.parent().expect("target dir");
    let profile = profile_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("debug");
    let mut c = Command::new(env!("CARGO"));
    c.args(["build", "--quiet", "-p", package, "--bin", bin])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    // The test profile builds into target/debug, as `cargo test` builds the package's
    // own tests' binary: the artifacts are shared, nothing is rebuilt twice.
    match profile {
        "debug" => c.args(["--profile", "test"]),
        "release" => c.arg("--release"),
        p => c.args(["--profile", p]),
    };
    let st = c.status();
    assert!(
        matches!(st, Ok(s) if s.success()) && path.is_file(),
        "building {bin} for the tests failed ({st:?}); build it with \
         `cargo build -p {package}` and look at its errors"
    );
    path
}

/// Whether `bin` is missing or older than a source of `crates` (folder names under crates/)
/// or the lock file.
fn sources_newer_than(bin: &Path, crates: &[&str]) -> bool {
    let Ok(built) = std::fs::metadata(bin).and_then(|m| m.modified()) else {
        return true;
    };
    let crates_dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates dir");
    let newer = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > built)
    };
    fn walk(dir: &Path, f: &dyn Fn(&Path) -> bool) -> bool {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return false;
        };
        rd.flatten().any(|e| {
            let p = e.path();
            if p.is_dir() {
                walk(&p, f)
            } else {
                f(&p)
            }
        })
    }
    newer(&crates_dir.join("../Cargo.lock"))
        || crates.iter().any(|c| {
            let dir = crates_dir.join(c);
            newer(&dir.join("Cargo.toml")) || walk(&dir.join("src"), &newer)
        })
}

/// A `softrdmad` child process on a control socket in a temp folder of its own, serving
/// the given addresses on UDP `port`; killed (and its folder removed) on drop, so a failing
/// test leaves none behind.
pub struct TestDaemon {
    child: Child,
    /// Its control socket.
    pub socket: PathBuf,
    /// Its UDP port.
    pub port: u16,
    dir: PathBuf,
}

impl TestDaemon {
    /// A daemon on this host serving `addrs` on a free UDP port.
    pub fn start(addrs: &[&str]) -> TestDaemon {
        TestDaemon::start_with(addrs, None, |bin, args| {
            let mut c = Command::new(bin);
            c.args(args);
            c
        })
    }

    /// A daemon serving `addrs` on `port` (a free one if `None`), started by the command
    /// `wrap(binary, args)` makes (e.g. inside a network namespace).
    pub fn start_with(
        addrs: &[&str],
        port: Option<u16>,
        wrap: impl Fn(&str, &[&str]) -> Command,
    ) -> TestDaemon {
        let bin = daemon_binary();
        let bin = bin.to_str().expect("UTF-8 path");
        for _ in 0..5 {
            let port = port.unwrap_or_else(free_udp_port);
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let dir = std::env::temp_dir().join(format!(
                "softrdma-ibverbs-daemon-{}-{n}",
                std::process::id()
            ));
            std::fs::create_dir_all(&dir).expect("daemon dir");
            let socket = dir.join("softrdmad.sock");
            let port_s = port.to_string();
            let sock_s = socket.to_str().expect("UTF-8 path").to_string();
            let mut args: Vec<&str> = Vec::new();
            for a in addrs {
                args.extend_from_slice(&["--addr", a]);
            }
            args.extend_from_slice(&["--port", &port_s, "--socket", &sock_s]);
            let mut cmd = wrap(bin, &args);
            cmd.env_remove("SOFTRDMA_DAEMON_SOCKET")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(if std::env::var_os("SOFTRDMAD_TEST_LOG").is_some() {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                });
            // The daemon dies with the test thread that started it, even if the test
            // process is killed before its guard runs.
            // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let mut child = cmd.spawn().expect("spawn softrdmad");
            let deadline = Instant::now() + Duration::from_secs(20);
            let up = loop {
                if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                    break true;
                }
                if let Ok(Some(_)) = child.try_wait() {
                    break false; // the port was taken meanwhile: try another
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("softrdmad did not open {} in 20 s", socket.display());
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            if up {
                return TestDaemon {
                    child,
                    socket,
                    port,
                    dir,
                };
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        panic!("softrdmad failed to start 5 times");
    }

    /// How the daemon ended, if it has (it must outlive every client).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Kill the daemon (SIGKILL, as a crash would end it) and reap it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Fails the test if the daemon has exited (it must outlive every client).
    pub fn assert_alive(&mut self) {
        let st = self.exited();
        assert!(st.is_none(), "softrdmad exited: {st:?}");
    }

    /// The daemon's counters (`softrdma stat`), by name (`srxe0.cm_listens`...); empty if
    /// it does not answer.
    pub fn counters(&self) -> BTreeMap<String, u64> {
        let o = Command::new(cli_binary())
            .args(["stat", "--socket"])
            .arg(&self.socket)
            .output();
        let Ok(o) = o else {
            return BTreeMap::new();
        };
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                Some((f.next()?.to_string(), f.next()?.parse().ok()?))
            })
            .collect()
    }

    /// Services its devices' connection managers listen on now (`cm_listens`, summed over
    /// the devices).
    pub fn cm_listens(&self) -> u64 {
        self.counters()
            .iter()
            .filter(|(name, _)| name.ends_with(".cm_listens"))
            .map(|(_, n)| n)
            .sum()
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
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

/// [`finish`] a server whose client has finished: the test fails if it does not exit
/// within `limit`, showing both sides.
pub fn finish_server(prog: &str, server: Guard, limit: Duration, client: &Output) -> Output {
    let (o, timed_out) = finish(server, limit);
    assert!(
        !timed_out,
        "{prog}: the server timed out: {}\nclient: {}",
        describe(&o),
        describe(client)
    );
    o
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
    // What its threads were doing when it overran, if it did.
    let mut overran = None;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if start.elapsed() > limit {
            overran = Some(threads_of(child.id()));
            let _ = child.kill();
            break child.wait().expect("wait");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = t1.join().unwrap_or_default();
    let mut stderr = t2.join().unwrap_or_default();
    if let Some(threads) = &overran {
        stderr.extend_from_slice(
            format!("--- its threads at the time limit ({limit:?}) ---\n{threads}").as_bytes(),
        );
    }
    (
        Output {
            status,
            stdout,
            stderr,
        },
        overran.is_some(),
    )
}

/// What each thread of process `pid` is doing: name, state, where it waits in the kernel
/// and the system call it is in (what a program stuck at a time limit shows of itself).
pub fn threads_of(pid: u32) -> String {
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("process {pid} is gone\n");
    };
    let mut lines: Vec<String> = tasks
        .flatten()
        .map(|t| {
            let dir = t.path();
            let stat = read(&dir.join("stat"));
            // The state follows the parenthesized name, which may itself hold spaces.
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').next())
                .unwrap_or("?")
                .to_string();
            let syscall = read(&dir.join("syscall"));
            format!(
                "{} {}: state {state}, waits in {}, syscall {}",
                t.file_name().to_string_lossy(),
                read(&dir.join("comm")).trim(),
                read(&dir.join("wchan")).trim(),
                syscall.split(' ').next().unwrap_or("?").trim()
            )
        })
        .collect();
    lines.sort();
    lines.join("\n") + "\n"
}

/// `softrdma decode` of a capture: its summary line, and the summary with the packet lines
/// (the first 60 and the last 20 when longer), indented, for a failure message.
pub fn decoded(pcap: &Path) -> (String, String) {
    use std::fmt::Write as _;
    let o = match Command::new(cli_binary()).arg("decode").arg(pcap).output() {
        Ok(o) => o,
        Err(e) => {
            return (
                String::new(),
                format!("  softrdma decode did not run: {e}\n"),
            )
        }
    };
    let summary = String::from_utf8_lossy(&o.stderr).trim().to_string();
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let mut s = format!("  {summary}\n");
    let (head, tail) = if lines.len() <= 80 {
        (&lines[..], &lines[..0])
    } else {
        (&lines[..60], &lines[lines.len() - 20..])
    };
    for l in head {
        let _ = writeln!(s, "  {l}");
    }
    if !tail.is_empty() {
        let _ = writeln!(s, "  ... {} lines ...", lines.len() - 80);
        for l in tail {
            let _ = writeln!(s, "  {l}");
        }
    }
    (summary, s)
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

/// Why a client failed when the cause is the order in which the two sides came up, not the
/// stack (the kernel's CM answers the same way: a REQ for a service no one listens on gets
/// a REJ, reason 8, invalid service ID).
pub enum TooEarly {
    /// The server was not listening yet (on an embedded device, where the rdmacm tests' `pair`
    /// cannot see when it listens). Start both again: a client of several connections may have had
    /// the later ones accepted before it gave up, and the server counts them (udaddy -c 2's
    /// server then waits for data on a connection whose client is gone, and never answers
    /// the next client's second SIDR REQ: seen under a CPU-bound neighbour, 2 runs in 20).
    ServerNotListening,
    /// perftest -R makes two connections on the port: one to exchange parameters, then the
    /// test's. Its server listens for the second only after the exchange, and the client
    /// may connect before that (between namespaces its REQ came 1 ms after the exchange). The
    /// client's own retry is broken in Debian's perftest 4.5-0.17 (it reuses the ids it
    /// just destroyed: EINVAL; fixed upstream in 3d9d8d0), so it exits, and the server
    /// waits for a second connection that will not come: a client run again would be
    /// taken as that second connection. Start both again.
    PerftestServerListenedLate,
}

/// Whether a client's failed run `o` only came too early, and how.
pub fn too_early(o: &Output) -> Option<TooEarly> {
    if o.status.success() {
        return None;
    }
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
    .to_lowercase();
    let rejected = text.contains("rejected");
    if rejected && text.contains("failed to connect rdma cm events") {
        // Printed only for perftest's second connection.
        Some(TooEarly::PerftestServerListenedLate)
    } else if rejected
        || text.contains("connection refused")
        // perftest's TCP exchange: "Couldn't connect to <address>:<port>".
        || text.contains("couldn't connect")
        || text.contains("failed to connect")
        // perftest -R: "Unexpected CM event ... 8" (REJECTED), then this.
        || text.contains("unable to perform rdma_client function")
        // udaddy: SIDR answered "unsupported" (nothing listens yet).
        || text.contains("rdma_cm_event_unreachable")
    {
        Some(TooEarly::ServerNotListening)
    } else {
        None
    }
}

/// Whether a perftest program gave up on its own clock: it times with the CPU's cycle
/// counter, calibrated at start against the system clock, and on a loaded machine that fit
/// can fail ("Correlation coefficient r^2: ... < 0.9", then "Can't produce a report") after
/// the transfers all completed. Such a run judges nothing of ours: run the pair again.
pub fn perftest_clock_failed(o: &Output) -> bool {
    !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("Correlation coefficient")
}

/// Assert that one side of a two-process run exited successfully, showing both sides'
/// output when it did not.
pub fn assert_side_succeeded(o: &Output, other: &Output) {
    assert!(
        o.status.success(),
        "{}\nthe other side: {}",
        describe(o),
        describe(other)
    );
}

/// Run a two-process program on `backend` (see [`Backend`]) and return (server, client)
/// output. The client is retried while the server is not yet listening on its TCP port, and
/// the pair when perftest could not calibrate its clock (see [`perftest_clock_failed`]).
/// On the daemon, the daemon must still be running at the end.
pub fn server_client(
    prog: &str,
    server_args: &[&str],
    client_args: &[&str],
    backend: Backend,
    limit: Duration,
) -> (Output, Output) {
    let udp = free_udp_port();
    let mut daemon = match backend {
        Backend::Daemon => Some(TestDaemon::start(&["127.0.0.1"])),
        Backend::Embedded => None,
    };
    let on = |addr| match &daemon {
        Some(d) => On::Daemon { daemon: d, addr },
        None => On::Embedded { addr, port: udp },
    };
    // A pair whose perftest could not calibrate its clock runs again, twice at most.
    let mut tries = 0;
    let (server, client) = loop {
        let server = Guard(Some(
            verbs_command(prog, server_args, on("127.0.0.1"))
                .spawn()
                .expect("spawn server"),
        ));
        let client_addr = match backend {
            Backend::Daemon => "127.0.0.1",
            Backend::Embedded => "127.0.0.2",
        };
        let start = Instant::now();
        let client = loop {
            let o = run(verbs_command(prog, client_args, on(client_addr)), limit);
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
        let server = finish_server(prog, server, limit, &client);
        if (perftest_clock_failed(&server) || perftest_clock_failed(&client)) && tries < 2 {
            tries += 1;
            eprintln!("{prog}: perftest could not calibrate its clock; running the pair again");
            continue;
        }
        break (server, client);
    };
    if let Some(d) = daemon.as_mut() {
        d.assert_alive();
    }
    (server, client)
}

/// rdma-core's test suite (Debian python3-pyverbs).
pub const SUITE: &str = "/usr/share/doc/rdma-core/tests";
/// Debian's python, which has pyverbs.
pub const PYTHON: &str = "/usr/bin/python3";

/// A private, unpacked copy of the suite (some of its files ship gzipped).
pub fn suite_copy() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(make_suite_copy).clone()
}

fn make_suite_copy() -> PathBuf {
    if !Path::new(SUITE).join("run_tests.py").exists() {
        let _ = Command::new("apt-get")
            .args([
                "install",
                "-y",
                "--no-install-recommends",
                "python3-pyverbs",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
    assert!(
        Path::new(SUITE).join("run_tests.py").exists(),
        "python3-pyverbs is not installed and apt-get could not install it"
    );
    let root = std::env::temp_dir().join(format!("softrdma-pyverbs-{}", std::process::id()));
    let dst = root.join("tests");
    if !dst.join("run_tests.py").exists() {
        std::fs::create_dir_all(&root).expect("create suite dir");
        let st = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "cp -r {SUITE} {root} && gunzip -f {root}/tests/*.gz",
                root = root.display()
            ))
            .status()
            .expect("sh runs");
        assert!(st.success(), "copying the suite failed");
    }
    dst
}

/// Run `tests/scripts/<script>` with Debian's python, rdma-core's test suite importable (its
/// resources classes) and the drop-in on `on`'s device, named `device` to the script; fails
/// the test unless it exits 0 and prints `expect`.
pub fn run_suite_script(script: &str, device: &str, on: On<'_>, expect: &str) {
    let suite = suite_copy();
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scripts")
        .join(script);
    let root = suite.parent().expect("suite has a parent");
    let mut c = Command::new(PYTHON);
    c.arg(path)
        .arg(device)
        .current_dir(root)
        // The suite's modules import each other both as `tests.x` and as `x`.
        .env(
            "PYTHONPATH",
            format!("{}:{}", root.display(), suite.display()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    configure(&mut c, on);
    let o = run(c, Duration::from_secs(60));
    assert!(o.status.success(), "{script}: {}", describe(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(expect),
        "{script}: {}",
        describe(&o)
    );
}
