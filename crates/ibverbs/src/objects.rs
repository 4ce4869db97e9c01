//! The C objects the program holds, by device and context: asynchronous events name an
//! object by QPN or handle and become the program's pointer here ([`crate::events`]), and
//! `ibv_close_device` of a context that shares its device with others destroys the objects
//! the program left on that context ([`take_context`]).
//!
//! Every object made on the embedded device shares one engine, whichever context made it:
//! without this record, a context closed with a QP or a region left behind would leave them
//! running and reachable by peers. A NIC's close (and softrdmad's, where each context is a
//! connection of its own) destroys them.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::device::Ctx;

/// The kinds of object, in the order a closing context destroys them: each before the
/// objects it uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// A QP, by QPN.
    Qp,
    /// A memory window, by handle.
    Mw,
    /// An address handle, by handle.
    Ah,
    /// An SRQ, by handle.
    Srq,
    /// A CQ, by handle.
    Cq,
    /// A memory region, by handle.
    Mr,
    /// A protection domain, by handle.
    Pd,
}

/// Where a live object is: the address of our box (whose first field is the C struct) and
/// the context that made it.
#[derive(Debug, Clone, Copy)]
struct Place {
    ptr: usize,
    ctx: usize,
}

/// Live C objects by (device, kind, id).
type Registry = HashMap<(usize, Kind, u32), Place>;

static OBJECTS: Mutex<Option<Registry>> = Mutex::new(None);

fn objects() -> MutexGuard<'static, Option<Registry>> {
    OBJECTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Record a C object made on `cx`.
pub(crate) fn register(cx: &Ctx, kind: Kind, id: u32, ptr: usize) {
    let place = Place {
        ptr,
        ctx: cx as *const Ctx as usize,
    };
    objects()
        .get_or_insert_with(HashMap::new)
        .insert((cx.device_id(), kind, id), place);
}

/// Forget a destroyed C object.
pub(crate) fn unregister(cx: &Ctx, kind: Kind, id: u32) {
    if let Some(m) = objects().as_mut() {
        m.remove(&(cx.device_id(), kind, id));
    }
}

/// Forget the objects `cx` made and has not destroyed, and return them (kind and box
/// address) in the order they must be destroyed: QPs first, PDs last.
pub(crate) fn take_context(cx: &Ctx) -> Vec<(Kind, usize)> {
    let me = cx as *const Ctx as usize;
    let mut left = Vec::new();
    if let Some(m) = objects().as_mut() {
        m.retain(|&(_, kind, _), place| {
            let mine = place.ctx == me;
            if mine {
                left.push((kind, place.ptr));
            }
            !mine
        });
    }
    left.sort_unstable();
    left
}

/// The box of the live object `kind` `id` of `cx`'s device.
pub(crate) fn lookup(cx: &Ctx, kind: Kind, id: u32) -> Option<usize> {
    objects()
        .as_ref()?
        .get(&(cx.device_id(), kind, id))
        .map(|p| p.ptr)
}

/// Whether `ptr` is a live object of `kind` (an event handed it out).
pub(crate) fn is_live(kind: Kind, ptr: usize) -> bool {
    objects()
        .as_ref()
        .is_some_and(|m| m.iter().any(|((_, k, _), p)| *k == kind && p.ptr == ptr))
}
