//! Two connected devices on loopback, for the end-to-end tests, on either backend: the
//! embedded device, or devices of one `softrdmad` (started inside the test process, serving
//! 127.0.0.1, 127.0.0.2 and ::1 on one UDP port, with a control socket of its own).

#![allow(dead_code)]

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use softrdma::{AccessFlags, BackendKind, Buffer, Cq, Device, MemoryRegion, Pd, Qp};

/// Run a scenario `fn name(backend) { ... }` once per backend: the tests are
/// `name::embedded` and `name::daemon`.
#[macro_export]
macro_rules! on_both_backends {
    ($($(#[$m:meta])* fn $name:ident($b:ident: BackendKind) $body:block)*) => {$(
        $(#[$m])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            fn run($b: softrdma::BackendKind) $body
            #[test]
            fn embedded() {
                run(softrdma::BackendKind::Embedded)
            }
            #[test]
            fn daemon() {
                run(softrdma::BackendKind::Daemon)
            }
        }
    )*};
}

/// A `softrdmad` inside this test process: its devices, its socket.
pub struct TestDaemon {
    pub socket: PathBuf,
    pub port: u16,
    pub daemon: Arc<daemon::server::Daemon>,
}

/// The addresses the test daemon serves, one device each.
pub const DAEMON_ADDRS: [&str; 3] = ["127.0.0.1", "127.0.0.2", "::1"];

/// The test process's daemon, started on first use.
pub fn test_daemon() -> &'static TestDaemon {
    static D: OnceLock<TestDaemon> = OnceLock::new();
    D.get_or_init(start_daemon)
}

/// Remove the control sockets earlier test processes left (the file outlives a test
/// process; its name carries the pid).
fn remove_stale_sockets() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("softrdma-test-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

fn start_daemon() -> TestDaemon {
    use daemon::host::{Device as HostDevice, DeviceConfig};
    remove_stale_sockets();
    let pid = std::process::id();
    // Below the ephemeral range, so embedded devices (port 0) never take it; retried on
    // a collision with another test process.
    for attempt in 0..20u32 {
        let port = 20000 + ((pid.wrapping_mul(7) + attempt * 101) % 12000) as u16;
        let regions = daemon::memory::SharedRegions::default();
        let mut devices = Vec::new();
        for (i, a) in DAEMON_ADDRS.iter().enumerate() {
            let cfg = DeviceConfig {
                name: format!("srxe{i}"),
                addrs: vec![a.parse().unwrap()],
                port,
                remote_port: port,
                ..Default::default()
            };
            match HostDevice::start(cfg, regions.clone()) {
                Ok(d) => devices.push(d),
                Err(_) => break,
            }
        }
        if devices.len() != DAEMON_ADDRS.len() {
            continue;
        }
        let socket = std::env::temp_dir().join(format!("softrdma-test-{pid}-{port}.sock"));
        let listener = daemon::server::bind_control_socket(&socket).unwrap();
        let d = Arc::new(daemon::server::Daemon {
            devices,
            regions,
            stats: daemon::server::Stats::default(),
        });
        let served = d.clone();
        std::thread::spawn(move || daemon::server::serve(served, listener));
        return TestDaemon {
            socket,
            port,
            daemon: d,
        };
    }
    panic!("no free UDP port for the test daemon");
}

/// Open a device on `ip` with `backend`: embedded on a port the OS picks (point it at its
/// peer with `set_remote_port`), or the test daemon's device on that address.
pub fn open_on(backend: BackendKind, ip: &str) -> Device {
    let addr: IpAddr = ip.parse().unwrap();
    let dev = match backend {
        BackendKind::Daemon => Device::builder(addr)
            .backend(BackendKind::Daemon)
            .daemon_socket(&test_daemon().socket)
            .spawn_daemon(false)
            .open()
            .unwrap(),
        _ => Device::builder(addr)
            .backend(BackendKind::Embedded)
            .port(0)
            .open()
            .unwrap(),
    };
    assert_eq!(dev.backend(), backend);
    dev
}

/// Generous: the tests never assert timings, this only stops a hung test.
pub const WAIT: Option<Duration> = Some(Duration::from_secs(10));

/// One side of a connected pair.
pub struct Side {
    pub dev: Device,
    pub pd: Pd,
    pub cq: Cq,
    pub qp: Qp,
    pub mr: MemoryRegion<Buffer>,
}

/// Every access right on the region.
pub fn all_access() -> AccessFlags {
    AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC
}

fn side(dev: Device, mr_len: usize) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(256).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build().unwrap();
    let mr = pd.register(Buffer::zeroed(mr_len), all_access()).unwrap();
    Side {
        dev,
        pd,
        cq,
        qp,
        mr,
    }
}

/// Connect two sides directly (no TCP): each learns the other's endpoint.
pub fn connect(a: &Side, b: &Side) {
    let ea = a.qp.endpoint(Some(a.mr.remote(..).unwrap())).unwrap();
    let eb = b.qp.endpoint(Some(b.mr.remote(..).unwrap())).unwrap();
    a.qp.connect(&eb).unwrap();
    b.qp.connect(&ea).unwrap();
}

/// Two devices on loopback addresses `a_ip` and `b_ip`, each on a port the OS picks (so
/// tests never collide with each other or with other programs), pointed at each other.
pub fn open_pair(a_ip: &str, b_ip: &str) -> (Device, Device) {
    open_pair_on(BackendKind::Embedded, a_ip, b_ip)
}

/// [`open_pair`] on `backend`. On the daemon, each is a connection of its own to the
/// daemon's device on that address (the same device twice when the addresses are equal).
pub fn open_pair_on(backend: BackendKind, a_ip: &str, b_ip: &str) -> (Device, Device) {
    let a = open_on(backend, a_ip);
    let b = open_on(backend, b_ip);
    if let (Some(ra), Some(rb)) = (a.try_runtime(), b.try_runtime()) {
        ra.set_remote_port(b.local_addr().port());
        rb.set_remote_port(a.local_addr().port());
    }
    (a, b)
}

/// Two connected devices on 127.0.0.1 and 127.0.0.2.
pub fn pair_v4(mr_len: usize) -> (Side, Side) {
    pair_v4_on(BackendKind::Embedded, mr_len)
}

/// [`pair_v4`] on `backend`.
pub fn pair_v4_on(backend: BackendKind, mr_len: usize) -> (Side, Side) {
    let (a, b) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
    let (a, b) = (side(a, mr_len), side(b, mr_len));
    connect(&a, &b);
    (a, b)
}

/// Two connected devices on ::1 (distinct ports, each sending to the other's).
pub fn pair_v6(mr_len: usize) -> (Side, Side) {
    pair_v6_on(BackendKind::Embedded, mr_len)
}

/// [`pair_v6`] on `backend`.
pub fn pair_v6_on(backend: BackendKind, mr_len: usize) -> (Side, Side) {
    let (a, b) = open_pair_on(backend, "::1", "::1");
    let (a, b) = (side(a, mr_len), side(b, mr_len));
    connect(&a, &b);
    (a, b)
}

/// Connected sides on two given devices.
pub fn pair_on(a: Device, b: Device, mr_len: usize) -> (Side, Side) {
    let (a, b) = (side(a, mr_len), side(b, mr_len));
    connect(&a, &b);
    (a, b)
}
