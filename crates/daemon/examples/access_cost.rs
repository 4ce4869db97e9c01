//! What one access to a client's memory costs, by each way the daemon could make it: nanoseconds
//! per read and per write of 2 B, 4 KiB, 64 KiB and 256 KiB into another process, in the same
//! run. `process_vm_*` names the process by pid (the daemon's way until issue 13 item 8); the
//! daemon now uses the `/proc/<pid>/mem` it opened at connect ([`ClientProcess`]). A pidfd poll
//! is what checking the process after each `process_vm_*` call would add.
//!
//! A benchmark, not a test (it measures, it checks nothing):
//! `cargo run --release -p softrdma-daemon --example access_cost`.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::Instant;

use daemon::memory::ClientProcess;
use nix::sys::uio::{process_vm_readv, process_vm_writev, RemoteIoVec};
use nix::unistd::Pid;

const ROLE: &str = "SOFTRDMAD_TEST_ACCESS_COST_SOCKET";
const LEN: usize = 256 << 10;
const SIZES: [usize; 4] = [2, 4 << 10, 64 << 10, 256 << 10];
/// Rounds of every measurement; the best is kept (the others met a busy core).
const ROUNDS: usize = 5;

/// The measured process's half (this program re-executed with `ROLE` set): `LEN` bytes,
/// every page touched, their address said, and a wait for the end.
fn role_target(path: std::ffi::OsString) {
    let _s = UnixStream::connect(path).unwrap();
    let mem = vec![1u8; LEN];
    println!("TARGET {}", mem.as_ptr() as u64);
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    drop(std::hint::black_box(mem));
}

/// Best nanoseconds per call of `f` over `ROUNDS` rounds of `n` calls.
fn ns_per(n: usize, mut f: impl FnMut()) -> f64 {
    (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_nanos() as f64 / n as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    if let Some(path) = std::env::var_os(ROLE) {
        return role_target(path);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("target.sock");
    let l = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(ROLE, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let addr: usize = loop {
        let mut line = String::new();
        assert_ne!(
            out.read_line(&mut line).unwrap(),
            0,
            "the target said nothing"
        );
        if let Some(at) = line.find("TARGET ") {
            break line[at + 7..].trim().parse().unwrap();
        }
    };
    let (s, _) = l.accept().unwrap();
    let process = ClientProcess::of_peer(&s).unwrap();
    let pid = Pid::from_raw(process.pid());
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(process.pid()).unwrap(),
        rustix::process::PidfdFlags::empty(),
    )
    .unwrap();
    let mut buf = vec![0u8; LEN];

    println!("ns per access into another process (best of {ROUNDS} rounds)");
    println!(
        "{:>8} {:>14} {:>14} {:>14} {:>14}",
        "bytes", "vm_readv", "mem pread", "vm_writev", "mem pwrite"
    );
    for size in SIZES {
        let n = (256usize << 20).div_ceil(size).clamp(2_000, 200_000);
        let remote = [RemoteIoVec {
            base: addr,
            len: size,
        }];
        let vm_read = ns_per(n, || {
            let mut local = [std::io::IoSliceMut::new(&mut buf[..size])];
            assert_eq!(process_vm_readv(pid, &mut local, &remote).unwrap(), size);
        });
        let mem_read = ns_per(n, || process.read(addr, &mut buf[..size]).unwrap());
        let vm_write = ns_per(n, || {
            let local = [std::io::IoSlice::new(&buf[..size])];
            assert_eq!(process_vm_writev(pid, &local, &remote).unwrap(), size);
        });
        let mem_write = ns_per(n, || process.write(addr, &buf[..size]).unwrap());
        println!("{size:>8} {vm_read:>14.0} {mem_read:>14.0} {vm_write:>14.0} {mem_write:>14.0}");
    }
    let poll = ns_per(200_000, || {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::ZERO).unwrap(), 0);
    });
    println!("pidfd poll (is it alive?): {poll:.0} ns");

    writeln!(child.stdin.take().unwrap(), "done").unwrap();
    child.wait().unwrap();
}
