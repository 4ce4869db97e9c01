//! `recvmmsg(2)` over a receive side's slots, with every field the kernel writes back set
//! afresh for each call;
//! `sendmmsg(2)` of the datagrams one pass queued for one socket.
//!
//! `msg_namelen` and `msg_controllen` are in-out: the kernel replaces them with what it
//! wrote. nix 0.30's `recvmmsg` reuses its headers without restoring them
//! (nix-rust/nix#2813, open), so a slot that once received a datagram without a control
//! message never again sees one: a `UDP_GRO` train in that slot came with no segment size
//! and was taken for one packet. This is the few lines of `unsafe` that call it right.

#![allow(unsafe_code)]

use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

use socket2::SockAddr;

/// Room for every control message a receive side asks for: `IP_PKTINFO` or
/// `IPV6_PKTINFO`, and `UDP_GRO`'s segment size, with their headers and padding.
const CONTROL: usize = 64;

/// One slot's control buffer, aligned as `cmsghdr` needs.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct Control([u8; CONTROL]);

/// What one datagram of a batch was.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Bytes written into the slot.
    pub len: usize,
    /// It did not fit (`MSG_TRUNC`).
    pub truncated: bool,
    /// Its sender.
    pub src: Option<SocketAddr>,
    /// The local address it was sent to (packet info, when the socket asked for it).
    pub dst: Option<IpAddr>,
    /// The segment size of a `UDP_GRO` train.
    pub seg: Option<usize>,
}

/// The headers of a batch of `recvmmsg`.
pub(crate) struct MultiRecv {
    hdrs: Box<[libc::mmsghdr]>,
    iovs: Box<[libc::iovec]>,
    names: Box<[libc::sockaddr_storage]>,
    control: Box<[Control]>,
    /// The slots the first `.3` headers point at: start address, slot length, offset in
    /// the slot. A call on the same slots rewrites only what the kernel writes back.
    pointed: (usize, usize, usize, usize),
}

// SAFETY: the raw pointers in `hdrs` and `iovs` point at this struct's boxes and at the
// slots of the call that set them; only the kernel reads them, during a call from
// `&mut self` that checked they are the slots it was given (or wrote them afresh): moving
// the struct to another thread moves nothing they point to that another thread could use.
unsafe impl Send for MultiRecv {}

impl MultiRecv {
    /// Headers for batches of up to `batch` datagrams.
    pub(crate) fn new(batch: usize) -> MultiRecv {
        // SAFETY: `mmsghdr`, `iovec` and `sockaddr_storage` are plain C structs for which all
        // zero bytes (null pointers, zero lengths) is a valid value.
        let (hdr, iov, name) = unsafe {
            (
                zeroed::<libc::mmsghdr>(),
                zeroed::<libc::iovec>(),
                zeroed::<libc::sockaddr_storage>(),
            )
        };
        MultiRecv {
            hdrs: vec![hdr; batch].into_boxed_slice(),
            iovs: vec![iov; batch].into_boxed_slice(),
            names: vec![name; batch].into_boxed_slice(),
            control: vec![Control([0; CONTROL]); batch].into_boxed_slice(),
            pointed: (0, 0, 0, 0),
        }
    }

    /// Receive up to one datagram per slot without blocking: slot `i` is
    /// `slots[i * slot_len..][at..slot_len]`, as many slots as fit and the batch holds.
    /// Calls `each` with each datagram's slot index and what it was; returns how many came
    /// (0 when none waited).
    pub(crate) fn recv(
        &mut self,
        fd: BorrowedFd<'_>,
        slots: &mut [u8],
        slot_len: usize,
        at: usize,
        mut each: impl FnMut(usize, Received),
    ) -> nix::Result<usize> {
        let n = self.hdrs.len().min(slots.len() / slot_len.max(1));
        if n == 0 || at >= slot_len {
            return Ok(0);
        }
        let (base, pointed_len, pointed_at, pointed_n) = self.pointed;
        if base == slots.as_ptr() as usize
            && pointed_len == slot_len
            && pointed_at == at
            && pointed_n >= n
        {
            // The pointers and the iovecs are as the last call set them, for these same
            // slots (the kernel writes neither): only the in-out fields go back.
            for h in &mut self.hdrs[..n] {
                h.msg_len = 0;
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                h.msg_hdr.msg_controllen = CONTROL as _;
                h.msg_hdr.msg_flags = 0;
            }
        } else {
            for (i, slot) in slots.chunks_exact_mut(slot_len).take(n).enumerate() {
                let buf = &mut slot[at..];
                self.iovs[i] = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                };
                let h = &mut self.hdrs[i];
                h.msg_len = 0;
                h.msg_hdr.msg_name = (&raw mut self.names[i]).cast();
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                h.msg_hdr.msg_iov = &raw mut self.iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_control = self.control[i].0.as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = CONTROL as _;
                h.msg_hdr.msg_flags = 0;
            }
            self.pointed = (slots.as_ptr() as usize, slot_len, at, n);
        }
        // SAFETY: the first `n` headers point at live memory of this call: each iovec at a
        // slot of `slots` (borrowed mutably for the call) of the length given — set just
        // now, or by an earlier call for slots at the same address, of the same length and
        // offset, and at least as many, which are these — each name at a `sockaddr_storage`
        // and each control buffer at `CONTROL` bytes of `self`'s boxes (which never move),
        // with those sizes in the header. The kernel writes only within them and into the
        // headers.
        let got = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let got = usize::try_from(got).map_err(|_| nix::errno::Errno::last())?;
        for i in 0..got.min(n) {
            let h = &self.hdrs[i];
            let (dst, seg) = control_of(&h.msg_hdr);
            each(
                i,
                Received {
                    len: h.msg_len as usize,
                    truncated: h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                    src: sockaddr_of(&self.names[i], h.msg_hdr.msg_namelen),
                    dst,
                    seg,
                },
            );
        }
        Ok(got)
    }
}

/// The headers of a batch of `sendmmsg`.
pub(crate) struct MultiSend {
    hdrs: Box<[libc::mmsghdr]>,
    iovs: Box<[libc::iovec]>,
}

impl std::fmt::Debug for MultiSend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiSend")
            .field("batch", &self.hdrs.len())
            .finish()
    }
}

// SAFETY: as for `MultiRecv`: the pointers are written afresh before each call and point
// only at what that call borrows.
unsafe impl Send for MultiSend {}

impl MultiSend {
    /// Headers for batches of up to `batch` datagrams.
    pub(crate) fn new(batch: usize) -> MultiSend {
        // SAFETY: `mmsghdr` and `iovec` are plain C structs for which all zero bytes (null
        // pointers, zero lengths) is a valid value.
        let (hdr, iov) = unsafe { (zeroed::<libc::mmsghdr>(), zeroed::<libc::iovec>()) };
        MultiSend {
            hdrs: vec![hdr; batch].into_boxed_slice(),
            iovs: vec![iov; batch].into_boxed_slice(),
        }
    }

    /// Send each `(payload, to)` of `datagrams` (as many as the batch holds) in
    /// one call. Returns how many the kernel took, from the first: it stops at the first it
    /// cannot take, and fails only when that is the first.
    pub(crate) fn send<'a>(
        &mut self,
        fd: BorrowedFd<'_>,
        datagrams: impl Iterator<Item = (&'a [u8], &'a SockAddr)>,
    ) -> nix::Result<usize> {
        let mut n = 0;
        for (i, (payload, to)) in datagrams.take(self.hdrs.len()).enumerate() {
            // The kernel only reads through these pointers (`sendmmsg` does not write the
            // payload or the address).
            self.iovs[i] = libc::iovec {
                iov_base: payload.as_ptr().cast_mut().cast(),
                iov_len: payload.len(),
            };
            let h = &mut self.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = to.as_ptr().cast_mut().cast();
            h.msg_hdr.msg_namelen = to.len();
            h.msg_hdr.msg_iov = &raw mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
            n = i + 1;
        }
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the first `n` headers were just set to point at memory borrowed for this
        // call: each iovec at a payload of the given length, each name at a socket address
        // of the given length; no control messages. The kernel reads them and writes only
        // `msg_len` in the headers.
        let sent = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(sent).map_err(|_| nix::errno::Errno::last())
    }
}

/// The address the kernel wrote into `name` (`len` bytes).
fn sockaddr_of(name: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match i32::from(name.ss_family) {
        libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a `sockaddr_in`, as long as the
            // length the kernel wrote; `sockaddr_storage` is aligned for every sockaddr.
            let a =
                unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for a `sockaddr_in6`.
            let a =
                unsafe { &*(name as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// The packet info destination and the `UDP_GRO` segment size among the control messages
/// of `hdr`.
fn control_of(hdr: &libc::msghdr) -> (Option<IpAddr>, Option<usize>) {
    let mut dst = None;
    let mut seg = None;
    // SAFETY: `hdr` is a header the kernel just filled: `msg_control` points at our control
    // buffer and `msg_controllen` says how much of it holds complete control messages; the
    // CMSG_* functions walk within that length, and each payload is read (unaligned) only
    // when its length covers the type read.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let len = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::IPPROTO_IP, libc::IP_PKTINFO) if len >= size_of::<libc::in_pktinfo>() => {
                    let i = std::ptr::read_unaligned(data.cast::<libc::in_pktinfo>());
                    dst = Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(i.ipi_addr.s_addr))));
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO)
                    if len >= size_of::<libc::in6_pktinfo>() =>
                {
                    let i = std::ptr::read_unaligned(data.cast::<libc::in6_pktinfo>());
                    dst = Some(IpAddr::V6(Ipv6Addr::from(i.ipi6_addr.s6_addr)));
                }
                (libc::SOL_UDP, libc::UDP_GRO) if len >= size_of::<u16>() => {
                    // The kernel writes an int; read it whole where it is.
                    seg = if len >= size_of::<libc::c_int>() {
                        usize::try_from(std::ptr::read_unaligned(data.cast::<libc::c_int>())).ok()
                    } else {
                        Some(usize::from(std::ptr::read_unaligned(data.cast::<u16>())))
                    };
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    (dst, seg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::IoSlice;
    use std::os::fd::AsFd;

    use nix::sys::socket::{self as nsock, MsgFlags, SockaddrStorage};

    /// Receive until `want` datagrams came (the kernel delivers loopback sends at once, but
    /// a look may race them), each into `slots` from slot 0.
    fn take(
        rx: &mut MultiRecv,
        fd: BorrowedFd<'_>,
        slots: &mut [u8],
        want: usize,
    ) -> Vec<Received> {
        let mut got = Vec::new();
        for _ in 0..1000 {
            let _ = rx.recv(fd, slots, 2048, 16, |_, r| got.push(r));
            if got.len() >= want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        got
    }

    #[test]
    fn headers_kept_from_call_to_call_still_report_each_datagram_whole() {
        let any = SocketAddr::from(([0, 0, 0, 0], 0));
        let sock = crate::io::rx_socket(any, true).unwrap();
        let port = sock.local_addr().unwrap().as_socket().unwrap().port();
        let to = SocketAddr::from(([127, 0, 0, 1], port));
        let a = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let b = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut rx = MultiRecv::new(4);
        let mut slots = vec![0u8; 4 * 2048];
        let fd = sock.as_fd();
        // A lone datagram (no segment size), then a train of three 100-byte segments from
        // another port (a segment size), then a lone one again: the in-out fields of the
        // headers the first call set must be back for each call.
        a.send_to(&[1; 40], to).unwrap();
        let r = take(&mut rx, fd, &mut slots, 1);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].len, r[0].seg), (40, None));
        assert_eq!(r[0].src, Some(a.local_addr().unwrap()));
        assert!(r[0].dst.is_some(), "packet info is reported");

        let seg = 100u16;
        let data = [2u8; 300];
        let iov = [IoSlice::new(&data)];
        let cmsg = [nsock::ControlMessage::UdpGsoSegments(&seg)];
        nsock::sendmsg(
            b.as_raw_fd(),
            &iov,
            &cmsg,
            MsgFlags::empty(),
            Some(&SockaddrStorage::from(to)),
        )
        .unwrap();
        let r = take(&mut rx, fd, &mut slots, 1);
        assert_eq!(r[0].src, Some(b.local_addr().unwrap()));
        // Whole, with its segment size, or (a kernel without GRO here) cut in three.
        match r[0].seg {
            Some(s) => assert_eq!((r[0].len, s), (300, 100)),
            None => assert_eq!(r[0].len, 100),
        }
        if r[0].seg.is_none() {
            // The other two segments, before the next datagram.
            assert_eq!(
                r.len() + take(&mut rx, fd, &mut slots, 3 - r.len()).len(),
                3
            );
        }

        // Fewer slots than the headers were set for: the first one still points right.
        a.send_to(&[3; 24], to).unwrap();
        let r = take(&mut rx, fd, &mut slots[..2048], 1);
        assert_eq!((r[0].len, r[0].seg), (24, None));
        assert_eq!(r[0].src, Some(a.local_addr().unwrap()));
        assert_eq!(slots[16..16 + 24], [3; 24]);
        assert!(r[0].dst.is_some());
    }
}
