//! `imagepipe submit URL|FILE...`: URLs are submitted as they are, files are uploaded first
//! (`POST /v1/blobs`) and submitted by blob key with the label `file=<name>`; `--wait` follows
//! every task to its end. Every source is checked before any is submitted.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use imagepipe::ApiClient;
use imagepipe_blob::{Sniffed, sniff};
use imagepipe_contracts::SubmitTask;
use imagepipe_coordinator::TaskState;
use imagepipe_coordinator::api::{Accepted, TaskView};
use indicatif::{ProgressBar, ProgressStyle};

use super::show::{FILE_LABEL, outcome};
use super::{parse_label, print_json};
use crate::ApiArgs;

/// How often `--wait` asks for a task's state.
const POLL: Duration = Duration::from_millis(250);

/// Bytes of a file read to tell an image from anything else, and to say what else it is.
const SNIFF_BYTES: u64 = 1024;

/// A blob key standing in for a file's while its submit command is checked before the upload.
const PLACEHOLDER_KEY: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Options of `imagepipe submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Image URLs (http:// or https://) or image files. Every one is checked (files readable
    /// images, URLs valid) before any is submitted. A file's task gets the label `file=<its
    /// name>` unless `--label file=...` is given.
    #[arg(required = true)]
    sources: Vec<String>,
    /// Where to POST `task.*` notifications.
    #[arg(long)]
    callback_url: Option<String>,
    /// Labels copied into every event, `key=value` (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Follow every task until it completes, fails or is cancelled, and print its top label and
    /// tags or why it failed.
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

/// One source, checked: what to submit for it.
struct Checked {
    /// The source as given.
    given: String,
    /// The file to upload first, for a file.
    file: Option<PathBuf>,
    /// The submit command (for a file, without its blob key yet).
    submit: SubmitTask,
}

/// Submits every source; with `--wait`, exits non-zero when any task did not complete.
pub async fn run(args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let client = args.api.client()?;
    let checked = check_all(&args)?;
    let progress = bar(checked.len(), args.json, "submitting");
    let mut accepted: Vec<(String, Accepted)> = Vec::new();
    for source in checked {
        let task = match submit(&client, &source).await {
            Ok(task) => task,
            Err(e) => {
                progress.finish_and_clear();
                anyhow::bail!("{e:#} ({})", submitted_before(&accepted));
            }
        };
        progress.inc(1);
        if !args.json {
            progress.suspend(|| outln!("{}  {}", task.task_id, source.given));
        }
        accepted.push((source.given, task));
    }
    progress.finish_and_clear();
    if !args.wait {
        if args.json {
            print_json(&accepted.iter().map(|(_, a)| a).collect::<Vec<_>>())?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    wait(&client, &args, &accepted).await
}

/// Checks every source and the submit command each one makes; one line naming every problem,
/// and nothing submitted, when any is unusable.
fn check_all(args: &SubmitArgs) -> anyhow::Result<Vec<Checked>> {
    let mut checked = Vec::new();
    let mut problems = Vec::new();
    for given in &args.sources {
        match check(args, given) {
            Ok(source) => checked.push(source),
            Err(problem) => problems.push(format!("{given}: {problem}")),
        }
    }
    if !problems.is_empty() {
        anyhow::bail!(
            "nothing submitted: {} of {} source(s) unusable: {}",
            problems.len(),
            args.sources.len(),
            problems.join("; ")
        );
    }
    Ok(checked)
}

fn check(args: &SubmitArgs, given: &str) -> Result<Checked, String> {
    let mut submit = SubmitTask {
        callback_url: args.callback_url.clone(),
        labels: args.labels.iter().cloned().collect(),
        ..SubmitTask::default()
    };
    let file = if given.starts_with("http://") || given.starts_with("https://") {
        submit.url = Some(given.to_owned());
        None
    } else {
        let path = PathBuf::from(given);
        check_image_file(&path)?;
        if let Some(name) = path.file_name() {
            submit.labels.entry(FILE_LABEL.to_owned()).or_insert_with(|| name.to_string_lossy().into_owned());
        }
        submit.blob = Some(PLACEHOLDER_KEY.to_owned());
        Some(path)
    };
    submit.validate().map_err(|e| e.to_string())?;
    submit.blob = None;
    Ok(Checked { given: given.to_owned(), file, submit })
}

/// Whether `path` is a readable file that starts like an image.
fn check_image_file(path: &Path) -> Result<(), String> {
    let not_url = "not an http:// or https:// URL, so it must be an image file";
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot read it ({e}); {not_url}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot read it ({e})"))?;
    if !meta.is_file() {
        return Err(format!("not a file; {not_url}"));
    }
    let mut head = Vec::new();
    file.by_ref().take(SNIFF_BYTES).read_to_end(&mut head).map_err(|e| format!("cannot read it ({e})"))?;
    match sniff(&head) {
        Sniffed::Image(_) => Ok(()),
        Sniffed::Other(what) => Err(format!("not an image ({what})")),
    }
}

/// Uploads the source's file, if it is one, and submits its task.
async fn submit(client: &ApiClient, source: &Checked) -> anyhow::Result<Accepted> {
    let mut submit = source.submit.clone();
    if let Some(path) = &source.file {
        let bytes = tokio::fs::read(path).await.with_context(|| format!("reading {}", path.display()))?;
        let uploaded =
            client.upload(Bytes::from(bytes)).await.with_context(|| format!("uploading {}", path.display()))?;
        submit.blob = Some(uploaded.key);
    }
    client.submit(&submit).await.with_context(|| format!("submitting {}", source.given))
}

/// What a failed submission says about the tasks created before it.
fn submitted_before(accepted: &[(String, Accepted)]) -> String {
    if accepted.is_empty() {
        return "nothing submitted".to_owned();
    }
    let tasks: Vec<_> = accepted.iter().map(|(given, a)| format!("{} ({given})", a.task_id)).collect();
    format!("submitted before it: {}", tasks.join(", "))
}

/// Polls every accepted task until it finished, printing each one's outcome as it ends.
async fn wait(client: &ApiClient, args: &SubmitArgs, accepted: &[(String, Accepted)]) -> anyhow::Result<ExitCode> {
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
        for (slot, (source, task)) in finished.iter_mut().zip(accepted) {
            if slot.is_some() {
                continue;
            }
            let view = client.task(&task.task_id).await?;
            if view.task.state.is_terminal() {
                progress.inc(1);
                if !args.json {
                    let line = format!("{}  {source}  {}", view.task.id, outcome(&view.task));
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
