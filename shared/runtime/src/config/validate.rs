//! Checks of values that parse but no service can use.

use std::path::Path;
use std::time::Duration;

use super::{ConfigError, Settings, StoreKind};

/// URL schemes the Redis client understands.
const REDIS_SCHEMES: [&str; 4] = ["redis", "rediss", "redis+unix", "unix"];

impl Settings {
    /// Checks every section; the first problem found is returned, naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.bus.validate().map_err(|message| match message.split_once(": ") {
            Some((key, reason)) if key.starts_with("bus.") => ConfigError::invalid(key, reason),
            _ => ConfigError::invalid("bus", message),
        })?;

        match self.store.kind {
            StoreKind::Embedded => non_empty_path("store.path", &self.store.path)?,
            StoreKind::Redis => redis_url("store.redis.url", self.store.redis.url.expose())?,
        }
        self.blob
            .validate()
            .map_err(|imagepipe_blob::BlobConfigError::Invalid { key, reason }| ConfigError::invalid(key, reason))?;
        self.net.allowed_networks()?;
        download(&self.download)?;

        if self.http.port == 0 {
            return Err(ConfigError::invalid("http.port", "must be 1-65535 (a server needs a fixed port)"));
        }
        if let Some(token) = &self.http.auth_token {
            let token = token.expose();
            if token.is_empty() || token.chars().any(char::is_whitespace) {
                return Err(ConfigError::invalid("http.auth_token", "must be non-empty without whitespace"));
            }
        }

        non_empty_path("ai.model_dir", &self.ai.model_dir)?;
        if !(1..=1000).contains(&self.ai.top_k) {
            return Err(ConfigError::invalid("ai.top_k", "must be 1-1000 (the model has 1000 classes)"));
        }
        if self.ai.threads == 0 {
            return Err(ConfigError::invalid("ai.threads", "must be at least 1"));
        }
        if !(0.0..=1.0).contains(&self.ai.tag_min_score) {
            return Err(ConfigError::invalid("ai.tag_min_score", "must be 0-1"));
        }
        if self.ai.max_pixels == 0 {
            return Err(ConfigError::invalid("ai.max_pixels", "must be at least 1"));
        }

        tracing_subscriber::EnvFilter::try_new(&self.log.filter).map_err(|e| {
            ConfigError::invalid("log.filter", format!("{:?} is not a tracing filter ({e})", self.log.filter))
        })?;

        let worker = &self.worker;
        if worker.concurrency == 0 {
            return Err(ConfigError::invalid("worker.concurrency", "must be at least 1"));
        }
        if worker.max_deliveries == 0 {
            return Err(ConfigError::invalid("worker.max_deliveries", "must be at least 1"));
        }
        positive("worker.ack_wait", worker.ack_wait)?;
        positive("worker.handler_timeout", worker.handler_timeout)?;

        let coordinator = &self.coordinator;
        if coordinator.max_in_flight == 0 {
            return Err(ConfigError::invalid("coordinator.max_in_flight", "must be at least 1"));
        }
        if coordinator.max_attempts == 0 {
            return Err(ConfigError::invalid("coordinator.max_attempts", "must be at least 1"));
        }
        positive("coordinator.step_deadline", coordinator.step_deadline)?;
        for (key, deadline) in [
            ("coordinator.download_deadline", coordinator.download_deadline),
            ("coordinator.metadata_deadline", coordinator.metadata_deadline),
            ("coordinator.analyze_deadline", coordinator.analyze_deadline),
        ] {
            deadline.map_or(Ok(()), |d| positive(key, d))?;
        }
        positive("coordinator.sweep_interval", coordinator.sweep_interval)?;

        let metadata = &self.metadata;
        for (key, value) in [
            ("metadata.max_pixels", metadata.max_pixels),
            ("metadata.max_width", metadata.max_width.into()),
            ("metadata.max_height", metadata.max_height.into()),
            ("metadata.max_alloc_bytes", metadata.max_alloc_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(key, "must be at least 1"));
            }
        }
        if !(16..=4096).contains(&metadata.thumbnail_size) {
            return Err(ConfigError::invalid("metadata.thumbnail_size", "must be 16-4096 pixels"));
        }
        if !(1..=100).contains(&metadata.thumbnail_quality) {
            return Err(ConfigError::invalid("metadata.thumbnail_quality", "must be 1-100"));
        }

        if self.telemetry.service_name.as_deref().is_some_and(|name| name.trim().is_empty()) {
            return Err(ConfigError::invalid("telemetry.service_name", "must not be empty when set"));
        }
        self.notification.validate()?;
        self.dedup.validate()?;
        Ok(())
    }
}

fn download(download: &super::DownloadSettings) -> Result<(), ConfigError> {
    if download.max_bytes == 0 {
        return Err(ConfigError::invalid("download.max_bytes", "must be at least 1"));
    }
    positive("download.connect_timeout", download.connect_timeout)?;
    positive("download.total_timeout", download.total_timeout)?;
    if download.connect_timeout > download.total_timeout {
        return Err(ConfigError::invalid("download.connect_timeout", "must not be longer than download.total_timeout"));
    }
    let limit = super::DownloadSettings::MAX_REDIRECTS_LIMIT;
    if download.max_redirects > limit {
        return Err(ConfigError::invalid("download.max_redirects", format!("must be at most {limit}")));
    }
    let agent = &download.user_agent;
    if agent.trim().is_empty() || !agent.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
        return Err(ConfigError::invalid("download.user_agent", "must be non-empty printable ASCII"));
    }
    Ok(())
}

fn non_empty_path(key: &str, path: &Path) -> Result<(), ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(ConfigError::invalid(key, "must not be empty"));
    }
    Ok(())
}

fn positive(key: &str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::invalid(key, "must be longer than 0s"));
    }
    Ok(())
}

fn redis_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let masked = super::mask_url_credentials(url);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(ConfigError::invalid(key, format!("{masked:?} is not a URL such as redis://127.0.0.1:6379")));
    };
    if !REDIS_SCHEMES.contains(&scheme) {
        return Err(ConfigError::invalid(key, format!("scheme {scheme:?} is not one of {}", REDIS_SCHEMES.join(", "))));
    }
    if rest.is_empty() {
        return Err(ConfigError::invalid(key, format!("{masked:?} names no host or socket")));
    }
    Ok(())
}
