//! The retry and deadline rules the machine decides by, and the order of the stages.

use std::sync::Arc;
use std::time::Duration;

use imagepipe_contracts::Step;
use imagepipe_runtime::backoff::ExponentialBackoff;
use imagepipe_runtime::config::StageCondition;
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

/// One stage of the pipeline as the machine runs it (`pipeline.stages`).
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    /// The step.
    pub step: Step,
    /// A custom stage's limits (a built-in step's are [`Policy`]'s own fields).
    pub limits: Option<StepPolicy>,
    /// When it runs; `None`: always.
    pub when: Option<StageCondition>,
    /// The earlier outputs its command carries, by their names in the task's outputs.
    pub inputs: Vec<String>,
}

impl Stage {
    /// A stage that always runs, with the default limits.
    pub fn always(step: Step) -> Self {
        Self { step, limits: None, when: None, inputs: Vec::new() }
    }
}

/// Retry and deadline rules of every step, and the order of the stages.
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
    /// The stages in order, `download` first (default: the built-in pipeline).
    pub stages: Arc<[Stage]>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            download: StepPolicy::default(),
            metadata: StepPolicy::default(),
            analyze: StepPolicy::default(),
            backoff: ExponentialBackoff::step_retries(),
            stages: Step::ALL.map(Stage::always).into(),
        }
    }
}

impl Policy {
    /// The rules of `step` (a custom stage not in the pipeline gets the download step's).
    pub fn step(&self, step: Step) -> StepPolicy {
        match step {
            Step::Download => self.download,
            Step::Metadata => self.metadata,
            Step::Analyze => self.analyze,
            Step::Custom(_) => self.stage(step).and_then(|s| s.limits).unwrap_or(self.download),
        }
    }

    /// The pipeline's steps, in order.
    pub fn steps(&self) -> impl Iterator<Item = Step> + '_ {
        self.stages.iter().map(|s| s.step)
    }

    /// The pipeline's stage of `step`, if it has one.
    pub fn stage(&self, step: Step) -> Option<&Stage> {
        self.stages.iter().find(|s| s.step == step)
    }

    /// Where `step` runs in the pipeline (0 for `download`); `None` when it is no stage of it.
    pub fn position(&self, step: Step) -> Option<usize> {
        self.stages.iter().position(|s| s.step == step)
    }

    /// `step` and the stages after it, in order (none when `step` is not in the pipeline).
    pub fn stages_from(&self, step: Step) -> &[Stage] {
        self.position(step).map_or(&[], |i| &self.stages[i..])
    }

    /// The stages after `step`, in order (none when `step` is not in the pipeline).
    pub fn stages_after(&self, step: Step) -> &[Stage] {
        self.position(step).map_or(&[], |i| &self.stages[i + 1..])
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
