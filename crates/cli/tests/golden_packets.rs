//! Golden packets: exact bytes committed under tests/data, produced by implementations other
//! than ours (scapy for `*.scapy.hex`, Linux rdma_rxe for `rxe_*.hex`; each file's header says
//! how). Our codec must emit the same headers and payload to the same bytes, ICRC included.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use common::{crate_dir, parse_hex, to_hex};
use wire::packet::{emit_packet, IpRepr, RoceV2Packet, TransportRepr};
use wire::{
    AethRepr, BthRepr, DethRepr, Ipv4Repr, Ipv6Repr, Msn, Opcode, Psn, Qkey, Qpn, Syndrome,
};

fn golden(name: &str) -> Vec<u8> {
    let path = crate_dir().join("tests/data").join(name);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    parse_hex(&text)
}

fn emit(ip: IpRepr, src_port: u16, t: &TransportRepr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 2048];
    let n = emit_packet(&ip, src_port, wire::ROCEV2_UDP_PORT, t, payload, &mut buf)
        .expect("emit the golden packet");
    buf.truncate(n);
    buf
}

fn v4(src: [u8; 4], dst: [u8; 4], ident: u16, tos: u8) -> IpRepr {
    IpRepr::V4(Ipv4Repr {
        src: Ipv4Addr::from(src),
        dst: Ipv4Addr::from(dst),
        tos,
        ident,
        dont_frag: true,
        ttl: 64,
        payload_len: 0,
    })
}

fn transport(bth: BthRepr) -> TransportRepr {
    TransportRepr {
        bth,
        reth: None,
        aeth: None,
        deth: None,
        immdt: None,
        ieth: None,
        atomic_eth: None,
        atomic_ack_eth: None,
    }
}

fn assert_same(name: &str, ours: &[u8], theirs: &[u8]) {
    assert_eq!(
        to_hex(ours),
        to_hex(theirs),
        "{name}: our bytes (left) differ from the golden bytes (right)"
    );
}

#[test]
fn rc_send_only_with_three_pad_bytes_matches_scapy_byte_for_byte() {
    let mut bth = BthRepr::new(Opcode::RcSendOnly, Qpn::new(0x123), Psn::new(0xabcd));
    bth.ack_req = true;
    bth.pad_count = 3;
    let ours = emit(
        v4([192, 0, 2, 1], [192, 0, 2, 2], 0, 0),
        0xc001,
        &transport(bth),
        b"hello",
    );
    assert_same(
        "rc_send_only_pad3_v4",
        &ours,
        &golden("rc_send_only_pad3_v4.scapy.hex"),
    );
}

#[test]
fn rc_ack_matches_scapy_byte_for_byte() {
    let bth = BthRepr::new(Opcode::RcAcknowledge, Qpn::new(0x456), Psn::new(0xabcd));
    let mut t = transport(bth);
    t.aeth = Some(AethRepr {
        syndrome: Syndrome::ACK_NO_CREDIT,
        msn: Msn::new(7),
    });
    let ours = emit(
        v4([192, 0, 2, 2], [192, 0, 2, 1], 0x1234, 0x02),
        0xc002,
        &t,
        &[],
    );
    assert_same("rc_ack_v4", &ours, &golden("rc_ack_v4.scapy.hex"));
}

#[test]
fn ud_send_only_matches_scapy_byte_for_byte() {
    let bth = BthRepr::new(Opcode::UdSendOnly, Qpn::new(0x16), Psn::new(1));
    let mut t = transport(bth);
    t.deth = Some(DethRepr {
        qkey: Qkey::new(0x1111_1111),
        src_qp: Qpn::new(0x17),
    });
    let ours = emit(
        v4([192, 0, 2, 3], [192, 0, 2, 4], 0, 0),
        0xc003,
        &t,
        b"RoCEv2!\0",
    );
    assert_same(
        "ud_send_only_v4",
        &ours,
        &golden("ud_send_only_v4.scapy.hex"),
    );
}

#[test]
fn ipv6_send_only_matches_the_scapy_built_packet_byte_for_byte() {
    let ip = IpRepr::V6(Ipv6Repr {
        src: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        dst: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
        traffic_class: 0x12,
        flow_label: 0x12345,
        hop_limit: 9,
        payload_len: 0,
    });
    let bth = BthRepr::new(Opcode::RcSendOnly, Qpn::new(1), Psn::new(2));
    let ours = emit(ip, 5, &transport(bth), b"abcd");
    assert_same(
        "rc_send_only_v6",
        &ours,
        &golden("rc_send_only_v6.scapy.hex"),
    );
}

#[test]
fn golden_packets_from_linux_rxe_parse_and_re_emit_identically() {
    let expect = [
        ("rxe_rc_rdma_read_request.hex", Opcode::RcRdmaReadRequest),
        ("rxe_rc_fetch_add.hex", Opcode::RcFetchAdd),
        ("rxe_rc_atomic_ack.hex", Opcode::RcAtomicAcknowledge),
        ("rxe_ud_send_only.hex", Opcode::UdSendOnly),
    ];
    for (name, op) in expect {
        let bytes = golden(name);
        let pkt = RoceV2Packet::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(pkt.transport.bth.opcode, op, "{name}");
        assert!(pkt.icrc_ok, "{name}: rxe's ICRC must verify");
        let ours = emit(pkt.ip, pkt.udp.src_port, &pkt.transport, pkt.payload);
        assert_same(name, &ours, &bytes);
    }
}

#[test]
fn the_recorded_scapy_command_still_produces_the_committed_golden_bytes() {
    common::require_scapy();
    let out = std::process::Command::new(common::PYTHON)
        .arg(crate_dir().join("tests/scapy_icrc.py"))
        .arg("golden")
        .output()
        .expect("run scapy_icrc.py golden");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut seen = 0;
    for line in text.lines() {
        let (name, hex) = line.split_once(' ').expect("'<name> <hex>' lines");
        let file = format!("{name}.scapy.hex");
        assert_eq!(
            to_hex(&golden(&file)),
            hex,
            "{file} differs from what scapy builds today"
        );
        seen += 1;
    }
    assert_eq!(
        seen, 4,
        "scapy_icrc.py golden builds the four golden packets"
    );
}
