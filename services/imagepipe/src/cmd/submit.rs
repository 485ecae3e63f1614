//! `imagepipe submit URL|FILE|DIR...`: URLs are submitted as they are, files are uploaded first
//! (`POST /v1/blobs`) and submitted by blob key with the label `file=<name>`; the images of a
//! directory are uploaded and submitted through `POST /v1/tasks:batch`, 1000 at a time, where a
//! refused image does not stop the others; `--wait` follows every task to its end. Every source
//! is checked before any is submitted.

use std::collections::HashSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use futures::StreamExt;
use imagepipe::ApiClient;
use imagepipe::client::ClientError;
use imagepipe_blob::{Sniffed, sniff};
use imagepipe_contracts::{Priority, SubmitTask};
use imagepipe_coordinator::TaskState;
use imagepipe_coordinator::api::batch::{BatchItem, MAX_BATCH};
use imagepipe_coordinator::api::{Accepted, TaskView};
use imagepipe_runtime::{Shutdown, error_chain};
use indicatif::{ProgressBar, ProgressStyle};

use super::show::{FILE_LABEL, outcome};
use super::{parse_label, print_json};
use crate::ApiArgs;

/// How often `--wait` asks for a task's state.
const POLL: Duration = Duration::from_millis(250);

/// Bytes of a file read to tell an image from anything else, and to say what else it is.
const SNIFF_BYTES: u64 = 1024;

/// Uploads of a directory's images in flight at once.
const UPLOADS: usize = 4;

/// A blob key standing in for a file's while its submit command is checked before the upload.
const PLACEHOLDER_KEY: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

/// Options of `imagepipe submit`.
#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// Image URLs (http:// or https://), image files or directories. Every one is checked (files
    /// readable images, URLs valid) before any is submitted. A file's task gets the label
    /// `file=<its name>` unless `--label file=...` is given. A directory is walked (hidden
    /// entries and files that are not images skipped, symbolic links followed only to files
    /// inside it); its images are uploaded and submitted 1000 per request, each labelled
    /// `file=<its path in the directory>`, and an image the API refuses is reported without
    /// stopping the others (the exit status is then 1).
    #[arg(required = true)]
    sources: Vec<String>,
    /// Priority of the tasks: high, normal or low (each queue's lanes; low still gets a share).
    #[arg(long, default_value_t = Priority::Normal)]
    priority: Priority,
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

/// A checked source: one URL or file, or the images of a directory.
enum Source {
    One(Checked),
    Dir(Walked),
}

impl Source {
    fn items(&self) -> usize {
        match self {
            Source::One(_) => 1,
            Source::Dir(dir) => dir.images.len(),
        }
    }
}

/// A directory, walked and checked.
struct Walked {
    /// Its images, in path order, each with its submit command.
    images: Vec<Checked>,
    /// Entries skipped: files that are not images, links out of it or to a directory (hidden
    /// entries are left out without counting).
    skipped: usize,
}

/// Submits every source; exits non-zero when an image of a directory was refused, or, with
/// `--wait`, when any task did not complete.
pub async fn run(api: &ApiArgs, args: SubmitArgs) -> anyhow::Result<ExitCode> {
    let client = api.client()?;
    let sources = check_all(&args)?;
    let progress = bar(sources.iter().map(Source::items).sum(), args.json, "submitting");
    let mut accepted: Vec<(String, Accepted)> = Vec::new();
    let (mut refused, mut skipped, mut dirs) = (0, 0, false);
    for source in sources {
        let source = match source {
            Source::One(source) => source,
            Source::Dir(dir) => {
                dirs = true;
                skipped += dir.skipped;
                let submitted = submit_dir(&client, &args, dir, &progress, &mut accepted).await;
                refused += submitted.inspect_err(|_| progress.finish_and_clear())?;
                continue;
            }
        };
        let task = match submit(&client, &source).await {
            Ok(task) => task,
            Err(e) => {
                progress.finish_and_clear();
                anyhow::bail!("{} ({})", error_chain(e.as_ref()), submitted_before(&accepted));
            }
        };
        progress.inc(1);
        if !args.json {
            progress.suspend(|| outln!("{}  {}", task.task_id, source.given));
        }
        accepted.push((source.given, task));
    }
    progress.finish_and_clear();
    if dirs || refused > 0 {
        let skipped = if skipped > 0 { format!(", {skipped} other file(s) skipped") } else { String::new() };
        eprintln!("imagepipe submit: {} submitted, {refused} refused{skipped}", accepted.len());
    }
    let refusals = if refused > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS };
    if !args.wait {
        if args.json {
            print_json(&accepted.iter().map(|(_, a)| a).collect::<Vec<_>>())?;
        }
        return Ok(refusals);
    }
    let waited = wait(&client, &args, &accepted).await?;
    Ok(if refused > 0 { refusals } else { waited })
}

/// Uploads the images of a directory and submits them 1000 per request; prints each accepted
/// task (stdout) and each refused image (stderr) as it goes. Returns how many were refused: an
/// upload the API refuses (too large, not an image after all) or a submit command it refuses.
/// A failure of the API or the connection ends the command.
async fn submit_dir(
    client: &ApiClient,
    args: &SubmitArgs,
    dir: Walked,
    progress: &ProgressBar,
    accepted: &mut Vec<(String, Accepted)>,
) -> anyhow::Result<usize> {
    let mut refused = 0;
    let refuse = |given: &str, why: &str| progress.suspend(|| eprintln!("imagepipe submit: {given}: refused: {why}"));
    for chunk in dir.images.chunks(MAX_BATCH) {
        progress.set_message("uploading");
        let uploads: Vec<(&Checked, Result<String, ClientError>)> = futures::stream::iter(chunk)
            .map(|image| async move {
                let path = image.file.as_deref().expect("a directory's images are files");
                let bytes = tokio::fs::read(path).await.with_context(|| format!("reading {}", path.display()))?;
                anyhow::Ok((image, client.upload(Bytes::from(bytes)).await.map(|u| u.key)))
            })
            .buffered(UPLOADS)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<anyhow::Result<_>>()
            .map_err(|e| anyhow::anyhow!("{} ({})", error_chain(e.as_ref()), submitted_before(accepted)))?;
        let mut commands = Vec::with_capacity(uploads.len());
        let mut images = Vec::with_capacity(uploads.len());
        for (image, uploaded) in uploads {
            match uploaded {
                Ok(key) => {
                    commands.push(SubmitTask { blob: Some(key), ..image.submit.clone() });
                    images.push(image);
                }
                Err(e @ ClientError::Api { status, .. }) if status.is_client_error() => {
                    progress.inc(1);
                    refused += 1;
                    refuse(&image.given, &format!("uploading: {e}"));
                }
                Err(e) => anyhow::bail!("uploading {}: {e} ({})", image.given, submitted_before(accepted)),
            }
        }
        if commands.is_empty() {
            continue;
        }
        progress.set_message("submitting");
        let answer = match client.submit_batch(&commands).await {
            Ok(answer) => answer,
            Err(e) => anyhow::bail!("submitting {} images: {e} ({})", commands.len(), submitted_before(accepted)),
        };
        anyhow::ensure!(
            answer.results.len() == commands.len(),
            "POST /v1/tasks:batch answered {} results for {} tasks",
            answer.results.len(),
            commands.len()
        );
        for (image, result) in images.into_iter().zip(answer.results) {
            progress.inc(1);
            match result {
                BatchItem::Accepted(a) => {
                    if !args.json {
                        progress.suspend(|| outln!("{}  {}", a.task_id, image.given));
                    }
                    let task = Accepted { task_id: a.task_id, state: a.state, created: a.created };
                    accepted.push((image.given.clone(), task));
                }
                BatchItem::Refused(r) => {
                    refused += 1;
                    refuse(&image.given, &format!("{}: {}", r.error.code, r.error.message));
                }
            }
        }
    }
    Ok(refused)
}

/// Checks every source and the submit command each one makes; one line naming every problem,
/// and nothing submitted, when any is unusable.
fn check_all(args: &SubmitArgs) -> anyhow::Result<Vec<Source>> {
    let mut checked = Vec::new();
    let mut problems = Vec::new();
    for given in &args.sources {
        let is_url = given.starts_with("http://") || given.starts_with("https://");
        let checked_one = if !is_url && Path::new(given).is_dir() {
            walk(args, given).map(Source::Dir)
        } else {
            check(args, given).map(Source::One)
        };
        match checked_one {
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

/// The submit command of every source, before its URL or blob key is set.
fn base_command(args: &SubmitArgs) -> SubmitTask {
    SubmitTask {
        callback_url: args.callback_url.clone(),
        labels: args.labels.iter().cloned().collect(),
        priority: args.priority,
        ..SubmitTask::default()
    }
}

fn check(args: &SubmitArgs, given: &str) -> Result<Checked, String> {
    let mut submit = base_command(args);
    if given.starts_with("http://") || given.starts_with("https://") {
        submit.url = Some(given.to_owned());
        submit.validate().map_err(|e| e.to_string())?;
        return Ok(Checked { given: given.to_owned(), file: None, submit });
    }
    let path = PathBuf::from(given);
    check_image_file(&path)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    file_command(args, given.to_owned(), path, name)
}

/// The checked source of image file `path`, labelled `file=<name>` (unless `--label file=`).
fn file_command(args: &SubmitArgs, given: String, path: PathBuf, name: Option<String>) -> Result<Checked, String> {
    let mut submit = base_command(args);
    if let Some(name) = name {
        submit.labels.entry(FILE_LABEL.to_owned()).or_insert(name);
    }
    submit.blob = Some(PLACEHOLDER_KEY.to_owned());
    submit.validate().map_err(|e| e.to_string())?;
    submit.blob = None;
    Ok(Checked { given, file: Some(path), submit })
}

/// The images under directory `given`, in path order: every regular file that starts like an
/// image, and every symbolic link to one inside the directory; hidden entries (`.name`) and
/// links to directories are skipped. An unreadable entry, or a directory without images, is a
/// problem.
fn walk(args: &SubmitArgs, given: &str) -> Result<Walked, String> {
    let root = Path::new(given);
    let real_root = std::fs::canonicalize(root).map_err(|e| format!("cannot read it ({e})"))?;
    let unreadable = |path: &Path, e: std::io::Error| format!("cannot read {} ({e})", path.display());
    let (mut dirs, mut files, mut skipped) = (vec![root.to_owned()], Vec::new(), 0);
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| unreadable(&dir, e))? {
            let entry = entry.map_err(|e| unreadable(&dir, e))?;
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let kind = entry.file_type().map_err(|e| unreadable(&path, e))?;
            if kind.is_dir() {
                dirs.push(path);
                continue;
            }
            if !kind.is_file() && !kind.is_symlink() {
                skipped += 1;
                continue;
            }
            // A link is followed only to a file inside the directory.
            match std::fs::canonicalize(&path) {
                Ok(real) if real.starts_with(&real_root) && real.is_file() => files.push((path, real)),
                Err(e) if kind.is_file() => return Err(unreadable(&path, e)),
                // a broken link, or one to a directory or out of this one
                _ => skipped += 1,
            }
        }
    }
    // In path order, each file once (the first of its paths: a link to a file also listed).
    files.sort();
    let mut seen = HashSet::new();
    let files: Vec<PathBuf> = files.into_iter().filter(|(_, real)| seen.insert(real.clone())).map(|(p, _)| p).collect();
    let mut images = Vec::new();
    for path in files {
        if let Err(problem) = check_image_file(&path) {
            if problem.starts_with("not an image") {
                skipped += 1;
                continue;
            }
            return Err(format!("{}: {problem}", path.display()));
        }
        let relative = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
        let given = path.to_string_lossy().into_owned();
        let problem = |e: String| format!("{given}: {e}");
        images.push(file_command(args, given.clone(), path, Some(relative)).map_err(problem)?);
    }
    if images.is_empty() {
        return Err(format!("no image files in it ({skipped} other file(s))"));
    }
    Ok(Walked { images, skipped })
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
    // Installed before the first look: Ctrl-C from here on stops the waiting, not the tasks.
    let interrupted = Shutdown::on_signals().context("installing the Ctrl-C handler")?;
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
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            () = interrupted.wait() => {
                progress.finish_and_clear();
                let running: Vec<&str> = finished
                    .iter()
                    .zip(accepted)
                    .filter(|(slot, _)| slot.is_none())
                    .map(|(_, (_, task))| task.task_id.as_str())
                    .collect();
                eprintln!("imagepipe submit: {}", stopped_waiting(&running));
                return Ok(ExitCode::from(INTERRUPTED));
            }
        }
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

/// The exit status of a `--wait` stopped by Ctrl-C (128 + SIGINT, as the shell's).
const INTERRUPTED: u8 = 130;

/// What a `--wait` stopped by Ctrl-C says: the tasks go on, and how to follow them.
fn stopped_waiting(running: &[&str]) -> String {
    let follow = match running {
        [one] => format!("imagepipe watch --task {one}"),
        _ => "imagepipe watch --type task.completed,task.failed,task.cancelled (or imagepipe status ID)".to_owned(),
    };
    format!(
        "stopped waiting; {} task(s) keep running in the pipeline ({}); follow them with {follow}",
        running.len(),
        running.join(", ")
    )
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
