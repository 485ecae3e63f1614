//! The metadata worker end to end on the in-memory bus: a `tasks.metadata` command in, the
//! `image.metadata_extracted` event and the step result out, the thumbnail in the blob store.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use imagepipe_blob::{BlobError, BlobKey, BlobStore, LocalBlobStore};
use imagepipe_bus::{Bus, BusConfig, Consumer, ConsumerConfig, Delivery, Message, Selector, Subscription};
use imagepipe_contracts::names::{self, headers, queues};
use imagepipe_contracts::payload::ImageMetadataExtracted;
use imagepipe_contracts::{
    Event, EventType, Labels, MetadataCommand, Step, StepOutcome, StepOutput, StepResult, decode, event_id,
};
use imagepipe_metadata_worker::error::codes;
use imagepipe_metadata_worker::{MetadataHandler, SERVICE, run};
use imagepipe_runtime::clock::SystemClock;
use imagepipe_runtime::config::MetadataConfig;
use imagepipe_runtime::step::{self, Reporting, StepReporter, outgoing};
use imagepipe_runtime::{LoopConfig, Settings, Shutdown, Worker};
use support::*;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(20);

/// A metadata worker running on its own memory bus and blob directory, with a subscriber on
/// every event and a consumer of step results.
struct Harness {
    bus: Bus,
    blobs: LocalBlobStore,
    shutdown: Shutdown,
    worker: JoinHandle<()>,
    events: Box<dyn Consumer>,
    results: Box<dyn Consumer>,
    _dir: tempfile::TempDir,
}

impl Harness {
    async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        let mut settings = Settings::default();
        settings.blob.dir = dir.path().join("blobs");
        settings.worker.concurrency = 2;
        let blobs = LocalBlobStore::new(&settings.blob.dir);
        let events = bus.events.subscribe(Subscription::new("metadata-test", Selector::all())).await.unwrap();
        let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
        let shutdown = Shutdown::new();
        let (worker_bus, stop) = (bus.clone(), shutdown.clone());
        let worker = tokio::spawn(async move { run(worker_bus, &settings, stop).await.expect("the worker runs") });
        Self { bus, blobs, shutdown, worker, events, results, _dir: dir }
    }

    /// Runs the worker loop with the handler `make` builds on the harness's bus and blob
    /// directory, instead of [`run`]'s.
    async fn with_handler(make: impl FnOnce(Bus, &Path) -> Reporting<MetadataHandler>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        let settings = Settings::default();
        let handler = make(bus.clone(), dir.path());
        let consumer = bus.queues.consume(queues::METADATA, settings.worker.consumer_config()).await.unwrap();
        let events = bus.events.subscribe(Subscription::new("metadata-test", Selector::all())).await.unwrap();
        let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
        let shutdown = Shutdown::new();
        let worker = Worker::new(consumer, handler, LoopConfig::from_settings(queues::METADATA, &settings.worker));
        let stop = shutdown.clone();
        let worker = tokio::spawn(async move { worker.run(stop).await.expect("the worker runs") });
        Self { bus, blobs: LocalBlobStore::new(dir.path()), shutdown, worker, events, results, _dir: dir }
    }

    async fn send(&self, command: &MetadataCommand) {
        let id = format!("{}:metadata:{}", command.task_id, command.attempt);
        self.bus.queues.send(queues::METADATA, outgoing(command, &command.task_id, id)).await.unwrap();
    }

    async fn next_result(&self) -> StepResult {
        let delivery = one(&*self.results, WAIT).await.expect("a step result");
        let result = decode(&delivery.message.payload).unwrap();
        delivery.ack().await.unwrap();
        result
    }

    async fn no_event(&self) {
        assert!(one(&*self.events, Duration::from_millis(100)).await.is_none(), "no event for a failed step");
    }

    async fn stop(self) {
        self.shutdown.trigger();
        tokio::time::timeout(WAIT, self.worker).await.expect("the worker stops").unwrap();
    }
}

async fn one(consumer: &dyn Consumer, wait: Duration) -> Option<Delivery> {
    consumer.fetch(1, wait).await.unwrap().pop()
}

fn command(task_id: &str, blob_key: &str) -> MetadataCommand {
    MetadataCommand { task_id: task_id.into(), attempt: 1, blob_key: blob_key.into(), labels: Labels::new() }
}

fn permanent_code(result: &StepResult) -> &str {
    match &result.outcome {
        StepOutcome::Permanent { error } => &error.code,
        other => panic!("expected a permanent failure, got {other:?}"),
    }
}

#[tokio::test]
async fn a_photo_becomes_an_event_a_result_and_a_thumbnail() {
    let h = Harness::start().await;
    let photo = jpeg(&scene(800, 600), Some(camera_exif(6)), None);
    let key = h.blobs.put(Bytes::from(photo)).await.unwrap();
    let labels = Labels::from([("album".to_owned(), "summer".to_owned())]);
    let cmd = MetadataCommand { attempt: 2, labels: labels.clone(), ..command("tsk_meta_photo", key.as_str()) };
    h.send(&cmd).await;

    let delivered = one(&*h.events, WAIT).await.expect("an event");
    let event: Event<ImageMetadataExtracted> = decode(&delivered.message.payload).unwrap();
    assert_eq!(event.event_type, EventType::ImageMetadataExtracted);
    assert_eq!(event.event_id, event_id("tsk_meta_photo", EventType::ImageMetadataExtracted, 2));
    assert_eq!((event.task_id.as_deref(), event.source.as_str()), (Some("tsk_meta_photo"), SERVICE));
    assert_eq!((event.payload.blob_key.as_str(), &event.payload.labels), (key.as_str(), &labels));
    let metadata = event.payload.metadata;
    assert_eq!((metadata.format.as_str(), metadata.width, metadata.height), ("jpeg", 800, 600));
    assert_eq!(metadata.exif.as_ref().and_then(|e| e.make.as_deref()), Some("Imagepipe Optics"));
    assert!(metadata.exif.as_ref().and_then(|e| e.gps_latitude).is_some_and(|lat| lat < -22.9));

    let result = h.next_result().await;
    assert_eq!((result.task_id.as_str(), result.step, result.attempt), ("tsk_meta_photo", Step::Metadata, 2));
    match result.outcome {
        StepOutcome::Ok { output: StepOutput::Metadata(output) } => assert_eq!(output, metadata),
        other => panic!("expected the metadata output, got {other:?}"),
    }

    let thumbnail_key: BlobKey = metadata.thumbnail_key.parse().unwrap();
    let thumbnail = image::load_from_memory(&h.blobs.get(&thumbnail_key).await.unwrap()).unwrap();
    assert_eq!((thumbnail.width(), thumbnail.height()), (192, 256), "upright (orientation 6), 256 px long edge");
    let preview_key: BlobKey = metadata.preview_key.as_deref().expect("a preview for the AI worker").parse().unwrap();
    let preview = image::load_from_memory(&h.blobs.get(&preview_key).await.unwrap()).unwrap();
    assert_eq!((preview.width(), preview.height()), (600, 800), "upright, never enlarged");
    for derivative in &metadata.thumbnails {
        assert!(h.blobs.exists(&derivative.key.parse().unwrap()).await.unwrap(), "{} is stored", derivative.name);
    }
    h.stop().await;
}

#[tokio::test]
async fn undecodable_images_fail_permanently_without_an_event() {
    let h = Harness::start().await;
    let bomb = h.blobs.put(Bytes::from(pixel_bomb_png(100_000, 100_000))).await.unwrap();
    let jpeg = jpeg(&scene(320, 240), None, None);
    let truncated = h.blobs.put(Bytes::copy_from_slice(&jpeg[..jpeg.len() / 2])).await.unwrap();
    let text = h.blobs.put(Bytes::from_static(b"just some text, sent as image/jpeg")).await.unwrap();
    let missing = BlobKey::of(b"never stored");

    let cases = [
        ("tsk_meta_bomb", bomb.to_string(), codes::PIXEL_LIMIT),
        ("tsk_meta_truncated", truncated.to_string(), codes::DECODE_FAILED),
        ("tsk_meta_text", text.to_string(), codes::UNSUPPORTED_FORMAT),
        ("tsk_meta_missing", missing.to_string(), step::codes::BLOB_NOT_FOUND),
        ("tsk_meta_bad_key", "sha256:nothex".to_owned(), step::codes::INVALID_BLOB_KEY),
    ];
    for (task, key, code) in &cases {
        h.send(&command(task, key)).await;
        let result = h.next_result().await;
        assert_eq!(result.task_id, *task);
        assert_eq!(permanent_code(&result), *code);
    }
    h.no_event().await;
    h.stop().await;
}

#[tokio::test]
async fn a_malformed_command_is_dead_lettered_with_the_reason() {
    let h = Harness::start().await;
    let dlq =
        h.bus.queues.consume(&names::dead_letter_queue(queues::METADATA), ConsumerConfig::default()).await.unwrap();
    h.bus.queues.send(queues::METADATA, Message::new(r#"{"taskId":"tsk_meta_bad","attempt":1}"#)).await.unwrap();

    let dead = one(&*dlq, WAIT).await.expect("a dead letter");
    let reason = dead.message.headers.get(headers::DLQ_REASON).unwrap_or_default().to_owned();
    assert!(reason.contains("blobKey"), "{reason}");
    assert!(one(&*h.results, Duration::from_millis(100)).await.is_none(), "no step result for an unreadable command");
    h.stop().await;
}

/// A blob store whose writes fail, as a full or unmounted disk would.
struct ReadOnlyStore(LocalBlobStore);

#[async_trait]
impl BlobStore for ReadOnlyStore {
    async fn put(&self, _: Bytes) -> Result<BlobKey, BlobError> {
        Err(BlobError::Io { path: "thumbnails".into(), source: std::io::Error::other("no space left on device") })
    }
    async fn get_unchecked(&self, key: &BlobKey) -> Result<Bytes, BlobError> {
        self.0.get_unchecked(key).await
    }
    async fn exists(&self, key: &BlobKey) -> Result<bool, BlobError> {
        self.0.exists(key).await
    }
    async fn delete(&self, key: &BlobKey) -> Result<(), BlobError> {
        self.0.delete(key).await
    }
    async fn modified(&self, key: &BlobKey) -> Result<Option<std::time::SystemTime>, BlobError> {
        self.0.modified(key).await
    }
    async fn list(&self, after: Option<&BlobKey>, max: usize) -> Result<Vec<imagepipe_blob::StoredBlob>, BlobError> {
        self.0.list(after, max).await
    }
}

#[tokio::test]
async fn a_failing_blob_store_is_a_retryable_error() {
    let h = Harness::with_handler(|bus, dir| {
        let reporter = StepReporter::new(bus, SERVICE, Arc::new(SystemClock));
        let store = ReadOnlyStore(LocalBlobStore::new(dir));
        Reporting::new(MetadataHandler::new(Arc::new(store), MetadataConfig::default(), 2), reporter)
    })
    .await;
    let key = h.blobs.put(Bytes::from(png_with_alpha(20, 20))).await.unwrap();

    h.send(&command("tsk_meta_disk_full", key.as_str())).await;
    match h.next_result().await.outcome {
        StepOutcome::Retryable { error, .. } => {
            assert_eq!(error.code, step::codes::BLOB_IO);
            assert!(error.message.contains("no space left on device"), "{}", error.message);
        }
        other => panic!("expected a retryable failure, got {other:?}"),
    }
    h.no_event().await;
    h.stop().await;
}
