//! The `telemetry` section: traces (exported over OTLP when the standard `OTEL_*` variables
//! say where).

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The `telemetry` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Service name on traces; defaults to the service's own name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
}

impl TelemetryConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.service_name.as_deref().is_some_and(|name| name.trim().is_empty()) {
            return Err(ConfigError::invalid("telemetry.service_name", "must not be empty when set"));
        }
        Ok(())
    }
}
