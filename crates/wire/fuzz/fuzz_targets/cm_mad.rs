//! The CM MAD parser on arbitrary bytes: never panics; whatever parses re-emits to bytes
//! that parse to the same message, and emitting only ever clears (reserved) bits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::{CmMadRepr, CmaHeaderRepr, MAD_LEN};

fuzz_target!(|data: &[u8]| {
    let _ = CmaHeaderRepr::parse_bytes(data);
    match CmMadRepr::parse(data) {
        Ok(m) => {
            let mut out = [0u8; MAD_LEN];
            assert_eq!(m.emit(&mut out), Ok(MAD_LEN));
            assert_eq!(CmMadRepr::parse(&out), Ok(m));
            for (o, b) in out.iter().zip(data) {
                assert_eq!(o & !b, 0, "emit set a bit the input did not have");
            }
            // only a REQ or REP keeps the attribute modifier (its ECE options)
            let keeps = matches!(m.message, wire::CmMessage::Req(_) | wire::CmMessage::Rep(_));
            assert_eq!(out[20..24] == data[20..24], keeps || data[20..24] == [0; 4]);
            // a REQ's or SIDR_REQ's private data may start with an IP CM header
            if let wire::CmMessage::Req(r) = m.message {
                let _ = CmaHeaderRepr::parse_bytes(r.private_data.as_bytes());
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
