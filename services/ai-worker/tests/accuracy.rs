//! Each runtime against the numpy reference on the reference's exact inputs: the preparation
//! writes each sample photo's preprocessed tensor (`verification/<photo>.input.f32`, Pillow's
//! preprocessing) and the float64 reference's 1000 probabilities for it (`verification.json`), so
//! any difference here is the runtime's, not the preprocessing's.

mod common;

use std::path::Path;

use imagepipe_ai_worker::preprocess::INPUT_SIZE;
use imagepipe_ai_worker::{AiRuntime, Model, RuntimeKind, RuntimeOptions};
use sha2::{Digest, Sha256};
use tract_onnx::prelude::tract_ndarray::Array4;

/// Most a probability may differ from the reference's.
const TOLERANCE: f64 = 1e-4;

/// The reference's input for `photo` and its probabilities.
fn reference(dir: &Path, report: &serde_json::Value, photo: &str) -> (Array4<f32>, Vec<f64>) {
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
    (tensor, probabilities)
}

/// Runs `runtime` (chosen explicitly: it must load) on every photo's reference input.
fn agrees_with_the_reference(runtime: AiRuntime, kind: RuntimeKind) {
    let Some(dir) = common::model_dir() else { return };
    let report = common::verification(&dir);
    let options = RuntimeOptions { runtime, ..RuntimeOptions::default() };
    let model = Model::load_with(&dir, &options).unwrap_or_else(|e| panic!("{runtime} loads the model: {e}"));
    assert_eq!(model.runtime(), kind);
    for photo in common::PHOTOS {
        let (input, expected) = reference(&dir, &report, photo);
        let got = model.probabilities(input).unwrap();
        let worst = got.iter().zip(&expected).map(|(g, e)| (f64::from(*g) - e).abs()).fold(0.0, f64::max);
        eprintln!("{kind} {photo}: max |Δp| = {worst:.2e}");
        assert!(worst <= TOLERANCE, "{kind} {photo}: max |Δp| = {worst:e}, over {TOLERANCE:e}");
    }
}

#[test]
fn onnxruntime_agrees_with_the_numpy_reference_within_1e_4() {
    agrees_with_the_reference(AiRuntime::Onnxruntime, RuntimeKind::Onnxruntime);
}

#[test]
fn tract_agrees_with_the_numpy_reference_within_1e_4() {
    agrees_with_the_reference(AiRuntime::Tract, RuntimeKind::Tract);
}
