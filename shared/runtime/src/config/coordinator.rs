//! The `coordinator` section: retries, deadlines and limits of the task coordinator.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use super::{ConfigError, list_or_comma_separated_of, positive};
use crate::backoff::ExponentialBackoff;

/// The `coordinator` section: retries, deadlines and limits of the task coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// Most tasks started and unfinished at once; beyond it submissions wait in their queue.
    pub max_in_flight: u64,
    /// Attempts per step before the task fails.
    pub max_attempts: u32,
    /// Delay before a step's first retry; it doubles per attempt up to `retry_max_backoff`,
    /// with full jitter (each delay drawn between zero and the doubled value).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub retry_min_backoff: Duration,
    /// Longest delay before a retry, whatever a worker reports: a server answering
    /// `Retry-After: 3600` holds its task (and its in-flight slot) this long at most.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub retry_max_backoff: Duration,
    /// How long a step may stay silent before the attempt counts as failed.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub step_deadline: Duration,
    /// The download step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "duration"))]
    pub download_deadline: Option<Duration>,
    /// The metadata step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "duration"))]
    pub metadata_deadline: Option<Duration>,
    /// The analyze step's deadline, when it differs from `step_deadline`.
    #[serde(default, with = "humantime_serde", skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "duration"))]
    pub analyze_deadline: Option<Duration>,
    /// How long after a state write the sweeper relays outbox entries the write's own relay
    /// did not (e.g. after a crash).
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub relay_grace: Duration,
    /// How often the sweeper looks for due timers and unrelayed outbox entries.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub sweep_interval: Duration,
    /// Subscriber groups whose dead letters the coordinator archives for `/v1/dlq`, besides
    /// every task queue's; a comma-separated list in the environment
    /// (`notification,analytics,tag-indexer` for the bundled ones).
    #[serde(deserialize_with = "list_or_comma_separated_of")]
    pub dlq_groups: Vec<String>,
    /// How long a finished task (completed, failed, cancelled) is kept after its last
    /// transition: then its record, history, indexes and idempotency key are deleted, and the
    /// tag index drops it too.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub retention: Duration,
    /// Most reprocessing jobs (`POST /v1/reprocess`) one coordinator runs at once; one more is
    /// refused with `429` until one ends or is cancelled.
    pub max_reprocess_jobs: usize,
    /// Base URL of the tag indexer (`http://tag-indexer-worker:8080`): the coordinator's API
    /// forwards `GET /v1/search` there. Unset, that route answers `404 not_configured` naming
    /// this key; `imagepipe run` serves the search itself.
    #[serde(default, deserialize_with = "blank_as_none", skip_serializing_if = "Option::is_none")]
    pub search_url: Option<String>,
    /// Base URL of the analytics worker: the coordinator's API forwards `GET /v1/stats` there.
    /// Unset, that route answers `404 not_configured`.
    #[serde(default, deserialize_with = "blank_as_none", skip_serializing_if = "Option::is_none")]
    pub stats_url: Option<String>,
    /// Base URL of the similarity indexer: the coordinator's API forwards
    /// `GET /v1/tasks/{id}/similar`, `POST /v1/search/similar` and `GET /v1/duplicates` there.
    /// Unset, those routes answer `404 not_configured`.
    #[serde(default, deserialize_with = "blank_as_none", skip_serializing_if = "Option::is_none")]
    pub similarity_url: Option<String>,
    /// How many shards the tasks are spread over (a task's shard is a stable hash of its id;
    /// docs/contracts.md, "Shards"). Coordinator replicas share the shards out by lease, each
    /// owning `shards / replicas` ± 1, and a replica handles only its shards' submissions,
    /// results and timers. Fixed for the life of a store: a coordinator configured with
    /// another count than the store was written with refuses to start.
    pub shards: u16,
    /// How long a replica's lease on a shard lasts unless renewed (it renews five times per
    /// lease): a replica that dies has its shards taken over by the others this long after
    /// its last renewal, plus one renewal period.
    #[serde(with = "humantime_serde")]
    #[schemars(with = "String", extend("format" = "duration"))]
    pub shard_lease: Duration,
    /// How many batch loops a coordinator runs over the shards it owns, each over a share of
    /// them (a task's inputs stay in one loop, in order); 0: one per CPU core.
    pub shard_loops: usize,
    /// The URL other replicas and operators reach this replica's API at, shown in
    /// `GET /v1/cluster` (default: `http://<hostname>:<http.port>`).
    #[serde(default, deserialize_with = "blank_as_none", skip_serializing_if = "Option::is_none")]
    pub advertise_url: Option<String>,
}

impl Default for CoordinatorConfig {
    /// The retry backoff's range is [`ExponentialBackoff::step_retries`]'s.
    fn default() -> Self {
        let backoff = ExponentialBackoff::step_retries();
        Self {
            max_in_flight: 1_000,
            max_attempts: 5,
            retry_min_backoff: backoff.min(),
            retry_max_backoff: backoff.max(),
            step_deadline: Duration::from_secs(300),
            download_deadline: None,
            metadata_deadline: None,
            analyze_deadline: None,
            relay_grace: Duration::from_secs(10),
            sweep_interval: Duration::from_secs(1),
            dlq_groups: Vec::new(),
            retention: Duration::from_secs(7 * 24 * 3600),
            max_reprocess_jobs: 4,
            search_url: None,
            stats_url: None,
            similarity_url: None,
            shards: imagepipe_contracts::shard::DEFAULT_SHARDS,
            shard_lease: Duration::from_secs(5),
            shard_loops: 0,
            advertise_url: None,
        }
    }
}

impl CoordinatorConfig {
    /// The backoff between a step's attempts: [`ExponentialBackoff::step_retries`] between
    /// `retry_min_backoff` and `retry_max_backoff`.
    pub fn retry_backoff(&self) -> Result<ExponentialBackoff, ConfigError> {
        ExponentialBackoff::step_retries()
            .with_range(self.retry_min_backoff, self.retry_max_backoff)
            .map_err(|e| ConfigError::invalid("coordinator.retry_min_backoff", e.to_string()))
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_in_flight == 0 {
            return Err(ConfigError::invalid("coordinator.max_in_flight", "must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(ConfigError::invalid("coordinator.max_attempts", "must be at least 1"));
        }
        self.retry_backoff()?;
        positive("coordinator.step_deadline", self.step_deadline)?;
        for (key, deadline) in [
            ("coordinator.download_deadline", self.download_deadline),
            ("coordinator.metadata_deadline", self.metadata_deadline),
            ("coordinator.analyze_deadline", self.analyze_deadline),
        ] {
            deadline.map_or(Ok(()), |d| positive(key, d))?;
        }
        positive("coordinator.retention", self.retention)?;
        if self.max_reprocess_jobs == 0 {
            return Err(ConfigError::invalid("coordinator.max_reprocess_jobs", "must be at least 1"));
        }
        for (key, url) in [
            ("coordinator.search_url", &self.search_url),
            ("coordinator.stats_url", &self.stats_url),
            ("coordinator.similarity_url", &self.similarity_url),
        ] {
            url.as_deref().map_or(Ok(()), |url| base_url(key, url))?;
        }
        if !(1..=imagepipe_contracts::shard::MAX_SHARDS).contains(&self.shards) {
            let max = imagepipe_contracts::shard::MAX_SHARDS;
            return Err(ConfigError::invalid("coordinator.shards", format!("must be between 1 and {max}")));
        }
        if self.shard_lease < Duration::from_millis(500) {
            return Err(ConfigError::invalid("coordinator.shard_lease", "must be at least 500ms"));
        }
        if let Some(url) = &self.advertise_url {
            base_url("coordinator.advertise_url", url)?;
        }
        positive("coordinator.sweep_interval", self.sweep_interval)
    }

    /// How many batch loops to run over owned shards: `shard_loops`, or one per core.
    pub fn shard_loops(&self) -> usize {
        match self.shard_loops {
            0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            n => n,
        }
    }
}

/// An optional string, an empty or blank one (`IMAGEPIPE_COORDINATOR__SEARCH_URL=`) as unset.
fn blank_as_none<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    let value = Option::<String>::deserialize(deserializer)?;
    Ok(value.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()))
}

/// Checks that `url` is an `http(s)` base URL with a host and no query, fragment or user info.
fn base_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let parsed = reqwest::Url::parse(url).map_err(|e| {
        ConfigError::invalid(key, format!("{url:?} is not a URL ({e}), e.g. http://tag-indexer-worker:8080"))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(ConfigError::invalid(key, format!("{url:?} is not an http(s) URL with a host")));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() || !parsed.username().is_empty() {
        return Err(ConfigError::invalid(key, format!("{url:?}: give scheme, host, port and path only")));
    }
    Ok(())
}
