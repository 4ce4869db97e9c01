//! ICRC conformance: scapy's independent RoCE implementation computes the same ICRC as ours
//! for every packet of the matrix; flipping any bit the ICRC covers makes our check fail, and
//! changing any masked (variant) field does not (IBTA Annex A17.3.3).

mod common;

use common::{matrix, scapy_icrcs, Case};

/// The bit positions (byte index, bit mask) that the ICRC masks, for a packet starting at the
/// IP header. Everything else up to the ICRC is invariant.
fn masked_bits(packet: &[u8]) -> Vec<(usize, u8)> {
    let mut bits = Vec::new();
    let whole = |byte: usize, bits: &mut Vec<(usize, u8)>| {
        (0..8).for_each(|b| bits.push((byte, 1u8 << b)));
    };
    let (udp, bth) = if packet[0] >> 4 == 4 {
        // IPv4: TOS, TTL, header checksum.
        for byte in [1, 8, 10, 11] {
            whole(byte, &mut bits);
        }
        (20, 28)
    } else {
        // IPv6: traffic class (low nibble of byte 0, high nibble of byte 1), flow label (low
        // nibble of byte 1, bytes 2 and 3), hop limit (byte 7).
        for b in 0..4 {
            bits.push((0, 1u8 << b));
        }
        for byte in [1, 2, 3, 7] {
            whole(byte, &mut bits);
        }
        (40, 48)
    };
    // UDP checksum, BTH resv8a (FECN, BECN, resv6).
    for byte in [udp + 6, udp + 7, bth + 4] {
        whole(byte, &mut bits);
    }
    bits
}

fn icrc_accepts(packet: &[u8]) -> bool {
    matches!(wire::icrc::verify(packet), Ok(()))
}

#[test]
fn scapy_computes_the_same_icrc_as_ours_for_every_packet_of_the_matrix() {
    let cases = matrix();
    let packets: Vec<Vec<u8>> = cases.iter().map(Case::emit).collect();
    let theirs = scapy_icrcs(&packets);
    let mut failures = Vec::new();
    for ((case, packet), (icrc, how)) in cases.iter().zip(&packets).zip(&theirs) {
        let ours = &packet[packet.len() - 4..];
        if ours != icrc {
            failures.push(format!(
                "{}: ours {:02x?}, scapy ({how}) {:02x?}",
                case.name, ours, icrc
            ));
        }
        let v4 = packet[0] >> 4 == 4;
        if v4 && how != "scapy.contrib.roce" {
            failures.push(format!(
                "{}: IPv4 ICRC not from scapy's RoCE layer: {how}",
                case.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "ICRC disagreements:\n{}",
        failures.join("\n")
    );
}

#[test]
fn flipping_any_covered_bit_makes_the_icrc_check_fail() {
    let mut checked = 0usize;
    for case in matrix() {
        let packet = case.emit();
        assert!(
            icrc_accepts(&packet),
            "{}: our own packet fails its ICRC",
            case.name
        );
        let masked = masked_bits(&packet);
        for byte in 0..packet.len() {
            for bit in 0..8 {
                let mask = 1u8 << bit;
                if masked.contains(&(byte, mask)) {
                    continue;
                }
                let mut flipped = packet.clone();
                flipped[byte] ^= mask;
                assert!(
                    !icrc_accepts(&flipped),
                    "{}: flipping bit {bit} of byte {byte} (covered by the ICRC) still verifies",
                    case.name
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 100_000, "only {checked} bit flips checked");
}

#[test]
fn changing_masked_fields_keeps_the_icrc_valid() {
    for case in matrix() {
        let packet = case.emit();
        let masked = masked_bits(&packet);
        // Each masked bit alone...
        for &(byte, mask) in &masked {
            let mut p = packet.clone();
            p[byte] ^= mask;
            assert!(
                icrc_accepts(&p),
                "{}: flipping masked bit {mask:#04x} of byte {byte} broke the ICRC",
                case.name
            );
        }
        // ...and all of them at once, as a router rewriting TTL/ECN/checksums would.
        let mut p = packet.clone();
        for &(byte, mask) in &masked {
            p[byte] ^= mask;
        }
        assert!(
            icrc_accepts(&p),
            "{}: flipping every masked bit broke the ICRC",
            case.name
        );
    }
}

#[test]
fn named_variant_fields_are_masked_and_named_invariant_fields_are_not() {
    // The same facts as above, spelled out field by field for a reader.
    let v4 = matrix()
        .into_iter()
        .find(|c| c.payload.len() == 61)
        .expect("an IPv4 case");
    let p = v4.emit();
    let set = |at: usize, v: u8| {
        let mut q = p.clone();
        q[at] = v;
        q
    };
    assert!(icrc_accepts(&set(1, p[1] ^ 0xff)), "IPv4 TOS is masked");
    assert!(icrc_accepts(&set(8, 1)), "IPv4 TTL is masked");
    assert!(
        icrc_accepts(&set(10, p[10] ^ 0x5a)),
        "IPv4 header checksum is masked"
    );
    assert!(icrc_accepts(&set(26, 0x12)), "UDP checksum is masked");
    assert!(
        icrc_accepts(&set(28 + 4, 0xc0)),
        "BTH resv8a (FECN/BECN) is masked"
    );
    assert!(
        !icrc_accepts(&set(4, p[4] ^ 1)),
        "IPv4 identification is covered"
    );
    assert!(
        !icrc_accepts(&set(6, p[6] ^ 0x40)),
        "IPv4 DF flag is covered"
    );
    assert!(
        !icrc_accepts(&set(15, p[15] ^ 1)),
        "IPv4 source address is covered"
    );
    assert!(
        !icrc_accepts(&set(20, p[20] ^ 1)),
        "UDP source port is covered"
    );
    assert!(
        !icrc_accepts(&set(28 + 2, p[30] ^ 1)),
        "BTH P_Key is covered"
    );
    assert!(
        !icrc_accepts(&set(28 + 8, p[36] ^ 0x80)),
        "BTH AckReq is covered"
    );
    let last = p.len() - 5;
    assert!(
        !icrc_accepts(&set(last, p[last] ^ 1)),
        "payload and pad are covered"
    );

    let v6 = matrix()
        .into_iter()
        .find(|c| c.payload.len() == 61 && matches!(c.ip, wire::packet::IpRepr::V6(_)))
        .expect("an IPv6 case");
    let p = v6.emit();
    let set = |at: usize, v: u8| {
        let mut q = p.clone();
        q[at] = v;
        q
    };
    assert!(
        icrc_accepts(&set(1, p[1] ^ 0xff)),
        "IPv6 traffic class / flow label are masked"
    );
    assert!(icrc_accepts(&set(7, 1)), "IPv6 hop limit is masked");
    assert!(
        !icrc_accepts(&set(0, p[0] ^ 0x10)),
        "IPv6 version is covered"
    );
    assert!(!icrc_accepts(&set(6, 6)), "IPv6 next header is covered");
    assert!(
        !icrc_accepts(&set(39, p[39] ^ 1)),
        "IPv6 destination address is covered"
    );
}
