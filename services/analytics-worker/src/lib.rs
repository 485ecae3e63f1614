//! imagepipe analytics-worker: an event subscriber that counts every event (tasks by outcome,
//! events by type, queue pauses and resumes among them, image formats, bytes downloaded) and
//! measures stage latencies from event timestamps (`task.created` → `image.downloaded` →
//! `image.metadata_extracted` → `image.analyzed` → `task.completed`, and end to end) as
//! histograms, all time and for the last hour by minute; serves `GET /v1/stats` and exports the all-time counts and latencies as
//! Prometheus metrics.
//!
//! - [`update`]: what one event adds.
//! - [`histogram`]: fine fixed-bucket latency histograms and quantile estimates.
//! - [`window`]: the last hour, in a bucket per minute.
//! - [`store`]: the [`StatsStore`] seam, in Redis (`store.kind = redis`), in the embedded file
//!   `store.path/analytics.redb` (`store.kind = embedded`) or in process memory.
//! - [`handler`]: the [`EventHandler`](imagepipe_runtime::dedup::EventHandler) recording
//!   events, run inside the dedup layer.
//! - [`api`]: the stats route.
//! - [`open_store`] then [`run`]: the subscriber on a connected bus; serve [`api::routes`] of
//!   the same store.

pub mod api;
pub mod handler;
pub mod histogram;
pub mod store;
pub mod update;
pub mod window;

use std::sync::Arc;

use imagepipe_bus::{Bus, Selector, Subscription};
use imagepipe_runtime::clock::SystemClock;
use imagepipe_runtime::config::StoreKind;
use imagepipe_runtime::connect::redis_unreachable;
use imagepipe_runtime::dedup::{self, DedupError, Subscriber, SubscriberRunError, run_subscriber};
use imagepipe_runtime::service::checks;
use imagepipe_runtime::{Service, Settings, Shutdown, error_chain};

pub use handler::StatsHandler;
pub use histogram::{BUCKETS_MS, Histogram};
pub use store::{DEFAULT_TASK_TTL, EmbeddedStore, MemoryStore, RedisStore, Stats, StatsStore, StoreError};
pub use update::{Span, Stage, TaskOutcome, Update};
pub use window::{Minute, Window};

/// The service's name in logs and traces.
pub const SERVICE: &str = "analytics-worker";
/// The durable subscriber group; its dead letters are `dlq.events.analytics`.
pub const GROUP: &str = "analytics";

/// Metric names of the analytics worker. They count what this replica handled; `/v1/stats`
/// is the total of every replica.
pub mod metrics {
    /// Events counted, by `event_type`.
    pub const EVENTS: &str = "imagepipe_analytics_events_total";
    /// Finished tasks, by `outcome`.
    pub const TASKS: &str = "imagepipe_analytics_tasks_total";
    /// Downloaded images, by `format`.
    pub const IMAGES: &str = "imagepipe_analytics_images_total";
    /// Bytes downloaded.
    pub const BYTES_DOWNLOADED: &str = "imagepipe_analytics_downloaded_bytes_total";
    /// Seconds between two task stages, by `span`.
    pub const STAGE_LATENCY: &str = "imagepipe_analytics_stage_latency_seconds";
    /// Label: the event type.
    pub const EVENT_TYPE: &str = "event_type";
    /// Label: how a task ended.
    pub const OUTCOME: &str = "outcome";
    /// Label: the image format.
    pub const FORMAT: &str = "format";
    /// Label: the latency span (`download`, `metadata`, `analysis`, `completion`, `end_to_end`).
    pub const SPAN: &str = "span";

    /// Gives each of these metrics its `# HELP` text (at start; again is harmless).
    pub fn describe() {
        use ::metrics::{Unit, describe_counter, describe_histogram};
        describe_counter!(EVENTS, Unit::Count, "Events counted, by event_type.");
        describe_counter!(TASKS, Unit::Count, "Finished tasks, by outcome.");
        describe_counter!(IMAGES, Unit::Count, "Downloaded images, by format.");
        describe_counter!(BYTES_DOWNLOADED, Unit::Bytes, "Bytes downloaded.");
        describe_histogram!(STAGE_LATENCY, Unit::Seconds, "Time between two task stages, by span.");
    }
}

/// The worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The statistics store could not be opened.
    #[error("opening the analytics store")]
    Store(#[source] StoreError),
    /// The dedup store could not be opened.
    #[error("opening the dedup store")]
    Dedup(#[source] DedupError),
    /// The subscriber could not join its group, or its worker stopped with an error.
    #[error(transparent)]
    Subscriber(#[from] SubscriberRunError),
}

/// The store `settings` call for: Redis at `store.redis.url` (keys under
/// `<bus.prefix>:analytics:`) when `store.kind = redis`, the group's embedded file
/// (`store.path/analytics.redb`, beside its dedup set) otherwise.
pub async fn open_store(settings: &Settings) -> Result<Arc<dyn StatsStore>, RunError> {
    Ok(match settings.store.kind {
        StoreKind::Redis => Arc::new(
            RedisStore::connect(
                settings.store.redis.url.expose(),
                &settings.bus.prefix,
                DEFAULT_TASK_TTL,
                settings.dedup.ttl,
            )
            .await
            .map_err(RunError::Store)?,
        ),
        StoreKind::Embedded => {
            let dedup = dedup::open_embedded(settings, GROUP).await.map_err(RunError::Dedup)?;
            Arc::new(
                EmbeddedStore::open(dedup, DEFAULT_TASK_TTL, Arc::new(SystemClock)).await.map_err(RunError::Store)?,
            )
        }
    })
}

/// Whether opening the store failed because Redis could not be reached (retried at start, with
/// `/readyz` false meanwhile).
pub fn store_unreachable(error: &RunError) -> bool {
    matches!(error, RunError::Store(StoreError::Connect(source) | StoreError::Redis { source, .. })
        if redis_unreachable(source))
}

/// The events it counts: every pipeline event, and the queue events (`queue.paused`,
/// `queue.resumed`), which carry no task and only count.
pub const SELECTOR: &str = "image.* || task.* || queue.*";

/// The subscription: group [`GROUP`], every event it counts ([`SELECTOR`]).
pub fn subscription(settings: &Settings) -> Subscription {
    let selector = Selector::parse(SELECTOR).expect("the selector is valid");
    Subscription::new(GROUP, selector).with_consumer(settings.worker.consumer_config())
}

/// The service as its binary runs it, on a started [`Service`]: opens the store, serves
/// `/v1/stats` from it and counts events until the service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    let opened = service.connect(checks::STORE, store_unreachable, || open_store(&service.settings)).await?;
    let Some(store) = opened else { return Ok(()) };
    service.serve(api::routes(store.clone()));
    run(service.bus.clone(), &service.settings, store, service.shutdown.clone()).await
}

/// Counts the events on `bus` into `store` until `shutdown` fires and in-flight events are done.
///
/// Orderly: one event per task (message key) at a time, so a redelivered event never races its
/// twin past the dedup check and counts twice; different tasks run in parallel.
pub async fn run(
    bus: Bus,
    settings: &Settings,
    store: Arc<dyn StatsStore>,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    metrics::describe();
    let subscriber = Subscriber::new(subscription(settings), StatsHandler::new(store), &settings.worker).orderly();
    Ok(run_subscriber(bus, settings, subscriber, shutdown).await?)
}
