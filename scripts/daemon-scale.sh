#!/usr/bin/env bash
# Issue 15's scale table through softrdmad: `write_bw -s SIZE -q N` between two processes on
# one softrdmad (loopback, both on its device), for each N given, REPEAT times each. Prints
# the tool's result line (with its same-run baselines) and softrdmad's CPU seconds per run.
#
#   scripts/daemon-scale.sh [N...]
#   e.g. scripts/daemon-scale.sh 1 100 1000 10000
#
# MSGS sets the messages per run (default: 20 per QP, at least 20 000), SIZE the message
# size (4096), REPEAT the runs per N (2). Builds the release binaries first; uses its own
# socket and a port outside the default 4791, so a softrdmad already running is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- 1 100 1000 10000
SIZE=${SIZE:-4096}
REPEAT=${REPEAT:-2}
cargo build --release -q -p softrdma-cli -p softrdma-daemon
B=$PWD/target/release
TMP=$(mktemp -d)
"$B/softrdmad" --addr 127.0.0.1 --port 24791 --socket "$TMP/sock" > "$TMP/daemon.log" 2>&1 &
DPID=$!
trap 'kill $DPID 2>/dev/null; wait $DPID 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 50); do [ -S "$TMP/sock" ] && break; sleep 0.1; done
export SOFTRDMA_BACKEND=daemon SOFTRDMA_DAEMON_SPAWN=0 SOFTRDMA_DAEMON_SOCKET="$TMP/sock"
cpu() { awk '{print $14 + $15}' "/proc/$DPID/stat"; }
TCK=$(getconf CLK_TCK)
PORT=$((31000 + RANDOM % 1000))
echo "| N | messages | MB/s peak | MB/s average | M msg/s | softrdmad CPU s |"
echo "|---|---|---|---|---|---|"
for N in "$@"; do
    M=${MSGS:-$((N * 20 > 20000 ? N * 20 : 20000))}
    for _ in $(seq "$REPEAT"); do
        PORT=$((PORT + 1))
        c0=$(cpu)
        timeout 300 "$B/softrdma" write_bw -s "$SIZE" -q "$N" -n "$M" -p "$PORT" \
            > "$TMP/server.out" 2>&1 &
        SPID=$!
        sleep 0.5
        timeout 300 "$B/softrdma" write_bw 127.0.0.1 -s "$SIZE" -q "$N" -n "$M" -p "$PORT" \
            --baseline > "$TMP/client.out" 2>&1
        wait $SPID
        c1=$(cpu)
        row=$(awk -v s="$SIZE" '$1 == s && NF == 5 { print $3, $4, $5; exit }' "$TMP/client.out")
        read -r peak avg rate <<< "$row"
        printf '| %s | %s | %s | %s | %s | %.2f |\n' "$N" "$M" "$peak" "$avg" "$rate" \
            "$(echo "($c1 - $c0) / $TCK" | bc -l)"
    done
done
