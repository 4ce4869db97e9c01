#!/usr/bin/env bash
# Instructions per message of one process of a 2-byte message-rate run through softrdmad,
# counted by valgrind's callgrind: a figure that does not move with this machine's load
# (timings on it move by 30% from hour to hour). Two runs, of 3N and N messages; the
# difference over 2N leaves out start-up and connection set-up.
#
#   scripts/callgrind-rate.sh daemon [TEST]    softrdmad under callgrind, the softrdma tool's
#                                              TEST (send_bw, write_bw; default send_bw) as
#                                              server and client
#   scripts/callgrind-rate.sh client|server [PERFTEST]
#                                              perftest's PERFTEST (default ib_send_bw) through
#                                              the drop-in libibverbs, that side under callgrind
#   scripts/callgrind-rate.sh embedded-client|embedded-server [TEST]
#                                              the softrdma tool's TEST (default write_bw), each
#                                              process its own embedded device (127.0.0.1 and
#                                              127.0.0.2: every packet a UDP datagram on lo),
#                                              that side under callgrind
#
# SIZE sets the message size of the softrdma tool's runs (default 2) and MTU its path MTU
# (`-m`); a stream's cost per packet is then the figure over the packets per message, e.g.
# SIZE=65536 MTU=1024 N=5000 scripts/callgrind-rate.sh embedded-client write_bw (64 packets).
#
# N sets the messages of the short run (default 100000; fewer leave the start-up's
# variation in the figure: two runs of the defaults agree within 3%). The profile of the
# long run is left in $OUT (default /tmp/callgrind-rate.out) for callgrind_annotate.
# Builds the release binaries first; uses its own socket and a port outside the default
# 4791, so a softrdmad already running is left alone. Busy-polling loops count too: a
# process that finds its queue empty more often spends more instructions, so compare runs
# on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
SIDE=${1:?"daemon, client or server"}
N=${N:-100000}
OUT=${OUT:-/tmp/callgrind-rate.out}
SIZE=${SIZE:-2}
MTU_ARGS=()
[ -n "${MTU:-}" ] && MTU_ARGS=(-m "$MTU")
case "$SIDE" in
    daemon) T=${2:-send_bw} ;;
    embedded-client | embedded-server) T=${2:-write_bw} ;;
    client | server) T=${2:-ib_send_bw}
        command -v "$T" >/dev/null || { echo "needs perftest (apt-get install perftest)" >&2; exit 1; } ;;
    *) echo "usage: $0 daemon|client|server|embedded-client|embedded-server [TEST]" >&2; exit 2 ;;
esac
cargo build --release -q -p softrdma-cli -p softrdma-daemon -p softrdma-ibverbs
B=$PWD/target/release
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
CG=(valgrind --tool=callgrind)

# One run of $1 messages; prints the instructions callgrind counted.
run() {
    local n=$1 port=$((31000 + RANDOM % 1000)) dpid spid
    local -a dpre=() spre=() cpre=()
    case "$SIDE" in
        embedded-*)
            local -a spre2=() cpre2=()
            if [ "$SIDE" = embedded-server ]; then
                spre2=("${CG[@]}" "--callgrind-out-file=$TMP/cg.$n")
            else
                cpre2=("${CG[@]}" "--callgrind-out-file=$TMP/cg.$n")
            fi
            SOFTRDMA_BACKEND=embedded "${spre2[@]}" "$B/softrdma" "$T" -s "$SIZE" "${MTU_ARGS[@]}" \
                -n "$n" -B 127.0.0.2 -p "$port" --udp-port 24800 > "$TMP/server.out" 2>&1 &
            spid=$!
            sleep 2
            SOFTRDMA_BACKEND=embedded "${cpre2[@]}" "$B/softrdma" "$T" -s "$SIZE" "${MTU_ARGS[@]}" \
                -n "$n" -B 127.0.0.1 -p "$port" --udp-port 24800 127.0.0.2 \
                > "$TMP/client.out" 2>&1
            wait "$spid"
            awk '/^(summary|totals):/ { print $2; exit }' "$TMP/cg.$n"
            return
            ;;
        daemon) dpre=("${CG[@]}" "--callgrind-out-file=$TMP/cg.$n") ;;
        server) spre=("${CG[@]}" "--callgrind-out-file=$TMP/cg.$n") ;;
        client) cpre=("${CG[@]}" "--callgrind-out-file=$TMP/cg.$n") ;;
    esac
    rm -f "$TMP/sock"
    "${dpre[@]}" "$B/softrdmad" --addr 127.0.0.1 --port 24791 --socket "$TMP/sock" \
        > "$TMP/daemon.log" 2>&1 &
    dpid=$!
    for _ in $(seq 100); do [ -S "$TMP/sock" ] && break; sleep 0.2; done
    export SOFTRDMA_BACKEND=daemon SOFTRDMA_DAEMON_SPAWN=0 SOFTRDMA_DAEMON_SOCKET="$TMP/sock"
    if [ "$SIDE" = daemon ]; then
        "$B/softrdma" "$T" -s "$SIZE" "${MTU_ARGS[@]}" -n "$n" -p "$port" > "$TMP/server.out" 2>&1 &
        spid=$!
        sleep 1
        "$B/softrdma" "$T" 127.0.0.1 -s "$SIZE" "${MTU_ARGS[@]}" -n "$n" -p "$port" \
            > "$TMP/client.out" 2>&1
    else
        LD_LIBRARY_PATH=$B "${spre[@]}" "$T" -d srxe0 -s 2 -n "$n" -p "$port" \
            > "$TMP/server.out" 2>&1 &
        spid=$!
        sleep 2
        LD_LIBRARY_PATH=$B "${cpre[@]}" "$T" -d srxe0 -s 2 -n "$n" -p "$port" 127.0.0.1 \
            > "$TMP/client.out" 2>&1
    fi
    wait "$spid"
    kill -INT "$dpid"
    wait "$dpid" 2>/dev/null || true
    awk '/^(summary|totals):/ { print $2; exit }' "$TMP/cg.$n"
}

short=$(run "$N")
long=$(run $((3 * N)))
cp "$TMP/cg.$((3 * N))" "$OUT"
echo "$SIDE ($T): $(( (long - short) / (2 * N) )) instructions per message (runs of $N and $((3 * N)): $short, $long; profile in $OUT)"
