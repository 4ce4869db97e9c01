//! Two hosts on one machine: two network namespaces joined by a veth pair, a softrdma
//! server in one and the client in the other, through the CLI; and a capture taken on the
//! wire (tcpdump on the veth, real IP headers) in which every packet's ICRC verifies, by
//! `softrdma decode` and by scapy's independent RoCE layer.
//!
//! These tests need root (`ip netns`, as CI runs); without it they FAIL saying so, never
//! pass silently. Each test makes its own namespaces (named after the test and the process)
//! and deletes them even when it fails.

mod common;
mod hosts;
mod tools;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use hosts::Hosts;
use softrdma_cli::CaptureReader;
use tools::{assert_tshark_clean, bin, decode, decode_counts, scratch, Proc};

const LIMIT: Duration = Duration::from_secs(120);

impl Hosts {
    fn softrdma_in(ns: &str, args: &[&str]) -> Command {
        Hosts::exec(ns, bin(), args)
    }

    /// Run a server in `a` and its client in `b`; both must succeed. Returns the client's
    /// stdout.
    fn server_client(&self, what: &str, server: &[&str], client: &[&str]) -> String {
        let mut sargs = server.to_vec();
        sargs.extend_from_slice(&["-B", &self.addr_a]);
        let s = Proc::spawn(
            &format!("{what} server"),
            Hosts::softrdma_in(&self.a, &sargs),
        );
        let mut cargs = client.to_vec();
        cargs.insert(1, &self.addr_a);
        let c = Proc::spawn(
            &format!("{what} client"),
            Hosts::softrdma_in(&self.b, &cargs),
        );
        let out = c.success(LIMIT);
        s.success(LIMIT);
        out
    }
}

#[test]
fn pingpong_and_benchmarks_run_between_two_network_namespaces() {
    let h = Hosts::new("pp", 1, 9000);
    let out = h.server_client(
        "pingpong",
        &["pingpong", "-s", "4096", "-n", "200", "--chk"],
        &["pingpong", "-s", "4096", "-n", "200", "--chk"],
    );
    assert!(out.contains("1638400 bytes in "), "{out}");
    assert!(out.contains("200 iters in "), "{out}");
    assert!(out.contains(&format!("GID {}", h.addr_b)), "{out}");

    // Path MTU 4096 fits the 9000-byte veth.
    let out = h.server_client(
        "write_bw",
        &["write_bw"],
        &["write_bw", "-s", "65536", "-n", "300"],
    );
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some("65536"))
        .unwrap_or_else(|| panic!("no 65536-byte row:\n{out}"));
    assert_eq!(row.split_whitespace().nth(1), Some("300"), "{row}");

    let out = h.server_client(
        "send_lat",
        &["send_lat"],
        &["send_lat", "-n", "200", "--baseline"],
    );
    assert!(
        out.contains("t_typical[usec]") && out.contains("UDP ping-pong"),
        "{out}"
    );
}

/// Whole IP packets of a capture (Ethernet frames from tcpdump, or raw IP).
fn ip_packets(pcap: &Path) -> Vec<Vec<u8>> {
    let f = std::fs::File::open(pcap).expect("open the capture");
    let mut r = CaptureReader::new(std::io::BufReader::new(f)).expect("a pcap");
    let mut v = Vec::new();
    while let Some(rec) = r.next_record() {
        let rec = rec.expect("a readable record");
        let data = match rec.linktype {
            1 => {
                assert!(rec.data.len() > 14, "short Ethernet frame");
                let ethertype = u16::from_be_bytes([rec.data[12], rec.data[13]]);
                assert!(
                    ethertype == 0x0800 || ethertype == 0x86dd,
                    "not IP: ethertype {ethertype:#06x}"
                );
                rec.data[14..].to_vec()
            }
            101 => rec.data.clone(),
            other => panic!("unexpected link type {other}"),
        };
        v.push(data);
    }
    v
}

#[test]
fn a_wire_capture_between_namespaces_verifies_every_icrc_in_decode_and_scapy() {
    // A 1500-byte veth, as Ethernet usually is: the benchmark uses path MTU 1024.
    let h = Hosts::new("wc", 2, 1500);
    // A veth carries a GSO train uncut, as one frame; a NIC without UDP segmentation offload
    // gets it cut by the kernel, which numbers the segments' IPv4 IDs. Make both ends such
    // NICs, so that the capture holds the datagrams as a wire would and proves that every
    // segment's ICRC holds for the ID the kernel gave it.
    for (ns, dev) in [(&h.a, &h.va), (&h.b, &h.vb)] {
        let out = Hosts::exec(ns, "ethtool", &["-K", dev, "tx-udp-segmentation", "off"])
            .output()
            .expect("run ethtool (apt-get install -y ethtool)");
        assert!(out.status.success(), "ethtool on {dev} in {ns}: {out:?}");
    }
    let pcap = scratch(&format!("wire-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    let pcap_s = pcap.to_str().expect("utf-8 path").to_string();
    let tcpdump = Proc::spawn(
        "tcpdump",
        Hosts::exec(
            &h.a,
            "tcpdump",
            &[
                // Immediate delivery, and a ring of many packet-sized slots: with -s 0 the
                // slots are 256 KiB and a burst overflows the ring.
                "--immediate-mode",
                "-B",
                "65536",
                "-s",
                "9100",
                "-U",
                "-i",
                &h.va,
                "-w",
                &pcap_s,
                "udp",
                "port",
                "4791",
            ],
        ),
    );
    // tcpdump writes the file header once it listens.
    let t0 = Instant::now();
    while std::fs::metadata(&pcap).map_or(0, |m| m.len()) < 24 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "tcpdump did not start (apt-get install -y tcpdump)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    // 4999 bytes: 4 full 1024-byte packets and one of 903 bytes with a pad of 1.
    h.server_client(
        "write_bw",
        &["write_bw"],
        &["write_bw", "-s", "4999", "-n", "100", "-m", "1024"],
    );
    h.server_client(
        "read_lat",
        &["read_lat"],
        &["read_lat", "-s", "3000", "-n", "20", "-m", "1024"],
    );
    h.server_client(
        "atomic_bw",
        &["atomic_bw"],
        &["atomic_bw", "-n", "50", "-m", "1024"],
    );
    // Without -m the path MTU is the link's: the header says so, and the baseline's
    // datagrams are as large as these packets (12 + 16 + 1024 + 4 bytes), not 4 KiB ones
    // the link would fragment.
    let out = h.server_client(
        "write_bw",
        &["write_bw"],
        &["write_bw", "-s", "65536", "-n", "20", "--baseline"],
    );
    assert!(out.contains("Mtu             : 1024[B]"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().take(2).eq(["65536", "1056"])),
        "{out}"
    );
    std::thread::sleep(Duration::from_millis(300));
    let status = Command::new("kill")
        .args(["-INT", &tcpdump.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "could not stop tcpdump");
    let out = tcpdump.wait(LIMIT);
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        report
            .lines()
            .any(|l| l.trim() == "0 packets dropped by kernel"),
        "tcpdump lost packets: {report}"
    );

    let packets = ip_packets(&pcap);
    // Writes (5 packets each), ACKs, reads and their responses, atomics and their ACKs.
    assert!(
        packets.len() > 600,
        "only {} packets captured",
        packets.len()
    );
    let mut cut = 0;
    for p in &packets {
        assert_eq!(p[0] >> 4, 4, "IPv4 expected");
        assert!(
            p.len() <= 1500,
            "a frame above the link MTU: {} bytes",
            p.len()
        );
        let id = u16::from_be_bytes([p[4], p[5]]);
        let df = p[6] & 0x40 != 0;
        assert!(df, "softrdma sends IPv4 with DF");
        // ID 0 alone, k for the k-th segment of a train.
        if id != 0 {
            cut += 1;
        }
    }
    assert!(cut > 0, "no packet came from a train the kernel cut");

    let (_, summary) = decode(&pcap);
    let (total, good, bad, malformed, other) = decode_counts(&summary);
    assert_eq!(total as usize, packets.len());
    assert_eq!((bad, malformed, other), (0, 0, 0), "{summary}");
    assert_eq!(good, total, "{summary}");

    let scapy = common::scapy_icrcs(&packets);
    for (i, (p, (icrc, how))) in packets.iter().zip(&scapy).enumerate() {
        assert_eq!(
            &p[p.len() - 4..],
            icrc,
            "packet {}: scapy ({how}) computes another ICRC",
            i + 1
        );
    }
    assert_tshark_clean(&pcap);
    let _ = std::fs::remove_file(&pcap);
}
