//! The `rdma_*` calls on channels and ids: create, bind, resolve, listen, connect, accept,
//! reject, disconnect, events, options.

use core::ffi::{c_char, c_int, c_void};
use std::net::IpAddr;

use abi::cm_ffi::{CmParam, Ece};

use crate::addr::{
    ephemeral_port, family, gid_of, kernel_source_for, read_sa, storage_ip, write_sa,
};
use crate::cma::{self, fill_route, ret, with, St, G};
use crate::ffi::*;

#[no_mangle]
pub unsafe extern "C" fn rdma_create_event_channel() -> *mut rdma_event_channel {
    match with(|g| g.new_chan()) {
        Ok(c) => c as *mut rdma_event_channel,
        Err(e) => {
            cma::set_errno(e);
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut rdma_event_channel) {
    let _ = with(|g| {
        g.free_chan(channel as usize);
        Ok(())
    });
}

#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut rdma_event_channel,
    id: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    ret(create_id(channel, id, context, ps).map(|_| ()))
}

/// `rdma_create_id`; returns the new id's key.
pub(crate) fn create_id(
    channel: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps_: u32,
) -> Result<usize, c_int> {
    if out.is_null() {
        return Err(libc::EINVAL);
    }
    let qp_type = match ps_ {
        ps::TCP | ps::IB => qpt::RC,
        ps::UDP | ps::IPOIB => qpt::UD,
        _ => return Err(libc::EINVAL),
    };
    let k = with(|g| {
        let (chan, sync) = if channel.is_null() {
            let c = g.new_chan()?;
            (c, Some(c))
        } else if g.chans.contains_key(&(channel as usize)) {
            (channel as usize, None)
        } else {
            return Err(libc::EINVAL);
        };
        let k = g.new_id(chan, context, ps_, qp_type);
        if let Some(st) = g.ids.get_mut(&k) {
            st.sync_chan = sync;
        }
        Ok(k)
    })?;
    // SAFETY: non-NULL out-pointer of the caller.
    unsafe { *out = k as *mut rdma_cm_id };
    Ok(k)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    ret(cma::destroy(id as usize))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> c_int {
    ret(bind(id, addr))
}

fn bind(id: *mut rdma_cm_id, addr: *mut libc::sockaddr) -> Result<(), c_int> {
    // SAFETY: the caller's socket address (or NULL).
    let fam = unsafe { family(addr) };
    if addr.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: as above.
    let Some((ip, port)) = (unsafe { read_sa(addr) }) else {
        // AF_IB and others: RoCE ids bind IP addresses only.
        return Err(if fam == libc::AF_UNSPEC {
            libc::EINVAL
        } else {
            libc::EAFNOSUPPORT
        });
    };
    with(|g| {
        let (k, st) = g.id(id)?;
        if st.state != St::Idle {
            return Err(libc::EINVAL);
        }
        let reuse = st.reuseaddr;
        let dev = if ip.is_unspecified() {
            None
        } else {
            Some(g.dev_of(ip).ok_or(libc::EADDRNOTAVAIL)?)
        };
        let ps_ = g.cid(k).cid.ps;
        let port = if port == 0 {
            ephemeral_port(|p| g.port_in_use(ps_, p, k)).ok_or(libc::EADDRINUSE)?
        } else if !reuse && g.port_in_use(ps_, port, k) {
            return Err(libc::EADDRINUSE);
        } else {
            port
        };
        let ctx = dev.map(|d| g.devs[d].ctx);
        let pd = match dev {
            Some(d) => crate::qp::device_pd(g, d)?,
            None => std::ptr::null_mut(),
        };
        let sgid = gid_of(ip);
        let id = g.cid(k);
        write_sa(&mut id.cid.route.addr.src, ip, port);
        if let Some(ctx) = ctx {
            id.cid.verbs = ctx;
            id.cid.pd = pd;
            id.cid.port_num = 1;
            id.cid.route.addr.ibaddr.sgid = ibv_gid { raw: sgid };
            id.cid.route.addr.ibaddr.pkey = 0xffffu16.to_be();
        }
        let st = g.ids.get_mut(&k).ok_or(libc::EINVAL)?;
        st.dev = dev;
        st.state = St::Bound;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    ret(resolve_addr(id, src_addr, dst_addr).and_then(cma::complete))
}

fn resolve_addr(
    id: *mut rdma_cm_id,
    src_addr: *mut libc::sockaddr,
    dst_addr: *mut libc::sockaddr,
) -> Result<usize, c_int> {
    // SAFETY: the caller's socket addresses (or NULL).
    let Some((dst, dport)) = (unsafe { read_sa(dst_addr) }) else {
        return Err(if dst_addr.is_null() {
            libc::EINVAL
        } else {
            libc::EAFNOSUPPORT
        });
    };
    // SAFETY: as above.
    let given_src = unsafe { read_sa(src_addr) };
    let bound = with(|g| {
        let (k, st) = g.id(id)?;
        match st.state {
            St::Idle => Ok(None),
            St::Bound => Ok(storage_ip(&g.cid(k).cid.route.addr.src)),
            _ => Err(libc::EINVAL),
        }
    })?;
    if given_src.is_some() && bound.is_none() {
        // rdma-core binds to the given source first.
        bind(id, src_addr)?;
    }
    let (src_ip, sport) = match given_src.or(bound) {
        Some((ip, port)) => (if ip.is_unspecified() { None } else { Some(ip) }, port),
        None => (None, 0),
    };
    with(|g| {
        let (k, st) = g.id(id)?;
        let tos = st.tos;
        // The kernel's choice when the caller names no source.
        let src = src_ip.or_else(|| kernel_source_for(dst));
        let found = src.and_then(|s| g.dev_of(s).map(|d| (d, s)));
        // A loopback destination whose source no device holds (the embedded backend runs
        // one device per process, each on its own 127.0.0.x): the first device of the
        // family answers, from its own address, as if the loopback route said so.
        let found = found.or_else(|| {
            (dst.is_loopback() && src_ip.is_none())
                .then(|| g.first_of_family(dst))
                .flatten()
        });
        let Some((d, src)) = found else {
            g.post(k, ev::ADDR_ERROR, -libc::ENODEV);
            return Ok(k);
        };
        let ps_ = g.cid(k).cid.ps;
        let sport = if sport == 0 {
            ephemeral_port(|p| g.port_in_use(ps_, p, k)).ok_or(libc::EADDRINUSE)?
        } else {
            sport
        };
        let (ctx, mtu) = (g.devs[d].ctx, g.devs[d].mtu);
        let pd = crate::qp::device_pd(g, d)?;
        let id_ = g.cid(k);
        id_.cid.verbs = ctx;
        if id_.cid.pd.is_null() {
            id_.cid.pd = pd;
        }
        id_.cid.port_num = 1;
        write_sa(&mut id_.cid.route.addr.src, src, sport);
        write_sa(&mut id_.cid.route.addr.dst, dst, dport);
        fill_route(id_, gid_of(src), gid_of(dst), mtu, tos);
        // Resolved, not routed: num_paths stays 0 until rdma_resolve_route.
        id_.cid.route.num_paths = 0;
        let st = g.ids.get_mut(&k).ok_or(libc::EINVAL)?;
        st.dev = Some(d);
        st.state = St::AddrResolved;
        g.post(k, ev::ADDR_RESOLVED, 0);
        Ok(k)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    ret(resolve_route(id).and_then(cma::complete))
}

fn resolve_route(id: *mut rdma_cm_id) -> Result<usize, c_int> {
    with(|g| {
        let (k, st) = g.id(id)?;
        if st.state != St::AddrResolved {
            return Err(libc::EINVAL);
        }
        st.state = St::RouteResolved;
        let id_ = g.cid(k);
        id_.cid.route.num_paths = 1;
        id_.cid.route.path_rec = &mut id_.path;
        g.post(k, ev::ROUTE_RESOLVED, 0);
        Ok(k)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    ret(listen(id))
}

fn listen(id: *mut rdma_cm_id) -> Result<(), c_int> {
    let state = with(|g| Ok(g.id(id)?.1.state))?;
    if state == St::Idle {
        // The kernel binds an unbound listener to the wildcard address, ephemeral port.
        let mut any: libc::sockaddr_storage =
            // SAFETY: all-zero storage is valid.
            unsafe { std::mem::zeroed() };
        write_sa(&mut any, IpAddr::from([0, 0, 0, 0]), 0);
        bind(id, (&mut any as *mut libc::sockaddr_storage).cast())?;
    }
    with(|g| {
        let (k, st) = g.id(id)?;
        if st.state != St::Bound {
            return Err(libc::EINVAL);
        }
        let dev = st.dev;
        let id_ = g.cid(k);
        let port = storage_ip(&id_.cid.route.addr.src).map_or(0, |(_, p)| p);
        let sid = (u64::from(id_.cid.ps) << 16) | u64::from(port);
        // Bound to an address: its device; to the wildcard: every device.
        let devs: Vec<usize> = match dev {
            Some(d) => vec![d],
            None => (0..g.devs.len()).collect(),
        };
        if devs.is_empty() {
            return Err(libc::ENODEV);
        }
        let mut done: Vec<(usize, u64)> = Vec::new();
        for d in devs {
            // SAFETY: a context of ours.
            let r = unsafe { (g.v.cm.listen)(g.devs[d].ctx, sid) };
            if r != 0 {
                for (d, sid) in done.iter().copied() {
                    // SAFETY: as above.
                    unsafe { (g.v.cm.unlisten)(g.devs[d].ctx, sid) };
                }
                return Err(if r == libc::EEXIST {
                    libc::EADDRINUSE
                } else {
                    r
                });
            }
            done.push((d, sid));
        }
        let st = g.ids.get_mut(&k).ok_or(libc::EINVAL)?;
        st.listening = done;
        st.state = St::Listen;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_connect(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    ret(connect(id, conn_param).and_then(cma::complete))
}

fn connect(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> Result<usize, c_int> {
    with(|g| {
        let (k, st) = g.id(id)?;
        if st.state != St::RouteResolved {
            return Err(libc::EINVAL);
        }
        let d = st.dev.ok_or(libc::EINVAL)?;
        let id_ = g.cid(k);
        if matches!(id_.cid.ps, ps::UDP | ps::IPOIB) {
            return resolve(g, k, d, p);
        }
        // Without a QP on the id the program moves its own (rdma-core's
        // ucma_valid_param: then the parameters, with the QP's number, are required).
        if id_.cid.qp.is_null() && p.is_null() {
            return Err(libc::EINVAL);
        }
        let (dst, dport) = storage_ip(&id_.cid.route.addr.dst).ok_or(libc::EINVAL)?;
        let mut param = g.param(k, p, REQ_PRIVATE_DATA_MAX, None)?;
        // rdma-core's ucma_copy_ece_param_to_kern_req: the REQ asks for the id's own ECE.
        let local_ece = g.ids.get(&k).ok_or(libc::EINVAL)?.local_ece;
        param.ece = Ece {
            vendor_id: local_ece.vendor_id,
            options: local_ece.options,
        };
        let sid = (u64::from(id_.cid.ps) << 16) | u64::from(dport);
        let peer = cma::cm_addr(dst, dport);
        let mut comm = 0u32;
        // SAFETY: our context, the id's QP (made on it), records that live for the call.
        let r =
            unsafe { (g.v.cm.connect)(g.devs[d].ctx, id_.cid.qp, &peer, sid, &param, &mut comm) };
        if r != 0 {
            return Err(r);
        }
        g.comms.insert((d, comm), k);
        let st = g.ids.get_mut(&k).ok_or(libc::EINVAL)?;
        st.comm = Some(comm);
        st.state = St::Connecting;
        st.conn = (param.responder_resources, param.initiator_depth);
        Ok(k)
    })
}

/// `rdma_connect` on a datagram id: SIDR asks the peer which UD QP serves the service
/// (Linux's `cma_resolve_ib_udp`); the answer is `RDMA_CM_EVENT_ESTABLISHED` with
/// `param.ud`, or `RDMA_CM_EVENT_UNREACHABLE`. The id's QP (if any) is not involved.
fn resolve(g: &mut G, k: usize, d: usize, p: *mut rdma_conn_param) -> Result<usize, c_int> {
    let id_ = g.cid(k);
    let (dst, dport) = storage_ip(&id_.cid.route.addr.dst).ok_or(libc::EINVAL)?;
    let param = g.param(k, p, SIDR_REQ_PRIVATE_DATA_MAX, None)?;
    let sid = (u64::from(id_.cid.ps) << 16) | u64::from(dport);
    let peer = cma::cm_addr(dst, dport);
    let mut comm = 0u32;
    // SAFETY: our context, records that live for the call.
    let r = unsafe { (g.v.cm.resolve)(g.devs[d].ctx, &peer, sid, &param, &mut comm) };
    if r != 0 {
        return Err(r);
    }
    g.comms.insert((d, comm), k);
    let st = g.ids.get_mut(&k).ok_or(libc::EINVAL)?;
    st.comm = Some(comm);
    st.state = St::Connecting;
    Ok(k)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_accept(
    id: *mut rdma_cm_id,
    conn_param: *mut rdma_conn_param,
) -> c_int {
    ret(accept(id, conn_param).and_then(cma::complete))
}

fn accept(id: *mut rdma_cm_id, p: *mut rdma_conn_param) -> Result<usize, c_int> {
    with(|g| {
        let (k, st) = g.id(id)?;
        if st.state != St::ConnectReq {
            return Err(libc::EINVAL);
        }
        let (d, comm) = (st.dev.ok_or(libc::EINVAL)?, st.comm.ok_or(libc::EINVAL)?);
        let defaults = (st.req_responder_resources, st.req_initiator_depth);
        // rdma-core's ucma_copy_ece_param_to_kern_rep: the REP answers with the REQ's
        // vendor ID ("the same ID as received") and this side's options.
        let ece = Ece {
            vendor_id: st.remote_ece.vendor_id,
            options: st.local_ece.options,
        };
        let qp = g.cid(k).cid.qp;
        let datagram = matches!(g.cid(k).cid.ps, ps::UDP | ps::IPOIB);
        if qp.is_null() && datagram {
            // The SIDR answer takes its Q_Key from the id's UD QP.
            return Err(libc::EOPNOTSUPP);
        }
        // As for rdma_connect: a program that moves its own QP names it in the parameters.
        if qp.is_null() && p.is_null() {
            return Err(libc::EINVAL);
        }
        let max = if datagram {
            SIDR_REP_PRIVATE_DATA_MAX
        } else {
            REP_PRIVATE_DATA_MAX
        };
        let mut param: CmParam = g.param(k, p, max, Some(defaults))?;
        param.ece = ece;
        // SAFETY: our context, the id's QP, a record living for the call.
        let r = unsafe { (g.v.cm.accept)(g.devs[d].ctx, comm, qp, &param) };
        if r != 0 {
            return Err(r);
        }
        let st = g.ids.get_mut(&k).ok_or(libc::EINVAL)?;
        // A SIDR answer is the whole exchange: the passive side sees no further event.
        st.state = if datagram {
            St::Connected
        } else {
            St::Accepting
        };
        st.conn = (param.responder_resources, param.initiator_depth);
        Ok(k)
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    ret(reject(
        id,
        private_data,
        private_data_len,
        REJ_CONSUMER_DEFINED,
    ))
}

/// REJ reason 28: the consumer refused (`rdma_reject`).
const REJ_CONSUMER_DEFINED: u16 = 28;
/// REJ reason 35: the consumer refused the ECE options asked for (`rdma_reject_ece`).
const REJ_VENDOR_OPTION_NOT_SUPPORTED: u16 = 35;

fn reject(id: *mut rdma_cm_id, data: *const c_void, len: u8, reason: u16) -> Result<(), c_int> {
    if usize::from(len) > REJ_PRIVATE_DATA_MAX || (len > 0 && data.is_null()) {
        return Err(libc::EINVAL);
    }
    with(|g| {
        let (_, st) = g.id(id)?;
        if st.state != St::ConnectReq {
            return Err(libc::EINVAL);
        }
        let (d, comm) = (st.dev.ok_or(libc::EINVAL)?, st.comm.ok_or(libc::EINVAL)?);
        st.state = St::Closed;
        // SAFETY: our context; the caller's `len` bytes at `data`.
        let r = unsafe { (g.v.cm.reject)(g.devs[d].ctx, comm, reason, data, len) };
        if r != 0 {
            return Err(r);
        }
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn rdma_reject_ece(
    id: *mut rdma_cm_id,
    private_data: *const c_void,
    private_data_len: u8,
) -> c_int {
    // As rdma-core: IBTA's "vendor option not supported".
    ret(reject(
        id,
        private_data,
        private_data_len,
        REJ_VENDOR_OPTION_NOT_SUPPORTED,
    ))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut rdma_cm_id) -> c_int {
    ret(with(|g| {
        let (_, st) = g.id(id)?;
        if st.state == St::Closed {
            // Already closed (the peer disconnected first, time-wait may be over too):
            // nothing left to send, as the kernel answers.
            return Ok(());
        }
        let (Some(d), Some(comm)) = (st.dev, st.comm) else {
            return Err(libc::EINVAL);
        };
        if !matches!(
            st.state,
            St::Connecting | St::Replied | St::Accepting | St::Connected
        ) {
            return Err(libc::EINVAL);
        }
        st.disconnecting = true;
        // SAFETY: our context.
        let r = unsafe { (g.v.cm.disconnect)(g.devs[d].ctx, comm, std::ptr::null(), 0) };
        if r != 0 && r != libc::EINVAL {
            return Err(r);
        }
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut rdma_event_channel,
    event: *mut *mut rdma_cm_event,
) -> c_int {
    if event.is_null() {
        return ret(Err(libc::EINVAL));
    }
    match cma::get_event(channel as usize) {
        Ok(e) => {
            // SAFETY: non-NULL out-pointer of the caller.
            unsafe { *event = e };
            0
        }
        Err(e) => ret(Err(e)),
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut rdma_cm_event) -> c_int {
    // `ev` is the first field of Ev: the event's address is the Ev's.
    ret(cma::ack(event as usize))
}

const EVENT_NAMES: [&std::ffi::CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

#[no_mangle]
pub extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    EVENT_NAMES
        .get(event as usize)
        .copied()
        .unwrap_or(c"UNKNOWN EVENT")
        .as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(
    id: *mut rdma_cm_id,
    channel: *mut rdma_event_channel,
) -> c_int {
    ret(cma::migrate(id as usize, channel as usize))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    ret(with(|g| {
        let (k, st) = g.id(id)?;
        if optval.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's option value of `optlen` bytes, checked per option.
        let byte = || unsafe { *(optval as *const u8) };
        // SAFETY: as above.
        let int = || unsafe { (optval as *const c_int).read_unaligned() };
        match (level, optname) {
            (opt::LEVEL_ID, opt::ID_TOS) if optlen == 1 => st.tos = byte(),
            (opt::LEVEL_ID, opt::ID_REUSEADDR) if optlen == size_of::<c_int>() => {
                st.reuseaddr = int() != 0
            }
            (opt::LEVEL_ID, opt::ID_AFONLY) if optlen == size_of::<c_int>() => {
                st.afonly = int() != 0
            }
            (opt::LEVEL_ID, opt::ID_ACK_TIMEOUT) if optlen == 1 => st.ack_timeout = byte(),
            (opt::LEVEL_ID, opt::ID_TOS | opt::ID_REUSEADDR | opt::ID_AFONLY)
            | (opt::LEVEL_ID, opt::ID_ACK_TIMEOUT) => return Err(libc::EINVAL),
            (opt::LEVEL_IB, opt::IB_PATH) => {
                // A path given by the program (from its own SA query) routes the id, as
                // the kernel takes it; RoCE paths are made from the IP addresses, so the
                // id's own path stands.
                if st.state != St::AddrResolved {
                    return Err(libc::EINVAL);
                }
                st.state = St::RouteResolved;
                let id_ = g.cid(k);
                id_.cid.route.num_paths = 1;
                id_.cid.route.path_rec = &mut id_.path;
            }
            // The kernel's ucma answers ENOSYS for options it does not know.
            _ => return Err(libc::ENOSYS),
        }
        Ok(())
    }))
}

fn port_of(id: *mut rdma_cm_id, dst: bool) -> u16 {
    with(|g| {
        let (k, _) = g.id(id)?;
        let r = &g.cid(k).cid.route.addr;
        Ok(storage_ip(if dst { &r.dst } else { &r.src }).map_or(0, |(_, p)| p))
    })
    .unwrap_or(0)
    .to_be()
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    port_of(id, false)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    port_of(id, true)
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut ibv_context {
    let ctxs = match with(|g| Ok(g.devs.iter().map(|d| d.ctx).collect::<Vec<_>>())) {
        Ok(c) => c,
        Err(e) => {
            cma::set_errno(e);
            return std::ptr::null_mut();
        }
    };
    // SAFETY: calloc of n + 1 pointers, NULL-checked; the last stays NULL.
    let list = unsafe { libc::calloc(ctxs.len() + 1, size_of::<*mut ibv_context>()) }
        as *mut *mut ibv_context;
    if list.is_null() {
        cma::set_errno(libc::ENOMEM);
        return list;
    }
    for (i, c) in ctxs.iter().enumerate() {
        // SAFETY: i < n, within the allocation.
        unsafe { *list.add(i) = *c };
    }
    if !num_devices.is_null() {
        // SAFETY: the caller's int.
        unsafe { *num_devices = ctxs.len() as c_int };
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: a list of rdma_get_devices (calloc) or NULL; the contexts stay open, as
    // rdma-core keeps them.
    unsafe { libc::free(list.cast()) }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_notify(id: *mut rdma_cm_id, _event: c_int) -> c_int {
    // The device's CM establishes connections on the RTU or the first packet itself;
    // a QP event passed on changes nothing, as for the kernel once established.
    ret(with(|g| {
        let (_, st) = g.id(id)?;
        if st.comm.is_none() {
            return Err(libc::EINVAL);
        }
        Ok(())
    }))
}

/// The RTU of a connection whose QP the program moved itself after CONNECT_RESPONSE (its
/// QP in RTS, from `rdma_init_qp_attr`): rdma-core's `ucma_process_conn_resp` without a
/// QP. No event follows on this side; the peer sees ESTABLISHED.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut rdma_cm_id) -> c_int {
    ret(with(|g| {
        let (k, st) = g.id(id)?;
        let (state, dev, comm) = (st.state, st.dev, st.comm);
        // rdma-core refuses an id with a QP (the CM moves it).
        if !g.cid(k).cid.qp.is_null() || state != St::Replied {
            return Err(libc::EINVAL);
        }
        let (Some(d), Some(comm)) = (dev, comm) else {
            return Err(libc::EINVAL);
        };
        // SAFETY: our context.
        let r = unsafe { (g.v.cm.establish)(g.devs[d].ctx, comm) };
        if r != 0 {
            return Err(r);
        }
        g.ids.get_mut(&k).ok_or(libc::EINVAL)?.state = St::Connected;
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_set_local_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ret(with(|g| {
        let (k, _) = g.id(id)?;
        if ece.is_null() || !g.cid(k).cid.qp.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct ibv_ece.
        let e = unsafe { *ece };
        if e.vendor_id == 0 || e.comp_mask != 0 {
            return Err(libc::EINVAL);
        }
        // Sent in the REQ (rdma_connect), or as the REP's options (rdma_accept).
        g.id(id)?.1.local_ece = ibv_ece {
            vendor_id: e.vendor_id,
            options: e.options,
            comp_mask: 0,
        };
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_get_remote_ece(id: *mut rdma_cm_id, ece: *mut ibv_ece) -> c_int {
    ret(with(|g| {
        let (k, st) = g.id(id)?;
        // rdma-core: all zero (and success) when the peer sent none or has not answered.
        let remote = ibv_ece {
            comp_mask: 0,
            ..st.remote_ece
        };
        if ece.is_null() || !g.cid(k).cid.qp.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct ibv_ece.
        unsafe { *ece = remote };
        Ok(())
    }))
}

#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut rdma_cm_id,
    qp_attr: *mut ibv_qp_attr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    ret(with(|g| {
        let (k, _) = g.id(id)?;
        if qp_attr.is_null() || qp_attr_mask.is_null() {
            return Err(libc::EINVAL);
        }
        let (dev, comm) = {
            let st = &g.ids[&k];
            (st.dev, st.comm)
        };
        let id_ = g.cid(k);
        if id_.cid.verbs.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's struct.
        let a = unsafe { &mut *qp_attr };
        match a.qp_state {
            qps::INIT => {
                let (attr, mask) = init_attr(id_.cid.ps);
                *a = attr;
                // SAFETY: the caller's int.
                unsafe { *qp_attr_mask = mask };
                Ok(())
            }
            // RTR and RTS as the connection's exchange decided them (Linux's
            // cm_init_qp_rtr_attr/_rts_attr): the device's CM keeps the PSNs and paths.
            qps::RTR | qps::RTS if !matches!(id_.cid.ps, ps::UDP | ps::IPOIB) => {
                let (Some(d), Some(comm)) = (dev, comm) else {
                    return Err(libc::EINVAL);
                };
                // SAFETY: our context; the caller's struct and int (checked non-NULL).
                let r = unsafe { (g.v.cm.init_qp_attr)(g.devs[d].ctx, comm, a, qp_attr_mask) };
                if r != 0 {
                    return Err(r);
                }
                Ok(())
            }
            // A UD QP goes to RTR and RTS with the state alone (and the SQ PSN for RTS).
            qps::RTR if matches!(id_.cid.ps, ps::UDP | ps::IPOIB) => {
                *a = ibv_qp_attr {
                    qp_state: qps::RTR,
                    ..ibv_qp_attr::default()
                };
                // SAFETY: the caller's int.
                unsafe { *qp_attr_mask = qp_mask::STATE };
                Ok(())
            }
            qps::RTS if matches!(id_.cid.ps, ps::UDP | ps::IPOIB) => {
                *a = ibv_qp_attr {
                    qp_state: qps::RTS,
                    sq_psn: 0,
                    ..ibv_qp_attr::default()
                };
                // SAFETY: the caller's int.
                unsafe { *qp_attr_mask = qp_mask::STATE | qp_mask::SQ_PSN };
                Ok(())
            }
            _ => Err(libc::EINVAL),
        }
    }))
}

/// The INIT attributes of a QP on an id of port space `ps_`: port 1, P_Key index 0, and
/// for connected QPs every remote access (the peer's READs need it once connected; the
/// device's CM keeps a QP's INIT attributes), for UD QPs `RDMA_UDP_QKEY`.
pub(crate) fn init_attr(ps_: u32) -> (ibv_qp_attr, c_int) {
    let mut a = ibv_qp_attr {
        qp_state: qps::INIT,
        port_num: 1,
        pkey_index: 0,
        ..ibv_qp_attr::default()
    };
    let base = qp_mask::STATE | qp_mask::PKEY_INDEX | qp_mask::PORT;
    if matches!(ps_, ps::UDP | ps::IPOIB) {
        a.qkey = RDMA_UDP_QKEY;
        (a, base | qp_mask::QKEY)
    } else {
        a.qp_access_flags =
            ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
        (a, base | qp_mask::ACCESS_FLAGS)
    }
}

symver!(
    rdma_create_event_channel,
    rdma_destroy_event_channel,
    rdma_create_id,
    rdma_destroy_id,
    rdma_bind_addr,
    rdma_resolve_addr,
    rdma_resolve_route,
    rdma_listen,
    rdma_connect,
    rdma_accept,
    rdma_reject,
    rdma_reject_ece,
    rdma_disconnect,
    rdma_get_cm_event,
    rdma_ack_cm_event,
    rdma_event_str,
    rdma_migrate_id,
    rdma_set_option,
    rdma_get_src_port,
    rdma_get_dst_port,
    rdma_get_devices,
    rdma_free_devices,
    rdma_notify,
    rdma_establish,
    rdma_set_local_ece,
    rdma_get_remote_ece,
    rdma_init_qp_attr,
);
