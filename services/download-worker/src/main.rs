//! Binary of the imagepipe download worker: load settings, start telemetry and the health
//! server, connect the bus, consume `tasks.download` until SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use imagepipe_download_worker::{SERVICE, run};
use imagepipe_runtime::{ConfigArgs, Service};

/// The imagepipe download worker.
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
    let service = Service::start(SERVICE, settings, axum::Router::new()).await?;
    let outcome = run(service.bus.clone(), &service.settings, service.shutdown.clone()).await;
    service.stop().await?;
    Ok(outcome?)
}
