//! Ring entries on arbitrary bytes: `decode_send`, `decode_recv` and `Cqe::completion` return a
//! value or a `WqeError`, never a panic; whatever decodes re-encodes into the largest entry, in
//! no more bytes than a ring sized for it gives, and decodes again to the same value.
#![no_main]

use abi::wqe::{self, Cqe};
use engine::{SendPayload, WcFlags};
use libfuzzer_sys::fuzz_target;
use zerocopy::FromBytes;

fuzz_target!(|data: &[u8]| {
    send(data);
    recv(data);
    cqe(data);
});

fn send(entry: &[u8]) {
    let (wr, ud) = match wqe::decode_send(entry) {
        Ok(d) => d,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let mut buf = [0u8; wqe::MAX_SEND_ENTRY];
    let n = wqe::encode_send(&wr, ud.as_ref(), &mut buf)
        .expect("a decoded send WR re-encodes into the largest entry");
    let (sges, inline) = match &wr.payload {
        SendPayload::Sges(s) => (s.len(), 0),
        SendPayload::Inline(d) => (0, d.len()),
    };
    // A ring the daemon sized for this many SGEs or inline bytes holds it.
    assert!(
        n <= wqe::send_entry_len(sges as u32, inline as u32),
        "{wr:?} in {n} bytes"
    );
    // The decoder read no further than the entry reaches: the rest of a ring slot is ignored.
    assert!(n <= entry.len());
    assert_eq!(
        wqe::decode_send(&entry[..n]).as_ref(),
        Ok(&(wr.clone(), ud))
    );
    assert_eq!(wqe::decode_send(&buf[..n]), Ok((wr, ud)));
}

fn recv(entry: &[u8]) {
    let wr = match wqe::decode_recv(entry) {
        Ok(wr) => wr,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let mut buf = [0u8; wqe::MAX_RECV_ENTRY];
    let n = wqe::encode_recv(&wr, &mut buf)
        .expect("a decoded receive WR re-encodes into the largest entry");
    assert!(
        n <= wqe::recv_entry_len(wr.sg_list.len() as u32),
        "{wr:?} in {n} bytes"
    );
    assert!(n <= entry.len());
    assert_eq!(wqe::decode_recv(&entry[..n]).as_ref(), Ok(&wr));
    assert_eq!(wqe::decode_recv(&buf[..n]), Ok(wr));
}

fn cqe(entry: &[u8]) {
    let Ok((c, _)) = Cqe::read_from_prefix(entry) else {
        assert!(entry.len() < wqe::CQE_LEN);
        return;
    };
    assert_eq!(c.bytes(), &entry[..wqe::CQE_LEN]);
    let wc = match c.completion() {
        Ok(wc) => wc,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    // What the daemon writes back for it: every field the same, but reserved bytes zero and
    // flag bits libibverbs does not define dropped.
    let back = Cqe::of(&wc);
    let expect = Cqe {
        wc_flags: WcFlags::from_bits_truncate(c.wc_flags).bits(),
        reserved0: 0,
        reserved: [0; 4],
        ..c
    };
    assert_eq!(back, expect);
    let again = Cqe::read_from_bytes(back.bytes()).expect("a CQE's bytes are a CQE");
    assert_eq!(again.completion(), Ok(wc));
}
