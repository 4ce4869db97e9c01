//! Two hosts on one machine: two network namespaces joined by a veth pair with the usual
//! 1500-byte MTU, a `softrdmad` in each, and in each a client process driving its own daemon.
//! The clients connect RC QPs across the link and do SEND/RECV, RDMA WRITE and RDMA READ of
//! multi-packet messages; the data is checked where it lands, and the daemons' counters and
//! the veth's own show the packets crossed the link as UDP, none larger than the link allows.
//! A device spanning loopback and the 1500-byte link offers the smaller link's MTU.
//!
//! The client processes are this test binary run again inside a namespace with a filter
//! (`netns_peer`, a no-op in a normal run), talking to the parent over stdin/stdout.
//!
//! Needs root (`ip netns`, as CI runs); without it the test FAILS saying so. The namespaces
//! are deleted and every process killed even when it fails.

mod common;
#[path = "../../cli/tests/hosts/mod.rs"]
mod hosts;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use abi::client::Client;
use common::{hex, say, unhex, Side, Stats};
use engine::{RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge};
use hosts::Hosts;

const ROLE_ENV: &str = "SOFTRDMAD_NETNS_ROLE";
const SOCKET_ENV: &str = "SOFTRDMAD_NETNS_SOCKET";
const SIGNALED: u32 = 2;
/// How long any one step may take before the test gives up (generous; no timing asserted).
const STEP: Duration = Duration::from_secs(20);

/// Each client's registered buffer.
const LEN: usize = 256 * 1024;
/// The SEND: 8 KiB from a's offset 0 into b's offset 0.
const SEND_AT: usize = 0;
const SEND_LEN: usize = 8 * 1024;
/// A small SEND after the WRITE: b's second receive, at this offset of both buffers.
const NOTE_AT: usize = 16 * 1024;
const NOTE: &[u8] = b"after the write";
/// The WRITE: 64 KiB from a's offset into b's same offset.
const WRITE_AT: usize = 64 * 1024;
const WRITE_LEN: usize = 64 * 1024;
/// The READ: 32 KiB of b's (filled by b) into a's same offset.
const READ_AT: usize = 160 * 1024;
const READ_LEN: usize = 32 * 1024;
/// The link's MTU, and the port MTU a device on it must offer: the largest IB MTU whose
/// RoCEv2 packets (up to 96 bytes of headers) fit 1500 bytes.
const LINK_MTU: u32 = 1500;
const PORT_MTU: u32 = 1024;
/// The most bytes a packet of a 1024-byte path MTU can take (IPv4 20, UDP 8, BTH 12, RETH
/// 16, payload 1024, ICRC 4), with room to spare: anything above it broke the path MTU.
const MAX_PACKET: u64 = 1024 + 96;

/// Bytes no two regions share, so a misplaced one shows.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed ^ (i >> 8) as u8)
        .collect()
}

fn hear() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    line
}

fn wr(wr_id: u64, op: SendOp, me: &Side, at: usize, len: usize) -> SendWr {
    SendWr {
        wr_id,
        op,
        flags: SendFlags::from_bits_truncate(SIGNALED),
        payload: SendPayload::Sges(
            vec![Sge {
                addr: me.buf.addr() + at as u64,
                length: len as u32,
                lkey: me.lkey,
            }]
            .into(),
        ),
    }
}

/// One host's client: run only when the parent test re-executes this binary inside a
/// namespace with `ROLE_ENV` set (a no-op otherwise). Role `a` sends, writes and reads;
/// role `b` receives and checks what landed in its memory.
#[test]
fn netns_peer() {
    let (Some(role), Some(socket)) = (std::env::var_os(ROLE_ENV), std::env::var_os(SOCKET_ENV))
    else {
        return;
    };
    let active = role == "a";
    let mut client = Client::connect(socket).unwrap();
    let port = client.query_port(0, 1).unwrap();
    let mut me = Side::new(client, LEN);
    if active {
        me.buf.write(SEND_AT, &pattern(1, SEND_LEN));
        me.buf.write(NOTE_AT, NOTE);
        me.buf.write(WRITE_AT, &pattern(2, WRITE_LEN));
    } else {
        me.buf.write(READ_AT, &pattern(3, READ_LEN));
    }
    say(&format!(
        "PEER {} {} {} {} {}",
        hex(&me.gid),
        me.qpn,
        me.rkey.value(),
        me.buf.addr(),
        port.active_mtu.bytes()
    ));
    let line = hear();
    let f: Vec<&str> = line.split_whitespace().collect();
    let (gid, qpn) = (unhex(f[0]), f[1].parse::<u32>().unwrap());
    let (rkey, raddr) = (
        engine::Rkey::new(f[2].parse::<u32>().unwrap()),
        f[3].parse::<u64>().unwrap(),
    );
    // The path MTU an application picks: the smaller of the two ports' (what `ibv_devinfo`
    // shows as active_mtu on each host).
    let mtu = (port.active_mtu.bytes() as u32).min(f[4].parse().unwrap());
    me.connect_mtu(gid, qpn, mtu);

    if !active {
        for (wr_id, at, len) in [(1, SEND_AT, SEND_LEN), (2, NOTE_AT, 64)] {
            let sge = Sge {
                addr: me.buf.addr() + at as u64,
                length: len as u32,
                lkey: me.lkey,
            };
            me.client
                .post_recv(me.qp, &RecvWr::new(wr_id, vec![sge]))
                .unwrap();
        }
        say("READY");
        let w = me.wait(2);
        assert_eq!((w[0].wr_id, w[0].status), (1, 0), "{w:?}");
        assert_eq!(w[0].byte_len as usize, SEND_LEN);
        assert_eq!((w[1].wr_id, w[1].status), (2, 0), "{w:?}");
        assert_eq!(w[1].byte_len as usize, NOTE.len());
        assert!(me.buf.read(SEND_AT, SEND_LEN) == pattern(1, SEND_LEN));
        assert_eq!(me.buf.read(NOTE_AT, NOTE.len()), NOTE);
        // The note was sent after the WRITE on the same RC QP: the WRITE's data is in place.
        assert!(me.buf.read(WRITE_AT, WRITE_LEN) == pattern(2, WRITE_LEN));
        say("CHECKED");
        // a's READ of this memory may still be under way: the QP and MR must outlive it
        // (exiting would reclaim them, and the READ would never be answered).
        assert_eq!(hear().trim(), "BYE");
        return;
    }

    say("READY");
    assert_eq!(hear().trim(), "GO");
    let write = SendOp::RdmaWrite {
        remote_addr: raddr + WRITE_AT as u64,
        rkey,
    };
    let read = SendOp::RdmaRead {
        remote_addr: raddr + READ_AT as u64,
        rkey,
    };
    let wrs = [
        wr(1, SendOp::Send, &me, SEND_AT, SEND_LEN),
        wr(2, write, &me, WRITE_AT, WRITE_LEN),
        wr(3, SendOp::Send, &me, NOTE_AT, NOTE.len()),
        wr(4, read, &me, READ_AT, READ_LEN),
    ];
    for w in wrs {
        me.client.post_send(me.qp, &w).unwrap();
    }
    let w = me.wait(4);
    let got: Vec<(u64, u32)> = w.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(got, [(1, 0), (2, 0), (3, 0), (4, 0)], "{w:?}");
    assert_eq!(w[3].byte_len as usize, READ_LEN);
    assert!(me.buf.read(READ_AT, READ_LEN) == pattern(3, READ_LEN));
    say("DONE");
}

const SPAN_ENV: &str = "SOFTRDMAD_NETNS_SPAN_ADDR";

/// Run only when re-executed inside a namespace with `SPAN_ENV` set to the address of its
/// 1500-byte link (a no-op otherwise): a device on loopback alone offers 4096, a device on
/// loopback and that link offers what the smaller link carries.
#[test]
fn netns_device_spanning_two_links() {
    let Some(addr) = std::env::var_os(SPAN_ENV) else {
        return;
    };
    use daemon::host::{Device, DeviceConfig};
    use engine::qp_attr::Mtu;
    let link: std::net::IpAddr = addr.to_str().unwrap().parse().unwrap();
    let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
    let active_mtu = |addrs: Vec<std::net::IpAddr>| {
        let dev = Device::start(
            DeviceConfig {
                name: "srxe-span".into(),
                addrs,
                port: 0,
                remote_port: 0,
                ..Default::default()
            },
            daemon::memory::SharedRegions::default(),
        )
        .unwrap();
        dev.read(|e| e.query_port(1)).unwrap().active_mtu
    };
    assert_eq!(active_mtu(vec![lo]), Mtu::Mtu4096);
    assert_eq!(active_mtu(vec![lo, link]), Mtu::Mtu1024);
    assert_eq!(active_mtu(vec![link, lo]), Mtu::Mtu1024);
    say("SPAN OK");
}

/// A child process killed (and reaped) on drop, so a failing test leaves nothing running.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `softrdmad` serving `addr` inside namespace `ns`, its control socket at `socket`; returns
/// once it accepts connections.
fn start_daemon(ns: &str, addr: &str, socket: &Path) -> Killed {
    let log = std::env::var_os("SOFTRDMAD_TEST_LOG").is_some();
    let socket_arg = socket.to_str().unwrap();
    let mut d = Killed(
        Hosts::exec(
            ns,
            env!("CARGO_BIN_EXE_softrdmad"),
            &["--addr", addr, "--socket", socket_arg],
        )
        .env_remove("SOFTRDMA_DAEMON_SOCKET")
        .env("RUST_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if log { Stdio::inherit() } else { Stdio::null() })
        .spawn()
        .expect("spawn softrdmad"),
    );
    let deadline = Instant::now() + STEP;
    // A Unix socket is reached through the file system, not the network namespace: the
    // test process connects to both daemons from outside.
    while Client::connect(socket).is_err() {
        if let Ok(Some(status)) = d.0.try_wait() {
            panic!("softrdmad in {ns} exited at start: {status} (SOFTRDMAD_TEST_LOG=1 shows why)");
        }
        assert!(
            Instant::now() < deadline,
            "softrdmad in {ns} did not come up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    d
}

/// A client (`netns_peer` of this binary) inside namespace `ns`, lines of its stdout coming
/// through a thread so a stuck or dead child fails the test instead of hanging it.
struct Peer {
    name: &'static str,
    child: Killed,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Peer {
    fn start(name: &'static str, ns: &str, socket: &Path) -> Peer {
        let exe = std::env::current_exe().unwrap();
        let mut child = Killed(
            Hosts::exec(
                ns,
                exe.to_str().unwrap(),
                &["--exact", "netns_peer", "--nocapture", "--test-threads=1"],
            )
            .env(ROLE_ENV, name)
            .env(SOCKET_ENV, socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn a client in a namespace"),
        );
        let stdin = child.0.stdin.take().unwrap();
        let out = BufReader::new(child.0.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in out.lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Peer {
            name,
            child,
            stdin,
            lines,
        }
    }

    /// What follows `prefix` on the next line holding it.
    fn expect(&self, prefix: &str) -> String {
        loop {
            let l = self.lines.recv_timeout(STEP).unwrap_or_else(|e| {
                panic!(
                    "client {} never said {prefix:?} ({e}; its panic, if any, is above)",
                    self.name
                )
            });
            // The harness may have started the line ("test netns_peer ... ").
            if let Some(at) = l.find(prefix) {
                return l[at + prefix.len()..].trim().to_string();
            }
        }
    }

    fn tell(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Wait for the client to exit and require success.
    fn finish(mut self) {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                assert!(status.success(), "client {} failed: {status}", self.name);
                return;
            }
            assert!(
                Instant::now() < deadline,
                "client {} did not exit",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A counter of an interface inside namespace `ns`.
fn link_counter(ns: &str, iface: &str, name: &str) -> u64 {
    let path = format!("/sys/class/net/{iface}/statistics/{name}");
    let out = Hosts::exec(ns, "cat", &[&path]).output().unwrap();
    assert!(out.status.success(), "cat {path} in {ns}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn stats(socket: &Path) -> Stats {
    Stats(Client::connect(socket).unwrap().stat().unwrap())
}

#[test]
fn two_daemons_on_two_hosts_carry_send_write_and_read_over_a_1500_byte_link() {
    let h = Hosts::new("dd", 6, LINK_MTU);
    let dir = tempfile::tempdir().unwrap();
    let (sock_a, sock_b) = (dir.path().join("a.sock"), dir.path().join("b.sock"));
    // Declared after the hosts: dropped (killed) before the namespaces are deleted.
    let _da = start_daemon(&h.a, &h.addr_a, &sock_a);
    let _db = start_daemon(&h.b, &h.addr_b, &sock_b);

    let mut a = Peer::start("a", &h.a, &sock_a);
    let mut b = Peer::start("b", &h.b, &sock_b);
    let (info_a, info_b) = (a.expect("PEER "), b.expect("PEER "));
    for (who, info) in [("a", &info_a), ("b", &info_b)] {
        let f: Vec<&str> = info.split_whitespace().collect();
        let want_gid = format!("00000000000000000000ffff{}", {
            let addr = if who == "a" { &h.addr_a } else { &h.addr_b };
            let ip: std::net::Ipv4Addr = addr.parse().unwrap();
            hex(&ip.octets())
        });
        assert_eq!(f[0], want_gid, "{who}'s GID is its namespace's address");
        assert_eq!(
            f[4].parse::<u32>().unwrap(),
            PORT_MTU,
            "the port of {who}'s device offers what its {LINK_MTU}-byte link carries"
        );
    }
    a.tell(&info_b);
    b.tell(&info_a);
    a.expect("READY");
    b.expect("READY");
    a.tell("GO");
    a.expect("DONE");
    b.expect("CHECKED");
    b.tell("BYE");
    a.finish();
    b.finish();

    let (sa, sb) = (stats(&sock_a), stats(&sock_b));
    let c = |s: &Stats, n: &str| s.get(&format!("srxe0.{n}"));
    let mtu = PORT_MTU as usize;
    // a → b: the SEND and the WRITE cut at the path MTU, the note, the READ request.
    let requests = (SEND_LEN / mtu + WRITE_LEN / mtu + 2) as u64;
    // b → a: the READ's responses.
    let responses = (READ_LEN / mtu) as u64;
    assert!(c(&sa, "tx_packets") >= requests, "a sent: {:?}", sa.0);
    assert!(c(&sb, "rx_packets") >= requests, "b received: {:?}", sb.0);
    assert!(c(&sb, "tx_packets") >= responses, "b sent: {:?}", sb.0);
    assert!(c(&sa, "rx_packets") >= responses, "a received: {:?}", sa.0);
    for (who, s) in [("a", &sa), ("b", &sb)] {
        assert!(
            c(s, "rx_bytes") <= c(s, "rx_packets") * MAX_PACKET,
            "{who} received packets above the path MTU: {:?}",
            s.0
        );
        for bad in ["rx_malformed", "rx_bad_icrc", "rx_not_our_address"] {
            assert_eq!(c(s, bad), 0, "{who}: {bad}");
        }
    }
    // And they crossed the veth: a's end carried at least the UDP payload of every packet a's
    // daemon sent and received (a GSO train crosses a veth uncut, as one frame with one IPv4
    // and UDP header, so frames are fewer than packets: count bytes).
    let payload =
        |s: &Stats, dir: &str| c(s, &format!("{dir}_bytes")) - 28 * c(s, &format!("{dir}_packets"));
    assert!(link_counter(&h.a, &h.va, "tx_bytes") >= payload(&sa, "tx"));
    assert!(link_counter(&h.a, &h.va, "rx_bytes") >= payload(&sa, "rx"));
}

#[test]
fn a_device_spanning_two_links_offers_the_mtu_of_the_smaller() {
    let h = Hosts::new("ds", 7, LINK_MTU);
    let exe = std::env::current_exe().unwrap();
    let out = Hosts::exec(
        &h.a,
        exe.to_str().unwrap(),
        &[
            "--exact",
            "netns_device_spanning_two_links",
            "--nocapture",
            "--test-threads=1",
        ],
    )
    .env(SPAN_ENV, &h.addr_a)
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("SPAN OK"),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
