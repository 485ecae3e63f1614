//! `POST /v1/search/similar` with the prepared model over HTTP: a search finding every model slot
//! taken waits `similarity.model_wait`, then is answered `503 busy` with `Retry-After`; once a
//! slot is free it is answered.
//!
//! The model directory comes from `IMAGEPIPE_TEST_MODEL_DIR` (scripts/test.sh prepares it), else
//! the repository's `.imagepipe/models`; without either the test fails with the reason, or with
//! `IMAGEPIPE_TEST_ALLOW_SKIP=1` is skipped.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use imagepipe_ai_worker::Classifier;
use imagepipe_bus::{Bus, BusConfig};
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::http::{ApiRoutes, HealthServer, Readiness, UploadSlots, testing};
use imagepipe_runtime::{Settings, Shutdown};
use imagepipe_similarity_indexer::{EmbeddedStore, GROUP, LiveIndex, SimilarityStore, api, routes};

/// The prepared model directory, or `None` (reported) when there is none.
fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("IMAGEPIPE_TEST_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.imagepipe/models"));
    if dir.join("manifest.json").exists() {
        return Some(dir);
    }
    imagepipe_contracts::testing::environment_missing(&format!(
        "no prepared model in {} (run scripts/prepare-model.sh, or set IMAGEPIPE_TEST_MODEL_DIR)",
        dir.display()
    ));
    None
}

/// A sample photo the preparation verified the model on.
fn photo(dir: &Path) -> Vec<u8> {
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("verification.json")).unwrap()).unwrap();
    let file = report["photos"]["coffee"]["file"].as_str().expect("the coffee photo");
    let path = Path::new(report["photo_dir"].as_str().unwrap()).join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test]
async fn a_search_finding_every_model_slot_taken_is_answered_503_with_retry_after() {
    let Some(model_dir) = model_dir() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.store.path = dir.path().to_owned();
    settings.ai.model_dir = model_dir.clone();
    settings.ai.threads = 1;
    settings.similarity.model_wait = Duration::from_millis(200);
    let classifier = Classifier::load(&settings.ai).await.expect("the prepared model loads");

    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let db = EmbeddedDb::open_group(&settings.store.path, GROUP).unwrap();
    let store: Arc<dyn SimilarityStore> = Arc::new(EmbeddedStore::open(db).await.unwrap());
    let live = Arc::new(LiveIndex::new(settings.similarity.clone()));
    let shutdown = Shutdown::new();
    let api = api(&settings, bus, store, live, Some(classifier.clone()), shutdown.clone()).await.unwrap();
    // Served through the runtime's HTTP edge, as the service serves its routes.
    let edge = ApiRoutes::new(None);
    edge.add(routes(api, 8 << 20, UploadSlots::new(8, Duration::from_secs(2))));
    let server = HealthServer::new(Readiness::new(), imagepipe_runtime::metrics::install().unwrap()).api(edge);
    let bound = server.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = bound.local_addr();
    tokio::spawn(bound.serve(shutdown.clone()));
    let image = photo(&model_dir);

    // The only model slot is taken (by an analysis of the AI worker, say).
    let taken = classifier.slots().acquire().await;
    let started = tokio::time::Instant::now();
    let answer = testing::request_with_body(addr, "POST", "/v1/search/similar", None, &image).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert!(started.elapsed() >= Duration::from_millis(200), "it waited similarity.model_wait first");
    assert!(answer.head.contains("retry-after: 1"), "{}", answer.head);
    assert!(answer.body.contains("\"busy\"") && answer.body.contains("similarity.model_wait"), "{}", answer.body);

    // Free again: the search is answered.
    drop(taken);
    let answer = testing::request_with_body(addr, "POST", "/v1/search/similar", None, &image).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("\"results\""), "{}", answer.body);
    shutdown.trigger();
}
