//! Protection domains: the scope inside which QPs and memory regions may be used together.

/// Handle of a protection domain within one [`crate::Engine`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PdHandle(pub u32);

/// A protection domain. It only counts its users so that a PD still in use is not freed.
#[derive(Debug, Default)]
pub(crate) struct Pd {
    pub(crate) users: u32,
}
