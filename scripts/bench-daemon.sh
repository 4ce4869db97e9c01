# Sourced by the benchmark scripts that run two processes on one softrdmad of their own:
# starts it on 127.0.0.1 (its own socket in $TMP, port 24791, so a softrdmad already running
# is left alone) with the prefix in DPIN (an array: taskset...), stops it and removes $TMP on
# exit, points the tools at it, and defines `cpu` (its CPU seconds so far).
# Needs TMP and B (the release binaries) set.
"${DPIN[@]}" "$B/softrdmad" --addr 127.0.0.1 --port 24791 --socket "$TMP/sock" > "$TMP/daemon.log" 2>&1 &
DPID=$!
trap 'kill $DPID 2>/dev/null; wait $DPID 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 50); do [ -S "$TMP/sock" ] && break; sleep 0.1; done
export SOFTRDMA_BACKEND=daemon SOFTRDMA_DAEMON_SPAWN=0 SOFTRDMA_DAEMON_SOCKET="$TMP/sock"
TCK=$(getconf CLK_TCK)
cpu() { awk -v t="$TCK" '{print ($14 + $15) / t}' "/proc/$DPID/stat"; }
