//! Hostile clients: garbage, truncated and oversized messages, bad bodies, requests before
//! hello, another client's handles, unmapped memory. Each gets an error or a closed
//! connection; the daemon keeps serving everyone else.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use abi::proto::{self, kind, Header, Request, Response, HEADER_LEN};
use common::{Daemon, ALL_ACCESS};

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
        let none = engine::AccessFlags::empty();
        assert_eq!(
            b.reg_mr_at(h, 0, 8, none).unwrap_err().errno(),
            Some(EINVAL)
        );
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
    // Unknown access bits are refused too (the request does not decode).
    let unknown = engine::AccessFlags::from_bits_retain(1 << 30);
    assert_eq!(
        c.reg_mr_at(pd, buf.as_ptr() as u64, 4096, unknown)
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

#[test]
fn shared_registrations_need_the_file_really_mapped_at_the_address() {
    use abi::shm::SharedMemory;
    let d = Daemon::start();
    let mut c = d.client();
    let pd = c.alloc_pd(0).unwrap();
    let len = 64u64 << 10;
    let one = SharedMemory::create("one", len as usize).unwrap();
    let other = SharedMemory::create("other", len as usize).unwrap();
    let (one_fd, other_fd) = (one.fd().unwrap(), other.fd().unwrap());
    let heap = vec![0u8; len as usize];
    let at = one.as_ptr() as u64;
    // Another file, the right file at the wrong offset, heap memory with a file, a range
    // beyond the mapping: all claim bytes the file does not hold there.
    for (addr, length, fd, offset) in [
        (at, len, other_fd, 0),
        (at, len - 4096, one_fd, 4096),
        (heap.as_ptr() as u64, len, one_fd, 0),
        (at, len + 4096, one_fd, 0),
        (at, 0, one_fd, 0),
    ] {
        let e = c
            .reg_mr_shared(pd, addr, length, ALL_ACCESS, fd, offset)
            .unwrap_err();
        assert_eq!(e.errno(), Some(EFAULT), "{addr:#x}+{length} @{offset}: {e}");
    }
    // The request without its file; and after a request that takes no file came with one
    // (that file is dropped, not kept for the next request).
    let no_file = Request::RegMrShared {
        pd,
        addr: at,
        length: len,
        access: ALL_ACCESS,
        offset: 0,
    };
    assert_eq!(c.call(&no_file).unwrap_err().errno(), Some(EINVAL));
    c.call_passing(&Request::AllocPd { dev: 0 }, Some(one_fd))
        .unwrap();
    assert_eq!(c.call(&no_file).unwrap_err().errno(), Some(EINVAL));
    assert_eq!(d.stat("mapped_registrations"), 0);
    // The truth registers, also for a part of the mapping.
    let whole = c.reg_mr_shared(pd, at, len, ALL_ACCESS, one_fd, 0).unwrap();
    let part = c
        .reg_mr_shared(pd, at + 8192, 100, ALL_ACCESS, one_fd, 8192)
        .unwrap();
    assert_eq!(d.stat("mapped_registrations"), 2);
    c.dereg_mr(part.handle).unwrap();
    c.dereg_mr(whole.handle).unwrap();
    assert_eq!(d.stat("live_mrs"), 0);
    drop(heap);
}

#[test]
fn another_clients_srqs_ahs_windows_channels_and_events_are_out_of_reach() {
    use engine::{
        AhAttr, AhHandle, AsyncEvent, MwType, QpAttr, QpAttrMask, QpState, RecvWr, SendFlags,
        SendOp, SendPayload, SendWr, SrqAttr, UdDest,
    };
    let mut d = Daemon::start();
    let mut a = d.client();
    let mut b = d.client();
    let pd_a = a.alloc_pd(0).unwrap();
    let cq_a = a.create_cq(0, 1).unwrap();
    let srq = SrqAttr {
        max_wr: 16,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq_a = a.create_srq(pd_a, &srq).unwrap();
    let ah_a = a
        .create_ah(
            pd_a,
            &AhAttr {
                // ::ffff:127.0.0.1, an IPv4 GID like the device's own.
                dgid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1],
                hop_limit: 64,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let init = |pd, cq| common::rc_init(pd, cq, 4, 1, 0);
    let qp_a = a.create_qp_with_srq(&init(pd_a, cq_a), srq_a).unwrap();
    let (mw_a, _) = a.alloc_mw(pd_a, MwType::Type2).unwrap();
    // b's own PD and CQ exist, so only the foreign SRQ/AH/CQ handles can be what is refused.
    let pd_b = b.alloc_pd(0).unwrap();
    let cq_b = b.create_cq(0, 4).unwrap();
    let wr = SendWr {
        wr_id: 1,
        op: SendOp::Send,
        flags: SendFlags::from_bits_truncate(0),
        payload: SendPayload::Sges(vec![].into()),
    };
    for h in [srq_a, ah_a, cq_a, qp_a.handle, mw_a] {
        if h == pd_b || h == cq_b {
            continue; // b's own numbers name b's own objects
        }
        assert_eq!(b.destroy_srq(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(b.srq_len(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(
            b.post_srq_recv(h, &RecvWr::new(1, vec![]),)
                .unwrap_err()
                .errno(),
            Some(EINVAL)
        );
        assert_eq!(b.destroy_ah(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(
            b.post_send_ud(
                h,
                &wr,
                &UdDest {
                    ah: AhHandle(h),
                    remote_qpn: wire::Qpn::GSI,
                    remote_qkey: 1
                }
            )
            .unwrap_err()
            .errno(),
            Some(EINVAL)
        );
        assert_eq!(b.cq_channel(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(b.dealloc_mw(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(b.query_mw(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(
            b.alloc_mw(h, MwType::Type2).unwrap_err().errno(),
            Some(EINVAL)
        );
        assert_eq!(b.req_notify_cq(h, false).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(b.cq_len(h).unwrap_err().errno(), Some(EINVAL));
        assert_eq!(
            b.create_qp_with_srq(&init(pd_b, cq_b), h)
                .unwrap_err()
                .errno(),
            Some(EINVAL)
        );
    }
    // a's QP goes to ERR (IBV_QPS_ERR with IBV_QP_STATE): on an SRQ that raises
    // "last WQE reached" for a.
    a.post_srq_recv(srq_a, &RecvWr::new(1, vec![])).unwrap();
    let init_attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    let init_mask =
        QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    a.modify_qp(qp_a.handle, &init_attr, init_mask).unwrap();
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    a.modify_qp(qp_a.handle, &err, QpAttrMask::STATE).unwrap();
    // b never sees the events of a's objects; a gets its own.
    assert!(b.async_events().unwrap().is_empty());
    let evs = a.async_events().unwrap();
    assert!(
        evs.contains(&AsyncEvent::QpLastWqeReached {
            qpn: wire::Qpn::new(qp_a.qpn)
        }),
        "{evs:?}"
    );
    assert!(a.async_events().unwrap().is_empty(), "taken once");
    assert!(d.alive());
    // Dropping a reclaims its SRQ and AH with everything else.
    drop(a);
    let s = d.wait_until("a's objects reclaimed", |s| s.get("clients_reclaimed") == 1);
    assert_eq!(s.get("reclaimed_srqs"), 1);
    assert_eq!(s.get("reclaimed_ahs"), 1);
    assert_eq!(s.get("reclaimed_mws"), 1);
    assert_eq!(s.get("live_srqs"), 0);
    assert_eq!(s.get("live_ahs"), 0);
}
