//! `imagepipe reprocess`: `POST /v1/reprocess`, then its progress from `GET /v1/reprocess/{id}`.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use imagepipe_contracts::{Labels, Priority};
use imagepipe_coordinator::reprocess::{
    Filter, FinishedState, From, JobStatus, ReprocessJob, ReprocessRequest, Select,
};

use super::{parse_label, print_json};
use crate::ApiArgs;

/// Options of `imagepipe reprocess`.
#[derive(Debug, Args)]
pub struct ReprocessArgs {
    /// The first step to run again: `metadata` (then analysis) or `analyze`.
    #[arg(long, value_enum, required_unless_present = "status")]
    from: Option<FromArg>,
    /// `missing`: only tasks without that step's output; `all`: every matching task.
    #[arg(long, value_enum, default_value = "missing")]
    select: SelectArg,
    /// Only finished tasks in this state.
    #[arg(long, value_enum)]
    state: Option<StateArg>,
    /// Only tasks with this label (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Only tasks created after this time: a duration ago (`12h`, `7d`) or an RFC 3339 time.
    #[arg(long, value_parser = super::list::parse_since)]
    created_after: Option<u64>,
    /// `not-current`: only tasks analysed by an older model; or a model name to move away from.
    #[arg(long)]
    model: Option<String>,
    /// The lanes the reprocessed tasks run in.
    #[arg(long, default_value = "low")]
    priority: Priority,
    /// Print progress until the job is done.
    #[arg(long)]
    wait: bool,
    /// Show the progress of an earlier job instead of starting one.
    #[arg(long, conflicts_with = "from")]
    status: Option<String>,
    /// Print the job as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FromArg {
    Metadata,
    Analyze,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum StateArg {
    Completed,
    Failed,
    Cancelled,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SelectArg {
    Missing,
    All,
}

/// Starts a reprocessing (or looks one up) and prints its progress.
pub async fn run(api: &ApiArgs, args: ReprocessArgs) -> anyhow::Result<ExitCode> {
    let client = api.client()?;
    let mut job: ReprocessJob = match &args.status {
        Some(id) => client.get(&format!("/v1/reprocess/{id}"), &[]).await?,
        None => {
            let request = ReprocessRequest {
                from: match args.from.expect("clap requires --from without --status") {
                    FromArg::Metadata => From::Metadata,
                    FromArg::Analyze => From::Analyze,
                },
                select: match args.select {
                    SelectArg::Missing => Select::Missing,
                    SelectArg::All => Select::All,
                },
                filter: Filter {
                    state: args.state.map(|s| match s {
                        StateArg::Completed => FinishedState::Completed,
                        StateArg::Failed => FinishedState::Failed,
                        StateArg::Cancelled => FinishedState::Cancelled,
                    }),
                    labels: args.labels.iter().cloned().collect::<Labels>(),
                    created_after: args.created_after,
                    model: args.model.clone(),
                },
                priority: args.priority,
            };
            client.post("/v1/reprocess", Some(&request)).await?
        }
    };
    loop {
        if args.json {
            print_json(&job)?;
        } else {
            outln!(
                "{}  {:?}: {} scanned, {} matched, {} reprocessed, {} skipped{}",
                job.id,
                job.status,
                job.scanned,
                job.matched,
                job.queued,
                job.skipped,
                job.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
            );
        }
        if !args.wait || job.status != JobStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        job = client.get(&format!("/v1/reprocess/{}", job.id), &[]).await?;
    }
    Ok(if job.status == JobStatus::Failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
