//! `softrdma exec`: run any RDMA program on softrdma, unmodified.
//!
//! Three things stand between a verbs or rdma_cm program and softrdma's devices, and this
//! command provides each, for that program (and its children) only:
//!
//! 1. **The libraries.** The drop-ins `libibverbs.so.1` and `librdmacm.so.1` come first on
//!    its `LD_LIBRARY_PATH` (the folder holding them: `--lib-dir`, else beside this
//!    executable, as `cargo build` leaves them, else `../lib/softrdma`).
//! 2. **The devices.** On the daemon backend (the default) a `softrdmad` must answer: the
//!    one on the control socket, else one started as the drop-in would start it
//!    ([`softrdma::raw::daemon_devices`]). It is started before anything else, so it runs in
//!    the host's namespaces, for every process, not in the program's view; and from a
//!    helper process (this executable's hidden `start-daemon`) that exits once the daemon
//!    answers, so that the daemon is nobody's child: not the program's (which this process
//!    becomes), and not waited for by a thread here (a user namespace is only made by a
//!    single-threaded process).
//! 3. **What programs probe before they use a device.** UCX opens no device unless
//!    `/dev/infiniband/<dev_name>` is a character device it may read and write, and reads
//!    each GID's type from `/sys/class/infiniband/<dev>/ports/<p>/gid_attrs/types/<i>`;
//!    rdma-core's tests want `/sys/class/infiniband/<dev>/device/net/<netdev>`; others read
//!    the GUIDs, the port state and rate. The program runs in a view of the system in which
//!    softrdma's devices are there as a kernel RDMA device's would be ([`view_entries`]),
//!    every value queried from the device itself.
//!
//! The view is a private mount namespace (`unshare(CLONE_NEWNS)`, every mount made a slave
//! first, so nothing mounted here propagates back to the host). Sysfs and devtmpfs take no
//! new directories, so a tmpfs goes over `/sys/class` and one over `/dev`, the entries they
//! covered are bound back into them (recursively, submounts such as `/dev/pts` and
//! `/dev/shm` included), and softrdma's entries are added beside them: `infiniband` and
//! `infiniband_verbs` under `/sys/class` (holding softrdma's devices only, as the drop-in
//! lists only those), `infiniband` under `/dev`, whose character devices are `/dev/null`
//! bound onto files (no `mknod`). The `/sys/class` tmpfs is then made read-only. Nothing
//! on the host changes; the namespace ends with the last process in it.
//!
//! Not root (no `CAP_SYS_ADMIN`): the namespace is made inside a new user namespace that
//! maps only the caller's uid and gid to themselves. Limits: the kernel must allow
//! unprivileged user namespaces (some distributions turn them off:
//! `kernel.unprivileged_userns_clone`, `kernel.apparmor_restrict_unprivileged_userns`);
//! files of other users show as `nobody`; set-uid programs gain nothing and
//! `setgroups` is denied.

use std::convert::Infallible;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::ErrorKind;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use engine::PortState;
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use softrdma::raw::PortLink;
use softrdma::{BackendKind, Device, Gid};

use crate::devinfo::guid_text;
use crate::tool::BackendArg;

/// The drop-ins the program must load, by soname.
pub const DROP_INS: [&str; 2] = ["libibverbs.so.1", "librdmacm.so.1"];

/// Options of `softrdma exec`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExecArgs {
    /// Backend of the program's devices: daemon (softrdmad's devices; one is started when
    /// none answers) or embedded (a device inside the program, on $SOFTRDMA_DEVICE,
    /// default 127.0.0.1, UDP port $SOFTRDMA_PORT, default 4791). Default:
    /// $SOFTRDMA_BACKEND, else daemon. Given, it sets $SOFTRDMA_BACKEND for the program.
    #[arg(long, value_enum, value_name = "KIND")]
    pub backend: Option<BackendArg>,
    /// Folder holding the drop-ins libibverbs.so.1 and librdmacm.so.1. Default: the folder
    /// of this executable (as `cargo build` leaves them), else ../lib/softrdma from it.
    #[arg(long, value_name = "DIR")]
    pub lib_dir: Option<PathBuf>,
    /// The program to run (looked up on PATH) and its arguments; put `--` before it when
    /// its arguments start with `-`.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    pub command: Vec<OsString>,
}

/// Why `softrdma exec` could not run the program.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// The drop-in libraries are not where they were looked for.
    #[error(
        "no {missing} in {} (build the drop-ins with `cargo build -p softrdma-ibverbs \
         -p softrdma-rdmacm`, or name their folder with --lib-dir)",
        dir.display()
    )]
    NoDropIns {
        /// The folder searched (the first, when several were: beside this executable).
        dir: PathBuf,
        /// The soname not found there.
        missing: &'static str,
    },
    /// Finding, starting or querying the devices failed.
    #[error(transparent)]
    Api(#[from] softrdma::Error),
    /// No daemon answers and none could be started; why.
    #[error("{0}")]
    Daemon(String),
    /// A system call making the view failed.
    #[error("{what}: {source}")]
    Sys {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Bad input clap could not catch.
    #[error("{0}")]
    Usage(String),
    /// The program could not be started.
    #[error("{}: {source}", program.to_string_lossy())]
    Program {
        /// The program named.
        program: OsString,
        /// Why `execve` failed.
        source: std::io::Error,
    },
}

impl ExecError {
    /// The exit status for this failure, as `env` and shells use them: 127 when the program
    /// is not found, 126 when it cannot be run, 125 when this command itself failed.
    pub fn exit_code(&self) -> u8 {
        match self {
            ExecError::Program { source, .. } if source.kind() == ErrorKind::NotFound => 127,
            ExecError::Program { .. } => 126,
            _ => 125,
        }
    }
}

fn sys(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ExecError {
    let what = what.into();
    move |source| ExecError::Sys { what, source }
}

fn nix_sys(what: impl Into<String>) -> impl FnOnce(nix::Error) -> ExecError {
    let what = what.into();
    move |e| ExecError::Sys {
        what,
        source: std::io::Error::from(e),
    }
}

/// Run `softrdma exec`: print why it failed and return the exit status; on success the
/// program has replaced this process and nothing returns.
pub fn main(args: &ExecArgs) -> ExitCode {
    match run(args) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("softrdma exec: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Set the program up as the module docs say and `execve` it; returns only on failure.
pub fn run(args: &ExecArgs) -> Result<Infallible, ExecError> {
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(ExecError::Usage("no program to run".into()));
    };
    if program.is_empty() {
        return Err(ExecError::Usage("the program name is empty".into()));
    }
    let lib_dir = drop_in_dir(args.lib_dir.as_deref())?;
    let kind = match args.backend {
        Some(b) => b.into(),
        None => BackendKind::from_env()?.unwrap_or(BackendKind::Daemon),
    };
    let devices = query_devices(kind)?;
    enter_view(&view_entries(&devices))?;

    let mut c = std::process::Command::new(program);
    c.args(program_args)
        .env("LD_LIBRARY_PATH", library_path(&lib_dir));
    if args.backend.is_some() {
        let name = match kind {
            BackendKind::Embedded => "embedded",
            _ => "daemon",
        };
        c.env(softrdma::BACKEND_ENV, name);
    }
    let source = c.exec();
    Err(ExecError::Program {
        program: program.clone(),
        source,
    })
}

/// The folder holding both drop-ins: `given`, else beside this executable, else
/// `../lib/softrdma` from it.
pub fn drop_in_dir(given: Option<&Path>) -> Result<PathBuf, ExecError> {
    let candidates: Vec<PathBuf> = match given {
        Some(d) => vec![d.to_path_buf()],
        None => {
            let exe = std::env::current_exe().map_err(sys("cannot find this executable"))?;
            let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
            vec![dir.clone(), dir.join("../lib/softrdma")]
        }
    };
    let mut first_miss = None;
    for dir in candidates {
        match DROP_INS.iter().find(|so| !dir.join(so).is_file()) {
            None => {
                // The program may run in another folder: make the path absolute.
                return std::fs::canonicalize(&dir)
                    .map_err(sys(format!("cannot resolve {}", dir.display())));
            }
            Some(missing) => {
                first_miss.get_or_insert((dir, *missing));
            }
        }
    }
    // Every list above holds a folder, so a miss was recorded.
    let (dir, missing) = first_miss.expect("at least one candidate folder");
    Err(ExecError::NoDropIns { dir, missing })
}

/// `LD_LIBRARY_PATH` for the program: the drop-ins' folder, then what it was.
fn library_path(dir: &Path) -> OsString {
    let mut v = dir.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// One device as the view shows it: what its queries returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceView {
    /// Its name, as the drop-in lists it (`srxe0`..., `softrdma0` embedded).
    pub name: String,
    /// Node GUID, host order ([`softrdma::raw::node_guid`]).
    pub node_guid: u64,
    /// Firmware version string.
    pub fw_ver: String,
    /// Port 1, its only port.
    pub port: PortView,
}

/// Port 1 of a device as the view shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortView {
    /// Logical state.
    pub state: PortState,
    /// Width, speed, physical state and capabilities.
    pub link: PortLink,
    /// The GID table, in order.
    pub gids: Vec<Gid>,
    /// The interface holding each GID's address (`None`: on none), index for index.
    pub netdevs: Vec<Option<String>>,
    /// Entries of the P_Key table (index 0 is the default P_Key).
    pub pkey_tbl_len: u16,
}

/// Query the devices the program will see on backend `kind`.
fn query_devices(kind: BackendKind) -> Result<Vec<DeviceView>, ExecError> {
    let ifaces = interface_addresses()?;
    match kind {
        BackendKind::Embedded => {
            // The device the drop-in makes in the program: on $SOFTRDMA_DEVICE (else
            // $SOFTRDMA_ADDR, else 127.0.0.1), UDP port $SOFTRDMA_PORT (else 4791). Opening
            // it here for a moment binds that port; the program binds it again.
            let addr_var = [softrdma::DEVICE_ENV, "SOFTRDMA_ADDR"]
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()));
            let addr: IpAddr = match addr_var {
                Some(v) => v.trim().parse().map_err(|_| {
                    ExecError::Usage(format!(
                        "{}={v}: the embedded backend needs an IP address",
                        softrdma::DEVICE_ENV
                    ))
                })?,
                None => IpAddr::from([127, 0, 0, 1]),
            };
            let port = match std::env::var("SOFTRDMA_PORT") {
                Ok(v) => v
                    .trim()
                    .parse()
                    .map_err(|_| ExecError::Usage(format!("SOFTRDMA_PORT={v}: not a UDP port")))?,
                Err(_) => 4791,
            };
            let dev = Device::builder(addr)
                .backend(BackendKind::Embedded)
                .port(port)
                .open()?;
            Ok(vec![device_view(
                &dev,
                "softrdma0",
                softrdma::raw::node_guid(addr, port),
                &ifaces,
            )?])
        }
        _ => {
            ensure_daemon()?;
            let mut out = Vec::new();
            for d in softrdma::raw::daemon_devices(None)? {
                let Some(&addr) = d.addrs.first() else {
                    continue;
                };
                let dev = Device::builder(addr)
                    .backend(BackendKind::Daemon)
                    .spawn_daemon(false)
                    .open()?;
                let guid = softrdma::raw::node_guid(addr, d.port);
                out.push(device_view(&dev, &d.name, guid, &ifaces)?);
            }
            Ok(out)
        }
    }
}

/// Make sure a daemon answers on the control socket: when none does, run this executable's
/// `start-daemon` (see the module docs), which starts one as the drop-in would, or says why
/// it cannot.
fn ensure_daemon() -> Result<(), ExecError> {
    if abi::client::Client::connect(abi::client::socket_path()).is_ok() {
        return Ok(());
    }
    let exe = std::env::current_exe().map_err(sys("cannot find this executable"))?;
    let out = std::process::Command::new(exe)
        .arg(START_DAEMON)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .map_err(sys("cannot run softrdma start-daemon"))?;
    if out.status.success() {
        return Ok(());
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
    Err(ExecError::Daemon(if why.is_empty() {
        format!("softrdma start-daemon failed ({})", out.status)
    } else {
        why
    }))
}

/// The hidden subcommand that starts the daemon for `softrdma exec`.
pub const START_DAEMON: &str = "start-daemon";

/// `softrdma start-daemon`: make sure softrdmad answers (starting it as the drop-in would),
/// then exit, leaving it to run on its own.
pub fn start_daemon_main() -> ExitCode {
    match softrdma::raw::daemon_devices(None) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// What the view shows of open device `dev`.
fn device_view(
    dev: &Device,
    name: &str,
    node_guid: u64,
    ifaces: &[(IpAddr, String)],
) -> Result<DeviceView, ExecError> {
    let attr = dev.query_device();
    let port = dev.query_port()?;
    let gids = dev.gids();
    let netdevs = gids
        .iter()
        .map(|g| {
            let ip = g.to_ip();
            ifaces
                .iter()
                .find(|(a, _)| *a == ip)
                .map(|(_, n)| n.clone())
        })
        .collect();
    Ok(DeviceView {
        name: name.to_string(),
        node_guid,
        fw_ver: attr.fw_ver.clone(),
        port: PortView {
            state: port.state,
            link: PortLink::of(port.state),
            gids,
            netdevs,
            pkey_tbl_len: port.pkey_tbl_len,
        },
    })
}

/// Every address of the host's interfaces, with the interface's name.
fn interface_addresses() -> Result<Vec<(IpAddr, String)>, ExecError> {
    let ifaces = nix::ifaddrs::getifaddrs().map_err(nix_sys("cannot list the interfaces"))?;
    Ok(ifaces
        .filter_map(|ifa| {
            let a = ifa.address?;
            let ip = match (a.as_sockaddr_in(), a.as_sockaddr_in6()) {
                (Some(v4), _) => IpAddr::V4(v4.ip()),
                (None, Some(v6)) => IpAddr::V6(v6.ip()),
                _ => return None,
            };
            Some((ip, ifa.interface_name))
        })
        .collect())
}

/// What the view adds to the system: a folder, a file and its text, a symbolic link and
/// its target, or a character device the program may open for reading and writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A folder.
    Dir,
    /// A read-only file holding this text.
    File(String),
    /// A symbolic link to this target.
    Link(String),
    /// A character device anyone may open for reading and writing (`/dev/null`'s).
    CharDevice,
}

/// The view's top folders this command puts a tmpfs over, and the entries of theirs it
/// replaces rather than binds back.
pub const COVERED: [(&str, &[&str]); 2] = [
    ("/sys/class", &["infiniband", "infiniband_verbs"]),
    ("/dev", &["infiniband"]),
];

/// A port's `rate` as the kernel words it (`rate_show` in drivers/infiniband/core/sysfs.c):
/// the lane speed times the width, e.g. `100 Gb/sec (4X EDR)`.
pub fn rate_text(link: &PortLink) -> String {
    // Tenths of Gb/s per lane, and the speed's name (unknown speeds are SDR, as there).
    let (tenths, speed) = match link.active_speed {
        2 => (50, "DDR"),
        4 => (100, "QDR"),
        8 => (100, "FDR10"),
        16 => (140, "FDR"),
        32 => (250, "EDR"),
        64 => (500, "HDR"),
        128 => (1000, "NDR"),
        _ => (25, "SDR"),
    };
    let width: u32 = match link.active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => 0,
    };
    let rate = tenths * width;
    let half = if rate.is_multiple_of(10) { "" } else { ".5" };
    format!("{}{half} Gb/sec ({width}X {speed})", rate / 10)
}

fn state_text(s: PortState) -> &'static str {
    match s {
        PortState::Active => "4: ACTIVE",
        _ => "1: DOWN",
    }
}

fn phys_state_text(p: u8) -> String {
    let name = match p {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "<unknown>",
    };
    format!("{p}: {name}")
}

/// The files the view adds for `devices`, by absolute path, parents before children: what
/// the kernel shows of an RDMA device under `/sys/class/infiniband/<dev>` (GUIDs, node
/// type, firmware, port 1's state, physical state, rate, LID fields, capability mask, link
/// layer, GIDs with their types and network devices, P_Keys; `device/net/<netdev>` links to
/// the interfaces holding its addresses), `/sys/class/infiniband_verbs/uverbsN/ibdev`, and
/// `/dev/infiniband/uverbsN` and `rdma_cm`. The N-th device is `uverbsN`; the drop-in names
/// its `ibv_device.dev_name` `uverbs_<dev>`, so that name links to `uverbsN` in both places.
pub fn view_entries(devices: &[DeviceView]) -> Vec<(String, Node)> {
    let mut v: Vec<(String, Node)> = Vec::new();
    let mut add = |path: String, node: Node| v.push((path, node));
    let ib = "/sys/class/infiniband";
    let verbs = "/sys/class/infiniband_verbs";
    add(ib.into(), Node::Dir);
    add(verbs.into(), Node::Dir);
    add("/dev/infiniband".into(), Node::Dir);
    add("/dev/infiniband/rdma_cm".into(), Node::CharDevice);
    for (i, d) in devices.iter().enumerate() {
        let dir = format!("{ib}/{}", d.name);
        let file = |name: &str, text: String| (format!("{dir}/{name}"), Node::File(text + "\n"));
        add(dir.clone(), Node::Dir);
        for (name, text) in [
            ("node_type", "1: CA".to_string()),
            ("node_guid", guid_text(d.node_guid)),
            ("sys_image_guid", guid_text(d.node_guid)),
            ("fw_ver", d.fw_ver.clone()),
            ("node_desc", d.name.clone()),
        ] {
            let (p, n) = file(name, text);
            add(p, n);
        }
        // The device's "device": the interfaces under its addresses.
        add(format!("{dir}/device"), Node::Dir);
        add(format!("{dir}/device/net"), Node::Dir);
        let mut netdevs: Vec<&str> = Vec::new();
        for n in d.port.netdevs.iter().flatten() {
            if !netdevs.contains(&n.as_str()) {
                netdevs.push(n);
            }
        }
        for n in &netdevs {
            add(
                format!("{dir}/device/net/{n}"),
                Node::Link(format!("/sys/class/net/{n}")),
            );
        }
        let p = &d.port;
        let port = format!("{dir}/ports/1");
        add(format!("{dir}/ports"), Node::Dir);
        add(port.clone(), Node::Dir);
        for (name, text) in [
            ("state", state_text(p.state).to_string()),
            ("phys_state", phys_state_text(p.link.phys_state)),
            ("rate", rate_text(&p.link)),
            ("lid", "0x0".to_string()),
            ("sm_lid", "0x0".to_string()),
            ("lid_mask_count", "0".to_string()),
            ("sm_sl", "0".to_string()),
            ("cap_mask", format!("{:#010x}", p.link.cap_flags)),
            ("link_layer", "Ethernet".to_string()),
        ] {
            add(format!("{port}/{name}"), Node::File(text + "\n"));
        }
        for sub in [
            "gids",
            "gid_attrs",
            "gid_attrs/types",
            "gid_attrs/ndevs",
            "pkeys",
        ] {
            add(format!("{port}/{sub}"), Node::Dir);
        }
        for (g, gid) in p.gids.iter().enumerate() {
            add(format!("{port}/gids/{g}"), Node::File(format!("{gid}\n")));
            // Every softrdma GID is a RoCEv2 one (UDP 4791), as ibv_query_gid_type says.
            add(
                format!("{port}/gid_attrs/types/{g}"),
                Node::File("RoCE v2\n".into()),
            );
            if let Some(Some(n)) = p.netdevs.get(g) {
                add(
                    format!("{port}/gid_attrs/ndevs/{g}"),
                    Node::File(format!("{n}\n")),
                );
            }
        }
        for k in 0..p.pkey_tbl_len {
            // The default P_Key (IBA 10.9.1.2), the one entry a RoCE port has.
            let key = if k == 0 { "0xffff" } else { "0x0000" };
            add(format!("{port}/pkeys/{k}"), Node::File(format!("{key}\n")));
        }
        let uverbs = format!("uverbs{i}");
        add(format!("{verbs}/{uverbs}"), Node::Dir);
        add(
            format!("{verbs}/{uverbs}/ibdev"),
            Node::File(format!("{}\n", d.name)),
        );
        add(
            format!("{verbs}/uverbs_{}", d.name),
            Node::Link(uverbs.clone()),
        );
        add(format!("/dev/infiniband/{uverbs}"), Node::CharDevice);
        add(
            format!("/dev/infiniband/uverbs_{}", d.name),
            Node::Link(uverbs),
        );
    }
    v
}

/// Enter a private mount namespace holding `entries` (see the module docs).
fn enter_view(entries: &[(String, Node)]) -> Result<(), ExecError> {
    private_mount_namespace()?;
    for (dir, replaced) in COVERED {
        cover(Path::new(dir), replaced)?;
    }
    for (path, node) in entries {
        add_node(Path::new(path), node)?;
    }
    // Sysfs is not the program's to write into.
    let ro = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    nix::mount::mount(None::<&str>, "/sys/class", None::<&str>, ro, None::<&str>)
        .map_err(nix_sys("cannot make /sys/class read-only"))
}

/// Move into a mount namespace of our own whose mounts receive the host's but send none
/// back; in a user namespace of our own first when not privileged.
fn private_mount_namespace() -> Result<(), ExecError> {
    let euid = nix::unistd::geteuid();
    let direct = if euid.is_root() {
        nix::sched::unshare(CloneFlags::CLONE_NEWNS)
    } else {
        Err(nix::Error::EPERM)
    };
    match direct {
        Ok(()) => {}
        Err(nix::Error::EPERM) => user_namespace()?,
        Err(e) => return Err(nix_sys("cannot make a mount namespace (unshare)")(e)),
    }
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(nix_sys(
        "cannot make the namespace's mounts slaves of the host's",
    ))
}

/// `unshare(CLONE_NEWUSER | CLONE_NEWNS)`, mapping the caller's uid and gid to themselves.
fn user_namespace() -> Result<(), ExecError> {
    let threads = thread_count();
    if threads > 1 {
        // The daemon is started from a helper process, and a device opened here joins its
        // threads when closed: nothing should be left running.
        return Err(ExecError::Sys {
            what: format!(
                "cannot make a user namespace: this process has {threads} threads \
                 (the kernel requires one)"
            ),
            source: std::io::Error::from(ErrorKind::Unsupported),
        });
    }
    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
    nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS).map_err(|e| {
        ExecError::Sys {
            what: "cannot make a user namespace (run as root, or allow unprivileged user \
                   namespaces: sysctl kernel.unprivileged_userns_clone=1, and on Ubuntu \
                   kernel.apparmor_restrict_unprivileged_userns=0)"
                .into(),
            source: e.into(),
        }
    })?;
    // setgroups must be denied before an unprivileged process may write gid_map.
    for (file, text) in [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("{uid} {uid} 1")),
        ("/proc/self/gid_map", format!("{gid} {gid} 1")),
    ] {
        std::fs::write(file, text).map_err(sys(format!("cannot write {file}")))?;
    }
    Ok(())
}

/// Threads of this process, from /proc (1 when it cannot be read).
fn thread_count() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(1)
}

/// Put a tmpfs over `dir` and bind its entries back into it (but those named in
/// `replaced`): folders and files bound (recursively, their submounts with them), symbolic
/// links copied.
fn cover(dir: &Path, replaced: &[&str]) -> Result<(), ExecError> {
    let shown = dir.display();
    // Held open across the mount: the covered folder stays reachable through it.
    let orig = File::open(dir).map_err(sys(format!("cannot open {shown}")))?;
    let mut entries: Vec<(OsString, std::fs::FileType)> = Vec::new();
    for e in std::fs::read_dir(dir).map_err(sys(format!("cannot list {shown}")))? {
        let e = e.map_err(sys(format!("cannot list {shown}")))?;
        let ty = e.file_type().map_err(sys(format!("cannot list {shown}")))?;
        if !replaced.iter().any(|r| OsStr::new(r) == e.file_name()) {
            entries.push((e.file_name(), ty));
        }
    }
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID,
        Some("mode=0755"),
    )
    .map_err(nix_sys(format!("cannot mount a tmpfs on {shown}")))?;
    let base = PathBuf::from(format!("/proc/self/fd/{}", orig.as_raw_fd()));
    for (name, ty) in entries {
        let (src, dst) = (base.join(&name), dir.join(&name));
        let made = if ty.is_symlink() {
            std::fs::read_link(&src).and_then(|t| std::os::unix::fs::symlink(t, &dst))
        } else {
            let placeholder = if ty.is_dir() {
                std::fs::create_dir(&dst)
            } else {
                File::create(&dst).map(drop)
            };
            placeholder.and_then(|()| {
                nix::mount::mount(
                    Some(&src),
                    &dst,
                    None::<&str>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&str>,
                )
                .map_err(std::io::Error::from)
            })
        };
        match made {
            Ok(()) => {}
            // Gone since it was listed (a device unplugged): nothing to show.
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(sys(format!("cannot bind {} back", dst.display()))(e)),
        }
    }
    Ok(())
}

/// Create one entry of the view.
fn add_node(path: &Path, node: &Node) -> Result<(), ExecError> {
    let what = || format!("cannot create {}", path.display());
    match node {
        Node::Dir => std::fs::create_dir_all(path).map_err(sys(what())),
        Node::File(text) => {
            std::fs::write(path, text).map_err(sys(what()))?;
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o444))
                .map_err(sys(what()))
        }
        Node::Link(target) => std::os::unix::fs::symlink(target, path).map_err(sys(what())),
        Node::CharDevice => {
            File::create(path).map_err(sys(what()))?;
            nix::mount::mount(
                Some("/dev/null"),
                path,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(nix_sys(format!(
                "cannot bind /dev/null onto {}",
                path.display()
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> DeviceView {
        DeviceView {
            name: "srxe0".into(),
            node_guid: softrdma::raw::node_guid("127.0.0.1".parse().unwrap(), 4791),
            fw_ver: "0.1.0".into(),
            port: PortView {
                state: PortState::Active,
                link: PortLink::of(PortState::Active),
                gids: vec![
                    Gid::from_ip("127.0.0.1".parse().unwrap()),
                    Gid::from_ip("fd00::2".parse().unwrap()),
                ],
                netdevs: vec![Some("lo".into()), None],
                pkey_tbl_len: 1,
            },
        }
    }

    fn text<'a>(v: &'a [(String, Node)], path: &str) -> &'a str {
        match v.iter().find(|(p, _)| p == path) {
            Some((_, Node::File(t))) => t,
            other => panic!("{path}: {other:?}"),
        }
    }

    #[test]
    fn the_view_shows_a_device_as_the_kernel_does() {
        let v = view_entries(&[device()]);
        let d = "/sys/class/infiniband/srxe0";
        assert_eq!(text(&v, &format!("{d}/node_type")), "1: CA\n");
        assert_eq!(text(&v, &format!("{d}/node_guid")), "5352:12b7:7f00:0001\n");
        assert_eq!(text(&v, &format!("{d}/ports/1/state")), "4: ACTIVE\n");
        assert_eq!(text(&v, &format!("{d}/ports/1/phys_state")), "5: LinkUp\n");
        assert_eq!(
            text(&v, &format!("{d}/ports/1/rate")),
            "100 Gb/sec (4X EDR)\n"
        );
        assert_eq!(text(&v, &format!("{d}/ports/1/cap_mask")), "0x04010000\n");
        assert_eq!(
            text(&v, &format!("{d}/ports/1/gids/0")),
            "0000:0000:0000:0000:0000:ffff:7f00:0001\n"
        );
        assert_eq!(
            text(&v, &format!("{d}/ports/1/gids/1")),
            "fd00:0000:0000:0000:0000:0000:0000:0002\n"
        );
        assert_eq!(
            text(&v, &format!("{d}/ports/1/gid_attrs/types/1")),
            "RoCE v2\n"
        );
        assert_eq!(text(&v, &format!("{d}/ports/1/gid_attrs/ndevs/0")), "lo\n");
        // An address on no interface has no network device.
        assert!(!v.iter().any(|(p, _)| p.ends_with("ndevs/1")));
        assert_eq!(text(&v, &format!("{d}/ports/1/pkeys/0")), "0xffff\n");
        assert!(v.contains(&(
            format!("{d}/device/net/lo"),
            Node::Link("/sys/class/net/lo".into())
        )));
        assert_eq!(
            text(&v, "/sys/class/infiniband_verbs/uverbs0/ibdev"),
            "srxe0\n"
        );
        assert!(v.contains(&("/dev/infiniband/uverbs0".into(), Node::CharDevice)));
        assert!(v.contains(&(
            "/dev/infiniband/uverbs_srxe0".into(),
            Node::Link("uverbs0".into())
        )));
    }

    #[test]
    fn parents_come_before_their_children() {
        let v = view_entries(&[device(), device()]);
        for (i, (p, _)) in v.iter().enumerate() {
            let parent = Path::new(p).parent().unwrap().to_str().unwrap();
            let covered = COVERED.iter().any(|(d, _)| *d == parent);
            assert!(
                covered || v[..i].iter().any(|(q, n)| q == parent && *n == Node::Dir),
                "{p} before its folder"
            );
        }
    }

    #[test]
    fn rates_read_as_the_kernel_words_them() {
        let mut l = PortLink::of(PortState::Active);
        assert_eq!(rate_text(&l), "100 Gb/sec (4X EDR)");
        l.active_width = 1;
        l.active_speed = 1;
        assert_eq!(rate_text(&l), "2.5 Gb/sec (1X SDR)");
        l.active_width = 8;
        l.active_speed = 16;
        assert_eq!(rate_text(&l), "168 Gb/sec (12X FDR)");
    }

    #[test]
    fn a_missing_drop_in_is_named_with_the_folder_searched() {
        let dir = std::env::temp_dir().join(format!("softrdma-exec-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libibverbs.so.1"), b"").unwrap();
        let e = drop_in_dir(Some(&dir)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("librdmacm.so.1") && msg.contains(&*dir.to_string_lossy()));
        assert_eq!(e.exit_code(), 125);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
