//! Binary of the imagepipe analytics worker: load settings, open the store, start telemetry and
//! the HTTP server (health, metrics, `/v1/stats`), connect the bus, count until SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use imagepipe_analytics_worker::{SERVICE, api, open_store, run};
use imagepipe_runtime::{ConfigArgs, Service};

/// The imagepipe analytics worker.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    config: ConfigArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    imagepipe_runtime::service::exit_code(SERVICE, main_body(Args::parse()).await)
}

async fn main_body(args: Args) -> anyhow::Result<()> {
    let settings = args.config.load()?;
    let store = open_store(&settings).await?;
    let service = Service::start(SERVICE, settings, api::routes(store.clone())).await?;
    let outcome = run(service.bus.clone(), &service.settings, store, service.shutdown.clone()).await;
    service.stop().await?;
    Ok(outcome?)
}
