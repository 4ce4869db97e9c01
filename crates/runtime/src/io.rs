//! The socket layer: strip the IP and UDP headers the engine emits and send the rest from the
//! right UDP source port; receive datagrams (batched with `recvmmsg`, with `IP_PKTINFO` /
//! `IPV6_RECVPKTINFO`) and rebuild the headers the sender's ICRC covered.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::io;
use std::io::IoSlice;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use nix::sys::socket::{self as nsock, MsgFlags, SockaddrStorage};
use smallvec::SmallVec;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use wire::{IpRepr, Ipv4, Ipv4Repr, Ipv6, Ipv6Repr, Udp, UdpRepr, ROCEV2_UDP_PORT};

use crate::capture::Capture;
use crate::config::SrcPortPolicy;
use crate::mmsg;

/// Room in front of every receive slot for the rebuilt headers (IPv6 40 + UDP 8; IPv4 uses
/// the last 28 bytes).
pub(crate) const HEADROOM: usize = 48;
/// Largest UDP payload of one packet: a 4096-byte MTU packet plus every RoCE header, with
/// room.
pub(crate) const MAX_DATAGRAM: usize = 8192;
/// Largest UDP payload of a train (`UDP_GRO`, or a raw socket that sees a GSO train uncut):
/// what an IP datagram can carry.
const MAX_TRAIN: usize = 65_536;
/// Socket buffer sizes asked for (the kernel caps them at `net.core.{r,w}mem_max`).
const SOCKET_BUFFER: usize = 4 << 20;

/// `IP_PMTUDISC_DO` / `IPV6_PMTUDISC_DO`: never fragment, so IPv4 datagrams carry DF and,
/// on an unconnected socket, IP ID 0: the header the engine computed the ICRC over.
fn set_pmtudisc_do(sock: &Socket, v6: bool) -> io::Result<()> {
    let (level, name, value) = if v6 {
        (
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        (
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    };
    let value: libc::c_int = value;
    // SAFETY: `sock` is an open socket for the duration of the call; the option value is a
    // live c_int whose size we pass, as setsockopt(2) requires. No safe wrapper exists in
    // socket2 or nix for this option.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A UDP socket bound to `addr`, set up for RoCEv2 (DF, no fragmentation, large buffers).
pub(crate) fn udp_socket(addr: SocketAddr, reuse: bool) -> io::Result<Socket> {
    let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        sock.set_only_v6(true)?;
    }
    if reuse {
        // Send-only sockets of two devices on one address may share a source port.
        sock.set_reuse_address(true)?;
    }
    set_pmtudisc_do(&sock, addr.is_ipv6())?;
    set_multicast_interface(&sock, addr.ip());
    // Best effort: a smaller buffer only costs throughput.
    let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = sock.set_send_buffer_size(SOCKET_BUFFER);
    sock.bind(&addr.into())?;
    Ok(sock)
}

/// Datagrams to a multicast group leave through the interface holding `local` (the one the
/// device joins its groups on), whatever the routing table says about the group, and the
/// socket receives only the groups joined on it, not every group this host joined (a
/// wildcard-bound device socket would otherwise get a second copy of what its group
/// sockets receive). Best effort: a device starts without either (an address the kernel
/// does not hold yet, a kernel without `IPV6_MULTICAST_ALL`), multicast is all it costs.
fn set_multicast_interface(sock: &Socket, local: IpAddr) {
    let r = match local {
        IpAddr::V4(a) => sock.set_multicast_all_v4(false).and_then(|()| {
            if a.is_unspecified() {
                Ok(())
            } else {
                sock.set_multicast_if_v4(&a)
            }
        }),
        IpAddr::V6(a) => sock.set_multicast_all_v6(false).and_then(|()| {
            match crate::link::interface_index(local).filter(|_| !a.is_unspecified()) {
                Some(index) => sock.set_multicast_if_v6(index),
                None => Ok(()),
            }
        }),
    };
    if let Err(e) = r {
        tracing::debug!(%local, error = %e, "cannot set the socket's multicast interface");
    }
}

/// A socket that receives the datagrams sent to multicast group `group` on UDP `port`, on
/// the interfaces holding `locals` (the device's addresses of the group's family; the
/// unspecified address lets the kernel choose), joined there (`IP_ADD_MEMBERSHIP` with the
/// interface address, `IPV6_JOIN_GROUP` with its index: the kernel sends the IGMP / MLD
/// report, as rdma_cm's `cma_igmp_send` does for a RoCEv2 join). Bound to the group
/// address, with `SO_REUSEADDR` / `SO_REUSEPORT` so that every device and process of the
/// host that joins the group gets its own copy of each datagram, and with
/// `IP_MULTICAST_ALL` off so that it gets only the groups joined on it.
///
/// `raw`: an IPv4 raw socket instead ([`raw_rx_socket`]'s, bound to the group and
/// filtered to `port`), which shows each datagram's own IP header: the ICRC is then checked
/// exactly, as on the device's raw receive path. Needs `CAP_NET_RAW`. A raw socket owns no
/// port, which a group does not need: the kernel sends no ICMP error for a datagram to a
/// multicast address that nothing receives.
pub(crate) fn group_socket(
    group: IpAddr,
    port: u16,
    locals: &[IpAddr],
    raw: bool,
) -> io::Result<Socket> {
    let v6 = group.is_ipv6();
    let sock = if raw && !v6 {
        let s = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))?;
        s.attach_filter(&udp_port_filter(port))?;
        s
    } else {
        let s = Socket::new(
            Domain::for_address(SocketAddr::new(group, port)),
            Type::DGRAM,
            Some(Protocol::UDP),
        )?;
        if v6 {
            s.set_only_v6(true)?;
        }
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s
    };
    let raw = raw && !v6;
    let locals: Vec<IpAddr> = locals
        .iter()
        .copied()
        .filter(|l| l.is_ipv6() == v6)
        .collect();
    match group {
        IpAddr::V4(g) => {
            // Best effort (as on the device's sockets): bound to the group, the socket only
            // ever gets that group's datagrams; with the option it also gets them only from
            // the interfaces it joined on.
            let _ = sock.set_multicast_all_v4(false);
            let bind_port = if raw { 0 } else { port };
            sock.bind(&SocketAddr::from((g, bind_port)).into())?;
        }
        IpAddr::V6(g) => {
            let _ = sock.set_multicast_all_v6(false);
            // A group of interface- or link-local scope names an interface, as a link-local
            // address does: bind with the first local's.
            let scope = if g.segments()[0] & 0x000f <= 2 {
                locals
                    .first()
                    .and_then(|l| crate::link::interface_index(*l))
                    .unwrap_or(0)
            } else {
                0
            };
            sock.bind(&std::net::SocketAddrV6::new(g, port, 0, scope).into())?;
        }
    }
    let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
    // Join on each interface once: two addresses of one interface make the second join
    // fail with EADDRINUSE, which changes nothing.
    let mut joined = 0;
    let mut last_err = None;
    let interfaces: Vec<IpAddr> = if locals.is_empty() {
        vec![if v6 {
            Ipv6Addr::UNSPECIFIED.into()
        } else {
            Ipv4Addr::UNSPECIFIED.into()
        }]
    } else {
        locals
    };
    for l in interfaces {
        let r = match (group, l) {
            (IpAddr::V4(g), IpAddr::V4(a)) => sock.join_multicast_v4(&g, &a),
            (IpAddr::V6(g), IpAddr::V6(_)) => {
                sock.join_multicast_v6(&g, crate::link::interface_index(l).unwrap_or(0))
            }
            _ => continue,
        };
        match r {
            Ok(()) => joined += 1,
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => joined += 1,
            Err(e) => last_err = Some(e),
        }
    }
    if joined == 0 {
        return Err(last_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable)));
    }
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// The receiving socket, non-blocking, taking trains whole if `gro`; with packet info enabled when it is bound to the
/// unspecified address (bound to one address, every datagram is for that address, and the
/// control message would only cost each receive).
pub(crate) fn rx_socket(addr: SocketAddr, gro: bool) -> io::Result<Socket> {
    let sock = udp_socket(addr, false)?;
    sock.set_nonblocking(true)?;
    if gro {
        set_gro(&sock, true);
    }
    if !addr.ip().is_unspecified() {
        return Ok(sock);
    }
    if addr.is_ipv6() {
        nsock::setsockopt(&sock, nsock::sockopt::Ipv6RecvPacketInfo, &true)?;
    } else {
        nsock::setsockopt(&sock, nsock::sockopt::Ipv4PacketInfo, &true)?;
    }
    Ok(sock)
}

/// Turn `UDP_GRO` on or off: whether the kernel may hand this socket a train of datagrams
/// (of one sender, to one port, all of one size but the last) as one, with the segment size
/// in a control message. Best effort: without it every datagram comes alone.
pub(crate) fn set_gro(sock: &Socket, on: bool) {
    if let Err(e) = nsock::setsockopt(sock, nsock::sockopt::UdpGroSegment, &on) {
        tracing::debug!(error = %e, "cannot set UDP_GRO");
    }
}

/// Counters of the socket layer and of the routes that bypass it (the engine counts
/// everything after them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoCounters {
    /// Packets received and handed to the engine (each packet of a GRO train counts).
    pub rx_datagrams: u64,
    /// Datagrams dropped before the engine: truncated, empty, wrong family.
    pub rx_dropped: u64,
    /// Datagrams sent (each packet of a GSO train counts).
    pub tx_datagrams: u64,
    /// GSO trains sent: one `sendmsg` that the kernel cuts into several datagrams.
    pub tx_trains: u64,
    /// Send system calls made: a `sendmmsg` of the packets that leave alone, a `sendmsg`
    /// of a train (fewer than `tx_datagrams` when packets share them).
    pub tx_calls: u64,
    /// Datagrams that came as GSO/GRO trains of several packets (their packets count in
    /// `rx_datagrams`).
    pub rx_trains: u64,
    /// Packets the engine emitted that could not be sent (send error, unparsable header).
    pub tx_errors: u64,
    /// Packets sent from the fixed port after rewriting the source port and ICRC.
    pub tx_port_rewrites: u64,
    /// Packets between two QPs of this device, handed back to the engine with no socket.
    pub local_packets: u64,
    /// Packets handed to (or taken from) another device of this process with no socket.
    pub peer_packets: u64,
    /// Datagrams to a multicast group that a device of this process sent, back from the
    /// network: dropped, as the devices of the process had their copies already (see
    /// `route_multicast`).
    pub rx_mcast_own: u64,
}

impl IoCounters {
    /// Every counter by name, as `softrdma stat` prints them.
    pub fn named(&self) -> [(&'static str, u64); 11] {
        [
            ("rx_datagrams", self.rx_datagrams),
            ("rx_trains", self.rx_trains),
            ("rx_dropped", self.rx_dropped),
            ("tx_datagrams", self.tx_datagrams),
            ("tx_trains", self.tx_trains),
            ("tx_calls", self.tx_calls),
            ("tx_errors", self.tx_errors),
            ("tx_port_rewrites", self.tx_port_rewrites),
            ("local_packets", self.local_packets),
            ("peer_packets", self.peer_packets),
            ("rx_mcast_own", self.rx_mcast_own),
        ]
    }
}

/// One local address's sending side: the receiving socket (the fixed source port) and the
/// per-port sockets opened on first use.
#[derive(Debug)]
struct Local {
    ip: IpAddr,
    fixed: Arc<Socket>,
    per_port: BTreeMap<u16, Option<Socket>>,
}

impl Local {
    /// The socket that sends from `port`: the fixed one for the fixed port, or when no
    /// socket could be bound to `port`.
    fn socket(&self, port: u16) -> &Socket {
        match self.per_port.get(&port) {
            Some(Some(s)) => s,
            _ => &self.fixed,
        }
    }
}

/// Trains kept open at once (one per QP sending; the oldest leaves when another starts).
const MAX_OPEN_TRAINS: usize = 16;

/// Packets of one QP that leave as one `UDP_SEGMENT` send (see [`wire::train`]).
#[derive(Debug)]
struct Train {
    /// The local address (index into `Tx::locals`) and source port: the socket.
    local: usize,
    port: u16,
    to: SocketAddr,
    /// The segment size: the first packet's UDP payload length.
    seg: usize,
    /// The last packet's link.
    last: wire::train::Link,
    /// A shorter packet ended it.
    closed: bool,
    /// UDP payload bytes so far.
    bytes: usize,
    /// Each packet whole, as the engine emitted it (with its segment's IPv4 ID), and where
    /// its UDP payload lies. Room for a whole train, kept from train to train.
    packets: Vec<(Vec<u8>, Range<usize>)>,
    /// What the segments' IDs do to their ICRCs (they share one length but the last's).
    deltas: wire::icrc::IdentDeltas,
}

impl Train {
    /// Whether a packet of `len` payload bytes and `link` may ride next.
    fn takes(&self, link: wire::train::Link, len: usize) -> bool {
        !self.closed
            && len <= self.seg
            && self.last.is_followed_by(link)
            && self.packets.len() < wire::train::MAX_SEGMENTS
            && self.bytes + len <= wire::train::MAX_BYTES
    }
}

/// The sending side: for each local address, one socket per UDP source port (opened
/// lazily), or the fixed one; the trains of packets that leave together.
#[derive(Debug)]
pub(crate) struct Tx {
    locals: Vec<Local>,
    remote_port: u16,
    policy: SrcPortPolicy,
    fixed_port: u16,
    /// Send consecutive full-size packets of a QP as GSO trains (`UDP_SEGMENT`); cleared
    /// for good when the kernel refuses one.
    gso: bool,
    trains: Vec<Train>,
    /// Packets that leave alone, queued for one `sendmmsg` per socket at [`Tx::flush`].
    singles: Vec<Single>,
    multi: mmsg::MultiSend,
    /// Packet buffers back from trains and singles that left.
    spare: Vec<Vec<u8>>,
    /// The packet lists of trains that left, for the next trains to fill.
    spare_lists: Vec<Vec<(Vec<u8>, Range<usize>)>>,
    /// The headers of the last packets sent: the packets of a message share them.
    parsed: wire::DatagramCache,
    pub(crate) counters: IoCounters,
}

/// Packets queued to leave alone, at most (then they leave at once).
const MAX_SINGLES: usize = 64;

/// A packet that leaves alone, queued until the pass ends.
#[derive(Debug)]
struct Single {
    /// The socket (as in [`Train`]).
    local: usize,
    port: u16,
    to: SockAddr,
    /// The packet whole, and where its UDP payload lies.
    buf: Vec<u8>,
    payload: Range<usize>,
}

impl Tx {
    /// `fixed`: each local address with its receiving socket, bound to `fixed_port`.
    pub(crate) fn new(
        fixed: Vec<(IpAddr, Arc<Socket>)>,
        remote_port: u16,
        policy: SrcPortPolicy,
        fixed_port: u16,
        gso: bool,
    ) -> Tx {
        Tx {
            locals: fixed
                .into_iter()
                .map(|(ip, fixed)| Local {
                    ip,
                    fixed,
                    per_port: BTreeMap::new(),
                })
                .collect(),
            remote_port,
            policy,
            fixed_port,
            gso,
            trains: Vec::new(),
            singles: Vec::with_capacity(MAX_SINGLES),
            multi: mmsg::MultiSend::new(MAX_SINGLES),
            spare: Vec::new(),
            spare_lists: Vec::new(),
            parsed: wire::DatagramCache::new(),
            counters: IoCounters::default(),
        }
    }

    /// Change the UDP port packets are sent to.
    pub(crate) fn set_remote_port(&mut self, port: u16) {
        self.remote_port = port;
    }

    /// Send the whole IP packet in `buf[..len]` (as the engine emitted it) to `dst`, from
    /// the local address it names as its source (the first one if it names none of them),
    /// and record it in `capture` as it goes out. A packet that may ride a GSO train waits
    /// in one, and `buf` is swapped for a spare: [`Tx::flush`] sends the trains.
    pub(crate) fn send(
        &mut self,
        buf: &mut Vec<u8>,
        len: usize,
        dst: IpAddr,
        capture: Option<&Capture>,
    ) {
        let pkt = &mut buf[..len];
        let Ok(mut d) = self.parsed.parse(pkt) else {
            self.counters.tx_errors += 1;
            return;
        };
        let Some(li) = self
            .locals
            .iter()
            .position(|l| l.ip == d.src.ip())
            .or((!self.locals.is_empty()).then_some(0))
        else {
            self.counters.tx_errors += 1;
            return;
        };
        let to = SocketAddr::new(dst, self.remote_port);
        let src_port = d.src.port();
        let port = self.source_port(li, src_port);
        if port != src_port {
            // The ICRC covers the UDP source port: rewrite both.
            if d.set_src_port(pkt, port).is_err() {
                self.counters.tx_errors += 1;
                return;
            }
            self.counters.tx_port_rewrites += 1;
        }
        let payload = d.payload.clone();
        let link = if self.gso {
            wire::train::Link::of(&pkt[payload.clone()])
        } else {
            None
        };
        if let Some(link) = link {
            let open = self.trains.iter().position(|t| {
                t.local == li && t.port == port && t.to == to && t.last.dest_qp == link.dest_qp
            });
            if let Some(i) = open {
                let t = &mut self.trains[i];
                if t.takes(link, payload.len()) {
                    // Segment k leaves with IPv4 ID k: seal it for that ID.
                    let k = u16::try_from(t.packets.len()).unwrap_or(u16::MAX);
                    if d.set_ipv4_ident_with(pkt, k, &mut t.deltas).is_ok() {
                        if let Some(c) = capture {
                            c.record(pkt);
                        }
                        t.closed = payload.len() < t.seg;
                        t.bytes += payload.len();
                        t.last = link;
                        let spare = self.spare.pop().unwrap_or_else(|| vec![0; buf.len()]);
                        t.packets.push((std::mem::replace(buf, spare), payload));
                        return;
                    }
                }
                // The QP's next packet does not ride: what the train holds goes first.
                self.flush_train(i);
            }
            if link.leads(payload.len()) {
                if let Some(c) = capture {
                    c.record(pkt);
                }
                if self.trains.len() >= MAX_OPEN_TRAINS {
                    self.flush_train(0);
                }
                let spare = self.spare.pop().unwrap_or_else(|| vec![0; buf.len()]);
                let mut packets = self
                    .spare_lists
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(wire::train::MAX_SEGMENTS));
                let seg = payload.len();
                packets.push((std::mem::replace(buf, spare), payload));
                self.trains.push(Train {
                    local: li,
                    port,
                    to,
                    seg,
                    last: link,
                    closed: false,
                    bytes: seg,
                    packets,
                    deltas: wire::icrc::IdentDeltas::new(),
                });
                return;
            }
        }
        if let Some(c) = capture {
            c.record(pkt);
        }
        let spare = self.spare.pop().unwrap_or_else(|| vec![0; buf.len()]);
        self.queue_single(li, port, to, std::mem::replace(buf, spare), payload);
    }

    /// Queue a packet that leaves alone; a full queue leaves at once.
    fn queue_single(
        &mut self,
        local: usize,
        port: u16,
        to: SocketAddr,
        buf: Vec<u8>,
        payload: Range<usize>,
    ) {
        if self.singles.len() >= MAX_SINGLES {
            self.flush_singles();
        }
        self.singles.push(Single {
            local,
            port,
            to: SockAddr::from(to),
            buf,
            payload,
        });
    }

    /// Send the queued singles: one `sendmmsg` for each run of them that leaves from one
    /// socket (their order kept). A datagram the kernel refuses is counted and skipped.
    fn flush_singles(&mut self) {
        let Tx {
            locals,
            singles,
            multi,
            spare,
            counters,
            ..
        } = self;
        let mut at = 0;
        while at < singles.len() {
            let (local, port) = (singles[at].local, singles[at].port);
            let run = singles[at..]
                .iter()
                .take_while(|s| s.local == local && s.port == port)
                .count();
            let sock = locals[local].socket(port);
            let end = at + run;
            while at < end {
                let batch = singles[at..end]
                    .iter()
                    .map(|s| (&s.buf[s.payload.clone()], &s.to));
                counters.tx_calls += 1;
                match multi.send(sock.as_fd(), batch) {
                    Ok(n) if n > 0 => {
                        counters.tx_datagrams += n as u64;
                        at += n;
                    }
                    result => {
                        counters.tx_errors += 1;
                        tracing::debug!(to = ?singles[at].to.as_socket(), ?result, "send failed; the transport will retransmit");
                        at += 1;
                    }
                }
            }
        }
        spare.extend(singles.drain(..).map(|s| s.buf));
    }

    /// The source port a packet the engine sent from `port` leaves from: its own where the
    /// policy is per-QP ports and a socket is (or can be) bound to it, else the fixed port.
    fn source_port(&mut self, li: usize, port: u16) -> u16 {
        if self.policy != SrcPortPolicy::PerQp || port == self.fixed_port {
            return self.fixed_port;
        }
        let local = &mut self.locals[li];
        let ip = local.ip;
        let bound = local.per_port.entry(port).or_insert_with(|| {
            match udp_socket(SocketAddr::new(ip, port), true) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(port, error = %e, "cannot bind UDP source port; using the fixed port for it");
                    None
                }
            }
        });
        if bound.is_some() {
            port
        } else {
            self.fixed_port
        }
    }

    /// Count `packets` sent, or lost to a send error (the transport retransmits them).
    fn count_sent(&mut self, result: io::Result<()>, packets: u64, dst: IpAddr) {
        match result {
            Ok(()) => self.counters.tx_datagrams += packets,
            Err(e) => {
                self.counters.tx_errors += packets;
                tracing::debug!(%dst, error = %e, "send failed; the transport will retransmit");
            }
        }
    }

    /// Send every queued single and open train.
    pub(crate) fn flush(&mut self) {
        while !self.trains.is_empty() {
            self.flush_train(0);
        }
        self.flush_singles();
    }

    /// Send open train `i`: one `sendmsg` whose `UDP_SEGMENT` cuts it into its packets,
    /// gathered straight from their buffers. A kernel that refuses the train (a device
    /// without checksum offload, a path MTU below the segment) gets its packets one by one,
    /// and no train again.
    fn flush_train(&mut self, i: usize) {
        let mut t = self.trains.remove(i);
        let n = t.packets.len();
        if n == 1 {
            // A train of one leaves alone, with the singles.
            if let Some((b, r)) = t.packets.pop() {
                self.queue_single(t.local, t.port, t.to, b, r);
            }
            self.spare_lists.push(t.packets);
            return;
        }
        // A QP's singles queued before its train opened leave first.
        self.flush_singles();
        let sock = self.locals[t.local].socket(t.port);
        self.counters.tx_calls += 1;
        let result = {
            let iov: SmallVec<[IoSlice<'_>; 8]> = t
                .packets
                .iter()
                .map(|(b, r)| IoSlice::new(&b[r.clone()]))
                .collect();
            let seg = u16::try_from(t.seg).unwrap_or(u16::MAX);
            let gso = [nsock::ControlMessage::UdpGsoSegments(&seg)];
            let to = SockaddrStorage::from(t.to);
            nsock::sendmsg(sock.as_raw_fd(), &iov, &gso, MsgFlags::empty(), Some(&to))
                .map(drop)
                .map_err(io::Error::from)
        };
        let refused = n > 1
            && matches!(
                result.as_ref().map_err(io::Error::raw_os_error),
                Err(Some(libc::EIO | libc::EINVAL))
            );
        if refused {
            tracing::warn!(to = %t.to, error = ?result, "the kernel refuses UDP GSO trains here; sending packet by packet");
            self.gso = false;
            for (b, r) in &mut t.packets {
                // Back to the ID a lone datagram leaves with.
                let sent = match wire::Datagram::parse(b) {
                    Ok(d) if d.set_ipv4_ident(b, 0).is_ok() => self.locals[t.local]
                        .socket(t.port)
                        .send_to(&b[r.clone()], &SockAddr::from(t.to))
                        .map(drop),
                    _ => Err(io::Error::from(io::ErrorKind::InvalidData)),
                };
                self.counters.tx_calls += 1;
                self.count_sent(sent, 1, t.to.ip());
            }
        } else {
            if n > 1 && result.is_ok() {
                self.counters.tx_trains += 1;
            }
            self.count_sent(result, n as u64, t.to.ip());
        }
        self.spare.extend(t.packets.drain(..).map(|(b, _)| b));
        self.spare_lists.push(t.packets);
    }
}

/// Where one received datagram lies: one packet, or a train of them.
#[derive(Debug, Clone, Copy)]
struct Meta {
    /// Which slot holds it.
    slot: usize,
    /// Where its UDP payload lies in the slot.
    start: usize,
    end: usize,
    /// The length of each packet but the last (all of it for one packet).
    seg: usize,
    /// Who sent it to whom (the UDP path rebuilds the headers from them).
    src: SocketAddr,
    dst: IpAddr,
    /// The raw path: the IPv4 and UDP headers the datagram came with, from which each
    /// packet of a train gets its own.
    header: [u8; wire::train::IPV4_TRAIN_HEADER_LEN],
}

/// A raw IPv4/UDP socket bound to `addr`'s address: it sees every UDP packet to that address
/// with its real IP header, and keeps those to `addr`'s port (a socket filter, so the
/// host's other UDP traffic neither wakes the progress thread nor fills the queue; the
/// receive path checks the port again, for packets queued before the filter). Needs
/// `CAP_NET_RAW`.
pub(crate) fn raw_rx_socket(addr: SocketAddr) -> io::Result<Socket> {
    let sock = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::UDP))?;
    sock.attach_filter(&udp_port_filter(addr.port()))?;
    let _ = sock.set_recv_buffer_size(SOCKET_BUFFER);
    sock.bind(&SocketAddr::new(addr.ip(), 0).into())?;
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// A classic BPF program for a raw IPv4 socket (each packet starts at its IP header) that
/// keeps the UDP datagrams to `port`.
fn udp_port_filter(port: u16) -> [socket2::SockFilter; 5] {
    use socket2::SockFilter as F;
    // Opcodes of linux/filter.h.
    const LDX_B_MSH: u16 = 0x01 | 0x10 | 0xa0; // X = 4 * (pkt[k] & 0xf): the IP header length
    const LD_H_IND: u16 = 0x08 | 0x40; // A = be16 at X + k
    const JEQ_K: u16 = 0x05 | 0x10;
    const RET_K: u16 = 0x06;
    [
        F::new(LDX_B_MSH, 0, 0, 0),
        F::new(LD_H_IND, 0, 0, 2), // the UDP destination port
        F::new(JEQ_K, 0, 1, port as u32),
        F::new(RET_K, 0, 0, u32::MAX),
        F::new(RET_K, 0, 0, 0),
    ]
}

/// Most datagrams one `recvmmsg` takes ([`crate::RuntimeConfig::rx_batch`] is capped here).
pub(crate) const MAX_RX_BATCH: usize = 64;

/// A count per receiving socket (a device has one per address family, and a raw socket
/// where it may): kept on the stack, as every look for packets makes one.
pub(crate) type PerSocket = SmallVec<[usize; 4]>;

/// The receiving side: a batch of slots, each with headroom for the rebuilt headers.
pub(crate) struct Rx {
    sock: Arc<Socket>,
    local: IpAddr,
    slots: Vec<u8>,
    /// Bytes per slot: the headroom and the largest datagram this side takes.
    slot_len: usize,
    meta: Vec<Meta>,
    /// The next packet [`Rx::next_packet`] hands out: datagram, packet within it.
    cursor: (usize, usize),
    mrecv: mmsg::MultiRecv,
    batch: usize,
    /// Raw receive path: the UDP port whose packets are ours (`None`: a UDP socket).
    raw_port: Option<u16>,
    /// A multicast group's side ([`group_socket`]; `local` is the group): datagrams from
    /// these sources (this process's devices, which delivered their own copies) are dropped.
    /// `None`: a unicast side.
    own_sources: Option<Vec<IpAddr>>,
    /// Receive-side counters.
    pub(crate) counters: IoCounters,
    /// The last look of a polling thread found packets (so the next takes a batch).
    pub(crate) streaming: bool,
}

impl core::fmt::Debug for Rx {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Rx")
            .field("local", &self.local)
            .field("batch", &self.batch)
            .finish_non_exhaustive()
    }
}

impl Rx {
    /// `raw_port`: `sock` is a raw socket ([`raw_rx_socket`]) and packets to this UDP port
    /// are ours.
    /// `trains`: datagrams may come as trains (the socket has `UDP_GRO`, or is raw and
    /// sees GSO trains uncut), so each slot takes the largest datagram.
    pub(crate) fn new(
        sock: Arc<Socket>,
        local: IpAddr,
        batch: usize,
        raw_port: Option<u16>,
        trains: bool,
    ) -> Rx {
        let batch = batch.clamp(1, MAX_RX_BATCH);
        let slot_len = HEADROOM + if trains { MAX_TRAIN } else { MAX_DATAGRAM };
        Rx {
            sock,
            local,
            slots: vec![0; slot_len * batch],
            slot_len,
            meta: Vec::with_capacity(batch),
            cursor: (0, 0),
            mrecv: mmsg::MultiRecv::new(batch),
            batch,
            raw_port,
            own_sources: None,
            counters: IoCounters::default(),
            streaming: false,
        }
    }

    /// The side of multicast group `group`, on a socket from [`group_socket`] (`raw_port`
    /// as for [`Rx::new`]); datagrams from `own_sources` are dropped.
    pub(crate) fn for_group(
        sock: Arc<Socket>,
        group: IpAddr,
        batch: usize,
        raw_port: Option<u16>,
        own_sources: Vec<IpAddr>,
    ) -> Rx {
        let trains = raw_port.is_some();
        let mut rx = Rx::new(sock, group, batch, raw_port, trains);
        rx.own_sources = Some(own_sources);
        rx
    }

    /// The multicast group this side receives, if it is a group's.
    pub(crate) fn group(&self) -> Option<IpAddr> {
        self.own_sources.is_some().then_some(self.local)
    }

    /// The socket this side reads.
    pub(crate) fn socket(&self) -> &Arc<Socket> {
        &self.sock
    }

    /// Receive what is waiting (up to one batch) without blocking. Returns the number of
    /// packets ready for [`Rx::next_packet`] (a train holds several).
    pub(crate) fn recv_batch(&mut self) -> usize {
        self.receive(self.batch)
    }

    /// Receive one datagram if one is waiting, without blocking (a thread that polls for
    /// the next packet of a ping-pong pays for no second look, as a batch would). Returns
    /// the number of packets ready for [`Rx::next_packet`] (0 or 1, or those of a train).
    pub(crate) fn recv_one(&mut self) -> usize {
        self.receive(1)
    }

    /// Receive up to `max` datagrams into the slots; list the usable ones.
    fn receive(&mut self, max: usize) -> usize {
        self.meta.clear();
        self.cursor = (0, 0);
        // A raw socket delivers the IP header too: receive from the start of the slot.
        let at = self.payload_offset();
        let mut got: SmallVec<[(usize, mmsg::Received); MAX_RX_BATCH]> = SmallVec::new();
        let slots = &mut self.slots[..self.slot_len * max.min(self.batch)];
        let res = self
            .mrecv
            .recv(self.sock.as_fd(), slots, self.slot_len, at, |i, r| {
                got.push((i, r));
            });
        if let Err(e) = res {
            if e != nix::errno::Errno::EAGAIN {
                tracing::debug!(error = %e, "recvmmsg failed");
            }
            return 0;
        }
        let mut packets = 0;
        // By reference: moving the batch into an iterator copies all its 64 slots (5 KB),
        // a tenth of a ping-pong's user time.
        for &(i, r) in &got {
            packets += self.accept(i, r);
        }
        self.counters.rx_datagrams += packets as u64;
        packets
    }

    /// Whether the IP and UDP headers of this side's packets are rebuilt (a UDP socket), not
    /// the sender's own (a raw socket).
    pub(crate) fn rebuilds_headers(&self) -> bool {
        self.raw_port.is_none()
    }

    /// Where in a slot the socket writes: a raw socket delivers the IP header too.
    fn payload_offset(&self) -> usize {
        if self.raw_port.is_some() {
            0
        } else {
            HEADROOM
        }
    }

    /// Check the datagram received into slot `i` and, if it is usable, list it in `meta`.
    /// Returns how many packets it holds.
    fn accept(&mut self, i: usize, r: mmsg::Received) -> usize {
        let mmsg::Received {
            len,
            truncated,
            src,
            dst,
            seg,
        } = r;
        let counters = &mut self.counters;
        let base = i * self.slot_len;
        if let Some(port) = self.raw_port {
            let slot = &mut self.slots[base..base + self.slot_len];
            match raw_packet(&mut slot[..len.min(self.slot_len)], port, truncated) {
                RawVerdict::Ours { src, .. }
                    if self
                        .own_sources
                        .as_ref()
                        .is_some_and(|o| o.contains(&src.ip())) =>
                {
                    counters.rx_mcast_own += 1;
                }
                RawVerdict::Ours { payload, src, dst } => {
                    // A raw socket sees a GSO train uncut, with no segment size: the train
                    // rules tell where its packets lie.
                    let seg = wire::train::segment_len(&slot[payload.clone()]);
                    return self.list(i, payload, seg, src, dst);
                }
                RawVerdict::NotOurs => {}
                RawVerdict::Bad => counters.rx_dropped += 1,
            }
            return 0;
        }
        let Some(src) = src else {
            counters.rx_dropped += 1;
            return 0;
        };
        if truncated || len == 0 || src.is_ipv4() != self.local.is_ipv4() {
            counters.rx_dropped += 1;
            return 0;
        }
        if self
            .own_sources
            .as_ref()
            .is_some_and(|o| o.contains(&src.ip()))
        {
            counters.rx_mcast_own += 1;
            return 0;
        }
        let dst = dst.unwrap_or(self.local);
        let seg = seg.filter(|&s| s > 0 && s < len).unwrap_or(len);
        self.list(i, HEADROOM..HEADROOM + len, seg, src, dst)
    }

    /// List the datagram whose UDP payload lies at `payload` in slot `i`, cut every `seg`
    /// bytes; returns how many packets that makes.
    fn list(
        &mut self,
        i: usize,
        payload: Range<usize>,
        seg: usize,
        src: SocketAddr,
        dst: IpAddr,
    ) -> usize {
        let packets = payload.len().div_ceil(seg.max(1));
        if packets > 1 {
            self.counters.rx_trains += 1;
        }
        let base = i * self.slot_len;
        let mut header = [0; wire::train::IPV4_TRAIN_HEADER_LEN];
        if self.raw_port.is_some() {
            header.copy_from_slice(&self.slots[base..base + wire::train::IPV4_TRAIN_HEADER_LEN]);
        }
        self.meta.push(Meta {
            slot: i,
            start: payload.start,
            end: payload.end,
            seg: seg.max(1),
            src,
            dst,
            header,
        });
        packets
    }

    /// The next packet of the last receive (a whole IP packet), in order, or `None` when
    /// all were handed out. Each packet's IP and UDP headers are written in front of its
    /// UDP payload as the handing out reaches it: for the second packet of a train and
    /// after, over the end of the packet before it, which its caller is done with (so a
    /// train needs no copy).
    ///
    /// The UDP path rebuilds the headers as the sender built them (IPv4 ID 0 and DF; the
    /// `k`th packet of a train gets ID `k`, as the kernel numbered the segments of the train
    /// the sender handed it, and the engine finds the right one when that guess is wrong:
    /// see "Receive policy"). The raw path keeps the sender's header, with the lengths of
    /// each packet and the ID of its segment.
    pub(crate) fn next_packet(&mut self) -> Option<&[u8]> {
        loop {
            let (mi, k) = self.cursor;
            let m = *self.meta.get(mi)?;
            let at = m.start + k * m.seg;
            let end = (at + m.seg).min(m.end);
            self.cursor = if end >= m.end {
                (mi + 1, 0)
            } else {
                (mi, k + 1)
            };
            let base = m.slot * self.slot_len;
            let slot = &mut self.slots[base..base + self.slot_len];
            let start = if self.raw_port.is_some() {
                // The train's header (or the packet's own, when it came alone) is
                // `m.start` bytes long: written over the end of the packet before.
                at.checked_sub(m.start).filter(|&h| {
                    m.end - m.start == end - at
                        || wire::train::ipv4_segment_header(
                            &m.header,
                            &mut slot[h..at],
                            k,
                            end - at,
                        )
                        .is_ok()
                })
            } else {
                let ident = if m.end - m.start > m.seg {
                    u16::try_from(k).unwrap_or(u16::MAX)
                } else {
                    0
                };
                write_headers(slot, at, end - at, m.src, m.dst, ident)
            };
            match start {
                Some(start) => return Some(&self.slots[base + start..base + end]),
                None => self.counters.rx_dropped += 1,
            }
        }
    }
}

/// What the raw receive path makes of one IPv4 packet.
#[derive(Debug, PartialEq, Eq)]
enum RawVerdict {
    /// A UDP datagram to our port, from `src` to `dst`, its UDP payload at `payload`; its
    /// destination port now reads 4791.
    Ours {
        /// Where its UDP payload lies.
        payload: Range<usize>,
        /// Its source address and port.
        src: SocketAddr,
        /// Its destination address.
        dst: IpAddr,
    },
    /// Some other UDP traffic of this host.
    NotOurs,
    /// Ours but unusable (truncated, malformed).
    Bad,
}

/// Check a packet from the raw socket: IPv4 without options, UDP, to `port`. The header is
/// the sender's own, so the engine checks the ICRC exactly, whatever IP ID it carries. A
/// port other than 4791 is mapped back to 4791, as on the UDP path.
fn raw_packet(p: &mut [u8], port: u16, truncated: bool) -> RawVerdict {
    let Ok(mut d) = wire::Datagram::parse(p) else {
        // Not a UDP packet we can read (the raw socket sees all of this host's UDP).
        return RawVerdict::NotOurs;
    };
    if d.dst.port() != port {
        return RawVerdict::NotOurs;
    }
    if truncated || d.payload.start != wire::train::IPV4_TRAIN_HEADER_LEN {
        return RawVerdict::Bad;
    }
    d.set_dst_port(p, ROCEV2_UDP_PORT);
    RawVerdict::Ours {
        payload: d.payload,
        src: d.src,
        dst: d.dst.ip(),
    }
}

/// Write the IP and UDP headers of a datagram whose `len` bytes of UDP payload lie at
/// `slot[at..]` in front of it, as the sender's engine built them: IPv4 with ID `ident` and
/// DF, UDP destination port 4791 (the port the ICRC was computed with, whatever port
/// carried it), checksum 0. Returns where the packet starts.
pub(crate) fn write_headers(
    slot: &mut [u8],
    at: usize,
    len: usize,
    src: SocketAddr,
    dst: IpAddr,
    ident: u16,
) -> Option<usize> {
    let udp_len = len + wire::UDP_HEADER_LEN;
    let ip = match (src.ip(), dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(Ipv4Repr {
            src: s,
            dst: d,
            tos: 0,
            ident,
            dont_frag: true,
            ttl: 64,
            payload_len: udp_len,
        }),
        (IpAddr::V6(s), IpAddr::V6(d)) => IpRepr::V6(Ipv6Repr {
            src: s,
            dst: d,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            payload_len: udp_len,
        }),
        _ => return None,
    };
    let hl = ip.header_len();
    let start = at.checked_sub(wire::UDP_HEADER_LEN + hl)?;
    let udp = UdpRepr {
        src_port: src.port(),
        dst_port: ROCEV2_UDP_PORT,
        length: u16::try_from(udp_len).ok()?,
        checksum: 0,
    };
    udp.emit(&mut Udp::new_unchecked(
        &mut slot[at - wire::UDP_HEADER_LEN..at],
    ));
    match ip {
        IpRepr::V4(r) => r.emit(&mut Ipv4::new_unchecked(&mut slot[start..start + hl])),
        IpRepr::V6(r) => r.emit(&mut Ipv6::new_unchecked(&mut slot[start..start + hl])),
    }
    Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, UdpSocket};

    /// Every datagram waiting on non-blocking `sock`, as (source, payload).
    fn drain(sock: &Socket) -> Vec<(IpAddr, Vec<u8>)> {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let udp = UdpSocket::from(sock.try_clone().unwrap());
        let mut out = Vec::new();
        let mut buf = [0u8; 256];
        while let Ok((n, from)) = udp.recv_from(&mut buf) {
            out.push((from.ip(), buf[..n].to_vec()));
        }
        out
    }

    #[test]
    fn a_group_socket_gets_its_groups_datagrams_to_its_port_on_lo() {
        let group = IpAddr::V4(Ipv4Addr::new(239, 9, 9, 61));
        let port = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let a = group_socket(group, port, &[IpAddr::V4(Ipv4Addr::LOCALHOST)], false).unwrap();
        // A second member on the same interface, as another device or process: both get
        // every datagram.
        let b = group_socket(group, port, &["127.0.0.2".parse().unwrap()], false).unwrap();
        // A socket of another group on the same port gets none of them.
        let other = group_socket(
            IpAddr::V4(Ipv4Addr::new(239, 9, 9, 62)),
            port,
            &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
            false,
        )
        .unwrap();
        let tx = udp_socket(SocketAddr::from(([127, 0, 0, 3], 0)), false).unwrap();
        tx.send_to(b"to the group", &SocketAddr::new(group, port).into())
            .unwrap();
        tx.send_to(b"other port", &SocketAddr::new(group, port ^ 1).into())
            .unwrap();
        let from: IpAddr = "127.0.0.3".parse().unwrap();
        for s in [&a, &b] {
            assert_eq!(drain(s), [(from, b"to the group".to_vec())]);
        }
        assert!(drain(&other).is_empty());
    }

    #[test]
    fn a_raw_group_socket_sees_its_groups_datagrams_to_its_port_with_their_ip_header() {
        let group = Ipv4Addr::new(239, 9, 9, 63);
        let port = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let Ok(raw) = group_socket(group.into(), port, &[Ipv4Addr::LOCALHOST.into()], true) else {
            eprintln!("skipped: a raw socket needs root or CAP_NET_RAW");
            return;
        };
        let tx = udp_socket(SocketAddr::from(([127, 0, 0, 3], 0)), false).unwrap();
        tx.send_to(b"other port", &SocketAddr::from((group, port ^ 1)).into())
            .unwrap();
        tx.send_to(b"ours", &SocketAddr::from((group, port)).into())
            .unwrap();
        raw.set_nonblocking(false).unwrap();
        raw.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut &raw, &mut buf).expect("the datagram to our port");
        let d = wire::Datagram::parse(&buf[..n]).unwrap();
        assert_eq!(d.src.ip(), IpAddr::from([127, 0, 0, 3]));
        assert_eq!(d.dst, SocketAddr::from((group, port)));
        assert_eq!(&buf[d.payload.clone()], b"ours");
    }

    #[test]
    fn the_raw_socket_sees_only_datagrams_to_its_port() {
        let ip = Ipv4Addr::new(127, 0, 0, 61);
        let ours = UdpSocket::bind((ip, 0)).unwrap();
        let port = ours.local_addr().unwrap().port();
        let Ok(raw) = raw_rx_socket(SocketAddr::from((ip, port))) else {
            eprintln!("skipped: a raw socket needs root or CAP_NET_RAW");
            return;
        };
        let other = UdpSocket::bind((ip, 0)).unwrap();
        let tx = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        tx.send_to(b"not ours", other.local_addr().unwrap())
            .unwrap();
        tx.send_to(b"ours", (ip, port)).unwrap();
        raw.set_nonblocking(false).unwrap();
        raw.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = std::io::Read::read(&mut &raw, &mut buf).expect("the datagram to our port");
        let got = &buf[..n];
        assert!(
            got.ends_with(b"ours") && !got.ends_with(b"not ours"),
            "{got:?}"
        );
        let ihl = usize::from(got[0] & 0xf) * 4;
        assert_eq!(u16::from_be_bytes([got[ihl + 2], got[ihl + 3]]), port);
    }
}
