//! Shared by the daemon's integration tests: start `softrdmad`, connect RC QPs, wait for
//! completions, and buffers the daemon writes from outside the process.

#![allow(dead_code, unsafe_code)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use abi::client::Client;
use abi::wqe::Cqe;
use engine::{AccessFlags, AhAttr, CqHandle, PdHandle, QpAttr, QpCap, QpInitAttr, QpState, QpType};

/// Local write.
pub const LOCAL_WRITE: AccessFlags = AccessFlags::LOCAL_WRITE;
/// Remote write.
pub const REMOTE_WRITE: AccessFlags = AccessFlags::REMOTE_WRITE;
/// Remote read.
pub const REMOTE_READ: AccessFlags = AccessFlags::REMOTE_READ;
/// Remote atomic.
pub const REMOTE_ATOMIC: AccessFlags = AccessFlags::REMOTE_ATOMIC;
/// All of the above.
pub const ALL_ACCESS: AccessFlags = LOCAL_WRITE
    .union(REMOTE_WRITE)
    .union(REMOTE_READ)
    .union(REMOTE_ATOMIC);

/// An RC QP's creation attributes with `pd` and `cq` (the connection's handles) and `depth`
/// WRs of `sges` SGEs per queue.
pub fn rc_init(pd: u32, cq: u32, depth: u32, sges: u32, inline: u32) -> QpInitAttr {
    QpInitAttr {
        pd: PdHandle(pd),
        send_cq: CqHandle(cq),
        recv_cq: CqHandle(cq),
        cap: QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: sges,
            max_recv_sge: sges,
            max_inline_data: inline,
        },
        qp_type: QpType::Rc,
        sq_sig_all: false,
    }
}

/// Counters by name.
pub struct Stats(pub Vec<(String, u64)>);

impl Stats {
    /// The named counter.
    pub fn get(&self, name: &str) -> u64 {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no counter {name}"))
            .1
    }
}

/// A `softrdmad` child process on a temp socket; killed on drop.
pub struct Daemon {
    pub child: Child,
    monitor: std::sync::Mutex<Option<Client>>,
    pub socket: PathBuf,
    pub port: u16,
    _dir: tempfile::TempDir,
}

static NEXT: AtomicU16 = AtomicU16::new(0);

impl Daemon {
    /// Start a daemon serving `127.0.0.x` (x picked per daemon) on a non-default UDP port.
    pub fn start() -> Daemon {
        Daemon::start_with(|n| {
            let addr: IpAddr = format!("127.0.0.{}", 2 + (n % 200)).parse().unwrap();
            vec!["--addr".into(), addr.to_string()]
        })
    }

    /// Start a daemon with the address options `args(n)` gives for the n-th daemon of this
    /// test process, on a non-default UDP port and a temp control socket.
    pub fn start_with(args: impl Fn(u16) -> Vec<String>) -> Daemon {
        for _ in 0..8 {
            let n = NEXT.fetch_add(1, Ordering::SeqCst);
            let port = 20000 + ((std::process::id() as u16).wrapping_mul(7) % 20000) + n * 3;
            let dir = tempfile::tempdir().unwrap();
            let socket = dir.path().join("softrdmad.sock");
            let log = std::env::var_os("SOFTRDMAD_TEST_LOG").is_some();
            let mut child = Command::new(env!("CARGO_BIN_EXE_softrdmad"))
                .args(args(n))
                .args(["--port", &port.to_string()])
                .arg("--socket")
                .arg(&socket)
                .env_remove("SOFTRDMA_DAEMON_SOCKET")
                .env("RUST_LOG", "debug")
                .stdout(Stdio::null())
                .stderr(if log { Stdio::inherit() } else { Stdio::null() })
                .spawn()
                .expect("spawn softrdmad");
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // bind failed (port taken?): try another
                }
                if Client::connect(&socket).is_ok() {
                    return Daemon {
                        child,
                        monitor: std::sync::Mutex::new(None),
                        socket,
                        port,
                        _dir: dir,
                    };
                }
                assert!(Instant::now() < deadline, "softrdmad did not come up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("softrdmad failed to start 8 times");
    }

    /// A new connection.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket).expect("connect")
    }

    /// Every counter, read over the daemon's one monitor connection (so reading them opens
    /// and closes no connection of its own).
    pub fn stats(&self) -> Stats {
        let mut m = self.monitor.lock().unwrap();
        let c = m.get_or_insert_with(|| self.client());
        Stats(c.stat().unwrap())
    }

    /// The named counter.
    pub fn stat(&self, name: &str) -> u64 {
        self.stats().get(name)
    }

    /// Wait until `cond` holds on the counters (generous deadline; no timing asserted).
    pub fn wait_until(&self, what: &str, cond: impl Fn(&Stats) -> bool) -> Stats {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = self.stats();
            if cond(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "never true: {what}; counters {:?}",
                s.0
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether the daemon process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Memory the daemon reads and writes from outside the process: touched here only through
/// volatile accesses, so the compiler never assumes it unchanged.
pub struct Buf {
    mem: Box<[u8]>,
}

impl Buf {
    pub fn new(len: usize) -> Buf {
        Buf {
            mem: vec![0u8; len].into_boxed_slice(),
        }
    }
    pub fn addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
    pub fn ptr(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr()
    }
    pub fn len(&self) -> usize {
        self.mem.len()
    }
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let p = self.mem.as_ptr();
        assert!(off + len <= self.mem.len());
        // SAFETY: in bounds of the live allocation; volatile because the daemon writes it.
        (off..off + len)
            .map(|i| unsafe { std::ptr::read_volatile(p.add(i)) })
            .collect()
    }
    pub fn write(&mut self, off: usize, data: &[u8]) {
        let p = self.mem.as_mut_ptr();
        assert!(off + data.len() <= self.mem.len());
        for (i, b) in data.iter().enumerate() {
            // SAFETY: in bounds of the live allocation.
            unsafe { std::ptr::write_volatile(p.add(off + i), *b) };
        }
    }
    pub fn read_u64(&self, off: usize) -> u64 {
        u64::from_ne_bytes(self.read(off, 8).try_into().unwrap())
    }
}

/// One side of an RC connection: its objects and registered buffer.
pub struct Side {
    pub client: Client,
    pub pd: u32,
    pub cq: u32,
    pub qp: u32,
    pub qpn: u32,
    pub mr: u32,
    pub lkey: engine::Lkey,
    pub rkey: engine::Rkey,
    pub buf: Buf,
    pub gid: [u8; 16],
}

/// `ibv_qp_attr_mask` bits.
pub mod mask {
    use engine::QpAttrMask as M;
    pub const STATE: M = M::STATE;
    pub const ACCESS_FLAGS: M = M::ACCESS_FLAGS;
    pub const PKEY_INDEX: M = M::PKEY_INDEX;
    pub const PORT: M = M::PORT;
    pub const AV: M = M::AV;
    pub const PATH_MTU: M = M::PATH_MTU;
    pub const TIMEOUT: M = M::TIMEOUT;
    pub const RETRY_CNT: M = M::RETRY_CNT;
    pub const RNR_RETRY: M = M::RNR_RETRY;
    pub const RQ_PSN: M = M::RQ_PSN;
    pub const MAX_QP_RD_ATOMIC: M = M::MAX_QP_RD_ATOMIC;
    pub const MIN_RNR_TIMER: M = M::MIN_RNR_TIMER;
    pub const SQ_PSN: M = M::SQ_PSN;
    pub const MAX_DEST_RD_ATOMIC: M = M::MAX_DEST_RD_ATOMIC;
    pub const DEST_QPN: M = M::DEST_QPN;
}

impl Side {
    /// PD, CQ, RC QP (in RESET) and an MR over a fresh `len`-byte buffer on device 0.
    pub fn new(client: Client, len: usize) -> Side {
        Side::on(client, 0, len)
    }

    /// The same on device `dev` of the daemon.
    pub fn on(client: Client, dev: u32, len: usize) -> Side {
        let mut client = client;
        let pd = client.alloc_pd(dev).unwrap();
        let cq = client.create_cq(dev, 64).unwrap();
        let qp = client.create_qp(&rc_init(pd, cq, 32, 4, 64)).unwrap();
        let mut buf = Buf::new(len);
        // SAFETY: `buf` lives as long as the Side (and so as the connection); it is touched
        // only with volatile accesses.
        let mr = unsafe { client.reg_mr(pd, buf.ptr(), len, ALL_ACCESS) }.unwrap();
        let gid = client.query_gid(dev, 1, 0).unwrap().0;
        Side {
            client,
            pd,
            cq,
            qp: qp.handle,
            qpn: qp.qpn,
            mr: mr.handle,
            lkey: engine::Lkey::new(mr.lkey),
            rkey: engine::Rkey::new(mr.rkey),
            buf,
            gid,
        }
    }

    /// RESET → INIT → RTR → RTS towards `qpn` at `gid`, path MTU 1024.
    pub fn connect(&mut self, gid: [u8; 16], qpn: u32) {
        self.connect_mtu(gid, qpn, 1024);
    }

    /// RESET → INIT → RTR → RTS towards `qpn` at `gid` with a path MTU of `path_mtu` bytes.
    pub fn connect_mtu(&mut self, gid: [u8; 16], qpn: u32, path_mtu: u32) {
        use mask::*;
        let c = &mut self.client;
        let init = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC,
            ..QpAttr::default()
        };
        c.modify_qp(self.qp, &init, STATE | PKEY_INDEX | PORT | ACCESS_FLAGS)
            .unwrap();
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            path_mtu: wire::Mtu::from_bytes(path_mtu as usize).expect("an IBA MTU"),
            dest_qp_num: wire::Qpn::new(qpn),
            rq_psn: 100,
            max_dest_rd_atomic: 4,
            min_rnr_timer: 1,
            ah_attr: AhAttr {
                dgid: gid,
                hop_limit: 64,
                ..AhAttr::default()
            },
            ..QpAttr::default()
        };
        c.modify_qp(
            self.qp,
            &rtr,
            STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
        )
        .unwrap();
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 100,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 4,
            ..QpAttr::default()
        };
        c.modify_qp(
            self.qp,
            &rts,
            STATE | SQ_PSN | TIMEOUT | RETRY_CNT | RNR_RETRY | MAX_QP_RD_ATOMIC,
        )
        .unwrap();
    }

    /// Wait for `n` completions on the side's CQ.
    pub fn wait(&mut self, n: usize) -> Vec<Cqe> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut got = Vec::new();
        while got.len() < n {
            got.extend(self.client.poll_cq(self.cq, 16).unwrap());
            assert!(
                Instant::now() < deadline,
                "waited for {n} completions, got {got:?}"
            );
            if got.len() < n {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        got
    }
}

/// Two sides on one daemon, connected to each other.
pub fn connected_pair(d: &Daemon, len: usize) -> (Side, Side) {
    let mut a = Side::new(d.client(), len);
    let mut b = Side::new(d.client(), len);
    let (ga, qa, gb, qb) = (a.gid, a.qpn, b.gid, b.qpn);
    a.connect(gb, qb);
    b.connect(ga, qa);
    (a, b)
}

/// A GID as hex text, for a line between a test and its child process.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The GID [`hex`] wrote.
pub fn unhex(s: &str) -> [u8; 16] {
    let mut g = [0u8; 16];
    for (i, x) in g.iter_mut().enumerate() {
        *x = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    g
}

/// A line from a child process to its parent test, written to fd 1 directly (the test
/// harness captures `println!`).
pub fn say(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{line}\n").as_bytes()).unwrap();
    out.flush().unwrap();
}
