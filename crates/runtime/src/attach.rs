//! What a host adds to a device it runs on the runtime.
//!
//! The embedded device needs nothing: applications call verbs through
//! [`crate::Runtime::lock`] and the runtime does the rest. A daemon has work and
//! completions that travel another way, through rings in memory it shares with its clients:
//! its [`Attachment`] takes posted work into the engine at every pass of the progress
//! thread, moves completions into the rings after every change, and makes the memory it
//! writes visible before anything tells a peer or a client that it was written.

use crate::SendEngine;

/// Hooks a host gives the runtime, all called under the device lock.
pub trait Attachment: Send + 'static {
    /// Whether [`Attachment::set_asleep`] must be called (it costs the progress thread a
    /// lock each time it wakes).
    const SLEEPS: bool = false;

    /// The device lock was just taken (for example: data read ahead from client memory
    /// before this point may be stale now).
    fn locked(&mut self) {}

    /// Take work posted outside the verbs calls into the engine (every pass of the progress
    /// thread, and before a verb through [`crate::EngineGuard::take_work`]). Returns how
    /// many work requests were taken: any counts as activity, which keeps the progress
    /// thread polling for [`crate::RuntimeConfig::busy_poll`].
    fn take_work(&mut self, _engine: &mut SendEngine) -> usize {
        0
    }

    /// Whether work waits that [`Attachment::take_work`] would take (the progress thread
    /// looks once more before it sleeps).
    fn has_work(&self) -> bool {
        false
    }

    /// The progress thread is about to sleep (`true`) or has woken (`false`): work posted
    /// while it sleeps must ring its doorbell ([`crate::Runtime::doorbell`]).
    fn set_asleep(&mut self, _asleep: bool) {}

    /// Make every write to registered memory so far visible to its owner: called before
    /// packets leave and before completions are delivered (a completion or an ACK says the
    /// data is in memory).
    fn flush(&mut self) {}

    /// Deliver what the engine completed (after every change of engine state).
    fn deliver(&mut self, _engine: &mut SendEngine) {}
}

/// Nothing attached: the embedded device.
#[derive(Debug, Default, Clone, Copy)]
pub struct Plain;

impl Attachment for Plain {}
