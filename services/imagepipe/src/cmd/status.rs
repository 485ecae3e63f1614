//! `imagepipe status ID`.

use std::process::ExitCode;

use clap::Args;
use imagepipe_contracts::Step;
use imagepipe_coordinator::{Task, TaskState, TimerKind};

use super::print_json;
use super::show::{attempts, duration, failure_reason, size, source, step_ms, tags, time, top_label};
use crate::ApiArgs;

/// Options of `imagepipe status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The task id.
    id: String,
    /// Print the task as JSON.
    #[arg(long)]
    json: bool,
}

/// Prints a task's state, source, times, steps and outputs.
pub async fn run(api: &ApiArgs, args: StatusArgs) -> anyhow::Result<ExitCode> {
    let view = api.client()?.task(&args.id).await?;
    if args.json {
        print_json(&view)?;
        return Ok(ExitCode::SUCCESS);
    }
    let task = &view.task;
    let row = |name: &str, value: &str| outln!("{name:<10} {value}");
    row("task", &task.id);
    row("state", &failure_reason(task));
    row("source", &source(task));
    if !task.labels.is_empty() {
        row("labels", &task.labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", "));
    }
    row("created", &time(task.created_at));
    let age = duration(task.updated_at.saturating_sub(task.created_at));
    if task.state.is_terminal() {
        row("finished", &format!("{} (took {age})", time(task.updated_at)));
    } else {
        row("updated", &format!("{} ({age} after it was created)", time(task.updated_at)));
    }
    for step in Step::ALL {
        if task.steps.get(step).attempts > 0 {
            row(step.as_str(), &step_line(task, step));
        }
    }
    if let Some(d) = &task.outputs.download {
        row("image", &format!("{}, {}", d.format, size(d.size)));
    }
    if let Some(m) = &task.outputs.metadata {
        row("size", &format!("{}×{}", m.width, m.height));
        row("thumbnail", &m.thumbnail_key);
        for derivative in m.thumbnails.iter().filter(|t| t.key != m.thumbnail_key) {
            let line = format!(
                "{} ({} {}×{}, {})",
                derivative.key,
                derivative.format,
                derivative.width,
                derivative.height,
                size(derivative.size)
            );
            row(&derivative.name, &line);
        }
    }
    if let Some(a) = &task.outputs.analysis {
        row("top label", &top_label(a).unwrap_or_else(|| "-".to_owned()));
        let predictions: Vec<_> = a.predictions.iter().map(|p| format!("{} {:.2}", p.label, p.score)).collect();
        row("predicted", &predictions.join(", "));
        row("tags", &tags(a, a.tags.len()));
    }
    if !task.state.is_terminal()
        && let Some(e) = &view.last_error
    {
        row("error", &e.to_string());
    }
    Ok(ExitCode::SUCCESS)
}

/// `12 ms, 1 attempt`; `running, attempt 2 (started …)`; `failed after 5 attempts`.
fn step_line(task: &Task, step: Step) -> String {
    let record = task.steps.get(step);
    let tried = attempts(record.attempts);
    if let Some(ms) = step_ms(task, step) {
        return format!("{}, {tried}", duration(ms));
    }
    let started = record.started_at.map(|at| format!(", started {}", time(at))).unwrap_or_default();
    match task.state {
        TaskState::Failed => format!("failed after {tried}{started}"),
        TaskState::Cancelled => format!("cancelled after {tried}{started}"),
        _ => match task.timer {
            Some(timer) if timer.kind == TimerKind::Retry && timer.step == step => {
                format!("{tried} failed, attempt {} at {}", timer.attempt, time(timer.due_at))
            }
            _ => format!("running, attempt {}{started}", record.attempts),
        },
    }
}
