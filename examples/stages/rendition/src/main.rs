//! Binary of the rendition stage: consume `<prefix>.tasks.rendition` until SIGTERM (see
//! [`imagepipe_stage_rendition::run`]).

use std::process::ExitCode;

use clap::Parser;
use imagepipe_runtime::service::exit_code;
use imagepipe_runtime::{ConfigArgs, Service};
use imagepipe_stage_rendition::{RenditionArgs, SERVICE, run};

/// imagepipe's example stage in Rust: watermarked renditions of each task's image, kept in the
/// blob store (configure the coordinators' `pipeline.stages` with a `rendition` entry).
#[derive(Debug, Parser)]
#[command(name = "imagepipe-stage-rendition", version)]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    rendition: RenditionArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A name that cannot be a stage's fails before the broker is waited for.
    if let Err(e) = imagepipe_contracts::StageName::check(&cli.rendition.stage) {
        return exit_code(SERVICE, Err(format!("--stage: {e}")));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return exit_code(SERVICE, Err(e)),
    };
    let outcome: Result<(), Box<dyn std::error::Error + Send + Sync>> = runtime.block_on(async move {
        let settings = cli.config.load()?;
        let service = Service::start(SERVICE, settings).await?;
        let served = run(
            service.bus.clone(),
            &service.settings,
            &cli.rendition.stage,
            cli.rendition.spec(),
            service.shutdown.clone(),
        )
        .await;
        let stopped = service.stop().await;
        served?;
        Ok(stopped?)
    });
    exit_code(SERVICE, outcome.map_err(|e| imagepipe_runtime::error_chain(e.as_ref())))
}
