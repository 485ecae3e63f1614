//! The `coordinator` section: retries, deadlines and limits of the task coordinator.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, list_or_comma_separated, positive};

/// The `coordinator` section: retries, deadlines and limits of the task coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// Most tasks started and unfinished at once; beyond it submissions wait in their queue.
    pub max_in_flight: u64,
    /// Attempts per step before the task fails.
    pub max_attempts: u32,
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
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 1_000,
            max_attempts: 5,
            step_deadline: Duration::from_secs(300),
            download_deadline: None,
            metadata_deadline: None,
            analyze_deadline: None,
            relay_grace: Duration::from_secs(10),
            sweep_interval: Duration::from_secs(1),
            dlq_groups: Vec::new(),
        }
    }
}

impl CoordinatorConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_in_flight == 0 {
            return Err(ConfigError::invalid("coordinator.max_in_flight", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::invalid("coordinator.max_attempts", "must be at least 1"));
        }
        positive("coordinator.step_deadline", self.step_deadline)?;
        for (key, deadline) in [
            ("coordinator.download_deadline", self.download_deadline),
            ("coordinator.metadata_deadline", self.metadata_deadline),
            ("coordinator.analyze_deadline", self.analyze_deadline),
        ] {
            deadline.map_or(Ok(()), |d| positive(key, d))?;
        }
        positive("coordinator.sweep_interval", self.sweep_interval)
    }
}
