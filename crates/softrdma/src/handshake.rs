//! The connection handshake: what two programs exchange (over TCP, or any byte stream) to
//! connect a pair of RC QPs, as `ibv_rc_pingpong` and perftest do.
//!
//! ## Message, version 1 (all integers big-endian)
//!
//! | bytes | field |
//! |---|---|
//! | 4 | magic `SRDM` |
//! | 1 | version = 1 |
//! | 1 | flags: bit 0 = an MR follows |
//! | 2 | body length in bytes (what follows this field) |
//! | 4 | QPN (24 bits used) |
//! | 4 | first PSN (24 bits used) |
//! | 16 | GID |
//! | 2 | path MTU in bytes (256, 512, 1024, 2048 or 4096) |
//! | 8, 8, 4 | if flag 0: MR address, length, rkey |
//!
//! A reader accepts a longer body than it knows (later versions append fields) up to
//! [`MAX_BODY`] bytes, and rejects everything malformed with a [`HandshakeError`]; no input
//! can make it panic or allocate more than `MAX_BODY`.
//!
//! After both sides connected their QPs they exchange one byte (`R`), so neither sends before
//! the other can receive.

use std::io::{Read, Write};

use engine::qp_attr::Mtu;
use engine::Gid;

use crate::{Qpn, Rkey};

/// What a peer's memory region looks like from here: where it is and the key to reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteMr {
    /// Virtual address of the first byte, in the peer's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: Rkey,
}

impl RemoteMr {
    /// The part of the region at `offset` (same key), or `None` if it is past the end.
    pub fn offset(&self, offset: u64) -> Option<RemoteMr> {
        let len = self.len.checked_sub(offset)?;
        Some(RemoteMr {
            addr: self.addr.checked_add(offset)?,
            len,
            rkey: self.rkey,
        })
    }
}

/// Everything a peer needs to connect to one of our QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endpoint {
    /// QP number.
    pub qpn: Qpn,
    /// First PSN the QP sends (the peer's `rq_psn`).
    pub psn: u32,
    /// The port GID (its IP address).
    pub gid: Gid,
    /// Largest path MTU it accepts.
    pub mtu: Mtu,
    /// A memory region offered to the peer, if any.
    pub mr: Option<RemoteMr>,
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The stream failed or closed early.
    #[error("handshake stream: {0}")]
    Io(#[from] std::io::Error),
    /// The peer is not speaking this protocol.
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 4]),
    /// The peer speaks a version we do not.
    #[error("unsupported handshake version {0}")]
    Version(u8),
    /// The body is shorter than its fields, or longer than [`MAX_BODY`].
    #[error("bad body length {0}")]
    BadLength(u16),
    /// A field holds a value that cannot be right.
    #[error("invalid {field}: {value}")]
    BadField {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// The peer did not confirm it is connected.
    #[error("peer did not confirm the connection")]
    NoSync,
}

/// Protocol version written.
pub const VERSION: u8 = 1;
/// Largest body accepted.
pub const MAX_BODY: u16 = 512;
const MAGIC: [u8; 4] = *b"SRDM";
const FLAG_MR: u8 = 1;
const BASE_BODY: usize = 4 + 4 + 16 + 2;
const MR_BODY: usize = 8 + 8 + 4;

/// Encode `e` as a version-1 message.
pub fn encode(e: &Endpoint) -> Vec<u8> {
    let body = BASE_BODY + if e.mr.is_some() { MR_BODY } else { 0 };
    let mut v = Vec::with_capacity(8 + body);
    v.extend_from_slice(&MAGIC);
    v.push(VERSION);
    v.push(if e.mr.is_some() { FLAG_MR } else { 0 });
    v.extend_from_slice(&(body as u16).to_be_bytes());
    v.extend_from_slice(&e.qpn.value().to_be_bytes());
    v.extend_from_slice(&e.psn.to_be_bytes());
    v.extend_from_slice(&e.gid.0);
    v.extend_from_slice(&(e.mtu.bytes() as u16).to_be_bytes());
    if let Some(mr) = e.mr {
        v.extend_from_slice(&mr.addr.to_be_bytes());
        v.extend_from_slice(&mr.len.to_be_bytes());
        v.extend_from_slice(&mr.rkey.value().to_be_bytes());
    }
    v
}

fn mtu_from_bytes(b: u16) -> Option<Mtu> {
    [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ]
    .into_iter()
    .find(|m| m.bytes() == usize::from(b))
}

/// Read one message from `r`.
pub fn read_endpoint<R: Read>(r: &mut R) -> Result<Endpoint, HandshakeError> {
    let mut head = [0u8; 8];
    r.read_exact(&mut head)?;
    let magic = [head[0], head[1], head[2], head[3]];
    if magic != MAGIC {
        return Err(HandshakeError::BadMagic(magic));
    }
    if head[4] != VERSION {
        return Err(HandshakeError::Version(head[4]));
    }
    let flags = head[5];
    let body_len = u16::from_be_bytes([head[6], head[7]]);
    let need = BASE_BODY + if flags & FLAG_MR != 0 { MR_BODY } else { 0 };
    if usize::from(body_len) < need || body_len > MAX_BODY {
        return Err(HandshakeError::BadLength(body_len));
    }
    let mut body = vec![0u8; usize::from(body_len)];
    r.read_exact(&mut body)?;
    decode_body(flags, &body)
}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    // Callers check the body length first; a short slice leaves zeros rather than panicking.
    if let Some(s) = b.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

fn decode_body(flags: u8, b: &[u8]) -> Result<Endpoint, HandshakeError> {
    let qpn_bits = u32::from_be_bytes(be(b, 0));
    let psn = u32::from_be_bytes(be(b, 4));
    let gid = Gid(be(b, 8));
    let mtu_bytes = u16::from_be_bytes(be(b, 24));
    let qpn = Qpn::try_new(qpn_bits).ok_or(HandshakeError::BadField {
        field: "qpn",
        value: u64::from(qpn_bits),
    })?;
    if psn > 0x00ff_ffff {
        return Err(HandshakeError::BadField {
            field: "psn",
            value: u64::from(psn),
        });
    }
    let mtu = mtu_from_bytes(mtu_bytes).ok_or(HandshakeError::BadField {
        field: "mtu",
        value: u64::from(mtu_bytes),
    })?;
    let mr = if flags & FLAG_MR != 0 {
        let addr = u64::from_be_bytes(be(b, 26));
        let len = u64::from_be_bytes(be(b, 34));
        let rkey = Rkey::new(u32::from_be_bytes(be(b, 42)));
        if addr.checked_add(len).is_none() {
            return Err(HandshakeError::BadField {
                field: "mr length",
                value: len,
            });
        }
        Some(RemoteMr { addr, len, rkey })
    } else {
        None
    };
    Ok(Endpoint {
        qpn,
        psn,
        gid,
        mtu,
        mr,
    })
}

/// Send `local` and read the peer's endpoint (both sides send first, so neither waits).
pub fn exchange<S: Read + Write>(s: &mut S, local: &Endpoint) -> Result<Endpoint, HandshakeError> {
    s.write_all(&encode(local))?;
    s.flush()?;
    read_endpoint(s)
}

/// Tell the peer we are connected and wait until it says the same.
pub fn sync<S: Read + Write>(s: &mut S) -> Result<(), HandshakeError> {
    s.write_all(b"R")?;
    s.flush()?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    if b[0] == b'R' {
        Ok(())
    } else {
        Err(HandshakeError::NoSync)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(mr: Option<RemoteMr>) -> Endpoint {
        Endpoint {
            qpn: Qpn::new(0x11),
            psn: 0xabcdef,
            gid: Gid::from_ip("10.0.0.1".parse().unwrap()),
            mtu: Mtu::Mtu1024,
            mr,
        }
    }

    #[test]
    fn round_trips_with_and_without_an_mr() {
        for e in [
            ep(None),
            ep(Some(RemoteMr {
                addr: 0x7f00_0000_1000,
                len: 4096,
                rkey: Rkey::new(0x1234),
            })),
        ] {
            let bytes = encode(&e);
            assert_eq!(read_endpoint(&mut &bytes[..]).unwrap(), e);
        }
    }

    #[test]
    fn longer_bodies_from_later_versions_are_accepted() {
        let mut bytes = encode(&ep(None));
        let len = u16::from_be_bytes([bytes[6], bytes[7]]) + 3;
        bytes[6..8].copy_from_slice(&len.to_be_bytes());
        bytes.extend_from_slice(&[9, 9, 9]);
        assert_eq!(read_endpoint(&mut &bytes[..]).unwrap(), ep(None));
    }

    #[test]
    fn malformed_messages_are_errors() {
        let good = encode(&ep(None));
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        assert!(matches!(
            read_endpoint(&mut &bad_magic[..]),
            Err(HandshakeError::BadMagic(_))
        ));
        let mut bad_version = good.clone();
        bad_version[4] = 2;
        assert!(matches!(
            read_endpoint(&mut &bad_version[..]),
            Err(HandshakeError::Version(2))
        ));
        let mut short = good.clone();
        short[7] = 3;
        assert!(matches!(
            read_endpoint(&mut &short[..]),
            Err(HandshakeError::BadLength(3))
        ));
        let mut huge = good.clone();
        huge[6..8].copy_from_slice(&u16::MAX.to_be_bytes());
        assert!(matches!(
            read_endpoint(&mut &huge[..]),
            Err(HandshakeError::BadLength(_))
        ));
        let mut bad_mtu = good.clone();
        bad_mtu[32..34].copy_from_slice(&300u16.to_be_bytes());
        assert!(matches!(
            read_endpoint(&mut &bad_mtu[..]),
            Err(HandshakeError::BadField { field: "mtu", .. })
        ));
        let mut bad_qpn = good.clone();
        bad_qpn[8] = 0xff;
        assert!(matches!(
            read_endpoint(&mut &bad_qpn[..]),
            Err(HandshakeError::BadField { field: "qpn", .. })
        ));
        let mut mr_flag_without_mr = good.clone();
        mr_flag_without_mr[5] = 1;
        assert!(read_endpoint(&mut &mr_flag_without_mr[..]).is_err());
        assert!(matches!(
            read_endpoint(&mut &good[..good.len() - 1]),
            Err(HandshakeError::Io(_))
        ));
    }

    #[test]
    fn no_input_panics() {
        // Every prefix and every single-byte corruption of a valid message.
        let good = encode(&ep(Some(RemoteMr {
            addr: 1,
            len: 2,
            rkey: Rkey::new(3),
        })));
        for n in 0..good.len() {
            let _ = read_endpoint(&mut &good[..n]);
        }
        for i in 0..good.len() {
            for v in [0u8, 1, 0x7f, 0x80, 0xff] {
                let mut b = good.clone();
                b[i] = v;
                let _ = read_endpoint(&mut &b[..]);
            }
        }
    }
}
