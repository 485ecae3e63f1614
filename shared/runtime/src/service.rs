//! The start-up every service shares, so that a `main` stays a few lines:
//!
//! ```no_run
//! # use imagepipe_runtime::{ConfigArgs, service::Service, worker::{Handler, Outcome, Worker}};
//! # struct Download;
//! # #[async_trait::async_trait]
//! # impl Handler for Download {
//! #     async fn handle(&self, _: &imagepipe_bus::Delivery) -> Outcome { Outcome::Ack }
//! # }
//! # async fn main_body(args: ConfigArgs) -> Result<(), Box<dyn std::error::Error>> {
//! let settings = args.load()?;
//! let service = Service::start("download-worker", settings, axum::Router::new()).await?;
//! let consumer = service.consume("tasks.download").await?;
//! Worker::new(consumer, Download, service.worker_config("tasks.download")).run(service.shutdown.clone()).await?;
//! service.stop().await?;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::Router;
use imagepipe_bus::{Bus, BusError, Consumer};
use tokio::task::JoinHandle;

use crate::config::Settings;
use crate::http::{HealthServer, HttpError, Readiness};
use crate::metrics::MetricsError;
use crate::shutdown::Shutdown;
use crate::telemetry::{self, Telemetry, TelemetryError};
use crate::worker::WorkerConfig;

/// Readiness check names every service registers.
pub mod checks {
    /// The bus is connected.
    pub const BUS: &str = "bus";
    /// The service is not shutting down.
    pub const SHUTDOWN: &str = "shutdown";
    /// Every consumer the service opened is open (a Kafka group may take seconds to join).
    pub const CONSUMERS: &str = "consumers";
}

/// A service could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
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
/// the HTTP server (health, readiness, metrics and the service's routes) running.
pub struct Service {
    /// The settings it started with.
    pub settings: Settings,
    /// The connected bus.
    pub bus: Bus,
    /// Fires on SIGTERM or SIGINT; pass it into `run` functions.
    pub shutdown: Shutdown,
    /// Readiness checks of `/readyz`; add the service's own.
    pub readiness: Readiness,
    telemetry: Option<Telemetry>,
    http_addr: SocketAddr,
    http_stop: Shutdown,
    http: JoinHandle<Result<(), HttpError>>,
}

impl Service {
    /// Sets up telemetry (unless the process already has), metrics and signal handling,
    /// starts the HTTP server on `http.bind:http.port` with `routes` merged in, then connects
    /// the bus, retrying an unreachable broker with backoff until shutdown.
    pub async fn start(name: &str, settings: Settings, routes: Router) -> Result<Self, ServiceError> {
        let telemetry = match telemetry::init(name, &settings.log, &settings.telemetry) {
            Ok(telemetry) => Some(telemetry),
            Err(TelemetryError::AlreadyInstalled(_)) => None,
            Err(error) => return Err(ServiceError::Telemetry(error)),
        };
        let metrics = crate::metrics::install().map_err(ServiceError::Metrics)?;
        let shutdown = Shutdown::on_signals().map_err(ServiceError::Signals)?;

        let readiness = Readiness::new();
        let connected: Arc<OnceLock<Bus>> = Arc::default();
        let bus_check = connected.clone();
        readiness.add(checks::BUS, move || bus_check.get().is_some_and(Bus::is_connected));
        let consumers_check = connected.clone();
        readiness.add(checks::CONSUMERS, move || consumers_check.get().is_some_and(Bus::consumers_open));
        let draining = shutdown.clone();
        readiness.add(checks::SHUTDOWN, move || !draining.is_triggered());

        let server = HealthServer::new(readiness.clone(), metrics)
            .merge(routes)
            .bind(settings.http.socket_addr())
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
        Ok(Self { settings, bus, shutdown, readiness, telemetry, http_addr, http_stop, http })
    }

    /// The address the HTTP server listens on.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Opens a consumer on `queue` with the `worker` settings.
    pub async fn consume(&self, queue: &str) -> Result<Box<dyn Consumer>, BusError> {
        self.bus.queues.consume(queue, self.settings.worker.consumer_config()).await
    }

    /// The worker loop settings for the worker called `name`, from the `worker` settings.
    pub fn worker_config(&self, name: &str) -> WorkerConfig {
        WorkerConfig::from_settings(name, &self.settings.worker)
    }

    /// Stops the HTTP server (after the service's own work has finished) and flushes traces.
    pub async fn stop(self) -> Result<(), ServiceError> {
        self.http_stop.trigger();
        let served = self.http.await;
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
    let mut attempts = crate::backoff::ExponentialBackoff::broker_reconnect().attempts();
    loop {
        match Bus::connect(&settings.bus).await {
            Ok(bus) => return Ok(bus),
            Err(error @ BusError::Connect { .. }) => {
                let delay = attempts.next_delay();
                tracing::warn!(error = %crate::worker::error_chain(&error), retry_in = ?delay,
                    "broker unreachable; retrying");
                tokio::select! {
                    () = shutdown.wait() => return Err(ServiceError::Interrupted),
                    () = tokio::time::sleep(delay) => {}
                }
            }
            Err(error) => return Err(ServiceError::Bus(error)),
        }
    }
}

/// How a service binary ends: status 0, or its error with every cause on one line
/// (`imagepipe-<service>: …`) and status 1.
pub fn exit_code<E: std::fmt::Display>(service: &str, outcome: Result<(), E>) -> std::process::ExitCode {
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("imagepipe-{service}: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    async fn status_and_body(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        (head.split(' ').nth(1).unwrap().parse().unwrap(), body.to_owned())
    }

    #[tokio::test]
    async fn a_service_starts_serves_turns_unready_on_shutdown_and_stops() {
        let mut settings = Settings::default();
        settings.http.bind = IpAddr::V4(Ipv4Addr::LOCALHOST);
        settings.http.port = 0;
        let routes = Router::new().route("/v1/ping", get(|| async { "pong" }));
        let service = Service::start("service-test", settings, routes).await.unwrap();
        let addr = service.http_addr();
        assert_ne!(addr.port(), 0);

        assert_eq!(status_and_body(addr, "/readyz").await, (503, "not ready: consumers\n".into()), "no consumer yet");
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

    #[tokio::test]
    async fn a_bus_that_cannot_be_built_fails_the_start_and_frees_the_port() {
        let mut settings = Settings::default();
        settings.http.bind = IpAddr::V4(Ipv4Addr::LOCALHOST);
        settings.http.port = 0;
        settings.bus.prefix = "not valid!".into();
        let err = Service::start("service-test", settings, Router::new()).await.err().expect("bad bus config");
        assert!(matches!(err, ServiceError::Bus(BusError::Invalid(_))), "{err:?}");
    }
}
