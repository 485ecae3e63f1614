//! The end-to-end scenarios, written once and run on every broker: a batch of tasks through
//! seven separate processes, the same batch while every process is killed with SIGKILL and
//! restarted, and a batch with every blob in S3.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::json;

use crate::backend::{Backend, Cleanup};
use crate::cluster::{Cluster, ClusterConfig, ServiceKind};
use crate::fixtures::{Fixtures, SAMPLES};
use crate::observe::EventRecorder;

/// Event types every completed task produces, once each.
const COMPLETED_FLOW: [&str; 5] =
    ["image.downloaded", "image.metadata_extracted", "image.analyzed", "task.created", "task.completed"];

/// The settings every scenario gives its services.
pub fn cluster_config(backend: Backend, label: &str, model_dir: &std::path::Path) -> ClusterConfig {
    ClusterConfig::new(backend, label)
        .env("IMAGEPIPE_AI__MODEL_DIR", model_dir.display().to_string())
        .env("IMAGEPIPE_AI__THREADS", "1")
        .env("IMAGEPIPE_WORKER__CONCURRENCY", "4")
        .env("IMAGEPIPE_WORKER__ACK_WAIT", "10s")
        // Far shorter than the backlogs of these runs (hundreds of tasks submitted at once): a
        // command waiting in its queue must not be charged its deadline, or the resent
        // duplicates pile up behind it until every attempt is spent (as before that check:
        // 340 of 500 tasks failed the Kafka kill -9 run at 10 s).
        .env("IMAGEPIPE_COORDINATOR__STEP_DEADLINE", "10s")
        .env("IMAGEPIPE_COORDINATOR__MAX_IN_FLIGHT", "1000")
}

/// The task ids and submit bodies of `count` tasks cycling through the sample photos, each
/// with the fixture server's webhook as its callback.
fn submits(prefix: &str, count: usize, fixtures: &Fixtures) -> (Vec<String>, Vec<Vec<u8>>) {
    (0..count)
        .map(|i| {
            let id = format!("tsk_{prefix}_{i:04}");
            let body = json!({
                "taskId": id,
                "url": fixtures.photo_url(SAMPLES[i % SAMPLES.len()]),
                "callbackUrl": fixtures.hook_url(),
                "labels": { "run": prefix, "sample": SAMPLES[i % SAMPLES.len()] },
            });
            (id, serde_json::to_vec(&body).expect("JSON"))
        })
        .unzip()
}

/// `count` tasks submitted by publishing plain JSON to `<prefix>.tasks.submit`, through seven
/// separate processes: every task completes; each subscriber saw each event once after
/// deduplication (analytics counts, one terminal event id per task in the webhooks, one index
/// entry per task); thumbnails
/// are stored, tags and stats are right; every process stops cleanly on SIGTERM.
pub async fn every_task_completes_across_processes(backend: Backend, count: usize) {
    let Some(model_dir) = crate::cluster::model_dir() else { return };
    let fixtures = Fixtures::start().await.expect("fixture server");
    let config = cluster_config(backend.clone(), "flow", &model_dir);
    let _cleanup = Cleanup::new(&backend, &config.prefix);
    let recorder = EventRecorder::start(&backend.bus_config(&config.prefix)).await.expect("event recorder");
    let cluster = Cluster::start(config).await.expect("cluster");
    let prefix = cluster.prefix().to_owned();

    let (ids, mut bodies) = submits(&prefix, count, &fixtures);
    // And photos as phones write them: chelsea as a HEIC, as one image and as a grid of tiles.
    let heics =
        [("heic", "chelsea.heic", fixtures.heic_url()), ("heic_grid", "chelsea-grid.heic", fixtures.heic_grid_url())]
            .map(|(suffix, sample, url)| {
                let id = format!("tsk_{prefix}_{suffix}");
                let body = json!({
                    "taskId": id,
                    "url": url,
                    "callbackUrl": fixtures.hook_url(),
                    "labels": { "run": prefix, "sample": sample },
                });
                bodies.push(serde_json::to_vec(&body).expect("JSON"));
                (id, sample)
            });
    backend.submitter(&prefix).await.expect("submitter").publish_all(bodies).await.expect("publish submits");

    let all: BTreeSet<String> = ids.iter().cloned().chain(heics.iter().map(|(id, _)| id.clone())).collect();
    let finished = recorder.wait_until(Duration::from_secs(600), |r| r.terminal_tasks().is_superset(&all)).await;
    assert!(finished, "{} of {count} tasks finished", recorder.terminal_tasks().intersection(&all).count());

    for event_type in COMPLETED_FLOW {
        let ids_per_task = recorder.distinct_ids(event_type);
        for id in all.iter() {
            let seen = ids_per_task.get(id).map_or(0, BTreeSet::len);
            assert_eq!(seen, 1, "{id}: {seen} distinct {event_type} events");
        }
    }
    assert!(recorder.distinct_ids("task.failed").keys().all(|id| !all.contains(id)), "no task failed");

    check_tasks(&cluster, &ids).await;
    for (id, sample) in &heics {
        check_heic(&cluster, id, sample).await;
    }
    check_search(&cluster, &ids).await;
    let subscribers_done =
        recorder.wait_until(Duration::from_secs(60), |_| fixtures.webhooks_by_task().len() >= all.len()).await;
    assert!(subscribers_done, "webhooks for {} of {} tasks", fixtures.webhooks_by_task().len(), all.len());
    let webhooks = fixtures.webhooks_by_task();
    for id in &all {
        assert_eq!(webhooks.get(id).map_or(0, BTreeSet::len), 1, "{id}: one task.completed webhook");
    }
    check_stats(&cluster, &recorder).await;

    let failures = cluster.stop(Duration::from_secs(40)).await;
    recorder.stop().await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
}

/// `count` tasks while each worker kind, each subscriber and the coordinator are killed with
/// SIGKILL once and restarted: every task still completes, exactly once (one `task.completed`
/// event id, no `task.failed`), the coordinator's record agrees (completed, thumbnail stored,
/// tags right), and the subscribers' deduplicated views count each completion once.
pub async fn every_task_completes_once_through_kill_9(backend: Backend, count: usize) {
    let Some(model_dir) = crate::cluster::model_dir() else { return };
    let fixtures = Fixtures::start().await.expect("fixture server");
    let config = cluster_config(backend.clone(), "kill", &model_dir);
    let _cleanup = Cleanup::new(&backend, &config.prefix);
    let recorder = EventRecorder::start(&backend.bus_config(&config.prefix)).await.expect("event recorder");
    let mut cluster = Cluster::start(config).await.expect("cluster");
    let prefix = cluster.prefix().to_owned();

    let (ids, bodies) = submits(&prefix, count, &fixtures);
    backend.submitter(&prefix).await.expect("submitter").publish_all(bodies).await.expect("publish submits");
    let all: BTreeSet<String> = ids.iter().cloned().collect();

    let victims = [
        ServiceKind::Download,
        ServiceKind::Coordinator,
        ServiceKind::Metadata,
        ServiceKind::Ai,
        ServiceKind::Notification,
        ServiceKind::Analytics,
        ServiceKind::TagIndexer,
    ];
    for (round, victim) in victims.into_iter().enumerate() {
        let progress = count * (round + 1) / (victims.len() + 2);
        let reached = recorder
            .wait_until(Duration::from_secs(600), |r| r.terminal_tasks().intersection(&all).count() >= progress)
            .await;
        assert!(reached, "stalled before killing {victim:?}: {} of {count} finished", finished(&recorder, &all));
        cluster.kill9(victim).await;
        cluster.restart(victim).await.expect("restarted after kill -9");
        eprintln!("killed and restarted {victim:?} at {} of {count} finished", finished(&recorder, &all));
    }

    let done = recorder.wait_until(Duration::from_secs(900), |r| r.terminal_tasks().is_superset(&all)).await;
    assert!(done, "{} of {count} tasks reached a terminal state", finished(&recorder, &all));

    let completed = recorder.distinct_ids("task.completed");
    let failed = recorder.distinct_ids("task.failed");
    for id in &ids {
        let completions = completed.get(id).map_or(0, BTreeSet::len);
        assert!(completions <= 1, "{id} completed {completions} times");
    }
    let not_completed: Vec<&String> = ids.iter().filter(|id| !completed.contains_key(*id)).collect();
    if !not_completed.is_empty() {
        let mut why = std::collections::BTreeMap::<String, usize>::new();
        let mut first = None;
        for id in &not_completed {
            let task = cluster.get_json(ServiceKind::Coordinator, &format!("/v1/tasks/{id}")).await;
            let failure = task.as_ref().map(|t| &t["failure"]);
            let reason = failure.map_or("unreadable".into(), |f| format!("{} {}", f["step"], f["error"]["code"]));
            *why.entry(reason).or_default() += 1;
            first.get_or_insert(task);
        }
        let task = first.flatten();
        panic!(
            "{} of {count} tasks did not complete through kill -9 (step and error code: {why:?}); the first: \
             {task:?}; all: {not_completed:?}",
            not_completed.len()
        );
    }
    let failed_too: Vec<&String> = failed.keys().filter(|id| all.contains(*id)).collect();
    assert!(failed_too.is_empty(), "tasks both completed and failed: {failed_too:?}");
    check_tasks(&cluster, &ids).await;
    eprintln!("all {count} tasks completed once");

    let hooks = recorder.wait_until(Duration::from_secs(120), |_| fixtures.webhooks_by_task().len() >= count).await;
    assert!(hooks, "webhooks for {} of {count} tasks", fixtures.webhooks_by_task().len());
    for (id, events) in fixtures.webhooks_by_task() {
        assert_eq!(events.len(), 1, "{id}: webhooks carry one terminal event id, got {events:?}");
    }
    check_stats(&cluster, &recorder).await;

    let failures = cluster.stop(Duration::from_secs(40)).await;
    recorder.stop().await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
}

fn finished(recorder: &EventRecorder, all: &BTreeSet<String>) -> usize {
    recorder.terminal_tasks().intersection(all).count()
}

/// Every task is completed in the coordinator's store, its thumbnail is in the blob store, and
/// its tags fit its photo.
async fn check_tasks(cluster: &Cluster, ids: &[String]) {
    for (i, id) in ids.iter().enumerate() {
        let task = cluster.must_get_json(ServiceKind::Coordinator, &format!("/v1/tasks/{id}")).await;
        assert_eq!(task["state"], "completed", "{id}: {task}");
        let outputs = &task["outputs"];
        let thumbnail =
            outputs["metadata"]["thumbnailKey"].as_str().unwrap_or_else(|| panic!("{id}: thumbnail key in {outputs}"));
        assert!(blob_exists(&cluster.blob_dir(), thumbnail), "{id}: thumbnail {thumbnail} stored");
        let tags: Vec<&str> = outputs["analysis"]["tags"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["label"].as_str()).collect())
            .unwrap_or_default();
        let top = outputs["analysis"]["predictions"][0]["label"].as_str().unwrap_or_default();
        match SAMPLES[i % SAMPLES.len()] {
            "chelsea.jpg" => assert!(tags.contains(&"cat"), "{id}: chelsea is tagged cat: {tags:?}"),
            "coffee.jpg" => assert_eq!(top, "espresso", "{id}: coffee's top label"),
            _ => assert!(!tags.is_empty() && !top.is_empty(), "{id}: labelled and tagged: {outputs}"),
        }
    }
}

/// A HEIC task (`sample`: one image or a grid of tiles) completed like its JPEG original: read
/// as `heic` at its stored size, its derivatives stored, the AI worker given the preview (not the
/// HEIC), labelled a cat, with the task's own labels on it.
async fn check_heic(cluster: &Cluster, id: &str, sample: &str) {
    let task = cluster.must_get_json(ServiceKind::Coordinator, &format!("/v1/tasks/{id}")).await;
    assert_eq!(task["state"], "completed", "{id}: {task}");
    assert_eq!(task["labels"]["sample"], sample, "{id}: {task}");
    let metadata = &task["outputs"]["metadata"];
    // The sample is 451 px wide: heif-enc 1.15 stored it so, heif-enc >= 1.17 pads a single image
    // to 452 with a `clap` crop of one column, and the metadata reports the stored (`ispe`) size;
    // a grid is stored at the size it was given.
    assert_eq!(metadata["format"].as_str(), Some("heic"), "{metadata}");
    assert!(matches!(metadata["width"].as_u64(), Some(451 | 452)), "{metadata}");
    assert_eq!(metadata["height"].as_u64(), Some(300), "{metadata}");
    let derivatives = metadata["thumbnails"].as_array().map(Vec::as_slice).unwrap_or_default();
    assert_eq!(derivatives.len(), 2, "a thumbnail and a preview: {metadata}");
    for derivative in derivatives {
        let key = derivative["key"].as_str().unwrap_or_default();
        assert!(blob_exists(&cluster.blob_dir(), key), "{id}: {} {key} stored", derivative["name"]);
    }
    assert!(metadata["previewKey"].is_string(), "{metadata}");
    let analysis = &task["outputs"]["analysis"];
    let tags: Vec<&str> =
        analysis["tags"].as_array().map(|t| t.iter().filter_map(|t| t["label"].as_str()).collect()).unwrap_or_default();
    let top = analysis["predictions"][0]["label"].as_str().unwrap_or_default();
    assert!(tags.contains(&"cat") && top.contains("cat"), "{id}: the HEIC chelsea is a cat: {top}, {tags:?}");
}

/// The tag index lists every chelsea task under `cat`, each once, and no other task.
async fn check_search(cluster: &Cluster, ids: &[String]) {
    let cats: BTreeSet<&String> =
        ids.iter().enumerate().filter(|(i, _)| i % SAMPLES.len() == 0).map(|(_, id)| id).collect();
    let found = poll(Duration::from_secs(60), || async {
        let body =
            cluster.get_json(ServiceKind::TagIndexer, &format!("/v1/search?tags=cat&limit={}", ids.len() + 10)).await?;
        let hits: Vec<String> = body["results"]
            .as_array()
            .or_else(|| body.as_array())?
            .iter()
            .filter_map(|hit| hit["taskId"].as_str().map(str::to_owned))
            .collect();
        (hits.len() >= cats.len()).then_some(hits)
    })
    .await
    .expect("tag search lists every cat");
    let unique: BTreeSet<&String> = found.iter().collect();
    assert_eq!(unique.len(), found.len(), "each task once in the index: {found:?}");
    let ours: BTreeSet<&String> = unique.into_iter().filter(|id| ids.contains(id)).collect();
    assert_eq!(ours, cats, "the cats, and only them");
}

/// Analytics counted each distinct event exactly once: its count of every event type equals
/// the number of distinct event ids of that type the recorder saw (a retried step is a new
/// event, with its own id; a redelivered one is not), and its task outcomes match.
async fn check_stats(cluster: &Cluster, recorder: &EventRecorder) {
    let expected: BTreeMap<String, u64> = recorder
        .seen()
        .into_iter()
        .map(|seen| (seen.event_type, seen.event_id))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .fold(BTreeMap::new(), |mut counts, (event_type, _)| {
            *counts.entry(event_type).or_default() += 1;
            counts
        });
    let last = std::sync::Mutex::new(None);
    let caught_up = poll(Duration::from_secs(60), || async {
        let stats = cluster.get_json(ServiceKind::Analytics, "/v1/stats").await?;
        let events: BTreeMap<String, u64> = serde_json::from_value(stats["events"].clone()).ok()?;
        let behind = expected.iter().any(|(event_type, n)| events.get(event_type).copied().unwrap_or(0) < *n);
        *last.lock().expect("last stats") = Some(stats.clone());
        (!behind).then_some((events, stats))
    })
    .await;
    let (events, stats) = caught_up.unwrap_or_else(|| {
        panic!("analytics counted fewer events than were published ({expected:?}): {:?}", last.lock().expect("last"))
    });
    let counted: BTreeMap<String, u64> = events.into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(counted, expected, "every distinct event counted once: {stats}");
    let completed = expected.get("task.completed").copied().unwrap_or(0);
    assert_eq!(stats["tasks"]["completed"].as_u64(), Some(completed), "{stats}");
}

fn blob_exists(dir: &std::path::Path, key: &str) -> bool {
    let Some(hex) = key.strip_prefix("sha256:") else { return false };
    walk(dir).iter().any(|path| path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(hex)))
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .filter_map(Result::ok)
        .flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] })
        .collect()
}

/// Calls `attempt` every 250 ms until it returns `Some` or `deadline` passes.
async fn poll<T, F, Fut>(deadline: Duration, mut attempt: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(value) = attempt().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= until {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `count` tasks through seven separate processes that keep every blob in S3 (`blob.kind =
/// "s3"` on the tests' SeaweedFS, under the run's prefix): each task completes; its original
/// and its derivatives are objects in the bucket; the coordinator serves each derivative from
/// S3, streamed, with the bytes of its key. And a large original uploaded through
/// `POST /v1/blobs` (over the multipart threshold) is stored in parts and read back whole.
pub async fn every_task_completes_with_blobs_in_s3(backend: Backend, count: usize) {
    use imagepipe_blob::{BlobKey, MULTIPART_PART_SIZE};

    let Some(model_dir) = crate::cluster::model_dir() else { return };
    let config = cluster_config(backend.clone(), "s3", &model_dir);
    let Some(blob) = crate::s3::blob_config(&config.prefix) else { return };
    let config = crate::s3::with_blobs(config, &blob);
    let blobs = blob.open().expect("the test's own client of the bucket");
    let fixtures = Fixtures::start().await.expect("fixture server");
    let _cleanup = Cleanup::new(&backend, &config.prefix);
    let recorder = EventRecorder::start(&backend.bus_config(&config.prefix)).await.expect("event recorder");
    let cluster = Cluster::start(config).await.expect("cluster");
    let prefix = cluster.prefix().to_owned();

    let (ids, bodies) = submits(&prefix, count, &fixtures);
    backend.submitter(&prefix).await.expect("submitter").publish_all(bodies).await.expect("publish submits");
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    let finished = recorder.wait_until(Duration::from_secs(600), |r| r.terminal_tasks().is_superset(&all)).await;
    assert!(finished, "{} of {count} tasks finished", recorder.terminal_tasks().intersection(&all).count());

    blobs_in_s3_and_served(&cluster, &ids, blobs.as_ref()).await;
    let http = reqwest::Client::new();
    let coordinator = cluster.url(ServiceKind::Coordinator);

    // An original over the multipart threshold, uploaded as a client would: one PUT per part
    // behind `POST /v1/blobs`, streamed back by `GET /v1/blobs/{key}`.
    let mut large = std::fs::read(crate::fixtures::sample_path(SAMPLES[0])).expect("a sample");
    large.extend((0..2 * MULTIPART_PART_SIZE).map(|i| (i % 251) as u8));
    let uploaded = http.post(format!("{coordinator}/v1/blobs")).body(large.clone()).send().await.expect("upload");
    assert_eq!(uploaded.status(), reqwest::StatusCode::CREATED);
    let body: serde_json::Value = uploaded.json().await.expect("JSON");
    let key: BlobKey = body["key"].as_str().expect("a key").parse().expect("a blob key");
    assert_eq!(key, BlobKey::of(&large));
    assert_eq!(blobs.get(&key).await.expect("the upload is in S3"), large);
    let served = http.get(format!("{coordinator}/v1/blobs/{key}")).send().await.expect("GET");
    assert_eq!(served.headers()["content-type"], "image/jpeg");
    assert_eq!(served.bytes().await.expect("the whole body").as_ref(), large.as_slice());

    let failures = cluster.stop(Duration::from_secs(40)).await;
    recorder.stop().await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
    empty(blobs.as_ref()).await;
}

/// Each of `ids` completed; its original and both derivatives are objects in `blobs`, and the
/// coordinator serves each, streamed, with the bytes of its key.
async fn blobs_in_s3_and_served(cluster: &Cluster, ids: &[String], blobs: &dyn imagepipe_blob::BlobStore) {
    use imagepipe_blob::BlobKey;

    let http = reqwest::Client::new();
    let coordinator = cluster.url(ServiceKind::Coordinator);
    for id in ids {
        let task = cluster.must_get_json(ServiceKind::Coordinator, &format!("/v1/tasks/{id}")).await;
        assert_eq!(task["state"], "completed", "{id}: {task}");
        let metadata = &task["outputs"]["metadata"];
        let mut keys: Vec<String> = metadata["thumbnails"]
            .as_array()
            .map(|t| t.iter().filter_map(|d| d["key"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        assert_eq!(keys.len(), 2, "{id}: a thumbnail and a preview: {metadata}");
        let original = task["outputs"]["download"]["blobKey"].as_str();
        keys.push(original.unwrap_or_else(|| panic!("{id}: the original's key in {}", task["outputs"])).to_owned());
        for key in keys {
            let parsed: BlobKey = key.parse().unwrap_or_else(|e| panic!("{id}: {e}"));
            assert!(blobs.exists(&parsed).await.expect("S3 answers"), "{id}: {key} is an object in the bucket");
            let served = http.get(format!("{coordinator}/v1/blobs/{key}")).send().await.expect("GET /v1/blobs");
            assert_eq!(served.status(), reqwest::StatusCode::OK, "{id}: {key}");
            let length = served.content_length();
            let bytes = served.bytes().await.unwrap_or_else(|e| panic!("{id}: {key} body: {e}"));
            assert_eq!(length, Some(bytes.len() as u64), "{id}: {key} Content-Length");
            assert_eq!(BlobKey::of(&bytes), parsed, "{id}: the coordinator served {key}'s bytes");
        }
    }
}

/// Deletes every object of `blobs`.
async fn empty(blobs: &dyn imagepipe_blob::BlobStore) {
    let mut after = None;
    loop {
        let page = blobs.list(after.as_ref(), 500).await.unwrap_or_default();
        let Some(last) = page.last() else { break };
        after = Some(last.key.clone());
        for stored in page {
            let _ = blobs.delete(&stored.key).await;
        }
    }
}

/// `count` tasks through seven separate processes keeping every blob in a SeaweedFS of the
/// test's own, which is killed with SIGKILL once the first task completed and started again
/// over its data 5 s later. The services' S3 requests retry through the outage
/// (`blob.s3.retry_timeout` 30 s): every task completes, none fails, and every blob a task
/// completed with (stored before the crash or after) is in the bucket and served whole.
pub async fn every_task_completes_through_a_seaweedfs_crash(backend: Backend, count: usize) {
    use imagepipe_blob::testing::SeaweedFs;
    use imagepipe_blob::{BlobConfig, BlobKind};

    let Some(model_dir) = crate::cluster::model_dir() else { return };
    let Some(bin) = imagepipe_blob::testing::seaweedfs_binary() else { return };
    let mut server = tokio::task::spawn_blocking(move || SeaweedFs::start(bin)).await.expect("SeaweedFS starts");
    let config = cluster_config(backend.clone(), "s3crash", &model_dir);
    let blob = BlobConfig {
        kind: BlobKind::S3,
        s3: server.s3_config(&config.prefix, Duration::from_secs(30)),
        ..BlobConfig::default()
    };
    let config = crate::s3::with_blobs(config, &blob);
    let blobs = blob.open().expect("the test's own client of the bucket");
    let fixtures = Fixtures::start().await.expect("fixture server");
    let _cleanup = Cleanup::new(&backend, &config.prefix);
    let recorder = EventRecorder::start(&backend.bus_config(&config.prefix)).await.expect("event recorder");
    let cluster = Cluster::start(config).await.expect("cluster");
    let prefix = cluster.prefix().to_owned();

    let (ids, bodies) = submits(&prefix, count, &fixtures);
    backend.submitter(&prefix).await.expect("submitter").publish_all(bodies).await.expect("publish submits");
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    let first = recorder.wait_until(Duration::from_secs(300), |r| !r.terminal_tasks().is_disjoint(&all)).await;
    assert!(first, "no task finished before the crash");
    server = tokio::task::spawn_blocking(move || {
        server.kill9();
        server
    })
    .await
    .expect("kill -9");
    let at_kill = recorder.terminal_tasks().intersection(&all).count();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let killed_for = std::time::Instant::now();
    server = tokio::task::spawn_blocking(move || {
        server.serve();
        server
    })
    .await
    .expect("SeaweedFS starts again");
    eprintln!(
        "SeaweedFS killed with {at_kill} of {count} tasks finished; back {:.1?} after the 5 s outage",
        killed_for.elapsed()
    );
    assert!(at_kill < count, "every task finished before the crash: make the run longer");
    let finished = recorder.wait_until(Duration::from_secs(600), |r| r.terminal_tasks().is_superset(&all)).await;
    assert!(finished, "{} of {count} tasks finished", recorder.terminal_tasks().intersection(&all).count());
    let failed = recorder.distinct_ids("task.failed");
    let failed: Vec<&String> = ids.iter().filter(|id| failed.contains_key(*id)).collect();
    assert!(failed.is_empty(), "tasks failed through the SeaweedFS crash: {failed:?}");
    blobs_in_s3_and_served(&cluster, &ids, blobs.as_ref()).await;

    let failures = cluster.stop(Duration::from_secs(40)).await;
    recorder.stop().await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
    drop(server);
}
