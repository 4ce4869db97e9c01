//! A process's mappings, as its `/proc/<pid>/maps` lists them: what registration asks of
//! them (is this range private anonymous memory, is that file mapped here, is this range
//! mapped read-write), answered the same way for the library's own process and for the
//! daemon's clients.
//!
//! A `maps` file is asked one mapping at a time with the `PROCMAP_QUERY` ioctl (Linux 6.11):
//! a question about a range costs one call per mapping over it, where reading the text makes
//! the kernel format a line for every mapping of the process (a quarter of what an
//! `ibv_reg_mr` through the daemon cost). On older kernels the text is read and parsed.

#![allow(unsafe_code)]

use std::os::fd::{AsFd, OwnedFd};

/// What a mapping without a file is called, as far as registration cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Name {
    /// No name: memory from `mmap` (or `malloc`'s large blocks).
    None,
    /// `[heap]`: the program break's memory (`malloc`'s small blocks).
    Heap,
    /// Anything else: a file's path, `[stack]`, `[vdso]`, a name given with `PR_SET_VMA`.
    Other,
}

impl Name {
    fn of(name: &[u8]) -> Name {
        match name {
            b"" => Name::None,
            b"[heap]" => Name::Heap,
            _ => Name::Other,
        }
    }
}

/// One mapping of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// Shared (`s` in the text), not a private copy (`p`).
    pub shared: bool,
    /// Offset in the file of the byte at `start`.
    pub offset: u64,
    /// The file's device (major, minor); (0, 0) for anonymous memory.
    pub dev: (u32, u32),
    /// The file's inode; 0 for anonymous memory.
    pub inode: u64,
    /// What it is called.
    pub name: Name,
}

impl Mapping {
    /// Readable and writable.
    pub fn read_write(&self) -> bool {
        self.read && self.write
    }

    /// Private anonymous read-write memory (the heap's included, a stack's not).
    pub fn private_anonymous(&self) -> bool {
        self.inode == 0 && self.name != Name::Other && self.read_write() && !self.shared
    }
}

/// The lines of a `/proc/<pid>/maps` text that parse, in its order (ascending addresses).
pub fn parse(maps: &str) -> impl Iterator<Item = Mapping> + '_ {
    maps.lines().filter_map(|line| {
        let mut f = line.splitn(6, ' ');
        let (range, perms, offset, dev, inode) =
            (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let path = f.next().unwrap_or("").trim_start();
        let (a, b) = range.split_once('-')?;
        let (ma, mi) = dev.split_once(':')?;
        let perms = perms.as_bytes();
        if perms.len() != 4 {
            return None;
        }
        Some(Mapping {
            start: u64::from_str_radix(a, 16).ok()?,
            end: u64::from_str_radix(b, 16).ok()?,
            read: perms[0] == b'r',
            write: perms[1] == b'w',
            shared: perms[3] == b's',
            offset: u64::from_str_radix(offset, 16).ok()?,
            dev: (
                u32::from_str_radix(ma, 16).ok()?,
                u32::from_str_radix(mi, 16).ok()?,
            ),
            inode: inode.parse().ok()?,
            name: Name::of(path.as_bytes()),
        })
    })
}

/// Whether `mappings` (in ascending order) cover all of `addr..addr + len` (non-empty)
/// without a gap, each passing `ok`.
fn cover(
    mappings: impl IntoIterator<Item = Mapping>,
    addr: u64,
    len: u64,
    ok: impl Fn(&Mapping) -> bool,
) -> bool {
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let mut cur = addr;
    for m in mappings {
        if m.end <= cur {
            continue;
        }
        if m.start > cur || !ok(&m) {
            return false;
        }
        cur = m.end;
        if cur >= end {
            return len > 0;
        }
    }
    false
}

/// Whether `mappings` show all of `addr..addr + len` (non-empty) as private anonymous
/// read-write memory, in one mapping or several.
pub fn private_anonymous(mappings: impl IntoIterator<Item = Mapping>, addr: u64, len: u64) -> bool {
    cover(mappings, addr, len, Mapping::private_anonymous)
}

/// Whether `mappings` show all of `addr..addr + len` (non-empty) readable and writable, in
/// one mapping or several.
pub fn read_write(mappings: impl IntoIterator<Item = Mapping>, addr: u64, len: u64) -> bool {
    cover(mappings, addr, len, Mapping::read_write)
}

/// Whether `mappings` show `fd`'s file mapped shared and read-write over all of
/// `addr..addr + len`, as one mapping, with byte `offset` of the file at `addr`: then a
/// mapping of that file holds exactly the bytes the process sees at those addresses.
pub fn shows_file(
    mappings: impl IntoIterator<Item = Mapping>,
    addr: u64,
    len: u64,
    fd: &impl AsFd,
    offset: u64,
) -> bool {
    let Ok(st) = rustix::fs::fstat(fd) else {
        return false;
    };
    let dev = (rustix::fs::major(st.st_dev), rustix::fs::minor(st.st_dev));
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    mappings
        .into_iter()
        .take_while(|m| m.start <= addr)
        .any(|m| {
            m.read_write()
                && m.shared
                && addr < m.end
                && end <= m.end
                && m.dev == dev
                && m.inode == st.st_ino
                && m.offset.checked_add(addr - m.start) == Some(offset)
        })
}

/// `struct procmap_query` and its numbers (`include/uapi/linux/fs.h`, Linux 6.11).
mod query {
    use rustix::ioctl::{opcode, Opcode};

    /// `PROCMAP_QUERY_COVERING_OR_NEXT_VMA`: the mapping at the address or, if none, the
    /// next one above it.
    pub const COVERING_OR_NEXT: u64 = 0x10;
    pub const VMA_READABLE: u64 = 0x01;
    pub const VMA_WRITABLE: u64 = 0x02;
    pub const VMA_SHARED: u64 = 0x08;

    /// `struct procmap_query`.
    #[repr(C)]
    #[derive(Default)]
    pub struct Query {
        pub size: u64,
        pub query_flags: u64,
        pub query_addr: u64,
        pub vma_start: u64,
        pub vma_end: u64,
        pub vma_flags: u64,
        pub vma_page_size: u64,
        pub vma_offset: u64,
        pub inode: u64,
        pub dev_major: u32,
        pub dev_minor: u32,
        pub vma_name_size: u32,
        pub build_id_size: u32,
        pub vma_name_addr: u64,
        pub build_id_addr: u64,
    }

    /// `PROCMAP_QUERY`: `_IOWR(PROCFS_IOCTL_MAGIC = 'f', 17, struct procmap_query)`.
    pub const IOC: Opcode = opcode::read_write::<Query>(b'f', 17);
}

/// An open `/proc/<pid>/maps`. It stays with the address space it was opened on: a process
/// that has exited shows no mappings, whatever took its number since.
#[derive(Debug)]
pub struct Maps {
    fd: OwnedFd,
}

/// What one query found.
enum Found {
    Mapping(Mapping),
    /// No mapping at or above the address (or the process is gone).
    Nothing,
    /// This kernel has no `PROCMAP_QUERY`: read the text.
    NoQuery,
}

impl Maps {
    /// `/proc/<pid>/maps`, or this process's own for `None`.
    pub fn open(pid: Option<i32>) -> std::io::Result<Maps> {
        let path = match pid {
            Some(pid) => format!("/proc/{pid}/maps"),
            None => "/proc/self/maps".to_owned(),
        };
        let fd = rustix::fs::open(
            path,
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        Ok(Maps { fd })
    }

    /// A `maps` file already open (`/proc/<pid>/maps`).
    pub fn from_fd(fd: OwnedFd) -> Maps {
        Maps { fd }
    }

    /// The mappings from the one that holds `from` (or the first above it) upwards, in
    /// ascending order, as they are at each step. An error ends them early (the callers'
    /// questions then answer no).
    pub fn mappings_from(&self, from: u64) -> impl Iterator<Item = Mapping> + '_ {
        let mut next = Some(from);
        let mut text: Option<std::vec::IntoIter<Mapping>> = None;
        std::iter::from_fn(move || {
            if let Some(lines) = &mut text {
                return lines.next();
            }
            match self.query(next?) {
                Found::Mapping(m) => {
                    // The last mapping can end at the top of the address space.
                    next = Some(m.end).filter(|&end| end > m.start && end != u64::MAX);
                    Some(m)
                }
                Found::Nothing => None,
                Found::NoQuery => text.insert(self.text_mappings_from(from)).next(),
            }
        })
    }

    /// [`Maps::mappings_from`] by the text, for kernels without `PROCMAP_QUERY`.
    fn text_mappings_from(&self, from: u64) -> std::vec::IntoIter<Mapping> {
        let all = self.text().unwrap_or_default();
        let lines: Vec<_> = parse(&all).filter(|m| m.end > from).collect();
        lines.into_iter()
    }

    /// The mapping that holds `addr`, if one does.
    pub fn at(&self, addr: u64) -> Option<Mapping> {
        self.mappings_from(addr).next().filter(|m| m.start <= addr)
    }

    /// The mapping at or above `addr`, by `PROCMAP_QUERY`.
    fn query(&self, addr: u64) -> Found {
        let mut name = [0u8; 4096];
        let mut q = query::Query {
            size: std::mem::size_of::<query::Query>() as u64,
            query_flags: query::COVERING_OR_NEXT,
            query_addr: addr,
            vma_name_size: name.len() as u32,
            vma_name_addr: name.as_mut_ptr() as u64,
            ..Default::default()
        };
        // SAFETY: PROCMAP_QUERY reads and writes a `struct procmap_query` of the size its
        // first field gives, and writes at most `vma_name_size` bytes at `vma_name_addr`,
        // which is `name`, alive for the call; the build-id buffer is not asked for.
        let done = unsafe {
            rustix::ioctl::ioctl(
                &self.fd,
                rustix::ioctl::Updater::<{ query::IOC }, _>::new(&mut q),
            )
        };
        match done {
            Ok(()) => {}
            // No such ioctl on a `maps` file before Linux 6.11.
            Err(rustix::io::Errno::NOTTY | rustix::io::Errno::INVAL) => return Found::NoQuery,
            // ENOENT: nothing at or above; ESRCH: the process is gone; anything else ends it.
            Err(_) => return Found::Nothing,
        }
        // The size the kernel reports counts the terminating NUL.
        let named = (q.vma_name_size as usize).min(name.len());
        let name = name[..named].strip_suffix(b"\0").unwrap_or(&name[..named]);
        Found::Mapping(Mapping {
            start: q.vma_start,
            end: q.vma_end,
            read: q.vma_flags & query::VMA_READABLE != 0,
            write: q.vma_flags & query::VMA_WRITABLE != 0,
            shared: q.vma_flags & query::VMA_SHARED != 0,
            offset: q.vma_offset,
            dev: (q.dev_major, q.dev_minor),
            inode: q.inode,
            name: Name::of(name),
        })
    }

    /// The whole text as it is now (empty once the process has exited).
    pub fn text(&self) -> std::io::Result<String> {
        let mut text = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        loop {
            match rustix::io::pread(&self.fd, &mut chunk[..], text.len() as u64) {
                Ok(0) => break,
                Ok(n) => text.extend_from_slice(&chunk[..n]),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        String::from_utf8(text).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// Whether all of `addr..addr + len` (non-empty) is private anonymous read-write memory.
    pub fn private_anonymous(&self, addr: u64, len: u64) -> bool {
        private_anonymous(self.mappings_from(addr), addr, len)
    }

    /// Whether all of `addr..addr + len` (non-empty) is mapped readable and writable.
    pub fn read_write(&self, addr: u64, len: u64) -> bool {
        read_write(self.mappings_from(addr), addr, len)
    }

    /// Whether `fd`'s file is mapped shared and read-write over all of `addr..addr + len`,
    /// as one mapping, with byte `offset` of the file at `addr` (see [`shows_file`]).
    pub fn shows_file(&self, addr: u64, len: u64, fd: &impl AsFd, offset: u64) -> bool {
        shows_file(self.mappings_from(addr).take(1), addr, len, fd, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
00e03000-00e24000 rw-p 00000000 00:00 0           [heap]
00e24000-00e26000 rw-p 00000000 00:00 0
35b1800000-35b1820000 rw-s 00001000 00:01 4242    /memfd:softrdma-mr (deleted)
7fff6ae00000-7fff6ae21000 rw-p 00000000 00:00 0   [stack]
garbage line
";

    #[test]
    fn maps_lines_parse_with_and_without_a_path() {
        let m: Vec<_> = parse(MAPS).collect();
        assert_eq!(m.len(), 5, "the garbage line is skipped");
        assert_eq!(m[0].name, Name::Other);
        assert_eq!((m[0].dev, m[0].inode), ((8, 2), 173521));
        assert_eq!((m[1].name, m[2].name), (Name::Heap, Name::None));
        assert_eq!((m[2].start, m[2].end), (0xe24000, 0xe26000));
        assert!(m[3].shared && m[3].read_write() && !m[0].read_write());
        assert_eq!(m[3].offset, 0x1000);
        assert_eq!(m[4].name, Name::Other);
    }

    #[test]
    fn only_private_anonymous_memory_counts_as_such() {
        let yes = |a: u64, len: u64| private_anonymous(parse(MAPS), a, len);
        assert!(yes(0xe03000, 0x1000));
        assert!(
            yes(0xe23000, 0x2000),
            "across the heap into the next anonymous mapping"
        );
        assert!(!yes(0xe25000, 0x2000), "runs past the end");
        assert!(!yes(0xe03000, 0), "empty");
        assert!(!yes(0x400000, 0x1000), "a file");
        assert!(!yes(0x35b1800000, 0x1000), "shared");
        assert!(!yes(0x7fff6ae00000, 0x1000), "the stack");
        assert!(!yes(u64::MAX - 10, 0x1000), "overflow");
        assert!(read_write(parse(MAPS), 0x7fff6ae00000, 0x1000));
        assert!(!read_write(parse(MAPS), 0x400000, 0x1000));
    }

    /// Maps `len` fresh bytes of private anonymous memory, unmapped when dropped.
    struct Fresh(*mut std::ffi::c_void, usize);

    impl Fresh {
        fn new(len: usize) -> Fresh {
            // SAFETY: a fresh private anonymous mapping chosen by the kernel.
            let p = unsafe {
                rustix::mm::mmap_anonymous(
                    std::ptr::null_mut(),
                    len,
                    rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                    rustix::mm::MapFlags::PRIVATE,
                )
            }
            .unwrap();
            Fresh(p, len)
        }
    }

    impl Drop for Fresh {
        fn drop(&mut self) {
            // SAFETY: the mapping made in `new`, referred to by nothing else.
            unsafe { rustix::mm::munmap(self.0, self.1) }.unwrap();
        }
    }

    /// The queries (on this kernel, `PROCMAP_QUERY`) agree with the text for every mapping
    /// of this process, and the questions answer as they do on the text.
    #[test]
    fn queries_see_what_the_text_shows() {
        let page = rustix::param::page_size();
        let fresh = Fresh::new(3 * page);
        let here = &fresh as *const Fresh as u64;
        let maps = Maps::open(None).unwrap();
        let queried: Vec<_> = maps.mappings_from(0).collect();
        let text: Vec<_> = maps.text_mappings_from(0).collect();
        // Other tests' threads map and unmap memory meanwhile: compare the mappings they
        // leave alone, the program's and its libraries' (files mapped private).
        let stable = |m: &&Mapping| m.inode != 0 && !m.shared;
        let files: Vec<_> = queried.iter().filter(stable).collect();
        assert!(files.len() > 2, "{queried:?}");
        assert_eq!(files, text.iter().filter(stable).collect::<Vec<_>>());
        let addr = fresh.0 as u64;
        assert!(maps.private_anonymous(addr, (3 * page) as u64));
        assert!(maps.read_write(addr, (3 * page) as u64));
        // This thread's stack (the main thread's is `[stack]`, another's is anonymous).
        let stack = maps.at(here).unwrap();
        assert!(stack.start <= here && here < stack.end && stack.read_write());
        assert!(maps.at(0).is_none(), "nothing is mapped at 0");
        // Kernels without the query read the text: the same answers.
        assert!(private_anonymous(
            maps.text_mappings_from(addr),
            addr,
            (3 * page) as u64
        ));
        // The middle page made unwritable: the range is no longer read-write throughout.
        // SAFETY: the middle page of the test's own mapping, which nothing reads.
        unsafe {
            rustix::mm::mprotect(
                fresh.0.cast::<u8>().add(page).cast(),
                page,
                rustix::mm::MprotectFlags::READ,
            )
        }
        .unwrap();
        assert!(!maps.read_write(addr, (3 * page) as u64));
        assert!(maps.read_write(addr, page as u64));
        assert!(!maps.private_anonymous(addr, 2 * page as u64));
        assert!(!read_write(
            maps.text_mappings_from(addr),
            addr,
            (3 * page) as u64
        ));
        assert!(read_write(maps.text_mappings_from(addr), addr, page as u64));
    }

    /// A `maps` file opened on a process that has exited shows nothing.
    #[test]
    fn an_exited_process_shows_no_mappings() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        let maps = Maps::open(Some(child.id() as i32)).unwrap();
        assert!(maps.mappings_from(0).next().is_some());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(maps.mappings_from(0).count(), 0);
    }
}
