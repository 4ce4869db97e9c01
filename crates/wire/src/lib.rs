//! # softrdma `wire`: RoCEv2 on the wire, exactly
//!
//! The bottom layer of softrdma. It turns bytes into RoCEv2 / InfiniBand transport headers
//! and back, and nothing else: no I/O, no allocation, no `unsafe`, and no panic on any input.
//! Everything above it (the engine's `recv`/`req`/`comp`/`resp`, the CLI's `decode`) sees
//! packets only through this crate.
//!
//! A RoCEv2 packet is `IP / UDP (dst 4791) / BTH / extension headers / payload / pad / ICRC`.
//! Each header has (smoltcp style) a zero-copy view `Foo<T: AsRef<[u8]>>` with a checked
//! constructor and field accessors, and a plain `FooRepr` struct that parses from and emits
//! into the view: [`Ipv4`], [`Ipv6`], [`Udp`], [`Bth`], [`Reth`], [`Aeth`], [`Deth`],
//! [`ImmDt`], [`Ieth`], [`AtomicEth`], [`AtomicAckEth`].
//!
//! - [`Opcode`] is the IBA opcode table for RC, UC, UD and CNP: which operation, which packet
//!   of a message, which extension headers follow ([`Opcode::ext`]).
//! - [`Syndrome`] decodes the AETH: ACK with credits, RNR NAK with its timer, NAK codes.
//! - [`Psn`] does 24-bit sequence arithmetic that stays right across wrap-around.
//! - [`icrc`] computes and checks the invariant CRC of IBTA Annex A17, and finds the IPv4
//!   identification a packet's ICRC holds for when a UDP socket hid it.
//! - [`train`] says which packets ride one GSO train (`UDP_SEGMENT` / `UDP_GRO`) and where
//!   the packets of a train handed over whole lie.
//! - [`mad`] is the common header of the management datagrams QP1 exchanges; [`cm`] the
//!   connection manager's messages in them ([`CmMadRepr`]: REQ, REP, RTU, REJ, MRA, DREQ,
//!   DREP, SIDR_REQ, SIDR_REP), and [`cma`] the rdma_cm layer on top (service IDs from port
//!   spaces, the IP addresses at the head of a REQ's private data).
//! - [`RoceV2Packet::parse`] validates a whole packet from untrusted bytes and returns a
//!   precise [`WireError`] for every malformed case; [`emit_packet`] and [`PacketLayout`]
//!   build packets with every length, the pad, the checksums and the ICRC filled in.
//!
//! ```
//! use wire::*;
//! let ip = IpRepr::V4(Ipv4Repr {
//!     src: "10.0.0.1".parse().unwrap(),
//!     dst: "10.0.0.2".parse().unwrap(),
//!     tos: 0, ident: 0, dont_frag: true, ttl: 64, payload_len: 0,
//! });
//! let mut bth = BthRepr::new(Opcode::RcSendOnly, Qpn::new(0x11), Psn::new(7));
//! bth.ack_req = true;
//! let t = TransportRepr::new(bth);
//! let mut buf = [0u8; 128];
//! let n = emit_packet(&ip, 0xc000, ROCEV2_UDP_PORT, &t, b"hello", &mut buf).unwrap();
//! let p = RoceV2Packet::parse_checked(&buf[..n]).unwrap();
//! assert_eq!(p.payload, b"hello");
//! assert_eq!(p.transport.bth.pad_count, 3);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bytes;

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cm;
pub mod cma;
pub mod datagram;
pub mod deth;
pub mod error;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod mad;
pub mod opcode;
pub mod packet;
pub mod reth;
pub mod train;
pub mod types;
pub mod udp;

pub use aeth::{Aeth, AethRepr, NakCode, Syndrome, AETH_LEN};
pub use atomic::{
    AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr, ATOMIC_ACK_ETH_LEN, ATOMIC_ETH_LEN,
};
pub use bth::{Bth, BthRepr, BTH_LEN, DEFAULT_PKEY};
pub use cm::{
    CmAttrId, CmMadRepr, CmMessage, CmMsgRef, CmPathRepr, DreqRepr, Ece, IdsRepr, MraRepr,
    PrivateData, RejRepr, RejectReason, RepRepr, ReqRepr, ServiceType, SidrRepRepr, SidrReqRepr,
    SidrStatus, CM_ARI_LEN, CM_CLASS_VERSION, CM_MGMT_CLASS, CM_MSG_LEN, CM_PATH_LEN,
    DREP_PRIVATE_DATA_LEN, DREQ_PRIVATE_DATA_LEN, MRA_PRIVATE_DATA_LEN, REJ_PRIVATE_DATA_LEN,
    REP_PRIVATE_DATA_LEN, REQ_PRIVATE_DATA_LEN, RTU_PRIVATE_DATA_LEN, SIDR_REP_PRIVATE_DATA_LEN,
    SIDR_REQ_PRIVATE_DATA_LEN,
};
pub use cma::{CmaAddrs, CmaHeader, CmaHeaderRepr, PortSpace, ServiceId, CMA_HEADER_LEN};
pub use datagram::{Datagram, DatagramCache};
pub use deth::{Deth, DethRepr, DETH_LEN};
pub use error::{HeaderKind, WireError};
pub use icrc::ICRC_LEN;
pub use ieth::{Ieth, IethRepr, IETH_LEN};
pub use immdt::{ImmDt, ImmDtRepr, IMMDT_LEN};
pub use ipv4::{Ipv4, Ipv4Repr, IPV4_HEADER_LEN};
pub use ipv6::{Ipv6, Ipv6Repr, IPV6_HEADER_LEN};
pub use mad::{
    gsi_transport, MadHeader, MadHeaderRepr, MadMethod, GSI_QKEY, MAD_HEADER_LEN, MAD_LEN,
};
pub use opcode::{ExtHeaders, OpKind, Opcode, CNP_RESERVED_LEN};
pub use packet::{
    emit_packet, pad_for, IpRepr, PacketLayout, RoceV2Packet, TransportPacket, TransportRepr,
};
pub use reth::{Reth, RethRepr, RETH_LEN};
pub use types::{Msn, Mtu, Psn, Qkey, Qpn, Rkey, Transport};
pub use udp::{
    flow_label_for_qpns, src_port_for_connection, src_port_for_flow_label, src_port_for_qpn, Udp,
    UdpRepr, ROCEV2_UDP_PORT, UDP_HEADER_LEN,
};
