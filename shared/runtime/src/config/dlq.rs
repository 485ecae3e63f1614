//! The `dlq` section: how much of the dead-letter archive the coordinator keeps.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, positive};

/// The `dlq` section: bounds of the coordinator's dead-letter archive (`/v1/dlq`). The oldest
/// entries go first, whichever bound is reached; each entry keeps at most 64 KiB of its body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DlqConfig {
    /// Most dead letters archived at once; beyond it the oldest are deleted.
    pub max_entries: u64,
    /// Dead letters older than this (since they were dead-lettered) are deleted.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub max_age: Duration,
}

impl Default for DlqConfig {
    fn default() -> Self {
        Self { max_entries: 10_000, max_age: Duration::from_secs(14 * 24 * 3600) }
    }
}

impl DlqConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_entries == 0 {
            return Err(ConfigError::invalid("dlq.max_entries", "must be at least 1"));
        }
        positive("dlq.max_age", self.max_age)
    }
}
