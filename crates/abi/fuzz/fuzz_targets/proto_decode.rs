//! The control protocol on arbitrary bytes: framing, requests and answers decode to a value or
//! a `ProtoError`, never a panic; whatever decodes re-encodes to the very bytes it came from
//! (one encoding per message) and decodes again to the same value.
#![no_main]

use abi::proto::{self, Header, Request, Response, HEADER_LEN, KIND_ERROR, MAX_BODY, RESPONSE_BIT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The bytes as a stream off the socket: whole messages split off the front, as the daemon
    // and the client read them, until a bad header or an incomplete message.
    let mut rest = data;
    loop {
        match proto::split_message(rest) {
            Ok(Some((h, body))) => {
                assert_eq!(body.len(), h.length as usize);
                assert_eq!(h.to_bytes()[..], rest[..HEADER_LEN]);
                request(h.kind, h.id, body);
                response(h.kind, h.id, body);
                rest = &rest[HEADER_LEN + body.len()..];
            }
            Ok(None) => break,
            Err(e) => {
                let _ = e.to_string();
                break;
            }
        }
    }
    // A kind and a body, as they reach the decoders after a header that checked: most random
    // streams stop at the magic, these do not.
    if let Some((k, body)) = data.split_first_chunk::<2>() {
        if body.len() <= MAX_BODY as usize {
            let kind = u16::from_le_bytes(*k);
            request(kind, 0x5eed, body);
            // Answers need RESPONSE_BIT; try the kind with and without it.
            response(kind, 0x5eed, body);
            response(kind ^ RESPONSE_BIT, 0x5eed, body);
        }
    }
});

/// The header an encoder must write for a body of `body` bytes.
fn header(kind: u16, id: u32, body: &[u8]) -> [u8; HEADER_LEN] {
    Header {
        kind,
        length: body.len() as u32,
        id,
    }
    .to_bytes()
}

fn request(kind: u16, id: u32, body: &[u8]) {
    let req = match Request::decode(kind, body) {
        Ok(req) => req,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert_eq!(req.kind(), kind);
    let bytes = req.encode(id);
    assert_eq!(bytes[..HEADER_LEN], header(kind, id, body));
    assert_eq!(bytes[HEADER_LEN..], *body, "{req:?} re-encodes differently");
    let (h, b) = proto::split_message(&bytes)
        .expect("an encoded request has a good header")
        .expect("an encoded request is whole");
    assert_eq!((h.kind, h.id, b.len()), (kind, id, body.len()));
    assert_eq!(Request::decode(h.kind, b), Ok(req));
}

fn response(kind: u16, id: u32, body: &[u8]) {
    let resp = match Response::decode(kind, body) {
        Ok(resp) => resp,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    // An error answer has a kind of its own; any other carries the request's kind.
    assert_eq!(matches!(resp, Response::Error { .. }), kind == KIND_ERROR);
    assert_ne!(kind & RESPONSE_BIT, 0);
    let bytes = resp.encode(kind & !RESPONSE_BIT, id);
    assert_eq!(bytes[..HEADER_LEN], header(kind, id, body));
    assert_eq!(
        bytes[HEADER_LEN..],
        *body,
        "{resp:?} re-encodes differently"
    );
    let (h, b) = proto::split_message(&bytes)
        .expect("an encoded answer has a good header")
        .expect("an encoded answer is whole");
    assert_eq!((h.kind, h.id, b.len()), (kind, id, body.len()));
    assert_eq!(Response::decode(h.kind, b), Ok(resp));
}
