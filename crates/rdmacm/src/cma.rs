//! Event channels, ids and their events: the state librdmacm keeps, under one lock.
//!
//! Every id, channel and delivered event is a heap object whose address C holds; the
//! [`G`] tables, keyed by those addresses, say which are live, so no pointer from C is
//! dereferenced before it is found there.
//!
//! A channel's `fd` is an epoll descriptor over the channel's own eventfd (signalled while
//! its queue holds events) and the CM descriptor of every device (readable while the
//! device has events for this process). `rdma_get_cm_event` drains the devices, hands each
//! event to the id it is about (by device and comm ID; a connect request to the id
//! listening on its service ID), queues it on that id's current channel, and returns the
//! oldest of its own channel, waiting on the epoll descriptor if the channel is blocking.

use core::ffi::{c_int, c_void};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Condvar, Mutex, MutexGuard};

use abi::cm_ffi::{event as dev_ev, CmAddr, CmEventRec, CmParam, PRIVATE_DATA_MAX};

use crate::addr::{gid_of, ip_of_gid, storage_ip, write_sa};
use crate::ffi::*;
use crate::verbs::{verbs, Verbs};

/// READ/ATOMIC depth assumed for a device whose attributes cannot be read.
const DEFAULT_RD_ATOMIC: u8 = 16;

/// One device of the process, opened once for the life of the process (as rdma-core
/// keeps its devices open).
pub(crate) struct Dev {
    /// The context librdmacm opened; `id->verbs` of every id on the device.
    pub ctx: *mut ibv_context,
    /// The device's CM descriptor (owned by the context).
    pub cm_fd: c_int,
    /// Port 1's active MTU (`enum ibv_mtu`).
    pub mtu: u8,
    /// The GID table: index and GID.
    pub gids: Vec<(u8, [u8; 16])>,
    /// The PD rdma_create_qp uses when given none (allocated on first use).
    pub pd: *mut ibv_pd,
    /// READ/ATOMIC depth the device allows each way (`max_qp_rd_atom`,
    /// `max_qp_init_rd_atom`, the smaller): what `RDMA_MAX_RESP_RES` and
    /// `RDMA_MAX_INIT_DEPTH` stand for, and the cap rdma_connect/accept check against.
    pub max_rd: u8,
}

impl Dev {
    /// The GID index holding `ip`, if the device has it.
    pub fn gid_index(&self, ip: IpAddr) -> Option<u8> {
        let g = gid_of(ip);
        self.gids.iter().find(|(_, x)| *x == g).map(|(i, _)| *i)
    }
}

/// Where an id is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum St {
    /// Created.
    Idle,
    /// `rdma_bind_addr` done.
    Bound,
    /// `rdma_resolve_addr` done.
    AddrResolved,
    /// `rdma_resolve_route` done.
    RouteResolved,
    /// Listening.
    Listen,
    /// A connect request not yet answered (passive side).
    ConnectReq,
    /// `rdma_connect` sent the REQ (active side).
    Connecting,
    /// CONNECT_RESPONSE delivered (active side, the program moves its QP): waiting for
    /// `rdma_establish`.
    Replied,
    /// `rdma_accept` sent the REP (passive side).
    Accepting,
    /// ESTABLISHED delivered.
    Connected,
    /// Disconnected, rejected, unreachable or failed: the connection is gone.
    Closed,
}

/// What librdmacm knows about an id beyond `struct rdma_cm_id`.
pub(crate) struct IdSt {
    pub state: St,
    /// Index of its device in [`G::devs`], once bound to one.
    pub dev: Option<usize>,
    /// The device CM's connection.
    pub comm: Option<u32>,
    /// The (device, service ID) pairs it listens on.
    pub listening: Vec<(usize, u64)>,
    /// Events delivered by `rdma_get_cm_event` and not yet acknowledged.
    pub outstanding: u32,
    /// The private channel of a synchronous id (created with no channel).
    pub sync_chan: Option<usize>,
    /// `RDMA_OPTION_ID_TOS`.
    pub tos: u8,
    /// `RDMA_OPTION_ID_REUSEADDR`.
    pub reuseaddr: bool,
    /// `RDMA_OPTION_ID_AFONLY`.
    pub afonly: bool,
    /// `RDMA_OPTION_ID_ACK_TIMEOUT` (0: the device's default).
    pub ack_timeout: u8,
    /// `rdma_set_local_ece` (zeroed when a QP is made on the id, as rdma-core's
    /// `init_ece` takes the QP's, which this device has none of).
    pub local_ece: ibv_ece,
    /// The peer's ECE (`rdma_get_remote_ece`): the REQ's on a passive id, the REP's on an
    /// active one.
    pub remote_ece: ibv_ece,
    /// From the connect request: what rdma_accept(NULL) answers with.
    pub req_responder_resources: u8,
    /// From the connect request.
    pub req_initiator_depth: u8,
    /// The peer's QP number, once known.
    pub remote_qpn: u32,
    /// What rdma_create_ep gave a passive id, for the QPs of rdma_get_request.
    pub ep_qp_attr: Option<ibv_qp_init_attr>,
    /// rdma_create_qp made the send CQ and its channel.
    pub own_send_cq: bool,
    /// rdma_create_qp made the receive CQ and its channel.
    pub own_recv_cq: bool,
    /// What rdma_connect asked for (reported back in ESTABLISHED).
    pub conn: (u8, u8),
    /// rdma_disconnect sent the DREQ; DISCONNECTED follows the peer's DREP.
    pub disconnecting: bool,
    /// The multicast groups joined (`rdma_join_multicast`).
    pub groups: Vec<crate::mcast::Group>,
}

impl IdSt {
    fn new() -> IdSt {
        IdSt {
            state: St::Idle,
            dev: None,
            comm: None,
            listening: Vec::new(),
            outstanding: 0,
            sync_chan: None,
            tos: 0,
            reuseaddr: false,
            afonly: false,
            ack_timeout: 0,
            local_ece: ibv_ece::default(),
            remote_ece: ibv_ece::default(),
            req_responder_resources: 0,
            req_initiator_depth: 0,
            remote_qpn: 0,
            ep_qp_attr: None,
            own_send_cq: false,
            own_recv_cq: false,
            conn: (0, 0),
            disconnecting: false,
            groups: Vec::new(),
        }
    }
}

/// An id: the C struct, then its one path record (`route.path_rec` points at it).
#[repr(C)]
pub(crate) struct Id {
    pub cid: rdma_cm_id,
    pub path: ibv_sa_path_rec,
}

/// A channel as C sees it.
#[repr(C)]
pub(crate) struct Chan {
    pub ch: rdma_event_channel,
}

/// A channel's queue.
pub(crate) struct ChanSt {
    /// Signalled while `queue` is not empty.
    pub evfd: c_int,
    /// Events not yet taken, oldest first.
    pub queue: VecDeque<usize>,
}

/// An event: the C struct, the id whose acknowledgement count it holds, and room for its
/// private data (valid until it is acknowledged, as rdma-core promises).
#[repr(C)]
pub(crate) struct Ev {
    pub ev: rdma_cm_event,
    pub counted: usize,
    pub data: [u8; PRIVATE_DATA_MAX],
}

/// Everything librdmacm tracks.
pub(crate) struct G {
    pub v: &'static Verbs,
    pub devs: Vec<Dev>,
    pub ids: HashMap<usize, IdSt>,
    pub chans: HashMap<usize, ChanSt>,
    /// Events handed to the program and not yet acknowledged.
    pub events: HashMap<usize, usize>,
    /// (device, comm ID) → id.
    pub comms: HashMap<(usize, u32), usize>,
}

// SAFETY: the raw pointers in G name objects owned by this library (or by libibverbs, which
// is thread-safe); G is only reached under its mutex.
unsafe impl Send for G {}

static STATE: Mutex<Option<G>> = Mutex::new(None);
/// Signalled whenever an event is acknowledged (rdma_destroy_id waits on it).
static ACKED: Condvar = Condvar::new();

/// The lock over everything, the devices opened on first use.
pub(crate) fn lock() -> Result<MutexGuard<'static, Option<G>>, c_int> {
    let v = verbs()?;
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    if g.is_none() {
        *g = Some(G {
            v,
            devs: open_devices(v),
            ids: HashMap::new(),
            chans: HashMap::new(),
            events: HashMap::new(),
            comms: HashMap::new(),
        });
    }
    Ok(g)
}

/// Run `f` on the state.
pub(crate) fn with<R>(f: impl FnOnce(&mut G) -> Result<R, c_int>) -> Result<R, c_int> {
    let mut g = lock()?;
    match g.as_mut() {
        Some(g) => f(g),
        None => Err(libc::ENODEV),
    }
}

fn open_devices(v: &Verbs) -> Vec<Dev> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer.
    let list = unsafe { (v.get_device_list)(&mut n) };
    if list.is_null() {
        return Vec::new();
    }
    let mut devs = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list has `n` entries.
        let d = unsafe { *list.add(i) };
        // SAFETY: a device of the list just returned.
        let ctx = unsafe { (v.open_device)(d) };
        if ctx.is_null() {
            continue;
        }
        // SAFETY: a context of softrdma's libibverbs (checked when it was loaded).
        let fd = unsafe { (v.cm.open)(ctx) };
        if fd < 0 {
            eprintln!(
                "librdmacm (softrdma): device {i} has no connection manager (errno {})",
                -fd
            );
            continue;
        }
        // struct ibv_port_attr: state, max_mtu, active_mtu, gid_tbl_len, ... (room to
        // spare for its later fields).
        let mut port = [0u32; 32];
        // SAFETY: `port` is larger than struct ibv_port_attr.
        let r = unsafe { (v.query_port)(ctx, 1, port.as_mut_ptr().cast()) };
        let (mtu, tbl) = if r == 0 {
            (
                port[PORT_ATTR_ACTIVE_MTU / 4] as u8,
                (port[PORT_ATTR_GID_TBL_LEN / 4] as i32).clamp(0, 64),
            )
        } else {
            (3, 16)
        };
        let mut gids = Vec::new();
        for idx in 0..tbl {
            let mut g = ibv_gid::default();
            // SAFETY: `g` is a 16-byte GID.
            if unsafe { (v.query_gid)(ctx, 1, idx, &mut g) } == 0 && g.raw != [0; 16] {
                gids.push((idx as u8, g.raw));
            }
        }
        // struct ibv_device_attr is 232 bytes; room to spare.
        let mut attr = [0u8; 512];
        // SAFETY: `attr` is larger than struct ibv_device_attr.
        let max_rd = if unsafe { (v.query_device)(ctx, attr.as_mut_ptr().cast()) } == 0 {
            let int = |o: usize| {
                i32::from_ne_bytes(attr[o..o + 4].try_into().expect("4 bytes in bounds"))
            };
            int(DEVICE_ATTR_MAX_QP_RD_ATOM)
                .min(int(DEVICE_ATTR_MAX_QP_INIT_RD_ATOM))
                .clamp(0, 255) as u8
        } else {
            DEFAULT_RD_ATOMIC
        };
        devs.push(Dev {
            ctx,
            cm_fd: fd,
            mtu,
            gids,
            pd: std::ptr::null_mut(),
            max_rd,
        });
    }
    // SAFETY: the list came from get_device_list; opened contexts outlive it.
    unsafe { (v.free_device_list)(list) };
    devs
}

/// `errno = e`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// rdma-core's return convention: 0, or -1 with errno.
pub(crate) fn ret(r: Result<(), c_int>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

impl G {
    /// The id behind a C pointer, if it is a live one.
    pub fn id(&mut self, id: *mut rdma_cm_id) -> Result<(usize, &mut IdSt), c_int> {
        let k = id as usize;
        self.ids.get_mut(&k).map(|s| (k, s)).ok_or(libc::EINVAL)
    }

    /// The C struct of a live id.
    pub fn cid(&self, k: usize) -> &'static mut Id {
        debug_assert!(self.ids.contains_key(&k));
        // SAFETY: `k` is a key of `ids`, i.e. a live Box<Id> made by new_id and freed only
        // after its removal from `ids`; access is serialized by the state lock.
        unsafe { &mut *(k as *mut Id) }
    }

    /// A new channel (its epoll set over its eventfd and every device).
    pub fn new_chan(&mut self) -> Result<usize, c_int> {
        // SAFETY: plain descriptor calls, results checked.
        let (ep, evfd) = unsafe {
            let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if ep < 0 {
                return Err(errno());
            }
            let evfd = libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK);
            if evfd < 0 {
                let e = errno();
                libc::close(ep);
                return Err(e);
            }
            (ep, evfd)
        };
        for fd in std::iter::once(evfd).chain(self.devs.iter().map(|d| d.cm_fd)) {
            let mut e = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: fd as u64,
            };
            // SAFETY: both descriptors are open; `e` is a valid event.
            unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut e) };
        }
        let c = Box::into_raw(Box::new(Chan {
            ch: rdma_event_channel { fd: ep },
        })) as usize;
        self.chans.insert(
            c,
            ChanSt {
                evfd,
                queue: VecDeque::new(),
            },
        );
        Ok(c)
    }

    /// Close channel `c` (its queued events are freed).
    pub fn free_chan(&mut self, c: usize) {
        if let Some(st) = self.chans.remove(&c) {
            for e in st.queue {
                // SAFETY: queued events are live Box<Ev>s owned by the queue.
                drop(unsafe { Box::from_raw(e as *mut Ev) });
            }
            // SAFETY: `c` is a Box<Chan> of new_chan; its descriptors are ours.
            unsafe {
                let ch = Box::from_raw(c as *mut Chan);
                libc::close(ch.ch.fd);
                libc::close(st.evfd);
            }
        }
    }

    /// Queue `ev` on channel `c` (freed if the channel is gone).
    pub fn push(&mut self, c: usize, ev: Box<Ev>) {
        match self.chans.get_mut(&c) {
            Some(st) => {
                if st.queue.is_empty() {
                    let one: u64 = 1;
                    // SAFETY: writes 8 bytes to the channel's eventfd.
                    unsafe { libc::write(st.evfd, (&one as *const u64).cast(), 8) };
                }
                st.queue.push_back(Box::into_raw(ev) as usize);
            }
            None => drop(ev),
        }
    }

    /// The oldest event of channel `c`.
    pub fn pop(&mut self, c: usize) -> Option<usize> {
        let st = self.chans.get_mut(&c)?;
        let e = st.queue.pop_front()?;
        if st.queue.is_empty() {
            let mut n: u64 = 0;
            // SAFETY: reads 8 bytes from the (non-blocking) eventfd, clearing it.
            unsafe { libc::read(st.evfd, (&mut n as *mut u64).cast(), 8) };
        }
        Some(e)
    }

    /// An event about id `k`, counted against `counted`, for id `k`'s channel.
    pub fn new_event(&self, k: usize, event: u32, status: c_int) -> Box<Ev> {
        let mut e = Box::new(Ev {
            ev: rdma_cm_event {
                id: k as *mut rdma_cm_id,
                listen_id: std::ptr::null_mut(),
                event,
                status,
                param: rdma_cm_event_param {
                    ud: rdma_ud_param {
                        private_data: std::ptr::null(),
                        private_data_len: 0,
                        ah_attr: ibv_ah_attr::default(),
                        qp_num: 0,
                        qkey: 0,
                    },
                },
            },
            counted: k,
            data: [0; PRIVATE_DATA_MAX],
        });
        e.ev.param.conn = rdma_conn_param {
            private_data: std::ptr::null(),
            private_data_len: 0,
            responder_resources: 0,
            initiator_depth: 0,
            flow_control: 0,
            retry_count: 0,
            rnr_retry_count: 0,
            srq: 0,
            qp_num: 0,
        };
        e
    }

    /// Queue an event librdmacm makes itself (address and route resolution) for id `k`.
    pub fn post(&mut self, k: usize, event: u32, status: c_int) {
        let e = self.new_event(k, event, status);
        let c = self.cid(k).cid.channel as usize;
        self.push(c, e);
    }

    /// Take every event the devices hold and queue each for its id.
    pub fn pump(&mut self) {
        for d in 0..self.devs.len() {
            loop {
                let mut rec = CmEventRec::default();
                // SAFETY: a context of ours and a record to fill.
                let r = unsafe { (self.v.cm.get_event)(self.devs[d].ctx, &mut rec) };
                if r != 0 {
                    break;
                }
                self.deliver(d, &rec);
            }
        }
    }

    fn deliver(&mut self, d: usize, rec: &CmEventRec) {
        if rec.kind == dev_ev::CONNECT_REQUEST {
            self.deliver_request(d, rec);
            return;
        }
        let Some(&k) = self.comms.get(&(d, rec.comm_id)) else {
            // The id is gone (destroyed before the device's event came).
            return;
        };
        if !self.ids.contains_key(&k) {
            return;
        }
        let datagram = matches!(self.cid(k).cid.ps, ps::UDP | ps::IPOIB);
        if datagram && matches!(rec.kind, dev_ev::RESOLVED | dev_ev::UNREACHABLE) {
            self.deliver_resolution(d, k, rec);
            return;
        }
        if rec.kind == dev_ev::TIMEWAIT_EXIT {
            // The device's CM forgot the connection: nothing left to destroy there.
            self.comms.remove(&(d, rec.comm_id));
            if let Some(st) = self.ids.get_mut(&k) {
                st.comm = None;
            }
        }
        let Some(st) = self.ids.get_mut(&k) else {
            return;
        };
        let (event, status, data) = match rec.kind {
            dev_ev::ESTABLISHED => {
                if st.state == St::Connecting {
                    // The REP, on an id whose QP the device moved: rdma-core's
                    // ucma_process_conn_resp_ece keeps its vendor ID (its options went to
                    // the QP, which this device does not take).
                    st.remote_ece.vendor_id = rec.ece.vendor_id;
                }
                st.state = St::Connected;
                (ev::ESTABLISHED, 0, rec.private_data())
            }
            dev_ev::CONNECT_RESPONSE => {
                st.state = St::Replied;
                st.remote_qpn = rec.remote_qpn;
                st.remote_ece = ece_of(rec);
                (ev::CONNECT_RESPONSE, 0, rec.private_data())
            }
            dev_ev::REJECTED => {
                st.state = St::Closed;
                (ev::REJECTED, rec.status, rec.private_data())
            }
            dev_ev::UNREACHABLE => {
                st.state = St::Closed;
                (ev::UNREACHABLE, -libc::ETIMEDOUT, &[][..])
            }
            dev_ev::CONNECT_ERROR => {
                st.state = St::Closed;
                (ev::CONNECT_ERROR, -rec.status.abs(), &[][..])
            }
            dev_ev::DISCONNECTED => {
                st.state = St::Closed;
                (ev::DISCONNECTED, 0, &[][..])
            }
            dev_ev::TIMEWAIT_EXIT => (ev::TIMEWAIT_EXIT, 0, &[][..]),
            _ => return,
        };
        let conn = st.conn;
        let remote_qpn = st.remote_qpn;
        let mut e = self.new_event(k, event, status);
        let n = data.len().min(PRIVATE_DATA_MAX).min(255);
        e.data[..n].copy_from_slice(&data[..n]);
        // SAFETY: `conn` is the variant new_event wrote.
        unsafe {
            let c = &mut e.ev.param.conn;
            if n > 0 {
                c.private_data = e.data.as_ptr().cast();
                c.private_data_len = n as u8;
            }
            c.responder_resources = conn.0;
            c.initiator_depth = conn.1;
            c.qp_num = remote_qpn;
        }
        let c = self.cid(k).cid.channel as usize;
        self.push(c, e);
    }

    /// The answer to a datagram id's SIDR request (Linux's `cma_sidr_rep_handler`):
    /// ESTABLISHED with `param.ud` (an address vector to the peer, its UD QP and Q_Key),
    /// or UNREACHABLE with the peer's SIDR status (`-ETIMEDOUT` when it never answered).
    /// Either way with the SIDR_REP's private data.
    fn deliver_resolution(&mut self, d: usize, k: usize, rec: &CmEventRec) {
        let resolved = rec.kind == dev_ev::RESOLVED;
        let (event, status) = match (resolved, rec.status) {
            (true, _) => (ev::ESTABLISHED, 0),
            (false, 0) => (ev::UNREACHABLE, -libc::ETIMEDOUT),
            (false, s) => (ev::UNREACHABLE, s),
        };
        if let Some(st) = self.ids.get_mut(&k) {
            st.state = if resolved { St::Connected } else { St::Closed };
        }
        let mut e = self.new_event(k, event, status);
        let data = rec.private_data();
        let n = data.len().min(PRIVATE_DATA_MAX).min(255);
        e.data[..n].copy_from_slice(&data[..n]);
        let ah_attr = self.ud_ah_attr(d, k, self.cid(k).cid.route.addr.ibaddr.dgid.raw);
        // SAFETY: a UD event: `ud` is the variant that counts; new_event wrote both.
        unsafe {
            let u = &mut e.ev.param.ud;
            if n > 0 {
                u.private_data = e.data.as_ptr().cast();
                u.private_data_len = n as u8;
            }
            if resolved {
                u.ah_attr = ah_attr;
                u.qp_num = rec.remote_qpn;
                u.qkey = rec.qkey;
            }
        }
        let c = self.cid(k).cid.channel as usize;
        self.push(c, e);
    }

    /// The address vector from id `k` on device `d` to `dgid` (its peer, or a group), as
    /// the kernel builds it from the route for RoCE (`ib_init_ah_attr_from_path`): global,
    /// the route's source GID and hop limit, port 1.
    pub fn ud_ah_attr(&self, d: usize, k: usize, dgid: [u8; 16]) -> ibv_ah_attr {
        let id = self.cid(k);
        let sgid = id.cid.route.addr.ibaddr.sgid.raw;
        let sgid_index = self.devs[d].gid_index(ip_of_gid(sgid)).unwrap_or(0);
        ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: dgid },
                flow_label: 0,
                sgid_index,
                hop_limit: id.path.hop_limit,
                traffic_class: id.path.traffic_class,
            },
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: 1,
            port_num: 1,
        }
    }

    fn deliver_request(&mut self, d: usize, rec: &CmEventRec) {
        let listener = self
            .ids
            .iter()
            .find(|(_, s)| s.state == St::Listen && s.listening.contains(&(d, rec.service_id)))
            .map(|(k, _)| *k);
        let ctx = self.devs[d].ctx;
        let Some(l) = listener else {
            // Nobody listens any more: say so to the peer.
            // SAFETY: a context of ours.
            unsafe { (self.v.cm.reject)(ctx, rec.comm_id, 0, std::ptr::null(), 0) };
            return;
        };
        let lsync = self.ids.get(&l).and_then(|s| s.sync_chan).is_some();
        let lid = self.cid(l);
        let (lchan, lcontext, lps, lqpt) = (
            lid.cid.channel as usize,
            lid.cid.context,
            lid.cid.ps,
            lid.cid.qp_type,
        );
        let lport = storage_ip(&lid.cid.route.addr.src).map_or(0, |(_, p)| p);
        // A synchronous listener's requests get synchronous ids (rdma-core migrates them to
        // a private channel); the event itself goes to the listener's channel.
        let chan = if lsync {
            match self.new_chan() {
                Ok(c) => Some(c),
                Err(_) => {
                    // SAFETY: a context of ours.
                    unsafe { (self.v.cm.reject)(ctx, rec.comm_id, 0, std::ptr::null(), 0) };
                    return;
                }
            }
        } else {
            None
        };
        let k = self.new_id(chan.unwrap_or(lchan), lcontext, lps, lqpt);
        let local = rec.local.ip();
        let peer = rec.peer.ip();
        let sgid = gid_of(local);
        let (mtu, max_rd) = (self.devs[d].mtu, self.devs[d].max_rd);
        {
            let st = self.ids.get_mut(&k).expect("just inserted");
            st.state = St::ConnectReq;
            st.dev = Some(d);
            st.comm = Some(rec.comm_id);
            st.sync_chan = chan;
            // The kernel hands the REQ's numbers over from the listener's point of view:
            // what the peer accepts outstanding is what this side may initiate.
            st.req_initiator_depth = rec.responder_resources.min(max_rd);
            st.req_responder_resources = rec.initiator_depth.min(max_rd);
            st.remote_qpn = rec.remote_qpn;
            st.conn = (st.req_responder_resources, st.req_initiator_depth);
            // rdma-core's ucma_process_conn_req: the REQ's ECE, for rdma_get_remote_ece
            // and for the REP's vendor ID.
            st.remote_ece = ece_of(rec);
        }
        // As rdma-core's ucma_get_device: the id has the device's PD with its context (a
        // failed allocation leaves it NULL; rdma_create_qp then tries again).
        let pd = crate::qp::device_pd(self, d).unwrap_or(std::ptr::null_mut());
        let id = self.cid(k);
        id.cid.verbs = ctx;
        id.cid.pd = pd;
        id.cid.port_num = 1;
        write_sa(&mut id.cid.route.addr.src, local, lport);
        write_sa(&mut id.cid.route.addr.dst, peer, rec.peer.port);
        fill_route(id, sgid, gid_of(peer), mtu, 0);
        self.comms.insert((d, rec.comm_id), k);

        let mut e = self.new_event(k, ev::CONNECT_REQUEST, 0);
        e.ev.listen_id = l as *mut rdma_cm_id;
        e.counted = l;
        let data = rec.private_data();
        let n = data.len().min(255);
        e.data[..n].copy_from_slice(&data[..n]);
        if matches!(lps, ps::UDP | ps::IPOIB) {
            // A SIDR request: `param.ud` (Linux's `cma_ib_req_handler` hands over the
            // private data only; the address vector to the peer is added for programs
            // that answer by datagram).
            let ah_attr = self.ud_ah_attr(d, k, gid_of(peer));
            // SAFETY: `ud` is the variant that counts for a UD event.
            unsafe {
                let u = &mut e.ev.param.ud;
                u.private_data = e.data.as_ptr().cast();
                u.private_data_len = n as u8;
                u.ah_attr = ah_attr;
                u.qp_num = 0;
                u.qkey = 0;
            }
            self.push(lchan, e);
            return;
        }
        let (rr, id_) = {
            let st = &self.ids[&k];
            (st.req_responder_resources, st.req_initiator_depth)
        };
        // SAFETY: `conn` is the variant new_event wrote.
        unsafe {
            let c = &mut e.ev.param.conn;
            c.private_data = e.data.as_ptr().cast();
            c.private_data_len = n as u8;
            c.responder_resources = rr;
            c.initiator_depth = id_;
            c.retry_count = 7;
            c.rnr_retry_count = 7;
            c.qp_num = rec.remote_qpn;
        }
        self.push(lchan, e);
    }

    /// A new id on channel `chan`.
    pub fn new_id(&mut self, chan: usize, context: *mut c_void, ps: u32, qp_type: u32) -> usize {
        let mut id = Box::new(Id {
            // SAFETY: an all-zero rdma_cm_id (NULL pointers, zero numbers) is valid.
            cid: unsafe { std::mem::zeroed() },
            path: ibv_sa_path_rec::default(),
        });
        id.cid.channel = chan as *mut rdma_event_channel;
        id.cid.context = context;
        id.cid.ps = ps;
        id.cid.qp_type = qp_type;
        let k = Box::into_raw(id) as usize;
        self.ids.insert(k, IdSt::new());
        k
    }

    /// Whether `port` of port space `ps` is taken by an id other than `except`.
    pub fn port_in_use(&self, ps: u32, port: u16, except: usize) -> bool {
        self.ids.iter().any(|(k, s)| {
            *k != except
                && s.state != St::Idle
                && !matches!(s.state, St::ConnectReq | St::Accepting)
                && {
                    let id = self.cid(*k);
                    id.cid.ps == ps
                        && storage_ip(&id.cid.route.addr.src).is_some_and(|(_, p)| p == port)
                }
        })
    }

    /// The device holding `ip` (by its GID table).
    pub fn dev_of(&self, ip: IpAddr) -> Option<usize> {
        self.devs.iter().position(|d| d.gid_index(ip).is_some())
    }

    /// The first device with an address of `ip`'s family, and that address.
    pub fn first_of_family(&self, ip: IpAddr) -> Option<(usize, IpAddr)> {
        self.devs.iter().enumerate().find_map(|(i, d)| {
            d.gids.iter().find_map(|(_, g)| {
                let a = ip_of_gid(*g);
                let ok = match (a, ip) {
                    (IpAddr::V4(_), IpAddr::V4(_)) => true,
                    (IpAddr::V6(x), IpAddr::V6(_)) => (x.segments()[0] & 0xffc0) != 0xfe80,
                    _ => false,
                };
                ok.then_some((i, a))
            })
        })
    }

    /// Drop queued events counted against `k`; a connect request's new id goes with it.
    pub fn purge(&mut self, k: usize) {
        let mut orphans = Vec::new();
        for st in self.chans.values_mut() {
            st.queue.retain(|&e| {
                // SAFETY: queued events are live Box<Ev>s.
                let ev = unsafe { &*(e as *const Ev) };
                if ev.counted != k && ev.ev.id as usize != k {
                    return true;
                }
                if ev.ev.event == ev::CONNECT_REQUEST && ev.ev.id as usize != k {
                    orphans.push(ev.ev.id as usize);
                }
                // SAFETY: removed from the queue, so freed once.
                drop(unsafe { Box::from_raw(e as *mut Ev) });
                false
            });
        }
        for o in orphans {
            self.drop_unclaimed(o);
        }
    }

    /// Reject and forget the id of a connect request the program never saw.
    fn drop_unclaimed(&mut self, k: usize) {
        let Some(st) = self.ids.remove(&k) else {
            return;
        };
        if let (Some(d), Some(c)) = (st.dev, st.comm) {
            self.comms.remove(&(d, c));
            // SAFETY: a context of ours.
            unsafe { (self.v.cm.reject)(self.devs[d].ctx, c, 0, std::ptr::null(), 0) };
        }
        if let Some(c) = st.sync_chan {
            self.free_chan(c);
        }
        // SAFETY: `k` was a live Box<Id>, now out of every table.
        drop(unsafe { Box::from_raw(k as *mut Id) });
    }

    /// Build the device CM's parameters from a C `rdma_conn_param` (NULL: defaults).
    /// `defaults` (responder resources, initiator depth) stand when `p` is NULL; `None`:
    /// the device's maximum, as rdma-core asks for.
    pub fn param(
        &self,
        k: usize,
        p: *const rdma_conn_param,
        max_private: usize,
        defaults: Option<(u8, u8)>,
    ) -> Result<CmParam, c_int> {
        let st = self.ids.get(&k).ok_or(libc::EINVAL)?;
        let max_rd = st
            .dev
            .and_then(|d| self.devs.get(d))
            .map_or(DEFAULT_RD_ATOMIC, |d| d.max_rd);
        let defaults = defaults.unwrap_or((max_rd, max_rd));
        let id = self.cid(k);
        let mut out = CmParam {
            responder_resources: defaults.0,
            initiator_depth: defaults.1,
            ack_timeout: st.ack_timeout,
            src_port: storage_ip(&id.cid.route.addr.src).map_or(0, |(_, p)| p),
            ..CmParam::default()
        };
        if p.is_null() {
            return Ok(out);
        }
        // SAFETY: non-NULL, the caller's struct rdma_conn_param.
        let p = unsafe { &*p };
        let n = usize::from(p.private_data_len);
        if n > max_private || (n > 0 && p.private_data.is_null()) {
            return Err(libc::EINVAL);
        }
        if n > 0 {
            // SAFETY: the caller's buffer holds private_data_len bytes.
            let s = unsafe { std::slice::from_raw_parts(p.private_data as *const u8, n) };
            out.private_data[..n].copy_from_slice(s);
            out.private_data_len = n as u16;
        }
        // rdma-core: RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH (0xff) mean the device's
        // maximum; any other value above it is EINVAL.
        let cap = |v: u8| if v == 0xff { max_rd } else { v };
        if (p.responder_resources != 0xff && p.responder_resources > max_rd)
            || (p.initiator_depth != 0xff && p.initiator_depth > max_rd)
        {
            return Err(libc::EINVAL);
        }
        out.responder_resources = cap(p.responder_resources);
        out.initiator_depth = cap(p.initiator_depth);
        out.retry_count = p.retry_count.min(7);
        out.rnr_retry_count = p.rnr_retry_count.min(7);
        // rdma-core: the QP number the id's QP has, or with none the caller's.
        out.qp_num = p.qp_num & 0xff_ffff;
        Ok(out)
    }
}

/// The ECE a device event reports, as `struct ibv_ece` holds it.
fn ece_of(rec: &CmEventRec) -> ibv_ece {
    ibv_ece {
        vendor_id: rec.ece.vendor_id,
        options: rec.ece.options,
        comp_mask: 0,
    }
}

/// The id's route once addresses are known: GIDs, P_Key, one path record.
pub(crate) fn fill_route(id: &mut Id, sgid: [u8; 16], dgid: [u8; 16], mtu: u8, tos: u8) {
    id.cid.route.addr.ibaddr = rdma_ib_addr {
        sgid: ibv_gid { raw: sgid },
        dgid: ibv_gid { raw: dgid },
        pkey: 0xffffu16.to_be(),
    };
    id.path = ibv_sa_path_rec {
        dgid: ibv_gid { raw: dgid },
        sgid: ibv_gid { raw: sgid },
        // RoCEv2 routes by IP: hop limit as a routed path, reversible, one path.
        hop_limit: 64,
        traffic_class: tos,
        reversible: 1,
        numb_path: 1,
        pkey: 0xffffu16.to_be(),
        // Selector 2: exactly this value.
        mtu_selector: 2,
        mtu,
        rate_selector: 2,
        rate: 3,
        packet_life_time_selector: 2,
        // Linux's CMA_IBOE_PACKET_LIFETIME.
        packet_life_time: 16,
        ..ibv_sa_path_rec::default()
    };
    id.cid.route.path_rec = &mut id.path;
    id.cid.route.num_paths = 1;
}

/// The calling thread's errno.
pub(crate) fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Whether `SOFTRDMA_RDMACM_DEBUG` asks for a line on stderr per event delivered.
pub(crate) fn debug() -> bool {
    static D: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *D.get_or_init(|| std::env::var_os("SOFTRDMA_RDMACM_DEBUG").is_some_and(|v| v != "0"))
}

/// Take the next event of channel `c`, waiting if its descriptor is blocking.
pub(crate) fn get_event(c: usize) -> Result<*mut rdma_cm_event, c_int> {
    loop {
        let fd = {
            let mut g = lock()?;
            let g = g.as_mut().ok_or(libc::ENODEV)?;
            if !g.chans.contains_key(&c) {
                return Err(libc::EINVAL);
            }
            g.pump();
            if let Some(e) = g.pop(c) {
                // SAFETY: a live Box<Ev> just taken from the queue.
                let ev = unsafe { &mut *(e as *mut Ev) };
                if let Some(st) = g.ids.get_mut(&ev.counted) {
                    st.outstanding += 1;
                }
                g.events.insert(e, ev.counted);
                if debug() {
                    eprintln!(
                        "librdmacm (softrdma): event {} status {} id {:#x}",
                        ev.ev.event, ev.ev.status, ev.ev.id as usize
                    );
                }
                return Ok(&mut ev.ev);
            }
            // SAFETY: `c` is a live channel.
            unsafe { (*(c as *const Chan)).ch.fd }
        };
        // SAFETY: fcntl on our own epoll descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
            return Err(libc::EAGAIN);
        }
        let mut e = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: waits on our epoll descriptor for one event into `e`. The channel may be
        // destroyed meanwhile only by a program breaking rdma-core's rules; then epoll_wait
        // fails and the next round finds the channel gone.
        let r = unsafe { libc::epoll_wait(fd, &mut e, 1, -1) };
        if r < 0 && errno() != libc::EINTR {
            return Err(errno());
        }
    }
}

/// Acknowledge event `e`.
pub(crate) fn ack(e: usize) -> Result<(), c_int> {
    with(|g| {
        let k = g.events.remove(&e).ok_or(libc::EINVAL)?;
        if let Some(st) = g.ids.get_mut(&k) {
            st.outstanding = st.outstanding.saturating_sub(1);
        }
        // SAFETY: `e` was a delivered Box<Ev>, now out of the table.
        drop(unsafe { Box::from_raw(e as *mut Ev) });
        ACKED.notify_all();
        Ok(())
    })
}

/// For a synchronous id, wait for the event its last call causes, as rdma-core's
/// `ucma_complete`: the previous event is acknowledged, the new one kept in `id->event`, and
/// an error event becomes the call's errno.
pub(crate) fn complete(k: usize) -> Result<(), c_int> {
    let (chan, prev) = with(|g| {
        let st = g.ids.get(&k).ok_or(libc::EINVAL)?;
        let Some(c) = st.sync_chan else {
            return Ok((None, 0));
        };
        let id = g.cid(k);
        let prev = id.cid.event as usize;
        id.cid.event = std::ptr::null_mut();
        Ok((Some(c), prev))
    })?;
    let Some(chan) = chan else {
        return Ok(());
    };
    if prev != 0 {
        let _ = ack(prev);
    }
    let e = get_event(chan)?;
    with(|g| {
        g.cid(k).cid.event = e;
        Ok(())
    })?;
    // SAFETY: a delivered, not yet acknowledged event.
    let (event, status) = unsafe { ((*e).event, (*e).status) };
    if status == 0 {
        Ok(())
    } else if event == ev::REJECTED {
        Err(libc::ECONNREFUSED)
    } else {
        Err(status.abs())
    }
}

/// Destroy id `k`: leave the device CM, drop its queued events, wait until the program has
/// acknowledged the ones it got, free it.
pub(crate) fn destroy(k: usize) -> Result<(), c_int> {
    let held = with(|g| {
        g.id(k as *mut rdma_cm_id)?;
        let id = g.cid(k);
        let held = id.cid.event as usize;
        id.cid.event = std::ptr::null_mut();
        Ok(held)
    })?;
    if held != 0 {
        let _ = ack(held);
    }
    let mut guard = lock()?;
    {
        let g = guard.as_mut().ok_or(libc::ENODEV)?;
        let st = g.ids.get_mut(&k).ok_or(libc::EINVAL)?;
        let listening = std::mem::take(&mut st.listening);
        let comm = st.comm.take();
        let dev = st.dev;
        for (d, sid) in listening {
            // SAFETY: a context of ours.
            unsafe { (g.v.cm.unlisten)(g.devs[d].ctx, sid) };
        }
        if let (Some(d), Some(c)) = (dev, comm) {
            if g.comms.get(&(d, c)) == Some(&k) {
                g.comms.remove(&(d, c));
                // SAFETY: a context of ours.
                unsafe { (g.v.cm.destroy_id)(g.devs[d].ctx, c) };
            }
        }
        g.purge(k);
    }
    // rdma-core: rdma_destroy_id blocks until every event it reported is acknowledged.
    loop {
        let g = guard.as_mut().ok_or(libc::ENODEV)?;
        match g.ids.get(&k) {
            Some(st) if st.outstanding > 0 => {}
            _ => break,
        }
        guard = ACKED.wait(guard).unwrap_or_else(|p| p.into_inner());
    }
    let g = guard.as_mut().ok_or(libc::ENODEV)?;
    if let Some(st) = g.ids.remove(&k) {
        if let Some(c) = st.sync_chan {
            g.free_chan(c);
        }
        // SAFETY: `k` was a live Box<Id>, now out of every table.
        drop(unsafe { Box::from_raw(k as *mut Id) });
    }
    Ok(())
}

/// Where `k`'s events go from now on: channel `to` (0: a private one, making it
/// synchronous). Queued events follow it.
pub(crate) fn migrate(k: usize, to: usize) -> Result<(), c_int> {
    with(|g| {
        g.id(k as *mut rdma_cm_id)?;
        if to != 0 && !g.chans.contains_key(&to) {
            return Err(libc::EINVAL);
        }
        let new = if to == 0 { g.new_chan()? } else { to };
        let old = g.cid(k).cid.channel as usize;
        let mut moved = Vec::new();
        if let Some(st) = g.chans.get_mut(&old) {
            st.queue.retain(|&e| {
                // SAFETY: queued events are live Box<Ev>s.
                let ev = unsafe { &*(e as *const Ev) };
                if ev.ev.id as usize == k && ev.counted == k {
                    moved.push(e);
                    false
                } else {
                    true
                }
            });
            if st.queue.is_empty() {
                let mut n: u64 = 0;
                // SAFETY: clears the eventfd (non-blocking).
                unsafe { libc::read(st.evfd, (&mut n as *mut u64).cast(), 8) };
            }
        }
        for e in moved {
            // SAFETY: taken out of the old queue, now owned here.
            g.push(new, unsafe { Box::from_raw(e as *mut Ev) });
        }
        let st = g.ids.get_mut(&k).ok_or(libc::EINVAL)?;
        let old_sync = st.sync_chan.take();
        if to == 0 {
            st.sync_chan = Some(new);
        }
        g.cid(k).cid.channel = new as *mut rdma_event_channel;
        if let Some(c) = old_sync {
            g.free_chan(c);
        }
        Ok(())
    })
}

/// The device CM's address record for `ip` and `port`.
pub(crate) fn cm_addr(ip: IpAddr, port: u16) -> CmAddr {
    CmAddr::new(ip, port)
}
