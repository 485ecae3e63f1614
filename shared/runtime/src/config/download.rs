//! The `download` section: limits of the download worker's HTTP client, and its politeness
//! towards each source host (`download.per_host`).

use std::time::Duration;

use imagepipe_net::Limits;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, optional_list_or_comma_separated_of, positive};

/// The `download` section: limits of the download worker's HTTP client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DownloadConfig {
    /// Largest image accepted, in bytes; a body passing it is cut off while it streams.
    pub max_bytes: u64,
    /// Longest time to resolve and connect to one server.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub connect_timeout: Duration,
    /// Longest wait for the next byte: for the response head (connecting included), then for
    /// each piece of the body. A server that accepts the connection and never answers fails
    /// with `timeout` (retried) after this long.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub read_timeout: Duration,
    /// Longest time for a whole download, redirects and body included. It bounds how long a
    /// server that drips its body (too slowly to finish, too fast for `read_timeout`) holds a
    /// task: at most `coordinator.max_attempts` times this, plus the retry backoff. The default
    /// keeps that under two minutes (it is the HTTP client's own, [`Limits::default`]).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub total_timeout: Duration,
    /// Most redirects followed, each one checked by the SSRF guard like the first request.
    pub max_redirects: u32,
    /// The `User-Agent` header of downloads.
    #[schemars(extend("x-default" = "`\"imagepipe-download-worker/<version>\"`"))]
    pub user_agent: String,
    /// CIDRs downloads may reach despite the SSRF guard; a comma-separated list in the
    /// environment. Unset, downloads use `net.allow_cidrs`; set (even to an empty list), it
    /// replaces `net.allow_cidrs` for downloads.
    #[serde(
        default,
        deserialize_with = "optional_list_or_comma_separated_of",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_cidrs: Option<Vec<String>>,
    /// Politeness towards each source host, shared by every download replica
    /// (`download.per_host.*`).
    pub per_host: PerHostConfig,
}

impl DownloadConfig {
    /// Most redirects `max_redirects` may allow.
    pub const MAX_REDIRECTS_LIMIT: u32 = 20;

    /// How much longer than `total_timeout` a host slot lives by default: a worker killed
    /// mid-download leaves its slot held this much past the longest download it could have run.
    pub const LEASE_MARGIN: Duration = Duration::from_secs(10);

    /// How long a held host slot lives when its worker dies without releasing it:
    /// `per_host.lease`, or else `total_timeout` + [`LEASE_MARGIN`](Self::LEASE_MARGIN).
    pub fn per_host_lease(&self) -> Duration {
        self.per_host.lease.unwrap_or(self.total_timeout + Self::LEASE_MARGIN)
    }
}

/// The `download.per_host` section: how hard the download workers, all replicas together, may
/// press one source host (the URL's host and port). Uploaded blobs are not limited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct PerHostConfig {
    /// Most downloads from one host at once, across every replica (halved for each step a host
    /// answering 429 or 503 has been slowed down, never below 1).
    pub concurrency: u32,
    /// Most requests per second started to one host, across every replica; `0` (the default)
    /// is no rate limit. A fraction is allowed (`0.5`: one request every two seconds). Halved
    /// like `concurrency` while a host is slowed down. At most 1000.
    pub rate: f64,
    /// How long a download may wait in place for its host's slot; past it the task is handed
    /// back to the coordinator (deferred, no attempt charged) and sent again later. `0s`
    /// defers at once.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub max_wait: Duration,
    /// Longest time a host is paused after a 429 or 503: the cap on its `Retry-After` and on
    /// the doubling backoff used without one.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub throttle_max: Duration,
    /// How long a held slot lives if its worker dies without releasing it; unset:
    /// `download.total_timeout` + 10 s. Never shorter than `download.total_timeout`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "duration"))]
    pub lease: Option<Duration>,
}

impl PerHostConfig {
    /// Highest `rate` accepted, in requests per second.
    pub const MAX_RATE: f64 = 1_000.0;

    /// Whether a rate limit is set (`rate > 0`).
    pub fn rate_limited(&self) -> bool {
        self.rate > 0.0
    }
}

impl Default for PerHostConfig {
    fn default() -> Self {
        Self {
            concurrency: 4,
            rate: 0.0,
            max_wait: Duration::from_secs(2),
            throttle_max: Duration::from_secs(60),
            lease: None,
        }
    }
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
            per_host: PerHostConfig::default(),
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
        self.validate_per_host()
    }

    fn validate_per_host(&self) -> Result<(), ConfigError> {
        let per_host = &self.per_host;
        if per_host.concurrency == 0 {
            return Err(ConfigError::invalid("download.per_host.concurrency", "must be at least 1"));
        }
        let max_rate = PerHostConfig::MAX_RATE;
        if !(per_host.rate.is_finite() && (0.0..=max_rate).contains(&per_host.rate)) {
            return Err(ConfigError::invalid(
                "download.per_host.rate",
                format!("must be between 0 (no limit) and {max_rate} requests per second"),
            ));
        }
        positive("download.per_host.throttle_max", per_host.throttle_max)?;
        if let Some(lease) = per_host.lease
            && lease < self.total_timeout
        {
            return Err(ConfigError::invalid(
                "download.per_host.lease",
                "must not be shorter than download.total_timeout (a slot would free while its download runs)",
            ));
        }
        Ok(())
    }
}
