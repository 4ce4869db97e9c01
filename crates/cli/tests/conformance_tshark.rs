//! Conformance against Wireshark's InfiniBand dissector: every opcode × {IPv4, IPv6} ×
//! {no payload, payload with pad 0..3}, emitted by our codec into a raw-IP pcap, must decode in
//! `tshark` as InfiniBand with exactly the field values we put in, with no malformed packet and
//! no expert info of warning or error severity.

mod common;

use common::{matrix, tmp_path, tshark, write_pcap, Case};
use serde_json::Value;

/// Wireshark's expert severities (epan/proto.h): PI_WARN and PI_ERROR.
const PI_WARN: u64 = 0x0060_0000;

/// Options for every tshark run of this suite, and why:
/// - RoCEv2 sends UDP checksum 0 over IPv6 too (as Linux rxe does, the zero-checksum UDP
///   tunnel case of RFC 6935/6936); Wireshark flags that as an error unless told it is allowed.
/// - The heuristic dissectors that Wireshark tries on InfiniBand *payload* (RPC-over-RDMA, SMB
///   Direct, Mellanox EoIB, ...) interpret our made-up test payload as their protocols; two of
///   them (rpcrdma_infiniband, mellanox_eoib) even throw on an empty payload, which IBA allows. They
///   judge application bytes, not the transport headers under test, so they are off.
const TSHARK_OPTS: [&str; 22] = [
    "-o",
    "udp.ignore_ipv6_zero_checksum:TRUE",
    "--disable-heuristic",
    "rpcrdma_infiniband",
    "--disable-heuristic",
    "mellanox_eoib",
    "--disable-heuristic",
    "eth_over_ib",
    "--disable-heuristic",
    "smb_direct_infiniband",
    "--disable-heuristic",
    "smcr_infiniband",
    "--disable-heuristic",
    "sdp_infiniband",
    "--disable-heuristic",
    "iser_infiniband",
    "--disable-heuristic",
    "lnet_ib",
    "--disable-heuristic",
    "fc_infiniband",
    "--disable-heuristic",
    "nvme_rdma",
];

/// Runs tshark on `pcap` with the suite's options plus `args`.
fn tshark_on(pcap: &std::path::Path, args: &[&str]) -> String {
    let mut all = vec!["-r", pcap.to_str().expect("utf-8 path")];
    all.extend_from_slice(&TSHARK_OPTS);
    all.extend_from_slice(args);
    tshark(&all)
}

/// Every value stored under `key` anywhere below `v`, as text.
fn find_all<'a>(v: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                if k == key {
                    out.push(child);
                }
                find_all(child, key, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|c| find_all(c, key, out)),
        _ => {}
    }
}

fn values(v: &Value, key: &str) -> Vec<String> {
    let mut found = Vec::new();
    find_all(v, key, &mut found);
    found
        .into_iter()
        .map(|x| match x {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// Parses tshark's rendering of an integer field: decimal, or hex with 0x.
fn num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// tshark's rendering of a byte field ("c0:ff:ee:01") as a big-endian integer.
fn bytes_num(s: &str) -> Option<u64> {
    let hex: String = s.split(':').collect();
    u64::from_str_radix(&hex, 16).ok()
}

/// Problems in one frame: malformed markers and expert infos of warning severity or worse.
fn problems(frame: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let mut found = Vec::new();
    find_all(frame, "_ws.malformed", &mut found);
    if !found.is_empty() {
        errs.push(format!("malformed packet: {}", found[0]));
    }
    let mut experts = Vec::new();
    find_all(frame, "_ws.expert", &mut experts);
    for e in experts {
        for sev in values(e, "_ws.expert.severity") {
            if num(&sev).unwrap_or(u64::MAX) >= PI_WARN {
                errs.push(format!("expert info of severity {sev}: {e}"));
            }
        }
    }
    errs
}

struct Checker<'a> {
    frame: &'a Value,
    errs: Vec<String>,
}

impl Checker<'_> {
    fn one(&mut self, key: &str) -> Option<String> {
        let mut v = values(self.frame, key);
        // tshark's json repeats some byte fields (ImmDt, IETH) verbatim; one value is one value.
        v.dedup();
        if v.len() != 1 {
            self.errs
                .push(format!("{key}: expected one value, tshark gave {v:?}"));
            return None;
        }
        v.into_iter().next()
    }

    fn eq(&mut self, key: &str, want: u64) {
        if let Some(s) = self.one(key) {
            if num(&s) != Some(want) {
                self.errs
                    .push(format!("{key}: tshark says {s}, we emitted {want:#x}"));
            }
        }
    }

    fn eq_bytes(&mut self, key: &str, want: u64) {
        if let Some(s) = self.one(key) {
            if bytes_num(&s) != Some(want) {
                self.errs
                    .push(format!("{key}: tshark says {s}, we emitted {want:#x}"));
            }
        }
    }

    fn absent(&mut self, key: &str) {
        let v = values(self.frame, key);
        if !v.is_empty() {
            self.errs.push(format!(
                "{key}: present ({v:?}) but our opcode has no such header"
            ));
        }
    }
}

fn check_frame(frame: &Value, case: &Case, packet: &[u8]) -> Vec<String> {
    let mut c = Checker {
        frame,
        errs: problems(frame),
    };
    let protocols = values(frame, "frame.protocols").join(" ");
    if !protocols.contains("infiniband") {
        c.errs
            .push(format!("not dissected as InfiniBand: {protocols}"));
        return c.errs;
    }
    let t = &case.transport;
    let b = &t.bth;
    c.eq("infiniband.bth.opcode", u64::from(b.opcode.code()));
    c.eq("infiniband.bth.destqp", u64::from(b.dest_qp.value()));
    c.eq("infiniband.bth.psn", u64::from(b.psn.value()));
    c.eq("infiniband.bth.a", u64::from(b.ack_req));
    c.eq("infiniband.bth.se", u64::from(b.solicited));
    c.eq("infiniband.bth.m", u64::from(b.mig_req));
    c.eq("infiniband.bth.padcnt", u64::from(case.pad()));
    c.eq("infiniband.bth.tver", 0);
    c.eq("infiniband.bth.p_key", u64::from(b.pkey));
    let icrc_bytes = &packet[packet.len() - 4..];
    if b.opcode == wire::Opcode::Cnp {
        // Wireshark 4.0 does not know the CNP opcode: it shows the BTH (BECN in the reserved
        // byte) and the rest, 16 reserved bytes and the ICRC, as vendor-specific data.
        if !values(frame, "infiniband.reserved")
            .iter()
            .any(|r| r == "40")
        {
            c.errs
                .push("CNP: BECN not set in the BTH reserved byte".to_owned());
        }
        let mut rest = vec![0u8; wire::CNP_RESERVED_LEN];
        rest.extend_from_slice(icrc_bytes);
        let want: String = rest.iter().map(|b| format!("{b:02x}")).collect();
        let vendor = values(frame, "infiniband.vendor");
        if !vendor.iter().any(|v| v.replace(':', "") == want) {
            c.errs.push(format!(
                "CNP: tshark shows {vendor:?} after the BTH, we emitted {want}"
            ));
        }
        return c.errs;
    }
    c.eq(
        "infiniband.invariant.crc",
        u64::from(u32::from_be_bytes([
            icrc_bytes[0],
            icrc_bytes[1],
            icrc_bytes[2],
            icrc_bytes[3],
        ])),
    );

    match &t.reth {
        Some(r) => {
            c.eq("infiniband.reth.dmalen", u64::from(r.dma_len));
            // The AtomicETH reuses the RETH's va / r_key field names, so check them per header.
            let reth = values(frame, "infiniband.reth_tree");
            if reth.len() != 1 {
                c.errs
                    .push(format!("expected one RETH, tshark gave {}", reth.len()));
            }
            c.eq("infiniband.reth.va", r.va);
            c.eq("infiniband.reth.r_key", u64::from(r.rkey.value()));
        }
        None => c.absent("infiniband.reth"),
    }
    match &t.atomic_eth {
        Some(a) => {
            c.eq("infiniband.reth.va", a.va);
            c.eq("infiniband.reth.r_key", u64::from(a.rkey.value()));
            c.eq("infiniband.atomiceth.swapdt", a.swap_add);
            c.eq("infiniband.atomiceth.cmpdt", a.compare);
        }
        None => c.absent("infiniband.atomiceth"),
    }
    match &t.aeth {
        Some(a) => {
            c.eq("infiniband.aeth.syndrome", u64::from(a.syndrome.to_u8()));
            c.eq("infiniband.aeth.msn", u64::from(a.msn.value()));
        }
        None => c.absent("infiniband.aeth"),
    }
    match &t.atomic_ack_eth {
        Some(a) => c.eq("infiniband.atomicacketh.origremdt", a.orig),
        None => c.absent("infiniband.atomicacketh"),
    }
    match &t.deth {
        Some(d) => {
            c.eq("infiniband.deth.q_key", u64::from(d.qkey.value()));
            c.eq("infiniband.deth.srcqp", u64::from(d.src_qp.value()));
        }
        None => c.absent("infiniband.deth"),
    }
    match t.immdt {
        Some(imm) => c.eq_bytes("infiniband.immdt", u64::from(imm)),
        None => c.absent("infiniband.immdt"),
    }
    match t.ieth {
        Some(rkey) => c.eq_bytes("infiniband.ieth", u64::from(rkey.value())),
        None => c.absent("infiniband.ieth"),
    }
    // tshark hands the payload (pad included) to the data dissector.
    let padded = case.payload.len() + usize::from(case.pad());
    let data_len: u64 = values(frame, "data.len")
        .iter()
        .filter_map(|s| num(s))
        .sum();
    let payload_len: u64 = values(frame, "infiniband.payload")
        .iter()
        .map(|s| s.split(':').filter(|x| !x.is_empty()).count() as u64)
        .sum();
    let seen = data_len.max(payload_len);
    if seen != padded as u64 {
        c.errs.push(format!(
            "payload: tshark shows {seen} bytes (data.len {data_len}), we emitted {padded} (incl. pad)"
        ));
    }
    c.errs
}

fn frames_of(json: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(json).expect("tshark -T json output parses");
    match v {
        Value::Array(frames) => frames,
        other => panic!("tshark -T json gave no array: {other}"),
    }
}

#[test]
fn every_opcode_decodes_in_tshark_with_our_field_values_and_no_expert_errors() {
    let cases = matrix();
    let packets: Vec<Vec<u8>> = cases.iter().map(Case::emit).collect();
    assert!(
        cases.len() > 200,
        "the matrix covers every opcode: {} cases",
        cases.len()
    );
    let pcap = tmp_path("tshark-matrix.pcap");
    write_pcap(&pcap, 101, &packets);
    let json = tshark_on(&pcap, &["-T", "json"]);
    let frames = frames_of(&json);
    assert_eq!(frames.len(), cases.len(), "tshark read every packet");
    let mut failures = Vec::new();
    for (i, ((case, packet), frame)) in cases.iter().zip(&packets).zip(&frames).enumerate() {
        for e in check_frame(frame, case, packet) {
            failures.push(format!("frame {} ({}): {e}", i + 1, case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} disagreements with tshark:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // Expert summary over the whole file, as a second opinion on the per-frame json scan.
    let expert = tshark_on(&pcap, &["-q", "-z", "expert,warn"]);
    assert!(
        !expert.contains("Warns (") && !expert.contains("Errors ("),
        "tshark -z expert reports problems:\n{expert}"
    );
}

#[test]
fn our_opcode_names_are_wiresharks() {
    let cases = matrix();
    let packets: Vec<Vec<u8>> = cases.iter().map(Case::emit).collect();
    let pcap = tmp_path("tshark-names.pcap");
    write_pcap(&pcap, 101, &packets);
    let text = tshark_on(&pcap, &["-T", "fields", "-e", "_ws.col.Info"]);
    let infos: Vec<&str> = text.lines().collect();
    assert_eq!(infos.len(), cases.len());
    for (case, info) in cases.iter().zip(infos) {
        let op = case.transport.bth.opcode;
        if op == wire::Opcode::Cnp {
            // Wireshark 4.0 predates CNP in its opcode table.
            assert!(info.starts_with("Unknown OpCode"), "{}: {info}", case.name);
            continue;
        }
        // Wireshark spells one name without a space ("UC RDMA Write FirstQP=..."), so compare
        // with spaces removed.
        let squeeze = |s: &str| s.replace(' ', "");
        assert!(
            squeeze(info).starts_with(&format!("{}QP=", squeeze(op.name()))),
            "{}: tshark's Info column is {info:?}, our name {:?}",
            case.name,
            op.name()
        );
    }
}

#[test]
fn the_expert_check_catches_a_malformed_packet() {
    // Negative control: a RoCE packet cut inside its RETH must be flagged, or the check above
    // proves nothing.
    let case = matrix()
        .into_iter()
        .find(|c| c.transport.reth.is_some())
        .expect("a case with a RETH");
    let mut packet = case.emit();
    packet.truncate(20 + 8 + 12 + 6);
    // Keep the IP and UDP lengths consistent with the cut so only the IB layer is malformed.
    let total = packet.len() as u16;
    packet[2..4].copy_from_slice(&total.to_be_bytes());
    packet[10..12].copy_from_slice(&[0, 0]);
    let sum = wire::ipv4::checksum(&packet[..20]);
    packet[10..12].copy_from_slice(&sum.to_be_bytes());
    packet[24..26].copy_from_slice(&(total - 20).to_be_bytes());
    let pcap = tmp_path("tshark-negative.pcap");
    write_pcap(&pcap, 101, &[packet]);
    let json = tshark_on(&pcap, &["-T", "json"]);
    let frames = frames_of(&json);
    assert_eq!(frames.len(), 1);
    assert!(
        !problems(&frames[0]).is_empty(),
        "a truncated RETH should be malformed or carry an expert error: {}",
        frames[0]
    );
}
