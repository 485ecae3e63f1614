//! Why an image could not be analysed, with the stable code its step result carries.

use std::path::PathBuf;

use imagepipe_contracts::EmbeddingError;

/// Stable error codes of the analyze step (the `code` of its step errors).
pub mod codes {
    /// The bytes are not an image in a supported format, or it is truncated or corrupt.
    pub const DECODE_FAILED: &str = "decode_failed";
    /// The image has more pixels than `ai.max_pixels` allows.
    pub const PIXEL_LIMIT: &str = "pixel_limit";
    /// The model failed on a well-formed input or the analysis crashed (retryable), or the
    /// model's features for the image make no embedding (not retryable).
    pub const INFERENCE_FAILED: &str = "inference_failed";
}

/// The command that writes a model directory; every "model missing" error names it.
pub const PREPARE_COMMAND: &str = "scripts/prepare-model.sh";

/// The model directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file of the prepared model is missing.
    #[error(
        "model file {path} is missing: prepare the model with `{PREPARE_COMMAND} --out {dir}` \
         (the directory is the ai.model_dir setting)",
        dir = path.parent().map_or_else(|| ".".into(), |d| d.display().to_string())
    )]
    Missing {
        /// The file looked for.
        path: PathBuf,
    },
    /// A model file could not be read.
    #[error("reading model file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A model file does not hold what the preparation writes.
    #[error(
        "model file {path} is invalid: {reason}; re-run `{PREPARE_COMMAND} --force` (for a model of your own, \
         correct the file or its manifest: docs/model.md)"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The manifest describes the model in a way the worker cannot use (an input that is not a
    /// square RGB image, a scale of 0, an output shape not matching the labels, ...).
    #[error("model manifest {path}: its {field} {reason}")]
    Manifest {
        /// The manifest.
        path: PathBuf,
        /// The manifest field at fault (`input.shape`, `output.shape`, ...).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The class names (`labels.json`) or the tag table (`tags.json`) are unusable.
    #[error("model file {path} is unusable: {reason}")]
    Classes {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: crate::taxonomy::TaxonomyError,
    },
    /// The graph's logits are not one per class of `labels.json`.
    #[error("the model {path} gives {logits} logits in its output {output}, but {labels_path} names {labels} classes")]
    ClassCount {
        /// The graph file.
        path: PathBuf,
        /// The logits output.
        output: String,
        /// Logits the output holds.
        logits: usize,
        /// The labels file.
        labels_path: PathBuf,
        /// Classes it names.
        labels: usize,
    },
    /// The runtime could not load or optimise the ONNX graph.
    #[error("{runtime} could not load the ONNX graph {path}: {reason}")]
    Graph {
        /// The runtime (`onnxruntime` or `tract`).
        runtime: &'static str,
        /// The graph file.
        path: PathBuf,
        /// The runtime's error chain.
        reason: String,
    },
    /// onnxruntime is wanted, but the model directory ships no library for it (prepared before
    /// the preparation shipped one).
    #[error(
        "{manifest} names no onnxruntime library: re-run `{PREPARE_COMMAND}` to add it to the model \
         directory, set ai.onnxruntime_library, or set ai.runtime = tract"
    )]
    NoOnnxruntime {
        /// The model directory's manifest.
        manifest: PathBuf,
    },
    /// onnxruntime's shared library could not be loaded.
    #[error("loading onnxruntime's library {library}: {reason} (ai.runtime = tract runs the model without it)")]
    OnnxruntimeLibrary {
        /// The library file.
        library: PathBuf,
        /// Why it did not load.
        reason: String,
    },
}

/// Why analysing one image failed.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    /// The bytes are in no supported format.
    #[error("not an image in a supported format (jpeg, png, gif, webp, bmp, tiff)")]
    UnsupportedFormat,
    /// The image is truncated or corrupt, or the decoder refused it.
    #[error("decoding the image failed: {0}")]
    Decode(String),
    /// Width × height is over `ai.max_pixels`.
    #[error("the image is {width}×{height} pixels, over the limit of {max_pixels}")]
    TooManyPixels {
        /// Width the header claims.
        width: u32,
        /// Height the header claims.
        height: u32,
        /// The configured limit.
        max_pixels: u64,
    },
    /// The image decoded to no pixels.
    #[error("the image has no pixels ({width}×{height})")]
    Empty {
        /// Width decoded.
        width: u32,
        /// Height decoded.
        height: u32,
    },
    /// The model failed to run.
    #[error("running the model failed: {0}")]
    Inference(String),
    /// The model's features for the image make no embedding.
    #[error("the model's features make no embedding of version {version}: {reason}")]
    Embedding {
        /// The embedding version of the model.
        version: String,
        /// Why the features make none (in the message too: the step error carries the message
        /// alone).
        reason: EmbeddingError,
    },
    /// The blocking task analysing the image panicked.
    #[error("the analysis crashed on this image")]
    Panicked,
    /// A caller that waits a bounded time ([`Classifier::analyze_within`]) got no model slot
    /// (`ai.threads`), memory or core within it.
    ///
    /// [`Classifier::analyze_within`]: crate::Classifier::analyze_within
    #[error("the model stayed busy for {waited:?} (every slot of ai.threads taken, or ai.memory_budget spent)")]
    Busy {
        /// How long it waited.
        waited: std::time::Duration,
    },
}

impl AnalyzeError {
    /// The stable code of this error (one of [`codes`]).
    pub fn code(&self) -> &'static str {
        match self {
            Self::UnsupportedFormat | Self::Decode(_) | Self::Empty { .. } => codes::DECODE_FAILED,
            Self::TooManyPixels { .. } => codes::PIXEL_LIMIT,
            Self::Inference(_) | Self::Panicked | Self::Embedding { .. } | Self::Busy { .. } => codes::INFERENCE_FAILED,
        }
    }

    /// Whether another attempt on the same bytes may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Inference(_) | Self::Panicked | Self::Busy { .. })
    }
}
