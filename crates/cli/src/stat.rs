//! `softrdma stat`: the counters of the host daemon `softrdmad` and of each of its devices,
//! read over the daemon's control socket.
//!
//! Daemon-wide counters come first (connections, reclaimed clients, refused requests...),
//! then each device's engine counters prefixed with the device name (`srxe0.tx_packets`).

use std::io::Write;
use std::path::PathBuf;

use abi::client::{Client, ClientError};
use clap::Args;

/// Options of `softrdma stat`.
#[derive(Debug, Args)]
pub struct StatArgs {
    /// The daemon's control socket (default: $SOFTRDMA_DAEMON_SOCKET, else the well-known path).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Show only counters whose name contains this text (e.g. a device name, `nak`).
    #[arg(long, value_name = "TEXT")]
    pub filter: Option<String>,
    /// Leave out counters that are zero.
    #[arg(long)]
    pub nonzero: bool,
}

/// Why `softrdma stat` could not show the counters.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StatError {
    /// No daemon answers on the socket.
    #[error("cannot reach softrdmad at {path}: {source} (is the daemon running? start it with `softrdmad`)")]
    Connect {
        /// The socket tried.
        path: PathBuf,
        /// What connecting said.
        source: ClientError,
    },
    /// The daemon answered the request with an error, or not at all.
    #[error("softrdmad did not give its counters: {0}")]
    Request(#[from] ClientError),
    /// Writing the table failed.
    #[error("writing the counters: {0}")]
    Output(#[from] std::io::Error),
}

/// The counters `args` selects, by name, in the daemon's order.
pub fn read(args: &StatArgs) -> Result<Vec<(String, u64)>, StatError> {
    let path = args.socket.clone().unwrap_or_else(abi::client::socket_path);
    let mut client = Client::connect(&path).map_err(|source| StatError::Connect {
        path: path.clone(),
        source,
    })?;
    let all = client.stat()?;
    Ok(all
        .into_iter()
        .filter(|(name, value)| {
            args.filter.as_deref().is_none_or(|f| name.contains(f))
                && (!args.nonzero || *value != 0)
        })
        .collect())
}

/// Print the selected counters as an aligned two-column table.
pub fn run(args: &StatArgs, out: &mut impl Write) -> Result<(), StatError> {
    let counters = read(args)?;
    let width = counters.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    for (name, value) in &counters {
        writeln!(out, "{name:<width$}  {value}")?;
    }
    Ok(())
}
