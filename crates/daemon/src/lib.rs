//! # softrdma `daemon`: one soft RNIC per host, shared by every process
//!
//! `softrdmad` hosts the engine for all local processes: it owns UDP 4791 on its devices'
//! addresses (one device per interface, `srxe0`, `srxe1`...), and clients drive it over a
//! Unix stream socket with the versioned, length-checked messages of [`proto`]. The daemon
//! reaches a client's registered memory with `process_vm_readv` / `process_vm_writev` on that
//! client's own pid ([`memory`]), keeps each connection's objects in a table of its own
//! ([`server`]), and destroys them when the connection ends. [`client::Client`] is the other
//! end of the socket.
//!
//! Layers: [`proto`] (bytes ↔ messages, no I/O), [`convert`] (engine types ↔ messages,
//! shared by both ends), [`memory`] (client memory as an [`engine::Memory`]), [`host`] (an
//! engine on UDP sockets with a progress thread), [`server`] (connections and handle
//! tables), [`client`] (the library side, which the `softrdma` API's daemon backend uses),
//! [`ring`] (shared-memory rings over a sealed memfd).
//!
//! ## Data path today
//!
//! Posting is a request on the socket. Completions come either by request
//! ([`proto::Request::PollCq`]) or, after [`client::Client::attach_cq_ring`], through a CQ
//! ring in shared memory (its memfd passed with SCM_RIGHTS) that the client polls with no
//! system call. The daemon refills a ring whenever it handles anything; while completions
//! wait for room it looks again every 200 µs (no consumer doorbell yet). A completion
//! channel ([`proto::Request::CqChannel`]) is an eventfd passed the same way, signalled when
//! a notification armed with [`proto::Request::ReqNotifyCq`] fires (at once if the CQ is
//! not empty). Asynchronous events are kept (at most 1024, oldest dropped) until the
//! connection owning their QP, CQ or SRQ takes them ([`proto::Request::GetAsyncEvents`]);
//! a connection's event channel ([`proto::Request::AsyncEventChannel`], an eventfd) is
//! signalled whenever one is raised.
//!
//! Memory windows (alloc, bind verb, BIND_MW and LOCAL_INV work requests), SRQs, AHs and
//! UD sends go over the protocol too.
//!
//! Not here yet (issue 6): SQ/RQ rings and doorbells (posting is a message today), a
//! consumer doorbell for CQ rings, same-host direct data movement (two QPs of one daemon
//! still exchange UDP packets).

#![warn(missing_docs)]

pub mod client;
pub mod convert;
pub mod host;
pub mod memory;
pub mod proto;
pub mod ring;
pub mod server;
