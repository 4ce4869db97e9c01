//! The IPv4 ID recovery on arbitrary bytes: never panics, and what it finds is right.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let found = wire::icrc::recover_ipv4_ident(data);
    if let Some(id) = found {
        // Written into the header, the ID makes the ICRC hold.
        let mut fixed = data.to_vec();
        wire::Ipv4::new_unchecked(&mut fixed[..]).set_ident(id);
        assert!(wire::icrc::verify(&fixed).is_ok());
    }
    let recovering = wire::RoceV2Packet::parse_checked_recovering_ipv4_ident(data);
    match (wire::RoceV2Packet::parse_checked(data), &recovering) {
        // A packet that checks as received needs no recovery.
        (Ok(p), Ok((q, None))) => assert_eq!(p, *q),
        // One that does not is accepted exactly when an ID was found, with that ID.
        (Err(wire::WireError::BadIcrc { .. }), Ok((q, Some(id)))) => {
            assert_eq!(found, Some(*id));
            assert!(q.icrc_ok && matches!(q.ip, wire::IpRepr::V4(r) if r.ident == *id));
        }
        (Err(wire::WireError::BadIcrc { .. }), Err(wire::WireError::BadIcrc { .. })) => {
            assert!(found.is_none())
        }
        (Err(a), Err(b)) => assert_eq!(a, *b),
        other => panic!("parse_checked and the recovering parse disagree: {other:?}"),
    }
    // The lower-level form on whatever numbers the bytes hold.
    if data.len() >= 14 {
        let ident = u16::from_be_bytes([data[0], data[1]]);
        let len = usize::from(u16::from_be_bytes([data[2], data[3]]));
        let computed = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        let carried = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
        let a = wire::icrc::ipv4_ident_for_icrc(ident, len, computed, carried);
        assert_eq!(
            a,
            wire::icrc::ipv4_ident_for_icrc(ident, len, carried, computed)
        );
        if computed == carried && len >= 44 {
            assert_eq!(a, Some(ident));
        }
    }
});
