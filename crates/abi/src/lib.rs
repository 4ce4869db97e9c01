//! # softrdma `abi`: the boundary between the verbs library and `softrdmad`
//!
//! A hardware RNIC and its user-space provider share a device ABI: the commands that create
//! and destroy objects, and the queues in memory that carry work requests and completions.
//! This crate is that ABI for softrdma's host daemon, defined once, and both sides — the
//! `softrdma` library (and through it the drop-in `libibverbs.so.1`) and the daemon — depend
//! on it; neither depends on the other.
//!
//! - [`proto`]: the control protocol over a Unix stream socket (versioned header, requests
//!   and answers, bounds-checked codecs, descriptor passing with SCM_RIGHTS);
//! - [`convert`]: engine types ↔ protocol messages;
//! - [`ring`]: single-producer single-consumer rings in a sealed memfd, the data path;
//! - [`shm`]: shared memory (sealed memfds mapped by both processes);
//! - [`wqe`]: the fixed-layout work-queue and completion entries of those rings;
//! - [`client`]: the library's end of the control socket.
//!
//! Everything a peer writes — a message body, a ring index, a ring entry — is untrusted and
//! checked before use: a bad message is an error, never a panic.

#![warn(missing_docs)]

pub mod client;
pub mod convert;
pub mod proto;
pub mod ring;
pub mod shm;
pub mod wqe;
