//! ATOMIC fetch-and-add and compare-and-swap on a counter in the server's memory.
//!
//! `cargo run -p softrdma --example atomics` runs both ends on loopback;
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
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
            // Buffer is page aligned: atomics need an 8-byte aligned word.
            let mr = pd.register(Buffer::zeroed(8), access)?;
            mr.write_u64(0, 1000)?;
            qp.recv(1, &[])?;
            qp.handshake(stream, Some(mr.remote(..)?))?;
            cq.wait_ok(None)?;
            println!("server: counter is now {}", mr.read_u64(0)?);
        }
        Role::Client => {
            let mr = pd.register(Buffer::zeroed(8), AccessFlags::LOCAL_WRITE)?;
            let peer = qp.handshake(stream, None)?;
            let counter = peer.mr.ok_or(softrdma::Error::Timeout)?;
            for _ in 0..10 {
                qp.fetch_add(1, mr.sge(..)?, &counter, 1)?;
                cq.wait_ok(None)?;
            }
            println!(
                "client: fetch-and-add x10, last original value {}",
                mr.read_u64(0)?
            );
            let seen = mr.read_u64(0)? + 1;
            qp.compare_swap(2, mr.sge(..)?, &counter, seen, 42)?;
            cq.wait_ok(None)?;
            println!(
                "client: compare-and-swap({seen} -> 42) saw {}",
                mr.read_u64(0)?
            );
            qp.send(3, &[])?;
            cq.wait_ok(None)?;
        }
    }
    Ok(())
}

fn main() {
    common::main_with(run);
}
