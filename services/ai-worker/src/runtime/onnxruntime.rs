//! onnxruntime through the `ort` crate. Nothing of onnxruntime is linked or downloaded at build
//! time: its shared library (`libonnxruntime.so.<version>`, which `scripts/prepare-model.sh`
//! copies from the pinned onnxruntime wheel into the model directory) is loaded at run time, once
//! per process. `ort` speaks onnxruntime's C API version 22 ([`ort::MINOR_VERSION`]); the prepared
//! library is a 1.22 release, the one `ort` expects (another minor version makes `ort` warn at
//! every start). onnxruntime's own log lines go through `tracing` (target `ort`) at the level the
//! filter shows for it: `warn` unless `RUST_LOG` or `log.filter` names `ort`.
//!
//! Every session runs one inference at a time on its caller's thread (one intra-op thread, no
//! inter-op pool, sequential execution, every graph optimisation): the worker runs `ai.threads`
//! inferences at once on its blocking threads, each with a session of its own from a pool. A run
//! computes every output of the graph; the logits and the features are read from the same run.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use ort::logging::LogLevel;
use ort::session::Session;
use ort::session::builder::{GraphOptimizationLevel, PrepackedWeights};
use ort::value::{TensorRef, ValueType};
use tract_onnx::prelude::tract_ndarray::Array4;

use super::{OutputNames, RawOutputs};
use crate::error::{AnalyzeError, ModelError};
use crate::model::known_len;
use crate::preprocess::ModelInput;

/// The library this process loaded, or failed to load, and the outcome (`ort` loads one library
/// per process, at its first use, and keeps it).
static LIBRARY: OnceLock<(PathBuf, Result<String, String>)> = OnceLock::new();

/// The graph in onnxruntime sessions: one per inference running at once.
pub struct OnnxruntimeBackend {
    library: PathBuf,
    version: String,
    /// The graph's bytes, for a session more when every session is busy.
    graph: Arc<[u8]>,
    /// The graph input each run feeds.
    input: String,
    /// The outputs each run reads.
    outputs: OutputNames,
    /// The number of logits, when the graph says before it runs.
    logits_len: Option<usize>,
    /// Sessions not running an inference now.
    idle: Mutex<Vec<Session>>,
}

impl std::fmt::Debug for OnnxruntimeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxruntimeBackend")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("input", &self.input)
            .field("outputs", &self.outputs)
            .field("idle_sessions", &self.idle.lock().map_or(0, |idle| idle.len()))
            .finish_non_exhaustive()
    }
}

impl OnnxruntimeBackend {
    /// Loads onnxruntime's shared library `library` (once per process), then `graph` (the
    /// bytes of `path`) into `sessions` sessions sharing their prepacked weights; the graph must
    /// take the one float `input` and give the float `outputs`.
    pub fn load(
        library: &Path,
        graph: &[u8],
        path: &Path,
        input: &ModelInput,
        outputs: &OutputNames,
        sessions: usize,
    ) -> Result<Self, ModelError> {
        let version = load_library(library)?;
        let graph_error = |reason: String| ModelError::Graph { runtime: "onnxruntime", path: path.to_owned(), reason };
        let prepacked = PrepackedWeights::new();
        let mut idle = Vec::with_capacity(sessions.max(1));
        for _ in 0..sessions.max(1) {
            idle.push(new_session(graph, Some(&prepacked)).map_err(graph_error)?);
        }
        let logits_len = check_signature(&idle[0], input, outputs).map_err(graph_error)?;
        Ok(Self {
            library: library.to_owned(),
            version,
            graph: graph.into(),
            input: input.name.clone(),
            outputs: outputs.clone(),
            logits_len,
            idle: Mutex::new(idle),
        })
    }

    /// How many logits a run gives, when the graph says before it runs.
    pub(crate) fn logits_len(&self) -> Option<usize> {
        self.logits_len
    }

    /// The library's path.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// The library's version, as it reports it.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// One run on one input, on an idle session (a new one when every session is busy; it stays
    /// in the pool): the outputs the backend was loaded to read.
    pub(crate) fn run(&self, input: Array4<f32>) -> Result<RawOutputs, AnalyzeError> {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let mut session = match idle {
            Some(session) => session,
            None => new_session(&self.graph, None)
                .map_err(|reason| AnalyzeError::Inference(format!("onnxruntime: a session more: {reason}")))?,
        };
        let outputs = run(&mut session, &self.input, input, &self.outputs);
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).push(session);
        outputs
    }
}

/// Loads onnxruntime's library at `library` into the process and creates its environment, the
/// first time; afterwards the same library is loaded already, and another one is an error.
/// Returns the library's version.
fn load_library(library: &Path) -> Result<String, ModelError> {
    let error = |reason: String| ModelError::OnnxruntimeLibrary { library: library.to_owned(), reason };
    let wanted = std::fs::canonicalize(library).map_err(|e| error(e.to_string()))?;
    if !wanted.is_file() {
        return Err(error("not a file".into()));
    }
    let (loaded, outcome) = LIBRARY.get_or_init(|| (wanted.clone(), init(&wanted)));
    if *loaded != wanted {
        return Err(error(format!(
            "this process loaded onnxruntime from {} already, and loads one library only",
            loaded.display()
        )));
    }
    outcome.clone().map_err(error)
}

/// Loads the library through `ort` and commits its environment. `ort` panics when the library
/// does not load (a missing dependency, not a shared library, an API older than 22): the panic
/// is caught and returned as the reason (the default panic hook has printed it to stderr too).
fn init(library: &Path) -> Result<String, String> {
    let committed = catch_unwind(AssertUnwindSafe(|| {
        ort::init_from(library.display().to_string()).with_name("imagepipe-ai-worker").commit()?;
        ort::environment::get_environment()?.set_log_level(log_level());
        Ok::<_, ort::Error>(ort::info())
    }));
    match committed {
        Ok(Ok(info)) => Ok(version_of(info)),
        Ok(Err(e)) => Err(format!("creating its environment: {e}")),
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "loading it panicked".into())),
    }
}

/// The most detailed level of onnxruntime's lines the `tracing` filter shows (it creates its
/// environment logging everything, and formats every line it logs).
fn log_level() -> LogLevel {
    if tracing::enabled!(target: "ort::logging", tracing::Level::TRACE) {
        LogLevel::Verbose
    } else if tracing::enabled!(target: "ort::logging", tracing::Level::INFO) {
        LogLevel::Info
    } else {
        LogLevel::Warning
    }
}

/// The version in onnxruntime's build information (`ORT Build Info: git-branch=rel-1.31.1, ...`),
/// or the whole first field when it has none.
fn version_of(info: &str) -> String {
    let first = info.split(',').next().unwrap_or(info).trim();
    match first.split_once("git-branch=") {
        Some((_, branch)) => branch.trim_start_matches("rel-").to_owned(),
        None => first.to_owned(),
    }
}

/// A session of `graph`: one intra-op thread, sequential, every graph optimisation, the
/// weights prepacked once for every session sharing `prepacked`.
fn new_session(graph: &[u8], prepacked: Option<&PrepackedWeights>) -> Result<Session, String> {
    let mut builder = Session::builder()
        .and_then(|b| b.with_optimization_level(GraphOptimizationLevel::Level3))
        .and_then(|b| b.with_intra_threads(1))
        .and_then(|b| b.with_inter_threads(1))
        .and_then(|b| b.with_parallel_execution(false))
        .map_err(|e| format!("session options: {e}"))?;
    if let Some(prepacked) = prepacked {
        builder = builder.with_prepacked_weights(prepacked).map_err(|e| format!("session options: {e}"))?;
    }
    builder.commit_from_memory(graph).map_err(|e| e.to_string())
}

/// The graph takes one float tensor named as `expected` says, `[1,3,size,size]` (a dimension
/// the graph leaves free takes any size), and gives the float `outputs`. Returns the number of
/// logits when every dimension of the logits output is known.
fn check_signature(session: &Session, expected: &ModelInput, outputs: &OutputNames) -> Result<Option<usize>, String> {
    let size = i64::from(expected.size);
    let [input] = session.inputs.as_slice() else {
        let names: Vec<&str> = session.inputs.iter().map(|input| input.name.as_str()).collect();
        return Err(format!("it has {} inputs {names:?}, expected 1", names.len()));
    };
    if input.name != expected.name {
        return Err(format!("its input is named {:?}, the manifest's input.name says {:?}", input.name, expected.name));
    }
    match &input.input_type {
        ValueType::Tensor { ty: ort::tensor::TensorElementType::Float32, shape, .. }
            if shape.len() == 4 && shape.iter().zip([1, 3, size, size]).all(|(&got, want)| got == want || got < 0) => {}
        other => return Err(format!("its input {} is {other:?}, expected f32 [1, 3, {size}, {size}]", input.name)),
    }
    let mut logits_len = None;
    for name in std::iter::once(&outputs.logits).chain(&outputs.features) {
        match session.outputs.iter().find(|output| output.name == *name) {
            Some(output) if output.output_type.tensor_type() == Some(ort::tensor::TensorElementType::Float32) => {
                if *name == outputs.logits {
                    logits_len = output.output_type.tensor_shape().and_then(|shape| known_len(shape));
                }
            }
            Some(output) => return Err(format!("its output {name} is {:?}, expected f32", output.output_type)),
            None => {
                let names: Vec<&str> = session.outputs.iter().map(|output| output.name.as_str()).collect();
                return Err(format!("it has no output {name} (its outputs: {names:?})"));
            }
        }
    }
    Ok(logits_len)
}

fn run(
    session: &mut Session,
    input_name: &str,
    input: Array4<f32>,
    names: &OutputNames,
) -> Result<RawOutputs, AnalyzeError> {
    let error = |e: ort::Error| AnalyzeError::Inference(format!("onnxruntime: {e}"));
    let (n, c, h, w) = input.dim();
    let input = input.as_standard_layout();
    let data = input.as_slice().expect("a standard-layout array is one slice");
    let tensor = TensorRef::from_array_view(([n, c, h, w], data)).map_err(error)?;
    let outputs = session.run(ort::inputs![input_name => tensor]).map_err(error)?;
    let read = |name: &str| -> Result<Vec<f32>, AnalyzeError> {
        let value = outputs
            .get(name)
            .ok_or_else(|| AnalyzeError::Inference(format!("onnxruntime: the run gave no output {name}")))?;
        let (_, values) = value.try_extract_tensor::<f32>().map_err(error)?;
        Ok(values.to_vec())
    };
    Ok(RawOutputs { logits: read(&names.logits)?, features: names.features.as_deref().map(read).transpose()? })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outputs() -> OutputNames {
        OutputNames { logits: "logits".into(), features: Some("features".into()) }
    }

    #[test]
    fn the_version_is_read_from_the_build_information() {
        let info = "ORT Build Info: git-branch=rel-1.31.1, git-commit-id=abc, build type=Release, cmake cxx flags: -O3";
        assert_eq!(version_of(info), "1.31.1");
        assert_eq!(version_of("something else"), "something else");
    }

    // The only test of this binary that loads a library: `ort` loads one per process.
    #[test]
    fn a_file_that_is_not_a_library_is_an_error_naming_it_and_stays_one() {
        let dir = tempfile::tempdir().unwrap();
        let bogus = dir.path().join("libonnxruntime.so");
        std::fs::write(&bogus, b"not a shared library").unwrap();
        for _ in 0..2 {
            let err =
                OnnxruntimeBackend::load(&bogus, b"", Path::new("model.onnx"), &ModelInput::default(), &outputs(), 1)
                    .unwrap_err();
            assert!(matches!(&err, ModelError::OnnxruntimeLibrary { library, .. } if *library == bogus), "{err:?}");
            assert!(err.to_string().contains(&bogus.display().to_string()), "{err}");
        }
        let other = dir.path().join("libonnxruntime.so.2");
        std::fs::write(&other, b"another").unwrap();
        let err = OnnxruntimeBackend::load(&other, b"", Path::new("model.onnx"), &ModelInput::default(), &outputs(), 1)
            .unwrap_err();
        assert!(err.to_string().contains("loads one library only"), "{err}");
    }
}
