//! Every service in one process: the coordinator, the download, metadata and AI workers and the
//! notification, tag-indexer, similarity-indexer and analytics subscribers on one bus, the
//! coordinator's store, a local blob directory, and one HTTP server for all of their APIs. It
//! starts like any service ([`Service::start_with`]): the same readiness checks, the same `/v1`
//! edge and token check, the same connect with retry.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt, TryFutureExt};
use imagepipe_ai_worker::{Classifier, ModelError};
use imagepipe_blob::{BlobConfigError, BlobStore};
use imagepipe_bus::{Bus, BusError, BusKind, Message};
use imagepipe_contracts::SubmitTask;
use imagepipe_coordinator::Task;
use imagepipe_coordinator::api::forward::Upstream;
use imagepipe_coordinator::app::{Coordinator, open_store};
use imagepipe_coordinator::engine::Engine;
use imagepipe_coordinator::store::StoreError;
use imagepipe_runtime::clock::SystemClock;
use imagepipe_runtime::config::{StoreKind, mask_url_credentials};
use imagepipe_runtime::service::{Service, ServiceError};
use imagepipe_runtime::{Settings, Shutdown};
use tokio::task::JoinSet;

/// The pipeline's name in logs and traces.
const NAME: &str = "imagepipe";

/// How often [`Pipeline::wait_for`] looks at the store.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// The in-process pipeline could not start, or one of its services failed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The AI model could not be loaded.
    #[error("loading the AI model")]
    Model(#[source] ModelError),
    /// The service start-up (telemetry, metrics, HTTP server, bus) failed, or its stop did.
    #[error(transparent)]
    Start(Box<ServiceError>),
    /// The blob store of `blob.*` could not be opened.
    #[error("opening the blob store")]
    BlobStore(#[source] BlobConfigError),
    /// A subscriber's group could not be created.
    #[error("creating the subscriber group {group}")]
    Subscribe {
        /// The group.
        group: String,
        /// Bus error.
        #[source]
        source: BusError,
    },
    /// The analytics store could not be opened.
    #[error("opening the analytics store")]
    Stats(#[source] imagepipe_analytics_worker::RunError),
    /// The tag index could not be opened.
    #[error("opening the tag index")]
    TagIndex(#[source] imagepipe_tag_indexer_worker::RunError),
    /// The similarity index could not be opened.
    #[error("opening the similarity index")]
    Similarity(#[source] imagepipe_similarity_indexer::RunError),
    /// The coordinator's store could not be opened.
    #[error("opening the task store")]
    Store(#[source] StoreError),
    /// Another process (another `imagepipe run`) has the embedded store's files open.
    #[error(
        "another process holds the store in {} ({}): stop it, or give this one another directory with store.path (IMAGEPIPE_STORE__PATH)",
        dir.display(),
        files.join(", ")
    )]
    StoreHeld {
        /// `store.path`.
        dir: PathBuf,
        /// The files held.
        files: Vec<String>,
    },
    /// A submit command could not be sent.
    #[error("sending the submit command of task {task_id}")]
    Submit {
        /// The task.
        task_id: String,
        /// Bus error.
        #[source]
        source: BusError,
    },
    /// A service stopped with an error.
    #[error("the {service} stopped")]
    Service {
        /// Which service.
        service: &'static str,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Tasks did not finish in time.
    #[error("tasks not finished after {waited:?}: {}", pending.join(", "))]
    Timeout {
        /// How long it waited.
        waited: Duration,
        /// The unfinished tasks.
        pending: Vec<String>,
    },
    /// A service panicked.
    #[error("the {service} panicked")]
    Panicked {
        /// Which service (when known).
        service: &'static str,
    },
}

impl From<ServiceError> for PipelineError {
    fn from(error: ServiceError) -> Self {
        Self::Start(Box::new(error))
    }
}

/// A service's error, as the pipeline reports it.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

type ServiceResult = (&'static str, Result<(), BoxError>);

/// How one service of the pipeline runs: on the pipeline's bus and settings until its shutdown.
type StartService = Box<dyn FnOnce(Bus, Arc<Settings>, Shutdown) -> BoxFuture<'static, Result<(), BoxError>> + Send>;

/// The entry of the pipeline's service table for `run` (a service's own run, given the bus,
/// settings and shutdown), its error boxed.
fn start<F, R, E>(run: F) -> StartService
where
    F: FnOnce(Bus, Arc<Settings>, Shutdown) -> R + Send + 'static,
    R: Future<Output = Result<(), E>> + Send + 'static,
    E: std::error::Error + Send + Sync + 'static,
{
    Box::new(move |bus, settings, stop| run(bus, settings, stop).map_err(boxed).boxed())
}

/// The running pipeline. Stop it with [`Pipeline::stop`] (or [`Pipeline::run_until`]).
pub struct Pipeline {
    service: Service,
    /// The model's name and the runtime running it.
    model: String,
    engine: Engine,
    blobs: Arc<dyn BlobStore>,
    settings: Arc<Settings>,
    services: JoinSet<ServiceResult>,
}

impl Pipeline {
    /// Loads the model, connects the bus of `settings.bus` (the in-memory bus by default) and
    /// the store of `settings.store`, binds `http.bind:http.port` (port 0 picks one) and starts
    /// every service. Tasks the store holds unfinished are resumed by the coordinator's sweeper.
    /// Refuses at once, before loading anything, when another process holds the store's files.
    pub async fn start(settings: Settings) -> Result<Self, PipelineError> {
        let held = imagepipe_runtime::embedded::held_by_another_process(&settings.store.path);
        if !held.is_empty() {
            let files = held.iter().filter_map(|f| f.file_name()).map(|f| f.to_string_lossy().into_owned()).collect();
            return Err(PipelineError::StoreHeld { dir: settings.store.path.clone(), files });
        }
        let classifier = Classifier::load(&settings.ai).await.map_err(PipelineError::Model)?;
        let model = format!("{} on {}", classifier.model().name(), classifier.model().runtime());
        let service = Service::start_with(NAME, settings, Shutdown::new()).await.map_err(PipelineError::from)?;
        let (bus, settings) = (service.bus.clone(), service.settings.clone());
        let store = open_store(&settings).await.map_err(PipelineError::Store)?;
        let control = imagepipe_runtime::control::connect(&settings)
            .await
            .map_err(|e| PipelineError::Service { service: "coordinator", source: Box::new(e) })?;
        let blobs = settings.blob.open().map_err(PipelineError::BlobStore)?;
        let coordinator = Coordinator::new(&settings, store, bus.clone(), Arc::new(SystemClock))
            .with_control(control)
            .with_blobs(blobs.clone());
        let engine = coordinator.engine.clone();
        if settings.bus.kind == BusKind::Memory {
            // The in-process bus lost the commands that were in flight when the last run ended.
            let resent = engine
                .redispatch_running()
                .await
                .map_err(|e| PipelineError::Service { service: "coordinator", source: Box::new(e) })?;
            if resent > 0 {
                tracing::info!(resent, "re-sent the steps that were running when the last run ended");
            }
        }
        let tag_index = imagepipe_tag_indexer_worker::open_index(&settings).await.map_err(PipelineError::TagIndex)?;
        let stats = imagepipe_analytics_worker::open_store(&settings).await.map_err(PipelineError::Stats)?;
        let similarity =
            imagepipe_similarity_indexer::open_store(&settings).await.map_err(PipelineError::Similarity)?;
        let live = Arc::new(imagepipe_similarity_indexer::LiveIndex::new(settings.similarity.clone()));
        let similarity_api = imagepipe_similarity_indexer::api(
            &settings,
            bus.clone(),
            similarity.clone(),
            live.clone(),
            Some(classifier.clone()),
            service.shutdown.clone(),
        )
        .await
        .map_err(PipelineError::Similarity)?;
        // Subscriber groups start at new events: create them before the coordinator publishes.
        for subscription in [
            imagepipe_notification_worker::subscription(&settings),
            imagepipe_tag_indexer_worker::subscription(&settings),
            imagepipe_similarity_indexer::subscription(&settings),
            imagepipe_analytics_worker::subscription(&settings),
        ] {
            let group = subscription.group.clone();
            bus.events.subscribe(subscription).await.map_err(|source| PipelineError::Subscribe { group, source })?;
        }

        service.serve(coordinator.routes(blobs.clone()));
        service.serve(imagepipe_tag_indexer_worker::api::routes(tag_index.clone()));
        service.serve(imagepipe_analytics_worker::api::routes(stats.clone()));
        let slots = imagepipe_runtime::http::UploadSlots::from_config(&settings.http);
        service.serve(imagepipe_similarity_indexer::routes(similarity_api, settings.download.max_bytes, slots));
        // Search, stats and similarity are served here; the coordinator forwards nothing.
        service.serve(coordinator.forwarded_routes(&Upstream::ALL));
        service.serve(coordinator.dashboard(&service));

        let settings = Arc::new(settings);
        // Every service of the pipeline, in start order: its name in errors, and how it runs.
        let table: Vec<(&'static str, StartService)> = vec![
            ("coordinator", start(|_, _, stop| coordinator.run(stop))),
            (
                "download worker",
                start(|bus, s, stop| async move { imagepipe_download_worker::run(bus, &s, stop).await }),
            ),
            (
                "metadata worker",
                start(|bus, s, stop| async move { imagepipe_metadata_worker::run(bus, &s, stop).await }),
            ),
            (
                "ai worker",
                start(|bus, s, stop| async move { imagepipe_ai_worker::run(bus, &s, classifier, stop).await }),
            ),
            (
                "notification worker",
                start(|bus, s, stop| async move { imagepipe_notification_worker::run(bus, &s, stop).await }),
            ),
            (
                "tag indexer",
                start(|bus, s, stop| async move { imagepipe_tag_indexer_worker::run(bus, &s, tag_index, stop).await }),
            ),
            (
                "similarity indexer",
                start(|bus, s, stop| async move {
                    imagepipe_similarity_indexer::run(bus, &s, similarity, live, stop).await
                }),
            ),
            (
                "analytics worker",
                start(|bus, s, stop| async move { imagepipe_analytics_worker::run(bus, &s, stats, stop).await }),
            ),
        ];
        let mut services = JoinSet::new();
        for (name, start) in table {
            let running = start(bus.clone(), settings.clone(), service.shutdown.clone());
            services.spawn(async move { (name, running.await) });
        }
        tracing::info!(addr = %service.http_addr(), "pipeline running");
        Ok(Self { service, model, engine, blobs, settings, services })
    }

    /// The address the HTTP API listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.service.http_addr()
    }

    /// The API's base URL, e.g. `http://127.0.0.1:8080` (an unspecified bind address becomes
    /// loopback).
    pub fn api_url(&self) -> String {
        let mut addr = self.local_addr();
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        format!("http://{addr}")
    }

    /// What `imagepipe run` says once started: where the API and the dashboard are, and the
    /// store, bus and model it runs on, as `(what, value)` rows (credentials in URLs masked).
    pub fn summary(&self) -> Vec<(&'static str, String)> {
        let settings = &self.settings;
        let api = self.api_url();
        let store = match settings.store.kind {
            StoreKind::Embedded => format!("embedded, {} (store.path)", settings.store.path.display()),
            StoreKind::Redis => format!("redis, {} (store.redis.url)", settings.store.redis.url.masked()),
        };
        let bus = match settings.bus.kind {
            BusKind::Memory => "memory, in this process (bus.kind)".to_owned(),
            BusKind::Nats => {
                format!("nats, {} prefix {}", mask_url_credentials(&settings.bus.nats.url), settings.bus.prefix)
            }
            BusKind::Kafka => {
                format!("kafka, {} prefix {}", mask_url_credentials(&settings.bus.kafka.brokers), settings.bus.prefix)
            }
        };
        let model = format!("{}, {} (ai.model_dir)", self.model, settings.ai.model_dir.display());
        vec![
            ("api", format!("{api} (http.port)")),
            ("dashboard", format!("{api}/")),
            ("store", store),
            ("bus", bus),
            ("model", model),
        ]
    }

    /// The bus every service runs on.
    pub fn bus(&self) -> &Bus {
        &self.service.bus
    }

    /// The coordinator's engine (its store holds every task).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The blob store the workers read and write.
    pub fn blobs(&self) -> &Arc<dyn BlobStore> {
        &self.blobs
    }

    /// The settings the pipeline runs with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Publishes `submit` on its lane of the submit queue (the durable path);
    /// `submit.task_id` must be set to follow the task.
    pub async fn submit(&self, submit: &SubmitTask) -> Result<(), PipelineError> {
        let task_id = submit.task_id.clone().unwrap_or_default();
        let body = serde_json::to_vec(submit).expect("a submit command serializes");
        let message = Message::new(body).with_key(task_id.clone());
        self.service
            .bus
            .queues
            .send(&submit.lane(), message)
            .await
            .map_err(|source| PipelineError::Submit { task_id, source })
    }

    /// Waits until every task of `ids` reached a terminal state (completed, failed, cancelled)
    /// and returns them in the order of `ids`.
    pub async fn wait_for(&self, ids: &[String], timeout: Duration) -> Result<Vec<Task>, PipelineError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let mut done = Vec::with_capacity(ids.len());
            let mut pending = Vec::new();
            for id in ids {
                match self.engine.store().get(id).await.map_err(PipelineError::Store)? {
                    Some(task) if task.state.is_terminal() => done.push(task),
                    // Not stored yet: the coordinator has not taken its submit command.
                    Some(_) | None => pending.push(id.clone()),
                }
            }
            if pending.is_empty() {
                return Ok(done);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(PipelineError::Timeout { waited: timeout, pending });
            }
            tokio::time::sleep(WAIT_POLL).await;
        }
    }

    /// Runs until `stop` fires or a service stops on its own, then stops everything. A service
    /// that stopped on its own is an error.
    pub async fn run_until(mut self, stop: Shutdown) -> Result<(), PipelineError> {
        let early = tokio::select! {
            () = stop.wait() => None,
            Some(joined) = self.services.join_next() => Some(joined),
        };
        let first = early.map(|joined| match service_outcome(joined) {
            Ok(service) => Err(PipelineError::Service { service, source: "stopped unexpectedly".into() }),
            Err(e) => Err(e),
        });
        let rest = self.stop().await;
        first.unwrap_or(Ok(())).and(rest)
    }

    /// Stops every service (in-flight work finishes within `worker.shutdown_grace`), then the
    /// HTTP server; returns the first error of any of them.
    pub async fn stop(mut self) -> Result<(), PipelineError> {
        self.service.shutdown.trigger();
        let mut outcome = Ok(());
        while let Some(joined) = self.services.join_next().await {
            if let Err(e) = service_outcome(joined)
                && outcome.is_ok()
            {
                outcome = Err(e);
            }
        }
        let stopped = self.service.stop().await.map_err(PipelineError::from);
        outcome.and(stopped)
    }
}

fn boxed(e: impl std::error::Error + Send + Sync + 'static) -> BoxError {
    Box::new(e)
}

/// The service's name when it returned `Ok`, else its error.
fn service_outcome(joined: Result<ServiceResult, tokio::task::JoinError>) -> Result<&'static str, PipelineError> {
    match joined {
        Ok((service, Ok(()))) => Ok(service),
        Ok((service, Err(source))) => Err(PipelineError::Service { service, source }),
        Err(_) => Err(PipelineError::Panicked { service: "a service" }),
    }
}
