//! The socket layer: strip the IP and UDP headers the engine emits and send the rest from the
//! right UDP source port; receive datagrams (batched with `recvmmsg`, with `IP_PKTINFO` /
//! `IPV6_RECVPKTINFO`) and rebuild the headers the sender's ICRC covered.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::io;
use std::io::IoSliceMut;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use nix::sys::socket::{self as nsock, ControlMessageOwned, MsgFlags, SockaddrStorage};
use smallvec::SmallVec;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use wire::{IpRepr, Ipv4, Ipv4Repr, Ipv6, Ipv6Repr, Udp, UdpRepr, ROCEV2_UDP_PORT};

use crate::config::SrcPortPolicy;

/// Room in front of every receive slot for the rebuilt headers (IPv6 40 + UDP 8; IPv4 uses
/// the last 28 bytes).
pub(crate) const HEADROOM: usize = 48;
/// Largest UDP payload we accept: a 4096-byte MTU packet plus every RoCE header, with room.
pub(crate) const MAX_DATAGRAM: usize = 8192;
const SLOT: usize = HEADROOM + MAX_DATAGRAM;
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

/// The receiving socket, non-blocking; with packet info enabled when it is bound to the
/// unspecified address (bound to one address, every datagram is for that address, and the
/// control message would only cost each receive).
pub(crate) fn rx_socket(addr: SocketAddr) -> io::Result<Socket> {
    let sock = udp_socket(addr, false)?;
    sock.set_nonblocking(true)?;
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

/// Counters of the socket layer and of the routes that bypass it (the engine counts
/// everything after them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct IoCounters {
    /// Datagrams received and handed to the engine.
    pub rx_datagrams: u64,
    /// Datagrams dropped before the engine: truncated, empty, wrong family.
    pub rx_dropped: u64,
    /// Datagrams sent.
    pub tx_datagrams: u64,
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
    pub fn named(&self) -> [(&'static str, u64); 8] {
        [
            ("rx_datagrams", self.rx_datagrams),
            ("rx_dropped", self.rx_dropped),
            ("tx_datagrams", self.tx_datagrams),
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

/// The sending side: for each local address, one socket per UDP source port (opened
/// lazily), or the fixed one.
#[derive(Debug)]
pub(crate) struct Tx {
    locals: Vec<Local>,
    remote_port: u16,
    policy: SrcPortPolicy,
    fixed_port: u16,
    pub(crate) counters: IoCounters,
}

impl Tx {
    /// `fixed`: each local address with its receiving socket, bound to `fixed_port`.
    pub(crate) fn new(
        fixed: Vec<(IpAddr, Arc<Socket>)>,
        remote_port: u16,
        policy: SrcPortPolicy,
        fixed_port: u16,
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
            counters: IoCounters::default(),
        }
    }

    /// Change the UDP port packets are sent to.
    pub(crate) fn set_remote_port(&mut self, port: u16) {
        self.remote_port = port;
    }

    /// Send the whole IP packet `pkt` (as the engine emitted it) to `dst`, from the local
    /// address it names as its source (the first one if it names none of them).
    pub(crate) fn send(&mut self, pkt: &mut [u8], dst: IpAddr) {
        let Ok(mut d) = wire::Datagram::parse(pkt) else {
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
        let to = SockAddr::from(SocketAddr::new(dst, self.remote_port));
        let src_port = d.src.port();
        let per_qp = self.policy == SrcPortPolicy::PerQp && src_port != self.fixed_port;
        let local = &mut self.locals[li];
        let sock = if per_qp {
            let ip = local.ip;
            local
                .per_port
                .entry(src_port)
                .or_insert_with(|| match udp_socket(SocketAddr::new(ip, src_port), true) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::warn!(port = src_port, error = %e, "cannot bind UDP source port; using the fixed port for it");
                        None
                    }
                })
                .as_ref()
        } else {
            None
        };
        let result = match sock {
            Some(s) => s.send_to(&pkt[d.payload.clone()], &to),
            None => {
                if src_port != self.fixed_port {
                    // The ICRC covers the UDP source port: rewrite both.
                    if d.set_src_port(pkt, self.fixed_port).is_err() {
                        self.counters.tx_errors += 1;
                        return;
                    }
                    self.counters.tx_port_rewrites += 1;
                }
                local.fixed.send_to(&pkt[d.payload.clone()], &to)
            }
        };
        match result {
            Ok(_) => self.counters.tx_datagrams += 1,
            Err(e) => {
                self.counters.tx_errors += 1;
                tracing::debug!(%dst, error = %e, "send failed; the transport will retransmit");
            }
        }
    }
}

/// Where one received packet lies.
#[derive(Debug, Clone, Copy)]
struct Meta {
    /// Which slot holds it.
    slot: usize,
    /// Where the (rebuilt or real) IP header starts in the slot.
    start: usize,
    /// Where the packet ends in the slot.
    end: usize,
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
    meta: Vec<Meta>,
    headers: nsock::MultiHeaders<SockaddrStorage>,
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

// SAFETY: `MultiHeaders` is !Send only because it holds raw pointers; they point into its own
// heap allocations (control-message buffers and addresses), which move with it, and every use
// goes through `&mut self` (the runtime keeps the `Rx` behind a mutex).
#[allow(unsafe_code)]
unsafe impl Send for Rx {}

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
    pub(crate) fn new(sock: Arc<Socket>, local: IpAddr, batch: usize, raw_port: Option<u16>) -> Rx {
        let batch = batch.clamp(1, MAX_RX_BATCH);
        let cmsg = if local.is_ipv6() {
            nix::cmsg_space!(libc::in6_pktinfo)
        } else {
            nix::cmsg_space!(libc::in_pktinfo)
        };
        Rx {
            sock,
            local,
            slots: vec![0; SLOT * batch],
            meta: Vec::with_capacity(batch),
            headers: nsock::MultiHeaders::preallocate(batch, Some(cmsg)),
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
        let mut rx = Rx::new(sock, group, batch, raw_port);
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

    /// Receive what is waiting (up to one batch) without blocking; rebuild each datagram's IP
    /// and UDP headers. Returns the number of packets ready in [`Rx::packet`].
    pub(crate) fn recv_batch(&mut self) -> usize {
        self.meta.clear();
        // A raw socket delivers the IP header too: receive from the start of the slot.
        let at = self.payload_offset();
        // The slots' views live (and die) inside this block: the packets are rebuilt in the
        // slots after it.
        let raw = {
            // An array, not a vector, so that a look for packets allocates nothing.
            let mut slots = self.slots.chunks_mut(SLOT);
            let mut iovs: [[IoSliceMut<'_>; 1]; MAX_RX_BATCH] = core::array::from_fn(|_| {
                [IoSliceMut::new(
                    slots.next().map_or(&mut [][..], |c| &mut c[at..]),
                )]
            });
            let res = nsock::recvmmsg(
                self.sock.as_raw_fd(),
                &mut self.headers,
                iovs[..self.batch].iter_mut(),
                MsgFlags::MSG_DONTWAIT,
                None,
            );
            let results = match res {
                Ok(r) => r,
                Err(nix::errno::Errno::EAGAIN) => return 0,
                Err(e) => {
                    tracing::debug!(error = %e, "recvmmsg failed");
                    return 0;
                }
            };
            let mut raw = SmallVec::<[_; MAX_RX_BATCH]>::new();
            for m in results {
                let truncated = m.flags.contains(MsgFlags::MSG_TRUNC);
                let src = m.address.and_then(|a| storage_to_socket_addr(&a));
                let dst = m.cmsgs().ok().and_then(pktinfo_dst);
                raw.push((m.bytes, truncated, src, dst));
            }
            raw
        };
        for (i, (len, truncated, src, dst)) in raw.into_iter().enumerate() {
            self.accept(i, len, truncated, src, dst);
        }
        self.counters.rx_datagrams += self.meta.len() as u64;
        self.meta.len()
    }

    /// Receive one datagram if one is waiting, without blocking (one `recvmsg`: a thread
    /// that polls for the next packet of a ping-pong pays for no second look, as a batch
    /// would). Returns the number of packets ready in [`Rx::packet`] (0 or 1).
    pub(crate) fn recv_one(&mut self) -> usize {
        self.meta.clear();
        let at = self.payload_offset();
        let mut cmsg = [0u8; 64];
        let (len, truncated, src, dst) = {
            let mut iov = [IoSliceMut::new(&mut self.slots[at..SLOT])];
            // Packet info comes only on a socket bound to the unspecified address.
            let wants_dst = self.local.is_unspecified();
            let m = match nsock::recvmsg::<SockaddrStorage>(
                self.sock.as_raw_fd(),
                &mut iov,
                wants_dst.then_some(&mut cmsg),
                MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(m) => m,
                Err(nix::errno::Errno::EAGAIN) => return 0,
                Err(e) => {
                    tracing::debug!(error = %e, "recvmsg failed");
                    return 0;
                }
            };
            let truncated = m.flags.contains(MsgFlags::MSG_TRUNC);
            let src = m.address.and_then(|a| storage_to_socket_addr(&a));
            let dst = if wants_dst {
                m.cmsgs().ok().and_then(pktinfo_dst)
            } else {
                None
            };
            (m.bytes, truncated, src, dst)
        };
        self.accept(0, len, truncated, src, dst);
        self.counters.rx_datagrams += self.meta.len() as u64;
        self.meta.len()
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

    /// Check the datagram of `len` bytes received into slot `i` and, if it is usable,
    /// rebuild its headers and list it in `meta`.
    fn accept(
        &mut self,
        i: usize,
        len: usize,
        truncated: bool,
        src: Option<SocketAddr>,
        dst: Option<IpAddr>,
    ) {
        let counters = &mut self.counters;
        if let Some(port) = self.raw_port {
            let slot = &mut self.slots[i * SLOT..(i + 1) * SLOT];
            match raw_packet(&mut slot[..len.min(SLOT)], port, truncated) {
                RawVerdict::Ours { src, .. }
                    if self.own_sources.as_ref().is_some_and(|o| o.contains(&src)) =>
                {
                    counters.rx_mcast_own += 1;
                }
                RawVerdict::Ours { end, .. } => self.meta.push(Meta {
                    slot: i,
                    start: 0,
                    end,
                }),
                RawVerdict::NotOurs => {}
                RawVerdict::Bad => counters.rx_dropped += 1,
            }
            return;
        }
        let Some(src) = src else {
            counters.rx_dropped += 1;
            return;
        };
        if truncated || len == 0 || src.is_ipv4() != self.local.is_ipv4() {
            counters.rx_dropped += 1;
            return;
        }
        if self
            .own_sources
            .as_ref()
            .is_some_and(|o| o.contains(&src.ip()))
        {
            counters.rx_mcast_own += 1;
            return;
        }
        let dst = dst.unwrap_or(self.local);
        let slot = &mut self.slots[i * SLOT..(i + 1) * SLOT];
        let Some(start) = rebuild_headers(slot, len, src, dst) else {
            counters.rx_dropped += 1;
            return;
        };
        self.meta.push(Meta {
            slot: i,
            start,
            end: HEADROOM + len,
        });
    }

    /// The `i`-th rebuilt packet of the last batch (a whole IP packet).
    pub(crate) fn packet(&self, i: usize) -> &[u8] {
        let m = self.meta[i];
        let base = SLOT * m.slot;
        &self.slots[base + m.start..base + m.end]
    }
}

/// What the raw receive path makes of one IPv4 packet.
#[derive(Debug, PartialEq, Eq)]
enum RawVerdict {
    /// A UDP packet to our port, ending at offset `end`, from `src`; its destination port
    /// now reads 4791.
    Ours {
        /// Where it ends.
        end: usize,
        /// Its source address.
        src: IpAddr,
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
    if truncated {
        return RawVerdict::Bad;
    }
    d.set_dst_port(p, ROCEV2_UDP_PORT);
    RawVerdict::Ours {
        end: d.len(),
        src: d.src.ip(),
    }
}

/// The local address a datagram was sent to, from its `IP_PKTINFO` / `IPV6_PKTINFO`.
fn pktinfo_dst(cmsgs: impl Iterator<Item = ControlMessageOwned>) -> Option<IpAddr> {
    let mut dst = None;
    for c in cmsgs {
        match c {
            ControlMessageOwned::Ipv4PacketInfo(i) => {
                dst = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(i.ipi_addr.s_addr))));
            }
            ControlMessageOwned::Ipv6PacketInfo(i) => {
                dst = Some(IpAddr::V6(Ipv6Addr::from(i.ipi6_addr.s6_addr)));
            }
            _ => {}
        }
    }
    dst
}

fn storage_to_socket_addr(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        Some(SocketAddr::from((v4.ip(), v4.port())))
    } else {
        a.as_sockaddr_in6()
            .map(|v6| SocketAddr::from((v6.ip(), v6.port())))
    }
}

/// Write the IP and UDP headers of a datagram of `len` bytes (at `slot[HEADROOM..]`) into
/// the headroom, as the sender's engine built them: IPv4 with ID 0 and DF, UDP destination
/// port 4791 (the port the ICRC was computed with, whatever port carried it), checksum 0.
/// Returns where the packet starts.
pub(crate) fn rebuild_headers(
    slot: &mut [u8],
    len: usize,
    src: SocketAddr,
    dst: IpAddr,
) -> Option<usize> {
    let udp_len = len + wire::UDP_HEADER_LEN;
    let ip = match (src.ip(), dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IpRepr::V4(Ipv4Repr {
            src: s,
            dst: d,
            tos: 0,
            ident: 0,
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
    let start = HEADROOM - wire::UDP_HEADER_LEN - hl;
    let udp = UdpRepr {
        src_port: src.port(),
        dst_port: ROCEV2_UDP_PORT,
        length: u16::try_from(udp_len).ok()?,
        checksum: 0,
    };
    udp.emit(&mut Udp::new_unchecked(
        &mut slot[HEADROOM - wire::UDP_HEADER_LEN..HEADROOM],
    ));
    match ip {
        IpRepr::V4(r) => {
            let mut v = Ipv4::new_unchecked(&mut slot[start..start + hl]);
            r.emit(&mut v);
        }
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
