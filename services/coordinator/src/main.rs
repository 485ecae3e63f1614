//! Binary of the imagepipe coordinator: load settings, start telemetry and the HTTP server
//! (health, metrics, API), connect bus and store, run until SIGTERM.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use imagepipe_coordinator::app::{Coordinator, open_store};
use imagepipe_runtime::ConfigArgs;
use imagepipe_runtime::clock::SystemClock;
use imagepipe_runtime::http::{HealthServer, Readiness};
use imagepipe_runtime::service::checks;
use imagepipe_runtime::shutdown::Shutdown;

/// The imagepipe task coordinator.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    config: ConfigArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    imagepipe_runtime::service::exit_code("coordinator", run(Args::parse()).await)
}

async fn run(args: Args) -> anyhow::Result<()> {
    let settings = args.config.load()?;
    let telemetry = imagepipe_runtime::telemetry::init("coordinator", &settings.log, &settings.telemetry)?;
    let metrics = imagepipe_runtime::metrics::install()?;
    let shutdown = Shutdown::on_signals().context("installing signal handlers")?;

    let bus = imagepipe_bus::Bus::connect(&settings.bus).await.context("connecting the bus")?;
    let store = open_store(&settings).await.context("opening the store")?;
    let coordinator = Coordinator::new(&settings, store, bus.clone(), Arc::new(SystemClock));

    let readiness = Readiness::new();
    let consuming = bus.clone();
    readiness.add(checks::BUS, move || bus.is_connected());
    readiness.add(checks::CONSUMERS, move || consuming.consumers_open());
    let draining = shutdown.clone();
    readiness.add(checks::SHUTDOWN, move || !draining.is_triggered());
    let server =
        HealthServer::new(readiness, metrics).merge(coordinator.routes()).bind(settings.http.socket_addr()).await?;
    let http_stop = Shutdown::new();
    let http = tokio::spawn(server.serve(http_stop.clone()));

    let outcome = coordinator.run(shutdown).await;
    http_stop.trigger();
    http.await.context("HTTP server task")??;
    telemetry.shutdown();
    Ok(outcome?)
}
