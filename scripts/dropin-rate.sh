#!/usr/bin/env bash
# Issue 13's message rate through the drop-in libibverbs: perftest's ib_send_bw and
# ib_write_bw with 2-byte messages, two unmodified processes on one softrdmad (loopback,
# both on its device), each row beside the UDP datagram rate of the same size measured in
# the same run (`softrdma send_bw -s 2 --baseline`: a UDP stream of the datagrams a 2-byte
# SEND makes, between the same addresses).
#
#   scripts/dropin-rate.sh [TEST...]        e.g. scripts/dropin-rate.sh ib_send_bw ib_write_bw
#
# ITERS sets perftest's -n (default 3000000), SIZE its -s (2), REPEAT the rows per test (3),
# PERFTEST passes further perftest options (e.g. "--cq-mod 32"). PIN=1 puts softrdmad on
# CPU 0 and both perftest processes on CPU 1. HOG=1 runs a busy loop beside everything (a
# busy neighbour; the UDP baseline runs beside it too). Builds the release binaries first;
# uses its own socket and a port outside the default 4791, so a softrdmad already running
# is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- ib_send_bw ib_write_bw
command -v ib_send_bw >/dev/null || { echo "needs perftest (apt-get install perftest)" >&2; exit 1; }
ITERS=${ITERS:-3000000}
SIZE=${SIZE:-2}
REPEAT=${REPEAT:-3}
DPIN=() CPIN=()
if [ "${PIN:-0}" = 1 ]; then DPIN=(taskset -c 0) CPIN=(taskset -c 1); fi
cargo build --release -q -p softrdma-ibverbs -p softrdma-cli -p softrdma-daemon
B=$PWD/target/release
TMP=$(mktemp -d)
# shellcheck source=scripts/bench-daemon.sh
. scripts/bench-daemon.sh
if [ "${HOG:-0}" = 1 ]; then
    sh -c 'while :; do :; done' &
    HOG_PID=$!
    trap 'kill $HOG_PID $DPID 2>/dev/null; wait $DPID 2>/dev/null; rm -rf "$TMP"' EXIT
fi
PORT=$((20000 + RANDOM % 5000))
echo "| test | -s | messages | M msg/s | UDP datagrams, same run (M/s) | ratio | softrdmad CPU per message (us) |"
echo "|---|---|---|---|---|---|---|"
for T in "$@"; do
    for _ in $(seq "$REPEAT"); do
        PORT=$((PORT + 1))
        c0=$(cpu)
        # shellcheck disable=SC2086
        LD_LIBRARY_PATH=$B timeout 600 "${CPIN[@]}" "$T" -d srxe0 -s "$SIZE" -n "$ITERS" -p "$PORT" \
            ${PERFTEST:-} > "$TMP/server.out" 2>&1 &
        spid=$!
        sleep 1
        # shellcheck disable=SC2086
        LD_LIBRARY_PATH=$B timeout 600 "${CPIN[@]}" "$T" -d srxe0 -s "$SIZE" -n "$ITERS" -p "$PORT" \
            ${PERFTEST:-} 127.0.0.1 > "$TMP/client.out" 2>&1 || { cat "$TMP/client.out" >&2; exit 1; }
        wait "$spid"
        c1=$(cpu)
        # perftest's row: #bytes #iterations BW-peak BW-average MsgRate[Mpps]
        rate=$(awk -v s="$SIZE" '$1 == s && NF >= 5 { print $5; exit }' "$TMP/client.out")
        # The baseline of this row: the UDP stream of this size's datagrams, right after.
        PORT=$((PORT + 1))
        timeout 120 "$B/softrdma" send_bw -s "$SIZE" -n 1000 -p "$PORT" --baseline > "$TMP/bs.out" 2>&1 &
        bpid=$!
        sleep 0.5
        timeout 120 "$B/softrdma" send_bw 127.0.0.1 -s "$SIZE" -n 1000 -p "$PORT" --baseline \
            > "$TMP/bc.out" 2>&1
        wait "$bpid"
        # Its "Message rate" table: #bytes softrdma[Mmsg/s] UDP stream[Mdgram/s] ...
        udp=$(awk '/UDP stream\[Mdgram\/s\]/ { getline; print $3; exit }' "$TMP/bc.out")
        ratio=$(awk -v r="$rate" -v u="$udp" 'BEGIN { if (u > 0) printf "%.2f", r / u; else print "?" }')
        per=$(awk -v a="$c0" -v b="$c1" -v n="$ITERS" 'BEGIN { printf "%.2f", (b - a) * 1e6 / n }')
        echo "| $T | $SIZE | $ITERS | $rate | $udp | $ratio | $per |"
    done
done
