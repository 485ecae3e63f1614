//! Wall-clock time behind a trait, so timestamps and due times can be tested.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `d` in whole milliseconds, saturating: the unit of every stored timestamp and TTL.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A source of wall-clock time.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> SystemTime;

    /// The current time in Unix milliseconds (the envelope's `timestamp`); 0 before 1970.
    fn unix_ms(&self) -> u64 {
        self.now().duration_since(UNIX_EPOCH).map_or(0, millis)
    }
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that moves only when told to; clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock {
    now: Arc<Mutex<SystemTime>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: SystemTime) -> Self {
        Self { now: Arc::new(Mutex::new(start)) }
    }

    /// A clock standing at `ms` Unix milliseconds.
    pub fn at_unix_ms(ms: u64) -> Self {
        Self::new(UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        *self.lock() += by;
    }

    /// Sets the clock to `to` (which may be earlier, as wall clocks sometimes are).
    pub fn set(&self, to: SystemTime) {
        *self.lock() = to;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SystemTime> {
        self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.lock()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told_and_clones_share_it() {
        let clock = ManualClock::at_unix_ms(1_763_800_000_000);
        let shared = clock.clone();
        assert_eq!(clock.unix_ms(), 1_763_800_000_000);
        shared.advance(Duration::from_millis(1_500));
        assert_eq!(clock.unix_ms(), 1_763_800_001_500);
        clock.set(UNIX_EPOCH + Duration::from_secs(5));
        assert_eq!(shared.unix_ms(), 5_000);
    }

    #[test]
    fn the_system_clock_is_after_2025() {
        assert!(SystemClock.unix_ms() > 1_735_689_600_000);
    }

    #[test]
    fn clocks_are_usable_as_trait_objects() {
        let clocks: Vec<Box<dyn Clock>> = vec![Box::new(SystemClock), Box::new(ManualClock::at_unix_ms(1))];
        assert_eq!(clocks[1].unix_ms(), 1);
    }
}
