//! The coordinator assembled from [`Settings`]: store, engine, API routes and loops. Used by
//! the binary and by `imagepipe run`.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use imagepipe_bus::Bus;
use imagepipe_contracts::Step;
use imagepipe_runtime::Settings;
use imagepipe_runtime::clock::Clock;
use imagepipe_runtime::config::{CoordinatorSettings, StoreKind};
use imagepipe_runtime::shutdown::Shutdown;
use imagepipe_runtime::worker::WorkerConfig;

use crate::engine::{Engine, EngineConfig};
use crate::events::EventHub;
use crate::machine::{Policy, StepPolicy};
use crate::service::{self, ServiceConfig, ServiceError};
use crate::store::embedded::EmbeddedStore;
use crate::store::redis::RedisStore;
use crate::store::{StoreError, TaskStore};

/// Events buffered per `/v1/events` client before it is told it lagged.
const SSE_BUFFER: usize = 1_024;

/// Opens the store `settings.store` names; Redis keys start with `bus.prefix`.
pub async fn open_store(settings: &Settings) -> Result<Arc<dyn TaskStore>, StoreError> {
    let grace = settings.coordinator.relay_grace;
    Ok(match settings.store.kind {
        StoreKind::Embedded => Arc::new(EmbeddedStore::open(&settings.store.path, grace)?),
        StoreKind::Redis => {
            Arc::new(RedisStore::connect(settings.store.redis.url.expose(), &settings.bus.prefix, grace).await?)
        }
    })
}

/// The retry and deadline rules of the `coordinator` section.
pub fn policy(settings: &CoordinatorSettings) -> Policy {
    let step = |step: Step| {
        let deadline = match step {
            Step::Download => settings.download_deadline,
            Step::Metadata => settings.metadata_deadline,
            Step::Analyze => settings.analyze_deadline,
        };
        StepPolicy { max_attempts: settings.max_attempts, deadline: deadline.unwrap_or(settings.step_deadline) }
    };
    Policy {
        download: step(Step::Download),
        metadata: step(Step::Metadata),
        analyze: step(Step::Analyze),
        ..Policy::default()
    }
}

/// A coordinator ready to serve and run.
pub struct Coordinator {
    /// The engine.
    pub engine: Engine,
    /// The event fan-out behind `/v1/events`.
    pub hub: EventHub,
    token: Option<String>,
    config: ServiceConfig,
}

impl Coordinator {
    /// Assembles a coordinator over `store` and `bus`.
    pub fn new(settings: &Settings, store: Arc<dyn TaskStore>, bus: Bus, clock: Arc<dyn Clock>) -> Self {
        let c = &settings.coordinator;
        let engine_config =
            EngineConfig { policy: policy(c), max_in_flight: c.max_in_flight, ..EngineConfig::default() };
        let engine = Engine::new(store, bus, clock, engine_config);
        let config = ServiceConfig {
            worker: WorkerConfig::from_settings("coordinator", &settings.worker),
            consumer: settings.worker.consumer_config(),
            sweep_interval: c.sweep_interval,
            cap_recheck: Duration::from_millis(500),
            dlq_groups: c.dlq_groups.clone(),
            events_group: format!("coordinator-sse-{}", uuid::Uuid::new_v4().simple()),
        };
        let token = settings.http.auth_token.as_ref().map(|t| t.expose().clone());
        Self { engine, hub: EventHub::new(SSE_BUFFER), token, config }
    }

    /// The `/v1` API routes, to merge into the service's HTTP server.
    pub fn routes(&self) -> Router {
        crate::api::router(self.engine.clone(), self.hub.clone(), self.token.clone())
    }

    /// Runs the sweeper and every consumer until `shutdown`.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), ServiceError> {
        service::run(self.engine, self.hub, self.config, shutdown).await
    }
}
