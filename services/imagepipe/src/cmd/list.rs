//! `imagepipe list`: tasks, oldest first (`GET /v1/tasks`, page after page), filtered by state
//! in the API and by label and creation time here.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use comfy_table::{Table, presets::NOTHING};
use imagepipe_coordinator::{Task, TaskState};

use super::show::{source, time, top_label};
use super::{parse_label, print_json, print_table};
use crate::ApiArgs;

/// Largest page the API serves.
const PAGE: usize = 500;

/// Options of `imagepipe list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only tasks in this state: queued, downloading, extracting_metadata, analyzing, completed,
    /// failed or cancelled.
    #[arg(long)]
    state: Option<TaskState>,
    /// Only tasks with this label, `key=value` (repeatable: every one must match). The API does
    /// not filter by label: the CLI reads every page and keeps the matching tasks.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Only tasks created since: a duration ago (`90s`, `15m`, `2h`, `1d`) or an RFC 3339 time
    /// in UTC (`2026-11-24T19:00:00Z`). Filtered by the CLI, as `--label` is.
    #[arg(long, value_parser = parse_since)]
    since: Option<u64>,
    /// Most tasks shown.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Print the tasks as a JSON array.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

/// `--since`: a duration before now or an RFC 3339 time, as Unix milliseconds.
pub fn parse_since(s: &str) -> Result<u64, String> {
    let at = match humantime::parse_duration(s) {
        Ok(ago) => SystemTime::now().checked_sub(ago).ok_or_else(|| format!("{s:?} reaches before 1970"))?,
        Err(_) => humantime::parse_rfc3339_weak(s).map_err(|_| {
            format!("{s:?} is neither a duration (`15m`, `2h`, `1d`) nor an RFC 3339 time (`2026-11-24T19:00:00Z`)")
        })?,
    };
    Ok(at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
}

/// Prints up to `--limit` matching tasks, oldest first.
pub async fn run(args: ListArgs) -> anyhow::Result<ExitCode> {
    let client = args.api.client()?;
    let filtered_here = !args.labels.is_empty() || args.since.is_some();
    let mut tasks = Vec::new();
    let mut cursor = None;
    while tasks.len() < args.limit {
        let page_size = if filtered_here { PAGE } else { (args.limit - tasks.len()).clamp(1, PAGE) };
        let page = client.tasks(args.state, page_size, cursor.as_deref()).await?;
        let room = args.limit - tasks.len();
        tasks.extend(page.tasks.into_iter().filter(|t| matches(&args, t)).take(room));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if args.json {
        print_json(&tasks)?;
        return Ok(ExitCode::SUCCESS);
    }
    if tasks.is_empty() {
        outln!("no tasks");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new();
    table.load_preset(NOTHING).set_header(["id", "state", "created", "source", "top label"]);
    for task in &tasks {
        let top = task.outputs.analysis.as_ref().and_then(top_label).unwrap_or_else(|| "-".to_owned());
        table.add_row([task.id.clone(), task.state.to_string(), time(task.created_at), source(task), top]);
    }
    print_table(&table);
    Ok(ExitCode::SUCCESS)
}

/// Whether `task` passes the filters the API does not apply.
fn matches(args: &ListArgs, task: &Task) -> bool {
    args.since.is_none_or(|since| task.created_at >= since)
        && args.labels.iter().all(|(key, value)| task.labels.get(key) == Some(value))
}
