//! # softrdma `daemon`: one soft RNIC per host, shared by every process
//!
//! `softrdmad` hosts the engine for all local processes: it owns UDP 4791 on its devices'
//! addresses (one device per interface, `srxe0`, `srxe1`...), and clients drive it over a
//! Unix stream socket with the versioned, length-checked messages of the device ABI
//! ([`abi::proto`], a crate of its own that the library depends on too). The daemon
//! reaches a client's registered memory through the `/proc/<pid>/mem` it opened when the
//! client connected (bound to that process, not to its pid), or through its own mapping of
//! the client's file when the client registered shared memory with it ([`memory`],
//! [`abi::shm`]), keeps each connection's objects in a table of its own ([`server`]), and
//! destroys them when the connection ends. [`abi::client::Client`] is the other end of the
//! socket.
//!
//! Layers: [`memory`] (client memory as an [`engine::Memory`]), [`host`] (a device: an
//! engine on the runtime), [`server`] (connections and handle tables), [`wq`] (work rings:
//! validating what clients write). Below them, in [`abi`]: [`abi::proto`] (bytes ↔
//! messages carrying the engine's types, no I/O; one table row per request), [`abi::ring`]
//! (shared-memory rings), [`abi::arena`] (a connection's rings in a few sealed memfds),
//! [`abi::shm`] (client buffers the daemon maps).
//!
//! ## Data path
//!
//! Posting: each QP's send and receive queue (and each SRQ) can take its WQEs from a ring in
//! shared memory ([`abi::proto::Request::AttachWorkRing`]). Every ring of a connection, work
//! and CQ rings alike, lives in the connection's ring arena ([`abi::arena`]): a few large
//! sealed memfds, each passed once with SCM_RIGHTS and mapped once on each side, so tens of
//! thousands of rings (up to `--max-work-rings`, 65536 by default) cost a handful of
//! mappings, the budget (`vm.max_map_count`) every client of the daemon shares. The client
//! writes the work request as a fixed-layout entry ([`abi::wqe`]), sets the ring's bit
//! in the connection's doorbell page of the device ([`abi::doorbell`],
//! [`abi::proto::Request::DoorbellPage`], another sealed memfd), and writes the device's
//! doorbell ([`abi::proto::Request::Doorbell`], an eventfd) only when the page's sleeping word
//! says the progress thread sleeps; while it is busy (and for a short idle spin after,
//! `--busy-poll-us`) it takes WQEs on its own, so a stream of posts costs no system call. The
//! progress thread drains only the rings whose bits it finds set (and those it left work in),
//! so a pass costs what was posted, not the number of rings.
//! [`wq`] validates every index and WQE a client writes; a lying ring is detached and its QP
//! moved to the error state. Posting by request still works (and is what the library falls
//! back to for a WQE it cannot vouch for): any request first takes what waits in the
//! connection's rings, so order is kept.
//!
//! Completions come either by request ([`abi::proto::Request::PollCq`]) or, after
//! [`abi::client::Client::attach_cq_ring`], through a CQ ring in shared memory that the client
//! polls with no system call. The daemon refills a ring whenever it handles anything; while
//! completions wait for room it sets the ring's backlog word, and a client that frees slots
//! then rings the device's doorbell (only then: no system call while nothing waits). A
//! completion channel ([`abi::proto::Request::CqChannel`]) is an eventfd passed the same way,
//! signalled when an armed notification fires. A CQ with a ring is armed in place, as a NIC's
//! library arms one with a doorbell: the client writes the ring's arm word (with the producer
//! index it saw) and sets the CQ's bit in its doorbell page
//! ([`abi::proto::Request::AttachCqArm`]), and the daemon arms the CQ when it takes the bit —
//! firing it at once for completions that reached the ring after the arm. No request, no
//! reply to wait for: `ibv_req_notify_cq` costs no system call while the daemon is awake.
//! [`abi::proto::Request::ReqNotifyCq`] arms by request (at once if the daemon holds
//! completions). Asynchronous events are kept (at most 1024, oldest dropped)
//! until the connection owning their QP, CQ or SRQ takes them
//! ([`abi::proto::Request::GetAsyncEvents`]); a connection's event channel
//! ([`abi::proto::Request::AsyncEventChannel`], an eventfd) is signalled whenever one is raised.
//!
//! Two QPs on the same device exchange their packets inside the daemon, never through a
//! socket (the device's `local_packets` counter; `tx_datagrams` counts what left as UDP), and
//! over the engine's internal path: 32 KiB segments sealed without an ICRC
//! (`engine::EngineConfig::internal_addresses`), since they never meet a wire.
//!
//! Client memory ([`memory::ClientMemory`]) is read ahead (one `pread` of 16 KiB, growing to
//! 256 KiB as a message runs on, valid until the device lock is next taken) and written
//! behind (continuing writes gathered into one `pwrite`, flushed before any completion or
//! packet leaves): a call's fixed cost dominates small accesses, the kernel's page-by-page
//! copy large ones.
//! Memory registered with its file ([`abi::proto::Request::RegMrShared`]: a large
//! `softrdma::Buffer` lives in a sealed memfd) is mapped by the daemon and copied with
//! plain memory copies instead, its atomics being CPU atomics; the daemon first checks that
//! the file cannot shrink and that the client really has it mapped at that address.
//!
//! Memory windows (alloc, bind verb, BIND_MW and LOCAL_INV work requests), SRQs, AHs and
//! UD sends go over the protocol too.
//!
//! Two devices of one daemon ([`host::link_devices`]) hand each other their packets through
//! an inbox (`peer_packets`), never a socket either, and over internal paths as QPs of one
//! device do: 32 KiB segments without an ICRC.
//!
//! Not here: a same-daemon transfer is still two copies (the sender's memory into a packet,
//! the packet into the receiver's), not one from one client straight to the other.

#![warn(missing_docs)]

pub mod host;
pub mod memory;
pub mod server;
pub mod wq;
