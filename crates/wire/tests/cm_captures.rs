//! The connection manager's MADs against Linux: every CM MAD that kernel rdma_cm sent in
//! shared/testdata's captures decodes to the values `tshark -d udp.port==4791,infiniband -V`
//! prints for it (written out below) and re-emits to the same 256 bytes; and every CM message
//! we emit decodes in Wireshark's InfiniBand dissector with no malformed packet and no expert
//! warning. tshark and text2pcap are required (`apt-get install -y tshark`).
//!
//! One exception to "as tshark prints": Wireshark 4.0 reads the primary path's flow label and
//! packet rate from the wrong bytes (for the bytes `1a cd 70 00` it shows flow label 0x001ac
//! and rate 0x1a). The values below are the ones IBA 12.6.5 (and Linux's
//! `include/rdma/ibta_vol1_c12.h`) place there: flow label 0x1acd7 in the top 20 bits, rate
//! in the low 6 bits of the fourth byte.

mod common;

use std::net::Ipv4Addr;
use std::process::Command;

use common::roce_packets;
use wire::*;

/// The CM MADs of a capture: the UD payloads sent to QP1.
fn cm_mads(name: &str) -> Vec<Vec<u8>> {
    roce_packets(name)
        .iter()
        .filter_map(|b| {
            let p = RoceV2Packet::parse_checked(b).expect("capture packets parse");
            let d = p.transport.deth?;
            if p.transport.bth.dest_qp != Qpn::GSI {
                return None;
            }
            // IBA 13.5.1: GSI traffic is UD from QP1 with the well-known Q_Key; QP1's send
            // queue counts PSNs up like any other.
            let psn = p.transport.bth.psn;
            assert_eq!(p.transport, gsi_transport(0xffff, Qpn::GSI, psn));
            assert_eq!(d.qkey, GSI_QKEY);
            assert_eq!(p.payload.len(), MAD_LEN);
            Some(p.payload.to_vec())
        })
        .collect()
}

/// (message, transaction ID, local comm ID, remote comm ID) — the columns tshark shows.
fn summary(m: &CmMadRepr) -> (&'static str, u64, u32, u32) {
    let (local, remote) = match &m.message {
        CmMessage::Req(r) => (r.local_comm_id, 0),
        CmMessage::Rep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rej(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Rtu(r) | CmMessage::Drep(r) => (r.local_comm_id, r.remote_comm_id),
        CmMessage::Dreq(r) => (r.local_comm_id, r.remote_comm_id),
        other => panic!("not in the captures: {other:?}"),
    };
    (m.message.name(), m.transaction_id, local, remote)
}

/// Parses every CM MAD of `name`, checks it re-emits byte for byte, and returns them.
fn decode_all(name: &str) -> Vec<CmMadRepr> {
    cm_mads(name)
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let m = CmMadRepr::parse(b).unwrap_or_else(|e| panic!("{name} CM MAD #{i}: {e}"));
            let mut out = [0u8; MAD_LEN];
            assert_eq!(m.emit(&mut out), Ok(MAD_LEN));
            assert_eq!(&out[..], &b[..], "{name} CM MAD #{i} re-emits differently");
            m
        })
        .collect()
}

fn gid(ip: [u8; 4]) -> [u8; 16] {
    Ipv4Addr::from(ip).to_ipv6_mapped().octets()
}

/// The REQ fields every kernel rdma_cm REQ in the captures shares (tshark -V, frame 1 of
/// rxe-cm-rping.pcap), with the ones that vary passed in.
fn kernel_req(qpn: u32, psn: u32, flow_label: u32, port: u16, retry: u8, rnr: u8) -> ReqRepr {
    let path = CmPathRepr {
        local_lid: 0xffff,
        remote_lid: 0xffff,
        local_gid: gid([10, 50, 0, 12]),
        remote_gid: gid([10, 50, 0, 11]),
        flow_label,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 0x40,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 0x13,
    };
    ReqRepr {
        service_id: ServiceId::rdma_cm(PortSpace::TCP, port),
        local_ca_guid: 0x5054_00ff_fe50_0012,
        local_qkey: Qkey(0),
        local_qpn: Qpn::new(qpn),
        responder_resources: 1,
        initiator_depth: 1,
        remote_cm_response_timeout: 0x14,
        transport_service_type: ServiceType::Rc,
        starting_psn: Psn::new(psn),
        local_cm_response_timeout: 0x14,
        retry_count: retry,
        pkey: 0xffff,
        path_mtu: 3,
        rnr_retry_count: rnr,
        max_cm_retries: 15,
        primary_path: path,
        ..ReqRepr::default()
    }
}

/// Checks a captured REQ against `want` (private data aside) and returns its IP CM header.
fn check_req(got: &ReqRepr, want: ReqRepr) -> CmaHeaderRepr {
    let want = ReqRepr {
        local_comm_id: got.local_comm_id,
        private_data: got.private_data,
        ..want
    };
    assert_eq!(*got, want);
    assert_eq!(got.mtu(), Some(Mtu::Mtu1024));
    let cma = CmaHeaderRepr::parse_bytes(got.private_data.as_bytes()).expect("IP CM header");
    assert_eq!(
        cma.addrs,
        CmaAddrs::V4 {
            src: [10, 50, 0, 12].into(),
            dst: [10, 50, 0, 11].into()
        }
    );
    // rping and ucmatose send no private data of their own
    assert!(got.private_data.as_bytes()[CMA_HEADER_LEN..]
        .iter()
        .all(|&b| b == 0));
    cma
}

#[test]
fn every_rping_cm_mad_decodes_as_tshark_shows_it_and_reemits_exactly() {
    let mads = decode_all("rxe-cm-rping.pcap");
    let mut want = vec![
        ("REQ", 0x2_0563_b747, 0x47b7_6305, 0),
        ("REJ", 0x2_0563_b747, 0, 0x47b7_6305),
        ("REQ", 0x2_0563_b746, 0x46b7_6305, 0),
        ("REP", 0x2_0563_b746, 0x694a_bb9e, 0x46b7_6305),
        ("RTU", 0x2_0563_b746, 0x46b7_6305, 0x694a_bb9e),
        ("DREQ", 0x2_0563_b746, 0x46b7_6305, 0x694a_bb9e),
        ("DREP", 0x2_0563_b746, 0x694a_bb9e, 0x46b7_6305),
    ];
    // then the same REQ, retransmitted nine times to a peer with no listener
    want.extend([("REQ", 0x2_0563_b745, 0x45b7_6305, 0); 9]);
    assert_eq!(mads.iter().map(summary).collect::<Vec<_>>(), want);

    let req = |i: usize| match mads[i].message {
        CmMessage::Req(r) => r,
        other => panic!("{other:?}"),
    };
    let first = check_req(&req(0), kernel_req(0x11, 0xd9cf53, 0x1acd7, 7174, 7, 7));
    assert_eq!(first.src_port, 0x910f);
    let second = check_req(&req(2), kernel_req(0x12, 0xf731d3, 0x27f2e, 7174, 7, 7));
    assert_eq!(second.src_port, 0x97d8);
    let third = check_req(&req(7), kernel_req(0x13, 0x56161e, 0xc4041, 7174, 7, 7));
    assert_eq!(third.src_port, 0xe865);
    for i in 7..16 {
        assert_eq!(req(i), req(7), "a retransmission is the same REQ");
    }
    // nothing listens yet: REJ reason 8, invalid service ID, rejecting the REQ
    let CmMessage::Rej(rej) = mads[1].message else {
        panic!()
    };
    assert_eq!(rej.reason, RejectReason::INVALID_SERVICE_ID);
    assert_eq!(rej.message_rejected, CmMsgRef::Req);
    assert_eq!(rej.reject_info_len, 0);
    let CmMessage::Rep(rep) = mads[3].message else {
        panic!()
    };
    assert_eq!(
        rep,
        RepRepr {
            local_comm_id: 0x694a_bb9e,
            remote_comm_id: 0x46b7_6305,
            local_qkey: Qkey(0),
            local_qpn: Qpn::new(0x11),
            local_eecn: 0,
            starting_psn: Psn::new(0x0e38bb),
            responder_resources: 1,
            initiator_depth: 1,
            target_ack_delay: 0x0f,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 7,
            srq: false,
            local_ca_guid: 0x5054_00ff_fe50_0011,
            ece: Ece::default(),
            private_data: PrivateData::default(),
        }
    );
    let CmMessage::Dreq(dreq) = mads[5].message else {
        panic!()
    };
    // the DREQ names the passive side's QP, the one the REP announced
    assert_eq!(dreq.remote_qpn_eecn, rep.local_qpn);
}

#[test]
fn every_ucmatose_cm_mad_decodes_as_tshark_shows_it_and_reemits_exactly() {
    let mads = decode_all("rxe-cm-rping-ucmatose.pcap");
    let want = vec![
        ("REQ", 0x2_0be7_b4c3, 0xc3b4_e70b, 0),
        ("REP", 0x2_0be7_b4c3, 0x7137_836b, 0xc3b4_e70b),
        ("RTU", 0x2_0be7_b4c3, 0xc3b4_e70b, 0x7137_836b),
        ("DREQ", 0x2_0be7_b4c3, 0xc3b4_e70b, 0x7137_836b),
        ("DREP", 0x2_0be7_b4c3, 0x7137_836b, 0xc3b4_e70b),
        ("REQ", 0x2_0be7_b4c2, 0xc2b4_e70b, 0),
        ("REQ", 0x2_0be7_b4c1, 0xc1b4_e70b, 0),
        ("REP", 0x2_0be7_b4c2, 0x7337_836b, 0xc2b4_e70b),
        ("RTU", 0x2_0be7_b4c2, 0xc2b4_e70b, 0x7337_836b),
        ("REJ", 0x2_0be7_b4c1, 0x7437_836b, 0xc1b4_e70b),
        ("DREQ", 0x2_6b83_3773, 0x7337_836b, 0xc2b4_e70b),
        ("DREP", 0x2_6b83_3773, 0xc2b4_e70b, 0x7337_836b),
    ];
    assert_eq!(mads.iter().map(summary).collect::<Vec<_>>(), want);
    let req = |i: usize| match mads[i].message {
        CmMessage::Req(r) => r,
        other => panic!("{other:?}"),
    };
    // rping on port 7174, then ucmatose on its default port 7471 (0x1d2f), which asks for
    // 5 transport retries and no RNR retries
    let cma = check_req(&req(0), kernel_req(0x11, 0xc33ffb, 0x2e923, 7174, 7, 7));
    assert_eq!(cma.src_port, 0x9b43);
    let a = check_req(&req(5), kernel_req(0x12, 0xb36245, 0x12a9d, 7471, 5, 0));
    let b = check_req(&req(6), kernel_req(0x13, 0x28bbc9, 0x572a2, 7471, 5, 0));
    assert_eq!((a.src_port, b.src_port), (0x8cd2, 0xb02d));
    assert_eq!(
        req(5).service_id.rdma_cm_parts(),
        Some((PortSpace::TCP, 7471))
    );
    // the server takes one connection and rejects the other as its consumer (reason 28)
    let CmMessage::Rej(rej) = mads[9].message else {
        panic!()
    };
    assert_eq!(rej.reason, RejectReason::CONSUMER_DEFINED);
    assert_eq!(rej.message_rejected, CmMsgRef::Req);
    let reps: Vec<_> = [1, 7]
        .map(|i| match mads[i].message {
            CmMessage::Rep(r) => (r.local_qpn.value(), r.starting_psn.value()),
            other => panic!("{other:?}"),
        })
        .into();
    assert_eq!(reps, [(0x11, 0x5fcd8f), (0x12, 0x616208)]);
    // this time the passive side disconnects: its DREQ names the active side's QP 0x12
    let CmMessage::Dreq(dreq) = mads[10].message else {
        panic!()
    };
    assert_eq!(dreq.remote_qpn_eecn, Qpn::new(0x12));
}

/// Where ECE goes, checked against a kernel REQ and REP: the captured MAD parses with no ECE
/// (Linux 6.1's rdma_cm sends vendor ID 0 and attribute modifier 0 when the user set none),
/// and giving the same message an ECE changes exactly the bytes Linux's
/// `include/rdma/ibta_vol1_c12.h` names: the attribute modifier (MAD bytes 20..24) and REQ
/// bytes 5..8, or REP bytes 15, 19 and 23 (MAD bytes 24 further on).
#[test]
fn ece_takes_the_bytes_a_kernel_req_and_rep_leave_zero() {
    let raw = cm_mads("rxe-cm-rping.pcap");
    let ece = Ece {
        vendor_id: 0x0a_0b0c,
        options: 0x1122_3344,
    };
    for (i, name, vendor_at) in [(2, "REQ", [29, 30, 31]), (3, "REP", [39, 43, 47])] {
        let mut m = CmMadRepr::parse(&raw[i]).unwrap();
        let got = match &mut m.message {
            CmMessage::Req(r) => &mut r.ece,
            CmMessage::Rep(r) => &mut r.ece,
            other => panic!("{other:?}"),
        };
        assert_eq!(*got, Ece::default(), "the kernel's {name} carries no ECE");
        for at in vendor_at.iter().copied().chain(20..24) {
            assert_eq!(raw[i][at], 0, "{name} byte {at}");
        }
        *got = ece;
        let mut out = [0u8; MAD_LEN];
        m.emit(&mut out).unwrap();
        let changed: Vec<usize> = (0..MAD_LEN).filter(|&j| out[j] != raw[i][j]).collect();
        let mut want: Vec<usize> = (20..24).chain(vendor_at).collect();
        want.sort_unstable();
        assert_eq!(changed, want, "the bytes ECE changes in the {name}");
        assert_eq!(out[20..24], [0x11, 0x22, 0x33, 0x44]);
        assert_eq!(vendor_at.map(|j| out[j]), [0x0a, 0x0b, 0x0c]);
        assert_eq!(CmMadRepr::parse(&out), Ok(m));
    }
}

/// One of every message we model, each field set to something distinguishable.
fn one_of_each() -> Vec<CmMadRepr> {
    let pd = |n: usize| -> Vec<u8> { (0..n).map(|i| (i * 7 + 1) as u8).collect() };
    let mut req = kernel_req(0x123456, 0xabcdef, 0x12345, 18515, 7, 7);
    req.local_comm_id = 0x1111_2222;
    req.ece = Ece {
        vendor_id: 0x00_02c9,
        options: 0x8000_0001,
    };
    req.private_data = {
        let mut b = [0u8; REQ_PRIVATE_DATA_LEN];
        CmaHeaderRepr {
            src_port: 40000,
            addrs: CmaAddrs::new([10, 0, 0, 1].into(), [10, 0, 0, 2].into()).unwrap(),
        }
        .emit(&mut b)
        .unwrap();
        b[CMA_HEADER_LEN..].copy_from_slice(&pd(56));
        PrivateData(b)
    };
    let msgs = [
        CmMessage::Req(req),
        CmMessage::Mra(MraRepr {
            local_comm_id: 2,
            remote_comm_id: 0x1111_2222,
            message_mraed: CmMsgRef::Req,
            service_timeout: 20,
            private_data: PrivateData::from_slice(&pd(10)).unwrap(),
        }),
        CmMessage::Rej(RejRepr {
            local_comm_id: 2,
            remote_comm_id: 0x1111_2222,
            message_rejected: CmMsgRef::Req,
            reject_info_len: 0,
            reason: RejectReason::CONSUMER_DEFINED,
            ari: PrivateData::default(),
            private_data: PrivateData::from_slice(&pd(148)).unwrap(),
        }),
        CmMessage::Rep(RepRepr {
            local_comm_id: 2,
            remote_comm_id: 0x1111_2222,
            local_qpn: Qpn::new(0x42),
            starting_psn: Psn::new(0x77),
            responder_resources: 16,
            initiator_depth: 16,
            target_ack_delay: 15,
            rnr_retry_count: 7,
            local_ca_guid: 0x0200_00ff_fe00_0002,
            ece: Ece {
                vendor_id: 0x00_02c9,
                options: 0x0000_0001,
            },
            private_data: PrivateData::from_slice(&pd(196)).unwrap(),
            ..RepRepr::default()
        }),
        CmMessage::Rtu(IdsRepr {
            local_comm_id: 0x1111_2222,
            remote_comm_id: 2,
            private_data: PrivateData::from_slice(&pd(3)).unwrap(),
        }),
        CmMessage::Dreq(DreqRepr {
            local_comm_id: 0x1111_2222,
            remote_comm_id: 2,
            remote_qpn_eecn: Qpn::new(0x42),
            private_data: PrivateData::default(),
        }),
        CmMessage::Drep(IdsRepr {
            local_comm_id: 2,
            remote_comm_id: 0x1111_2222,
            private_data: PrivateData::default(),
        }),
        CmMessage::SidrReq(SidrReqRepr {
            request_id: 9,
            pkey: 0xffff,
            service_id: ServiceId::rdma_cm(PortSpace::UDP, 7174),
            private_data: PrivateData::from_slice(&pd(36)).unwrap(),
        }),
        CmMessage::SidrRep(SidrRepRepr {
            request_id: 9,
            status: SidrStatus::SUCCESS,
            add_info_len: 0,
            qpn: Qpn::new(0x99),
            service_id: ServiceId::rdma_cm(PortSpace::UDP, 7174),
            qkey: Qkey(0x0123_4567),
            add_info: PrivateData::default(),
            private_data: PrivateData::from_slice(&pd(136)).unwrap(),
        }),
        // rdma_reject_ece's reason
        CmMessage::Rej(RejRepr {
            local_comm_id: 3,
            remote_comm_id: 0x1111_2223,
            message_rejected: CmMsgRef::Req,
            reject_info_len: 0,
            reason: RejectReason::VENDOR_OPTION_NOT_SUPPORTED,
            ari: PrivateData::default(),
            private_data: PrivateData::default(),
        }),
    ];
    msgs.into_iter()
        .enumerate()
        .map(|(i, message)| CmMadRepr {
            transaction_id: 0x0000_0001_0000_0000 | i as u64,
            message,
        })
        .collect()
}

/// The whole RoCEv2 packet (IPv4, UD to QP1) carrying `m`.
fn gsi_packet(m: &CmMadRepr, i: u16) -> Vec<u8> {
    let ip = IpRepr::V4(Ipv4Repr {
        src: [10, 0, 0, 1].into(),
        dst: [10, 0, 0, 2].into(),
        tos: 0,
        ident: 0,
        dont_frag: true,
        ttl: 64,
        payload_len: 0,
    });
    let mut mad = [0u8; MAD_LEN];
    m.emit(&mut mad).unwrap();
    let t = gsi_transport(0xffff, Qpn::GSI, Psn::new(u32::from(i)));
    let mut out = vec![0u8; 512];
    let n = emit_packet(
        &ip,
        src_port_for_qpn(Qpn::GSI),
        ROCEV2_UDP_PORT,
        &t,
        &mad,
        &mut out,
    )
    .unwrap();
    out.truncate(n);
    out
}

/// Writes raw IP packets into a pcap with Wireshark's own text2pcap (link type 101, raw IP),
/// so this crate needs no pcap writer.
fn write_pcap(path: &std::path::Path, packets: &[Vec<u8>]) {
    let mut hex = String::new();
    for p in packets {
        for (row, chunk) in p.chunks(16).enumerate() {
            hex.push_str(&format!("{:06x}", row * 16));
            for b in chunk {
                hex.push_str(&format!(" {b:02x}"));
            }
            hex.push('\n');
        }
    }
    let txt = path.with_extension("txt");
    std::fs::write(&txt, hex).expect("write hex dump");
    let out = Command::new("text2pcap")
        .args(["-q", "-l", "101"])
        .arg(&txt)
        .arg(path)
        .output()
        .expect("text2pcap is required for this test: apt-get install -y tshark");
    assert!(
        out.status.success(),
        "text2pcap failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tshark(pcap: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args(["-d", "udp.port==4791,infiniband"])
        .args(args)
        .output()
        .expect("tshark is required for this test: apt-get install -y tshark");
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tshark prints UTF-8")
}

#[test]
fn every_message_we_emit_round_trips_and_decodes_cleanly_in_tshark() {
    let mads = one_of_each();
    let packets: Vec<_> = mads
        .iter()
        .enumerate()
        .map(|(i, m)| gsi_packet(m, i as u16))
        .collect();
    for (m, p) in mads.iter().zip(&packets) {
        let parsed = RoceV2Packet::parse_checked(p).expect("our own packet parses");
        assert_eq!(CmMadRepr::parse(parsed.payload), Ok(*m));
    }
    let path = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cm_messages.pcap");
    write_pcap(&path, &packets);
    let mad = tshark(
        &path,
        &[
            "-Y",
            "infiniband.mad",
            "-T",
            "fields",
            "-e",
            "infiniband.mad.attributeid",
        ],
    );
    let ids: Vec<&str> = mad.lines().collect();
    assert_eq!(
        ids,
        [
            "0x0010", "0x0011", "0x0012", "0x0013", "0x0014", "0x0015", "0x0016", "0x0017",
            "0x0018", "0x0012"
        ],
        "every packet is a MAD with its attribute"
    );
    let req = tshark(
        &path,
        &[
            "-Y",
            "infiniband.cm.req",
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "infiniband.cm.req",
            "-e",
            "infiniband.cm.req.localqpn",
            "-e",
            "infiniband.cm.req.startpsn",
            "-e",
            "infiniband.cm.req.serviceid.dport",
            "-e",
            "infiniband.cm.req.ip_cm.sport",
            "-e",
            "infiniband.cm.req.ip_cm.sip4",
            "-e",
            "infiniband.cm.req.ip_cm.dip4",
        ],
    );
    assert_eq!(
        req.trim(),
        "0x11112222|0x123456|0xabcdef|0x4853|0x9c40|10.0.0.1|10.0.0.2"
    );
    let rest = tshark(
        &path,
        &[
            "-Y",
            "infiniband.cm.rep || infiniband.cm.rej.reason || infiniband.cm.dreq.localcommid",
            "-T",
            "fields",
            "-E",
            "separator=|",
            "-e",
            "infiniband.cm.rep.localqpn",
            "-e",
            "infiniband.cm.rep.startpsn",
            "-e",
            "infiniband.cm.rej.reason",
            "-e",
            "infiniband.cm.req.remoteqpneecn",
        ],
    );
    assert_eq!(
        rest.lines().collect::<Vec<_>>(),
        [
            "||0x001c|",
            "0x000042|0x000077||",
            "|||0x000042",
            "||0x0023|"
        ]
    );
    // the ECE options in the REQ's and REP's attribute modifier, none anywhere else
    let modifiers = tshark(
        &path,
        &[
            "-Y",
            "infiniband.mad",
            "-T",
            "fields",
            "-e",
            "infiniband.mad.attributemodifier",
        ],
    );
    let modifiers: Vec<&str> = modifiers.lines().collect();
    assert_eq!(modifiers[0], "0x80000001");
    assert_eq!(modifiers[3], "0x00000001");
    assert!(modifiers
        .iter()
        .enumerate()
        .all(|(i, m)| [0, 3].contains(&i) || *m == "0x00000000"));
    let bad = tshark(
        &path,
        &["-Y", "_ws.malformed || _ws.expert.severity >= 0x00600000"],
    );
    assert!(
        bad.trim().is_empty(),
        "tshark complains about {}:\n{bad}",
        path.display()
    );
}
