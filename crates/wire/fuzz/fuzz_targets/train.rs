//! A raw socket's view of a datagram (IPv4 and UDP headers, then one packet or a GSO train)
//! on arbitrary bytes: cutting it never panics, every cut lies within the payload, the pieces
//! are what a train is made of (all as long as the first but the last, each after the first
//! the next PSN of the same QP), and each piece gets headers whose lengths describe it.
//! `cut` on the same bytes never panics, and its packets hold the payload in order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wire::train::{cut, ipv4_segment_header, segment_len, Link, IPV4_TRAIN_HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Some(packets) = cut(data) {
        assert!(packets.len() > 1);
        let d = wire::Datagram::parse(data).unwrap();
        let h = d.payload.start;
        let joined: Vec<u8> = packets.iter().flat_map(|p| p[h..].iter().copied()).collect();
        assert_eq!(joined, data[d.payload]);
    }
    let Some((header, payload)) = data.split_first_chunk::<IPV4_TRAIN_HEADER_LEN>() else {
        let seg = segment_len(data);
        assert!(seg <= data.len());
        return;
    };
    let seg = segment_len(payload);
    assert!(seg <= payload.len());
    if seg == payload.len() {
        return;
    }
    assert!(seg > 0);
    let mut prev: Option<Link> = None;
    for (k, piece) in payload.chunks(seg).enumerate() {
        let link = Link::of(piece).expect("every piece of a train has a BTH");
        if let Some(p) = prev {
            assert!(p.is_followed_by(link), "piece {k} does not follow");
        } else {
            assert!(link.leads(seg), "a train led by a packet that may not lead one");
        }
        prev = Some(link);
        let mut out = vec![0u8; IPV4_TRAIN_HEADER_LEN + piece.len()];
        if ipv4_segment_header(header, &mut out, k, piece.len()).is_ok() {
            let ip = wire::Ipv4::new_checked(&out[..]).unwrap();
            assert_eq!(usize::from(ip.total_len()), out.len());
        }
    }
});
