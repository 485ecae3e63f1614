//! `imagepipe list`: tasks, newest first (`GET /v1/tasks`, page after page), filtered by state,
//! a label and creation time in the API and by further labels here; says how to go on when
//! there are more.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;
use comfy_table::{Table, presets::NOTHING};
use imagepipe::client::TaskQuery;
use imagepipe_coordinator::{Task, TaskState};

use super::show::{source, time, top_label};
use super::{parse_label, print_json, print_table};
use crate::ApiArgs;

/// Largest page the API serves.
const PAGE: usize = 500;

/// Options of `imagepipe list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only tasks in this state: queued, downloading, extracting_metadata, analyzing, paused,
    /// completed, failed or cancelled.
    #[arg(long)]
    state: Option<TaskState>,
    /// Only tasks with this label, `key=value` (repeatable: every one must match).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Only tasks created since: a duration ago (`90s`, `15m`, `2h`, `1d`) or an RFC 3339 time
    /// in UTC (`2026-11-24T19:00:00Z`).
    #[arg(long, value_parser = parse_since)]
    since: Option<u64>,
    /// Most tasks shown; when there are more, a line on stderr says how to list them.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Oldest first (default: newest first).
    #[arg(long)]
    oldest_first: bool,
    /// Go on from where a listing stopped (the cursor its "more" line gave).
    #[arg(long)]
    cursor: Option<String>,
    /// Print the tasks as a JSON array.
    #[arg(long)]
    json: bool,
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

/// Prints up to `--limit` matching tasks, newest first (or oldest first); when there are more,
/// says on stderr how to list them.
pub async fn run(api: &ApiArgs, args: ListArgs) -> anyhow::Result<ExitCode> {
    let client = api.client()?;
    let mut tasks = Vec::new();
    let mut cursor = args.cursor.clone();
    // Whole pages of at most the room left: the cursor after the last one is exact.
    while tasks.len() < args.limit {
        let page = client.tasks(&query(&args, (args.limit - tasks.len()).clamp(1, PAGE), cursor.as_deref())).await?;
        tasks.extend(page.tasks.into_iter().filter(|t| matches(&args, t)));
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    if let Some(cursor) = &cursor
        && more(&client, &args, cursor).await?
    {
        eprintln!("imagepipe list: {} task(s) shown; more with --cursor {cursor} (or a larger --limit)", tasks.len());
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

/// Whether the listing goes on after `cursor`: a task follows (or the API's filtered scan has
/// not reached the end yet).
async fn more(client: &imagepipe::ApiClient, args: &ListArgs, cursor: &str) -> anyhow::Result<bool> {
    let next = client.tasks(&query(args, 1, Some(cursor))).await?;
    Ok(!next.tasks.is_empty() || next.next_cursor.is_some())
}

/// A page of `limit` tasks after `cursor` with the filters the API applies.
fn query<'a>(args: &'a ListArgs, limit: usize, cursor: Option<&'a str>) -> TaskQuery<'a> {
    TaskQuery {
        limit,
        newest_first: !args.oldest_first,
        state: args.state,
        label: args.labels.first().map(|(k, v)| (k.as_str(), v.as_str())),
        created_after: args.since,
        cursor,
    }
}

/// Whether `task` passes every filter (the API applied the state, the first label and
/// `--since`; the other labels are applied here).
fn matches(args: &ListArgs, task: &Task) -> bool {
    args.since.is_none_or(|since| task.created_at >= since)
        && args.labels.iter().all(|(key, value)| task.labels.get(key) == Some(value))
}
