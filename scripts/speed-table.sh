#!/usr/bin/env bash
# The speed tables of issues 12 and 15: the embedded device against softrdmad, on one host
# (loopback) and between two network namespaces over a veth, idle and beside a CPU-bound
# process. Every row prints the same run's baselines (`--baseline`): for a latency test the
# UDP ping-pong, for a bandwidth test the UDP stream, the UDP GSO/GRO stream and the TCP
# stream.
#
#   sudo scripts/speed-table.sh [ITERS] [TESTS] [PATHS] [LOADS]
#   e.g. sudo scripts/speed-table.sh 20000 "write_lat send_lat" "host ns" "idle load"
#        sudo scripts/speed-table.sh 5000 "write_bw read_bw send_bw" "host ns" idle
#
# host: embedded = two processes on 127.0.0.2 / 127.0.0.1, each its own device;
#       daemon   = one softrdmad serving 127.0.0.1, both processes on its device.
# ns:   two namespaces (srl1 10.77.0.1, srl2 10.77.0.2) joined by a veth of MTU $MTU (1500
#       unless set); embedded = one device per process, daemon = one softrdmad per namespace.
# load: `while :; do :; done` runs beside the benchmark.
# Needs root (namespaces); builds the release binaries first. BACKENDS="daemon" limits the
# backends, DARGS passes options to softrdmad, SIZE sets the message size (default: the
# tool's), REPEAT runs each row that many times. A bandwidth test with SIZE of at most 1024
# (one packet per message) prints messages/s against the same run's UDP datagrams/s instead:
# issue 13's message-rate table is SIZE=2 scripts/speed-table.sh 1000000 "write_bw send_bw" "host ns" idle
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20000}
TESTS=${2:-"write_lat send_lat read_lat atomic_lat"}
PATHS=${3:-"host ns"}
LOADS=${4:-"idle load"}
cargo build --release -q -p softrdma-cli -p softrdma-daemon
B=$PWD/target/release
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

setup_ns() {
    ip netns add srl1 2>/dev/null || true
    ip netns add srl2 2>/dev/null || true
    if ! ip -n srl1 link show srlv1 >/dev/null 2>&1; then
        ip link add srlv1 netns srl1 type veth peer name srlv2 netns srl2
        ip -n srl1 addr add 10.77.0.1/24 dev srlv1
        ip -n srl2 addr add 10.77.0.2/24 dev srlv2
        for n in srl1 srl2; do ip -n $n link set lo up; done
        ip -n srl1 link set srlv1 up
        ip -n srl2 link set srlv2 up
    fi
    ip -n srl1 link set srlv1 mtu "${MTU:-1500}"
    ip -n srl2 link set srlv2 mtu "${MTU:-1500}"
}

# run BACKEND PATH TEST LOAD: one row.
run() {
    local be=$1 path=$2 t=$3 load=$4
    local p=$((20000 + RANDOM % 10000)) s1=$TMP/sd1.sock s2=$TMP/sd2.sock
    local ns1=() ns2=() a1 a2 port daemons=() hog=""
    if [ "$path" = host ]; then
        a2=127.0.0.1
        if [ "$be" = daemon ]; then a1=127.0.0.1; else a1=127.0.0.2; fi
    else
        ns1=(ip netns exec srl1) ns2=(ip netns exec srl2) a1=10.77.0.1 a2=10.77.0.2
    fi
    if [ "$be" = daemon ]; then
        port=4791
        if [ "$path" = host ]; then
            # shellcheck disable=SC2086
            "$B/softrdmad" --addr "$a1" --socket "$s1" ${DARGS:-} >/dev/null 2>&1 &
            daemons+=($!)
            s2=$s1
        else
            # shellcheck disable=SC2086
            "${ns1[@]}" "$B/softrdmad" --addr "$a1" --socket "$s1" ${DARGS:-} >/dev/null 2>&1 &
            daemons+=($!)
            # shellcheck disable=SC2086
            "${ns2[@]}" "$B/softrdmad" --addr "$a2" --socket "$s2" ${DARGS:-} >/dev/null 2>&1 &
            daemons+=($!)
        fi
        sleep 0.5
    else
        port=4800
    fi
    if [ "$load" = load ]; then
        (while :; do :; done) &
        hog=$!
    fi
    local size=() mtu=()
    [ -n "${SIZE:-}" ] && size=(-s "$SIZE")
    [[ "$t" == *_lat ]] && [ -z "${SIZE:-}" ] && size=(-s 2)
    # A 1500-byte link carries 1024-byte RoCE MTU packets.
    [ "$path" = ns ] && [ "${MTU:-1500}" -lt 4200 ] && mtu=(-m 1024)
    SOFTRDMA_BACKEND=$be SOFTRDMA_DAEMON_SPAWN=0 SOFTRDMA_DAEMON_SOCKET=$s1 "${ns1[@]}" \
        "$B/softrdma" "$t" "${size[@]}" "${mtu[@]}" -n "$N" -B "$a1" -p "$p" --udp-port $port \
        >"$TMP/srv" 2>&1 &
    local srv=$!
    sleep 0.3
    SOFTRDMA_BACKEND=$be SOFTRDMA_DAEMON_SPAWN=0 SOFTRDMA_DAEMON_SOCKET=$s2 timeout 600 "${ns2[@]}" \
        "$B/softrdma" "$t" "${size[@]}" "${mtu[@]}" -n "$N" -B "$a2" -p "$p" --udp-port $port \
        --baseline "$a1" >"$TMP/cli" 2>&1 || true
    wait "$srv" || true
    [ -n "$hog" ] && kill "$hog"
    for d in "${daemons[@]}"; do kill "$d"; wait "$d" 2>/dev/null || true; done
    local row base
    row=$(grep -E "^ *[0-9]+ +$N " "$TMP/cli" | head -1 || true)
    if [ -z "$row" ]; then
        echo "| $t | $path | $be | $load | failed: $(tail -1 "$TMP/cli") |"
        return
    fi
    if [[ "$t" == *_bw ]] && [ "${SIZE:-65536}" -le 1024 ]; then
        # One packet per message: messages/s against the same run's UDP datagrams/s.
        # shellcheck disable=SC2046
        set -- $(grep -A1 "softrdma\[Mmsg/s\]" "$TMP/cli" | tail -n 1)
        echo "| $t | $path | $be | $load | ${2:-?} | ${3:-?} | ${4:-?} |"
        return
    fi
    if [[ "$t" == *_bw ]]; then
        # The baseline row: bytes, datagram, UDP, UDP GSO, TCP, then the ratios.
        base=$(grep -A1 "UDP GSO\[" "$TMP/cli" | grep -E "^ *[0-9]" | head -1 || true)
        # shellcheck disable=SC2086
        set -- $row
        local avg=$4
        # shellcheck disable=SC2086
        set -- $base
        echo "| $t | $path | $be | $load | $avg | ${3:-?} | ${4:-?} | ${5:-?} | ${8:-?} |"
        return
    fi
    base=$(grep -A2 "UDP" "$TMP/cli" | grep -E "^ *[0-9]" | head -1 || true)
    # shellcheck disable=SC2086
    set -- $row
    local typ=$5 avg=$6 p999=$9
    # shellcheck disable=SC2086
    set -- $base
    echo "| $t | $path | $be | $load | $typ | $avg | $p999 | ${3:-?} | ${4:-?} |"
}

case "$TESTS" in
*_bw*) if [ "${SIZE:-65536}" -le 1024 ]; then
           echo "| test | path | backend | load | M msg/s | UDP M datagrams/s | softrdma/UDP |"
           echo "|---|---|---|---|---|---|---|"
       else
           echo "| test | path | backend | load | MB/s | UDP MB/s | UDP GSO MB/s | TCP MB/s | softrdma/TCP |"
           echo "|---|---|---|---|---|---|---|---|---|"
       fi ;;
*) echo "| test | path | backend | load | typical us | avg us | 99.9% us | UDP ping-pong typ | UDP avg |"
   echo "|---|---|---|---|---|---|---|---|---|" ;;
esac
[[ " $PATHS " == *" ns "* ]] && setup_ns
for t in $TESTS; do
    for path in $PATHS; do
        for load in $LOADS; do
            for be in ${BACKENDS:-embedded daemon}; do
                for _ in $(seq "${REPEAT:-1}"); do
                    run "$be" "$path" "$t" "$load"
                done
            done
        done
    done
done
