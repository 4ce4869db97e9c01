//! Multicast joins on datagram ids (`rdma_join_multicast`, `mckey`): as Linux's rdma_cm does
//! for RoCE, with no subnet administrator to ask. The group's GID comes from its IP address
//! (`cma_iboe_set_mgid`: an IPv4 group as its IPv4-mapped GID, an IPv6 group as itself),
//! the id's QP is attached to it (`ibv_attach_mcast`, as rdma-core's librdmacm does when it
//! delivers the join), and `RDMA_CM_EVENT_MULTICAST_JOIN` carries what a sender needs: an
//! address vector to the group, QPN 0xFFFFFF and the port space's Q_Key.

use core::ffi::{c_int, c_void};
use std::net::IpAddr;

use crate::addr::{gid_of, read_sa};
use crate::cma::{ret, with, St, G};
use crate::ffi::*;

/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`.
const ATTR_ADDRESS: u32 = 1;
/// `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS`.
const ATTR_JOIN_FLAGS: u32 = 2;
/// `RDMA_MC_JOIN_FLAG_FULLMEMBER`.
const FULLMEMBER: u32 = 0;
/// `RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER`.
const SENDONLY_FULLMEMBER: u32 = 1;
/// The QPN datagrams to a group are sent to.
const MULTICAST_QPN: u32 = 0xff_ffff;

/// A group an id joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Group {
    addr: IpAddr,
    mgid: [u8; 16],
    /// The id's QP was attached to it (a full member with a QP).
    attached: bool,
}

fn is_multicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_multicast(),
        IpAddr::V6(a) => a.is_multicast(),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    ret(join(id, addr, FULLMEMBER, context))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut rdma_cm_id,
    attr: *mut rdma_cm_join_mc_attr_ex,
    context: *mut c_void,
) -> c_int {
    // SAFETY: NULL or the caller's attributes.
    let Some(a) = (unsafe { attr.as_ref() }) else {
        return ret(Err(libc::EINVAL));
    };
    // rdma-core: both the address and the flags must be given, and nothing else.
    if a.comp_mask != ATTR_ADDRESS | ATTR_JOIN_FLAGS {
        return ret(Err(libc::EINVAL));
    }
    if !matches!(a.join_flags, FULLMEMBER | SENDONLY_FULLMEMBER) {
        return ret(Err(libc::EINVAL));
    }
    ret(join(id, a.addr, a.join_flags, context))
}

fn join(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
    flags: u32,
    context: *mut c_void,
) -> Result<(), c_int> {
    // SAFETY: NULL or the caller's socket address.
    let (ip, _) = unsafe { read_sa(addr) }.ok_or(libc::EINVAL)?;
    if !is_multicast(ip) {
        return Err(libc::EINVAL);
    }
    with(|g| {
        let (k, st) = g.id(id)?;
        // Linux: the address must be bound or resolved (it names the device).
        if !matches!(st.state, St::Bound | St::AddrResolved | St::RouteResolved) {
            return Err(libc::EINVAL);
        }
        let d = st.dev.ok_or(libc::ENODEV)?;
        if st.groups.iter().any(|m| m.addr == ip) {
            return Err(libc::EADDRINUSE);
        }
        let cid = &g.cid(k).cid;
        if !matches!(cid.ps, ps::UDP | ps::IPOIB) {
            return Err(libc::EINVAL);
        }
        let mgid = gid_of(ip);
        let qp = cid.qp;
        let attach = flags == FULLMEMBER && !qp.is_null();
        if attach {
            let gid = ibv_gid { raw: mgid };
            // SAFETY: the id's QP (made on our context), a GID living for the call.
            let r = unsafe { (g.v.attach_mcast)(qp, &gid, 0) };
            if r != 0 {
                return Err(r);
            }
        }
        g.ids.get_mut(&k).ok_or(libc::EINVAL)?.groups.push(Group {
            addr: ip,
            mgid,
            attached: attach,
        });
        post_join(g, k, d, mgid, context);
        Ok(())
    })
}

/// Queue `RDMA_CM_EVENT_MULTICAST_JOIN` for id `k`: `param.ud` has the address vector to
/// the group, QPN 0xFFFFFF, the Q_Key and, as rdma-core puts it there, the join's context
/// in `private_data`.
fn post_join(g: &mut G, k: usize, d: usize, mgid: [u8; 16], context: *mut c_void) {
    let mut e = g.new_event(k, ev::MULTICAST_JOIN, 0);
    let ah_attr = g.ud_ah_attr(d, k, mgid);
    // SAFETY: a UD event: `ud` is the variant that counts (new_event wrote both).
    unsafe {
        let u = &mut e.ev.param.ud;
        u.private_data = context.cast_const();
        u.private_data_len = 0;
        u.ah_attr = ah_attr;
        u.qp_num = MULTICAST_QPN;
        u.qkey = RDMA_UDP_QKEY;
    }
    let c = g.cid(k).cid.channel as usize;
    g.push(c, e);
}

#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(
    id: *mut rdma_cm_id,
    addr: *mut libc::sockaddr,
) -> c_int {
    // SAFETY: NULL or the caller's socket address.
    let Some((ip, _)) = (unsafe { read_sa(addr) }) else {
        return ret(Err(libc::EINVAL));
    };
    ret(with(|g| {
        let (k, st) = g.id(id)?;
        let at = st
            .groups
            .iter()
            .position(|m| m.addr == ip)
            .ok_or(libc::EADDRNOTAVAIL)?;
        let group = st.groups.remove(at);
        let qp = g.cid(k).cid.qp;
        if group.attached && !qp.is_null() {
            let gid = ibv_gid { raw: group.mgid };
            // SAFETY: the id's QP, a GID living for the call.
            let r = unsafe { (g.v.detach_mcast)(qp, &gid, 0) };
            if r != 0 {
                return Err(r);
            }
        }
        Ok(())
    }))
}

symver!(
    rdma_join_multicast,
    rdma_join_multicast_ex,
    rdma_leave_multicast
);
