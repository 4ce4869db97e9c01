//! Interop with Linux kernel Soft-RoCE (`rdma_rxe`), live: unmodified rdma-core programs on
//! our side (the drop-in libibverbs.so.1 on a `softrdmad` serving 10.50.0.1 in network
//! namespace `rxeo`) against the same programs on Debian's kernel in a qemu VM (10.50.0.11,
//! `rxe0`, GID index 1), through the shared tool `rxe-vm/run-vm.sh` (see [`rxe_vm`]).
//!
//! The matrix ([`MATRIX`]): ibv_rc_pingpong, ibv_ud_pingpong, ibv_srq_pingpong, ib_write_bw,
//! ib_read_bw, ib_send_bw (64 KiB, and ib_write_bw and ib_send_bw again with 2-byte
//! messages), ib_atomic_bw, ib_write_lat, few iterations each (the VM is
//! emulated: correctness only, never timings), in both directions, one VM per direction
//! running the whole list in order. Each program has its own TCP port (18515 + its place in
//! the list), so a client can only ever pair with its own server; the client retries while
//! its server is not listening yet. The VM prints `@@ BEGIN <port>` / `@@ END <port> rc=N`
//! around each program, which our side follows on the VM's console as it runs. When our side
//! fails first, it ends the VM's program at once (a connection to port + 100, where the VM's
//! script listens for that) instead of waiting for the VM's per-program timeout.
//!
//! The rdma_cm matrix ([`CM_MATRIX`]): rping, ucmatose, udaddy (SIDR) and ib_write_bw -R
//! through the drop-in `librdmacm.so.1` against the kernel's rdma_cm (`rdma_ucm` in the VM),
//! both directions, on rdma_cm ports from 7471 (udaddy: UDP port 7174): the IB CM protocol
//! on QP1 both ways.
//!
//! Two more tests run the same scripts between two kernel rxe VMs: they show the harness and
//! the VM work, so a failure of the others is ours to read.
//!
//! Every program is reported PASS or FAIL (none is skipped); a failure prints both sides'
//! output, the daemon counters that changed while it ran and its capture decoded by
//! `softrdma decode` (captures stay in target/rxe-vm/captures). Set SOFTRDMAD_TEST_LOG=1 to
//! see the daemon's log too.
//!
//! Run alone: `cargo test -p softrdma-ibverbs --test rxe_interop -- --nocapture`.

mod common;
#[path = "../../cli/tests/hosts/mod.rs"]
mod hosts;
#[path = "../../rdmacm/tests/rdmacm_lib/mod.rs"]
mod rdmacm_lib;
mod rxe_vm;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{describe, finish, Guard, On, TestDaemon};
use hosts::Hosts;
use rxe_vm::{Capture, RxeVm, Vm, HOST_ADDR, NS, VM_ADDR};

/// How a program is told its role, port and peer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// rdma-core's pingpongs and perftest: `-d DEV -g|-x GID -n ITERS ... -p PORT [SERVER]`.
    Verbs,
    /// rping: `-s -a 0.0.0.0` or `-c -a SERVER`, `-p PORT -C ITERS -v`.
    Rping,
    /// ucmatose: `[-s SERVER] -p PORT -C ITERS`.
    Ucmatose,
    /// udaddy: `[-s SERVER] -C ITERS`, always on rdma_cm UDP port 7174 (it has no port
    /// option): SIDR resolves the server's UD QP, then datagrams both ways.
    Udaddy,
}

/// One program of the matrix and how both sides run it.
struct Program {
    /// The rdma-core or perftest program.
    name: &'static str,
    /// How it takes its arguments.
    kind: Kind,
    /// Iterations (`-n`): few, the VM is emulated.
    iters: &'static str,
    /// Further options, the same on both sides.
    extra: &'static [&'static str],
    /// perftest: the message size of the client's result row.
    row_size: Option<&'static str>,
}

/// The programs, in the order both sides run them.
const MATRIX: &[Program] = &[
    Program {
        kind: Kind::Verbs,
        name: "ibv_rc_pingpong",
        iters: "5",
        extra: &["-c"],
        row_size: None,
    },
    // One datagram per message: the payload fits the 1024-byte path MTU.
    Program {
        kind: Kind::Verbs,
        name: "ibv_ud_pingpong",
        iters: "5",
        extra: &["-s", "1024", "-c"],
        row_size: None,
    },
    Program {
        kind: Kind::Verbs,
        name: "ibv_srq_pingpong",
        iters: "5",
        extra: &[],
        row_size: None,
    },
    // -F: the VM has no CPU frequency information; figures are not looked at anyway.
    Program {
        kind: Kind::Verbs,
        name: "ib_write_bw",
        iters: "20",
        extra: &["-F"],
        row_size: Some("65536"),
    },
    Program {
        kind: Kind::Verbs,
        name: "ib_read_bw",
        iters: "20",
        extra: &["-F"],
        row_size: Some("65536"),
    },
    Program {
        kind: Kind::Verbs,
        name: "ib_send_bw",
        iters: "20",
        extra: &["-F"],
        row_size: Some("65536"),
    },
    // Small messages back to back: softrdma sends them as GSO trains of equal ONLY packets,
    // which the kernel cuts and rxe checks packet by packet.
    Program {
        kind: Kind::Verbs,
        name: "ib_write_bw",
        iters: "200",
        extra: &["-F", "-s", "2"],
        row_size: Some("2"),
    },
    Program {
        kind: Kind::Verbs,
        name: "ib_send_bw",
        iters: "200",
        extra: &["-F", "-s", "2"],
        row_size: Some("2"),
    },
    Program {
        kind: Kind::Verbs,
        name: "ib_atomic_bw",
        iters: "20",
        extra: &["-F"],
        row_size: Some("8"),
    },
    Program {
        kind: Kind::Verbs,
        name: "ib_write_lat",
        iters: "20",
        extra: &["-F"],
        row_size: Some("2"),
    },
];

/// The programs that connect through the RDMA connection manager (librdmacm; the drop-in
/// on our side, the kernel's rdma_ucm in the VM): the CM protocol on QP1 both ways.
const CM_MATRIX: &[Program] = &[
    Program {
        kind: Kind::Rping,
        name: "rping",
        iters: "5",
        extra: &[],
        row_size: None,
    },
    Program {
        kind: Kind::Ucmatose,
        name: "ucmatose",
        iters: "5",
        extra: &[],
        row_size: None,
    },
    Program {
        kind: Kind::Udaddy,
        name: "udaddy",
        iters: "5",
        extra: &[],
        row_size: None,
    },
    Program {
        kind: Kind::Verbs,
        name: "ib_write_bw",
        iters: "20",
        extra: &["-F", "-R"],
        row_size: Some("65536"),
    },
];

/// The first rdma_cm port of [`CM_MATRIX`] (apart from [`MATRIX`]'s, whose runs may overlap
/// in time on one host).
const CM_BASE_PORT: u16 = 7471;

/// The TCP port of the first program's connection exchange (the programs' default).
const BASE_PORT: u16 = 18515;
/// The kernel's device in the VM and the GID index of its IPv4 address.
const VM_DEVICE: &str = "rxe0";
const VM_GID: &str = "1";

/// The VM ends each program attempt after this long (busybox `timeout`): a successful run
/// takes about 2 s there, and a kernel rxe client whose peer never answers retransmits
/// until then (it does not stop at its retry count), so a failing program costs this much.
const VM_PROGRAM_SECS: u32 = 20;
/// How many times the VM's client tries to connect (once a second) before it gives up.
const VM_CONNECT_TRIES: u32 = 60;
/// Boot to the script's start (about 6 s measured; emulated, on a loaded CI machine).
const READY_LIMIT: Duration = Duration::from_secs(180);
/// One run of one of our programs (a UD client whose replies never come waits forever).
const PROGRAM_LIMIT: Duration = Duration::from_secs(25);
/// Our client retries its connection this long while the VM's server is not listening.
const CONNECT_LIMIT: Duration = Duration::from_secs(60);
/// Waiting for the VM's side of a program after ours ended, or to end it.
const END_LIMIT: Duration = Duration::from_secs(35);
/// Our server waits this long for the VM's client at most.
const SERVER_LIMIT: Duration = Duration::from_secs(150);
/// After the VM's client ended, our server gets this long to end too (it succeeded / failed).
const GRACE_OK: Duration = Duration::from_secs(20);
const GRACE_FAILED: Duration = Duration::from_secs(3);
/// A direction stops starting programs after this long (each remaining one is reported
/// FAIL, not run), so a broken VM cannot hold CI for the sum of every limit. Measured: about
/// 15 s when all pass, 170 s when every program fails at the VM's timeout.
const DIRECTION_BUDGET: Duration = Duration::from_secs(420);

impl Program {
    /// The port of its connection exchange: its place in the matrix.
    fn port(matrix: &[Program], index: usize) -> u16 {
        let base = if std::ptr::eq(matrix, CM_MATRIX) {
            CM_BASE_PORT
        } else {
            BASE_PORT
        };
        base + index as u16
    }

    fn is_perftest(&self) -> bool {
        self.name.starts_with("ib_")
    }

    /// Its options on a device and GID index (`-x` in perftest, `-g` in rdma-core), as the
    /// server (`peer` None) or as the client of the server at `peer`.
    fn args(&self, device: &str, gid: &str, port: u16, peer: Option<&str>) -> Vec<String> {
        let port = port.to_string();
        let mut a: Vec<&str> = match self.kind {
            Kind::Verbs => {
                let gid_flag = if self.is_perftest() { "-x" } else { "-g" };
                let mut a = vec!["-d", device, gid_flag, gid, "-n", self.iters];
                a.extend(self.extra);
                a.extend(["-p", &port]);
                a.extend(peer);
                return a.into_iter().map(str::to_string).collect();
            }
            Kind::Rping => match peer {
                None => vec!["-s", "-a", "0.0.0.0"],
                Some(p) => vec!["-c", "-a", p],
            },
            Kind::Ucmatose | Kind::Udaddy => match peer {
                None => vec![],
                Some(p) => vec!["-s", p],
            },
        };
        if self.kind != Kind::Udaddy {
            a.extend(["-p", &port]);
        }
        a.extend(["-C", self.iters]);
        if self.kind == Kind::Rping {
            a.push("-v");
        }
        a.extend(self.extra);
        a.into_iter().map(str::to_string).collect()
    }

    /// Whether `text` (one side's output) shows the program did its work: the pingpongs
    /// print "N iters in" on both sides; perftest prints its result row on the client.
    fn printed_result(&self, text: &str, client: bool) -> bool {
        let iters: usize = self.iters.parse().expect("a number");
        match (self.kind, self.row_size) {
            // Each side prints every ping's data with -v.
            (Kind::Rping, _) => text.matches("ping data: rdma-ping-").count() >= iters,
            // It says "test complete" whatever happened; the status is the verdict.
            (Kind::Ucmatose | Kind::Udaddy, _) => text.contains("return status 0"),
            (Kind::Verbs, None) => text.contains(&format!("{} iters in", self.iters)),
            (Kind::Verbs, Some(size)) => {
                !client
                    || text.lines().any(|l| {
                        let mut f = l.split_whitespace();
                        f.next() == Some(size) && f.next() == Some(self.iters)
                    })
            }
        }
    }
}

/// The VM's script: a shell function that runs one program of the matrix (busybox sh), then
/// one line per program. `peer`: the server's address when the VM is the client.
///
/// The function prints `@@ BEGIN <port>`, runs the program in the background with a time
/// limit while `nc` listens on port + 100 to kill it (how the other side ends it early) and
/// on port + 200 to start it afresh (it prints `@@ AGAIN <port>`: how our client restarts a
/// server it confused), retries while a client cannot connect yet, prints the program's
/// standard error and then `@@ END <port> rc=<status> tries=<n>`. A client that failed ends
/// its server the same way.
/// Standard output goes to the console as it comes (a terminal: line-buffered), so a program
/// that is killed still shows what it printed.
fn vm_script(matrix: &[Program], peer: Option<&str>) -> String {
    let stop_peer = match peer {
        Some(p) => format!("[ $r = 0 ]||timeout 3 nc {p} $((p+100)) </dev/null >/dev/null 2>&1;"),
        None => String::new(),
    };
    // A client retries while its server is not there yet: a refused TCP exchange, or an
    // rdma_cm request rejected (nothing listens) or unanswered. rping and ucmatose say so
    // on standard output: with `O` set, it goes to /o too (and the console sees it after).
    let mut s = format!(
        "r(){{ p=$1;shift;echo \"@@ BEGIN $p\";i=0;while :;do \
         if [ \"$O\" ];then timeout {VM_PROGRAM_SECS} \"$@\" >/o 2>&1& \
         else timeout {VM_PROGRAM_SECS} \"$@\" 2>/o& fi;w=$!;\
         nc -l -p $((p+100)) -e kill $w& n=$!;nc -l -p $((p+200)) -e sh -c \"touch /a;kill $w\"& m=$!;\
         wait $w;r=$?;kill $n $m 2>/dev/null;\
         if [ -e /a ];then rm /a;echo \"@@ AGAIN $p\";sleep 1;continue;fi;\
         grep -qE \"t connect to|REJECTED|UNREACHABLE|rdma_client f\" /o||break;i=$((i+1));\
         [ $i -lt {VM_CONNECT_TRIES} ]||break;\
         sleep 1;done;cat /o;{stop_peer}echo \"@@ END $p rc=$r tries=$i\";}}\n"
    );
    if matrix.iter().any(|p| p.kind != Kind::Verbs) {
        s.push_str("O=1\n");
    }
    for (i, p) in matrix.iter().enumerate() {
        let port = Program::port(matrix, i);
        let _ = writeln!(
            s,
            "r {port} {} {}",
            p.name,
            p.args(VM_DEVICE, VM_GID, port, peer).join(" ")
        );
    }
    s
}

/// How one program went.
struct Outcome {
    name: &'static str,
    passed: bool,
    /// One line: how each side ended and, for a failure, what the daemon's counters and
    /// the capture say about received packets.
    summary: String,
    /// The details printed for a failure.
    details: String,
}

/// The outcomes of one direction, printable as the report CI shows.
struct Report {
    title: String,
    outcomes: Vec<Outcome>,
    elapsed: Duration,
    /// Shown after the programs (the VM's console when it misbehaved).
    epilogue: String,
}

impl Report {
    fn passed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.passed).count()
    }

    fn table(&self) -> String {
        let mut s = format!(
            "{}: {} of {} passed in {:.0} s\n",
            self.title,
            self.passed(),
            self.outcomes.len(),
            self.elapsed.as_secs_f64()
        );
        for o in &self.outcomes {
            let verdict = if o.passed { "PASS" } else { "FAIL" };
            let _ = writeln!(s, "  {:<18} {verdict}  {}", o.name, o.summary);
        }
        s
    }

    /// Print the table; fail the test with the table and every failure's details unless all
    /// passed.
    fn check(&self) {
        println!("{}", self.table());
        if self.passed() == self.outcomes.len() {
            return;
        }
        let mut s = self.table();
        for o in self.outcomes.iter().filter(|o| !o.passed) {
            let _ = write!(s, "\n========== {}: FAIL ==========\n{}", o.name, o.details);
        }
        if !self.epilogue.is_empty() {
            let _ = write!(s, "\n==========\n{}", self.epilogue);
        }
        // Again at the end, where a long CI log is read first.
        let _ = write!(s, "\n{}", self.table());
        panic!("{s}");
    }
}

/// Our side: a `softrdmad` serving 10.50.0.1 in the namespace on UDP 4791, and the device
/// and GID index the drop-in shows for that address.
struct Ours {
    daemon: TestDaemon,
    device: String,
    gid: String,
}

impl Ours {
    /// `rx_path`: softrdmad's `--rx-path` (its receive policy for rxe's IPv4 IDs).
    fn start(rx_path: RxPath) -> Ours {
        common::require("ibv_devinfo", "ibverbs-utils");
        common::require("ib_write_bw", "perftest");
        common::require("rping", "rdmacm-utils");
        // rdma_cm programs load the drop-in librdmacm.so.1 from the same folder (built by
        // `cargo test --workspace`, or `cargo build -p softrdma-rdmacm`).
        rdmacm_lib::install_beside(&common::library_dir());
        let daemon = TestDaemon::start_with(&[HOST_ADDR], Some(4791), |bin, args| {
            let mut args = args.to_vec();
            args.extend_from_slice(&["--rx-path", rx_path.arg()]);
            Hosts::exec(NS, bin, &args)
        });
        let c = verbs_command(&daemon, "ibv_devinfo", &["-v".to_string()]);
        let o = common::run(c, Duration::from_secs(30));
        let text = String::from_utf8_lossy(&o.stdout);
        let (device, gid) = device_and_gid(&text, HOST_ADDR)
            .unwrap_or_else(|| panic!("no GID of {HOST_ADDR} in ibv_devinfo -v: {}", describe(&o)));
        Ours {
            daemon,
            device,
            gid,
        }
    }

    fn command(&self, prog: &str, args: &[String]) -> Command {
        verbs_command(&self.daemon, prog, args)
    }
}

/// `prog args` in the namespace with the drop-in on the daemon's device for 10.50.0.1;
/// standard output line-buffered (`stdbuf -oL`), so a program killed at its time limit still
/// shows what it printed.
fn verbs_command(daemon: &TestDaemon, prog: &str, args: &[String]) -> Command {
    let mut argv = vec!["netns", "exec", NS, "stdbuf", "-oL", prog];
    argv.extend(args.iter().map(String::as_str));
    common::verbs_command(
        "ip",
        &argv,
        On::Daemon {
            daemon,
            addr: HOST_ADDR,
        },
    )
}

/// From `ibv_devinfo -v`: the device (hca_id) with a GID of `addr` and that GID's index.
fn device_and_gid(devinfo: &str, addr: &str) -> Option<(String, String)> {
    let mut device = None;
    let want = format!("::ffff:{addr},");
    for l in devinfo.lines() {
        let t = l.trim();
        if let Some(d) = t.strip_prefix("hca_id:") {
            device = Some(d.trim().to_string());
        }
        if let Some(rest) = t.strip_prefix("GID[") {
            let (index, value) = rest.split_once("]:")?;
            if value.trim().starts_with(&want) {
                return Some((device?, index.trim().to_string()));
            }
        }
    }
    None
}

/// Counters that changed between two readings, as `name +delta` lines.
fn counter_changes(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> String {
    if after.is_empty() {
        return "  (softrdma stat did not answer: the daemon is gone?)\n".to_string();
    }
    let mut s = String::new();
    for (name, v) in after {
        let d = v.saturating_sub(before.get(name).copied().unwrap_or(0));
        if d != 0 {
            let _ = writeln!(s, "  {name:<40} +{d}");
        }
    }
    s
}

/// The packets in each ICRC class of a capture, from `softrdma decode`'s summary line.
#[derive(Default)]
struct Icrcs {
    good: u64,
    bad: u64,
}

/// `softrdma decode` of a capture (see [`common::decoded`]), and its ICRC counts.
fn decode(pcap: &Path) -> (String, Icrcs) {
    let (summary, text) = common::decoded(pcap);
    let number_before = |what: &str| -> u64 {
        summary
            .split(", ")
            .find_map(|part| {
                let part = part.rsplit(": ").next()?;
                part.strip_suffix(what)?.trim().parse().ok()
            })
            .unwrap_or(0)
    };
    let icrcs = Icrcs {
        good: number_before(" RoCEv2 with good ICRC"),
        bad: number_before(" with bad ICRC"),
    };
    (text, icrcs)
}

/// A fresh folder for one direction's captures.
fn capture_dir(vm: &RxeVm, name: &str) -> PathBuf {
    let dir = vm.work().join("captures").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the capture folder");
    dir
}

/// Everything one program of the VM-against-us directions left, judged.
struct Run<'a> {
    program: &'a Program,
    /// Our program's output.
    ours: Output,
    /// Whether ours was killed at a time limit.
    killed: bool,
    /// Whether ours was the client.
    ours_client: bool,
    /// The VM's exit status for it (None: it never said).
    vm_rc: Option<i32>,
    /// The VM's console lines for it.
    vm_section: String,
    counters: String,
    capture: PathBuf,
    /// softrdmad's rx_bad_icrc count while it ran.
    bad_icrc_drops: u64,
}

impl Run<'_> {
    fn judge(self) -> Outcome {
        let p = self.program;
        let o = &self.ours;
        let ours_ok = o.status.success()
            && !self.killed
            && p.printed_result(&String::from_utf8_lossy(&o.stdout), self.ours_client);
        let ours_text = describe(o)
            + if self.killed {
                "\n(killed at its time limit)"
            } else {
                ""
            };
        let vm_ok = self.vm_rc == Some(0) && p.printed_result(&self.vm_section, !self.ours_client);
        let passed = ours_ok && vm_ok;
        let ours_word = if self.killed {
            "killed at its limit".to_string()
        } else {
            format!("exit {}", o.status.code().unwrap_or(-1))
        };
        let vm_word = rc_word(self.vm_rc);
        let mut summary = format!("softrdma {ours_word}, rxe {vm_word}");
        let mut details = String::new();
        if !passed {
            let (decoded, icrcs) = decode(&self.capture);
            if self.bad_icrc_drops > 0 {
                let _ = write!(
                    summary,
                    "; softrdmad dropped {} as bad ICRC, capture ICRC ok {} bad {}",
                    self.bad_icrc_drops, icrcs.good, icrcs.bad
                );
            }
            let role = if self.ours_client { "client" } else { "server" };
            let vm_role = if self.ours_client { "server" } else { "client" };
            let _ = write!(
                details,
                "--- ours ({role}: drop-in libibverbs on softrdmad, netns {NS}): {ours_text}\n\
                 --- kernel rxe ({vm_role}, VM console): \n{}\n\
                 --- softrdmad counters that changed meanwhile:\n{}\
                 --- capture {} (softrdma decode):\n{decoded}",
                if self.vm_section.is_empty() {
                    "(nothing: the VM never started it)"
                } else {
                    &self.vm_section
                },
                self.counters,
                self.capture.display(),
            );
            if self.bad_icrc_drops > 0 && icrcs.bad == 0 && icrcs.good > 0 {
                let _ = writeln!(
                    details,
                    "--- note: softrdmad counted {} datagrams rx_bad_icrc while every RoCEv2 \
                     ICRC in the capture is valid: its receive path does not see the IPv4 ID \
                     rxe sends (rxe counts IDs up; the UDP path rebuilds ID 0), README \
                     \"Receive policy\".",
                    self.bad_icrc_drops
                );
            }
        }
        Outcome {
            name: p.name,
            passed,
            summary,
            details,
        }
    }
}

/// How a VM's program ended, in a word.
fn rc_word(rc: Option<i32>) -> String {
    match rc {
        Some(143) => "rc=143 (ended by us or its timeout)".to_string(),
        Some(rc) => format!("rc={rc}"),
        None => "no end seen".to_string(),
    }
}

/// A program reported FAIL without running.
fn not_run(p: &Program, why: &str) -> Outcome {
    Outcome {
        name: p.name,
        passed: false,
        summary: format!("not run: {why}"),
        details: format!("not run: {why}\n"),
    }
}

/// Sum of a counter over the daemon's devices (`srxe0.rx_bad_icrc`...) between readings.
fn device_counter_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    counter: &str,
) -> u64 {
    let suffix = format!(".{counter}");
    after
        .iter()
        .filter(|(n, _)| n.ends_with(&suffix))
        .map(|(n, v)| v.saturating_sub(before.get(n).copied().unwrap_or(0)))
        .sum()
}

/// Why the VM cannot run programs now, if it cannot.
fn vm_unavailable(vm: &mut Vm, start: Instant) -> Option<&'static str> {
    if start.elapsed() > DIRECTION_BUDGET {
        Some("the direction's time budget is spent")
    } else if !vm.running() {
        Some("the VM is not running")
    } else if !vm.is_ready() && start.elapsed() > READY_LIMIT {
        Some("the VM did not start its script in time")
    } else {
        None
    }
}

/// The VM's console and run-vm.sh's output, for a report whose VM misbehaved.
fn vm_epilogue(vm: &Vm, ready: bool, powered_off: bool) -> String {
    if ready && powered_off {
        return String::new();
    }
    let log = vm.log();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!(
        "the VM {}; last lines of its console:\n{}\n--- run-vm.sh output:\n{}",
        if ready {
            "did not power off by itself"
        } else {
            "never started its script"
        },
        tail.join("\n"),
        vm.tool_output()
    )
}

/// Who serves in a direction.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serves {
    /// Kernel rxe serves each program in the VM; ours are the clients.
    Rxe,
    /// Ours serve; kernel rxe in the VM connects.
    Softrdma,
}

/// How softrdmad receives rxe's packets (runtime docs, "Receive policy").
#[derive(Clone, Copy, PartialEq, Eq)]
enum RxPath {
    /// softrdmad's default: a raw socket where it may open one (as here, root), which sees
    /// rxe's IPv4 IDs: every ICRC checked exactly.
    Auto,
    /// A UDP socket, which hides rxe's IDs: the engine finds the one the ICRC holds for.
    Udp,
}

impl RxPath {
    fn arg(self) -> &'static str {
        match self {
            RxPath::Auto => "auto",
            RxPath::Udp => "udp",
        }
    }
}

/// One direction: one VM runs its side of the whole matrix in order while ours run theirs,
/// each program captured on br0 with the daemon's counters read before and after.
fn direction(matrix: &[Program], serves: Serves, rx_path: RxPath) -> Report {
    let vm = RxeVm::prepare();
    let mut ours = Ours::start(rx_path);
    let (name, title, peer) = match serves {
        Serves::Rxe => (
            "rxe-serves",
            format!(
                "kernel rxe serves ({VM_ADDR} {VM_DEVICE} GID {VM_GID}), softrdma connects \
                 ({HOST_ADDR} {} GID {}, --rx-path {})",
                ours.device,
                ours.gid,
                rx_path.arg()
            ),
            None,
        ),
        Serves::Softrdma => (
            "softrdma-serves",
            format!(
                "softrdma serves ({HOST_ADDR} {} GID {}, --rx-path {}), kernel rxe connects \
                 ({VM_ADDR} {VM_DEVICE} GID {VM_GID})",
                ours.device,
                ours.gid,
                rx_path.arg()
            ),
            Some(HOST_ADDR),
        ),
    };
    let name = if std::ptr::eq(matrix, CM_MATRIX) {
        format!("cm-{name}")
    } else {
        name.to_string()
    };
    let captures = capture_dir(&vm, &name);
    let start = Instant::now();
    let mut booted = vm.boot(&vm_script(matrix, peer));
    // Our servers wait for the VM's clients anyway; our clients wait for the VM here.
    if serves == Serves::Rxe {
        booted.wait_ready(READY_LIMIT);
    }
    let mut outcomes = Vec::new();
    let first = ours.daemon.counters();
    for (i, p) in matrix.iter().enumerate() {
        if let Some(why) = vm_unavailable(&mut booted, start) {
            outcomes.push(not_run(p, why));
            continue;
        }
        let port = Program::port(matrix, i);
        let capture = Capture::start(&captures.join(format!("{i}-{}.pcap", p.name)));
        let before = ours.daemon.counters();
        let (out, killed) = match serves {
            Serves::Rxe => run_client(&ours, &mut booted, p, port),
            // The first server also waits for the VM to boot.
            Serves::Softrdma => {
                let boot = if i == 0 { READY_LIMIT } else { Duration::ZERO };
                run_server(&ours, &mut booted, p, port, SERVER_LIMIT + boot)
            }
        };
        // The VM's side ends by itself once ours succeeded; when ours failed, it is ended.
        let vm_rc = if out.status.success() {
            booted.wait_end(port, END_LIMIT)
        } else {
            None
        }
        .or_else(|| booted.stop_program(port, END_LIMIT));
        let capture = capture.stop();
        let after = ours.daemon.counters();
        outcomes.push(
            Run {
                program: p,
                ours: out,
                killed,
                ours_client: serves == Serves::Rxe,
                vm_rc,
                vm_section: rxe_vm::section(&booted.log(), port),
                counters: counter_changes(&before, &after),
                capture,
                bad_icrc_drops: device_counter_delta(&before, &after, "rx_bad_icrc"),
            }
            .judge(),
        );
    }
    // The receive policy did what it says: the raw path sees rxe's real IDs (nothing to
    // recover), the UDP path recovers them; neither drops a good packet.
    let last = ours.daemon.counters();
    let recovered = device_counter_delta(&first, &last, "rx_icrc_id_recovered");
    let dropped = device_counter_delta(&first, &last, "rx_bad_icrc");
    let policy_held = dropped == 0
        && match rx_path {
            RxPath::Auto => recovered == 0,
            RxPath::Udp => recovered > 0,
        };
    outcomes.push(Outcome {
        name: "receive policy",
        passed: policy_held,
        summary: format!(
            "--rx-path {}: {recovered} IPv4 IDs recovered, {dropped} dropped as bad ICRC",
            rx_path.arg()
        ),
        details: format!(
            "expected no rx_bad_icrc, and rx_icrc_id_recovered {} (got {recovered}, {dropped})\n",
            if rx_path == RxPath::Udp { "> 0" } else { "= 0" }
        ),
    });
    if !std::ptr::eq(matrix, CM_MATRIX) {
        // The bandwidth programs' full-size packets left as GSO trains, cut by the kernel
        // before the VM's NIC: rxe checked every segment's ICRC for the ID the kernel gave
        // it, or the programs above would have failed.
        let trains = device_counter_delta(&first, &last, "tx_trains");
        outcomes.push(Outcome {
            name: "GSO trains",
            passed: trains > 0,
            summary: format!("{trains} UDP GSO trains sent to rxe"),
            details: format!("expected tx_trains > 0 (got {trains})\n"),
        });
    }
    let ready = booted.is_ready();
    let powered_off = booted.power_off(Duration::from_secs(60));
    if let Some(st) = ours.daemon.exited() {
        outcomes.push(Outcome {
            name: "softrdmad",
            passed: false,
            summary: format!("exited ({st}) before the end"),
            details: format!("softrdmad exited: {st} (SOFTRDMAD_TEST_LOG=1 shows its log)\n"),
        });
    }
    Report {
        title,
        outcomes,
        elapsed: start.elapsed(),
        epilogue: vm_epilogue(&booted, ready, powered_off),
    }
}

/// Our client against the VM's server on `port`, retried while that server is not listening
/// yet (and still to come). Returns its output and whether it was killed at its limit.
fn run_client(ours: &Ours, vm: &mut Vm, p: &Program, port: u16) -> (Output, bool) {
    let args = p.args(&ours.device, &ours.gid, port, Some(VM_ADDR));
    let tried = Instant::now();
    loop {
        let g = Guard(Some(
            ours.command(p.name, &args)
                .spawn()
                .expect("spawn our client"),
        ));
        let (o, killed) = finish(g, PROGRAM_LIMIT);
        // Failed only because the VM's server was not listening yet (`common::too_early`).
        let early = common::too_early(&o);
        if early.is_some()
            && vm.ended(port).is_none()
            && vm.running()
            && tried.elapsed() < CONNECT_LIMIT
        {
            // perftest's `-R` client connects its test QP right after the handshake
            // connection, and the emulated VM's server may not listen for it yet: rejected
            // then, the client's retry would start a new handshake that the server takes
            // for its test connection (both then wait until their timeouts). Start the
            // server afresh first.
            if matches!(early, Some(common::TooEarly::PerftestServerListenedLate))
                && !vm.restart_program(port, END_LIMIT)
            {
                return (o, killed);
            }
            std::thread::sleep(Duration::from_millis(500));
            continue;
        }
        return (o, killed);
    }
}

/// Our server on `port` for the VM's client: it runs until it exits, or the VM's client
/// ended (then it gets a grace to finish), or `limit`. Returns its output and whether it was
/// killed.
fn run_server(ours: &Ours, vm: &mut Vm, p: &Program, port: u16, limit: Duration) -> (Output, bool) {
    let args = p.args(&ours.device, &ours.gid, port, None);
    let mut g = Guard(Some(
        ours.command(p.name, &args)
            .spawn()
            .expect("spawn our server"),
    ));
    let served = Instant::now();
    // The programs print far less than a pipe holds, so their output can wait unread.
    let grace = loop {
        let child = g.0.as_mut().expect("child present");
        if !matches!(child.try_wait(), Ok(None)) {
            break Duration::ZERO;
        }
        match vm.ended(port) {
            Some(0) => break GRACE_OK,
            Some(_) => break GRACE_FAILED,
            None => {}
        }
        if !vm.running() {
            break GRACE_FAILED;
        }
        if served.elapsed() > limit {
            break Duration::ZERO;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    finish(g, grace)
}

/// `matrix` between two kernel rxe VMs: the harness and the VM work, so a failure of the
/// directions against softrdma is ours to read.
fn vm_pair(matrix: &[Program], name: &str) -> Report {
    let vm = RxeVm::prepare();
    let captures = capture_dir(&vm, name);
    let pcap = captures.join("pair.pcap");
    let start = Instant::now();
    let run = vm.pair(
        &vm_script(matrix, None),
        &vm_script(matrix, Some(VM_ADDR)),
        &pcap,
        Duration::from_secs(600),
    );
    let mut outcomes = Vec::new();
    for (i, p) in matrix.iter().enumerate() {
        let port = Program::port(matrix, i);
        let (srv, cli) = (
            rxe_vm::section(&run.server, port),
            rxe_vm::section(&run.client, port),
        );
        let (src, crc) = (
            rxe_vm::end_status(&run.server, port),
            rxe_vm::end_status(&run.client, port),
        );
        let passed = src == Some(0)
            && crc == Some(0)
            && p.printed_result(&srv, false)
            && p.printed_result(&cli, true);
        outcomes.push(Outcome {
            name: p.name,
            passed,
            summary: format!("server {}, client {}", rc_word(src), rc_word(crc)),
            details: if passed {
                String::new()
            } else {
                format!("--- server VM:\n{srv}\n--- client VM:\n{cli}\n")
            },
        });
    }
    let all = outcomes.iter().all(|o| o.passed);
    let epilogue = if all {
        String::new()
    } else {
        format!(
            "run-vm.sh pair{}: {}\n--- capture {} (softrdma decode):\n{}",
            if run.timed_out {
                " (killed at its limit)"
            } else {
                ""
            },
            describe(&run.output),
            pcap.display(),
            decode(&pcap).0
        )
    };
    Report {
        title: "kernel rxe serves (10.50.0.11), kernel rxe connects (10.50.0.12)".to_string(),
        outcomes,
        elapsed: start.elapsed(),
        epilogue,
    }
}

#[test]
fn the_harness_runs_the_matrix_between_two_kernel_rxe_vms() {
    vm_pair(MATRIX, "rxe-pair").check();
}

#[test]
fn the_harness_runs_the_rdma_cm_matrix_between_two_kernel_rxe_vms() {
    vm_pair(CM_MATRIX, "rxe-pair-cm").check();
}

#[test]
fn softrdma_clients_run_the_matrix_against_kernel_rxe_servers() {
    direction(MATRIX, Serves::Rxe, RxPath::Auto).check();
}

#[test]
fn kernel_rxe_clients_run_the_matrix_against_softrdma_servers() {
    direction(MATRIX, Serves::Softrdma, RxPath::Auto).check();
}

/// rping, ucmatose and ib_write_bw -R through the drop-in librdmacm against the kernel's
/// rdma_cm: the CM protocol on QP1, our side the active one.
///
/// Run again once, in a fresh VM, when a program failed. (perftest's `-R` client connects its
/// test QP right after its handshake connection, and a server in the emulated VM that is
/// slower than that to listen rejects it: REJ reason 8, invalid service ID, seen in a
/// capture. `run_client` then starts that server afresh before it retries.) A second failure
/// fails the test, with both reports.
#[test]
fn softrdma_rdma_cm_clients_connect_to_kernel_rdma_cm_servers() {
    let first = direction(CM_MATRIX, Serves::Rxe, RxPath::Auto);
    if first.passed() == first.outcomes.len() {
        return first.check();
    }
    let mut again = direction(CM_MATRIX, Serves::Rxe, RxPath::Auto);
    again.epilogue = format!(
        "{}\n========== the first run ==========\n{}",
        again.epilogue,
        first.table()
    );
    println!(
        "the first run failed; a second run in a fresh VM:\n{}",
        first.table()
    );
    again.check();
}

/// The kernel's rdma_cm connects to our listens.
#[test]
fn kernel_rdma_cm_clients_connect_to_softrdma_rdma_cm_servers() {
    direction(CM_MATRIX, Serves::Softrdma, RxPath::Auto).check();
}

/// The unprivileged receive path: rxe's IPv4 IDs are hidden and recovered from the ICRC.
#[test]
fn softrdma_clients_on_the_udp_receive_path_run_the_matrix_against_kernel_rxe_servers() {
    direction(MATRIX, Serves::Rxe, RxPath::Udp).check();
}

/// The unprivileged receive path, with rxe connecting.
#[test]
fn kernel_rxe_clients_run_the_matrix_against_softrdma_servers_on_the_udp_receive_path() {
    direction(MATRIX, Serves::Softrdma, RxPath::Udp).check();
}

#[test]
fn the_vm_scripts_fit_on_the_kernel_command_line() {
    // boot() and pair() check it too; this says so without root or a VM.
    for m in [MATRIX, CM_MATRIX] {
        rxe_vm::assert_script_fits(&vm_script(m, None));
        rxe_vm::assert_script_fits(&vm_script(m, Some(HOST_ADDR)));
    }
}
