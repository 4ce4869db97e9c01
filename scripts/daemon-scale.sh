#!/usr/bin/env bash
# Issue 15's scale table through softrdmad: `TEST -s SIZE -q N` between two processes on
# one softrdmad (loopback, both on its device), for each N given, REPEAT times each. Prints
# the tool's rates, the ACKs the device sent per message, and softrdmad's CPU per message
# over the data phase alone: each row is two runs, a short one (one message per QP) and the
# long one, and the CPU is their difference over the messages' difference, so that creating
# and connecting N QPs does not count.
#
#   scripts/daemon-scale.sh [N...]
#   e.g. scripts/daemon-scale.sh 1 100 1000 10000
#
# MSGS sets the messages of the long run (default: 200 per QP, at least 1 000 000), SIZE the
# message size (4096), REPEAT the rows per N (2), TX the tool's -t (its default, 128: what is
# outstanding over all QPs), TEST the tool (write_bw; send_bw too). PIN=1 puts softrdmad on
# CPU 0 and both processes on CPU 1 (taskset), so that the rows show the daemon's cost with
# a core of its own rather than how the scheduler shared two.
# Issue 13's message rate: SIZE=2 MSGS=3000000 TEST=send_bw scripts/daemon-scale.sh 1
# Builds the release binaries first; uses its own socket and a port outside the default
# 4791, so a softrdmad already running is left alone.
#
# IDLE_CQS=N first opens N CQs that stay idle, from another program on the same softrdmad
# (scripts/idle-cqs.c through the drop-in libibverbs), as a host with many idle clients has;
# IDLE_CLIENTS=K runs K such programs (each with IDLE_CQS CQs, default 1).
#
# BACKEND=embedded runs the same long runs without softrdmad: each process its own device,
# on 127.0.0.2 and 127.0.0.1 (every message and ACK a UDP datagram); it prints the rates only.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- 1 100 1000 10000
SIZE=${SIZE:-4096}
TEST=${TEST:-write_bw}
DPIN=() CPIN=()
if [ "${PIN:-0}" = 1 ]; then DPIN=(taskset -c 0) CPIN=(taskset -c 1); fi
REPEAT=${REPEAT:-2}
cargo build --release -q -p softrdma-cli -p softrdma-daemon
B=$PWD/target/release
TMP=$(mktemp -d)
if [ "${BACKEND:-daemon}" = embedded ]; then
    trap 'rm -rf "$TMP"' EXIT
    PORT=$((31000 + RANDOM % 1000))
    echo "| N | messages | MB/s average | M msg/s |"
    echo "|---|---|---|---|"
    for N in "$@"; do
        M=${MSGS:-$((N * 200 > 1000000 ? N * 200 : 1000000))}
        for _ in $(seq "$REPEAT"); do
            PORT=$((PORT + 1))
            timeout 600 "${CPIN[@]}" "$B/softrdma" "$TEST" -s "$SIZE" -q "$N" -n "$M" -B 127.0.0.1 \
                -p "$PORT" ${TX:+-t "$TX"} > "$TMP/server.out" 2>&1 &
            spid=$!
            sleep 0.5
            timeout 600 "${CPIN[@]}" "$B/softrdma" "$TEST" 127.0.0.1 -B 127.0.0.2 -s "$SIZE" -q "$N" \
                -n "$M" -p "$PORT" ${TX:+-t "$TX"} > "$TMP/client.out" 2>&1
            wait "$spid"
            awk -v s="$SIZE" -v n="$N" -v m="$M" \
                '$1 == s && NF == 5 { printf "| %s | %s | %s | %s |\n", n, m, $4, $5; exit }' \
                "$TMP/client.out"
        done
    done
    exit 0
fi
# shellcheck source=scripts/bench-daemon.sh
. scripts/bench-daemon.sh
if [ "${IDLE_CQS:-0}" -gt 0 ] || [ "${IDLE_CLIENTS:-0}" -gt 0 ]; then
    IDLE_CQS=${IDLE_CQS:-1} IDLE_CLIENTS=${IDLE_CLIENTS:-1}
    [ "$IDLE_CQS" -gt 0 ] || IDLE_CQS=1
    [ "$IDLE_CLIENTS" -gt 0 ] || IDLE_CLIENTS=1
    cargo build --release -q -p softrdma-ibverbs
    gcc -O2 -o "$TMP/idle-cqs" scripts/idle-cqs.c -libverbs
    IDLE_PIDS=()
    for i in $(seq "$IDLE_CLIENTS"); do
        LD_LIBRARY_PATH=$B "$TMP/idle-cqs" "$IDLE_CQS" 100000 2> "$TMP/idle.$i.log" &
        IDLE_PIDS+=($!)
    done
    trap 'kill "${IDLE_PIDS[@]}" $DPID 2>/dev/null; wait $DPID 2>/dev/null; rm -rf "$TMP"' EXIT
    for i in $(seq "$IDLE_CLIENTS"); do
        for _ in $(seq 300); do grep -q "open for" "$TMP/idle.$i.log" && break; sleep 0.1; done
        grep -q "open for" "$TMP/idle.$i.log" || { cat "$TMP/idle.$i.log" >&2; exit 1; }
    done
    echo "($IDLE_CLIENTS idle clients with $IDLE_CQS CQs each on the device)"
fi
acks() { "$B/softrdma" stat --socket "$TMP/sock" --filter resp_acks_sent | awk '{s += $2} END {print s}'; }
PORT=$((31000 + RANDOM % 1000))
# bench N MESSAGES: one run; sets ROW (the tool's size line) and CPU, ACKS (the deltas).
bench() {
    local n=$1 m=$2 c0 a0 spid
    PORT=$((PORT + 1))
    c0=$(cpu) a0=$(acks)
    timeout 600 "${CPIN[@]}" "$B/softrdma" "$TEST" -s "$SIZE" -q "$n" -n "$m" -p "$PORT" ${TX:+-t "$TX"} \
        > "$TMP/server.out" 2>&1 &
    spid=$!
    sleep 0.5
    timeout 600 "${CPIN[@]}" "$B/softrdma" "$TEST" 127.0.0.1 -s "$SIZE" -q "$n" -n "$m" -p "$PORT" \
        ${TX:+-t "$TX"} > "$TMP/client.out" 2>&1
    wait "$spid"
    ROW=$(awk -v s="$SIZE" '$1 == s && NF == 5 { print $3, $4, $5; exit }' "$TMP/client.out")
    CPU=$(echo "$(cpu) - $c0" | bc -l)
    ACKS=$(($(acks) - a0))
}
echo "| N | messages | MB/s average | M msg/s | ACKs per message | softrdmad CPU per message, data phase (us) | softrdmad CPU, share of the data phase |"
echo "|---|---|---|---|---|---|---|"
for N in "$@"; do
    M=${MSGS:-$((N * 200 > 1000000 ? N * 200 : 1000000))}
    for _ in $(seq "$REPEAT"); do
        bench "$N" "$N"
        short_cpu=$CPU
        bench "$N" "$M"
        read -r _peak avg rate <<< "$ROW"
        awk -v n="$N" -v m="$M" -v avg="$avg" -v rate="$rate" -v acks="$ACKS" \
            -v c="$CPU" -v c0="$short_cpu" 'BEGIN {
                per = (c - c0) / (m - n) * 1e6
                printf "| %s | %s | %s | %.3f | %.2f | %.2f | %.0f%% |\n",
                    n, m, avg, rate, acks / m, per, per * rate * 100 }'
    done
done
