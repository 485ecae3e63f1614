//! `imagepipe history ID`: every transition of a task (`GET /v1/tasks/{id}/history`).

use std::process::ExitCode;

use clap::Args;
use comfy_table::{Table, presets::NOTHING};

use super::show::{duration, time};
use super::{print_json, print_table};
use crate::ApiArgs;

/// Options of `imagepipe history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// The task id.
    id: String,
    /// Print the history as JSON.
    #[arg(long)]
    json: bool,
}

/// Prints the transitions, oldest first: when, time since the first, what happened, the state
/// change, the step and attempt, details.
pub async fn run(api: &ApiArgs, args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let history = api.client()?.history(&args.id).await?;
    if args.json {
        print_json(&history)?;
        return Ok(ExitCode::SUCCESS);
    }
    let start = history.entries.first().map_or(0, |e| e.at);
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(["at", "after", "event", "state", "step", "detail"]);
    for entry in &history.entries {
        let event = serde_json::to_value(entry.event)?.as_str().unwrap_or_default().to_owned();
        let state = match entry.from {
            Some(from) if from != entry.to => format!("{from} → {}", entry.to),
            _ => entry.to.to_string(),
        };
        let step = match (entry.step, entry.attempt) {
            (Some(step), Some(attempt)) => format!("{step} #{attempt}"),
            (Some(step), None) => step.to_string(),
            _ => String::new(),
        };
        table.add_row([
            time(entry.at),
            format!("+{}", duration(entry.at.saturating_sub(start))),
            event,
            state,
            step,
            entry.detail.clone().unwrap_or_default(),
        ]);
    }
    print_table(&table);
    Ok(ExitCode::SUCCESS)
}
