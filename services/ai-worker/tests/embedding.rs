//! The image's embedding (the pooled features of the same run as the labels): its version, unit
//! length, size in `image.analyzed`, agreement between the runtimes, model directories prepared
//! before it, and how close transformed copies of a photo stay to it compared with other photos
//! (the numbers behind the near-duplicate threshold; run with `--no-capture` to see the table).
//! Measured on the four samples: resized and re-encoded copies 0.93-0.997, 10 % crops 0.89-0.98,
//! different photos 0.09-0.25.

mod common;

use std::io::Cursor;
use std::path::Path;

use image::codecs::jpeg::JpegEncoder;
use image::imageops::FilterType;
use image::{DynamicImage, ImageFormat};
use imagepipe_ai_worker::model::{LABELS_FILE, MANIFEST_FILE, MODEL_FILE, TAGS_FILE};
use imagepipe_ai_worker::{AiRuntime, AnalysisOptions, Model, ModelError, RuntimeKind, RuntimeOptions, analyze};
use imagepipe_contracts::command::AnalyzeCommand;
use imagepipe_contracts::payload::ImageAnalyzed;
use imagepipe_contracts::{Event, StepCommand, StepOutput, TraceId};
use imagepipe_runtime::config::AiConfig;

/// The four sample photos of `imagepipe demo`.
const SAMPLES: [&str; 4] = ["chelsea", "coffee", "rocket", "astronaut"];
/// Largest `image.analyzed` event allowed.
const EVENT_LIMIT: usize = 4096;
const MAX_PIXELS: u64 = 100_000_000;
/// The similarity indexer's default near-duplicate threshold (`similarity.duplicate_threshold`).
const DUPLICATE_THRESHOLD: f32 = 0.95;

fn settings() -> AnalysisOptions {
    AnalysisOptions::from(&AiConfig::default())
}

/// The bytes of a sample photo of `services/imagepipe/samples`.
fn sample(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../imagepipe/samples").join(format!("{name}.jpg"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>() / (norm(a) * norm(b))
}

/// The unit vector of `bytes`'s embedding, as the similarity indexer reads it back.
fn unit(model: &Model, bytes: &[u8]) -> Vec<f32> {
    let analysis = analyze(model, &settings(), bytes).unwrap();
    analysis.embedding.expect("the prepared model gives an embedding").to_unit().unwrap()
}

/// A copy of the prepared directory's model files with `edit` applied to its manifest.
fn with_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    let library = manifest["onnxruntime"]["library"].as_str().expect("the manifest names the library").to_owned();
    for file in [MODEL_FILE, LABELS_FILE, TAGS_FILE, library.as_str()] {
        std::fs::copy(dir.join(file), copy.path().join(file)).unwrap();
    }
    edit(&mut manifest);
    std::fs::write(copy.path().join(MANIFEST_FILE), serde_json::to_vec(&manifest).unwrap()).unwrap();
    copy
}

#[test]
fn the_analysis_carries_a_unit_embedding_of_the_manifests_version() {
    let (Some(dir), Some(model)) = (common::model_dir(), common::model()) else { return };
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join(MANIFEST_FILE)).unwrap()).unwrap();
    let version = manifest["embedding"]["version"].as_str().expect("the manifest has an embedding version");
    assert_eq!(version, format!("{}/pool-1280", model.name()));
    assert_eq!(model.embedding_version(), Some(version));
    assert_eq!(model.embedding().map(|spec| (spec.output.as_str(), spec.dim)), Some(("features", 1280)));

    for name in SAMPLES {
        let bytes = sample(name);
        let embedding = analyze(&model, &settings(), &bytes).unwrap().embedding.expect("an embedding");
        assert_eq!((embedding.version.as_str(), embedding.dim), (version, 1280), "{name}");
        assert_eq!(embedding.components().unwrap().len(), 1280, "{name}");
        let back = embedding.to_unit().unwrap();
        assert!((norm(&back) - 1.0).abs() < 1e-5, "{name}: norm {}", norm(&back));
        let dequantised: Vec<f32> =
            embedding.components().unwrap().iter().map(|&q| f32::from(q) * embedding.scale).collect();
        assert!((norm(&dequantised) - 1.0).abs() < 0.01, "{name}: the scale keeps unit length: {}", norm(&dequantised));

        let features = model.infer(model.preprocess(&bytes, MAX_PIXELS).unwrap()).unwrap().features.unwrap();
        assert!(features.iter().all(|f| (0.0..=6.0).contains(f)), "{name}: pooled ReLU6 features lie in 0..=6");
        let similarity = cosine(&back, &features);
        assert!(similarity > 0.999, "{name}: quantised vs float cosine {similarity}");
    }
}

#[test]
fn the_image_analyzed_event_stays_under_4_kib_and_the_step_result_leaves_the_embedding_out() {
    let Some(model) = common::model() else { return };
    let command = AnalyzeCommand {
        task_id: "tsk_01JC3Z7E4K8Q2M5N6P7R8S9T0V".into(),
        attempt: 1,
        blob_key: format!("sha256:{}", "ab".repeat(32)),
        preview_key: Some(format!("sha256:{}", "cd".repeat(32))),
        labels: [("album".to_owned(), "holidays-2026".to_owned()), ("user".to_owned(), "u-123456".to_owned())].into(),
    };
    for name in SAMPLES {
        let analysis = analyze(&model, &settings(), &sample(name)).unwrap();
        assert!(analysis.embedding.is_some());
        let (payload, output) = command.announce(analysis);
        let payload = payload.expect("the AI worker announces its step itself");
        let StepOutput::Analyze(result) = &output else { panic!("{name}: {output:?}") };
        assert_eq!(result.embedding, None, "{name}: the step result leaves the embedding out");
        assert!(!serde_json::to_string(&output).unwrap().contains("embedding"), "{name}");
        let event = Event::for_task(&command.task_id, 1, TraceId::random(), 1_763_800_000_000, "ai-worker", payload);
        let json = event.to_json();
        eprintln!("{name}: image.analyzed is {} bytes", json.len());
        assert!(json.len() < EVENT_LIMIT, "{name}: image.analyzed is {} bytes", json.len());
        let back: Event<ImageAnalyzed> = Event::from_json(&json).unwrap();
        assert_eq!(back.payload.analysis.embedding, event.payload.analysis.embedding);
    }
}

#[test]
fn onnxruntime_and_tract_give_the_same_embedding() {
    let Some(dir) = common::model_dir() else { return };
    let load = |runtime| {
        Model::load_with(&dir, &RuntimeOptions { runtime, ..RuntimeOptions::default() })
            .unwrap_or_else(|e| panic!("{runtime}: {e}"))
    };
    let (ort, tract) = (load(AiRuntime::Onnxruntime), load(AiRuntime::Tract));
    assert_eq!((ort.runtime(), tract.runtime()), (RuntimeKind::Onnxruntime, RuntimeKind::Tract));
    assert_eq!(ort.embedding_version(), tract.embedding_version());
    for name in SAMPLES {
        let bytes = sample(name);
        let input = ort.preprocess(&bytes, MAX_PIXELS).unwrap();
        let (a, b) = (ort.infer(input.clone()).unwrap(), tract.infer(input).unwrap());
        let float = cosine(a.features.as_ref().unwrap(), b.features.as_ref().unwrap());
        let quantised = cosine(&unit(&ort, &bytes), &unit(&tract, &bytes));
        eprintln!("{name}: onnxruntime vs tract cosine {float:.7} (float), {quantised:.7} (int8)");
        assert!(float > 0.999 && quantised > 0.999, "{name}: {float}, {quantised}");
    }
}

#[test]
fn a_model_directory_prepared_before_embeddings_still_loads_without_one() {
    let Some(dir) = common::model_dir() else { return };
    let old = with_manifest(&dir, |manifest| {
        manifest.as_object_mut().unwrap().remove("embedding");
    });
    for runtime in [AiRuntime::Onnxruntime, AiRuntime::Tract] {
        let model = Model::load_with(old.path(), &RuntimeOptions { runtime, ..RuntimeOptions::default() })
            .unwrap_or_else(|e| panic!("{runtime}: {e}"));
        assert_eq!((model.embedding(), model.embedding_version()), (None, None), "{runtime}");
        let bytes = sample("chelsea");
        assert_eq!(model.infer(model.preprocess(&bytes, MAX_PIXELS).unwrap()).unwrap().features, None, "{runtime}");
        let analysis = analyze(&model, &settings(), &bytes).unwrap();
        assert_eq!(analysis.embedding, None, "{runtime}");
        assert_eq!(analysis.predictions.len(), settings().top_k, "{runtime}: it still labels");
    }
}

#[test]
fn an_embedding_output_the_graph_does_not_have_is_an_error_naming_it() {
    let Some(dir) = common::model_dir() else { return };
    let wrong = with_manifest(&dir, |manifest| manifest["embedding"]["output"] = "no_such_output".into());
    for runtime in [AiRuntime::Onnxruntime, AiRuntime::Tract] {
        let err = Model::load_with(wrong.path(), &RuntimeOptions { runtime, ..RuntimeOptions::default() })
            .expect_err("the output is not in the graph");
        assert!(matches!(err, ModelError::Graph { .. }), "{runtime}: {err:?}");
        assert!(err.to_string().contains("no_such_output"), "{runtime}: {err}");
    }
    let empty = with_manifest(&dir, |manifest| manifest["embedding"]["version"] = "".into());
    let err = Model::load(empty.path()).expect_err("an embedding without a version");
    assert!(matches!(&err, ModelError::Invalid { path, .. } if path.ends_with(MANIFEST_FILE)), "{err:?}");
}

/// A transformed copy of a photo, encoded as the pipeline would receive it.
struct Transformed {
    name: &'static str,
    bytes: Vec<u8>,
}

fn png(image: &DynamicImage) -> Vec<u8> {
    let mut bytes = Cursor::new(Vec::new());
    image.write_to(&mut bytes, ImageFormat::Png).unwrap();
    bytes.into_inner()
}

/// Resized to half, re-encoded as JPEG quality 60, the centre 90 % of each side, and 10 % cut
/// off the right or the bottom. All but the JPEG are lossless PNGs, so each copy differs from the
/// original by its one transformation.
fn copies(original: &[u8]) -> Vec<Transformed> {
    let image = image::load_from_memory(original).unwrap();
    let (w, h) = (image.width(), image.height());
    let ninety = |side: u32| (f64::from(side) * 0.9).round() as u32;
    let mut jpeg = Vec::new();
    JpegEncoder::new_with_quality(&mut jpeg, 60).encode_image(&image.to_rgb8()).unwrap();
    let (cw, ch) = (ninety(w), ninety(h));
    vec![
        Transformed { name: "50 %", bytes: png(&image.resize_exact(w / 2, h / 2, FilterType::Lanczos3)) },
        Transformed { name: "jpeg q60", bytes: jpeg },
        Transformed { name: "centre 90 %", bytes: png(&image.crop_imm((w - cw) / 2, (h - ch) / 2, cw, ch)) },
        Transformed { name: "-10 % right", bytes: png(&image.crop_imm(0, 0, cw, h)) },
        Transformed { name: "-10 % bottom", bytes: png(&image.crop_imm(0, 0, w, ch)) },
    ]
}

#[test]
fn a_transformed_copy_is_closest_to_its_original() {
    let Some(model) = common::model() else { return };
    let originals: Vec<(&str, Vec<f32>)> = SAMPLES.iter().map(|&name| (name, unit(&model, &sample(name)))).collect();

    eprintln!("cosine between the originals:");
    for (i, (a, va)) in originals.iter().enumerate() {
        for (b, vb) in &originals[i + 1..] {
            let similarity = cosine(va, vb);
            eprintln!("  {a:>9} – {b:<9} {similarity:.3}");
            assert!(similarity < DUPLICATE_THRESHOLD, "{a} and {b} are different photos: {similarity}");
        }
    }
    eprintln!("cosine of each copy with its original (* below {DUPLICATE_THRESHOLD}), and with the closest other:");
    let mut failures: Vec<String> = Vec::new();
    for (name, original) in &originals {
        for copy in copies(&sample(name)) {
            let vector = unit(&model, &copy.bytes);
            let own = cosine(&vector, original);
            let (other, best_other) = originals
                .iter()
                .filter(|(o, _)| o != name)
                .map(|(o, v)| (*o, cosine(&vector, v)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .unwrap();
            let missed = if own < DUPLICATE_THRESHOLD { '*' } else { ' ' };
            eprintln!("  {name:>9} {:<12} own {own:.3}{missed}  best other {best_other:.3} ({other})", copy.name);
            if own <= best_other {
                failures.push(format!("{name} {}: own {own}, {other} {best_other}", copy.name));
            }
        }
    }
    assert!(failures.is_empty(), "copies closer to another photo than to their original: {failures:?}");
}
