//! A minimal pcap writer for simulated traffic (whole IP packets, `LINKTYPE_RAW`).
//!
//! Timestamps are the virtual time, with nanosecond resolution, so Wireshark and tshark show the
//! simulation's timeline.

use std::io::{self, Write};

use crate::sim::{TraceEvent, TraceHook, TraceKind};
use core::time::Duration;

/// pcap link type for raw IPv4/IPv6 packets (version taken from the first nibble).
pub const LINKTYPE_RAW: u32 = 101;
/// pcap magic number for nanosecond-resolution timestamps.
const MAGIC_NANOS: u32 = 0xa1b2_3c4d;

/// Writes packets into a pcap stream.
#[derive(Debug)]
pub struct Writer<W: Write> {
    out: W,
}

impl<W: Write> Writer<W> {
    /// Writes the pcap file header and returns the writer.
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&MAGIC_NANOS.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&65_535u32.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_RAW.to_le_bytes());
        out.write_all(&h)?;
        Ok(Writer { out })
    }

    /// Appends one packet captured at virtual time `time`.
    pub fn write_packet(&mut self, time: Duration, packet: &[u8]) -> io::Result<()> {
        let len = u32::try_from(packet.len()).unwrap_or(u32::MAX);
        let secs = u32::try_from(time.as_secs()).unwrap_or(u32::MAX);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&time.subsec_nanos().to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&packet[..len as usize])
    }

    /// Flushes and returns the underlying stream.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Which packets a pcap trace hook records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Capture {
    /// Packets as the senders emitted them (before loss and corruption).
    Sent,
    /// Packets as the receivers got them (after the network's faults).
    Delivered,
}

/// A trace hook for [`crate::Sim::set_trace`] that writes the chosen packets to `out`.
///
/// Write errors stop the capture (the first one is printed to stderr); they never fail the
/// simulation.
pub fn trace_hook<W: Write + 'static>(out: W, capture: Capture) -> io::Result<TraceHook> {
    let mut w = Some(Writer::new(out)?);
    Ok(Box::new(move |ev: &TraceEvent<'_>| {
        let wanted = matches!(
            (capture, ev.kind),
            (Capture::Sent, TraceKind::Sent) | (Capture::Delivered, TraceKind::Delivered { .. })
        );
        if wanted {
            if let Some(writer) = w.as_mut() {
                if let Err(e) = writer.write_packet(ev.time, ev.packet) {
                    eprintln!("pcap capture stopped: {e}");
                    w = None;
                }
            }
        }
    }))
}
