//! QP1, the General Services Interface (IBA 13.5): the port's management datagrams (MADs),
//! which the connection manager sends and receives (IBA 12). QP1 is the device's, not an
//! application's: it is a UD endpoint that takes only 256-byte MADs with the well-known
//! Q_Key and hands them to the device's host ([`crate::Engine::poll_mad`]), which sends its
//! own with [`crate::Engine::send_mad`]. The packets are what Linux rxe sends for its GSI
//! (captured in `shared/testdata/rxe-cm-*.pcap`): UD SEND ONLY with AckReq set, P_Key 0xffff,
//! a DETH with Q_Key 0x8001_0000 and source QP 1, PSNs counting from 0, and the UDP source
//! port rxe gives QP 1.

use std::collections::VecDeque;
use std::net::IpAddr;

use wire::{Opcode, PacketLayout, Psn, Qpn};

use crate::counters::{Counter, Counters};
use crate::device::Gid;
use crate::error::VerbsError;
use crate::Transmit;

pub use wire::MAD_LEN;

/// MADs kept for the host until it polls them; more are dropped and counted, as a GSI with
/// no receive posted drops them.
const RX_DEPTH: usize = 128;

/// MADs queued to send; a host that queues more is told the queue is full.
const TX_DEPTH: usize = 128;

/// A MAD received on QP1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mad {
    /// The sender's address (its GID).
    pub src: IpAddr,
    /// The local address it was sent to.
    pub dst: IpAddr,
    /// The sender's QP (from the DETH; 1 for the CM).
    pub src_qp: u32,
    /// The MAD itself.
    pub data: [u8; MAD_LEN],
}

/// A MAD waiting to leave.
#[derive(Debug, Clone)]
struct Outgoing {
    src: IpAddr,
    dst: IpAddr,
    dest_qp: u32,
    data: [u8; MAD_LEN],
}

/// The state of QP1.
#[derive(Debug, Default)]
pub(crate) struct Gsi {
    rx: VecDeque<Mad>,
    tx: VecDeque<Outgoing>,
    /// PSN of the next MAD sent.
    psn: u32,
}

/// The UDP source port Linux rxe gives a QP it creates (`rxe_qp.c`: 0xc000 plus the top 14
/// bits of the 32-bit golden-ratio hash of the QPN); for QP1 it is 55410, as captured.
fn rxe_qp_src_port(qpn: u32) -> u16 {
    let h = qpn.wrapping_mul(0x61c8_8647) >> (32 - 14);
    0xc000 | h as u16
}

impl Gsi {
    /// A datagram for QP1 that passed the device's ingress checks (ICRC, address, CNP).
    pub(crate) fn receive(
        &mut self,
        counters: &mut Counters,
        src: IpAddr,
        dst: IpAddr,
        transport: &wire::TransportRepr,
        payload: &[u8],
    ) {
        if transport.bth.opcode != Opcode::UdSendOnly {
            counters.inc(Counter::RxBadOpcode);
            return;
        }
        let Some(deth) = transport.deth else {
            counters.inc(Counter::RxMalformed);
            return;
        };
        if deth.qkey != wire::GSI_QKEY {
            counters.inc(Counter::RxQkeyMismatch);
            return;
        }
        let Ok(data) = <[u8; MAD_LEN]>::try_from(payload) else {
            counters.inc(Counter::RxMalformed);
            return;
        };
        if self.rx.len() >= RX_DEPTH {
            counters.inc(Counter::RxGsiOverflow);
            return;
        }
        counters.inc(Counter::RxMads);
        self.rx.push_back(Mad {
            src,
            dst,
            src_qp: deth.src_qp.value(),
            data,
        });
    }

    /// The oldest MAD received.
    pub(crate) fn poll(&mut self) -> Option<Mad> {
        self.rx.pop_front()
    }

    /// Queue `data` from local address `src` to QP `dest_qp` at `dst`.
    pub(crate) fn send(
        &mut self,
        gids: &[Gid],
        src: IpAddr,
        dst: IpAddr,
        dest_qp: u32,
        data: &[u8; MAD_LEN],
    ) -> Result<(), VerbsError> {
        if !gids.contains(&Gid::from_ip(src)) || src.is_ipv4() != dst.is_ipv4() {
            return Err(VerbsError::InvalidAh);
        }
        if dest_qp > 0xff_ffff {
            return Err(VerbsError::InvalidQp);
        }
        if self.tx.len() >= TX_DEPTH {
            return Err(VerbsError::QueueFull);
        }
        self.tx.push_back(Outgoing {
            src,
            dst,
            dest_qp,
            data: *data,
        });
        Ok(())
    }

    /// Build the next queued MAD's packet into `buf`; `None` if none waits or `buf` is too
    /// small (the MAD then stays queued).
    pub(crate) fn transmit(&mut self, counters: &mut Counters, buf: &mut [u8]) -> Option<Transmit> {
        let m = self.tx.front()?;
        let t = wire::gsi_transport(wire::DEFAULT_PKEY, Qpn::new(m.dest_qp), Psn::new(self.psn));
        let ip = crate::req::gsi_ip_repr(m.src, m.dst);
        let layout = PacketLayout::new(
            &ip,
            rxe_qp_src_port(Qpn::GSI.value()),
            wire::ROCEV2_UDP_PORT,
            &t,
            MAD_LEN,
        )
        .ok()?;
        if buf.len() < layout.len() {
            return None;
        }
        layout.emit_headers(buf).ok()?;
        layout.payload_mut(buf).ok()?.copy_from_slice(&m.data);
        let len = layout.finish(buf).ok()?;
        let dst = m.dst;
        self.tx.pop_front();
        self.psn = (self.psn + 1) & 0xff_ffff;
        counters.inc(Counter::TxMads);
        Some(Transmit {
            len,
            dst,
            internal: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp1_leaves_from_the_udp_port_rxe_uses_for_it() {
        assert_eq!(rxe_qp_src_port(Qpn::GSI.value()), 55410);
    }
}
