//! imagepipe tag-indexer-worker: an event subscriber that indexes every analyzed image's tags
//! (tag → task ids with the tag's score) and each task's thumbnail key, and serves
//! `GET /v1/search?tags=cat,animal&mode=all|any&limit=20`.
//!
//! - [`index`]: the [`TagIndex`] seam, in Redis (`store.kind = redis`), in the embedded file
//!   `store.path/tag-indexer.redb` (`store.kind = embedded`) or in process memory.
//! - [`handler`]: the [`EventHandler`](imagepipe_runtime::dedup::EventHandler) writing the
//!   index, run inside the dedup layer.
//! - [`api`]: the search route.
//! - [`open_index`] then [`run`]: the subscriber on a connected bus; serve [`api::routes`] of
//!   the same index. While it runs, the entries of tasks older than `coordinator.retention`
//!   are dropped every [`EXPIRY_INTERVAL`] ([`expire`]).

pub mod api;
pub mod handler;
pub mod index;

use std::sync::Arc;
use std::time::Duration;

use imagepipe_bus::{Bus, Selector, Subscription};
use imagepipe_runtime::batches::until_short;
use imagepipe_runtime::clock::{Clock, SystemClock, millis};
use imagepipe_runtime::config::StoreKind;
use imagepipe_runtime::connect::redis_unreachable;
use imagepipe_runtime::dedup::{Subscriber, SubscriberRunError, run_subscriber};
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::service::checks;
use imagepipe_runtime::{Service, Settings, Shutdown, error_chain};

pub use handler::IndexHandler;
pub use index::{EmbeddedIndex, Hit, IndexError, MemoryIndex, RedisIndex, TagIndex, TagMatch};

/// The service's name in logs and traces.
pub const SERVICE: &str = "tag-indexer-worker";
/// The durable subscriber group; its dead letters are `dlq.events.tag-indexer`.
pub const GROUP: &str = "tag-indexer";
/// The events it indexes.
pub const SELECTOR: &str = "image.analyzed || image.metadata_extracted || stage.completed";
/// How often the entries of tasks older than `coordinator.retention` are dropped.
pub const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);
/// Most tasks dropped per index call; [`expire`] repeats calls until one comes back short.
const EXPIRY_BATCH: usize = 500;

/// The indexer could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The index could not be opened.
    #[error("opening the tag index")]
    Index(#[source] IndexError),
    /// The subscriber could not join its group, or its worker stopped with an error.
    #[error(transparent)]
    Subscriber(#[from] SubscriberRunError),
}

/// The index `settings` call for: Redis at `store.redis.url` (keys under
/// `<bus.prefix>:{<bus.prefix>:tags}:`, one Redis Cluster slot; keys an older version wrote under
/// `<bus.prefix>:tags:` are moved there) when `store.kind = redis`, the group's embedded file
/// (`store.path/tag-indexer.redb`, beside its dedup set) otherwise.
pub async fn open_index(settings: &Settings) -> Result<Arc<dyn TagIndex>, RunError> {
    Ok(match settings.store.kind {
        StoreKind::Redis => Arc::new(
            RedisIndex::connect(settings.store.redis.url.expose(), &settings.bus.prefix)
                .await
                .map_err(RunError::Index)?,
        ),
        StoreKind::Embedded => {
            let db = EmbeddedDb::open_group(&settings.store.path, GROUP)
                .map_err(|e| RunError::Index(IndexError::Embedded(e)))?;
            Arc::new(EmbeddedIndex::open(db).await.map_err(RunError::Index)?)
        }
    })
}

/// Whether opening the index failed because Redis could not be reached (retried at start, with
/// `/readyz` false meanwhile).
pub fn index_unreachable(error: &RunError) -> bool {
    matches!(error, RunError::Index(IndexError::Connect(source) | IndexError::Redis { source, .. })
        if redis_unreachable(source))
}

/// The subscription: group [`GROUP`], selector [`SELECTOR`].
pub fn subscription(settings: &Settings) -> Subscription {
    let selector = Selector::parse(SELECTOR).expect("the selector is valid");
    Subscription::new(GROUP, selector).with_consumer(settings.worker.consumer_config())
}

/// The service as its binary runs it, on a started [`Service`]: opens the index, serves
/// `/v1/search` from it and indexes events until the service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    let opened = service.connect(checks::STORE, index_unreachable, || open_index(&service.settings)).await?;
    let Some(index) = opened else { return Ok(()) };
    service.serve(api::routes(index.clone()));
    run(service.bus.clone(), &service.settings, index, service.shutdown.clone()).await
}

/// Indexes the events on `bus` into `index` until `shutdown` fires and in-flight events are done,
/// dropping the entries of tasks older than `coordinator.retention` every [`EXPIRY_INTERVAL`].
pub async fn run(bus: Bus, settings: &Settings, index: Arc<dyn TagIndex>, shutdown: Shutdown) -> Result<(), RunError> {
    let expiring = expire_every(index.clone(), settings.coordinator.retention, shutdown.clone());
    let handler = IndexHandler::new(index);
    let subscriber = Subscriber::new(subscription(settings), handler, &settings.worker).alongside(expiring);
    Ok(run_subscriber(bus, settings, subscriber, shutdown).await?)
}

/// Drops every entry of the tasks whose latest event is older than `retention` at `now` (Unix
/// ms); returns how many tasks.
pub async fn expire(index: &dyn TagIndex, now: u64, retention: Duration) -> Result<usize, IndexError> {
    let before = now.saturating_sub(millis(retention));
    until_short(EXPIRY_BATCH, |max| index.expire(before, max)).await
}

/// Runs [`expire`] every [`EXPIRY_INTERVAL`] until `shutdown`.
async fn expire_every(index: Arc<dyn TagIndex>, retention: Duration, shutdown: Shutdown) {
    loop {
        match expire(index.as_ref(), SystemClock.unix_ms(), retention).await {
            Ok(0) => {}
            Ok(tasks) => tracing::info!(tasks, "tag index entries of expired tasks dropped"),
            Err(e) => tracing::warn!(error = %error_chain(&e), "tag index expiry failed; tried again later"),
        }
        if !shutdown.sleep(EXPIRY_INTERVAL).await {
            return;
        }
    }
}

/// A tag as indexed and searched: trimmed and lowercased.
pub fn normalize_tag(tag: &str) -> String {
    tag.trim().to_lowercase()
}
