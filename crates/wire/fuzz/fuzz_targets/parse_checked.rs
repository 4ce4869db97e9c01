//! The checked parser on arbitrary bytes: must return Ok or a WireError, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let checked = wire::RoceV2Packet::parse_checked(data);
    let lenient = wire::RoceV2Packet::parse(data);
    // parse_checked = parse + ICRC verdict
    match (&checked, &lenient) {
        (Ok(a), Ok(b)) => assert!(a == b && a.icrc_ok),
        (Err(wire::WireError::BadIcrc { expected, computed }), Ok(b)) => {
            assert!(!b.icrc_ok && *expected == b.icrc && expected != computed)
        }
        (Err(a), Err(b)) => assert_eq!(a, b),
        other => panic!("parse and parse_checked disagree: {other:?}"),
    }
    // The other entry points for untrusted bytes.
    let _ = wire::TransportPacket::parse(data);
    let _ = wire::icrc::compute(data);
    let _ = wire::icrc::verify(data);
    // Error messages format without panicking.
    if let Err(e) = checked {
        let _ = e.to_string();
    }
});
