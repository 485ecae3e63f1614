//! Binary of the imagepipe tag indexer: load settings, open the index, start telemetry and the
//! HTTP server (health, metrics, `/v1/search`), connect the bus, index until SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use imagepipe_runtime::{ConfigArgs, Service};
use imagepipe_tag_indexer_worker::{SERVICE, api, open_index, run};

/// The imagepipe tag indexer.
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
    let index = open_index(&settings).await?;
    let service = Service::start(SERVICE, settings, api::routes(index.clone())).await?;
    let outcome = run(service.bus.clone(), &service.settings, index, service.shutdown.clone()).await;
    service.stop().await?;
    Ok(outcome?)
}
