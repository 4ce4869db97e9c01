//! Registered memory the daemon can map: a client's buffer in a sealed `memfd`, passed with
//! its registration (SCM_RIGHTS), so the daemon copies to and from it with plain memory
//! copies instead of `pread`/`pwrite` on the client's `/proc/<pid>/mem` (which walk every
//! page of every access, most of a same-host transfer's cost).
//!
//! The client makes one with [`SharedMemory::create`] (the `softrdma` API's `Buffer` does,
//! for large buffers). The daemon maps the client's file with [`SharedMemory::map_client`]
//! only after checking what a hostile client could use against it: the file must be sealed
//! against shrinking (a shrunk file turns the daemon's accesses into SIGBUS), and long enough
//! for the range; and the daemon checks that the client really has
//! that file mapped at the registered address, so the daemon touches exactly the bytes the
//! client sees there.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Why shared memory could not be made or mapped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// The call.
        what: &'static str,
        /// Its error.
        source: std::io::Error,
    },
    /// The file offered cannot be used.
    #[error("shared memory refused: {0}")]
    Refused(&'static str),
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |e| ShmError::Os {
        what,
        source: e.into(),
    }
}

/// A shared mapping of (part of) a memfd, unmapped on drop.
#[derive(Debug)]
pub struct SharedMemory {
    /// Start of the mapping (page-aligned).
    map: NonNull<u8>,
    map_len: usize,
    /// The first byte of the range asked for, within the mapping.
    skip: usize,
    len: usize,
    /// The file, while this side keeps it (the mapping does not need it).
    fd: Option<OwnedFd>,
}

// SAFETY: the mapping is process memory owned by this value (like a Vec's heap storage),
// reached only through raw pointers by its users.
unsafe impl Send for SharedMemory {}
// SAFETY: `&SharedMemory` gives out only the address and the fd; accesses through the
// address are the users' to synchronize (the daemon's device lock; the client's verbs).
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// `len` zero bytes (at least one), page-aligned, in a new memfd called `name`, exactly
    /// that long and sealed against shrinking and growing.
    pub fn create(name: &str, len: usize) -> Result<SharedMemory, ShmError> {
        let size = len.max(1);
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, size as u64).map_err(os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(os("F_ADD_SEALS"))?;
        let map = map(&fd, 0, size)?;
        Ok(SharedMemory {
            map,
            map_len: size,
            skip: 0,
            len: size,
            fd: Some(fd),
        })
    }

    /// Map `len` bytes at byte `offset` of a peer's file (the descriptor is not kept):
    /// refused unless the file is sealed against shrinking and that long.
    pub fn map_client(fd: &impl AsFd, offset: u64, len: u64) -> Result<SharedMemory, ShmError> {
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(os("F_GET_SEALS"))?;
        if !seals.contains(SealFlags::SHRINK) {
            return Err(ShmError::Refused("file not sealed against shrinking"));
        }
        let st = rustix::fs::fstat(fd).map_err(os("fstat"))?;
        let end = offset
            .checked_add(len)
            .ok_or(ShmError::Refused("offset + length overflows"))?;
        if len == 0 || u64::try_from(st.st_size).map_or(true, |size| end > size) {
            return Err(ShmError::Refused("the range is not within the file"));
        }
        let page = rustix::param::page_size() as u64;
        let start = offset - offset % page;
        let skip = (offset - start) as usize;
        let map_len = usize::try_from(end - start)
            .map_err(|_| ShmError::Refused("the range is too large to map"))?;
        let map = map(fd, start, map_len)?;
        Ok(SharedMemory {
            map,
            map_len,
            skip,
            len: len as usize,
            fd: None,
        })
    }

    /// First byte of the range.
    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: `skip < map_len`: the range starts inside the mapping.
        unsafe { self.map.as_ptr().add(self.skip) }
    }

    /// Bytes in the range.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty range (never: both constructors refuse or round up).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file, to pass to the peer: `None` once taken, and for a peer's file.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// Take the file (the mapping stays): for a creator that hands it to its peer and keeps
    /// no descriptor of its own.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fd.take()
    }
}

fn map(fd: &impl AsFd, offset: u64, len: usize) -> Result<NonNull<u8>, ShmError> {
    // SAFETY: a fresh shared mapping chosen by the kernel (null hint) of a file that is at
    // least `offset + len` bytes long and cannot shrink (checked or sealed by the callers);
    // it aliases no Rust object.
    let p = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            offset,
        )
    }
    .map_err(os("mmap"))?;
    NonNull::new(p.cast::<u8>()).ok_or(ShmError::Refused("null mapping"))
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, of this length; no reference into it outlives
        // `self` (users hold raw pointers only while they hold `self`).
        let _ = unsafe { rustix::mm::munmap(self.map.as_ptr().cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    #[test]
    fn a_client_buffer_maps_in_a_second_place_with_the_same_bytes() {
        let a = SharedMemory::create("t", 3 * PAGE + 10).unwrap();
        assert_eq!(a.len(), 3 * PAGE + 10);
        // SAFETY: within the fresh mapping, which nothing else uses.
        unsafe { a.as_ptr().add(PAGE + 5).write(0x5a) };
        let b = SharedMemory::map_client(&a.fd().unwrap(), PAGE as u64 + 5, 100).unwrap();
        assert!(b.fd().is_none(), "a peer's descriptor is not kept");
        // SAFETY: within b's range.
        assert_eq!(unsafe { b.as_ptr().read() }, 0x5a);
        // SAFETY: within b's range; a sees it.
        unsafe { b.as_ptr().add(1).write(0xa5) };
        // SAFETY: within a's range.
        assert_eq!(unsafe { a.as_ptr().add(PAGE + 6).read() }, 0xa5);
    }

    #[test]
    fn files_that_could_shrink_or_are_too_short_are_refused() {
        let loose = rustix::fs::memfd_create("loose", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&loose, 8192).unwrap();
        assert!(matches!(
            SharedMemory::map_client(&loose, 0, 4096),
            Err(ShmError::Refused(_))
        ));
        let mut a = SharedMemory::create("t", PAGE).unwrap();
        for (off, len) in [
            (0, PAGE as u64 + 1),
            (1, PAGE as u64),
            (u64::MAX, 2),
            (0, 0),
        ] {
            assert!(
                matches!(
                    SharedMemory::map_client(&a.fd().unwrap(), off, len),
                    Err(ShmError::Refused(_))
                ),
                "{off}+{len}"
            );
        }
        // The file cannot shrink under a mapping.
        let fd = a.take_fd().unwrap();
        assert!(a.fd().is_none());
        assert!(rustix::fs::ftruncate(&fd, 0).is_err());
    }
}
