//! Helpers shared by the capture tests: where shared/testdata is, and the packets of its
//! classic pcap files.
#![allow(dead_code)] // each test crate uses its own subset

use std::path::PathBuf;

use wire::ROCEV2_UDP_PORT;

/// shared/testdata sits beside the repository (../shared from the repo root); the
/// environment variable SOFTRDMA_TESTDATA overrides it.
pub fn testdata(name: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("SOFTRDMA_TESTDATA") {
        return PathBuf::from(dir).join(name);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    for cand in [
        root.join("../shared/testdata"),
        root.join("shared/testdata"),
        "/work/shared/testdata".into(),
    ] {
        if cand.join(name).exists() {
            return cand.join(name);
        }
    }
    panic!("capture {name} not found: set SOFTRDMA_TESTDATA to the shared/testdata directory");
}

/// The IP packets (Ethernet payloads of IPv4/IPv6 frames) of a classic pcap file.
pub fn ip_packets(name: &str) -> Vec<Vec<u8>> {
    let data = std::fs::read(testdata(name)).expect("read capture");
    assert!(data.len() >= 24, "pcap global header");
    let le = match data[..4] {
        [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
        _ => panic!("not a classic pcap file"),
    };
    let u32_at = |at: usize| {
        let b = [data[at], data[at + 1], data[at + 2], data[at + 3]];
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    assert_eq!(u32_at(20), 1, "linktype Ethernet");
    let mut out = Vec::new();
    let mut at = 24;
    while at + 16 <= data.len() {
        let incl = u32_at(at + 8) as usize;
        let frame = &data[at + 16..at + 16 + incl];
        at += 16 + incl;
        let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
        if ethertype == 0x0800 || ethertype == 0x86dd {
            out.push(frame[14..].to_vec());
        }
    }
    assert_eq!(at, data.len(), "pcap ends on a record boundary");
    out
}

/// True when the IP packet is UDP to port 4791.
pub fn is_roce(ip: &[u8]) -> bool {
    match ip[0] >> 4 {
        4 => ip[9] == 17 && u16::from_be_bytes([ip[22], ip[23]]) == ROCEV2_UDP_PORT,
        6 => ip[6] == 17 && u16::from_be_bytes([ip[42], ip[43]]) == ROCEV2_UDP_PORT,
        _ => false,
    }
}

pub fn roce_packets(name: &str) -> Vec<Vec<u8>> {
    ip_packets(name)
        .into_iter()
        .filter(|p| is_roce(p))
        .collect()
}
