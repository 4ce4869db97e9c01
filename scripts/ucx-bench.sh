#!/usr/bin/env bash
# UCX's ucx_perftest (Debian ucx-utils) on softrdma's rc_verbs and ud_verbs beside UCX's own
# tcp transport, in the same run: every test UCX has, one table, each figure beside its
# ratio to tcp's.
#
#   scripts/ucx-bench.sh [--netns] [-n ITERS] [-w WARMUP] [--mtu BYTES] [--tests "T..."]
#                        [--no-build] [--keep DIR]
#
# Where the two processes (server and client) run:
#   default  one host: one softrdmad of the script's own (release build; control socket in
#            a temporary folder, a free UDP port) serving 127.0.0.1 as srxe0, both
#            processes on that device, so their QPs meet inside the daemon; tcp over lo.
#   --netns  two network namespaces joined by a veth (10.77.250.1 and .2, MTU 1500 unless
#            --mtu), a softrdmad in each: RoCEv2 over UDP between them; tcp over the veth.
#            Needs root.
# softrdma's runs go through `softrdma exec`; the tcp runs are plain ucx_perftest.
#
# UCT tests name their transport (-x rc_verbs | ud_verbs | tcp, -d the device). UCP tests
# take UCX_TLS: "rc_verbs" is UCX_TLS=rc_verbs,ud_verbs (UCP wires up through ud_verbs,
# then sends on rc_verbs), "ud_verbs" is UCX_TLS=ud_verbs, "tcp" UCX_TLS=tcp.
# n/a: UCX refuses that test on that transport (the reasons follow the table). FAIL: the
# run failed otherwise (its output follows; the script then exits 1).
#
# Default 10000 iterations after 1000 warm-up ones (large-message rows run fewer);
# --tests limits the rows to those whose test name is listed (e.g. "am_lat tag_bw").
# --keep DIR keeps every run's output there.
set -euo pipefail
cd "$(dirname "$0")/.."

N=10000
W=1000
NETNS=0
MTU=1500
ONLY=""
BUILD=1
KEEP=""
while [ $# -gt 0 ]; do
    case $1 in
        --netns) NETNS=1 ;;
        -n) N=$2; shift ;;
        -w) W=$2; shift ;;
        --mtu) MTU=$2; shift ;;
        --tests) ONLY=$2; shift ;;
        --no-build) BUILD=0 ;;
        --keep) KEEP=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "ucx-bench: unknown option $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done

command -v ucx_perftest >/dev/null || {
    echo "ucx-bench: ucx_perftest missing: apt-get install ucx-utils" >&2
    exit 1
}
if [ "$BUILD" = 1 ]; then
    cargo build --release -q -p softrdma-cli -p softrdma-daemon -p softrdma-ibverbs \
        -p softrdma-rdmacm
fi
B=${CARGO_TARGET_DIR:-$PWD/target}/release
for f in softrdma softrdmad libibverbs.so.1 librdmacm.so.1; do
    [ -e "$B/$f" ] || { echo "ucx-bench: no $B/$f (cargo build --release)" >&2; exit 1; }
done

TMP=$(mktemp -d /tmp/ucx-bench.XXXXXX)
[ -n "$KEEP" ] && mkdir -p "$KEEP"
DAEMONS=()
NS_A="" NS_B=""
cleanup() {
    for d in "${DAEMONS[@]}"; do kill "$d" 2>/dev/null || true; done
    for d in "${DAEMONS[@]}"; do wait "$d" 2>/dev/null || true; done
    [ -n "$NS_A" ] && ip netns del "$NS_A" 2>/dev/null
    [ -n "$NS_B" ] && ip netns del "$NS_B" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port no socket of `proto` (t or u) uses here now.
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 40000))
        [ -z "$(ss -Hln"$1" "sport = :$p" 2>/dev/null)" ] && { echo "$p"; return; }
    done
}

# start_daemon SOCKET PORT ADDR [NS]: a softrdmad serving ADDR, up once its socket is.
start_daemon() {
    local sock=$1 port=$2 addr=$3 ns=${4:-} pre=()
    [ -n "$ns" ] && pre=(ip netns exec "$ns")
    "${pre[@]}" "$B/softrdmad" --socket "$sock" --port "$port" --addr "$addr" \
        >"$TMP/softrdmad-$port-$addr.log" 2>&1 &
    local pid=$! i
    for i in $(seq 200); do
        [ -S "$sock" ] && { DAEMONS+=("$pid"); return 0; }
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
    done
    kill "$pid"
    return 1
}

DEV=srxe0
if [ "$NETNS" = 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "ucx-bench: --netns needs root" >&2; exit 1; }
    NS_A=ucxbench-$$-a NS_B=ucxbench-$$-b
    NETDEV=ucxb0 # both veth ends, one in each namespace: one -d for both sides
    ip netns add "$NS_A"
    ip netns add "$NS_B"
    ip link add ucxb$$a type veth peer name ucxb$$b
    ip link set ucxb$$a netns "$NS_A" name "$NETDEV"
    ip link set ucxb$$b netns "$NS_B" name "$NETDEV"
    for ns in "$NS_A" "$NS_B"; do
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$NETDEV" mtu "$MTU" up
    done
    ip -n "$NS_A" addr add 10.77.250.1/24 dev "$NETDEV"
    ip -n "$NS_B" addr add 10.77.250.2/24 dev "$NETDEV"
    SERVER_ADDR=10.77.250.1
    SOCK_A=$TMP/a.sock SOCK_B=$TMP/b.sock
    start_daemon "$SOCK_A" 4791 10.77.250.1 "$NS_A" || { echo "ucx-bench: softrdmad failed" >&2; exit 1; }
    start_daemon "$SOCK_B" 4791 10.77.250.2 "$NS_B" || { echo "ucx-bench: softrdmad failed" >&2; exit 1; }
    PRE_A=(ip netns exec "$NS_A") PRE_B=(ip netns exec "$NS_B")
    WHERE="two network namespaces over a veth (MTU $MTU), one softrdmad each; tcp over the veth"
else
    NETDEV=lo
    SERVER_ADDR=127.0.0.1
    SOCK_A=$TMP/d.sock SOCK_B=$TMP/d.sock
    for _ in 1 2 3 4 5; do
        start_daemon "$SOCK_A" "$(free_port u)" 127.0.0.1 && break
    done
    [ -S "$SOCK_A" ] || { echo "ucx-bench: softrdmad failed to start" >&2; exit 1; }
    PRE_A=() PRE_B=()
    WHERE="one host, two processes on one softrdmad device (127.0.0.1); tcp over lo"
fi

# The rows: test|api|figures (lat or bw)|iterations (empty: -n)|more ucx_perftest options
ROWS="am_lat|uct|lat||
am_bw|uct|bw||
put_lat|uct|lat||
put_bw|uct|bw||
put_lat|uct|lat||-D zcopy
put_bw|uct|bw|2000|-D zcopy -s 65536
get|uct|lat||-D bcopy
get|uct|bw|2000|-D zcopy -s 65536
add_lat|uct|lat||
add_mr|uct|bw||
fadd|uct|lat||
swap|uct|lat||
cswap|uct|lat||
tag_lat|ucp|lat||
tag_bw|ucp|bw||
tag_bw|ucp|bw|500|-s 1048576
tag_sync_lat|ucp|lat||
tag_sync_bw|ucp|bw||
stream_lat|ucp|lat||
stream_bw|ucp|bw||
stream_bw|ucp|bw|2000|-s 65536
ucp_am_lat|ucp|lat||
ucp_am_bw|ucp|bw||
ucp_put_lat|ucp|lat||
ucp_put_bw|ucp|bw||
ucp_put_bw|ucp|bw|500|-s 1048576
ucp_get|ucp|lat||
ucp_add|ucp|bw||
ucp_fadd|ucp|lat||
ucp_swap|ucp|lat||
ucp_cswap|ucp|lat||"

TLS="rc_verbs ud_verbs tcp"
declare -A RES=()  # row#tl -> "p50 avg bw rate" | n/a | FAIL
declare -A WHY=()  # tl: reason -> tests UCX refused for it
FAILS=""

# run ROW# TEST API ITERS TL OPTS...: one server/client pair; fills RES.
run() {
    local i=$1 test=$2 api=$3 iters=$4 tl=$5
    shift 5
    local args=(-t "$test" -n "$iters" -w "$W" "$@") tls wrap_a=() wrap_b=()
    local port out=$TMP/run-$i-$tl
    port=$(free_port t)
    case $tl in
        tcp) tls=tcp ;;
        rc_verbs) tls=rc_verbs,ud_verbs ;;
        ud_verbs) tls=ud_verbs ;;
    esac
    local dev=$DEV:1
    [ "$tl" = tcp ] && dev=$NETDEV
    [ "$api" = uct ] && args+=(-x "$tl" -d "$dev")
    if [ "$tl" != tcp ]; then
        wrap_a=(env SOFTRDMA_DAEMON_SOCKET="$SOCK_A" SOFTRDMA_DAEMON_SPAWN=0 "$B/softrdma" exec --)
        wrap_b=(env SOFTRDMA_DAEMON_SOCKET="$SOCK_B" SOFTRDMA_DAEMON_SPAWN=0 "$B/softrdma" exec --)
    fi
    export UCX_TLS=$tls UCX_NET_DEVICES=$dev
    local srv try
    # A second try on another port when another program took it between the look and the
    # bind.
    for _ in 1 2 3; do
        timeout 600 "${PRE_A[@]}" "${wrap_a[@]}" ucx_perftest "${args[@]}" -p "$port" \
            >"$out.server" 2>&1 &
        srv=$!
        for try in $(seq 100); do
            timeout 600 "${PRE_B[@]}" "${wrap_b[@]}" ucx_perftest "$SERVER_ADDR" "${args[@]}" \
                -p "$port" >"$out.client" 2>&1 && break
            grep -q "connect() failed" "$out.client" || break
            kill -0 "$srv" 2>/dev/null || break
            sleep 0.1
        done
        # A server whose client never came would wait for ever.
        for try in $(seq 100); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
        kill "$srv" 2>/dev/null || true
        wait "$srv" 2>/dev/null || true
        grep -q "bind() failed" "$out.server" || break
        port=$(free_port t)
    done
    [ -n "$KEEP" ] && cp "$out.server" "$out.client" "$KEEP/"
    local final
    final=$(grep -h '^Final:' "$out.client" | head -1 || true)
    if [ -n "$final" ]; then
        # Final: iterations, then latency (50%ile, average, overall), MB/s (average,
        # overall) and msg/s (average, overall); each "average" covers the last
        # progress report's interval only, "overall" the whole run.
        # shellcheck disable=SC2086
        set -- $final
        RES[$i#$tl]="$3 $5 $7 $9"
        return
    fi
    local why
    why=$(grep -hoE "(does not support|Unsupported|unsupported|no auxiliary transport).*" \
        "$out.client" "$out.server" | head -1 || true)
    if [ -n "$why" ]; then
        RES[$i#$tl]=n/a
        WHY["$tl|$why"]+=" $test"
    else
        RES[$i#$tl]=FAIL
        FAILS+="== $test $tl ${args[*]}: client
$(tail -5 "$out.client")
== server
$(tail -5 "$out.server")
"
    fi
}

# ratio VALUE TCP: VALUE / TCP, or - when either is not a figure.
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a / b; else printf "-" }'
}

i=0
declare -a LABEL KIND
while IFS='|' read -r test api kind iters opts; do
    i=$((i + 1))
    if [ -n "$ONLY" ] && [[ " $ONLY " != *" $test "* ]]; then continue; fi
    LABEL[$i]="$test${opts:+ $opts}"
    KIND[$i]=$kind
    for tl in $TLS; do
        # shellcheck disable=SC2086
        run "$i" "$test" "$api" "${iters:-$N}" "$tl" $opts
    done
done <<<"$ROWS"

ucx=$(ucx_info -v 2>/dev/null | sed -n 's/^# Version //p' | head -1)
echo "ucx_perftest (UCX ${ucx:-?}) on softrdma ($B): $WHERE."
echo "$N iterations after $W warm-up ones unless the row says (-n per row below: fewer for"
echo "large messages); 8-byte messages unless -s says. Latency in usec (lower is better):"
echo "the median of the latest iterations UCX keeps, and the mean over the whole run;"
echo "bandwidth MB/s and message rate msg/s over the whole run (higher is better);"
echo "x tcp = figure / tcp's."
echo
printf '%-36s %-9s %11s %11s %11s %8s %8s\n' test figure rc_verbs ud_verbs tcp "rc x tcp" "ud x tcp"
for n in $(seq "$i"); do
    [ -n "${LABEL[$n]:-}" ] || continue
    label=${LABEL[$n]}
    iters=$(sed -n "${n}p" <<<"$ROWS" | cut -d'|' -f4)
    [ -n "$iters" ] && label+=" (-n $iters)"
    if [ "${KIND[$n]}" = lat ]; then figs="p50_usec:1 mean_usec:2"; else figs="MB/s:3 msg/s:4"; fi
    for f in $figs; do
        name=${f%:*} col=${f#*:}
        vals=()
        for tl in $TLS; do
            r=${RES[$n#$tl]:-}
            case $r in
                n/a|FAIL|"") vals+=("${r:--}") ;;
                *) vals+=("$(cut -d' ' -f"$col" <<<"$r")") ;;
            esac
        done
        printf '%-36s %-9s %11s %11s %11s %8s %8s\n' "$label" "$name" "${vals[0]}" "${vals[1]}" \
            "${vals[2]}" "$(ratio "${vals[0]}" "${vals[2]}")" "$(ratio "${vals[1]}" "${vals[2]}")"
        label=""
    done
done
if [ ${#WHY[@]} -gt 0 ]; then
    echo
    echo "n/a: UCX refuses these, saying why:"
    for k in "${!WHY[@]}"; do echo "  ${k%%|*} (${WHY[$k]# }): ${k#*|}"; done | sort
fi
if [ -n "$FAILS" ]; then
    echo
    echo "FAILED runs:"
    echo "$FAILS"
    exit 1
fi
