//! Similar images and near-duplicates on the whole pipeline, over the memory bus with the
//! embedded store and over NATS with Redis: copies of the sample photos resized to 50 %,
//! re-encoded at JPEG quality 60 and cropped by 10 % come back as similar to their original and
//! are announced as its near-duplicates; different photos are not duplicates of each other; the
//! index rebuilt from the event stream equals the live one.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::time::Duration;

use bytes::Bytes;
use image::ImageFormat;
use image::codecs::jpeg::JpegEncoder;
use image::imageops::FilterType;
use imagepipe::samples::SAMPLES;
use imagepipe::{ApiClient, Pipeline};
use imagepipe_bus::{BusKind, Selector, Subscription};
use imagepipe_contracts::payload::ImageDuplicateDetected;
use imagepipe_contracts::{Event, EventType, SubmitTask, decode};
use imagepipe_coordinator::TaskState;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);

/// The transformed copies of a photo: (name, JPEG bytes).
fn copies(original: &[u8]) -> Vec<(&'static str, Vec<u8>)> {
    let image = image::load_from_memory(original).unwrap();
    let (w, h) = (image.width(), image.height());
    let jpeg = |image: &image::DynamicImage, quality: u8| {
        let mut out = Cursor::new(Vec::new());
        image.to_rgb8().write_with_encoder(JpegEncoder::new_with_quality(&mut out, quality)).unwrap();
        out.into_inner()
    };
    let half = image.resize_exact(w / 2, h / 2, FilterType::Lanczos3);
    let cropped = image.crop_imm(w / 20, h / 20, w - w / 10, h - h / 10);
    assert_eq!(image::guess_format(original).unwrap(), ImageFormat::Jpeg);
    vec![("half", jpeg(&half, 90)), ("q60", jpeg(&image, 60)), ("crop10", jpeg(&cropped, 90))]
}

struct Run {
    pipeline: Pipeline,
    _work: tempfile::TempDir,
    prefix: String,
}

async fn start(bus: BusKind) -> Option<Run> {
    let model_dir = common::model_dir()?;
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    let prefix = format!("sim{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    settings.bus.prefix = prefix.clone();
    if bus == BusKind::Nats {
        common::on_nats_and_redis(&mut settings);
    }
    let pipeline = Pipeline::start(settings).await.unwrap();
    Some(Run { pipeline, _work: work, prefix })
}

impl Run {
    async fn submit(&self, id: &str, bytes: Vec<u8>) {
        let key = self.pipeline.blobs().put(Bytes::from(bytes)).await.unwrap();
        let submit = SubmitTask { task_id: Some(id.to_owned()), blob: Some(key.to_string()), ..SubmitTask::default() };
        self.pipeline.submit(&submit).await.unwrap();
    }

    fn client(&self) -> ApiClient {
        ApiClient::new(&self.pipeline.api_url(), None).unwrap()
    }

    /// Waits until the indexer holds `n` vectors.
    async fn indexed(&self, n: u64) -> Value {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let answer: Value = self.client().get("/v1/duplicates", &[]).await.unwrap();
            if answer["index"]["vectors"].as_u64() == Some(n) {
                return answer;
            }
            assert!(tokio::time::Instant::now() < deadline, "never {n} vectors: {answer}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn stop(self) {
        let nats = self.pipeline.settings().bus.kind == BusKind::Nats;
        self.pipeline.stop().await.unwrap();
        if nats {
            common::delete_nats_streams(&self.prefix).await;
        }
    }
}

/// The family (sample name) of a task id `tsk_<family>_<variant>`.
fn family(id: &str) -> &str {
    id.trim_start_matches("tsk_").split('_').next().unwrap()
}

async fn transformed_copies_are_similar_and_announced_as_duplicates(bus: BusKind) {
    let Some(run) = start(bus).await else { return };
    let duplicates = run
        .pipeline
        .bus()
        .events
        .subscribe(Subscription::new("sim-test", Selector::parse("image.duplicate_detected").unwrap()))
        .await
        .unwrap();

    let mut originals = Vec::new();
    for sample in SAMPLES {
        let id = format!("tsk_{}_orig", sample.name.trim_end_matches(".jpg"));
        run.submit(&id, sample.bytes.to_vec()).await;
        originals.push(id);
    }
    for task in run.pipeline.wait_for(&originals, WAIT).await.unwrap() {
        assert_eq!(task.state, TaskState::Completed, "{}: {:?}", task.id, task.failure);
    }
    let before = run.indexed(SAMPLES.len() as u64).await;
    assert_eq!(before["total"], 0, "different photos are not near-duplicates: {before}");

    let mut copy_ids = Vec::new();
    for sample in SAMPLES {
        for (variant, bytes) in copies(sample.bytes) {
            let id = format!("tsk_{}_{variant}", sample.name.trim_end_matches(".jpg"));
            run.submit(&id, bytes).await;
            copy_ids.push(id);
        }
    }
    for task in run.pipeline.wait_for(&copy_ids, WAIT).await.unwrap() {
        assert_eq!(task.state, TaskState::Completed, "{}: {:?}", task.id, task.failure);
    }
    run.indexed((SAMPLES.len() * 4) as u64).await;

    // Each copy: its most similar image is of its own family, and of the originals its own
    // comes first.
    let client = run.client();
    for copy in &copy_ids {
        let answer: Value = client.similar_to(copy, 20).await.unwrap();
        let results = answer["results"].as_array().unwrap();
        let ids: Vec<&str> = results.iter().map(|r| r["taskId"].as_str().unwrap()).collect();
        assert_eq!(family(ids[0]), family(copy), "{copy}: {answer}");
        let first_original = ids.iter().find(|id| id.ends_with("_orig")).unwrap();
        assert_eq!(family(first_original), family(copy), "{copy}: {answer}");
        assert!(!ids.contains(&copy.as_str()), "{copy} is not its own neighbour");
    }
    // The file route runs the model on the bytes: a copy of chelsea finds chelsea's family.
    let (_, half) = copies(SAMPLES[0].bytes).remove(0);
    let answer: Value = client.search_similar(Bytes::from(half), 3).await.unwrap();
    assert_eq!(family(answer["results"][0]["taskId"].as_str().unwrap()), family(&originals[0]), "{answer}");

    // Every copy is announced once as a near-duplicate of its family, no original is.
    let mut announced: BTreeMap<String, Event<ImageDuplicateDetected>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while announced.len() < copy_ids.len() && tokio::time::Instant::now() < deadline {
        for delivery in duplicates.fetch(32, Duration::from_secs(1)).await.unwrap() {
            let event: Event<ImageDuplicateDetected> = decode(&delivery.message.payload).unwrap();
            assert_eq!(event.event_type, EventType::ImageDuplicateDetected);
            let task = event.task_id.clone().unwrap();
            assert!(delivery.message.payload.len() < 4096);
            assert!(announced.insert(task.clone(), event).is_none(), "{task} announced twice");
            delivery.ack().await.unwrap();
        }
    }
    let ids: BTreeSet<&String> = announced.keys().collect();
    assert_eq!(ids, copy_ids.iter().collect(), "every copy announced, no original");
    for (task, event) in &announced {
        assert_eq!(family(&event.payload.duplicate_of), family(task), "{task}: {:?}", event.payload);
        let (cosine, distance) = (event.payload.cosine, event.payload.phash_distance);
        let threshold = run.pipeline.settings().similarity.duplicate_threshold;
        assert!(
            cosine.is_some_and(|c| c >= threshold) || distance.is_some_and(|d| d <= 6),
            "{task}: {:?}",
            event.payload
        );
    }

    // The groups are the four families.
    let groups: Value = client.get("/v1/duplicates", &[]).await.unwrap();
    assert_eq!(groups["total"], SAMPLES.len(), "{groups}");
    for group in groups["groups"].as_array().unwrap() {
        let members: BTreeSet<&str> =
            group["tasks"].as_array().unwrap().iter().map(|t| family(t["taskId"].as_str().unwrap())).collect();
        assert_eq!(members.len(), 1, "one family per group: {group}");
    }

    // A rebuild from the event stream gives the same index: the same neighbours, the same groups.
    let similar_before: Vec<Value> = {
        let mut all = Vec::new();
        for id in originals.iter().chain(&copy_ids) {
            all.push(client.similar_to::<Value>(id, 5).await.unwrap()["results"].clone());
        }
        all
    };
    let started: Value = client.post::<(), Value>("/v1/similarity/rebuild", None).await.unwrap();
    assert_eq!(started["state"], "running", "{started}");
    let deadline = tokio::time::Instant::now() + WAIT;
    let status = loop {
        let status: Value = client.get("/v1/similarity/rebuild", &[]).await.unwrap();
        if status["state"] != "running" {
            break status;
        }
        assert!(tokio::time::Instant::now() < deadline, "rebuild never ended: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status["state"], "done", "{status}");
    assert!(status["events"].as_u64().unwrap() >= (copy_ids.len() + originals.len()) as u64 * 2, "{status}");
    run.indexed((SAMPLES.len() * 4) as u64).await;
    for (id, before) in originals.iter().chain(&copy_ids).zip(similar_before) {
        let after = client.similar_to::<Value>(id, 5).await.unwrap()["results"].clone();
        assert_eq!(after, before, "{id}: the rebuilt index answers as the live one did");
    }
    let rebuilt: Value = client.get("/v1/duplicates", &[]).await.unwrap();
    assert_eq!(rebuilt["groups"], groups["groups"]);
    // The rebuild announced nothing again.
    assert!(duplicates.fetch(32, Duration::from_secs(2)).await.unwrap().is_empty());
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformed_copies_are_similar_and_announced_as_duplicates_memory() {
    transformed_copies_are_similar_and_announced_as_duplicates(BusKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transformed_copies_are_similar_and_announced_as_duplicates_nats() {
    transformed_copies_are_similar_and_announced_as_duplicates(BusKind::Nats).await;
}
