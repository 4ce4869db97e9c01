//! Field codecs of the control protocol: the [`Wire`] trait, a bounds-checked [`Reader`] and
//! a [`Writer`], and `Wire` for every type a message carries — integers, `bool`, arrays,
//! strings, `Vec`, `Option`, pairs, IP addresses, QP numbers and keys, and the engine's own types (`QpAttr`,
//! `QpInitAttr`, `AhAttr`, `DeviceAttr`, `PortAttr`, `SrqAttr`, `MwBind`, `AsyncEvent`, their
//! enums, flags and handles), so that a message names the engine's types and no mirror of
//! them exists.
//!
//! Everything is little-endian. A `Vec` is a u32 count then its items, a string a u16 length
//! then UTF-8, an `Option` a byte 0 or 1 then the value, an enum its `ibv_*` number, a set of
//! flags its `u32` bits; a struct is its fields in the order its `wire_struct!` row lists
//! them. Decoding is strict so that every value has exactly one encoding: a number that
//! names no enum value, a flag bit the engine does not know, a boolean other than 0 or 1,
//! bad UTF-8 or a count the remaining bytes cannot hold is a [`ProtoError`], never a panic,
//! and no length field makes the decoder allocate more than the bytes that arrived justify.

use std::net::IpAddr;

use cm::{CmEvent, CommId, ConnParam, ConnectRequest};
use engine::{
    AccessFlags, AhAttr, AsyncEvent, AtomicCap, CqHandle, DeviceAttr, Gid, MrHandle, MwBind,
    MwType, PdHandle, PortAttr, PortState, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType,
    ReregFlags, SrqAttr, SrqAttrMask, SrqHandle,
};
use wire::types::{Lkey, Rkey};
use wire::{Ece, Mtu, Qpn, RejectReason, ServiceId};

use crate::proto::{DeviceInfo, ProtoError};
use crate::wqe::Cqe;

/// A value with one encoding in the control protocol.
pub trait Wire: Sized {
    /// The fewest bytes any value of the type takes: a count of items is checked against
    /// the bytes left with it before anything is allocated.
    const MIN_LEN: usize;
    /// Append the value's bytes.
    fn put(&self, w: &mut Writer);
    /// Read a value; anything that is not the encoding of a value is an error.
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError>;
}

/// A bounds-checked cursor over an untrusted body.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Read from `buf`.
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf }
    }

    /// Take the next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if n > self.buf.len() {
            return Err(ProtoError::Truncated);
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    /// Take the next `N` bytes as an array.
    pub fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let (head, rest) = self
            .buf
            .split_first_chunk::<N>()
            .ok_or(ProtoError::Truncated)?;
        self.buf = rest;
        Ok(*head)
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Take a value.
    pub fn take<T: Wire>(&mut self) -> Result<T, ProtoError> {
        T::take(self)
    }

    /// Succeeds only if every byte was consumed.
    pub fn finish(self) -> Result<(), ProtoError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(n)),
        }
    }
}

/// Appends values to a body.
#[derive(Debug, Default)]
pub struct Writer {
    /// The bytes so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// Append a value.
    pub fn put<T: Wire>(&mut self, v: &T) -> &mut Self {
        v.put(self);
        self
    }

    /// Append raw bytes.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
}

macro_rules! wire_int {
    ($($t:ty),*) => {$(
        impl Wire for $t {
            const MIN_LEN: usize = size_of::<$t>();
            fn put(&self, w: &mut Writer) {
                w.bytes(&self.to_le_bytes());
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
                Ok(<$t>::from_le_bytes(r.array()?))
            }
        }
    )*};
}

wire_int!(u8, u16, u32, u64, i32);

impl Wire for bool {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Writer) {
        u8::from(*self).put(w);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        match u8::take(r)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::Invalid("boolean")),
        }
    }
}

impl<T: Wire + Copy + Default, const N: usize> Wire for [T; N] {
    const MIN_LEN: usize = N * T::MIN_LEN;
    fn put(&self, w: &mut Writer) {
        for v in self {
            v.put(w);
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let mut a = [T::default(); N];
        for v in &mut a {
            *v = T::take(r)?;
        }
        Ok(a)
    }
}

/// A string: u16 length (cut at 65535 bytes, on a character boundary), then UTF-8.
impl Wire for String {
    const MIN_LEN: usize = 2;
    fn put(&self, w: &mut Writer) {
        let mut n = self.len().min(usize::from(u16::MAX));
        while !self.is_char_boundary(n) {
            n -= 1;
        }
        // n ≤ u16::MAX by the line above.
        (n as u16).put(w);
        w.bytes(&self.as_bytes()[..n]);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let n = usize::from(u16::take(r)?);
        let b = r.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Invalid("utf-8"))
    }
}

/// A sequence: u32 count, then the items (a `Vec<u8>` is a length and the bytes). A count
/// the remaining bytes cannot hold is refused before anything is allocated for it.
impl<T: Wire> Wire for Vec<T> {
    const MIN_LEN: usize = 4;
    fn put(&self, w: &mut Writer) {
        // Bodies are at most MAX_BODY bytes, far below u32::MAX items; the count written
        // is the count of items written in any case.
        let n = u32::try_from(self.len()).unwrap_or(u32::MAX);
        n.put(w);
        for v in &self[..n as usize] {
            v.put(w);
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let n = u32::take(r)? as usize;
        if n.saturating_mul(T::MIN_LEN.max(1)) > r.remaining() {
            return Err(ProtoError::Truncated);
        }
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(T::take(r)?);
        }
        Ok(v)
    }
}

/// An optional value: a byte 0 (none) or 1, then the value.
impl<T: Wire> Wire for Option<T> {
    const MIN_LEN: usize = 1;
    fn put(&self, w: &mut Writer) {
        self.is_some().put(w);
        if let Some(v) = self {
            v.put(w);
        }
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok(if bool::take(r)? {
            Some(T::take(r)?)
        } else {
            None
        })
    }
}

impl<A: Wire, B: Wire> Wire for (A, B) {
    const MIN_LEN: usize = A::MIN_LEN + B::MIN_LEN;
    fn put(&self, w: &mut Writer) {
        self.0.put(w);
        self.1.put(w);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok((A::take(r)?, B::take(r)?))
    }
}

/// An IP address: family byte (4 or 6), then 4 or 16 bytes.
impl Wire for IpAddr {
    const MIN_LEN: usize = 5;
    fn put(&self, w: &mut Writer) {
        match self {
            IpAddr::V4(a) => w.put(&4u8).bytes(&a.octets()),
            IpAddr::V6(a) => w.put(&6u8).bytes(&a.octets()),
        };
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        match u8::take(r)? {
            4 => Ok(IpAddr::from(r.array::<4>()?)),
            6 => Ok(IpAddr::from(r.array::<16>()?)),
            _ => Err(ProtoError::Invalid("address family")),
        }
    }
}

/// `Wire` for a type that travels as another: `wire_as!(T as Repr, "what", to, from)`
/// encodes `to(&T)` and decodes with `from(Repr) -> Option<T>`, `None` being refused as an
/// invalid `what`.
macro_rules! wire_as {
    ($($t:ty as $repr:ty, $what:literal, $to:expr, $from:expr;)*) => {$(
        impl Wire for $t {
            const MIN_LEN: usize = <$repr as Wire>::MIN_LEN;
            fn put(&self, w: &mut Writer) {
                let to: fn(&$t) -> $repr = $to;
                to(self).put(w);
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
                let from: fn($repr) -> Option<$t> = $from;
                from(<$repr>::take(r)?).ok_or(ProtoError::Invalid($what))
            }
        }
    )*};
}

wire_as! {
    QpState as u32, "QP state", |v| v.to_ibv(), |n| QpState::try_from(n).ok();
    engine::qp_attr::MigState as u32, "path migration state", |v| v.to_ibv(),
        |n| engine::qp_attr::MigState::try_from(n).ok();
    QpType as u32, "QP type", |v| v.to_ibv(), |n| QpType::try_from(n).ok();
    Mtu as u8, "MTU", |v| v.to_ibv(), Mtu::from_ibv;
    MwType as u8, "memory window type", |v| *v as u8, |n| match n {
        1 => Some(MwType::Type1),
        2 => Some(MwType::Type2),
        _ => None,
    };
    AtomicCap as u8, "atomic capability", |v| match v {
        AtomicCap::None => 0,
        AtomicCap::Hca => 1,
        AtomicCap::Glob => 2,
    }, |n| [AtomicCap::None, AtomicCap::Hca, AtomicCap::Glob].get(usize::from(n)).copied();
    // `ibv_port_state` numbers: IBV_PORT_DOWN 1, IBV_PORT_ACTIVE 4.
    PortState as u8, "port state", |v| match v {
        PortState::Down => 1,
        PortState::Active => 4,
    }, |n| match n {
        1 => Some(PortState::Down),
        4 => Some(PortState::Active),
        _ => None,
    };
    // Flags: bits the engine does not know are refused, as the verbs refuse them.
    AccessFlags as u32, "access flags", |v| v.bits(), AccessFlags::from_bits;
    QpAttrMask as u32, "QP attribute mask", |v| v.bits(), QpAttrMask::from_bits;
    SrqAttrMask as u32, "SRQ attribute mask", |v| v.bits(), SrqAttrMask::from_bits;
    ReregFlags as u32, "rereg flags", |v| v.bits(), ReregFlags::from_bits;
    // Handles carry numbers as they are: in a message, the connection's handles.
    PdHandle as u32, "PD handle", |v| v.0, |n| Some(PdHandle(n));
    CqHandle as u32, "CQ handle", |v| v.0, |n| Some(CqHandle(n));
    MrHandle as u32, "MR handle", |v| v.0, |n| Some(MrHandle(n));
    SrqHandle as u32, "SRQ handle", |v| v.0, |n| Some(SrqHandle(n));
    Gid as [u8; 16], "GID", |v| v.0, |b| Some(Gid(b));
    CommId as u32, "communication ID", |v| v.0, |n| Some(CommId(n));
    ServiceId as u64, "service ID", |v| v.0, |n| Some(ServiceId(n));
    RejectReason as u16, "reject reason", |v| v.0, |n| Some(RejectReason(n));
    // A QPN is 24 bits: a number over that names no QP, and is refused rather than masked.
    Qpn as u32, "QP number", |v| v.value(), Qpn::try_new;
    Rkey as u32, "R_Key", |v| v.value(), |n| Some(Rkey::new(n));
    Lkey as u32, "L_Key", |v| v.value(), |n| Some(Lkey::new(n));
}

/// `Wire` for a struct, its fields in the order listed with their types (a row per type is
/// its layout on the wire). `T { .. }` builds the value from its fields, so a field added to
/// `T` and not to the row does not compile; `T: Default { .. }` starts from `T::default()`
/// and sets the listed fields, for `#[non_exhaustive]` types of other crates.
macro_rules! wire_struct {
    ($($t:ident $(: $default:ident)? { $($f:ident: $ft:ty),* $(,)? })*) => {$(
        impl Wire for $t {
            const MIN_LEN: usize = 0 $(+ <$ft as Wire>::MIN_LEN)*;
            fn put(&self, w: &mut Writer) {
                $( <$ft as Wire>::put(&self.$f, w); )*
            }
            fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
                wire_struct!(@build $t $(: $default)? r { $($f: $ft),* })
            }
        }
    )*};
    (@build $t:ident $r:ident { $($f:ident: $ft:ty),* }) => {
        Ok($t { $($f: <$ft as Wire>::take($r)?),* })
    };
    (@build $t:ident: Default $r:ident { $($f:ident: $ft:ty),* }) => {{
        let mut v = $t::default();
        $( v.$f = <$ft as Wire>::take($r)?; )*
        Ok(v)
    }};
}

wire_struct! {
    AhAttr {
        dgid: [u8; 16],
        sgid_index: u8,
        hop_limit: u8,
        traffic_class: u8,
        flow_label: u32,
        dlid: u16,
        sl: u8,
        static_rate: u8,
        port_num: u8,
        is_global: bool,
    }
    QpCap {
        max_send_wr: u32,
        max_recv_wr: u32,
        max_send_sge: u32,
        max_recv_sge: u32,
        max_inline_data: u32,
    }
    QpAttr {
        qp_state: QpState,
        cur_qp_state: QpState,
        path_mtu: Mtu,
        path_mig_state: engine::qp_attr::MigState,
        qkey: u32,
        rq_psn: u32,
        sq_psn: u32,
        dest_qp_num: Qpn,
        qp_access_flags: AccessFlags,
        cap: QpCap,
        ah_attr: AhAttr,
        alt_ah_attr: AhAttr,
        pkey_index: u16,
        alt_pkey_index: u16,
        en_sqd_async_notify: bool,
        sq_draining: bool,
        max_rd_atomic: u8,
        max_dest_rd_atomic: u8,
        min_rnr_timer: u8,
        port_num: u8,
        timeout: u8,
        retry_cnt: u8,
        rnr_retry: u8,
        alt_port_num: u8,
        alt_timeout: u8,
        rate_limit: u32,
    }
    QpInitAttr {
        pd: PdHandle,
        send_cq: CqHandle,
        recv_cq: CqHandle,
        cap: QpCap,
        qp_type: QpType,
        sq_sig_all: bool,
    }
    SrqAttr {
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
    }
    MwBind {
        mr: MrHandle,
        addr: u64,
        length: u64,
        access: AccessFlags,
    }
    DeviceAttr: Default {
        fw_ver: String,
        node_guid: u64,
        sys_image_guid: u64,
        max_mr_size: u64,
        page_size_cap: u64,
        vendor_id: u32,
        vendor_part_id: u32,
        hw_ver: u32,
        max_qp: u32,
        max_qp_wr: u32,
        max_sge: u32,
        max_sge_rd: u32,
        max_cq: u32,
        max_cqe: u32,
        max_mr: u32,
        max_pd: u32,
        max_qp_rd_atom: u32,
        max_qp_init_rd_atom: u32,
        max_res_rd_atom: u32,
        max_inline_data: u32,
        atomic_cap: AtomicCap,
        max_srq: u32,
        max_srq_wr: u32,
        max_srq_sge: u32,
        max_mw: u32,
        max_ah: u32,
        max_pkeys: u16,
        phys_port_cnt: u8,
        max_mcast_grp: u32,
        max_mcast_qp_attach: u32,
        max_total_mcast_qp_attach: u32,
    }
    // The reserved words of a ring entry are not carried (they are zero).
    Cqe: Default {
        wr_id: u64,
        status: u32,
        opcode: u32,
        vendor_err: u32,
        byte_len: u32,
        imm_data: u32,
        invalidated_rkey: u32,
        qp_num: u32,
        src_qp: u32,
        wc_flags: u32,
        pkey_index: u16,
    }
    ConnParam: Default {
        private_data: Vec<u8>,
        responder_resources: u8,
        initiator_depth: u8,
        retry_count: u8,
        rnr_retry_count: u8,
        ack_timeout: u8,
        min_rnr_timer: u8,
        src_port: u16,
        qp_num: u32,
        ece: Ece,
    }
    // Any 32 bits encode: the wire cuts a vendor ID to its 24 bits, as Linux's does.
    Ece: Default {
        vendor_id: u32,
        options: u32,
    }
    ConnectRequest {
        id: CommId,
        service_id: ServiceId,
        peer: IpAddr,
        peer_port: u16,
        local: IpAddr,
        remote_qpn: Qpn,
        responder_resources: u8,
        initiator_depth: u8,
        private_data: Vec<u8>,
        ece: Ece,
        datagram: bool,
    }
    DeviceInfo {
        index: u32,
        name: String,
        addrs: Vec<IpAddr>,
        port: u16,
    }
}

/// A RoCE port's attributes (its link layer is Ethernet, the only one there is).
impl Wire for PortAttr {
    const MIN_LEN: usize = 1 + 1 + 1 + 4 + 2 + 4;
    fn put(&self, w: &mut Writer) {
        w.put(&self.state)
            .put(&self.max_mtu)
            .put(&self.active_mtu)
            .put(&self.gid_tbl_len)
            .put(&self.pkey_tbl_len)
            .put(&self.max_msg_sz);
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        let (state, max_mtu, active_mtu, gid_tbl_len) =
            (r.take()?, r.take()?, r.take()?, r.take()?);
        let pkey_tbl_len = r.take()?;
        let mut p = PortAttr::roce(state, max_mtu, active_mtu, gid_tbl_len, r.take()?);
        p.pkey_tbl_len = pkey_tbl_len;
        Ok(p)
    }
}

/// An asynchronous event: its `IBV_EVENT_*`-like kind byte, then its object (a QPN, a
/// port, or a CQ or SRQ handle — the connection's, which the daemon puts in place of the
/// engine's). An event this protocol version does not name travels as kind 0, which no
/// decoder accepts: the daemon passes on only the kinds below.
impl Wire for AsyncEvent {
    const MIN_LEN: usize = 2;
    fn put(&self, w: &mut Writer) {
        match *self {
            AsyncEvent::CqErr { cq } => w.put(&1u8).put(&cq),
            AsyncEvent::SqDrained { qpn } => w.put(&2u8).put(&qpn),
            AsyncEvent::QpFatal { qpn } => w.put(&3u8).put(&qpn),
            AsyncEvent::SrqLimitReached { srq } => w.put(&4u8).put(&srq),
            AsyncEvent::QpLastWqeReached { qpn } => w.put(&5u8).put(&qpn),
            AsyncEvent::PortActive { port } => w.put(&6u8).put(&port),
            AsyncEvent::PortErr { port } => w.put(&7u8).put(&port),
            _ => w.put(&0u8),
        };
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok(match u8::take(r)? {
            1 => AsyncEvent::CqErr { cq: r.take()? },
            2 => AsyncEvent::SqDrained { qpn: r.take()? },
            3 => AsyncEvent::QpFatal { qpn: r.take()? },
            4 => AsyncEvent::SrqLimitReached { srq: r.take()? },
            5 => AsyncEvent::QpLastWqeReached { qpn: r.take()? },
            6 => AsyncEvent::PortActive { port: r.take()? },
            7 => AsyncEvent::PortErr { port: r.take()? },
            _ => return Err(ProtoError::Invalid("async event kind")),
        })
    }
}

/// A connection manager's event: a kind byte, then its fields. Like [`AsyncEvent`], a kind
/// this protocol version does not name travels as 0, which no decoder accepts.
impl Wire for CmEvent {
    const MIN_LEN: usize = 1 + 4;
    fn put(&self, w: &mut Writer) {
        match self {
            CmEvent::ConnectRequest(r) => w.put(&1u8).put(&**r),
            CmEvent::Established {
                id,
                private_data,
                ece,
            } => w.put(&2u8).put(id).put(private_data).put(ece),
            CmEvent::Rejected {
                id,
                reason,
                private_data,
            } => w.put(&3u8).put(id).put(reason).put(private_data),
            CmEvent::Unreachable { id } => w.put(&4u8).put(id),
            CmEvent::ConnectError { id, errno } => w.put(&5u8).put(id).put(errno),
            CmEvent::Disconnected { id } => w.put(&6u8).put(id),
            CmEvent::Resolved {
                id,
                qpn,
                qkey,
                private_data,
            } => w.put(&7u8).put(id).put(qpn).put(qkey).put(private_data),
            CmEvent::Unresolved {
                id,
                status,
                private_data,
            } => w.put(&8u8).put(id).put(status).put(private_data),
            CmEvent::ConnectResponse {
                id,
                remote_qpn,
                private_data,
                ece,
            } => w
                .put(&9u8)
                .put(id)
                .put(remote_qpn)
                .put(private_data)
                .put(ece),
            CmEvent::TimeWaitExit { id } => w.put(&10u8).put(id),
            _ => w.put(&0u8),
        };
    }
    fn take(r: &mut Reader<'_>) -> Result<Self, ProtoError> {
        Ok(match u8::take(r)? {
            1 => CmEvent::ConnectRequest(Box::new(r.take()?)),
            2 => CmEvent::Established {
                id: r.take()?,
                private_data: r.take()?,
                ece: r.take()?,
            },
            3 => CmEvent::Rejected {
                id: r.take()?,
                reason: r.take()?,
                private_data: r.take()?,
            },
            4 => CmEvent::Unreachable { id: r.take()? },
            5 => CmEvent::ConnectError {
                id: r.take()?,
                errno: r.take()?,
            },
            6 => CmEvent::Disconnected { id: r.take()? },
            7 => CmEvent::Resolved {
                id: r.take()?,
                qpn: r.take()?,
                qkey: r.take()?,
                private_data: r.take()?,
            },
            8 => CmEvent::Unresolved {
                id: r.take()?,
                status: r.take()?,
                private_data: r.take()?,
            },
            9 => CmEvent::ConnectResponse {
                id: r.take()?,
                remote_qpn: r.take()?,
                private_data: r.take()?,
                ece: r.take()?,
            },
            10 => CmEvent::TimeWaitExit { id: r.take()? },
            _ => return Err(ProtoError::Invalid("CM event kind")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qpn_over_24_bits_is_refused_and_keys_keep_their_32_bits() {
        let mut w = Writer::default();
        w.put(&Qpn::MULTICAST)
            .put(&0x0100_0000u32)
            .put(&Rkey::new(u32::MAX))
            .put(&Lkey::new(u32::MAX));
        assert_eq!(w.buf[..4], 0x00ff_ffffu32.to_le_bytes());
        let mut r = Reader::new(&w.buf);
        assert_eq!(r.take::<Qpn>(), Ok(Qpn::MULTICAST));
        assert!(matches!(r.take::<Qpn>(), Err(ProtoError::Invalid(_))));
        assert_eq!(r.take::<Rkey>(), Ok(Rkey::new(u32::MAX)));
        assert_eq!(r.take::<Lkey>(), Ok(Lkey::new(u32::MAX)));
        assert_eq!(r.finish(), Ok(()));
    }
}
