//! QPs and SRQs on ids, and the endpoint calls of rdma-core's synchronous API
//! (`rdma_create_ep`, `rdma_get_request`, `rdma_destroy_ep`).

use core::ffi::c_int;

use crate::addr::read_sa;
use crate::cma::{self, ret, with, St, G};
use crate::ffi::*;
use crate::id;

/// The PD rdma-core uses when the caller gives none: one per device, made on first use. An
/// id shows it in `rdma_cm_id.pd` from the moment it has a device (rdma-core's
/// `ucma_get_device`), and programs use it before any QP exists (pyverbs wraps it at bind
/// and route resolution, then creates QPs and AHs on it).
pub(crate) fn device_pd(g: &mut G, d: usize) -> Result<*mut ibv_pd, c_int> {
    if g.devs[d].pd.is_null() {
        // SAFETY: a context of ours.
        let pd = unsafe { (g.v.alloc_pd)(g.devs[d].ctx) };
        if pd.is_null() {
            return Err(cma::errno());
        }
        g.devs[d].pd = pd;
    }
    Ok(g.devs[d].pd)
}

/// A CQ of `depth` entries with its own completion channel, as rdma-core makes for an id.
fn make_cq(
    g: &G,
    ctx: *mut ibv_context,
    depth: u32,
) -> Result<(*mut ibv_cq, *mut ibv_comp_channel), c_int> {
    // SAFETY: a context of ours.
    let ch = unsafe { (g.v.create_comp_channel)(ctx) };
    if ch.is_null() {
        return Err(cma::errno());
    }
    let depth = c_int::try_from(depth.max(1)).unwrap_or(c_int::MAX);
    // SAFETY: as above; the channel was just made on it.
    let cq = unsafe { (g.v.create_cq)(ctx, depth, std::ptr::null_mut(), ch, 0) };
    if cq.is_null() {
        let e = cma::errno();
        // SAFETY: the channel has no CQ.
        unsafe { (g.v.destroy_comp_channel)(ch) };
        return Err(e);
    }
    Ok((cq, ch))
}

/// Destroy the CQs rdma_create_qp made for id `k`.
fn free_cqs(g: &mut G, k: usize) {
    let Some(st) = g.ids.get_mut(&k) else {
        return;
    };
    let (s, r) = (st.own_send_cq, st.own_recv_cq);
    st.own_send_cq = false;
    st.own_recv_cq = false;
    let id = g.cid(k);
    // SAFETY: CQs and channels this library made for the id, their QP gone.
    unsafe {
        if s {
            (g.v.destroy_cq)(id.cid.send_cq);
            (g.v.destroy_comp_channel)(id.cid.send_cq_channel);
            id.cid.send_cq = std::ptr::null_mut();
            id.cid.send_cq_channel = std::ptr::null_mut();
        }
        if r {
            (g.v.destroy_cq)(id.cid.recv_cq);
            (g.v.destroy_comp_channel)(id.cid.recv_cq_channel);
            id.cid.recv_cq = std::ptr::null_mut();
            id.cid.recv_cq_channel = std::ptr::null_mut();
        }
    }
}

/// `rdma_create_qp_ex` with the attributes rdma_create_qp passes.
fn create_qp(id: *mut rdma_cm_id, attr: &mut ibv_qp_init_attr_ex_head) -> Result<(), c_int> {
    with(|g| {
        let (k, st) = g.id(id)?;
        let d = st.dev.ok_or(libc::EINVAL)?;
        let cid = &g.cid(k).cid;
        if !cid.qp.is_null() {
            return Err(libc::EINVAL);
        }
        let ctx = cid.verbs;
        let ps_ = cid.ps;
        if attr.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 {
            // Extended creation (send ops, create flags...): not offered on ids.
            return Err(libc::EOPNOTSUPP);
        }
        let pd = if attr.comp_mask & IBV_QP_INIT_ATTR_PD != 0 && !attr.pd.is_null() {
            // SAFETY: the caller's PD.
            if unsafe { (*attr.pd).context } != ctx {
                return Err(libc::EINVAL);
            }
            attr.pd
        } else {
            device_pd(g, d)?
        };
        let mut base = attr.base();
        let b = &mut base;
        let mut made_send = None;
        let mut made_recv = None;
        if b.send_cq.is_null() && cid.send_cq.is_null() {
            made_send = Some(make_cq(g, ctx, b.cap.max_send_wr)?);
        }
        if b.recv_cq.is_null() && cid.recv_cq.is_null() {
            match make_cq(g, ctx, b.cap.max_recv_wr) {
                Ok(c) => made_recv = Some(c),
                Err(e) => {
                    if let Some((cq, ch)) = made_send {
                        // SAFETY: made just above, unused.
                        unsafe {
                            (g.v.destroy_cq)(cq);
                            (g.v.destroy_comp_channel)(ch);
                        }
                    }
                    return Err(e);
                }
            }
        }
        let id_ = g.cid(k);
        if let Some((cq, ch)) = made_send {
            id_.cid.send_cq = cq;
            id_.cid.send_cq_channel = ch;
        }
        if let Some((cq, ch)) = made_recv {
            id_.cid.recv_cq = cq;
            id_.cid.recv_cq_channel = ch;
        }
        if let Some(st) = g.ids.get_mut(&k) {
            st.own_send_cq |= made_send.is_some();
            st.own_recv_cq |= made_recv.is_some();
        }
        let id_ = g.cid(k);
        if b.send_cq.is_null() {
            b.send_cq = id_.cid.send_cq;
        }
        if b.recv_cq.is_null() {
            b.recv_cq = id_.cid.recv_cq;
        }
        if b.srq.is_null() {
            b.srq = id_.cid.srq;
        }
        // SAFETY: a PD of the id's context and the caller's attributes.
        let qp = unsafe { (g.v.create_qp)(pd, b) };
        // What the QP got (capabilities, CQs) goes back to the caller, as rdma-core does.
        *attr = ibv_qp_init_attr_ex_head::new(base, attr.comp_mask, attr.pd);
        if qp.is_null() {
            let e = cma::errno();
            free_cqs(g, k);
            return Err(e);
        }
        if let Err(e) = init_qp(g, qp, ps_) {
            // SAFETY: the QP just made, never handed out.
            unsafe { (g.v.destroy_qp)(qp) };
            free_cqs(g, k);
            return Err(e);
        }
        let id_ = g.cid(k);
        id_.cid.qp = qp;
        id_.cid.pd = pd;
        // rdma-core's init_ece: the id's ECE becomes its QP's, and this device's QPs have
        // none (ibv_query_ece: EOPNOTSUPP), so an earlier rdma_set_local_ece is dropped.
        if let Some(st) = g.ids.get_mut(&k) {
            st.local_ece = ibv_ece::default();
        }
        Ok(())
    })
}

/// Bring a new QP to where rdma-core leaves it: a connected QP in INIT (receives may be
/// posted before the connection), a UD QP ready to send (INIT, RTR, RTS).
fn init_qp(g: &G, qp: *mut ibv_qp, ps_: u32) -> Result<(), c_int> {
    let (mut a, mask) = id::init_attr(ps_);
    // SAFETY: a QP of ours and its attributes.
    let r = unsafe { (g.v.modify_qp)(qp, &mut a, mask) };
    if r != 0 {
        return Err(r);
    }
    if matches!(ps_, ps::UDP | ps::IPOIB) {
        let mut a = ibv_qp_attr {
            qp_state: qps::RTR,
            ..ibv_qp_attr::default()
        };
        // SAFETY: as above.
        let r = unsafe { (g.v.modify_qp)(qp, &mut a, qp_mask::STATE) };
        if r != 0 {
            return Err(r);
        }
        let mut a = ibv_qp_attr {
            qp_state: qps::RTS,
            sq_psn: 0,
            ..ibv_qp_attr::default()
        };
        // SAFETY: as above.
        let r = unsafe { (g.v.modify_qp)(qp, &mut a, qp_mask::STATE | qp_mask::SQ_PSN) };
        if r != 0 {
            return Err(r);
        }
    }
    Ok(())
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if qp_init_attr.is_null() {
        return ret(Err(libc::EINVAL));
    }
    // rdma-core: the PD given, else the id's (rdma_create_ep's), else the device's.
    let pd = if pd.is_null() {
        with(|g| {
            let (k, _) = g.id(id)?;
            Ok(g.cid(k).cid.pd)
        })
        .unwrap_or(std::ptr::null_mut())
    } else {
        pd
    };
    // SAFETY: the caller's attributes.
    let mut ex = ibv_qp_init_attr_ex_head::new(unsafe { *qp_init_attr }, IBV_QP_INIT_ATTR_PD, pd);
    let r = create_qp(id, &mut ex);
    if r.is_ok() {
        // The capabilities the QP got, written back as rdma-core does.
        // SAFETY: as above.
        unsafe { *qp_init_attr = ex.base() };
    }
    ret(r)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    qp_init_attr: *mut ibv_qp_init_attr_ex_head,
) -> c_int {
    if qp_init_attr.is_null() {
        return ret(Err(libc::EINVAL));
    }
    // SAFETY: the caller's struct ibv_qp_init_attr_ex begins with these fields.
    let mut ex = unsafe { *qp_init_attr };
    let r = create_qp(id, &mut ex);
    if r.is_ok() {
        // SAFETY: as above; only the fields the caller gave are written back.
        unsafe { *qp_init_attr = ex };
    }
    ret(r)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut rdma_cm_id) {
    let _ = with(|g| {
        let (k, st) = g.id(id)?;
        // A connection still up lets go of the QP first: QP numbers are reused, and a late
        // DREQ must not reach the QP's next owner. One closed, or closing after
        // rdma_disconnect, stays: its DISCONNECTED event is still to come (programs such as
        // cmtime destroy the QP and then wait for it), and the device moves no QP of a
        // closed connection.
        if !(st.disconnecting || st.state == St::Closed) {
            if let (Some(d), Some(c)) = (st.dev, st.comm.take()) {
                if g.comms.remove(&(d, c)).is_some() {
                    // SAFETY: a context of ours.
                    unsafe { (g.v.cm.destroy_id)(g.devs[d].ctx, c) };
                }
            }
        }
        let id_ = g.cid(k);
        if !id_.cid.qp.is_null() {
            // SAFETY: the id's QP, made by rdma_create_qp.
            unsafe { (g.v.destroy_qp)(id_.cid.qp) };
            id_.cid.qp = std::ptr::null_mut();
        }
        free_cqs(g, k);
        Ok(())
    });
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_srq_init_attr,
) -> c_int {
    ret(with(|g| {
        let (k, st) = g.id(id)?;
        let d = st.dev.ok_or(libc::EINVAL)?;
        if attr.is_null() || !g.cid(k).cid.srq.is_null() {
            return Err(libc::EINVAL);
        }
        let pd = if pd.is_null() { device_pd(g, d)? } else { pd };
        // SAFETY: a PD of ours or the caller's, the caller's attributes.
        let srq = unsafe { (g.v.create_srq)(pd, attr) };
        if srq.is_null() {
            return Err(cma::errno());
        }
        let id_ = g.cid(k);
        id_.cid.srq = srq;
        id_.cid.pd = pd;
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq_ex(
    _id: *mut rdma_cm_id,
    _attr: *mut core::ffi::c_void,
) -> c_int {
    // XRC and extended SRQs are not offered by the device.
    ret(Err(libc::EOPNOTSUPP))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut rdma_cm_id) {
    let _ = with(|g| {
        let (k, _) = g.id(id)?;
        let id_ = g.cid(k);
        if !id_.cid.srq.is_null() {
            // SAFETY: the id's SRQ.
            unsafe { (g.v.destroy_srq)(id_.cid.srq) };
            id_.cid.srq = std::ptr::null_mut();
        }
        Ok(())
    });
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return ret(Err(libc::EINVAL));
    }
    // SAFETY: the caller's addrinfo (from rdma_getaddrinfo).
    let r = unsafe { &*res };
    let mut cm_id: *mut rdma_cm_id = std::ptr::null_mut();
    let ps_ = r.ai_port_space as u32;
    if let Err(e) = id::create_id(std::ptr::null_mut(), &mut cm_id, std::ptr::null_mut(), ps_) {
        return ret(Err(e));
    }
    let _ = with(|g| {
        g.cid(cm_id as usize).cid.pd = pd;
        Ok(())
    });
    let result = (|| {
        if r.ai_flags & RAI_PASSIVE != 0 {
            // SAFETY: the caller's id and address.
            if unsafe { id::rdma_bind_addr(cm_id, r.ai_src_addr) } != 0 {
                return Err(cma::errno());
            }
            if !qp_init_attr.is_null() {
                // SAFETY: the caller's attributes.
                let mut a = unsafe { *qp_init_attr };
                // The requests' QPs take the type the address info names, as rdma-core's.
                a.qp_type = r.ai_qp_type as u32;
                with(|g| {
                    g.id(cm_id)?.1.ep_qp_attr = Some(a);
                    Ok(())
                })?;
            }
            return Ok(());
        }
        // SAFETY: the id just made and the caller's addresses.
        let src_ok = unsafe { read_sa(r.ai_src_addr) }.is_some();
        let src = if src_ok {
            r.ai_src_addr
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: as above.
        if unsafe { id::rdma_resolve_addr(cm_id, src, r.ai_dst_addr, 2000) } != 0 {
            return Err(cma::errno());
        }
        // SAFETY: as above.
        if unsafe { id::rdma_resolve_route(cm_id, 2000) } != 0 {
            return Err(cma::errno());
        }
        if !qp_init_attr.is_null() {
            // SAFETY: the caller's attributes.
            unsafe { (*qp_init_attr).qp_type = r.ai_qp_type as u32 };
            // SAFETY: as above.
            if unsafe { rdma_create_qp(cm_id, pd, qp_init_attr) } != 0 {
                return Err(cma::errno());
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            // SAFETY: the caller's out-pointer (checked non-NULL).
            unsafe { *id = cm_id };
            0
        }
        Err(e) => {
            let _ = cma::destroy(cm_id as usize);
            ret(Err(e))
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut rdma_cm_id) {
    // SAFETY: the caller's id (unknown ones are ignored by each call).
    unsafe {
        rdma_destroy_qp(id);
        rdma_destroy_srq(id);
    }
    let _ = cma::destroy(id as usize);
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(
    listen: *mut rdma_cm_id,
    id: *mut *mut rdma_cm_id,
) -> c_int {
    ret(get_request(listen, id))
}

fn get_request(listen: *mut rdma_cm_id, out: *mut *mut rdma_cm_id) -> Result<(), c_int> {
    if out.is_null() {
        return Err(libc::EINVAL);
    }
    let (chan, attr, pd) = with(|g| {
        let (k, st) = g.id(listen)?;
        // rdma-core: only a synchronous listener has requests to get.
        let c = st.sync_chan.ok_or(libc::EINVAL)?;
        let attr = st.ep_qp_attr;
        Ok((c, attr, g.cid(k).cid.pd))
    })?;
    let e = cma::get_event(chan)?;
    // SAFETY: a delivered, unacknowledged event.
    let (kind, status, new) = unsafe { ((*e).event, (*e).status, (*e).id) };
    if status != 0 || kind != ev::CONNECT_REQUEST {
        let _ = cma::ack(e as usize);
        return Err(if status != 0 {
            status.abs()
        } else {
            libc::EINVAL
        });
    }
    if let Some(mut a) = attr {
        // SAFETY: the request's new id and attributes of our own.
        if unsafe { rdma_create_qp(new, pd, &mut a) } != 0 {
            let err = cma::errno();
            // SAFETY: as above.
            unsafe { id::rdma_reject(new, std::ptr::null(), 0) };
            let _ = cma::ack(e as usize);
            let _ = cma::destroy(new as usize);
            return Err(err);
        }
    }
    with(|g| {
        let (k, _) = g.id(new)?;
        // Kept until the id's next synchronous call or its destruction, as rdma-core.
        g.cid(k).cid.event = e;
        Ok(())
    })?;
    // SAFETY: the caller's out-pointer (checked).
    unsafe { *out = new };
    Ok(())
}

symver!(
    rdma_create_qp,
    rdma_create_qp_ex,
    rdma_destroy_qp,
    rdma_create_srq,
    rdma_create_srq_ex,
    rdma_destroy_srq,
    rdma_create_ep,
    rdma_destroy_ep,
    rdma_get_request,
);
