//! Hostile clients: garbage, truncated and oversized messages, bad bodies, requests before
//! hello, another client's handles, unmapped memory. Each gets an error or a closed
//! connection; the daemon keeps serving everyone else.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use common::{Daemon, ALL_ACCESS};
use daemon::proto::{self, kind, Header, Request, Response, HEADER_LEN};

const EINVAL: i32 = 22;
const EFAULT: i32 = 14;
const EPROTO: i32 = 71;

/// Everything the daemon sends until it closes the connection (a write the daemon no
/// longer reads may fail: it closed first).
fn send_and_drain(d: &Daemon, bytes: &[u8]) -> Vec<u8> {
    let mut s = UnixStream::connect(&d.socket).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(n) = s.read(&mut chunk) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&chunk[..n]);
    }
    out
}

/// The error answers in `bytes`.
fn errors(bytes: &[u8]) -> Vec<i32> {
    let mut rest = bytes;
    let mut v = Vec::new();
    while let Ok(Some((h, body))) = proto::split_message(rest) {
        if let Ok(Response::Error { errno, .. }) = Response::decode(h.kind, body) {
            v.push(errno);
        }
        rest = &rest[HEADER_LEN + body.len()..];
    }
    v
}

fn hello() -> Vec<u8> {
    Request::Hello {
        version: proto::VERSION,
    }
    .encode(1)
}

#[test]
fn malformed_messages_get_errors_or_a_closed_connection_and_the_daemon_survives() {
    let mut d = Daemon::start();
    let mut good = d.client();
    let pd = good.alloc_pd(0).unwrap();

    // Garbage: bad magic, answered once, then closed.
    let garbage: Vec<u8> = (0..200u32).map(|i| (i * 37 + 11) as u8).collect();
    assert_eq!(errors(&send_and_drain(&d, &garbage)), vec![EPROTO]);

    // A header announcing more than the limit: refused before anything is allocated.
    let mut huge = Header {
        kind: kind::STAT,
        length: u32::MAX,
        id: 1,
    }
    .to_bytes()
    .to_vec();
    huge.extend_from_slice(&[0; 64]);
    assert_eq!(errors(&send_and_drain(&d, &huge)), vec![EPROTO]);

    // Wrong version.
    let mut old = hello();
    old[4] = 99;
    assert_eq!(errors(&send_and_drain(&d, &old)), vec![EPROTO]);

    // Truncated: the body never completes; the client goes away mid-message.
    let mut cut = hello();
    cut.extend_from_slice(&Request::AllocPd { dev: 0 }.encode(2)[..HEADER_LEN + 2]);
    let out = send_and_drain(&d, &cut);
    assert!(
        errors(&out).is_empty(),
        "hello is answered, the cut message is not"
    );

    // A well-framed body that does not decode, a request before hello, an unknown kind and
    // trailing bytes: each is an error answer and the connection stays usable.
    let mut msgs = proto::frame(kind::POST_SEND, 1, &[1, 2, 3]);
    msgs.extend(hello());
    msgs.extend(proto::frame(0x7777, 3, &[]));
    msgs.extend(proto::frame(kind::ALLOC_PD, 4, &[0, 0, 0, 0, 9]));
    msgs.extend(
        Request::QueryGid {
            dev: 42,
            port: 1,
            index: 0,
        }
        .encode(5),
    );
    msgs.extend(Request::ListDevices.encode(6));
    let out = send_and_drain(&d, &msgs);
    assert_eq!(errors(&out), vec![EINVAL; 4]);
    assert!(
        proto::split_message(&out).unwrap().is_some(),
        "the ListDevices after the errors was answered too"
    );
    let first_before_hello = {
        let mut m = proto::frame(kind::ALLOC_PD, 1, &0u32.to_le_bytes());
        m.extend(hello());
        errors(&send_and_drain(&d, &m))
    };
    assert_eq!(first_before_hello, vec![EPROTO], "nothing before hello");

    // The well-behaved client never noticed.
    assert!(d.alive());
    good.dealloc_pd(pd).unwrap();
    let s = d.stats();
    assert_eq!(s.get("bad_headers"), 3);
    assert!(s.get("bad_bodies") >= 3);
}

#[test]
fn a_client_cannot_use_another_clients_handles() {
    let d = Daemon::start();
    let mut a = d.client();
    let mut b = d.client();
    let pd_a = a.alloc_pd(0).unwrap();
    let cq_a = a.create_cq(0, 16).unwrap();
    // b holds nothing: every one of a's handles is unknown to it.
    for h in [pd_a, cq_a, 1, 2, 3, u32::MAX] {
        assert_eq!(b.dealloc_pd(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(b.destroy_cq(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(b.poll_cq(h, 4).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(b.reg_mr_at(h, 0, 8, 0).unwrap_err().errno(), Some(EINVAL));
    }
    // b's own objects get b's own handles, which may equal a's numbers and still name b's.
    let pd_b = b.alloc_pd(0).unwrap();
    assert_eq!(pd_b, pd_a, "handles are per connection");
    b.dealloc_pd(pd_b).unwrap();
    // a's PD and CQ are untouched.
    assert!(a.poll_cq(cq_a, 4).unwrap().is_empty());
    a.destroy_cq(cq_a).unwrap();
    a.dealloc_pd(pd_a).unwrap();
    assert!(d.stat("foreign_handles") >= 24);
}

#[test]
fn registering_memory_that_is_not_mapped_fails_cleanly() {
    let d = Daemon::start();
    let mut c = d.client();
    let pd = c.alloc_pd(0).unwrap();
    // Page zero, a kernel address, a range running off the end of the address space, and
    // a real buffer with a length far beyond it.
    let buf = vec![0u8; 4096];
    for (addr, len) in [
        (0u64, 4096u64),
        (0xffff_8000_0000_0000, 4096),
        (u64::MAX - 10, 100),
        (buf.as_ptr() as u64, 1 << 40),
        (buf.as_ptr() as u64, 0),
    ] {
        let e = c.reg_mr_at(pd, addr, len, ALL_ACCESS).unwrap_err();
        assert_eq!(e.errno(), Some(EFAULT), "{addr:#x}+{len}: {e}");
    }
    // Unknown access bits are refused too.
    assert_eq!(
        c.reg_mr_at(pd, buf.as_ptr() as u64, 4096, 1 << 30)
            .unwrap_err()
            .errno(),
        Some(EINVAL)
    );
    // The real buffer registers.
    let mr = c
        .reg_mr_at(pd, buf.as_ptr() as u64, 4096, ALL_ACCESS)
        .unwrap();
    c.dereg_mr(mr.handle).unwrap();
    assert_eq!(d.stat("unmapped_registrations"), 5);
    drop(buf);
}
