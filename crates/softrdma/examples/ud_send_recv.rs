//! UD: connectionless datagrams. The QPs exchange only their QPN and GID; the client sends a
//! datagram through an address handle, the server replies to the source it sees.
//!
//! `cargo run -p softrdma --example ud_send_recv` runs both ends on loopback;
//! `... -- server 10.0.0.1` and `... -- client 10.0.0.2 10.0.0.1` run them as two programs.

mod common;

use std::net::TcpStream;

use common::Role;
use softrdma::{handshake, AccessFlags, Buffer, Device, QpType, Result, DEFAULT_QKEY, GRH_LEN};

fn run(role: Role, dev: Device, mut stream: TcpStream) -> Result<()> {
    let pd = dev.alloc_pd()?;
    let send_cq = dev.create_cq(16)?;
    let recv_cq = dev.create_cq(16)?;
    let qp = pd
        .qp_builder(&send_cq, &recv_cq)
        .qp_type(QpType::Ud)
        .build()?;
    let mr = pd.register(Buffer::zeroed(4096), AccessFlags::LOCAL_WRITE)?;
    // Every UD receive buffer starts with the 40-byte GRH.
    qp.recv(1, &[mr.sge(2048..2048 + GRH_LEN + 1024)?])?;
    // Only the QPN and GID matter for UD; no connection is made.
    let peer = handshake::exchange(&mut stream, &qp.endpoint(None)?)?;
    handshake::sync(&mut stream)?;
    let ah = pd.create_ah(peer.gid)?;
    let send = |text: &[u8]| -> Result<()> {
        mr.write(0, text)?;
        qp.send_ud(2, &[mr.sge(..text.len())?], &ah, peer.qpn, DEFAULT_QKEY)?;
        send_cq.wait_ok(None)?;
        Ok(())
    };
    if let Role::Client = role {
        send(b"a datagram from the client")?;
    }
    let wc = recv_cq.wait_ok(None)?;
    let n = wc.byte_len as usize - GRH_LEN;
    let mut got = vec![0u8; n];
    mr.read(2048 + GRH_LEN, &mut got)?;
    let me = match role {
        Role::Server => "server",
        Role::Client => "client",
    };
    println!(
        "{me}: {:?} from QP {:#x}",
        String::from_utf8_lossy(&got),
        wc.src_qp
    );
    if let Role::Server = role {
        send(b"a datagram back from the server")?;
    }
    Ok(())
}

fn main() {
    common::main_with(run);
}
