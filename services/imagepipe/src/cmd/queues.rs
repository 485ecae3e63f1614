//! `imagepipe queues` (`GET /v1/queues`) and `imagepipe queue pause|resume|concurrency`.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use imagepipe_coordinator::api::CancelRequest;
use imagepipe_coordinator::api::queue_control::{ConcurrencyRequest, QueueView, QueuesView};

use super::{print_json, print_table};
use crate::ApiArgs;

/// Options of `imagepipe queues`.
#[derive(Debug, Args)]
pub struct QueuesArgs {
    /// Print them as JSON.
    #[arg(long)]
    json: bool,
    /// Print them again every 2 seconds until interrupted.
    #[arg(long)]
    watch: bool,
}

/// Options of `imagepipe queue`.
#[derive(Debug, Args)]
pub struct QueueArgs {
    #[command(subcommand)]
    action: QueueAction,
}

#[derive(Debug, Subcommand)]
enum QueueAction {
    /// Stop every replica taking new messages of a stage queue (in-flight ones finish; nothing
    /// is lost, and the deadlines of waiting tasks start over).
    Pause {
        /// `download`, `metadata` or `ai`.
        queue: String,
        /// Why; sent in the `queue.paused` event.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Serve a paused stage queue again.
    Resume {
        /// `download`, `metadata` or `ai`.
        queue: String,
    },
    /// Set how many messages each replica of a stage handles at once, without a restart.
    Concurrency {
        /// `download`, `metadata` or `ai`.
        queue: String,
        /// Messages per replica (1 to 1024), or `default` for each replica's `worker.concurrency`.
        per_replica: String,
    },
}

/// Prints the stage queues, once or every 2 seconds.
pub async fn run_queues(api: &ApiArgs, args: QueuesArgs) -> anyhow::Result<ExitCode> {
    let client = api.client()?;
    loop {
        let queues: QueuesView = client.get("/v1/queues", &[]).await?;
        if args.json {
            print_json(&queues)?;
        } else {
            if args.watch {
                out!("\x1b[2J\x1b[H");
            }
            print_table(&table(&queues.queues));
        }
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn table(queues: &[QueueView]) -> comfy_table::Table {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header([
        "QUEUE",
        "DEPTH",
        "HIGH/NORMAL/LOW",
        "IN FLIGHT",
        "OLDEST",
        "RATE/S",
        "CONSUMERS",
        "CONCURRENCY",
        "PAUSED",
    ]);
    let or_dash = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
    for q in queues {
        let lanes: Vec<String> = q.lanes.iter().map(|l| or_dash(l.depth)).collect();
        let concurrency = match q.per_replica {
            Some(n) => format!("{} ({n}/replica)", q.concurrency),
            None => q.concurrency.to_string(),
        };
        table.add_row([
            q.name.clone(),
            or_dash(q.depth),
            lanes.join("/"),
            q.in_flight.to_string(),
            q.oldest_wait_ms.map_or_else(
                || "-".to_owned(),
                |ms| humantime::format_duration(Duration::from_secs(ms / 1000)).to_string(),
            ),
            format!("{:.1}", q.rate_per_sec),
            q.consumers.to_string(),
            concurrency,
            paused(q).to_owned(),
        ]);
    }
    table
}

/// The PAUSED column: `paused` once no replica takes new messages, `pausing` until then.
fn paused(queue: &QueueView) -> &'static str {
    match (queue.paused, queue.pausing) {
        (true, false) => "paused",
        (true, true) => "pausing",
        (false, _) => "no",
    }
}

/// Pauses, resumes or sets the concurrency of a stage queue and prints it after.
pub async fn run_queue(api: &ApiArgs, args: QueueArgs) -> anyhow::Result<ExitCode> {
    let client = api.client()?;
    let view: QueueView = match args.action {
        QueueAction::Pause { queue, reason } => {
            client.post(&format!("/v1/queues/{queue}/pause"), Some(&CancelRequest { reason })).await?
        }
        QueueAction::Resume { queue } => client.post::<(), _>(&format!("/v1/queues/{queue}/resume"), None).await?,
        QueueAction::Concurrency { queue, per_replica } => {
            let per_replica = match per_replica.as_str() {
                "default" => None,
                n => Some(n.parse::<u32>().map_err(|_| {
                    anyhow::anyhow!("the concurrency must be a number from 1 to 1024, or `default` (got {n:?})")
                })?),
            };
            client.put(&format!("/v1/queues/{queue}/concurrency"), &ConcurrencyRequest { per_replica }).await?
        }
    };
    print_table(&table(std::slice::from_ref(&view)));
    if view.pausing {
        outln!(
            "pausing: a {} replica has not stopped taking messages yet; `imagepipe queues` shows `paused` once \
             every one has",
            view.name
        );
    }
    Ok(ExitCode::SUCCESS)
}
