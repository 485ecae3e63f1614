//! imagepipe tag-indexer-worker: an event subscriber that indexes every analyzed image's tags
//! (tag → task ids with the tag's score) and each task's thumbnail key, and serves
//! `GET /v1/search?tags=cat,animal&mode=all|any&limit=20`.
//!
//! - [`index`]: the [`TagIndex`] seam, in Redis (`store.kind = redis`) or in process.
//! - [`handler`]: the [`EventHandler`](imagepipe_runtime::dedup::EventHandler) writing the
//!   index, run inside the dedup layer.
//! - [`api`]: the search route.
//! - [`open_index`] then [`run`]: the subscriber on a connected bus; serve [`api::routes`] of
//!   the same index.

pub mod api;
pub mod handler;
pub mod index;

use std::sync::Arc;

use imagepipe_bus::{Bus, BusError, Selector, Subscription};
use imagepipe_runtime::config::StoreKind;
use imagepipe_runtime::dedup::{self, DedupError, Deduplicated};
use imagepipe_runtime::worker::WorkerError;
use imagepipe_runtime::{LoopConfig, Service, Settings, Shutdown, Worker, error_chain};

pub use handler::IndexHandler;
pub use index::{Hit, IndexError, MemoryIndex, RedisIndex, TagIndex, TagMatch};

/// The service's name in logs and traces.
pub const SERVICE: &str = "tag-indexer-worker";
/// The durable subscriber group; its dead letters are `dlq.events.tag-indexer`.
pub const GROUP: &str = "tag-indexer";
/// The events it indexes.
pub const SELECTOR: &str = "image.analyzed || image.metadata_extracted";

/// The indexer could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The index could not be opened.
    #[error("opening the tag index")]
    Index(#[source] IndexError),
    /// The dedup store could not be opened.
    #[error("opening the dedup store")]
    Dedup(#[source] DedupError),
    /// The subscription could not be opened.
    #[error("subscribing the {GROUP} group")]
    Subscribe(#[source] BusError),
    /// The worker loop stopped with an error.
    #[error("running the tag indexer")]
    Worker(#[source] WorkerError),
}

/// The index `settings` call for: Redis at `store.redis.url` (keys under `<bus.prefix>:tags:`)
/// when `store.kind = redis`, in process otherwise.
pub async fn open_index(settings: &Settings) -> Result<Arc<dyn TagIndex>, RunError> {
    Ok(match settings.store.kind {
        StoreKind::Redis => Arc::new(
            RedisIndex::connect(settings.store.redis.url.expose(), &settings.bus.prefix)
                .await
                .map_err(RunError::Index)?,
        ),
        StoreKind::Embedded => Arc::new(MemoryIndex::new()),
    })
}

/// The subscription: group [`GROUP`], selector [`SELECTOR`].
pub fn subscription(settings: &Settings) -> Subscription {
    let selector = Selector::parse(SELECTOR).expect("the selector is valid");
    Subscription::new(GROUP, selector).with_consumer(settings.worker.consumer_config())
}

/// The service as its binary runs it, on a started [`Service`]: opens the index, serves
/// `/v1/search` from it and indexes events until the service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    let index = open_index(&service.settings).await?;
    service.serve(api::routes(index.clone()));
    run(service.bus.clone(), &service.settings, index, service.shutdown.clone()).await
}

/// Indexes the events on `bus` into `index` until `shutdown` fires and in-flight events are done.
pub async fn run(bus: Bus, settings: &Settings, index: Arc<dyn TagIndex>, shutdown: Shutdown) -> Result<(), RunError> {
    let dedup = dedup::connect(settings, GROUP).await.map_err(RunError::Dedup)?;
    let consumer = bus.events.subscribe(subscription(settings)).await.map_err(RunError::Subscribe)?;
    let handler = Deduplicated::new(IndexHandler::new(index), dedup, GROUP);
    let config = LoopConfig::from_settings(GROUP, &settings.worker);
    Worker::new(consumer, handler, config).run(shutdown).await.map_err(RunError::Worker)
}

/// A tag as indexed and searched: trimmed and lowercased.
pub fn normalize_tag(tag: &str) -> String {
    tag.trim().to_lowercase()
}
