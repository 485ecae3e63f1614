//! `imagepipe submit URL|FILE...`: URLs are submitted as they are, files are uploaded first
//! (`POST /v1/blobs`) and submitted by blob key; `--wait` follows every task to its end.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use imagepipe::ApiClient;
use imagepipe_contracts::SubmitTask;
use imagepipe_coordinator::TaskState;
use imagepipe_coordinator::api::TaskView;
use indicatif::{ProgressBar, ProgressStyle};

use super::{failure_reason, print_json};
use crate::ApiArgs;

/// How often `--wait` asks for a task's state.
const POLL: Duration = Duration::from_millis(250);

/// Options of `imagepipe submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Image URLs (http:// or https://) or image files.
    #[arg(required = true)]
    sources: Vec<String>,
    /// Where to POST `task.*` notifications.
    #[arg(long)]
    callback_url: Option<String>,
    /// Labels copied into every event, `key=value` (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Follow every task until it completes, fails or is cancelled.
    #[arg(long)]
    wait: bool,
    /// Longest time `--wait` waits, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Print the accepted tasks (or, with --wait, the finished ones) as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    api: ApiArgs,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("{s:?} is not key=value"))
}

/// Submits every source; with `--wait`, exits non-zero when any task did not complete.
pub async fn run(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let client = args.api.client()?;
    let progress = bar(args.sources.len(), args.json, "submitting");
    let mut accepted = Vec::new();
    for source in &args.sources {
        let mut submit = SubmitTask {
            callback_url: args.callback_url.clone(),
            labels: args.labels.iter().cloned().collect(),
            ..SubmitTask::default()
        };
        if source.starts_with("http://") || source.starts_with("https://") {
            submit.url = Some(source.clone());
        } else {
            submit.blob = Some(upload(&client, Path::new(source)).await?);
        }
        let task = client.submit(&submit).await.with_context(|| format!("submitting {source}"))?;
        progress.inc(1);
        if !args.json && !args.wait {
            progress.suspend(|| outln!("{}  {source}", task.task_id));
        }
        accepted.push((source.clone(), task));
    }
    progress.finish_and_clear();
    if !args.wait {
        if args.json {
            print_json(&accepted.iter().map(|(_, a)| a).collect::<Vec<_>>())?;
        }
        return Ok(ExitCode::SUCCESS);
    }

    let progress = bar(accepted.len(), args.json, "processing");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.timeout);
    let mut finished: Vec<Option<TaskView>> = vec![None; accepted.len()];
    while finished.iter().any(Option::is_none) {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{} task(s) not finished after {} s",
            finished.iter().filter(|f| f.is_none()).count(),
            args.timeout
        );
        for (slot, (source, task)) in finished.iter_mut().zip(&accepted) {
            if slot.is_some() {
                continue;
            }
            let view = client.task(&task.task_id).await?;
            if view.task.state.is_terminal() {
                progress.inc(1);
                if !args.json {
                    let line = match view.task.state {
                        TaskState::Completed => format!("{}  completed  {source}", view.task.id),
                        _ => format!("{}  {}  {source}: {}", view.task.id, view.task.state, failure_reason(&view.task)),
                    };
                    progress.suspend(|| outln!("{line}"));
                }
                *slot = Some(view);
            }
        }
        tokio::time::sleep(POLL).await;
    }
    progress.finish_and_clear();
    let finished: Vec<TaskView> = finished.into_iter().flatten().collect();
    if args.json {
        print_json(&finished)?;
    }
    let failed = finished.iter().filter(|v| v.task.state != TaskState::Completed).count();
    if failed > 0 {
        eprintln!("imagepipe submit: {failed} of {} task(s) did not complete", finished.len());
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

async fn upload(client: &ApiClient, path: &Path) -> anyhow::Result<String> {
    let bytes = tokio::fs::read(path).await.with_context(|| {
        format!("reading {} (not an http:// or https:// URL, so it must be an image file)", path.display())
    })?;
    let uploaded = client.upload(Bytes::from(bytes)).await.with_context(|| format!("uploading {}", path.display()))?;
    Ok(uploaded.key)
}

/// A progress bar for batches on a terminal; hidden for one item or JSON output.
fn bar(len: usize, json: bool, what: &'static str) -> ProgressBar {
    if len < 2 || json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what);
    bar
}
