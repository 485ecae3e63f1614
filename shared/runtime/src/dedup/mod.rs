//! Remembering which events a subscriber has handled, so a redelivered event (same `eventId`)
//! has its effect once: check [`Dedup::is_done`] before the effect, [`Dedup::mark_done`] after
//! it. A crash in between repeats the effect on redelivery (at-least-once), never loses it.
//! [`Deduplicated`] is that protocol as a layer around a subscriber's [`EventHandler`], and
//! [`run_subscriber`] the one way a subscriber runs inside it.
//!
//! Backends: [`RedisDedup`] (`SET NX` with a TTL, shared by every replica of a subscriber
//! group) for `store.kind = redis`; [`EmbeddedDedup`] (the group's redb file under
//! `store.path`, kept across restarts, bounded by a TTL and a capacity) for
//! `store.kind = embedded`; and [`MemoryDedup`] (the same bounds in process memory, gone with the
//! process) for tests and handlers run in process. [`connect`] picks one from [`Settings`].

mod embedded;
mod layer;
mod serve;
pub mod slot;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backoff::ExponentialBackoff;
use crate::clock::SystemClock;
use crate::config::{Settings, StoreKind};
use crate::connect::{Unconnected, redis_unreachable, with_retry};
use crate::embedded::{EmbeddedDb, EmbeddedError};
use crate::redis_connection::RedisConnection;
use crate::shutdown::Shutdown;

pub use embedded::EmbeddedDedup;
pub use layer::{Deduplicated, EventHandler, Seen};
pub use serve::{Subscriber, SubscriberRunError, run_subscriber};

/// The dedup store could not be reached or answered nonsense.
#[derive(Debug, thiserror::Error)]
pub enum DedupError {
    /// Connecting to Redis failed.
    #[error("connecting to Redis for deduplication")]
    Connect(#[source] redis::RedisError),
    /// A Redis command failed.
    #[error("Redis {command} on {key:?}")]
    Redis {
        /// The command.
        command: &'static str,
        /// The key it was about.
        key: String,
        /// What Redis said.
        #[source]
        source: redis::RedisError,
    },
    /// The embedded dedup file failed.
    #[error("embedded dedup store")]
    Embedded(#[source] EmbeddedError),
}

/// Handled keys (event ids, or event id + target) of one subscriber group.
#[async_trait]
pub trait Dedup: Send + Sync + 'static {
    /// Whether `key` was marked done and is still remembered.
    async fn is_done(&self, key: &str) -> Result<bool, DedupError>;

    /// Marks `key` done; `false` when it already was.
    async fn mark_done(&self, key: &str) -> Result<bool, DedupError>;
}

/// The dedup store `settings` call for, namespaced by subscriber `group`: Redis keys
/// `<bus.prefix>:dedup:<group>:{<tag>}:<key>` ([`redis_prefix`]) when `store.kind = redis`, the
/// group's embedded file ([`open_embedded`]) otherwise. A key marked under an earlier layout
/// ([`legacy_redis_prefixes`]) counts as done until it expires.
pub async fn connect(settings: &Settings, group: &str) -> Result<Box<dyn Dedup>, DedupError> {
    match settings.store.kind {
        StoreKind::Redis => {
            let connection =
                RedisConnection::open(settings.store.redis.url.expose()).await.map_err(DedupError::Connect)?;
            let prefix = redis_prefix(&settings.bus.prefix, group);
            let legacy = legacy_redis_prefixes(&settings.bus.prefix, group, connection.is_cluster());
            Ok(Box::new(RedisDedup::new(connection, prefix, settings.dedup.ttl).with_legacy_prefixes(legacy)))
        }
        StoreKind::Embedded => Ok(Box::new(open_embedded(settings, group).await?)),
    }
}

/// Subscriber `group`'s handled keys in its file under `store.path`
/// ([`crate::embedded::group_file`]), bounded by `dedup.ttl` and `dedup.capacity`. A store of
/// the group in the same file marks its events there too ([`EmbeddedDedup::mark_in`]).
pub async fn open_embedded(settings: &Settings, group: &str) -> Result<EmbeddedDedup, DedupError> {
    let db = EmbeddedDb::open_group(&settings.store.path, group).map_err(DedupError::Embedded)?;
    EmbeddedDedup::open(db, settings.dedup.ttl, settings.dedup.capacity, Arc::new(SystemClock)).await
}

/// [`connect`], retrying while Redis is unreachable (with the bus's backoff and a log line per
/// attempt, see [`crate::connect`]) instead of failing: a subscriber started before Redis
/// waits for it, and opens no consumer meanwhile, so `/readyz` stays false. `Ok(None)` when
/// `shutdown` fired first.
pub async fn connect_with_retry(
    settings: &Settings,
    group: &str,
    shutdown: &Shutdown,
) -> Result<Option<Box<dyn Dedup>>, DedupError> {
    let unreachable = |error: &DedupError| matches!(error, DedupError::Connect(source) if redis_unreachable(source));
    let what = format!("the dedup store of {group}");
    match with_retry(&what, ExponentialBackoff::broker_reconnect(), shutdown, unreachable, || connect(settings, group))
        .await
    {
        Ok(dedup) => Ok(Some(dedup)),
        Err(Unconnected::Interrupted) => Ok(None),
        Err(Unconnected::Failed(error)) => Err(error),
    }
}

/// The prefix of subscriber `group`'s dedup keys in Redis: `<bus_prefix>:dedup:<group>:{<tag>}`,
/// where `<tag>` is the shortest hash tag of the slot of the group's hash tag
/// ([`redis_group_tag`], [`slot::tag_of_slot`]); a key is this, `:`, and the event id. A store
/// that marks an event done inside its own atomic write (so a retry after a lost reply cannot
/// apply it twice) writes the same key, and keeps the keys that write touches under the group's
/// hash tag, so that on a Redis Cluster they share the slot. The short tag keeps the bus prefix
/// out of the tag (it was there twice in every key, [`legacy_redis_prefixes`]); the group's name
/// before it keeps the keys of groups whose tags are the same apart.
pub fn redis_prefix(bus_prefix: &str, group: &str) -> String {
    let tag = slot::tag_of_slot(slot::hash_slot(redis_group_tag(bus_prefix, group).as_bytes()));
    format!("{bus_prefix}:dedup:{group}:{{{tag}}}")
}

/// The Redis Cluster hash tag of subscriber `group`: `{<bus_prefix>:<group>}`. Its dedup keys
/// carry it, and so do the keys of a store that marks events done in its own writes.
pub fn redis_group_tag(bus_prefix: &str, group: &str) -> String {
    format!("{{{bus_prefix}:{group}}}")
}

/// The prefix of the dedup keys written before they carried a hash tag:
/// `<bus_prefix>:dedup:<group>`. On a single Redis server a key is done when it is marked under
/// either prefix, so the marks made before an upgrade count until they expire (`dedup.ttl`); a
/// cluster never had such keys.
pub fn legacy_redis_prefix(bus_prefix: &str, group: &str) -> String {
    format!("{bus_prefix}:dedup:{group}")
}

/// The prefix of the dedup keys written with the group's whole hash tag, before
/// [`redis_prefix`] shortened it: `<bus_prefix>:dedup:{<bus_prefix>:<group>}`. Its keys are in the
/// slot of [`redis_prefix`]'s, so they are looked up with them on a cluster too.
pub fn tagged_redis_prefix(bus_prefix: &str, group: &str) -> String {
    format!("{bus_prefix}:dedup:{}", redis_group_tag(bus_prefix, group))
}

/// The prefixes under which earlier versions marked subscriber `group`'s keys, each looked up
/// until its marks expire: [`tagged_redis_prefix`]'s, and on a single server also
/// [`legacy_redis_prefix`]'s (a cluster never had those, and they are in other slots).
pub fn legacy_redis_prefixes(bus_prefix: &str, group: &str, cluster: bool) -> Vec<String> {
    let mut prefixes = vec![tagged_redis_prefix(bus_prefix, group)];
    if !cluster {
        prefixes.push(legacy_redis_prefix(bus_prefix, group));
    }
    prefixes
}

/// Keys in Redis, `<prefix>:<key>`, each set with `SET NX PX <ttl>`.
#[derive(Clone)]
pub struct RedisDedup {
    connection: RedisConnection,
    prefix: String,
    legacy_prefixes: Vec<String>,
    ttl: Duration,
}

impl RedisDedup {
    /// Keys under `prefix`, each forgotten `ttl` after it was marked.
    pub fn new(connection: RedisConnection, prefix: impl Into<String>, ttl: Duration) -> Self {
        Self { connection, prefix: prefix.into(), legacy_prefixes: Vec::new(), ttl }
    }

    /// The same, also taking a key marked under any of `legacy` ([`legacy_redis_prefixes`])
    /// as done. On a cluster, only prefixes whose keys share the slot of the key under `prefix`
    /// (one `EXISTS` looks them up together).
    #[must_use]
    pub fn with_legacy_prefixes(self, legacy: Vec<String>) -> Self {
        Self { legacy_prefixes: legacy, ..self }
    }

    fn key(&self, key: &str) -> String {
        format!("{}:{key}", self.prefix)
    }
}

#[async_trait]
impl Dedup for RedisDedup {
    async fn is_done(&self, key: &str) -> Result<bool, DedupError> {
        let legacy: Vec<String> = self.legacy_prefixes.iter().map(|prefix| format!("{prefix}:{key}")).collect();
        let key = self.key(key);
        let exists: u64 = redis::cmd("EXISTS")
            .arg(&key)
            .arg(legacy)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|source| DedupError::Redis { command: "EXISTS", key, source })?;
        Ok(exists > 0)
    }

    async fn mark_done(&self, key: &str) -> Result<bool, DedupError> {
        let key = self.key(key);
        let ttl_ms = crate::clock::millis(self.ttl).max(1);
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|source| DedupError::Redis { command: "SET", key, source })?;
        Ok(set.is_some())
    }
}

/// Keys in process memory: at most `capacity` (the oldest marked are forgotten first), each
/// forgotten `ttl` after it was marked; gone with the process (tests, handlers run in process).
#[derive(Debug)]
pub struct MemoryDedup {
    ttl: Duration,
    capacity: usize,
    inner: Mutex<Marked>,
}

#[derive(Debug, Default)]
struct Marked {
    at: HashMap<String, Instant>,
    order: VecDeque<(String, Instant)>,
}

impl Marked {
    /// Drops expired entries and, beyond `capacity`, the oldest.
    fn evict(&mut self, now: Instant, ttl: Duration, capacity: usize) {
        while let Some((key, marked)) = self.order.front() {
            if self.order.len() <= capacity && now.duration_since(*marked) < ttl {
                break;
            }
            if self.at.get(key) == Some(marked) {
                self.at.remove(key);
            }
            self.order.pop_front();
        }
    }
}

impl MemoryDedup {
    /// An empty set.
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self { ttl, capacity: capacity.max(1), inner: Mutex::default() }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Marked, Instant) -> T) -> T {
        let mut marked = self.inner.lock().expect("dedup lock");
        let now = Instant::now();
        marked.evict(now, self.ttl, self.capacity);
        f(&mut marked, now)
    }
}

#[async_trait]
impl Dedup for MemoryDedup {
    async fn is_done(&self, key: &str) -> Result<bool, DedupError> {
        Ok(self.with(|marked, _| marked.at.contains_key(key)))
    }

    async fn mark_done(&self, key: &str) -> Result<bool, DedupError> {
        let (capacity, ttl) = (self.capacity, self.ttl);
        Ok(self.with(|marked, now| {
            if marked.at.contains_key(key) {
                return false;
            }
            marked.at.insert(key.to_owned(), now);
            marked.order.push_back((key.to_owned(), now));
            marked.evict(now, ttl, capacity);
            true
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;
    use crate::clock::ManualClock;

    /// Marks once, remembers for the TTL (60 s) and forgets after it; `advance` moves the
    /// backend's clock.
    async fn forgets_after_the_ttl<F: Future<Output = ()>>(dedup: &dyn Dedup, advance: impl Fn(Duration) -> F) {
        assert!(!dedup.is_done("a").await.unwrap());
        assert!(dedup.mark_done("a").await.unwrap());
        assert!(!dedup.mark_done("a").await.unwrap());
        assert!(dedup.is_done("a").await.unwrap());
        advance(Duration::from_secs(59)).await;
        assert!(dedup.is_done("a").await.unwrap());
        advance(Duration::from_secs(1)).await;
        assert!(!dedup.is_done("a").await.unwrap());
        assert!(dedup.mark_done("a").await.unwrap());
    }

    /// With a capacity of 2, the oldest marked key goes first.
    async fn forgets_the_oldest_beyond_capacity(dedup: &dyn Dedup) {
        for key in ["c", "b", "a"] {
            assert!(dedup.mark_done(key).await.unwrap());
        }
        assert!(!dedup.is_done("c").await.unwrap());
        assert!(dedup.is_done("b").await.unwrap());
        assert!(dedup.is_done("a").await.unwrap());
    }

    #[tokio::test(start_paused = true)]
    async fn memory_marks_once_and_forgets_after_the_ttl() {
        forgets_after_the_ttl(&MemoryDedup::new(Duration::from_secs(60), 10), tokio::time::advance).await;
    }

    #[tokio::test(start_paused = true)]
    async fn memory_forgets_the_oldest_beyond_capacity() {
        forgets_the_oldest_beyond_capacity(&MemoryDedup::new(Duration::from_secs(60), 2)).await;
    }

    async fn embedded(dir: &std::path::Path, capacity: usize, clock: &ManualClock) -> EmbeddedDedup {
        let db = EmbeddedDb::open(&dir.join("group.redb")).unwrap();
        EmbeddedDedup::open(db, Duration::from_secs(60), capacity, Arc::new(clock.clone())).await.unwrap()
    }

    #[tokio::test]
    async fn embedded_marks_once_and_forgets_after_the_ttl() {
        let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::at_unix_ms(1_763_800_000_000));
        let dedup = embedded(dir.path(), 10, &clock).await;
        forgets_after_the_ttl(&dedup, |by| {
            clock.advance(by);
            std::future::ready(())
        })
        .await;
    }

    #[tokio::test]
    async fn embedded_forgets_the_oldest_beyond_capacity() {
        let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::at_unix_ms(1_763_800_000_000));
        forgets_the_oldest_beyond_capacity(&embedded(dir.path(), 2, &clock).await).await;
    }

    #[tokio::test]
    async fn embedded_keys_survive_a_restart_with_their_age() {
        let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::at_unix_ms(1_763_800_000_000));
        assert!(embedded(dir.path(), 10, &clock).await.mark_done("evt").await.unwrap());
        clock.advance(Duration::from_secs(30));
        let reopened = embedded(dir.path(), 10, &clock).await;
        assert!(reopened.is_done("evt").await.unwrap(), "remembered by the file");
        assert!(!reopened.mark_done("evt").await.unwrap());
        clock.advance(Duration::from_secs(30));
        assert!(!reopened.is_done("evt").await.unwrap(), "forgotten 60 s after it was marked, not reopened");
    }

    #[tokio::test]
    async fn embedded_dedup_is_the_groups_file_under_store_path() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = Settings::default();
        settings.store.path = dir.path().join("store");
        let dedup = connect(&settings, "archive").await.unwrap();
        assert!(dedup.mark_done("evt").await.unwrap());
        drop(dedup);
        assert!(settings.store.path.join("archive.redb").is_file());
        assert!(connect(&settings, "archive").await.unwrap().is_done("evt").await.unwrap());
        let refused = connect(&settings, "../elsewhere").await.err().expect("not a file name");
        assert!(crate::error_chain(&refused).contains("cannot name a store file"), "{refused}");
    }

    #[tokio::test]
    async fn redis_marks_once_with_a_ttl() {
        for (name, url) in imagepipe_contracts::testing::redis_urls() {
            let mut connection = RedisConnection::open(&url).await.unwrap_or_else(|e| panic!("Redis at {url}: {e}"));
            let prefix = redis_prefix(&format!("imagepipe-test-{}", uuid_like()), "group");
            let dedup = RedisDedup::new(connection.clone(), prefix.clone(), Duration::from_secs(30));
            assert!(!dedup.is_done("evt").await.unwrap(), "{name}");
            assert!(dedup.mark_done("evt").await.unwrap(), "{name}");
            assert!(!dedup.mark_done("evt").await.unwrap(), "{name}");
            assert!(dedup.is_done("evt").await.unwrap(), "{name}");
            let ttl: i64 = redis::cmd("PTTL").arg(format!("{prefix}:evt")).query_async(&mut connection).await.unwrap();
            assert!((1..=30_000).contains(&ttl), "{name}: ttl {ttl}");
            let _: () = redis::cmd("DEL").arg(format!("{prefix}:evt")).query_async(&mut connection).await.unwrap();
        }
    }

    #[tokio::test]
    async fn redis_keys_share_the_groups_slot_and_earlier_marks_count() {
        for (name, url) in imagepipe_contracts::testing::redis_urls() {
            let mut connection = RedisConnection::open(&url).await.unwrap_or_else(|e| panic!("Redis at {url}: {e}"));
            let bus = format!("imagepipe-test-{}", uuid_like());
            let prefix = redis_prefix(&bus, "group");
            assert!(prefix.starts_with(&format!("{bus}:dedup:group:{{")), "{prefix}");
            assert!(prefix.len() <= format!("{bus}:dedup:group:{{abc}}").len(), "{prefix}");
            let group_slot = slot::hash_slot(redis_group_tag(&bus, "group").as_bytes());
            assert_eq!(slot::hash_slot(format!("{prefix}:evt").as_bytes()), group_slot);
            if connection.is_cluster() {
                let key = format!("{prefix}:evt");
                let slot: u16 =
                    redis::cmd("CLUSTER").arg("KEYSLOT").arg(&key).query_async(&mut connection).await.unwrap();
                assert_eq!(slot, group_slot, "{name}: the cluster agrees");
            }
            let legacy = legacy_redis_prefixes(&bus, "group", connection.is_cluster());
            let dedup = RedisDedup::new(connection.clone(), prefix.clone(), Duration::from_secs(30))
                .with_legacy_prefixes(legacy.clone());
            // Marked by an earlier version, under each earlier layout this deployment had.
            let mut marked = Vec::new();
            for (i, old) in legacy.iter().enumerate() {
                let key = format!("{old}:old{i}");
                let _: () = redis::cmd("SET").arg(&key).arg(1).query_async(&mut connection).await.unwrap();
                assert!(dedup.is_done(&format!("old{i}")).await.unwrap(), "{name}: {key} counts");
                marked.push(key);
            }
            assert!(!dedup.is_done("new").await.unwrap(), "{name}");
            assert!(dedup.mark_done("new").await.unwrap(), "{name}");
            assert!(dedup.is_done("new").await.unwrap(), "{name}");
            marked.push(format!("{prefix}:new"));
            for key in marked {
                let _: () = redis::cmd("DEL").arg(key).query_async(&mut connection).await.unwrap();
            }
        }
    }

    fn uuid_like() -> String {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        format!("{}-{nanos}", std::process::id())
    }
}
