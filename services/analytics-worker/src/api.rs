//! `GET /v1/stats`: counters, and per span a histogram (count, sum, extremes, cumulative
//! buckets) with p50/p95/p99 estimates, as JSON; and the same for the last hour, by minute
//! (`lastHour`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use imagepipe_contracts::EventType;
use imagepipe_runtime::http::{ApiError, Scope, require};
use serde::{Deserialize, Serialize};

use crate::histogram::{BUCKETS_MS, Histogram};
use crate::store::{Stats, StatsStore};
use crate::update::{Span, TaskOutcome};
use crate::window::{Minute, WINDOW_MINUTES, WINDOW_MS, Window};

/// Most failure codes `lastHour.failureReasons` lists.
pub const MAX_FAILURE_REASONS: usize = 10;

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
    /// The last hour.
    pub last_hour: LastHourView,
}

/// The last hour: the minute the answer was made in and the 59 before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LastHourView {
    /// The window's length, s (3600).
    pub window_seconds: u64,
    /// Tasks finished in the window, by outcome.
    pub tasks: TaskCountsView,
    /// Tasks finished in the window (every outcome) per second of `windowSeconds`.
    pub tasks_per_second: f64,
    /// The window's minutes, oldest first; minutes without events count zeros.
    #[schemars(length(equal = 60))]
    pub per_minute: Vec<MinuteView>,
    /// Latency of every span (named as in the all-time `latencies`), measured by events of the
    /// window; spans not measured there have count 0.
    pub latencies: BTreeMap<String, SpanWindowView>,
    /// The error codes of the tasks failed in the window, most frequent first (equal counts by
    /// code), at most 10. A minute counts 32 codes by name, further ones as `other`.
    #[schemars(length(max = 10))]
    pub failure_reasons: Vec<FailureReasonView>,
}

/// Finished tasks by outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskCountsView {
    /// Completed tasks.
    pub completed: u64,
    /// Failed tasks.
    pub failed: u64,
    /// Cancelled tasks.
    pub cancelled: u64,
}

/// Tasks finished in one minute, by outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MinuteView {
    /// The minute's start, Unix ms.
    pub at: u64,
    /// Completed tasks.
    pub completed: u64,
    /// Failed tasks.
    pub failed: u64,
    /// Cancelled tasks.
    pub cancelled: u64,
}

/// One span's latency in the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpanWindowView {
    /// Samples.
    pub count: u64,
    /// Estimated median, ms, never outside the smallest and largest sample; null without
    /// samples.
    #[schemars(schema_with = "present_or_null_ms")]
    pub p50_ms: Option<f64>,
    /// Estimated 95th percentile, ms, never outside the smallest and largest sample; null
    /// without samples.
    #[schemars(schema_with = "present_or_null_ms")]
    pub p95_ms: Option<f64>,
}

/// The schema of a milliseconds field always present, `null` when there is nothing to measure
/// (schemars leaves an `Option` field out of `required`; this one is always serialized).
fn present_or_null_ms(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    generator.subschema_for::<Option<f64>>()
}

/// How many tasks failed with an error code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailureReasonView {
    /// The error code (at most 64 bytes), or `other`.
    pub code: String,
    /// Tasks failed with it.
    pub count: u64,
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

impl TaskCountsView {
    fn new(minute: &Minute) -> Self {
        Self {
            completed: minute.finished(TaskOutcome::Completed),
            failed: minute.finished(TaskOutcome::Failed),
            cancelled: minute.finished(TaskOutcome::Cancelled),
        }
    }

    /// Tasks of every outcome.
    pub fn total(&self) -> u64 {
        self.completed.saturating_add(self.failed).saturating_add(self.cancelled)
    }
}

impl LastHourView {
    fn new(window: &Window) -> Self {
        let total = window.total();
        let tasks = TaskCountsView::new(&total);
        let empty = Minute::default();
        let per_minute = window
            .minute_starts()
            .map(|at| {
                let counts = TaskCountsView::new(window.minutes.get(&at).unwrap_or(&empty));
                MinuteView { at, completed: counts.completed, failed: counts.failed, cancelled: counts.cancelled }
            })
            .collect();
        let unmeasured = Histogram::new();
        let latencies = Span::ALL
            .into_iter()
            .map(|span| {
                let histogram = total.latencies.get(&span).unwrap_or(&unmeasured);
                let view = SpanWindowView {
                    count: histogram.count,
                    p50_ms: histogram.quantile(0.5),
                    p95_ms: histogram.quantile(0.95),
                };
                (span.as_str().to_owned(), view)
            })
            .collect();
        let mut failure_reasons: Vec<FailureReasonView> =
            total.failures.into_iter().map(|(code, count)| FailureReasonView { code, count }).collect();
        failure_reasons.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.code.cmp(&b.code)));
        failure_reasons.truncate(MAX_FAILURE_REASONS);
        let window_seconds = WINDOW_MS / 1000;
        Self {
            window_seconds,
            tasks,
            tasks_per_second: tasks.total() as f64 / window_seconds as f64,
            per_minute,
            latencies,
            failure_reasons,
        }
    }
}

const _: () = assert!(WINDOW_MINUTES == 60, "lastHour.perMinute is documented as 60 entries");

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
        Self {
            tasks,
            events,
            formats: stats.formats,
            bytes_downloaded: stats.bytes_downloaded,
            latencies,
            last_hour: LastHourView::new(&stats.last_hour),
        }
    }
}

/// The stats route over `store`.
pub fn routes(store: Arc<dyn StatsStore>) -> Router {
    Router::new().route("/v1/stats", require(Scope::Read, get(stats))).with_state(store)
}

async fn stats(State(store): State<Arc<dyn StatsStore>>) -> Result<Json<StatsResponse>, ApiError> {
    let stats = store.snapshot().await.map_err(|e| ApiError::unavailable(crate::error_chain(&e)))?;
    Ok(Json(StatsResponse::from(stats)))
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// The schema the coordinator's OpenAPI document publishes for the answer.
    fn schema() -> Value {
        serde_json::to_value(schemars::schema_for!(StatsResponse)).unwrap()
    }

    fn required(schema: &Value) -> Vec<&str> {
        let mut fields: Vec<&str> =
            schema["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        fields.sort_unstable();
        fields
    }

    #[test]
    fn the_last_hour_schema_requires_every_field_and_nulls_only_the_percentiles() {
        let schema = schema();
        let defs = &schema["$defs"];
        assert!(required(&schema).contains(&"lastHour"));
        let hour = &defs["LastHourView"];
        let fields = ["failureReasons", "latencies", "perMinute", "tasks", "tasksPerSecond", "windowSeconds"];
        assert_eq!(required(hour), fields);
        assert_eq!(hour["properties"]["perMinute"]["minItems"], 60);
        assert_eq!(hour["properties"]["perMinute"]["maxItems"], 60);
        assert_eq!(hour["properties"]["failureReasons"]["maxItems"], 10);
        assert_eq!(hour["properties"]["tasksPerSecond"]["type"], "number");
        assert_eq!(required(&defs["MinuteView"]), ["at", "cancelled", "completed", "failed"]);
        assert_eq!(required(&defs["TaskCountsView"]), ["cancelled", "completed", "failed"]);
        assert_eq!(required(&defs["FailureReasonView"]), ["code", "count"]);
        let span = &defs["SpanWindowView"];
        assert_eq!(required(span), ["count", "p50Ms", "p95Ms"]);
        assert_eq!(span["properties"]["p50Ms"]["type"], json!(["number", "null"]));
        assert_eq!(span["properties"]["count"]["type"], "integer");
        let text = schema.to_string();
        for link in ["[`", "](", "]["] {
            assert!(!text.contains(link), "no rustdoc link syntax in the published descriptions: {link}");
        }
    }
}
