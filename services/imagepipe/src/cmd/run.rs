//! `imagepipe run`: every service in one process until SIGTERM or Ctrl-C.

use std::process::ExitCode;

use anyhow::Context;
use imagepipe::Pipeline;
use imagepipe_runtime::{ConfigArgs, Shutdown};

/// Runs the pipeline with the loaded configuration until a signal; once started, prints where
/// the API and the dashboard are and what it runs on.
pub async fn run(config: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let settings = config.load().context("loading the configuration")?;
    let telemetry = imagepipe_runtime::telemetry::init("imagepipe", &settings.log, &settings.telemetry)?;
    let stop = Shutdown::on_signals().context("installing signal handlers")?;
    let pipeline = Pipeline::start(settings).await.context("starting the pipeline")?;
    // One write: the services' own log lines cannot land between its rows.
    let summary = pipeline.summary();
    let width = summary.iter().map(|(what, _)| what.len()).max().unwrap_or(0);
    let mut text = String::from("imagepipe: every service running (Ctrl-C stops)\n");
    for (what, value) in summary {
        text.push_str(&format!("  {what:<width$}  {value}\n"));
    }
    eprint!("{text}");
    let outcome = pipeline.run_until(stop).await;
    telemetry.shutdown();
    outcome?;
    Ok(ExitCode::SUCCESS)
}
