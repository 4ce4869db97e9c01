//! `softrdma`: command-line tools for softrdma: decode, devinfo, pingpong, the
//! perftest-compatible benchmarks, demo, stat (the host daemon's counters), and exec (run
//! any RDMA program on softrdma).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use softrdma_cli::perf::{PerfArgs, Test};
use softrdma_cli::tool::ToolError;
use softrdma_cli::{
    decode_capture, demo, devinfo, exec, perf, pingpong, stat, DecodeError, DecodeSummary,
};

/// RDMA in software: tools for softrdma.
#[derive(Parser)]
#[command(name = "softrdma", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print one line per packet of a pcap/pcapng capture, decoding RoCEv2 (UDP 4791) headers
    /// and checking each ICRC.
    Decode {
        /// The capture file (pcap or pcapng; Ethernet, raw IP or Linux cooked link types);
        /// `-` reads standard input.
        file: PathBuf,
    },
    /// Show a device's attributes, as ibv_devinfo does.
    Devinfo(devinfo::DevinfoArgs),
    /// Ping-pong messages between two devices, as ibv_rc_pingpong does (server when no peer).
    Pingpong(pingpong::PingpongArgs),
    /// RDMA WRITE bandwidth (ib_write_bw).
    #[command(name = "write_bw", alias = "write-bw")]
    WriteBw(PerfArgs),
    /// RDMA READ bandwidth (ib_read_bw).
    #[command(name = "read_bw", alias = "read-bw")]
    ReadBw(PerfArgs),
    /// SEND bandwidth (ib_send_bw).
    #[command(name = "send_bw", alias = "send-bw")]
    SendBw(PerfArgs),
    /// ATOMIC bandwidth (ib_atomic_bw).
    #[command(name = "atomic_bw", alias = "atomic-bw")]
    AtomicBw(PerfArgs),
    /// RDMA WRITE ping-pong latency (ib_write_lat).
    #[command(name = "write_lat", alias = "write-lat")]
    WriteLat(PerfArgs),
    /// RDMA READ latency (ib_read_lat).
    #[command(name = "read_lat", alias = "read-lat")]
    ReadLat(PerfArgs),
    /// SEND ping-pong latency (ib_send_lat).
    #[command(name = "send_lat", alias = "send-lat")]
    SendLat(PerfArgs),
    /// ATOMIC latency (ib_atomic_lat).
    #[command(name = "atomic_lat", alias = "atomic-lat")]
    AtomicLat(PerfArgs),
    /// A few-second narrated tour of RDMA between two devices on loopback.
    Demo(demo::DemoArgs),
    /// Show the counters of the host daemon softrdmad and of each of its devices.
    Stat(stat::StatArgs),
    /// Run a program on softrdma: the drop-in libibverbs.so.1 and librdmacm.so.1 first on
    /// its library path, softrdmad found or started, and softrdma's devices in
    /// /sys/class/infiniband and /dev/infiniband of a private view of the system.
    Exec(exec::ExecArgs),
    /// Make sure softrdmad answers, starting it when none does, and exit (what `exec` runs
    /// so that the daemon it starts is not the program's child).
    #[command(name = "start-daemon", hide = true)]
    StartDaemon,
}

fn summary_line(s: &DecodeSummary) -> String {
    format!(
        "{} packets: {} RoCEv2 with good ICRC, {} with bad ICRC, {} malformed RoCEv2, {} not RoCEv2",
        s.packets, s.roce_ok, s.roce_bad_icrc, s.malformed, s.not_roce
    )
}

fn decode(file: &Path) -> ExitCode {
    // "-" reads the capture from standard input, as `tcpdump -r -` does.
    let opened: std::io::Result<Box<dyn Read>> = if file == Path::new("-") {
        Ok(Box::new(std::io::stdin().lock()))
    } else {
        File::open(file).map(|f| Box::new(f) as Box<dyn Read>)
    };
    let input = match opened {
        Ok(f) => BufReader::new(f),
        Err(e) => {
            eprintln!("softrdma decode: cannot open {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let res = decode_capture(input, &mut out);
    // A failed flush is reported like any other output error below.
    let flushed = out.flush();
    match (res, flushed) {
        (Ok(summary), Ok(())) => {
            eprintln!("{}", summary_line(&summary));
            ExitCode::SUCCESS
        }
        (Err(DecodeError::Capture { error, summary }), _) => {
            eprintln!("softrdma decode: {}: {error}", file.display());
            eprintln!("{}", summary_line(&summary));
            ExitCode::FAILURE
        }
        // The reader went away (`softrdma decode f.pcap | head`): a normal way to stop.
        (Err(DecodeError::Output(e)), _) | (Ok(_), Err(e))
            if e.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            ExitCode::SUCCESS
        }
        (Err(e), _) => {
            eprintln!("softrdma decode: {e}");
            ExitCode::FAILURE
        }
        (Ok(_), Err(e)) => {
            eprintln!("softrdma decode: cannot write output: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Print a device tool's failure and turn it into the exit status.
fn finish(tool: &str, r: Result<(), ToolError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("softrdma {tool}: {e}");
            if let ToolError::Api(softrdma::Error::Runtime(softrdma::RuntimeError::Bind {
                source,
                ..
            })) = &e
            {
                if source.kind() == std::io::ErrorKind::AddrInUse {
                    // Typically softrdmad, on a port or address this run did not let it
                    // serve, or a device of another program.
                    eprintln!(
                        "softrdma {tool}: hint: another device holds that UDP port (softrdmad, \
                         or another program). Use softrdmad's device (--backend daemon, \
                         without --capture, --busy-poll or another --udp-port), or pick a \
                         free --udp-port."
                    );
                }
            }
            if let ToolError::Api(softrdma::Error::Completion {
                status: softrdma::WcStatus::RetryExcErr,
                ..
            }) = e
            {
                // The usual cause on a real network: datagrams larger than the link MTU are
                // refused (IPv4 DF is always set), so every retry is lost too.
                eprintln!(
                    "softrdma {tool}: hint: the peer never acknowledged. Is it reachable on UDP \
                     4791 (firewall)? Does the path MTU fit the link? A 1500-byte link needs -m 1024."
                );
            }
            ExitCode::FAILURE
        }
    }
}

fn bench(test: Test, args: &PerfArgs) -> ExitCode {
    let mut out = std::io::stdout();
    finish(test.name(), perf::run(test, args, &mut out).map(|_| ()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut out = std::io::stdout();
    match cli.command {
        Command::Decode { file } => decode(&file),
        Command::Devinfo(a) => finish("devinfo", devinfo::run(&a)),
        Command::Pingpong(a) => finish("pingpong", pingpong::run(&a, &mut out).map(|_| ())),
        Command::WriteBw(a) => bench(Test::WriteBw, &a),
        Command::ReadBw(a) => bench(Test::ReadBw, &a),
        Command::SendBw(a) => bench(Test::SendBw, &a),
        Command::AtomicBw(a) => bench(Test::AtomicBw, &a),
        Command::WriteLat(a) => bench(Test::WriteLat, &a),
        Command::ReadLat(a) => bench(Test::ReadLat, &a),
        Command::SendLat(a) => bench(Test::SendLat, &a),
        Command::AtomicLat(a) => bench(Test::AtomicLat, &a),
        Command::Demo(a) => finish("demo", demo::run(&a, &mut out)),
        Command::Exec(a) => exec::main(&a),
        Command::StartDaemon => exec::start_daemon_main(),
        Command::Stat(a) => match stat::run(&a, &mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(stat::StatError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("softrdma stat: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
