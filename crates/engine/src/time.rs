//! Time as the engine sees it: a number handed in by the caller, never read from a clock.

use core::ops::Add;
use core::time::Duration;

/// A point in time, in nanoseconds since an origin the caller chooses (the sim starts at 0,
/// the runtime uses a monotonic clock). The engine only compares and adds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this instant is (zero if it is not after it).
    pub const fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    /// Saturates at the far future rather than wrapping: a timer that long never fires.
    fn add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_and_distance() {
        let t = Instant::from_nanos(1_000);
        let u = t + Duration::from_micros(2);
        assert_eq!(u.as_nanos(), 3_000);
        assert_eq!(u.saturating_duration_since(t), Duration::from_nanos(2_000));
        assert_eq!(t.saturating_duration_since(u), Duration::ZERO);
        assert_eq!((t + Duration::MAX).as_nanos(), u64::MAX);
    }
}
