//! `softrdma decode` as a user meets it: every link type it promises, pcapng, packets that are
//! not RoCE or are malformed, and damaged files, which give an error line and a non-zero exit
//! but never a panic.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{ip_for, matrix, payload_for, tmp_path, transport_for, tshark, write_pcap, Case};
use softrdma_cli::{decode_ip, Verdict};
use wire::packet::RoceV2Packet;

fn run(path: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .arg("decode")
        .arg(path)
        .output()
        .expect("run softrdma")
}

fn stdout_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// A few matrix packets, IPv4 and IPv6.
fn sample_packets() -> Vec<Vec<u8>> {
    let cases = matrix();
    let pick = |v6: bool, len: usize| {
        cases
            .iter()
            .find(|c| matches!(c.ip, wire::packet::IpRepr::V6(_)) == v6 && c.payload.len() == len)
            .map(Case::emit)
            .expect("a matching case")
    };
    vec![pick(false, 61), pick(true, 62), pick(false, 0)]
}

/// The packet lines without index and timestamp.
fn bodies(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l.splitn(3, ' ').nth(2).unwrap_or_default().to_owned())
        .collect()
}

fn wrap(linktype: u32, ip: &[u8]) -> Vec<u8> {
    let v6 = ip[0] >> 4 == 6;
    let ethertype: [u8; 2] = if v6 { [0x86, 0xdd] } else { [0x08, 0x00] };
    let mut f = Vec::new();
    match linktype {
        1 => {
            f.extend_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
            // One 802.1Q tag, VLAN 5.
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
            f.extend_from_slice(&ethertype);
        }
        113 => {
            f.extend_from_slice(&[0, 0, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0]);
            f.extend_from_slice(&ethertype);
        }
        276 => {
            f.extend_from_slice(&ethertype);
            f.extend_from_slice(&[0, 0, 0, 0, 0, 2, 0, 1, 0, 0, 6, 2, 0, 0, 0, 0, 1, 0]);
        }
        0 => f.extend_from_slice(&(if v6 { 10u32 } else { 2u32 }).to_le_bytes()),
        _ => {}
    }
    f.extend_from_slice(ip);
    f
}

#[test]
fn every_supported_link_type_gives_the_same_lines_as_raw_ip() {
    let packets = sample_packets();
    let raw = tmp_path("link-raw.pcap");
    write_pcap(&raw, 101, &packets);
    let out = run(&raw);
    assert!(out.status.success());
    let expected = bodies(&stdout_lines(&out));
    assert_eq!(expected.len(), 3);
    for l in &expected {
        assert!(l.ends_with(" icrc=ok"), "{l}");
    }
    for linktype in [1u32, 12, 14, 113, 276, 0, 228, 229] {
        let frames: Vec<Vec<u8>> = match linktype {
            // LINKTYPE_IPV4 / IPV6 hold one family only.
            228 => vec![packets[0].clone()],
            229 => vec![packets[1].clone()],
            _ => packets.iter().map(|p| wrap(linktype, p)).collect(),
        };
        let path = tmp_path(&format!("link-{linktype}.pcap"));
        write_pcap(&path, linktype, &frames);
        let out = run(&path);
        assert!(out.status.success(), "link type {linktype}: {}", out.status);
        let got = bodies(&stdout_lines(&out));
        let want: Vec<String> = match linktype {
            228 => vec![expected[0].clone()],
            229 => vec![expected[1].clone()],
            _ => expected.clone(),
        };
        assert_eq!(got, want, "link type {linktype}");
    }
}

#[test]
fn ethernet_padding_after_a_short_packet_is_ignored() {
    let cases = matrix();
    let ack = cases
        .iter()
        .find(|c| c.transport.bth.opcode == wire::Opcode::RcSendOnly && c.payload.is_empty())
        .expect("an empty RC SEND ONLY")
        .emit();
    let mut frame = wrap(1, &ack);
    frame.resize(frame.len().max(60) + 6, 0);
    let path = tmp_path("eth-padding.pcap");
    write_pcap(&path, 1, &[frame]);
    let out = run(&path);
    let lines = stdout_lines(&out);
    assert!(lines[0].ends_with(" payload=0 icrc=ok"), "{lines:?}");
}

#[test]
fn pcapng_files_decode_like_pcap() {
    let packets = sample_packets();
    let pcap = tmp_path("ng-source.pcap");
    write_pcap(&pcap, 101, &packets);
    let ng = tmp_path("converted.pcapng");
    tshark(&[
        "-r",
        pcap.to_str().expect("utf-8"),
        "-F",
        "pcapng",
        "-w",
        ng.to_str().expect("utf-8"),
    ]);
    let a = run(&pcap);
    let b = run(&ng);
    assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
    // Same lines, timestamps included (pcapng counts time in units of the interface's
    // if_tsresol, microseconds as tshark writes it).
    assert_eq!(stdout_lines(&a), stdout_lines(&b));
    assert_eq!(stdout_lines(&a).len(), packets.len());
}

#[test]
fn malformed_roce_packets_get_the_precise_wire_error_and_decoding_goes_on() {
    let good = sample_packets()[0].clone();
    let mut bad_opcode = good.clone();
    bad_opcode[28] = 0x1f; // reserved RC opcode
    let mut truncated = good.clone();
    truncated.truncate(20 + 8 + 5);
    let mut bad_tver = good.clone();
    bad_tver[29] |= 0x0f;
    let packets = vec![bad_opcode, truncated, good.clone(), bad_tver];
    for p in &packets[..2] {
        let err = RoceV2Packet::parse(p).expect_err("malformed");
        let d = decode_ip(p);
        assert_eq!(d.verdict, Verdict::Malformed(err));
        assert!(
            d.text.ends_with(&format!("malformed RoCEv2: {err}")),
            "{}",
            d.text
        );
    }
    let path = tmp_path("malformed.pcap");
    write_pcap(&path, 101, &packets);
    let out = run(&path);
    assert!(out.status.success(), "bad packets are not a bad file");
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 4);
    assert!(
        lines[0].contains("malformed RoCEv2: unknown BTH opcode 0x1f"),
        "{}",
        lines[0]
    );
    assert!(lines[1].contains("malformed RoCEv2: "), "{}", lines[1]);
    assert!(lines[2].ends_with("icrc=ok"), "{}", lines[2]);
    assert!(
        lines[3].contains("malformed RoCEv2: bad BTH transport version 15"),
        "{}",
        lines[3]
    );
}

#[test]
fn other_traffic_is_named_not_decoded() {
    let mut udp = sample_packets()[0].clone();
    udp[22..24].copy_from_slice(&53u16.to_be_bytes()); // DNS, not 4791
    let mut icmp = vec![
        0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    icmp.extend_from_slice(&[8, 0, 0, 0, 0, 0, 0, 0]);
    let mut arp = vec![0xff; 12];
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    let path = tmp_path("other.pcap");
    write_pcap(
        &path,
        1,
        &[wrap(1, &udp), wrap(1, &icmp), arp, vec![1, 2, 3]],
    );
    let out = run(&path);
    assert!(out.status.success());
    let lines = stdout_lines(&out);
    assert!(
        lines[0].contains("> 198.51.100.2.53: not RoCEv2: UDP (not to port 4791)"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("IP 10.0.0.1 > 10.0.0.2: not RoCEv2: ICMP"),
        "{}",
        lines[1]
    );
    assert!(lines[2].ends_with("not RoCEv2: ARP"), "{}", lines[2]);
    assert!(
        lines[3].ends_with("not RoCEv2: truncated Ethernet header: need 14 bytes, have 3"),
        "{}",
        lines[3]
    );
}

#[test]
fn damaged_files_give_an_error_and_a_non_zero_exit_but_never_a_panic() {
    let src = common::testdata_dir().join("rxe-badicrc.pcap");
    let whole = std::fs::read(&src).expect("read the capture");
    let good = run(&src);
    let good_lines = stdout_lines(&good);
    // Cut inside the last record, inside a record header, inside the file header; empty; junk.
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("cut-last-record", whole[..whole.len() - 10].to_vec()),
        ("cut-record-header", whole[..24 + 16 + 74 + 7].to_vec()),
        ("cut-file-header", whole[..13].to_vec()),
        ("empty", Vec::new()),
        (
            "junk",
            b"this is not a capture file, just some words".to_vec(),
        ),
        (
            "pcapng-junk",
            [&[0x0a, 0x0d, 0x0d, 0x0a][..], &[0xff; 40][..]].concat(),
        ),
        ("huge-record", {
            let mut v = whole[..24].to_vec();
            v.extend_from_slice(&[
                0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff, 0x7f,
            ]);
            v
        }),
    ];
    for (name, bytes) in cases {
        let path = tmp_path(&format!("damaged-{name}.pcap"));
        std::fs::write(&path, &bytes).expect("write");
        let out = run(&path);
        let code = out.status.code();
        assert!(
            code.is_some() && code != Some(0) && code != Some(101),
            "{name}: exit {:?}",
            code
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("softrdma decode: "),
            "{name}: no error line: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{name}: {stderr}");
        // Whatever was intact before the damage is still printed, identically.
        let lines = stdout_lines(&out);
        assert_eq!(lines[..], good_lines[..lines.len()], "{name}");
        if name == "cut-last-record" {
            assert_eq!(lines.len(), good_lines.len() - 1, "{name}");
        }
    }
    let missing = run(Path::new("/nonexistent/capture.pcap"));
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn random_bytes_as_packets_never_panic() {
    // Deterministic xorshift; a failure names the seed and the packet.
    let mut x: u64 = 0x5eed_2026_1122_0347;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let good = sample_packets();
    let mut packets = Vec::new();
    for i in 0..600 {
        let mut p = good[i % good.len()].clone();
        // Mutate a few bytes, and sometimes cut the packet.
        for _ in 0..(1 + next() % 4) {
            let at = (next() as usize) % p.len();
            p[at] = next() as u8;
        }
        if next() % 3 == 0 {
            let len = (next() as usize) % (p.len() + 1);
            p.truncate(len);
        }
        packets.push(p);
    }
    for p in &packets {
        let _ = decode_ip(p);
    }
    let path = tmp_path("random.pcap");
    write_pcap(&path, 101, &packets);
    let out = run(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout_lines(&out).len(), packets.len());
}

#[test]
fn every_opcode_line_shows_every_field_we_emitted() {
    use wire::{OpKind, Syndrome};
    for case in matrix() {
        let packet = case.emit();
        let d = decode_ip(&packet);
        assert_eq!(d.verdict, Verdict::RoceOk, "{}: {}", case.name, d.text);
        let t = &case.transport;
        let b = &t.bth;
        let mut want = vec![
            format!(": {} ({:#04x}) ", b.opcode.name(), b.opcode.code()),
            format!(" qpn={:#08x} ", b.dest_qp.value()),
            format!(" psn={} ", b.psn.value()),
            format!(" ack_req={} ", u8::from(b.ack_req)),
            format!(" payload={} icrc=ok", case.payload.len()),
        ];
        if b.solicited {
            want.push(" se=1 ".into());
        }
        if b.mig_req {
            want.push(" mig=1 ".into());
        }
        if case.pad() != 0 {
            want.push(format!(" pad={} ", case.pad()));
        }
        if b.becn {
            want.push(" becn=1 ".into());
        }
        if let Some(r) = &t.reth {
            want.push(format!(
                " va={:#018x} rkey={:#010x} dma_len={} ",
                r.va,
                r.rkey.value(),
                r.dma_len
            ));
        }
        if let Some(a) = &t.atomic_eth {
            let op = if b.opcode.kind() == OpKind::FetchAdd {
                "add"
            } else {
                "swap"
            };
            want.push(format!(
                " va={:#018x} rkey={:#010x} {op}={:#018x} compare={:#018x} ",
                a.va,
                a.rkey.value(),
                a.swap_add,
                a.compare
            ));
        }
        if let Some(a) = &t.aeth {
            let kind = match a.syndrome {
                Syndrome::Ack { credits } => format!("ACK credits={credits}"),
                Syndrome::RnrNak { timer } => format!("RNR_NAK timer={timer}"),
                Syndrome::Nak(_) => "NAK code=".to_owned(),
            };
            want.push(format!(" syndrome={:#04x} aeth={kind}", a.syndrome.to_u8()));
            want.push(format!(" msn={} ", a.msn.value()));
        }
        if let Some(a) = &t.atomic_ack_eth {
            want.push(format!(" orig={:#018x} ", a.orig));
        }
        if let Some(d) = &t.deth {
            want.push(format!(
                " qkey={:#010x} src_qp={:#08x} ",
                d.qkey.value(),
                d.src_qp.value()
            ));
        }
        if let Some(imm) = t.immdt {
            want.push(format!(" imm={imm:#010x} "));
        }
        if let Some(rkey) = t.ieth {
            want.push(format!(" inv_rkey={:#010x} ", rkey.value()));
        }
        for w in want {
            assert!(
                d.text.contains(&w),
                "{}: {:?} missing from {}",
                case.name,
                w,
                d.text
            );
        }
    }
}

#[test]
fn a_bad_icrc_shows_both_values() {
    let mut p = sample_packets()[0].clone();
    let n = p.len();
    p[n - 1] ^= 0x80;
    let d = decode_ip(&p);
    assert_eq!(d.verdict, Verdict::RoceBadIcrc);
    let carried = u32::from_le_bytes([p[n - 4], p[n - 3], p[n - 2], p[n - 1]]);
    let computed = wire::icrc::compute(&p[..n - 4]).expect("computable");
    assert!(
        d.text.ends_with(&format!(
            " icrc=BAD (carried {carried:#010x}, computed {computed:#010x})"
        )),
        "{}",
        d.text
    );
}

/// Re-fixes the IPv4 header checksum after a test edited the header.
fn fix_ipv4_checksum(p: &mut [u8]) {
    p[10..12].copy_from_slice(&[0, 0]);
    let sum = wire::ipv4::checksum(&p[..20]);
    p[10..12].copy_from_slice(&sum.to_be_bytes());
}

/// Whether an error is the one a malformation must produce.
type IsExpected = fn(&wire::WireError) -> bool;

#[test]
fn each_kind_of_malformation_is_named_precisely() {
    use wire::WireError as E;
    let cases = matrix();
    let find = |op: wire::Opcode, len: usize| {
        cases
            .iter()
            .find(|c| {
                c.transport.bth.opcode == op
                    && c.payload.len() == len
                    && matches!(c.ip, wire::packet::IpRepr::V4(_))
            })
            .map(Case::emit)
            .expect("a matching case")
    };
    let send = find(wire::Opcode::RcSendOnly, 61);
    let ack = find(wire::Opcode::RcAcknowledge, 0);
    let edit = |base: &[u8], f: &dyn Fn(&mut Vec<u8>)| {
        let mut p = base.to_vec();
        f(&mut p);
        p
    };
    let bth = 28;
    let checks: Vec<(&str, Vec<u8>, IsExpected)> = vec![
        (
            "UC RDMA READ REQUEST does not exist",
            edit(&send, &|p| p[bth] = 0x2c),
            |e| matches!(e, E::OpcodeNotValidForTransport { code: 0x2c }),
        ),
        ("RD is not spoken", edit(&send, &|p| p[bth] = 0x44), |e| {
            matches!(e, E::UnsupportedTransport { code: 0x44 })
        }),
        ("reserved opcode", edit(&send, &|p| p[bth] = 0x1f), |e| {
            matches!(e, E::UnknownOpcode { code: 0x1f })
        }),
        (
            "pad beyond payload",
            edit(&ack, &|p| p[bth + 1] |= 0x30),
            |e| matches!(e, E::PadTooLarge { pad: 3, payload: 0 }),
        ),
        (
            "reserved AETH syndrome",
            edit(&ack, &|p| p[bth + 12] = 0x40),
            |e| matches!(e, E::BadSyndrome { value: 0x40 }),
        ),
        (
            "UDP length disagrees",
            edit(&send, &|p| {
                let l = u16::from_be_bytes([p[24], p[25]]) - 4;
                p[24..26].copy_from_slice(&l.to_be_bytes());
            }),
            |e| {
                matches!(
                    e,
                    E::LengthMismatch {
                        header: wire::HeaderKind::Udp,
                        claimed: 84,
                        actual: 88
                    }
                )
            },
        ),
        (
            "IPv4 fragment",
            edit(&send, &|p| {
                p[6] |= 0x20;
                fix_ipv4_checksum(p);
            }),
            |e| matches!(e, E::Ipv4Fragmented),
        ),
        (
            "IP length cuts the packet off",
            edit(&send, &|p| p.truncate(bth + 7)),
            |e| {
                matches!(
                    e,
                    E::LengthMismatch {
                        header: wire::HeaderKind::Ipv4,
                        ..
                    }
                )
            },
        ),
        (
            "cut inside the BTH, lengths consistent",
            edit(&send, &|p| {
                p.truncate(bth + 7);
                p[2..4].copy_from_slice(&35u16.to_be_bytes());
                p[24..26].copy_from_slice(&15u16.to_be_bytes());
                fix_ipv4_checksum(p);
            }),
            |e| {
                matches!(
                    e,
                    E::Truncated {
                        header: wire::HeaderKind::Bth,
                        ..
                    }
                )
            },
        ),
    ];
    for (what, packet, expected) in checks {
        let err = RoceV2Packet::parse(&packet).expect_err(what);
        assert!(expected(&err), "{what}: the codec says {err:?}");
        let d = decode_ip(&packet);
        assert_eq!(d.verdict, Verdict::Malformed(err), "{what}");
        assert!(
            d.text.ends_with(&format!(": malformed RoCEv2: {err}")),
            "{what}: {}",
            d.text
        );
    }
}

#[test]
fn a_dash_reads_the_capture_from_standard_input() {
    use std::io::Write as _;
    let src = common::testdata_dir().join("rxe-badicrc.pcap");
    let from_file = run(&src);
    let mut child = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["decode", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run softrdma");
    let bytes = std::fs::read(&src).expect("read the capture");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&bytes)
        .expect("feed the capture");
    let from_stdin = child.wait_with_output().expect("softrdma finishes");
    assert!(from_stdin.status.success());
    assert_eq!(stdout_lines(&from_stdin), stdout_lines(&from_file));
    assert_eq!(stdout_lines(&from_file).len(), 19);
}

/// A GSO train as `tcpdump` on `lo` records it: one frame whose UDP payload is three
/// RoCEv2 packets of one QP (two WRITE MIDDLEs and a LAST), each sealed for the IPv4 ID its
/// segment gets when cut (k). `decode` prints each packet with the headers it has on the
/// wire, and each ICRC verifies.
#[test]
fn a_gso_train_recorded_uncut_decodes_as_its_packets() {
    use wire::{Datagram, Opcode};
    let base = ip_for(false, 0);
    let mut train = Vec::new();
    for k in 0..3u32 {
        let op = if k < 2 {
            Opcode::RcRdmaWriteMiddle
        } else {
            Opcode::RcRdmaWriteLast
        };
        let mut t = transport_for(op, 0);
        t.bth.psn = t.bth.psn.add(k);
        let case = Case {
            name: format!("segment {k}"),
            ip: base,
            src_port: 49152,
            transport: t,
            payload: payload_for(if k < 2 { 1024 } else { 100 }, k),
        };
        let mut pkt = case.emit();
        let d = Datagram::parse(&pkt).unwrap();
        d.set_ipv4_ident(&mut pkt, k as u16).unwrap();
        if k == 0 {
            train.extend_from_slice(&pkt[..d.payload.start]);
        }
        train.extend_from_slice(&pkt[d.payload]);
    }
    // The train's own lengths and ID, as the sender handed it to the kernel.
    let total = train.len() as u16;
    train[2..4].copy_from_slice(&total.to_be_bytes());
    train[4..6].copy_from_slice(&0u16.to_be_bytes());
    train[24..26].copy_from_slice(&(total - 20).to_be_bytes());
    fix_ipv4_checksum(&mut train);

    let pcap = tmp_path("train.pcap");
    write_pcap(&pcap, 1, &[wrap(1, &train)]);
    let out = run(&pcap);
    assert!(out.status.success(), "{out:?}");
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (k, l) in lines.iter().enumerate() {
        assert!(l.starts_with("1 "), "one record: {l}");
        assert!(l.ends_with(&format!("segment={}/3", k + 1)), "{l}");
        assert!(l.contains("icrc=ok"), "{l}");
    }
    assert!(lines[2].contains("RDMA Write Last") && lines[2].contains("payload=100"));
    let summary = String::from_utf8_lossy(&out.stderr);
    assert!(
        summary.contains("3 packets: 3 RoCEv2 with good ICRC"),
        "{summary}"
    );
    // Not a train: the same bytes with the third packet's PSN out of order are one packet,
    // whose ICRC then fails.
    let mut broken = train.clone();
    let psn_at = 28 + 2 * (12 + 1024 + 4) + 9;
    broken[psn_at + 2] ^= 0x40;
    let d = softrdma_cli::decode_ip_packets(&broken);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].verdict, Verdict::RoceBadIcrc);
}
