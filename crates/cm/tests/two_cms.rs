//! Two CMs talking through a lossy in-memory link with a fake clock: connections set up and
//! torn down, with REQ, REP, RTU, DREP lost on the way, MRAs, rejects, timeouts and SIDR.
//! Everything is deterministic: no test depends on wall-clock time.

use std::net::IpAddr;
use std::time::Duration;

use cm::*;
use wire::{
    CmAttrId, CmMadRepr, CmMsgRef, CmaAddrs, CmaHeaderRepr, PortSpace, Psn, Qkey, Qpn,
    RejectReason, RepRepr, ReqRepr, ServiceId, SidrRepRepr, SidrReqRepr, SidrStatus,
    CMA_HEADER_LEN, MAD_LEN,
};

const SERVICE: ServiceId = ServiceId::rdma_cm(PortSpace::TCP, 7174);

fn config(first_comm_id: u32) -> CmConfig {
    CmConfig {
        local_ca_guid: u64::from(first_comm_id),
        // 2^10 × 4.096 µs ≈ 4.2 ms per wait, so a test walks through all retries quickly
        local_cm_response_timeout: 10,
        remote_cm_response_timeout: 10,
        max_cm_retries: 3,
        packet_life_time: Duration::from_micros(100),
        time_wait: Duration::from_millis(10),
        first_comm_id,
        tid_prefix: first_comm_id,
    }
}

/// Two CMs, A (active) and B (passive), and the MADs that crossed between them.
struct Pair {
    now: Instant,
    a: Cm,
    b: Cm,
    ip_a: IpAddr,
    ip_b: IpAddr,
    /// (from A?, message name) of every MAD sent, in order, lost or not.
    log: Vec<(bool, &'static str)>,
    /// Decides whether a MAD (from A?, message name, how many of that kind from that side
    /// so far) is lost.
    lose: Box<dyn FnMut(bool, &'static str, usize) -> bool>,
}

impl Pair {
    fn new() -> Pair {
        let mut b = Cm::new(config(0x1000));
        b.listen(SERVICE).unwrap();
        Pair {
            now: Instant::from_nanos(0),
            a: Cm::new(config(0x100)),
            b,
            ip_a: [10, 0, 0, 1].into(),
            ip_b: [10, 0, 0, 2].into(),
            log: Vec::new(),
            lose: Box::new(|_, _, _| false),
        }
    }

    /// Deliver every queued MAD (and what it triggers) until both sides are quiet.
    fn flush(&mut self) {
        let mut buf = [0u8; MAD_LEN];
        loop {
            let mut moved = false;
            for from_a in [true, false] {
                let (src, dst) = if from_a {
                    (&mut self.a, &mut self.b)
                } else {
                    (&mut self.b, &mut self.a)
                };
                while let Some(t) = src.poll_transmit(self.now, &mut buf) {
                    moved = true;
                    let name = CmMadRepr::parse(&buf[..t.len]).unwrap().message.name();
                    let n = self
                        .log
                        .iter()
                        .filter(|&&(f, m)| f == from_a && m == name)
                        .count();
                    self.log.push((from_a, name));
                    if !(self.lose)(from_a, name, n) {
                        let from = if from_a { self.ip_a } else { self.ip_b };
                        assert_eq!(t.dst, if from_a { self.ip_b } else { self.ip_a });
                        dst.handle_mad(self.now, from, &buf[..t.len]);
                    }
                }
            }
            if !moved {
                return;
            }
        }
    }

    /// Jump to the next timer of either side and run it.
    fn tick(&mut self) -> bool {
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(at) = next else { return false };
        assert!(at >= self.now, "timers never go back in time");
        self.now = at;
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        self.flush();
        true
    }

    fn sent(&self, from_a: bool, name: &str) -> usize {
        self.log
            .iter()
            .filter(|&&(f, m)| f == from_a && m == name)
            .count()
    }
}

/// What an rdma_cm REQ carries: QP, PSN, and the IP CM header with both addresses.
fn req(user_data: &[u8]) -> ReqRepr {
    let mut pd = [0u8; 92];
    CmaHeaderRepr {
        src_port: 40000,
        addrs: CmaAddrs::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into()).unwrap(),
    }
    .emit(&mut pd)
    .unwrap();
    pd[CMA_HEADER_LEN..CMA_HEADER_LEN + user_data.len()].copy_from_slice(user_data);
    ReqRepr {
        service_id: SERVICE,
        local_qpn: Qpn::new(0x11),
        starting_psn: Psn::new(0x1234),
        responder_resources: 1,
        initiator_depth: 1,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        pkey: 0xffff,
        private_data: wire::PrivateData(pd),
        ..ReqRepr::default()
    }
}

fn rep() -> RepRepr {
    RepRepr {
        local_qpn: Qpn::new(0x22),
        starting_psn: Psn::new(0x5678),
        responder_resources: 1,
        initiator_depth: 1,
        rnr_retry_count: 7,
        ..RepRepr::default()
    }
}

/// A connects, B accepts whatever arrives; returns (A's ID, B's ID) once the REQ is in.
fn request(p: &mut Pair) -> (CommId, CommId) {
    let a_id = p.a.connect(p.now, p.ip_b, req(b"hello"));
    p.flush();
    match p.b.poll_event() {
        Some(Event::ConnectRequest { id, peer, req }) => {
            assert_eq!(peer, p.ip_a);
            assert_eq!(req.local_comm_id, a_id.0);
            (a_id, id)
        }
        other => panic!("expected a connect request, got {other:?}"),
    }
}

fn established(cm: &mut Cm) -> Option<Box<RepRepr>> {
    match cm.poll_event() {
        Some(Event::Established { reply, .. }) => reply,
        other => panic!("expected established, got {other:?}"),
    }
}

fn run_until_quiet(p: &mut Pair) {
    for _ in 0..100 {
        if !p.tick() {
            return;
        }
    }
    panic!("timers never settle");
}

#[test]
fn a_connection_is_requested_accepted_established_and_closed() {
    let mut p = Pair::new();
    let a_id = p.a.connect(p.now, p.ip_b, req(b"hello"));
    p.flush();
    let Some(Event::ConnectRequest { id: b_id, req, .. }) = p.b.poll_event() else {
        panic!("no connect request")
    };
    // the passive side learns the peer's QP, PSN, addresses and private data from the REQ
    assert_eq!(req.local_qpn, Qpn::new(0x11));
    assert_eq!(req.starting_psn, Psn::new(0x1234));
    assert_eq!(req.local_ca_guid, 0x100);
    let cma = CmaHeaderRepr::parse_bytes(req.private_data.as_bytes()).unwrap();
    assert_eq!(cma.src_port, 40000);
    assert_eq!(&req.private_data.as_bytes()[36..41], b"hello");
    assert_eq!(p.b.state(b_id), Some(State::ReqRcvd));

    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    let reply = established(&mut p.a).expect("the active side gets the REP");
    assert_eq!(
        (reply.local_qpn, reply.starting_psn),
        (Qpn::new(0x22), Psn::new(0x5678))
    );
    assert_eq!(reply.remote_comm_id, a_id.0);
    assert_eq!(established(&mut p.b), None);
    assert_eq!(p.a.state(a_id), Some(State::Established));
    assert_eq!(p.b.state(b_id), Some(State::Established));
    assert_eq!(
        p.log,
        [(true, "REQ"), (false, "REP"), (true, "RTU")],
        "one message each, no retransmission"
    );

    p.a.disconnect(p.now, a_id, b"bye").unwrap();
    p.flush();
    assert_eq!(p.a.poll_event(), Some(Event::Disconnected { id: a_id }));
    assert_eq!(p.b.poll_event(), Some(Event::Disconnected { id: b_id }));
    assert_eq!(p.a.state(a_id), Some(State::TimeWait));
    let closed = p.now;
    run_until_quiet(&mut p);
    assert_eq!((p.a.state(a_id), p.b.state(b_id)), (None, None));
    // both sides report the end of time-wait, once, no sooner than the period
    assert_eq!(p.a.poll_event(), Some(Event::TimeWaitExit { id: a_id }));
    assert_eq!(p.b.poll_event(), Some(Event::TimeWaitExit { id: b_id }));
    assert_eq!((p.a.poll_event(), p.b.poll_event()), (None, None));
    assert!(p.now >= closed + config(0).time_wait);
    assert_eq!(p.log[3..], [(true, "DREQ"), (false, "DREP")]);
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn transaction_ids_pair_answers_with_requests() {
    let mut p = Pair::new();
    let mut tids = Vec::new();
    let a_id = p.a.connect(p.now, p.ip_b, req(b""));
    let mut buf = [0u8; MAD_LEN];
    let mut pump = |from: &mut Cm, to: &mut Cm, now, src, tids: &mut Vec<_>| {
        while let Some(t) = from.poll_transmit(now, &mut buf) {
            let m = CmMadRepr::parse(&buf[..t.len]).unwrap();
            tids.push((m.message.attr_id(), m.transaction_id));
            to.handle_mad(now, src, &buf[..t.len]);
        }
    };
    pump(&mut p.a, &mut p.b, p.now, p.ip_a, &mut tids);
    let Some(Event::ConnectRequest { id: b_id, .. }) = p.b.poll_event() else {
        panic!()
    };
    p.b.accept(p.now, b_id, rep()).unwrap();
    pump(&mut p.b, &mut p.a, p.now, p.ip_b, &mut tids);
    pump(&mut p.a, &mut p.b, p.now, p.ip_a, &mut tids);
    p.b.disconnect(p.now, b_id, b"").unwrap();
    pump(&mut p.b, &mut p.a, p.now, p.ip_b, &mut tids);
    pump(&mut p.a, &mut p.b, p.now, p.ip_a, &mut tids);
    let _ = a_id;
    let ids: Vec<_> = tids.iter().map(|&(a, _)| a).collect();
    assert_eq!(
        ids,
        [
            CmAttrId::REQ,
            CmAttrId::REP,
            CmAttrId::RTU,
            CmAttrId::DREQ,
            CmAttrId::DREP
        ]
    );
    // REP and RTU carry the REQ's; the DREQ starts its own, which the DREP carries
    assert_eq!(tids[1].1, tids[0].1);
    assert_eq!(tids[2].1, tids[0].1);
    assert_ne!(tids[3].1, tids[0].1);
    assert_eq!(tids[4].1, tids[3].1);
}

#[test]
fn a_lost_req_is_resent_after_the_response_timeout() {
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, name, n| from_a && name == "REQ" && n == 0);
    let a_id = p.a.connect(p.now, p.ip_b, req(b""));
    p.flush();
    assert_eq!(p.b.poll_event(), None);
    // the REQ waits the peer's response timeout plus twice the packet life time
    let deadline = p.a.poll_timeout().unwrap();
    assert_eq!(
        deadline,
        Instant::from_nanos(0) + cm_timeout(10) + Duration::from_micros(200)
    );
    assert!(p.tick());
    let Some(Event::ConnectRequest { id: b_id, .. }) = p.b.poll_event() else {
        panic!("the resent REQ arrives")
    };
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    assert!(established(&mut p.a).is_some());
    assert_eq!(established(&mut p.b), None);
    assert_eq!(p.a.counters().retransmitted, 1);
    assert_eq!(p.sent(true, "REQ"), 2);
    assert_eq!(p.a.state(a_id), Some(State::Established));
}

#[test]
fn a_lost_rep_is_resent_and_a_duplicate_req_is_answered_with_it() {
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, name, n| !from_a && name == "REP" && n == 0);
    let (a_id, b_id) = request(&mut p);
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    assert_eq!(p.a.poll_event(), None);
    // both sides' timers run out together: A resends the REQ, B resends the REP and also
    // answers the duplicate REQ with it
    assert!(p.tick());
    assert!(established(&mut p.a).is_some());
    assert_eq!(established(&mut p.b), None);
    assert_eq!(p.b.poll_event(), None, "no second connect request");
    assert_eq!(p.a.state(a_id), Some(State::Established));
    assert_eq!(p.b.state(b_id), Some(State::Established));
    assert!(p.b.counters().duplicates_answered + p.b.counters().retransmitted >= 1);
    run_until_quiet(&mut p);
    assert_eq!(p.b.state(b_id), Some(State::Established));
}

/// ECE rides in the REQ and REP (vendor ID in the message, options in the MAD header), so a
/// resent or re-answered message must carry it again: lose the first REQ and the first
/// REP, and what arrives still has each side's values.
#[test]
fn ece_crosses_in_the_req_and_the_rep_and_survives_their_retransmissions() {
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, name, n| n == 0 && (from_a && name == "REQ" || name == "REP"));
    let asked = Ece {
        vendor_id: 0x00_02c9,
        options: 0x8000_0003,
    };
    let granted = Ece {
        vendor_id: 0x00_02c9,
        options: 0x0000_0001,
    };
    let a_id = p.a.connect(
        p.now,
        p.ip_b,
        ReqRepr {
            ece: asked,
            ..req(b"")
        },
    );
    p.flush();
    assert!(p.tick(), "the REQ is resent");
    let Some(Event::ConnectRequest { id: b_id, req, .. }) = p.b.poll_event() else {
        panic!("the resent REQ arrives")
    };
    assert_eq!(req.ece, asked);
    p.b.accept(
        p.now,
        b_id,
        RepRepr {
            ece: granted,
            ..rep()
        },
    )
    .unwrap();
    p.flush();
    assert_eq!(p.a.poll_event(), None, "the first REP is lost");
    run_until_quiet(&mut p);
    let reply = established(&mut p.a).expect("a REP arrives again");
    assert_eq!(reply.ece, granted);
    assert!(p.sent(true, "REQ") >= 2 && p.sent(false, "REP") >= 2);
    assert_eq!(p.a.state(a_id), Some(State::Established));
}

#[test]
fn a_lost_rtu_is_recovered_when_the_rep_comes_again() {
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, name, n| from_a && name == "RTU" && n == 0);
    let (a_id, b_id) = request(&mut p);
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    assert!(established(&mut p.a).is_some());
    assert_eq!(p.b.state(b_id), Some(State::RepSent));
    assert!(p.tick());
    // B resent its REP; A, already established, answered it with the RTU again
    assert_eq!(established(&mut p.b), None);
    assert_eq!(p.a.poll_event(), None, "A reports established once");
    assert_eq!(p.a.counters().duplicates_answered, 1);
    assert_eq!(p.sent(true, "RTU"), 2);
    assert_eq!(p.a.state(a_id), Some(State::Established));
}

#[test]
fn a_held_rtu_leaves_only_when_the_host_sends_it() {
    let mut p = Pair::new();
    let a_id = p.a.connect_holding_rtu(p.now, p.ip_b, req(b"hello"));
    p.flush();
    let b_id = match p.b.poll_event() {
        Some(Event::ConnectRequest { id, .. }) => id,
        other => panic!("expected a connect request, got {other:?}"),
    };
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    match p.a.poll_event() {
        Some(Event::Replied { id, rep }) => {
            assert_eq!(id, a_id);
            assert_eq!(rep.local_qpn, Qpn::new(0x22));
        }
        other => panic!("expected the REP, got {other:?}"),
    }
    assert_eq!(p.a.state(a_id), Some(State::RepRcvd));
    assert_eq!(p.sent(true, "RTU"), 0, "no RTU before the host says");
    assert_eq!(
        p.a.poll_timeout(),
        None,
        "nothing to resend while waiting for the host"
    );
    // B resends its REP meanwhile: A drops the duplicate, still waiting
    assert!(p.tick());
    assert_eq!(p.sent(false, "REP"), 2);
    assert_eq!(p.a.poll_event(), None);
    assert_eq!(p.sent(true, "RTU"), 0);
    p.a.send_rtu(a_id).unwrap();
    p.flush();
    assert_eq!(p.sent(true, "RTU"), 1);
    assert_eq!(p.a.state(a_id), Some(State::Established));
    assert_eq!(established(&mut p.b), None);
    assert_eq!(p.b.state(b_id), Some(State::Established));
    assert!(p.a.send_rtu(a_id).is_err(), "an RTU goes once");
}

#[test]
fn a_held_rep_given_up_is_rejected_as_a_rep() {
    let mut p = Pair::new();
    let a_id = p.a.connect_holding_rtu(p.now, p.ip_b, req(b""));
    p.flush();
    let Some(Event::ConnectRequest { id: b_id, .. }) = p.b.poll_event() else {
        panic!("expected a connect request");
    };
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    assert!(matches!(p.a.poll_event(), Some(Event::Replied { .. })));
    p.a.reject(a_id, RejectReason::CONSUMER_DEFINED, &[])
        .unwrap();
    p.flush();
    match p.b.poll_event() {
        Some(Event::Rejected { id, rej }) => {
            assert_eq!(id, b_id);
            assert_eq!(rej.message_rejected, CmMsgRef::Rep);
        }
        other => panic!("expected the REJ, got {other:?}"),
    }
    assert_eq!(p.a.state(a_id), None);
    assert_eq!(p.b.state(b_id), None);
}

#[test]
fn data_before_the_rtu_establishes_the_passive_side() {
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, name, _| from_a && name == "RTU");
    let (_, b_id) = request(&mut p);
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    p.b.notify_established(b_id).unwrap();
    assert_eq!(established(&mut p.b), None);
    assert_eq!(p.b.poll_timeout(), None, "the REP is no longer resent");
    assert!(p.b.notify_established(b_id).is_err());
}

#[test]
fn an_unanswered_req_is_resent_max_cm_retries_times_then_times_out() {
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, _, _| from_a);
    let a_id = p.a.connect(p.now, p.ip_b, req(b""));
    p.flush();
    run_until_quiet(&mut p);
    assert_eq!(p.a.poll_event(), Some(Event::TimedOut { id: a_id }));
    assert_eq!(p.sent(true, "REQ"), 1 + 3);
    // the peer hears we gave up (IBA 12.6.7.2: REJ, reason Timeout)
    assert_eq!(p.log.last(), Some(&(true, "REJ")));
    assert_eq!(p.a.state(a_id), None);
    assert_eq!(
        p.now,
        Instant::from_nanos(0) + 4 * (cm_timeout(10) + Duration::from_micros(200))
    );
}

#[test]
fn an_unanswered_rep_times_out_and_rejects_with_timeout() {
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, name, _| from_a && name != "REQ");
    let (a_id, b_id) = request(&mut p);
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    assert!(established(&mut p.a).is_some());
    run_until_quiet(&mut p);
    assert_eq!(p.b.poll_event(), Some(Event::TimedOut { id: b_id }));
    assert_eq!(p.sent(false, "REP"), 1 + 3);
    // A answered every REP with an RTU that got lost, then hears B gave up
    assert_eq!(p.sent(true, "RTU"), 1 + 3);
    let last_b = p.log.iter().rev().find(|(f, _)| !f).unwrap();
    assert_eq!(last_b.1, "REJ");
    let Some(Event::Rejected { id, rej }) = p.a.poll_event() else {
        panic!("A hears the REJ")
    };
    assert_eq!((id, rej.reason), (a_id, RejectReason::TIMEOUT));
    assert_eq!(p.a.state(a_id), None);
}

#[test]
fn an_mra_makes_the_active_side_wait_longer_before_resending() {
    let mut p = Pair::new();
    let (a_id, b_id) = request(&mut p);
    let first_deadline = p.a.poll_timeout().unwrap();
    p.b.mra(b_id, 16).unwrap();
    p.flush();
    let stretched = p.a.poll_timeout().unwrap();
    assert!(stretched >= first_deadline + (cm_timeout(16) - cm_timeout(10)));
    // a duplicate REQ would get the MRA again; the host accepts in time
    p.now = first_deadline + Duration::from_millis(1);
    p.a.handle_timeout(p.now);
    p.flush();
    assert_eq!(
        p.sent(true, "REQ"),
        1,
        "no REQ resent within the MRA's time"
    );
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    assert!(established(&mut p.a).is_some());
    assert_eq!(p.a.state(a_id), Some(State::Established));
}

#[test]
fn a_req_for_a_service_nobody_listens_on_is_rejected_as_linux_does() {
    let mut p = Pair::new();
    let mut r = req(b"");
    r.service_id = ServiceId::rdma_cm(PortSpace::TCP, 9);
    let a_id = p.a.connect(p.now, p.ip_b, r);
    p.flush();
    let Some(Event::Rejected { id, rej }) = p.a.poll_event() else {
        panic!("expected a reject")
    };
    assert_eq!(id, a_id);
    assert_eq!(rej.reason, RejectReason::INVALID_SERVICE_ID);
    assert_eq!(rej.local_comm_id, 0);
    assert_eq!(p.a.state(a_id), None);
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn the_consumer_rejects_with_private_data() {
    let mut p = Pair::new();
    let (a_id, b_id) = request(&mut p);
    // a REJ holds 148 bytes of private data; asking for more fails and keeps the request
    assert!(matches!(
        p.b.reject(b_id, RejectReason::CONSUMER_DEFINED, &[0; 149]),
        Err(CmError::Wire(wire::WireError::PrivateDataTooLong {
            len: 149,
            max: 148
        }))
    ));
    p.b.reject(b_id, RejectReason::CONSUMER_DEFINED, b"busy")
        .unwrap();
    p.flush();
    let Some(Event::Rejected { id, rej }) = p.a.poll_event() else {
        panic!("expected a reject")
    };
    assert_eq!(id, a_id);
    assert_eq!(rej.reason, RejectReason::CONSUMER_DEFINED);
    assert_eq!(&rej.private_data.as_bytes()[..4], b"busy");
    assert_eq!((p.a.state(a_id), p.b.state(b_id)), (None, None));
    assert!(matches!(
        p.b.reject(b_id, RejectReason::CONSUMER_DEFINED, b""),
        Err(CmError::UnknownId(_))
    ));
}

#[test]
fn a_consumer_refusing_the_ece_asked_for_rejects_with_reason_35() {
    let mut p = Pair::new();
    let (a_id, b_id) = request(&mut p);
    p.b.reject(b_id, RejectReason::VENDOR_OPTION_NOT_SUPPORTED, b"")
        .unwrap();
    p.flush();
    let Some(Event::Rejected { id, rej }) = p.a.poll_event() else {
        panic!("expected a reject")
    };
    assert_eq!((id, rej.reason.0), (a_id, 35));
    assert_eq!(rej.message_rejected, CmMsgRef::Req);
}

#[test]
fn either_side_can_give_up_a_connection_before_it_is_established() {
    // The active side gives up while its REQ waits for an answer.
    let mut p = Pair::new();
    let (a_id, b_id) = request(&mut p);
    p.a.reject(a_id, RejectReason::TIMEOUT, b"").unwrap();
    p.flush();
    let Some(Event::Rejected { id, rej }) = p.b.poll_event() else {
        panic!("expected a reject")
    };
    assert_eq!((id, rej.reason), (b_id, RejectReason::TIMEOUT));
    // as Linux's cm_format_rej: nothing the peer sent is rejected, so "other"; and a
    // timeout REJ carries the sender's CA GUID, by which Linux finds the connection
    assert_eq!(rej.message_rejected, wire::CmMsgRef::Other);
    assert_eq!(rej.reject_info_len, 8);
    assert_eq!(rej.ari.as_bytes()[..8], 0x100u64.to_be_bytes());
    assert_eq!((p.a.state(a_id), p.b.state(b_id)), (None, None));

    // The passive side gives up after its REP, before the RTU (lost here).
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, name, _| from_a && name == "RTU");
    let (a_id, b_id) = request(&mut p);
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    assert!(established(&mut p.a).is_some());
    assert_eq!(p.b.state(b_id), Some(State::RepSent));
    p.b.reject(b_id, RejectReason::CONSUMER_DEFINED, b"")
        .unwrap();
    p.flush();
    assert!(matches!(p.a.poll_event(), Some(Event::Rejected { id, .. }) if id == a_id));
    assert_eq!((p.a.state(a_id), p.b.state(b_id)), (None, None));
}

#[test]
fn a_lost_drep_is_answered_again_from_time_wait() {
    let mut p = Pair::new();
    p.lose = Box::new(|from_a, name, n| !from_a && name == "DREP" && n == 0);
    let (a_id, b_id) = request(&mut p);
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    established(&mut p.a);
    established(&mut p.b);
    p.a.disconnect(p.now, a_id, b"").unwrap();
    p.flush();
    assert_eq!(p.b.poll_event(), Some(Event::Disconnected { id: b_id }));
    assert_eq!(p.a.poll_event(), None);
    assert!(p.tick());
    assert_eq!(p.a.poll_event(), Some(Event::Disconnected { id: a_id }));
    assert_eq!(p.b.counters().duplicates_answered, 1);
    assert_eq!(p.sent(true, "DREQ"), 2);
}

#[test]
fn an_unanswered_dreq_still_disconnects() {
    let mut p = Pair::new();
    let (a_id, b_id) = request(&mut p);
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    established(&mut p.a);
    p.lose = Box::new(|from_a, _, _| from_a);
    p.a.disconnect(p.now, a_id, b"").unwrap();
    p.flush();
    run_until_quiet(&mut p);
    assert_eq!(p.a.poll_event(), Some(Event::Disconnected { id: a_id }));
    assert_eq!(p.sent(true, "DREQ"), 1 + 3);
    assert_eq!(p.a.state(a_id), None);
}

#[test]
fn sidr_resolves_a_ud_service_and_refuses_an_unknown_one() {
    let mut p = Pair::new();
    let udp = ServiceId::rdma_cm(PortSpace::UDP, 7174);
    p.b.listen(udp).unwrap();
    assert!(matches!(p.b.listen(udp), Err(CmError::AlreadyListening(_))));
    let ask = |service_id| SidrReqRepr {
        pkey: 0xffff,
        service_id,
        ..SidrReqRepr::default()
    };
    let a_id = p.a.sidr_request(p.now, p.ip_b, ask(udp));
    p.flush();
    let Some(Event::SidrRequest { id: b_id, req, .. }) = p.b.poll_event() else {
        panic!("expected a SIDR request")
    };
    assert_eq!(req.service_id, udp);
    p.b.sidr_reply(
        b_id,
        SidrRepRepr {
            status: SidrStatus::SUCCESS,
            qpn: Qpn::new(0x99),
            qkey: Qkey(0x1234_5678),
            service_id: udp,
            ..SidrRepRepr::default()
        },
    )
    .unwrap();
    p.flush();
    let Some(Event::SidrReply { id, rep }) = p.a.poll_event() else {
        panic!("expected a SIDR reply")
    };
    assert_eq!(id, a_id);
    assert_eq!(
        (rep.status, rep.qpn, rep.qkey),
        (SidrStatus::SUCCESS, Qpn::new(0x99), Qkey(0x1234_5678))
    );

    let unknown =
        p.a.sidr_request(p.now, p.ip_b, ask(ServiceId::rdma_cm(PortSpace::UDP, 1)));
    p.flush();
    let Some(Event::SidrReply { id, rep }) = p.a.poll_event() else {
        panic!("expected a SIDR reply")
    };
    assert_eq!((id, rep.status), (unknown, SidrStatus::UNSUPPORTED));
    assert_eq!(p.a.poll_timeout(), None);
}

#[test]
fn garbage_strangers_and_replays_are_counted_and_dropped() {
    let mut p = Pair::new();
    let (a_id, b_id) = request(&mut p);
    p.b.accept(p.now, b_id, rep()).unwrap();
    p.flush();
    established(&mut p.a);
    established(&mut p.b);
    let before = p.b.counters().clone();
    // not a MAD at all, and a MAD of another class
    p.b.handle_mad(p.now, p.ip_a, &[0u8; 10]);
    let mut mad = [0u8; MAD_LEN];
    CmMadRepr {
        transaction_id: 1,
        message: wire::CmMessage::Rtu(wire::IdsRepr {
            local_comm_id: a_id.0,
            remote_comm_id: b_id.0,
            private_data: Default::default(),
        }),
    }
    .emit(&mut mad)
    .unwrap();
    let mut other_class = mad;
    other_class[1] = 0x03;
    p.b.handle_mad(p.now, p.ip_a, &other_class);
    // an RTU while established, the same RTU from a stranger, and one for an unknown ID
    p.b.handle_mad(p.now, p.ip_a, &mad);
    p.b.handle_mad(p.now, [10, 9, 9, 9].into(), &mad);
    let mut unknown = mad;
    unknown[24 + 4..24 + 8].copy_from_slice(&0xdead_beefu32.to_be_bytes());
    p.b.handle_mad(p.now, p.ip_a, &unknown);
    let c = p.b.counters();
    assert_eq!(c.received - before.received, 5);
    assert_eq!(c.dropped.get(&DropReason::Malformed), Some(&2));
    assert_eq!(c.dropped.get(&DropReason::WrongState), Some(&1));
    assert_eq!(c.dropped.get(&DropReason::UnknownCommId), Some(&2));
    assert_eq!(p.b.poll_event(), None);
    assert_eq!(p.b.state(b_id), Some(State::Established));
    let mut buf = [0u8; MAD_LEN];
    assert_eq!(p.b.poll_transmit(p.now, &mut buf), None, "nothing answered");
}

#[test]
fn many_connections_come_and_go_without_leaving_state_behind() {
    let mut p = Pair::new();
    for i in 0..200u32 {
        let (a_id, b_id) = request(&mut p);
        if i % 3 == 0 {
            p.b.reject(b_id, RejectReason::CONSUMER_DEFINED, b"")
                .unwrap();
            p.flush();
            assert!(matches!(p.a.poll_event(), Some(Event::Rejected { .. })));
            continue;
        }
        p.b.accept(p.now, b_id, rep()).unwrap();
        p.flush();
        established(&mut p.a);
        established(&mut p.b);
        p.b.disconnect(p.now, b_id, b"").unwrap();
        p.flush();
        assert_eq!(p.a.poll_event(), Some(Event::Disconnected { id: a_id }));
        assert_eq!(p.b.poll_event(), Some(Event::Disconnected { id: b_id }));
    }
    run_until_quiet(&mut p);
    assert_eq!((p.a.poll_timeout(), p.b.poll_timeout()), (None, None));
    assert_eq!(
        p.a.counters().retransmitted + p.b.counters().retransmitted,
        0
    );
    assert!(p.a.counters().dropped.is_empty() && p.b.counters().dropped.is_empty());
}
