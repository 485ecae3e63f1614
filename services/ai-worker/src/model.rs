//! The prepared model directory (`ai.model_dir`, written by `scripts/prepare-model.sh`):
//! `model.onnx` (EfficientNet-Lite0, input `[1,3,224,224]`; outputs `logits` `[1,1000]` and
//! `features` `[1,1280]`, the global-average-pooled features the final fully connected layer
//! takes), `labels.json`, `tags.json`, onnxruntime's shared library
//! (`libonnxruntime.so.<version>`) and `manifest.json`. Any other ONNX image classifier whose
//! manifest describes it loads the same way (`scripts/prepare_custom_model.py` makes one). The
//! manifest fields the worker reads:
//!
//! - `model`: name and version (`efficientnet-lite0-imagenet1k@57934424`), reported with every
//!   analysis;
//! - `files`: each file's sha256, checked at load (`tags.json` is used only when listed);
//! - `input`: `{"name", "shape": [1, 3, size, size], "mean", "scale"}`: the graph's one input,
//!   a square RGB image of 16 to 2048 pixels a side, each 0-255 channel value fed as
//!   `(x − mean) / scale` (`mean` and `scale` a number, or one per channel R, G, B; `scale`
//!   never 0). Absent: the bundled model's (`input`, 224, 127, 128);
//! - `output`: `{"name", "shape"}`: the logits output (`logits` when absent), one logit per
//!   class of `labels.json` (at least 2); `shape`, when given, must say as many;
//! - `onnxruntime`: `{"library": <file name>, "version"}`, the shipped library;
//! - `embedding`: `{"output": "features", "dim": 1280, "version":
//!   "efficientnet-lite0-imagenet1k@57934424/pool-1280"}`, the output holding the image's
//!   embedding and the version every embedding is labelled with (it changes with the model or
//!   the layer, so vectors of different models are never compared). A model without one (a
//!   directory prepared before embeddings, or a classifier of your own without a features
//!   output) still loads, its analyses have no embedding, and a warning says so.
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
use crate::preprocess::ModelInput;
use crate::runtime::{Backend, OutputNames, RuntimeKind, RuntimeOptions};
use crate::taxonomy::Taxonomy;

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
/// The least side of a model's square input, in pixels.
pub const MIN_INPUT_SIZE: u32 = 16;
/// The largest side of a model's square input, in pixels.
pub const MAX_INPUT_SIZE: u32 = 2048;

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
    /// The graph's input (read on its own by [`model_input`], so its errors name it).
    input: Option<serde_json::Value>,
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
    /// Its shape (`[1, classes]`), when the manifest says.
    shape: Option<Vec<i64>>,
}

/// The manifest's `input` entry, as written (other fields are ignored, as elsewhere in the
/// manifest).
#[derive(Debug, Deserialize)]
struct InputEntry {
    /// The graph input's name.
    name: String,
    /// NCHW: `[1, 3, height, width]`.
    shape: Vec<i64>,
    /// Subtracted from each 0-255 channel value.
    mean: PerChannel,
    /// Divides each value after the mean is subtracted.
    scale: PerChannel,
}

/// A normalisation constant: one for every channel, or one per channel (R, G, B).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PerChannel {
    /// The same for every channel.
    All(f32),
    /// One per channel.
    Each(Vec<f32>),
}

impl PerChannel {
    /// The three channels' values, or why there are not three.
    fn channels(&self) -> Result<[f32; 3], String> {
        match self {
            Self::All(value) => Ok([*value; 3]),
            Self::Each(values) => <[f32; 3]>::try_from(values.as_slice())
                .map_err(|_| format!("has {} values {values:?}, expected one number or 3 (R, G, B)", values.len())),
        }
    }
}

/// The model input the manifest's `input` entry describes (the bundled model's when absent),
/// or the field at fault and why.
fn model_input(entry: Option<&serde_json::Value>) -> Result<ModelInput, (&'static str, String)> {
    let Some(entry) = entry else { return Ok(ModelInput::default()) };
    let entry: InputEntry = serde_json::from_value(entry.clone())
        .map_err(|e| ("input", format!("is not {{\"name\", \"shape\", \"mean\", \"scale\"}}: {e}")))?;
    if entry.name.is_empty() {
        return Err(("input.name", "is empty".into()));
    }
    let size = match *entry.shape.as_slice() {
        [1, 3, height, width] if height == width => u32::try_from(height).ok(),
        [1, 3, height, width] => {
            return Err((
                "input.shape",
                format!("{:?} is {height} high and {width} wide: the input must be square", entry.shape),
            ));
        }
        _ => {
            return Err(("input.shape", format!("{:?} is not [1, 3, size, size] (NCHW, batch 1, RGB)", entry.shape)));
        }
    };
    let size = size.filter(|size| (MIN_INPUT_SIZE..=MAX_INPUT_SIZE).contains(size)).ok_or_else(|| {
        ("input.shape", format!("{:?}: the side must be {MIN_INPUT_SIZE} to {MAX_INPUT_SIZE} pixels", entry.shape))
    })?;
    let mean = entry.mean.channels().map_err(|reason| ("input.mean", reason))?;
    let scale = entry.scale.channels().map_err(|reason| ("input.scale", reason))?;
    if !mean.iter().all(|m| m.is_finite()) {
        return Err(("input.mean", format!("{mean:?} is not finite")));
    }
    if !scale.iter().all(|s| s.is_finite() && *s != 0.0) {
        return Err(("input.scale", format!("{scale:?}: every scale must be finite and not 0")));
    }
    Ok(ModelInput { name: entry.name, size, mean, scale })
}

/// How many values a tensor of `shape` holds, when every dimension is known (none negative,
/// as a graph marks a free one) and the product fits.
pub(crate) fn known_len(shape: &[i64]) -> Option<usize> {
    shape.iter().try_fold(1usize, |len, &dim| len.checked_mul(usize::try_from(dim).ok()?))
}

/// Checks the manifest's `output.shape`, when given, against the number of classes.
fn check_output_shape(output: Option<&OutputEntry>, classes: usize) -> Result<(), (&'static str, String)> {
    let Some(shape) = output.and_then(|output| output.shape.as_ref()) else { return Ok(()) };
    let len = known_len(shape);
    match (shape.first(), len) {
        (Some(1), Some(len)) if len == classes => Ok(()),
        _ => Err((
            "output.shape",
            format!(
                "{shape:?} does not hold one logit per class: labels.json names {classes} classes, so [1, {classes}]"
            ),
        )),
    }
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
    input: ModelInput,
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
        let manifest_error = |(field, reason)| ModelError::Manifest { path: manifest_path.clone(), field, reason };
        let input = model_input(manifest.input.as_ref()).map_err(manifest_error)?;
        let graph = read_checked(dir, &manifest_path, &manifest, MODEL_FILE)?;
        let labels = read_checked(dir, &manifest_path, &manifest, LABELS_FILE)?;
        // The tag table is optional: used when the manifest lists it.
        let tags = match manifest.files.contains_key(TAGS_FILE) {
            true => Some(read_checked(dir, &manifest_path, &manifest, TAGS_FILE)?),
            false => None,
        };
        let taxonomy = Taxonomy::from_json(&labels, tags.as_deref()).map_err(|reason| ModelError::Classes {
            path: dir.join(if reason.is_about_tags() { TAGS_FILE } else { LABELS_FILE }),
            reason,
        })?;
        check_output_shape(manifest.output.as_ref(), taxonomy.classes()).map_err(manifest_error)?;
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
        let backend = Backend::load(&graph, &dir.join(MODEL_FILE), &input, &outputs, library, options)?;
        if let Some(logits) = backend.logits_len()
            && logits != taxonomy.classes()
        {
            return Err(ModelError::ClassCount {
                path: dir.join(MODEL_FILE),
                output: outputs.logits,
                logits,
                labels_path: dir.join(LABELS_FILE),
                labels: taxonomy.classes(),
            });
        }
        tracing::info!(model = %manifest.model, runtime = %backend.kind(), detail = %backend.detail(),
            input = %input.name, size = input.size, classes = taxonomy.classes(),
            embedding = embedding.as_ref().map_or("none", |spec| spec.version.as_str()),
            dir = %dir.display(), load_ms = started.elapsed().as_millis(), "model loaded");
        if embedding.is_none() {
            tracing::warn!(dir = %dir.display(),
                "the model directory's manifest has no embedding entry: images are analysed without one, so \
                 similarity search and near-duplicate detection skip them (a directory of `{PREPARE_COMMAND}` \
                 prepared before embeddings is brought up to date by running it again)");
        }
        Ok(Self { name: manifest.model, input, backend, taxonomy, embedding })
    }

    /// What the model takes (the manifest's `input`): its input's name and size and the
    /// normalisation [`preprocess`](crate::preprocess) applies.
    pub fn input(&self) -> &ModelInput {
        &self.input
    }

    /// The model's input for an image's bytes (see [`preprocess`](crate::preprocess)), at most
    /// `max_pixels` pixels. CPU-bound.
    pub fn preprocess(&self, bytes: &[u8], max_pixels: u64) -> Result<Array4<f32>, AnalyzeError> {
        self.input.preprocess(bytes, max_pixels)
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
        if outputs.logits.len() != self.taxonomy.classes() {
            return Err(AnalyzeError::Inference(format!(
                "the model gave {} logits, its labels name {} classes",
                outputs.logits.len(),
                self.taxonomy.classes()
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

    fn input(entry: serde_json::Value) -> Result<ModelInput, (&'static str, String)> {
        model_input(Some(&entry))
    }

    #[test]
    fn the_manifest_input_gives_the_name_size_and_normalisation() {
        assert_eq!(model_input(None).unwrap(), ModelInput::default());
        let bundled = serde_json::json!({"name": "input", "shape": [1, 3, 224, 224], "mean": 127.0, "scale": 128.0});
        assert_eq!(input(bundled).unwrap(), ModelInput::default());
        let custom = serde_json::json!({"name": "pixels", "shape": [1, 3, 160, 160], "mean": [123.675, 116.28, 103.53],
            "scale": [58.395, 57.12, 57.375]});
        assert_eq!(
            input(custom).unwrap(),
            ModelInput {
                name: "pixels".into(),
                size: 160,
                mean: [123.675, 116.28, 103.53],
                scale: [58.395, 57.12, 57.375]
            }
        );
    }

    #[test]
    fn a_manifest_input_the_worker_cannot_feed_is_rejected_naming_the_field() {
        let entry = |shape: serde_json::Value, mean: serde_json::Value, scale: serde_json::Value| serde_json::json!({"name": "x", "shape": shape, "mean": mean, "scale": scale});
        let cases = [
            (entry(serde_json::json!([1, 3, 224]), 0.into(), 1.into()), "input.shape", "not [1, 3, size, size]"),
            (entry(serde_json::json!([2, 3, 224, 224]), 0.into(), 1.into()), "input.shape", "batch 1"),
            (entry(serde_json::json!([1, 1, 224, 224]), 0.into(), 1.into()), "input.shape", "RGB"),
            (entry(serde_json::json!([1, 3, 224, 160]), 0.into(), 1.into()), "input.shape", "must be square"),
            (entry(serde_json::json!([1, 3, 8, 8]), 0.into(), 1.into()), "input.shape", "16 to 2048"),
            (entry(serde_json::json!([1, 3, 4096, 4096]), 0.into(), 1.into()), "input.shape", "16 to 2048"),
            (entry(serde_json::json!([1, 3, -1, -1]), 0.into(), 1.into()), "input.shape", "16 to 2048"),
            (entry(serde_json::json!([1, 3, 64, 64]), 0.into(), 0.into()), "input.scale", "not 0"),
            (entry(serde_json::json!([1, 3, 64, 64]), 0.into(), serde_json::json!([1, 0, 1])), "input.scale", "not 0"),
            (entry(serde_json::json!([1, 3, 64, 64]), serde_json::json!([1, 2]), 1.into()), "input.mean", "2 values"),
            (serde_json::json!({"name": "", "shape": [1, 3, 64, 64], "mean": 0, "scale": 1}), "input.name", "empty"),
            (serde_json::json!({"name": "x", "shape": [1, 3, 64, 64], "scale": 1}), "input", "missing field `mean`"),
        ];
        for (entry, field, says) in cases {
            let (got, reason) = input(entry.clone()).unwrap_err();
            assert_eq!(got, field, "{entry}: {reason}");
            assert!(reason.contains(says), "{entry}: {reason:?} does not say {says:?}");
        }
    }

    /// A directory with `manifest` (its `files` filled in) and the files `files`.
    fn directory(mut manifest: serde_json::Value, files: &[(&str, &[u8])]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            std::fs::write(dir.path().join(name), bytes).unwrap();
            manifest["files"][*name] = hex::encode(Sha256::digest(bytes)).into();
        }
        std::fs::write(dir.path().join(MANIFEST_FILE), serde_json::to_vec(&manifest).unwrap()).unwrap();
        dir
    }

    #[test]
    fn a_bad_manifest_input_fails_the_load_naming_the_manifest_and_the_field() {
        let manifest = serde_json::json!({"model": "m", "files": {},
            "input": {"name": "pixels", "shape": [1, 3, 224, 160], "mean": 0, "scale": 1}});
        let dir = directory(manifest, &[]);
        let err = Model::load(dir.path()).unwrap_err();
        assert!(
            matches!(&err, ModelError::Manifest { path, field: "input.shape", .. } if path.ends_with(MANIFEST_FILE)),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(message.contains("input.shape") && message.contains(&dir.path().display().to_string()), "{message}");
    }

    #[test]
    fn an_output_shape_not_matching_the_labels_is_rejected() {
        let manifest = serde_json::json!({"model": "m", "files": {}, "output": {"name": "scores", "shape": [1, 1000]}});
        let dir = directory(
            manifest,
            &[(MODEL_FILE, b"graph".as_slice()), (LABELS_FILE, br#"["cat", "dog", "food"]"#.as_slice())],
        );
        let err = Model::load(dir.path()).unwrap_err();
        assert!(matches!(&err, ModelError::Manifest { field: "output.shape", .. }), "{err:?}");
        assert!(err.to_string().contains("3 classes"), "{err}");
    }

    #[test]
    fn a_tag_table_not_matching_the_labels_or_too_few_labels_are_rejected() {
        let manifest = serde_json::json!({"model": "m", "files": {}});
        let files: [(&str, &[u8]); 3] =
            [(MODEL_FILE, b"graph"), (LABELS_FILE, br#"["cat", "dog", "food"]"#), (TAGS_FILE, br#"[[], ["animal"]]"#)];
        let err = Model::load(directory(manifest.clone(), &files).path()).unwrap_err();
        assert!(matches!(&err, ModelError::Classes { path, .. } if path.ends_with(TAGS_FILE)), "{err:?}");
        assert!(err.to_string().contains("2 entries, expected 3"), "{err}");

        let one = directory(manifest, &[(MODEL_FILE, b"graph".as_slice()), (LABELS_FILE, br#"["cat"]"#.as_slice())]);
        let err = Model::load(one.path()).unwrap_err();
        assert!(matches!(&err, ModelError::Classes { path, .. } if path.ends_with(LABELS_FILE)), "{err:?}");
    }
}
