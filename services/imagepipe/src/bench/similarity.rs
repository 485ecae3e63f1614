//! `imagepipe bench --scenario similarity`: the similarity index at scale. Query latency, memory
//! per image and insert cost of the vector index (exact scan and HNSW graph) on synthetic
//! 1280-d embeddings ([`imagepipe_similarity::bench::scale`]), and a rebuild of the similarity
//! indexer from the event stream: `image.metadata_extracted` and `image.analyzed` events of
//! synthetic images published on the in-process bus, then read back through a rebuild group into
//! the embedded store, as `POST /v1/similarity/rebuild` does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use imagepipe_bus::{Bus, BusConfig, Message};
use imagepipe_contracts::payload::{ImageAnalyzed, ImageMetadataExtracted};
use imagepipe_contracts::step::{AnalysisOutput, MetadataOutput};
use imagepipe_contracts::{Embedding, Event, TraceId};
use imagepipe_runtime::clock::{Clock, SystemClock};
use imagepipe_runtime::config::SimilarityConfig;
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::{Settings, Shutdown};
use imagepipe_similarity::bench::DIM;
use imagepipe_similarity_indexer::{EmbeddedStore, GROUP, LiveIndex, SimilarityStore, rebuild};
use serde::Serialize;

/// The figures of a rebuild from the event stream.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RebuildFigures {
    /// Images whose two events were replayed.
    pub images: usize,
    /// Events read.
    pub events: u64,
    /// Time from the start of the rebuild to the end of the stream (the rebuild ends once no
    /// event came for [`rebuild::IDLE_END`], which is not counted).
    pub duration: Duration,
    /// Images the rebuilt index holds.
    pub indexed: usize,
    /// Bytes its vectors take.
    pub vector_bytes: usize,
}

impl std::fmt::Display for RebuildFigures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.duration.as_secs_f64();
        write!(
            f,
            "rebuild from the event stream: {} images ({} events) in {secs:.1} s ({:.0} images/s), {} indexed, {:.1} MB of vectors",
            self.images,
            self.events,
            self.images as f64 / secs.max(1e-9),
            self.indexed,
            self.vector_bytes as f64 / 1e6
        )
    }
}

/// A deterministic unit-ish embedding for image `i`: a cluster direction (one of 64) plus noise,
/// non-negative like the model's pooled features.
fn features(i: usize) -> Vec<f32> {
    let mut state = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let cluster = i % 64;
    (0..DIM).map(|d| if d % 64 == cluster { 1.0 + next() } else { 0.3 * next() }).collect()
}

/// Publishes the two events of `images` synthetic images on a fresh in-process bus, then
/// rebuilds an embedded similarity store in `dir` from them and times it.
pub async fn rebuild_from_stream(
    images: usize,
    config: SimilarityConfig,
    dir: &std::path::Path,
) -> anyhow::Result<RebuildFigures> {
    let mut bus_config = BusConfig::default();
    bus_config.memory.retention = bus_config.memory.retention.max(2 * images + 1);
    bus_config.memory.capacity = bus_config.memory.capacity.max(2 * images + 1);
    let bus = Bus::connect(&bus_config).await?;
    let start = SystemClock.unix_ms();
    for i in 0..images {
        let task_id = format!("tsk_bench_{i:07}");
        let at = start + i as u64;
        let metadata: MetadataOutput = serde_json::from_value(serde_json::json!({
            "format": "jpeg", "width": 640, "height": 480, "colorType": "rgb8", "bitDepth": 8, "hasAlpha": false,
            "frameCount": 1, "hasIccProfile": false, "dominantColors": [], "meanBrightness": 0.5,
            "phash": format!("{:016x}", (i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d)),
            "blurhash": "LEHV6nWB2yk8", "thumbnailKey": format!("sha256:{i:064x}")
        }))?;
        let extracted = ImageMetadataExtracted { blob_key: "sha256:00".into(), metadata, labels: Default::default() };
        publish(&bus, Event::for_task(&task_id, 1, TraceId::random(), at, "metadata-worker", extracted)).await?;
        let embedding = Embedding::from_features("bench/pool-1280", &features(i))?;
        let analysis =
            AnalysisOutput { model: "bench".into(), predictions: vec![], tags: vec![], embedding: Some(embedding) };
        let analyzed = ImageAnalyzed { blob_key: "sha256:00".into(), analysis, labels: Default::default() };
        publish(&bus, Event::for_task(&task_id, 1, TraceId::random(), at, "ai-worker", analyzed)).await?;
    }
    let db = EmbeddedDb::open_group(dir, GROUP)?;
    let store: Arc<dyn SimilarityStore> = Arc::new(EmbeddedStore::open(db).await?);
    let live = Arc::new(LiveIndex::new(config));
    let started = Instant::now();
    let mut events = 0;
    rebuild::run(&bus, store.clone(), live.clone(), "bench-rebuild", &Shutdown::new(), |read, _| events = read)
        .await
        .map_err(|e| anyhow::anyhow!("the rebuild failed: {e}"))?;
    let duration = started.elapsed().saturating_sub(rebuild::IDLE_END);
    live.sync(store.as_ref()).await?;
    let size = live.size();
    Ok(RebuildFigures { images, events, duration, indexed: size.vectors, vector_bytes: size.vector_bytes })
}

async fn publish<P: Serialize>(bus: &Bus, event: Event<P>) -> anyhow::Result<()> {
    let message = Message::new(event.to_json()).with_id(event.event_id.to_string());
    bus.events.publish(event.event_type.as_str(), message).await?;
    Ok(())
}

/// The whole scenario: the index at `images` with `queries` queries (exact up to
/// `similarity.exact_limit` of `settings`, the graph beyond), then a rebuild of
/// `rebuild_images` from the stream.
pub async fn run(
    settings: &Settings,
    images: usize,
    queries: usize,
    rebuild_images: usize,
) -> anyhow::Result<(imagepipe_similarity::bench::ScaleReport, RebuildFigures)> {
    let exact_limit = settings.similarity.exact_limit;
    let scale =
        tokio::task::spawn_blocking(move || imagepipe_similarity::bench::scale(images, queries, exact_limit)).await?;
    let work = tempfile::tempdir()?;
    let rebuilt = rebuild_from_stream(rebuild_images, settings.similarity.clone(), work.path()).await?;
    Ok((scale, rebuilt))
}
