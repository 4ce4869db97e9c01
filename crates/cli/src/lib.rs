//! The `softrdma` command-line tools, as a library so that their output can be tested.
//!
//! This is the top layer of softrdma. It holds `softrdma decode`, a tcpdump-style decoder
//! for RoCEv2 captures built on the `wire` codec, and the device tools built on the
//! `softrdma` API: `devinfo`, `pingpong`, the perftest-compatible benchmarks ([`perf`]) with
//! their raw-socket [`baseline`], and `demo`; [`stat`], the host daemon's counters; and
//! [`exec`], which runs any RDMA program on softrdma (drop-ins, daemon, and a private view
//! of `/sys/class/infiniband` and `/dev/infiniband`).
//!
//! The device tools open softrdmad's device when a daemon answers and serves their address,
//! else an embedded one, as the API does; `--backend` chooses (see [`tool::DeviceOptions`]),
//! and each tool prints which backend it uses.

#![warn(missing_docs)]

pub mod baseline;
pub mod capture;
pub mod decode;
pub mod demo;
pub mod devinfo;
pub mod exec;
pub mod link;
pub mod perf;
pub mod pingpong;
pub mod stat;
pub mod tool;

use std::io::{Read, Write};
use std::time::Duration;

pub use capture::{CaptureError, CaptureReader, Record};
pub use decode::{
    decode_frame, decode_frame_packets, decode_ip, decode_ip_packets, Decoded, Verdict,
};

/// Counts of what `decode` saw in a capture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeSummary {
    /// Packets decoded: one per record, but one per packet of a GSO train recorded uncut.
    pub packets: u64,
    /// RoCEv2 packets whose ICRC verifies.
    pub roce_ok: u64,
    /// RoCEv2 packets whose ICRC does not verify.
    pub roce_bad_icrc: u64,
    /// Packets to UDP port 4791 that are not valid RoCEv2.
    pub malformed: u64,
    /// Packets that are not RoCEv2 at all.
    pub not_roce: u64,
}

/// Formats a capture timestamp as tcpdump does by default: UTC time of day, microseconds.
pub fn format_timestamp(ts: Duration) -> String {
    let secs = ts.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:06}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60,
        ts.subsec_micros()
    )
}

/// Formats one record as full output lines (without newline), one per packet (several for a
/// GSO train recorded uncut): record index (from 1), time, packet.
pub fn format_record(index: u64, rec: &Record) -> Vec<(String, Verdict)> {
    let cut = (rec.data.len() as u64) < u64::from(rec.orig_len);
    decode_frame_packets(rec.linktype, &rec.data)
        .into_iter()
        .map(|d| {
            let mut line = format!("{index} {} {}", format_timestamp(rec.timestamp), d.text);
            if cut {
                line.push_str(&format!(
                    " [captured {} of {} bytes]",
                    rec.data.len(),
                    rec.orig_len
                ));
            }
            (line, d.verdict)
        })
        .collect()
}

/// Why `decode` stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The capture could not be read (further); the summary covers what was printed.
    #[error("{error}")]
    Capture {
        /// What went wrong.
        #[source]
        error: CaptureError,
        /// What was decoded before it.
        summary: DecodeSummary,
    },
    /// Writing the output failed (e.g. a closed pipe).
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// Decodes every packet of a pcap / pcapng stream, one line each to `out`.
///
/// Bad packets get a line saying what is wrong and decoding goes on; a damaged file stops
/// decoding at the damage with [`DecodeError::Capture`].
pub fn decode_capture<R: Read, W: Write>(
    input: R,
    out: &mut W,
) -> Result<DecodeSummary, DecodeError> {
    let mut summary = DecodeSummary::default();
    let mut records = 0;
    let mut reader = match CaptureReader::new(input) {
        Ok(r) => r,
        Err(error) => return Err(DecodeError::Capture { error, summary }),
    };
    while let Some(rec) = reader.next_record() {
        let rec = match rec {
            Ok(r) => r,
            Err(error) => return Err(DecodeError::Capture { error, summary }),
        };
        records += 1;
        for (line, verdict) in format_record(records, &rec) {
            writeln!(out, "{line}")?;
            summary.packets += 1;
            match verdict {
                Verdict::RoceOk => summary.roce_ok += 1,
                Verdict::RoceBadIcrc => summary.roce_bad_icrc += 1,
                Verdict::Malformed(_) => summary.malformed += 1,
                Verdict::NotRoce => summary.not_roce += 1,
            }
        }
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_read_as_time_of_day() {
        let ts = Duration::new(1_700_000_000 + 3_661, 123_456_789);
        assert_eq!(format_timestamp(ts), "23:14:21.123456");
    }
}
