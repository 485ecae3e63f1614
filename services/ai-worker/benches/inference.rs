//! AI milliseconds per image on this machine: model load time, then decode + preprocess +
//! inference + tagging per sample photo (median of repeated runs, one thread), and inference
//! alone. Run with `cargo bench -p imagepipe-ai-worker --bench inference`; it needs the prepared
//! model (`scripts/prepare-model.sh`; `IMAGEPIPE_TEST_MODEL_DIR` or `.imagepipe/models`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use imagepipe_ai_worker::preprocess::preprocess;
use imagepipe_ai_worker::{AnalysisOptions, Model, analyze};

const RUNS: usize = 30;

fn median(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    samples[samples.len() / 2].as_secs_f64() * 1000.0
}

fn main() {
    let dir = std::env::var_os("IMAGEPIPE_TEST_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.imagepipe/models"));
    let started = Instant::now();
    let model = match Model::load(&dir) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("inference bench: {e}");
            std::process::exit(1);
        }
    };
    println!("model {} loaded and optimised in {:.0} ms", model.name(), started.elapsed().as_secs_f64() * 1000.0);

    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("verification.json")).unwrap()).unwrap();
    let photo_dir = PathBuf::from(report["photo_dir"].as_str().unwrap());
    let settings = AnalysisOptions { top_k: 5, tag_min_score: 0.05, max_pixels: 100_000_000 };
    let mut all = Vec::new();
    for name in ["chelsea", "coffee", "rocket", "astronaut"] {
        let bytes = std::fs::read(photo_dir.join(report["photos"][name]["file"].as_str().unwrap())).unwrap();
        let analysis = analyze(&model, &settings, &bytes).unwrap();
        let (mut total, mut inference) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            let t = Instant::now();
            std::hint::black_box(analyze(&model, &settings, &bytes).unwrap());
            total.push(t.elapsed());
            let input = preprocess(&bytes, settings.max_pixels).unwrap();
            let t = Instant::now();
            std::hint::black_box(model.probabilities(input).unwrap());
            inference.push(t.elapsed());
        }
        all.extend(total.iter().copied());
        let top: Vec<String> =
            analysis.predictions[..3].iter().map(|p| format!("{} {:.2}", p.label, p.score)).collect();
        println!(
            "{name:>10}: {:6.1} ms per image (decode+preprocess+inference+tags), {:6.1} ms inference alone; top 3: {}",
            median(total),
            median(inference),
            top.join(", ")
        );
    }
    println!("AI ms per image (median over {} runs, 4 photos, one thread): {:.1} ms", all.len(), median(all));
}
