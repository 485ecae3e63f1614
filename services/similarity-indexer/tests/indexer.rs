//! The similarity indexer end to end on the memory bus (embedded store): events in, the index and
//! `image.duplicate_detected` out — a redelivered event is indexed and announced once, a
//! near-duplicate whose original's embedding comes later is still announced (once), a different
//! image is not, a malformed event is dead-lettered with the reason — and the routes over HTTP.

use std::sync::Arc;
use std::time::Duration;

use imagepipe_bus::{Bus, BusConfig, ConsumerConfig, Message, Selector, Subscription};
use imagepipe_contracts::names::{self, headers};
use imagepipe_contracts::payload::{ImageAnalyzed, ImageDuplicateDetected, ImageMetadataExtracted};
use imagepipe_contracts::step::{AnalysisOutput, MetadataOutput};
use imagepipe_contracts::{Embedding, Event, TraceId, decode};
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::http::testing;
use imagepipe_runtime::{Settings, Shutdown};
use imagepipe_similarity_indexer::{EmbeddedStore, GROUP, LiveIndex, SimilarityStore, api, routes, run, subscription};

/// Any fixed time, Unix ms.
const T0: u64 = 1_763_800_000_000;
const VERSION: &str = "test-model/pool-8";

/// A unit-ish vector pointing mostly along axis `axis`, nudged by `nudge` along the next one.
fn features(axis: usize, nudge: f32) -> Vec<f32> {
    let mut v = vec![0.05; 8];
    v[axis] = 1.0;
    v[(axis + 1) % 8] += nudge;
    v
}

fn analyzed(task_id: &str, at: u64, features: &[f32]) -> Event<ImageAnalyzed> {
    let embedding = Embedding::from_features(VERSION, features).unwrap();
    let payload = ImageAnalyzed {
        blob_key: "sha256:00".into(),
        analysis: AnalysisOutput { model: "m".into(), predictions: vec![], tags: vec![], embedding: Some(embedding) },
        labels: [("run".to_owned(), "sim".to_owned())].into(),
    };
    Event::for_task(task_id, 1, TraceId::random(), at, "ai-worker", payload)
}

fn extracted(task_id: &str, at: u64, phash: u64) -> Event<ImageMetadataExtracted> {
    let metadata: MetadataOutput = serde_json::from_value(serde_json::json!({
        "format": "jpeg", "width": 4, "height": 3, "colorType": "rgb8", "bitDepth": 8, "hasAlpha": false,
        "frameCount": 1, "hasIccProfile": false, "dominantColors": [], "meanBrightness": 0.5,
        "phash": format!("{phash:016x}"), "blurhash": "LEHV6nWB2yk8", "thumbnailKey": format!("sha256:{task_id}")
    }))
    .unwrap();
    // Every event of a task carries the task's labels, so the order the indexer handles them in
    // does not change the labels it keeps (without them here, an analysis handled first lost them).
    let labels = [("run".to_owned(), "sim".to_owned())].into();
    let payload = ImageMetadataExtracted { blob_key: "sha256:00".into(), metadata, labels };
    Event::for_task(task_id, 1, TraceId::random(), at, "metadata-worker", payload)
}

struct Indexer {
    bus: Bus,
    store: Arc<dyn SimilarityStore>,
    addr: std::net::SocketAddr,
    shutdown: Shutdown,
    worker: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn start() -> Indexer {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.store.path = dir.path().to_owned();
    settings.ai.model_dir = dir.path().join("no-model");
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    drop(bus.events.subscribe(subscription(&settings)).await.unwrap());
    let db = EmbeddedDb::open_group(&settings.store.path, GROUP).unwrap();
    let store: Arc<dyn SimilarityStore> = Arc::new(EmbeddedStore::open(db).await.unwrap());
    let live = Arc::new(LiveIndex::new(settings.similarity.clone()));
    let shutdown = Shutdown::new();
    let api = api(&settings, bus.clone(), store.clone(), live.clone(), None, shutdown.clone()).await.unwrap();
    let slots = imagepipe_runtime::http::UploadSlots::new(8, Duration::from_secs(2));
    let addr = testing::serve_api(routes(api, 1 << 20, slots)).await;
    let worker = tokio::spawn({
        let (bus, store, shutdown) = (bus.clone(), store.clone(), shutdown.clone());
        async move { run(bus, &settings, store, live, shutdown).await.unwrap() }
    });
    Indexer { bus, store, addr, shutdown, worker, _dir: dir }
}

impl Indexer {
    async fn publish<P: serde::Serialize>(&self, event: &Event<P>) {
        let message = Message::new(event.to_json()).with_id(event.event_id.to_string());
        self.bus.events.publish(event.event_type.as_str(), message).await.unwrap();
    }

    /// A group of its own reading the `image.duplicate_detected` events from now on.
    async fn watch_duplicates(&self) -> Box<dyn imagepipe_bus::Consumer> {
        let selector = Selector::parse("image.duplicate_detected").unwrap();
        self.bus.events.subscribe(Subscription::new("watch", selector)).await.unwrap()
    }

    async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let answer = testing::get(self.addr, path).await;
        (answer.status, serde_json::from_str(&answer.body).unwrap_or_default())
    }

    /// Waits until the store's entry of `task_id` has pairs computed (or is complete).
    async fn complete(&self, task_id: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            if self.store.entry(task_id).await.unwrap().is_some_and(|e| e.is_complete()) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{task_id} never indexed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(10), self.worker).await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn near_duplicates_are_announced_once_and_searchable() {
    let indexer = start().await;
    let announced = indexer.watch_duplicates().await;

    // An original, then a copy close to it (a redelivered event among them), and a different image.
    indexer.publish(&extracted("tsk_orig", T0, 0xf0f0_f0f0_0f0f_0f0f)).await;
    indexer.publish(&analyzed("tsk_orig", T0 + 1, &features(0, 0.0))).await;
    indexer.complete("tsk_orig").await;
    let copy_meta = extracted("tsk_copy", T0 + 10, 0xf0f0_f0f0_0f0f_0f0e);
    let copy_analyzed = analyzed("tsk_copy", T0 + 11, &features(0, 0.05));
    indexer.publish(&copy_meta).await;
    indexer.publish(&copy_analyzed).await;
    indexer.publish(&copy_analyzed).await;
    indexer.publish(&extracted("tsk_other", T0 + 20, 0x0123_4567_89ab_cdef)).await;
    indexer.publish(&analyzed("tsk_other", T0 + 21, &features(4, 0.0))).await;
    indexer.complete("tsk_other").await;
    indexer.complete("tsk_copy").await;

    let mut first = announced.fetch(8, Duration::from_secs(15)).await.unwrap();
    assert_eq!(first.len(), 1, "one announcement, for the copy");
    let event: Event<ImageDuplicateDetected> = decode(&first[0].message.payload).unwrap();
    assert_eq!(event.task_id.as_deref(), Some("tsk_copy"));
    assert_eq!(event.payload.duplicate_of, "tsk_orig");
    assert_eq!(event.payload.phash_distance, Some(1));
    assert!(event.payload.cosine.unwrap() > 0.99, "{:?}", event.payload);
    assert_eq!(event.payload.duplicate_thumbnail_key.as_deref(), Some("sha256:tsk_orig"));
    assert_eq!(event.payload.labels.get("run").map(String::as_str), Some("sim"));
    assert_eq!(event.source, "similarity-indexer");
    first.remove(0).ack().await.unwrap();
    assert!(
        announced.fetch(8, Duration::from_millis(500)).await.unwrap().is_empty(),
        "the redelivery announced nothing"
    );

    let (status, similar) = indexer.get("/v1/tasks/tsk_copy/similar?limit=2").await;
    assert_eq!(status, 200, "{similar}");
    assert_eq!(similar["version"], VERSION);
    assert_eq!(similar["results"][0]["taskId"], "tsk_orig");
    assert_eq!(similar["results"][0]["phashDistance"], 1);
    assert_eq!(similar["results"][0]["thumbnailKey"], "sha256:tsk_orig");
    assert_eq!(similar["results"][1]["taskId"], "tsk_other");
    let (_, groups) = indexer.get("/v1/duplicates").await;
    assert_eq!(groups["total"], 1, "{groups}");
    assert_eq!(groups["groups"][0]["tasks"].as_array().unwrap().len(), 2, "{groups}");
    assert_eq!(groups["index"]["vectors"], 3);

    for bad in ["/v1/tasks/tsk_copy/similar?limit=0", "/v1/duplicates?threshold=2", "/v1/duplicates?threshold=0.1"] {
        let (status, body) = indexer.get(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (status, body) = indexer.get("/v1/tasks/tsk_nobody/similar").await;
    assert_eq!(status, 404, "{body}");
    // No model here: searching by an image says so instead of guessing.
    let jpeg = [0xff, 0xd8, 0xff, 0xe0, 0, 0x10, b'J', b'F', b'I', b'F', 0];
    let answer = testing::request_with_body(indexer.addr, "POST", "/v1/search/similar", None, &jpeg).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(answer.body.contains("model_unavailable"), "{answer:?}");
    let answer = testing::request_with_body(indexer.addr, "POST", "/v1/search/similar", None, b"hello").await;
    assert_eq!(answer.status, 415, "{answer:?}");

    // A malformed event is dead-lettered with the reason.
    indexer
        .bus
        .events
        .publish("image.analyzed", Message::new(b"{\"eventType\": \"image.analyzed\"}".to_vec()))
        .await
        .unwrap();
    let dlq =
        indexer.bus.queues.consume(&names::dead_letter_queue_of_group(GROUP), ConsumerConfig::default()).await.unwrap();
    let dead = dlq.fetch(1, Duration::from_secs(5)).await.unwrap().pop().expect("the malformed event");
    assert!(dead.message.headers.get(headers::DLQ_REASON).unwrap().contains("eventId"));
    dead.ack().await.unwrap();
    indexer.stop().await;
}

/// The copy is complete before its original has an embedding (both in flight at once): the
/// original's embedding, when it comes, makes the copy its announced near-duplicate.
#[tokio::test]
async fn a_copy_compared_before_its_original_was_complete_is_announced_when_it_is() {
    let indexer = start().await;
    let announced = indexer.watch_duplicates().await;
    // Far apart hashes: only the embedding can tell.
    indexer.publish(&extracted("tsk_orig", T0, 0)).await;
    indexer.publish(&extracted("tsk_copy", T0 + 10, u64::MAX)).await;
    indexer.publish(&analyzed("tsk_copy", T0 + 11, &features(2, 0.05))).await;
    indexer.complete("tsk_copy").await;
    assert!(announced.fetch(8, Duration::from_millis(500)).await.unwrap().is_empty(), "nothing to compare with yet");
    indexer.publish(&analyzed("tsk_orig", T0 + 30, &features(2, 0.0))).await;
    let mut got = announced.fetch(8, Duration::from_secs(15)).await.unwrap();
    assert_eq!(got.len(), 1);
    let event: Event<ImageDuplicateDetected> = decode(&got[0].message.payload).unwrap();
    assert_eq!((event.task_id.as_deref(), event.payload.duplicate_of.as_str()), (Some("tsk_copy"), "tsk_orig"));
    assert_eq!(event.payload.phash_distance, Some(64));
    got.remove(0).ack().await.unwrap();
    assert!(announced.fetch(8, Duration::from_millis(500)).await.unwrap().is_empty());
    indexer.stop().await;
}
