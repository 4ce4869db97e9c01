#!/usr/bin/env bash
# Runs every softrdma test: formatting, lints, unit, property, simulation and conformance tests.
# Installs the Debian packages the tests drive when absent (tshark, python3-scapy, tcpdump,
# iproute2, ibverbs-utils, perftest, python3-pyverbs); those checks are never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
/usr/bin/python3 -c 'import scapy.contrib.roce' >/dev/null 2>&1 || need+=(python3-scapy)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ibv_devinfo >/dev/null 2>&1 || need+=(ibverbs-utils)
command -v ib_write_bw >/dev/null 2>&1 || need+=(perftest)
/usr/bin/python3 -c 'import pyverbs' >/dev/null 2>&1 || need+=(python3-pyverbs)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi

echo "== cargo fmt"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
