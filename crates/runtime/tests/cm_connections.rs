//! RC connections set up and torn down by the runtime's connection manager alone: two
//! devices on 127.0.0.1 and 127.0.0.2 over real UDP, no out-of-band exchange. Only the order
//! of events is checked, never how long anything took (waits have a generous limit so a
//! broken build fails instead of hanging).

use std::net::IpAddr;
use std::time::Duration;

use engine::{
    AccessFlags, CqHandle, MrKeys, PdHandle, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendWr,
    Sge, WcOpcode, WcStatus, WorkCompletion,
};
use runtime::{
    CmChannel, CmConfig, CmEvent, ConnParam, ConnectRequest, Ece, PortSpace, RejectReason, Runtime,
    RuntimeConfig, ServiceId,
};

const SERVICE: ServiceId = ServiceId::rdma_cm(PortSpace::TCP, 7471);

/// Longest wait for anything: a hang guard, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(20);

const BUF: usize = 4096;

/// One device with a PD, a CQ, a registered buffer and a CM event channel.
struct Device {
    rt: Runtime,
    pd: PdHandle,
    cq: CqHandle,
    /// Registered with `mr`; only read while holding the engine lock (see `reg_mr`).
    buf: Vec<u8>,
    mr: MrKeys,
    channel: CmChannel,
}

impl Device {
    /// A device on `ip` at `port` (0: the OS picks) with connection manager `cm`.
    fn open(ip: &str, port: u16, cm: CmConfig) -> Device {
        let mut config = RuntimeConfig::new(ip.parse().unwrap());
        config.port = port;
        config.remote_port = 0;
        config.cm = cm;
        let rt = Runtime::start(config).expect("start a device");
        let mut buf = vec![0u8; BUF];
        let (pd, cq, mr) = {
            let mut g = rt.lock();
            let pd = g.alloc_pd().unwrap();
            let cq = g.create_cq(64).unwrap();
            let access =
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
            // SAFETY: `buf` is neither moved (a Vec's heap block stays put) nor freed before the
            // runtime is dropped (fields drop in order: `rt` first), and the test reads it only
            // under the engine lock.
            let mr = unsafe { g.reg_mr(pd, buf.as_mut_ptr(), BUF, access) }.unwrap();
            (pd, cq, mr)
        };
        let channel = CmChannel::new().unwrap();
        Device {
            rt,
            pd,
            cq,
            buf,
            mr,
            channel,
        }
    }

    fn ip(&self) -> IpAddr {
        self.rt.local_addr().ip()
    }

    /// A new RC QP in RESET: the connection manager moves it from here.
    fn qp(&self) -> u32 {
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        self.rt
            .lock()
            .create_qp(&QpInitAttr {
                pd: self.pd,
                send_cq: self.cq,
                recv_cq: self.cq,
                cap,
                qp_type: QpType::Rc,
                sq_sig_all: false,
            })
            .unwrap()
    }

    fn state(&self, qpn: u32) -> QpState {
        self.rt.lock().query_qp(qpn).unwrap().qp_state
    }

    fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            addr: self.buf.as_ptr() as u64 + offset as u64,
            length: len as u32,
            lkey: self.mr.lkey,
        }
    }

    /// Write `bytes` at `offset` of the registered buffer.
    fn fill(&mut self, offset: usize, bytes: &[u8]) {
        let _g = self.rt.lock();
        self.buf[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    /// The registered buffer's bytes at `offset`.
    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let _g = self.rt.lock();
        self.buf[offset..offset + len].to_vec()
    }

    fn event(&self) -> CmEvent {
        self.channel
            .wait_event(Some(PATIENCE))
            .unwrap()
            .expect("a CM event")
    }

    fn completion(&self) -> WorkCompletion {
        assert!(
            self.rt.wait_cq(self.cq, Some(PATIENCE)).unwrap(),
            "a completion"
        );
        self.rt.lock().poll_cq(self.cq, 1).unwrap()[0]
    }
}

/// A connection manager that resends after about half a second (2^17 × 4.096 µs), so a lost
/// MAD costs little.
fn quick_cm() -> CmConfig {
    CmConfig {
        local_cm_response_timeout: 17,
        remote_cm_response_timeout: 17,
        max_cm_retries: 5,
        ..CmConfig::default()
    }
}

/// Devices on 127.0.0.1 and 127.0.0.2, each sending to the other's port.
fn pair() -> (Device, Device) {
    let a = Device::open("127.0.0.1", 0, quick_cm());
    let b = Device::open("127.0.0.2", 0, quick_cm());
    a.rt.set_remote_port(b.rt.local_addr().port());
    b.rt.set_remote_port(a.rt.local_addr().port());
    (a, b)
}

/// `b` listens, `a` connects a new QP with `hello`: returns a's QP, a's connection and the
/// request as `b` got it.
fn request(a: &Device, b: &Device, hello: &[u8]) -> (u32, runtime::CommId, Box<ConnectRequest>) {
    b.rt.lock().cm_listen(&b.channel, SERVICE).unwrap();
    let a_qp = a.qp();
    let a_id =
        a.rt.lock()
            .cm_connect(
                &a.channel,
                Some(a_qp),
                b.ip(),
                SERVICE,
                &ConnParam::with_private_data(hello),
            )
            .unwrap();
    let CmEvent::ConnectRequest(req) = b.event() else {
        panic!("the listener gets the request first")
    };
    (a_qp, a_id, req)
}

/// `b` listens, `a` connects with `hello`, `b` accepts with `reply`: returns (a's QP, a's
/// connection, b's QP, b's connection, the REP's private data as `a` got it).
fn connect(a: &Device, b: &Device, hello: &[u8], reply: &[u8]) -> Connected {
    let (a_qp, a_id, req) = request(a, b, hello);
    assert_eq!(req.service_id, SERVICE);
    assert_eq!(req.peer, a.ip());
    assert_eq!(req.local, b.ip());
    assert_eq!(req.remote_qpn.value(), a_qp);
    assert_eq!(&req.private_data[..hello.len()], hello);
    let b_qp = b.qp();
    b.rt.lock()
        .cm_accept(
            &b.channel,
            req.id,
            Some(b_qp),
            &ConnParam::with_private_data(reply),
        )
        .unwrap();
    // The accept left the QP in RTS (as Linux's rdma_accept does): a receive posted now is
    // there before the connector, which waits for its Established event, can send.
    assert_eq!(b.state(b_qp), QpState::Rts);
    b.rt.lock()
        .post_recv(b_qp, RecvWr::new(1, &[b.sge(0, 64)][..]))
        .unwrap();
    let CmEvent::Established {
        id, private_data, ..
    } = a.event()
    else {
        panic!("the connector is established by the REP")
    };
    assert_eq!(id, a_id);
    let CmEvent::Established { id: b_id, .. } = b.event() else {
        panic!("the listener is established by the RTU")
    };
    assert_eq!(b_id, req.id);
    Connected {
        a_qp,
        a_id,
        b_qp,
        b_id,
        rep_data: private_data,
    }
}

struct Connected {
    a_qp: u32,
    a_id: runtime::CommId,
    b_qp: u32,
    b_id: runtime::CommId,
    rep_data: Vec<u8>,
}

#[test]
fn a_connection_made_through_the_cm_alone_carries_a_send_and_an_rdma_write() {
    let (mut a, b) = pair();
    // The listener advertises its buffer in the REP's private data, as rping does.
    let mut advert = [0u8; 12];
    advert[..8].copy_from_slice(&(b.buf.as_ptr() as u64).to_be_bytes());
    advert[8..].copy_from_slice(&b.mr.rkey.value().to_be_bytes());
    let c = connect(&a, &b, b"hello from a", &advert);
    assert_eq!(&c.rep_data[..12], &advert, "the REP's private data arrives");
    assert_eq!(a.state(c.a_qp), QpState::Rts);
    assert_eq!(b.state(c.b_qp), QpState::Rts);

    a.fill(0, b"a SEND over a CM connection");
    a.rt.lock()
        .post_send(c.a_qp, SendWr::send(10, &[a.sge(0, 27)][..]))
        .unwrap();
    let sent = a.completion();
    assert_eq!((sent.wr_id, sent.status), (10, WcStatus::Success));
    let got = b.completion();
    assert_eq!(
        (got.wr_id, got.status, got.byte_len),
        (1, WcStatus::Success, 27)
    );
    assert_eq!(b.read(0, 27), b"a SEND over a CM connection");

    let addr = u64::from_be_bytes(c.rep_data[..8].try_into().unwrap());
    let rkey = engine::Rkey::new(u32::from_be_bytes(c.rep_data[8..12].try_into().unwrap()));
    a.fill(100, b"an RDMA WRITE");
    a.rt.lock()
        .post_send(
            c.a_qp,
            SendWr::rdma_write(11, &[a.sge(100, 13)][..], addr + 1000, rkey),
        )
        .unwrap();
    let wrote = a.completion();
    assert_eq!(
        (wrote.wr_id, wrote.status, wrote.opcode),
        (11, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    assert_eq!(b.read(1000, 13), b"an RDMA WRITE");
}

#[test]
fn a_connect_to_a_port_nobody_listens_on_is_rejected_and_its_qp_errored() {
    let (a, b) = pair();
    let qp = a.qp();
    let nobody = ServiceId::rdma_cm(PortSpace::TCP, 9);
    let id =
        a.rt.lock()
            .cm_connect(&a.channel, Some(qp), b.ip(), nobody, &ConnParam::default())
            .unwrap();
    match a.event() {
        CmEvent::Rejected {
            id: rid, reason, ..
        } => {
            assert_eq!(rid, id);
            // As Linux answers a REQ for a service nobody listens on.
            assert_eq!(reason, RejectReason::INVALID_SERVICE_ID);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(a.state(qp), QpState::Err);
    assert!(
        b.channel.get_event().is_none(),
        "nobody listens: nothing for b"
    );
}

#[test]
fn a_listener_that_rejects_sends_its_private_data_to_the_connector() {
    let (a, b) = pair();
    let (qp, id, req) = request(&a, &b, b"");
    b.rt.lock()
        .cm_reject(
            &b.channel,
            req.id,
            RejectReason::CONSUMER_DEFINED,
            b"go away",
        )
        .unwrap();
    match a.event() {
        CmEvent::Rejected {
            id: rid,
            reason,
            private_data,
        } => {
            assert_eq!(rid, id);
            assert_eq!(reason, RejectReason::CONSUMER_DEFINED);
            assert_eq!(&private_data[..7], b"go away");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(a.state(qp), QpState::Err);
}

/// What each side gives as ECE reaches the other: the REQ's at the listener, the REP's at
/// the connector, whether the runtime moves the connector's QP (ESTABLISHED) or the
/// connector does (CONNECT_RESPONSE).
#[test]
fn ece_given_by_each_side_reaches_the_other_in_the_req_and_the_rep() {
    let (a, b) = pair();
    b.rt.lock().cm_listen(&b.channel, SERVICE).unwrap();
    let asked = Ece {
        vendor_id: 0x00_02c9,
        options: 0x8000_0003,
    };
    let granted = Ece {
        vendor_id: 0x00_02c9,
        options: 0x0000_0002,
    };
    for managed in [false, true] {
        let a_qp = a.qp();
        let mut param = ConnParam::with_private_data(b"ece");
        param.ece = asked;
        param.qp_num = a_qp;
        let qp = (!managed).then_some(a_qp);
        let a_id =
            a.rt.lock()
                .cm_connect(&a.channel, qp, b.ip(), SERVICE, &param)
                .unwrap();
        let CmEvent::ConnectRequest(req) = b.event() else {
            panic!("the listener gets the request")
        };
        assert_eq!(req.ece, asked, "the REQ's ECE at the listener");
        let mut answer = ConnParam::default();
        answer.ece = granted;
        let b_qp = b.qp();
        b.rt.lock()
            .cm_accept(&b.channel, req.id, Some(b_qp), &answer)
            .unwrap();
        let got = match a.event() {
            CmEvent::Established { id, ece, .. } if !managed => {
                assert_eq!(id, a_id);
                ece
            }
            CmEvent::ConnectResponse { id, ece, .. } if managed => {
                assert_eq!(id, a_id);
                for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
                    move_qp(&a, a_id, a_qp, state);
                }
                a.rt.lock().cm_establish(&a.channel, a_id).unwrap();
                ece
            }
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(got, granted, "the REP's ECE at the connector");
        match b.event() {
            CmEvent::Established { id, ece, .. } => {
                assert_eq!(id, req.id);
                assert_eq!(
                    ece,
                    Ece::default(),
                    "the listener had its peer's in the request"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// `rdma_reject_ece`: the connector learns its ECE options were refused (reason 35), not
/// merely that the listener said no; a reason that is the CM's own (here 8) is refused to
/// the consumer, and the request stays to be answered.
#[test]
fn a_listener_refusing_the_ece_asked_for_rejects_with_reason_35() {
    let (a, b) = pair();
    let (qp, id, req) = request(&a, &b, b"");
    let e =
        b.rt.lock()
            .cm_reject(&b.channel, req.id, RejectReason::INVALID_SERVICE_ID, b"")
            .unwrap_err();
    assert!(matches!(
        e,
        runtime::RuntimeError::Cm(runtime::CmError::NotAConsumerReason(_))
    ));
    b.rt.lock()
        .cm_reject(
            &b.channel,
            req.id,
            RejectReason::VENDOR_OPTION_NOT_SUPPORTED,
            b"",
        )
        .unwrap();
    match a.event() {
        CmEvent::Rejected {
            id: rid, reason, ..
        } => {
            assert_eq!(rid, id);
            assert_eq!(reason.0, 35);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert_eq!(a.state(qp), QpState::Err);
}

#[test]
fn a_disconnect_flushes_both_qps_and_both_sides_see_it() {
    let (a, b) = pair();
    let c = connect(&a, &b, b"", b"");
    // Outstanding receives on both sides: they flush when the QPs go to ERR.
    a.rt.lock()
        .post_recv(c.a_qp, RecvWr::new(20, &[a.sge(0, 64)][..]))
        .unwrap();
    b.rt.lock()
        .post_recv(c.b_qp, RecvWr::new(21, &[b.sge(0, 64)][..]))
        .unwrap();

    a.rt.lock()
        .cm_disconnect(&a.channel, c.a_id, b"bye")
        .unwrap();
    assert_eq!(a.event(), CmEvent::Disconnected { id: c.a_id });
    assert_eq!(b.event(), CmEvent::Disconnected { id: c.b_id });
    assert_eq!(a.state(c.a_qp), QpState::Err);
    assert_eq!(b.state(c.b_qp), QpState::Err);
    let fa = a.completion();
    assert_eq!((fa.wr_id, fa.status), (20, WcStatus::WrFlushErr));
    // b still had the receive `connect` posted, then this one
    for wr_id in [1, 21] {
        let fb = b.completion();
        assert_eq!((fb.wr_id, fb.status), (wr_id, WcStatus::WrFlushErr));
    }
    // A second disconnect has nothing to close.
    assert!(a.rt.lock().cm_disconnect(&a.channel, c.a_id, b"").is_err());
}

#[test]
fn a_request_lost_on_the_way_is_resent_and_the_connection_comes_up() {
    let (a, b) = pair();
    let b_port = b.rt.local_addr().port();
    // b goes away: the REQ finds no socket at b's address and is lost.
    drop(b);
    let a_qp = a.qp();
    let a_id =
        a.rt.lock()
            .cm_connect(
                &a.channel,
                Some(a_qp),
                "127.0.0.2".parse().unwrap(),
                SERVICE,
                &{ ConnParam::with_private_data(b"again") },
            )
            .unwrap();
    assert_eq!(a.rt.cm_counters().cm.sent, 1, "the REQ left");
    // b comes back on the same port and listens before the CM resends (about half a
    // second later).
    let b = Device::open("127.0.0.2", b_port, quick_cm());
    b.rt.set_remote_port(a.rt.local_addr().port());
    b.rt.lock().cm_listen(&b.channel, SERVICE).unwrap();
    let CmEvent::ConnectRequest(req) = b.event() else {
        panic!("the resent REQ arrives")
    };
    assert_eq!(&req.private_data[..5], b"again");
    assert!(a.rt.cm_counters().cm.retransmitted >= 1);
    let b_qp = b.qp();
    b.rt.lock()
        .cm_accept(&b.channel, req.id, Some(b_qp), &ConnParam::default())
        .unwrap();
    assert!(matches!(a.event(), CmEvent::Established { id, .. } if id == a_id));
    assert!(matches!(b.event(), CmEvent::Established { id, .. } if id == req.id));
    assert_eq!(a.state(a_qp), QpState::Rts);
}

#[test]
fn a_connection_let_go_of_is_closed_at_the_peer_and_reports_nothing_more() {
    let (a, b) = pair();
    let c = connect(&a, &b, b"", b"");
    a.rt.lock().cm_destroy_id(&a.channel, c.a_id).unwrap();
    assert_eq!(a.state(c.a_qp), QpState::Err);
    assert_eq!(b.event(), CmEvent::Disconnected { id: c.b_id });
    assert_eq!(b.state(c.b_qp), QpState::Err);
    // The QP is the consumer's again, to destroy; the connection is gone.
    a.rt.lock().destroy_qp(c.a_qp).unwrap();
    assert!(a.rt.lock().cm_destroy_id(&a.channel, c.a_id).is_err());
}

#[test]
fn a_request_let_go_of_before_the_answer_is_rejected_at_the_listener() {
    let (a, b) = pair();
    let (qp, id, req) = request(&a, &b, b"");
    a.rt.lock().cm_destroy_id(&a.channel, id).unwrap();
    assert_eq!(a.state(qp), QpState::Err);
    match b.event() {
        CmEvent::Rejected { id, reason, .. } => {
            assert_eq!(id, req.id);
            // as Linux's cm_destroy_id tells the peer of a REQ it gives up
            assert_eq!(reason, RejectReason::TIMEOUT);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    // The request is gone: accepting it now fails and leaves the QP alone.
    let b_qp = b.qp();
    assert!(b
        .rt
        .lock()
        .cm_accept(&b.channel, req.id, Some(b_qp), &ConnParam::default())
        .is_err());
    assert_eq!(b.state(b_qp), QpState::Reset);
}

#[test]
fn only_the_channel_a_connection_reports_to_may_act_on_it() {
    let (a, b) = pair();
    let c = connect(&a, &b, b"", b"");
    let other = runtime::CmChannel::new().unwrap();
    // Another consumer of the same device cannot close (or destroy) a's connection...
    let refused = a.rt.lock().cm_disconnect(&other, c.a_id, b"");
    assert!(matches!(
        refused,
        Err(runtime::RuntimeError::Cm(runtime::CmError::UnknownId(_)))
    ));
    assert!(a.rt.lock().cm_destroy_id(&other, c.a_id).is_err());
    assert_eq!(a.state(c.a_qp), QpState::Rts);
    // ...and closing that other channel leaves it alone.
    assert_eq!(a.rt.lock().cm_close_channel(&other), 0);
    assert_eq!(a.state(c.a_qp), QpState::Rts);
}

#[test]
fn closing_a_channel_ends_its_listens_and_tears_its_connections_down_at_the_peer() {
    let (a, b) = pair();
    let c = connect(&a, &b, b"", b"");
    // b's consumer goes away: its listen ends and its connection is closed at a.
    assert_eq!(b.rt.lock().cm_close_channel(&b.channel), 1);
    assert_eq!(b.state(c.b_qp), QpState::Err);
    assert_eq!(a.event(), CmEvent::Disconnected { id: c.a_id });
    // Nothing listens any more: a new request is rejected by b's CM itself.
    let a_qp = a.qp();
    a.rt.lock()
        .cm_connect(
            &a.channel,
            Some(a_qp),
            b.ip(),
            SERVICE,
            &ConnParam::default(),
        )
        .unwrap();
    assert!(matches!(a.event(), CmEvent::Rejected { .. }));
}

/// Move `qpn` to `state` with what the connection manager hands out for it
/// (`rdma_init_qp_attr` + `ibv_modify_qp`, as a program that moves its own QP does).
fn move_qp(d: &Device, id: runtime::CommId, qpn: u32, state: QpState) {
    let mut g = d.rt.lock();
    let (attr, mask) = g.cm_init_qp_attr(&d.channel, id, state).unwrap();
    assert_eq!(attr.qp_state, state);
    g.modify_qp(qpn, &attr, mask).unwrap();
}

#[test]
fn qps_their_consumers_move_connect_with_the_attributes_the_cm_hands_out() {
    let (a, mut b) = pair();
    b.rt.lock().cm_listen(&b.channel, SERVICE).unwrap();
    // Neither side gives the runtime its QP: the REQ and REP only announce the numbers.
    let (a_qp, b_qp) = (a.qp(), b.qp());
    let mut param = ConnParam::with_private_data(b"managed");
    param.qp_num = a_qp;
    let a_id =
        a.rt.lock()
            .cm_connect(&a.channel, None, b.ip(), SERVICE, &param)
            .unwrap();
    assert_eq!(
        a.state(a_qp),
        QpState::Reset,
        "the runtime leaves the QP alone"
    );
    let CmEvent::ConnectRequest(req) = b.event() else {
        panic!("the listener gets the request")
    };
    assert_eq!(
        req.remote_qpn.value(),
        a_qp,
        "the REQ announces the consumer's QP"
    );
    // The passive side moves its QP before accepting, as rdma-core's rdma_accept does.
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        move_qp(&b, req.id, b_qp, state);
    }
    b.rt.lock()
        .post_recv(b_qp, RecvWr::new(1, &[b.sge(0, 64)][..]))
        .unwrap();
    let mut answer = ConnParam::default();
    answer.qp_num = b_qp;
    b.rt.lock()
        .cm_accept(&b.channel, req.id, None, &answer)
        .unwrap();
    let CmEvent::ConnectResponse { id, remote_qpn, .. } = a.event() else {
        panic!("the connector gets the REP as a response to act on")
    };
    assert_eq!((id, remote_qpn.value()), (a_id, b_qp));
    assert!(
        b.channel.get_event().is_none(),
        "no RTU yet: the listener is not established"
    );
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        move_qp(&a, a_id, a_qp, state);
    }
    let qa = a.rt.lock().query_qp(a_qp).unwrap();
    let qb = b.rt.lock().query_qp(b_qp).unwrap();
    assert_eq!(
        (qa.dest_qp_num.value(), qb.dest_qp_num.value()),
        (b_qp, a_qp)
    );
    assert_eq!(qa.sq_psn, qb.rq_psn, "a sends from the PSN b expects");
    assert_eq!(qb.sq_psn, qa.rq_psn, "b sends from the PSN a expects");
    a.rt.lock().cm_establish(&a.channel, a_id).unwrap();
    let CmEvent::Established { id, .. } = b.event() else {
        panic!("the RTU establishes the listener")
    };
    assert_eq!(id, req.id);
    assert!(
        a.rt.lock().cm_establish(&a.channel, a_id).is_err(),
        "the RTU goes once"
    );

    b.fill(0, &[0; 64]);
    let mut a = a;
    a.fill(0, b"moved by its owner");
    a.rt.lock()
        .post_send(a_qp, SendWr::send(7, &[a.sge(0, 18)][..]))
        .unwrap();
    assert_eq!(a.completion().status, WcStatus::Success);
    let got = b.completion();
    assert_eq!(
        (got.wr_id, got.status, got.byte_len),
        (1, WcStatus::Success, 18)
    );
    assert_eq!(b.read(0, 18), b"moved by its owner");

    // Disconnecting leaves the QPs to their owners too.
    a.rt.lock().cm_disconnect(&a.channel, a_id, &[]).unwrap();
    assert!(matches!(b.event(), CmEvent::Disconnected { .. }));
    assert!(matches!(a.event(), CmEvent::Disconnected { .. }));
    assert_eq!(a.state(a_qp), QpState::Rts);
    // Both ids stay until their time-wait ends (rdma_cm's TIMEWAIT_EXIT), then are gone.
    assert_eq!(a.event(), CmEvent::TimeWaitExit { id: a_id });
    assert_eq!(b.event(), CmEvent::TimeWaitExit { id: req.id });
    assert!(a.rt.lock().cm_destroy_id(&a.channel, a_id).is_err());
    assert_eq!(a.rt.cm_counters().connections, 0);
}

#[test]
fn a_connection_with_a_moved_qp_reports_its_attributes_and_refuses_to_establish() {
    let (a, b) = pair();
    let c = connect(&a, &b, b"x", b"y");
    // The runtime moved these QPs; what it reports matches what it applied.
    let (attr, _) =
        a.rt.lock()
            .cm_init_qp_attr(&a.channel, c.a_id, QpState::Rtr)
            .unwrap();
    let q = a.rt.lock().query_qp(c.a_qp).unwrap();
    assert_eq!((attr.dest_qp_num, attr.rq_psn), (q.dest_qp_num, q.rq_psn));
    let (attr, _) =
        b.rt.lock()
            .cm_init_qp_attr(&b.channel, c.b_id, QpState::Rts)
            .unwrap();
    assert_eq!(attr.sq_psn, b.rt.lock().query_qp(c.b_qp).unwrap().sq_psn);
    assert!(a
        .rt
        .lock()
        .cm_init_qp_attr(&a.channel, c.a_id, QpState::Sqd)
        .is_err());
    assert!(
        a.rt.lock().cm_establish(&a.channel, c.a_id).is_err(),
        "the runtime sent this RTU itself"
    );
}
