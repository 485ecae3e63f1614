//! Stages of users' own (`pipeline.stages`) across processes: the services with a config file
//! whose pipeline holds a `faces` stage, and the faces stage in Python
//! (`examples/stages/faces/faces.py`: nats-py or confluent-kafka, OpenCV's Haar cascade) as its
//! worker, a child process of the test. Over NATS with the stage after analyze, over Kafka
//! (Tansu) with it between metadata and analyze: the astronaut has one face and the coffee none
//! (`outputs.faces.count`), one `stage.completed` per task, and `GET /v1/search?tags=faces:1`
//! finds the astronaut. A paused stage queue holds its commands and their deadlines until it is
//! resumed. And a stage whose `when` does not hold is skipped: the task completes without it and
//! its history says why.
//!
//! The worker's Python is `IMAGEPIPE_TEST_FACES_PYTHON`, else the venv `scripts/stage-examples.sh`
//! sets up; without either the tests fail (or skip with `IMAGEPIPE_TEST_ALLOW_SKIP=1`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use imagepipe_e2e::backend::{Backend, Cleanup};
use imagepipe_e2e::cluster::{Cluster, ServiceKind};
use imagepipe_e2e::fixtures::sample_path;
use imagepipe_e2e::observe::EventRecorder;
use imagepipe_e2e::scenarios::cluster_config;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// The variable naming the Python of the example stages' venv.
const FACES_PYTHON_ENV: &str = "IMAGEPIPE_TEST_FACES_PYTHON";

/// The services a pipeline with a custom stage needs here: the coordinator, the three built-in
/// steps and the tag indexer (search), each its own process.
const SERVICES: [ServiceKind; 5] =
    [ServiceKind::Coordinator, ServiceKind::Download, ServiceKind::Metadata, ServiceKind::Ai, ServiceKind::TagIndexer];

/// The built-in stages, then faces for the formats OpenCV decodes, as examples/stages/faces/faces.toml.
const FACES_LAST: &str = r#"
[[pipeline.stages]]
name = "download"
[[pipeline.stages]]
name = "metadata"
[[pipeline.stages]]
name = "analyze"
[[pipeline.stages]]
name = "faces"
deadline = "60s"
attempts = 3
when = { format = ["jpeg", "png", "webp", "heic"] }
"#;

/// Faces between metadata and analyze, with the metadata step's output as its input.
const FACES_BEFORE_ANALYZE: &str = r#"
[[pipeline.stages]]
name = "download"
[[pipeline.stages]]
name = "metadata"
[[pipeline.stages]]
name = "faces"
deadline = "60s"
attempts = 3
inputs = ["metadata"]
when = { format = ["jpeg", "png", "webp", "heic"] }
[[pipeline.stages]]
name = "analyze"
"#;

/// Faces last with a deadline shorter than the pause test holds its queue, and one attempt: a
/// deadline charged while the queue is paused would fail the task.
const FACES_PAUSED: &str = r#"
[[pipeline.stages]]
name = "download"
[[pipeline.stages]]
name = "metadata"
[[pipeline.stages]]
name = "analyze"
[[pipeline.stages]]
name = "faces"
deadline = "8s"
attempts = 1
"#;

/// Faces for PNG sources only: a JPEG passes it over.
const FACES_FOR_PNG_ONLY: &str = r#"
[[pipeline.stages]]
name = "download"
[[pipeline.stages]]
name = "metadata"
[[pipeline.stages]]
name = "faces"
when = { format = ["png"] }
[[pipeline.stages]]
name = "analyze"
"#;

/// The Python of the example stages: `IMAGEPIPE_TEST_FACES_PYTHON`, else the venv of
/// `scripts/stage-examples.sh` (`${IMAGEPIPE_CACHE_DIR:-$HOME/.cache/imagepipe}/stages-venv`).
fn faces_python() -> Option<PathBuf> {
    let python = std::env::var_os(FACES_PYTHON_ENV).map(PathBuf::from).or_else(|| {
        let cache = std::env::var_os("IMAGEPIPE_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/imagepipe")))?;
        Some(cache.join("stages-venv/bin/python"))
    });
    match python {
        Some(python) if python.exists() => Some(python),
        _ => {
            imagepipe_contracts::testing::environment_missing(&format!(
                "the example stages' Python is not there (run scripts/stage-examples.sh, which sets up its venv, \
                 or set {FACES_PYTHON_ENV})"
            ));
            None
        }
    }
}

/// The faces stage's worker, `examples/stages/faces/faces.py`, as a child process logging to a
/// file; killed when dropped, and its log printed when the test panicked.
struct FacesWorker {
    child: Child,
    log: PathBuf,
}

impl FacesWorker {
    /// Starts the worker on `backend` with `prefix`, fetching blobs from `coordinator`, and waits
    /// until it says it is ready (consumers created, topics subscribed).
    async fn start(python: &Path, backend: &Backend, prefix: &str, coordinator: &str, dir: &Path) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/stages/faces/faces.py");
        let log = dir.join("faces-stage.log");
        let file = std::fs::File::create(&log).expect("the worker's log file");
        let mut command = Command::new(python);
        command.arg(&script).args(["--prefix", prefix, "--coordinator", coordinator, "--concurrency", "2"]);
        match backend {
            Backend::Nats { url } => command.args(["--bus", "nats", "--nats-url", url]),
            Backend::Kafka { brokers } => command.args(["--bus", "kafka", "--kafka-brokers", brokers]),
        };
        command.stdin(Stdio::null()).stdout(file.try_clone().expect("log file")).stderr(file).kill_on_drop(true);
        let child =
            command.spawn().unwrap_or_else(|e| panic!("starting {} {}: {e}", python.display(), script.display()));
        let mut worker = Self { child, log };
        let until = tokio::time::Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(Some(status)) = worker.child.try_wait() {
                panic!("the faces stage exited with {status}:\n{}", worker.log_tail(40));
            }
            if std::fs::read_to_string(&worker.log).unwrap_or_default().contains("ready: stage faces") {
                return worker;
            }
            assert!(tokio::time::Instant::now() < until, "the faces stage not ready in 90 s:\n{}", worker.log_tail(40));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits up to `within` until its log says `text`.
    async fn said(&self, text: &str, within: Duration) {
        let until = tokio::time::Instant::now() + within;
        while !std::fs::read_to_string(&self.log).unwrap_or_default().contains(text) {
            assert!(
                tokio::time::Instant::now() < until,
                "the faces stage did not say {text:?}:\n{}",
                self.log_tail(40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The last `lines` lines of its log.
    fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Stops it with SIGTERM and returns its exit status (it finishes what is in flight).
    async fn stop(mut self) -> std::process::ExitStatus {
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        let pid = self.child.id().expect("running");
        kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("SIGTERM to the faces stage");
        tokio::time::timeout(Duration::from_secs(45), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the faces stage still running 45 s after SIGTERM:\n{}", self.log_tail(20)))
            .expect("waiting for the faces stage")
    }
}

impl Drop for FacesWorker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- faces-stage (Python) ---\n{}", self.log_tail(60));
        }
    }
}

/// A cluster of [`SERVICES`] on `backend` whose config file holds `pipeline`, with its
/// recorder of every event and the directory of the config file.
async fn cluster_with(
    backend: &Backend,
    label: &str,
    pipeline: &str,
) -> Option<(Cluster, EventRecorder, Cleanup, tempfile::TempDir)> {
    let model_dir = imagepipe_e2e::cluster::model_dir()?;
    let dir = tempfile::Builder::new().prefix("imagepipe-stages-").tempdir().expect("temp dir");
    let config_file = dir.path().join("imagepipe.toml");
    std::fs::write(&config_file, pipeline).expect("config file");
    let config = cluster_config(backend.clone(), label, &model_dir)
        .services(&SERVICES)
        .env("IMAGEPIPE_CONFIG", config_file.display().to_string());
    let cleanup = Cleanup::new(backend, &config.prefix);
    let recorder = EventRecorder::start(&backend.bus_config(&config.prefix)).await.expect("event recorder");
    let cluster = Cluster::start(config).await.expect("cluster");
    Some((cluster, recorder, cleanup, dir))
}

/// Uploads each sample through `POST /v1/blobs` and submits it with `POST /v1/tasks`, as a
/// client of the HTTP API does; the task ids, in the order of `samples`.
async fn submit(cluster: &Cluster, samples: &[&str]) -> Vec<String> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("HTTP client");
    let coordinator = cluster.url(ServiceKind::Coordinator);
    let mut ids = Vec::new();
    for sample in samples {
        let bytes = std::fs::read(sample_path(sample)).expect("sample photo");
        let uploaded = http.post(format!("{coordinator}/v1/blobs")).body(bytes).send().await.expect("upload");
        assert_eq!(uploaded.status(), reqwest::StatusCode::CREATED, "upload of {sample}");
        let key = uploaded.json::<Value>().await.expect("JSON")["key"].as_str().expect("a blob key").to_owned();
        let id = format!("tsk_{}_{}", cluster.prefix(), sample.trim_end_matches(".jpg"));
        let body = json!({ "taskId": id, "blob": key, "labels": { "sample": sample } });
        let submitted = http.post(format!("{coordinator}/v1/tasks")).json(&body).send().await.expect("submit");
        assert!(submitted.status().is_success(), "submit of {sample}: {}", submitted.status());
        ids.push(id);
    }
    ids
}

/// Waits until every task of `ids` has a terminal event, and checks each completed.
async fn completed(cluster: &Cluster, recorder: &EventRecorder, ids: &[String]) -> Vec<Value> {
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    let finished = recorder.wait_until(Duration::from_secs(300), |r| r.terminal_tasks().is_superset(&all)).await;
    let mut tasks = Vec::new();
    for id in ids {
        let task = cluster.must_get_json(ServiceKind::Coordinator, &format!("/v1/tasks/{id}")).await;
        assert!(finished, "not every task finished in 300 s; {id}: {task}");
        assert_eq!(task["state"], "completed", "{id}: {task}");
        tasks.push(task);
    }
    tasks
}

/// The task ids `GET /v1/search?tags=<tag>` lists (through the coordinator, which forwards it
/// to the tag indexer), once it lists at least `at_least` (the index follows the events).
async fn search(cluster: &Cluster, tag: &str, at_least: usize) -> Vec<String> {
    let until = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let body = cluster.get_json(ServiceKind::Coordinator, &format!("/v1/search?tags={tag}&limit=100")).await;
        let hits: Vec<String> = body
            .as_ref()
            .and_then(|b| b["results"].as_array().or_else(|| b.as_array()).cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|hit| hit["taskId"].as_str().map(str::to_owned))
            .collect();
        if hits.len() >= at_least || tokio::time::Instant::now() >= until {
            return hits;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The astronaut and the coffee through a pipeline with the faces stage, its worker the Python
/// example on `backend`: one face and none, in `outputs.faces` and in exactly one
/// `stage.completed` per task, the astronaut found by `faces:1`, and every built-in output there.
async fn faces_are_counted(backend: Backend, label: &str, pipeline: &str) {
    let Some(python) = faces_python() else { return };
    let Some((cluster, recorder, _cleanup, dir)) = cluster_with(&backend, label, pipeline).await else { return };
    let coordinator = cluster.url(ServiceKind::Coordinator);
    let worker = FacesWorker::start(&python, &backend, cluster.prefix(), &coordinator, dir.path()).await;

    let ids = submit(&cluster, &["astronaut.jpg", "coffee.jpg"]).await;
    let tasks = completed(&cluster, &recorder, &ids).await;
    for (task, faces) in tasks.iter().zip([1, 0]) {
        let id = task["taskId"].as_str().unwrap_or_default();
        let output = &task["outputs"]["faces"];
        assert_eq!(output["count"], faces, "{id}: outputs.faces {output}");
        assert_eq!(output["boxes"].as_array().map(Vec::len), Some(faces), "{id}: a box per face in {output}");
        assert_eq!(output["tags"], json!([format!("faces:{faces}")]), "{id}: {output}");
        for step in ["download", "metadata", "analysis"] {
            assert!(task["outputs"][step].is_object(), "{id}: outputs.{step} in {task}");
        }
    }
    let astronaut_box = &tasks[0]["outputs"]["faces"]["boxes"][0];
    let [x, y, w, h] = [0, 1, 2, 3].map(|i| astronaut_box[i].as_u64().expect("box numbers"));
    // Her face, in the 512 × 512 photo: the upper middle.
    assert!(x > 100 && x + w < 400 && y < 250 && (40..250).contains(&w) && w == h, "astronaut's box {astronaut_box}");

    // One stage.completed per task, with the stage's output.
    let events = recorder.wait_until(Duration::from_secs(30), |r| r.distinct_ids("stage.completed").len() >= 2).await;
    assert!(events, "stage.completed for {:?}", recorder.distinct_ids("stage.completed"));
    let per_task = recorder.distinct_ids("stage.completed");
    for (id, faces) in ids.iter().zip([1, 0]) {
        assert_eq!(per_task.get(id).map_or(0, BTreeSet::len), 1, "{id}: one stage.completed, got {per_task:?}");
        let event = recorder
            .seen()
            .into_iter()
            .find(|s| s.event_type == "stage.completed" && &s.task_id == id)
            .expect("the event");
        let payload = &event.body["payload"];
        assert_eq!(payload["stage"], "faces", "{id}: {payload}");
        assert_eq!(payload["output"]["count"], faces, "{id}: {payload}");
        assert_eq!(payload["labels"]["sample"], format!("{}.jpg", id.rsplit('_').next().unwrap_or_default()));
    }

    let with_a_face = search(&cluster, "faces:1", 1).await;
    assert_eq!(with_a_face, vec![ids[0].clone()], "faces:1 finds the astronaut, and only her");
    let without = search(&cluster, "faces:0", 1).await;
    assert_eq!(without, vec![ids[1].clone()], "faces:0 finds the coffee");

    let status = worker.stop().await;
    assert!(status.success(), "the faces stage stopped with {status}");
    let failures = cluster.stop(Duration::from_secs(40)).await;
    recorder.stop().await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_faces_stage_counts_faces_after_analyze_over_nats() {
    faces_are_counted(Backend::nats(), "faces_nats", FACES_LAST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_faces_stage_counts_faces_between_metadata_and_analyze_over_kafka() {
    faces_are_counted(Backend::kafka(), "faces_kafka", FACES_BEFORE_ANALYZE).await;
}

/// A paused `faces` queue over NATS: the Python worker reads the pause from `GET /v1/queues` and
/// takes no command; the stage's deadline (8 s, one attempt) comes due meanwhile and is held, not
/// charged (history `deadline_postponed`, the task still `processing`, no `stage.completed`);
/// after the resume the astronaut's face is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_stage_queue_holds_its_commands_and_their_deadlines_until_resumed() {
    let backend = Backend::nats();
    let Some(python) = faces_python() else { return };
    let Some((cluster, recorder, _cleanup, dir)) = cluster_with(&backend, "faces_pause", FACES_PAUSED).await else {
        return;
    };
    let coordinator = cluster.url(ServiceKind::Coordinator);
    let worker = FacesWorker::start(&python, &backend, cluster.prefix(), &coordinator, dir.path()).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("HTTP client");
    let control = |action: &str| http.post(format!("{coordinator}/v1/queues/faces/{action}")).json(&json!({})).send();
    let paused = control("pause").await.expect("pause");
    assert!(paused.status().is_success(), "pause: {}", paused.status());
    worker.said("queue faces paused", Duration::from_secs(30)).await;

    let ids = submit(&cluster, &["astronaut.jpg"]).await;
    let history_path = format!("/v1/tasks/{}/history", ids[0]);
    let until = tokio::time::Instant::now() + Duration::from_secs(120);
    let history = loop {
        let history = cluster.must_get_json(ServiceKind::Coordinator, &history_path).await;
        let entries = history["entries"].as_array().cloned().unwrap_or_default();
        if entries.iter().any(|e| e["event"] == "deadline_postponed" && e.to_string().contains("faces queue is paused"))
        {
            break history;
        }
        assert!(tokio::time::Instant::now() < until, "no deadline of faces held in 120 s: {history}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let task = cluster.must_get_json(ServiceKind::Coordinator, &format!("/v1/tasks/{}", ids[0])).await;
    assert_eq!(task["state"], "processing", "waiting in the paused queue: {task}\n{history}");
    assert_eq!(task["steps"]["faces"]["attempts"], 1, "{task}");
    assert!(task["steps"]["faces"]["lastError"].is_null(), "no attempt was charged: {task}");
    assert!(recorder.distinct_ids("stage.completed").is_empty(), "no stage.completed while paused");

    let resumed = control("resume").await.expect("resume");
    assert!(resumed.status().is_success(), "resume: {}", resumed.status());
    let tasks = completed(&cluster, &recorder, &ids).await;
    assert_eq!(tasks[0]["outputs"]["faces"]["count"], 1, "{}", tasks[0]);
    worker.said("queue faces resumed", Duration::from_secs(5)).await;

    let status = worker.stop().await;
    assert!(status.success(), "the faces stage stopped with {status}");
    let failures = cluster.stop(Duration::from_secs(40)).await;
    recorder.stop().await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
}

/// A stage whose `when` does not hold for the task (PNG only, the source a JPEG) is passed over
/// with no worker running for it: the task completes without `outputs.faces`, no
/// `stage.completed` is published, and the history says `skipped faces: ...`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_whose_condition_does_not_hold_is_skipped() {
    let backend = Backend::nats();
    let Some((cluster, recorder, _cleanup, _dir)) = cluster_with(&backend, "faces_skip", FACES_FOR_PNG_ONLY).await
    else {
        return;
    };
    let ids = submit(&cluster, &["coffee.jpg"]).await;
    let tasks = completed(&cluster, &recorder, &ids).await;
    let task = &tasks[0];
    assert!(task["outputs"].get("faces").is_none(), "no faces output: {task}");
    assert!(task["outputs"]["analysis"].is_object(), "analyze ran after the skipped stage: {task}");
    let history = cluster.must_get_json(ServiceKind::Coordinator, &format!("/v1/tasks/{}/history", ids[0])).await;
    let said = history["entries"]
        .as_array()
        .expect("history entries")
        .iter()
        .any(|entry| entry.to_string().contains("skipped faces: format jpeg is not one of png"));
    assert!(said, "the history says why faces was skipped: {history}");
    assert!(recorder.distinct_ids("stage.completed").is_empty(), "no stage.completed");

    let failures = cluster.stop(Duration::from_secs(40)).await;
    recorder.stop().await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
}
