//! RC SEND / RECV over a connection the RDMA connection manager set up: no TCP rendezvous,
//! only the server's address and rdma_cm port. The client sends a greeting, the server
//! answers, the client disconnects.
//!
//! ```text
//! cm_send_recv                           both ends in this process (127.0.0.1 <- 127.0.0.2)
//! cm_send_recv server BIND_IP [PORT]     listen on rdma_cm TCP port PORT (default 7471)
//! cm_send_recv client BIND_IP SERVER_IP[:PORT]
//! ```
//!
//! The wire protocol is the IB CM's, as the Linux kernel's rdma_cm speaks it: the server
//! accepts a client of any rdma_cm program that connects to that port and sends first.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use softrdma::cm::ConnParam;
use softrdma::{AccessFlags, Buffer, Cq, Device, MemoryRegion, Qp, Result};

/// rping's default port.
const PORT: u16 = 7471;
/// How long either side waits for the other.
const WAIT: Option<Duration> = Some(Duration::from_secs(10));

/// A device's PD, CQs, an RC QP and a registered buffer, with a receive posted.
struct End {
    send_cq: Cq,
    recv_cq: Cq,
    qp: Qp,
    mr: MemoryRegion,
}

fn end(dev: &Device) -> Result<End> {
    let pd = dev.alloc_pd()?;
    let send_cq = dev.create_cq(16)?;
    let recv_cq = dev.create_cq(16)?;
    let qp = pd.qp_builder(&send_cq, &recv_cq).build()?;
    let mr = pd.register(Buffer::zeroed(4096), AccessFlags::LOCAL_WRITE)?;
    // Posted before the connection is up, so the peer's first SEND finds it.
    qp.recv(1, &[mr.sge(2048..)?])?;
    Ok(End {
        send_cq,
        recv_cq,
        qp,
        mr,
    })
}

impl End {
    fn send(&self, text: &[u8]) -> Result<()> {
        self.mr.write(0, text)?;
        self.qp.send(2, &[self.mr.sge(..text.len())?])?;
        self.send_cq.wait_ok(WAIT)?;
        Ok(())
    }

    fn receive(&self) -> Result<String> {
        let wc = self.recv_cq.wait_ok(WAIT)?;
        let mut got = vec![0u8; wc.byte_len as usize];
        self.mr.read(2048, &mut got)?;
        Ok(String::from_utf8_lossy(&got).into_owned())
    }
}

fn server(dev: Device, port: u16) -> Result<()> {
    let e = end(&dev)?;
    let listener = dev.connection_manager()?.listen(port)?;
    println!(
        "server: {} listening on rdma_cm port {port}",
        dev.local_addr().ip()
    );
    let req = listener.next_request(None)?;
    println!("server: request from {}", req.peer());
    let conn = req.accept(&e.qp, &ConnParam::with_private_data(b"welcome"), WAIT)?;
    println!("server: received {:?}", e.receive()?);
    e.send(b"hello back from the server")?;
    conn.wait_disconnected(WAIT)?;
    println!("server: disconnected");
    Ok(())
}

fn client(dev: Device, to: SocketAddr) -> Result<()> {
    let e = end(&dev)?;
    let cm = dev.connection_manager()?;
    let conn = cm.connect(&e.qp, to, &ConnParam::with_private_data(b"hello"), WAIT)?;
    let welcome = conn.private_data();
    let n = welcome
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(welcome.len());
    println!(
        "client: connected to {to}, accepted with {:?}",
        String::from_utf8_lossy(&welcome[..n])
    );
    e.send(b"hello from the client")?;
    println!("client: received {:?}", e.receive()?);
    conn.disconnect()?;
    conn.wait_disconnected(WAIT)?;
    Ok(())
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|_| {
        eprintln!("not an IP address: {s}");
        std::process::exit(2)
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = match args.as_slice() {
        [] => both(),
        ["server", bind] => Device::open(ip(bind)).and_then(|d| server(d, PORT)),
        ["server", bind, port] => match port.parse() {
            Ok(p) => Device::open(ip(bind)).and_then(|d| server(d, p)),
            Err(_) => usage(),
        },
        ["client", bind, peer] => {
            let to = peer
                .parse()
                .unwrap_or_else(|_| SocketAddr::new(ip(peer), PORT));
            Device::open(ip(bind)).and_then(|d| client(d, to))
        }
        _ => usage(),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn usage() -> Result<()> {
    eprintln!("usage: [server BIND_IP [PORT] | client BIND_IP SERVER_IP[:PORT]]");
    std::process::exit(2);
}

/// Both ends in this process, on 127.0.0.1 (server) and 127.0.0.2 (client).
fn both() -> Result<()> {
    let server_dev = Device::open(ip("127.0.0.1"))?;
    let client_dev = Device::open(ip("127.0.0.2"))?;
    let to = SocketAddr::new(server_dev.local_addr().ip(), PORT);
    std::thread::scope(|s| {
        let srv = s.spawn(|| server(server_dev, PORT));
        // The server listens before the client's REQ arrives, or the REQ is rejected:
        // the client tries again a few times, as rping does.
        let mut r = Ok(());
        for _ in 0..20 {
            r = client(client_dev.clone(), to);
            match &r {
                Err(softrdma::Error::CmRejected { .. }) => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                _ => break,
            }
        }
        let s = srv.join().expect("the server thread does not panic");
        r.and(s)
    })
}
