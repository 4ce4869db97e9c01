//! Memory windows: the server lends the client part of a region through a type 2 window,
//! and the client hands it back with SEND with Invalidate. After that the window's key is
//! dead: the client's next write through it is refused with REM_ACCESS_ERR.
//!
//! The server's region allows no remote access of its own; the window grants remote write
//! to 4 KiB of it, on this one connection only. (A type 1 window, bound with `Qp::bind_mw`,
//! would serve every QP of the PD and stay bound until bound again.)
//!
//! `cargo run -p softrdma --example mw` runs both ends on loopback;
//! `... -- server 10.0.0.1` and `... -- client 10.0.0.2 10.0.0.1` run them as two programs.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;

use common::Role;
use softrdma::{
    AccessFlags, Buffer, Device, Error, MwType, RemoteMr, Result, Rkey, WcFlags, WcStatus,
};

const REGION: usize = 64 * 1024;
/// The part of the region the window exposes.
const WINDOW: std::ops::Range<usize> = 8192..12288;
/// Bytes of a window descriptor on the wire: address, length, rkey (big-endian).
const DESC: usize = 20;

fn run(role: Role, dev: Device, mut stream: TcpStream) -> Result<()> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let qp = pd.qp_builder(&cq, &cq).build()?;
    match role {
        Role::Server => {
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND;
            let mr = pd.register(Buffer::zeroed(REGION), access)?;
            let msgs = pd.register(Buffer::zeroed(64), AccessFlags::LOCAL_WRITE)?;
            let mw = pd.alloc_mw(MwType::Type2)?;
            qp.handshake(&mut stream, None)?;

            // Bind the window on this QP (a bind work request), and tell the client.
            let remote = qp.post_bind_mw(1, &mw, &mr, WINDOW, AccessFlags::REMOTE_WRITE)?;
            cq.wait_ok(None)?;
            println!(
                "server: window {:#x} bound over {} bytes at {:#x}",
                remote.rkey, remote.len, remote.addr
            );
            qp.recv(2, &[msgs.sge(..)?])?; // for the client's "done"
            msgs.write(0, &encode(&remote))?;
            qp.send(3, &[msgs.sge(..DESC)?])?;
            cq.wait_ok(None)?;

            let wc = cq.wait_ok(None)?;
            if wc.wc_flags.contains(WcFlags::WITH_INV) {
                println!(
                    "server: client invalidated {:#x}; window bound: {}",
                    wc.invalidated_rkey,
                    mw.is_bound()?
                );
            }
            let data = mr.to_vec();
            let inside = data[WINDOW].iter().enumerate().all(|(i, &b)| b == pat(i));
            let outside = data[..WINDOW.start].iter().all(|&b| b == 0)
                && data[WINDOW.end..].iter().all(|&b| b == 0);
            println!("server: window holds the pattern: {inside}; rest untouched: {outside}");
            // Stay up until the client has tried the dead key (a gone QP would not answer).
            stream.read_exact(&mut [0u8; 1])?;
        }
        Role::Client => {
            let data: Vec<u8> = (0..WINDOW.len()).map(pat).collect();
            let mr = pd.register(data, AccessFlags::LOCAL_WRITE)?;
            let msgs = pd.register(Buffer::zeroed(64), AccessFlags::LOCAL_WRITE)?;
            qp.recv(1, &[msgs.sge(..)?])?; // for the window descriptor
            qp.handshake(&mut stream, None)?;
            cq.wait_ok(None)?;
            let mut desc = [0u8; DESC];
            msgs.read(0, &mut desc)?;
            let window = decode(&desc);

            qp.write(2, &[mr.sge(..)?], &window)?;
            cq.wait_ok(None)?;
            println!(
                "client: wrote {} bytes through window {:#x}",
                window.len, window.rkey
            );
            qp.send_with_inv(3, &[], window.rkey)?;
            cq.wait_ok(None)?;

            qp.write(4, &[mr.sge(..16)?], &window)?;
            match cq.wait_ok(None) {
                Err(Error::Completion {
                    status: WcStatus::RemAccessErr,
                    ..
                }) => println!("client: the window is closed (REM_ACCESS_ERR), as it should be"),
                Err(e) => return Err(e),
                Ok(_) => {
                    eprintln!("client: the invalidated key still worked");
                    std::process::exit(1);
                }
            }
            stream.write_all(&[1])?;
        }
    }
    Ok(())
}

fn pat(i: usize) -> u8 {
    (i % 241) as u8
}

fn encode(r: &RemoteMr) -> [u8; DESC] {
    let mut b = [0u8; DESC];
    b[..8].copy_from_slice(&r.addr.to_be_bytes());
    b[8..16].copy_from_slice(&r.len.to_be_bytes());
    b[16..].copy_from_slice(&r.rkey.value().to_be_bytes());
    b
}

fn decode(b: &[u8; DESC]) -> RemoteMr {
    let word = |r: std::ops::Range<usize>| {
        let mut w = [0u8; 8];
        w[8 - r.len()..].copy_from_slice(&b[r]);
        u64::from_be_bytes(w)
    };
    RemoteMr {
        addr: word(0..8),
        len: word(8..16),
        rkey: Rkey::new(word(16..20) as u32),
    }
}

fn main() {
    common::main_with(run);
}
