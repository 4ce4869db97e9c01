#!/usr/bin/python3
"""Independent RoCEv2 ICRC computation with scapy, for softrdma's conformance tests.

Run with Debian's /usr/bin/python3 (python3-scapy). Two modes:

  scapy_icrc.py icrc
      Reads one IP packet per line on stdin (hex, the whole packet including its 4 ICRC bytes)
      and prints one line per packet: "<icrc as 8 hex digits, wire byte order> <method>".
      IPv4 packets go through scapy's own RoCE layer (scapy.contrib.roce.BTH.compute_icrc),
      which masks the variant fields and runs zlib's CRC-32 without any code of ours.
      scapy's RoCE layer does not compute the ICRC of IPv6 packets (it warns and returns 0),
      so for IPv6 this script masks the variant fields through scapy's IPv6/UDP/BTH field
      setters (traffic class, flow label, hop limit, UDP checksum, BTH FECN/BECN/resv6) and
      runs zlib's CRC-32 over 8 bytes of 0xFF plus the masked packet, as IBTA Annex A17 says.

  scapy_icrc.py golden
      Prints the golden packets that tests/data/*.scapy.hex hold, built entirely by scapy
      (headers and ICRC), one "<name> <hex>" line each.
"""

import struct
import sys
import zlib

from scapy.all import conf  # noqa: F401  (loads the layer bindings)
from scapy.compat import raw
from scapy.contrib.roce import BTH, AETH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6, in6_chksum
from scapy.packet import Raw

conf.verb = 0


def icrc_ipv4(pkt_bytes):
    pkt = IP(pkt_bytes)
    if BTH not in pkt:
        raise SystemExit("scapy found no BTH in an IPv4 packet: %s" % pkt.summary())
    # scapy's own computation: pseudo-LRH of 0xFF bytes, IP/UDP/BTH with the variant fields
    # set to ones, zlib CRC-32, packed little-endian (the wire order of the ICRC).
    return pkt[BTH].compute_icrc(None), "scapy.contrib.roce"


def icrc_ipv6(pkt_bytes):
    pkt = IPv6(pkt_bytes)
    if BTH not in pkt:
        raise SystemExit("scapy found no BTH in an IPv6 packet: %s" % pkt.summary())
    masked = pkt.copy()
    masked.tc = 0xFF
    masked.fl = 0xFFFFF
    masked.hlim = 0xFF
    masked[UDP].chksum = 0xFFFF
    masked[BTH].fecn = 1
    masked[BTH].becn = 1
    masked[BTH].resv6 = 0x3F
    body = raw(masked)
    if len(body) != len(pkt_bytes):
        raise SystemExit("scapy rebuilt the IPv6 packet with a different length")
    crc = zlib.crc32(b"\xff" * 8 + body[:-4]) & 0xFFFFFFFF
    return struct.pack("<I", crc), "scapy-ipv6-fields+zlib"


def mode_icrc():
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        pkt_bytes = bytes.fromhex(line)
        version = pkt_bytes[0] >> 4
        if version == 4:
            icrc, how = icrc_ipv4(pkt_bytes)
        elif version == 6:
            icrc, how = icrc_ipv6(pkt_bytes)
        else:
            raise SystemExit("not an IP packet: version %d" % version)
        print(icrc.hex(), how)


def golden_packets():
    """The packets of tests/data/*.scapy.hex: every byte, ICRC included, comes from scapy."""
    # RC SEND ONLY, 5 bytes of payload and 3 bytes of pad, AckReq set, IPv4 with DF and ID 0
    # (how softrdma's sockets send).
    send = (
        IP(src="192.0.2.1", dst="192.0.2.2", id=0, flags="DF", ttl=64)
        / UDP(sport=0xC001, dport=4791, chksum=0)
        / BTH(opcode=0x04, padcount=3, dqpn=0x000123, ackreq=1, psn=0x00ABCD)
        / Raw(b"hello" + b"\x00" * 3)
    )
    # RC ACKNOWLEDGE with syndrome 0x1f (ACK, no credit count) and MSN 7, IPv4 ID 0x1234.
    ack = (
        IP(src="192.0.2.2", dst="192.0.2.1", id=0x1234, flags="DF", ttl=64, tos=0x02)
        / UDP(sport=0xC002, dport=4791, chksum=0)
        / BTH(opcode=0x11, dqpn=0x000456, psn=0x00ABCD)
        / AETH(syndrome=0x1F, msn=7)
    )
    # UD SEND ONLY with DETH (Q_Key 0x11111111, source QP 0x17), 8 bytes of payload.
    ud = (
        IP(src="192.0.2.3", dst="192.0.2.4", id=0, flags="DF", ttl=64)
        / UDP(sport=0xC003, dport=4791, chksum=0)
        / BTH(opcode=0x64, dqpn=0x000016, psn=0x000001, ackreq=0)
        / Raw(bytes.fromhex("1111111100000017") + b"RoCEv2!\x00")
    )
    return [("rc_send_only_pad3_v4", send), ("rc_ack_v4", ack), ("ud_send_only_v4", ud)]


def golden_ipv6():
    """RC SEND ONLY over IPv6 with non-zero traffic class, flow label and hop limit: headers
    built by scapy, ICRC from icrc_ipv6 (scapy's RoCE layer has no IPv6 ICRC), then the UDP
    checksum computed by scapy's in6_chksum over the final datagram (RFC 8200 forbids a zero
    UDP checksum over IPv6; the ICRC masks the field, so the order does not matter)."""
    pkt = (
        IPv6(src="2001:db8::1", dst="2001:db8::2", tc=0x12, fl=0x12345, hlim=9)
        / UDP(sport=5, dport=4791, chksum=0)
        / BTH(opcode=0x04, dqpn=1, psn=2, icrc=0)  # placeholder, replaced below
        / Raw(b"abcd")
    )
    body = raw(pkt)
    icrc, _ = icrc_ipv6(body)
    final = bytearray(body[:-4] + icrc)
    udp = bytes(final[40:])
    csum = in6_chksum(17, IPv6(bytes(final)), udp)
    if csum == 0:
        csum = 0xFFFF
    final[46:48] = struct.pack("!H", csum)
    return bytes(final)


def mode_golden():
    for name, pkt in golden_packets():
        print(name, raw(pkt).hex())
    print("rc_send_only_v6", golden_ipv6().hex())


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "icrc"
    if mode == "icrc":
        mode_icrc()
    elif mode == "golden":
        mode_golden()
    else:
        raise SystemExit("usage: scapy_icrc.py icrc|golden")


if __name__ == "__main__":
    main()
