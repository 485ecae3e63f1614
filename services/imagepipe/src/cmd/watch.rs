//! `imagepipe watch [--task ID] [--type T]`: tails events until interrupted.

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use futures::StreamExt;

use crate::ApiArgs;

/// Options of `imagepipe watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Only events of this task.
    #[arg(long = "task")]
    task_id: Option<String>,
    /// Only these event types: `task.completed || task.failed`, `image.*`.
    #[arg(long = "type")]
    event_type: Option<String>,
    /// Print each event envelope as one JSON line.
    #[arg(long)]
    json: bool,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<usize>,
    #[command(flatten)]
    api: ApiArgs,
}

/// Prints events as they arrive.
pub async fn run(args: WatchArgs) -> anyhow::Result<ExitCode> {
    let client = args.api.client()?;
    let mut events = Box::pin(client.events(args.task_id.as_deref(), args.event_type.as_deref()).await?);
    let mut seen = 0;
    while args.count.is_none_or(|n| seen < n) {
        let Some(event) = events.next().await else {
            anyhow::bail!("the API at {} closed the event stream", client.base());
        };
        let event = event?;
        if event.event == "lagged" {
            eprintln!("imagepipe watch: too slow, missed events: {}", event.data);
            continue;
        }
        seen += 1;
        if args.json {
            outln!("{}", event.data);
            continue;
        }
        let envelope: serde_json::Value =
            serde_json::from_str(&event.data).with_context(|| format!("an event that is not JSON: {}", event.data))?;
        let field = |name: &str| envelope[name].as_str().unwrap_or("-").to_owned();
        let at = envelope["timestamp"].as_u64().map_or_else(|| "-".into(), |ms| ms.to_string());
        outln!("{at} {:<26} {:<40} {}", field("eventType"), field("taskId"), field("source"));
    }
    Ok(ExitCode::SUCCESS)
}
