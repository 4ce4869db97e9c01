//! A client dies while its connections live on (a child it forked holds the sockets, so the
//! daemon reclaims nothing), and another user's process takes its pid, with memory mapped at
//! the very addresses the dead client registered. RDMA WRITEs and READs aimed at the dead
//! client's regions must fail, and the process that now has its pid must never be touched:
//! the daemon reaches the process that connected, not whichever holds its number (issue 13,
//! item 8).
//!
//! The pid is taken deterministically, as CRIU restores pids: the test writes the dead
//! client's pid minus one to `/proc/sys/kernel/ns_last_pid` and starts the new process at
//! once (again if something else took the number first). That needs root.
//!
//! Below it, the binding itself: a peer that exited before it was served is not bound, not
//! even once its pid is another process's, and a bound process that died is reached no more
//! (its accesses are faults, which the engine answers with a NAK).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use abi::client::Client;
use abi::wqe::Cqe;
use common::{hex, say, unhex, Daemon, Side, ALL_ACCESS};
use daemon::memory::{range_is_mapped, BindError, ClientProcess};
use engine::{SendFlags, SendOp, SendPayload, SendWr, Sge};

const SIGNALED: u32 = 2;
/// `IBV_WC_REM_ACCESS_ERR` and `IBV_WC_REM_OP_ERR`: how a responder's refusal to touch
/// memory reaches the requester (the engine reports a fault of registered memory as the
/// latter).
const REM_ACCESS_ERR: u32 = 10;
const REM_OP_ERR: u32 = 11;

/// Which part a re-executed test binary plays.
const ROLE: &str = "SOFTRDMAD_TEST_PID_REUSE_ROLE";
const SOCKET: &str = "SOFTRDMAD_TEST_PID_REUSE_SOCKET";

/// Where the dying client and the impostor both map their memory: a fixed address, so the
/// impostor's bytes sit exactly where the dead client's registered region was.
const ADDR: u64 = 0x6b6b_0000_0000;
const LEN: usize = 64 << 10;
/// What the impostor fills its memory with.
const PATTERN: u8 = 0xa5;
/// QP pairs between the test and the dying client, one per access tried after its death (a
/// refused access moves its QPs to the error state).
const PAIRS: usize = 4;
/// The impostor's user: another user's process, as in the issue.
const NOBODY: u32 = 65534;

/// `LEN` bytes of fresh anonymous memory at `ADDR` (never over an existing mapping).
#[allow(unsafe_code)]
fn map_at_addr(fill: u8) -> *mut u8 {
    use rustix::mm::{mmap_anonymous, MapFlags, ProtFlags};
    // SAFETY: FIXED_NOREPLACE maps nothing over memory this process already uses.
    let p = unsafe {
        mmap_anonymous(
            ADDR as *mut _,
            LEN,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::FIXED_NOREPLACE,
        )
    }
    .expect("map the test region at its fixed address");
    assert_eq!(p as u64, ADDR);
    let p = p.cast::<u8>();
    for i in 0..LEN {
        // SAFETY: within the mapping just made; volatile because the daemon may write it.
        unsafe { std::ptr::write_volatile(p.add(i), fill) };
    }
    p
}

/// The dying client's half (a no-op unless the test re-executes this binary for it): QPs on
/// `PAIRS` connections, each with a region over `ADDR`, connected to the test's QPs; then a
/// child that inherits every connection, and a wait to be killed.
#[test]
fn role_dying_client() {
    if std::env::var(ROLE).as_deref() != Ok("dying_client") {
        return;
    }
    let socket = std::env::var_os(SOCKET).expect("the daemon's socket");
    map_at_addr(b'c');
    let mut sides: Vec<Side> = (0..PAIRS)
        .map(|_| Side::new(Client::connect(&socket).unwrap(), 64))
        .collect();
    let mut line = format!("CLIENT {}", hex(&sides[0].gid));
    for s in &mut sides {
        let mr = s
            .client
            .reg_mr_at(s.pd, ADDR, LEN as u64, ALL_ACCESS)
            .unwrap();
        line += &format!(" {} {}", s.qpn, mr.rkey);
    }
    say(&line);
    let mut peer = String::new();
    std::io::stdin().read_line(&mut peer).unwrap();
    let mut f = peer.split_whitespace();
    let gid = unhex(f.next().unwrap());
    for s in &mut sides {
        s.connect(gid, f.next().unwrap().parse().unwrap());
    }
    say(&format!("HOLDER {}", fork_holder()));
    std::thread::sleep(Duration::from_secs(120));
}

/// A child that holds every descriptor of this process (the connections among them) and
/// outlives it.
#[allow(unsafe_code)]
fn fork_holder() -> i32 {
    use nix::unistd::{alarm, fork, pause, ForkResult};
    // SAFETY: the child only calls async-signal-safe functions (alarm, pause) until it dies.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            // Gone in two minutes even if the test never kills it.
            alarm::set(120);
            loop {
                pause();
            }
        }
        ForkResult::Parent { child } => child.as_raw(),
    }
}

/// The impostor's half (a no-op unless re-executed for it): memory at `ADDR` full of
/// `PATTERN`; on a line from the test, say how many of those bytes changed.
#[test]
#[allow(unsafe_code)]
fn role_impostor() {
    if std::env::var(ROLE).as_deref() != Ok("impostor") {
        return;
    }
    let p = map_at_addr(PATTERN);
    say("IMPOSTOR ready");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let changed = (0..LEN)
        // SAFETY: within the mapping; volatile because the daemon may have written it.
        .filter(|&i| unsafe { std::ptr::read_volatile(p.add(i)) } != PATTERN)
        .count();
    say(&format!("IMPOSTOR changed {changed}"));
}

/// A re-executed test binary playing a role, its lines read by a thread so that a stuck one
/// fails the test instead of hanging it. Killed on drop.
struct Role {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Role {
    fn start(role: &str, socket: Option<&std::path::Path>, uid: Option<u32>) -> Role {
        let test = format!("role_{role}");
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", &test, "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(s) = socket {
            cmd.env(SOCKET, s);
        }
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().expect("re-execute the test binary");
        let stdin = child.stdin.take().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Role {
            child,
            stdin,
            lines,
        }
    }

    /// What follows `prefix` on the next line that has it.
    fn line(&self, prefix: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| panic!("waited in vain for a line {prefix:?}"));
            // The harness may have started the line ("test role_impostor ... ").
            if let Some(at) = l.find(prefix) {
                return l[at + prefix.len()..].trim().to_string();
            }
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for Role {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process killed when the test ends, however it ends.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// Start the impostor with pid `pid`, which no process holds: the kernel gives the next
/// process the number after `ns_last_pid`. Another process or thread starting at the same
/// moment (this binary's tests run in parallel, and every thread takes a number too) may
/// take it first; then wait until its holder is gone and try again.
fn start_impostor_as(pid: i32) -> Role {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            // Taken (by a process, or by a thread: `/proc/<tid>` answers too).
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("write /proc/sys/kernel/ns_last_pid");
        let r = Role::start("impostor", None, Some(NOBODY));
        if r.pid() == pid {
            return r;
        }
    }
    panic!("could not start a process with pid {pid}: still taken after a minute");
}

/// Post `op` of `len` bytes from/to offset `local` of `side`'s buffer; its completion.
fn one(side: &mut Side, op: SendOp, local: usize, len: usize) -> Cqe {
    let wr = SendWr {
        wr_id: 7,
        op,
        flags: SendFlags::from_bits_truncate(SIGNALED),
        payload: SendPayload::Sges(
            vec![Sge {
                addr: side.buf.addr() + local as u64,
                length: len as u32,
                lkey: side.lkey,
            }]
            .into(),
        ),
    };
    side.client.post_send(side.qp, &wr).unwrap();
    side.wait(1).remove(0)
}

#[test]
fn a_dead_clients_pid_taken_by_another_process_is_never_reached_by_its_peers_writes() {
    if !rustix::process::geteuid().is_root() {
        eprintln!(
            "skipped: needs root (it sets /proc/sys/kernel/ns_last_pid to hand a pid over, \
             and starts a process as another user)"
        );
        return;
    }
    let d = Daemon::start();
    let mut me: Vec<Side> = (0..PAIRS).map(|_| Side::new(d.client(), LEN)).collect();
    let client = Role::start("dying_client", Some(&d.socket), None);
    let info = client.line("CLIENT ");
    let mut f = info.split_whitespace();
    let gid = unhex(f.next().unwrap());
    let theirs: Vec<(u32, engine::Rkey)> = (0..PAIRS)
        .map(|_| {
            let qpn = f.next().unwrap().parse().unwrap();
            (qpn, engine::Rkey::new(f.next().unwrap().parse().unwrap()))
        })
        .collect();
    let mut reply = hex(&me[0].gid);
    for (s, &(qpn, _)) in me.iter_mut().zip(&theirs) {
        s.connect(gid, qpn);
        reply += &format!(" {}", s.qpn);
    }
    {
        let mut stdin = &client.stdin;
        writeln!(stdin, "{reply}").unwrap();
    }
    let _holder = KillOnDrop(client.line("HOLDER ").parse().unwrap());

    // While the client lives, its region is reached: the same WRITE and READ that must fail
    // later succeed now.
    me[0].buf.write(0, b"ok");
    let write = |i: usize, off: u64| SendOp::RdmaWrite {
        remote_addr: ADDR + off,
        rkey: theirs[i].1,
    };
    let read = |i: usize, off: u64| SendOp::RdmaRead {
        remote_addr: ADDR + off,
        rkey: theirs[i].1,
    };
    assert_eq!(one(&mut me[0], write(0, 0), 0, 2).status, 0);
    assert_eq!(one(&mut me[0], read(0, 0), 16, 2).status, 0);
    assert_eq!(me[0].buf.read(16, 2), b"ok");

    // The client dies; its child keeps the connections (and so its regions) alive.
    let pid = client.pid();
    drop(client);
    assert_eq!(
        d.stat("clients_reclaimed"),
        0,
        "the connections outlive the client"
    );
    let impostor = start_impostor_as(pid);
    impostor.line("IMPOSTOR ready");

    // Every access the dead client's keys allow, to the addresses the impostor now uses.
    for s in &mut me {
        let len = s.buf.len();
        s.buf.write(0, &vec![b'w'; len]);
    }
    let statuses = [
        ("WRITE 2 B", one(&mut me[0], write(0, 0), 0, 2).status),
        (
            "WRITE 4 KiB",
            one(&mut me[1], write(1, 4096), 0, 4096).status,
        ),
        ("WRITE 64 KiB", one(&mut me[2], write(2, 0), 0, LEN).status),
        ("READ 4 KiB", one(&mut me[3], read(3, 8192), 0, 4096).status),
    ];
    {
        let mut stdin = &impostor.stdin;
        writeln!(stdin, "CHECK").unwrap();
    }
    let changed: usize = impostor.line("IMPOSTOR changed ").parse().unwrap();
    let read_back = me[3].buf.read(0, 4096);
    assert_eq!(
        changed, 0,
        "pid {pid}'s new process had {changed} bytes changed (completions: {statuses:?})"
    );
    assert!(
        !read_back.contains(&PATTERN),
        "a READ of the dead client brought back pid {pid}'s new process's bytes"
    );
    for (what, status) in statuses {
        assert!(
            status == REM_OP_ERR || status == REM_ACCESS_ERR,
            "{what} to the dead client completed with status {status}, not a remote error"
        );
    }
    assert_eq!(d.stat("clients_reclaimed"), 0);
}

/// A plain peer's half (a no-op unless re-executed for it): connect to the test's socket,
/// say where 64 bytes of `PATTERN` are, and exit on a line from the test.
#[test]
fn role_peer() {
    if std::env::var(ROLE).as_deref() != Ok("peer") {
        return;
    }
    let _s = UnixStream::connect(std::env::var_os(SOCKET).unwrap()).unwrap();
    let bytes = vec![PATTERN; 64];
    say(&format!("PEER {}", bytes.as_ptr() as u64));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    drop(std::hint::black_box(bytes));
}

/// A listener on a fresh path, and a peer process connected to it, the connection accepted.
fn accepted_peer() -> (tempfile::TempDir, UnixStream, Role, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("peer.sock");
    let l = UnixListener::bind(&path).unwrap();
    let peer = Role::start("peer", Some(&path), None);
    let addr = peer.line("PEER ").parse().unwrap();
    let (s, _) = l.accept().unwrap();
    (dir, s, peer, addr)
}

#[test]
fn a_connection_whose_process_exited_before_it_was_served_is_not_bound() {
    let (_dir, s, mut peer, _) = accepted_peer();
    let pid = peer.pid();
    writeln!(&peer.stdin, "bye").unwrap();
    peer.child.wait().unwrap();
    // Its number is free for anyone now: opening `/proc/<pid>` would reach whoever takes it.
    let r = ClientProcess::of_peer(&s);
    assert!(r.is_err(), "bound to a process that had exited: {r:?}");
    if rustix::process::geteuid().is_root() {
        let impostor = start_impostor_as(pid);
        impostor.line("IMPOSTOR ready");
        let r = ClientProcess::of_peer(&s);
        assert!(
            matches!(r, Err(BindError::Exited(p)) if p == pid),
            "bound to the process that took the dead peer's pid: {r:?}"
        );
        // Before Linux 6.5 (no SO_PEERPIDFD) the process with the number must hold the
        // connection's other end, which the one that took the number does not.
        let r = ClientProcess::of_peer_by_socket(&s);
        assert!(
            matches!(r, Err(BindError::NotPeer(p)) if p == pid),
            "bound by socket to the process that took the dead peer's pid: {r:?}"
        );
    } else {
        eprintln!("part skipped: handing the dead peer's pid to another process needs root");
    }
    // A living peer is bound (this process, at the other end of a pair it made), either way.
    let (a, _b) = UnixStream::pair().unwrap();
    ClientProcess::of_peer(&a).unwrap();
    ClientProcess::of_peer_by_socket(&a).unwrap();
}

#[test]
fn a_bound_process_that_died_is_reached_no_more_and_accesses_fail_cleanly() {
    let (_dir, s, peer, addr) = accepted_peer();
    let p = ClientProcess::of_peer(&s).unwrap();
    assert_eq!(p.pid(), peer.pid());
    let mut got = [0u8; 64];
    p.read(addr as usize, &mut got).unwrap();
    assert_eq!(got, [PATTERN; 64]);
    assert!(range_is_mapped(&p, addr, 64));
    p.write(addr as usize, b"still here").unwrap();
    drop(peer);
    // Faults, as an unmapped range is: the engine answers them with a NAK.
    assert!(p.read(addr as usize, &mut got).is_err());
    assert!(p.write(addr as usize, b"gone").is_err());
    assert!(!range_is_mapped(&p, addr, 64));
}
