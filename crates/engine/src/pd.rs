//! Protection domains: the scope inside which QPs and memory regions may be used together,
//! and their verbs (`alloc_pd`, `dealloc_pd`).

use crate::error::VerbsError;
use crate::memory::Memory;
use crate::Engine;

/// Handle of a protection domain within one [`crate::Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdHandle(pub u32);

/// A protection domain. It only counts its users so that a PD still in use is not freed.
#[derive(Debug, Default)]
pub(crate) struct Pd {
    pub(crate) users: u32,
}

impl<M: Memory + ?Sized> Engine<M> {
    /// `ibv_alloc_pd`.
    pub fn alloc_pd(&mut self) -> Result<PdHandle, VerbsError> {
        if self.pds.len() >= self.config.device.max_pd as usize {
            return Err(VerbsError::TooMany("protection domains"));
        }
        Ok(PdHandle(self.pds.insert(Pd::default())))
    }

    /// `ibv_dealloc_pd`: fails with `Busy` while MRs or QPs use it.
    pub fn dealloc_pd(&mut self, pd: PdHandle) -> Result<(), VerbsError> {
        let p = self.pds.get(pd.0).ok_or(VerbsError::InvalidPd)?;
        if p.users > 0 {
            return Err(VerbsError::Busy("protection domain in use"));
        }
        self.pds.remove(pd.0);
        Ok(())
    }
}
