//! The `imagepipe` command line: every operator action, and `imagepipe run` (every service in
//! one process).

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
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

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every service in one process (in-memory bus, embedded store).
    Run,
    /// Run the pipeline over the bundled sample photos and print a table.
    Demo,
    /// Submit URLs or files as tasks.
    Submit,
    /// Show a task's state.
    Status,
    /// Tail events.
    Watch,
    /// Find tasks by tag.
    Search,
    /// Show pipeline statistics.
    Stats,
    /// Inspect, replay or purge dead letters.
    Dlq,
    /// Measure the pipeline's throughput and latency.
    Bench,
    /// Show the effective configuration.
    Config {
        #[command(subcommand)]
        action: ConfigAction,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigAction {
    /// Print the effective configuration (defaults < file < environment) as TOML, secrets masked.
    Print,
}

impl Command {
    /// The issue that builds the command, for commands not built yet.
    fn built_by_issue(&self) -> Option<u32> {
        match self {
            Command::Run | Command::Demo | Command::Submit | Command::Status => Some(6),
            Command::Watch | Command::Search | Command::Stats | Command::Dlq => Some(6),
            Command::Bench => Some(9),
            Command::Config { .. } => None,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(issue) = cli.command.built_by_issue() {
        let name = format!("{:?}", cli.command).to_lowercase();
        eprintln!("imagepipe {name}: not built yet (issue #{issue}); the services it needs are still being built");
        return ExitCode::from(2);
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("imagepipe: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Config { action: ConfigAction::Print } => {
            let settings = cli.config.load().context("loading the configuration")?;
            print!("{}", settings.to_masked_toml().context("printing the configuration")?);
            Ok(())
        }
        other => unreachable!("{other:?} has no implementation yet and was refused above"),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }
}
