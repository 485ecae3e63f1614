//! Finding the prepared model and the sample photos for tests.
//!
//! The model directory comes from `IMAGEPIPE_TEST_MODEL_DIR` (scripts/test.sh prepares it and
//! sets it), else the repository's `.imagepipe/models` when prepared there. Without either, a
//! test fails with the reason, or with `IMAGEPIPE_TEST_ALLOW_SKIP=1` is skipped
//! (`imagepipe_contracts::testing`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use imagepipe_ai_worker::Model;
use serde_json::Value;

/// The sample photos the preparation verifies the model on.
pub const PHOTOS: [&str; 4] = ["chelsea", "coffee", "rocket", "astronaut"];

/// The environment variable naming the prepared model directory.
pub const MODEL_DIR_ENV: &str = "IMAGEPIPE_TEST_MODEL_DIR";

/// The prepared model directory; without one the test fails, or gets `None` (and skips) when
/// `IMAGEPIPE_TEST_ALLOW_SKIP=1`.
pub fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os(MODEL_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.imagepipe/models"));
    if dir.join("manifest.json").exists() {
        return Some(dir);
    }
    thread_local! {
        // Tests ask for the directory and the model both: one `SKIPPED` line per test.
        static REPORTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    if !REPORTED.replace(true) {
        imagepipe_contracts::testing::environment_missing(&format!(
            "no prepared model in {} (run scripts/prepare-model.sh, or set {MODEL_DIR_ENV} to a prepared directory)",
            dir.display()
        ));
    }
    None
}

/// The environment variable naming the Python of the model preparation's venv (numpy, onnx,
/// onnxruntime), which runs `scripts/prepare_custom_model.py`.
pub const PREPARE_PYTHON_ENV: &str = "IMAGEPIPE_TEST_PREPARE_PYTHON";

/// The Python of the model preparation: `IMAGEPIPE_TEST_PREPARE_PYTHON`, else the venv
/// `scripts/prepare-model.sh` sets up (`${IMAGEPIPE_CACHE_DIR:-$HOME/.cache/imagepipe}/venv-prepare`).
/// Without either, the test fails, or gets `None` (and skips) when `IMAGEPIPE_TEST_ALLOW_SKIP=1`.
pub fn prepare_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os(PREPARE_PYTHON_ENV) {
        return Some(python.into());
    }
    let cache = std::env::var_os("IMAGEPIPE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/imagepipe")));
    let python = cache.map(|cache| cache.join("venv-prepare/bin/python"));
    match python {
        Some(python) if python.exists() => Some(python),
        _ => {
            imagepipe_contracts::testing::environment_missing(&format!(
                "the model preparation's Python is not there (run scripts/prepare-model.sh, which sets up its venv, \
                 or set {PREPARE_PYTHON_ENV})"
            ));
            None
        }
    }
}

/// The model, loaded once per test binary with the default runtime choice (`auto`: onnxruntime,
/// which the prepared directory ships).
pub fn model() -> Option<Arc<Model>> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    let dir = model_dir()?;
    Some(MODEL.get_or_init(|| Arc::new(Model::load(&dir).expect("the prepared model loads"))).clone())
}

/// `verification.json`: the numpy reference's results, written by the preparation.
pub fn verification(dir: &Path) -> Value {
    let text = std::fs::read(dir.join("verification.json")).expect("verification.json is prepared");
    serde_json::from_slice(&text).unwrap()
}

/// The bytes of a sample photo (`chelsea`, `coffee`, `rocket`, `astronaut`).
pub fn photo(dir: &Path, name: &str) -> Vec<u8> {
    let report = verification(dir);
    let file = report["photos"][name]["file"].as_str().unwrap_or_else(|| panic!("no photo {name}"));
    let path = Path::new(report["photo_dir"].as_str().unwrap()).join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
