//! Two connected devices on loopback, for the end-to-end tests.

#![allow(dead_code)]

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

/// Two devices on loopback addresses `a_ip` and `b_ip`, each on a port the OS picks (so
/// tests never collide with each other or with other programs), pointed at each other.
pub fn open_pair(a_ip: &str, b_ip: &str) -> (Device, Device) {
    let a = Device::builder(a_ip.parse().unwrap())
        .port(0)
        .open()
        .unwrap();
    let b = Device::builder(b_ip.parse().unwrap())
        .port(0)
        .open()
        .unwrap();
    a.runtime().set_remote_port(b.local_addr().port());
    b.runtime().set_remote_port(a.local_addr().port());
    (a, b)
}

/// Two connected devices on 127.0.0.1 and 127.0.0.2.
pub fn pair_v4(mr_len: usize) -> (Side, Side) {
    let (a, b) = open_pair("127.0.0.1", "127.0.0.2");
    let (a, b) = (side(a, mr_len), side(b, mr_len));
    connect(&a, &b);
    (a, b)
}

/// Two connected devices on ::1 (distinct ports, each sending to the other's).
pub fn pair_v6(mr_len: usize) -> (Side, Side) {
    let (a, b) = open_pair("::1", "::1");
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
