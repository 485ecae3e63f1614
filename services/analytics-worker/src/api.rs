//! `GET /v1/stats`: counters, and per span a histogram (count, sum, extremes, cumulative
//! buckets) with p50/p95/p99 estimates, as JSON.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use imagepipe_contracts::EventType;
use imagepipe_runtime::http::ApiError;
use serde::{Deserialize, Serialize};

use crate::histogram::{BUCKETS_MS, Histogram};
use crate::store::{Stats, StatsStore};
use crate::update::{Span, TaskOutcome};

/// The answer of `GET /v1/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatsResponse {
    /// Finished tasks by outcome; every outcome is listed.
    pub tasks: BTreeMap<String, u64>,
    /// Events by type; every event type is listed.
    pub events: BTreeMap<String, u64>,
    /// Downloaded images by format.
    pub formats: BTreeMap<String, u64>,
    /// Bytes downloaded.
    pub bytes_downloaded: u64,
    /// Latency of every span; spans never measured have count 0.
    pub latencies: BTreeMap<String, LatencyView>,
}

/// One span's latency histogram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LatencyView {
    /// The event type the span starts at.
    pub from: String,
    /// The event type it ends at.
    pub to: String,
    /// Samples.
    pub count: u64,
    /// Sum of the samples, ms.
    pub sum_ms: u64,
    /// Mean, ms.
    pub mean_ms: Option<f64>,
    /// The smallest sample, ms.
    pub min_ms: Option<u64>,
    /// The largest sample, ms.
    pub max_ms: Option<u64>,
    /// Estimated median, ms, never outside the smallest and largest sample.
    pub p50_ms: Option<f64>,
    /// Estimated 95th percentile, ms, never outside the smallest and largest sample.
    pub p95_ms: Option<f64>,
    /// Estimated 99th percentile, ms, never outside the smallest and largest sample.
    pub p99_ms: Option<f64>,
    /// Cumulative buckets: samples `<= le_ms`, at each bucket that holds samples (the count
    /// stays the same between them); the last one (`le_ms` null) holds every sample.
    pub buckets: Vec<BucketView>,
}

/// Samples at or below a bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BucketView {
    /// The bound, ms; `None` for +Inf.
    pub le_ms: Option<u64>,
    /// Samples at or below it.
    pub count: u64,
}

impl LatencyView {
    fn new(span: Span, histogram: &Histogram) -> Self {
        let (from, to) = span.stages();
        let mut cumulative = 0;
        let overflow = BUCKETS_MS.len();
        let buckets = histogram
            .buckets
            .iter()
            .enumerate()
            .filter(|(index, count)| **count > 0 || *index == overflow)
            .map(|(index, count)| {
                cumulative += count;
                BucketView { le_ms: BUCKETS_MS.get(index).copied(), count: cumulative }
            })
            .collect();
        let measured = histogram.count > 0;
        Self {
            from: from.event_type().as_str().to_owned(),
            to: to.event_type().as_str().to_owned(),
            count: histogram.count,
            sum_ms: histogram.sum_ms,
            mean_ms: measured.then(|| histogram.sum_ms as f64 / histogram.count as f64),
            min_ms: measured.then_some(histogram.min_ms),
            max_ms: measured.then_some(histogram.max_ms),
            p50_ms: histogram.quantile(0.5),
            p95_ms: histogram.quantile(0.95),
            p99_ms: histogram.quantile(0.99),
            buckets,
        }
    }
}

impl From<Stats> for StatsResponse {
    fn from(stats: Stats) -> Self {
        let mut tasks = stats.tasks;
        for outcome in TaskOutcome::ALL {
            tasks.entry(outcome.as_str().to_owned()).or_default();
        }
        let mut events = stats.events;
        for event_type in EventType::ALL {
            events.entry(event_type.as_str().to_owned()).or_default();
        }
        let empty = Histogram::new();
        let latencies = Span::ALL
            .into_iter()
            .map(|span| {
                let histogram = stats.latencies.get(&span).unwrap_or(&empty);
                (span.as_str().to_owned(), LatencyView::new(span, histogram))
            })
            .collect();
        Self { tasks, events, formats: stats.formats, bytes_downloaded: stats.bytes_downloaded, latencies }
    }
}

/// The stats route over `store`.
pub fn routes(store: Arc<dyn StatsStore>) -> Router {
    Router::new().route("/v1/stats", get(stats)).with_state(store)
}

async fn stats(State(store): State<Arc<dyn StatsStore>>) -> Result<Json<StatsResponse>, ApiError> {
    let stats = store.snapshot().await.map_err(|e| ApiError::unavailable(crate::error_chain(&e)))?;
    Ok(Json(StatsResponse::from(stats)))
}
