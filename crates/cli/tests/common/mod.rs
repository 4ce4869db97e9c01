//! Helpers shared by the conformance suites: the packet matrix, pcap writing, and the external
//! tools (tshark, scapy). A missing tool is a test FAILURE with the command that installs it,
//! never a skip: these checks are the point of the suite.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use wire::packet::{emit_packet, IpRepr, TransportRepr};
use wire::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, DethRepr, Ipv4Repr, Ipv6Repr, Msn, NakCode,
    OpKind, Opcode, Psn, Qkey, Qpn, RethRepr, Rkey, Syndrome,
};

/// Debian's python, where python3-scapy installs.
pub const PYTHON: &str = "/usr/bin/python3";

/// The crate directory.
pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `shared/testdata`, which sits beside the repository.
pub fn testdata_dir() -> PathBuf {
    crate_dir().join("../../../shared/testdata")
}

/// A scratch path for this test run.
pub fn tmp_path(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("softrdma-cli-conformance");
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    dir.join(name)
}

/// Fails the test when tshark is missing.
pub fn require_tshark() {
    let ok = Command::new("tshark")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "tshark is required for this conformance test: apt-get install -y tshark"
    );
}

/// Fails the test when /usr/bin/python3 cannot import scapy's RoCE layer.
pub fn require_scapy() {
    let ok = Command::new(PYTHON)
        .args(["-c", "import scapy.contrib.roce"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{PYTHON} with scapy is required for this conformance test: apt-get install -y python3-scapy"
    );
}

/// Writes `packets` as a classic little-endian µs pcap with the given link type.
pub fn write_pcap(path: &Path, linktype: u32, packets: &[Vec<u8>]) {
    let mut out = Vec::new();
    out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&4u16.to_le_bytes());
    out.extend_from_slice(&0i32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&65_535u32.to_le_bytes());
    out.extend_from_slice(&linktype.to_le_bytes());
    for (i, p) in packets.iter().enumerate() {
        let len = u32::try_from(p.len()).expect("test packets are small");
        out.extend_from_slice(&1_700_000_000u32.to_le_bytes());
        out.extend_from_slice(&u32::try_from(i).expect("few packets").to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(p);
    }
    std::fs::write(path, out).expect("write the pcap");
}

/// Parses a hex dump, ignoring whitespace and `#` comment lines.
pub fn parse_hex(text: &str) -> Vec<u8> {
    let digits: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.chars())
        .filter(|c| !c.is_whitespace())
        .collect();
    assert!(digits.len().is_multiple_of(2), "odd number of hex digits");
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex digit"))
        .collect()
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One packet of the conformance matrix.
#[derive(Debug, Clone)]
pub struct Case {
    /// A readable name, e.g. "RC Send Only/v6/payload 7".
    pub name: String,
    /// IP header.
    pub ip: IpRepr,
    /// UDP source port.
    pub src_port: u16,
    /// Transport headers.
    pub transport: TransportRepr,
    /// Payload (without pad).
    pub payload: Vec<u8>,
}

impl Case {
    /// The pad count the emitted packet must carry.
    pub fn pad(&self) -> u8 {
        ((4 - self.payload.len() % 4) % 4) as u8
    }

    /// Emits the packet with our codec.
    pub fn emit(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        let n = emit_packet(
            &self.ip,
            self.src_port,
            wire::ROCEV2_UDP_PORT,
            &self.transport,
            &self.payload,
            &mut buf,
        )
        .unwrap_or_else(|e| panic!("{}: emit failed: {e}", self.name));
        buf.truncate(n);
        buf
    }
}

/// The syndromes the ACK cases cycle through: every kind and every NAK code.
pub fn syndromes() -> Vec<Syndrome> {
    vec![
        Syndrome::ACK_NO_CREDIT,
        Syndrome::Ack { credits: 5 },
        Syndrome::RnrNak { timer: 14 },
        Syndrome::Nak(NakCode::PsnSequenceError),
        Syndrome::Nak(NakCode::InvalidRequest),
        Syndrome::Nak(NakCode::RemoteAccessError),
        Syndrome::Nak(NakCode::RemoteOperationalError),
        Syndrome::Nak(NakCode::InvalidRdRequest),
    ]
}

/// Transport headers for `op` with distinctive values derived from `i`.
pub fn transport_for(op: Opcode, i: u32) -> TransportRepr {
    let ext = op.ext();
    let mut bth = BthRepr::new(
        op,
        Qpn::new(0x01_0000 + i * 3),
        Psn::new(0x80_0000 + i * 7919),
    );
    bth.ack_req = i % 2 == 1;
    bth.solicited =
        op.kind() == OpKind::Send && (op.is_last() || op.is_only()) && i.is_multiple_of(3);
    bth.mig_req = i.is_multiple_of(5);
    if op == Opcode::Cnp {
        bth.becn = true;
    }
    let sy = syndromes();
    TransportRepr {
        bth,
        reth: ext.reth.then(|| RethRepr {
            va: 0x1122_3344_5566_7788 ^ u64::from(i),
            rkey: Rkey::new(0xdead_0000 | i),
            dma_len: 4096 + i,
        }),
        aeth: ext.aeth.then(|| AethRepr {
            syndrome: sy[i as usize % sy.len()],
            msn: Msn::new(0x00ab_0000 + i),
        }),
        deth: ext.deth.then(|| DethRepr {
            qkey: Qkey::new(0x1111_0000 | i),
            src_qp: Qpn::new(0x17 + i),
        }),
        immdt: ext.immdt.then_some(0xc0ff_ee00 | i),
        ieth: ext.ieth.then(|| Rkey::new(0xbeef_0000 | i)),
        atomic_eth: ext.atomic_eth.then(|| AtomicEthRepr {
            va: 0x0000_7f00_0000_1000 + u64::from(i) * 8,
            rkey: Rkey::new(0xa70c_0000_u32 | i),
            swap_add: 0x0102_0304_0506_0708 + u64::from(i),
            compare: 0x1112_1314_1516_1718 + u64::from(i),
        }),
        atomic_ack_eth: ext.atomic_ack_eth.then(|| AtomicAckEthRepr {
            orig: 0x2122_2324_2526_2728 + u64::from(i),
        }),
    }
}

/// The IP header for case `i`, IPv4 or IPv6, with non-trivial values in the masked fields.
pub fn ip_for(v6: bool, i: u32) -> IpRepr {
    if v6 {
        IpRepr::V6(Ipv6Repr {
            src: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1 + (i as u16 & 0xff)),
            dst: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 1, 2),
            traffic_class: (i as u8).wrapping_mul(13),
            flow_label: (i * 4099) & 0xf_ffff,
            hop_limit: 64,
            payload_len: 0,
        })
    } else {
        IpRepr::V4(Ipv4Repr {
            src: Ipv4Addr::new(192, 0, 2, 1 + (i as u8 & 0x7f)),
            dst: Ipv4Addr::new(198, 51, 100, 2),
            tos: (i as u8).wrapping_mul(4),
            ident: (i as u16).wrapping_mul(257),
            dont_frag: true,
            ttl: 64,
            payload_len: 0,
        })
    }
}

/// Payload of `len` bytes, different for each case.
pub fn payload_for(len: usize, i: u32) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u32 * 31 + i * 7 + 1) as u8)
        .collect()
}

/// Every opcode × {IPv4, IPv6} × {no payload, payload with pad 0, 1, 2, 3}; opcodes without
/// payload only get the no-payload packet.
pub fn matrix() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut i = 0u32;
    for &op in Opcode::ALL {
        for v6 in [false, true] {
            let lens: &[usize] = if op.has_payload() {
                &[0, 64, 63, 62, 61]
            } else {
                &[0]
            };
            for &len in lens {
                i += 1;
                let mut transport = transport_for(op, i);
                transport.bth.pad_count = ((4 - len % 4) % 4) as u8;
                cases.push(Case {
                    name: format!(
                        "{}/{}/payload {len}",
                        op.name(),
                        if v6 { "v6" } else { "v4" }
                    ),
                    ip: ip_for(v6, i),
                    src_port: 0xc000 | (i as u16 & 0x3fff),
                    transport,
                    payload: payload_for(len, i),
                });
            }
        }
    }
    cases
}

/// Runs scapy_icrc.py over `packets`: the ICRC bytes (wire order) scapy computes for each, and
/// how it computed them.
pub fn scapy_icrcs(packets: &[Vec<u8>]) -> Vec<([u8; 4], String)> {
    require_scapy();
    let script = crate_dir().join("tests/scapy_icrc.py");
    let mut child = Command::new(PYTHON)
        .arg(&script)
        .arg("icrc")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start scapy_icrc.py");
    {
        let mut stdin = child.stdin.take().expect("piped stdin");
        let mut text = String::new();
        for p in packets {
            text.push_str(&to_hex(p));
            text.push('\n');
        }
        stdin
            .write_all(text.as_bytes())
            .expect("feed scapy_icrc.py");
    }
    let out = child.wait_with_output().expect("run scapy_icrc.py");
    assert!(
        out.status.success(),
        "scapy_icrc.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).expect("utf-8 from scapy_icrc.py");
    let res: Vec<([u8; 4], String)> = stdout
        .lines()
        .map(|l| {
            let (hex, how) = l.split_once(' ').expect("'<icrc> <method>' lines");
            let b = parse_hex(hex);
            ([b[0], b[1], b[2], b[3]], how.to_owned())
        })
        .collect();
    assert_eq!(res.len(), packets.len(), "one ICRC per packet from scapy");
    res
}

/// Runs tshark with `args` and returns its stdout; fails the test on any error.
pub fn tshark(args: &[&str]) -> String {
    require_tshark();
    let out = Command::new("tshark")
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("tshark prints UTF-8")
}
