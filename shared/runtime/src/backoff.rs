//! Exponential backoff with jitter, for every retry in imagepipe (after linkerd2-proxy's
//! `ExponentialBackoff`).

use std::time::Duration;

use rand::Rng;

/// How much randomness is added to a delay, so that many clients failing together do not
/// retry together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Jitter {
    /// Exactly the exponential delay.
    None,
    /// The exponential delay plus up to this fraction of it (`0.5` adds 0–50 %), capped at the
    /// maximum.
    Proportional(f64),
    /// Uniform between zero and the exponential delay ("full jitter").
    Full,
}

/// Delays `min · 2^attempt`, capped at `max`, with [`Jitter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExponentialBackoff {
    min: Duration,
    max: Duration,
    jitter: Jitter,
}

/// Backoff parameters that make no sense.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidBackoff {
    /// `min` is zero or larger than `max`.
    #[error("backoff minimum {min:?} must be non-zero and at most the maximum {max:?}")]
    Range {
        /// The minimum given.
        min: Duration,
        /// The maximum given.
        max: Duration,
    },
    /// A proportional jitter that is negative or not finite.
    #[error("jitter ratio {0} must be finite and at least 0")]
    Jitter(f64),
}

impl ExponentialBackoff {
    /// A backoff from `min` doubling up to `max`.
    pub fn new(min: Duration, max: Duration, jitter: Jitter) -> Result<Self, InvalidBackoff> {
        if min.is_zero() || min > max {
            return Err(InvalidBackoff::Range { min, max });
        }
        if let Jitter::Proportional(ratio) = jitter
            && !(ratio.is_finite() && ratio >= 0.0)
        {
            return Err(InvalidBackoff::Jitter(ratio));
        }
        Ok(Self { min, max, jitter })
    }

    /// The coordinator's step retries: 1 s doubling, capped at 60 s, full jitter.
    pub fn step_retries() -> Self {
        Self { min: Duration::from_secs(1), max: Duration::from_secs(60), jitter: Jitter::Full }
    }

    /// This backoff's jitter between `min` and `max` instead.
    pub fn with_range(self, min: Duration, max: Duration) -> Result<Self, InvalidBackoff> {
        Self::new(min, max, self.jitter)
    }

    /// Reconnects and fetch retries after a broker hiccup: 100 ms doubling, capped at 10 s,
    /// plus up to 50 %.
    pub fn broker_reconnect() -> Self {
        Self { min: Duration::from_millis(100), max: Duration::from_secs(10), jitter: Jitter::Proportional(0.5) }
    }

    /// Redeliveries of an input whose handling the state store failed (unreachable, failing
    /// over): 2 s doubling, capped at 30 s, plus up to 50 %, so that the four waits between
    /// five deliveries add up to at least 30 s, longer than a Redis failover takes, and an
    /// input is not dead-lettered for an outage that is not its fault.
    pub fn store_outage() -> Self {
        Self { min: Duration::from_secs(2), max: Duration::from_secs(30), jitter: Jitter::Proportional(0.5) }
    }

    /// The smallest un-jittered delay.
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The cap on every delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay before retry number `attempt` (0 for the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, &mut rand::rng())
    }

    /// [`delay`](Self::delay) drawing jitter from `rng` (seed it for reproducible delays).
    pub fn delay_with<R: Rng + ?Sized>(&self, attempt: u32, rng: &mut R) -> Duration {
        let base = self.base(attempt);
        match self.jitter {
            Jitter::None => base,
            Jitter::Proportional(ratio) => {
                let extra = base.as_secs_f64() * ratio * rng.random::<f64>();
                (base + Duration::try_from_secs_f64(extra).unwrap_or(self.max)).min(self.max)
            }
            Jitter::Full => base.mul_f64(rng.random::<f64>()),
        }
    }

    /// A sequence of delays for one retry loop; [`Attempts::reset`] it after a success.
    pub fn attempts(&self) -> Attempts {
        Attempts { backoff: *self, attempt: 0 }
    }

    fn base(&self, attempt: u32) -> Duration {
        2u32.checked_pow(attempt).and_then(|factor| self.min.checked_mul(factor)).map_or(self.max, |d| d.min(self.max))
    }
}

/// The delays of one retry loop, growing with each failure.
#[derive(Debug, Clone)]
pub struct Attempts {
    backoff: ExponentialBackoff,
    attempt: u32,
}

impl Attempts {
    /// The delay before the next retry; each call counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.backoff.delay(self.attempt);
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    /// Failures counted since the last reset.
    pub fn failures(&self) -> u32 {
        self.attempt
    }

    /// Back to the smallest delay (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn without_jitter_delays_double_up_to_the_cap() {
        let backoff = ExponentialBackoff::new(secs(1), secs(60), Jitter::None).unwrap();
        let delays: Vec<_> = (0..9).map(|a| backoff.delay(a).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff.delay(u32::MAX), secs(60), "huge attempt numbers do not overflow");
    }

    #[test]
    fn full_jitter_stays_between_zero_and_the_exponential_delay() {
        let backoff = ExponentialBackoff::step_retries();
        let mut rng = StdRng::seed_from_u64(7);
        for attempt in 0..12 {
            let cap = secs(1).saturating_mul(1 << attempt.min(6)).min(secs(60));
            for _ in 0..200 {
                let d = backoff.delay_with(attempt, &mut rng);
                assert!(d <= cap, "attempt {attempt}: {d:?} > {cap:?}");
            }
        }
        let spread: Vec<_> = (0..200).map(|_| backoff.delay_with(10, &mut rng)).collect();
        assert!(spread.iter().any(|d| *d < secs(20)) && spread.iter().any(|d| *d > secs(40)), "jitter spreads");
    }

    #[test]
    fn proportional_jitter_adds_at_most_its_ratio_and_respects_the_cap() {
        let backoff = ExponentialBackoff::new(secs(1), secs(10), Jitter::Proportional(0.5)).unwrap();
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..200 {
            let d = backoff.delay_with(1, &mut rng);
            assert!((secs(2)..=secs(3)).contains(&d), "{d:?}");
            assert!(backoff.delay_with(20, &mut rng) <= secs(10));
        }
    }

    #[test]
    fn five_deliveries_under_the_store_outage_backoff_span_at_least_30_seconds() {
        let backoff = ExponentialBackoff::store_outage();
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..100 {
            let waits: Duration = (0..4).map(|attempt| backoff.delay_with(attempt, &mut rng)).sum();
            assert!(waits >= secs(30), "{waits:?}");
            assert!(waits <= secs(45), "{waits:?}");
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_delays() {
        let backoff = ExponentialBackoff::step_retries();
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..8).map(|a| backoff.delay_with(a, &mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
    }

    #[test]
    fn attempts_grow_and_reset() {
        let backoff = ExponentialBackoff::new(Duration::from_millis(100), secs(1), Jitter::None).unwrap();
        let mut attempts = backoff.attempts();
        let delays: Vec<_> = (0..6).map(|_| attempts.next_delay().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(attempts.failures(), 6);
        attempts.reset();
        assert_eq!(attempts.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn with_range_keeps_the_jitter() {
        let backoff = ExponentialBackoff::step_retries().with_range(secs(2), secs(5)).unwrap();
        assert_eq!((backoff.min(), backoff.max(), backoff.jitter), (secs(2), secs(5), Jitter::Full));
        assert!(ExponentialBackoff::step_retries().with_range(secs(5), secs(2)).is_err());
    }

    #[test]
    fn nonsense_parameters_are_refused() {
        assert!(ExponentialBackoff::new(Duration::ZERO, secs(1), Jitter::None).is_err());
        assert!(ExponentialBackoff::new(secs(2), secs(1), Jitter::None).is_err());
        assert!(ExponentialBackoff::new(secs(1), secs(2), Jitter::Proportional(-1.0)).is_err());
        assert!(ExponentialBackoff::new(secs(1), secs(2), Jitter::Proportional(f64::NAN)).is_err());
    }
}
