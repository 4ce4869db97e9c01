//! The control protocol between `softrdmad` and its clients, over a Unix stream socket.
//!
//! Every message is a 16-byte [`Header`] followed by `length` bytes of body, all integers
//! little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic [`MAGIC`] (`"SRDM"`) |
//! | 4..6 | protocol version [`VERSION`] |
//! | 6..8 | kind: a request number ([`kind`]), `RESPONSE_BIT | request` for its answer, [`KIND_ERROR`] for an error |
//! | 8..12 | body length, at most [`MAX_BODY`] |
//! | 12..16 | request id, echoed in the answer |
//!
//! A request's body is its fields in the order its row lists them; an answer's body is its
//! tag ([`tag`]) then its fields. Each field is encoded by its type's [`Wire`] codec
//! ([`crate::codec`]), and the fields are the engine's own types (`QpAttr`, `QpInitAttr`,
//! `AhAttr`, `DeviceAttr`, `MwBind`, `AsyncEvent`...): there is no message type mirroring an
//! engine type, and no conversion between them.
//!
//! # The table is the protocol
//!
//! [`Request`] and [`Response`] are each one table (`messages!` below): a row gives a
//! message's number, the name of its constant, the variant and its typed fields. The enum,
//! the constants, the number of a value and both codecs are generated from it. Adding a
//! request takes:
//!
//! 1. one row in the [`Request`] table, with a number no row has used (a number is never
//!    reused: an old number names what it named, or nothing), answered by an existing
//!    [`Response`] row or by a new row in that table;
//! 2. its handler in the daemon (`softrdma-daemon`'s `server.rs`, where the `match` on
//!    [`Request`] is exhaustive, so the compiler points at the place);
//! 3. its method on [`crate::client::Client`].
//!
//! A field of a type without a codec needs a `Wire` impl in [`crate::codec`] (for a struct,
//! a `wire_struct!` row there). Any change to a row's fields, or to a codec, changes the
//! bytes: bump [`VERSION`], which both ends check at connect (in every header, and in
//! [`Request::Hello`]).
//!
//! # Untrusted bytes
//!
//! Bodies are decoded with a bounds-checked [`Reader`]: a length, a count or a field that does
//! not fit the bytes that arrived is an error, never a panic; so is a number naming no enum
//! value or flag, and a body with bytes left over after its last field. Every message has
//! exactly one encoding (the fuzz target `proto_decode` checks that whatever decodes encodes
//! back to the same bytes). The daemon answers a bad body with an error message and closes
//! the connection on a bad header (after it, framing can no longer be trusted).

use engine::{
    AccessFlags, AhAttr, AsyncEvent, DeviceAttr, Gid, MwBind, MwType, PortAttr, QpAttr, QpAttrMask,
    QpInitAttr, QpState, ReregFlags, SrqAttr, SrqAttrMask,
};

use std::net::IpAddr;

use cm::{CmEvent, CommId, ConnParam};
use wire::{RejectReason, ServiceId};

pub use crate::codec::{Reader, Wire, Writer};
use crate::wqe::Cqe;

/// First four bytes of every message: `"SRDM"`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SRDM");
/// The protocol version this crate speaks (14: the doorbell page's waiting words, where a
/// client's pollers sleep until completions come — [`crate::doorbell`]; 13: CQs are armed
/// through their rings —
/// [`Request::AttachCqArm`] and the rings' arm word; 12: rings live in the connection's ring arena —
/// [`Response::WorkRingAt`] and [`Response::RingAt`] name a ring's place, the doorbell page
/// has 65 536 bits and a summary; 11: work rings ring bits of a doorbell page —
/// [`Request::DoorbellPage`], `Response::Bell`; 10: [`Request::CmReject`] carries the reason; 9:
/// ECE in `ConnParam`, `ConnectRequest` and the ESTABLISHED and CONNECT_RESPONSE events; 8: connections whose QP the client moves —
/// `ConnParam::qp_num`, [`Request::CmEstablish`], [`Request::CmInitQpAttr`]; 5: the
/// connection manager's requests and events; 4: messages are generated from their tables
/// and carry the engine's types whole).
pub const VERSION: u16 = 14;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 16;
/// Largest body accepted (inline data and completion batches fit easily).
pub const MAX_BODY: u32 = 1 << 20;
/// Set in the kind of every successful answer.
pub const RESPONSE_BIT: u16 = 0x8000;
/// Kind of an error answer ([`Response::Error`]).
pub const KIND_ERROR: u16 = 0xffff;

/// Why bytes could not be decoded as a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// The magic number is wrong: not our protocol.
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {0}")]
    BadVersion(u16),
    /// The announced body length exceeds [`MAX_BODY`].
    #[error("body length {0} exceeds the limit")]
    TooLong(u32),
    /// The kind names no message.
    #[error("unknown message kind {0:#06x}")]
    UnknownKind(u16),
    /// The body ended before a field.
    #[error("message truncated")]
    Truncated,
    /// The body has bytes after its last field.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// A field holds a value that is not allowed (a count over its limit, bad UTF-8...).
    #[error("invalid field: {0}")]
    Invalid(&'static str),
}

/// The fixed header of every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Message kind (see the module docs).
    pub kind: u16,
    /// Body length in bytes.
    pub length: u32,
    /// Request id, echoed in the answer.
    pub id: u32,
}

impl Header {
    /// Parse and validate a header: magic, version, and a length within [`MAX_BODY`].
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, ProtoError> {
        let magic = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if magic != MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(ProtoError::BadVersion(version));
        }
        let length = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if length > MAX_BODY {
            return Err(ProtoError::TooLong(length));
        }
        Ok(Header {
            kind: u16::from_le_bytes([b[6], b[7]]),
            length,
            id: u32::from_le_bytes([b[12], b[13], b[14], b[15]]),
        })
    }

    /// The header's bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.kind.to_le_bytes());
        b[8..12].copy_from_slice(&self.length.to_le_bytes());
        b[12..16].copy_from_slice(&self.id.to_le_bytes());
        b
    }
}

/// Frame a body: the header for `kind`/`id`, then the body.
pub fn frame(kind: u16, id: u32, body: &[u8]) -> Vec<u8> {
    let length = u32::try_from(body.len()).unwrap_or(u32::MAX);
    let mut out = Header { kind, length, id }.to_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// Send `bytes` on `stream` with `fd` attached to the first of them (SCM_RIGHTS): how a
/// memfd travels with the message that names it, in either direction.
pub fn send_with_fd(
    stream: &mut std::os::unix::net::UnixStream,
    bytes: &[u8],
    fd: std::os::fd::BorrowedFd<'_>,
) -> std::io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::io::Write;
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    control.push(SendAncillaryMessage::ScmRights(&fds));
    let n = rustix::net::sendmsg(
        &*stream,
        &[std::io::IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    stream.write_all(&bytes[n..])
}

/// How long each end of the control socket looks for the other's next message before it
/// blocks in `read`: a control call is a burst of requests and answers (a QP's create and
/// three modifies, a registration), and a thread woken from a blocking read on another CPU
/// waits for that CPU to wake first. Measured on a 2-vCPU KVM guest, `ibv_alloc_pd` took
/// 13 us per round trip with both ends on one CPU and 40 us on two; looking first avoids
/// the second wakeup whenever the answer or the next request comes within this time.
pub const LOOK_BEFORE_BLOCKING: std::time::Duration = std::time::Duration::from_micros(50);

/// Look at `stream` without blocking until bytes (or the end) wait in it or `spin` has
/// passed, giving the CPU away between looks (another thread of this host may be the one
/// to answer); returns whether something waits. Either way the caller then reads as usual,
/// blocking if nothing came: this only saves the wakeup of a reader that blocked early.
pub fn look_before_blocking(
    stream: &std::os::unix::net::UnixStream,
    spin: std::time::Duration,
) -> bool {
    use rustix::net::RecvFlags;
    let start = std::time::Instant::now();
    loop {
        let mut byte = [0u8; 1];
        match rustix::net::recv(stream, &mut byte, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            // Bytes, or the end (0): the read that follows returns at once.
            Ok(_) => return true,
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
            // The read that follows reports it.
            Err(_) => return true,
        }
        if start.elapsed() >= spin {
            return false;
        }
        std::thread::yield_now();
    }
}

/// Fill `buf` from `stream`, keeping the first file descriptor that arrives with the bytes
/// (SCM_RIGHTS; any others are closed at once). `Ok(None)`: the stream ended before the
/// first byte; ending later is `UnexpectedEof`.
pub fn read_with_fd(
    stream: &std::os::unix::net::UnixStream,
    buf: &mut [u8],
) -> std::io::Result<Option<Option<std::os::fd::OwnedFd>>> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut got = 0;
    let mut fd = None;
    while got < buf.len() {
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let r = match rustix::net::recvmsg(
            stream,
            &mut [std::io::IoSliceMut::new(&mut buf[got..])],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(r) => r,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        };
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(fds) = m {
                for f in fds {
                    fd.get_or_insert(f);
                }
            }
        }
        if r.bytes == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += r.bytes;
    }
    Ok(Some(fd))
}

/// Generates a message enum from its table: the enum, a module of constants holding each
/// row's number, `number()` (a value's number), and the two codecs of the fields
/// (`put_fields`, `take_fields`), each field by its type's [`Wire`] codec in row order.
/// A row: `number CONSTANT => Variant { field: Type, ... }`, or `=> Variant` without fields.
macro_rules! messages {
    (
        $(#[$meta:meta])*
        pub enum $Enum:ident, numbered by $Num:ident in mod $consts:ident {
            $(
                $(#[$vdoc:meta])*
                $num:literal $CONST:ident => $Variant:ident $({
                    $( $(#[$fdoc:meta])* $field:ident : $fty:ty ),* $(,)?
                })?
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        pub enum $Enum {
            $( $(#[$vdoc])* $Variant $({ $( $(#[$fdoc])* $field: $fty ),* })?, )*
        }

        #[doc = concat!("The number of each [`", stringify!($Enum), "`] on the wire.")]
        pub mod $consts {
            $(
                #[doc = concat!("[`super::", stringify!($Enum), "::", stringify!($Variant), "`].")]
                pub const $CONST: $Num = $num;
            )*
        }

        // Two rows with one number would leave one of them undecodable: refuse to build.
        const _: () = {
            let n: &[$Num] = &[$($num),*];
            let mut i = 0;
            while i < n.len() {
                let mut j = i + 1;
                while j < n.len() {
                    assert!(n[i] != n[j], "two rows of a message table share a number");
                    j += 1;
                }
                i += 1;
            }
        };

        impl $Enum {
            /// This message's number: its row's.
            fn number(&self) -> $Num {
                match self {
                    $( Self::$Variant { .. } => $num, )*
                }
            }

            /// Append the fields, in row order.
            fn put_fields(&self, w: &mut Writer) {
                match self {
                    $( Self::$Variant $({ $($field),* })? => { $($( w.put($field); )*)? } )*
                }
            }

            /// Read the fields of the row numbered `number`; `Ok(None)` if there is none.
            fn take_fields(number: $Num, r: &mut Reader<'_>) -> Result<Option<Self>, ProtoError> {
                Ok(Some(match number {
                    $( $num => Self::$Variant $({ $( $field: r.take()? ),* })?, )*
                    _ => return Ok(None),
                }))
            }
        }
    };
}

messages! {
    /// A request from a client. Handles (`pd`, `cq`, `mr`, `qp`..., and those inside
    /// `QpInitAttr` and `MwBind`) are the connection's own numbers, meaningless on any other
    /// connection; the daemon replaces them with the engine's.
    #[derive(Debug, Clone, PartialEq, Eq)]
    // Exhaustive on purpose: both ends handle every message of their protocol version.
    pub enum Request, numbered by u16 in mod kind {
        /// Open the session; the daemon answers with its version.
        1 HELLO => Hello {
            /// The client's protocol version.
            version: u16,
        },
        /// The devices the daemon serves.
        2 LIST_DEVICES => ListDevices,
        /// `ibv_query_device`.
        3 QUERY_DEVICE => QueryDevice {
            /// Device index.
            dev: u32,
        },
        /// `ibv_query_port`.
        4 QUERY_PORT => QueryPort {
            /// Device index.
            dev: u32,
            /// Port number (1).
            port: u8,
        },
        /// `ibv_query_gid`.
        5 QUERY_GID => QueryGid {
            /// Device index.
            dev: u32,
            /// Port number (1).
            port: u8,
            /// GID index.
            index: u32,
        },
        /// `ibv_alloc_pd`.
        6 ALLOC_PD => AllocPd {
            /// Device index.
            dev: u32,
        },
        /// `ibv_dealloc_pd`.
        7 DEALLOC_PD => DeallocPd {
            /// PD handle.
            pd: u32,
        },
        /// `ibv_reg_mr` over the client's own memory.
        8 REG_MR => RegMr {
            /// PD handle.
            pd: u32,
            /// Start address in the client.
            addr: u64,
            /// Length in bytes.
            length: u64,
            /// Access rights.
            access: AccessFlags,
        },
        /// `ibv_dereg_mr`.
        9 DEREG_MR => DeregMr {
            /// MR handle.
            mr: u32,
        },
        /// `ibv_create_cq`.
        10 CREATE_CQ => CreateCq {
            /// Device index.
            dev: u32,
            /// Minimum number of entries.
            cqe: u32,
        },
        /// `ibv_destroy_cq`.
        11 DESTROY_CQ => DestroyCq {
            /// CQ handle.
            cq: u32,
        },
        /// `ibv_create_qp`.
        12 CREATE_QP => CreateQp {
            /// Its PD, CQs (the connection's handles), queue sizes and type.
            init: QpInitAttr,
        },
        /// `ibv_modify_qp`.
        13 MODIFY_QP => ModifyQp {
            /// QP handle.
            qp: u32,
            /// Which attributes to set.
            mask: QpAttrMask,
            /// The attributes the mask selects.
            attr: QpAttr,
        },
        /// `ibv_query_qp`.
        14 QUERY_QP => QueryQp {
            /// QP handle.
            qp: u32,
        },
        /// `ibv_destroy_qp`.
        15 DESTROY_QP => DestroyQp {
            /// QP handle.
            qp: u32,
        },
        /// `ibv_post_send` of one WR (RC, UC or UD), the same entry a send ring carries.
        16 POST_SEND => PostSend {
            /// QP handle.
            qp: u32,
            /// The work request as a send entry ([`crate::wqe::encode_send`]).
            wqe: Vec<u8>,
        },
        /// `ibv_post_recv` of one WR, the same entry a receive ring carries.
        17 POST_RECV => PostRecv {
            /// QP handle.
            qp: u32,
            /// The work request as a receive entry ([`crate::wqe::encode_recv`]).
            wqe: Vec<u8>,
        },
        /// `ibv_poll_cq`.
        18 POLL_CQ => PollCq {
            /// CQ handle.
            cq: u32,
            /// Most completions to return.
            max: u32,
        },
        /// The daemon's counters and each device's.
        19 STAT => Stat,
        /// Deliver `cq`'s completions into a shared-memory ring of `capacity` entries
        /// ([`crate::ring`], [`crate::wqe::Cqe`] entries) instead of [`Request::PollCq`],
        /// in the connection's ring arena ([`crate::arena`]): answered with
        /// [`Response::RingAt`], which carries the file of the arena chunk it names
        /// (SCM_RIGHTS) the first time an answer names that chunk.
        20 ATTACH_CQ_RING => AttachCqRing {
            /// CQ handle.
            cq: u32,
            /// Entries (a power of two).
            capacity: u32,
        },
        /// `ibv_create_srq`.
        21 CREATE_SRQ => CreateSrq {
            /// PD handle.
            pd: u32,
            /// Its size, SGEs per WR and limit.
            attr: SrqAttr,
        },
        /// `ibv_destroy_srq`.
        22 DESTROY_SRQ => DestroySrq {
            /// SRQ handle.
            srq: u32,
        },
        /// `ibv_post_srq_recv` of one WR, the same entry an SRQ ring carries.
        23 POST_SRQ_RECV => PostSrqRecv {
            /// SRQ handle.
            srq: u32,
            /// The work request as a receive entry ([`crate::wqe::encode_recv`]).
            wqe: Vec<u8>,
        },
        /// Receive WRs waiting in an SRQ (answered with [`Response::Count`]).
        24 SRQ_LEN => SrqLen {
            /// SRQ handle.
            srq: u32,
        },
        /// Completions waiting in a CQ (answered with [`Response::Count`]).
        25 CQ_LEN => CqLen {
            /// CQ handle.
            cq: u32,
        },
        /// `ibv_create_ah` (RoCE: always global).
        26 CREATE_AH => CreateAh {
            /// PD handle.
            pd: u32,
            /// The address vector.
            ah: AhAttr,
        },
        /// `ibv_destroy_ah`.
        27 DESTROY_AH => DestroyAh {
            /// AH handle.
            ah: u32,
        },
        // 28 was POST_SEND_UD before version 3: a UD post is a POST_SEND whose WQE says so.
        /// `ibv_create_qp` taking receives from an SRQ.
        29 CREATE_QP_WITH_SRQ => CreateQpWithSrq {
            /// Its PD, CQs (the connection's handles), queue sizes and type.
            init: QpInitAttr,
            /// SRQ handle.
            srq: u32,
        },
        /// `ibv_req_notify_cq`: signal the CQ's channel ([`Request::CqChannel`]) at its next
        /// (solicited) completion.
        30 REQ_NOTIFY_CQ => ReqNotifyCq {
            /// CQ handle.
            cq: u32,
            /// Only solicited or error completions.
            solicited_only: bool,
        },
        /// A completion channel for `cq`: the answer carries an eventfd (SCM_RIGHTS) that the
        /// daemon signals whenever an armed notification of the CQ fires.
        31 CQ_CHANNEL => CqChannel {
            /// CQ handle.
            cq: u32,
        },
        /// Take the asynchronous events of this connection's objects (answered with
        /// [`Response::AsyncEvents`]).
        32 GET_ASYNC_EVENTS => GetAsyncEvents,
        /// An event channel for this connection: the answer carries an eventfd (SCM_RIGHTS)
        /// the daemon signals whenever any device raises an asynchronous event (then ask with
        /// [`Request::GetAsyncEvents`]; an event of another connection's object is a spurious
        /// wakeup).
        33 ASYNC_EVENT_CHANNEL => AsyncEventChannel,
        /// `ibv_alloc_mw` (answered with [`Response::Mw`]).
        34 ALLOC_MW => AllocMw {
            /// PD handle.
            pd: u32,
            /// Type 1 or 2.
            mw_type: MwType,
        },
        /// `ibv_dealloc_mw`.
        35 DEALLOC_MW => DeallocMw {
            /// MW handle.
            mw: u32,
        },
        /// The window's current rkey and whether it is bound (answered with [`Response::Mw`]).
        36 QUERY_MW => QueryMw {
            /// MW handle.
            mw: u32,
        },
        /// `ibv_bind_mw` of a type 1 window (answered with [`Response::Mw`]: the rkey it
        /// will have once bound).
        37 BIND_MW => BindMw {
            /// QP handle the bind is posted on.
            qp: u32,
            /// Returned in the completion.
            wr_id: u64,
            /// MW handle.
            mw: u32,
            /// The bind (its `mr`: the connection's MR handle).
            bind: MwBind,
            /// Complete with a CQE.
            signaled: bool,
        },
        /// `ibv_modify_srq`.
        38 MODIFY_SRQ => ModifySrq {
            /// SRQ handle.
            srq: u32,
            /// What to change (`MAX_WR`, `LIMIT`).
            mask: SrqAttrMask,
            /// The values the mask selects.
            attr: SrqAttr,
        },
        /// `ibv_query_srq` (answered with [`Response::SrqAttr`]).
        39 QUERY_SRQ => QuerySrq {
            /// SRQ handle.
            srq: u32,
        },
        /// Take posts to a QP's send or receive queue, or to an SRQ, from a shared-memory
        /// ring of `capacity` entries ([`crate::ring`]; entries as [`crate::wqe`] lays them
        /// out, sized by the daemon for the queue's capabilities) as well as by request
        /// (answered with [`Response::WorkRingAt`]: where the ring is in the connection's ring
        /// arena, [`crate::arena`], with the file of its chunk the first time an answer names
        /// that chunk, SCM_RIGHTS; and its bit in the connection's doorbell page of that
        /// device, which [`Request::DoorbellPage`] must have made first). The client
        /// produces, the daemon consumes.
        40 ATTACH_WORK_RING => AttachWorkRing {
            /// Which queue: [`wq::SQ`], [`wq::RQ`] or [`wq::SRQ`].
            queue: u8,
            /// QP handle (SQ, RQ) or SRQ handle.
            handle: u32,
            /// Entries (a power of two).
            capacity: u32,
        },
        /// The doorbell of device `dev`: the answer carries an eventfd (SCM_RIGHTS) to write
        /// after ringing a work ring's bit in a doorbell page that says the daemon sleeps,
        /// or after polling a CQ ring whose backlog word asks for it.
        41 DOORBELL => Doorbell {
            /// Device index.
            dev: u32,
        },
        /// `ibv_reg_mr` over the client's memory that is a shared mapping of a sealed memfd,
        /// which rides on this message (SCM_RIGHTS): the daemon maps it too and copies with
        /// plain memory copies ([`crate::shm`]). Refused unless the client has byte `offset`
        /// of that file mapped at `addr` for all `length` bytes, and the file cannot shrink.
        42 REG_MR_SHARED => RegMrShared {
            /// PD handle.
            pd: u32,
            /// Start address in the client.
            addr: u64,
            /// Length in bytes.
            length: u64,
            /// Access rights.
            access: AccessFlags,
            /// Offset in the file of the byte at `addr`.
            offset: u64,
        },
        /// `ibv_resize_cq` (answered with [`Response::Count`]: the size it has now).
        43 RESIZE_CQ => ResizeCq {
            /// CQ handle.
            cq: u32,
            /// Completions it must hold.
            cqe: u32,
        },
        /// `ibv_rereg_mr` (answered with [`Response::Mr`]): change a region's translation
        /// (to the client's own memory at `addr`), PD or access in place.
        44 REREG_MR => ReregMr {
            /// MR handle.
            mr: u32,
            /// What changes.
            flags: ReregFlags,
            /// PD handle (with `CHANGE_PD`).
            pd: u32,
            /// Start address in the client (with `CHANGE_TRANSLATION`).
            addr: u64,
            /// Length in bytes (with `CHANGE_TRANSLATION`).
            length: u64,
            /// Access rights (with `CHANGE_ACCESS`).
            access: AccessFlags,
        },
        /// A connection-manager channel (`rdma_event_channel`) on device `dev` (answered with
        /// [`Response::Handle`]): the answer carries an eventfd (SCM_RIGHTS) readable while
        /// the channel holds events ([`Request::CmGetEvent`] takes them).
        45 CM_CHANNEL => CmChannel {
            /// Device index.
            dev: u32,
        },
        /// Deliver connection requests for `service_id` to `channel` (`rdma_listen`).
        46 CM_LISTEN => CmListen {
            /// Channel handle.
            channel: u32,
            /// The service (port space and port).
            service_id: ServiceId,
        },
        /// Stop listening on `service_id`.
        47 CM_UNLISTEN => CmUnlisten {
            /// Channel handle.
            channel: u32,
            /// The service.
            service_id: ServiceId,
        },
        /// Connect RC QP `qp` to `service_id` at `peer` (`rdma_connect`; answered with
        /// [`Response::CmId`]); its events arrive on `channel`.
        48 CM_CONNECT => CmConnect {
            /// Channel handle.
            channel: u32,
            /// QP handle (in RESET or INIT), or 0: the client moves its QP itself, and the
            /// REQ announces `param.qp_num`.
            qp: u32,
            /// The peer's address.
            peer: IpAddr,
            /// The service.
            service_id: ServiceId,
            /// What this side asks for.
            param: ConnParam,
        },
        /// Accept connection request `id` with RC QP `qp` (`rdma_accept`).
        49 CM_ACCEPT => CmAccept {
            /// The channel holding the connection.
            channel: u32,
            /// The request's connection.
            id: CommId,
            /// QP handle (in RESET or INIT), or 0: the client moves its QP itself, and the
            /// REP announces `param.qp_num`.
            qp: u32,
            /// What this side asks for.
            param: ConnParam,
        },
        /// Reject connection request `id` (`rdma_reject`, `rdma_reject_ece`).
        50 CM_REJECT => CmReject {
            /// The channel holding the connection.
            channel: u32,
            /// The request's connection.
            id: CommId,
            /// Consumer defined (28) or vendor option not supported (35).
            reason: RejectReason,
            /// For the peer (at most 148 bytes).
            private_data: Vec<u8>,
        },
        /// Close connection `id` (`rdma_disconnect`).
        51 CM_DISCONNECT => CmDisconnect {
            /// The channel holding the connection.
            channel: u32,
            /// The connection.
            id: CommId,
            /// For the peer (at most 220 bytes).
            private_data: Vec<u8>,
        },
        /// Let go of connection `id` in whatever state (`rdma_destroy_id`).
        52 CM_DESTROY_ID => CmDestroyId {
            /// The channel holding the connection.
            channel: u32,
            /// The connection.
            id: CommId,
        },
        /// The oldest event of `channel`, if any (answered with [`Response::CmEvent`]).
        53 CM_GET_EVENT => CmGetEvent {
            /// Channel handle.
            channel: u32,
        },
        /// Close `channel`: it stops listening, and connections whose events it received
        /// stay until destroyed.
        54 CM_DESTROY_CHANNEL => CmDestroyChannel {
            /// Channel handle.
            channel: u32,
        },
        /// `ibv_attach_mcast`: UD QP `qp` receives what is sent to group `gid`.
        56 ATTACH_MCAST => AttachMcast {
            /// QP handle.
            qp: u32,
            /// The multicast group's GID.
            gid: Gid,
        },
        /// `ibv_detach_mcast`.
        57 DETACH_MCAST => DetachMcast {
            /// QP handle.
            qp: u32,
            /// The multicast group's GID.
            gid: Gid,
        },
        /// Ask `peer` which UD QP serves `service_id` (SIDR: `rdma_connect` on a UDP id;
        /// answered with [`Response::CmId`]); the answer arrives on `channel`.
        55 CM_RESOLVE => CmResolve {
            /// Channel handle.
            channel: u32,
            /// The peer's address.
            peer: IpAddr,
            /// The service.
            service_id: ServiceId,
            /// Private data and source port (the rest is unused).
            param: ConnParam,
        },
        /// Send the RTU of connection `id`, whose QP the client moves and whose REP arrived
        /// (`rdma_establish`).
        58 CM_ESTABLISH => CmEstablish {
            /// The channel holding the connection.
            channel: u32,
            /// The connection.
            id: CommId,
        },
        /// The attributes that take connection `id`'s QP to `state` (INIT, RTR or RTS) as
        /// the CM exchange decided them (`rdma_init_qp_attr`; answered with
        /// [`Response::CmQpAttr`]).
        59 CM_INIT_QP_ATTR => CmInitQpAttr {
            /// The channel holding the connection.
            channel: u32,
            /// The connection.
            id: CommId,
            /// The state to reach.
            state: QpState,
        },
        /// This connection's doorbell page of device `dev` ([`crate::doorbell`]), made on the
        /// first call: the answer carries its memfd (SCM_RIGHTS). Each work ring the
        /// connection attaches on the device has a bit in it, to set after every push.
        60 DOORBELL_PAGE => DoorbellPage {
            /// Device index.
            dev: u32,
        },
        /// Arm `cq` through its ring ([`Request::AttachCqRing`] first) from now on, as a NIC's
        /// library arms a CQ with a doorbell, with no request: the client writes the ring's
        /// arm word ([`crate::ring::Ring::arm`]) and sets the answered bit
        /// ([`Response::ArmBit`]) in its doorbell page of the CQ's device
        /// ([`Request::DoorbellPage`] first). [`Request::ReqNotifyCq`] keeps working.
        61 ATTACH_CQ_ARM => AttachCqArm {
            /// CQ handle.
            cq: u32,
        },
    }
}

messages! {
    /// An answer from the daemon. Its kind is `RESPONSE_BIT | request kind`, or
    /// [`KIND_ERROR`] for [`Response::Error`]; its body starts with its tag.
    #[derive(Debug, Clone, PartialEq, Eq)]
    // Exhaustive on purpose: both ends handle every message of their protocol version.
    pub enum Response, numbered by u8 in mod tag {
        /// Success with nothing to return.
        0 DONE => Done,
        /// Answer to [`Request::Hello`].
        1 HELLO => Hello {
            /// The daemon's protocol version.
            version: u16,
            /// The daemon's pid (clients may let it trace them, e.g. `PR_SET_PTRACER`).
            pid: u32,
        },
        /// Answer to [`Request::ListDevices`].
        2 DEVICES => Devices {
            /// The devices, by index.
            devices: Vec<DeviceInfo>,
        },
        /// Answer to [`Request::QueryDevice`].
        3 DEVICE_ATTR => DeviceAttr {
            /// The device's attributes.
            attr: DeviceAttr,
        },
        /// Answer to [`Request::QueryPort`].
        4 PORT_ATTR => PortAttr {
            /// The port's attributes.
            attr: PortAttr,
        },
        /// Answer to [`Request::QueryGid`].
        5 GID => Gid {
            /// The GID.
            gid: Gid,
        },
        /// A new object's handle (PD, CQ, SRQ, AH).
        6 HANDLE => Handle {
            /// The connection's handle.
            handle: u32,
        },
        /// An MR: handle and keys ([`Request::RegMr`], [`Request::ReregMr`]...).
        7 MR => Mr {
            /// Handle.
            handle: u32,
            /// Local key.
            lkey: u32,
            /// Remote key.
            rkey: u32,
        },
        /// A new QP: handle and QP number.
        8 QP => Qp {
            /// Handle.
            handle: u32,
            /// QP number (what the peer puts in `dest_qp_num`).
            qpn: u32,
        },
        /// Answer to [`Request::QueryQp`].
        9 QP_ATTR => QpAttr {
            /// The QP's attributes.
            attr: QpAttr,
        },
        /// Answer to [`Request::PollCq`].
        10 COMPLETIONS => Completions {
            /// Oldest first.
            cqes: Vec<Cqe>,
        },
        /// Answer to [`Request::Stat`].
        11 STAT => Stat {
            /// Named counters.
            counters: Vec<(String, u64)>,
        },
        /// A number of things ([`Request::CqLen`], [`Request::SrqLen`], [`Request::ResizeCq`]).
        12 COUNT => Count {
            /// How many.
            n: u64,
        },
        /// Answer to [`Request::GetAsyncEvents`].
        13 ASYNC_EVENTS => AsyncEvents {
            /// Oldest first; CQs and SRQs by the connection's handles.
            events: Vec<AsyncEvent>,
        },
        /// A memory window ([`Request::AllocMw`], [`Request::QueryMw`], [`Request::BindMw`]).
        14 MW => Mw {
            /// Its handle.
            handle: u32,
            /// Its rkey (after a bind: the key the bind gives it).
            rkey: u32,
            /// Whether it is bound now.
            bound: bool,
        },
        /// Answer to [`Request::QuerySrq`].
        15 SRQ_ATTR => SrqAttr {
            /// The SRQ's attributes.
            attr: SrqAttr,
        },
        /// A connection ([`Request::CmConnect`]) or a SIDR request ([`Request::CmResolve`]).
        16 CM_ID => CmId {
            /// Its local communication ID.
            id: CommId,
        },
        /// Answer to [`Request::CmGetEvent`].
        17 CM_EVENT => CmEvent {
            /// The oldest event, if any.
            event: Option<CmEvent>,
        },
        /// Answer to [`Request::CmInitQpAttr`]: the attributes and which of them to apply.
        18 CM_QP_ATTR => CmQpAttr {
            /// The attributes.
            attr: QpAttr,
            /// Which of them (the state included).
            mask: QpAttrMask,
        },
        // 19 was `Bell` (version 11), the bit of a work ring in a file of its own.
        /// Answer to [`Request::AttachWorkRing`]: where the ring is in the connection's
        /// arena ([`crate::arena::RingPlace`]) and its bit in the doorbell page.
        20 WORK_RING_AT => WorkRingAt {
            /// Arena chunk.
            chunk: u32,
            /// Byte offset of the ring in the chunk.
            offset: u64,
            /// Bytes of the ring.
            len: u64,
            /// Bit number (below [`crate::doorbell::BITS`]).
            bit: u32,
        },
        /// Answer to [`Request::AttachCqRing`]: where the ring is in the connection's arena
        /// ([`crate::arena::RingPlace`]).
        21 RING_AT => RingAt {
            /// Arena chunk.
            chunk: u32,
            /// Byte offset of the ring in the chunk.
            offset: u64,
            /// Bytes of the ring.
            len: u64,
        },
        /// Answer to [`Request::AttachCqArm`]: the CQ's bit in the doorbell page.
        22 ARM_BIT => ArmBit {
            /// Bit number (below [`crate::doorbell::BITS`]).
            bit: u32,
        },
        /// The request failed: an errno as libibverbs would return it, and why.
        255 ERROR => Error {
            /// Positive errno (`EINVAL`, `ENOMEM`, `EFAULT`...).
            errno: i32,
            /// Human-readable reason.
            message: String,
        },
    }
}

/// The queues a work ring can feed ([`Request::AttachWorkRing`]).
pub mod wq {
    /// A QP's send queue: [`super::Request::PostSend`].
    pub const SQ: u8 = 0;
    /// A QP's receive queue: [`super::Request::PostRecv`].
    pub const RQ: u8 = 1;
    /// A shared receive queue: [`super::Request::PostSrqRecv`].
    pub const SRQ: u8 = 2;
}

/// A device the daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Index used in requests.
    pub index: u32,
    /// Name (`srxe0`...).
    pub name: String,
    /// Addresses (GID table order).
    pub addrs: Vec<std::net::IpAddr>,
    /// UDP port it receives RoCEv2 on.
    pub port: u16,
}

/// Most completions in one answer.
pub const MAX_WCS: usize = 4096;
/// Most asynchronous events in one answer.
pub const MAX_EVENTS: usize = 4096;

impl Request {
    /// The message kind of this request: its row's number.
    pub fn kind(&self) -> u16 {
        self.number()
    }

    /// The queue a post request goes to ([`wq`]), or `None` for any other request.
    pub fn work_queue(&self) -> Option<u8> {
        match self {
            Request::PostSend { .. } => Some(wq::SQ),
            Request::PostRecv { .. } => Some(wq::RQ),
            Request::PostSrqRecv { .. } => Some(wq::SRQ),
            _ => None,
        }
    }

    /// The body bytes.
    pub fn encode_body(&self) -> Vec<u8> {
        let mut w = Writer::default();
        self.put_fields(&mut w);
        w.buf
    }

    /// The whole framed message.
    pub fn encode(&self, id: u32) -> Vec<u8> {
        frame(self.kind(), id, &self.encode_body())
    }

    /// Decode a request body of `kind`; every byte must be used.
    pub fn decode(kind: u16, body: &[u8]) -> Result<Request, ProtoError> {
        let mut r = Reader::new(body);
        let req = Request::take_fields(kind, &mut r)?.ok_or(ProtoError::UnknownKind(kind))?;
        r.finish()?;
        Ok(req)
    }
}

impl Response {
    /// Frame this answer to request `req_kind` with id `id`.
    pub fn encode(&self, req_kind: u16, id: u32) -> Vec<u8> {
        let mut w = Writer::default();
        w.put(&self.number());
        self.put_fields(&mut w);
        let kind = match self {
            Response::Error { .. } => KIND_ERROR,
            _ => RESPONSE_BIT | req_kind,
        };
        frame(kind, id, &w.buf)
    }

    /// Decode an answer body of message kind `kind`; every byte must be used.
    pub fn decode(kind: u16, body: &[u8]) -> Result<Response, ProtoError> {
        if kind & RESPONSE_BIT == 0 {
            return Err(ProtoError::UnknownKind(kind));
        }
        let mut r = Reader::new(body);
        let tag = r.take()?;
        let resp =
            Response::take_fields(tag, &mut r)?.ok_or(ProtoError::Invalid("response tag"))?;
        // An error has its own kind, and only an error has it: one encoding per answer.
        if matches!(resp, Response::Error { .. }) != (kind == KIND_ERROR) {
            return Err(ProtoError::Invalid("answer kind"));
        }
        r.finish()?;
        Ok(resp)
    }
}

/// Split one whole message off the front of `bytes`: its header and body, or `Ok(None)` if
/// more bytes are needed. Errors are framing errors (bad magic, version or length).
pub fn split_message(bytes: &[u8]) -> Result<Option<(Header, &[u8])>, ProtoError> {
    let Some(h) = bytes.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let header = Header::parse(h)?;
    let end = HEADER_LEN + header.length as usize;
    Ok(bytes.get(HEADER_LEN..end).map(|body| (header, body)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine::{AsyncEvent, CqHandle, MrHandle, PdHandle, QpCap, QpState, QpType, SrqHandle};
    use proptest::prelude::*;
    use wire::Qpn;

    #[test]
    fn looking_before_blocking_sees_bytes_and_the_end_and_consumes_nothing() {
        use std::io::{Read, Write};
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let short = std::time::Duration::from_millis(2);
        // Nothing waits: false, once the spin is over.
        let t = std::time::Instant::now();
        assert!(!look_before_blocking(&b, short));
        assert!(t.elapsed() >= short);
        // A byte waits: seen, and still there for the read.
        a.write_all(b"x").unwrap();
        assert!(look_before_blocking(&b, short));
        let mut got = [0u8; 1];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"x");
        // The peer closed: seen (the read then returns the end at once).
        drop(a);
        assert!(look_before_blocking(&b, std::time::Duration::from_secs(60)));
        assert_eq!(b.read(&mut got).unwrap(), 0);
    }

    fn init() -> QpInitAttr {
        QpInitAttr {
            pd: PdHandle(1),
            send_cq: CqHandle(2),
            recv_cq: CqHandle(3),
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
            },
            qp_type: QpType::Rc,
            sq_sig_all: true,
        }
    }

    /// A QP attribute set with every field away from its default.
    fn qp_attr() -> QpAttr {
        QpAttr {
            qp_state: QpState::Rts,
            cur_qp_state: QpState::Rtr,
            path_mtu: wire::Mtu::Mtu1024,
            path_mig_state: engine::qp_attr::MigState::Armed,
            qkey: 1,
            rq_psn: 2,
            sq_psn: 3,
            dest_qp_num: Qpn::new(4),
            qp_access_flags: AccessFlags::REMOTE_WRITE,
            cap: init().cap,
            ah_attr: AhAttr {
                dgid: [1; 16],
                sgid_index: 1,
                hop_limit: 9,
                traffic_class: 2,
                flow_label: 3,
                dlid: 4,
                sl: 5,
                static_rate: 6,
                port_num: 1,
                is_global: true,
            },
            alt_ah_attr: AhAttr {
                dgid: [2; 16],
                is_global: false,
                ..AhAttr::default()
            },
            pkey_index: 5,
            alt_pkey_index: 6,
            en_sqd_async_notify: true,
            sq_draining: true,
            max_rd_atomic: 7,
            max_dest_rd_atomic: 8,
            min_rnr_timer: 9,
            port_num: 1,
            timeout: 10,
            retry_cnt: 6,
            rnr_retry: 7,
            alt_port_num: 2,
            alt_timeout: 11,
            rate_limit: 12,
        }
    }

    fn sample_requests() -> Vec<Request> {
        let mut param = ConnParam::with_private_data(b"hi");
        param.retry_count = 3;
        param.src_port = 40_000;
        param.qp_num = 0x12_3456;
        param.ece = cm::Ece {
            vendor_id: 0x00_02c9,
            options: 0x8000_0001,
        };
        let peer = IpAddr::from([10, 0, 0, 2]);
        let service_id = ServiceId(0x0106_0000_0000_1d4f);
        vec![
            Request::CmChannel { dev: 0 },
            Request::CmListen {
                channel: 1,
                service_id,
            },
            Request::CmUnlisten {
                channel: 1,
                service_id,
            },
            Request::CmConnect {
                channel: 1,
                qp: 3,
                peer,
                service_id,
                param: param.clone(),
            },
            Request::CmAccept {
                channel: 1,
                id: CommId(9),
                qp: 4,
                param,
            },
            Request::CmReject {
                channel: 1,
                id: CommId(9),
                reason: RejectReason::VENDOR_OPTION_NOT_SUPPORTED,
                private_data: vec![1, 2, 3],
            },
            Request::CmDisconnect {
                channel: 1,
                id: CommId(9),
                private_data: vec![],
            },
            Request::CmDestroyId {
                channel: 1,
                id: CommId(9),
            },
            Request::CmGetEvent { channel: 1 },
            Request::CmDestroyChannel { channel: 1 },
            Request::CmResolve {
                channel: 1,
                peer,
                service_id,
                param: ConnParam::with_private_data(b"ud"),
            },
            Request::AttachMcast {
                qp: 3,
                gid: Gid([0xff; 16]),
            },
            Request::DetachMcast {
                qp: 3,
                gid: Gid([0xfe; 16]),
            },
            Request::CmEstablish {
                channel: 1,
                id: CommId(9),
            },
            Request::CmInitQpAttr {
                channel: 1,
                id: CommId(9),
                state: QpState::Rtr,
            },
            Request::Hello { version: VERSION },
            Request::ListDevices,
            Request::QueryGid {
                dev: 1,
                port: 1,
                index: 2,
            },
            Request::RegMr {
                pd: 3,
                addr: 0x1000,
                length: 4096,
                access: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            },
            Request::RegMrShared {
                pd: 3,
                addr: 0x1000,
                length: 4096,
                access: AccessFlags::LOCAL_WRITE,
                offset: 8192,
            },
            Request::CreateQp { init: init() },
            Request::ModifyQp {
                qp: 4,
                mask: QpAttrMask::all(),
                attr: qp_attr(),
            },
            Request::PostRecv {
                qp: 4,
                wqe: vec![1; 64],
            },
            Request::ReregMr {
                mr: 3,
                flags: ReregFlags::all(),
                pd: 2,
                addr: 0x7f00_1234_5000,
                length: 1 << 20,
                access: AccessFlags::all(),
            },
            Request::PollCq { cq: 2, max: 16 },
            Request::Stat,
            Request::CreateSrq {
                pd: 1,
                attr: SrqAttr {
                    max_wr: 64,
                    max_sge: 2,
                    srq_limit: 0,
                },
            },
            Request::PostSrqRecv {
                srq: 2,
                wqe: vec![2; 32],
            },
            Request::CreateAh {
                pd: 1,
                ah: qp_attr().ah_attr,
            },
            Request::CreateQpWithSrq {
                init: QpInitAttr {
                    qp_type: QpType::Ud,
                    sq_sig_all: false,
                    ..init()
                },
                srq: 7,
            },
            Request::ReqNotifyCq {
                cq: 2,
                solicited_only: true,
            },
            Request::CqChannel { cq: 2 },
            Request::CqLen { cq: 2 },
            Request::ResizeCq { cq: 2, cqe: 9 },
            Request::AsyncEventChannel,
            Request::AllocMw {
                pd: 1,
                mw_type: MwType::Type2,
            },
            Request::ModifySrq {
                srq: 7,
                mask: SrqAttrMask::LIMIT,
                attr: SrqAttr {
                    max_wr: 0,
                    max_sge: 0,
                    srq_limit: 4,
                },
            },
            Request::QuerySrq { srq: 7 },
            Request::BindMw {
                qp: 4,
                wr_id: 9,
                mw: 5,
                bind: MwBind {
                    mr: MrHandle(6),
                    addr: 0x1000,
                    length: 64,
                    access: AccessFlags::REMOTE_WRITE,
                },
                signaled: true,
            },
            Request::PostSend {
                qp: 4,
                wqe: vec![0xa5; crate::wqe::SEND_WQE_LEN + 16],
            },
            Request::AttachWorkRing {
                queue: wq::RQ,
                handle: 3,
                capacity: 64,
            },
            Request::Doorbell { dev: 1 },
            Request::DoorbellPage { dev: 1 },
            Request::AttachCqArm { cq: 2 },
        ]
    }

    #[test]
    fn every_request_round_trips() {
        for (i, req) in sample_requests().into_iter().enumerate() {
            let bytes = req.encode(i as u32);
            let (h, body) = split_message(&bytes).unwrap().unwrap();
            assert_eq!(h.id, i as u32);
            assert_eq!(Request::decode(h.kind, body).unwrap(), req);
            // Every proper prefix of the body is refused, never accepted or a panic.
            for cut in 0..body.len() {
                assert!(
                    Request::decode(h.kind, &body[..cut]).is_err(),
                    "{req:?} cut {cut}"
                );
            }
            let mut long = body.to_vec();
            long.push(0);
            assert_eq!(Request::decode(h.kind, &long), Err(ProtoError::Trailing(1)));
        }
    }

    #[test]
    fn kinds_are_the_rows_numbers() {
        assert_eq!(Request::Stat.kind(), kind::STAT);
        assert_eq!(
            Request::ReregMr {
                mr: 0,
                flags: ReregFlags::empty(),
                pd: 0,
                addr: 0,
                length: 0,
                access: AccessFlags::empty(),
            }
            .kind(),
            44
        );
        // Unused numbers name nothing (28 was retired in version 3).
        for k in [0, 28, 62, 0x7777] {
            assert_eq!(Request::decode(k, &[]), Err(ProtoError::UnknownKind(k)));
        }
    }

    #[test]
    fn responses_round_trip() {
        let mut dev = DeviceAttr::default();
        dev.node_guid = 0x1122;
        dev.sys_image_guid = 0x3344;
        dev.max_mw = 77;
        dev.atomic_cap = engine::AtomicCap::Glob;
        dev.fw_ver = "9.9".into();
        let mut port = PortAttr::roce(
            engine::PortState::Active,
            wire::Mtu::Mtu4096,
            wire::Mtu::Mtu1024,
            3,
            1 << 31,
        );
        port.pkey_tbl_len = 2;
        let request = cm::ConnectRequest {
            id: CommId(5),
            service_id: ServiceId(0x0106_0000_0000_1d4f),
            peer: IpAddr::from([10, 0, 0, 1]),
            peer_port: 41_000,
            local: IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
            remote_qpn: Qpn::new(0x11),
            responder_resources: 4,
            initiator_depth: 2,
            private_data: b"req".to_vec(),
            ece: cm::Ece {
                vendor_id: 0x12_3456,
                options: 0xffff_ffff,
            },
            datagram: false,
        };
        let cm_events = [
            CmEvent::ConnectRequest(Box::new(request.clone())),
            CmEvent::Established {
                id: CommId(5),
                private_data: vec![7; 196],
                ece: cm::Ece {
                    vendor_id: 1,
                    options: 2,
                },
            },
            CmEvent::Rejected {
                id: CommId(5),
                reason: wire::RejectReason(28),
                private_data: vec![],
            },
            CmEvent::Unreachable { id: CommId(6) },
            CmEvent::ConnectError {
                id: CommId(6),
                errno: 22,
            },
            CmEvent::Disconnected { id: CommId(6) },
            CmEvent::ConnectRequest(Box::new(cm::ConnectRequest {
                datagram: true,
                remote_qpn: Qpn::new(0),
                ece: cm::Ece::default(),
                ..request.clone()
            })),
            CmEvent::Resolved {
                id: CommId(7),
                qpn: 0x33,
                qkey: 0x0123_4567,
                private_data: vec![1; 136],
            },
            CmEvent::Unresolved {
                id: CommId(8),
                status: 2,
                private_data: vec![],
            },
            CmEvent::ConnectResponse {
                id: CommId(10),
                remote_qpn: Qpn::new(0xab_cdef),
                private_data: vec![5; 196],
                ece: cm::Ece {
                    vendor_id: 3,
                    options: 4,
                },
            },
            CmEvent::TimeWaitExit { id: CommId(11) },
        ];
        let mut rs = vec![
            Response::CmId { id: CommId(1) },
            Response::CmEvent { event: None },
        ];
        rs.extend(
            cm_events
                .into_iter()
                .map(|e| Response::CmEvent { event: Some(e) }),
        );
        rs.extend([
            Response::Error {
                errno: 22,
                message: "nope".into(),
            },
            Response::Done,
            Response::Devices {
                devices: vec![DeviceInfo {
                    index: 0,
                    name: "srxe0".into(),
                    addrs: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
                    port: 4791,
                }],
            },
            Response::DeviceAttr { attr: dev },
            Response::PortAttr { attr: port },
            Response::Gid { gid: Gid([7; 16]) },
            Response::QpAttr { attr: qp_attr() },
            Response::CmQpAttr {
                attr: qp_attr(),
                mask: QpAttrMask::STATE | QpAttrMask::RQ_PSN | QpAttrMask::AV,
            },
            Response::Completions {
                cqes: vec![Cqe {
                    wr_id: 1,
                    byte_len: 5,
                    ..Cqe::default()
                }],
            },
            Response::Stat {
                counters: vec![("a".into(), 1), ("b".into(), 2)],
            },
            Response::Mr {
                handle: 1,
                lkey: 2,
                rkey: 3,
            },
            Response::Count { n: 7 },
            Response::WorkRingAt {
                chunk: 2,
                offset: 0x4_0000,
                len: 192 + 64 * 112,
                bit: 65_535,
            },
            Response::RingAt {
                chunk: 0,
                offset: 256,
                len: 192 + 64 * 64,
            },
            Response::ArmBit { bit: 4_095 },
            Response::AsyncEvents {
                events: vec![
                    AsyncEvent::QpFatal {
                        qpn: Qpn::new(0x11),
                    },
                    AsyncEvent::CqErr { cq: CqHandle(3) },
                    AsyncEvent::SrqLimitReached { srq: SrqHandle(4) },
                    AsyncEvent::PortErr { port: 1 },
                ],
            },
            Response::Mw {
                handle: 3,
                rkey: 0x300,
                bound: true,
            },
            Response::SrqAttr {
                attr: SrqAttr {
                    max_wr: 64,
                    max_sge: 2,
                    srq_limit: 4,
                },
            },
        ]);
        for r in rs {
            let bytes = r.encode(kind::STAT, 5);
            let (h, body) = split_message(&bytes).unwrap().unwrap();
            assert_eq!(Response::decode(h.kind, body).unwrap(), r);
            for cut in 0..body.len() {
                assert!(
                    Response::decode(h.kind, &body[..cut]).is_err(),
                    "{r:?} cut {cut}"
                );
            }
        }
    }

    #[test]
    fn an_answer_kind_must_match_its_tag() {
        let err = Response::Error {
            errno: 1,
            message: String::new(),
        }
        .encode(kind::STAT, 1);
        let (_, body) = split_message(&err).unwrap().unwrap();
        assert!(Response::decode(RESPONSE_BIT | kind::STAT, body).is_err());
        let done = Response::Done.encode(kind::STAT, 1);
        let (_, body) = split_message(&done).unwrap().unwrap();
        assert!(Response::decode(KIND_ERROR, body).is_err());
        assert!(
            Response::decode(kind::STAT, body).is_err(),
            "no RESPONSE_BIT"
        );
    }

    #[test]
    fn values_that_name_nothing_are_refused() {
        let body = |f: &dyn Fn(&mut Writer)| {
            let mut w = Writer::default();
            f(&mut w);
            w.buf
        };
        // A QP type the engine has no such number for.
        let mut b = Request::CreateQp { init: init() }.encode_body();
        b[32..36].copy_from_slice(&9u32.to_le_bytes());
        assert_eq!(
            Request::decode(kind::CREATE_QP, &b),
            Err(ProtoError::Invalid("QP type"))
        );
        // An access bit no verb knows.
        let b = body(&|w| {
            w.put(&1u32).put(&0u64).put(&0u64).put(&(1u32 << 30));
        });
        assert_eq!(
            Request::decode(kind::REG_MR, &b),
            Err(ProtoError::Invalid("access flags"))
        );
        // A window type 3, a boolean 2, an async event kind 0.
        let b = body(&|w| {
            w.put(&1u32).put(&3u8);
        });
        assert!(Request::decode(kind::ALLOC_MW, &b).is_err());
        let b = body(&|w| {
            w.put(&1u32).put(&2u8);
        });
        assert!(Request::decode(kind::REQ_NOTIFY_CQ, &b).is_err());
        let b = body(&|w| {
            w.put(&tag::ASYNC_EVENTS).put(&1u32).put(&0u8).put(&0u32);
        });
        assert!(Response::decode(RESPONSE_BIT | kind::GET_ASYNC_EVENTS, &b).is_err());
    }

    #[test]
    fn headers_with_bad_magic_version_or_length_are_refused() {
        let mut h = Header {
            kind: 1,
            length: 2,
            id: 3,
        }
        .to_bytes();
        assert!(Header::parse(&h).is_ok());
        h[8..12].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
        assert_eq!(Header::parse(&h), Err(ProtoError::TooLong(MAX_BODY + 1)));
        let other = VERSION + 1;
        h[4..6].copy_from_slice(&other.to_le_bytes());
        assert_eq!(Header::parse(&h), Err(ProtoError::BadVersion(other)));
        h[0] = 0;
        assert!(matches!(Header::parse(&h), Err(ProtoError::BadMagic(_))));
    }

    #[test]
    fn a_lying_count_does_not_allocate_or_panic() {
        // PostRecv claiming a WQE of 4 GiB with 8 bytes present.
        let mut w = Writer::default();
        w.put(&1u32).put(&u32::MAX).put(&2u64);
        assert_eq!(
            Request::decode(kind::POST_RECV, &w.buf),
            Err(ProtoError::Truncated)
        );
        // Stat answer claiming 2^32 - 1 counters.
        let mut w = Writer::default();
        w.put(&tag::STAT).put(&u32::MAX);
        assert_eq!(
            Response::decode(kind::STAT | RESPONSE_BIT, &w.buf),
            Err(ProtoError::Truncated)
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn arbitrary_bytes_never_panic_the_decoders(kind in any::<u16>(), body in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Request::decode(kind, &body);
            let _ = Response::decode(kind, &body);
            let _ = split_message(&body);
        }

        #[test]
        fn mutated_valid_messages_never_panic(i in 0usize..64, pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let reqs = sample_requests();
            let mut bytes = reqs[i % reqs.len()].encode(1);
            let p = pos.index(bytes.len());
            bytes[p] = byte;
            if let Ok(Some((h, body))) = split_message(&bytes) {
                if let Ok(req) = Request::decode(h.kind, body) {
                    // One encoding per message: what decodes encodes back to its bytes.
                    prop_assert_eq!(req.encode_body(), body.to_vec());
                }
            }
        }
    }
}
