//! The `coordinator` section: retries, deadlines and limits of the task coordinator.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, list_or_comma_separated, positive};
use crate::backoff::ExponentialBackoff;

/// The `coordinator` section: retries, deadlines and limits of the task coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// Most tasks started and unfinished at once; beyond it submissions wait in their queue.
    pub max_in_flight: u64,
    /// Attempts per step before the task fails.
    pub max_attempts: u32,
    /// Delay before a step's first retry; it doubles per attempt up to `retry_max_backoff`,
    /// with full jitter (each delay drawn between zero and the doubled value).
    #[serde(with = "humantime_serde")]
    pub retry_min_backoff: Duration,
    /// Longest delay before a retry, whatever a worker reports: a server answering
    /// `Retry-After: 3600` holds its task (and its in-flight slot) this long at most.
    #[serde(with = "humantime_serde")]
    pub retry_max_backoff: Duration,
    /// How long a step may stay silent before the attempt counts as failed.
    #[serde(with = "humantime_serde")]
    pub step_deadline: Duration,
    /// The download step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub download_deadline: Option<Duration>,
    /// The metadata step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub metadata_deadline: Option<Duration>,
    /// The analyze step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    pub analyze_deadline: Option<Duration>,
    /// How long after a state write the sweeper relays outbox entries the write's own relay
    /// did not (e.g. after a crash).
    #[serde(with = "humantime_serde")]
    pub relay_grace: Duration,
    /// How often the sweeper looks for due timers and unrelayed outbox entries.
    #[serde(with = "humantime_serde")]
    pub sweep_interval: Duration,
    /// Subscriber groups whose dead letters the coordinator archives for `/v1/dlq`, besides
    /// every task queue's; a comma-separated list in the environment.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub dlq_groups: Vec<String>,
    /// How long a finished task (completed, failed, cancelled) is kept after its last
    /// transition: then its record, history, indexes and idempotency key are deleted.
    #[serde(with = "humantime_serde")]
    pub retention: Duration,
}

impl Default for CoordinatorConfig {
    /// The retry backoff's range is [`ExponentialBackoff::step_retries`]'s.
    fn default() -> Self {
        let backoff = ExponentialBackoff::step_retries();
        Self {
            max_in_flight: 1_000,
            max_attempts: 5,
            retry_min_backoff: backoff.min(),
            retry_max_backoff: backoff.max(),
            step_deadline: Duration::from_secs(300),
            download_deadline: None,
            metadata_deadline: None,
            analyze_deadline: None,
            relay_grace: Duration::from_secs(10),
            sweep_interval: Duration::from_secs(1),
            dlq_groups: Vec::new(),
            retention: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl CoordinatorConfig {
    /// The backoff between a step's attempts: [`ExponentialBackoff::step_retries`] between
    /// `retry_min_backoff` and `retry_max_backoff`.
    pub fn retry_backoff(&self) -> Result<ExponentialBackoff, ConfigError> {
        ExponentialBackoff::step_retries()
            .with_range(self.retry_min_backoff, self.retry_max_backoff)
            .map_err(|e| ConfigError::invalid("coordinator.retry_min_backoff", e.to_string()))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_in_flight == 0 {
            return Err(ConfigError::invalid("coordinator.max_in_flight", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::invalid("coordinator.max_attempts", "must be at least 1"));
        }
        self.retry_backoff()?;
        positive("coordinator.step_deadline", self.step_deadline)?;
        for (key, deadline) in [
            ("coordinator.download_deadline", self.download_deadline),
            ("coordinator.metadata_deadline", self.metadata_deadline),
            ("coordinator.analyze_deadline", self.analyze_deadline),
        ] {
            deadline.map_or(Ok(()), |d| positive(key, d))?;
        }
        positive("coordinator.retention", self.retention)?;
        positive("coordinator.sweep_interval", self.sweep_interval)
    }
}
