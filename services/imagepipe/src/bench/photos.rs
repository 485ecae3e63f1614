//! `imagepipe bench --mode real --photos DIR`: what each stage costs per real photo.
//!
//! Besides the pipeline run on the photos (images/s at full load, by the parent), each stage is
//! measured on its own in a child process of its own (`--probe metadata|ai`), so its peak
//! resident memory is the stage's alone: every photo, [`ROUNDS`] times after one round not
//! counted (a worker runs warm), one at a time, the process's CPU time per image (p50/p95; a
//! probe runs nothing else, and libheif decodes on threads of its own). The metadata probe writes the preview of
//! each photo (the derivative the AI worker reads) for the AI probe.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use imagepipe_ai_worker::{AnalysisOptions, Classifier};
use imagepipe_blob::{Sniffed, sniff};
use imagepipe_runtime::Settings;
use serde::{Deserialize, Serialize};

use super::process::{self, MemoryField, Pid};
use super::stats::Percentiles;

/// Times each photo goes through a stage in a probe.
pub const ROUNDS: usize = 3;

/// A stage measured by a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Decode, EXIF, colours, hashes, every derivative (`metadata.thumbnails`).
    Metadata,
    /// The preview decoded and preprocessed, the model run, tags.
    Ai,
}

/// What a probe measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageFigures {
    /// The stage.
    pub stage: Stage,
    /// Photos (each measured [`ROUNDS`] times).
    pub images: usize,
    /// CPU time of the stage per image, every thread of the probe process.
    pub cpu_ms: Percentiles,
    /// Of it, the model alone (AI stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_ms: Option<Percentiles>,
    /// `VmHWM` of the probe process: the stage (and, for AI, the loaded model) alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
}

/// The images of `dir` (files whose first bytes say they are an image), by file name.
pub fn load(dir: &Path) -> anyhow::Result<Vec<(String, Bytes)>> {
    let mut photos = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if !path.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        if matches!(sniff(&bytes), Sniffed::Image(_)) {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            photos.push((name, Bytes::from(bytes)));
        }
    }
    photos.sort_by(|a, b| a.0.cmp(&b.0));
    anyhow::ensure!(!photos.is_empty(), "{} holds no image files", dir.display());
    Ok(photos)
}

/// Runs the probe of `stage` in this process (the child side of [`measure`]): the metadata
/// stage writes each photo's preview into `previews`, the AI stage reads them from there.
pub async fn probe(stage: Stage, settings: &Settings, photos: &Path, previews: &Path) -> anyhow::Result<StageFigures> {
    let figures = match stage {
        Stage::Metadata => {
            let photos = load(photos)?;
            let (settings, previews) = (settings.metadata.clone(), previews.to_owned());
            tokio::task::spawn_blocking(move || probe_metadata(&photos, &settings, &previews)).await??
        }
        Stage::Ai => {
            let classifier = Classifier::load(&settings.ai).await.context("loading the model")?;
            let options = AnalysisOptions::from(&settings.ai);
            let previews = load(previews)?;
            tokio::task::spawn_blocking(move || probe_ai(&previews, &classifier, &options)).await??
        }
    };
    Ok(StageFigures { peak_rss_bytes: process::memory(Pid::Current, MemoryField::Peak), ..figures })
}

fn probe_metadata(
    photos: &[(String, Bytes)],
    settings: &imagepipe_runtime::config::MetadataConfig,
    previews: &Path,
) -> anyhow::Result<StageFigures> {
    std::fs::create_dir_all(previews).with_context(|| format!("creating {}", previews.display()))?;
    let mut cpu = Vec::with_capacity(ROUNDS * photos.len());
    // A round not counted first: a worker runs warm (its allocator holds the buffers' pages).
    for round in 0..=ROUNDS {
        for (name, bytes) in photos {
            let started = process_cpu();
            let extracted = imagepipe_metadata_worker::extract(bytes, settings)
                .map_err(|e| anyhow::anyhow!("{name}: {}", imagepipe_runtime::error_chain(&e)))?;
            if round > 0 {
                cpu.push(process_cpu().saturating_sub(started));
            } else {
                let m = &extracted.metadata;
                let index = m.thumbnails.iter().position(|t| Some(&t.key) == m.preview_key.as_ref());
                let preview = index.map_or_else(|| bytes.clone(), |i| extracted.derivatives[i].clone());
                std::fs::write(previews.join(name), &preview).context("writing a preview")?;
            }
        }
    }
    Ok(StageFigures {
        stage: Stage::Metadata,
        images: photos.len(),
        cpu_ms: Percentiles::of(&cpu),
        inference_ms: None,
        peak_rss_bytes: None,
    })
}

fn probe_ai(
    previews: &[(String, Bytes)],
    classifier: &Classifier,
    options: &AnalysisOptions,
) -> anyhow::Result<StageFigures> {
    let model = classifier.model();
    let (mut cpu, mut inference) = (Vec::new(), Vec::new());
    for round in 0..=ROUNDS {
        for (name, bytes) in previews {
            let started = process_cpu();
            let input = model.preprocess(bytes, options.max_pixels).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            let before_model = process_cpu();
            let probabilities = model.probabilities(input).map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            let model_time = process_cpu().saturating_sub(before_model);
            std::hint::black_box(model.taxonomy().analyze(&probabilities, options.top_k, options.tag_min_score));
            if round > 0 {
                inference.push(model_time);
                cpu.push(process_cpu().saturating_sub(started));
            }
        }
    }
    Ok(StageFigures {
        stage: Stage::Ai,
        images: previews.len(),
        cpu_ms: Percentiles::of(&cpu),
        inference_ms: Some(Percentiles::of(&inference)),
        peak_rss_bytes: None,
    })
}

/// Runs the metadata probe, then the AI probe, each as a child `imagepipe bench --probe` of
/// `exe` with the same configuration, and returns their figures.
pub async fn measure(
    exe: &Path,
    config_file: Option<&Path>,
    photos: &Path,
    work: &Path,
) -> anyhow::Result<Vec<StageFigures>> {
    let previews = work.join("previews");
    let mut figures = Vec::new();
    for stage in [Stage::Metadata, Stage::Ai] {
        let mut command = tokio::process::Command::new(exe);
        if let Some(file) = config_file {
            command.arg("--config").arg(file);
        }
        let name = match stage {
            Stage::Metadata => "metadata",
            Stage::Ai => "ai",
        };
        command
            .args(["bench", "--mode", "real", "--probe", name, "--photos"])
            .arg(photos)
            .arg("--previews")
            .arg(&previews)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit());
        let output = command.output().await.with_context(|| format!("starting the {name} probe"))?;
        anyhow::ensure!(output.status.success(), "the {name} probe failed ({})", output.status);
        figures.push(serde_json::from_slice(&output.stdout).with_context(|| format!("reading the {name} probe"))?);
    }
    Ok(figures)
}

/// CPU time of this process, every thread: libheif and libde265 decode on threads of their own,
/// and nothing else runs in a probe.
fn process_cpu() -> Duration {
    cpu_time::ProcessTime::now().as_duration()
}
