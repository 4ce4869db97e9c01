//! How to start a [`crate::Runtime`].

use std::net::IpAddr;
use std::time::Duration;

use cm::CmConfig;
use engine::DeviceAttr;
use wire::Mtu;

/// How the UDP source port of outgoing packets is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum SrcPortPolicy {
    /// The port the engine derived from the QPN (ECMP entropy, as Linux rxe does), sent from a
    /// socket bound to that port, opened on first use. Where a port cannot be bound, that
    /// QP's packets fall back to the fixed port (with the ICRC recomputed).
    #[default]
    PerQp,
    /// Every packet leaves from the receiving socket's port (the ICRC is recomputed when the
    /// engine emitted another port). One socket, no ECMP entropy.
    Fixed,
}

/// Where received packets come from, and so which IP header the engine checks the ICRC of
/// (see the crate docs, "Receive policy").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum RxPath {
    /// A UDP socket: the IP header is not visible, so it is rebuilt as softrdma senders emit
    /// it (IPv4 ID 0 and DF), and for an IPv4 packet whose ICRC does not hold with ID 0 the
    /// engine finds the one ID for which it does, if any (`engine::Ipv4IdentPolicy::Recover`:
    /// Linux rxe numbers its packets). No privilege needed; the check keeps 16 of its 32
    /// bits for such packets.
    #[default]
    Udp,
    /// A raw socket (`SOCK_RAW`, `IPPROTO_UDP`; needs root or `CAP_NET_RAW`) that sees each
    /// packet with the header its sender built, so the ICRC is checked exactly, all 32 bits,
    /// for every sender, Linux rxe included. IPv4 only: an IPv6 address uses [`RxPath::Udp`],
    /// which is exact for IPv6 already. The UDP socket stays bound (it owns the port) but is
    /// not read. Fails to start without the privilege.
    Raw,
    /// [`RxPath::Raw`] where the process may open a raw socket, else [`RxPath::Udp`]: the
    /// exact check whenever it can be had. softrdmad's default (it normally runs as root).
    Auto,
}

/// Everything a [`crate::Runtime`] needs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RuntimeConfig {
    /// The local address: the socket binds to it and it is the port's GID 0.
    pub addr: IpAddr,
    /// Further addresses of the same port (GIDs 1, 2...), one socket each: a device per
    /// interface serves every address of its interface, as a kernel RDMA device does.
    pub extra_addrs: Vec<IpAddr>,
    /// Name of the progress thread (default: `softrdma <address>`).
    pub name: Option<String>,
    /// Connected QPs between two of this device's own addresses use the engine's internal
    /// paths (32 KiB segments, no ICRC: `engine::EngineConfig::internal_addresses`). Their
    /// packets never leave the process, so nothing on a wire could check them; a capture
    /// does not show them.
    pub internal_paths: bool,
    /// UDP port this device receives on (RoCEv2: 4791).
    pub port: u16,
    /// UDP port packets are sent to (RoCEv2: 4791). Differs from `port` only when several
    /// devices share one address (e.g. `::1` in tests); see the crate docs on ports. 0: the
    /// port this device receives on (useful with `port` 0).
    pub remote_port: u16,
    /// UDP source port choice.
    pub src_port_policy: SrcPortPolicy,
    /// Receive path.
    pub rx_path: RxPath,
    /// How long the progress thread keeps polling (for packets, and for the work a host
    /// attached) after the last activity before it sleeps: the one spin knob of a device.
    /// While it polls, packets and posts reach the engine without a wakeup; on a machine
    /// with few cores it takes a core from the applications.
    pub busy_poll: Duration,
    /// The longest polling the progress thread learns on its own (0: none, only
    /// `busy_poll`). When work keeps arriving soon after it goes to sleep (a peer reading or
    /// doing atomics on this device's memory while the application here does nothing, a
    /// request stream), every sleep costs a wakeup, several microseconds on a virtual
    /// machine; the thread then polls that long after activity (doubling from 8 us while
    /// sleeps stay short, halving when polling finds nothing), and an idle or sparsely used
    /// device learns nothing and sleeps at once, as with a CPU's halt-polling governor.
    pub adaptive_poll: Duration,
    /// How long a plain ACK may wait to be coalesced with newer ones
    /// (`engine::EngineConfig::ack_coalesce`). Default zero: an ACK leaves at the pass after
    /// the one that handled its request (after the reply the application posts meanwhile),
    /// and ACKs made in one pass are one. Measured on 2 CPUs, the engine's 50 us made
    /// waiting peers pay the delay whenever they were not recognized as waiting (send_lat
    /// through softrdmad: ~100 us a message).
    pub ack_coalesce: Duration,
    /// Datagrams received per `recvmmsg` call (1 to 64).
    pub rx_batch: usize,
    /// UDP segmentation offload: consecutive full-size packets of a QP leave as one GSO
    /// train (`UDP_SEGMENT`, one `sendmsg` the kernel cuts into the datagrams; see
    /// `wire::train`), and the UDP socket takes trains whole (`UDP_GRO`). Each packet keeps
    /// its own ICRC, sealed for the IPv4 ID the kernel gives its segment. Default on;
    /// where the kernel refuses a train the device sends packet by packet from then on.
    pub gso: bool,
    /// Port MTU (the largest path MTU a QP may use). The port offers less when the link
    /// under `addr` cannot carry it (see [`crate::link()`]).
    pub mtu: Mtu,
    /// Device attributes to report and enforce.
    pub device: DeviceAttr,
    /// Seed of the key generator; `None` draws one from the OS (keys must be unpredictable).
    pub rng_seed: Option<u64>,
    /// The connection manager's timeouts and retries. A `local_ca_guid` of 0 takes the
    /// device's node GUID (or one made from its address); the first communication ID and
    /// the transaction ID prefix are always drawn at random.
    pub cm: CmConfig,
}

/// The longest polling a progress thread learns by default ([`RuntimeConfig::adaptive_poll`]).
pub const DEFAULT_ADAPTIVE_POLL: Duration = Duration::from_micros(64);

impl RuntimeConfig {
    /// Every address of the device, GID order.
    pub fn addrs(&self) -> Vec<IpAddr> {
        let mut v = vec![self.addr];
        for a in &self.extra_addrs {
            if !v.contains(a) {
                v.push(*a);
            }
        }
        v
    }

    /// Defaults for a device on `addr`: port 4791 both ways, per-QP source ports, UDP receive
    /// path, no fixed busy polling (spinning threads starve each other on small machines; raise
    /// it where cores are spare) but polling learned up to 64 us, MTU 4096.
    pub fn new(addr: IpAddr) -> RuntimeConfig {
        RuntimeConfig {
            addr,
            extra_addrs: Vec::new(),
            name: None,
            internal_paths: false,
            port: wire::ROCEV2_UDP_PORT,
            remote_port: wire::ROCEV2_UDP_PORT,
            src_port_policy: SrcPortPolicy::PerQp,
            rx_path: RxPath::Udp,
            busy_poll: Duration::ZERO,
            adaptive_poll: DEFAULT_ADAPTIVE_POLL,
            ack_coalesce: Duration::ZERO,
            rx_batch: 32,
            gso: true,
            mtu: Mtu::Mtu4096,
            device: DeviceAttr::default(),
            rng_seed: None,
            cm: CmConfig::default(),
        }
    }
}
