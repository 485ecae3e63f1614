//! `imagepipe cancel ID`: `POST /v1/tasks/{id}/cancel`.

use std::process::ExitCode;

use clap::Args;

use super::print_json;
use super::show::failure_reason;
use crate::ApiArgs;

/// Options of `imagepipe cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The task id.
    id: String,
    /// Why; kept in the task's history and sent in its `task.cancelled` event.
    #[arg(long)]
    reason: Option<String>,
    /// Print the task as JSON.
    #[arg(long)]
    json: bool,
}

/// Cancels a task: at once when no step is running (also when its command still waits in a
/// paused queue that runs nothing), else its worker stops the step within about a second. A
/// finished task cannot be cancelled (an error).
pub async fn run(api: &ApiArgs, args: CancelArgs) -> anyhow::Result<ExitCode> {
    let view = api.client()?.cancel(&args.id, args.reason).await?;
    if args.json {
        print_json(&view)?;
        return Ok(ExitCode::SUCCESS);
    }
    let task = &view.task;
    if task.state.is_terminal() {
        outln!("{}  {}", task.id, failure_reason(task));
    } else {
        let step = task.state.step().map_or_else(|| task.state.to_string(), |s| s.to_string());
        outln!(
            "{}  cancelling: its {step} step is told to stop (within a second if it runs, when a worker takes it if \
             it still waits); `imagepipe status {}` shows `cancelled` once it has",
            task.id,
            task.id
        );
    }
    Ok(ExitCode::SUCCESS)
}
