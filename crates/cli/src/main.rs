//! `softrdma`: command-line tools for softrdma (today: `decode`).

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use softrdma_cli::{decode_capture, DecodeError, DecodeSummary};

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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode { file } => decode(&file),
    }
}
