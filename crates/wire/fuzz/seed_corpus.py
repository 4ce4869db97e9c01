"""Write one seed file per distinct RoCE packet shape found in the pcaps of a directory
into corpus/<target>/ for both fuzz targets (classic pcap, Ethernet, IPv4/IPv6)."""
import glob
import os
import struct
import sys

src = sys.argv[1] if len(sys.argv) > 1 else "../../../../shared/testdata"
n = 0
for path in sorted(glob.glob(os.path.join(src, "*.pcap"))):
    data = open(path, "rb").read()
    at, seen = 24, set()
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
        key = (ip[:1], len(ip) > 200, ip[28 if ip[0] >> 4 == 4 else 48])
        if key in seen:
            continue
        seen.add(key)
        for target in ("parse_checked", "parse_emit_parse"):
            os.makedirs(f"corpus/{target}", exist_ok=True)
            open(f"corpus/{target}/seed{n}", "wb").write(ip)
        n += 1
print(n, "seeds")
