//! # softrdma `abi`: the boundary between the verbs library and `softrdmad`
//!
//! A hardware RNIC and its user-space provider share a device ABI: the commands that create
//! and destroy objects, and the queues in memory that carry work requests and completions.
//! This crate is that ABI for softrdma's host daemon, defined once, and both sides — the
//! `softrdma` library (and through it the drop-in `libibverbs.so.1`) and the daemon — depend
//! on it; neither depends on the other.
//!
//! - [`proto`]: the control protocol over a Unix stream socket (versioned header, requests
//!   and answers each defined once, as a table, descriptor passing with SCM_RIGHTS);
//! - [`codec`]: the bounds-checked codec of every field type, the engine's types included;
//! - [`ring`]: single-producer single-consumer rings in shared memory, the data path;
//! - [`arena`]: the few large sealed memfds that hold a connection's many rings;
//! - [`doorbell`]: the page of bits by which a client says which of its work rings to look
//!   at, and the daemon says whether it sleeps;
//! - [`shm`]: shared memory (sealed memfds mapped by both processes);
//! - [`maps`]: a process's mappings, which registration checks;
//! - [`wqe`]: the fixed-layout work-queue and completion entries of those rings;
//! - [`client`]: the library's end of the control socket.
//! - [`cm_ffi`]: the records of the private C interface between the drop-in librdmacm and
//!   libibverbs (not part of the daemon protocol).
//!
//! Everything a peer writes — a message body, a ring index, a ring entry — is untrusted and
//! checked before use: a bad message is an error, never a panic.
//!
//! ## The control protocol is defined once
//!
//! Each request and each answer is one row of a table in [`proto`] (its number, its
//! constant, its variant and typed fields); the enums, the numbers and both codecs are
//! generated from the rows, and the fields are the engine's own types (`engine::QpAttr`,
//! `QpInitAttr`, `AhAttr`, `DeviceAttr`, `PortAttr`, `SrqAttr`, `MwBind`, `AsyncEvent`...),
//! each with one [`codec::Wire`] codec. Neither side converts a message into an engine type:
//! the client sends what the library's caller gave it, the daemon hands what it decoded to
//! the engine after replacing the connection's handles with the engine's. Adding a request
//! is one row in [`proto::Request`]'s table, its handler in the daemon, and its method on
//! [`client::Client`] (see [`proto`] for the steps); a change to the bytes bumps
//! [`proto::VERSION`], which both ends check at connect.

#![warn(missing_docs)]

pub mod arena;
pub mod client;
pub mod cm_ffi;
pub mod codec;
pub mod doorbell;
pub mod maps;
pub mod proto;
pub mod ring;
pub mod shm;
pub mod wqe;
