//! The whole pipeline in one process on the memory bus: the sample photos complete with every
//! event; a URL answering 404 fails the task with its reason.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use imagepipe::Pipeline;
use imagepipe::samples::SAMPLES;
use imagepipe_bus::{Selector, Subscription};
use imagepipe_contracts::payload::TaskFailed;
use imagepipe_contracts::{Event, EventType, Step, SubmitTask, decode};
use imagepipe_coordinator::TaskState;
use imagepipe_net::testing::FixtureServer;
use imagepipe_runtime::http::testing;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_photos_complete_with_every_event_and_a_404_url_fails_with_its_reason() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::start(common::settings(&model_dir, &work)).await.unwrap();
    let events = pipeline.bus().events.subscribe(Subscription::new("e2e-test", Selector::all())).await.unwrap();
    let fixtures = FixtureServer::start([]).await.unwrap();

    let mut ids = Vec::new();
    for sample in SAMPLES {
        let key = pipeline.blobs().put(Bytes::from_static(sample.bytes)).await.unwrap();
        let id = format!("tsk_e2e_{}", sample.name.trim_end_matches(".jpg"));
        let submit = SubmitTask { task_id: Some(id.clone()), blob: Some(key.to_string()), ..SubmitTask::default() };
        pipeline.submit(&submit).await.unwrap();
        ids.push(id);
    }
    let missing_url = fixtures.url("/missing.jpg");
    let missing =
        SubmitTask { task_id: Some("tsk_e2e_missing".into()), url: Some(missing_url.clone()), ..SubmitTask::default() };
    pipeline.submit(&missing).await.unwrap();
    ids.push("tsk_e2e_missing".into());

    let tasks = pipeline.wait_for(&ids, Duration::from_secs(120)).await.unwrap();
    let (photos, failed) = tasks.split_at(SAMPLES.len());
    for task in photos {
        assert_eq!(task.state, TaskState::Completed, "{}: {:?}", task.id, task.failure);
        let analysis = task.outputs.analysis.as_ref().unwrap();
        assert!(!analysis.predictions.is_empty() && !analysis.tags.is_empty(), "{analysis:?}");
        let metadata = task.outputs.metadata.as_ref().unwrap();
        assert!(pipeline.blobs().exists(&metadata.thumbnail_key.parse().unwrap()).await.unwrap(), "thumbnail stored");
    }
    let cat = &photos[0].outputs.analysis.as_ref().unwrap().tags;
    assert!(cat.iter().any(|t| t.label == "cat"), "chelsea is tagged cat: {cat:?}");
    let failure = failed[0].failure.as_ref().expect("the 404 task failed");
    assert_eq!((failure.step, failure.error.code.as_str()), (Step::Download, "http_404"));
    assert_eq!(fixtures.requests().len(), 1, "a 404 is permanent: no retry");

    let expected: HashMap<&str, BTreeSet<EventType>> = ids
        .iter()
        .map(|id| {
            let types = if id == "tsk_e2e_missing" {
                BTreeSet::from([EventType::TaskCreated, EventType::TaskFailed])
            } else {
                BTreeSet::from([
                    EventType::TaskCreated,
                    EventType::ImageDownloaded,
                    EventType::ImageMetadataExtracted,
                    EventType::ImageAnalyzed,
                    EventType::TaskCompleted,
                ])
            };
            (id.as_str(), types)
        })
        .collect();
    let mut seen: HashMap<String, BTreeSet<EventType>> = HashMap::new();
    let mut failed_event = None;
    while seen.values().map(BTreeSet::len).sum::<usize>() < expected.values().map(BTreeSet::len).sum::<usize>() {
        let batch = events.fetch(32, Duration::from_secs(10)).await.unwrap();
        assert!(!batch.is_empty(), "events missing; have {seen:?}");
        for delivery in batch {
            let event: Event<serde_json::Value> = decode(&delivery.message.payload).unwrap();
            let task_id = event.task_id.clone().unwrap();
            if event.event_type == EventType::TaskFailed {
                failed_event = Some(decode::<Event<TaskFailed>>(&delivery.message.payload).unwrap());
            }
            if expected.get(task_id.as_str()).is_some_and(|types| types.contains(&event.event_type)) {
                seen.entry(task_id).or_default().insert(event.event_type);
            }
            delivery.ack().await.unwrap();
        }
    }
    for (id, types) in &expected {
        assert_eq!(seen.get(*id), Some(types), "{id}");
    }
    let failed_event = failed_event.unwrap();
    assert_eq!(failed_event.payload.error.code, "http_404");
    assert!(failed_event.payload.error.message.contains("404"), "{:?}", failed_event.payload.error);

    // The tag indexer, a subscriber in the same process, makes the cat searchable.
    let api = imagepipe::ApiClient::new(&pipeline.api_url(), None).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let found: serde_json::Value = api.get("/v1/search", &[("tags", "cat,animal".into())]).await.unwrap();
        let hits = found["results"].as_array().unwrap();
        if hits.iter().any(|hit| hit["taskId"] == "tsk_e2e_chelsea") {
            let chelsea = hits.iter().find(|hit| hit["taskId"] == "tsk_e2e_chelsea").unwrap();
            let thumbnail = photos[0].outputs.metadata.as_ref().unwrap().thumbnail_key.as_str();
            assert_eq!(chelsea["thumbnailKey"], thumbnail, "{found}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "chelsea not searchable by cat and animal: {found}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The analytics subscriber counts every task once and measures the stages.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let stats: serde_json::Value = api.get("/v1/stats", &[]).await.unwrap();
        if stats["tasks"]["completed"] == SAMPLES.len() && stats["tasks"]["failed"] == 1 {
            assert_eq!(stats["latencies"]["download"]["count"], SAMPLES.len(), "{stats}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "stats incomplete: {stats}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    pipeline.stop().await.unwrap();
}

/// `imagepipe run` with `http.auth_token` set: every `/v1` route of every service it runs
/// (search, stats and similarity included) needs the token; health and readiness do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_search_stats_similarity_and_every_v1_route_need_it() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    settings.http.auth_token = Some("run-t0ken-0123456789abcdef0123456789".to_owned().into());
    let pipeline = Pipeline::start(settings).await.unwrap();
    let addr = pipeline.local_addr();

    for path in ["/v1/search?tags=cat", "/v1/stats", "/v1/tasks", "/v1/dlq", "/v1/openapi.json", "/v1/duplicates"] {
        let anonymous = testing::get(addr, path).await;
        assert_eq!(anonymous.status, 401, "{path}: {anonymous:?}");
        assert!(anonymous.body.contains(r#""error":"unauthorized""#), "{path}: {anonymous:?}");
        assert_eq!(testing::request(addr, "GET", path, Some("wrong")).await.status, 401, "{path}");
        assert_eq!(
            testing::request(addr, "GET", path, Some("run-t0ken-0123456789abcdef0123456789")).await.status,
            200,
            "{path}"
        );
    }
    // The similarity routes are this process's own too: nothing is forwarded.
    let unknown =
        testing::request(addr, "GET", "/v1/tasks/tsk_nobody/similar", Some("run-t0ken-0123456789abcdef0123456789"))
            .await;
    assert_eq!(unknown.status, 404, "{unknown:?}");
    assert!(unknown.body.contains("no embedding in the similarity index"), "{unknown:?}");
    assert_eq!(testing::get(addr, "/healthz").await.status, 200);
    let ready = testing::get_until(addr, "/readyz", None, |a| a.status == 200).await;
    assert_eq!(ready.status, 200, "{ready:?}");
    pipeline.stop().await.unwrap();
}
