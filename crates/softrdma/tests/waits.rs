//! Blocking and async waits, the TCP handshake, and asynchronous events.

#[macro_use]
mod common;

use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use common::{all_access, open_on, open_pair_on, pair_v4_on, WAIT};
use softrdma::{AsyncEvent, Buffer, Error, WcStatus};

on_both_backends! {
fn a_thread_blocked_in_wait_wakes_when_the_message_arrives(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 4096);
    b.qp.recv(1, &[b.mr.sge(..).unwrap()]).unwrap();
    let cq = b.cq.clone();
    let waiter = thread::spawn(move || cq.wait_ok(WAIT));
    // Give the waiter a chance to block (correct either way: arm-then-wait never misses).
    thread::sleep(Duration::from_millis(20));
    a.mr.write(0, b"wake").unwrap();
    a.qp.send(1, &[a.mr.sge(..4).unwrap()]).unwrap();
    let wc = waiter.join().unwrap().unwrap();
    assert_eq!(wc.byte_len, 4);
}
}

on_both_backends! {
fn a_wait_with_nothing_coming_times_out(backend: BackendKind) {
    let (a, _b) = pair_v4_on(backend, 64);
    match a.cq.wait(1, Some(Duration::from_millis(10))) {
        Err(Error::Timeout) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
}
}

on_both_backends! {
fn two_programs_connect_over_tcp_in_a_few_lines(backend: BackendKind) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = listener.local_addr().unwrap();
    // Two programs would both use UDP 4791; in one test process the OS picks the ports.
    let (dev, server_dev) = open_pair_on(backend, "127.0.0.1", "127.0.0.2");
    let server = thread::spawn(move || {
        let dev = server_dev;
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(16).unwrap();
        let qp = pd.qp_builder(&cq, &cq).build().unwrap();
        let mr = pd.register(Buffer::zeroed(1024), all_access()).unwrap();
        // The client writes, then sends to say it is done.
        qp.recv(1, &[]).unwrap();
        let (stream, _) = listener.accept().unwrap();
        let peer = qp.handshake(stream, Some(mr.remote(..).unwrap())).unwrap();
        assert!(peer.mr.is_none());
        let wc = cq.wait_ok(WAIT).unwrap();
        assert_eq!(wc.byte_len, 0);
        mr.to_vec()
    });
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build().unwrap();
    let mr = pd
        .register(Buffer::from_slice(b"written by the client"), all_access())
        .unwrap();
    let peer = qp
        .handshake(TcpStream::connect(tcp).unwrap(), None)
        .unwrap();
    let remote = peer.mr.expect("the server offered its region");
    assert_eq!(remote.len, 1024);
    qp.write(1, &[mr.sge(..).unwrap()], &remote).unwrap();
    cq.wait_ok(WAIT).unwrap();
    qp.send(2, &[]).unwrap();
    cq.wait_ok(WAIT).unwrap();
    let got = server.join().unwrap();
    assert_eq!(&got[..21], b"written by the client");
}
}

on_both_backends! {
fn a_cq_overflow_is_an_async_event_and_errors_the_qp(backend: BackendKind) {
    let a = open_on(backend, "127.0.0.1");
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(1).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build().unwrap();
    // Two flushed receives into a CQ of one entry.
    qp.recv(1, &[]).unwrap();
    qp.recv(2, &[]).unwrap();
    qp.set_error().unwrap();
    let ev = a.wait_async_event(WAIT).unwrap();
    assert!(
        matches!(ev, AsyncEvent::CqErr { .. } | AsyncEvent::QpFatal { .. }),
        "{ev:?}"
    );
    let wc = cq.wait_one(WAIT).unwrap();
    assert_eq!(wc.status, WcStatus::WrFlushErr);
}
}

on_both_backends! {
fn a_cq_resizes_but_never_below_the_completions_waiting(backend: BackendKind) {
    let a = open_on(backend, "127.0.0.1");
    let pd = a.alloc_pd().unwrap();
    let cq = a.create_cq(3).unwrap();
    let qp = pd.qp_builder(&cq, &cq).build().unwrap();
    assert_eq!(cq.resize(1).unwrap(), 1);
    assert_eq!(cq.resize(8).unwrap(), 8);
    assert_eq!(cq.resize(0).unwrap_err().errno(), 22);
    // Three flushed receives wait in it: it cannot shrink to two.
    for i in 0..3 {
        qp.recv(i, &[]).unwrap();
    }
    qp.set_error().unwrap();
    let t0 = std::time::Instant::now();
    while cq.len().unwrap() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the flushes never came");
        thread::sleep(Duration::from_millis(1));
    }
    let e = cq.resize(2).unwrap_err();
    assert_eq!(e.errno(), 22, "{e}");
    // Nothing was lost by the refusal; once they are taken it shrinks.
    for i in 0..3 {
        let wc = cq.wait_one(WAIT).unwrap();
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::WrFlushErr));
    }
    assert_eq!(cq.resize(2).unwrap(), 2);
}
}

#[cfg(feature = "tokio")]
async fn an_async_wait_resolves_when_the_message_arrives(backend: softrdma::BackendKind) {
    let (a, b) = pair_v4_on(backend, 4096);
    b.qp.recv(1, &[b.mr.sge(..).unwrap()]).unwrap();
    let cq = b.cq.clone();
    let wait = tokio::spawn(async move { cq.wait_ok_async().await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    a.mr.write(0, b"async").unwrap();
    a.qp.send(1, &[a.mr.sge(..5).unwrap()]).unwrap();
    let wc = tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(wc.byte_len, 5);
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread")]
async fn an_async_wait_resolves_when_the_message_arrives_embedded() {
    an_async_wait_resolves_when_the_message_arrives(softrdma::BackendKind::Embedded).await
}

#[cfg(feature = "tokio")]
#[tokio::test(flavor = "current_thread")]
async fn an_async_wait_resolves_when_the_message_arrives_daemon() {
    an_async_wait_resolves_when_the_message_arrives(softrdma::BackendKind::Daemon).await
}

on_both_backends! {
fn after_a_long_wait_the_device_keeps_serving_peers_with_nobody_waiting(backend: BackendKind) {
    let (a, b) = pair_v4_on(backend, 4096);
    // A long wait parks the progress thread; leaving it must hand the socket back.
    assert!(matches!(
        b.cq.wait(1, Some(Duration::from_millis(50))),
        Err(Error::Timeout)
    ));
    for i in 0..3u8 {
        a.mr.write(0, &[i; 16]).unwrap();
        a.qp.write(
            u64::from(i),
            &[a.mr.sge(..16).unwrap()],
            &b.mr.remote(..16).unwrap(),
        )
        .unwrap();
        a.cq.wait_ok(WAIT).unwrap();
        assert_eq!(b.mr.to_vec()[..16], [i; 16]);
        // A short wait too (no parking), then traffic with nobody waiting on b.
        let _ = b.cq.wait(1, Some(Duration::from_millis(1)));
    }
}
}

on_both_backends! {
    fn a_thread_waiting_for_an_async_event_wakes_when_one_is_raised(backend: BackendKind) {
        let a = open_on(backend, "127.0.0.1");
        let pd = a.alloc_pd().unwrap();
        let cq = a.create_cq(1).unwrap();
        let qp = pd.qp_builder(&cq, &cq).build().unwrap();
        let dev = a.clone();
        let waiter = thread::spawn(move || dev.wait_async_event(WAIT));
        // Correct either way; this only makes the waiter likely to be asleep first.
        thread::sleep(Duration::from_millis(20));
        qp.recv(1, &[]).unwrap();
        qp.recv(2, &[]).unwrap();
        qp.set_error().unwrap();
        let ev = waiter.join().unwrap().unwrap();
        assert!(
            matches!(ev, AsyncEvent::CqErr { .. } | AsyncEvent::QpFatal { .. }),
            "{ev:?}"
        );
    }
}

on_both_backends! {
    fn the_async_event_descriptor_is_readable_when_an_event_is_raised(backend: BackendKind) {
        let a = open_on(backend, "127.0.0.2");
        let pd = a.alloc_pd().unwrap();
        let cq = a.create_cq(1).unwrap();
        let qp = pd.qp_builder(&cq, &cq).build().unwrap();
        qp.recv(1, &[]).unwrap();
        qp.recv(2, &[]).unwrap();
        qp.set_error().unwrap();
        // On the daemon the descriptor also wakes for other connections' events (other
        // tests of this process share the daemon): those are cleared and waited past.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let ev = loop {
            runtime::wait_readable(a.async_event_fd(), WAIT).unwrap();
            if let Some(ev) = a.async_event().unwrap() {
                break ev;
            }
            assert!(std::time::Instant::now() < deadline, "no event came");
            let mut b = [0u8; 8];
            let _ = rustix::io::read(a.async_event_fd(), &mut b);
        };
        assert!(
            matches!(ev, AsyncEvent::CqErr { .. } | AsyncEvent::QpFatal { .. }),
            "{ev:?}"
        );
    }
}
