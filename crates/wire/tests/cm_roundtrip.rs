//! Property tests for the CM MADs: every message, whatever its field values, survives
//! parse -> emit -> parse, and no byte string makes the MAD or IP CM parsers panic.
//!
//! The messages are generated as random bytes behind a valid CM header rather than field by
//! field: every bit pattern of every field is then reachable, and a Repr parsed from them holds
//! only in-range values. Failures print a seed; replay with `cargo test -p softrdma-wire --test
//! cm_roundtrip` (proptest also stores failing seeds under proptest-regressions/).

use proptest::prelude::*;
use wire::*;

const ATTRS: [u16; 9] = [
    0x0010, 0x0011, 0x0012, 0x0013, 0x0014, 0x0015, 0x0016, 0x0017, 0x0018,
];

/// A 256-byte CM MAD with a valid header for one of the modeled messages, a random attribute
/// modifier (a REQ's or REP's ECE options) and random content.
fn arb_cm_mad() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(&ATTRS[..]),
        any::<u64>(),
        any::<u32>(),
        prop::collection::vec(any::<u8>(), CM_MSG_LEN),
    )
        .prop_map(|(attr, tid, modifier, body)| {
            let mut b = vec![0u8; MAD_LEN];
            MadHeaderRepr {
                base_version: 1,
                mgmt_class: CM_MGMT_CLASS,
                class_version: CM_CLASS_VERSION,
                method: MadMethod::SEND,
                transaction_id: tid,
                attribute_id: attr,
                attribute_modifier: modifier,
                ..MadHeaderRepr::default()
            }
            .emit(&mut b)
            .unwrap();
            b[MAD_HEADER_LEN..].copy_from_slice(&body);
            b
        })
}

fn arb_cma() -> impl Strategy<Value = CmaHeaderRepr> {
    let v4 = (any::<[u8; 4]>(), any::<[u8; 4]>()).prop_map(|(s, d)| CmaAddrs::V4 {
        src: s.into(),
        dst: d.into(),
    });
    let v6 = (any::<[u8; 16]>(), any::<[u8; 16]>()).prop_map(|(s, d)| CmaAddrs::V6 {
        src: s.into(),
        dst: d.into(),
    });
    (any::<u16>(), prop_oneof![v4, v6])
        .prop_map(|(src_port, addrs)| CmaHeaderRepr { src_port, addrs })
}

proptest! {
    #[test]
    fn every_cm_message_round_trips_through_emit(bytes in arb_cm_mad()) {
        let m = CmMadRepr::parse(&bytes).expect("a valid header and any body parse");
        prop_assert_eq!(m.message.attr_id().0, ATTRS.iter().copied()
            .find(|&a| a == u16::from_be_bytes([bytes[16], bytes[17]])).unwrap());
        let mut out = [0xa5u8; MAD_LEN + 4];
        prop_assert_eq!(m.emit(&mut out), Ok(MAD_LEN));
        // bytes after the MAD are not touched
        prop_assert_eq!(&out[MAD_LEN..], &[0xa5; 4]);
        prop_assert_eq!(CmMadRepr::parse(&out), Ok(m));
        // emitting keeps every bit a field owns and zeroes only reserved ones
        for (i, (&o, &b)) in out[..MAD_LEN].iter().zip(&bytes).enumerate() {
            prop_assert_eq!(o & !b, 0, "byte {} gained bits", i);
        }
        // the attribute modifier is a REQ's or REP's ECE options, and nothing for the others
        let modifier = &bytes[20..24];
        let ece = match m.message {
            CmMessage::Req(r) => Some(r.ece),
            CmMessage::Rep(r) => Some(r.ece),
            _ => None,
        };
        match ece {
            Some(ece) => {
                prop_assert_eq!(&out[20..24], modifier);
                prop_assert_eq!(ece.options.to_be_bytes(), [modifier[0], modifier[1], modifier[2], modifier[3]]);
                prop_assert!(ece.vendor_id <= 0xff_ffff);
            }
            None => prop_assert_eq!(&out[20..24], &[0u8; 4]),
        }
    }

    #[test]
    fn ip_cm_headers_round_trip(r in arb_cma(), tail in any::<[u8; 8]>()) {
        let mut b = [0u8; CMA_HEADER_LEN + 8];
        b[CMA_HEADER_LEN..].copy_from_slice(&tail);
        r.emit(&mut b).unwrap();
        prop_assert_eq!(CmaHeaderRepr::parse_bytes(&b), Ok(r));
        prop_assert_eq!(&b[CMA_HEADER_LEN..], &tail);
        let sid = ServiceId::rdma_cm(PortSpace(r.src_port), tail[0].into());
        prop_assert_eq!(sid.rdma_cm_parts(), Some((PortSpace(r.src_port), tail[0].into())));
    }

    #[test]
    fn cm_parsers_never_panic_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = CmMadRepr::parse(&bytes);
        let _ = CmaHeaderRepr::parse_bytes(&bytes);
        if let Ok(h) = MadHeader::new_checked(&bytes[..]) {
            let _ = MadHeaderRepr::parse(&h);
        }
        for id in ATTRS {
            let _ = CmMessage::parse(CmAttrId(id), 0xffff_ffff, &bytes);
        }
        if let Err(e) = CmMadRepr::parse(&bytes) {
            let _ = e.to_string();
        }
    }

    #[test]
    fn cm_headers_that_are_almost_right_give_precise_errors(bytes in arb_cm_mad(), at in 0usize..4, v: u8) {
        let mut bad = bytes;
        prop_assume!(bad[at] != v);
        bad[at] = v;
        let e = CmMadRepr::parse(&bad).unwrap_err();
        let want = match at {
            0 => WireError::BadMadBaseVersion { version: v },
            1 => WireError::WrongMgmtClass { class: v, expected: CM_MGMT_CLASS },
            2 => WireError::BadClassVersion { version: v },
            _ => WireError::UnexpectedMadMethod { method: v },
        };
        prop_assert_eq!(e, want);
    }
}

#[test]
fn fields_wider_than_their_bits_are_cut_on_emit() {
    let r = ReqRepr {
        remote_cm_response_timeout: 0xff,
        retry_count: 0xff,
        max_cm_retries: 0xff,
        ..ReqRepr::default()
    };
    let mut b = [0u8; MAD_LEN];
    CmMadRepr {
        transaction_id: 0,
        message: CmMessage::Req(r),
    }
    .emit(&mut b)
    .unwrap();
    let CmMessage::Req(back) = CmMadRepr::parse(&b).unwrap().message else {
        panic!("a REQ")
    };
    assert_eq!(
        (
            back.remote_cm_response_timeout,
            back.retry_count,
            back.max_cm_retries
        ),
        (0x1f, 7, 0xf)
    );
    // the neighbours of the cut fields are untouched
    assert_eq!(back.transport_service_type, ServiceType::Rc);
    assert_eq!(back.pkey, 0);
    assert!(!back.srq);
}
