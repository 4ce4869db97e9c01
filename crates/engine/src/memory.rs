//! How the engine reaches registered memory: the "DMA" of the soft NIC.
//!
//! The engine never owns application buffers. Every access goes through [`Memory`], after the
//! engine has already checked the key, the protection domain, the bounds and the access rights
//! of the memory region, so an implementation only has to move bytes. The [`MemOwner`] token of
//! the region is passed through untouched: a daemon serving several processes uses it to pick
//! the process whose address space `addr` lives in.

/// Opaque token naming whose address space a memory region lives in (a process, a test
/// buffer set...). The engine stores it with the MR and hands it back on every access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MemOwner(pub u64);

/// The memory could not be accessed although the engine's checks passed (the owning process
/// died, the mapping went away...). The engine reports it like a protection error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryError {
    /// The address range is not accessible in the owner's address space.
    #[error("memory fault at {addr:#x} (+{len} bytes)")]
    Fault {
        /// First byte of the failed access.
        addr: u64,
        /// Length of the failed access.
        len: usize,
    },
    /// The owner token names nothing this memory knows.
    #[error("unknown memory owner {0:?}")]
    UnknownOwner(MemOwner),
}

/// Access to registered memory, implemented by whoever hosts the engine.
///
/// Atomics operate on 8-byte, 8-byte-aligned words in host byte order, like Linux rxe does;
/// they must be atomic with respect to other [`Memory::compare_swap`] / [`Memory::fetch_add`]
/// calls on the same word.
pub trait Memory {
    /// Copy `buf.len()` bytes starting at `addr` into `buf`.
    fn read(&mut self, owner: MemOwner, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError>;

    /// Copy `data` to `addr`, in address order.
    fn write(&mut self, owner: MemOwner, addr: u64, data: &[u8]) -> Result<(), MemoryError>;

    /// If the word at `addr` equals `compare`, store `swap`; return the original word.
    fn compare_swap(
        &mut self,
        owner: MemOwner,
        addr: u64,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryError>;

    /// Add `add` (wrapping) to the word at `addr`; return the original word.
    fn fetch_add(&mut self, owner: MemOwner, addr: u64, add: u64) -> Result<u64, MemoryError>;
}
