//! The prepared model directory (`ai.model_dir`, written by `scripts/prepare-model.sh`):
//! `model.onnx` (EfficientNet-Lite0, input `[1,3,224,224]`; outputs `logits` `[1,1000]` and
//! `features` `[1,1280]`, the global-average-pooled features the final fully connected layer
//! takes), `labels.json`, `tags.json`, onnxruntime's shared library
//! (`libonnxruntime.so.<version>`) and `manifest.json`. The manifest fields the worker reads:
//!
//! - `model`: name and version (`efficientnet-lite0-imagenet1k@57934424`), reported with every
//!   analysis;
//! - `files`: each file's sha256, checked at load;
//! - `output.name`: the logits output (`logits` when absent);
//! - `onnxruntime`: `{"library": <file name>, "version"}`, the shipped library;
//! - `embedding`: `{"output": "features", "dim": 1280, "version":
//!   "efficientnet-lite0-imagenet1k@57934424/pool-1280"}`, the output holding the image's
//!   embedding and the version every embedding is labelled with (it changes with the model or
//!   the layer, so vectors of different models are never compared). A directory prepared before
//!   embeddings has none: it still loads, its analyses have no embedding, and a warning names
//!   `scripts/prepare-model.sh`, which brings it up to date.
//!
//! [`Model::load_with`] checks the files it uses against the manifest, then loads the graph once
//! into the runtime `ai.runtime` picks (see [`runtime`](crate::runtime)); [`Model::infer`] runs
//! it once per image for both the probabilities and the features.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tract_onnx::prelude::tract_ndarray::Array4;

use crate::error::{AnalyzeError, ModelError, PREPARE_COMMAND};
use crate::runtime::{Backend, OutputNames, RuntimeKind, RuntimeOptions};
use crate::taxonomy::{CLASSES, Taxonomy};

/// The ONNX graph's file name.
pub const MODEL_FILE: &str = "model.onnx";
/// The class names' file name.
pub const LABELS_FILE: &str = "labels.json";
/// The tag table's file name.
pub const TAGS_FILE: &str = "tags.json";
/// The manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The logits output's name when the manifest does not say.
const DEFAULT_LOGITS_OUTPUT: &str = "logits";

/// What `manifest.json` says (the fields the worker reads).
#[derive(Debug, Deserialize)]
struct Manifest {
    /// Model name and version, reported with every analysis.
    model: String,
    /// sha256 of each file, by file name.
    files: HashMap<String, String>,
    /// onnxruntime's library in the directory; absent in a directory prepared before the
    /// preparation shipped it.
    onnxruntime: Option<OnnxruntimeEntry>,
    /// The logits output.
    output: Option<OutputEntry>,
    /// The embedding output; absent in a directory prepared before embeddings.
    embedding: Option<EmbeddingSpec>,
}

/// The manifest's `output` entry.
#[derive(Debug, Deserialize)]
struct OutputEntry {
    /// The graph output holding the logits.
    name: String,
}

/// The manifest's `embedding` entry: where the image's embedding comes from and how it is
/// labelled.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EmbeddingSpec {
    /// The graph output holding the pooled features (`features`).
    pub output: String,
    /// Its number of components (1280).
    pub dim: usize,
    /// The version every embedding of this model is labelled with (the model's name and the
    /// layer's, `efficientnet-lite0-imagenet1k@57934424/pool-1280`).
    pub version: String,
}

/// What one run of the model gave for one image.
#[derive(Debug, Clone, PartialEq)]
pub struct Inference {
    /// The softmax of the logits, one per class.
    pub probabilities: Vec<f32>,
    /// The pooled features (not normalised), [`EmbeddingSpec::dim`] of them; `None` when the
    /// model has no embedding output.
    pub features: Option<Vec<f32>>,
}

/// The manifest's `onnxruntime` entry.
#[derive(Debug, Deserialize)]
struct OnnxruntimeEntry {
    /// The library's file name in the directory (its sha256 is in `files`).
    library: String,
}

/// A loaded, optimised classifier with its class names and tags. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Model {
    name: String,
    backend: Backend,
    taxonomy: Taxonomy,
    embedding: Option<EmbeddingSpec>,
}

impl Model {
    /// Loads the model directory `dir` with the default runtime choice (`auto`: onnxruntime when
    /// the directory's library loads, else tract); a missing file is an error naming the
    /// preparation command.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        Self::load_with(dir, &RuntimeOptions::default())
    }

    /// Loads the model directory `dir` into the runtime `options` pick, checking every file it
    /// uses against the manifest; a missing file is an error naming the preparation command.
    /// Logs the model's name and the runtime running it.
    pub fn load_with(dir: &Path, options: &RuntimeOptions) -> Result<Self, ModelError> {
        let started = Instant::now();
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest: Manifest = serde_json::from_slice(&read(&manifest_path)?)
            .map_err(|e| ModelError::Invalid { path: manifest_path.clone(), reason: e.to_string() })?;
        let mut checked = HashMap::new();
        for file in [MODEL_FILE, LABELS_FILE, TAGS_FILE] {
            checked.insert(file, read_checked(dir, &manifest_path, &manifest, file)?);
        }
        let taxonomy = Taxonomy::from_json(&checked[LABELS_FILE], &checked[TAGS_FILE])
            .map_err(|e| ModelError::Invalid { path: dir.join(TAGS_FILE), reason: e.to_string() })?;
        let library = || match (&options.onnxruntime_library, &manifest.onnxruntime) {
            (Some(library), _) => Ok(library.clone()),
            (None, Some(entry)) => shipped_library(dir, &manifest_path, &manifest, &entry.library),
            (None, None) => Err(ModelError::NoOnnxruntime { manifest: manifest_path.clone() }),
        };
        let embedding = manifest.embedding.clone();
        if let Some(spec) = &embedding
            && (spec.output.is_empty() || spec.version.is_empty() || spec.dim == 0)
        {
            return Err(ModelError::Invalid {
                path: manifest_path,
                reason: format!("its embedding entry {spec:?} needs an output, a version and a dimension"),
            });
        }
        let outputs = OutputNames {
            logits: manifest.output.as_ref().map_or(DEFAULT_LOGITS_OUTPUT, |output| &output.name).to_owned(),
            features: embedding.as_ref().map(|spec| spec.output.clone()),
        };
        let backend = Backend::load(&checked[MODEL_FILE], &dir.join(MODEL_FILE), &outputs, library, options)?;
        tracing::info!(model = %manifest.model, runtime = %backend.kind(), detail = %backend.detail(),
            embedding = embedding.as_ref().map_or("none", |spec| spec.version.as_str()),
            dir = %dir.display(), load_ms = started.elapsed().as_millis(), "model loaded");
        if embedding.is_none() {
            tracing::warn!(dir = %dir.display(),
                "the model directory was prepared before embeddings (its manifest has no embedding entry): \
                 images are analysed without one, so similarity search and near-duplicate detection skip them; \
                 run `{PREPARE_COMMAND}` to bring the directory up to date");
        }
        Ok(Self { name: manifest.model, backend, taxonomy, embedding })
    }

    /// Model name and version (`efficientnet-lite0-imagenet1k@57934424`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The runtime running the model.
    pub fn runtime(&self) -> RuntimeKind {
        self.backend.kind()
    }

    /// Class names and tags.
    pub fn taxonomy(&self) -> &Taxonomy {
        &self.taxonomy
    }

    /// The embedding the model gives (the manifest's `embedding`), or `None` for a directory
    /// prepared before embeddings.
    pub fn embedding(&self) -> Option<&EmbeddingSpec> {
        self.embedding.as_ref()
    }

    /// The version the model's embeddings are labelled with, when it gives them.
    pub fn embedding_version(&self) -> Option<&str> {
        self.embedding.as_ref().map(|spec| spec.version.as_str())
    }

    /// One run of the model on one preprocessed input (see [`preprocess`](crate::preprocess)):
    /// the softmax of its logits and its pooled features. CPU-bound, on the caller's thread
    /// alone: call it on a blocking thread.
    pub fn infer(&self, input: Array4<f32>) -> Result<Inference, AnalyzeError> {
        let outputs = self.backend.run(input)?;
        if outputs.logits.len() != CLASSES {
            return Err(AnalyzeError::Inference(format!(
                "the model gave {} logits, expected {CLASSES}",
                outputs.logits.len()
            )));
        }
        if let (Some(spec), Some(features)) = (&self.embedding, &outputs.features)
            && features.len() != spec.dim
        {
            return Err(AnalyzeError::Inference(format!(
                "the model gave {} features in {}, its manifest says {}",
                features.len(),
                spec.output,
                spec.dim
            )));
        }
        Ok(Inference { probabilities: softmax(outputs.logits.iter().copied()), features: outputs.features })
    }

    /// The softmax of the model's logits for one preprocessed input: [`Model::infer`] without
    /// the features.
    pub fn probabilities(&self, input: Array4<f32>) -> Result<Vec<f32>, AnalyzeError> {
        self.infer(input).map(|inference| inference.probabilities)
    }
}

/// The bytes of `dir/file`, which must match the manifest's sha256 for `file`.
fn read_checked(dir: &Path, manifest_path: &Path, manifest: &Manifest, file: &str) -> Result<Vec<u8>, ModelError> {
    let path = dir.join(file);
    let bytes = read(&path)?;
    let expected = manifest.files.get(file).ok_or_else(|| ModelError::Invalid {
        path: manifest_path.to_owned(),
        reason: format!("it lists no sha256 for {file}"),
    })?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if &actual != expected {
        return Err(ModelError::Invalid {
            path,
            reason: format!("its sha256 is {actual}, the manifest says {expected}"),
        });
    }
    Ok(bytes)
}

/// The path of the onnxruntime library the directory ships (`name`), checked against the
/// manifest.
fn shipped_library(dir: &Path, manifest_path: &Path, manifest: &Manifest, name: &str) -> Result<PathBuf, ModelError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(ModelError::Invalid {
            path: manifest_path.to_owned(),
            reason: format!("its onnxruntime library {name:?} is not a file name"),
        });
    }
    read_checked(dir, manifest_path, manifest, name)?;
    Ok(dir.join(name))
}

fn read(path: &Path) -> Result<Vec<u8>, ModelError> {
    std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ModelError::Missing { path: PathBuf::from(path) },
        _ => ModelError::Read { path: PathBuf::from(path), source },
    })
}

/// Softmax, computed stably (the largest logit subtracted first).
pub fn softmax(logits: impl Iterator<Item = f32> + Clone) -> Vec<f32> {
    let max = logits.clone().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = logits.map(|l| f64::from(l - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| (e / sum) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_keeps_the_order() {
        let p = softmax([1.0f32, 3.0, 2.0, 1000.0, -1000.0].into_iter());
        assert!((p.iter().map(|&x| f64::from(x)).sum::<f64>() - 1.0).abs() < 1e-6);
        assert!(p[3] > 0.999 && p[4] == 0.0, "large logits do not overflow: {p:?}");
        let q = softmax([0.0f32, (2.0f32).ln()].into_iter());
        assert!((q[0] - 1.0 / 3.0).abs() < 1e-6 && (q[1] - 2.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn a_missing_model_names_the_preparation_command() {
        let dir = tempfile::tempdir().unwrap();
        let err = Model::load(dir.path()).unwrap_err();
        assert!(matches!(err, ModelError::Missing { .. }), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("scripts/prepare-model.sh"), "{message}");
        assert!(message.contains(&dir.path().display().to_string()), "{message}");
    }

    #[test]
    fn a_file_not_matching_the_manifest_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = r#"{"model": "m", "files": {"model.onnx": "00", "labels.json": "00", "tags.json": "00"}}"#;
        std::fs::write(dir.path().join(MANIFEST_FILE), manifest).unwrap();
        for file in [MODEL_FILE, LABELS_FILE, TAGS_FILE] {
            std::fs::write(dir.path().join(file), b"x").unwrap();
        }
        let err = Model::load(dir.path()).unwrap_err();
        assert!(matches!(&err, ModelError::Invalid { path, .. } if path.ends_with(MODEL_FILE)), "{err:?}");
        assert!(err.to_string().contains("--force"), "{err}");
        std::fs::write(dir.path().join(MANIFEST_FILE), "not json").unwrap();
        assert!(matches!(Model::load(dir.path()), Err(ModelError::Invalid { .. })));
    }
}
