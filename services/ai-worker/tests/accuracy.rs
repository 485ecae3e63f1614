//! Each runtime against the numpy reference on the reference's exact inputs: the preparation
//! writes each sample photo's preprocessed tensor (`verification/<photo>.input.f32`, Pillow's
//! preprocessing), the float64 reference's 1000 probabilities and 1280 pooled features for it
//! (`verification.json`), so any difference here is the runtime's, not the preprocessing's.

mod common;

use std::path::Path;

use imagepipe_ai_worker::preprocess::INPUT_SIZE;
use imagepipe_ai_worker::{AiRuntime, Model, RuntimeKind, RuntimeOptions};
use sha2::{Digest, Sha256};
use tract_onnx::prelude::tract_ndarray::Array4;

/// Most a probability may differ from the reference's.
const TOLERANCE: f64 = 1e-4;
/// Least cosine of the features with the reference's.
const FEATURES_MIN_COSINE: f64 = 0.9999;

/// The reference's input for `photo`, its probabilities and its features.
fn reference(dir: &Path, report: &serde_json::Value, photo: &str) -> (Array4<f32>, Vec<f64>, Vec<f64>) {
    let entry = &report["photos"][photo];
    let input = &entry["input"];
    let path = dir.join(input["file"].as_str().unwrap_or_else(|| panic!("{photo}: no input in verification.json")));
    let raw = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(hex::encode(Sha256::digest(&raw)), input["sha256"].as_str().unwrap(), "{}", path.display());
    let values: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let size = INPUT_SIZE as usize;
    let tensor = Array4::from_shape_vec((1, 3, size, size), values).expect("a [1,3,224,224] tensor");
    let probabilities: Vec<f64> = entry["probabilities"]
        .as_array()
        .unwrap_or_else(|| panic!("{photo}: no probabilities in verification.json"))
        .iter()
        .map(|p| p.as_f64().unwrap())
        .collect();
    assert_eq!(probabilities.len(), 1000);
    let features: Vec<f64> = entry["features"]
        .as_array()
        .unwrap_or_else(|| panic!("{photo}: no features in verification.json (run scripts/prepare-model.sh)"))
        .iter()
        .map(|f| f.as_f64().unwrap())
        .collect();
    assert_eq!(features.len(), 1280);
    (tensor, probabilities, features)
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let a: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (norm(&a) * norm(b))
}

/// Runs `runtime` (chosen explicitly: it must load) on every photo's reference input.
fn agrees_with_the_reference(runtime: AiRuntime, kind: RuntimeKind) {
    let Some(dir) = common::model_dir() else { return };
    let report = common::verification(&dir);
    let options = RuntimeOptions { runtime, ..RuntimeOptions::default() };
    let model = Model::load_with(&dir, &options).unwrap_or_else(|e| panic!("{runtime} loads the model: {e}"));
    assert_eq!(model.runtime(), kind);
    for photo in common::PHOTOS {
        let (input, expected, expected_features) = reference(&dir, &report, photo);
        let got = model.infer(input).unwrap();
        let worst = got.probabilities.iter().zip(&expected).map(|(g, e)| (f64::from(*g) - e).abs()).fold(0.0, f64::max);
        let features = got.features.expect("the prepared model gives features");
        let similarity = cosine(&features, &expected_features);
        eprintln!("{kind} {photo}: max |Δp| = {worst:.2e}, features cosine {similarity:.7}");
        assert!(worst <= TOLERANCE, "{kind} {photo}: max |Δp| = {worst:e}, over {TOLERANCE:e}");
        assert!(similarity >= FEATURES_MIN_COSINE, "{kind} {photo}: features cosine {similarity}");
    }
}

#[test]
fn onnxruntime_agrees_with_the_numpy_reference_within_1e_4_and_its_features() {
    agrees_with_the_reference(AiRuntime::Onnxruntime, RuntimeKind::Onnxruntime);
}

#[test]
fn tract_agrees_with_the_numpy_reference_within_1e_4_and_its_features() {
    agrees_with_the_reference(AiRuntime::Tract, RuntimeKind::Tract);
}
