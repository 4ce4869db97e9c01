//! RDMA WRITE: the server offers a region; the client writes into it directly, then tells
//! the server with a zero-byte SEND. The server's CPU takes no part in the transfer.
//!
//! `cargo run -p softrdma --example rdma_write` runs both ends on loopback;
//! `... -- server 10.0.0.1` and `... -- client 10.0.0.2 10.0.0.1` run them as two programs.

mod common;

use std::net::TcpStream;

use common::Role;
use softrdma::{AccessFlags, Buffer, Device, Result};

const SIZE: usize = 64 * 1024;

fn run(role: Role, dev: Device, stream: TcpStream) -> Result<()> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let qp = pd.qp_builder(&cq, &cq).build()?;
    match role {
        Role::Server => {
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            let mr = pd.register(Buffer::zeroed(SIZE), access)?;
            qp.recv(1, &[])?; // for the "done" message
            qp.handshake(stream, Some(mr.remote(..)?))?;
            cq.wait_ok(None)?;
            let data = mr.to_vec();
            let ok = data.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8);
            println!("server: {SIZE} bytes written into my memory, pattern intact: {ok}");
        }
        Role::Client => {
            let data: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
            let mr = pd.register(data, AccessFlags::LOCAL_WRITE)?;
            let peer = qp.handshake(stream, None)?;
            let remote = peer.mr.ok_or(softrdma::Error::Timeout)?;
            qp.write(1, &[mr.sge(..)?], &remote)?;
            cq.wait_ok(None)?;
            qp.send(2, &[])?;
            cq.wait_ok(None)?;
            println!(
                "client: wrote {SIZE} bytes to {:#x} (rkey {:#x})",
                remote.addr, remote.rkey
            );
        }
    }
    Ok(())
}

fn main() {
    common::main_with(run);
}
