//! The `imagepipe` command line: every operator action, and `imagepipe run` (every service in
//! one process).

mod cmd;

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use imagepipe::ApiClient;
use imagepipe::client::DEFAULT_API;
use imagepipe_runtime::ConfigArgs;

/// Event-driven image-processing pipeline.
#[derive(Debug, Parser)]
#[command(name = "imagepipe", version, about)]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    command: Command,
}

/// Where the HTTP API is, for the commands that talk to it. Global: before or after the
/// subcommand.
#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// Base URL of the imagepipe API (the commands that talk to it).
    #[arg(long, global = true, env = "IMAGEPIPE_API", default_value = DEFAULT_API, value_parser = parse_api)]
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

/// `--api`: an http(s) URL, refused as an argument mistake otherwise.
fn parse_api(s: &str) -> Result<String, String> {
    imagepipe::client::base_url(s).map(|_| s.to_owned()).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every service in one process (in-memory bus, embedded store) with the API on http.port.
    ///
    /// The API and the dashboard listen on http.bind:http.port, 127.0.0.1:8080 by default
    /// (IMAGEPIPE_HTTP__PORT=9000 moves it). The services talk over
    /// bus.kind (IMAGEPIPE_BUS__KIND): memory by default, or nats or kafka (bus.nats.url,
    /// bus.kafka.brokers) to share a broker with other processes; the tasks are kept in
    /// store.kind: embedded files under store.path (IMAGEPIPE_STORE__PATH, one process at a time)
    /// by default, or redis. The start prints the address, store, bus, model and dashboard;
    /// logs go to stderr at log.filter (RUST_LOG overrides it).
    Run,
    /// Run the pipeline over the bundled sample photos and print a table.
    Demo(cmd::demo::DemoArgs),
    /// Submit URLs, image files or directories of images as tasks.
    Submit(cmd::submit::SubmitArgs),
    /// Show a task's state, source, times, steps and results.
    Status(cmd::status::StatusArgs),
    /// List tasks, newest first, by state, label and creation time.
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
    /// Show the coordinator replicas, the shards each owns and the recent handovers.
    Cluster(cmd::cluster::ClusterArgs),
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
    /// Answer the download, metadata and AI queues at once with the bench's no-op stages, on
    /// the configured bus, until SIGTERM: the end-to-end tests measure coordinators with it.
    #[command(hide = true)]
    NoopStages,
}

impl Command {
    /// Whether the command reads the configuration (`--config`) rather than talking to the
    /// API (`--api`, `--token`).
    fn reads_config(&self) -> bool {
        matches!(
            self,
            Command::Run
                | Command::Demo(_)
                | Command::Bench(_)
                | Command::Healthcheck(_)
                | Command::Doctor(_)
                | Command::Config { .. }
                | Command::NoopStages
        )
    }
}

/// A global option given on the command line to a command it means nothing to: the mistake,
/// or `None`.
fn misplaced(cli: &Cli, matches: &ArgMatches) -> Option<String> {
    let given = |id: &str| matches.value_source(id) == Some(ValueSource::CommandLine);
    let mut path = vec!["imagepipe"];
    let mut sub = matches.subcommand();
    while let Some((name, next)) = sub {
        path.push(name);
        sub = next.subcommand();
    }
    let command = path.join(" ");
    if cli.command.reads_config() {
        let flag = ["api", "token"].into_iter().find(|id| given(id))?;
        Some(format!(
            "--{flag} does not apply to `{command}`: it reads the configuration (--config FILE or IMAGEPIPE_CONFIG, IMAGEPIPE_<SECTION>__<KEY> variables), not the API"
        ))
    } else if given("config") {
        Some(format!(
            "--config does not apply to `{command}`: it talks to the API, set with --api URL or IMAGEPIPE_API (and --token or IMAGEPIPE_TOKEN)"
        ))
    } else {
        None
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let parsed = Cli::command().try_get_matches().and_then(|matches| Ok((Cli::from_arg_matches(&matches)?, matches)));
    let cli = match parsed {
        Ok((cli, matches)) => match misplaced(&cli, &matches) {
            None => cli,
            Some(mistake) => {
                eprintln!("imagepipe: {mistake}");
                return ExitCode::from(2);
            }
        },
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // `imagepipe`, `imagepipe dlq`: the help, on stderr.
            let _ = e.print();
            return ExitCode::from(2);
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

/// A usage error on one line, as every other error: clap's message and tips, without its
/// `error:`, and the help to read instead of the usage block (`see `imagepipe submit --help``).
fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let mut said = Vec::new();
    let mut command = None;
    for line in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(usage) = line.strip_prefix("Usage:") {
            let words = usage.split_whitespace().take_while(|w| !w.starts_with(['[', '<', '-']));
            command = Some(words.collect::<Vec<_>>().join(" "));
        } else if !line.starts_with("For more information") && command.is_none() {
            said.push(line.trim_start_matches("error: "));
        }
    }
    // A line ending in `:` introduces the next (`…not provided: <SOURCES>...`); tips are apart.
    let mut line = String::new();
    for part in said {
        if !line.is_empty() {
            line.push_str(if line.ends_with(':') { " " } else { "; " });
        }
        line.push_str(part);
    }
    if let Some(command) = command.filter(|c| !c.is_empty()) {
        line.push_str(&format!(" (see `{command} --help`)"));
    }
    line
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run => cmd::run::run(&cli.config).await,
        Command::Demo(args) => cmd::demo::run(&cli.config, args).await,
        Command::Submit(args) => cmd::submit::run(&cli.api, args).await,
        Command::Status(args) => cmd::status::run(&cli.api, args).await,
        Command::List(args) => cmd::list::run(&cli.api, args).await,
        Command::History(args) => cmd::history::run(&cli.api, args).await,
        Command::Cancel(args) => cmd::cancel::run(&cli.api, args).await,
        Command::Pause(args) => cmd::pause::run(&cli.api, args, true).await,
        Command::Resume(args) => cmd::pause::run(&cli.api, args, false).await,
        Command::Queues(args) => cmd::queues::run_queues(&cli.api, args).await,
        Command::Queue(args) => cmd::queues::run_queue(&cli.api, args).await,
        Command::Reprocess(args) => cmd::reprocess::run(&cli.api, args).await,
        Command::Thumbnail(args) => cmd::thumbnail::run(&cli.api, args).await,
        Command::Watch(args) => cmd::watch::run(&cli.api, args).await,
        Command::Search(args) => cmd::search::run(&cli.api, args).await,
        Command::Similar(args) => cmd::similar::run_similar(&cli.api, args).await,
        Command::Duplicates(args) => cmd::similar::run_duplicates(&cli.api, args).await,
        Command::Similarity(args) => cmd::similar::run_similarity(&cli.api, args).await,
        Command::Stats(args) => cmd::stats::run(&cli.api, args).await,
        Command::Cluster(args) => cmd::cluster::run(&cli.api, args).await,
        Command::Dlq(args) => cmd::dlq::run(&cli.api, args).await,
        Command::Bench(args) => cmd::bench::run(&cli.config, args).await,
        Command::Healthcheck(args) => cmd::healthcheck::run(&cli.config, args).await,
        Command::Doctor(args) => cmd::doctor::run(&cli.config, args).await,
        Command::Config { action } => cmd::config::run(&cli.config, action),
        Command::NoopStages => noop_stages(&cli.config).await,
    }
}

/// `imagepipe noop-stages`: the bench's no-op stages ([`imagepipe::bench::noop`]) as a
/// service of their own (health, readiness and metrics on http.port) until SIGTERM.
async fn noop_stages(config: &ConfigArgs) -> anyhow::Result<ExitCode> {
    use imagepipe_runtime::service::Service;
    let settings = config.load()?;
    let service = Service::start("noop-stages", settings).await?;
    let mut stages = tokio::task::JoinSet::new();
    let spawned = imagepipe::bench::noop::spawn(&service.bus, &service.settings, &service.shutdown, &mut stages).await;
    let mut failed = spawned.err().map(anyhow::Error::from);
    if failed.is_some() {
        service.shutdown.trigger();
    }
    while let Some(stage) = stages.join_next().await {
        let error = match stage {
            Ok(Ok(())) => continue,
            Ok(Err(text)) => anyhow::anyhow!(text),
            Err(panicked) => anyhow::Error::from(panicked),
        };
        // One stage failing stops the others.
        service.shutdown.trigger();
        failed.get_or_insert(error);
    }
    service.stop().await?;
    failed.map_or(Ok(ExitCode::SUCCESS), Err)
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
            assert!(line.contains("yesterday") || line.contains("not provided: <SOURCES>"), "{line}");
            assert!(!line.contains("Usage") && !line.contains("For more information"), "{line}");
        }
    }

    #[test]
    fn global_options_are_taken_before_and_after_the_command() {
        for argv in [
            &["imagepipe", "--config", "f.toml", "doctor"][..],
            &["imagepipe", "doctor", "--config", "f.toml"],
            &["imagepipe", "--api", "http://h:1", "submit", "x.jpg"],
            &["imagepipe", "submit", "x.jpg", "--api", "http://h:1", "--wait"],
            &["imagepipe", "dlq", "list", "--token", "t"],
        ] {
            let matches = Cli::command().try_get_matches_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
            assert_eq!(super::misplaced(&cli, &matches), None, "{argv:?}");
        }
        let argv = ["imagepipe", "submit", "x.jpg", "--config", "f.toml"];
        let matches = Cli::command().try_get_matches_from(argv).unwrap();
        let cli = <Cli as clap::FromArgMatches>::from_arg_matches(&matches).unwrap();
        let mistake = super::misplaced(&cli, &matches).expect("refused");
        assert!(mistake.starts_with("--config does not apply to `imagepipe submit`"), "{mistake}");
    }
}
