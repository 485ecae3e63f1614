//! The `download` section: limits of the download worker's HTTP client.

use std::time::Duration;

use imagepipe_net::Limits;
use serde::{Deserialize, Serialize};

use super::{ConfigError, optional_list_or_comma_separated, positive};

/// The `download` section: limits of the download worker's HTTP client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DownloadConfig {
    /// Largest image accepted, in bytes; a body passing it is cut off while it streams.
    pub max_bytes: u64,
    /// Longest time to resolve and connect to one server.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest wait for the next byte: for the response head (connecting included), then for
    /// each piece of the body. A server that accepts the connection and never answers fails
    /// with `timeout` (retried) after this long.
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
    /// Longest time for a whole download, redirects and body included. It bounds how long a
    /// server that drips its body (too slowly to finish, too fast for `read_timeout`) holds a
    /// task: at most `coordinator.max_attempts` times this, plus the retry backoff. The default
    /// keeps that under two minutes (see [`Limits::default`]).
    #[serde(with = "humantime_serde")]
    pub total_timeout: Duration,
    /// Most redirects followed, each one checked by the SSRF guard like the first request.
    pub max_redirects: u32,
    /// The `User-Agent` header of downloads.
    pub user_agent: String,
    /// CIDRs downloads may reach despite the SSRF guard; a comma-separated list in the
    /// environment. Unset, downloads use `net.allow_cidrs`; set (even to an empty list), it
    /// replaces `net.allow_cidrs` for downloads.
    #[serde(default, deserialize_with = "optional_list_or_comma_separated", skip_serializing_if = "Option::is_none")]
    pub allow_cidrs: Option<Vec<String>>,
}

impl DownloadConfig {
    /// Most redirects `max_redirects` may allow.
    pub const MAX_REDIRECTS_LIMIT: u32 = 20;
}

impl Default for DownloadConfig {
    /// The HTTP client's own [`Limits::default`], so the two never disagree.
    fn default() -> Self {
        let Limits { max_bytes, connect_timeout, read_timeout, total_timeout, max_redirects } = Limits::default();
        Self {
            max_bytes,
            connect_timeout,
            read_timeout,
            total_timeout,
            max_redirects,
            user_agent: concat!("imagepipe-download-worker/", env!("CARGO_PKG_VERSION")).into(),
            allow_cidrs: None,
        }
    }
}

impl DownloadConfig {
    /// The client limits these settings describe.
    pub fn limits(&self) -> Limits {
        Limits {
            max_bytes: self.max_bytes,
            connect_timeout: self.connect_timeout,
            read_timeout: self.read_timeout,
            total_timeout: self.total_timeout,
            max_redirects: self.max_redirects,
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_bytes == 0 {
            return Err(ConfigError::invalid("download.max_bytes", "must be at least 1"));
        }
        positive("download.connect_timeout", self.connect_timeout)?;
        positive("download.read_timeout", self.read_timeout)?;
        positive("download.total_timeout", self.total_timeout)?;
        for (key, timeout) in
            [("download.connect_timeout", self.connect_timeout), ("download.read_timeout", self.read_timeout)]
        {
            if timeout > self.total_timeout {
                return Err(ConfigError::invalid(key, "must not be longer than download.total_timeout"));
            }
        }
        let limit = Self::MAX_REDIRECTS_LIMIT;
        if self.max_redirects > limit {
            return Err(ConfigError::invalid("download.max_redirects", format!("must be at most {limit}")));
        }
        let agent = &self.user_agent;
        if agent.trim().is_empty() || !agent.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
            return Err(ConfigError::invalid("download.user_agent", "must be non-empty printable ASCII"));
        }
        Ok(())
    }
}
