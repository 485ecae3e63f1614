//! The retry and deadline rules the machine decides by.

use std::time::Duration;

use imagepipe_contracts::Step;
use imagepipe_runtime::backoff::ExponentialBackoff;
use rand::SeedableRng;
use rand::rngs::StdRng;

/// Limits of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPolicy {
    /// Attempts before the task fails.
    pub max_attempts: u32,
    /// How long an attempt may stay silent before it counts as failed.
    pub deadline: Duration,
}

impl Default for StepPolicy {
    fn default() -> Self {
        Self { max_attempts: 5, deadline: Duration::from_secs(300) }
    }
}

/// Retry and deadline rules of every step.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The download step.
    pub download: StepPolicy,
    /// The metadata step.
    pub metadata: StepPolicy,
    /// The analyze step.
    pub analyze: StepPolicy,
    /// Delay before each retry (default: 1 s doubling, cap 60 s, full jitter). Its maximum
    /// also caps a worker's `retry_after`, so no server holds a task longer than that.
    pub backoff: ExponentialBackoff,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            download: StepPolicy::default(),
            metadata: StepPolicy::default(),
            analyze: StepPolicy::default(),
            backoff: ExponentialBackoff::step_retries(),
        }
    }
}

impl Policy {
    /// The rules of `step`.
    pub fn step(&self, step: Step) -> StepPolicy {
        match step {
            Step::Download => self.download,
            Step::Metadata => self.metadata,
            Step::Analyze => self.analyze,
        }
    }

    /// The backoff after failed attempt `attempt` (from 1), its jitter drawn from `seed`.
    pub fn backoff(&self, attempt: u32, seed: u64) -> Duration {
        self.backoff.delay_with(attempt.saturating_sub(1), &mut StdRng::seed_from_u64(seed))
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_jitter_stays_under_the_doubling_cap_and_is_reproducible() {
        let p = Policy::default();
        for seed in 0..200 {
            assert!(p.backoff(1, seed) <= Duration::from_secs(1));
            assert!(p.backoff(3, seed) <= Duration::from_secs(4));
            assert!(p.backoff(40, seed) <= Duration::from_secs(60));
            assert_eq!(p.backoff(5, seed), p.backoff(5, seed));
        }
        let spread: std::collections::HashSet<_> = (0..50).map(|seed| p.backoff(10, seed)).collect();
        assert!(spread.len() > 40, "jitter spreads retries");
    }
}
