//! ICRC and header parse/emit cost at 64 B, 1 KiB and 4 KiB payloads, with plain CRC-32
//! (crc32fast over the same bytes) as the baseline, and the cost of recovering an IPv4 ID a
//! UDP socket hid (alone, and in the recovering checked parse), and of sealing the 64 IPv4
//! IDs of a GSO train's segments (two multiplications each, or the table a train keeps).
//! After the criterion runs, prints the throughput ratio ICRC / CRC-32 per size (target:
//! >= 0.8).
//!
//! `cargo bench -p softrdma-wire -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use wire::*;

const SIZES: [usize; 3] = [64, 1024, 4096];

/// An RDMA WRITE ONLY over IPv4 (the common data-path shape: RETH + payload).
fn layout(payload_len: usize) -> (IpRepr, TransportRepr) {
    let ip = IpRepr::V4(Ipv4Repr {
        src: "10.50.0.11".parse().unwrap(),
        dst: "10.50.0.12".parse().unwrap(),
        tos: 0,
        ident: 0,
        dont_frag: true,
        ttl: 64,
        payload_len: 0,
    });
    let mut t = TransportRepr::new(BthRepr::new(
        Opcode::RcRdmaWriteOnly,
        Qpn::new(0x11),
        Psn::new(1),
    ));
    t.reth = Some(RethRepr {
        va: 0x7f00_0000_1000,
        rkey: Rkey(0x1234),
        dma_len: payload_len as u32,
    });
    (ip, t)
}

fn packet(payload_len: usize) -> Vec<u8> {
    let (ip, t) = layout(payload_len);
    let payload: Vec<u8> = (0..payload_len).map(|i| (i * 31) as u8).collect();
    let mut buf = vec![0u8; 8192];
    let n = emit_packet(&ip, 0xc121, ROCEV2_UDP_PORT, &t, &payload, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn benches(c: &mut Criterion) {
    for &size in &SIZES {
        let pkt = packet(size);
        let body = &pkt[..pkt.len() - ICRC_LEN];
        let mut g = c.benchmark_group(format!("payload_{size}"));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(BenchmarkId::new("crc32_baseline", size), |b| {
            b.iter(|| crc32fast::hash(black_box(body)))
        });
        g.bench_function(BenchmarkId::new("icrc", size), |b| {
            b.iter(|| icrc::compute(black_box(body)))
        });
        g.bench_function(BenchmarkId::new("parse_headers", size), |b| {
            b.iter(|| {
                let bytes = black_box(&pkt[..]);
                let ip = IpRepr::parse(bytes).unwrap();
                let l = ip.header_len();
                let udp = UdpRepr::parse(&Udp::new_checked(&bytes[l..]).unwrap()).unwrap();
                let t = TransportPacket::parse(&bytes[l + UDP_HEADER_LEN..]).unwrap();
                (ip, udp, t.transport)
            })
        });
        g.bench_function(BenchmarkId::new("parse_checked", size), |b| {
            b.iter(|| {
                RoceV2Packet::parse_checked(black_box(&pkt[..]))
                    .unwrap()
                    .transport
            })
        });
        // The packet as sent with ID 0x4d2 and seen by a UDP socket's receiver with ID 0: the
        // check fails, and the ID is recovered from the CRC it computed.
        let mut hidden = pkt.clone();
        let n = hidden.len();
        Ipv4::new_unchecked(&mut hidden[..]).set_ident(0x4d2);
        let carried = icrc::compute(&hidden[..n - ICRC_LEN]).unwrap();
        hidden[n - ICRC_LEN..].copy_from_slice(&icrc::icrc_bytes(carried));
        let mut h = Ipv4::new_unchecked(&mut hidden[..]);
        h.set_ident(0);
        h.fill_checksum();
        let computed = icrc::compute(&hidden[..n - ICRC_LEN]).unwrap();
        assert_eq!(
            icrc::ipv4_ident_for_icrc(0, n, computed, carried),
            Some(0x4d2)
        );
        g.bench_function(BenchmarkId::new("ipv4_ident_for_icrc", size), |b| {
            b.iter(|| icrc::ipv4_ident_for_icrc(0, black_box(n), black_box(computed), carried))
        });
        g.bench_function(
            BenchmarkId::new("parse_checked_recovering_ipv4_ident", size),
            |b| {
                b.iter(|| {
                    RoceV2Packet::parse_checked_recovering_ipv4_ident(black_box(&hidden[..]))
                        .unwrap()
                        .1
                })
            },
        );
        // Sealing a 64-segment GSO train for IDs 0..64: each segment's ICRC moved by the
        // two multiplications, and by the table a train keeps (one per train, as `Tx` does).
        g.bench_function(BenchmarkId::new("train_idents_multiplied", size), |b| {
            b.iter(|| {
                (0..64u16).fold(0, |acc, k| {
                    acc ^ icrc::icrc_for_ipv4_ident(black_box(carried), n, 0, k).unwrap()
                })
            })
        });
        g.bench_function(BenchmarkId::new("train_idents_by_table", size), |b| {
            b.iter(|| {
                let mut deltas = icrc::IdentDeltas::new();
                (0..64u16).fold(0, |acc, k| {
                    acc ^ deltas.icrc_for(black_box(carried), n, 0, k).unwrap()
                })
            })
        });
        let (ip, t) = layout(size);
        let mut out = vec![0u8; pkt.len()];
        let l = PacketLayout::new(&ip, 0xc121, ROCEV2_UDP_PORT, &t, size).unwrap();
        g.bench_function(BenchmarkId::new("emit_headers", size), |b| {
            b.iter(|| l.emit_headers(black_box(&mut out[..])).unwrap())
        });
        let payload = pkt[l.payload_range()].to_vec();
        g.bench_function(BenchmarkId::new("emit_packet", size), |b| {
            b.iter(|| {
                emit_packet(
                    &ip,
                    0xc121,
                    ROCEV2_UDP_PORT,
                    black_box(&t),
                    black_box(&payload),
                    &mut out[..],
                )
                .unwrap()
            })
        });
        g.finish();
    }
}

/// Best-of-N bytes per second of `f` over `bytes` bytes per call.
fn throughput(bytes: usize, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..7 {
        let iters = 20_000;
        let t0 = Instant::now();
        for _ in 0..iters {
            f();
        }
        let per = t0.elapsed().as_secs_f64() / iters as f64;
        best = best.min(per);
    }
    bytes as f64 / best
}

fn print_ratios() {
    println!();
    println!("ICRC vs plain CRC-32 over the same bytes (IPv4 RDMA WRITE ONLY packet, best of 7):");
    println!(
        "{:>8} {:>8} {:>14} {:>14} {:>8}",
        "payload", "bytes", "CRC-32 GB/s", "ICRC GB/s", "ratio"
    );
    for &size in &SIZES {
        let pkt = packet(size);
        let body = &pkt[..pkt.len() - ICRC_LEN];
        let crc = throughput(body.len(), || {
            black_box(crc32fast::hash(black_box(body)));
        });
        let icrc = throughput(body.len(), || {
            black_box(icrc::compute(black_box(body)).unwrap());
        });
        println!(
            "{:>8} {:>8} {:>14.2} {:>14.2} {:>8.3}",
            size,
            body.len(),
            crc / 1e9,
            icrc / 1e9,
            icrc / crc
        );
    }
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .configure_from_args();
    benches(&mut c);
    c.final_summary();
    print_ratios();
}
