//! `rdma_getaddrinfo`: names and numbers to addresses with the C library's getaddrinfo,
//! laid out as rdma-core's `struct rdma_addrinfo`.

use core::ffi::{c_char, c_int};

use crate::ffi::*;

/// A heap copy of a socket address of `len` bytes (NULL if there is none).
fn dup_sa(sa: *const libc::sockaddr, len: libc::socklen_t) -> *mut libc::sockaddr {
    if sa.is_null() || len == 0 {
        return std::ptr::null_mut();
    }
    // SAFETY: malloc of `len` bytes, NULL-checked; `sa` holds `len` bytes.
    unsafe {
        let p = libc::malloc(len as usize) as *mut libc::sockaddr;
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(sa as *const u8, p as *mut u8, len as usize);
        }
        p
    }
}

#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        crate::cma::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's hints, or NULL.
    let h = unsafe { hints.as_ref() };
    let flags = h.map_or(0, |h| h.ai_flags);
    let family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
    let mut ai_hints: libc::addrinfo =
        // SAFETY: an all-zero addrinfo is the empty hint.
        unsafe { std::mem::zeroed() };
    ai_hints.ai_family = family;
    ai_hints.ai_socktype = libc::SOCK_STREAM;
    if flags & RAI_PASSIVE != 0 {
        ai_hints.ai_flags |= libc::AI_PASSIVE;
    }
    if flags & RAI_NUMERICHOST != 0 {
        ai_hints.ai_flags |= libc::AI_NUMERICHOST;
    }
    let mut ai: *mut libc::addrinfo = std::ptr::null_mut();
    let mut from_hints_only = false;
    if !node.is_null() || !service.is_null() {
        // SAFETY: NUL-terminated strings of the caller (or NULL), valid hints, out-pointer.
        let r = unsafe { libc::getaddrinfo(node, service, &ai_hints, &mut ai) };
        if r != 0 {
            // rdma-core returns getaddrinfo's code (programs print gai_strerror of it).
            return r;
        }
    } else {
        from_hints_only = true;
    }
    // SAFETY: calloc of one zeroed rdma_addrinfo, NULL-checked.
    let out = unsafe { libc::calloc(1, size_of::<rdma_addrinfo>()) } as *mut rdma_addrinfo;
    if out.is_null() {
        if !ai.is_null() {
            // SAFETY: the list getaddrinfo returned.
            unsafe { libc::freeaddrinfo(ai) };
        }
        crate::cma::set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: `out` is ours and zeroed; `ai` (first entry) is getaddrinfo's, if any.
    unsafe {
        let o = &mut *out;
        o.ai_flags = flags;
        o.ai_qp_type = h
            .map(|h| h.ai_qp_type)
            .filter(|t| *t != 0)
            .unwrap_or(qpt::RC as c_int);
        o.ai_port_space = h
            .map(|h| h.ai_port_space)
            .filter(|p| *p != 0)
            .unwrap_or(ps::TCP as c_int);
        if let Some(h) = h {
            // A source or destination given in the hints is kept, as rdma-core does.
            o.ai_src_len = h.ai_src_len;
            o.ai_src_addr = dup_sa(h.ai_src_addr, h.ai_src_len);
            if flags & RAI_PASSIVE == 0 && from_hints_only {
                o.ai_dst_len = h.ai_dst_len;
                o.ai_dst_addr = dup_sa(h.ai_dst_addr, h.ai_dst_len);
            }
        }
        if !ai.is_null() {
            let a = &*ai;
            o.ai_family = a.ai_family;
            if flags & RAI_PASSIVE != 0 {
                libc::free(o.ai_src_addr.cast());
                o.ai_src_len = a.ai_addrlen;
                o.ai_src_addr = dup_sa(a.ai_addr, a.ai_addrlen);
            } else {
                o.ai_dst_len = a.ai_addrlen;
                o.ai_dst_addr = dup_sa(a.ai_addr, a.ai_addrlen);
            }
            libc::freeaddrinfo(ai);
        } else {
            let sa = if o.ai_dst_addr.is_null() {
                o.ai_src_addr
            } else {
                o.ai_dst_addr
            };
            o.ai_family = crate::addr::family(sa);
        }
        *res = out;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: a list of rdma_getaddrinfo: every pointer malloc'd or NULL.
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr.cast());
            libc::free((*p).ai_dst_addr.cast());
            libc::free((*p).ai_src_canonname.cast());
            libc::free((*p).ai_dst_canonname.cast());
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p.cast());
            p = next;
        }
    }
}

symver!(rdma_getaddrinfo, rdma_freeaddrinfo);
