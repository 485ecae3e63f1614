//! The typed payload of each event type. Every payload carries the task's `labels`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Labels;
use crate::command::ImageSource;
use crate::event::{EventPayload, EventType};
use crate::step::{AnalysisOutput, DownloadOutput, MetadataOutput, Step, StepError};

/// Payload of `image.downloaded`: the stored image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageDownloaded {
    /// What was stored.
    #[serde(flatten)]
    pub image: DownloadOutput,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `image.metadata_extracted`: the image's metadata and thumbnail key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageMetadataExtracted {
    /// Blob key of the source image.
    pub blob_key: String,
    /// What was found.
    #[serde(flatten)]
    pub metadata: MetadataOutput,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `image.analyzed`: the model's labels and tags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageAnalyzed {
    /// Blob key of the source image.
    pub blob_key: String,
    /// What the model said.
    #[serde(flatten)]
    pub analysis: AnalysisOutput,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `image.duplicate_detected`: the task's image (the envelope's `taskId`) is a
/// near-duplicate of an earlier task's, by perceptual hash, by embedding, or both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageDuplicateDetected {
    /// The earlier task whose image this one duplicates.
    pub duplicate_of: String,
    /// Hamming distance of the two 64-bit perceptual hashes (0 = identical), when both have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phash_distance: Option<u32>,
    /// Cosine of the two embeddings (1 = same direction), when both have one of one version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cosine: Option<f64>,
    /// Blob key of the earlier image's thumbnail, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_thumbnail_key: Option<String>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `task.created`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskCreated {
    /// Where the image comes from.
    pub source: ImageSource,
    /// The notification target, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `task.retrying`: a step failed with a retryable error and is scheduled again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskRetrying {
    /// The step that failed.
    pub step: Step,
    /// The attempt that failed.
    pub attempt: u32,
    /// Milliseconds until the next attempt.
    pub delay_ms: u64,
    /// Why it failed.
    pub error: StepError,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `task.completed`: the outputs of every step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskCompleted {
    /// Milliseconds from submission to completion.
    pub duration_ms: u64,
    /// Output of the download step.
    pub download: DownloadOutput,
    /// Output of the metadata step.
    pub metadata: MetadataOutput,
    /// Output of the analyze step.
    pub analysis: AnalysisOutput,
    /// Outputs of the stages of users' own (`pipeline.stages`) that ran, by stage name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub stages: std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
    /// The notification target, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `task.failed`: the step and error that ended the task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskFailed {
    /// The step that failed.
    pub step: Step,
    /// The attempt that failed last.
    pub attempt: u32,
    /// Why the task failed.
    pub error: StepError,
    /// The notification target, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `task.cancelled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskCancelled {
    /// The step the task was at, if it had started one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    /// Why, as given by whoever cancelled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The notification target, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `task.paused`: where the task stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskPaused {
    /// The step it runs when resumed; absent when it had not started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    /// Why, as given by whoever paused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `task.resumed`: where the task goes on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskResumed {
    /// The step dispatched now; absent when the task waits for its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

/// Payload of `queue.paused` and `queue.resumed` (no `taskId`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueChanged {
    /// The stage queue (`tasks.download`, `tasks.metadata`, `tasks.ai`); every priority lane of
    /// it.
    pub queue: String,
    /// Who asked, as given to the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Payload of `queue.paused`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct QueuePaused(pub QueueChanged);

/// Payload of `queue.resumed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct QueueResumed(pub QueueChanged);

/// Payload of `stage.completed`: a stage of users' own succeeded (built-in steps announce
/// themselves with their `image.*` events instead).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageCompleted {
    /// The stage's name in `pipeline.stages`.
    pub stage: Step,
    /// The attempt that succeeded.
    pub attempt: u32,
    /// What the stage's worker reported, kept under `outputs.<stage>` of the task. A `tags`
    /// array of strings in it is indexed by the tag indexer (e.g. `faces:1`).
    pub output: serde_json::Map<String, serde_json::Value>,
    /// The task's labels.
    #[serde(default)]
    pub labels: Labels,
}

macro_rules! payload_of {
    ($($ty:ident => $event:ident),* $(,)?) => {
        $(impl EventPayload for $ty {
            const EVENT_TYPE: EventType = EventType::$event;
        })*
    };
}

payload_of! {
    ImageDownloaded => ImageDownloaded,
    ImageMetadataExtracted => ImageMetadataExtracted,
    ImageAnalyzed => ImageAnalyzed,
    ImageDuplicateDetected => ImageDuplicateDetected,
    TaskCreated => TaskCreated,
    TaskRetrying => TaskRetrying,
    TaskCompleted => TaskCompleted,
    TaskFailed => TaskFailed,
    TaskCancelled => TaskCancelled,
    TaskPaused => TaskPaused,
    TaskResumed => TaskResumed,
    QueuePaused => QueuePaused,
    QueueResumed => QueueResumed,
    StageCompleted => StageCompleted,
}
