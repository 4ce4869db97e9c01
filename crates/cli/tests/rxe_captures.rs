//! The captures of real Linux Soft-RoCE (rdma_rxe) traffic in shared/testdata: `softrdma decode`
//! agrees with tshark on every RoCE packet, field by field, shows `icrc=ok` for every good packet
//! and `icrc=BAD` for the corrupted one; and re-emitting each packet's headers and payload with
//! our codec reproduces rxe's bytes, ICRC included.

mod common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use common::{testdata_dir, to_hex, tshark};
use softrdma_cli::link::{strip, Network};
use softrdma_cli::CaptureReader;
use wire::packet::{emit_packet, RoceV2Packet};

const CAPTURES: [&str; 3] = [
    "rxe-rc-pingpong.pcap",
    "rxe-verbs-suite.pcap",
    "rxe-badicrc.pcap",
];

fn capture(name: &str) -> PathBuf {
    let p = testdata_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: shared/testdata must sit beside the repo",
        p.display()
    );
    p
}

/// Runs `softrdma decode` on a capture: its stdout lines.
fn decode(name: &str) -> Vec<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("decode")
        .arg(capture(name))
        .output()
        .expect("run softrdma");
    assert!(
        out.status.success(),
        "softrdma decode {name} exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8 output")
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The `key=value` tokens of a line.
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|tok| tok.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// The opcode byte printed as "(0x..)" after the opcode name.
fn opcode_of(line: &str) -> Option<u8> {
    let start = line.find(" (0x")? + 4;
    u8::from_str_radix(line.get(start..start + 2)?, 16).ok()
}

fn num(s: &str) -> u64 {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .unwrap_or_else(|_| panic!("not a number: {s:?}"))
}

/// tshark's view: per frame number, the InfiniBand fields we compare.
const TSHARK_FIELDS: [(&str, &str); 16] = [
    ("infiniband.bth.opcode", "opcode"),
    ("infiniband.bth.destqp", "qpn"),
    ("infiniband.bth.psn", "psn"),
    ("infiniband.bth.a", "ack_req"),
    ("infiniband.bth.padcnt", "pad"),
    ("infiniband.reth.va", "va"),
    ("infiniband.reth.r_key", "rkey"),
    ("infiniband.reth.dmalen", "dma_len"),
    ("infiniband.aeth.syndrome", "syndrome"),
    ("infiniband.aeth.msn", "msn"),
    ("infiniband.deth.q_key", "qkey"),
    ("infiniband.deth.srcqp", "src_qp"),
    ("infiniband.atomiceth.swapdt", "swap_or_add"),
    ("infiniband.atomiceth.cmpdt", "compare"),
    ("infiniband.atomicacketh.origremdt", "orig"),
    ("infiniband.invariant.crc", "icrc_value"),
];

fn tshark_frames(name: &str) -> BTreeMap<usize, BTreeMap<&'static str, u64>> {
    let path = capture(name);
    let mut args = vec![
        "-r",
        path.to_str().expect("utf-8 path"),
        "-Y",
        "infiniband",
        "-T",
        "fields",
    ];
    args.extend([
        "-E",
        "separator=\t",
        "-E",
        "occurrence=f",
        "-e",
        "frame.number",
    ]);
    for (f, _) in TSHARK_FIELDS {
        args.extend(["-e", f]);
    }
    let text = tshark(&args);
    let mut frames = BTreeMap::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split('\t').collect();
        let frame: usize = cols[0].parse().expect("frame number");
        let mut m = BTreeMap::new();
        for ((_, ours), v) in TSHARK_FIELDS.iter().zip(&cols[1..]) {
            if !v.is_empty() {
                m.insert(*ours, num(v));
            }
        }
        frames.insert(frame, m);
    }
    frames
}

/// Compares our line for a frame with tshark's fields for it.
fn compare(name: &str, frame: usize, line: &str, theirs: &BTreeMap<&str, u64>) -> Vec<String> {
    let ours = fields(line);
    let mut errs = Vec::new();
    let mut check = |what: &str, our: Option<u64>, their: Option<u64>| {
        if our != their {
            errs.push(format!(
                "{name} frame {frame}: {what}: ours {our:?}, tshark {their:?}: {line}"
            ));
        }
    };
    let get = |k: &str| ours.get(k).map(|v| num(v));
    check(
        "opcode",
        opcode_of(line).map(u64::from),
        theirs.get("opcode").copied(),
    );
    for k in [
        "qpn", "psn", "ack_req", "syndrome", "msn", "qkey", "src_qp", "compare", "orig",
    ] {
        check(k, get(k), theirs.get(k).copied());
    }
    // We print the pad count only when it is non-zero.
    check(
        "pad",
        Some(get("pad").unwrap_or(0)),
        theirs.get("pad").copied(),
    );
    // RETH, or the AtomicETH whose VA / R_Key tshark files under the RETH field names.
    for k in ["va", "rkey", "dma_len"] {
        check(k, get(k), theirs.get(k).copied());
    }
    check(
        "swap/add",
        get("swap").or_else(|| get("add")),
        theirs.get("swap_or_add").copied(),
    );
    errs
}

#[test]
fn decode_agrees_with_tshark_on_every_rxe_packet_and_every_icrc_is_ok() {
    let mut failures = Vec::new();
    for name in ["rxe-rc-pingpong.pcap", "rxe-verbs-suite.pcap"] {
        let lines = decode(name);
        let theirs = tshark_frames(name);
        assert!(
            theirs.len() >= 120,
            "{name}: tshark sees {} RoCE packets",
            theirs.len()
        );
        let mut our_counts: BTreeMap<u8, usize> = BTreeMap::new();
        let mut their_counts: BTreeMap<u8, usize> = BTreeMap::new();
        for (i, line) in lines.iter().enumerate() {
            let frame = i + 1;
            assert!(
                line.starts_with(&format!("{frame} ")),
                "{name}: line {frame} is {line}"
            );
            match theirs.get(&frame) {
                Some(t) => {
                    if !line.ends_with(" icrc=ok") {
                        failures.push(format!("{name} frame {frame}: ICRC not ok: {line}"));
                    }
                    failures.extend(compare(name, frame, line, t));
                    *our_counts
                        .entry(opcode_of(line).unwrap_or(0xff))
                        .or_default() += 1;
                    *their_counts.entry(t["opcode"] as u8).or_default() += 1;
                }
                None => {
                    if !line.contains("not RoCEv2: TCP") {
                        failures.push(format!("{name} frame {frame}: expected a TCP line: {line}"));
                    }
                }
            }
        }
        assert_eq!(
            lines.len(),
            count_records(name),
            "{name}: one line per packet"
        );
        assert_eq!(
            our_counts, their_counts,
            "{name}: packets per opcode, ours vs tshark"
        );
    }
    assert!(
        failures.is_empty(),
        "{} problems:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_corrupted_packet_in_rxe_badicrc_is_the_only_bad_one() {
    let lines = decode("rxe-badicrc.pcap");
    let roce: Vec<&String> = lines.iter().filter(|l| l.contains(" icrc=")).collect();
    assert_eq!(
        roce.len(),
        5,
        "rxe-badicrc.pcap has 5 RoCE packets:\n{}",
        lines.join("\n")
    );
    assert!(
        roce[0].contains(" icrc=BAD"),
        "first RoCE packet must show icrc=BAD: {}",
        roce[0]
    );
    for l in &roce[1..] {
        assert!(
            l.ends_with(" icrc=ok"),
            "only the first packet is corrupt: {l}"
        );
    }
    // rxe drops the corrupt packet and NAKs the next one with a PSN sequence error.
    assert!(
        roce.iter()
            .any(|l| l.contains("syndrome=0x60 aeth=NAK code=psn_sequence_error")),
        "the NAK with syndrome 0x60 is decoded:\n{}",
        lines.join("\n")
    );
    let theirs = tshark_frames("rxe-badicrc.pcap");
    assert_eq!(theirs.len(), 5);
    let mut failures = Vec::new();
    for (frame, t) in &theirs {
        failures.extend(compare("rxe-badicrc.pcap", *frame, &lines[frame - 1], t));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn count_records(name: &str) -> usize {
    let file = File::open(capture(name)).expect("open capture");
    let mut reader = CaptureReader::new(std::io::BufReader::new(file)).expect("pcap header");
    let mut n = 0;
    while let Some(rec) = reader.next_record() {
        rec.expect("intact record");
        n += 1;
    }
    n
}

#[test]
fn re_emitting_rxe_packets_with_our_codec_reproduces_their_bytes_and_icrc() {
    let mut emitted = 0;
    let mut nonzero_udp_checksums = Vec::new();
    let mut failures = Vec::new();
    for name in CAPTURES {
        let file = File::open(capture(name)).expect("open capture");
        let mut reader = CaptureReader::new(std::io::BufReader::new(file)).expect("pcap header");
        let mut index = 0;
        while let Some(rec) = reader.next_record() {
            let rec = rec.expect("intact record");
            index += 1;
            let Network::Ip(ip) = strip(rec.linktype, &rec.data) else {
                continue;
            };
            // Only the IP packet, not Ethernet padding.
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let ip = &ip[..total.min(ip.len())];
            if ip[9] != 17 {
                continue;
            }
            let pkt = RoceV2Packet::parse(ip)
                .unwrap_or_else(|e| panic!("{name} frame {index}: rxe packet rejected: {e}"));
            let mut buf = vec![0u8; 4096];
            let n = emit_packet(
                &pkt.ip,
                pkt.udp.src_port,
                pkt.udp.dst_port,
                &pkt.transport,
                pkt.payload,
                &mut buf,
            )
            .unwrap_or_else(|e| panic!("{name} frame {index}: emit failed: {e}"));
            let ours = &buf[..n];
            emitted += 1;
            // We always send UDP checksum 0 (as rxe does); the peer that forged the packets
            // of rxe-badicrc.pcap filled it in. It is masked out of the ICRC, so compare the
            // rest of the bytes with it zeroed.
            let udp_csum = if ip[0] >> 4 == 4 { 26 } else { 46 };
            let mut theirs_ip = ip.to_vec();
            if theirs_ip[udp_csum..udp_csum + 2] != [0, 0] {
                nonzero_udp_checksums.push((name, index));
                theirs_ip[udp_csum..udp_csum + 2].copy_from_slice(&[0, 0]);
            }
            let ip = &theirs_ip[..];
            let (their_icrc, our_icrc) = (&ip[ip.len() - 4..], &ours[n - 4..]);
            if pkt.icrc_ok {
                if our_icrc != their_icrc {
                    failures.push(format!(
                        "{name} frame {index}: ICRC ours {} rxe {}",
                        to_hex(our_icrc),
                        to_hex(their_icrc)
                    ));
                }
                if ours != ip {
                    failures.push(format!(
                        "{name} frame {index}: bytes differ\n ours {}\n rxe  {}",
                        to_hex(ours),
                        to_hex(ip)
                    ));
                }
            } else {
                // The corrupt packet: our ICRC is the correct one, one bit away from rxe's.
                let diff: u32 = our_icrc
                    .iter()
                    .zip(their_icrc)
                    .map(|(a, b)| (a ^ b).count_ones())
                    .sum();
                assert_eq!(
                    diff, 1,
                    "{name} frame {index}: the bad ICRC is one flipped bit"
                );
                assert_eq!(ours[..n - 4], ip[..ip.len() - 4], "{name} frame {index}");
            }
        }
    }
    assert_eq!(
        emitted, 325,
        "every RoCE packet of the three captures was re-emitted"
    );
    // Linux rxe always sends 0; only the forging peer's four packets carry a checksum.
    assert_eq!(
        nonzero_udp_checksums,
        (12..=15)
            .map(|i| ("rxe-badicrc.pcap", i))
            .collect::<Vec<_>>(),
        "packets with a UDP checksum"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
