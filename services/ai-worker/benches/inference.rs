//! AI milliseconds per image on this machine, one thread, side by side in one run:
//!
//! - inference alone on the numpy reference's exact inputs (`verification/<photo>.input.f32`):
//!   tract and onnxruntime through our [`Model`], and onnxruntime from Python (the preparation's
//!   venv, `onnxruntime.InferenceSession` with one intra-op thread, the same `model.onnx`), in
//!   interleaved rounds so that a noisy neighbour slows all three alike; medians and ratios;
//! - decode + preprocess + inference + tagging per sample photo, with each runtime.
//!
//! Run with `cargo bench -p imagepipe-ai-worker --bench inference`; it needs the prepared model
//! (`scripts/prepare-model.sh`; `IMAGEPIPE_TEST_MODEL_DIR` or `.imagepipe/models`) and the
//! preparation's Python (`IMAGEPIPE_BENCH_PYTHON`, else
//! `${IMAGEPIPE_CACHE_DIR:-~/.cache/imagepipe}/venv-prepare/bin/python`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use imagepipe_ai_worker::preprocess::INPUT_SIZE;
use imagepipe_ai_worker::{AiRuntime, AnalysisOptions, Model, RuntimeOptions, analyze};
use tract_onnx::prelude::tract_ndarray::Array4;

const PHOTOS: [&str; 4] = ["chelsea", "coffee", "rocket", "astronaut"];
/// Rounds of (tract, onnxruntime, Python onnxruntime), interleaved.
const ROUNDS: usize = 5;
/// Inferences per photo and round for onnxruntime (Rust and Python).
const ORT_RUNS: usize = 20;
/// Inferences per photo and round for tract (4-5 times slower).
const TRACT_RUNS: usize = 5;
/// Inferences per photo before timing, in each process.
const WARMUP: usize = 3;
/// Whole analyses per photo and runtime.
const ANALYSES: usize = 10;

/// Times `onnxruntime.InferenceSession.run` on each input file: one intra-op thread,
/// sequential, every graph optimisation, as our sessions. Prints
/// `{"version": ..., "seconds": {file: [..]}}`.
const PYTHON: &str = r#"
import json, sys, time
import numpy as np
import onnxruntime as ort
model, runs, warmup, *inputs = sys.argv[1:]
options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
seconds = {}
for path in inputs:
    x = np.fromfile(path, dtype="<f4").reshape(1, 3, 224, 224)
    for _ in range(int(warmup)):
        session.run(None, {"input": x})
    samples = []
    for _ in range(int(runs)):
        started = time.perf_counter()
        session.run(None, {"input": x})
        samples.append(time.perf_counter() - started)
    seconds[path] = samples
print(json.dumps({"version": ort.__version__, "seconds": seconds}))
"#;

fn median_ms(samples: &[Duration]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2].as_secs_f64() * 1000.0
}

fn fail(message: String) -> ! {
    eprintln!("inference bench: {message}");
    std::process::exit(1);
}

fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("IMAGEPIPE_BENCH_PYTHON") {
        return python.into();
    }
    let cache = std::env::var_os("IMAGEPIPE_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| fail("HOME is not set".into())))
            .join(".cache/imagepipe")
    });
    cache.join("venv-prepare/bin/python")
}

fn load(dir: &Path, runtime: AiRuntime) -> (Model, f64) {
    let started = Instant::now();
    let model = Model::load_with(dir, &RuntimeOptions { runtime, ..RuntimeOptions::default() })
        .unwrap_or_else(|e| fail(format!("{runtime}: {e}")));
    (model, started.elapsed().as_secs_f64() * 1000.0)
}

fn read_input(path: &Path) -> Array4<f32> {
    let raw = std::fs::read(path).unwrap_or_else(|e| fail(format!("{}: {e}", path.display())));
    let values = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let size = INPUT_SIZE as usize;
    Array4::from_shape_vec((1, 3, size, size), values).unwrap_or_else(|e| fail(format!("{}: {e}", path.display())))
}

/// Inference alone, `runs` times after a warm-up; the input's copy is made outside the timing.
fn time_inference(model: &Model, input: &Array4<f32>, runs: usize, samples: &mut Vec<Duration>) {
    for i in 0..WARMUP + runs {
        let input = input.clone();
        let started = Instant::now();
        std::hint::black_box(model.probabilities(input).unwrap());
        if i >= WARMUP {
            samples.push(started.elapsed());
        }
    }
}

/// One Python process timing `ORT_RUNS` inferences per input; its onnxruntime version.
fn time_python(python: &Path, model_file: &Path, inputs: &[PathBuf], samples: &mut Vec<Duration>) -> String {
    let output = Command::new(python)
        .arg("-c")
        .arg(PYTHON)
        .arg(model_file)
        .arg(ORT_RUNS.to_string())
        .arg(WARMUP.to_string())
        .args(inputs)
        .output()
        .unwrap_or_else(|e| fail(format!("running {}: {e} (run scripts/prepare-model.sh)", python.display())));
    if !output.status.success() {
        fail(format!("{} failed: {}", python.display(), String::from_utf8_lossy(&output.stderr)));
    }
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| fail(format!("python's report: {e}: {}", String::from_utf8_lossy(&output.stdout))));
    for per_input in report["seconds"].as_object().unwrap().values() {
        samples.extend(per_input.as_array().unwrap().iter().map(|s| Duration::from_secs_f64(s.as_f64().unwrap())));
    }
    report["version"].as_str().unwrap_or("?").to_owned()
}

fn main() {
    let dir = std::env::var_os("IMAGEPIPE_TEST_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.imagepipe/models"));
    let report: serde_json::Value = std::fs::read(dir.join("verification.json"))
        .ok()
        .and_then(|text| serde_json::from_slice(&text).ok())
        .unwrap_or_else(|| fail(format!("no verification.json in {} (run scripts/prepare-model.sh)", dir.display())));
    let python = python();

    let (ort, ort_load) = load(&dir, AiRuntime::Onnxruntime);
    let (tract, tract_load) = load(&dir, AiRuntime::Tract);
    println!("model {}: loaded in {ort_load:.0} ms by onnxruntime, {tract_load:.0} ms by tract", ort.name());

    let input_files: Vec<PathBuf> = PHOTOS
        .iter()
        .map(|photo| {
            dir.join(report["photos"][photo]["input"]["file"].as_str().unwrap_or_else(|| {
                fail(format!("verification.json has no input for {photo} (re-run scripts/prepare-model.sh)"))
            }))
        })
        .collect();
    let inputs: Vec<Array4<f32>> = input_files.iter().map(|f| read_input(f)).collect();

    let (mut tract_ms, mut ort_ms, mut python_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut python_version = String::new();
    for _ in 0..ROUNDS {
        for input in &inputs {
            time_inference(&tract, input, TRACT_RUNS, &mut tract_ms);
            time_inference(&ort, input, ORT_RUNS, &mut ort_ms);
        }
        python_version = time_python(&python, &dir.join("model.onnx"), &input_files, &mut python_ms);
    }
    let (tract_median, ort_median, python_median) = (median_ms(&tract_ms), median_ms(&ort_ms), median_ms(&python_ms));
    println!("inference alone, one thread, the reference's 4 inputs, {ROUNDS} interleaved rounds (median of n runs):");
    println!("  tract, our Model                      {tract_median:6.2} ms  (n = {})", tract_ms.len());
    println!("  onnxruntime, our Model (ort crate)    {ort_median:6.2} ms  (n = {})", ort_ms.len());
    println!(
        "  onnxruntime {python_version}, Python InferenceSession {python_median:6.2} ms  (n = {})",
        python_ms.len()
    );
    println!(
        "  ratios: ours/Python onnxruntime {:.2}x; tract/Python onnxruntime {:.2}x; tract/ours onnxruntime {:.2}x",
        ort_median / python_median,
        tract_median / python_median,
        tract_median / ort_median
    );

    let photo_dir = PathBuf::from(report["photo_dir"].as_str().unwrap());
    let settings = AnalysisOptions { top_k: 5, tag_min_score: 0.05, max_pixels: 100_000_000 };
    println!("decode + preprocess + inference + tags per photo, one thread (median of {ANALYSES}):");
    for (label, model) in [("onnxruntime", &ort), ("tract", &tract)] {
        let mut all = Vec::new();
        for photo in PHOTOS {
            let bytes = std::fs::read(photo_dir.join(report["photos"][photo]["file"].as_str().unwrap())).unwrap();
            let analysis = analyze(model, &settings, &bytes).unwrap();
            let mut samples = Vec::new();
            for _ in 0..ANALYSES {
                let started = Instant::now();
                std::hint::black_box(analyze(model, &settings, &bytes).unwrap());
                samples.push(started.elapsed());
            }
            let top: Vec<String> =
                analysis.predictions[..3].iter().map(|p| format!("{} {:.2}", p.label, p.score)).collect();
            println!("  {label:>11} {photo:>10}: {:6.1} ms; top 3: {}", median_ms(&samples), top.join(", "));
            all.extend(samples);
        }
        println!("  {label:>11} AI ms per image (4 photos): {:.1} ms", median_ms(&all));
    }
}
