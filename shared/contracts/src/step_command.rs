//! [`StepCommand`]: what the step commands share (the three built-in ones and a custom stage's
//! [`StageCommand`]), so one step skeleton serves every worker.

use crate::command::{AnalyzeCommand, DownloadCommand, MetadataCommand};
use crate::event::EventPayload;
use crate::payload::{ImageAnalyzed, ImageDownloaded, ImageMetadataExtracted};
use crate::stage::StageCommand;
use crate::step::{AnalysisOutput, DownloadOutput, MetadataOutput, Step, StepOutput};

/// What the step commands share: the task and attempt they are about, the step they drive,
/// and how a success is announced (the step's event payload, if its worker publishes one, and
/// its step output).
pub trait StepCommand: serde::de::DeserializeOwned + Send + Sync + 'static {
    /// What the step produces.
    type Output: Send + 'static;
    /// The payload of the step's event.
    type Event: EventPayload + Send;

    /// The step the command drives.
    fn step(&self) -> Step;

    /// The task.
    fn task_id(&self) -> &str;

    /// Which attempt of the step this is, from 1.
    fn attempt(&self) -> u32;

    /// The event payload the worker publishes (none: the coordinator announces the step) and
    /// the step output announcing `output`.
    fn announce(&self, output: Self::Output) -> (Option<Self::Event>, StepOutput);
}

impl StepCommand for DownloadCommand {
    fn step(&self) -> Step {
        Step::Download
    }

    type Output = DownloadOutput;
    type Event = ImageDownloaded;

    fn task_id(&self) -> &str {
        &self.task_id
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn announce(&self, image: DownloadOutput) -> (Option<ImageDownloaded>, StepOutput) {
        (Some(ImageDownloaded { image: image.clone(), labels: self.labels.clone() }), StepOutput::Download(image))
    }
}

impl StepCommand for MetadataCommand {
    fn step(&self) -> Step {
        Step::Metadata
    }

    type Output = MetadataOutput;
    type Event = ImageMetadataExtracted;

    fn task_id(&self) -> &str {
        &self.task_id
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn announce(&self, metadata: MetadataOutput) -> (Option<ImageMetadataExtracted>, StepOutput) {
        let event = ImageMetadataExtracted {
            blob_key: self.blob_key.clone(),
            metadata: metadata.clone(),
            labels: self.labels.clone(),
        };
        (Some(event), StepOutput::Metadata(metadata))
    }
}

impl StepCommand for AnalyzeCommand {
    fn step(&self) -> Step {
        Step::Analyze
    }

    type Output = AnalysisOutput;
    type Event = ImageAnalyzed;

    fn task_id(&self) -> &str {
        &self.task_id
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn announce(&self, analysis: AnalysisOutput) -> (Option<ImageAnalyzed>, StepOutput) {
        let result = AnalysisOutput {
            model: analysis.model.clone(),
            predictions: analysis.predictions.clone(),
            tags: analysis.tags.clone(),
            embedding: None,
        };
        let event = ImageAnalyzed { blob_key: self.blob_key.clone(), analysis, labels: self.labels.clone() };
        (Some(event), StepOutput::Analyze(result))
    }
}

/// A custom stage's command: the coordinator announces its success (`stage.completed`) from the
/// step result, so its worker publishes no event of its own.
impl StepCommand for StageCommand {
    type Output = serde_json::Map<String, serde_json::Value>;
    type Event = crate::payload::StageCompleted;

    fn step(&self) -> Step {
        self.stage
    }

    fn task_id(&self) -> &str {
        &self.task_id
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn announce(&self, output: Self::Output) -> (Option<Self::Event>, StepOutput) {
        (None, StepOutput::Stage(output))
    }
}
