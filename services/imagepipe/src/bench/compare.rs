//! `imagepipe bench --mode real --photos DIR --compare`: the same photos through Pillow's draft
//! decode (JPEG DCT scaling), the HEIC and AVIF photos through libheif's own `heif-convert` (to
//! JPEG; the reference for the phone formats, which Pillow does not read), and the same model
//! through onnxruntime, from the Python environment `scripts/prepare-model.sh` set up, in the
//! same run; their CPU time per image is set beside the stages' own ([`super::photos`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context;
use imagepipe_blob::{ImageFormat, Sniffed, sniff};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::photos::ROUNDS;
use super::stats::Percentiles;

/// The script that measures Pillow and onnxruntime.
const SCRIPT: &str = include_str!("compare.py");

/// What the Python side measured, one thread, CPU time per image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Comparison {
    /// Pillow's version.
    pub pillow: String,
    /// onnxruntime's version.
    pub onnxruntime: String,
    /// Pillow: draft decode to the largest derivative, it as JPEG, the smallest as WebP (the
    /// metadata stage's pixel work); `None` when no photo is a format Pillow reads by itself.
    pub pillow_draft_derivatives_ms: Option<Percentiles>,
    /// Pillow: draft decode to the smallest derivative and the thumbnail alone.
    pub pillow_draft_thumbnail_ms: Option<Percentiles>,
    /// libheif's version as `heif-convert` reports it; `None` when no photo is HEIC or AVIF, or
    /// `heif-convert` (Debian: libheif-examples) is not installed.
    #[serde(default)]
    pub libheif: Option<String>,
    /// `heif-convert -q 85` of each HEIC and AVIF photo to a JPEG, its decoders as it chooses
    /// them: the CPU time of the child process (decode at full size, colour conversion, JPEG
    /// encoding).
    #[serde(default)]
    pub heif_convert_ms: Option<Percentiles>,
    /// onnxruntime: the model, one intra-op thread.
    pub onnxruntime_inference_ms: Percentiles,
}

/// The Python of the model preparation's environment (`IMAGEPIPE_CACHE_DIR`, default
/// `~/.cache/imagepipe`), which has Pillow, numpy and onnxruntime.
pub fn python() -> PathBuf {
    let cache = std::env::var_os("IMAGEPIPE_CACHE_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache").join("imagepipe")
    });
    cache.join("venv-prepare").join("bin").join("python")
}

/// Runs the comparison on the JPEG, PNG and WebP files of `photos` (Pillow reads no HEIC or
/// AVIF by itself), on their HEIC and AVIF files (`heif-convert`, when installed) and on
/// `model_dir/model.onnx`, with the derivative sizes of the metadata stage: `preview` (the
/// largest) and `thumbnail` (the smallest).
pub async fn run(photos: &Path, model_dir: &Path, preview: u32, thumbnail: u32) -> anyhow::Result<Comparison> {
    let python = python();
    anyhow::ensure!(
        python.is_file(),
        "{} is missing: run scripts/prepare-model.sh once (it sets up Pillow and onnxruntime there)",
        python.display()
    );
    let (mut pillow, mut heif) = (Vec::new(), Vec::new());
    for (name, bytes) in super::photos::load(photos)? {
        match sniff(&bytes) {
            Sniffed::Image(ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::Webp) => pillow.push(name),
            Sniffed::Image(ImageFormat::Heic | ImageFormat::Avif) => heif.push(name),
            _ => {}
        }
    }
    let files = serde_json::json!({ "pillow": pillow, "heif": heif });
    let mut child = tokio::process::Command::new(&python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(photos)
        .arg(model_dir.join("model.onnx"))
        .arg(ROUNDS.to_string())
        .arg(preview.to_string())
        .arg(thumbnail.to_string())
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", python.display()))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin.write_all(&serde_json::to_vec(&files)?).await?;
    drop(stdin);
    let output = child.wait_with_output().await?;
    anyhow::ensure!(output.status.success(), "the comparison script failed ({})", output.status);
    serde_json::from_slice(&output.stdout).context("reading the comparison's figures")
}
