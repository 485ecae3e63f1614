//! The `imagepipe` binary's API commands against an in-process pipeline on 127.0.0.1:0.

mod common;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use imagepipe::Pipeline;
use imagepipe_net::testing::{FixtureServer, Route};

/// Runs the binary with `args` (off the async runtime's threads).
async fn imagepipe(args: Vec<String>) -> Output {
    imagepipe_with_env(args, Vec::new()).await
}

/// Runs the binary with `args` and the environment variables `env` besides the test's own
/// (without any `IMAGEPIPE_API`/`IMAGEPIPE_TOKEN` the test process may have).
async fn imagepipe_with_env(args: Vec<String>, env: Vec<(&'static str, String)>) -> Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
            .args(args)
            .env_remove("IMAGEPIPE_API")
            .env_remove("IMAGEPIPE_TOKEN")
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// Runs the binary with `args` in the directory `dir`.
async fn imagepipe_in(dir: &Path, args: Vec<String>) -> Output {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
            .args(args)
            .current_dir(dir)
            .env_remove("IMAGEPIPE_API")
            .env_remove("IMAGEPIPE_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The standard output of a run that succeeded.
fn ok(out: &Output) -> String {
    assert!(out.status.success(), "exit {:?}: {}{}", out.status.code(), text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// The one-line error of a run that exited with 1.
fn one_line_error(out: &Output) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stdout: {} stderr: {err}", text(&out.stdout));
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

/// The one-line error of a run refused for its arguments (exit 2).
fn usage_error(out: &Output) -> String {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stdout: {} stderr: {err}", text(&out.stdout));
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    err
}

/// Whether `s` is a time as the CLI shows it: RFC 3339 in UTC with milliseconds.
fn is_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 24
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'.',
            23 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

/// The RFC 3339 times in `line`.
fn times(line: &str) -> Vec<&str> {
    line.split_whitespace().filter(|w| is_rfc3339(w)).collect()
}

/// The line of `output` starting with `name`.
fn row<'a>(output: &'a str, name: &str) -> &'a str {
    output.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} line in {output}"))
}

/// The ids of a `list --json` answer.
fn listed(out: &Output) -> Vec<String> {
    let tasks: serde_json::Value = serde_json::from_str(&ok(out)).unwrap();
    tasks.as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_wait_status_and_dlq_go_through_the_api_and_errors_are_one_line() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(common::settings(&model_dir, &work)).await.unwrap();
    let api = pipeline.api_url();
    let photo = concat!(env!("CARGO_MANIFEST_DIR"), "/samples/coffee.jpg");

    let out = imagepipe(args(&["submit", photo, "--wait", "--json", "--api", &api])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let finished: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(finished[0]["state"], "completed", "{finished}");
    let id = finished[0]["id"].as_str().unwrap().to_owned();

    let out = imagepipe(args(&["status", &id, "--api", &api])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let status = text(&out.stdout);
    assert!(status.contains("completed") && status.contains("espresso"), "{status}");

    let out = imagepipe(args(&["status", &id, "--json", "--api", &api])).await;
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["id"], id.as_str());

    // A reader that has stopped reading (`imagepipe status ID | head -3`): a quiet exit 0.
    for command in [vec!["status", &id], vec!["status", &id, "--json"], vec!["dlq", "list"]] {
        let api = api.clone();
        let command: Vec<String> = command.iter().map(|s| (*s).to_owned()).collect();
        let out = tokio::task::spawn_blocking(move || {
            let (reader, writer) = std::io::pipe().unwrap();
            drop(reader);
            std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
                .args(&command)
                .args(["--api", &api])
                .env_remove("IMAGEPIPE_TOKEN")
                .stdout(writer)
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert_eq!((out.status.code(), text(&out.stderr)), (Some(0), String::new()), "a closed pipe");
    }

    let out = imagepipe(args(&["dlq", "list", "--json", "--api", &api])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(), serde_json::json!([]));

    let out = imagepipe(args(&["status", "tsk_nope", "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("404") && err.contains("no task tsk_nope"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");

    let out = imagepipe(args(&["submit", "/no/such/file.jpg", "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("/no/such/file.jpg"), "{}", text(&out.stderr));

    pipeline.stop().await.unwrap();

    let out = imagepipe(args(&["status", &id, "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("cannot reach the imagepipe API") && err.trim_end().lines().count() == 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_takes_the_api_and_its_token_from_the_environment() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    settings.http.auth_token = Some("cli-t0ken-0123456789abcdef0123456789".to_owned().into());
    let pipeline = Pipeline::start(settings).await.unwrap();
    let api = pipeline.api_url();

    let out = imagepipe_with_env(args(&["stats", "--json"]), vec![("IMAGEPIPE_API", api.clone())]).await;
    assert_eq!(out.status.code(), Some(1), "no token: {}", text(&out.stdout));
    assert!(text(&out.stderr).contains("401"), "{}", text(&out.stderr));

    let env =
        vec![("IMAGEPIPE_API", api.clone()), ("IMAGEPIPE_TOKEN", "cli-t0ken-0123456789abcdef0123456789".to_owned())];
    let out = imagepipe_with_env(args(&["stats", "--json"]), env).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(stats["tasks"].is_object(), "{stats}");

    let out = imagepipe_with_env(
        args(&["--help"]),
        vec![("IMAGEPIPE_TOKEN", "cli-t0ken-0123456789abcdef0123456789".to_owned())],
    )
    .await;
    assert!(!text(&out.stdout).contains("cli-t0ken-0123456789abcdef0123456789"), "the token is not shown in --help");
    pipeline.stop().await.unwrap();
}

/// A sample photo's path.
fn sample(name: &str) -> String {
    format!("{}/samples/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_read_like_prose_in_submit_status_history_list_thumbnail_watch_and_search() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(common::settings(&model_dir, &work)).await.unwrap();
    let api = pipeline.api_url();
    let coffee = sample("coffee.jpg");

    // submit --wait: each task's top label and tags.
    let out = imagepipe(args(&["submit", &coffee, "--label", "album=summer", "--wait", "--api", &api])).await;
    let submitted = ok(&out);
    let done = submitted.lines().find(|l| l.contains("completed")).unwrap_or_else(|| panic!("{submitted}"));
    assert!(done.contains("coffee.jpg  completed  espresso (") && done.contains("beverage"), "{submitted}");
    let id = done.split_whitespace().next().unwrap().to_owned();
    let out = imagepipe(args(&["submit", &sample("chelsea.jpg"), "--wait", "--api", &api])).await;
    let cat = ok(&out).split_whitespace().next().unwrap().to_owned();

    // status: the uploaded file's name, RFC 3339 times, durations.
    let status = ok(&imagepipe(args(&["status", &id, "--api", &api])).await);
    assert!(row(&status, "source").contains("coffee.jpg (uploaded, sha256:"), "{status}");
    assert!(row(&status, "labels").contains("album=summer, file=coffee.jpg"), "{status}");
    assert_eq!(times(row(&status, "created")).len(), 1, "{status}");
    let finished = row(&status, "finished");
    assert!(times(finished).len() == 1 && finished.contains("(took "), "{status}");
    for step in ["download", "metadata", "analyze"] {
        let line = row(&status, step);
        assert!(line.ends_with(" ms, 1 attempt") || line.ends_with(" s, 1 attempt"), "{status}");
    }
    assert!(row(&status, "top label").contains("espresso ("), "{status}");
    assert_eq!(row(&status, "state"), "state      completed", "{status}");

    // history: every transition with its time.
    let history = ok(&imagepipe(args(&["history", &id, "--api", &api])).await);
    let lines: Vec<&str> = history.lines().skip(1).collect();
    assert!(lines.iter().all(|l| times(l).len() == 1), "{history}");
    assert!(lines.first().is_some_and(|l| l.contains("created")), "{history}");
    assert!(lines.last().is_some_and(|l| l.contains("completed") && l.contains("analyze #1")), "{history}");
    assert!(history.contains("queued → downloading"), "{history}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&imagepipe(args(&["history", &id, "--json", "--api", &api])).await)).unwrap();
    assert_eq!(json["taskId"], id.as_str());

    // list: filters by state in the API, by label and creation time here.
    let table = ok(&imagepipe(args(&["list", "--api", &api])).await);
    let coffee_row = table.lines().find(|l| l.contains(&id)).unwrap_or_else(|| panic!("{table}"));
    assert!(coffee_row.contains("completed") && coffee_row.contains("coffee.jpg (uploaded"), "{table}");
    assert!(coffee_row.contains("espresso (") && times(coffee_row).len() == 1, "{table}");
    let list = |extra: &[&str]| {
        let mut a = args(&["list", "--json", "--api", &api]);
        a.extend(args(extra));
        imagepipe(a)
    };
    // Newest first, as the dashboard; --oldest-first the other way.
    assert_eq!(listed(&list(&[]).await), [cat.as_str(), id.as_str()]);
    assert_eq!(listed(&list(&["--oldest-first"]).await), [id.as_str(), cat.as_str()]);
    assert_eq!(listed(&list(&["--label", "album=summer"]).await), [id.as_str()]);
    assert_eq!(listed(&list(&["--label", "file=chelsea.jpg", "--state", "completed"]).await), [cat.as_str()]);
    assert_eq!(listed(&list(&["--state", "failed"]).await), Vec::<String>::new());
    assert_eq!(listed(&list(&["--since", "1h"]).await), [cat.as_str(), id.as_str()]);
    assert_eq!(listed(&list(&["--since", "2100-01-01T00:00:00Z"]).await), Vec::<String>::new());
    // A listing cut by --limit says how to go on; the last page says nothing.
    let first = list(&["--limit", "1"]).await;
    assert_eq!(listed(&first), [cat.as_str()]);
    let hint = text(&first.stderr);
    let cursor = hint.split_whitespace().skip_while(|w| *w != "--cursor").nth(1);
    let cursor = cursor.unwrap_or_else(|| panic!("no --cursor in {hint:?}")).to_owned();
    let rest = list(&["--limit", "1", "--cursor", &cursor]).await;
    assert_eq!(listed(&rest), [id.as_str()]);
    assert_eq!(text(&rest.stderr), "", "nothing more after the last task");
    assert_eq!(text(&list(&[]).await.stderr), "", "nothing more when everything was shown");
    let help = ok(&imagepipe(args(&["list", "--help"])).await);
    assert!(help.contains("paused"), "{help}");
    let empty = ok(&imagepipe(args(&["list", "--state", "cancelled", "--api", &api])).await);
    assert_eq!(empty.trim(), "no tasks");
    let err = usage_error(&imagepipe(args(&["list", "--since", "yesterday", "--api", &api])).await);
    assert!(err.contains("\"yesterday\" is neither a duration"), "{err}");

    // thumbnail: a real image (WebP by default), to the file named, to the default name, or to
    // a pipe; --name picks another derivative (the JPEG preview).
    let webp = |bytes: &[u8]| bytes.starts_with(b"RIFF") && bytes.get(8..12) == Some(b"WEBP");
    let file = work.path().join("thumb.webp");
    ok(&imagepipe(args(&["thumbnail", &id, "-o", file.to_str().unwrap(), "--api", &api])).await);
    assert!(webp(&std::fs::read(&file).unwrap()), "a WebP");
    let said = ok(&imagepipe_in(work.path(), args(&["thumbnail", &id, "--api", &api])).await);
    let default = work.path().join(format!("{id}-thumbnail.webp"));
    assert!(said.contains(&format!("{id}-thumbnail.webp")), "{said}");
    assert!(webp(&std::fs::read(&default).unwrap()), "a WebP");
    let out = imagepipe(args(&["thumbnail", &id, "-o", "-", "--api", &api])).await;
    assert!(out.status.success() && webp(&out.stdout), "{}", text(&out.stderr));
    let said = ok(&imagepipe_in(work.path(), args(&["thumbnail", &id, "--name", "preview", "--api", &api])).await);
    assert!(said.contains(&format!("{id}-preview.jpg")), "{said}");
    let preview = std::fs::read(work.path().join(format!("{id}-preview.jpg"))).unwrap();
    assert!(preview.starts_with(&[0xff, 0xd8, 0xff]), "the preview is a JPEG");
    // A file name saying another format than the derivative's is refused, naming both.
    let png = work.path().join("preview.png");
    let out =
        imagepipe(args(&["thumbnail", &id, "--name", "preview", "-o", png.to_str().unwrap(), "--api", &api])).await;
    let err = one_line_error(&out);
    assert!(err.contains("is JPG (image/jpeg)") && err.contains("preview.jpg"), "{err}");
    assert!(!png.exists(), "nothing written");
    let said = ok(&imagepipe_in(work.path(), args(&["thumbnail", &id, "-o", "t.WEBP", "--api", &api])).await);
    assert!(said.contains("t.WEBP (WEBP, "), "{said}");

    // Resuming (or pausing) a finished task is an error, as cancelling one is.
    for verb in ["resume", "pause", "cancel"] {
        let err = one_line_error(&imagepipe(args(&[verb, &id, "--api", &api])).await);
        assert!(err.contains("409") && err.contains("the task is already completed"), "{verb}: {err}");
    }
    let err = imagepipe(args(&["thumbnail", &id, "--name", "poster", "--api", &api])).await;
    assert!(
        !err.status.success() && text(&err.stderr).contains("no derivative named \"poster\""),
        "{}",
        text(&err.stderr)
    );

    // watch --task of a finished task: its final state, at once.
    let out = imagepipe(args(&["watch", "--task", &id, "--api", &api])).await;
    let line = ok(&out);
    assert!(line.starts_with(&format!("{id}  completed  espresso (")), "{line}");
    let out = imagepipe(args(&["watch", "--task", &id, "--json", "--api", &api])).await;
    let task: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(task["state"], "completed");

    // watch --type takes a comma-separated list, as search does.
    let mut watching = std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
        .args(["watch", "--type", "task.created,task.completed", "--count", "2", "--api", &api])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while watching.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            watching.kill().unwrap();
            panic!("watch did not see two events");
        }
        // Events published before the stream opened are not shown: submit until two were.
        ok(&imagepipe(args(&["submit", &coffee, "--api", &api])).await);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = watching.wait_with_output().unwrap();
    let watched = ok(&out);
    assert_eq!(watched.lines().count(), 2, "{watched}");
    for line in watched.lines() {
        assert!(is_rfc3339(line.split_whitespace().next().unwrap()), "{watched}");
        let kind = line.split_whitespace().nth(1).unwrap();
        assert!(kind == "task.created" || kind == "task.completed", "{watched}");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found: serde_json::Value =
            serde_json::from_str(
                &ok(&imagepipe(args(&["search", "espresso,beverage", "--json", "--api", &api])).await),
            )
            .unwrap();
        if found.to_string().contains(&id) {
            break;
        }
        assert!(Instant::now() < deadline, "search espresso,beverage never found {id}: {found}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // search, similar and duplicates: a header, and which image each task is.
    let found = ok(&imagepipe(args(&["search", "espresso", "--api", &api])).await);
    let mut lines = found.lines();
    assert_eq!(lines.next().map(|l| l.split_whitespace().collect::<Vec<_>>()), Some(vec!["task", "score", "source"]));
    let hit = found.lines().find(|l| l.starts_with(&id)).unwrap_or_else(|| panic!("{found}"));
    assert!(hit.contains("coffee.jpg (uploaded, sha256:"), "{found}");
    let similar = until(|| async {
        let said = ok(&imagepipe(args(&["similar", &cat, "--api", &api])).await);
        said.contains(&id).then_some(said)
    })
    .await;
    assert!(similar.starts_with("task") && similar.lines().next().unwrap().ends_with("source"), "{similar}");
    let row = similar.lines().find(|l| l.starts_with(&id)).unwrap();
    assert!(row.contains("coffee.jpg (uploaded, sha256:"), "{similar}");
    // Coffee went in more than once (the watch above): a group of near-duplicates.
    let duplicates = until(|| async {
        let said = ok(&imagepipe(args(&["duplicates", "--api", &api])).await);
        said.lines().any(|l| l.contains(&id)).then_some(said)
    })
    .await;
    let header = duplicates.lines().nth(1).map(|l| l.split_whitespace().collect::<Vec<_>>());
    assert_eq!(header, Some(vec!["group", "task", "source"]), "{duplicates}");
    let row = duplicates.lines().find(|l| l.contains(&id)).unwrap();
    assert!(row.starts_with('1') && row.contains("coffee.jpg (uploaded"), "{duplicates}");
    pipeline.stop().await.unwrap();
}

/// The first `Some` of `attempt`, tried every 200 ms for up to 30 s.
async fn until<T, F: std::future::Future<Output = Option<T>>>(attempt: impl Fn() -> F) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = attempt().await {
            return found;
        }
        assert!(Instant::now() < deadline, "not within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_local_url_names_the_key_that_allows_it() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    settings.net.allow_cidrs = Vec::new();
    let pipeline = Pipeline::start(settings).await.unwrap();
    let api = pipeline.api_url();

    // The guard decides before any connection: nothing listens on port 9, nothing is dialled.
    let out = imagepipe(args(&["submit", "http://127.0.0.1:9/cat.jpg", "--wait", "--json", "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let finished: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = finished[0]["id"].as_str().unwrap().to_owned();
    let status = ok(&imagepipe(args(&["status", &id, "--api", &api])).await);
    assert!(status.contains("failed at download") && status.contains("address_refused"), "{status}");
    assert!(status.contains("download.allow_cidrs") && status.contains("IMAGEPIPE_DOWNLOAD__ALLOW_CIDRS"), "{status}");
    pipeline.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_task_says_where_and_why_and_a_cancelled_one_ends_its_watch() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    settings.coordinator.retry_min_backoff = Duration::from_millis(10);
    settings.coordinator.retry_max_backoff = Duration::from_millis(40);
    settings.coordinator.sweep_interval = Duration::from_millis(50);
    settings.download.read_timeout = Duration::from_millis(1500);
    let pipeline = Pipeline::start(settings).await.unwrap();
    let api = pipeline.api_url();
    let images =
        FixtureServer::start([("/broken.jpg", Route::status(500)), ("/slow.jpg", Route::Silent)]).await.unwrap();

    let broken = format!("{}?token=s3cret", images.url("/broken.jpg"));
    let out = imagepipe(args(&["submit", &broken, "--wait", "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    let line = said.lines().find(|l| l.contains("failed")).unwrap_or_else(|| panic!("{said}"));
    assert!(line.contains("failed at download after 5 attempts: http_500: "), "{said}");
    assert!(!line.contains("gave up after"), "said once: {said}");
    assert!(text(&out.stderr).contains("1 of 1 task(s) did not complete"), "{}", text(&out.stderr));
    let id = line.split_whitespace().next().unwrap().to_owned();

    let status = ok(&imagepipe(args(&["status", &id, "--api", &api])).await);
    assert!(row(&status, "state").contains("failed at download after 5 attempts: http_500: "), "{status}");
    assert!(row(&status, "download").contains("failed after 5 attempts"), "{status}");
    assert_eq!(row(&status, "source"), format!("source     {}", images.url("/broken.jpg")), "redacted: {status}");
    assert!(!status.contains("s3cret"), "{status}");

    // A task whose download hangs: cancelling it tells the worker to stop the running attempt,
    // and a watch of it ends with its final state.
    let out = imagepipe(args(&["submit", &images.url("/slow.jpg"), "--api", &api])).await;
    let slow = ok(&out).split_whitespace().next().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while images.requests().iter().filter(|r| r.target == "/slow.jpg").count() == 0 {
        assert!(Instant::now() < deadline, "the download never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The watch follows the task before the cancel: the worker may stop the attempt at once.
    let watching = std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
        .args(["watch", "--task", &slow, "--api", &api])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (watching, said) = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut watching = watching;
        let mut stderr = std::io::BufReader::new(watching.stderr.take().unwrap());
        let mut line = String::new();
        stderr.read_line(&mut line).unwrap();
        (watching, line)
    })
    .await
    .unwrap();
    assert!(said.starts_with(&format!("imagepipe watch: following {slow} (downloading)")), "{said}");
    let out = imagepipe(args(&["cancel", &slow, "--reason", "not needed", "--api", &api])).await;
    let said = ok(&out);
    assert!(said.contains("cancelling: its download step is told to stop (within a second if it runs"), "{said}");
    let out = tokio::task::spawn_blocking(move || watching.wait_with_output().unwrap()).await.unwrap();
    let watched = ok(&out);
    assert!(watched.lines().any(|l| l.contains("task.cancelled")), "{watched}");
    assert_eq!(watched.lines().last(), Some(format!("{slow}  cancelled: not needed").as_str()), "{watched}");

    let history = ok(&imagepipe(args(&["history", &slow, "--api", &api])).await);
    assert!(history.lines().nth(1).is_some_and(|l| l.contains("created")), "{history}");
    assert!(history.lines().any(|l| l.contains("cancel_requested") && l.contains("not needed")), "{history}");
    assert!(history.lines().any(|l| l.contains("downloading → cancelled")), "{history}");

    let err = one_line_error(&imagepipe(args(&["cancel", &slow, "--api", &api])).await);
    assert!(err.contains("409") && err.contains("already cancelled"), "{err}");
    let err = one_line_error(&imagepipe(args(&["thumbnail", &slow, "--api", &api])).await);
    assert!(err.contains("no thumbnail"), "{err}");
    pipeline.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_source_is_checked_before_any_is_submitted_and_a_bad_event_type_is_one_line() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    // Uploads over 1 KB are refused: a source that passes every check can still fail.
    settings.download.max_bytes = 1_000;
    let pipeline = Pipeline::start(settings).await.unwrap();
    let api = pipeline.api_url();
    let images = FixtureServer::start([]).await.unwrap();
    let coffee = sample("coffee.jpg");
    let missing = work.path().join("missing.jpg");
    let missing = missing.to_str().unwrap();
    let notes = work.path().join("notes.txt");
    std::fs::write(&notes, "not a photo").unwrap();
    let url = images.url("/a.jpg");

    let err = one_line_error(&imagepipe(args(&["submit", &coffee, missing, "--api", &api])).await);
    assert!(err.contains("nothing submitted") && err.contains(missing), "{err}");
    assert!(!err.contains("coffee.jpg"), "only the unusable source is named: {err}");
    let err = one_line_error(&imagepipe(args(&["submit", &url, missing, "--wait", "--api", &api])).await);
    assert!(err.contains("nothing submitted") && err.contains(missing), "{err}");
    let err = one_line_error(&imagepipe(args(&["submit", notes.to_str().unwrap(), "http://", "--api", &api])).await);
    assert!(err.contains("2 of 2") && err.contains("not an image (text)") && err.contains("`url`"), "{err}");
    assert_eq!(listed(&imagepipe(args(&["list", "--json", "--api", &api])).await), Vec::<String>::new());

    // A later source the API refuses: the error names the task already submitted.
    let out = imagepipe(args(&["submit", &url, &coffee, "--api", &api])).await;
    let err = one_line_error(&out);
    let first = text(&out.stdout).split_whitespace().next().unwrap_or_default().to_owned();
    assert!(first.starts_with("tsk_"), "the accepted task is printed: {}", text(&out.stdout));
    assert!(err.contains("uploading") && err.contains(&format!("submitted before it: {first} ({url})")), "{err}");
    assert_eq!(listed(&imagepipe(args(&["list", "--json", "--api", &api])).await), [first]);

    for bad in ["bogus", "task.Completed", "task.completed,nope.*"] {
        let started = Instant::now();
        let err = usage_error(&imagepipe(args(&["watch", "--type", bad, "--api", &api])).await);
        assert!(err.contains("--type") && err.contains(&format!("{:?}", bad.split(',').next_back().unwrap())), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "an error, not a wait");
    }
    pipeline.stop().await.unwrap();
}

/// What a subscriber group skipped as already handled, so far in this process.
fn duplicates_skipped(group: &str) -> u64 {
    let text = imagepipe_runtime::metrics::install().unwrap().render();
    let series = format!("{}{{source=\"{group}\"}} ", imagepipe_runtime::metrics::SUBSCRIBER_DUPLICATES);
    text.lines().find_map(|line| line.strip_prefix(&series)).map_or(0, |n| n.parse::<f64>().unwrap() as u64)
}

/// The `stats --json` answer once `done` holds for it.
async fn stats_once(api: &str, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats: serde_json::Value =
            serde_json::from_str(&ok(&imagepipe(args(&["stats", "--json", "--api", api])).await)).unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "stats never got there: {stats}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `imagepipe run` on the embedded store (every file under `store.path`) stopped and started
/// again: `search` lists the same tasks and `stats` counts the same (completed = 2, not 0), and
/// events delivered again after the restart are skipped by every subscriber group, whose dedup
/// sets were kept too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_run_keeps_search_stats_and_what_each_subscriber_handled() {
    use imagepipe_bus::{Selector, Subscription};
    use imagepipe_contracts::{Event, EventType, decode};

    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let settings = common::settings(&model_dir, &work);
    let first = Pipeline::start(settings.clone()).await.unwrap();
    let events = first.bus().events.subscribe(Subscription::new("restart-test", Selector::all())).await.unwrap();
    let api = first.api_url();

    let out =
        imagepipe(args(&["submit", &sample("coffee.jpg"), &sample("chelsea.jpg"), "--wait", "--json", "--api", &api]))
            .await;
    let finished: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    let ids: Vec<String> = finished.as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids.len(), 2, "{finished}");
    let mut top_tags = Vec::new();
    for task in first.wait_for(&ids, Duration::from_secs(1)).await.unwrap() {
        let analysis = task.outputs.analysis.expect("analysed");
        top_tags.push(imagepipe_tag_indexer_worker::normalize_tag(&analysis.tags[0].label));
    }
    let query = top_tags.join(",");
    let search = || async {
        let out = imagepipe(args(&["search", &query, "--mode", "any", "--json", "--api", &api])).await;
        serde_json::from_str::<serde_json::Value>(&ok(&out)).unwrap()["results"].clone()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let found = loop {
        let found = search().await;
        if ids.iter().all(|id| found.to_string().contains(id.as_str())) {
            break found;
        }
        assert!(Instant::now() < deadline, "search {query} never listed {ids:?}: {found}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let counted =
        |stats: &serde_json::Value| stats["tasks"]["completed"] == 2 && stats["latencies"]["end_to_end"]["count"] == 2;
    let stats = stats_once(&api, counted).await;

    // The events of the first run, to deliver again after the restart.
    let mut again = Vec::new();
    loop {
        let batch = events.fetch(64, Duration::from_millis(200)).await.unwrap();
        if batch.is_empty() {
            break;
        }
        for delivery in batch {
            let event: Event<serde_json::Value> = decode(&delivery.message.payload).unwrap();
            if matches!(event.event_type, EventType::TaskCompleted | EventType::ImageAnalyzed) {
                again.push((event.event_type, delivery.message.clone()));
            }
            delivery.ack().await.unwrap();
        }
    }
    assert_eq!(again.len(), 4, "task.completed and image.analyzed of both tasks");
    drop(events);
    first.stop().await.unwrap();

    let second = Pipeline::start(settings).await.unwrap();
    let api = second.api_url();
    let mut restarted = stats_once(&api, |_| true).await;
    let mut before = stats.clone();
    // The last hour's per-minute series moves with the clock; its totals must not.
    for view in [&mut restarted, &mut before] {
        view["lastHour"].as_object_mut().expect("lastHour").remove("perMinute");
    }
    assert_eq!(restarted, before, "the same counts and latencies after the restart");
    let counts_before = before;
    let search = || async {
        let out = imagepipe(args(&["search", &query, "--mode", "any", "--json", "--api", &api])).await;
        serde_json::from_str::<serde_json::Value>(&ok(&out)).unwrap()["results"].clone()
    };
    assert_eq!(search().await, found, "the same tasks, scores and thumbnails after the restart");
    let table = ok(&imagepipe(args(&["stats", "--api", &api])).await);
    assert!(table.contains("completed=2"), "{table}");

    // Analytics takes all four events again, notification the two task.completed, the tag
    // indexer the two image.analyzed.
    let groups = [("analytics", 4), ("notification", 2), ("tag-indexer", 2)];
    let before: Vec<u64> = groups.iter().map(|(group, _)| duplicates_skipped(group)).collect();
    for (event_type, message) in again {
        second.bus().events.publish(event_type.as_str(), message).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for ((group, again), before) in groups.into_iter().zip(before) {
        while duplicates_skipped(group) < before + again {
            assert!(Instant::now() < deadline, "{group} did not skip the events it handled before the restart");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The per-minute series moves with the clock (a minute may have turned since); the counts
    // and latencies must not.
    let mut after = stats_once(&api, |_| true).await;
    after["lastHour"].as_object_mut().expect("lastHour").remove("perMinute");
    assert_eq!(after, counts_before, "nothing counted twice");
    second.stop().await.unwrap();
}

/// `imagepipe submit DIR/`: the directory's images (in subdirectories too, a link to one inside
/// once, hidden files and what is not an image skipped, a link out of it not followed) are
/// uploaded and submitted in one batch request; an image the API refuses (here: larger than
/// `download.max_bytes`) is reported on its own line, the others still go through, and the exit
/// status says one was refused. `--priority` reaches the tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_dir_uploads_and_batches_its_images_and_reports_each_refused_one() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    settings.download.max_bytes = 50_000; // chelsea.jpg (34 KB) fits, coffee.jpg (71 KB) does not
    let pipeline = Pipeline::start(settings).await.unwrap();
    let api = pipeline.api_url();
    let photos = tempfile::tempdir().unwrap();
    let dir = photos.path().join("photos");
    std::fs::create_dir_all(dir.join("cats")).unwrap();
    std::fs::copy(sample("coffee.jpg"), dir.join("coffee.jpg")).unwrap();
    std::fs::copy(sample("chelsea.jpg"), dir.join("cats/chelsea.jpg")).unwrap();
    std::fs::copy(sample("chelsea.jpg"), dir.join(".hidden.jpg")).unwrap();
    std::fs::write(dir.join("notes.txt"), "not a photo").unwrap();
    std::os::unix::fs::symlink(dir.join("cats/chelsea.jpg"), dir.join("cats/again.jpg")).unwrap();
    std::os::unix::fs::symlink(sample("rocket.jpg"), dir.join("outside.jpg")).unwrap();
    let given = format!("{}/", dir.display());

    // (No --wait here: this build's workers do not read the priority lanes yet.)
    let out = imagepipe(args(&["submit", &given, "--priority", "low", "--json", "--api", &api])).await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "one image refused: {err}");
    let accepted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let accepted = accepted.as_array().unwrap();
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    assert_eq!(accepted[0]["created"], true);
    let refused = err.lines().find(|l| l.contains("refused:")).unwrap_or_else(|| panic!("{err}"));
    assert!(refused.contains("coffee.jpg") && refused.contains("413"), "{err}");
    assert!(err.contains("1 submitted, 1 refused, 2 other file(s) skipped"), "{err}");
    let id = accepted[0]["taskId"].as_str().unwrap();
    let out = imagepipe(args(&["status", id, "--json", "--api", &api])).await;
    let task: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
    assert_eq!(task["priority"], "low");
    assert_eq!(task["labels"]["file"], "cats/again.jpg", "the image's first path in the directory");

    // Without --json: each accepted task on stdout as `id  path`; --wait follows them.
    let cats = dir.join("cats");
    let out = imagepipe(args(&["submit", cats.to_str().unwrap(), "--wait", "--api", &api])).await;
    let said = ok(&out);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    assert!(lines[0].starts_with("tsk_") && lines[0].ends_with("cats/again.jpg"), "{said}");
    assert!(lines[1].contains("again.jpg  completed  "), "{said}");
    assert!(text(&out.stderr).contains("1 submitted, 0 refused"), "{}", text(&out.stderr));

    let empty = photos.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = one_line_error(&imagepipe(args(&["submit", empty.to_str().unwrap(), "--api", &api])).await);
    assert!(err.contains("nothing submitted") && err.contains("no image files in it"), "{err}");
    let err = usage_error(&imagepipe(args(&["submit", &given, "--priority", "urgent", "--api", &api])).await);
    assert!(err.contains("high, normal, low"), "{err}");
    pipeline.stop().await.unwrap();
}

/// `imagepipe dlq replay --reason ...`: a dry run says how many match; without a terminal
/// nothing is replayed unless `--yes`; with it, each match goes back to its queue (here: the
/// submit queue, so each becomes a task). Replaying by id still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_replay_by_filter_counts_first_and_replays_with_yes() {
    use imagepipe_coordinator::store::DeadLetter;

    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(common::settings(&model_dir, &work)).await.unwrap();
    let api = pipeline.api_url();
    let photo = std::fs::read(sample("chelsea.jpg")).unwrap();
    let key = pipeline.blobs().put(photo.into()).await.unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let letter = |id: &str, reason: &str, task: &str, ago_ms: u64| DeadLetter {
        id: id.into(),
        source: "tasks.submit".into(),
        dlq: "dlq.tasks.submit".into(),
        reason: reason.into(),
        delivery_count: 5,
        dead_lettered_at: now - ago_ms,
        key: Some(task.into()),
        message_id: None,
        headers: vec![],
        body: format!(r#"{{"taskId":"{task}","blob":"{key}"}}"#),
    };
    let store = pipeline.engine().store();
    for l in [
        letter("dl_1", "store timeout", "tsk_again_1", 7_200_000),
        letter("dl_2", "Timeout talking to redis", "tsk_again_2", 60_000),
        letter("dl_3", "store timeout", "tsk_again_3", 30_000),
        letter("dl_4", "http_503", "tsk_again_4", 30_000),
    ] {
        store.put_dead_letter(&l).await.unwrap();
    }
    let archived = || async {
        let out = imagepipe(args(&["dlq", "list", "--json", "--api", &api])).await;
        let list: serde_json::Value = serde_json::from_str(&ok(&out)).unwrap();
        list.as_array().unwrap().iter().map(|l| l["id"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };

    let said = ok(&imagepipe(args(&["dlq", "replay", "--reason", "timeout", "--dry-run", "--api", &api])).await);
    assert!(said.starts_with("3 dead letters match\n  dl_1, dl_2, dl_3"), "{said}");
    let out = imagepipe(args(&["dlq", "replay", "--reason", "timeout", "--since", "1h", "--api", &api])).await;
    assert_eq!(out.status.code(), Some(1), "no terminal, no --yes");
    assert!(text(&out.stdout).starts_with("2 dead letters match"), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("nothing replayed: pass --yes"), "{}", text(&out.stderr));
    assert_eq!(archived().await, ["dl_1", "dl_2", "dl_3", "dl_4"]);

    let out = imagepipe(args(&["dlq", "replay", "--reason", "TIMEOUT", "--since", "1h", "--yes", "--api", &api])).await;
    let said = ok(&out);
    assert!(said.contains("2 dead letters match") && said.contains("replayed 2 of 2 dead letters"), "{said}");
    assert_eq!(archived().await, ["dl_1", "dl_4"]);
    let ids = ["tsk_again_2".to_owned(), "tsk_again_3".to_owned()];
    let tasks = pipeline.wait_for(&ids, Duration::from_secs(60)).await.unwrap();
    assert!(tasks.iter().all(|t| t.state == imagepipe_coordinator::TaskState::Completed), "{tasks:?}");

    let said = ok(&imagepipe(args(&["dlq", "replay", "dl_4", "--api", &api])).await);
    assert_eq!(said.trim(), "dl_4 replayed to tasks.submit");
    let said = ok(&imagepipe(args(&["dlq", "replay", "--queue", "download", "--api", &api])).await);
    assert_eq!(said.trim(), "0 dead letters match");
    let err = usage_error(&imagepipe(args(&["dlq", "replay", "dl_1", "--reason", "x", "--api", &api])).await);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = one_line_error(&imagepipe(args(&["dlq", "replay", "--queue", "thumbs", "--api", &api])).await);
    assert!(err.contains("400") && err.contains("no task queue"), "{err}");
    pipeline.stop().await.unwrap();
}

/// `imagepipe watch` reopens a stream that broke with `Last-Event-ID` and prints every event once:
/// a stand-in event stream on 127.0.0.1 sends one event and closes, then the next on the second
/// connection, recording what each request resumed after.
#[tokio::test]
async fn watch_reopens_a_broken_stream_after_its_last_event() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let envelope = |id: &str, event_type: &str| {
        format!(r#"{{"eventId":"{id}","eventType":"{event_type}","taskId":"tsk_w","timestamp":1,"source":"test"}}"#)
    };
    let events = [("e1", "task.created"), ("e2", "task.completed")];
    let bodies = events.map(|(id, event_type)| envelope(id, event_type));
    let served = bodies.clone();
    let server = tokio::spawn(async move {
        let mut resumed_after = Vec::new();
        for ((id, event_type), body) in events.into_iter().zip(served) {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut chunk = [0u8; 1024];
                let n = socket.read(&mut chunk).await.unwrap();
                assert!(n > 0, "the request ended early");
                request.extend_from_slice(&chunk[..n]);
            }
            let request = String::from_utf8(request).unwrap();
            resumed_after.push(
                request
                    .lines()
                    .find_map(|line| line.to_ascii_lowercase().strip_prefix("last-event-id: ").map(str::to_owned)),
            );
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\nevent: {event_type}\nid: {id}\ndata: {body}\n\n"
            );
            socket.write_all(response.as_bytes()).await.unwrap();
            socket.shutdown().await.unwrap();
        }
        resumed_after
    });
    let out = imagepipe(args(&["watch", "--json", "--count", "2", "--api", &api])).await;
    let printed = ok(&out);
    assert_eq!(printed.lines().collect::<Vec<_>>(), bodies, "each event once, in order");
    assert!(text(&out.stderr).contains("reconnecting"), "{}", text(&out.stderr));
    assert_eq!(server.await.unwrap(), [None, Some("e1".to_owned())]);
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `--config`, `--api` and `--token` go before or after the command they apply to, and are
/// refused (exit 2, one line) by one they do not; argument mistakes are one clear line with
/// exit 2: clap's tip kept and its usage block replaced by the command's `--help`, an `--api`
/// without a scheme; `run --help` says where it listens and what it runs on.
#[tokio::test]
async fn global_options_go_anywhere_they_apply_and_argument_mistakes_exit_2_on_one_line() {
    let api = format!("http://127.0.0.1:{}", closed_port());
    for argv in [["--api", &api, "status", "tsk_x"], ["status", "tsk_x", "--api", &api]] {
        let err = one_line_error(&imagepipe(args(&argv)).await);
        assert!(err.contains("cannot reach the imagepipe API") && err.contains("IMAGEPIPE_API"), "{err}");
    }
    let config = tempfile::NamedTempFile::new().unwrap();
    let config = config.path().to_str().unwrap();
    let err = usage_error(&imagepipe(args(&["submit", &sample("coffee.jpg"), "--config", config])).await);
    assert!(err.contains("--config does not apply to `imagepipe submit`") && err.contains("IMAGEPIPE_API"), "{err}");
    let err = usage_error(&imagepipe(args(&["doctor", "--api", &api])).await);
    assert!(err.contains("--api does not apply to `imagepipe doctor`"), "{err}");
    let err = usage_error(&imagepipe(args(&["dlq", "list", "--config", config])).await);
    assert!(err.contains("`imagepipe dlq list`"), "{err}");

    let help = ok(&imagepipe(args(&["run", "--help"])).await);
    for said in ["--config", "IMAGEPIPE_HTTP__PORT", "nats", "kafka", "store.path"] {
        assert!(help.contains(said), "run --help names {said}: {help}");
    }

    for bad in ["127.0.0.1:18080", "localhost:8080", "ftp://host/"] {
        let err = usage_error(&imagepipe(args(&["status", "tsk_x", "--api", bad])).await);
        assert!(err.contains("is not an http:// or https:// URL"), "{err}");
        let err = usage_error(&imagepipe_with_env(args(&["list"]), vec![("IMAGEPIPE_API", bad.to_owned())]).await);
        assert!(err.contains("is not an http:// or https:// URL"), "{err}");
    }
    let err = usage_error(&imagepipe(args(&["submit", "x.jpg", "--wiat"])).await);
    assert!(err.contains("unexpected argument '--wiat' found; tip: a similar argument exists: '--wait'"), "{err}");
    assert!(err.trim_end().ends_with("(see `imagepipe submit --help`)") && !err.contains("Usage"), "{err}");
    let err = usage_error(&imagepipe(args(&["watch", "--type", "task.done", "--api", &api])).await);
    assert!(err.contains("\"task.done\" is no event type"), "{err}");

    // An upload that cannot reach the API says so once.
    let err = one_line_error(&imagepipe(args(&["submit", &sample("coffee.jpg"), "--api", &api])).await);
    assert!(err.contains("uploading") && err.contains("cannot reach the imagepipe API"), "{err}");
    assert_eq!(err.matches("error sending request").count(), 1, "the cause is said once: {err}");
}

/// An `--api` pointing at another web server: a line saying so, not its HTML page.
#[tokio::test]
async fn an_api_that_answers_with_a_web_page_is_named_not_printed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut chunk = [0u8; 1024];
                match socket.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&chunk[..n]),
                }
            }
            let ok = request.starts_with(b"GET /v1/stats");
            let (status, body) = if ok {
                ("200 OK", "<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>")
            } else {
                (
                    "404 Not Found",
                    "<html><head><title>404 Not Found</title></head><body><center>nginx</center></body></html>",
                )
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(response.as_bytes()).await;
            let _ = socket.shutdown().await;
        }
    });
    for argv in [["status", "tsk_x"], ["stats", "--json"]] {
        let mut argv = args(&argv);
        argv.extend(args(&["--api", &api]));
        let err = one_line_error(&imagepipe(argv).await);
        assert!(err.contains("answered with a web page") && err.contains("IMAGEPIPE_API"), "{err}");
        assert!(!err.contains('<') && !err.contains("nginx"), "{err}");
    }
    server.abort();
}

/// `imagepipe run` as a child process with its settings in a `--config` file given after the
/// command (the API on a loopback port free a moment ago, store and blobs in `work`) and the variables `env`;
/// stderr piped.
fn spawn_run(model_dir: &Path, work: &Path, env: &[(&str, String)]) -> std::process::Child {
    let config = work.join("imagepipe.toml");
    let toml = format!(
        "[http]\nbind = \"127.0.0.1\"\nport = {}\n[store]\npath = {:?}\n[blob]\ndir = {:?}\n[ai]\nmodel_dir = {:?}\nthreads = 1\n",
        closed_port(),
        work.join("store"),
        work.join("blobs"),
        model_dir
    );
    std::fs::write(&config, toml).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
        .args(["run", "--config", config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .env_remove("IMAGEPIPE_API")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The lines `child` writes to stderr up to the one `last` accepts (or until it exits).
async fn stderr_until(child: &mut std::process::Child, last: fn(&str) -> bool) -> Vec<String> {
    use std::io::BufRead;
    let stderr = child.stderr.take().unwrap();
    tokio::task::spawn_blocking(move || {
        let mut lines = Vec::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            let done = last(&line);
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    })
    .await
    .unwrap()
}

/// Sends SIGTERM to `child` and waits for it.
fn stop(mut child: std::process::Child) -> std::process::ExitStatus {
    std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    child.wait().unwrap()
}

/// `imagepipe run` starts with a short summary (address, dashboard, store, bus, model), not with
/// ONNX Runtime's own lines, and without a warning that the runtime and its binding disagree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_starts_with_a_summary_not_onnx_runtimes_log() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut child = spawn_run(&model_dir, work.path(), &[]);
    let lines = stderr_until(&mut child, |l| l.trim_start().starts_with("model ")).await;
    let status = stop(child);
    let all = lines.join("\n");
    assert!(status.success(), "{status:?}: {all}");
    assert!(!all.contains("ort::") && !all.contains("GraphTransformer"), "ONNX Runtime's INFO lines: {all}");
    let summary = lines.iter().position(|l| l.contains("every service running")).unwrap_or_else(|| panic!("{all}"));
    assert_eq!(lines.len() - summary, 6, "the summary ends the start: {all}");
    assert!(!all.contains("compatibility issues"), "the runtime and the binding agree: {all}");
    let row = |name: &str| {
        lines
            .iter()
            .find(|l| l.trim_start().starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {all}"))
    };
    let api = row("api").split_whitespace().nth(1).unwrap().to_owned();
    assert!(api.starts_with("http://127.0.0.1:") && !api.ends_with(":0"), "{all}");
    assert!(row("dashboard").contains(&format!("{api}/")), "{all}");
    assert!(row("store").contains(&work.path().join("store").display().to_string()), "{all}");
    assert!(row("bus").contains("memory"), "{all}");
    assert!(row("model").contains("onnxruntime") && row("model").contains("efficientnet"), "{all}");
}

/// A second `imagepipe run` on the store of a running one stops at once, naming `store.path` and
/// its variable (before loading the model or listening); a port in use names `http.port`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_store_or_port_stops_run_at_once_naming_the_setting() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let held = imagepipe_runtime::embedded::EmbeddedDb::open(&work.path().join("store/coordinator.redb")).unwrap();
    let mut child = spawn_run(&model_dir, work.path(), &[]);
    let lines = stderr_until(&mut child, |_| false).await;
    let status = child.wait().unwrap();
    let all = lines.join("\n");
    assert_eq!(status.code(), Some(1), "{all}");
    assert_eq!(lines.len(), 1, "one line: {all}");
    assert!(all.contains("another process holds the store in") && all.contains("coordinator.redb"), "{all}");
    assert!(all.contains("store.path (IMAGEPIPE_STORE__PATH)"), "{all}");
    drop(held);

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let mut child = spawn_run(&model_dir, work.path(), &[("IMAGEPIPE_HTTP__PORT", port.clone())]);
    let lines = stderr_until(&mut child, |_| false).await;
    let status = child.wait().unwrap();
    let last = lines.last().cloned().unwrap_or_default();
    assert_eq!(status.code(), Some(1), "{lines:?}");
    assert!(last.contains(&format!("127.0.0.1:{port}")) && last.contains("IMAGEPIPE_HTTP__PORT"), "{last}");
    assert!(last.contains("http.port"), "{last}");
}

/// Ctrl-C during `submit --wait` stops the waiting, not the task: it says so and how to follow it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_during_submit_wait_says_the_tasks_keep_running() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(common::settings(&model_dir, &work)).await.unwrap();
    let api = pipeline.api_url();
    let images = FixtureServer::start([("/slow.jpg", Route::Silent)]).await.unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe"))
        .args(["submit", &images.url("/slow.jpg"), "--wait", "--api", &api])
        .env_remove("IMAGEPIPE_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupted once the download is under way (the task is accepted and waited for).
    let deadline = Instant::now() + Duration::from_secs(10);
    while images.requests().iter().filter(|r| r.target == "/slow.jpg").count() == 0 {
        assert!(Instant::now() < deadline, "the download never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    std::process::Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    let (said, err) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(130), "{said}{err}");
    let id = said.split_whitespace().next().unwrap_or_default().to_owned();
    assert!(id.starts_with("tsk_"), "{said}");
    assert!(err.contains("stopped waiting; 1 task(s) keep running"), "{err}");
    assert!(err.contains(&format!("imagepipe watch --task {id}")), "{err}");
    let view = ok(&imagepipe(args(&["status", &id, "--json", "--api", &api])).await);
    assert!(!view.contains("\"cancelled\""), "the task was left running: {view}");
    pipeline.stop().await.unwrap();
}
