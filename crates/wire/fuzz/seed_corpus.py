"""Write one seed file per distinct RoCE packet shape found in the pcaps of a directory
into corpus/<target>/ for every fuzz target (classic pcap, Ethernet, IPv4/IPv6); the
recover_ipv4_ident target also gets each IPv4 packet with its ID hidden (0, as a receiver
behind a UDP socket rebuilds the header); the cm_mad target gets the 256-byte MAD of one
IPv4 packet to QP1 per CM attribute."""
import glob
import os
import struct
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "../../../../shared/testdata"
n = 0
for path in sorted(glob.glob(os.path.join(src, "*.pcap"))):
    data = open(path, "rb").read()
    at, seen, mads = 24, set(), set()
    while at + 16 <= len(data):
        incl = struct.unpack("<I", data[at + 8:at + 12])[0]
        frame = data[at + 16:at + 16 + incl]
        at += 16 + incl
        if frame[12:14] == b"\x08\x00" and frame[14 + 9] == 17:
            ip = frame[14:]
        elif frame[12:14] == b"\x86\xdd" and frame[14 + 6] == 17:
            ip = frame[14:]
        else:
            continue
        # UD SEND ONLY (0x64) to QP1 over IPv4: BTH at 28, DETH at 40, the MAD at 48
        if ip[0] == 0x45 and ip[28] == 0x64 and ip[33:36] == b"\0\0\1" and ip[48 + 17] not in mads:
            mads.add(ip[48 + 17])
            os.makedirs("corpus/cm_mad", exist_ok=True)
            open(f"corpus/cm_mad/mad{n}_{ip[48 + 17]:02x}", "wb").write(ip[48:48 + 256])
        key = (ip[:1], len(ip) > 200, ip[28 if ip[0] >> 4 == 4 else 48])
        if key in seen:
            continue
        seen.add(key)
        for target in ("parse_checked", "parse_emit_parse", "recover_ipv4_ident"):
            os.makedirs(f"corpus/{target}", exist_ok=True)
            open(f"corpus/{target}/seed{n}", "wb").write(ip)
        if ip[0] == 0x45:
            hidden = bytearray(ip)
            hidden[4:6] = b"\0\0"
            hidden[10:12] = b"\0\0"
            s = sum(struct.unpack(">10H", bytes(hidden[:20])))
            while s >> 16:
                s = (s & 0xFFFF) + (s >> 16)
            hidden[10:12] = struct.pack(">H", ~s & 0xFFFF)
            open(f"corpus/recover_ipv4_ident/hidden{n}", "wb").write(hidden)
        n += 1
print(n, "seeds")
