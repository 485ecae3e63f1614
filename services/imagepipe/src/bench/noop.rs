//! No-op stages: the download, metadata and AI queues consumed by the real worker loop, each
//! command decoded and answered at once through the real [`StepReporter`] with a fixed output
//! of realistic size, so the coordinator and the bus do all of their work and no image is
//! touched.

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_bus::{Bus, BusError, Delivery};
use imagepipe_contracts::command::{AnalyzeCommand, DownloadCommand, MetadataCommand};
use imagepipe_contracts::payload::{ImageAnalyzed, ImageDownloaded, ImageMetadataExtracted, StageCompleted};
use imagepipe_contracts::step::{AnalysisOutput, DominantColor, DownloadOutput, MetadataOutput, Prediction};
use imagepipe_contracts::{Priority, StageCommand, Step, StepOutput, decode};
use imagepipe_runtime::clock::SystemClock;
use imagepipe_runtime::step::{Attempt, StepReporter};
use imagepipe_runtime::{Handler, LoopConfig, Outcome, Settings, Shutdown, Worker, error_chain};
use tokio::task::JoinSet;

/// The blob key every no-op task carries (the sha256 of an empty input).
pub const BLOB_KEY: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Answers the commands of one step with a fixed success.
pub struct NoopStage {
    step: Step,
    reporter: StepReporter,
}

impl NoopStage {
    /// A no-op `step` reporting on `bus` as that step's worker would.
    pub fn new(step: Step, bus: Bus) -> Self {
        let source = match step {
            Step::Download => imagepipe_download_worker::SERVICE,
            Step::Metadata => imagepipe_metadata_worker::SERVICE,
            Step::Analyze => imagepipe_ai_worker::SERVICE,
            Step::Custom(stage) => stage.as_str(),
        };
        Self { step, reporter: StepReporter::new(bus, source, Arc::new(SystemClock)) }
    }

    async fn report(
        &self,
        payload: &[u8],
        priority: Priority,
        shard: Option<u16>,
    ) -> Result<Result<(), BusError>, String> {
        let attempt =
            |task_id: &str, attempt| Attempt { task_id: task_id.to_owned(), step: self.step, attempt, priority, shard };
        Ok(match self.step {
            Step::Download => {
                let command: DownloadCommand = decode(payload).map_err(|e| e.to_string())?;
                let image = download_output();
                let event = ImageDownloaded { image: image.clone(), labels: command.labels };
                let attempt = attempt(&command.task_id, command.attempt);
                self.reporter.succeeded(&attempt, Some(event), StepOutput::Download(image)).await
            }
            Step::Metadata => {
                let command: MetadataCommand = decode(payload).map_err(|e| e.to_string())?;
                let metadata = metadata_output();
                let event = ImageMetadataExtracted {
                    blob_key: command.blob_key,
                    metadata: metadata.clone(),
                    labels: command.labels,
                };
                let attempt = attempt(&command.task_id, command.attempt);
                self.reporter.succeeded(&attempt, Some(event), StepOutput::Metadata(metadata)).await
            }
            Step::Analyze => {
                let command: AnalyzeCommand = decode(payload).map_err(|e| e.to_string())?;
                let analysis = analysis_output();
                let event =
                    ImageAnalyzed { blob_key: command.blob_key, analysis: analysis.clone(), labels: command.labels };
                let attempt = attempt(&command.task_id, command.attempt);
                self.reporter.succeeded(&attempt, Some(event), StepOutput::Analyze(analysis)).await
            }
            Step::Custom(_) => {
                let command: StageCommand = decode(payload).map_err(|e| e.to_string())?;
                let attempt = attempt(&command.task_id, command.attempt);
                let output = StepOutput::Stage(serde_json::Map::new());
                self.reporter.succeeded::<StageCompleted>(&attempt, None, output).await
            }
        })
    }
}

#[async_trait]
impl Handler for NoopStage {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let priority = imagepipe_contracts::lane_of(&delivery.source).1;
        let shard = imagepipe_runtime::step::command_shard(&delivery.message);
        match self.report(&delivery.message.payload, priority, shard).await {
            Ok(Ok(())) => Outcome::Ack,
            Ok(Err(error)) => Outcome::retry(format!("reporting the {} step: {}", self.step, error_chain(&error))),
            Err(malformed) => Outcome::reject(malformed),
        }
    }
}

/// Starts a worker loop with a [`NoopStage`] on each step's queue, with the `worker` settings,
/// until `stop`; a loop that fails ends with its error's text.
pub async fn spawn(
    bus: &Bus,
    settings: &Settings,
    stop: &Shutdown,
    workers: &mut JoinSet<Result<(), String>>,
) -> Result<(), BusError> {
    for step in [Step::Download, Step::Metadata, Step::Analyze] {
        let queue = step.queue();
        let consumer = imagepipe_runtime::worker::consume_lanes(bus, queue, &settings.worker).await?;
        let worker = Worker::new(
            consumer,
            NoopStage::new(step, bus.clone()),
            LoopConfig::from_settings(queue, &settings.worker),
        );
        let stop = stop.clone();
        workers.spawn(async move { worker.run(stop).await.map_err(|e| error_chain(&e)) });
    }
    Ok(())
}

fn download_output() -> DownloadOutput {
    DownloadOutput {
        blob_key: BLOB_KEY.to_owned(),
        size: 48_213,
        sha256: BLOB_KEY.trim_start_matches("sha256:").to_owned(),
        format: "jpeg".into(),
        final_url: None,
    }
}

fn metadata_output() -> MetadataOutput {
    let colors = [("#3a2f28", 0.31), ("#8c7b6b", 0.22), ("#d9cbb8", 0.18), ("#5b4a3c", 0.15), ("#1d1712", 0.14)];
    MetadataOutput {
        format: "jpeg".into(),
        width: 640,
        height: 427,
        color_type: "rgb8".into(),
        bit_depth: 8,
        has_alpha: false,
        frame_count: 1,
        exif: None,
        has_icc_profile: false,
        dominant_colors: colors
            .iter()
            .map(|(hex, share)| DominantColor { hex: (*hex).into(), share: *share })
            .collect(),
        mean_brightness: 0.42,
        phash: "c3d4e5f60718293a".into(),
        blurhash: "LEHV6nWB2yk8pyo0adR*.7kCMdnj".into(),
        thumbnail_key: "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae".into(),
        thumbnails: Vec::new(),
        preview_key: None,
    }
}

fn analysis_output() -> AnalysisOutput {
    let scored = |labels: &[&str]| {
        labels
            .iter()
            .enumerate()
            .map(|(i, label)| Prediction { label: (*label).into(), score: 0.5 / (i as f64 + 1.0) })
            .collect()
    };
    AnalysisOutput {
        model: "mobilenetv2-12 (ImageNet-1k)".into(),
        predictions: scored(&["tiger cat", "tabby", "Egyptian cat", "lynx", "tiger"]),
        tags: scored(&["organism", "animal", "chordate", "vertebrate", "mammal", "carnivore", "feline", "cat"]),
        embedding: None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use imagepipe_bus::{BusConfig, ConsumerConfig, Message, Selector, Subscription};
    use imagepipe_contracts::command::ImageSource;
    use imagepipe_contracts::names::queues;
    use imagepipe_contracts::{StepOutcome, StepResult};

    use super::*;

    #[tokio::test]
    async fn a_noop_stage_publishes_its_event_and_reports_success() {
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        let events = bus.events.subscribe(Subscription::new("t", Selector::all())).await.unwrap();
        let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
        let command = DownloadCommand {
            task_id: "tsk_1".into(),
            attempt: 2,
            source: ImageSource::Blob(BLOB_KEY.into()),
            labels: Default::default(),
        };
        bus.queues.send(queues::DOWNLOAD, Message::new(serde_json::to_vec(&command).unwrap())).await.unwrap();
        let delivery = bus
            .queues
            .consume(queues::DOWNLOAD, ConsumerConfig::default())
            .await
            .unwrap()
            .fetch(1, Duration::from_secs(1))
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(NoopStage::new(Step::Download, bus.clone()).handle(&delivery).await, Outcome::Ack);

        let event = events.fetch(1, Duration::from_secs(1)).await.unwrap().pop().unwrap();
        assert_eq!(event.message.key.as_deref(), Some("tsk_1"));
        let result = results.fetch(1, Duration::from_secs(1)).await.unwrap().pop().unwrap();
        let result: StepResult = decode(&result.message.payload).unwrap();
        assert_eq!((result.task_id.as_str(), result.step, result.attempt), ("tsk_1", Step::Download, 2));
        assert!(matches!(result.outcome, StepOutcome::Ok { output: StepOutput::Download(_) }));
    }

    #[tokio::test]
    async fn a_malformed_command_is_rejected() {
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        bus.queues.send(queues::AI, Message::new("{}")).await.unwrap();
        let consumer = bus.queues.consume(queues::AI, ConsumerConfig::default()).await.unwrap();
        let delivery = consumer.fetch(1, Duration::from_secs(1)).await.unwrap().pop().unwrap();
        let outcome = NoopStage::new(Step::Analyze, bus).handle(&delivery).await;
        assert!(matches!(outcome, Outcome::Reject { .. }), "{outcome:?}");
    }
}
