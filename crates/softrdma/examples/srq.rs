//! SRQ: the server serves several client QPs from one shared receive queue. The client
//! connects two RC QPs and sends on each; the server's receives all come from one SRQ.
//!
//! `cargo run -p softrdma --example srq` runs both ends on loopback;
//! `... -- server 10.0.0.1` and `... -- client 10.0.0.2 10.0.0.1` run them as two programs.

mod common;

use std::net::TcpStream;

use common::Role;
use softrdma::{AccessFlags, Buffer, Device, Result};

const QPS: usize = 2;

fn run(role: Role, dev: Device, mut stream: TcpStream) -> Result<()> {
    let pd = dev.alloc_pd()?;
    let cq = dev.create_cq(64)?;
    let mr = pd.register(Buffer::zeroed(4096), AccessFlags::LOCAL_WRITE)?;
    match role {
        Role::Server => {
            let srq = pd.create_srq(64, 1)?;
            for i in 0..8u64 {
                let off = i as usize * 256;
                srq.recv(i, &[mr.sge(off..off + 256)?])?;
            }
            let mut qps = Vec::new();
            for _ in 0..QPS {
                let qp = pd.qp_builder(&cq, &cq).srq(&srq).build()?;
                qp.handshake(&mut stream, None)?;
                qps.push(qp);
            }
            for _ in 0..QPS {
                let wc = cq.wait_ok(None)?;
                let mut got = vec![0u8; wc.byte_len as usize];
                mr.read(wc.wr_id as usize * 256, &mut got)?;
                println!(
                    "server: QP {:#x} got {:?} from SRQ buffer {}",
                    wc.qp_num,
                    String::from_utf8_lossy(&got),
                    wc.wr_id
                );
            }
            println!("server: {} receives left in the SRQ", srq.len()?);
        }
        Role::Client => {
            let mut qps = Vec::new();
            for _ in 0..QPS {
                let qp = pd.qp_builder(&cq, &cq).build()?;
                qp.handshake(&mut stream, None)?;
                qps.push(qp);
            }
            for (i, qp) in qps.iter().enumerate() {
                let text = format!("hello over QP {i}");
                mr.write(i * 64, text.as_bytes())?;
                qp.send(i as u64, &[mr.sge(i * 64..i * 64 + text.len())?])?;
                cq.wait_ok(None)?;
            }
            println!("client: sent one message on each of {QPS} QPs");
        }
    }
    Ok(())
}

fn main() {
    common::main_with(run);
}
