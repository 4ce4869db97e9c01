//! `softrdma exec -- PROGRAM`: the program loads the drop-ins, finds softrdmad's devices, and
//! sees them where the kernel puts RDMA devices (`/sys/class/infiniband`, `/dev/infiniband`),
//! in a view of its own that leaves the host as it was. The daemon is served from this test
//! process on a control socket of its own (one device, `srxe0`, on 127.0.0.1); the drop-ins
//! are the ones `cargo test` just built, under the sonames their build scripts link.

mod exec_env;
mod hosts;
mod tools;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use exec_env::{exec, lib_dir, require, test_daemon, DEV};
use tools::{scratch, softrdma, Proc};

const LIMIT: Duration = Duration::from_secs(120);

/// Run a shell script under `softrdma exec`; its output, after requiring success.
fn exec_sh(script: &str) -> String {
    Proc::spawn(script, exec(&["sh", "-c", script])).success(LIMIT)
}

/// `key=value` lines of `out`, by key.
fn value<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in\n{out}"))
}

#[test]
fn a_program_sees_the_device_where_the_kernel_puts_rdma_devices() {
    let d = format!("/sys/class/infiniband/{DEV}");
    let p = format!("{d}/ports/1");
    let out = exec_sh(&format!(
        "echo types0=$(cat {p}/gid_attrs/types/0)
         echo ndevs0=$(cat {p}/gid_attrs/ndevs/0)
         echo gid0=$(cat {p}/gids/0)
         echo state=$(cat {p}/state)
         echo phys_state=$(cat {p}/phys_state)
         echo rate=$(cat {p}/rate)
         echo link_layer=$(cat {p}/link_layer)
         echo node_type=$(cat {d}/node_type)
         echo net=$(ls {d}/device/net)
         echo net_mtu=$(cat {d}/device/net/lo/mtu)
         echo ibdev=$(cat /sys/class/infiniband_verbs/uverbs0/ibdev)
         echo uverbs0=$(stat -L -c %F /dev/infiniband/uverbs0)
         echo alias=$(stat -L -c %F /dev/infiniband/uverbs_{DEV})
         test -r /dev/infiniband/uverbs0 -a -w /dev/infiniband/uverbs0 && echo rw=yes
         exec 3<>/dev/infiniband/uverbs0 && echo opened=yes
         echo tty=$(ls -d /dev/null /dev/pts /dev/shm | tr '\\n' ' ')
         echo net_class=$(ls -d /sys/class/net/lo)
         echo ld=$LD_LIBRARY_PATH"
    ));
    assert_eq!(value(&out, "types0"), "RoCE v2");
    assert_eq!(value(&out, "ndevs0"), "lo");
    assert_eq!(
        value(&out, "gid0"),
        "0000:0000:0000:0000:0000:ffff:7f00:0001"
    );
    assert_eq!(value(&out, "state"), "4: ACTIVE");
    assert_eq!(value(&out, "phys_state"), "5: LinkUp");
    assert_eq!(value(&out, "rate"), "100 Gb/sec (4X EDR)");
    assert_eq!(value(&out, "link_layer"), "Ethernet");
    assert_eq!(value(&out, "node_type"), "1: CA");
    assert_eq!(value(&out, "net"), "lo");
    let host_mtu = std::fs::read_to_string("/sys/class/net/lo/mtu").unwrap();
    assert_eq!(value(&out, "net_mtu"), host_mtu.trim());
    assert_eq!(value(&out, "ibdev"), DEV);
    assert_eq!(value(&out, "uverbs0"), "character special file");
    assert_eq!(value(&out, "alias"), "character special file");
    assert_eq!(value(&out, "rw"), "yes");
    assert_eq!(value(&out, "opened"), "yes");
    // What the view covered is still there.
    assert_eq!(value(&out, "tty"), "/dev/null /dev/pts /dev/shm");
    assert_eq!(value(&out, "net_class"), "/sys/class/net/lo");
    let ld = value(&out, "ld");
    assert!(ld.starts_with(lib_dir().to_str().unwrap()), "{ld}");
}

#[test]
fn the_host_is_not_changed_for_any_other_process() {
    let marks = scratch(&format!("exec-host-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&marks);
    std::fs::create_dir_all(&marks).unwrap();
    let had_ib = Path::new("/sys/class/infiniband").exists();
    let had_dev = Path::new("/dev/infiniband").exists();
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    // The program tells its mount namespace, then waits to be killed.
    let script = format!(
        "readlink /proc/self/ns/mnt > {m}/ns.tmp && mv {m}/ns.tmp {m}/ns && sleep 60",
        m = marks.display()
    );
    let prog = Proc::spawn("exec sleep", exec(&["sh", "-c", &script]));
    let deadline = Instant::now() + LIMIT;
    let inside = loop {
        if let Ok(s) = std::fs::read_to_string(marks.join("ns")) {
            break s.trim().to_string();
        }
        assert!(Instant::now() < deadline, "the program never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    // While it runs: another namespace, and nothing of its view on the host.
    assert_ne!(inside, ns("self").to_string_lossy(), "no private namespace");
    assert_eq!(Path::new("/sys/class/infiniband").exists(), had_ib);
    assert_eq!(Path::new("/dev/infiniband").exists(), had_dev);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for l in mounts.lines() {
        let point = l.split(' ').nth(4).unwrap_or("");
        let leaked = matches!(
            point,
            "/sys/class" | "/dev/infiniband" | "/sys/class/infiniband"
        ) || point.starts_with("/dev/infiniband/")
            || (point == "/dev" && l.contains(" - tmpfs "));
        assert!(!leaked, "the view leaked onto the host: {l}");
    }
    // Inside, /sys/class and /dev are the view's tmpfs mounts.
    let pid = prog.id().to_string();
    let theirs = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    for point in ["/sys/class", "/dev"] {
        assert!(
            theirs
                .lines()
                .any(|l| l.split(' ').nth(4) == Some(point) && l.contains(" - tmpfs ")),
            "no tmpfs on {point} in the program's view:\n{theirs}"
        );
    }
    drop(prog);
    let _ = std::fs::remove_dir_all(&marks);
}

#[test]
fn ibv_devinfo_lists_the_device_with_the_values_sysfs_shows() {
    require("ibv_devinfo", "ibverbs-utils");
    let d = format!("/sys/class/infiniband/{DEV}");
    let out = exec_sh(&format!(
        "ibv_devinfo -v
         echo node_guid=$(cat {d}/node_guid)
         echo sys_image_guid=$(cat {d}/sys_image_guid)
         echo fw_ver=$(cat {d}/fw_ver)
         echo gid0=$(cat {d}/ports/1/gids/0)"
    ));
    assert!(out.contains(&format!("hca_id:\t{DEV}")), "{out}");
    // What the drop-in says through the verbs and what the view shows agree.
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}:")))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in\n{out}"))
    };
    assert_eq!(field("node_guid"), value(&out, "node_guid"));
    assert_eq!(field("sys_image_guid"), value(&out, "sys_image_guid"));
    assert_eq!(field("fw_ver"), value(&out, "fw_ver"));
    assert_eq!(field("state"), "PORT_ACTIVE (4)");
    // ibv_devinfo prints a GID as an IPv6 address, sysfs as eight groups of hex digits.
    let groups: Vec<u16> = value(&out, "gid0")
        .split(':')
        .map(|g| u16::from_str_radix(g, 16).unwrap())
        .collect();
    let groups: [u16; 8] = groups.try_into().expect("eight groups");
    let gid0 = std::net::Ipv6Addr::from(groups).to_string();
    assert_eq!(field("GID[  0]"), format!("{gid0}, RoCE v2"));
}

#[test]
fn ucx_finds_the_device_and_offers_its_verbs_transports() {
    require("ucx_info", "ucx-utils");
    let out = Proc::spawn("ucx_info -d", exec(&["ucx_info", "-d"])).success(LIMIT);
    // `ucx_info -d` lists each memory domain's transports, each followed by its device.
    let transports: Vec<(String, String)> = out
        .lines()
        .zip(out.lines().skip(1))
        .filter_map(|(a, b)| {
            let t = a.trim().strip_prefix("#      Transport: ")?;
            let d = b.trim().strip_prefix("#         Device: ")?;
            Some((t.to_string(), d.to_string()))
        })
        .collect();
    let on_dev = format!("{DEV}:1");
    for t in ["rc_verbs", "ud_verbs"] {
        assert!(
            transports.contains(&(t.to_string(), on_dev.clone())),
            "no {t} on {on_dev} in {transports:?}:\n{out}"
        );
    }
    assert!(out.contains("# Connection manager: rdmacm"), "{out}");
}

#[test]
fn the_embedded_backend_shows_the_programs_own_device() {
    require("ibv_devinfo", "ibverbs-utils");
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .unwrap()
        .port();
    let dir = lib_dir();
    let mut c = softrdma(&[
        "exec",
        "--backend",
        "embedded",
        "--lib-dir",
        dir.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "ls /sys/class/infiniband; ibv_devinfo; echo backend=$SOFTRDMA_BACKEND",
    ]);
    c.env("SOFTRDMA_PORT", port.to_string())
        .env_remove("SOFTRDMA_DEVICE")
        .env_remove("SOFTRDMA_ADDR");
    let out = Proc::spawn("exec --backend embedded", c).success(LIMIT);
    assert!(out.starts_with("softrdma0\n"), "{out}");
    assert!(out.contains("hca_id:\tsoftrdma0"), "{out}");
    assert_eq!(value(&out, "backend"), "embedded");
}

#[test]
fn bad_input_is_refused_with_a_clear_message() {
    let dir = lib_dir();
    let lib = dir.to_str().unwrap();
    let cases: [(&[&str], i32, &str); 7] = [
        (&["exec"], 2, "required arguments were not provided"),
        (&["exec", "--"], 2, "required arguments were not provided"),
        (
            &["exec", "--backend", "nic", "--", "true"],
            2,
            "invalid value 'nic'",
        ),
        (
            &["exec", "--lib-dir", lib, "--", ""],
            125,
            "the program name is empty",
        ),
        (
            &["exec", "--lib-dir", "/nonexistent", "--", "true"],
            125,
            "no libibverbs.so.1 in /nonexistent",
        ),
        (
            &["exec", "--lib-dir", lib, "--", "/nonexistent/program"],
            127,
            "/nonexistent/program: No such file or directory",
        ),
        (
            &["exec", "--lib-dir", lib, "--", "/etc/passwd"],
            126,
            "/etc/passwd: Permission denied",
        ),
    ];
    for (args, code, msg) in cases {
        let mut c = softrdma(args);
        c.env("SOFTRDMA_DAEMON_SOCKET", &test_daemon().0)
            .env("SOFTRDMA_DAEMON_SPAWN", "0");
        let o = Proc::spawn(&args.join(" "), c).wait(LIMIT);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(msg), "{args:?}: {msg:?} missing from {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // No daemon, and starting one is turned off: said so, before any program runs.
    let mut c = softrdma(&["exec", "--lib-dir", lib, "--", "true"]);
    c.env("SOFTRDMA_DAEMON_SOCKET", "/nonexistent/softrdmad.sock")
        .env("SOFTRDMA_DAEMON_SPAWN", "0")
        .env_remove("SOFTRDMA_BACKEND");
    let o = Proc::spawn("exec without a daemon", c).wait(LIMIT);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("starting one is turned off"), "{err}");
}

#[test]
fn an_unprivileged_user_gets_the_view_in_a_user_namespace() {
    if !nix::unistd::geteuid().is_root() || !Path::new("/usr/bin/setpriv").exists() {
        eprintln!("skipped: needs root (to become another user) and setpriv");
        return;
    }
    let as_nobody = |prog: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .args(prog);
        c
    };
    // Whether this kernel lets an unprivileged user make a user namespace at all.
    let userns = as_nobody(&["unshare", "--user", "--map-current-user", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !userns {
        eprintln!("skipped: unprivileged user namespaces are turned off here");
        return;
    }
    let dir = lib_dir();
    let script = format!(
        "id -u; cat /sys/class/infiniband/{DEV}/ports/1/gid_attrs/types/0
         exec 3<>/dev/infiniband/uverbs0 && echo opened"
    );
    let mut c = as_nobody(&[
        tools::bin(),
        "exec",
        "--lib-dir",
        dir.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ]);
    c.env("SOFTRDMA_DAEMON_SOCKET", &test_daemon().0)
        .env("SOFTRDMA_DAEMON_SPAWN", "0");
    let out = Proc::spawn("exec as nobody", c).success(LIMIT);
    assert_eq!(out, "65534\nRoCE v2\nopened\n");
}

/// rdma-core's pyverbs suite (Debian python3-pyverbs).
const SUITE: &str = "/usr/share/doc/rdma-core/tests";

/// Tests `-k test_rdmacm` runs that may end otherwise than `ok`: (what their report line
/// holds, how it ends, the reason the program printed).
const RDMACM_EXPECTED: [(&str, &str, &str); 1] = [
    // tests.test_mlx5_rdmacm, skipped by the suite itself on every device but mlx5 (its
    // line shows the docstring).
    (
        "using DC as an external QP",
        "... skipped 'Can not run the test over non MLX5 device'",
        "",
    ),
];

#[test]
fn pyverbs_rdmacm_tests_run_and_pass_under_exec() {
    if !Path::new(SUITE).join("run_tests.py").exists() {
        require("/usr/bin/python3", "python3");
        let _ = Command::new("apt-get")
            .args([
                "install",
                "-y",
                "--no-install-recommends",
                "python3-pyverbs",
            ])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status();
    }
    assert!(
        Path::new(SUITE).join("run_tests.py").exists(),
        "python3-pyverbs is not installed and apt-get could not install it"
    );
    require("ip", "iproute2");
    // A private, unpacked copy of the suite (some of its files ship gzipped).
    let root = scratch(&format!("exec-pyverbs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cp -r {SUITE} {r} && gunzip -f {r}/tests/*.gz",
            r = root.display()
        ))
        .status()
        .unwrap();
    assert!(st.success(), "copying the suite failed");
    let mut c = exec(&[
        "/usr/bin/python3",
        "tests/run_tests.py",
        "-v",
        "-k",
        "test_rdmacm",
    ]);
    c.current_dir(&root);
    let o = Proc::spawn("pyverbs test_rdmacm", c).wait(Duration::from_secs(600));
    // unittest reports on stderr.
    let report = String::from_utf8_lossy(&o.stderr).into_owned();
    let ran: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("Ran ")?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no test ran:\n{report}"));
    assert_eq!(ran, 11, "{report}");
    // The suite looks for /sys/class/infiniband/<dev>/device/net/: found, nothing skips
    // for the want of it.
    assert!(!report.contains("have net interface"), "{report}");
    // One line per test: "name (module.Class.name) ... result", or the docstring's first
    // line in place of the name.
    let printed = String::from_utf8_lossy(&o.stdout);
    let results: Vec<&str> = report.lines().filter(|l| l.contains(" ... ")).collect();
    assert_eq!(results.len(), ran, "{report}");
    for line in &results {
        let expected = RDMACM_EXPECTED
            .iter()
            .find(|(what, _, _)| line.contains(what));
        let fine = line.ends_with(" ... ok")
            || expected.is_some_and(|(_, end, why)| {
                line.ends_with(end) && (printed.contains(why) || report.contains(why))
            });
        assert!(fine, "unexpected result: {line}\n{printed}\n{report}");
    }
    let passed = results.iter().filter(|l| l.ends_with(" ... ok")).count();
    assert_eq!(passed, 10, "{passed} of {ran} passed:\n{report}");
    let _ = std::fs::remove_dir_all(&root);
}
