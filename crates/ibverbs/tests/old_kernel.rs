//! softrdmad and the drop-in on older kernels, booted in the rxe VM of
//! `shared/tools/rxe-vm`: Debian 12's own (Linux 6.1), and Debian 11's (5.10), where kernel
//! features the library and the daemon use on a newer host are missing:
//!
//! - `PROCMAP_QUERY` (6.11): the library and the daemon read `/proc/<pid>/maps` as text;
//! - `UFFD_FEATURE_WP_UNPOPULATED` (6.4): before registration adopts a program's pages
//!   into shared memory, the pages never touched are populated so that write-protection
//!   holds off writers there too;
//! - `SO_PEERPIDFD` (6.5): softrdmad binds a connection to the process that holds its other
//!   end, which the kernel's unix socket diagnostics name (module `unix_diag`, loaded by
//!   the script: the VM's initramfs has only the modules its tool lists);
//! - on 5.10 also `UFFD_FEATURE_WP_HUGETLBFS_SHMEM` (6.0) and `MADV_POPULATE_READ` (5.14):
//!   nothing is adopted, and softrdmad reaches every region through `/proc/<pid>/mem`.
//!
//! First README's demo runs there (embedded devices: UDP GSO/GRO trains, the whole verbs
//! model, the benchmark tables) and must say "every step checked its result". Then a
//! softrdmad serves 127.0.0.1, and through the drop-in
//! tests/programs/close_with_regions.c must pass (RDMA WRITEs into a region, no write after
//! `ibv_close_device`, the pages private again), with its region adopted on 6.1 ("CLOSE OK:
//! adopted") and not on 5.10, and `ibv_rc_pingpong -c` must pass its data check between two
//! processes, and `rping` through the drop-in librdmacm must connect and verify its three
//! pings. About a minute per kernel (TCG).

mod common;
#[path = "../../rdmacm/tests/rdmacm_lib/mod.rs"]
mod rdmacm_lib;
mod rxe_vm;

use std::path::Path;
use std::time::Duration;

use rxe_vm::RxeVm;

#[test]
fn adoption_and_registration_work_on_debian_12s_kernel() {
    let vm = RxeVm::prepare();
    let kernel = vm.kernel();
    run_on(&vm, &kernel, "6.1.", "CLOSE OK: adopted");
}

/// Debian 11's kernel (Linux 5.10, as old as Ubuntu 20.04's 5.4 and RHEL 9's 5.14 in what
/// matters here) has none of the userfaultfd features adoption needs
/// (`UFFD_FEATURE_WP_HUGETLBFS_SHMEM`, 6.0; nor `MADV_POPULATE_READ`, 5.14): softrdmad
/// reaches every region through `/proc/<pid>/mem`, and everything else works as on 6.1.
#[test]
fn registration_without_adoption_works_on_debian_11s_kernel() {
    let vm = RxeVm::prepare();
    let kernel = vm.debian_11_kernel();
    run_on(&vm, &kernel, "5.10.", "CLOSE OK: not adopted");
}

/// Boot kernel package `kpkg` (whose release starts with `release`) with README's demo,
/// softrdmad, the drop-ins and the test program, and check every step; `close_ok` is what
/// close_with_regions must print.
fn run_on(vm: &RxeVm, kpkg: &Path, release: &str, close_ok: &str) {
    let prog = common::verbs_program("close_with_regions", &["-lpthread"]);
    let daemon = common::daemon_binary();
    let library = common::built_library();
    let rdmacm = rdmacm_lib::built();
    let diag = std::fs::read_dir(kpkg.join("lib/modules"))
        .expect("the VM's kernel modules")
        .flatten()
        .map(|release| release.path().join("kernel/net/unix/unix_diag.ko"))
        .find(|m| m.is_file())
        .expect("unix_diag.ko in the VM's kernel package");
    // The kernel's rxe holds UDP 4791: softrdmad takes another port (its QPs on one device
    // talk over internal paths anyway).
    let script = "\
softrdma demo >/tmp/demo.log 2>&1; echo \"@@ demo rc=$?\"; tail -3 /tmp/demo.log
insmod /unix_diag.ko
softrdmad --addr 127.0.0.1 --port 24791 --socket /tmp/s >/tmp/d.log 2>&1 &
i=0; while [ ! -S /tmp/s ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
export SOFTRDMA_BACKEND=daemon SOFTRDMA_DAEMON_SOCKET=/tmp/s SOFTRDMA_DAEMON_SPAWN=0
export SOFTRDMA_DEVICE=127.0.0.1 LD_LIBRARY_PATH=/softrdma
echo \"@@ kernel $(uname -r)\"
close_with_regions; echo \"@@ close rc=$?\"
ibv_rc_pingpong -g 0 -c -n 20 & sleep 2
ibv_rc_pingpong -g 0 -c -n 20 127.0.0.1; echo \"@@ client rc=$?\"
wait $!; echo \"@@ server rc=$?\"
rping -s -a 127.0.0.1 -p 7471 -C 3 -v & sleep 2
rping -c -a 127.0.0.1 -p 7471 -C 3 -v; echo \"@@ rping client rc=$?\"
wait $!; echo \"@@ rping server rc=$?\"
tail -5 /tmp/d.log";
    let mut run = vm.boot_kernel_with(
        kpkg,
        &[
            (&daemon, "/usr/bin/softrdmad"),
            (&common::cli_binary(), "/usr/bin/softrdma"),
            (&library, "/softrdma/libibverbs.so.1"),
            (&rdmacm, "/softrdma/librdmacm.so.1"),
            (&prog, "/usr/bin/close_with_regions"),
            (&diag, "/unix_diag.ko"),
        ],
        script,
    );
    let off = run.power_off(Duration::from_secs(600));
    let log = run.log();
    let report = || format!("VM console:\n{log}\n--- run-vm.sh:\n{}", run.tool_output());
    assert!(off, "the VM did not finish in 10 minutes; {}", report());
    assert!(
        log.contains(&format!("@@ kernel {release}")),
        "not the kernel {release}*; {}",
        report()
    );
    assert!(log.contains(close_ok), "no '{close_ok}'; {}", report());
    assert!(
        log.contains("demo done: every step checked its result"),
        "{}",
        report()
    );
    for rc in [
        "@@ demo rc=0",
        "@@ close rc=0",
        "@@ client rc=0",
        "@@ server rc=0",
        "@@ rping client rc=0",
        "@@ rping server rc=0",
    ] {
        assert!(log.contains(rc), "no '{rc}'; {}", report());
    }
}
