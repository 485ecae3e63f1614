//! What a worker reports to the coordinator after handling a step command.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::stage::{InvalidStageName, StageName};

/// A step of the pipeline: one of the three built-in steps, or a stage of users' own from
/// `pipeline.stages` ([`StageName`]). On the wire it is the step's name (`download`,
/// `metadata`, `analyze`, or the stage's name).
///
/// The order of the pipeline is the configuration's (`pipeline.stages`), not this type's:
/// compare positions through the coordinator's pipeline, not with `<`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Step {
    /// Fetch the image into the blob store (download-worker).
    Download,
    /// Decode, extract metadata, write a thumbnail (metadata-worker).
    Metadata,
    /// Label the image with the model (ai-worker).
    Analyze,
    /// A stage of users' own, run by their worker on `tasks.<name>`.
    Custom(StageName),
}

impl Step {
    /// The built-in steps, in their pipeline order (the default `pipeline.stages`).
    pub const ALL: [Step; 3] = [Step::Download, Step::Metadata, Step::Analyze];

    /// The wire name: `download`, `metadata`, `analyze`, or a custom stage's name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Step::Download => "download",
            Step::Metadata => "metadata",
            Step::Analyze => "analyze",
            Step::Custom(stage) => stage.as_str(),
        }
    }

    /// The step called `name`: a built-in one, else a custom stage of that name.
    pub fn named(name: &str) -> Result<Step, InvalidStageName> {
        match Step::ALL.into_iter().find(|s| s.as_str() == name) {
            Some(step) => Ok(step),
            None => StageName::new(name).map(Step::Custom),
        }
    }

    /// The task queue whose workers run this step.
    pub const fn queue(self) -> &'static str {
        match self {
            Step::Download => crate::names::queues::DOWNLOAD,
            Step::Metadata => crate::names::queues::METADATA,
            Step::Analyze => crate::names::queues::AI,
            Step::Custom(stage) => stage.queue(),
        }
    }

    /// Whether this is a stage of users' own.
    pub const fn is_custom(self) -> bool {
        matches!(self, Step::Custom(_))
    }
}

impl Serialize for Step {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Step::named(&name).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Step {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Step".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A step of the pipeline: `download`, `metadata`, `analyze`, or the name of a stage of `pipeline.stages`.",
            "type": "string",
            "pattern": "^[a-z]{1}[a-z0-9_]{0,31}$"
        })
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A worker's report on one attempt of one step, sent on `tasks.results`.
/// `(taskId, step, attempt)` identifies it: the coordinator ignores stale or duplicate ones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepResult {
    /// The task.
    pub task_id: String,
    /// The step that ran.
    pub step: Step,
    /// The attempt that ran, from 1.
    pub attempt: u32,
    /// What came of it.
    pub outcome: StepOutcome,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
#[expect(clippy::large_enum_variant, reason = "decoded once per message and moved, never stored in bulk")]
pub enum StepOutcome {
    /// The step succeeded with this output.
    Ok {
        /// The step's output.
        output: StepOutput,
    },
    /// The step failed in a way that may pass on a later attempt.
    Retryable {
        /// What went wrong.
        error: StepError,
        /// The earliest the next attempt should start (e.g. from `Retry-After`).
        #[serde(default, rename = "retryAfterMs", skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
    },
    /// The step can never succeed for this input; the task fails at once.
    Permanent {
        /// What went wrong.
        error: StepError,
    },
    /// The worker did not start the step (its source host is at its politeness limit): the
    /// coordinator sends the same attempt again after `retryAfterMs`. No attempt is charged
    /// and the step's deadline does not run meanwhile.
    Deferred {
        /// Why it waits (code `host_busy`, `host_throttled`, ...).
        reason: StepError,
        /// How long to wait before sending it again.
        #[serde(rename = "retryAfterMs")]
        retry_after_ms: u64,
    },
}

/// A failure with a stable machine code (`http_404`, `not_an_image`, `timeout`, ...) and a
/// message for humans.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StepError {
    /// Stable, snake_case code to branch on.
    pub code: String,
    /// What happened, for people.
    pub message: String,
}

impl StepError {
    /// An error with `code` and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into() }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// The output of a successful step, named by the step; a custom stage's is `stage`: any JSON
/// object (at most [`crate::stage::MAX_STAGE_OUTPUT_BYTES`] bytes as JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[expect(clippy::large_enum_variant, reason = "decoded once per message and moved, never stored in bulk")]
pub enum StepOutput {
    /// Output of [`Step::Download`].
    Download(DownloadOutput),
    /// Output of [`Step::Metadata`].
    Metadata(MetadataOutput),
    /// Output of [`Step::Analyze`].
    Analyze(AnalysisOutput),
    /// Output of a [`Step::Custom`] stage, kept under `outputs.<name>` of the task.
    Stage(serde_json::Map<String, serde_json::Value>),
}

impl StepOutput {
    /// Whether this is the kind of output `step` produces.
    pub fn belongs_to(&self, step: Step) -> bool {
        match self {
            StepOutput::Download(_) => step == Step::Download,
            StepOutput::Metadata(_) => step == Step::Metadata,
            StepOutput::Analyze(_) => step == Step::Analyze,
            StepOutput::Stage(_) => step.is_custom(),
        }
    }

    /// The kind of output, for messages: the built-in step's name, or `stage`.
    pub fn kind(&self) -> &'static str {
        match self {
            StepOutput::Download(_) => "download",
            StepOutput::Metadata(_) => "metadata",
            StepOutput::Analyze(_) => "analyze",
            StepOutput::Stage(_) => "stage",
        }
    }
}

/// What the download step stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownloadOutput {
    /// Content-addressed blob key, `sha256:<hex>`.
    pub blob_key: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the bytes, hex.
    pub sha256: String,
    /// Format sniffed from the magic bytes (`jpeg`, `png`, ...).
    pub format: String,
    /// The URL after redirects; absent for uploaded blobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_url: Option<String>,
}

/// What the metadata step found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataOutput {
    /// Decoded format.
    pub format: String,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Colour type (`rgb8`, `rgba8`, `l8`, ...).
    pub color_type: String,
    /// Bits per channel.
    pub bit_depth: u8,
    /// Whether the image has an alpha channel.
    pub has_alpha: bool,
    /// Frames of an animation; 1 for still images.
    pub frame_count: u32,
    /// EXIF fields found, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exif: Option<Exif>,
    /// Whether an ICC profile is embedded.
    pub has_icc_profile: bool,
    /// The dominant colours, most common first.
    pub dominant_colors: Vec<DominantColor>,
    /// Mean brightness, 0 (black) to 1 (white).
    pub mean_brightness: f64,
    /// 64-bit perceptual hash, 16 hex digits.
    pub phash: String,
    /// Blurhash of the image.
    pub blurhash: String,
    /// Blob key of the smallest thumbnail (by default the 256 px WebP one); the same key as in
    /// `thumbnails`.
    pub thumbnail_key: String,
    /// Every derivative written (`metadata.thumbnails`): thumbnails and previews, upright,
    /// each its own blob, served by `GET /v1/blobs/{key}`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thumbnails: Vec<Thumbnail>,
    /// Blob key of the derivative the AI worker reads instead of the original
    /// (`metadata.ai_input`); absent from results of workers older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_key: Option<String>,
}

/// One derivative of the image the metadata step wrote to the blob store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Thumbnail {
    /// Its name in `metadata.thumbnails` (`thumbnail`, `preview`, ...).
    pub name: String,
    /// Blob key of its bytes.
    pub key: String,
    /// Encoding: `webp`, `jpeg` or `png`.
    pub format: String,
    /// Width in pixels, upright.
    pub width: u32,
    /// Height in pixels, upright.
    pub height: u32,
    /// Size of the encoded bytes.
    pub size: u64,
}

/// The EXIF fields imagepipe reads; each is absent when the image lacks it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Exif {
    /// Camera maker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub make: Option<String>,
    /// Camera model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Lens model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lens: Option<String>,
    /// DateTimeOriginal as written by the camera.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date_time_original: Option<String>,
    /// Exposure time, e.g. `1/250`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposure_time: Option<String>,
    /// ISO speed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iso: Option<u32>,
    /// Focal length in millimetres.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub focal_length_mm: Option<f64>,
    /// EXIF orientation, 1..=8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orientation: Option<u16>,
    /// GPS latitude in decimal degrees (north positive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gps_latitude: Option<f64>,
    /// GPS longitude in decimal degrees (east positive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gps_longitude: Option<f64>,
}

/// One dominant colour and its share of the pixels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DominantColor {
    /// `#rrggbb`.
    pub hex: String,
    /// Share of the pixels, 0..=1.
    pub share: f64,
}

/// What the model said about the image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisOutput {
    /// Model name and version.
    pub model: String,
    /// The top classes, best first.
    pub predictions: Vec<Prediction>,
    /// Search tags (class names and their ancestors), best first.
    pub tags: Vec<Prediction>,
    /// The image's visual embedding from the same inference, for similarity search. It travels
    /// in `image.analyzed` only: the step result and the task's record leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<crate::Embedding>,
}

/// A label with the model's score for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Prediction {
    /// Label or tag name.
    pub label: String,
    /// Score, 0..=1.
    pub score: f64,
}
