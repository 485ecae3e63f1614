//! Which runtime runs the model (`ai.runtime`), on the prepared model directory and on copies
//! of it without onnxruntime's library.

mod common;

use std::path::Path;

use imagepipe_ai_worker::model::{LABELS_FILE, MANIFEST_FILE, MODEL_FILE, TAGS_FILE};
use imagepipe_ai_worker::{AiRuntime, Model, ModelError, RuntimeKind, RuntimeOptions};

fn options(runtime: AiRuntime) -> RuntimeOptions {
    RuntimeOptions { runtime, ..RuntimeOptions::default() }
}

/// A copy of the prepared directory as the preparation wrote it before it shipped onnxruntime:
/// no library, no `onnxruntime` entry in the manifest.
fn without_onnxruntime(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for file in [MODEL_FILE, LABELS_FILE, TAGS_FILE] {
        std::fs::copy(dir.join(file), copy.path().join(file)).unwrap();
    }
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    let library = manifest["onnxruntime"]["library"].as_str().expect("the manifest names the library").to_owned();
    manifest["files"].as_object_mut().unwrap().remove(&library);
    manifest.as_object_mut().unwrap().remove("onnxruntime");
    std::fs::write(copy.path().join(MANIFEST_FILE), serde_json::to_vec(&manifest).unwrap()).unwrap();
    copy
}

#[test]
fn auto_runs_onnxruntime_from_the_prepared_directory() {
    let Some(model) = common::model() else { return };
    assert_eq!(model.runtime(), RuntimeKind::Onnxruntime);
}

#[test]
fn auto_falls_back_to_tract_without_the_library_and_an_explicit_onnxruntime_fails() {
    let Some(dir) = common::model_dir() else { return };
    let copy = without_onnxruntime(&dir);
    let model = Model::load_with(copy.path(), &options(AiRuntime::Auto)).unwrap();
    assert_eq!(model.runtime(), RuntimeKind::Tract);
    assert_eq!(Model::load_with(copy.path(), &options(AiRuntime::Tract)).unwrap().runtime(), RuntimeKind::Tract);

    let err = Model::load_with(copy.path(), &options(AiRuntime::Onnxruntime)).unwrap_err();
    assert!(matches!(err, ModelError::NoOnnxruntime { .. }), "{err:?}");
    let message = err.to_string();
    for part in ["scripts/prepare-model.sh", "ai.onnxruntime_library", "ai.runtime = tract"] {
        assert!(message.contains(part), "{part} missing from: {message}");
    }
}

#[test]
fn a_library_that_is_not_there_is_an_error_naming_it_or_tract_under_auto() {
    let Some(dir) = common::model_dir() else { return };
    let missing = dir.join("no-such-libonnxruntime.so");
    let explicit = RuntimeOptions { onnxruntime_library: Some(missing.clone()), ..options(AiRuntime::Onnxruntime) };
    let err = Model::load_with(&dir, &explicit).unwrap_err();
    assert!(matches!(&err, ModelError::OnnxruntimeLibrary { library, .. } if *library == missing), "{err:?}");
    assert!(err.to_string().contains(&missing.display().to_string()), "{err}");

    let auto = RuntimeOptions { runtime: AiRuntime::Auto, ..explicit };
    assert_eq!(Model::load_with(&dir, &auto).unwrap().runtime(), RuntimeKind::Tract);
}

#[test]
fn a_library_not_matching_the_manifest_is_rejected() {
    let Some(dir) = common::model_dir() else { return };
    let copy = tempfile::tempdir().unwrap();
    for file in [MODEL_FILE, LABELS_FILE, TAGS_FILE, MANIFEST_FILE] {
        std::fs::copy(dir.join(file), copy.path().join(file)).unwrap();
    }
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    let library = manifest["onnxruntime"]["library"].as_str().unwrap();
    std::fs::write(copy.path().join(library), b"not the library").unwrap();
    let err = Model::load_with(copy.path(), &options(AiRuntime::Onnxruntime)).unwrap_err();
    assert!(matches!(&err, ModelError::Invalid { path, .. } if path.ends_with(library)), "{err:?}");
}
