//! Deterministic network simulation for testing softrdma's sans-IO engine (test support only).
//!
//! A [`Sim`] hosts nodes (anything implementing [`Node`]: the four sans-IO driving calls), a
//! virtual clock, one seeded random generator and a network between the nodes that can lose,
//! duplicate, reorder, corrupt and delay packets, limit bandwidth, and cut pairs of nodes apart
//! for a while. Links keep packet order (a queue) unless the reordering fault picks a packet.
//! Nothing reads the wall clock and nothing iterates in hash order, so a seed plus the nodes'
//! code determine the whole run: a failing seed replays exactly ([`Sim::trace_hash`] proves it).
//! [`seeds`] runs randomized tests over many seeds and prints the command that replays a
//! failure.
//!
//! Focused tests can also drop or rewrite chosen packets ([`Sim::set_filter`]), forge packets
//! ([`Sim::inject`]), watch every packet ([`Sim::set_trace`], e.g. into a [`pcap`] file) and
//! read the network's counters ([`Sim::stats`]).
//!
//! This crate does not depend on the engine; engine tests wrap `engine::Engine` in a type that
//! implements [`Node`].
//!
//! ```
//! use core::time::Duration;
//! use sim::{NetConfig, Node, Sim, Transmit};
//!
//! struct Quiet;
//! impl Node for Quiet {
//!     fn handle_datagram(&mut self, _: Duration, _: &[u8]) {}
//!     fn handle_timeout(&mut self, _: Duration) {}
//!     fn poll_transmit(&mut self, _: Duration, _: &mut [u8]) -> Option<Transmit> { None }
//!     fn poll_timeout(&self) -> Option<Duration> { None }
//! }
//!
//! let mut sim = Sim::new(1, NetConfig::default());
//! sim.add_node(["10.0.0.1".parse().unwrap()], Quiet);
//! assert!(matches!(
//!     sim.run_until(|_| false, Duration::from_secs(1)),
//!     Err(sim::SimError::Idle { .. })
//! ));
//! ```

#![deny(missing_docs)]

mod net;
pub mod pcap;
pub mod rng;
pub mod seeds;
mod sim;

pub use crate::net::{DropReason, LinkConfig, NetConfig, Stats};
pub use crate::rng::Rng;
pub use crate::sim::{
    FilterHook, Filtered, Node, NodeId, Sim, SimError, TraceEvent, TraceHook, TraceKind, Transmit,
    Verdict,
};
