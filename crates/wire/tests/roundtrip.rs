//! Property tests: every header and every whole packet survives Repr -> emit -> parse, and
//! no byte string makes the parser panic.
//!
//! Failures print a seed; replay with `PROPTEST_CASES=... cargo test -p softrdma-wire --test
//! roundtrip` (proptest also stores failing seeds under proptest-regressions/).

use core::net::{Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use wire::*;

fn arb_opcode() -> impl Strategy<Value = Opcode> {
    prop::sample::select(Opcode::ALL)
}

fn arb_syndrome() -> impl Strategy<Value = Syndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credits| Syndrome::Ack { credits }),
        (0u8..32).prop_map(|timer| Syndrome::RnrNak { timer }),
        (0u8..5).prop_map(|c| Syndrome::Nak(NakCode::from_code(c).unwrap())),
    ]
}

prop_compose! {
    fn arb_bth(op: Opcode)(
        solicited: bool, mig_req: bool, pad_count in 0u8..4, pkey: u16, fecn: bool, becn: bool,
        qp in 0u32..1 << 24, ack_req: bool, psn in 0u32..1 << 24,
    ) -> BthRepr {
        BthRepr { opcode: op, solicited, mig_req, pad_count, tver: 0, pkey, fecn, becn,
                  dest_qp: Qpn::new(qp), ack_req, psn: Psn::new(psn) }
    }
}

prop_compose! {
    fn arb_reth()(va: u64, rkey: u32, dma_len: u32) -> RethRepr {
        RethRepr { va, rkey: Rkey(rkey), dma_len }
    }
}

prop_compose! {
    fn arb_aeth()(syndrome in arb_syndrome(), msn in 0u32..1 << 24) -> AethRepr {
        AethRepr { syndrome, msn: Msn::new(msn) }
    }
}

prop_compose! {
    fn arb_deth()(qkey: u32, qp in 0u32..1 << 24) -> DethRepr {
        DethRepr { qkey: Qkey(qkey), src_qp: Qpn::new(qp) }
    }
}

prop_compose! {
    fn arb_atomic()(va: u64, rkey: u32, swap_add: u64, compare: u64) -> AtomicEthRepr {
        AtomicEthRepr { va, rkey: Rkey(rkey), swap_add, compare }
    }
}

/// Transport headers for `op` with exactly the extension headers it carries.
fn arb_transport_for(op: Opcode) -> impl Strategy<Value = TransportRepr> {
    let e = op.ext();
    (
        arb_bth(op),
        arb_reth(),
        arb_aeth(),
        arb_deth(),
        any::<u32>(),
        any::<u32>(),
        arb_atomic(),
        any::<u64>(),
    )
        .prop_map(
            move |(bth, reth, aeth, deth, imm, inv, atomic, orig)| TransportRepr {
                bth,
                reth: e.reth.then_some(reth),
                aeth: e.aeth.then_some(aeth),
                deth: e.deth.then_some(deth),
                immdt: e.immdt.then_some(imm),
                ieth: e.ieth.then_some(Rkey(inv)),
                atomic_eth: e.atomic_eth.then_some(atomic),
                atomic_ack_eth: e.atomic_ack_eth.then_some(AtomicAckEthRepr { orig }),
            },
        )
}

fn arb_transport() -> impl Strategy<Value = TransportRepr> {
    arb_opcode().prop_flat_map(arb_transport_for)
}

fn arb_ip() -> impl Strategy<Value = IpRepr> {
    prop_oneof![
        (
            any::<u32>(),
            any::<u32>(),
            any::<u8>(),
            any::<u16>(),
            any::<bool>(),
            any::<u8>()
        )
            .prop_map(|(s, d, tos, ident, dont_frag, ttl)| IpRepr::V4(Ipv4Repr {
                src: Ipv4Addr::from(s),
                dst: Ipv4Addr::from(d),
                tos,
                ident,
                dont_frag,
                ttl,
                payload_len: 0,
            })),
        (
            any::<u128>(),
            any::<u128>(),
            any::<u8>(),
            0u32..1 << 20,
            any::<u8>()
        )
            .prop_map(|(s, d, traffic_class, flow_label, hop_limit)| IpRepr::V6(
                Ipv6Repr {
                    src: Ipv6Addr::from(s),
                    dst: Ipv6Addr::from(d),
                    traffic_class,
                    flow_label,
                    hop_limit,
                    payload_len: 0,
                }
            )),
    ]
}

/// A payload length that exercises every pad count, sometimes large.
fn arb_payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..16),
        1 => prop::collection::vec(any::<u8>(), 0..4200),
    ]
}

/// Emit a packet and return its bytes.
fn emit(ip: &IpRepr, sport: u16, t: &TransportRepr, payload: &[u8]) -> Vec<u8> {
    let l = PacketLayout::new(ip, sport, ROCEV2_UDP_PORT, t, payload.len()).unwrap();
    let mut buf = vec![0u8; l.len()];
    let n = emit_packet(ip, sport, ROCEV2_UDP_PORT, t, payload, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

proptest! {
    #[test]
    fn bth_round_trips(t in arb_transport()) {
        let mut b = [0u8; BTH_LEN];
        t.bth.emit(&mut Bth::new_unchecked(&mut b[..]));
        prop_assert_eq!(BthRepr::parse(&Bth::new_checked(&b[..]).unwrap()), Ok(t.bth));
    }

    #[test]
    fn extension_headers_round_trip(r in arb_reth(), a in arb_aeth(), d in arb_deth(),
                                    at in arb_atomic(), orig: u64, imm: u32, inv: u32) {
        let mut b = [0u8; 32];
        r.emit(&mut Reth::new_unchecked(&mut b[..]));
        prop_assert_eq!(RethRepr::parse(&Reth::new_checked(&b[..]).unwrap()), Ok(r));
        a.emit(&mut Aeth::new_unchecked(&mut b[..]));
        prop_assert_eq!(AethRepr::parse(&Aeth::new_checked(&b[..]).unwrap()), Ok(a));
        d.emit(&mut Deth::new_unchecked(&mut b[..]));
        prop_assert_eq!(DethRepr::parse(&Deth::new_checked(&b[..]).unwrap()), Ok(d));
        at.emit(&mut AtomicEth::new_unchecked(&mut b[..]));
        prop_assert_eq!(AtomicEthRepr::parse(&AtomicEth::new_checked(&b[..]).unwrap()), Ok(at));
        let ack = AtomicAckEthRepr { orig };
        ack.emit(&mut AtomicAckEth::new_unchecked(&mut b[..]));
        prop_assert_eq!(AtomicAckEthRepr::parse(&AtomicAckEth::new_checked(&b[..]).unwrap()), Ok(ack));
        ImmDtRepr(imm).emit(&mut ImmDt::new_unchecked(&mut b[..]));
        prop_assert_eq!(ImmDtRepr::parse(&ImmDt::new_checked(&b[..]).unwrap()), Ok(ImmDtRepr(imm)));
        IethRepr(Rkey(inv)).emit(&mut Ieth::new_unchecked(&mut b[..]));
        prop_assert_eq!(IethRepr::parse(&Ieth::new_checked(&b[..]).unwrap()), Ok(IethRepr(Rkey(inv))));
    }

    #[test]
    fn ip_and_udp_headers_round_trip(ip in arb_ip(), len in 0usize..2000, sport: u16, dport: u16, csum: u16) {
        let ip = ip.with_payload_len(len);
        let mut b = vec![0u8; ip.header_len() + len];
        ip.emit(&mut b).unwrap();
        prop_assert_eq!(IpRepr::parse(&b), Ok(ip));
        let udp = UdpRepr { src_port: sport, dst_port: dport, length: (len.max(8)) as u16, checksum: csum };
        let mut u = vec![0u8; len.max(8)];
        udp.emit(&mut Udp::new_unchecked(&mut u[..]));
        prop_assert_eq!(UdpRepr::parse(&Udp::new_checked(&u[..]).unwrap()), Ok(udp));
    }

    #[test]
    fn whole_packets_round_trip(ip in arb_ip(), t in arb_transport(), payload in arb_payload(), sport: u16) {
        let payload: &[u8] = if t.bth.opcode.has_payload() { &payload } else { &[] };
        let bytes = emit(&ip, sport, &t, payload);
        let p = RoceV2Packet::parse_checked(&bytes).unwrap();
        let mut want = t;
        want.bth.pad_count = pad_for(payload.len()) as u8;
        prop_assert_eq!(p.transport, want);
        prop_assert_eq!(p.payload, payload);
        prop_assert_eq!(p.ip, ip.with_payload_len(bytes.len() - ip.header_len()));
        prop_assert_eq!((p.udp.src_port, p.udp.dst_port, usize::from(p.udp.length)),
                        (sport, ROCEV2_UDP_PORT, bytes.len() - ip.header_len()));
        // UDP checksum: 0 over IPv4; over IPv6 computed, and it verifies.
        match ip {
            IpRepr::V4(_) => prop_assert_eq!(p.udp.checksum, 0),
            IpRepr::V6(r) => {
                let mut seg = bytes[40..].to_vec();
                seg[6..8].fill(0);
                prop_assert_eq!(p.udp.checksum, wire::udp::checksum_ipv6(&r.src, &r.dst, &seg));
            }
        }
        prop_assert!(icrc::verify(&bytes).is_ok());
        // and re-emitting the parse gives the same bytes
        let mut again = vec![0u8; p.buffer_len()];
        p.emit(&mut again).unwrap();
        prop_assert_eq!(again, bytes);
    }

    #[test]
    fn a_hidden_ipv4_ident_is_recovered(ip in arb_ip(), t in arb_transport(), payload in arb_payload(),
                                        seen: u16) {
        // `seen` is the ID a receiver's rebuilt header shows in place of the sender's.
        let payload: &[u8] = if t.bth.opcode.has_payload() { &payload } else { &[] };
        let sent = emit(&ip, 0xc000, &t, payload);
        let mut bytes = sent.clone();
        let IpRepr::V4(r) = ip else {
            // IPv6 has no ID: nothing to recover, and the check is the exact one.
            prop_assert_eq!(icrc::recover_ipv4_ident(&bytes), None);
            prop_assert_eq!(RoceV2Packet::parse_checked_recovering_ipv4_ident(&bytes),
                            RoceV2Packet::parse_checked(&bytes).map(|p| (p, None)));
            return Ok(());
        };
        let mut h = Ipv4::new_unchecked(&mut bytes[..]);
        h.set_ident(seen);
        h.fill_checksum();
        prop_assert_eq!(icrc::recover_ipv4_ident(&bytes), Some(r.ident));
        let (p, recovered) = RoceV2Packet::parse_checked_recovering_ipv4_ident(&bytes).unwrap();
        prop_assert_eq!(p, RoceV2Packet::parse_checked(&sent).unwrap());
        prop_assert_eq!(recovered, (seen != r.ident).then_some(r.ident));
        // The lower-level form, from the CRC over what was seen.
        let n = bytes.len();
        let computed = icrc::compute(&bytes[..n - ICRC_LEN]).unwrap();
        let carried = u32::from_le_bytes(bytes[n - ICRC_LEN..].try_into().unwrap());
        prop_assert_eq!(icrc::ipv4_ident_for_icrc(seen, n, computed, carried), Some(r.ident));
    }

    #[test]
    fn any_flipped_bit_is_caught_or_masked(ip in arb_ip(), t in arb_transport(),
                                           payload in prop::collection::vec(any::<u8>(), 0..64),
                                           pos: prop::sample::Index, bit in 0u8..8) {
        let payload: &[u8] = if t.bth.opcode.has_payload() { &payload } else { &[] };
        let mut bytes = emit(&ip, 0xc000, &t, payload);
        let i = pos.index(bytes.len());
        bytes[i] ^= 1 << bit;
        // Never panics; when it still parses, the ICRC flags every change outside the
        // masked fields (and the IPv4 checksum, which parse verifies itself).
        if let Ok(p) = RoceV2Packet::parse(&bytes) {
            let ip_len = ip.header_len();
            let masked = match ip {
                IpRepr::V4(_) => [1, 8, 10, 11].contains(&i),
                IpRepr::V6(_) => (i == 0 && bit < 4) || (1..4).contains(&i) || i == 7,
            } || i == ip_len + 6 || i == ip_len + 7 || i == ip_len + 8 + 4;
            prop_assert_eq!(p.icrc_ok, masked, "byte {} bit {}", i, bit);
        }
    }

    #[test]
    fn parse_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = RoceV2Packet::parse(&bytes);
        let _ = RoceV2Packet::parse_checked(&bytes);
        let _ = TransportPacket::parse(&bytes);
        let _ = icrc::compute(&bytes);
        let _ = icrc::verify(&bytes);
        let _ = RoceV2Packet::parse_checked_recovering_ipv4_ident(&bytes);
        // An ID found makes the ICRC hold once written into the header.
        if let Some(id) = icrc::recover_ipv4_ident(&bytes) {
            let mut fixed = bytes.clone();
            Ipv4::new_unchecked(&mut fixed[..]).set_ident(id);
            prop_assert!(icrc::verify(&fixed).is_ok());
        }
    }

    #[test]
    fn parse_never_panics_on_plausible_headers(ip in arb_ip(), t in arb_transport(),
                                               payload in prop::collection::vec(any::<u8>(), 0..40),
                                               cut in 0usize..200, edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4)) {
        // Start from a valid packet, then truncate it and overwrite a few bytes: this reaches
        // the deep checks that random bytes rarely get past.
        let payload: &[u8] = if t.bth.opcode.has_payload() { &payload } else { &[] };
        let mut bytes = emit(&ip, 0xc000, &t, payload);
        for (at, v) in edits {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        bytes.truncate(bytes.len().saturating_sub(cut % 8 * (cut / 8 % 2)));
        if let Some(id) = icrc::recover_ipv4_ident(&bytes) {
            // an ID found makes the ICRC hold once written into the header
            let mut fixed = bytes.clone();
            Ipv4::new_unchecked(&mut fixed[..]).set_ident(id);
            prop_assert!(icrc::verify(&fixed).is_ok());
        }
        if let Ok(p) = RoceV2Packet::parse(&bytes) {
            // what parses re-emits and re-parses to the same thing
            let mut again = vec![0u8; p.buffer_len()];
            let n = p.emit(&mut again).unwrap();
            let q = RoceV2Packet::parse_checked(&again[..n]).unwrap();
            prop_assert_eq!(q.transport, p.transport);
            prop_assert_eq!(q.payload, p.payload);
        }
    }
}

#[test]
fn every_opcode_ip_version_and_pad_count() {
    let v4 = IpRepr::V4(Ipv4Repr {
        src: Ipv4Addr::new(192, 0, 2, 1),
        dst: Ipv4Addr::new(192, 0, 2, 2),
        tos: 0,
        ident: 0,
        dont_frag: true,
        ttl: 64,
        payload_len: 0,
    });
    let v6 = IpRepr::V6(Ipv6Repr {
        src: "2001:db8::1".parse().unwrap(),
        dst: "2001:db8::2".parse().unwrap(),
        traffic_class: 0,
        flow_label: 0,
        hop_limit: 64,
        payload_len: 0,
    });
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut n = 0;
    for &op in Opcode::ALL {
        let t = arb_transport_for(op)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let lens: &[usize] = if op.has_payload() {
            &[0, 1, 2, 3, 4, 1021, 1022, 1023, 1024]
        } else {
            &[0]
        };
        for ip in [v4, v6] {
            for &len in lens {
                let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let bytes = emit(&ip, 0xc000, &t, &payload);
                let p = RoceV2Packet::parse_checked(&bytes).unwrap();
                assert_eq!(p.transport.bth.opcode, op);
                assert_eq!(p.payload, &payload[..]);
                assert_eq!(usize::from(p.transport.bth.pad_count), pad_for(len));
                n += 1;
            }
        }
    }
    assert_eq!(
        n,
        2 * (Opcode::ALL.iter().filter(|o| o.has_payload()).count() * 9
            + Opcode::ALL.iter().filter(|o| !o.has_payload()).count())
    );
}
