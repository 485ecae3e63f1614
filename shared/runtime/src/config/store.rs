//! The `store` section: where state lives, and what `store.kind` means for each service.
//!
//! | service | `store.kind = embedded` | `store.kind = redis` |
//! |---|---|---|
//! | coordinator (tasks, history, outbox, timers, dead letters) | `store.path/coordinator.redb` | Redis at `store.redis.url`, keys under `<bus.prefix>:` |
//! | analytics (counters, latencies, stage times) | `store.path/analytics.redb` | Redis, keys under `<bus.prefix>:analytics:` |
//! | tag index (tag → tasks, thumbnails) | `store.path/tag-indexer.redb` | Redis, keys under `<bus.prefix>:{<bus.prefix>:tags}:` (one cluster slot) |
//! | similarity index (embeddings, hashes, near pairs, change log) | `store.path/similarity-indexer.redb` | Redis, keys under `<bus.prefix>:{<bus.prefix>:similarity}:` (one cluster slot) |
//! | subscriber dedup (handled `eventId`s) | the group's file, `store.path/<group>.redb`, bounded by `dedup.capacity` | Redis, keys under `<bus.prefix>:dedup:<group>:` |
//! | download politeness (per-host slots, rate, throttles) | process memory (one download worker per process: `imagepipe run`) | Redis, keys under `<bus.prefix>:polite:{<host>}:`, shared by every download replica |
//!
//! Every embedded file is a redb database kept across restarts (see
//! [`crate::embedded`]); a file is opened by one process at a time. So `embedded` is for one
//! process (`imagepipe run`, or one replica of a service with a `store.path` of its own); every
//! multi-process deployment uses `redis`, which every replica of every service shares.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, SecretUrl, mask_url_credentials};

/// URL schemes the Redis client understands.
const REDIS_SCHEMES: [&str; 6] = ["redis", "rediss", "redis+unix", "unix", "redis+cluster", "rediss+cluster"];

/// Where every service keeps its state (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StoreKind {
    /// redb files in `store.path`, kept across restarts, for one process (`imagepipe run`):
    /// `coordinator.redb` (tasks), `analytics.redb` (counters and latencies), `tag-indexer.redb`
    /// (the tag index), `similarity-indexer.redb` (the similarity index) and one `<group>.redb`
    /// per subscriber group (its handled `eventId`s); the download worker's per-host limits live
    /// in process memory.
    #[default]
    Embedded,
    /// Redis at `store.redis.url`, shared by every replica of every service.
    Redis,
}

/// The `store` section: where every service keeps its state (the coordinator's tasks, the
/// indexes, the subscribers' handled event ids, the download worker's per-host limits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Backend.
    pub kind: StoreKind,
    /// Directory of the embedded store's files; one process uses it at a time.
    pub path: PathBuf,
    /// Redis settings.
    pub redis: RedisConfig,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { kind: StoreKind::default(), path: PathBuf::from(".imagepipe/store"), redis: RedisConfig::default() }
    }
}

/// The `store.redis` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]` (or `rediss://` for TLS) for one server;
    /// `redis+cluster://[user:password@]host:port[,host:port...]` (or `rediss+cluster://`) for a
    /// Redis Cluster, through the seed nodes listed (the client finds the others). The password
    /// is masked whenever printed.
    #[schemars(with = "String")]
    pub url: SecretUrl,
    /// Replicas that must hold the coordinator's transitions before it relays their messages
    /// and acknowledges their inputs: after each batch of transitions it sends `WAIT` to every
    /// primary written (up to 400 ms), and a batch fewer replicas acknowledged is a store error
    /// (its inputs are retried). 0 does not wait; 1 is recommended in production, so that a
    /// transition anyone saw survives the loss of its primary (each batch then waits for a
    /// replica's round trip).
    pub min_replicas: u32,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self { url: SecretUrl::new("redis://127.0.0.1:6379"), min_replicas: 0 }
    }
}

impl StoreConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        match self.kind {
            StoreKind::Embedded => super::non_empty_path("store.path", &self.path),
            StoreKind::Redis => redis_url("store.redis.url", self.redis.url.expose()),
        }
    }
}

fn redis_url(key: &str, url: &str) -> Result<(), ConfigError> {
    let masked = mask_url_credentials(url);
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
