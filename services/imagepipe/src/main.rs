//! The `imagepipe` command line: every operator action, and `imagepipe run` (every service in
//! one process).

mod cmd;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use imagepipe::ApiClient;
use imagepipe::client::DEFAULT_API;
use imagepipe_runtime::ConfigArgs;

/// Event-driven image-processing pipeline.
#[derive(Debug, Parser)]
#[command(name = "imagepipe", version, about)]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(subcommand)]
    command: Command,
}

/// Where the HTTP API is, for the commands that talk to it.
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// Base URL of the imagepipe API.
    #[arg(long, global = true, env = "IMAGEPIPE_API", default_value = DEFAULT_API)]
    api: String,
    /// Bearer token the API requires (its `http.auth_token`).
    #[arg(long, global = true, env = "IMAGEPIPE_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

impl ApiArgs {
    fn client(&self) -> anyhow::Result<ApiClient> {
        Ok(ApiClient::new(&self.api, self.token.clone())?)
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every service in one process (in-memory bus, embedded store) with the API on http.port.
    Run,
    /// Run the pipeline over the bundled sample photos and print a table.
    Demo(cmd::demo::DemoArgs),
    /// Submit URLs, image files or directories of images as tasks.
    Submit(cmd::submit::SubmitArgs),
    /// Show a task's state, source, times, steps and results.
    Status(cmd::status::StatusArgs),
    /// List tasks, oldest first, by state, label and creation time.
    List(cmd::list::ListArgs),
    /// Show every transition of a task, with its time.
    History(cmd::history::HistoryArgs),
    /// Cancel a task (a running step stops within a second).
    Cancel(cmd::cancel::CancelArgs),
    /// Pause a task at its next step boundary.
    Pause(cmd::pause::PauseArgs),
    /// Resume a paused task.
    Resume(cmd::pause::PauseArgs),
    /// Show the stage queues: depth per priority lane, in flight, oldest wait, rate, consumers.
    Queues(cmd::queues::QueuesArgs),
    /// Pause, resume or resize a stage queue across every replica.
    Queue(cmd::queues::QueueArgs),
    /// Run a step again (and the ones after it) for finished tasks, as a new generation.
    Reprocess(cmd::reprocess::ReprocessArgs),
    /// Save a task's thumbnail to a file.
    Thumbnail(cmd::thumbnail::ThumbnailArgs),
    /// Tail events (Server-Sent Events of `/v1/events`).
    Watch(cmd::watch::WatchArgs),
    /// Find tasks by tag.
    Search(cmd::search::SearchArgs),
    /// Find the images most similar to a task's or an image file's.
    Similar(cmd::similar::SimilarArgs),
    /// List groups of near-duplicate images.
    Duplicates(cmd::similar::DuplicatesArgs),
    /// Manage the similarity index (rebuild it from the event stream).
    Similarity(cmd::similar::SimilarityArgs),
    /// Show pipeline statistics.
    Stats(cmd::stats::StatsArgs),
    /// Inspect, replay or purge dead letters.
    Dlq(cmd::dlq::DlqArgs),
    /// Measure the pipeline's throughput, latency, broker messages, CPU and memory.
    Bench(cmd::bench::BenchArgs),
    /// Probe a service's `/readyz` (container health checks): exit 0 only on 200.
    Healthcheck(cmd::healthcheck::HealthcheckArgs),
    /// Check the configuration, broker, store, blob store, model and allow-lists; print each
    /// problem with its fix (exit 1 if one fails).
    Doctor(cmd::doctor::DoctorArgs),
    /// Show the effective configuration.
    Config {
        #[command(subcommand)]
        action: cmd::config::ConfigAction,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("imagepipe: {}", one_line(&e));
            return ExitCode::from(2);
        }
    };
    match run(cli).await {
        Ok(code) => code,
        Err(err) => {
            // Every cause once (a cause that repeats its error's text is left out).
            eprintln!("imagepipe: {}", imagepipe_runtime::error_chain(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// A usage error on one line, as every other error: clap's lines joined, without its `error:`.
fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let lines: Vec<&str> = rendered.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    lines.join(" ").trim_start_matches("error: ").to_owned()
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run => cmd::run::run(&cli.config).await,
        Command::Demo(args) => cmd::demo::run(&cli.config, args).await,
        Command::Submit(args) => cmd::submit::run(args).await,
        Command::Status(args) => cmd::status::run(args).await,
        Command::List(args) => cmd::list::run(args).await,
        Command::History(args) => cmd::history::run(args).await,
        Command::Cancel(args) => cmd::cancel::run(args).await,
        Command::Pause(args) => cmd::pause::run(args, true).await,
        Command::Resume(args) => cmd::pause::run(args, false).await,
        Command::Queues(args) => cmd::queues::run_queues(args).await,
        Command::Queue(args) => cmd::queues::run_queue(args).await,
        Command::Reprocess(args) => cmd::reprocess::run(args).await,
        Command::Thumbnail(args) => cmd::thumbnail::run(args).await,
        Command::Watch(args) => cmd::watch::run(args).await,
        Command::Search(args) => cmd::search::run(args).await,
        Command::Similar(args) => cmd::similar::run_similar(args).await,
        Command::Duplicates(args) => cmd::similar::run_duplicates(args).await,
        Command::Similarity(args) => cmd::similar::run_similarity(args).await,
        Command::Stats(args) => cmd::stats::run(args).await,
        Command::Dlq(args) => cmd::dlq::run(args).await,
        Command::Bench(args) => cmd::bench::run(&cli.config, args).await,
        Command::Healthcheck(args) => cmd::healthcheck::run(&cli.config, args).await,
        Command::Doctor(args) => cmd::doctor::run(&cli.config, args).await,
        Command::Config { action } => cmd::config::run(&cli.config, action),
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_usage_error_is_one_line() {
        for argv in [&["imagepipe", "list", "--since", "yesterday"][..], &["imagepipe", "submit"]] {
            let error = Cli::try_parse_from(argv).unwrap_err();
            let line = super::one_line(&error);
            assert!(!line.contains('\n') && !line.starts_with("error"), "{line}");
            assert!(line.contains("yesterday") || line.contains("<SOURCES>"), "{line}");
        }
    }
}
