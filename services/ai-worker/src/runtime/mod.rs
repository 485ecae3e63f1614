//! The inference runtimes behind [`Model::infer`](crate::Model::infer), and which one runs the
//! model (`ai.runtime`). Each feeds the graph's one input by the name and the size the model
//! directory's manifest gives ([`ModelInput`]), runs it once per image and reads the outputs it is
//! asked for ([`OutputNames`]: the logits, and the pooled features when the model directory has
//! them):
//!
//! - [`onnxruntime`]: onnxruntime through the `ort` crate, its shared library loaded at run time
//!   from the model directory (or `ai.onnxruntime_library`). Several times faster than tract.
//! - [`tract`]: pure Rust, needs nothing besides the graph; the fallback.
//!
//! `auto` (the default) runs onnxruntime when its library loads, else tract with a warning saying
//! why; `onnxruntime` or `tract` is that runtime or an error naming the problem.

pub mod onnxruntime;
pub mod tract;

use std::path::{Path, PathBuf};

use imagepipe_runtime::config::AiConfig;
pub use imagepipe_runtime::config::AiRuntime;
use tract_onnx::prelude::tract_ndarray::Array4;

use self::onnxruntime::OnnxruntimeBackend;
use self::tract::TractBackend;
use crate::error::{AnalyzeError, ModelError};
use crate::preprocess::ModelInput;

/// The runtime running a loaded model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    /// onnxruntime, through the `ort` crate.
    Onnxruntime,
    /// tract.
    Tract,
}

impl RuntimeKind {
    /// Its name, as `ai.runtime` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Onnxruntime => "onnxruntime",
            Self::Tract => "tract",
        }
    }
}

impl std::fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How [`Model::load_with`](crate::Model::load_with) picks and sets up its runtime (the
/// `ai.runtime` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Which runtime (`ai.runtime`).
    pub runtime: AiRuntime,
    /// onnxruntime's shared library to load instead of the model directory's
    /// (`ai.onnxruntime_library`).
    pub onnxruntime_library: Option<PathBuf>,
    /// Inferences expected to run at once (`ai.threads`): onnxruntime prepares a session for
    /// each at load (more are made when more run at once).
    pub sessions: usize,
}

impl Default for RuntimeOptions {
    /// `auto`, the model directory's library, one session.
    fn default() -> Self {
        Self { runtime: AiRuntime::Auto, onnxruntime_library: None, sessions: 1 }
    }
}

impl From<&AiConfig> for RuntimeOptions {
    fn from(ai: &AiConfig) -> Self {
        Self { runtime: ai.runtime, onnxruntime_library: ai.onnxruntime_library.clone(), sessions: ai.threads }
    }
}

/// The graph outputs a run reads, as the model directory's manifest names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputNames {
    /// The class logits, `[1, classes]`.
    pub logits: String,
    /// The pooled features the embedding is made of; `None` for a graph prepared without them.
    pub features: Option<String>,
}

/// What one run of the graph gave: the outputs [`OutputNames`] asked for, flattened.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RawOutputs {
    pub(crate) logits: Vec<f32>,
    pub(crate) features: Option<Vec<f32>>,
}

/// A graph loaded into one runtime.
#[derive(Debug)]
pub(crate) enum Backend {
    Onnxruntime(OnnxruntimeBackend),
    Tract(TractBackend),
}

impl Backend {
    /// Loads `graph` (the bytes of `path`) into the runtime `options` pick, to take `input` (its
    /// one input, by that name and size) and read `outputs` on each run (a missing or misnamed
    /// input or output is an error). `library` finds onnxruntime's library (or says why there is
    /// none); it is called only when onnxruntime is wanted. Under `auto`, onnxruntime failing for
    /// any reason falls back to tract with a warning.
    pub(crate) fn load(
        graph: &[u8],
        path: &Path,
        input: &ModelInput,
        outputs: &OutputNames,
        library: impl FnOnce() -> Result<PathBuf, ModelError>,
        options: &RuntimeOptions,
    ) -> Result<Self, ModelError> {
        let onnxruntime = || {
            library()
                .and_then(|library| OnnxruntimeBackend::load(&library, graph, path, input, outputs, options.sessions))
        };
        match options.runtime {
            AiRuntime::Tract => Self::tract(graph, path, input, outputs),
            AiRuntime::Onnxruntime => onnxruntime().map(Self::Onnxruntime),
            AiRuntime::Auto => match onnxruntime() {
                Ok(backend) => Ok(Self::Onnxruntime(backend)),
                Err(error) => {
                    tracing::warn!(
                        reason = %error_chain(&error),
                        "onnxruntime is not available, so tract runs the model (several times slower); \
                         set ai.runtime = tract to choose it and silence this warning"
                    );
                    Self::tract(graph, path, input, outputs)
                }
            },
        }
    }

    fn tract(graph: &[u8], path: &Path, input: &ModelInput, outputs: &OutputNames) -> Result<Self, ModelError> {
        TractBackend::load(graph, input, outputs).map(Self::Tract).map_err(|reason| ModelError::Graph {
            runtime: "tract",
            path: path.to_owned(),
            reason,
        })
    }

    /// Which runtime this is.
    pub(crate) fn kind(&self) -> RuntimeKind {
        match self {
            Self::Onnxruntime(_) => RuntimeKind::Onnxruntime,
            Self::Tract(_) => RuntimeKind::Tract,
        }
    }

    /// How many logits a run gives, when the graph says so before it runs (every dimension of
    /// the logits output known).
    pub(crate) fn logits_len(&self) -> Option<usize> {
        match self {
            Self::Onnxruntime(ort) => ort.logits_len(),
            Self::Tract(tract) => tract.logits_len(),
        }
    }

    /// What to log about the runtime: onnxruntime's version and library.
    pub(crate) fn detail(&self) -> String {
        match self {
            Self::Onnxruntime(ort) => format!("onnxruntime {} ({})", ort.version(), ort.library().display()),
            Self::Tract(_) => "tract".into(),
        }
    }

    /// One run of the graph on one input: the outputs it was loaded to read. CPU-bound, on the
    /// caller's thread.
    pub(crate) fn run(&self, input: Array4<f32>) -> Result<RawOutputs, AnalyzeError> {
        match self {
            Self::Onnxruntime(ort) => ort.run(input),
            Self::Tract(tract) => tract.run(input),
        }
    }
}

/// `error` and its sources, joined by `: `.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
