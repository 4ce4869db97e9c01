//! RDMA READ: the server publishes a region; the client reads it without the server's CPU,
//! then tells the server it is done.
//!
//! `cargo run -p softrdma --example rdma_read` runs both ends on loopback;
//! `... -- server 10.0.0.1` and `... -- client 10.0.0.2 10.0.0.1` run them as two programs.

mod common;

use std::net::TcpStream;

use common::Role;
use softrdma::{AccessFlags, Buffer, Device, Result};

fn run(role: Role, dev: Device, stream: TcpStream) -> Result<()> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(16)?;
    let qp = pd.qp_builder(&cq, &cq).build()?;
    match role {
        Role::Server => {
            let text = b"this text lives in the server's memory and was fetched by RDMA READ";
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
            let mr = pd.register(Buffer::from_slice(text), access)?;
            qp.recv(1, &[])?;
            qp.handshake(stream, Some(mr.remote(..)?))?;
            cq.wait_ok(None)?;
            println!("server: the client has read my region");
        }
        Role::Client => {
            let mr = pd.register(Buffer::zeroed(4096), AccessFlags::LOCAL_WRITE)?;
            let peer = qp.handshake(stream, None)?;
            let remote = peer.mr.ok_or(softrdma::Error::Timeout)?;
            let n = remote.len as usize;
            qp.read(1, &[mr.sge(..n)?], &remote)?;
            cq.wait_ok(None)?;
            let mut got = vec![0u8; n];
            mr.read(0, &mut got)?;
            println!("client: read {:?}", String::from_utf8_lossy(&got));
            qp.send(2, &[])?;
            cq.wait_ok(None)?;
        }
    }
    Ok(())
}

fn main() {
    common::main_with(run);
}
