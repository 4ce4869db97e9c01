//! Two client *processes* through one daemon, and a client killed with SIGKILL mid-way: the
//! daemon reclaims everything it held (counters show it), its peer sees errors as a real
//! fabric would show them, and everyone else is served as before.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use abi::client::Client;
use common::{hex, say, unhex, Daemon, Side};
use engine::{RecvWr, SendFlags, SendOp, SendPayload, SendWr, Sge};

const SIGNALED: u32 = 2;
const CHILD_ENV: &str = "SOFTRDMAD_TEST_CHILD_SOCKET";

/// The child's half: run only when the parent test re-executes this binary with
/// `CHILD_ENV` set (a no-op otherwise). It connects an RC QP to the parent's, SENDs one
/// message, and then waits to be killed, holding all its objects.
#[test]
fn child_process_peer() {
    let Some(socket) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let mut me = Side::new(Client::connect(socket).unwrap(), 4096);
    me.buf.write(0, b"greetings from the child process");
    say(&format!(
        "CHILD {} {} {} {} {}",
        hex(&me.gid),
        me.qpn,
        me.rkey.value(),
        me.buf.addr(),
        std::process::id()
    ));
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let mut f = line.split_whitespace();
    let gid = unhex(f.next().unwrap());
    let qpn: u32 = f.next().unwrap().parse().unwrap();
    me.connect(gid, qpn);
    me.client
        .post_send(
            me.qp,
            &SendWr {
                wr_id: 1,
                op: SendOp::Send,
                flags: SendFlags::from_bits_truncate(SIGNALED),
                payload: SendPayload::Sges(
                    vec![Sge {
                        addr: me.buf.addr(),
                        length: 32,
                        lkey: me.lkey,
                    }]
                    .into(),
                ),
            },
        )
        .unwrap();
    let w = me.wait(1);
    assert_eq!(w[0].status, 0);
    say("SENT");
    // Hold everything until SIGKILL.
    std::thread::sleep(std::time::Duration::from_secs(120));
}

#[test]
fn a_client_killed_mid_way_loses_its_resources_and_its_peer_sees_errors() {
    let d = Daemon::start();
    let mut parent = Side::new(d.client(), 4096);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_peer",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &d.socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // The child's lines arrive through a thread, so a stuck child fails the test instead of
    // hanging it.
    let out = BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let next_line = |prefix: &str| loop {
        let l = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the child said nothing more");
        // The harness may have started the line ("test child_process_peer ... ").
        if let Some(at) = l.find(prefix) {
            return l[at + prefix.len()..].trim().to_string();
        }
    };
    let info = next_line("CHILD ");
    let f: Vec<&str> = info.split_whitespace().collect();
    let (child_gid, child_qpn) = (unhex(f[0]), f[1].parse::<u32>().unwrap());
    let child_rkey = engine::Rkey::new(f[2].parse().unwrap());
    let child_addr: u64 = f[3].parse().unwrap();

    // Connect both ways; the child SENDs into the parent's receive buffer.
    parent.connect(child_gid, child_qpn);
    parent
        .client
        .post_recv(
            parent.qp,
            &RecvWr::new(
                7,
                vec![Sge {
                    addr: parent.buf.addr() + 1024,
                    length: 64,
                    lkey: parent.lkey,
                }],
            ),
        )
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{} {}", hex(&parent.gid), parent.qpn).unwrap();
    next_line("SENT");
    let w = parent.wait(1);
    assert_eq!((w[0].wr_id, w[0].status, w[0].byte_len), (7, 0, 32));
    assert_eq!(
        parent.buf.read(1024, 32),
        b"greetings from the child process"
    );

    // The parent WRITEs into the child's memory and READs it back: data in another
    // process's address space, both ways.
    parent.buf.write(0, b"written by the parent");
    let lkey = parent.lkey;
    let wr = move |wr_id, op, addr| SendWr {
        wr_id,
        op,
        flags: SendFlags::from_bits_truncate(SIGNALED),
        payload: SendPayload::Sges(
            vec![Sge {
                addr,
                length: 21,
                lkey,
            }]
            .into(),
        ),
    };
    let (p0, p1) = (parent.buf.addr(), parent.buf.addr() + 2048);
    let write_op = SendOp::RdmaWrite {
        remote_addr: child_addr + 100,
        rkey: child_rkey,
    };
    parent
        .client
        .post_send(parent.qp, &wr(8, write_op, p0))
        .unwrap();
    assert_eq!(parent.wait(1)[0].status, 0);
    let read_op = SendOp::RdmaRead {
        remote_addr: child_addr + 100,
        rkey: child_rkey,
    };
    parent
        .client
        .post_send(parent.qp, &wr(9, read_op, p1))
        .unwrap();
    assert_eq!(parent.wait(1)[0].status, 0);
    assert_eq!(parent.buf.read(2048, 21), b"written by the parent");

    let before = d.stats();
    assert_eq!(before.get("live_qps"), 2);
    assert_eq!(before.get("registered_ranges"), 2);

    // SIGKILL: no goodbye, the socket just closes.
    child.kill().unwrap();
    child.wait().unwrap();
    let s = d.wait_until("the child's objects reclaimed", |s| {
        s.get("clients_reclaimed") == 1
    });
    for c in [
        "reclaimed_qps",
        "reclaimed_mrs",
        "reclaimed_cqs",
        "reclaimed_pds",
    ] {
        assert_eq!(s.get(c), 1, "{c}");
    }
    for c in [
        "live_qps",
        "live_mrs",
        "live_cqs",
        "live_pds",
        "registered_ranges",
    ] {
        assert_eq!(s.get(c), 1, "{c}: only the parent's remain");
    }

    // The parent's next WRITE to the dead peer fails (its QP is gone: no ACK ever comes, the
    // retries run out) instead of hanging or landing anywhere.
    parent
        .client
        .post_send(parent.qp, &wr(10, write_op, p0))
        .unwrap();
    let w = parent.wait(1);
    assert_eq!(w[0].wr_id, 10);
    assert_ne!(w[0].status, 0, "a write to a reclaimed QP must fail: {w:?}");

    // And the daemon serves newcomers as before.
    let mut c = d.client();
    let pd = c.alloc_pd(0).unwrap();
    c.dealloc_pd(pd).unwrap();
}
