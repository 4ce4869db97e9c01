#!/usr/bin/env bash
# A/B of two softrdmad builds on issue 13's message rate: perftest's ib_send_bw -s 2 through
# the drop-in, two processes on one softrdmad, with softrdmad alone on CPU 0 and both
# perftest processes on CPU 1, so that the daemon is the bottleneck and its speed is the
# rate. The two builds alternate, ROUNDS runs each (default 6), and each side's median,
# minimum and maximum are printed: on this shared 2-CPU machine a single pair of runs moves
# by 10% either way.
#
#   cp target/release/softrdmad /tmp/d-a      # build A, then change and build B
#   scripts/daemon-ab.sh /tmp/d-a target/release/softrdmad [ROUNDS]
#
# N sets perftest's -n (default 2000000), T the perftest (default ib_send_bw). The drop-in
# libibverbs is target/release's (build it first: cargo build --release -p softrdma-ibverbs).
# Each run has its own socket and port, so a softrdmad already running is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: $0 DAEMON_A DAEMON_B [ROUNDS]" >&2; exit 2; }
command -v "${T:-ib_send_bw}" >/dev/null || { echo "needs perftest (apt-get install perftest)" >&2; exit 1; }
B=$PWD/target/release

# One run on daemon binary $1; prints perftest's message rate (M msg/s).
run() {
    local tmp dpid spid port
    tmp=$(mktemp -d)
    taskset -c 0 "$1" --addr 127.0.0.1 --port 24791 --socket "$tmp/sock" > "$tmp/d.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [ -S "$tmp/sock" ] && break; sleep 0.1; done
    port=$((30000 + RANDOM % 1000))
    SOFTRDMA_BACKEND=daemon SOFTRDMA_DAEMON_SPAWN=0 SOFTRDMA_DAEMON_SOCKET="$tmp/sock" \
        LD_LIBRARY_PATH=$B taskset -c 1 "${T:-ib_send_bw}" -d srxe0 -s 2 -n "${N:-2000000}" \
        -p "$port" > "$tmp/s.out" 2>&1 &
    spid=$!
    sleep 0.7
    SOFTRDMA_BACKEND=daemon SOFTRDMA_DAEMON_SPAWN=0 SOFTRDMA_DAEMON_SOCKET="$tmp/sock" \
        LD_LIBRARY_PATH=$B taskset -c 1 "${T:-ib_send_bw}" -d srxe0 -s 2 -n "${N:-2000000}" \
        -p "$port" 127.0.0.1 > "$tmp/c.out" 2>&1 || { cat "$tmp/c.out" >&2; }
    wait "$spid" || true
    # perftest's row: #bytes #iterations BW-peak BW-average MsgRate[Mpps]
    awk '$1 == 2 && NF >= 5 { print $5 }' "$tmp/c.out"
    kill -INT "$dpid"
    wait "$dpid" 2>/dev/null || true
    rm -rf "$tmp"
}

stats() {
    printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END {
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "median %.3f  min %.3f  max %.3f  (n=%d)\n", m, v[1], v[NR], NR }'
}

a=() b=()
for _ in $(seq "${3:-6}"); do
    a+=("$(run "$1")")
    b+=("$(run "$2")")
done
echo "A $1: $(stats "${a[@]}")   [${a[*]}]"
echo "B $2: $(stats "${b[@]}")   [${b[*]}]"
