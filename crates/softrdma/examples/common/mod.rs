//! What every example shares: the command line, the device, and a TCP rendezvous.
//!
//! ```text
//! example                         both ends in this process (127.0.0.1 <-> 127.0.0.2)
//! example server BIND_IP [TCP]    wait for a client on TCP port TCP (default 18515)
//! example client BIND_IP SERVER   connect to SERVER (ip[:tcp port])
//! ```

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::thread;

use softrdma::{Device, Result};

/// Default TCP port for the handshake (the one ibv_rc_pingpong uses).
pub const TCP_PORT: u16 = 18515;

/// Which end this program plays.
pub enum Role {
    /// Accepts the TCP connection.
    Server,
    /// Makes it.
    Client,
}

/// Parse the command line and run `body` for one end, or for both ends on loopback.
pub fn main_with(body: fn(Role, Device, TcpStream) -> Result<()>) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => both(body),
        ["server", ip] => server(body, ip, TCP_PORT),
        ["server", ip, port] => match port.parse() {
            Ok(p) => server(body, ip, p),
            Err(_) => usage(),
        },
        ["client", ip, peer] => client(body, ip, peer),
        _ => usage(),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn usage() -> Result<()> {
    eprintln!("usage: [server BIND_IP [TCP_PORT] | client BIND_IP SERVER_IP[:TCP_PORT]]");
    std::process::exit(2);
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap_or_else(|_| {
        eprintln!("not an IP address: {s}");
        std::process::exit(2)
    })
}

fn server(body: fn(Role, Device, TcpStream) -> Result<()>, bind: &str, port: u16) -> Result<()> {
    let dev = Device::open(ip(bind))?;
    let listener = TcpListener::bind((ip(bind), port))?;
    println!(
        "server: device on {}, waiting on TCP {port}",
        dev.local_addr()
    );
    let (stream, peer) = listener.accept()?;
    println!("server: client {peer}");
    body(Role::Server, dev, stream)
}

fn client(body: fn(Role, Device, TcpStream) -> Result<()>, bind: &str, peer: &str) -> Result<()> {
    let dev = Device::open(ip(bind))?;
    let addr: SocketAddr = peer
        .parse()
        .unwrap_or_else(|_| SocketAddr::new(ip(peer), TCP_PORT));
    let stream = TcpStream::connect(addr)?;
    body(Role::Client, dev, stream)
}

fn both(body: fn(Role, Device, TcpStream) -> Result<()>) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let server = thread::spawn(move || -> Result<()> {
        let dev = Device::open(IpAddr::from([127, 0, 0, 2]))?;
        let (stream, _) = listener.accept()?;
        body(Role::Server, dev, stream)
    });
    let dev = Device::open(IpAddr::from([127, 0, 0, 1]))?;
    let r = body(Role::Client, dev, TcpStream::connect(addr)?);
    // A panicking server thread has printed its message already.
    let s = server.join().unwrap_or(Ok(()));
    r.and(s)
}
