//! [`Settings::validate`]: every section's checks of values that parse but no service can use,
//! and the small checks they share.

use std::path::Path;
use std::time::Duration;

use super::{ConfigError, Outbound, Settings};
use crate::budget;

impl Settings {
    /// Checks every section; the first problem found is returned, naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.bus.validate().map_err(|message| match message.split_once(": ") {
            Some((key, reason)) if key.starts_with("bus.") => ConfigError::invalid(key, reason),
            _ => ConfigError::invalid("bus", message),
        })?;
        self.store.validate()?;
        self.blob
            .validate()
            .map_err(|imagepipe_blob::BlobConfigError::Invalid { key, reason }| ConfigError::invalid(key, reason))?;
        self.net.allowed_networks()?;
        for client in [Outbound::Download, Outbound::Notification] {
            self.allowed_networks(client)?;
        }
        self.download.validate()?;
        self.http.validate()?;
        self.ai.validate()?;
        self.log.validate()?;
        self.worker.validate()?;
        self.coordinator.validate()?;
        self.metadata.validate()?;
        self.telemetry.validate()?;
        self.notification.validate()?;
        self.dedup.validate()?;
        self.dlq.validate()?;
        self.pipeline.validate()?;
        self.similarity.validate()
    }
}

/// `key` names a path, which must not be empty.
pub(super) fn non_empty_path(key: &str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(ConfigError::invalid(key, "must not be empty"));
    }
    Ok(())
}

/// `key` names a memory budget in bytes, which must be at least [`budget::MIN_CAPACITY`].
pub(super) fn memory_budget(key: &str, bytes: u64) -> Result<(), ConfigError> {
    if bytes < budget::MIN_CAPACITY {
        let reason = format!("must be at least {} bytes (16 MiB)", budget::MIN_CAPACITY);
        return Err(ConfigError::invalid(key, reason));
    }
    Ok(())
}

/// `key` names a duration, which must be longer than zero.
pub(super) fn positive(key: &str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::invalid(key, "must be longer than 0s"));
    }
    Ok(())
}
