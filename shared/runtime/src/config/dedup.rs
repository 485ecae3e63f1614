//! The `dedup` section: how the event subscribers remember the `eventId`s they handled.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The `dedup` section: how long and how many handled `eventId`s a subscriber remembers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DedupConfig {
    /// How long a handled event id is remembered (a Redis key's TTL, or an embedded entry's
    /// age limit); redeliveries come within the event stream's retention, so keep it longer.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub ttl: Duration,
    /// Most event ids a subscriber group's embedded set holds (`store.kind = embedded`); the
    /// oldest go first.
    pub capacity: usize,
}

impl Default for DedupConfig {
    fn default() -> Self {
        Self { ttl: Duration::from_secs(7 * 24 * 3600), capacity: 100_000 }
    }
}

impl DedupConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.ttl < Duration::from_millis(1) {
            return Err(ConfigError::invalid("dedup.ttl", "must be at least 1ms"));
        }
        if self.capacity == 0 {
            return Err(ConfigError::invalid("dedup.capacity", "must be at least 1"));
        }
        Ok(())
    }
}
