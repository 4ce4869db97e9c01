//! RC SEND / RECV: the client sends a greeting, the server answers.
//!
//! `cargo run -p softrdma --example rc_send_recv` runs both ends on loopback;
//! `... -- server 10.0.0.1` and `... -- client 10.0.0.2 10.0.0.1` run them as two programs.

mod common;

use std::net::TcpStream;

use common::Role;
use softrdma::{AccessFlags, Buffer, Device, MemoryRegion, Qp, Result};

fn run(role: Role, dev: Device, stream: TcpStream) -> Result<()> {
    let pd = dev.alloc_pd()?;
    // One CQ per direction, so each wait below knows what it waits for.
    let send_cq = dev.create_cq(16)?;
    let recv_cq = dev.create_cq(16)?;
    let qp = pd.qp_builder(&send_cq, &recv_cq).build()?;
    let mr = pd.register(Buffer::zeroed(4096), AccessFlags::LOCAL_WRITE)?;
    // Post the receive before connecting, so the peer's first SEND finds it.
    qp.recv(1, &[mr.sge(2048..)?])?;
    qp.handshake(stream, None)?;

    let send = |text: &[u8], qp: &Qp, mr: &MemoryRegion| -> Result<()> {
        mr.write(0, text)?;
        qp.send(2, &[mr.sge(..text.len())?])?;
        send_cq.wait_ok(None)?;
        Ok(())
    };
    let me = match role {
        Role::Client => {
            send(b"hello from the client", &qp, &mr)?;
            "client"
        }
        Role::Server => "server",
    };
    let wc = recv_cq.wait_ok(None)?;
    let mut got = vec![0u8; wc.byte_len as usize];
    mr.read(2048, &mut got)?;
    println!("{me}: received {:?}", String::from_utf8_lossy(&got));
    if let Role::Server = role {
        send(b"hello back from the server", &qp, &mr)?;
    }
    Ok(())
}

fn main() {
    common::main_with(run);
}
