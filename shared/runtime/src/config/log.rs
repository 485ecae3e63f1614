//! The `log` section: how log lines are written.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The `log` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Line format.
    pub format: LogFormat,
    /// `tracing` filter directives (`info`, `imagepipe_runtime=debug,info`); `RUST_LOG`, when
    /// set, takes precedence. Also accepted as `log.level`.
    #[serde(alias = "level")]
    pub filter: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self { format: LogFormat::default(), filter: "info".into() }
    }
}

impl LogConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        tracing_subscriber::EnvFilter::try_new(&self.filter).map_err(|e| {
            ConfigError::invalid("log.filter", format!("{:?} is not a tracing filter ({e})", self.filter))
        })?;
        Ok(())
    }
}
