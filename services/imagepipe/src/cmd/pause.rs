//! `imagepipe pause ID` and `imagepipe resume ID`: `POST /v1/tasks/{id}/pause|resume`.

use std::process::ExitCode;

use clap::Args;
use imagepipe_coordinator::TaskState;

use super::print_json;
use crate::ApiArgs;

/// Options of `imagepipe pause` and `imagepipe resume`.
#[derive(Debug, Args)]
pub struct PauseArgs {
    /// The task id.
    id: String,
    /// Why (pause only); kept in the task's history and sent in its `task.paused` event.
    #[arg(long)]
    reason: Option<String>,
    /// Print the task as JSON.
    #[arg(long)]
    json: bool,
}

/// Pauses a task (at once when no step runs, else at the end of the running step), or resumes it;
/// a task that already finished is an error.
pub async fn run(api: &ApiArgs, args: PauseArgs, pause: bool) -> anyhow::Result<ExitCode> {
    // A finished task is a 409 from the API (as for `cancel`): the client's error, exit 1.
    let view = api.client()?.pause(&args.id, pause, args.reason).await?;
    let task = &view.task;
    if args.json {
        print_json(&view)?;
        return Ok(ExitCode::SUCCESS);
    }
    match task.state {
        TaskState::Paused => outln!("{}  paused", task.id),
        state if pause && task.pause_requested.is_some() => {
            outln!("{}  pausing: it stops when its running {} step ends", task.id, state)
        }
        state => outln!("{}  {state}", task.id),
    }
    Ok(ExitCode::SUCCESS)
}
