//! `ai.model_dir` holding a classifier other than the bundled one: `scripts/prepare_custom_model.py`
//! re-exports the prepared EfficientNet-Lite0, at test time and into a temporary directory, as a
//! differently shaped classifier (input `pixels` `[1,3,160,160]` with per-channel mean and
//! scale, 13 coarse classes as the output `scores`, no tag table, no embedding), and the AI stage
//! analyses the sample photos of `imagepipe demo` with it on both runtimes. Copies of the bundled
//! directory with a manifest that does not fit the graph fail to load, saying why.

mod common;

use std::path::Path;
use std::process::Command;

use imagepipe_ai_worker::model::{LABELS_FILE, MANIFEST_FILE, MODEL_FILE};
use imagepipe_ai_worker::{
    AiRuntime, AnalysisOptions, AnalyzeError, Model, ModelError, ModelInput, RuntimeKind, RuntimeOptions, analyze,
};
use sha2::{Digest, Sha256};

/// The coarse classes the script writes, in output order.
const COARSE: [&str; 13] = [
    "dog",
    "cat",
    "bird",
    "fish",
    "insect",
    "food",
    "vehicle",
    "weapon",
    "clothing",
    "structure",
    "device",
    "container",
    "other",
];
/// Each sample photo and its expected top coarse class (the bundled model's top classes: tiger
/// cat, espresso, missile).
const EXPECTED: [(&str, &str); 3] = [("chelsea", "cat"), ("coffee", "food"), ("rocket", "vehicle")];
const MAX_PIXELS: u64 = 100_000_000;

fn settings() -> AnalysisOptions {
    AnalysisOptions { top_k: 3, tag_min_score: 0.0, max_pixels: MAX_PIXELS }
}

fn options(runtime: AiRuntime) -> RuntimeOptions {
    RuntimeOptions { runtime, ..RuntimeOptions::default() }
}

/// The bytes of a sample photo of `services/imagepipe/samples`.
fn sample(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../imagepipe/samples").join(format!("{name}.jpg"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The second classifier, prepared from the bundled `dir` into a temporary directory by
/// `scripts/prepare_custom_model.py` with `python`.
fn prepare_custom(python: &Path, dir: &Path) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/prepare_custom_model.py");
    let output = Command::new(python)
        .arg(&script)
        .arg("--from")
        .arg(dir)
        .arg("--out")
        .arg(out.path())
        .args(["--size", "160"])
        .output()
        .unwrap_or_else(|e| panic!("running {} {}: {e}", python.display(), script.display()));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{} failed ({}):\n{stderr}", script.display(), output.status);
    eprint!("{stderr}");
    out
}

#[test]
fn a_second_classifier_of_another_input_and_label_set_labels_the_samples_on_both_runtimes() {
    let (Some(dir), Some(python)) = (common::model_dir(), common::prepare_python()) else { return };
    let custom = prepare_custom(&python, &dir);
    let mut tops = Vec::new();
    for (runtime, kind) in [(AiRuntime::Onnxruntime, RuntimeKind::Onnxruntime), (AiRuntime::Tract, RuntimeKind::Tract)]
    {
        let model = Model::load_with(custom.path(), &options(runtime)).unwrap_or_else(|e| panic!("{runtime}: {e}"));
        assert_eq!(model.runtime(), kind);
        assert_eq!(model.name(), "efficientnet-lite0-coarse13-160@57934424");
        assert_eq!(
            model.input(),
            &ModelInput { name: "pixels".into(), size: 160, mean: [127.0; 3], scale: [128.0; 3] },
            "{runtime}: the manifest's input"
        );
        assert_eq!(model.taxonomy().labels(), COARSE, "{runtime}: the custom label set");
        assert_eq!(model.embedding(), None, "{runtime}: no features output, no embedding");

        // The graph takes 160 px and nothing else: the bundled model's 224 px input fails.
        let bytes = sample("chelsea");
        let input = model.preprocess(&bytes, MAX_PIXELS).unwrap();
        assert_eq!(input.shape(), &[1, 3, 160, 160], "{runtime}");
        assert_eq!(model.infer(input).unwrap().probabilities.len(), COARSE.len(), "{runtime}");
        let bundled_input = ModelInput::default().preprocess(&bytes, MAX_PIXELS).unwrap();
        assert!(matches!(model.infer(bundled_input), Err(AnalyzeError::Inference(_))), "{runtime}: 224 px accepted");

        for (name, expected) in EXPECTED {
            let analysis = analyze(&model, &settings(), &sample(name)).unwrap();
            let predictions: Vec<(&str, f64)> =
                analysis.predictions.iter().map(|p| (p.label.as_str(), p.score)).collect();
            eprintln!("{runtime} {name}: {predictions:?}");
            assert_eq!(analysis.model, model.name());
            assert_eq!(predictions.len(), 3, "{runtime} {name}");
            assert_eq!(predictions[0].0, expected, "{runtime} {name}: {predictions:?}");
            assert!(predictions[0].1 > 0.5, "{runtime} {name}: {predictions:?}");
            assert!(predictions.iter().all(|(label, _)| COARSE.contains(label)), "{runtime} {name}");
            // Without a tag table the tags are the top classes' names, scored as they are.
            let tags: Vec<(&str, f64)> = analysis.tags.iter().map(|t| (t.label.as_str(), t.score)).collect();
            assert_eq!(tags.len(), predictions.len(), "{runtime} {name}: {tags:?}");
            for ((tag, tag_score), (label, score)) in tags.iter().zip(&predictions) {
                assert_eq!(tag, label, "{runtime} {name}");
                assert!((tag_score - score).abs() < 1e-9, "{runtime} {name}: {tag} {tag_score} vs {score}");
            }
            assert_eq!(analysis.embedding, None, "{runtime} {name}");
            tops.push((runtime, name, predictions[0].1));
        }
    }
    // Both runtimes ran the same graph on the same input.
    for (name, _) in EXPECTED {
        let scores: Vec<f64> = tops.iter().filter(|t| t.1 == name).map(|t| t.2).collect();
        assert!((scores[0] - scores[1]).abs() < 1e-3, "{name}: onnxruntime vs tract {scores:?}");
    }
}

/// A copy of the bundled directory (library left out: the tests run tract) with `labels` as
/// its label list, no tag table, and `edit` applied to its manifest.
fn bundled_copy(
    dir: &Path,
    labels: Option<Vec<String>>,
    edit: impl FnOnce(&mut serde_json::Value),
) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    std::fs::copy(dir.join(MODEL_FILE), copy.path().join(MODEL_FILE)).unwrap();
    let mut bundled: Vec<String> = serde_json::from_slice(&std::fs::read(dir.join(LABELS_FILE)).unwrap()).unwrap();
    if let Some(labels) = labels {
        bundled = labels;
    }
    let labels = serde_json::to_vec(&bundled).unwrap();
    std::fs::write(copy.path().join(LABELS_FILE), &labels).unwrap();
    let files = manifest["files"].as_object_mut().unwrap();
    files.retain(|name, _| name == MODEL_FILE);
    files.insert(LABELS_FILE.into(), hex::encode(Sha256::digest(&labels)).into());
    manifest.as_object_mut().unwrap().remove("onnxruntime");
    edit(&mut manifest);
    std::fs::write(copy.path().join(MANIFEST_FILE), serde_json::to_vec(&manifest).unwrap()).unwrap();
    copy
}

#[test]
fn the_bundled_model_without_a_tag_table_tags_with_its_top_classes() {
    let Some(dir) = common::model_dir() else { return };
    let copy = bundled_copy(&dir, None, |_| {});
    let model = Model::load_with(copy.path(), &options(AiRuntime::Tract)).unwrap();
    assert_eq!(model.taxonomy().classes(), 1000);
    let analysis = analyze(&model, &settings(), &sample("coffee")).unwrap();
    let tags: Vec<&str> = analysis.tags.iter().map(|t| t.label.as_str()).collect();
    assert!(tags.contains(&"espresso") && !tags.contains(&"beverage"), "{tags:?}");
}

#[test]
fn logits_not_one_per_label_fail_the_load() {
    let Some(dir) = common::model_dir() else { return };
    let labels: Vec<String> = (0..999).map(|i| format!("class {i}")).collect();
    // Without output.shape in the manifest the graph's own output shape is compared.
    let copy = bundled_copy(&dir, Some(labels.clone()), |manifest| {
        manifest["output"].as_object_mut().unwrap().remove("shape");
    });
    let err = Model::load_with(copy.path(), &options(AiRuntime::Tract)).unwrap_err();
    assert!(matches!(&err, ModelError::ClassCount { logits: 1000, labels: 999, .. }), "{err:?}");
    assert!(err.to_string().contains("names 999 classes"), "{err}");
    // With it, the manifest is at fault before the graph is loaded.
    let copy = bundled_copy(&dir, Some(labels), |_| {});
    let err = Model::load_with(copy.path(), &options(AiRuntime::Tract)).unwrap_err();
    assert!(matches!(&err, ModelError::Manifest { field: "output.shape", .. }), "{err:?}");
}

#[test]
fn an_input_name_the_graph_does_not_have_fails_the_load() {
    let Some(dir) = common::model_dir() else { return };
    let copy = bundled_copy(&dir, None, |manifest| manifest["input"]["name"] = "pixels".into());
    let err = Model::load_with(copy.path(), &options(AiRuntime::Tract)).unwrap_err();
    assert!(matches!(&err, ModelError::Graph { runtime: "tract", .. }), "{err:?}");
    assert!(err.to_string().contains("input.name") && err.to_string().contains("pixels"), "{err}");
}

#[test]
fn onnxruntime_checks_the_input_name_and_size_against_the_manifest() {
    let Some(dir) = common::model_dir() else { return };
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    let library = dir.join(manifest["onnxruntime"]["library"].as_str().unwrap());
    let ort = RuntimeOptions { onnxruntime_library: Some(library), ..options(AiRuntime::Onnxruntime) };
    let renamed = bundled_copy(&dir, None, |manifest| manifest["input"]["name"] = "pixels".into());
    let err = Model::load_with(renamed.path(), &ort).unwrap_err();
    assert!(matches!(&err, ModelError::Graph { runtime: "onnxruntime", .. }), "{err:?}");
    assert!(err.to_string().contains("input.name"), "{err}");
    let resized = bundled_copy(&dir, None, |manifest| manifest["input"]["shape"] = serde_json::json!([1, 3, 160, 160]));
    let err = Model::load_with(resized.path(), &ort).unwrap_err();
    assert!(matches!(&err, ModelError::Graph { runtime: "onnxruntime", .. }), "{err:?}");
    assert!(err.to_string().contains("[1, 3, 160, 160]"), "{err}");
}
