//! [`StepCommand`]: what the three step commands share, so one step skeleton serves every
//! worker.

use crate::command::{AnalyzeCommand, DownloadCommand, MetadataCommand};
use crate::event::EventPayload;
use crate::payload::{ImageAnalyzed, ImageDownloaded, ImageMetadataExtracted};
use crate::step::{AnalysisOutput, DownloadOutput, MetadataOutput, Step, StepOutput};

/// What the three step commands share: the task and attempt they are about, the step they
/// drive, and how a success is announced (the step's event payload and its step output).
pub trait StepCommand: serde::de::DeserializeOwned + Send + Sync + 'static {
    /// The step the command drives.
    const STEP: Step;
    /// What the step produces.
    type Output: Send + 'static;
    /// The payload of the step's event.
    type Event: EventPayload + Send;

    /// The task.
    fn task_id(&self) -> &str;

    /// Which attempt of the step this is, from 1.
    fn attempt(&self) -> u32;

    /// The event payload and the step output announcing `output`.
    fn announce(&self, output: Self::Output) -> (Self::Event, StepOutput);
}

impl StepCommand for DownloadCommand {
    const STEP: Step = Step::Download;
    type Output = DownloadOutput;
    type Event = ImageDownloaded;

    fn task_id(&self) -> &str {
        &self.task_id
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn announce(&self, image: DownloadOutput) -> (ImageDownloaded, StepOutput) {
        (ImageDownloaded { image: image.clone(), labels: self.labels.clone() }, StepOutput::Download(image))
    }
}

impl StepCommand for MetadataCommand {
    const STEP: Step = Step::Metadata;
    type Output = MetadataOutput;
    type Event = ImageMetadataExtracted;

    fn task_id(&self) -> &str {
        &self.task_id
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn announce(&self, metadata: MetadataOutput) -> (ImageMetadataExtracted, StepOutput) {
        let event = ImageMetadataExtracted {
            blob_key: self.blob_key.clone(),
            metadata: metadata.clone(),
            labels: self.labels.clone(),
        };
        (event, StepOutput::Metadata(metadata))
    }
}

impl StepCommand for AnalyzeCommand {
    const STEP: Step = Step::Analyze;
    type Output = AnalysisOutput;
    type Event = ImageAnalyzed;

    fn task_id(&self) -> &str {
        &self.task_id
    }

    fn attempt(&self) -> u32 {
        self.attempt
    }

    fn announce(&self, analysis: AnalysisOutput) -> (ImageAnalyzed, StepOutput) {
        let result = AnalysisOutput {
            model: analysis.model.clone(),
            predictions: analysis.predictions.clone(),
            tags: analysis.tags.clone(),
            embedding: None,
        };
        let event = ImageAnalyzed { blob_key: self.blob_key.clone(), analysis, labels: self.labels.clone() };
        (event, StepOutput::Analyze(result))
    }
}
