//! UD multicast: QPs attached to a group (`attach_mcast`) each get a copy of a datagram sent
//! to it, checked against their own Q_Key and completed into their own receive WQE; the
//! attach / detach verbs and their errors; and what leaves the sender for a group. The
//! engines are driven by hand: the test plays the host that hands a packet to a group
//! address to every engine that joined.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::*;
use engine::{
    AccessFlags, AhAttr, AhHandle, Counter, Engine, EngineConfig, Gid, Instant, MrKeys, PdHandle,
    QpType, RecvWr, SendWr, Sge, SrqAttr, UdDest, VerbsError, WcFlags, WcStatus, GRH_LEN,
    MULTICAST_QPN,
};
use wire::{BthRepr, DethRepr, IpRepr, Ipv4Repr, Opcode, Psn, Qkey, Qpn, TransportRepr};

const QKEY: u32 = 0x1111_0000;
const GROUP4: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);
const EINVAL: i32 = 22;
const ENOMEM: i32 = 12;

/// One engine with its memory, a PD and an MR over all of it.
struct Dev {
    e: Engine,
    mem: TestMemory,
    pd: PdHandle,
    mr: MrKeys,
    base: u64,
}

impl Dev {
    fn new(ip: IpAddr, base: u64) -> Dev {
        Dev::with_config(EngineConfig::new(vec![ip], base))
    }

    fn with_config(cfg: EngineConfig) -> Dev {
        let base = cfg.rng_seed;
        let mem = TestMemory::default();
        mem.add_region(OWNER, base, 1 << 20);
        let mut e = Engine::new(cfg, Box::new(mem.clone()));
        let pd = e.alloc_pd().unwrap();
        let mr = e
            .reg_mr(pd, OWNER, base, 1 << 20, AccessFlags::LOCAL_WRITE)
            .unwrap();
        Dev {
            e,
            mem,
            pd,
            mr,
            base,
        }
    }

    fn sge(&self, off: u64, len: u32) -> Sge {
        Sge::new(self.base + off, len, self.mr.lkey)
    }

    /// A UD QP in RTS with Q_Key `qkey`.
    fn ud_qp(&mut self, qkey: u32) -> Qp4 {
        let q = new_qp4(&mut self.e, self.pd, QpType::Ud, 16, None, None);
        ud_up(&mut self.e, q.qpn, qkey);
        q
    }

    /// Post a receive of 1 KiB at offset `off`.
    fn recv(&mut self, q: Qp4, wr_id: u64, off: u64) {
        let sge = self.sge(off, 1024);
        self.e
            .post_recv(q.qpn, RecvWr::new(wr_id, vec![sge]))
            .unwrap();
    }

    /// An address handle for group (or host) `dst`, hop limit 1 as multicast senders use.
    fn ah(&mut self, dst: IpAddr) -> AhHandle {
        self.e
            .create_ah(
                self.pd,
                &AhAttr {
                    dgid: Gid::from_ip(dst).0,
                    sgid_index: 0,
                    hop_limit: 1,
                    is_global: true,
                    ..AhAttr::default()
                },
            )
            .unwrap()
    }

    /// Send `data` from `q` through `ah` to the multicast QPN with `qkey`.
    fn send(&mut self, q: Qp4, ah: AhHandle, qkey: u32, data: &[u8]) {
        self.mem.set(OWNER, self.base, data);
        let wr = SendWr::send(7, vec![self.sge(0, data.len() as u32)]);
        let dest = UdDest {
            ah,
            remote_qpn: engine::Qpn::new(MULTICAST_QPN),
            remote_qkey: qkey,
        };
        self.e.post_send_ud(q.qpn, wr, dest).unwrap();
    }

    /// Every packet the engine has to send, with where it goes.
    fn transmit(&mut self) -> Vec<(IpAddr, Vec<u8>)> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 9000];
        while let Some(t) = self.e.poll_transmit(Instant::from_nanos(0), &mut buf) {
            assert!(!t.internal, "datagrams never take an internal path");
            out.push((t.dst, buf[..t.len].to_vec()));
        }
        out
    }

    fn deliver(&mut self, packet: &[u8]) {
        self.e.handle_datagram(Instant::from_nanos(1), packet);
    }

    fn completions(&mut self, q: Qp4) -> Vec<engine::WorkCompletion> {
        self.e.poll_cq(q.recv_cq, usize::MAX).unwrap()
    }

    fn qp_count(&self, q: Qp4, c: Counter) -> u64 {
        self.e.qp_counters(q.qpn).unwrap().get(c)
    }

    fn count(&self, c: Counter) -> u64 {
        self.e.counters().get(c)
    }
}

fn gid4(ip: Ipv4Addr) -> Gid {
    Gid::from(ip)
}

/// The one packet `sender` sends, checked to be a well-formed RoCEv2 UD SEND to `group`
/// for the multicast QPN.
fn one_packet_to(sender: &mut Dev, group: IpAddr) -> Vec<u8> {
    let mut sent = sender.transmit();
    assert_eq!(sent.len(), 1);
    let (dst, packet) = sent.remove(0);
    assert_eq!(dst, group, "the host sends it to the group's address");
    let p = wire::RoceV2Packet::parse(&packet).expect("a well-formed RoCEv2 packet");
    assert!(p.icrc_ok, "the ICRC covers the group address as sent");
    assert_eq!(p.ip.dst(), group);
    assert_eq!(p.udp.dst_port, wire::ROCEV2_UDP_PORT);
    assert!(
        p.udp.src_port >= 0xc000,
        "a per-QP source port as for unicast"
    );
    assert_eq!(p.transport.bth.opcode, Opcode::UdSendOnly);
    assert_eq!(p.transport.bth.dest_qp.value(), MULTICAST_QPN);
    assert_eq!(p.transport.deth.map(|d| d.qkey.value()), Some(QKEY));
    match p.ip {
        IpRepr::V4(v4) => assert_eq!(v4.ttl, 1, "the AH's hop limit is the TTL"),
        IpRepr::V6(v6) => assert_eq!(v6.hop_limit, 1, "the AH's hop limit"),
    }
    packet
}

#[test]
fn two_qps_attached_to_an_ipv4_group_each_get_a_copy_with_the_source_qp() {
    let mut a = Dev::new(side_ip(false, 1), 0x1000_0000);
    let mut b = Dev::new(side_ip(false, 2), 0x2000_0000);
    let sender = a.ud_qp(QKEY);
    let r1 = b.ud_qp(QKEY);
    // The second member takes its WQEs from an SRQ.
    let srq =
        b.e.create_srq(
            b.pd,
            &SrqAttr {
                max_wr: 8,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap();
    let r2 = new_qp4(&mut b.e, b.pd, QpType::Ud, 16, Some(srq), None);
    ud_up(&mut b.e, r2.qpn, QKEY);
    let bystander = b.ud_qp(QKEY);
    let group = gid4(GROUP4);
    b.e.attach_mcast(r1.qpn, group).unwrap();
    b.e.attach_mcast(r2.qpn, group).unwrap();
    b.e.attach_mcast(r2.qpn, group)
        .expect("attaching twice is not an error");
    b.recv(r1, 11, 0x1000);
    let sge = b.sge(0x2000, 1024);
    b.e.post_srq_recv(srq, RecvWr::new(22, vec![sge])).unwrap();
    b.recv(bystander, 33, 0x3000);

    let ah = a.ah(IpAddr::V4(GROUP4));
    let data = pattern(5, 200);
    a.send(sender, ah, QKEY, &data);
    let packet = one_packet_to(&mut a, IpAddr::V4(GROUP4));
    let sent = a.e.poll_cq(sender.send_cq, 8).unwrap();
    assert_eq!(sent.len(), 1, "a UD send completes when its packet leaves");
    assert_eq!(sent[0].status, WcStatus::Success);
    b.deliver(&packet);

    for (q, wr_id, off) in [(r1, 11, 0x1000), (r2, 22, 0x2000)] {
        let got = b.completions(q);
        assert_eq!(got.len(), 1, "QP {:#x} gets one copy", q.qpn);
        let wc = got[0];
        assert_eq!(wc.wr_id, wr_id);
        assert_eq!(wc.status, WcStatus::Success);
        assert_eq!(wc.qp_num.value(), q.qpn);
        assert_eq!(
            wc.src_qp.value(),
            sender.qpn,
            "the completion names the sender"
        );
        assert_eq!(wc.byte_len as usize, GRH_LEN + data.len());
        assert!(wc.wc_flags.contains(WcFlags::GRH));
        let grh = b.mem.get(OWNER, b.base + off, GRH_LEN);
        assert_eq!(&grh[20 + 12..20 + 16], &[10, 0, 0, 1], "source in the GRH");
        assert_eq!(&grh[20 + 16..], &GROUP4.octets(), "the group in the GRH");
        assert_eq!(b.mem.get(OWNER, b.base + off + 40, data.len()), data);
        assert_eq!(b.qp_count(q, Counter::RxMcastDelivered), 1);
        assert_eq!(b.qp_count(q, Counter::RxPackets), 1);
    }
    assert!(b.completions(bystander).is_empty(), "not attached: no copy");
    assert_eq!(b.count(Counter::RxMcastDelivered), 2);
    assert_eq!(b.count(Counter::RxPackets), 1, "one packet for the device");
    assert_eq!(b.count(Counter::RxNotOurAddress), 0);
}

#[test]
fn an_ipv6_group_reaches_its_members_the_senders_own_device_included() {
    let ip_a = side_ip(true, 1);
    let mut a = Dev::new(ip_a, 0x1000_0000);
    let mut b = Dev::new(side_ip(true, 2), 0x2000_0000);
    let group_ip: IpAddr = "ff0e::1:2".parse::<Ipv6Addr>().unwrap().into();
    let group = Gid::from_ip(group_ip);
    let sender = a.ud_qp(QKEY);
    let local = a.ud_qp(QKEY);
    let remote = b.ud_qp(QKEY);
    a.e.attach_mcast(local.qpn, group).unwrap();
    b.e.attach_mcast(remote.qpn, group).unwrap();
    a.recv(local, 1, 0x1000);
    b.recv(remote, 2, 0x1000);
    let ah = a.ah(group_ip);
    let data = b"to every member of ff0e::1:2".to_vec();
    a.send(sender, ah, QKEY, &data);
    let packet = one_packet_to(&mut a, group_ip);
    // The host hands a group packet to every device that joined, its own included.
    a.deliver(&packet);
    b.deliver(&packet);
    for (d, q) in [(&mut a, local), (&mut b, remote)] {
        let got = d.completions(q);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].status, WcStatus::Success);
        assert_eq!(got[0].src_qp.value(), sender.qpn);
        let grh = d.mem.get(OWNER, d.base + 0x1000, GRH_LEN);
        assert_eq!(grh[0] >> 4, 6, "an IPv6 header");
        assert_eq!(&grh[8..24], &Gid::from_ip(ip_a).0, "source");
        assert_eq!(&grh[24..40], &group.0, "destination: the group");
        assert_eq!(d.mem.get(OWNER, d.base + 0x1000 + 40, data.len()), data);
    }
    assert!(a.completions(sender).is_empty(), "the sender did not join");
}

#[test]
fn a_qp_with_another_qkey_or_no_receive_loses_its_copy_and_the_others_keep_theirs() {
    let mut a = Dev::new(side_ip(false, 1), 0x1000_0000);
    let mut b = Dev::new(side_ip(false, 2), 0x2000_0000);
    let sender = a.ud_qp(QKEY);
    let good = b.ud_qp(QKEY);
    let wrong_qkey = b.ud_qp(QKEY + 1);
    let no_recv = b.ud_qp(QKEY);
    let group = gid4(GROUP4);
    for q in [wrong_qkey, no_recv, good] {
        b.e.attach_mcast(q.qpn, group).unwrap();
    }
    b.recv(good, 1, 0x1000);
    b.recv(wrong_qkey, 2, 0x2000);
    let ah = a.ah(IpAddr::V4(GROUP4));
    a.send(sender, ah, QKEY, b"hello group");
    let packet = one_packet_to(&mut a, IpAddr::V4(GROUP4));
    b.deliver(&packet);
    assert_eq!(b.completions(good).len(), 1);
    assert!(b.completions(wrong_qkey).is_empty());
    assert!(b.completions(no_recv).is_empty());
    assert_eq!(b.qp_count(wrong_qkey, Counter::RxQkeyMismatch), 1);
    assert_eq!(b.qp_count(wrong_qkey, Counter::RxMcastDelivered), 0);
    assert_eq!(b.qp_count(no_recv, Counter::RxNoRecvWqe), 1);
    assert_eq!(b.count(Counter::RxQkeyMismatch), 1);
    assert_eq!(b.count(Counter::RxMcastDelivered), 1);
    // The WQE the wrong Q_Key left alone takes the next datagram with the right one.
    b.e.detach_mcast(good.qpn, group).unwrap();
    b.e.detach_mcast(no_recv.qpn, group).unwrap();
    let attr = engine::QpAttr {
        qkey: QKEY,
        ..engine::QpAttr::default()
    };
    b.e.modify_qp(wrong_qkey.qpn, &attr, engine::QpAttrMask::QKEY)
        .unwrap();
    b.deliver(&packet);
    let got = b.completions(wrong_qkey);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].wr_id, 2);
}

#[test]
fn a_detached_qp_gets_nothing_and_a_group_nobody_joined_is_counted() {
    let mut a = Dev::new(side_ip(false, 1), 0x1000_0000);
    let mut b = Dev::new(side_ip(false, 2), 0x2000_0000);
    let sender = a.ud_qp(QKEY);
    let stays = b.ud_qp(QKEY);
    let leaves = b.ud_qp(QKEY);
    let group = gid4(GROUP4);
    b.e.attach_mcast(stays.qpn, group).unwrap();
    b.e.attach_mcast(leaves.qpn, group).unwrap();
    b.e.detach_mcast(leaves.qpn, group).unwrap();
    assert_eq!(
        b.e.detach_mcast(leaves.qpn, group),
        Err(VerbsError::NotAttached)
    );
    assert_eq!(VerbsError::NotAttached.errno(), EINVAL);
    b.recv(stays, 1, 0x1000);
    b.recv(leaves, 2, 0x2000);
    let ah = a.ah(IpAddr::V4(GROUP4));
    a.send(sender, ah, QKEY, b"one");
    let packet = one_packet_to(&mut a, IpAddr::V4(GROUP4));
    b.deliver(&packet);
    assert_eq!(b.completions(stays).len(), 1);
    assert!(b.completions(leaves).is_empty());
    // The last member leaves: the group is gone, and its datagrams are dropped and counted.
    b.e.detach_mcast(stays.qpn, group).unwrap();
    b.recv(stays, 3, 0x1000);
    b.deliver(&packet);
    assert!(b.completions(stays).is_empty());
    assert!(b.completions(leaves).is_empty());
    assert_eq!(b.count(Counter::RxMcastNoGroup), 1);
    assert_eq!(b.count(Counter::RxMcastDelivered), 1);
    // Another group of the same device is not this one.
    b.e.attach_mcast(stays.qpn, gid4(Ipv4Addr::new(239, 1, 2, 4)))
        .unwrap();
    b.deliver(&packet);
    assert!(b.completions(stays).is_empty());
    assert_eq!(b.count(Counter::RxMcastNoGroup), 2);
}

#[test]
fn destroy_qp_leaves_every_group() {
    let mut cfg = EngineConfig::new(vec![side_ip(false, 2)], 0x2000_0000);
    cfg.device.max_total_mcast_qp_attach = 2;
    let mut b = Dev::with_config(cfg);
    let mut a = Dev::new(side_ip(false, 1), 0x1000_0000);
    let sender = a.ud_qp(QKEY);
    let q = b.ud_qp(QKEY);
    let g1 = gid4(GROUP4);
    let g2 = gid4(Ipv4Addr::new(239, 1, 2, 4));
    b.e.attach_mcast(q.qpn, g1).unwrap();
    b.e.attach_mcast(q.qpn, g2).unwrap();
    b.e.destroy_qp(q.qpn).unwrap();
    assert_eq!(b.e.detach_mcast(q.qpn, g1), Err(VerbsError::InvalidQp));
    let ah = a.ah(IpAddr::V4(GROUP4));
    a.send(sender, ah, QKEY, b"anyone?");
    let packet = one_packet_to(&mut a, IpAddr::V4(GROUP4));
    b.deliver(&packet);
    assert_eq!(
        b.count(Counter::RxMcastNoGroup),
        1,
        "the group went with its QP"
    );
    // Its attachments no longer count against the device's total.
    let q2 = b.ud_qp(QKEY);
    b.e.attach_mcast(q2.qpn, g1).unwrap();
    b.e.attach_mcast(q2.qpn, g2).unwrap();
}

#[test]
fn attach_errors_map_to_the_errnos_of_libibverbs() {
    let mut cfg = EngineConfig::new(vec![side_ip(false, 2)], 0x2000_0000);
    cfg.device.max_mcast_grp = 2;
    cfg.device.max_mcast_qp_attach = 2;
    cfg.device.max_total_mcast_qp_attach = 3;
    let mut b = Dev::with_config(cfg);
    let ud = b.ud_qp(QKEY);
    let rc = new_qp4(&mut b.e, b.pd, QpType::Rc, 16, None, None);
    let uc = new_qp4(&mut b.e, b.pd, QpType::Uc, 16, None, None);
    let g = |n| gid4(Ipv4Addr::new(239, 0, 0, n));

    let e = b.e.attach_mcast(0x00ab_cdef, g(1)).unwrap_err();
    assert_eq!(e, VerbsError::InvalidQp);
    assert_eq!(e.errno(), EINVAL);
    for q in [rc, uc] {
        let e = b.e.attach_mcast(q.qpn, g(1)).unwrap_err();
        assert_eq!(e, VerbsError::OpNotSupported, "only UD QPs join groups");
        assert_eq!(e.errno(), EINVAL);
        assert_eq!(b.e.detach_mcast(q.qpn, g(1)), Err(e));
    }
    for unicast in [
        Gid::from_ip(side_ip(false, 2)),
        Gid::from_ip(side_ip(true, 2)),
        Gid::ZERO,
    ] {
        let e = b.e.attach_mcast(ud.qpn, unicast).unwrap_err();
        assert_eq!(e, VerbsError::NotMulticastGid);
        assert_eq!(e.errno(), EINVAL);
        assert_eq!(b.e.detach_mcast(ud.qpn, unicast), Err(e));
    }
    assert_eq!(
        b.e.detach_mcast(ud.qpn, g(1)),
        Err(VerbsError::NotAttached),
        "never attached"
    );

    // Limits: 2 groups, 2 QPs per group, 3 attachments in all; beyond them ENOMEM.
    let more: Vec<Qp4> = (0..3).map(|_| b.ud_qp(QKEY)).collect();
    b.e.attach_mcast(ud.qpn, g(1)).unwrap();
    b.e.attach_mcast(more[0].qpn, g(1)).unwrap();
    let e = b.e.attach_mcast(more[1].qpn, g(1)).unwrap_err();
    assert!(matches!(e, VerbsError::TooMany(_)), "{e}");
    assert_eq!(e.errno(), ENOMEM, "max_mcast_qp_attach");
    b.e.attach_mcast(ud.qpn, g(1))
        .expect("a member attaching again takes no room");
    b.e.attach_mcast(ud.qpn, g(2)).unwrap();
    let e = b.e.attach_mcast(more[1].qpn, g(3)).unwrap_err();
    assert_eq!(e.errno(), ENOMEM, "max_mcast_grp");
    let e = b.e.attach_mcast(more[1].qpn, g(2)).unwrap_err();
    assert_eq!(e.errno(), ENOMEM, "max_total_mcast_qp_attach");
    b.e.detach_mcast(ud.qpn, g(1)).unwrap();
    b.e.attach_mcast(more[1].qpn, g(2)).unwrap();
}

#[test]
fn the_device_reports_rxe_multicast_limits() {
    let d = Dev::new(side_ip(false, 2), 0x2000_0000).e.query_device();
    assert_eq!(d.max_mcast_grp, 8192);
    assert_eq!(d.max_mcast_qp_attach, 56);
    assert_eq!(d.max_total_mcast_qp_attach, 56 * 8192);
}

/// A UD SEND ONLY from 10.0.0.1 to `dst` for QP `dest_qp` with a valid ICRC.
fn crafted(dst: Ipv4Addr, dest_qp: u32, opcode: Opcode) -> Vec<u8> {
    let mut t = TransportRepr::new(BthRepr::new(opcode, Qpn::new(dest_qp), Psn::new(1)));
    if opcode.ext().deth {
        t.deth = Some(DethRepr {
            qkey: Qkey::new(QKEY),
            src_qp: Qpn::new(0x42),
        });
    }
    let ip = IpRepr::V4(Ipv4Repr {
        src: Ipv4Addr::new(10, 0, 0, 1),
        dst,
        tos: 0,
        ident: 0,
        dont_frag: true,
        ttl: 1,
        payload_len: 0,
    });
    let mut buf = vec![0u8; 512];
    let n = wire::emit_packet(&ip, 0xc000, wire::ROCEV2_UDP_PORT, &t, b"xyz", &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn the_multicast_qpn_and_a_group_address_only_go_together() {
    let mut b = Dev::new(side_ip(false, 2), 0x2000_0000);
    let q = b.ud_qp(QKEY);
    b.e.attach_mcast(q.qpn, gid4(GROUP4)).unwrap();
    for _ in 0..4 {
        b.recv(q, 1, 0x1000);
    }
    let me = Ipv4Addr::new(10, 0, 0, 2);
    // The multicast QPN to a unicast address (ours), a unicast QPN to the group, and an RC
    // or UC SEND to the group: none is a multicast datagram.
    b.deliver(&crafted(me, MULTICAST_QPN, Opcode::UdSendOnly));
    b.deliver(&crafted(GROUP4, q.qpn, Opcode::UdSendOnly));
    b.deliver(&crafted(GROUP4, MULTICAST_QPN, Opcode::RcSendOnly));
    b.deliver(&crafted(GROUP4, MULTICAST_QPN, Opcode::UcSendOnly));
    assert_eq!(b.count(Counter::RxMcastMismatch), 4);
    assert!(b.completions(q).is_empty());
    // The real thing.
    b.deliver(&crafted(GROUP4, MULTICAST_QPN, Opcode::UdSendOnly));
    let got = b.completions(q);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].src_qp.value(), 0x42);
    assert_eq!(b.count(Counter::RxMcastDelivered), 1);
}
