//! The start-up every service shares, the coordinator and `imagepipe run` included, so that a
//! binary's `main` is one call:
//!
//! ```no_run
//! # use imagepipe_runtime::service::{self, Service};
//! # #[derive(Debug, thiserror::Error)] #[error("x")] struct RunError;
//! # async fn serve(service: &Service) -> Result<(), RunError> { Ok(()) }
//! fn main() -> std::process::ExitCode {
//!     service::main("download-worker", "The imagepipe download worker.", |service| Box::pin(serve(service)))
//! }
//! ```
//!
//! Start-up runs in two halves. [`Service::start`] sets up telemetry, metrics and the shutdown
//! signal, starts the HTTP server (health, readiness and metrics answer at once; `/readyz` is
//! 503 until the bus is connected and every consumer is open), then connects the bus,
//! retrying an unreachable broker with backoff until shutdown. Then the service builds its
//! parts from what was connected and adds its `/v1` routes with [`Service::serve`]; every one
//! of them sits behind the one bearer-token check ([`crate::http::auth`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use clap::{Args as _, FromArgMatches as _};
use imagepipe_bus::{Bus, BusError, Consumer};
use tokio::task::JoinHandle;

use crate::backoff::ExponentialBackoff;
use crate::config::{ConfigArgs, ConfigError, Settings};
use crate::connect::{Unconnected, with_retry};
use crate::http::{ApiRoutes, HealthServer, HttpError, Readiness};
use crate::metrics::MetricsError;
use crate::shutdown::Shutdown;
use crate::telemetry::{self, Telemetry, TelemetryError};
use crate::worker::{LoopConfig, error_chain};

/// How long open HTTP connections (SSE watchers) may hold a stopping server up.
const HTTP_DRAIN: Duration = Duration::from_secs(5);

/// Readiness check names every service registers.
pub mod checks {
    /// The bus is connected.
    pub const BUS: &str = "bus";
    /// The service is not shutting down.
    pub const SHUTDOWN: &str = "shutdown";
    /// Every consumer the service opened is open (a Kafka group may take seconds to join).
    pub const CONSUMERS: &str = "consumers";
    /// The service's state store (Redis, when `store.kind = redis`) is connected; added by
    /// the services that have one ([`Service::connect`](super::Service::connect)).
    pub const STORE: &str = "store";
}

/// A service could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The configuration could not be loaded.
    #[error("loading the configuration")]
    Config(#[source] ConfigError),
    /// Logging and tracing could not be set up.
    #[error("setting up telemetry")]
    Telemetry(#[source] TelemetryError),
    /// SIGTERM/SIGINT handlers could not be installed.
    #[error("installing signal handlers")]
    Signals(#[source] std::io::Error),
    /// The metrics recorder could not be installed.
    #[error("installing the metrics recorder")]
    Metrics(#[source] MetricsError),
    /// The HTTP server could not start or failed.
    #[error("running the HTTP server")]
    Http(#[source] HttpError),
    /// The HTTP server task died.
    #[error("the HTTP server task failed")]
    HttpTask(#[source] tokio::task::JoinError),
    /// The bus could not be connected (other than the broker being unreachable, which is
    /// retried).
    #[error("connecting the bus")]
    Bus(#[source] BusError),
    /// Shutdown was requested before the bus connected.
    #[error("shut down before the bus connected")]
    Interrupted,
}

/// A started service: its settings, connected bus, shutdown signal and readiness checks, with
/// the HTTP server running.
pub struct Service {
    /// The settings it started with.
    pub settings: Settings,
    /// The connected bus.
    pub bus: Bus,
    /// Fires on SIGTERM or SIGINT (or whatever [`Service::start_with`] was given); pass it into
    /// `run` functions.
    pub shutdown: Shutdown,
    /// Readiness checks of `/readyz`; add the service's own.
    pub readiness: Readiness,
    api: ApiRoutes,
    telemetry: Option<Telemetry>,
    http_addr: SocketAddr,
    http_stop: Shutdown,
    http: JoinHandle<Result<(), HttpError>>,
}

impl Service {
    /// Starts service `name` (see the module docs), stopping on SIGTERM or SIGINT.
    pub async fn start(name: &str, settings: Settings) -> Result<Self, ServiceError> {
        let shutdown = Shutdown::on_signals().map_err(ServiceError::Signals)?;
        Self::start_with(name, settings, shutdown).await
    }

    /// Starts service `name` (see the module docs), stopping when `shutdown` fires: for
    /// services embedded in another process (`imagepipe run`, tests). Telemetry already set up
    /// by the process is kept.
    pub async fn start_with(name: &str, settings: Settings, shutdown: Shutdown) -> Result<Self, ServiceError> {
        settings.http.check_exposure().map_err(ServiceError::Config)?;
        let telemetry = match telemetry::init(name, &settings.log, &settings.telemetry) {
            Ok(telemetry) => Some(telemetry),
            Err(TelemetryError::AlreadyInstalled(_)) => None,
            Err(error) => return Err(ServiceError::Telemetry(error)),
        };
        let metrics = crate::metrics::install().map_err(ServiceError::Metrics)?;

        let readiness = Readiness::new();
        let connected: Arc<OnceLock<Bus>> = Arc::default();
        let bus_check = connected.clone();
        readiness.add(checks::BUS, move || bus_check.get().is_some_and(Bus::is_connected));
        let consumers_check = connected.clone();
        readiness.add(checks::CONSUMERS, move || consumers_check.get().is_some_and(Bus::consumers_open));
        let draining = shutdown.clone();
        readiness.add(checks::SHUTDOWN, move || !draining.is_triggered());

        let access = crate::http::Access::from_config(&settings.http).map_err(ServiceError::Config)?;
        let api = ApiRoutes::with_access(access);
        let server = HealthServer::new(readiness.clone(), metrics)
            .api(api.clone())
            .bind_with(settings.http.socket_addr(), settings.http.limits())
            .await
            .map_err(ServiceError::Http)?;
        let http_addr = server.local_addr();
        let http_stop = Shutdown::new();
        let http = tokio::spawn(server.serve(http_stop.clone()));

        let bus = match connect(&settings, &shutdown).await {
            Ok(bus) => bus,
            Err(error) => {
                http_stop.trigger();
                let _ = http.await;
                return Err(error);
            }
        };
        let _ = connected.set(bus.clone());
        tracing::info!(service = name, bus = ?settings.bus.kind, http = %http_addr, "service started");
        Ok(Self { settings, bus, shutdown, readiness, api, telemetry, http_addr, http_stop, http })
    }

    /// Serves `routes`, the service's `/v1` API, beside health and metrics and behind the
    /// token check. May be called more than once (`imagepipe run` serves every service's).
    pub fn serve(&self, routes: Router) {
        self.api.add(routes);
    }

    /// The route table [`Service::serve`] adds to, for answering `/v1` requests inside the
    /// process ([`ApiRoutes::call`]).
    pub fn api(&self) -> &ApiRoutes {
        &self.api
    }

    /// The address the HTTP server listens on.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Connects something the service needs besides the bus (a Redis-backed store) the way the
    /// bus is connected: while `open` fails with an error `retryable` accepts, it is retried
    /// with the broker backoff and a log line per attempt, and the readiness check `check`
    /// (named in `/readyz`) is false until it succeeds. `Ok(None)` when shutdown fired first
    /// (the service then stops cleanly); the first error not retried otherwise.
    pub async fn connect<T, E, F, Fut>(
        &self,
        check: &'static str,
        retryable: impl Fn(&E) -> bool,
        open: F,
    ) -> Result<Option<T>, E>
    where
        E: std::error::Error + 'static,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let connected = Arc::new(AtomicBool::new(false));
        let ready = connected.clone();
        self.readiness.add(check, move || ready.load(Ordering::Acquire));
        match with_retry(check, ExponentialBackoff::broker_reconnect(), &self.shutdown, retryable, open).await {
            Ok(value) => {
                connected.store(true, Ordering::Release);
                Ok(Some(value))
            }
            Err(Unconnected::Interrupted) => Ok(None),
            Err(Unconnected::Failed(error)) => Err(error),
        }
    }

    /// Opens a consumer on `queue` with the `worker` settings.
    pub async fn consume(&self, queue: &str) -> Result<Box<dyn Consumer>, BusError> {
        self.bus.queues.consume(queue, self.settings.worker.consumer_config()).await
    }

    /// Opens a consumer on every priority lane of the stage queue `queue`, read with the
    /// `worker.priority_shares`.
    pub async fn consume_lanes(&self, queue: &str) -> Result<Box<dyn Consumer>, BusError> {
        crate::worker::consume_lanes(&self.bus, queue, &self.settings.worker).await
    }

    /// The worker loop settings for the worker called `name`, from the `worker` settings.
    pub fn loop_config(&self, name: &str) -> LoopConfig {
        LoopConfig::from_settings(name, &self.settings.worker)
    }

    /// Flushes the bus client, stops the HTTP server (after the service's own work has
    /// finished; connections still open after a few seconds, such as event streams, are
    /// closed) and flushes traces.
    pub async fn stop(mut self) -> Result<(), ServiceError> {
        if let Err(e) = self.bus.queues.flush().await {
            tracing::warn!(error = %e, "flushing the bus client; unflushed acks mean redeliveries");
        }
        self.http_stop.trigger();
        let served = match tokio::time::timeout(HTTP_DRAIN, &mut self.http).await {
            Ok(served) => served,
            Err(_) => {
                tracing::info!("closing HTTP connections still open after {HTTP_DRAIN:?}");
                self.http.abort();
                Ok(Ok(()))
            }
        };
        if let Some(telemetry) = self.telemetry
            && let Err(e) = tokio::task::spawn_blocking(move || telemetry.shutdown()).await
        {
            tracing::warn!(error = %e, "flushing traces");
        }
        served.map_err(ServiceError::HttpTask)?.map_err(ServiceError::Http)
    }
}

/// Connects the bus; an unreachable broker is retried with backoff until `shutdown`.
async fn connect(settings: &Settings, shutdown: &Shutdown) -> Result<Bus, ServiceError> {
    let unreachable = |error: &BusError| matches!(error, BusError::Connect { .. });
    let bus = settings.bus_config();
    with_retry("the broker", ExponentialBackoff::broker_reconnect(), shutdown, unreachable, || Bus::connect(&bus))
        .await
        .map_err(|gave| match gave {
            Unconnected::Failed(error) => ServiceError::Bus(error),
            Unconnected::Interrupted => ServiceError::Interrupted,
        })
}

/// What a service binary runs once started: its own work, until the service's shutdown.
pub type ServeFuture<'a, E> = Pin<Box<dyn Future<Output = Result<(), E>> + Send + 'a>>;

/// The whole `main` of a service binary called `imagepipe-<name>`: parses `--config` (with
/// `about` as the help text), loads the settings, [`Service::start`]s, runs `serve` on the
/// started service, and [`Service::stop`]s. Exits 0, or prints the error with every cause on
/// one line (`imagepipe-<name>: …`) and exits 1.
pub fn main<E, F>(name: &'static str, about: &'static str, serve: F) -> ExitCode
where
    E: std::error::Error + Send + Sync + 'static,
    F: for<'a> FnOnce(&'a Service) -> ServeFuture<'a, E>,
{
    let command = clap::Command::new(name).version(env!("CARGO_PKG_VERSION")).about(about);
    let matches = ConfigArgs::augment_args(command).get_matches();
    let args = ConfigArgs::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return exit_code(name, Err::<(), _>(e)),
    };
    let outcome: Result<(), Box<dyn std::error::Error + Send + Sync>> = runtime.block_on(async move {
        let settings = args.load().map_err(ServiceError::Config)?;
        let service = Service::start(name, settings).await?;
        let served = serve(&service).await;
        let stopped = service.stop().await;
        served?;
        Ok(stopped?)
    });
    exit_code(name, outcome.map_err(ErrorChain))
}

/// Prints an error with every cause.
struct ErrorChain(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for ErrorChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&error_chain(self.0.as_ref()))
    }
}

/// How a service binary ends: status 0, or its error (`{:#}`, every cause on one line for
/// `anyhow`) as `imagepipe-<service>: …` and status 1.
pub fn exit_code<E: std::fmt::Display>(service: &str, outcome: Result<(), E>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("imagepipe-{service}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use axum::routing::get;
    use tokio::net::TcpStream;

    use super::*;
    use crate::http::testing;

    async fn status_and_body(addr: SocketAddr, path: &str) -> (u16, String) {
        let answer = testing::get(addr, path).await;
        (answer.status, answer.body)
    }

    async fn with_token(addr: SocketAddr, path: &str, token: &str) -> (u16, String) {
        let answer = testing::request(addr, "GET", path, Some(token)).await;
        (answer.status, answer.body)
    }

    #[tokio::test]
    async fn a_service_starts_serves_turns_unready_on_shutdown_and_stops() {
        let mut settings = Settings::default();
        settings.http.bind = IpAddr::V4(Ipv4Addr::LOCALHOST);
        settings.http.port = 0;
        let service = Service::start_with("service-test", settings, Shutdown::new()).await.unwrap();
        let addr = service.http_addr();
        assert_ne!(addr.port(), 0);

        assert_eq!(status_and_body(addr, "/readyz").await, (503, "not ready: consumers\n".into()), "no consumer yet");
        assert_eq!(status_and_body(addr, "/v1/ping").await.0, 404, "no routes served yet");
        service.serve(Router::new().route("/v1/ping", get(|| async { "pong" })));
        assert_eq!(status_and_body(addr, "/v1/ping").await, (200, "pong".into()));
        let consumer = service.consume("tasks.service-test").await.unwrap();
        assert!(consumer.fetch(1, Duration::from_millis(10)).await.unwrap().is_empty());
        assert_eq!(status_and_body(addr, "/readyz").await, (200, "ready\n".into()));

        service.shutdown.trigger();
        assert_eq!(status_and_body(addr, "/readyz").await, (503, "not ready: shutdown\n".into()));
        assert_eq!(status_and_body(addr, "/healthz").await.0, 200, "alive while draining");

        tokio::time::timeout(Duration::from_secs(10), service.stop()).await.unwrap().unwrap();
        assert!(TcpStream::connect(addr).await.is_err());
    }

    const TOKEN: &str = "service-test-token-0123456789abcdef";

    #[tokio::test]
    async fn a_short_token_refuses_to_start() {
        let mut settings = Settings::default();
        settings.http.port = 0;
        settings.http.auth_token = Some("t0ken".to_owned().into());
        let error = Service::start_with("service-test", settings, Shutdown::new()).await.err().expect("refused");
        let ServiceError::Config(error) = error else { panic!("{error}") };
        assert_eq!(error.key(), Some("http.auth_token"), "{error}");
    }

    #[tokio::test]
    async fn with_a_token_every_v1_path_needs_it_and_health_does_not() {
        let mut settings = Settings::default();
        settings.http.bind = IpAddr::V4(Ipv4Addr::LOCALHOST);
        settings.http.port = 0;
        settings.http.auth_token = Some(TOKEN.to_owned().into());
        let service = Service::start_with("service-test", settings, Shutdown::new()).await.unwrap();
        service.serve(Router::new().route("/v1/ping", get(|| async { "pong" })));
        let addr = service.http_addr();

        for path in ["/v1/ping", "/v1/unknown", "/v1"] {
            let (status, body) = status_and_body(addr, path).await;
            assert_eq!(status, 401, "{path}");
            assert!(body.contains(r#""error":"unauthorized""#), "{path}: {body}");
            assert_eq!(with_token(addr, path, "wrong").await.0, 401, "{path}");
        }
        assert_eq!(with_token(addr, "/v1/ping", TOKEN).await, (200, "pong".into()));
        assert_eq!(with_token(addr, "/v1/unknown", TOKEN).await.0, 404);
        for open in ["/healthz", "/metrics"] {
            assert_eq!(status_and_body(addr, open).await.0, 200, "{open}");
        }
        service.shutdown.trigger();
        service.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_store_is_retried_with_readiness_false_until_it_connects() {
        use std::sync::atomic::AtomicU32;

        let mut settings = Settings::default();
        settings.http.bind = IpAddr::V4(Ipv4Addr::LOCALHOST);
        settings.http.port = 0;
        let service = Service::start_with("service-test", settings, Shutdown::new()).await.unwrap();
        let addr = service.http_addr();
        let _consumer = service.consume("tasks.service-store-test").await.unwrap();
        assert_eq!(status_and_body(addr, "/readyz").await.0, 200);

        let (up, attempts) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU32::new(0)));
        let open = || {
            let n = attempts.fetch_add(1, Ordering::SeqCst);
            let up = up.load(Ordering::SeqCst);
            async move { if up { Ok(n) } else { Err(std::io::Error::other("connection refused")) } }
        };
        let meanwhile = async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while attempts.load(Ordering::SeqCst) < 3 {
                assert!(tokio::time::Instant::now() < deadline, "no retries");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert_eq!(status_and_body(addr, "/readyz").await, (503, "not ready: store\n".into()));
            up.store(true, Ordering::SeqCst);
        };
        let (opened, ()) = tokio::join!(service.connect(checks::STORE, |_: &std::io::Error| true, open), meanwhile);
        assert!(opened.unwrap().is_some_and(|n| n >= 3), "connected after the failed attempts");
        assert_eq!(status_and_body(addr, "/readyz").await, (200, "ready\n".into()));

        let refused = service.connect(
            "other",
            |_: &std::io::Error| false,
            || async { Err::<(), _>(std::io::Error::other("bad")) },
        );
        assert!(refused.await.is_err(), "an error not retried is returned at once");
        service.shutdown.trigger();
        let interrupted = service.connect(
            "late",
            |_: &std::io::Error| true,
            || async { Err::<(), _>(std::io::Error::other("down")) },
        );
        assert!(interrupted.await.unwrap().is_none(), "shutdown ends the retries");
        service.stop().await.unwrap();
    }

    #[tokio::test]
    async fn a_bus_that_cannot_be_built_fails_the_start_and_frees_the_port() {
        let mut settings = Settings::default();
        settings.http.bind = IpAddr::V4(Ipv4Addr::LOCALHOST);
        settings.http.port = 0;
        settings.bus.prefix = "not valid!".into();
        let err = Service::start_with("service-test", settings, Shutdown::new()).await.err().expect("bad bus config");
        assert!(matches!(err, ServiceError::Bus(BusError::Invalid(_))), "{err:?}");
    }
}
