//! The device tools over real UDP on loopback: devinfo, pingpong as two processes, every
//! benchmark, the demo, captures (flag and environment variable) read by tshark and decode,
//! and bad input. Each test has its own addresses and ports, so they run in parallel.
//! No test asserts a timing.
//!
//! These are embedded devices whether or not a softrdmad runs on the host: every device
//! names its UDP port (`--udp-port`), which a daemon serving the address on another port
//! cannot give, so the tools open embedded ones (the backend rule; `backend_choice.rs`
//! tests the tools on a daemon).

mod tools;

use std::time::Duration;

use tools::{assert_tshark_clean, decode, decode_counts, run, run_ok, scratch, softrdma, Proc};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn devinfo_prints_the_ibv_devinfo_fields_of_a_device() {
    let out = run_ok(
        &[
            "devinfo",
            "--addr",
            "127.0.3.1",
            "--udp-port",
            "28101",
            "-v",
        ],
        LIMIT,
    );
    for key in [
        "hca_id:",
        "transport:\t\t\tInfiniBand (0)",
        "phys_port_cnt:\t\t\t1",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:",
        "127.0.3.1",
    ] {
        assert!(out.contains(key), "{key:?} missing from devinfo:\n{out}");
    }
}

#[test]
fn pingpong_between_two_processes_prints_the_ibv_rc_pingpong_summary() {
    let server = Proc::spawn(
        "pingpong server",
        softrdma(&[
            "pingpong",
            "-p",
            "27102",
            "-B",
            "127.0.3.2",
            "--udp-port",
            "28102",
            "-s",
            "1000",
            "-n",
            "200",
            "--chk",
        ]),
    );
    let client = Proc::spawn(
        "pingpong client",
        softrdma(&[
            "pingpong",
            "127.0.3.2",
            "-p",
            "27102",
            "-B",
            "127.0.3.3",
            "--udp-port",
            "28102",
            "-s",
            "1000",
            "-n",
            "200",
            "--chk",
        ]),
    );
    let c = client.success(LIMIT);
    let s = server.success(LIMIT);
    for out in [&c, &s] {
        assert!(out.contains("local address:"), "{out}");
        assert!(out.contains("remote address:"), "{out}");
        assert!(
            out.contains("400000 bytes in ") && out.contains(" Mbit/sec"),
            "byte summary missing:\n{out}"
        );
        assert!(
            out.contains("200 iters in ") && out.contains(" usec/iter"),
            "iteration summary missing:\n{out}"
        );
    }
}

#[test]
fn pingpong_mode_options_that_cannot_work_fail_with_a_clear_message() {
    // A UD message is one packet; an SRQ needs a receive per QP at least. Both are caught
    // before any peer is awaited.
    for (args, want) in [
        (
            vec!["pingpong", "--mode", "ud", "-s", "5000", "-p", "27103"],
            "larger than the MTU",
        ),
        (
            vec![
                "pingpong", "--mode", "ud", "-s", "2000", "-m", "1024", "-p", "27103",
            ],
            "larger than the MTU (1024)",
        ),
        (
            vec![
                "pingpong", "--mode", "srq", "-r", "4", "-q", "8", "-p", "27103",
            ],
            "rx-depth (4) must be at least num-qp (8)",
        ),
    ] {
        let out = run(&args, LIMIT);
        assert_eq!(out.status.code(), Some(1), "{args:?} must fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn write_bw_between_two_processes_prints_the_perftest_table() {
    let server = Proc::spawn(
        "write_bw server",
        softrdma(&[
            "write_bw",
            "-p",
            "27104",
            "-B",
            "127.0.3.4",
            "--udp-port",
            "28104",
        ]),
    );
    let out = Proc::spawn(
        "write_bw client",
        softrdma(&[
            "write_bw",
            "127.0.3.4",
            "-p",
            "27104",
            "-B",
            "127.0.3.5",
            "--udp-port",
            "28104",
            "-s",
            "16384",
            "-n",
            "200",
        ]),
    )
    .success(LIMIT);
    server.success(LIMIT);
    assert!(
        out.contains(
            " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
        ),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("16384 "))
        .unwrap_or_else(|| panic!("no 16384-byte row:\n{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "200", "iterations column: {row}");
    assert!(cols[3].parse::<f64>().unwrap() > 0.0, "average BW: {row}");
}

#[test]
fn write_bw_over_four_qps_spreads_the_messages_and_reports_them_all() {
    let server = Proc::spawn(
        "write_bw -q 4 server",
        softrdma(&[
            "write_bw",
            "-p",
            "27140",
            "-B",
            "127.0.3.20",
            "--udp-port",
            "28140",
        ]),
    );
    let out = Proc::spawn(
        "write_bw -q 4 client",
        softrdma(&[
            "write_bw",
            "127.0.3.20",
            "-p",
            "27140",
            "-B",
            "127.0.3.21",
            "--udp-port",
            "28140",
            "-q",
            "4",
            "-s",
            "16384",
            // Not a multiple of 4: one QP carries a message more than the others.
            "-n",
            "201",
        ]),
    )
    .success(LIMIT);
    let server_out = server.success(LIMIT);
    for o in [&out, &server_out] {
        assert!(o.contains(" Number of qps   : 4\t"), "{o}");
        // Each side's QPs, each connected to one of the other side's.
        assert_eq!(o.matches(" local address: ").count(), 4, "{o}");
        assert_eq!(o.matches(" remote address: ").count(), 4, "{o}");
        assert!(o.contains(" CPU per message : "), "{o}");
    }
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("16384 "))
        .unwrap_or_else(|| panic!("no 16384-byte row:\n{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "201", "iterations column (all QPs): {row}");
    assert!(cols[3].parse::<f64>().unwrap() > 0.0, "average BW: {row}");
    assert!(cols[4].parse::<f64>().unwrap() > 0.0, "message rate: {row}");
    let cpu = out
        .lines()
        .find_map(|l| l.strip_prefix(" CPU per message : "))
        .unwrap_or_else(|| panic!("no CPU line:\n{out}"));
    assert!(cpu.contains("for 201 messages"), "{cpu}");
}

#[test]
fn zero_qps_is_refused_before_anything_starts() {
    let out = run(&["write_bw", "--loopback", "-p", "0", "-q", "0"], LIMIT);
    assert!(!out.status.success(), "-q 0 must fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value '0' for '--qp <N>'") && err.contains("1..=16384"),
        "{err}"
    );
    // Latency tests run one QP, as perftest's do.
    let out = run(&["write_lat", "--loopback", "-p", "0", "-q", "2"], LIMIT);
    assert_eq!(
        out.status.code(),
        Some(1),
        "-q 2 on a latency test must fail"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("-q is for bandwidth tests"), "{err}");
}

#[test]
fn every_benchmark_runs_in_loopback_mode() {
    for (i, test) in [
        "write_bw",
        "read_bw",
        "send_bw",
        "atomic_bw",
        "write_lat",
        "read_lat",
        "send_lat",
        "atomic_lat",
    ]
    .into_iter()
    .enumerate()
    {
        let udp = (28110 + i).to_string();
        let out = run_ok(
            &[
                test,
                "--loopback",
                "-p",
                "0",
                "--udp-port",
                &udp,
                "-n",
                "50",
                "-s",
                "64",
            ],
            LIMIT,
        );
        let header = if test.ends_with("_lat") {
            "t_typical[usec]"
        } else {
            "BW average[MB/sec]"
        };
        assert!(out.contains(header), "{test}:\n{out}");
        let size = if test.starts_with("atomic") {
            "8"
        } else {
            "64"
        };
        let row = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(size))
            .unwrap_or_else(|| panic!("{test}: no row for {size} bytes:\n{out}"));
        assert_eq!(row.split_whitespace().nth(1), Some("50"), "{test}: {row}");
    }
}

#[test]
fn baseline_prints_raw_socket_figures_and_ratios_under_the_tables() {
    let bw = run_ok(
        &[
            "send_bw",
            "--loopback",
            "-p",
            "0",
            "--udp-port",
            "28120",
            "-n",
            "100",
            "-s",
            "8192",
            "--baseline",
            "--report_gbits",
        ],
        LIMIT,
    );
    assert!(bw.contains("BW average[Gb/sec]"), "{bw}");
    assert!(
        bw.contains("UDP stream[Gb/sec]")
            && bw.contains("UDP GSO[Gb/sec]")
            && bw.contains("TCP stream[Gb/sec]"),
        "{bw}"
    );
    assert!(
        bw.contains("softrdma/UDP") && bw.contains("softrdma/UDP-GSO"),
        "{bw}"
    );
    let lat = run_ok(
        &[
            "write_lat",
            "--loopback",
            "-p",
            "0",
            "--udp-port",
            "28121",
            "-n",
            "100",
            "--baseline",
        ],
        LIMIT,
    );
    assert!(lat.contains("UDP ping-pong"), "{lat}");
    // The baseline row of the 2-byte size (the last line starting with 2) carries a ratio.
    let has_ratio = |out: &str| {
        let row = out
            .lines()
            .rev()
            .find(|l| l.split_whitespace().next() == Some("2"))
            .unwrap_or_else(|| panic!("no baseline row:\n{out}"));
        assert!(row.contains('x'), "ratio missing: {row}");
    };
    has_ratio(&lat);
    assert!(lat.contains("busy-polled"), "{lat}");
    // A test that sleeps on its completion channel is set beside a ping-pong that sleeps.
    let ev = run_ok(
        &[
            "send_lat",
            "--loopback",
            "-p",
            "0",
            "--udp-port",
            "28150",
            "-n",
            "100",
            "-e",
            "--baseline",
        ],
        LIMIT,
    );
    assert!(
        ev.contains("UDP ping-pong, both ends sleeping in recv"),
        "{ev}"
    );
    has_ratio(&ev);
}

#[test]
fn all_sizes_runs_every_power_of_two() {
    let out = run_ok(
        &[
            "write_bw",
            "--loopback",
            "-p",
            "0",
            "--udp-port",
            "28122",
            "-a",
            "-n",
            "5",
        ],
        LIMIT,
    );
    for k in 1..=23 {
        let size = (1u64 << k).to_string();
        assert!(
            out.lines()
                .any(|l| l.split_whitespace().next() == Some(size.as_str())),
            "no row for {size}:\n{out}"
        );
    }
}

#[test]
fn demo_tours_the_model_and_exits_zero() {
    let out = run_ok(&["demo", "--udp-port", "28123"], LIMIT);
    for step in [
        "SEND / RECV",
        "RDMA WRITE",
        "RDMA READ",
        "fetch_add(5):          returned 100, B's word is now 105",
        "compare_swap(105 -> 7): returned 105, B's word is now 7",
        "40-byte GRH + \"a UD datagram from A\"",
        "from source QP 0x",
        "127.0.0.1 -> 127.0.0.2",
        "BW average[MB/sec]",
        "t_typical[usec]",
        "softrdma/UDP",
        "demo done",
    ] {
        assert!(out.contains(step), "{step:?} missing from the demo:\n{out}");
    }
}

#[test]
fn a_capture_of_a_benchmark_decodes_cleanly_in_tshark_and_decode() {
    let pcap = scratch("loopback-read_bw.pcap");
    let _ = std::fs::remove_file(&pcap);
    run_ok(
        &[
            "read_bw",
            "--loopback",
            "-p",
            "0",
            "--udp-port",
            "28124",
            "-n",
            "40",
            "-s",
            "10000",
            "--capture",
            pcap.to_str().unwrap(),
        ],
        LIMIT,
    );
    let packets = assert_tshark_clean(&pcap);
    let (_, summary) = decode(&pcap);
    let (total, good, bad, malformed, other) = decode_counts(&summary);
    assert_eq!(total as usize, packets);
    assert_eq!((bad, malformed, other), (0, 0, 0), "{summary}");
    assert_eq!(good, total, "{summary}");
    // 40 reads of 10000 bytes: 40 requests and 3 response packets each, at least.
    assert!(total >= 160, "{summary}");
}

#[test]
fn the_capture_environment_variable_records_any_program_using_the_api() {
    let pcap = scratch("env-pingpong.pcap");
    let _ = std::fs::remove_file(&pcap);
    let server = Proc::spawn(
        "pingpong server",
        softrdma(&[
            "pingpong",
            "-p",
            "27125",
            "-B",
            "127.0.3.6",
            "--udp-port",
            "28125",
            "-n",
            "20",
        ]),
    );
    let mut c = softrdma(&[
        "pingpong",
        "127.0.3.6",
        "-p",
        "27125",
        "-B",
        "127.0.3.7",
        "--udp-port",
        "28125",
        "-n",
        "20",
    ]);
    c.env("SOFTRDMA_CAPTURE", &pcap);
    Proc::spawn("pingpong client", c).success(LIMIT);
    server.success(LIMIT);
    let packets = assert_tshark_clean(&pcap);
    let (text, summary) = decode(&pcap);
    let (total, good, ..) = decode_counts(&summary);
    assert_eq!(total as usize, packets);
    assert_eq!(good, total, "{summary}");
    // 20 messages of 4096 bytes each way (four 1024-byte packets), seen by the client once
    // as sent or received.
    assert!(text.matches("RC Send Last").count() >= 40, "{text}");
}

#[test]
fn bad_command_lines_are_usage_errors_not_panics() {
    for args in [
        vec!["write_bw", "-s", "abc"],
        vec!["write_lat", "-n", "0"],
        vec!["read_bw", "-t", "0"],
        vec!["pingpong", "--mode", "xyz"],
        vec!["send_bw", "-s", "8", "-a"],
        vec!["devinfo", "--addr", "not-an-ip"],
        vec!["nonsense"],
    ] {
        let out = run(&args, LIMIT);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?} should be a usage error"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // Errors clap cannot see are reported, not panicked over.
    for args in [
        vec!["write_bw", "--loopback", "-p", "0", "-m", "1000"],
        vec!["write_bw", "--loopback", "-p", "0", "-s", "99999999999"],
        vec!["write_lat", "--loopback", "-p", "0", "-D", "2"],
    ] {
        let out = run(&args, LIMIT);
        assert_eq!(out.status.code(), Some(1), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with("softrdma "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// Runs `softrdma pingpong --mode MODE` as a server on `ip_s` and a client on `ip_c` (with
/// `extra` options on both and a capture on the client); checks exit codes, address lines and
/// the two ibv_*_pingpong summary lines; returns both outputs and the client's capture decoded.
fn pingpong_mode(
    mode: &str,
    tcp: &str,
    udp: &str,
    (ip_s, ip_c): (&str, &str),
    extra: &[&str],
    (bytes, iters): (u64, u64),
) -> (String, String, String) {
    let pcap = scratch(&format!("pingpong-{mode}.pcap"));
    let _ = std::fs::remove_file(&pcap);
    let mut sa = vec!["pingpong", "--mode", mode, "-p", tcp, "-B", ip_s];
    sa.extend(["--udp-port", udp]);
    sa.extend(extra);
    let server = Proc::spawn(&format!("{mode} pingpong server"), softrdma(&sa));
    let mut ca = vec!["pingpong", ip_s, "--mode", mode, "-p", tcp, "-B", ip_c];
    ca.extend(["--udp-port", udp, "--capture", pcap.to_str().unwrap()]);
    ca.extend(extra);
    let c = Proc::spawn(&format!("{mode} pingpong client"), softrdma(&ca)).success(LIMIT);
    let s = server.success(LIMIT);
    for out in [&c, &s] {
        assert!(out.contains("local address:"), "{mode}: {out}");
        assert!(out.contains("remote address:"), "{mode}: {out}");
        assert!(
            out.contains(&format!("{bytes} bytes in ")) && out.contains(" Mbit/sec"),
            "{mode}: byte summary missing:\n{out}"
        );
        assert!(
            out.contains(&format!("{iters} iters in ")) && out.contains(" usec/iter"),
            "{mode}: iteration summary missing:\n{out}"
        );
    }
    let (text, summary) = decode(&pcap);
    let (total, good, ..) = decode_counts(&summary);
    assert!(total > 0 && good == total, "{mode}: {summary}");
    (c, s, text)
}

#[test]
fn uc_pingpong_between_two_processes_sends_uc_packets_without_acks() {
    // 2000-byte messages over a 1024-byte path MTU: two packets each, checked with --chk.
    let (_, _, text) = pingpong_mode(
        "uc",
        "27130",
        "28130",
        ("127.0.3.10", "127.0.3.11"),
        &["-s", "2000", "-n", "50", "--chk"],
        (200_000, 50),
    );
    // Sent and received by the client: 50 messages each way.
    assert_eq!(text.matches("UC Send First").count(), 100, "{text}");
    assert_eq!(text.matches("UC Send Last").count(), 100, "{text}");
    assert!(
        !text.contains("RC "),
        "a UC run produced RC packets:\n{text}"
    );
    assert!(!text.contains("Acknowledge"), "UC has no ACKs:\n{text}");
}

#[test]
fn ud_pingpong_between_two_processes_sends_one_packet_per_message_with_the_qkey() {
    let (c, s, text) = pingpong_mode(
        "ud",
        "27131",
        "28131",
        ("127.0.3.12", "127.0.3.13"),
        &["-s", "1500", "-n", "40", "--chk"],
        (120_000, 40),
    );
    assert_eq!(text.matches("UD Send Only").count(), 80, "{text}");
    assert_eq!(text.matches("qkey=0x11111111").count(), 80, "{text}");
    // Each side's remote QPN is the other's local one (the AH and the src_qp check use it).
    let qpn = |out: &str, which: &str| -> String {
        let l = out.lines().find(|l| l.contains(which)).unwrap();
        l.split("QPN ").nth(1).unwrap()[..8].to_string()
    };
    assert_eq!(qpn(&c, "remote address"), qpn(&s, "local address"));
    assert_eq!(qpn(&s, "remote address"), qpn(&c, "local address"));
    // The default size fits the MTU: ibv_ud_pingpong's 2048 bytes under the 4096 port MTU.
    let pair = pingpong_mode(
        "ud",
        "27132",
        "28132",
        ("127.0.3.14", "127.0.3.15"),
        &["-n", "5"],
        (20_480, 5),
    );
    assert_eq!(pair.2.matches("payload=2048").count(), 10, "{}", pair.2);
}

#[test]
fn srq_pingpong_spreads_the_round_trips_over_qps_sharing_one_receive_queue() {
    let (c, s, text) = pingpong_mode(
        "srq",
        "27133",
        "28133",
        ("127.0.3.16", "127.0.3.17"),
        &["-q", "4", "-r", "8", "-s", "600", "-n", "60", "--chk"],
        (72_000, 60),
    );
    for out in [&c, &s] {
        assert_eq!(out.matches("local address:").count(), 4, "{out}");
        assert_eq!(out.matches("remote address:").count(), 4, "{out}");
    }
    // 60 messages each way spread over the 4 QPs: every QP carried sends.
    let qpns: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.contains("RC Send Only"))
        .filter_map(|l| l.split("qpn=").nth(1))
        .map(|q| &q[..8])
        .collect();
    assert_eq!(qpns.len(), 4, "{text}");
    assert_eq!(text.matches("RC Send Only").count(), 120, "{text}");
}
