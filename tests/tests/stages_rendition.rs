//! The example stage in Rust (`examples/stages/rendition`) end to end over NATS: a cluster whose
//! config file runs the pipeline download → metadata → analyze → rendition, the stage's binary
//! beside it as a process of its own with the cluster's environment, and the astronaut sample
//! submitted by publishing plain JSON: the task completes with `outputs.rendition`, whose blob,
//! fetched from the coordinator, is a JPEG scaled to the stage's `--max-side` with its aspect
//! kept, that matches a plain resize of the preview above its watermark band and differs from
//! it in the band.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use image::RgbImage;
use image::imageops::FilterType;
use imagepipe_e2e::backend::{Backend, Cleanup};
use imagepipe_e2e::cluster::{self, Cluster, ClusterConfig, ServiceKind};
use imagepipe_e2e::fixtures::sample_path;
use imagepipe_net::testing::{FixtureServer, Route};
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// The stage's binary.
const BINARY: &str = "imagepipe-stage-rendition";

/// The longest side the stage is asked for (the astronaut is 512 × 512, its preview too).
const MAX_SIDE: u32 = 320;

/// The config file of every process: the built-in pipeline and the rendition stage after it.
const PIPELINE: &str = r#"
[[pipeline.stages]]
name = "download"

[[pipeline.stages]]
name = "metadata"

[[pipeline.stages]]
name = "analyze"

[[pipeline.stages]]
name = "rendition"
deadline = "60s"
attempts = 3
"#;

/// The stage's worker as a child process of the test, killed when dropped; its log is printed
/// when the test fails.
struct StageWorker {
    child: Option<Child>,
    log: std::path::PathBuf,
}

impl StageWorker {
    /// Starts the stage's binary with `cluster`'s environment and `args`, its HTTP on a port of
    /// its own, and waits until it is ready.
    async fn start(cluster: &Cluster, dir: &Path, args: &[&str]) -> Self {
        let binary = cluster::bin_dir().join(BINARY);
        assert!(binary.is_file(), "{} missing: `cargo build --workspace --bins` first", binary.display());
        let port = cluster::free_port().expect("a free port");
        let log = dir.join(format!("{BINARY}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = Command::new(binary)
            .args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(cluster.service_env(port))
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .expect("spawning the stage's worker");
        let mut worker = Self { child: Some(child), log };
        let ready = format!("http://127.0.0.1:{port}/readyz");
        let http = reqwest::Client::new();
        let until = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = worker.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("{BINARY} exited with {status}:\n{}", worker.log_text());
            }
            if http.get(&ready).send().await.is_ok_and(|r| r.status().is_success()) {
                return worker;
            }
            assert!(tokio::time::Instant::now() < until, "{BINARY} not ready within 60 s:\n{}", worker.log_text());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it with SIGTERM; its exit status within `grace`.
    async fn stop(mut self, grace: Duration) -> Result<std::process::ExitStatus, String> {
        let mut child = self.child.take().expect("running");
        let pid = child.id().expect("running") as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM)
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(grace, child.wait()).await {
            Ok(status) => status.map_err(|e| e.to_string()),
            Err(_) => Err(format!("still running {grace:?} after SIGTERM")),
        }
    }
}

impl Drop for StageWorker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- {BINARY} ---\n{}", self.log_text());
        }
    }
}

/// GET `url`: the body, or why there is none.
async fn get_bytes(http: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let response = http.get(url).send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    if status.is_success() { Ok(body.to_vec()) } else { Err(format!("{status}: {}", String::from_utf8_lossy(&body))) }
}

/// Mean absolute difference per channel of `a` and `b` over rows `rows`.
fn mean_difference(a: &RgbImage, b: &RgbImage, rows: std::ops::Range<u32>) -> f64 {
    let (mut sum, mut n) = (0u64, 0u64);
    for y in rows {
        for x in 0..a.width() {
            for (p, q) in a.get_pixel(x, y).0.iter().zip(b.get_pixel(x, y).0) {
                sum += u64::from(p.abs_diff(q));
                n += 1;
            }
        }
    }
    sum as f64 / n.max(1) as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rendition_stage_stores_a_watermarked_rendition_of_the_astronaut_under_outputs_rendition() {
    let Some(model_dir) = cluster::model_dir() else { return };
    let backend = Backend::nats();
    let dir = tempfile::tempdir().expect("temp dir");
    let config_file = dir.path().join("rendition.toml");
    std::fs::write(&config_file, PIPELINE).expect("config file");
    let config = ClusterConfig::new(backend.clone(), "rendition")
        .services(&[ServiceKind::Coordinator, ServiceKind::Download, ServiceKind::Metadata, ServiceKind::Ai])
        .env(imagepipe_runtime::config::CONFIG_PATH_ENV, config_file.display().to_string())
        .env("IMAGEPIPE_AI__MODEL_DIR", model_dir.display().to_string())
        .env("IMAGEPIPE_AI__THREADS", "1");
    let _cleanup = Cleanup::new(&backend, &config.prefix);
    let cluster = Cluster::start(config).await.expect("cluster");
    let max_side = MAX_SIDE.to_string();
    let worker = StageWorker::start(&cluster, dir.path(), &["--max-side", &max_side, "--text", "imagepipe"]).await;

    let astronaut = std::fs::read(sample_path("astronaut.jpg")).expect("the astronaut sample");
    let photos = FixtureServer::start([("/photos/astronaut.jpg", Route::ok("image/jpeg", astronaut))])
        .await
        .expect("fixture server");
    let id = format!("tsk_{}_astronaut", cluster.prefix());
    let submit =
        json!({ "taskId": id, "url": photos.url("/photos/astronaut.jpg"), "labels": { "sample": "astronaut" } });
    backend
        .submitter(cluster.prefix())
        .await
        .expect("submitter")
        .publish_all(vec![serde_json::to_vec(&submit).expect("JSON")])
        .await
        .expect("publish the submit");

    let path = format!("/v1/tasks/{id}");
    let until = tokio::time::Instant::now() + Duration::from_secs(240);
    let task = loop {
        let task = cluster.get_json(ServiceKind::Coordinator, &path).await.unwrap_or(Value::Null);
        if matches!(task["state"].as_str(), Some("completed" | "failed" | "cancelled")) {
            break task;
        }
        assert!(tokio::time::Instant::now() < until, "{id} not finished within 240 s: {task}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(task["state"], "completed", "{task}");

    let outputs = &task["outputs"];
    let rendition = &outputs["rendition"];
    let preview = outputs["metadata"]["previewKey"].as_str().unwrap_or_else(|| panic!("a preview: {outputs}"));
    assert_eq!(rendition["source"], preview, "made from the preview: {rendition}");
    assert_eq!(rendition["format"], "jpeg", "{rendition}");
    let key = rendition["key"].as_str().unwrap_or_else(|| panic!("a key: {rendition}"));
    assert!(key.starts_with("sha256:") && key.len() == 7 + 64, "{key}");

    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("HTTP client");
    let api = cluster.url(ServiceKind::Coordinator);
    let stored = get_bytes(&http, &format!("{api}/v1/blobs/{key}")).await.expect("GET the rendition");
    assert_eq!(rendition["bytes"].as_u64(), Some(stored.len() as u64), "{rendition}");
    assert_eq!(image::guess_format(&stored).ok(), Some(image::ImageFormat::Jpeg));
    let marked = image::load_from_memory(&stored).expect("the rendition decodes").into_rgb8();
    let (width, height) = marked.dimensions();
    assert_eq!((rendition["width"].as_u64(), rendition["height"].as_u64()), (Some(width.into()), Some(height.into())));

    let source = get_bytes(&http, &format!("{api}/v1/blobs/{preview}")).await.expect("GET the preview");
    let source = image::load_from_memory(&source).expect("the preview decodes").into_rgb8();
    let (source_width, source_height) = source.dimensions();
    assert!(source_width.max(source_height) > MAX_SIDE, "the preview is scaled down: {source_width}×{source_height}");
    assert_eq!(width.max(height), MAX_SIDE, "the longest side is --max-side");
    let aspect = |w: u32, h: u32| f64::from(w) / f64::from(h);
    assert!(
        (aspect(width, height) - aspect(source_width, source_height)).abs() < 0.01,
        "aspect kept: {width}×{height} of {source_width}×{source_height}"
    );

    // The plain resize, with the stage's filter (bilinear); the watermark band is the lowest
    // eighth of the rendition, at least 12 rows (examples/stages/rendition/README.md).
    let plain = image::imageops::resize(&source, width, height, FilterType::Triangle);
    let band_top = height - (height / 8).max(12);
    let above = mean_difference(&plain, &marked, 0..band_top - 16);
    let in_band = mean_difference(&plain, &marked, band_top..height);
    eprintln!(
        "rendition {width}×{height}: mean difference from a plain resize {above:.2} above the band, {in_band:.2} in it"
    );
    assert!(above < 4.0, "above the band, a plain resize within JPEG's loss: {above:.2}");
    assert!(in_band > 25.0, "the watermark band differs from a plain resize: {in_band:.2} (above it: {above:.2})");

    let status = worker.stop(Duration::from_secs(30)).await.expect("the stage's worker stops on SIGTERM");
    assert!(status.success(), "{BINARY} exited with {status}");
    let failures = cluster.stop(Duration::from_secs(40)).await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
}
