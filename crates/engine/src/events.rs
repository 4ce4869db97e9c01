//! Asynchronous events beyond the RC ones: acknowledging them (`ibv_ack_async_event`) and
//! the port state that raises `PORT_ACTIVE` / `PORT_ERR` (IBA 11.6.3).
//!
//! The engine is sans-IO, so "waiting" for an event is the host's business: it polls
//! [`crate::Engine::get_async_event`] after each driving call. Events that name an SRQ or
//! a QP of an SRQ must be acknowledged before the SRQ can be destroyed, as libibverbs
//! requires (`ibv_destroy_srq` waits for the acknowledgements).

use crate::device::PortState;
use crate::memory::Memory;
use crate::{AsyncEvent, Engine};

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_ack_async_event`: the application is done with `event` (returned by
    /// `get_async_event`). Events that need no acknowledgement are accepted too.
    pub fn ack_async_event(&mut self, event: &AsyncEvent) {
        if let Some(i) = self.unacked_events.iter().position(|e| e == event) {
            self.unacked_events.swap_remove(i);
        }
    }

    /// How many delivered events equal to `event` are not acknowledged yet.
    pub(crate) fn unacked_events_of(&self, event: AsyncEvent) -> usize {
        self.unacked_events.iter().filter(|&&e| e == event).count()
    }

    /// Events delivered by `get_async_event` and not acknowledged yet (SRQ limit and last
    /// WQE reached events only).
    pub fn unacked_async_events(&self) -> usize {
        self.unacked_events.len()
    }

    /// Whether `get_async_event` has an event to return.
    pub fn has_async_event(&self) -> bool {
        !self.events.is_empty()
    }

    /// Bring port 1 up or down (a soft port follows its host's network interface): a change
    /// raises `PortActive` or `PortErr`. While the port is down, packets are neither
    /// received nor sent.
    pub fn set_port_state(&mut self, state: PortState) {
        if state == self.port_state {
            return;
        }
        self.port_state = state;
        self.events.push_back(match state {
            PortState::Active => AsyncEvent::PortActive { port: 1 },
            PortState::Down => AsyncEvent::PortErr { port: 1 },
        });
    }

    /// Remember an event that needs acknowledging, as `get_async_event` hands it out.
    pub(crate) fn note_delivered(&mut self, event: AsyncEvent) {
        if matches!(
            event,
            AsyncEvent::SrqLimitReached { .. } | AsyncEvent::QpLastWqeReached { .. }
        ) {
            self.unacked_events.push(event);
        }
    }
}
