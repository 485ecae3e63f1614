//! The prepared model and pipeline settings for tests.
//!
//! The model directory comes from `IMAGEPIPE_TEST_MODEL_DIR` (scripts/test.sh prepares it and
//! sets it), else the repository's `.imagepipe/models` when prepared there. Without either, a
//! test fails with the reason, or with `IMAGEPIPE_TEST_ALLOW_SKIP=1` is skipped
//! (`imagepipe_contracts::testing`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use imagepipe_runtime::Settings;
use tempfile::TempDir;

/// The environment variable naming the prepared model directory.
pub const MODEL_DIR_ENV: &str = "IMAGEPIPE_TEST_MODEL_DIR";

/// The prepared model directory; without one the test fails, or gets `None` (and skips) when
/// `IMAGEPIPE_TEST_ALLOW_SKIP=1`.
pub fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os(MODEL_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.imagepipe/models"));
    if imagepipe::model::is_prepared(&dir) {
        return Some(dir);
    }
    imagepipe_contracts::testing::environment_missing(&format!(
        "no prepared model in {} (run scripts/prepare-model.sh, or set {MODEL_DIR_ENV} to a prepared directory)",
        dir.display()
    ));
    None
}

/// Settings of a pipeline on the memory bus with its store and blobs in `work`, the API on a
/// free loopback port, and loopback reachable by the download client.
pub fn settings(model_dir: &Path, work: &TempDir) -> Settings {
    let mut settings = Settings::default();
    settings.ai.model_dir = model_dir.to_owned();
    settings.ai.threads = 2;
    settings.store.path = work.path().join("store");
    settings.blob.dir = work.path().join("blobs");
    settings.http.bind = std::net::Ipv4Addr::LOCALHOST.into();
    settings.http.port = 0;
    settings.net.allow_cidrs = vec!["127.0.0.1/32".into()];
    settings.worker.concurrency = 4;
    settings
}

/// The test NATS server (`IMAGEPIPE_TEST_NATS_URL`, else the local one scripts/nats.sh starts).
pub fn nats_url() -> String {
    std::env::var("IMAGEPIPE_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// Points `settings` at the test NATS server with the store in the test Redis
/// (`IMAGEPIPE_TEST_REDIS_URL`, else the local one scripts/redis.sh starts).
pub fn on_nats_and_redis(settings: &mut Settings) {
    settings.bus.kind = imagepipe_bus::BusKind::Nats;
    settings.bus.nats.url = nats_url();
    settings.store.kind = imagepipe_runtime::config::StoreKind::Redis;
    settings.store.redis.url = imagepipe_runtime::config::SecretUrl::new(
        std::env::var("IMAGEPIPE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into()),
    );
}

/// Deletes the JetStream streams of a test's bus prefix `prefix`.
pub async fn delete_nats_streams(prefix: &str) {
    let js = async_nats::jetstream::new(async_nats::connect(nats_url()).await.unwrap());
    for suffix in ["TASKS", "EVENTS", "DLQ"] {
        let _ = js.delete_stream(format!("{}_{suffix}", prefix.to_uppercase())).await;
    }
}
