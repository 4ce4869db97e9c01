//! The descriptors a program gets for its event sources: `context->async_fd` and a completion
//! channel's `fd`. Each is an epoll instance of the program's own, readable while any source
//! it watches is (the device's async-event eventfd; the event eventfds of the channel's CQs).
//!
//! Why not hand out the sources themselves: a descriptor shares its file status flags with
//! every copy of it, and ours are non-blocking for the library's own reads. A descriptor of
//! the program's own tells us whether the program made it non-blocking, which rdma-core's
//! event calls honour (`EAGAIN` instead of waiting; UCX's async thread relies on it), and
//! one channel can watch any number of CQs.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An epoll instance that is readable while one of its watched descriptors is.
#[derive(Debug)]
pub(crate) struct Watch(OwnedFd);

impl Watch {
    /// A watch of nothing yet; `None` when the process is out of descriptors.
    pub(crate) fn new() -> Option<Watch> {
        // SAFETY: no memory arguments; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        // SAFETY: a fresh descriptor owned by nobody else.
        (fd >= 0).then(|| Watch(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watch `fd` for readability (level-triggered).
    pub(crate) fn add(&self, fd: RawFd) {
        self.add_for(fd, libc::EPOLLIN as u32);
    }

    /// Watch socket `fd` for its peer hanging up only (not for data it may carry).
    pub(crate) fn add_hangup(&self, fd: RawFd) {
        // EPOLLHUP and EPOLLERR are reported whatever is asked.
        self.add_for(fd, 0);
    }

    fn add_for(&self, fd: RawFd, events: u32) {
        let mut ev = libc::epoll_event {
            events,
            u64: fd as u64,
        };
        // SAFETY: a valid epoll descriptor and event struct; a failure (already watched)
        // leaves the watch as it was.
        unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }

    /// Stop watching `fd` (before it is closed).
    pub(crate) fn remove(&self, fd: RawFd) {
        // SAFETY: a valid epoll descriptor; DEL ignores the event argument.
        unsafe {
            libc::epoll_ctl(
                self.0.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
    }

    /// The descriptor the program polls.
    pub(crate) fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Whether the program made the descriptor non-blocking: the event call that finds
    /// nothing then fails with `EAGAIN`, as a `read` of rdma-core's descriptor would.
    pub(crate) fn nonblocking(&self) -> bool {
        // SAFETY: F_GETFL reads the flags of our own valid descriptor.
        let flags = unsafe { libc::fcntl(self.raw(), libc::F_GETFL) };
        flags >= 0 && flags & libc::O_NONBLOCK != 0
    }
}
