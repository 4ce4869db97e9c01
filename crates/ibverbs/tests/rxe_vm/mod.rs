//! A live Linux Soft-RoCE peer for the interop tests: the shared tool `rxe-vm/run-vm.sh`
//! boots Debian's kernel with `rdma_rxe` in qemu (TCG) on bridge `br0` (10.50.0.1/24) inside
//! network namespace `rxeo`; a VM is 10.50.0.11 with device `rxe0`, GID index 1 its IPv4
//! address. This module prepares the tool once in a scratch folder (packages, Debian's
//! kernel, the initramfs) and reuses it while the tool and the host's tools stay the same,
//! boots VMs, follows their console while they run, ends a program in a VM early, and
//! captures `br0`.
//!
//! Where things are:
//! - the tool: `../shared/tools/rxe-vm` beside the repository (as CI checks it out), or the
//!   folder `$SOFTRDMA_RXE_VM` names. Without it the test FAILS saying where it looked.
//! - the scratch folder: `target/rxe-vm`, or `$SOFTRDMA_RXE_VM_WORK`.
//!
//! Needs root (qemu on a tap device, `ip netns`, tcpdump, apt-get), as CI runs; without it
//! the test FAILS saying so. One run at a time per machine (the namespace, its bridge and
//! taps are fixed names): [`RxeVm::prepare`] holds a lock file until the VM work is done.

#![allow(dead_code)]

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The network namespace of the bridge, the VMs' taps and our side.
pub const NS: &str = "rxeo";
/// Our side's address on the bridge.
pub const HOST_ADDR: &str = "10.50.0.1";
/// The VM's address (the server VM's in `pair`).
pub const VM_ADDR: &str = "10.50.0.11";

/// Longest kernel command line on x86 (COMMAND_LINE_SIZE, with its NUL): the VM's script
/// travels there, base64-encoded.
const CMDLINE_MAX: usize = 2047;
/// What run-vm.sh puts on the command line besides the script (its longest address).
const CMDLINE_REST: &str = "console=ttyS0 quiet panic=-1 rxe.ip=10.50.0.12 rxe.cmd=";

/// Host tools run-vm.sh's `initramfs` copies into the VM or uses, and `run` uses: when one
/// is missing, `install` runs again (a cached scratch folder outlives a fresh machine's
/// packages).
const HOST_TOOLS: &[&str] = &[
    "/usr/bin/qemu-system-x86_64",
    "/bin/busybox",
    "/usr/bin/tcpdump",
    "/usr/bin/cpio",
    "/usr/sbin/depmod",
    "/usr/bin/ibv_rc_pingpong",
    "/usr/bin/ib_write_bw",
    "/usr/bin/rping",
    "/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so",
    "/etc/libibverbs.d/rxe.driver",
];

/// The tool, prepared in its scratch folder, and this process's hold on the machine's VM
/// resources (released on drop).
pub struct RxeVm {
    tool: PathBuf,
    work: PathBuf,
    _lock: File,
}

/// The tool's folder: `$SOFTRDMA_RXE_VM`, else `shared/tools/rxe-vm` beside the repository.
fn tool_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SOFTRDMA_RXE_VM") {
        return PathBuf::from(dir);
    }
    // crates/ibverbs -> the repository -> the folder holding it.
    let beside = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(3)
        .expect("the repository has a parent folder");
    beside.join("shared/tools/rxe-vm")
}

/// The scratch folder: `$SOFTRDMA_RXE_VM_WORK`, else `rxe-vm` in the target folder of this
/// test binary (target/<profile>/deps/<test> -> target/rxe-vm).
fn work_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SOFTRDMA_RXE_VM_WORK") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test executable path");
    exe.ancestors()
        .nth(3)
        .expect("target/<profile>/deps/<test>")
        .join("rxe-vm")
}

impl RxeVm {
    /// Take the machine's VM lock (waiting for another run to finish), then make sure the
    /// tool is ready: `install` (apt packages, Debian's kernel package, about 30 s) when a
    /// host tool or the kernel is missing or run-vm.sh changed since the last preparation,
    /// `initramfs` (a few seconds) when it is missing or anything was installed; and the
    /// namespace and bridge are up (our daemon binds 10.50.0.1 before a VM boots).
    pub fn prepare() -> RxeVm {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "the kernel Soft-RoCE interop test needs root (qemu on a tap device, ip netns, \
             tcpdump, apt-get), as CI runs it; run it as root"
        );
        let dir = tool_dir();
        let tool = dir.join("run-vm.sh");
        assert!(
            tool.is_file(),
            "the rxe-vm tool is missing: no {} (CI checks out shared/ beside the repository; \
             elsewhere set SOFTRDMA_RXE_VM to the folder holding run-vm.sh)",
            tool.display()
        );
        let work = work_dir();
        std::fs::create_dir_all(&work)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", work.display()));
        let vm = RxeVm {
            tool,
            _lock: lock(),
            work,
        };
        vm.install_if_needed();
        vm.tool_step(&["netup"], Duration::from_secs(60));
        vm
    }

    /// The scratch folder (logs, captures).
    pub fn work(&self) -> &Path {
        &self.work
    }

    fn install_if_needed(&self) {
        let script = std::fs::read(&self.tool).expect("read run-vm.sh");
        let stamp = self.work.join("prepared-with-run-vm.sh");
        let same_tool = std::fs::read(&stamp).is_ok_and(|s| s == script);
        let missing: Vec<&str> = HOST_TOOLS
            .iter()
            .copied()
            .filter(|p| !Path::new(p).exists())
            .collect();
        let kernel = std::fs::read_dir(self.work.join("kpkg/boot")).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-")))
        });
        let install = !same_tool || !missing.is_empty() || !kernel;
        if install {
            eprintln!(
                "rxe-vm: install in {} (tool changed: {}, missing: {:?}, kernel present: {kernel})",
                self.work.display(),
                !same_tool,
                missing
            );
            let _ = std::fs::remove_file(&stamp);
            self.tool_step(&["install"], Duration::from_secs(1200));
        }
        if install || !self.work.join("initramfs.cpio.gz").is_file() {
            self.tool_step(&["initramfs"], Duration::from_secs(300));
        }
        std::fs::write(&stamp, &script).expect("write the preparation stamp");
    }

    /// `run-vm.sh args` with the scratch folder as `W` (not started). Without the test's
    /// `LD_LIBRARY_PATH`: cargo points it at target/<profile> and its deps, where the
    /// drop-ins sit under their sonames, and the tool's `ldd` closure must copy the host's
    /// libibverbs into the VM, not ours (a relative link there resolves to nothing).
    fn command(&self, args: &[&str]) -> Command {
        self.command_in(&self.work, args)
    }

    /// [`RxeVm::command`] with scratch folder `work`.
    fn command_in(&self, work: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("bash");
        c.arg(&self.tool)
            .args(args)
            .env("W", work)
            .env_remove("LD_LIBRARY_PATH");
        c
    }

    /// Run a preparation step to its end; fails the test with its output if it fails.
    fn tool_step(&self, args: &[&str], limit: Duration) {
        let mut c = self.command(args);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let o = crate::common::run(c, limit);
        assert!(
            o.status.success(),
            "run-vm.sh {} failed (W={}): {}",
            args.join(" "),
            self.work.display(),
            crate::common::describe(&o)
        );
    }

    /// Boot one VM (10.50.0.11, `rxe0` on its eth0) that runs `script` with busybox `sh -x`
    /// and powers off (run-vm.sh `run`); its console is followed through [`Vm`].
    pub fn boot(&self, script: &str) -> Vm {
        self.boot_in(&self.work, script)
    }

    /// [`RxeVm::boot`] with more files in the VM: each `(host file, path in the VM)` of
    /// `files`, and the shared libraries `ldd` says they load, go into a second initramfs
    /// archive appended to the tool's (the kernel unpacks both), in a scratch folder of its
    /// own (`with-files` in the tool's) that shares the tool's kernel.
    pub fn boot_with(&self, files: &[(&Path, &str)], script: &str) -> Vm {
        self.boot_kernel_with(&self.work.join("kpkg"), files, script)
    }

    /// The kernel package the tool installed (Debian 12's): `boot/` and `lib/modules/`.
    pub fn kernel(&self) -> PathBuf {
        self.work.join("kpkg")
    }

    /// Debian 11's newest kernel package (Linux 5.10), from `bullseye-security` through
    /// apt (the archive's signatures checked), unpacked once into `debian-11/kpkg` of the
    /// scratch folder; `boot/` and `lib/modules/` as [`RxeVm::kernel`]. The tool's
    /// initramfs boots it: its modules are the other kernel's and do not load, so the VM
    /// has no network device but loopback, and no `rxe0`.
    pub fn debian_11_kernel(&self) -> PathBuf {
        let dir = self.work.join("debian-11");
        let kpkg = dir.join("kpkg");
        let unpacked = std::fs::read_dir(kpkg.join("boot")).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("vmlinuz-")))
        });
        if unpacked {
            return kpkg;
        }
        let sh = r#"set -e
D="$0"; mkdir -p "$D/lists/partial" "$D/cache/archives/partial"
echo "deb http://deb.debian.org/debian-security bullseye-security main" > "$D/sources.list"
O="-o Dir::Etc::SourceList=$D/sources.list -o Dir::Etc::SourceParts=/dev/null
   -o Dir::State::Lists=$D/lists -o Dir::Cache=$D/cache -o Dir::State::status=/dev/null"
apt-get $O update
pkg=$(apt-cache $O pkgnames linux-image-5.10.0- | grep -E '^linux-image-5\.10\.0-[0-9]+-amd64$' | sort -V | tail -1)
[ -n "$pkg" ] || { echo "no Debian 11 kernel package in bullseye-security" >&2; exit 1; }
cd "$D" && rm -f ./*.deb && apt-get $O download "$pkg"
rm -rf "$D/kpkg.new" && dpkg-deb -x "$D"/"$pkg"_*.deb "$D/kpkg.new"
rm -rf "$D/kpkg" && mv "$D/kpkg.new" "$D/kpkg" && rm -f "$D"/*.deb"#;
        let mut c = Command::new("sh");
        c.arg("-c").arg(sh).arg(&dir);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let o = crate::common::run(c, Duration::from_secs(600));
        assert!(
            o.status.success(),
            "fetching Debian 11's kernel failed: {}",
            crate::common::describe(&o)
        );
        kpkg
    }

    /// [`RxeVm::boot_with`] on the kernel package `kpkg` ([`RxeVm::kernel`],
    /// [`RxeVm::debian_11_kernel`]), in a scratch folder of its own per kernel.
    pub fn boot_kernel_with(&self, kpkg: &Path, files: &[(&Path, &str)], script: &str) -> Vm {
        let name = if kpkg == self.work.join("kpkg") {
            "with-files".to_string()
        } else {
            format!(
                "with-files-{}",
                kpkg.parent()
                    .and_then(Path::file_name)
                    .map_or("kernel".into(), |n| n.to_string_lossy())
            )
        };
        let work = self.work.join(name);
        let root = work.join("root");
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&root).expect("create the extra root");
        let put = |from: &Path, to: &str| {
            let dest = root.join(to.trim_start_matches('/'));
            std::fs::create_dir_all(dest.parent().expect("a file path")).expect("create dir");
            std::fs::copy(from, &dest)
                .unwrap_or_else(|e| panic!("copy {} into the VM: {e}", from.display()));
        };
        for (from, to) in files {
            put(from, to);
            let o = Command::new("ldd").arg(from).output().expect("ldd runs");
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the loader's line.
            for lib in String::from_utf8_lossy(&o.stdout).lines().filter_map(|l| {
                let path = l.split("=>").last()?.split_whitespace().next()?;
                path.starts_with('/').then(|| path.to_string())
            }) {
                put(Path::new(&lib), &lib);
            }
        }
        let archive = work.join("extra.cpio.gz");
        let packed = Command::new("sh")
            .arg("-c")
            .arg("find . | cpio -o -H newc --quiet | gzip -1 > \"$0\"")
            .arg(&archive)
            .current_dir(&root)
            .status();
        assert!(
            matches!(packed, Ok(s) if s.success()),
            "packing the extra files failed: {packed:?}"
        );
        let mut initramfs =
            std::fs::read(self.work.join("initramfs.cpio.gz")).expect("the tool's initramfs");
        initramfs.extend(std::fs::read(&archive).expect("the extra archive"));
        std::fs::write(work.join("initramfs.cpio.gz"), initramfs).expect("write the initramfs");
        std::os::unix::fs::symlink(kpkg, work.join("kpkg")).expect("link the kernel");
        self.boot_in(&work, script)
    }

    fn boot_in(&self, work: &Path, script: &str) -> Vm {
        assert_script_fits(script);
        // run-vm.sh `run` names its VM vm1: console in vm1.log, qemu's pid in vm1.pid.
        let log = work.join("vm1.log");
        let _ = std::fs::remove_file(&log);
        let out_path = work.join("run-vm.out");
        let out = File::create(&out_path).expect("create run-vm.out");
        let err = out.try_clone().expect("dup run-vm.out");
        let mut c = self.command_in(work, &["run", script]);
        c.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // A group of its own: dropping the Vm ends run-vm.sh and the qemu it started.
            .process_group(0);
        let child = c.spawn().expect("spawn run-vm.sh run");
        Vm {
            child: Some(child),
            log,
            out: out_path,
        }
    }

    /// Two VMs, rxe against rxe (run-vm.sh `pair`): 10.50.0.11 runs `server`, 10.50.0.12
    /// runs `client`; br0 captured to `pcap`. Returns the two consoles (server, client)
    /// and run-vm.sh's own output once both VMs powered off.
    pub fn pair(&self, server: &str, client: &str, pcap: &Path, limit: Duration) -> PairRun {
        assert_script_fits(server);
        assert_script_fits(client);
        for f in ["vmsrv.log", "vmcli.log"] {
            let _ = std::fs::remove_file(self.work.join(f));
        }
        let mut c = self.command(&["pair", server, client, pcap.to_str().expect("UTF-8")]);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let child = c.spawn().expect("spawn run-vm.sh pair");
        let pgid = child.id() as i32;
        let (output, timed_out) = crate::common::finish(crate::common::Guard(Some(child)), limit);
        if timed_out {
            // SAFETY: a signal to the process group this test started (run-vm.sh, its
            // tcpdump and qemus).
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        let read = |f: &str| {
            String::from_utf8_lossy(&std::fs::read(self.work.join(f)).unwrap_or_default())
                .replace('\r', "")
        };
        PairRun {
            server: read("vmsrv.log"),
            client: read("vmcli.log"),
            output,
            timed_out,
        }
    }
}

/// What a `pair` run left.
pub struct PairRun {
    /// The server VM's console.
    pub server: String,
    /// The client VM's console.
    pub client: String,
    /// run-vm.sh's own output.
    pub output: Output,
    /// Whether it overran its limit and was killed.
    pub timed_out: bool,
}

/// The machine-wide lock (blocks while another test process holds it): the namespace, its
/// bridge and taps, the VMs' addresses and UDP 4791 on 10.50.0.1 are one per machine.
fn lock() -> File {
    let path = std::env::temp_dir().join("softrdma-rxe-vm.lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    // SAFETY: flock on a descriptor this function owns; released when the file is closed.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        r,
        0,
        "flock {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    f
}

/// The VM's script travels base64-encoded on the kernel command line: fail clearly (not with
/// a VM that silently runs a truncated script) when it cannot fit.
pub fn assert_script_fits(script: &str) {
    let encoded = (script.len() + 1).div_ceil(3) * 4; // run-vm.sh encodes script + '\n'
    assert!(
        CMDLINE_REST.len() + encoded <= CMDLINE_MAX,
        "the VM script is too long for the kernel command line ({} bytes encoded, {} \
         available): shorten it\n{script}",
        encoded,
        CMDLINE_MAX - CMDLINE_REST.len()
    );
}

/// A booted VM, followed through its console log while it runs; killed (with run-vm.sh) on
/// drop if still running.
pub struct Vm {
    child: Option<Child>,
    log: PathBuf,
    out: PathBuf,
}

impl Vm {
    /// The console so far (carriage returns removed).
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).replace('\r', "")
    }

    /// run-vm.sh's own output (set-up errors; the console once the VM is off).
    pub fn tool_output(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.out).unwrap_or_default()).into_owned()
    }

    /// Whether the VM (run-vm.sh waiting for qemu) still runs.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Whether the VM's init has started the script (rxe0 is up).
    pub fn is_ready(&self) -> bool {
        self.log().contains("[oracle] running:")
    }

    /// Wait until the VM's init starts the script, at most `limit`; false if the VM stopped
    /// or took longer.
    pub fn wait_ready(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.is_ready() {
                return true;
            }
            if !self.running() || start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The exit status the VM's script printed for the program on `port`, once it did.
    pub fn ended(&self, port: u16) -> Option<i32> {
        end_status(&self.log(), port)
    }

    /// Wait at most `limit` for the VM's program on `port` to end.
    pub fn wait_end(&mut self, port: u16, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if let Some(rc) = self.ended(port) {
                return Some(rc);
            }
            if !self.running() || start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// End the VM's program on `port` now (our side already failed: waiting for its own
    /// timeout would only cost time): connect to its stop port `port + 100`, where the
    /// script's listener kills it, again every second until the script says it ended (a
    /// client between two connection attempts has no listener). Returns its status.
    pub fn stop_program(&mut self, port: u16, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        loop {
            if self.ended(port).is_none() && self.running() {
                knock(port + 100);
            }
            if let Some(rc) = self.wait_end(port, Duration::from_secs(1)) {
                return Some(rc);
            }
            if !self.running() || start.elapsed() > limit {
                return None;
            }
        }
    }

    /// Start the VM's program on `port` afresh: connect to its restart port `port + 200`,
    /// where the script's listener kills it and marks the kill as a restart, again every
    /// second until the script says `@@ AGAIN <port>` once more. False if it did not within
    /// `limit` (or the program ended meanwhile).
    pub fn restart_program(&mut self, port: u16, limit: Duration) -> bool {
        let again = format!("@@ AGAIN {port}");
        let count = |log: &str| log.lines().filter(|l| l.trim() == again).count();
        let before = count(&self.log());
        let start = Instant::now();
        loop {
            if self.ended(port).is_some() || !self.running() || start.elapsed() > limit {
                return false;
            }
            knock(port + 200);
            let tried = Instant::now();
            while tried.elapsed() < Duration::from_secs(1) {
                if count(&self.log()) > before {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Wait at most `limit` for the VM to power off (its script ends with that), killing it
    /// after; true if it powered off by itself.
    pub fn power_off(&mut self, limit: Duration) -> bool {
        let start = Instant::now();
        while self.running() {
            if start.elapsed() > limit {
                self.kill();
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        true
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if matches!(c.try_wait(), Ok(None)) {
                // SAFETY: a signal to the process group this Vm started (run-vm.sh and the
                // qemu it started); the leader is not reaped yet, so the id is still ours.
                unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            }
            let _ = c.wait();
        }
    }
}

/// Connect to the VM's TCP `port` and close at once (what the script's `nc` listeners wait
/// for); no answer within 3 s is no error.
fn knock(port: u16) {
    let target = format!(": >/dev/tcp/{VM_ADDR}/{port}");
    let _ = Command::new("ip")
        .args(["netns", "exec", NS, "timeout", "3", "bash", "-c", &target])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

impl Drop for Vm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The status in the script's `@@ END <port> rc=<status>` line, if printed.
pub fn end_status(log: &str, port: u16) -> Option<i32> {
    let prefix = format!("@@ END {port} rc=");
    log.lines().find_map(|l| {
        let rest = l.trim().strip_prefix(&prefix)?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// The console lines of the program on `port`: from the script's `@@ BEGIN <port>` to its
/// `@@ END <port>` line (or to the end of the log when it never ended).
pub fn section(log: &str, port: u16) -> String {
    let begin = format!("@@ BEGIN {port}");
    let end = format!("@@ END {port} ");
    let mut out = String::new();
    let mut inside = false;
    for l in log.lines() {
        let t = l.trim();
        if t == begin {
            inside = true;
        }
        if inside {
            out.push_str(l);
            out.push('\n');
            if t.starts_with(&end) {
                break;
            }
        }
    }
    out
}

/// tcpdump on br0 in the namespace (UDP and TCP: RoCEv2 and the programs' connection
/// exchange), writing `path`; stopped on drop.
pub struct Capture {
    child: Option<Child>,
    path: PathBuf,
}

impl Capture {
    /// Start capturing; returns once tcpdump says it listens.
    pub fn start(path: &Path) -> Capture {
        // --immediate-mode: without it the kernel hands packets over a ring block at a time
        // (or after a 1 s timeout), and what the current block holds when tcpdump is stopped
        // is lost: short programs left empty captures. -B: a 64 MiB ring (default 2 MiB),
        // which a bandwidth test's bursts overflowed packet by packet.
        let tcpdump = ["tcpdump", "--immediate-mode", "-B", "65536", "-i", "br0"];
        let mut child = Command::new("ip")
            .args(["netns", "exec", NS])
            .args(tcpdump)
            .args(["-U", "-s", "0", "-w"])
            .arg(path)
            .arg("udp or tcp")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tcpdump");
        let mut err = BufReader::new(child.stderr.take().expect("piped stderr"));
        let mut said = String::new();
        loop {
            let mut line = String::new();
            match err.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let st = child.wait();
                    panic!("tcpdump on br0 in {NS} did not start ({st:?}): {said}");
                }
                Ok(_) if line.contains("listening on") => break,
                Ok(_) => said.push_str(&line),
            }
        }
        // Its closing statistics go nowhere; nothing else is written there.
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        Capture {
            child: Some(child),
            path: path.to_path_buf(),
        }
    }

    /// Stop capturing (tcpdump gets each packet as it comes and writes it at once) and
    /// return the file.
    pub fn stop(mut self) -> PathBuf {
        self.end();
        self.path.clone()
    }

    fn end(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: SIGTERM to the tcpdump this Capture started (ip netns exec execs it
            // in place), not reaped yet; it closes the file cleanly.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.end();
    }
}
