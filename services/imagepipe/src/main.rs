//! The `imagepipe` command line: every operator action, and `imagepipe run` (every service in
//! one process).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Event-driven image-processing pipeline.
#[derive(Debug, Parser)]
#[command(name = "imagepipe", version, about)]
struct Cli {
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
}

impl Command {
    /// The issue that builds the command.
    fn built_by_issue(&self) -> u32 {
        match self {
            Command::Run | Command::Demo | Command::Submit | Command::Status => 6,
            Command::Watch | Command::Search | Command::Stats | Command::Dlq => 6,
            Command::Bench => 9,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let name = format!("{:?}", cli.command).to_lowercase();
    eprintln!(
        "imagepipe {name}: not built yet (issue #{}); the services it needs are still being built",
        cli.command.built_by_issue()
    );
    ExitCode::from(2)
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
