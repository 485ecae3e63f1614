//! The coordinator assembled from [`Settings`]: store, engine, API routes and loops. Used by
//! the binary ([`serve`]) and by `imagepipe run`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use imagepipe_blob::BlobStore;
use imagepipe_bus::Bus;
use imagepipe_contracts::Step;
use imagepipe_runtime::clock::{Clock, SystemClock};
use imagepipe_runtime::config::{CoordinatorConfig, PipelineConfig, StoreKind};
use imagepipe_runtime::connect::redis_unreachable;
use imagepipe_runtime::control::ControlStore;
use imagepipe_runtime::http::UploadSlots;
use imagepipe_runtime::service::checks;
use imagepipe_runtime::shutdown::Shutdown;
use imagepipe_runtime::worker::LoopConfig;
use imagepipe_runtime::{Service, Settings};

use crate::api::forward::{Forwarding, Upstream};
use crate::blob_sweep::BlobSweeper;
use crate::cluster::{ClusterConfig, Ownership};
use crate::engine::{Engine, EngineConfig};
use crate::events::EventHub;
use crate::gauges;
use crate::loops::{self, LoopsConfig, RunError};
use crate::machine::{Policy, Stage, StepPolicy};
use crate::retention::Retention;
use crate::store::embedded::EmbeddedStore;
use crate::store::redis::RedisStore;
use crate::store::{StoreError, TaskStore};

/// Events buffered per `/v1/events` client before it is told it lagged.
const SSE_BUFFER: usize = 1_024;

/// How long the broker keeps a coordinator's `/v1/events` group after the process stopped
/// pulling from it (it stopped, crashed, or lost the broker; a live one pulls every few seconds
/// and recreates its group if it was deleted meanwhile).
pub const SSE_GROUP_IDLE: Duration = Duration::from_secs(60);

/// How often finished tasks and dead letters past their retention are deleted.
pub const EXPIRY_INTERVAL: Duration = Duration::from_secs(60);

/// How often the blobs no task references are looked for ([`BlobSweeper`]).
pub const BLOB_SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Opens the store `settings.store` names (Redis keys start with `bus.prefix`) with
/// `coordinator.shards` shards, refusing a store written with another count.
pub async fn open_store(settings: &Settings) -> Result<Arc<dyn TaskStore>, StoreError> {
    let (grace, shards) = (settings.coordinator.relay_grace, settings.coordinator.shards);
    let store: Arc<dyn TaskStore> = match settings.store.kind {
        StoreKind::Embedded => Arc::new(EmbeddedStore::open(&settings.store.path, grace)?.with_shards(shards)),
        StoreKind::Redis => Arc::new(
            RedisStore::connect(settings.store.redis.url.expose(), &settings.bus.prefix, grace)
                .await?
                .with_shards(shards)
                .with_min_replicas(settings.store.redis.min_replicas),
        ),
    };
    store.pin_shards(shards).await?;
    Ok(store)
}

/// The retry and deadline rules of the `coordinator` section and the stages of `pipeline`.
///
/// # Panics
///
/// When `retry_min_backoff` is zero or longer than `retry_max_backoff`, or `pipeline.stages`
/// is not a valid pipeline, which [`Settings::validate`] refuses.
pub fn policy(settings: &CoordinatorConfig, pipeline: &PipelineConfig) -> Policy {
    let step = |step: Step| {
        let deadline = match step {
            Step::Download => settings.download_deadline,
            Step::Metadata => settings.metadata_deadline,
            Step::Analyze => settings.analyze_deadline,
            Step::Custom(_) => None,
        };
        StepPolicy { max_attempts: settings.max_attempts, deadline: deadline.unwrap_or(settings.step_deadline) }
    };
    let stages = pipeline.steps().expect("Settings::validate checks pipeline.stages");
    let stages = stages
        .into_iter()
        .map(|(step, stage)| Stage {
            step,
            limits: step.is_custom().then(|| StepPolicy {
                max_attempts: stage.attempts.unwrap_or(settings.max_attempts),
                deadline: stage.deadline.unwrap_or(settings.step_deadline),
            }),
            when: stage.when.clone(),
            inputs: stage.inputs.clone(),
        })
        .collect();
    Policy {
        download: step(Step::Download),
        metadata: step(Step::Metadata),
        analyze: step(Step::Analyze),
        backoff: settings.retry_backoff().expect("Settings::validate checks the coordinator's retry backoff"),
        stages,
    }
}

/// Whether opening the store failed because Redis could not be reached (retried at start).
pub fn store_unreachable(error: &StoreError) -> bool {
    matches!(error, StoreError::Redis { source, .. } if redis_unreachable(source))
}

/// The coordinator as its binary runs it, on a started [`Service`]: opens the store (an
/// unreachable Redis is retried with backoff, `/readyz` false meanwhile) and the blob store,
/// serves the API and runs every loop until the service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    let settings = &service.settings;
    let opened = service.connect(checks::STORE, store_unreachable, || open_store(settings)).await;
    let Some(store) = opened.map_err(RunError::Store)? else { return Ok(()) };
    let blobs = settings.blob.open().map_err(RunError::BlobStore)?;
    let control = imagepipe_runtime::control::connect(settings).await.map_err(RunError::Control)?;
    let coordinator = Coordinator::new(settings, store, service.bus.clone(), Arc::new(SystemClock))
        .with_control(control)
        .with_blobs(blobs.clone());
    service.serve(coordinator.routes(blobs));
    service.serve(coordinator.forwarded_routes(&[]));
    service.serve(coordinator.dashboard(service));
    coordinator.run(service.shutdown.clone()).await
}

/// A coordinator ready to serve and run.
pub struct Coordinator {
    /// The engine.
    pub engine: Engine,
    /// The event fan-out behind `/v1/events`.
    pub hub: EventHub,
    forwarding: Forwarding,
    max_upload_bytes: u64,
    upload_slots: UploadSlots,
    config: LoopsConfig,
    orphan_grace: Duration,
    blobs: Option<Arc<dyn BlobStore>>,
    jobs: crate::reprocess::Jobs,
}

impl Coordinator {
    /// Assembles a coordinator over `store` and `bus`.
    pub fn new(settings: &Settings, store: Arc<dyn TaskStore>, bus: Bus, clock: Arc<dyn Clock>) -> Self {
        let c = &settings.coordinator;
        let engine_config = EngineConfig {
            policy: policy(c, &settings.pipeline),
            max_in_flight: c.max_in_flight,
            ..EngineConfig::default()
        };
        let ownership = Ownership::new(crate::cluster::replica_id(), c.shards);
        let engine = Engine::new(store, bus, clock, engine_config).with_ownership(ownership);
        let config = LoopsConfig {
            worker: LoopConfig::from_settings("coordinator", &settings.worker),
            max_batch: loops::MAX_BATCH,
            consumer: settings.worker.consumer_config(),
            shares: settings.worker.priority_shares.shares(),
            sweep_interval: c.sweep_interval,
            cap_recheck: Duration::from_millis(500),
            dlq_groups: c.dlq_groups.clone(),
            events_group: format!("{}-{}", loops::EVENTS_WORKER, uuid::Uuid::new_v4().simple()),
            events_idle: SSE_GROUP_IDLE,
            retention: Retention::from_settings(c, &settings.dlq),
            expiry_interval: EXPIRY_INTERVAL,
            cluster: Some(ClusterConfig {
                shards: c.shards,
                lease: c.shard_lease,
                address: Some(
                    c.advertise_url
                        .clone()
                        .unwrap_or_else(|| format!("http://{}:{}", crate::cluster::hostname(), settings.http.port)),
                ),
            }),
            shard_loops: c.shard_loops(),
        };
        let max_upload_bytes = settings.download.max_bytes;
        let hub = EventHub::new(SSE_BUFFER, settings.http.max_sse_clients);
        crate::metrics::describe();
        Self {
            engine,
            hub,
            forwarding: Forwarding::new(settings),
            max_upload_bytes,
            upload_slots: UploadSlots::from_config(&settings.http),
            config,
            orphan_grace: settings.blob.orphan_grace,
            blobs: None,
            jobs: crate::reprocess::Jobs::new(c.max_reprocess_jobs),
        }
    }

    /// The same coordinator with its operator controls kept in `control`
    /// ([`imagepipe_runtime::control::connect`]); by default they live in its memory only.
    pub fn with_control(mut self, control: Arc<dyn ControlStore>) -> Self {
        self.engine = self.engine.with_control(control);
        self
    }

    /// The same coordinator deleting the blobs of `blobs` no task references (expired tasks'
    /// images and derivatives, unsubmitted uploads) once `blob.orphan_grace` old
    /// ([`BlobSweeper`]); without it, no blob is ever deleted.
    pub fn with_blobs(mut self, blobs: Arc<dyn BlobStore>) -> Self {
        self.blobs = Some(blobs);
        self
    }

    /// The `/v1` API routes, uploads going into `blobs` (at most `download.max_bytes` each,
    /// `http.max_uploads` at once), to serve with [`Service::serve`].
    pub fn routes(&self, blobs: Arc<dyn BlobStore>) -> Router {
        let slots = self.upload_slots.clone();
        crate::api::router(
            self.engine.clone(),
            self.hub.clone(),
            blobs,
            self.max_upload_bytes,
            slots,
            self.jobs.clone(),
        )
    }

    /// The routes of the other services' user-facing APIs, forwarded to the URLs of
    /// `coordinator.search_url`, `.stats_url` and `.similarity_url`
    /// ([`forward`](crate::api::forward)), but for the upstreams `served_here` (whose routes
    /// this process serves itself, as `imagepipe run` does); to serve with [`Service::serve`]
    /// beside [`Coordinator::routes`].
    pub fn forwarded_routes(&self, served_here: &[Upstream]) -> Router {
        self.forwarding.router(served_here)
    }

    /// The dashboard's routes (`/`, [`crate::dashboard`]), rendering from the `/v1` routes
    /// `service` serves; to serve with [`Service::serve`] once those are added.
    pub fn dashboard(&self, service: &Service) -> Router {
        let clock = self.engine.clock().clone();
        crate::dashboard::Dashboard::new(service.api().clone(), &service.settings.telemetry, clock).router()
    }

    /// Runs the sweeper, every consumer and the gauge sampler until `shutdown`.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), RunError> {
        let (bus, store) = (self.engine.bus().clone(), self.engine.store().clone());
        let sampler = tokio::spawn(gauges::run(bus, store.clone(), gauges::SAMPLE_INTERVAL, shutdown.clone()));
        let sweeper = self.blobs.map(|blobs| {
            let sweeper = BlobSweeper::new(store, blobs, self.engine.clock().clone(), self.orphan_grace);
            let stop = shutdown.clone();
            tokio::spawn(async move { sweeper.run(BLOB_SWEEP_INTERVAL, stop).await })
        });
        let outcome = loops::run(self.engine, self.hub, self.config, shutdown).await;
        sampler.abort();
        if let Some(sweeper) = sweeper {
            sweeper.abort();
        }
        outcome
    }
}
