//! Delayed redelivery through retry topics, one per delay tier and consumer group.
//!
//! A nack with delay `d` writes the message, with its next delivery count and its due time
//! (`now + d`) in headers, to the group's retry topic of the smallest tier at least `d` (the
//! largest tier when `d` is beyond it), then commits past the original. The group reads its
//! retry topics like its main topics; a message not yet due is held in memory and its partition
//! paused until then, so nothing sleeps in a handler and the other partitions keep flowing.
//! Within one tier, messages are due at most one tier step apart, so one held at the head of a
//! partition delays the ones behind it by less than that.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The delay tiers of one bus, strictly increasing, at least one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetryTiers(Vec<Duration>);

impl RetryTiers {
    /// Tiers from config (validated: strictly increasing, not empty).
    pub(crate) fn new(tiers: Vec<Duration>) -> Self {
        debug_assert!(!tiers.is_empty());
        Self(tiers)
    }

    /// Every tier.
    pub(crate) fn all(&self) -> &[Duration] {
        &self.0
    }

    /// The tier whose topic carries a redelivery delayed by `delay`.
    pub(crate) fn tier_for(&self, delay: Duration) -> Duration {
        self.0.iter().copied().find(|tier| *tier >= delay).unwrap_or_else(|| *self.0.last().expect("at least one tier"))
    }
}

/// Milliseconds since the Unix epoch of `at`.
pub(crate) fn unix_ms(at: SystemTime) -> i64 {
    i64::try_from(at.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis()).unwrap_or(i64::MAX)
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> i64 {
    unix_ms(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delay_goes_to_the_smallest_tier_that_covers_it() {
        let s = Duration::from_secs;
        let tiers = RetryTiers::new(vec![s(1), s(10), s(60), s(600)]);
        assert_eq!(tiers.tier_for(Duration::ZERO), s(1));
        assert_eq!(tiers.tier_for(s(1)), s(1));
        assert_eq!(tiers.tier_for(Duration::from_millis(1001)), s(10));
        assert_eq!(tiers.tier_for(s(30)), s(60));
        assert_eq!(tiers.tier_for(s(600)), s(600));
        assert_eq!(tiers.tier_for(s(3600)), s(600), "beyond the largest tier: the largest, held until due");
    }
}
