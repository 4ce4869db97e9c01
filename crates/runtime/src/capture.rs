//! Packet capture: every packet a device sends and receives, as whole IP packets, in a
//! classic pcap file (link type `LINKTYPE_RAW`, 101) that tshark, tcpdump and
//! `softrdma decode` read.
//!
//! What is recorded is what the engine emitted (after any source-port rewrite, so exactly the
//! bytes the peer checks) and what it was handed on receive (the IP and UDP headers rebuilt
//! by the socket layer, see the crate docs on the receive policy). Packets therefore always
//! carry UDP destination port 4791, whatever port the socket used.
//!
//! A capture is opened explicitly ([`Capture::create`], then [`crate::Runtime::set_capture`])
//! or, for any program using the API, by the environment variable [`ENV_VAR`]: every runtime
//! started while it names a file records into it. Devices of one process that name the same
//! file share one writer, so the file stays one valid pcap.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable naming a pcap file that every runtime records into.
pub const ENV_VAR: &str = "SOFTRDMA_CAPTURE";

/// `LINKTYPE_RAW`: each record is an IPv4 or IPv6 packet, no link header.
const LINKTYPE_RAW: u32 = 101;
/// Largest record kept; RoCEv2 packets are far smaller (MTU 4096 plus headers).
const SNAPLEN: u32 = 65_535;
/// Buffered records are written out at least this often while packets flow.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// An open pcap file that runtimes record packets into. Cheap to share (`Arc`); the file is
/// flushed when the last holder drops it.
#[derive(Debug)]
pub struct Capture {
    path: PathBuf,
    inner: Mutex<Writer>,
}

#[derive(Debug)]
struct Writer {
    out: BufWriter<File>,
    last_flush: std::time::Instant,
    /// Set after the first write error: the capture stops rather than logging per packet.
    failed: bool,
    records: u64,
}

/// One open capture per path in this process, so devices naming the same file share it.
fn registry() -> &'static Mutex<HashMap<PathBuf, Weak<Capture>>> {
    static REG: OnceLock<Mutex<HashMap<PathBuf, Weak<Capture>>>> = OnceLock::new();
    REG.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Capture {
    /// Create (truncate) `path` and write the pcap file header. If this process already has
    /// `path` open as a capture, that capture is returned instead, so two devices can record
    /// into one file.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Arc<Capture>> {
        let path = path.as_ref().to_path_buf();
        let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = reg.get(&path).and_then(Weak::upgrade) {
            return Ok(c);
        }
        let mut out = BufWriter::with_capacity(256 * 1024, File::create(&path)?);
        out.write_all(&file_header())?;
        out.flush()?;
        let cap = Arc::new(Capture {
            path: path.clone(),
            inner: Mutex::new(Writer {
                out,
                last_flush: std::time::Instant::now(),
                failed: false,
                records: 0,
            }),
        });
        reg.retain(|_, w| w.strong_count() > 0);
        reg.insert(path, Arc::downgrade(&cap));
        Ok(cap)
    }

    /// The capture named by [`ENV_VAR`], if it is set and non-empty. A file that cannot be
    /// created is reported once (a warning) and capture is off: capturing is a diagnostic and
    /// never stops a device from starting.
    pub fn from_env() -> Option<Arc<Capture>> {
        let path = std::env::var_os(ENV_VAR)?;
        if path.is_empty() {
            return None;
        }
        match Capture::create(&path) {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(path = ?path, error = %e, "cannot open the capture file; not capturing");
                None
            }
        }
    }

    /// The file this capture writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.lock().records
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Writer> {
        // A panic mid-record at worst leaves one truncated record; keep capturing.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Append one whole IP packet, stamped with the current time.
    pub fn record(&self, packet: &[u8]) {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut w = self.lock();
        if w.failed {
            return;
        }
        let incl = packet.len().min(SNAPLEN as usize);
        let res = w
            .out
            .write_all(&record_header(ts, incl as u32, packet.len() as u32))
            .and_then(|()| w.out.write_all(&packet[..incl]));
        let res = res.and_then(|()| {
            if w.last_flush.elapsed() >= FLUSH_EVERY {
                w.last_flush = std::time::Instant::now();
                w.out.flush()
            } else {
                Ok(())
            }
        });
        match res {
            Ok(()) => w.records += 1,
            Err(e) => {
                w.failed = true;
                tracing::warn!(path = ?self.path, error = %e, "capture write failed; capture stopped");
            }
        }
    }

    /// Write buffered records to the file (the progress thread calls this before it sleeps,
    /// so an idle device's capture is complete on disk).
    pub fn flush(&self) {
        let mut w = self.lock();
        if !w.failed && !w.out.buffer().is_empty() {
            w.last_flush = std::time::Instant::now();
            if let Err(e) = w.out.flush() {
                w.failed = true;
                tracing::warn!(path = ?self.path, error = %e, "capture flush failed; capture stopped");
            }
        }
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let w = self.inner.get_mut().unwrap_or_else(|e| e.into_inner());
        let _ = w.out.flush();
    }
}

/// The pcap global header: microsecond timestamps, native byte order (readers detect it by
/// the magic), version 2.4.
fn file_header() -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&0xa1b2_c3d4u32.to_ne_bytes());
    h[4..6].copy_from_slice(&2u16.to_ne_bytes());
    h[6..8].copy_from_slice(&4u16.to_ne_bytes());
    // thiszone and sigfigs stay 0.
    h[16..20].copy_from_slice(&SNAPLEN.to_ne_bytes());
    h[20..24].copy_from_slice(&LINKTYPE_RAW.to_ne_bytes());
    h
}

fn record_header(ts: Duration, incl: u32, orig: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    // pcap's 32-bit seconds field wraps in 2106; truncation is what every writer does.
    h[0..4].copy_from_slice(&(ts.as_secs() as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&ts.subsec_micros().to_ne_bytes());
    h[8..12].copy_from_slice(&incl.to_ne_bytes());
    h[12..16].copy_from_slice(&orig.to_ne_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_pcap_header_and_one_record_per_packet() {
        let dir = std::env::temp_dir().join(format!("softrdma-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.pcap");
        {
            let c = Capture::create(&path).unwrap();
            let again = Capture::create(&path).unwrap();
            assert!(Arc::ptr_eq(&c, &again), "one writer per path");
            c.record(&[0x45, 0, 0, 20]);
            again.record(&[0x60; 7]);
            assert_eq!(c.records(), 2);
        }
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 24 + 16 + 4 + 16 + 7);
        assert_eq!(&bytes[0..4], &0xa1b2_c3d4u32.to_ne_bytes());
        assert_eq!(&bytes[20..24], &101u32.to_ne_bytes());
        assert_eq!(&bytes[24 + 8..24 + 12], &4u32.to_ne_bytes());
        assert_eq!(&bytes[24 + 16..24 + 20], &[0x45, 0, 0, 20]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
