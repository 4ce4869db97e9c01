//! Reading capture files: classic pcap (any byte order, µs or ns timestamps) and pcapng.
//!
//! The records come out one at a time with their link type, so a reader of a damaged file still
//! gets every packet before the damage, then one error.

use std::io::Read;
use std::time::Duration;

use pcap_file::pcap::PcapReader;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{PcapError, TsResolution};

/// The first four bytes of a pcapng file (a Section Header Block's type).
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

/// Why a capture file could not be read (further).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file header is neither a pcap nor a pcapng header.
    #[error("not a pcap or pcapng file: {0}")]
    BadHeader(String),
    /// A record could not be parsed; the file is truncated or corrupt from this point.
    #[error("bad record after packet {after}: {reason}")]
    BadRecord {
        /// How many packets were read before the bad record.
        after: u64,
        /// What was wrong.
        reason: String,
    },
}

/// One captured packet as the file holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Capture time since the Unix epoch.
    pub timestamp: Duration,
    /// The link type (LINKTYPE_* number) of the interface it was captured on.
    pub linktype: u32,
    /// Length of the packet on the wire (may exceed `data.len()` when the snap length cut it).
    pub orig_len: u32,
    /// The captured bytes, starting at the link-layer header.
    pub data: Vec<u8>,
}

/// Turns a pcap-file error into a one-line reason.
fn reason(e: &PcapError) -> String {
    match e {
        PcapError::IncompleteBuffer => "file ends inside a record".to_owned(),
        PcapError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            "file ends inside a record (truncated capture)".to_owned()
        }
        other => other.to_string(),
    }
}

/// A reader over the records of a pcap or pcapng stream.
pub struct CaptureReader<R: Read> {
    inner: Inner<R>,
    count: u64,
    failed: bool,
}

enum Inner<R: Read> {
    Pcap {
        reader: PcapReader<Prefixed<R>>,
        nanos: bool,
        linktype: u32,
    },
    PcapNg {
        reader: PcapNgReader<Prefixed<R>>,
    },
}

/// A reader that first replays the bytes sniffed for the magic number, then the stream.
struct Prefixed<R> {
    prefix: Vec<u8>,
    pos: usize,
    rest: R,
}

impl<R: Read> Read for Prefixed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos < self.prefix.len() {
            let n = buf.len().min(self.prefix.len() - self.pos);
            buf[..n].copy_from_slice(&self.prefix[self.pos..self.pos + n]);
            self.pos += n;
            return Ok(n);
        }
        self.rest.read(buf)
    }
}

impl<R: Read> CaptureReader<R> {
    /// Reads the file header and prepares to read records.
    pub fn new(mut rest: R) -> Result<Self, CaptureError> {
        let mut prefix = Vec::with_capacity(4);
        (&mut rest)
            .take(4)
            .read_to_end(&mut prefix)
            .map_err(|e| CaptureError::BadHeader(e.to_string()))?;
        if prefix.len() < 4 {
            return Err(CaptureError::BadHeader(format!(
                "file is only {} bytes long",
                prefix.len()
            )));
        }
        let is_ng = prefix[..] == PCAPNG_MAGIC;
        let src = Prefixed {
            prefix,
            pos: 0,
            rest,
        };
        let inner = if is_ng {
            let reader = PcapNgReader::new(src).map_err(|e| CaptureError::BadHeader(reason(&e)))?;
            Inner::PcapNg { reader }
        } else {
            let reader = PcapReader::new(src).map_err(|e| CaptureError::BadHeader(reason(&e)))?;
            let header = reader.header();
            Inner::Pcap {
                nanos: header.ts_resolution == TsResolution::NanoSecond,
                linktype: u32::from(header.datalink),
                reader,
            }
        };
        Ok(CaptureReader {
            inner,
            count: 0,
            failed: false,
        })
    }

    /// The next record, `None` at the end of the file. After an error, always `None`: a pcap
    /// stream has no resynchronisation point.
    pub fn next_record(&mut self) -> Option<Result<Record, CaptureError>> {
        if self.failed {
            return None;
        }
        let res = match &mut self.inner {
            Inner::Pcap {
                reader,
                nanos,
                linktype,
            } => next_pcap(reader, *nanos, *linktype),
            Inner::PcapNg { reader } => next_pcapng(reader),
        };
        match res {
            None => None,
            Some(Ok(rec)) => {
                self.count += 1;
                Some(Ok(rec))
            }
            Some(Err(reason)) => {
                self.failed = true;
                Some(Err(CaptureError::BadRecord {
                    after: self.count,
                    reason,
                }))
            }
        }
    }
}

fn next_pcap<R: Read>(
    reader: &mut PcapReader<R>,
    nanos: bool,
    linktype: u32,
) -> Option<Result<Record, String>> {
    // The raw record, not `next_packet`: that one rejects records whose original length exceeds
    // the snap length, which is exactly what a snap-length-limited capture contains.
    let raw = match reader.next_raw_packet()? {
        Ok(raw) => raw,
        Err(e) => return Some(Err(reason(&e))),
    };
    let frac_ns = if nanos {
        u64::from(raw.ts_frac)
    } else {
        u64::from(raw.ts_frac) * 1000
    };
    // A fraction of a second beyond one second is corrupt but harmless: carry it over.
    let timestamp = Duration::from_secs(u64::from(raw.ts_sec)) + Duration::from_nanos(frac_ns);
    Some(Ok(Record {
        timestamp,
        linktype,
        orig_len: raw.orig_len,
        data: raw.data.into_owned(),
    }))
}

fn next_pcapng<R: Read>(reader: &mut PcapNgReader<R>) -> Option<Result<Record, String>> {
    loop {
        // (interface index, timestamp, original length, bytes), copied out of the block so
        // that the reader can be asked about the interface afterwards.
        let (iface, timestamp, orig_len, data) = match reader.next_block()? {
            Ok(Block::EnhancedPacket(epb)) => (
                epb.interface_id as usize,
                epb.timestamp,
                epb.original_len,
                epb.data.into_owned(),
            ),
            Ok(Block::SimplePacket(spb)) => {
                (0, Duration::ZERO, spb.original_len, spb.data.into_owned())
            }
            // Section headers, interface descriptions, statistics, names: nothing to print.
            Ok(_) => continue,
            Err(e) => return Some(Err(reason(&e))),
        };
        let Some(desc) = reader.interfaces().get(iface) else {
            return Some(Err(format!("packet on undeclared interface {iface}")));
        };
        let linktype = u32::from(desc.linktype);
        let timestamp = interface_time(desc, timestamp);
        return Some(Ok(Record {
            timestamp,
            linktype,
            orig_len,
            data,
        }));
    }
}

/// The real time of a pcapng packet timestamp.
///
/// pcap-file 2.0 returns the raw 64-bit timestamp as if it counted nanoseconds, but its unit is
/// the interface's `if_tsresol` (microseconds when absent, as Wireshark writes it), and
/// `if_tsoffset` seconds are to be added.
fn interface_time(iface: &InterfaceDescriptionBlock<'_>, raw: Duration) -> Duration {
    let units = u64::try_from(raw.as_nanos()).unwrap_or(u64::MAX);
    let mut resol = 6u8;
    let mut offset = 0u64;
    for opt in &iface.options {
        match opt {
            InterfaceDescriptionOption::IfTsResol(r) => resol = *r,
            InterfaceDescriptionOption::IfTsOffset(o) => offset = *o,
            _ => {}
        }
    }
    let ts = scale_units(units, resol);
    ts.checked_add(Duration::from_secs(offset)).unwrap_or(ts)
}

/// `units` ticks of 10^-r seconds (top bit of `resol` clear) or 2^-r seconds (top bit set);
/// zero for resolutions a u64 tick count cannot express.
fn scale_units(units: u64, resol: u8) -> Duration {
    let exp = u32::from(resol & 0x7f);
    let per_sec = if resol & 0x80 == 0 {
        10u64.checked_pow(exp)
    } else {
        1u64.checked_shl(exp).filter(|_| exp < 64)
    };
    let Some(per_sec) = per_sec else {
        return Duration::ZERO;
    };
    let secs = units / per_sec;
    let frac = u128::from(units % per_sec) * 1_000_000_000 / u128::from(per_sec);
    // frac < 10^9 by construction.
    Duration::new(secs, u32::try_from(frac).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcapng_timestamp_units_follow_if_tsresol() {
        assert_eq!(scale_units(1_500_000, 6), Duration::from_millis(1500));
        assert_eq!(scale_units(1_500_000_000, 9), Duration::from_millis(1500));
        assert_eq!(scale_units(3, 0), Duration::from_secs(3));
        assert_eq!(
            scale_units((1 << 20) | (1 << 19), 0x80 | 20),
            Duration::from_millis(1500)
        );
        assert_eq!(scale_units(u64::MAX, 0x80 | 127), Duration::ZERO);
        assert_eq!(scale_units(5, 30), Duration::ZERO);
    }
}
