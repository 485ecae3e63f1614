//! The `telemetry` section: traces (exported over OTLP when the standard `OTEL_*` variables
//! say where).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigError;

/// The `telemetry` section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Service name on traces; defaults to the service's own name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Where people look at traces (Jaeger's UI, `http://localhost:16686`): the dashboard links
    /// a task's trace id to `<trace_ui_url>/trace/<trace id>`, or puts the id where the URL has
    /// `{trace_id}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_ui_url: Option<String>,
}

impl TelemetryConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.service_name.as_deref().is_some_and(|name| name.trim().is_empty()) {
            return Err(ConfigError::invalid("telemetry.service_name", "must not be empty when set"));
        }
        if let Some(url) = &self.trace_ui_url {
            let parsed =
                url::Url::parse(url).map_err(|e| ConfigError::invalid("telemetry.trace_ui_url", e.to_string()))?;
            if !matches!(parsed.scheme(), "http" | "https") {
                return Err(ConfigError::invalid("telemetry.trace_ui_url", "must be an http or https URL"));
            }
        }
        Ok(())
    }

    /// The link to trace `trace_id` in the trace UI, when `trace_ui_url` is set.
    pub fn trace_link(&self, trace_id: &str) -> Option<String> {
        let base = self.trace_ui_url.as_deref()?;
        Some(if base.contains("{trace_id}") {
            base.replace("{trace_id}", trace_id)
        } else {
            format!("{}/trace/{trace_id}", base.trim_end_matches('/'))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_link_appends_or_fills_in_the_id() {
        let config = |url: &str| TelemetryConfig { trace_ui_url: Some(url.to_owned()), ..TelemetryConfig::default() };
        assert_eq!(
            config("http://localhost:16686/").trace_link("ab12").as_deref(),
            Some("http://localhost:16686/trace/ab12")
        );
        assert_eq!(
            config("https://t.example/x?id={trace_id}").trace_link("ab12").as_deref(),
            Some("https://t.example/x?id=ab12")
        );
        assert!(TelemetryConfig::default().trace_link("ab12").is_none());
        assert!(config("ftp://x").validate().is_err());
        assert!(config("not a url").validate().is_err());
        assert!(config("http://localhost:16686").validate().is_ok());
    }
}
