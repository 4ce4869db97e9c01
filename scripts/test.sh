#!/usr/bin/env bash
# Runs every softrdma test: formatting, lints, unit, property, simulation, conformance and
# interop tests. Installs the Debian packages the tests drive when absent (tshark,
# python3-scapy, tcpdump, ethtool, iproute2, ibverbs-utils, perftest, python3-pyverbs, ucx-utils,
# openmpi-bin and libopenmpi-dev, valgrind, and
# for the kernel Soft-RoCE VM qemu-system-x86, busybox-static, cpio, kmod, rdmacm-utils,
# ibverbs-providers, rdma-core); those checks are never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v tshark >/dev/null 2>&1 || need+=(tshark)
/usr/bin/python3 -c 'import scapy.contrib.roce' >/dev/null 2>&1 || need+=(python3-scapy)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v ethtool >/dev/null 2>&1 || need+=(ethtool)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v ibv_devinfo >/dev/null 2>&1 || need+=(ibverbs-utils)
command -v ib_write_bw >/dev/null 2>&1 || need+=(perftest)
/usr/bin/python3 -c 'import pyverbs' >/dev/null 2>&1 || need+=(python3-pyverbs)
# The interop test against kernel Soft-RoCE (crates/ibverbs/tests/rxe_interop.rs) boots
# Debian's kernel in qemu with ../shared/tools/rxe-vm/run-vm.sh; what that tool's install
# and initramfs steps use (the test downloads the kernel package itself, once per target/).
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static)
command -v cpio >/dev/null 2>&1 || need+=(cpio)
[ -x /usr/sbin/depmod ] || [ -x /sbin/depmod ] || need+=(kmod)
command -v rping >/dev/null 2>&1 || need+=(rdmacm-utils)
[ -e /etc/libibverbs.d/rxe.driver ] || need+=(ibverbs-providers)
dpkg -s rdma-core >/dev/null 2>&1 || need+=(rdma-core)
# `softrdma exec` (crates/cli/tests/exec.rs, ucx.rs) runs UCX's ucx_info and ucx_perftest
# on the drop-ins.
command -v ucx_info >/dev/null 2>&1 && command -v ucx_perftest >/dev/null 2>&1 \
  || need+=(ucx-utils)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
# The tests run the C programs line-buffered (stdbuf), so a program killed at a time limit
# keeps what it printed.
command -v stdbuf >/dev/null 2>&1 || need+=(coreutils)
# OpenMPI over UCX on softrdma (crates/cli/tests/mpi.rs): mpirun and mpicc.
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
# Verbs programs under memcheck (crates/ibverbs/tests/valgrind.rs).
command -v valgrind >/dev/null 2>&1 || need+=(valgrind)
# The rdma_cm layout test (crates/rdmacm/tests/layout.rs) compiles against rdma-core's headers.
[ -e /usr/include/rdma/rdma_cma.h ] || need+=(librdmacm-dev)
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
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
cargo clippy -p softrdma --features tokio --all-targets --locked -- -D warnings
echo "== cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --lib --locked
echo "== cargo test"
cargo test --workspace --locked
echo "== cargo test (softrdma's async API, feature tokio)"
cargo test -p softrdma --features tokio --locked --test cm --test waits
