//! The `notification` section: where and how the notification worker posts webhooks.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Secret, list_or_comma_separated, optional_list_or_comma_separated};

/// The `notification` section: where and how the notification worker posts webhooks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NotificationConfig {
    /// URLs that receive every `task.completed`, `task.failed` and `task.cancelled` event,
    /// besides the task's own `callbackUrl`; a comma-separated list in the environment.
    #[serde(deserialize_with = "list_or_comma_separated")]
    pub subscribers: Vec<String>,
    /// Key of the `X-Imagepipe-Signature` HMAC-SHA256; without it webhooks are not signed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<Secret<String>>,
    /// Longest time to resolve and connect to a webhook target.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest time for one webhook request, redirects and response included.
    #[serde(with = "humantime_serde")]
    pub total_timeout: Duration,
    /// Deliveries of one event before it is dead-lettered (each one posts to every target not
    /// yet reached).
    pub max_attempts: u32,
    /// Delay before the first retry; it doubles per attempt (with jitter) up to `retry_max`.
    #[serde(with = "humantime_serde")]
    pub retry_min: Duration,
    /// Longest delay between two attempts.
    #[serde(with = "humantime_serde")]
    pub retry_max: Duration,
    /// CIDRs webhooks may reach despite the SSRF guard; a comma-separated list in the
    /// environment. Unset, webhooks use `net.allow_cidrs`; set (even to an empty list), it
    /// replaces `net.allow_cidrs` for webhooks.
    #[serde(default, deserialize_with = "optional_list_or_comma_separated", skip_serializing_if = "Option::is_none")]
    pub allow_cidrs: Option<Vec<String>>,
}

impl Default for NotificationConfig {
    fn default() -> Self {
        Self {
            subscribers: Vec::new(),
            secret: None,
            connect_timeout: Duration::from_secs(5),
            total_timeout: Duration::from_secs(15),
            max_attempts: 8,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            allow_cidrs: None,
        }
    }
}

impl NotificationConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (i, url) in self.subscribers.iter().enumerate() {
            let scheme = url.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
            if !matches!(scheme.as_deref(), Some("http" | "https")) {
                return Err(ConfigError::invalid(
                    format!("notification.subscribers[{i}]"),
                    format!("{url:?} is not an http(s) URL"),
                ));
            }
        }
        if self.secret.as_ref().is_some_and(|s| s.expose().is_empty()) {
            return Err(ConfigError::invalid("notification.secret", "must not be empty when set"));
        }
        for (key, value) in [
            ("notification.connect_timeout", self.connect_timeout),
            ("notification.total_timeout", self.total_timeout),
            ("notification.retry_min", self.retry_min),
        ] {
            if value.is_zero() {
                return Err(ConfigError::invalid(key, "must be longer than 0s"));
            }
        }
        if self.connect_timeout > self.total_timeout {
            return Err(ConfigError::invalid(
                "notification.connect_timeout",
                "must not be longer than notification.total_timeout",
            ));
        }
        if self.retry_min > self.retry_max {
            return Err(ConfigError::invalid(
                "notification.retry_min",
                "must not be longer than notification.retry_max",
            ));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::invalid("notification.max_attempts", "must be at least 1"));
        }
        Ok(())
    }
}
