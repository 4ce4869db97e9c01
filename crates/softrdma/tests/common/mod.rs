//! Two connected devices on loopback, for the end-to-end tests.

#![allow(dead_code)]

use std::net::IpAddr;
use std::time::Duration;

use softrdma::{AccessFlags, Buffer, Cq, Device, MemoryRegion, Pd, Qp};

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

/// Two devices on 127.0.0.1 and 127.0.0.2 (UDP 4791 each... a test-unique port each, so
/// tests can run in parallel), connected.
pub fn pair_v4(port: u16, mr_len: usize) -> (Side, Side) {
    let a_ip: IpAddr = "127.0.0.1".parse().unwrap();
    let b_ip: IpAddr = "127.0.0.2".parse().unwrap();
    let a = Device::builder(a_ip)
        .port(port)
        .remote_port(port)
        .open()
        .unwrap();
    let b = Device::builder(b_ip)
        .port(port)
        .remote_port(port)
        .open()
        .unwrap();
    let (a, b) = (side(a, mr_len), side(b, mr_len));
    connect(&a, &b);
    (a, b)
}

/// Two devices on ::1, on ports `port` and `port + 1`, each sending to the other's.
pub fn pair_v6(port: u16, mr_len: usize) -> (Side, Side) {
    let ip: IpAddr = "::1".parse().unwrap();
    let a = Device::builder(ip)
        .port(port)
        .remote_port(port + 1)
        .open()
        .unwrap();
    let b = Device::builder(ip)
        .port(port + 1)
        .remote_port(port)
        .open()
        .unwrap();
    let (a, b) = (side(a, mr_len), side(b, mr_len));
    connect(&a, &b);
    (a, b)
}
