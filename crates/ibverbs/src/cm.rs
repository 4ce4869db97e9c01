//! The private `softrdma_cm_*` interface for the drop-in `librdmacm.so.1`
//! ([`abi::cm_ffi`] has the records and the table of calls): the device's connection
//! manager ([`softrdma::RawCmChannel`]) behind a C ABI, bound to the standalone version
//! node `SOFTRDMA_PRIVATE_1`.
//!
//! librdmacm must not link a second copy of the device stack, so it reaches the CM through
//! this library, which the program has loaded anyway. Each open context gets one CM channel
//! (made by `softrdma_cm_open`, closed with the context): every listen and connection of
//! the context goes through it, and its descriptor is readable while events wait.

use core::ffi::{c_int, c_void};
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::{Arc, Mutex};

use abi::cm_ffi::{self, event, CmAddr, CmEventRec, CmParam};
use softrdma::cm::{CmEvent, CommId, ConnParam, ServiceId};
use softrdma::raw::RejectReason;
use softrdma::RawCmChannel;

use crate::abi::{ibv_context, ibv_qp, ibv_qp_attr};
use crate::device::{ctx, Ctx};
use crate::verbs::{qp_attr_to_c, Qp};
use softrdma::QpState;

/// The CM channel of each open context that asked for one, by context address.
static CHANNELS: Mutex<Option<HashMap<usize, Arc<RawCmChannel>>>> = Mutex::new(None);

/// The channel of context `c`, if `softrdma_cm_open` made one.
fn channel(c: *mut ibv_context) -> Result<(&'static Ctx, Arc<RawCmChannel>), c_int> {
    // SAFETY: `c` is NULL or a context a program (librdmacm) got from ibv_open_device.
    let cx = unsafe { ctx(c) }.ok_or(libc::EINVAL)?;
    let g = CHANNELS.lock().unwrap_or_else(|p| p.into_inner());
    let ch = g
        .as_ref()
        .and_then(|m| m.get(&(c as usize)))
        .cloned()
        .ok_or(libc::EINVAL)?;
    Ok((cx, ch))
}

/// Forget context `c`'s channel (its listens end, its connections are torn down): called
/// when the context closes.
pub(crate) fn forget(c: *mut ibv_context) {
    let mut g = CHANNELS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = g.as_mut() {
        m.remove(&(c as usize));
    }
}

/// The QP behind `qp`, if it belongs to context `c`; NULL is no QP (the caller moves
/// its QP itself).
fn qp_of(c: *mut ibv_context, qp: *mut ibv_qp) -> Result<Option<softrdma::QpHandle>, c_int> {
    if qp.is_null() {
        return Ok(None);
    }
    // SAFETY: a non-NULL QP comes from ibv_create_qp (a Qp with the ibv_qp first).
    let q = unsafe { &*(qp as *const Qp) };
    if q.ibv.context != c {
        return Err(libc::EINVAL);
    }
    Ok(Some(q.handle))
}

fn conn_param(p: *const CmParam) -> Result<ConnParam, c_int> {
    // SAFETY: NULL or the caller's record.
    let p = unsafe { p.as_ref() }.ok_or(libc::EINVAL)?;
    let mut c = ConnParam::default();
    c.private_data = p.private_data().to_vec();
    c.responder_resources = p.responder_resources;
    c.initiator_depth = p.initiator_depth;
    c.retry_count = p.retry_count;
    c.rnr_retry_count = p.rnr_retry_count;
    // 0: the device's defaults (the record cannot say "unset" otherwise).
    if p.ack_timeout != 0 {
        c.ack_timeout = p.ack_timeout;
    }
    if p.min_rnr_timer != 0 {
        c.min_rnr_timer = p.min_rnr_timer;
    }
    c.src_port = p.src_port;
    c.qp_num = p.qp_num;
    c.ece = p.ece;
    Ok(c)
}

/// `len` bytes at `data` (empty for 0).
///
/// # Safety
/// `data` holds `len` bytes when `len > 0`.
unsafe fn bytes<'a>(data: *const c_void, len: u8) -> Result<&'a [u8], c_int> {
    if len == 0 {
        return Ok(&[]);
    }
    if data.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's `len` bytes.
    Ok(unsafe { std::slice::from_raw_parts(data as *const u8, usize::from(len)) })
}

fn code(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => e,
    }
}

#[no_mangle]
pub extern "C" fn softrdma_cm_abi_version() -> u32 {
    cm_ffi::ABI_VERSION
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_open(c: *mut ibv_context) -> c_int {
    // SAFETY: as in `channel`.
    let Some(cx) = (unsafe { ctx(c) }) else {
        return -libc::EINVAL;
    };
    let mut g = CHANNELS.lock().unwrap_or_else(|p| p.into_inner());
    let m = g.get_or_insert_with(HashMap::new);
    if let Some(ch) = m.get(&(c as usize)) {
        return ch.fd().as_raw_fd();
    }
    match cx.raw().cm_channel() {
        Ok(ch) => {
            let fd = ch.fd().as_fd().as_raw_fd();
            m.insert(c as usize, Arc::new(ch));
            fd
        }
        Err(e) => -e.errno(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_listen(c: *mut ibv_context, service_id: u64) -> c_int {
    code(channel(c).and_then(|(_, ch)| ch.listen(ServiceId(service_id)).map_err(|e| e.errno())))
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_unlisten(c: *mut ibv_context, service_id: u64) -> c_int {
    code(channel(c).and_then(|(_, ch)| ch.unlisten(ServiceId(service_id)).map_err(|e| e.errno())))
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_connect(
    c: *mut ibv_context,
    qp: *mut ibv_qp,
    peer: *const CmAddr,
    service_id: u64,
    param: *const CmParam,
    comm_id: *mut u32,
) -> c_int {
    code((|| {
        let (_, ch) = channel(c)?;
        let q = qp_of(c, qp)?;
        // SAFETY: NULL or the caller's record.
        let peer = unsafe { peer.as_ref() }.ok_or(libc::EINVAL)?;
        if comm_id.is_null() {
            return Err(libc::EINVAL);
        }
        let p = conn_param(param)?;
        let id = ch
            .connect(q, peer.ip(), ServiceId(service_id), &p)
            .map_err(|e| e.errno())?;
        // SAFETY: the caller's out-pointer (checked).
        unsafe { *comm_id = id.0 };
        Ok(())
    })())
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_resolve(
    c: *mut ibv_context,
    peer: *const CmAddr,
    service_id: u64,
    param: *const CmParam,
    comm_id: *mut u32,
) -> c_int {
    code((|| {
        let (_, ch) = channel(c)?;
        // SAFETY: NULL or the caller's record.
        let peer = unsafe { peer.as_ref() }.ok_or(libc::EINVAL)?;
        if comm_id.is_null() {
            return Err(libc::EINVAL);
        }
        let p = conn_param(param)?;
        let id = ch
            .resolve(peer.ip(), ServiceId(service_id), &p)
            .map_err(|e| e.errno())?;
        // SAFETY: the caller's out-pointer (checked).
        unsafe { *comm_id = id.0 };
        Ok(())
    })())
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_accept(
    c: *mut ibv_context,
    comm_id: u32,
    qp: *mut ibv_qp,
    param: *const CmParam,
) -> c_int {
    code((|| {
        let (_, ch) = channel(c)?;
        let q = qp_of(c, qp)?;
        let p = conn_param(param)?;
        ch.accept(CommId(comm_id), q, &p).map_err(|e| e.errno())
    })())
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_establish(c: *mut ibv_context, comm_id: u32) -> c_int {
    code(channel(c).and_then(|(_, ch)| ch.establish(CommId(comm_id)).map_err(|e| e.errno())))
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_init_qp_attr(
    c: *mut ibv_context,
    comm_id: u32,
    attr: *mut ibv_qp_attr,
    mask: *mut c_int,
) -> c_int {
    code((|| {
        if attr.is_null() || mask.is_null() {
            return Err(libc::EINVAL);
        }
        let (_, ch) = channel(c)?;
        // SAFETY: the caller's struct (checked non-NULL).
        let want = unsafe { (*attr).qp_state };
        let state = QpState::try_from(want).map_err(|_| libc::EINVAL)?;
        let (a, m) = ch
            .init_qp_attr(CommId(comm_id), state)
            .map_err(|e| e.errno())?;
        // SAFETY: the caller's struct and int (checked non-NULL).
        unsafe {
            *attr = qp_attr_to_c(&a);
            *mask = m.bits() as c_int;
        }
        Ok(())
    })())
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_reject(
    c: *mut ibv_context,
    comm_id: u32,
    reason: u16,
    data: *const c_void,
    len: u8,
) -> c_int {
    code((|| {
        let (_, ch) = channel(c)?;
        // SAFETY: the caller's `len` bytes.
        let d = unsafe { bytes(data, len) }?;
        // As Linux's ucma_reject: 0 is consumer defined; the CM refuses what is not a
        // consumer's reason.
        let reason = match reason {
            0 => RejectReason::CONSUMER_DEFINED,
            r => RejectReason(r),
        };
        ch.reject(CommId(comm_id), reason, d).map_err(|e| e.errno())
    })())
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_disconnect(
    c: *mut ibv_context,
    comm_id: u32,
    data: *const c_void,
    len: u8,
) -> c_int {
    code((|| {
        let (_, ch) = channel(c)?;
        // SAFETY: the caller's `len` bytes.
        let d = unsafe { bytes(data, len) }?;
        ch.disconnect(CommId(comm_id), d).map_err(|e| e.errno())
    })())
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_destroy_id(c: *mut ibv_context, comm_id: u32) -> c_int {
    code(channel(c).and_then(|(_, ch)| ch.destroy_id(CommId(comm_id)).map_err(|e| e.errno())))
}

#[no_mangle]
pub unsafe extern "C" fn softrdma_cm_get_event(c: *mut ibv_context, out: *mut CmEventRec) -> c_int {
    code((|| {
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let (_, ch) = channel(c)?;
        let ev = ch.get_event().map_err(|e| e.errno())?.ok_or(libc::EAGAIN)?;
        let mut r = CmEventRec::default();
        match ev {
            CmEvent::ConnectRequest(q) => {
                r.kind = event::CONNECT_REQUEST;
                r.comm_id = q.id.0;
                r.service_id = q.service_id.0;
                r.peer = CmAddr::new(q.peer, q.peer_port);
                r.local = CmAddr::new(q.local, 0);
                r.remote_qpn = q.remote_qpn.value();
                r.responder_resources = q.responder_resources;
                r.initiator_depth = q.initiator_depth;
                r.set_private_data(&q.private_data);
                r.ece = q.ece;
            }
            CmEvent::Established {
                id,
                private_data,
                ece,
            } => {
                r.kind = event::ESTABLISHED;
                r.comm_id = id.0;
                r.set_private_data(&private_data);
                r.ece = ece;
            }
            CmEvent::ConnectResponse {
                id,
                remote_qpn,
                private_data,
                ece,
            } => {
                r.kind = event::CONNECT_RESPONSE;
                r.comm_id = id.0;
                r.remote_qpn = remote_qpn.value();
                r.set_private_data(&private_data);
                r.ece = ece;
            }
            CmEvent::Rejected {
                id,
                reason,
                private_data,
            } => {
                r.kind = event::REJECTED;
                r.comm_id = id.0;
                r.status = i32::from(reason.0);
                r.set_private_data(&private_data);
            }
            CmEvent::Unreachable { id } => {
                r.kind = event::UNREACHABLE;
                r.comm_id = id.0;
            }
            CmEvent::ConnectError { id, errno } => {
                r.kind = event::CONNECT_ERROR;
                r.comm_id = id.0;
                r.status = errno;
            }
            CmEvent::Disconnected { id } => {
                r.kind = event::DISCONNECTED;
                r.comm_id = id.0;
            }
            CmEvent::TimeWaitExit { id } => {
                r.kind = event::TIMEWAIT_EXIT;
                r.comm_id = id.0;
            }
            CmEvent::Resolved {
                id,
                qpn,
                qkey,
                private_data,
            } => {
                r.kind = event::RESOLVED;
                r.comm_id = id.0;
                r.remote_qpn = qpn;
                r.qkey = qkey;
                r.set_private_data(&private_data);
            }
            CmEvent::Unresolved {
                id,
                status,
                private_data,
            } => {
                r.kind = event::UNREACHABLE;
                r.comm_id = id.0;
                r.status = i32::from(status);
                r.set_private_data(&private_data);
            }
            // A kind this interface does not know yet: not for librdmacm.
            _ => return Err(libc::EAGAIN),
        }
        // SAFETY: the caller's record (checked non-NULL).
        unsafe { *out = r };
        Ok(())
    })())
}

symver!(
    softrdma_cm_abi_version,
    softrdma_cm_open,
    softrdma_cm_listen,
    softrdma_cm_unlisten,
    softrdma_cm_connect,
    softrdma_cm_resolve,
    softrdma_cm_accept,
    softrdma_cm_reject,
    softrdma_cm_disconnect,
    softrdma_cm_destroy_id,
    softrdma_cm_get_event,
    softrdma_cm_establish,
    softrdma_cm_init_qp_attr,
);
