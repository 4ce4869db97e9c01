//! The control protocol between `softrdmad` and its clients, over a Unix stream socket.
//!
//! Every message is a 16-byte [`Header`] followed by `length` bytes of body, all integers
//! little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic [`MAGIC`] (`"SRDM"`) |
//! | 4..6 | protocol version [`VERSION`] |
//! | 6..8 | kind: a request number, `RESPONSE_BIT | request` for its answer, [`KIND_ERROR`] for an error |
//! | 8..12 | body length, at most [`MAX_BODY`] |
//! | 12..16 | request id, echoed in the answer |
//!
//! Bodies are decoded with a bounds-checked [`Reader`]: a length, a count or a field that does
//! not fit the bytes that arrived is an error, never a panic, and a body with bytes left over
//! after its last field is refused too. The daemon answers a bad body with an error message and
//! closes the connection on a bad header (after it, framing can no longer be trusted).

use std::net::IpAddr;

use crate::wqe::Cqe;

/// First four bytes of every message: `"SRDM"`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SRDM");
/// The protocol version this crate speaks.
pub const VERSION: u16 = 3;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 16;
/// Largest body accepted (inline data and completion batches fit easily).
pub const MAX_BODY: u32 = 1 << 20;
/// Set in the kind of every successful answer.
pub const RESPONSE_BIT: u16 = 0x8000;
/// Kind of an error answer ([`Response::Error`]).
pub const KIND_ERROR: u16 = 0xffff;
/// Most scatter/gather entries accepted in one work request.
pub const MAX_SGES: usize = 256;

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

    fn array<const N: usize>(&mut self) -> Result<[u8; N], ProtoError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }

    /// A byte.
    pub fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.array::<1>()?[0])
    }
    /// A little-endian u16.
    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    /// A little-endian u32.
    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    /// A little-endian i32.
    pub fn i32(&mut self) -> Result<i32, ProtoError> {
        Ok(i32::from_le_bytes(self.array()?))
    }
    /// A little-endian u64.
    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    /// A boolean byte (0 or 1; anything else is invalid).
    pub fn bool(&mut self) -> Result<bool, ProtoError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(ProtoError::Invalid("boolean")),
        }
    }
    /// A u32 length followed by that many bytes.
    pub fn blob(&mut self) -> Result<&'a [u8], ProtoError> {
        let n = self.u32()? as usize;
        self.bytes(n)
    }
    /// A UTF-8 string (u16 length).
    pub fn string(&mut self) -> Result<String, ProtoError> {
        let n = usize::from(self.u16()?);
        let b = self.bytes(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Invalid("utf-8"))
    }
    /// A count (u16) of items of at least `min_size` bytes each, checked against both `max`
    /// and the bytes left, so a lying count cannot make the decoder allocate.
    pub fn count(&mut self, max: usize, min_size: usize) -> Result<usize, ProtoError> {
        let n = usize::from(self.u16()?);
        if n > max {
            return Err(ProtoError::Invalid("count over limit"));
        }
        if n.saturating_mul(min_size.max(1)) > self.buf.len() {
            return Err(ProtoError::Truncated);
        }
        Ok(n)
    }
    /// An IP address: family byte (4 or 6) then 4 or 16 bytes.
    pub fn ip(&mut self) -> Result<IpAddr, ProtoError> {
        match self.u8()? {
            4 => Ok(IpAddr::from(self.array::<4>()?)),
            6 => Ok(IpAddr::from(self.array::<16>()?)),
            _ => Err(ProtoError::Invalid("address family")),
        }
    }
    /// Succeeds only if every byte was consumed.
    pub fn finish(self) -> Result<(), ProtoError> {
        match self.buf.len() {
            0 => Ok(()),
            n => Err(ProtoError::Trailing(n)),
        }
    }
}

/// Appends fields to a body.
#[derive(Debug, Default)]
pub struct Writer {
    /// The bytes so far.
    pub buf: Vec<u8>,
}

impl Writer {
    /// A byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    /// A little-endian u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian i32.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A little-endian u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A boolean byte.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(u8::from(v))
    }
    /// A u32 length and the bytes (truncated at `u32::MAX`, far above [`MAX_BODY`]).
    pub fn blob(&mut self, b: &[u8]) -> &mut Self {
        let n = b.len().min(u32::MAX as usize);
        self.u32(n as u32);
        self.buf.extend_from_slice(&b[..n]);
        self
    }
    /// A string, u16 length (cut at 65535 bytes, on a character boundary).
    pub fn string(&mut self, s: &str) -> &mut Self {
        let mut n = s.len().min(usize::from(u16::MAX));
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.u16(n as u16);
        self.buf.extend_from_slice(&s.as_bytes()[..n]);
        self
    }
    /// A count (u16; callers keep counts within their limits).
    pub fn count(&mut self, n: usize) -> &mut Self {
        self.u16(u16::try_from(n).unwrap_or(u16::MAX))
    }
    /// An IP address (family byte, then the octets).
    pub fn ip(&mut self, ip: IpAddr) -> &mut Self {
        match ip {
            IpAddr::V4(a) => {
                self.u8(4);
                self.buf.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                self.u8(6);
                self.buf.extend_from_slice(&a.octets());
            }
        }
        self
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

/// What a memory window bind exposes (`ibv_mw_bind_info`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MwBindMsg {
    /// MR handle (ignored by a type 1 unbind).
    pub mr: u32,
    /// First byte of the window.
    pub addr: u64,
    /// Bytes in the window (0 unbinds a type 1 window).
    pub length: u64,
    /// `ibv_access_flags` for remote access through the window.
    pub access: u32,
}

/// Attributes of `ibv_modify_qp` / `ibv_query_qp` that a RoCE RC/UC/UD QP uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpAttrMsg {
    /// `IBV_QPS_*`.
    pub qp_state: u32,
    /// Path MTU in bytes (256..4096).
    pub path_mtu: u32,
    /// Q_Key (UD).
    pub qkey: u32,
    /// Receive PSN.
    pub rq_psn: u32,
    /// Send PSN.
    pub sq_psn: u32,
    /// Remote QPN.
    pub dest_qp_num: u32,
    /// `ibv_access_flags` bits for remote access.
    pub qp_access_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Port (1).
    pub port_num: u8,
    /// Outstanding READ/ATOMIC as requester.
    pub max_rd_atomic: u8,
    /// Outstanding READ/ATOMIC as responder.
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Retry count.
    pub retry_cnt: u8,
    /// RNR retry count (7 = infinite).
    pub rnr_retry: u8,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
    /// `IBV_QPS_*` the caller believes the QP is in (with `IBV_QP_CUR_STATE`).
    pub cur_qp_state: u32,
    /// `IBV_MIG_*`.
    pub path_mig_state: u32,
    /// Queue sizes (`ibv_qp_cap`, with `IBV_QP_CAP`; what query reports).
    pub cap: QpCapMsg,
    /// Alternate path (`IBV_QP_ALT_PATH`): its address vector.
    pub alt_ah: AhMsg,
    /// Alternate P_Key index.
    pub alt_pkey_index: u16,
    /// Alternate port.
    pub alt_port_num: u8,
    /// Alternate local ACK timeout.
    pub alt_timeout: u8,
    /// Raise `IBV_EVENT_SQ_DRAINED` (with `IBV_QP_EN_SQD_ASYNC_NOTIFY`).
    pub en_sqd_async_notify: bool,
    /// Query: the send queue is draining (SQD).
    pub sq_draining: bool,
    /// Rate limit in kbps (`IBV_QP_RATE_LIMIT`).
    pub rate_limit: u32,
}

/// Queue sizes of a QP (`ibv_qp_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpCapMsg {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
}

fn write_ah(w: &mut Writer, a: &AhMsg) {
    w.buf.extend_from_slice(&a.dgid);
    w.u8(a.sgid_index)
        .u8(a.hop_limit)
        .u8(a.traffic_class)
        .u32(a.flow_label);
}

fn read_ah(r: &mut Reader<'_>) -> Result<AhMsg, ProtoError> {
    Ok(AhMsg {
        dgid: r.array()?,
        sgid_index: r.u8()?,
        hop_limit: r.u8()?,
        traffic_class: r.u8()?,
        flow_label: r.u32()?,
    })
}

impl QpAttrMsg {
    fn write(&self, w: &mut Writer) {
        w.u32(self.qp_state)
            .u32(self.path_mtu)
            .u32(self.qkey)
            .u32(self.rq_psn)
            .u32(self.sq_psn)
            .u32(self.dest_qp_num)
            .u32(self.qp_access_flags)
            .u16(self.pkey_index)
            .u8(self.port_num)
            .u8(self.max_rd_atomic)
            .u8(self.max_dest_rd_atomic)
            .u8(self.min_rnr_timer)
            .u8(self.timeout)
            .u8(self.retry_cnt)
            .u8(self.rnr_retry);
        w.buf.extend_from_slice(&self.dgid);
        w.u8(self.sgid_index)
            .u8(self.hop_limit)
            .u8(self.traffic_class)
            .u32(self.flow_label);
        w.u32(self.cur_qp_state)
            .u32(self.path_mig_state)
            .u32(self.cap.max_send_wr)
            .u32(self.cap.max_recv_wr)
            .u32(self.cap.max_send_sge)
            .u32(self.cap.max_recv_sge)
            .u32(self.cap.max_inline_data);
        write_ah(w, &self.alt_ah);
        w.u16(self.alt_pkey_index)
            .u8(self.alt_port_num)
            .u8(self.alt_timeout)
            .bool(self.en_sqd_async_notify)
            .bool(self.sq_draining)
            .u32(self.rate_limit);
    }

    fn read(r: &mut Reader<'_>) -> Result<QpAttrMsg, ProtoError> {
        Ok(QpAttrMsg {
            qp_state: r.u32()?,
            path_mtu: r.u32()?,
            qkey: r.u32()?,
            rq_psn: r.u32()?,
            sq_psn: r.u32()?,
            dest_qp_num: r.u32()?,
            qp_access_flags: r.u32()?,
            pkey_index: r.u16()?,
            port_num: r.u8()?,
            max_rd_atomic: r.u8()?,
            max_dest_rd_atomic: r.u8()?,
            min_rnr_timer: r.u8()?,
            timeout: r.u8()?,
            retry_cnt: r.u8()?,
            rnr_retry: r.u8()?,
            dgid: r.array()?,
            sgid_index: r.u8()?,
            hop_limit: r.u8()?,
            traffic_class: r.u8()?,
            flow_label: r.u32()?,
            cur_qp_state: r.u32()?,
            path_mig_state: r.u32()?,
            cap: QpCapMsg {
                max_send_wr: r.u32()?,
                max_recv_wr: r.u32()?,
                max_send_sge: r.u32()?,
                max_recv_sge: r.u32()?,
                max_inline_data: r.u32()?,
            },
            alt_ah: read_ah(r)?,
            alt_pkey_index: r.u16()?,
            alt_port_num: r.u8()?,
            alt_timeout: r.u8()?,
            en_sqd_async_notify: r.bool()?,
            sq_draining: r.bool()?,
            rate_limit: r.u32()?,
        })
    }
}

/// Queue sizes and type of a new QP (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInitMsg {
    /// Client handle of the PD.
    pub pd: u32,
    /// Client handle of the send CQ.
    pub send_cq: u32,
    /// Client handle of the receive CQ.
    pub recv_cq: u32,
    /// `IBV_QPT_*` (RC 2, UC 3, UD 4).
    pub qp_type: u32,
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
    /// Every send WR is signaled.
    pub sq_sig_all: bool,
}

/// A device the daemon serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Index used in requests.
    pub index: u32,
    /// Name (`srxe0`...).
    pub name: String,
    /// Addresses (GID table order).
    pub addrs: Vec<IpAddr>,
    /// UDP port it receives RoCEv2 on.
    pub port: u16,
}

/// The device attributes a client needs (`ibv_device_attr` subset).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceAttrMsg {
    /// Node GUID.
    pub node_guid: u64,
    /// Largest MR.
    pub max_mr_size: u64,
    /// QPs.
    pub max_qp: u32,
    /// WRs per queue.
    pub max_qp_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// CQs.
    pub max_cq: u32,
    /// CQEs per CQ.
    pub max_cqe: u32,
    /// MRs.
    pub max_mr: u32,
    /// PDs.
    pub max_pd: u32,
    /// Outstanding READ/ATOMIC per QP as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding READ/ATOMIC per QP as requester.
    pub max_qp_init_rd_atom: u32,
    /// 0 none, 1 HCA, 2 global (`ibv_atomic_cap`).
    pub atomic_cap: u32,
    /// Ports.
    pub phys_port_cnt: u8,
    /// Firmware version string.
    pub fw_ver: String,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Supported page sizes.
    pub page_size_cap: u64,
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// SGEs per RDMA READ WR.
    pub max_sge_rd: u32,
    /// READ/ATOMIC resources of the device as responder.
    pub max_res_rd_atom: u32,
    /// Inline bytes per send WR.
    pub max_inline_data: u32,
    /// SRQs.
    pub max_srq: u32,
    /// WRs per SRQ.
    pub max_srq_wr: u32,
    /// SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// Memory windows.
    pub max_mw: u32,
    /// Address handles.
    pub max_ah: u32,
    /// P_Keys.
    pub max_pkeys: u16,
}

/// The port attributes a client needs (`ibv_port_attr` subset).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortAttrMsg {
    /// 1 down, 4 active (`ibv_port_state`).
    pub state: u32,
    /// Largest MTU, bytes.
    pub max_mtu: u32,
    /// Active MTU, bytes.
    pub active_mtu: u32,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Largest message.
    pub max_msg_sz: u32,
}

macro_rules! kinds {
    ($($(#[$doc:meta])* $name:ident = $v:literal,)*) => {
        /// Request kinds.
        pub mod kind {
            $( $(#[$doc])* pub const $name: u16 = $v; )*
        }
    };
}

kinds! {
    /// [`super::Request::Hello`].
    HELLO = 1,
    /// [`super::Request::ListDevices`].
    LIST_DEVICES = 2,
    /// [`super::Request::QueryDevice`].
    QUERY_DEVICE = 3,
    /// [`super::Request::QueryPort`].
    QUERY_PORT = 4,
    /// [`super::Request::QueryGid`].
    QUERY_GID = 5,
    /// [`super::Request::AllocPd`].
    ALLOC_PD = 6,
    /// [`super::Request::DeallocPd`].
    DEALLOC_PD = 7,
    /// [`super::Request::RegMr`].
    REG_MR = 8,
    /// [`super::Request::DeregMr`].
    DEREG_MR = 9,
    /// [`super::Request::CreateCq`].
    CREATE_CQ = 10,
    /// [`super::Request::DestroyCq`].
    DESTROY_CQ = 11,
    /// [`super::Request::CreateQp`].
    CREATE_QP = 12,
    /// [`super::Request::ModifyQp`].
    MODIFY_QP = 13,
    /// [`super::Request::QueryQp`].
    QUERY_QP = 14,
    /// [`super::Request::DestroyQp`].
    DESTROY_QP = 15,
    /// [`super::Request::PostSend`].
    POST_SEND = 16,
    /// [`super::Request::PostRecv`].
    POST_RECV = 17,
    /// [`super::Request::PollCq`].
    POLL_CQ = 18,
    /// [`super::Request::Stat`].
    STAT = 19,
    /// [`super::Request::AttachCqRing`].
    ATTACH_CQ_RING = 20,
    /// [`super::Request::CreateSrq`].
    CREATE_SRQ = 21,
    /// [`super::Request::DestroySrq`].
    DESTROY_SRQ = 22,
    /// [`super::Request::PostSrqRecv`].
    POST_SRQ_RECV = 23,
    /// [`super::Request::SrqLen`].
    SRQ_LEN = 24,
    /// [`super::Request::CqLen`].
    CQ_LEN = 25,
    /// [`super::Request::CreateAh`].
    CREATE_AH = 26,
    /// [`super::Request::DestroyAh`].
    DESTROY_AH = 27,
    // 28 was POST_SEND_UD before version 3: a UD post is a POST_SEND whose WQE says so.
    /// [`super::Request::CreateQpWithSrq`].
    CREATE_QP_WITH_SRQ = 29,
    /// [`super::Request::ReqNotifyCq`].
    REQ_NOTIFY_CQ = 30,
    /// [`super::Request::CqChannel`].
    CQ_CHANNEL = 31,
    /// [`super::Request::GetAsyncEvents`].
    GET_ASYNC_EVENTS = 32,
    /// [`super::Request::AsyncEventChannel`].
    ASYNC_EVENT_CHANNEL = 33,
    /// [`super::Request::AllocMw`].
    ALLOC_MW = 34,
    /// [`super::Request::DeallocMw`].
    DEALLOC_MW = 35,
    /// [`super::Request::QueryMw`].
    QUERY_MW = 36,
    /// [`super::Request::BindMw`].
    BIND_MW = 37,
    /// [`super::Request::ModifySrq`].
    MODIFY_SRQ = 38,
    /// [`super::Request::QuerySrq`].
    QUERY_SRQ = 39,
    /// [`super::Request::AttachWorkRing`].
    ATTACH_WORK_RING = 40,
    /// [`super::Request::Doorbell`].
    DOORBELL = 41,
    /// [`super::Request::RegMrShared`].
    REG_MR_SHARED = 42,
    /// [`super::Request::ResizeCq`].
    RESIZE_CQ = 43,
    /// [`super::Request::ReregMr`].
    REREG_MR = 44,
}

/// A request from a client. Handles (`pd`, `cq`, `mr`, `qp`) are the connection's own
/// numbers, meaningless on any other connection.
#[derive(Debug, Clone, PartialEq, Eq)]
// Exhaustive on purpose: both ends handle every message of their protocol version.
pub enum Request {
    /// Open the session; the daemon answers with its version.
    Hello {
        /// The client's protocol version.
        version: u16,
    },
    /// The devices the daemon serves.
    ListDevices,
    /// `ibv_query_device`.
    QueryDevice {
        /// Device index.
        dev: u32,
    },
    /// `ibv_query_port`.
    QueryPort {
        /// Device index.
        dev: u32,
        /// Port number (1).
        port: u8,
    },
    /// `ibv_query_gid`.
    QueryGid {
        /// Device index.
        dev: u32,
        /// Port number (1).
        port: u8,
        /// GID index.
        index: u32,
    },
    /// `ibv_alloc_pd`.
    AllocPd {
        /// Device index.
        dev: u32,
    },
    /// `ibv_dealloc_pd`.
    DeallocPd {
        /// PD handle.
        pd: u32,
    },
    /// `ibv_reg_mr` over the client's own memory.
    RegMr {
        /// PD handle.
        pd: u32,
        /// Start address in the client.
        addr: u64,
        /// Length in bytes.
        length: u64,
        /// `ibv_access_flags`.
        access: u32,
    },
    /// `ibv_reg_mr` over the client's memory that is a shared mapping of a sealed memfd, which
    /// rides on this message (SCM_RIGHTS): the daemon maps it too and copies with plain memory
    /// copies ([`crate::shm`]). Refused unless the client has byte `offset` of that file
    /// mapped at `addr` for all `length` bytes, and the file cannot shrink.
    RegMrShared {
        /// PD handle.
        pd: u32,
        /// Start address in the client.
        addr: u64,
        /// Length in bytes.
        length: u64,
        /// `ibv_access_flags`.
        access: u32,
        /// Offset in the file of the byte at `addr`.
        offset: u64,
    },
    /// `ibv_rereg_mr` (answered with [`Response::Mr`]): change a region's translation (to
    /// the client's own memory at `addr`), PD or access in place.
    ReregMr {
        /// MR handle.
        mr: u32,
        /// `IBV_REREG_MR_CHANGE_*` bits (TRANSLATION 1, PD 2, ACCESS 4).
        flags: u32,
        /// PD handle (with CHANGE_PD).
        pd: u32,
        /// Start address in the client (with CHANGE_TRANSLATION).
        addr: u64,
        /// Length in bytes (with CHANGE_TRANSLATION).
        length: u64,
        /// `ibv_access_flags` (with CHANGE_ACCESS).
        access: u32,
    },
    /// `ibv_dereg_mr`.
    DeregMr {
        /// MR handle.
        mr: u32,
    },
    /// `ibv_create_cq`.
    CreateCq {
        /// Device index.
        dev: u32,
        /// Minimum number of entries.
        cqe: u32,
    },
    /// `ibv_destroy_cq`.
    DestroyCq {
        /// CQ handle.
        cq: u32,
    },
    /// `ibv_create_qp`.
    CreateQp(QpInitMsg),
    /// `ibv_modify_qp`.
    ModifyQp {
        /// QP handle.
        qp: u32,
        /// `ibv_qp_attr_mask` bits.
        mask: u32,
        /// The attributes the mask selects.
        attr: QpAttrMsg,
    },
    /// `ibv_query_qp`.
    QueryQp {
        /// QP handle.
        qp: u32,
    },
    /// `ibv_destroy_qp`.
    DestroyQp {
        /// QP handle.
        qp: u32,
    },
    /// `ibv_post_send` of one WR (RC, UC or UD), the same entry a send ring carries.
    PostSend {
        /// QP handle.
        qp: u32,
        /// The work request as a send entry ([`crate::wqe::encode_send`]).
        wqe: Vec<u8>,
    },
    /// `ibv_post_recv` of one WR, the same entry a receive ring carries.
    PostRecv {
        /// QP handle.
        qp: u32,
        /// The work request as a receive entry ([`crate::wqe::encode_recv`]).
        wqe: Vec<u8>,
    },
    /// `ibv_poll_cq`.
    PollCq {
        /// CQ handle.
        cq: u32,
        /// Most completions to return.
        max: u32,
    },
    /// The daemon's counters and each device's.
    Stat,
    /// Deliver `cq`'s completions into a shared-memory ring of `capacity` entries
    /// ([`crate::ring`], [`crate::wqe::Cqe`] entries) instead of [`Request::PollCq`];
    /// the answer carries the ring's memfd (SCM_RIGHTS).
    AttachCqRing {
        /// CQ handle.
        cq: u32,
        /// Entries (a power of two).
        capacity: u32,
    },
    /// `ibv_create_srq`.
    CreateSrq {
        /// PD handle.
        pd: u32,
        /// Receive WRs it holds.
        max_wr: u32,
        /// SGEs per receive WR.
        max_sge: u32,
    },
    /// `ibv_destroy_srq`.
    DestroySrq {
        /// SRQ handle.
        srq: u32,
    },
    /// `ibv_post_srq_recv` of one WR, the same entry an SRQ ring carries.
    PostSrqRecv {
        /// SRQ handle.
        srq: u32,
        /// The work request as a receive entry ([`crate::wqe::encode_recv`]).
        wqe: Vec<u8>,
    },
    /// Receive WRs waiting in an SRQ (answered with [`Response::Count`]).
    SrqLen {
        /// SRQ handle.
        srq: u32,
    },
    /// Completions waiting in a CQ (answered with [`Response::Count`]).
    CqLen {
        /// CQ handle.
        cq: u32,
    },
    /// `ibv_resize_cq` (answered with [`Response::Count`]: the size it has now).
    ResizeCq {
        /// CQ handle.
        cq: u32,
        /// Completions it must hold.
        cqe: u32,
    },
    /// `ibv_create_ah` (RoCE: always global).
    CreateAh {
        /// PD handle.
        pd: u32,
        /// The address vector.
        ah: AhMsg,
    },
    /// `ibv_destroy_ah`.
    DestroyAh {
        /// AH handle.
        ah: u32,
    },
    /// `ibv_create_qp` taking receives from an SRQ.
    CreateQpWithSrq {
        /// Queue sizes and type.
        init: QpInitMsg,
        /// SRQ handle.
        srq: u32,
    },
    /// `ibv_req_notify_cq`: signal the CQ's channel ([`Request::CqChannel`]) at its next
    /// (solicited) completion.
    ReqNotifyCq {
        /// CQ handle.
        cq: u32,
        /// Only solicited or error completions.
        solicited_only: bool,
    },
    /// A completion channel for `cq`: the answer carries an eventfd (SCM_RIGHTS) that the
    /// daemon signals whenever an armed notification of the CQ fires.
    CqChannel {
        /// CQ handle.
        cq: u32,
    },
    /// Take the asynchronous events of this connection's objects (answered with
    /// [`Response::AsyncEvents`]).
    GetAsyncEvents,
    /// An event channel for this connection: the answer carries an eventfd (SCM_RIGHTS) the
    /// daemon signals whenever any device raises an asynchronous event (then ask with
    /// [`Request::GetAsyncEvents`]; an event of another connection's object is a spurious
    /// wakeup).
    AsyncEventChannel,
    /// `ibv_alloc_mw` (answered with [`Response::Mw`]).
    AllocMw {
        /// PD handle.
        pd: u32,
        /// 1 or 2 (`IBV_MW_TYPE_*`).
        mw_type: u8,
    },
    /// `ibv_dealloc_mw`.
    DeallocMw {
        /// MW handle.
        mw: u32,
    },
    /// The window's current rkey and whether it is bound (answered with [`Response::Mw`]).
    QueryMw {
        /// MW handle.
        mw: u32,
    },
    /// `ibv_bind_mw` of a type 1 window (answered with [`Response::Mw`]: the rkey it will
    /// have once bound).
    BindMw {
        /// QP handle the bind is posted on.
        qp: u32,
        /// Returned in the completion.
        wr_id: u64,
        /// MW handle.
        mw: u32,
        /// The bind.
        bind: MwBindMsg,
        /// Complete with a CQE.
        signaled: bool,
    },
    /// `ibv_modify_srq`.
    ModifySrq {
        /// SRQ handle.
        srq: u32,
        /// `ibv_srq_attr_mask` bits (MAX_WR 1, LIMIT 2).
        mask: u32,
        /// Receive WRs it holds (with MAX_WR).
        max_wr: u32,
        /// Limit to arm (with LIMIT).
        srq_limit: u32,
    },
    /// `ibv_query_srq` (answered with [`Response::SrqAttr`]).
    QuerySrq {
        /// SRQ handle.
        srq: u32,
    },
    /// Take posts to a QP's send or receive queue, or to an SRQ, from a shared-memory ring
    /// of `capacity` entries ([`crate::ring`]; entries as [`crate::wqe`] lays them out, sized
    /// by the daemon for the queue's capabilities) as well as by request; the answer
    /// carries the ring's memfd (SCM_RIGHTS). The client produces, the daemon consumes.
    AttachWorkRing {
        /// Which queue: [`wq::SQ`], [`wq::RQ`] or [`wq::SRQ`].
        queue: u8,
        /// QP handle (SQ, RQ) or SRQ handle.
        handle: u32,
        /// Entries (a power of two).
        capacity: u32,
    },
    /// The doorbell of device `dev`: the answer carries an eventfd (SCM_RIGHTS) to write
    /// after pushing into a work ring whose wakeup word says the daemon sleeps.
    Doorbell {
        /// Device index.
        dev: u32,
    },
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

/// An address vector (`ibv_ah_attr` with its GRH) as [`Request::CreateAh`] carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AhMsg {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label.
    pub flow_label: u32,
}

/// One asynchronous event (`ibv_async_event`) as [`Response::AsyncEvents`] carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsyncEventMsg {
    /// What happened: one of the `EV_*` constants of [`AsyncEventMsg`].
    pub kind: u8,
    /// The object: a QP number, or the connection's CQ or SRQ handle, or a port number.
    pub id: u32,
}

impl AsyncEventMsg {
    /// `IBV_EVENT_CQ_ERR` (`id`: CQ handle).
    pub const EV_CQ_ERR: u8 = 1;
    /// `IBV_EVENT_SQ_DRAINED` (`id`: QPN).
    pub const EV_SQ_DRAINED: u8 = 2;
    /// `IBV_EVENT_QP_FATAL` (`id`: QPN).
    pub const EV_QP_FATAL: u8 = 3;
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` (`id`: SRQ handle).
    pub const EV_SRQ_LIMIT_REACHED: u8 = 4;
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` (`id`: QPN).
    pub const EV_QP_LAST_WQE_REACHED: u8 = 5;
    /// `IBV_EVENT_PORT_ACTIVE` (`id`: port).
    pub const EV_PORT_ACTIVE: u8 = 6;
    /// `IBV_EVENT_PORT_ERR` (`id`: port).
    pub const EV_PORT_ERR: u8 = 7;
}

/// Most asynchronous events in one answer.
pub const MAX_EVENTS: usize = 4096;

fn write_bind(w: &mut Writer, b: &MwBindMsg) {
    w.u32(b.mr).u64(b.addr).u64(b.length).u32(b.access);
}

fn read_bind(r: &mut Reader<'_>) -> Result<MwBindMsg, ProtoError> {
    Ok(MwBindMsg {
        mr: r.u32()?,
        addr: r.u64()?,
        length: r.u64()?,
        access: r.u32()?,
    })
}

fn write_qp_init(w: &mut Writer, q: &QpInitMsg) {
    w.u32(q.pd)
        .u32(q.send_cq)
        .u32(q.recv_cq)
        .u32(q.qp_type)
        .u32(q.max_send_wr)
        .u32(q.max_recv_wr)
        .u32(q.max_send_sge)
        .u32(q.max_recv_sge)
        .u32(q.max_inline_data)
        .bool(q.sq_sig_all);
}

fn read_qp_init(r: &mut Reader<'_>) -> Result<QpInitMsg, ProtoError> {
    Ok(QpInitMsg {
        pd: r.u32()?,
        send_cq: r.u32()?,
        recv_cq: r.u32()?,
        qp_type: r.u32()?,
        max_send_wr: r.u32()?,
        max_recv_wr: r.u32()?,
        max_send_sge: r.u32()?,
        max_recv_sge: r.u32()?,
        max_inline_data: r.u32()?,
        sq_sig_all: r.bool()?,
    })
}

impl Request {
    /// The message kind of this request.
    pub fn kind(&self) -> u16 {
        match self {
            Request::Hello { .. } => kind::HELLO,
            Request::ListDevices => kind::LIST_DEVICES,
            Request::QueryDevice { .. } => kind::QUERY_DEVICE,
            Request::QueryPort { .. } => kind::QUERY_PORT,
            Request::QueryGid { .. } => kind::QUERY_GID,
            Request::AllocPd { .. } => kind::ALLOC_PD,
            Request::DeallocPd { .. } => kind::DEALLOC_PD,
            Request::RegMr { .. } => kind::REG_MR,
            Request::RegMrShared { .. } => kind::REG_MR_SHARED,
            Request::DeregMr { .. } => kind::DEREG_MR,
            Request::ReregMr { .. } => kind::REREG_MR,
            Request::CreateCq { .. } => kind::CREATE_CQ,
            Request::DestroyCq { .. } => kind::DESTROY_CQ,
            Request::CreateQp(_) => kind::CREATE_QP,
            Request::ModifyQp { .. } => kind::MODIFY_QP,
            Request::QueryQp { .. } => kind::QUERY_QP,
            Request::DestroyQp { .. } => kind::DESTROY_QP,
            Request::PostSend { .. } => kind::POST_SEND,
            Request::PostRecv { .. } => kind::POST_RECV,
            Request::PollCq { .. } => kind::POLL_CQ,
            Request::Stat => kind::STAT,
            Request::AttachCqRing { .. } => kind::ATTACH_CQ_RING,
            Request::CreateSrq { .. } => kind::CREATE_SRQ,
            Request::DestroySrq { .. } => kind::DESTROY_SRQ,
            Request::PostSrqRecv { .. } => kind::POST_SRQ_RECV,
            Request::SrqLen { .. } => kind::SRQ_LEN,
            Request::CqLen { .. } => kind::CQ_LEN,
            Request::ResizeCq { .. } => kind::RESIZE_CQ,
            Request::CreateAh { .. } => kind::CREATE_AH,
            Request::DestroyAh { .. } => kind::DESTROY_AH,
            Request::CreateQpWithSrq { .. } => kind::CREATE_QP_WITH_SRQ,
            Request::ReqNotifyCq { .. } => kind::REQ_NOTIFY_CQ,
            Request::CqChannel { .. } => kind::CQ_CHANNEL,
            Request::GetAsyncEvents => kind::GET_ASYNC_EVENTS,
            Request::AsyncEventChannel => kind::ASYNC_EVENT_CHANNEL,
            Request::AllocMw { .. } => kind::ALLOC_MW,
            Request::DeallocMw { .. } => kind::DEALLOC_MW,
            Request::QueryMw { .. } => kind::QUERY_MW,
            Request::BindMw { .. } => kind::BIND_MW,
            Request::ModifySrq { .. } => kind::MODIFY_SRQ,
            Request::QuerySrq { .. } => kind::QUERY_SRQ,
            Request::AttachWorkRing { .. } => kind::ATTACH_WORK_RING,
            Request::Doorbell { .. } => kind::DOORBELL,
        }
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
        match self {
            Request::ReregMr {
                mr,
                flags,
                pd,
                addr,
                length,
                access,
            } => {
                w.u32(*mr)
                    .u32(*flags)
                    .u32(*pd)
                    .u64(*addr)
                    .u64(*length)
                    .u32(*access);
            }
            Request::Hello { version } => {
                w.u16(*version);
            }
            Request::ListDevices | Request::Stat => {}
            Request::QueryDevice { dev } | Request::AllocPd { dev } => {
                w.u32(*dev);
            }
            Request::QueryPort { dev, port } => {
                w.u32(*dev).u8(*port);
            }
            Request::QueryGid { dev, port, index } => {
                w.u32(*dev).u8(*port).u32(*index);
            }
            Request::DeallocPd { pd: h }
            | Request::DeregMr { mr: h }
            | Request::DestroyCq { cq: h }
            | Request::QueryQp { qp: h }
            | Request::DestroyQp { qp: h } => {
                w.u32(*h);
            }
            Request::RegMr {
                pd,
                addr,
                length,
                access,
            } => {
                w.u32(*pd).u64(*addr).u64(*length).u32(*access);
            }
            Request::RegMrShared {
                pd,
                addr,
                length,
                access,
                offset,
            } => {
                w.u32(*pd).u64(*addr).u64(*length).u32(*access).u64(*offset);
            }
            Request::CreateCq { dev, cqe } => {
                w.u32(*dev).u32(*cqe);
            }
            Request::ResizeCq { cq, cqe } => {
                w.u32(*cq).u32(*cqe);
            }
            Request::CreateQp(q) => {
                write_qp_init(&mut w, q);
            }
            Request::ModifyQp { qp, mask, attr } => {
                w.u32(*qp).u32(*mask);
                attr.write(&mut w);
            }
            Request::PostSend { qp: h, wqe }
            | Request::PostRecv { qp: h, wqe }
            | Request::PostSrqRecv { srq: h, wqe } => {
                w.u32(*h).blob(wqe);
            }
            Request::PollCq { cq, max } => {
                w.u32(*cq).u32(*max);
            }
            Request::AttachCqRing { cq, capacity } => {
                w.u32(*cq).u32(*capacity);
            }
            Request::CreateSrq {
                pd,
                max_wr,
                max_sge,
            } => {
                w.u32(*pd).u32(*max_wr).u32(*max_sge);
            }
            Request::DestroySrq { srq: h }
            | Request::SrqLen { srq: h }
            | Request::CqLen { cq: h }
            | Request::DestroyAh { ah: h }
            | Request::CqChannel { cq: h } => {
                w.u32(*h);
            }
            Request::CreateAh { pd, ah } => {
                w.u32(*pd);
                write_ah(&mut w, ah);
            }
            Request::CreateQpWithSrq { init, srq } => {
                write_qp_init(&mut w, init);
                w.u32(*srq);
            }
            Request::ReqNotifyCq { cq, solicited_only } => {
                w.u32(*cq).bool(*solicited_only);
            }
            Request::GetAsyncEvents | Request::AsyncEventChannel => {}
            Request::AllocMw { pd, mw_type } => {
                w.u32(*pd).u8(*mw_type);
            }
            Request::DeallocMw { mw: h }
            | Request::QueryMw { mw: h }
            | Request::QuerySrq { srq: h }
            | Request::Doorbell { dev: h } => {
                w.u32(*h);
            }
            Request::AttachWorkRing {
                queue,
                handle,
                capacity,
            } => {
                w.u8(*queue).u32(*handle).u32(*capacity);
            }
            Request::ModifySrq {
                srq,
                mask,
                max_wr,
                srq_limit,
            } => {
                w.u32(*srq).u32(*mask).u32(*max_wr).u32(*srq_limit);
            }
            Request::BindMw {
                qp,
                wr_id,
                mw,
                bind,
                signaled,
            } => {
                w.u32(*qp).u64(*wr_id).u32(*mw);
                write_bind(&mut w, bind);
                w.bool(*signaled);
            }
        }
        w.buf
    }

    /// The whole framed message.
    pub fn encode(&self, id: u32) -> Vec<u8> {
        frame(self.kind(), id, &self.encode_body())
    }

    /// Decode a request body of `kind`; every byte must be used.
    pub fn decode(kind: u16, body: &[u8]) -> Result<Request, ProtoError> {
        let mut r = Reader::new(body);
        let req = match kind {
            kind::HELLO => Request::Hello { version: r.u16()? },
            kind::LIST_DEVICES => Request::ListDevices,
            kind::STAT => Request::Stat,
            kind::QUERY_DEVICE => Request::QueryDevice { dev: r.u32()? },
            kind::ALLOC_PD => Request::AllocPd { dev: r.u32()? },
            kind::QUERY_PORT => Request::QueryPort {
                dev: r.u32()?,
                port: r.u8()?,
            },
            kind::QUERY_GID => Request::QueryGid {
                dev: r.u32()?,
                port: r.u8()?,
                index: r.u32()?,
            },
            kind::DEALLOC_PD => Request::DeallocPd { pd: r.u32()? },
            kind::DEREG_MR => Request::DeregMr { mr: r.u32()? },
            kind::REREG_MR => Request::ReregMr {
                mr: r.u32()?,
                flags: r.u32()?,
                pd: r.u32()?,
                addr: r.u64()?,
                length: r.u64()?,
                access: r.u32()?,
            },
            kind::DESTROY_CQ => Request::DestroyCq { cq: r.u32()? },
            kind::QUERY_QP => Request::QueryQp { qp: r.u32()? },
            kind::DESTROY_QP => Request::DestroyQp { qp: r.u32()? },
            kind::REG_MR => Request::RegMr {
                pd: r.u32()?,
                addr: r.u64()?,
                length: r.u64()?,
                access: r.u32()?,
            },
            kind::REG_MR_SHARED => Request::RegMrShared {
                pd: r.u32()?,
                addr: r.u64()?,
                length: r.u64()?,
                access: r.u32()?,
                offset: r.u64()?,
            },
            kind::CREATE_CQ => Request::CreateCq {
                dev: r.u32()?,
                cqe: r.u32()?,
            },
            kind::RESIZE_CQ => Request::ResizeCq {
                cq: r.u32()?,
                cqe: r.u32()?,
            },
            kind::CREATE_QP => Request::CreateQp(read_qp_init(&mut r)?),
            kind::MODIFY_QP => Request::ModifyQp {
                qp: r.u32()?,
                mask: r.u32()?,
                attr: QpAttrMsg::read(&mut r)?,
            },
            kind::POST_SEND => Request::PostSend {
                qp: r.u32()?,
                wqe: r.blob()?.to_vec(),
            },
            kind::POST_RECV => Request::PostRecv {
                qp: r.u32()?,
                wqe: r.blob()?.to_vec(),
            },
            kind::POLL_CQ => Request::PollCq {
                cq: r.u32()?,
                max: r.u32()?,
            },
            kind::ATTACH_CQ_RING => Request::AttachCqRing {
                cq: r.u32()?,
                capacity: r.u32()?,
            },
            kind::CREATE_SRQ => Request::CreateSrq {
                pd: r.u32()?,
                max_wr: r.u32()?,
                max_sge: r.u32()?,
            },
            kind::DESTROY_SRQ => Request::DestroySrq { srq: r.u32()? },
            kind::POST_SRQ_RECV => Request::PostSrqRecv {
                srq: r.u32()?,
                wqe: r.blob()?.to_vec(),
            },
            kind::SRQ_LEN => Request::SrqLen { srq: r.u32()? },
            kind::CQ_LEN => Request::CqLen { cq: r.u32()? },
            kind::CREATE_AH => Request::CreateAh {
                pd: r.u32()?,
                ah: read_ah(&mut r)?,
            },
            kind::DESTROY_AH => Request::DestroyAh { ah: r.u32()? },
            kind::CREATE_QP_WITH_SRQ => Request::CreateQpWithSrq {
                init: read_qp_init(&mut r)?,
                srq: r.u32()?,
            },
            kind::REQ_NOTIFY_CQ => Request::ReqNotifyCq {
                cq: r.u32()?,
                solicited_only: r.bool()?,
            },
            kind::CQ_CHANNEL => Request::CqChannel { cq: r.u32()? },
            kind::GET_ASYNC_EVENTS => Request::GetAsyncEvents,
            kind::ASYNC_EVENT_CHANNEL => Request::AsyncEventChannel,
            kind::ALLOC_MW => Request::AllocMw {
                pd: r.u32()?,
                mw_type: r.u8()?,
            },
            kind::DEALLOC_MW => Request::DeallocMw { mw: r.u32()? },
            kind::MODIFY_SRQ => Request::ModifySrq {
                srq: r.u32()?,
                mask: r.u32()?,
                max_wr: r.u32()?,
                srq_limit: r.u32()?,
            },
            kind::QUERY_SRQ => Request::QuerySrq { srq: r.u32()? },
            kind::ATTACH_WORK_RING => Request::AttachWorkRing {
                queue: r.u8()?,
                handle: r.u32()?,
                capacity: r.u32()?,
            },
            kind::DOORBELL => Request::Doorbell { dev: r.u32()? },
            kind::QUERY_MW => Request::QueryMw { mw: r.u32()? },
            kind::BIND_MW => Request::BindMw {
                qp: r.u32()?,
                wr_id: r.u64()?,
                mw: r.u32()?,
                bind: read_bind(&mut r)?,
                signaled: r.bool()?,
            },
            k => return Err(ProtoError::UnknownKind(k)),
        };
        r.finish()?;
        Ok(req)
    }
}

/// An answer from the daemon. Its kind is `RESPONSE_BIT | request kind`, or [`KIND_ERROR`].
#[derive(Debug, Clone, PartialEq, Eq)]
// Exhaustive on purpose: both ends handle every message of their protocol version.
pub enum Response {
    /// The request failed: an errno as libibverbs would return it, and why.
    Error {
        /// Positive errno (`EINVAL`, `ENOMEM`, `EFAULT`...).
        errno: i32,
        /// Human-readable reason.
        message: String,
    },
    /// Success with nothing to return.
    Done,
    /// Answer to [`Request::Hello`].
    Hello {
        /// The daemon's protocol version.
        version: u16,
        /// The daemon's pid (clients may let it trace them, e.g. `PR_SET_PTRACER`).
        pid: u32,
    },
    /// Answer to [`Request::ListDevices`].
    Devices(Vec<DeviceInfo>),
    /// Answer to [`Request::QueryDevice`].
    DeviceAttr(DeviceAttrMsg),
    /// Answer to [`Request::QueryPort`].
    PortAttr(PortAttrMsg),
    /// Answer to [`Request::QueryGid`].
    Gid([u8; 16]),
    /// A new object's handle (PD, CQ).
    Handle(u32),
    /// A new MR: handle and keys.
    Mr {
        /// Handle.
        handle: u32,
        /// Local key.
        lkey: u32,
        /// Remote key.
        rkey: u32,
    },
    /// A new QP: handle and QP number.
    Qp {
        /// Handle.
        handle: u32,
        /// QP number (what the peer puts in `dest_qp_num`).
        qpn: u32,
    },
    /// Answer to [`Request::QueryQp`].
    QpAttr(QpAttrMsg),
    /// Answer to [`Request::PollCq`].
    Completions(Vec<Cqe>),
    /// Answer to [`Request::Stat`]: named counters.
    Stat(Vec<(String, u64)>),
    /// A number of things ([`Request::CqLen`], [`Request::SrqLen`]).
    Count(u64),
    /// Answer to [`Request::GetAsyncEvents`], oldest first.
    AsyncEvents(Vec<AsyncEventMsg>),
    /// Answer to [`Request::QuerySrq`].
    SrqAttr {
        /// Receive WRs it holds.
        max_wr: u32,
        /// SGEs per receive WR.
        max_sge: u32,
        /// Armed limit (0: not armed).
        srq_limit: u32,
    },
    /// A memory window ([`Request::AllocMw`], [`Request::QueryMw`], [`Request::BindMw`]).
    Mw {
        /// Its handle.
        handle: u32,
        /// Its rkey (after a bind: the key the bind gives it).
        rkey: u32,
        /// Whether it is bound now.
        bound: bool,
    },
}

/// Tags of the [`Response`] variants inside a success body (the first byte).
mod rtag {
    pub const DONE: u8 = 0;
    pub const HELLO: u8 = 1;
    pub const DEVICES: u8 = 2;
    pub const DEVICE_ATTR: u8 = 3;
    pub const PORT_ATTR: u8 = 4;
    pub const GID: u8 = 5;
    pub const HANDLE: u8 = 6;
    pub const MR: u8 = 7;
    pub const QP: u8 = 8;
    pub const QP_ATTR: u8 = 9;
    pub const COMPLETIONS: u8 = 10;
    pub const STAT: u8 = 11;
    pub const COUNT: u8 = 12;
    pub const ASYNC_EVENTS: u8 = 13;
    pub const MW: u8 = 14;
    pub const SRQ_ATTR: u8 = 15;
}

/// Most completions in one answer.
pub const MAX_WCS: usize = 4096;
/// Most counters in one answer.
pub const MAX_COUNTERS: usize = 8192;
/// Most devices in one answer.
pub const MAX_DEVICES: usize = 1024;

impl Response {
    /// Frame this answer to request `req_kind` with id `id`.
    pub fn encode(&self, req_kind: u16, id: u32) -> Vec<u8> {
        let mut w = Writer::default();
        if let Response::Error { errno, message } = self {
            w.i32(*errno).string(message);
            return frame(KIND_ERROR, id, &w.buf);
        }
        match self {
            Response::Error { .. } => {}
            Response::Done => {
                w.u8(rtag::DONE);
            }
            Response::Hello { version, pid } => {
                w.u8(rtag::HELLO).u16(*version).u32(*pid);
            }
            Response::Devices(d) => {
                w.u8(rtag::DEVICES).count(d.len());
                for d in d {
                    w.u32(d.index)
                        .string(&d.name)
                        .u16(d.port)
                        .count(d.addrs.len());
                    for a in &d.addrs {
                        w.ip(*a);
                    }
                }
            }
            Response::DeviceAttr(a) => {
                w.u8(rtag::DEVICE_ATTR)
                    .u64(a.node_guid)
                    .u64(a.max_mr_size)
                    .u32(a.max_qp)
                    .u32(a.max_qp_wr)
                    .u32(a.max_sge)
                    .u32(a.max_cq)
                    .u32(a.max_cqe)
                    .u32(a.max_mr)
                    .u32(a.max_pd)
                    .u32(a.max_qp_rd_atom)
                    .u32(a.max_qp_init_rd_atom)
                    .u32(a.atomic_cap)
                    .u8(a.phys_port_cnt)
                    .u64(a.sys_image_guid)
                    .u64(a.page_size_cap)
                    .u32(a.vendor_id)
                    .u32(a.vendor_part_id)
                    .u32(a.hw_ver)
                    .u32(a.max_sge_rd)
                    .u32(a.max_res_rd_atom)
                    .u32(a.max_inline_data)
                    .u32(a.max_srq)
                    .u32(a.max_srq_wr)
                    .u32(a.max_srq_sge)
                    .u32(a.max_mw)
                    .u32(a.max_ah)
                    .u16(a.max_pkeys)
                    .string(&a.fw_ver);
            }
            Response::PortAttr(p) => {
                w.u8(rtag::PORT_ATTR)
                    .u32(p.state)
                    .u32(p.max_mtu)
                    .u32(p.active_mtu)
                    .u32(p.gid_tbl_len)
                    .u32(p.max_msg_sz);
            }
            Response::Gid(g) => {
                w.u8(rtag::GID);
                w.buf.extend_from_slice(g);
            }
            Response::Handle(h) => {
                w.u8(rtag::HANDLE).u32(*h);
            }
            Response::Mr { handle, lkey, rkey } => {
                w.u8(rtag::MR).u32(*handle).u32(*lkey).u32(*rkey);
            }
            Response::Qp { handle, qpn } => {
                w.u8(rtag::QP).u32(*handle).u32(*qpn);
            }
            Response::QpAttr(a) => {
                w.u8(rtag::QP_ATTR);
                a.write(&mut w);
            }
            Response::Completions(wcs) => {
                w.u8(rtag::COMPLETIONS).count(wcs.len());
                for c in wcs {
                    w.u64(c.wr_id)
                        .u32(c.status)
                        .u32(c.opcode)
                        .u32(c.vendor_err)
                        .u32(c.byte_len)
                        .u32(c.imm_data)
                        .u32(c.invalidated_rkey)
                        .u32(c.qp_num)
                        .u32(c.src_qp)
                        .u32(c.wc_flags)
                        .u16(c.pkey_index);
                }
            }
            Response::Stat(s) => {
                w.u8(rtag::STAT).count(s.len());
                for (name, v) in s {
                    w.string(name).u64(*v);
                }
            }
            Response::Count(n) => {
                w.u8(rtag::COUNT).u64(*n);
            }
            Response::AsyncEvents(evs) => {
                w.u8(rtag::ASYNC_EVENTS).count(evs.len());
                for e in evs {
                    w.u8(e.kind).u32(e.id);
                }
            }
            Response::Mw {
                handle,
                rkey,
                bound,
            } => {
                w.u8(rtag::MW).u32(*handle).u32(*rkey).bool(*bound);
            }
            Response::SrqAttr {
                max_wr,
                max_sge,
                srq_limit,
            } => {
                w.u8(rtag::SRQ_ATTR)
                    .u32(*max_wr)
                    .u32(*max_sge)
                    .u32(*srq_limit);
            }
        }
        frame(RESPONSE_BIT | req_kind, id, &w.buf)
    }

    /// Decode an answer body of message kind `kind`; every byte must be used.
    pub fn decode(kind: u16, body: &[u8]) -> Result<Response, ProtoError> {
        let mut r = Reader::new(body);
        if kind == KIND_ERROR {
            let errno = r.i32()?;
            let message = r.string()?;
            r.finish()?;
            return Ok(Response::Error { errno, message });
        }
        if kind & RESPONSE_BIT == 0 {
            return Err(ProtoError::UnknownKind(kind));
        }
        let resp = match r.u8()? {
            rtag::DONE => Response::Done,
            rtag::HELLO => Response::Hello {
                version: r.u16()?,
                pid: r.u32()?,
            },
            rtag::DEVICES => {
                let n = r.count(MAX_DEVICES, 9)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let index = r.u32()?;
                    let name = r.string()?;
                    let port = r.u16()?;
                    let na = r.count(256, 5)?;
                    let mut addrs = Vec::with_capacity(na);
                    for _ in 0..na {
                        addrs.push(r.ip()?);
                    }
                    v.push(DeviceInfo {
                        index,
                        name,
                        addrs,
                        port,
                    });
                }
                Response::Devices(v)
            }
            rtag::DEVICE_ATTR => Response::DeviceAttr(DeviceAttrMsg {
                node_guid: r.u64()?,
                max_mr_size: r.u64()?,
                max_qp: r.u32()?,
                max_qp_wr: r.u32()?,
                max_sge: r.u32()?,
                max_cq: r.u32()?,
                max_cqe: r.u32()?,
                max_mr: r.u32()?,
                max_pd: r.u32()?,
                max_qp_rd_atom: r.u32()?,
                max_qp_init_rd_atom: r.u32()?,
                atomic_cap: r.u32()?,
                phys_port_cnt: r.u8()?,
                sys_image_guid: r.u64()?,
                page_size_cap: r.u64()?,
                vendor_id: r.u32()?,
                vendor_part_id: r.u32()?,
                hw_ver: r.u32()?,
                max_sge_rd: r.u32()?,
                max_res_rd_atom: r.u32()?,
                max_inline_data: r.u32()?,
                max_srq: r.u32()?,
                max_srq_wr: r.u32()?,
                max_srq_sge: r.u32()?,
                max_mw: r.u32()?,
                max_ah: r.u32()?,
                max_pkeys: r.u16()?,
                fw_ver: r.string()?,
            }),
            rtag::PORT_ATTR => Response::PortAttr(PortAttrMsg {
                state: r.u32()?,
                max_mtu: r.u32()?,
                active_mtu: r.u32()?,
                gid_tbl_len: r.u32()?,
                max_msg_sz: r.u32()?,
            }),
            rtag::GID => Response::Gid(r.array()?),
            rtag::HANDLE => Response::Handle(r.u32()?),
            rtag::MR => Response::Mr {
                handle: r.u32()?,
                lkey: r.u32()?,
                rkey: r.u32()?,
            },
            rtag::QP => Response::Qp {
                handle: r.u32()?,
                qpn: r.u32()?,
            },
            rtag::QP_ATTR => Response::QpAttr(QpAttrMsg::read(&mut r)?),
            rtag::COMPLETIONS => {
                let n = r.count(MAX_WCS, 46)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(Cqe {
                        wr_id: r.u64()?,
                        status: r.u32()?,
                        opcode: r.u32()?,
                        vendor_err: r.u32()?,
                        byte_len: r.u32()?,
                        imm_data: r.u32()?,
                        invalidated_rkey: r.u32()?,
                        qp_num: r.u32()?,
                        src_qp: r.u32()?,
                        wc_flags: r.u32()?,
                        pkey_index: r.u16()?,
                        ..Cqe::default()
                    });
                }
                Response::Completions(v)
            }
            rtag::STAT => {
                let n = r.count(MAX_COUNTERS, 10)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    let name = r.string()?;
                    v.push((name, r.u64()?));
                }
                Response::Stat(v)
            }
            rtag::COUNT => Response::Count(r.u64()?),
            rtag::ASYNC_EVENTS => {
                let n = r.count(MAX_EVENTS, 5)?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(AsyncEventMsg {
                        kind: r.u8()?,
                        id: r.u32()?,
                    });
                }
                Response::AsyncEvents(v)
            }
            rtag::MW => Response::Mw {
                handle: r.u32()?,
                rkey: r.u32()?,
                bound: r.bool()?,
            },
            rtag::SRQ_ATTR => Response::SrqAttr {
                max_wr: r.u32()?,
                max_sge: r.u32()?,
                srq_limit: r.u32()?,
            },
            _ => return Err(ProtoError::Invalid("response tag")),
        };
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
    use proptest::prelude::*;

    fn sample_requests() -> Vec<Request> {
        vec![
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
                access: 7,
            },
            Request::RegMrShared {
                pd: 3,
                addr: 0x1000,
                length: 4096,
                access: 7,
                offset: 8192,
            },
            Request::CreateQp(QpInitMsg {
                pd: 1,
                send_cq: 2,
                recv_cq: 3,
                qp_type: 2,
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 64,
                sq_sig_all: true,
            }),
            Request::ModifyQp {
                qp: 4,
                mask: 0x1fff,
                attr: QpAttrMsg {
                    qp_state: 3,
                    dgid: [7; 16],
                    ..QpAttrMsg::default()
                },
            },
            Request::PostRecv {
                qp: 4,
                wqe: vec![1; 64],
            },
            Request::ReregMr {
                mr: 3,
                flags: 7,
                pd: 2,
                addr: 0x7f00_1234_5000,
                length: 1 << 20,
                access: 0xf,
            },
            Request::PollCq { cq: 2, max: 16 },
            Request::Stat,
            Request::CreateSrq {
                pd: 1,
                max_wr: 64,
                max_sge: 2,
            },
            Request::PostSrqRecv {
                srq: 2,
                wqe: vec![2; 32],
            },
            Request::CreateAh {
                pd: 1,
                ah: AhMsg {
                    dgid: [9; 16],
                    sgid_index: 1,
                    hop_limit: 64,
                    traffic_class: 2,
                    flow_label: 3,
                },
            },
            Request::CreateQpWithSrq {
                init: QpInitMsg {
                    pd: 1,
                    send_cq: 2,
                    recv_cq: 3,
                    qp_type: 2,
                    max_send_wr: 16,
                    max_recv_wr: 0,
                    max_send_sge: 2,
                    max_recv_sge: 2,
                    max_inline_data: 64,
                    sq_sig_all: false,
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
            Request::AllocMw { pd: 1, mw_type: 2 },
            Request::ModifySrq {
                srq: 7,
                mask: 2,
                max_wr: 0,
                srq_limit: 4,
            },
            Request::QuerySrq { srq: 7 },
            Request::BindMw {
                qp: 4,
                wr_id: 9,
                mw: 5,
                bind: MwBindMsg {
                    mr: 6,
                    addr: 0x1000,
                    length: 64,
                    access: 2,
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
    fn responses_round_trip() {
        let rs = vec![
            Response::Error {
                errno: 22,
                message: "nope".into(),
            },
            Response::Done,
            Response::Devices(vec![DeviceInfo {
                index: 0,
                name: "srxe0".into(),
                addrs: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
                port: 4791,
            }]),
            Response::Completions(vec![Cqe {
                wr_id: 1,
                byte_len: 5,
                ..Cqe::default()
            }]),
            Response::Stat(vec![("a".into(), 1), ("b".into(), 2)]),
            Response::Mr {
                handle: 1,
                lkey: 2,
                rkey: 3,
            },
            Response::Count(7),
            Response::AsyncEvents(vec![AsyncEventMsg {
                kind: AsyncEventMsg::EV_QP_FATAL,
                id: 0x11,
            }]),
            Response::Mw {
                handle: 3,
                rkey: 0x300,
                bound: true,
            },
            Response::SrqAttr {
                max_wr: 64,
                max_sge: 2,
                srq_limit: 4,
            },
        ];
        for r in rs {
            let bytes = r.encode(kind::STAT, 5);
            let (h, body) = split_message(&bytes).unwrap().unwrap();
            assert_eq!(Response::decode(h.kind, body).unwrap(), r);
        }
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
        h[4] = 9;
        assert_eq!(Header::parse(&h), Err(ProtoError::BadVersion(9)));
        h[0] = 0;
        assert!(matches!(Header::parse(&h), Err(ProtoError::BadMagic(_))));
    }

    #[test]
    fn a_lying_count_does_not_allocate_or_panic() {
        // PostRecv claiming a WQE of 4 GiB with 8 bytes present.
        let mut w = Writer::default();
        w.u32(1).u32(u32::MAX).u64(2);
        assert_eq!(
            Request::decode(kind::POST_RECV, &w.buf),
            Err(ProtoError::Truncated)
        );
        // Stat answer claiming 2^32 counters.
        let mut w = Writer::default();
        w.u8(rtag::STAT).u32(u32::MAX);
        assert!(Response::decode(kind::STAT | RESPONSE_BIT, &w.buf).is_err());
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
        fn mutated_valid_messages_never_panic(i in 0usize..11, pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
            let reqs = sample_requests();
            let mut bytes = reqs[i % reqs.len()].encode(1);
            let p = pos.index(bytes.len());
            bytes[p] = byte;
            if let Ok(Some((h, body))) = split_message(&bytes) {
                let _ = Request::decode(h.kind, body);
            }
        }
    }
}
