//! `imagepipe status ID`.

use std::process::ExitCode;

use clap::Args;
use imagepipe_contracts::Step;

use super::{duration, failure_reason, print_json, size, step_ms};
use crate::ApiArgs;

/// Options of `imagepipe status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The task id.
    id: String,
    /// Print the task as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

/// Prints a task's state, steps and outputs.
pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let view = args.api.client()?.task(&args.id).await?;
    if args.json {
        print_json(&view)?;
        return Ok(ExitCode::SUCCESS);
    }
    let task = &view.task;
    outln!("task     {}", task.id);
    outln!("state    {}", task.state);
    for step in Step::ALL {
        let record = task.steps.get(step);
        if record.attempts == 0 {
            continue;
        }
        let took = step_ms(task, step).map_or_else(|| "running".into(), duration);
        outln!(
            "{:<8} {took} ({} attempt{})",
            step.as_str(),
            record.attempts,
            if record.attempts == 1 { "" } else { "s" }
        );
    }
    if let Some(d) = &task.outputs.download {
        outln!("image    {} {}", d.format, size(d.size));
    }
    if let Some(m) = &task.outputs.metadata {
        outln!("size     {}×{}", m.width, m.height);
        outln!("thumb    {}", m.thumbnail_key);
    }
    if let Some(a) = &task.outputs.analysis {
        let labels: Vec<_> = a.predictions.iter().map(|p| format!("{} {:.2}", p.label, p.score)).collect();
        let tags: Vec<_> = a.tags.iter().map(|p| p.label.as_str()).collect();
        outln!("labels   {}", labels.join(", "));
        outln!("tags     {}", tags.join(", "));
    }
    if task.state.is_terminal() && task.state != imagepipe_coordinator::TaskState::Completed {
        outln!("reason   {}", failure_reason(task));
    } else if let Some(e) = &view.last_error {
        outln!("error    {}: {}", e.code, e.message);
    }
    Ok(ExitCode::SUCCESS)
}
