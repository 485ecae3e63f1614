//! The prepared model directory (`ai.model_dir`, written by `scripts/prepare-model.sh`):
//! `model.onnx` (EfficientNet-Lite0, input `[1,3,224,224]`, output logits `[1,1000]`),
//! `labels.json`, `tags.json` and `manifest.json` (model name and each file's sha256).
//! [`Model::load`] checks the files against the manifest, then loads and optimises the graph
//! once; [`Model::probabilities`] runs it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tract_onnx::prelude::tract_ndarray::Array4;
use tract_onnx::prelude::*;

use crate::error::{AnalyzeError, ModelError};
use crate::preprocess::INPUT_SIZE;
use crate::taxonomy::{CLASSES, Taxonomy};

/// The ONNX graph's file name.
pub const MODEL_FILE: &str = "model.onnx";
/// The class names' file name.
pub const LABELS_FILE: &str = "labels.json";
/// The tag table's file name.
pub const TAGS_FILE: &str = "tags.json";
/// The manifest's file name.
pub const MANIFEST_FILE: &str = "manifest.json";

/// What `manifest.json` says (the fields the worker reads).
#[derive(Debug, Deserialize)]
struct Manifest {
    /// Model name and version, reported with every analysis.
    model: String,
    /// sha256 of each file, by file name.
    files: HashMap<String, String>,
}

/// A loaded, optimised classifier with its class names and tags. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Model {
    name: String,
    plan: Arc<TypedRunnableModel>,
    taxonomy: Taxonomy,
}

impl Model {
    /// Loads the model directory `dir`; a missing file is an error naming the preparation
    /// command.
    pub fn load(dir: &Path) -> Result<Self, ModelError> {
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest: Manifest = serde_json::from_slice(&read(&manifest_path)?)
            .map_err(|e| ModelError::Invalid { path: manifest_path.clone(), reason: e.to_string() })?;
        let mut checked = HashMap::new();
        for file in [MODEL_FILE, LABELS_FILE, TAGS_FILE] {
            let path = dir.join(file);
            let bytes = read(&path)?;
            let expected = manifest.files.get(file).ok_or_else(|| ModelError::Invalid {
                path: manifest_path.clone(),
                reason: format!("it lists no sha256 for {file}"),
            })?;
            let actual = hex::encode(Sha256::digest(&bytes));
            if &actual != expected {
                return Err(ModelError::Invalid {
                    path,
                    reason: format!("its sha256 is {actual}, the manifest says {expected}"),
                });
            }
            checked.insert(file, bytes);
        }
        let taxonomy = Taxonomy::from_json(&checked[LABELS_FILE], &checked[TAGS_FILE])
            .map_err(|e| ModelError::Invalid { path: dir.join(TAGS_FILE), reason: e.to_string() })?;
        let path = dir.join(MODEL_FILE);
        let plan = optimise(&checked[MODEL_FILE])
            .map_err(|e| ModelError::Graph { path: path.clone(), reason: format!("{e:#}") })?;
        Ok(Self { name: manifest.model, plan, taxonomy })
    }

    /// Model name and version (`efficientnet-lite0-imagenet1k@57934424`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Class names and tags.
    pub fn taxonomy(&self) -> &Taxonomy {
        &self.taxonomy
    }

    /// The softmax of the model's logits for one preprocessed input (see
    /// [`preprocess`](crate::preprocess)). CPU-bound: call it on a blocking thread.
    pub fn probabilities(&self, input: Array4<f32>) -> Result<Vec<f32>, AnalyzeError> {
        let outputs = self.plan.run(tvec!(Tensor::from(input).into())).map_err(inference_error)?;
        let logits = outputs[0].to_plain_array_view::<f32>().map_err(inference_error)?;
        if logits.len() != CLASSES {
            return Err(AnalyzeError::Inference(format!("the model gave {} logits, expected {CLASSES}", logits.len())));
        }
        Ok(softmax(logits.iter().copied()))
    }
}

fn inference_error(error: TractError) -> AnalyzeError {
    AnalyzeError::Inference(format!("{error:#}"))
}

fn optimise(onnx_bytes: &[u8]) -> TractResult<Arc<TypedRunnableModel>> {
    let size = INPUT_SIZE as usize;
    tract_onnx::onnx()
        .model_for_read(&mut &onnx_bytes[..])?
        .with_input_fact(0, f32::fact([1, 3, size, size]).into())?
        .into_optimized()?
        .into_runnable()
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
