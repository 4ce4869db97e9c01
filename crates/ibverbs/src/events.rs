//! Asynchronous events (`ibv_get_async_event`, `ibv_ack_async_event`); the objects the
//! device names in them (QPN, CQ or SRQ handle) become the C objects the program holds
//! through [`crate::objects`].

use core::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd};

use engine::AsyncEvent;

use crate::abi::*;
use crate::device::{ctx, Ctx};
use crate::objects::{is_live, lookup, Kind};
use crate::set_errno;

/// `enum ibv_event_type` values.
mod event_type {
    pub const CQ_ERR: u32 = 0;
    pub const QP_FATAL: u32 = 1;
    pub const DEVICE_FATAL: u32 = 8;
    pub const SQ_DRAINED: u32 = 5;
    pub const PORT_ACTIVE: u32 = 9;
    pub const PORT_ERR: u32 = 10;
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    pub const QP_LAST_WQE_REACHED: u32 = 16;
}

/// The C event for `ev`, or `None` if it names an object this library no longer has (it
/// was destroyed meanwhile: the event is dropped, as the kernel drops events of destroyed
/// objects).
fn to_c(cx: &Ctx, ev: &AsyncEvent) -> Option<ibv_async_event> {
    let obj = |kind, id| lookup(cx, kind, id).map(|p| p as *mut c_void);
    // The union's `int port_num` shares the first bytes of the pointer member
    // (little-endian x86-64): a port is stored as a pointer-sized integer.
    let port = |p: u8| usize::from(p) as *mut c_void;
    let (element, event_type) = match *ev {
        AsyncEvent::CqErr { cq } => (obj(Kind::Cq, cq.0)?, event_type::CQ_ERR),
        AsyncEvent::QpFatal { qpn } => (obj(Kind::Qp, qpn.value())?, event_type::QP_FATAL),
        AsyncEvent::SqDrained { qpn } => (obj(Kind::Qp, qpn.value())?, event_type::SQ_DRAINED),
        AsyncEvent::QpLastWqeReached { qpn } => {
            (obj(Kind::Qp, qpn.value())?, event_type::QP_LAST_WQE_REACHED)
        }
        AsyncEvent::SrqLimitReached { srq } => {
            (obj(Kind::Srq, srq.0)?, event_type::SRQ_LIMIT_REACHED)
        }
        AsyncEvent::PortActive { port: p } => (port(p), event_type::PORT_ACTIVE),
        AsyncEvent::PortErr { port: p } => (port(p), event_type::PORT_ERR),
        // A device event names no object.
        AsyncEvent::DeviceFatal => (std::ptr::null_mut(), event_type::DEVICE_FATAL),
        #[allow(unreachable_patterns)]
        _ => return None,
    };
    Some(ibv_async_event {
        element,
        event_type,
    })
}

/// Consume a pending wakeup of the event descriptor, if any (never blocks: read only when
/// poll says it is readable).
fn clear(fd: BorrowedFd<'_>) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; zero timeout.
    if unsafe { libc::poll(&mut p, 1, 0) } == 1 {
        let mut b = [0u8; 8];
        // SAFETY: 8 writable bytes; an eventfd that poll reports readable has a count.
        unsafe { libc::read(p.fd, b.as_mut_ptr().cast(), 8) };
    }
}

/// Make the event descriptor readable: events are still waiting.
fn signal(fd: BorrowedFd<'_>) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: 8 readable bytes written to an eventfd (adds 1 to its count).
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// `ibv_get_async_event`: the next event of the context's device, blocking until there is
/// one, or -1 with `EAGAIN` when the program made `async_fd` non-blocking and none waits.
/// `context->async_fd` is readable exactly while events wait here (on the daemon, an
/// event of another connection of the host, one that arrives while this call takes others,
/// or one for an object already destroyed can leave it readable once with nothing to take).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_async_event(
    c: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: see `ctx`.
    let Some(cx) = (unsafe { ctx(c) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let raw = cx.raw();
    let fd = cx.dev().async_event_fd();
    loop {
        {
            let mut q = cx.shared.pending.lock().unwrap_or_else(|p| p.into_inner());
            // Clear first, then take everything: an event raised after this signals again.
            clear(fd);
            loop {
                match raw.async_event() {
                    Ok(Some(ev)) => q.push_back(ev),
                    Ok(None) => break,
                    Err(e) => {
                        set_errno(e.errno());
                        return -1;
                    }
                }
            }
            while let Some(ev) = q.pop_front() {
                if ev == AsyncEvent::DeviceFatal {
                    // Said once: `async_fd` stops watching the dead connection.
                    if let Some(h) = cx.hangup {
                        cx.async_watch.remove(h);
                    }
                }
                if let Some(out) = to_c(cx, &ev) {
                    if !q.is_empty() {
                        signal(fd);
                    }
                    // SAFETY: non-NULL struct ibv_async_event of the caller.
                    unsafe { event.write(out) };
                    return 0;
                }
            }
        }
        if cx.async_watch.nonblocking() {
            // UCX's async thread reads with O_NONBLOCK after each wake-up; blocking here
            // would hang its teardown, which joins that thread.
            set_errno(libc::EAGAIN);
            return -1;
        }
        if let Err(e) = raw.wait_async_event(None) {
            set_errno(e.errno());
            return -1;
        }
    }
}

/// `ibv_ack_async_event`: count the event as handled on its object (`events_completed`,
/// as libibverbs does). Events are copies, so there is nothing to release; an event naming
/// an object this library does not know is ignored.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    if event.is_null() {
        return;
    }
    // SAFETY: non-NULL struct ibv_async_event of the caller.
    let ev = unsafe { event.read() };
    let p = ev.element as usize;
    // SAFETY (all arms): the address is a live object of that kind (checked in the
    // registry), whose box starts with the C struct.
    match ev.event_type {
        event_type::CQ_ERR if is_live(Kind::Cq, p) => unsafe {
            let cq = p as *mut ibv_cq;
            (*cq).async_events_completed = (*cq).async_events_completed.wrapping_add(1);
        },
        event_type::QP_FATAL | event_type::SQ_DRAINED | event_type::QP_LAST_WQE_REACHED
            if is_live(Kind::Qp, p) =>
        unsafe {
            let qp = p as *mut ibv_qp;
            (*qp).events_completed = (*qp).events_completed.wrapping_add(1);
        },
        event_type::SRQ_LIMIT_REACHED if is_live(Kind::Srq, p) => unsafe {
            let srq = p as *mut ibv_srq;
            (*srq).events_completed = (*srq).events_completed.wrapping_add(1);
        },
        _ => {}
    }
}

symver!(ibv_get_async_event, ibv_ack_async_event);
