//! imagepipe similarity-indexer: an event subscriber that keeps a vector index of every analysed
//! image (its embedding from `image.analyzed`, its perceptual hash and thumbnail from
//! `image.metadata_extracted`), announces near-duplicates as `image.duplicate_detected`, and
//! serves similar-image search. The index is a read model: it can always be regenerated from the
//! retained event stream (`POST /v1/similarity/rebuild`, `imagepipe similarity rebuild`).
//!
//! - [`store`]: the [`SimilarityStore`] seam — the entries and a change log — in Redis
//!   (`store.kind = redis`, every key in one cluster slot) or in the group's embedded file
//!   (`store.path/similarity-indexer.redb`).
//! - [`live`]: [`LiveIndex`], the in-memory index each replica answers from, following the
//!   store's change log (exact search, an HNSW graph beyond `similarity.exact_limit`).
//! - [`handler`]: the [`EventHandler`](imagepipe_runtime::dedup::EventHandler) writing the
//!   store and announcing duplicates, run inside the dedup layer.
//! - [`rebuild`]: regenerating the index from the stream through a group of its own.
//! - [`api`]: the routes.
//! - [`open_store`] then [`run`]: the subscriber on a connected bus; [`serve`] for the binary.

pub mod api;
pub mod handler;
pub mod live;
pub mod rebuild;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use imagepipe_ai_worker::Classifier;
use imagepipe_bus::{Bus, Selector, Subscription};
use imagepipe_runtime::batches::until_short;
use imagepipe_runtime::clock::{Clock, SystemClock, millis};
use imagepipe_runtime::config::StoreKind;
use imagepipe_runtime::connect::redis_unreachable;
use imagepipe_runtime::dedup::{Subscriber, SubscriberRunError, run_subscriber};
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::http::UploadSlots;
use imagepipe_runtime::service::checks;
use imagepipe_runtime::{Service, Settings, Shutdown, error_chain};

pub use api::{SimilarityApi, routes};
pub use handler::IndexHandler;
pub use live::{IndexSize, LiveIndex, Similar};
pub use rebuild::{Rebuild, RebuildState, RebuildStatus};
pub use store::{EmbeddedStore, Entry, Pair, RedisStore, SimilarityStore, StoreError};

/// The service's name: the `source` of its events, and its name in logs and traces.
pub const SERVICE: &str = "similarity-indexer";
/// The durable subscriber group; its dead letters are `dlq.events.similarity-indexer`.
pub const GROUP: &str = "similarity-indexer";
/// The events it indexes.
pub const SELECTOR: &str = "image.analyzed || image.metadata_extracted";
/// How often the entries of tasks older than `coordinator.retention` are dropped.
pub const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);
/// Most entries dropped per store call; [`expire`] repeats calls until one comes back short.
const EXPIRY_BATCH: usize = 500;

/// The indexer could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The store could not be opened.
    #[error("opening the similarity store")]
    Store(#[source] StoreError),
    /// The blob store of `blob.*` could not be opened.
    #[error("opening the blob store")]
    BlobStore(#[source] imagepipe_blob::BlobConfigError),
    /// The subscriber could not join its group, or its worker stopped with an error.
    #[error(transparent)]
    Subscriber(#[from] SubscriberRunError),
}

/// The store `settings` call for: Redis at `store.redis.url` (keys under
/// `<bus.prefix>:{<bus.prefix>:similarity}:`) when `store.kind = redis`, the group's embedded file
/// (`store.path/similarity-indexer.redb`, beside its dedup set) otherwise.
pub async fn open_store(settings: &Settings) -> Result<Arc<dyn SimilarityStore>, RunError> {
    Ok(match settings.store.kind {
        StoreKind::Redis => Arc::new(
            RedisStore::connect(settings.store.redis.url.expose(), &settings.bus.prefix)
                .await
                .map_err(RunError::Store)?,
        ),
        StoreKind::Embedded => {
            let db = EmbeddedDb::open_group(&settings.store.path, GROUP)
                .map_err(|e| RunError::Store(StoreError::Embedded(e)))?;
            Arc::new(EmbeddedStore::open(db).await.map_err(RunError::Store)?)
        }
    })
}

/// Whether opening the store failed because Redis could not be reached (retried at start, with
/// `/readyz` false meanwhile).
pub fn store_unreachable(error: &RunError) -> bool {
    matches!(error, RunError::Store(StoreError::Connect(source) | StoreError::Redis { source, .. })
        if redis_unreachable(source))
}

/// The subscription: group [`GROUP`], selector [`SELECTOR`].
pub fn subscription(settings: &Settings) -> Subscription {
    let selector = Selector::parse(SELECTOR).expect("the selector is valid");
    Subscription::new(GROUP, selector).with_consumer(settings.worker.consumer_config())
}

/// The API over `store` and `live`: the model of `ai.model_dir` embeds images given to
/// `POST /v1/search/similar` (when it cannot be loaded, that route says why), `blob.*` holds the
/// blobs it names, rebuilds read `bus`.
pub async fn api(
    settings: &Settings,
    bus: Bus,
    store: Arc<dyn SimilarityStore>,
    live: Arc<LiveIndex>,
    model: Option<Classifier>,
    shutdown: Shutdown,
) -> Result<SimilarityApi, RunError> {
    let model = match model {
        Some(model) => Ok(model),
        None => Classifier::load(&settings.ai).await.map_err(|e| {
            tracing::warn!(error = %error_chain(&e), "no model: POST /v1/search/similar answers 503");
            error_chain(&e)
        }),
    };
    let blobs = settings.blob.open().map_err(RunError::BlobStore)?;
    let rebuild = Arc::new(Rebuild::new(bus, store.clone(), live.clone(), shutdown));
    Ok(SimilarityApi { store, live, model, blobs, rebuild })
}

/// The service as its binary runs it, on a started [`Service`]: opens the store, serves the
/// similarity routes from it and indexes events until the service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    let opened = service.connect(checks::STORE, store_unreachable, || open_store(&service.settings)).await?;
    let Some(store) = opened else { return Ok(()) };
    let settings = &service.settings;
    let live = Arc::new(LiveIndex::new(settings.similarity.clone()));
    let api = api(settings, service.bus.clone(), store.clone(), live.clone(), None, service.shutdown.clone()).await?;
    service.serve(routes(api, settings.download.max_bytes, UploadSlots::from_config(&settings.http)));
    run(service.bus.clone(), settings, store, live, service.shutdown.clone()).await
}

/// Indexes the events on `bus` into `store` (comparing in `live`, announcing duplicates on
/// `bus`) until `shutdown` fires and in-flight events are done, dropping the entries of tasks
/// older than `coordinator.retention` every [`EXPIRY_INTERVAL`].
pub async fn run(
    bus: Bus,
    settings: &Settings,
    store: Arc<dyn SimilarityStore>,
    live: Arc<LiveIndex>,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let expiring = expire_every(store.clone(), settings.coordinator.retention, shutdown.clone());
    let handler = IndexHandler::new(store, live, bus.clone(), Arc::new(SystemClock));
    let subscriber = Subscriber::new(subscription(settings), handler, &settings.worker).alongside(expiring);
    Ok(run_subscriber(bus, settings, subscriber, shutdown).await?)
}

/// Drops every entry whose latest event is older than `retention` at `now` (Unix ms), and
/// removals the change log no longer needs; returns how many entries.
pub async fn expire(store: &dyn SimilarityStore, now: u64, retention: Duration) -> Result<usize, StoreError> {
    let before = now.saturating_sub(millis(retention));
    until_short(EXPIRY_BATCH, |max| store.expire(before, now, max)).await
}

/// Runs [`expire`] every [`EXPIRY_INTERVAL`] until `shutdown`.
async fn expire_every(store: Arc<dyn SimilarityStore>, retention: Duration, shutdown: Shutdown) {
    loop {
        match expire(store.as_ref(), SystemClock.unix_ms(), retention).await {
            Ok(0) => {}
            Ok(entries) => tracing::info!(entries, "similarity entries of expired tasks dropped"),
            Err(e) => tracing::warn!(error = %error_chain(&e), "similarity expiry failed; tried again later"),
        }
        if !shutdown.sleep(EXPIRY_INTERVAL).await {
            return;
        }
    }
}
