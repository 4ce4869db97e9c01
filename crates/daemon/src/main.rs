//! `softrdmad`: the host-wide softrdma daemon. Runs in the foreground (systemd runs it the
//! same way, see `dist/softrdmad.service`); logs with `tracing` (`RUST_LOG` filters).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use daemon::host::{Device, DeviceConfig};
use daemon::memory::SharedRegions;
use daemon::server::{self, Daemon, Stats};

/// The softrdma host daemon: one soft RoCEv2 NIC per interface, shared by every local process.
#[derive(Debug, Parser)]
#[command(name = "softrdmad", version)]
struct Args {
    /// Serve these addresses, one device each (repeatable). Default: every IPv4/IPv6 address
    /// of the host's interfaces, one device per interface (loopback only with --loopback or
    /// when it is the only interface).
    #[arg(long = "addr", value_name = "IP")]
    addrs: Vec<IpAddr>,
    /// Include the loopback interface in the default device list.
    #[arg(long)]
    loopback: bool,
    /// UDP port to receive RoCEv2 on.
    #[arg(long, default_value_t = wire::ROCEV2_UDP_PORT)]
    port: u16,
    /// UDP port peers receive on (default: --port).
    #[arg(long)]
    remote_port: Option<u16>,
    /// Control socket path.
    #[arg(long, env = "SOFTRDMA_DAEMON_SOCKET", default_value = abi::client::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Device name prefix.
    #[arg(long, default_value = "srxe")]
    name_prefix: String,
    /// Microseconds each device's progress thread keeps polling (its sockets and the
    /// clients' work rings) after the last activity before it sleeps: while it polls,
    /// posting costs clients no system call and a packet no wakeup; 0: sleep at once and be
    /// woken by a doorbell for every burst. The same knob as the embedded device's
    /// `busy_poll`.
    #[arg(long, default_value_t = daemon::host::DEFAULT_BUSY_POLL.as_micros() as u64)]
    busy_poll_us: u64,
    /// Where received packets come from: `auto` (default) is `raw` where softrdmad may open
    /// a raw socket (root or CAP_NET_RAW), else `udp`. `raw`: a raw socket sees every
    /// sender's IP header, so every ICRC is checked exactly, all 32 bits. `udp`: a UDP
    /// socket hides the header; packets are checked with it rebuilt as softrdma sends it
    /// (IPv4 ID 0), and for IPv4 senders that number their packets (Linux Soft-RoCE) the one
    /// ID for which the ICRC holds is found: such packets keep 16 of the 32 check bits.
    /// Packets for which no ID holds are dropped and counted (rx_bad_icrc); recovered IDs
    /// are counted (rx_icrc_id_recovered).
    #[arg(long, value_enum, default_value_t = RxPathArg::Auto)]
    rx_path: RxPathArg,
    /// Most work rings (shared-memory send, receive and shared receive queues) one client
    /// connection may hold; past it the client posts to its other queues by request (the
    /// `ring_refusals` counter counts the refusals). At most 65536.
    #[arg(long, default_value_t = server::MAX_WORK_RINGS_PER_CONNECTION, value_name = "N")]
    max_work_rings: usize,
    /// Record every packet the devices send and receive into this pcap file (as
    /// `SOFTRDMA_CAPTURE` does); `softrdma decode` and tshark read it.
    #[arg(long, env = "SOFTRDMA_CAPTURE", value_name = "FILE.pcap")]
    capture: Option<PathBuf>,
}

/// `--rx-path`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RxPathArg {
    /// A UDP socket (no privilege).
    Udp,
    /// A raw socket (CAP_NET_RAW).
    Raw,
    /// Raw where permitted, else UDP.
    Auto,
}

/// The host's interfaces and their addresses, in interface order. IPv6 link-local addresses
/// are left out: they need a scope on every packet, which the engine's paths do not carry.
fn interfaces() -> std::io::Result<BTreeMap<String, (bool, Vec<IpAddr>)>> {
    use nix::net::if_::InterfaceFlags;
    let mut out: BTreeMap<String, (bool, Vec<IpAddr>)> = BTreeMap::new();
    for ifa in nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)? {
        if !ifa.flags.contains(InterfaceFlags::IFF_UP) {
            continue;
        }
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(v4) = addr.as_sockaddr_in() {
            IpAddr::V4(v4.ip())
        } else if let Some(v6) = addr.as_sockaddr_in6() {
            let ip = v6.ip();
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                continue;
            }
            IpAddr::V6(ip)
        } else {
            continue;
        };
        let e = out
            .entry(ifa.interface_name.clone())
            .or_insert_with(|| (ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK), Vec::new()));
        if !e.1.contains(&ip) {
            e.1.push(ip);
        }
    }
    Ok(out)
}

fn device_addresses(args: &Args) -> std::io::Result<Vec<(String, Vec<IpAddr>)>> {
    if !args.addrs.is_empty() {
        return Ok(args
            .addrs
            .iter()
            .map(|a| (a.to_string(), vec![*a]))
            .collect());
    }
    let all = interfaces()?;
    let non_lo = all.values().filter(|(lo, _)| !lo).count();
    Ok(all
        .into_iter()
        .filter(|(_, (lo, _))| !lo || args.loopback || non_lo == 0)
        .map(|(name, (_, addrs))| (name, addrs))
        .collect())
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: under systemd the journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal};
    // Termination signals are taken by a signalfd on the main thread, so the socket file is
    // removed on the way out; every thread started below inherits the blocked mask.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGINT);
    mask.add(Signal::SIGTERM);
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)?;

    let capture = match &args.capture {
        Some(p) if !p.as_os_str().is_empty() => Some(runtime::Capture::create(p)?),
        _ => None,
    };
    server::set_max_work_rings_per_connection(args.max_work_rings);
    let regions = SharedRegions::default();
    let mut devices = Vec::new();
    for (i, (iface, addrs)) in device_addresses(args)?.into_iter().enumerate() {
        let name = format!("{}{i}", args.name_prefix);
        let dev = Device::start(
            DeviceConfig {
                name: name.clone(),
                addrs: addrs.clone(),
                port: args.port,
                remote_port: args.remote_port.unwrap_or(args.port),
                rx_path: match args.rx_path {
                    RxPathArg::Udp => runtime::RxPath::Udp,
                    RxPathArg::Raw => runtime::RxPath::Raw,
                    RxPathArg::Auto => runtime::RxPath::Auto,
                },
            },
            regions.clone(),
        )?;
        dev.set_busy_poll(std::time::Duration::from_micros(args.busy_poll_us));
        if let Some(cap) = &capture {
            dev.runtime().set_capture(Some(cap.clone()));
        }
        tracing::info!(device = %name, interface = %iface, ?addrs, port = args.port, "device up");
        devices.push(dev);
    }
    if devices.is_empty() {
        return Err("no addresses to serve".into());
    }
    daemon::host::link_devices(&devices);
    let listener = server::bind_control_socket(&args.socket)?;
    tracing::info!(socket = %args.socket.display(), "listening");
    let daemon = Arc::new(Daemon {
        devices,
        regions,
        stats: Stats::default(),
    });
    let d = daemon.clone();
    std::thread::Builder::new()
        .name("softrdmad accept".into())
        .spawn(move || server::serve(d, listener))?;
    let sfd = nix::sys::signalfd::SignalFd::new(&mask)?;
    let sig = sfd.read_signal()?;
    tracing::info!(signal = ?sig.map(|s| s.ssi_signo), "stopping");
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}
