//! Binary of the imagepipe AI worker: load settings and the model (a missing model names
//! `scripts/prepare-model.sh`), start telemetry and the health server, connect the bus,
//! consume `tasks.ai` until SIGTERM.

use std::process::ExitCode;

use clap::Parser;
use imagepipe_ai_worker::{Classifier, SERVICE, run};
use imagepipe_runtime::{ConfigArgs, Service};

/// The imagepipe AI worker.
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
    let classifier = Classifier::load(&settings.ai).await?;
    let service = Service::start(SERVICE, settings, axum::Router::new()).await?;
    tracing::info!(model = classifier.model().name(), dir = %service.settings.ai.model_dir.display(), "model ready");
    let outcome = run(service.bus.clone(), &service.settings, classifier, service.shutdown.clone()).await;
    service.stop().await?;
    Ok(outcome?)
}
