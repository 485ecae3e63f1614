//! Helpers shared by the coordinator's integration tests.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use imagepipe_bus::memory::{MemoryBus, MemoryConfig};
use imagepipe_bus::{Bus, Consumer, ConsumerConfig, Delivery, Message};
use imagepipe_contracts::step::{AnalysisOutput, DownloadOutput, MetadataOutput, Prediction};
use imagepipe_contracts::{Step, StepOutcome, StepOutput, StepResult};
use imagepipe_coordinator::engine::{Engine, EngineConfig};
use imagepipe_coordinator::store::TaskStore;
use imagepipe_runtime::clock::ManualClock;

pub const T0: u64 = 1_763_800_000_000;
pub const BLOB: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
pub const REDIS: &str = "redis://127.0.0.1:6379";

pub fn memory_bus() -> Bus {
    MemoryBus::new("imagepipe".into(), MemoryConfig::default()).into_bus()
}

pub fn engine(store: Arc<dyn TaskStore>, bus: &Bus, clock: &ManualClock, max_in_flight: u64) -> Engine {
    let config = EngineConfig { max_in_flight, ..EngineConfig::default() };
    Engine::new(store, bus.clone(), Arc::new(clock.clone()), config)
}

pub fn consumer_config() -> ConsumerConfig {
    ConsumerConfig { ack_wait: Duration::from_secs(30), max_deliveries: 3 }
}

/// Every delivery waiting on `consumer` now, acknowledged.
pub async fn drain(consumer: &dyn Consumer) -> Vec<Message> {
    let mut out = Vec::new();
    loop {
        let batch = consumer.fetch(100, Duration::from_millis(20)).await.unwrap();
        if batch.is_empty() {
            return out;
        }
        for d in batch {
            out.push(d.message.clone());
            d.ack().await.unwrap();
        }
    }
}

/// Sends `payload` to `queue` and fetches it back as a delivery.
pub async fn deliver(bus: &Bus, queue: &str, payload: Vec<u8>) -> Delivery {
    let consumer = bus.queues.consume(queue, consumer_config()).await.unwrap();
    bus.queues.send(queue, Message::new(payload)).await.unwrap();
    let mut got = consumer.fetch(1, Duration::from_secs(5)).await.unwrap();
    got.pop().expect("the message just sent")
}

pub fn output(step: Step) -> StepOutput {
    match step {
        Step::Download => StepOutput::Download(DownloadOutput {
            blob_key: BLOB.into(),
            size: 10,
            sha256: BLOB[7..].into(),
            format: "jpeg".into(),
            final_url: None,
        }),
        Step::Metadata => StepOutput::Metadata(MetadataOutput {
            format: "jpeg".into(),
            width: 1,
            height: 1,
            color_type: "rgb8".into(),
            bit_depth: 8,
            has_alpha: false,
            frame_count: 1,
            exif: None,
            has_icc_profile: false,
            dominant_colors: vec![],
            mean_brightness: 0.5,
            phash: "0000000000000000".into(),
            blurhash: "L00000fQfQfQfQfQfQfQfQfQfQfQ".into(),
            thumbnail_key: BLOB.into(),
            thumbnails: Vec::new(),
            preview_key: None,
        }),
        Step::Analyze => StepOutput::Analyze(AnalysisOutput {
            model: "m".into(),
            predictions: vec![Prediction { label: "cat".into(), score: 0.9 }],
            tags: vec![],
            embedding: None,
        }),
        Step::Custom(_) => StepOutput::Stage(serde_json::Map::new()),
    }
}

pub fn ok(task_id: &str, step: Step, attempt: u32) -> StepResult {
    StepResult { task_id: task_id.into(), step, attempt, outcome: StepOutcome::Ok { output: output(step) } }
}

/// Deletes every key of a Redis prefix when dropped.
pub struct RedisCleanup(pub String);

impl Drop for RedisCleanup {
    fn drop(&mut self) {
        let Ok(mut conn) = redis::Client::open(REDIS).and_then(|c| c.get_connection()) else { return };
        let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}:*", self.0)).query(&mut conn).unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

pub fn unique_prefix(name: &str) -> String {
    format!("test-coord-{name}-{}", uuid::Uuid::new_v4().simple())
}
