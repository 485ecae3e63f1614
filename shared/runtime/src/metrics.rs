//! Prometheus metrics: the names every service shares, and the process-wide recorder.
//!
//! Record with the `metrics` macros using these constants, e.g.
//! `metrics::counter!(MESSAGES_HANDLED, labels::SOURCE => queue, labels::OUTCOME => outcome::ACK)`.
//! Durations are histograms in seconds, with names ending `_seconds`.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Messages a worker finished with, by `source` and `outcome`.
pub const MESSAGES_HANDLED: &str = "imagepipe_messages_handled_total";
/// Seconds a handler took, by `source` and `outcome`.
pub const HANDLER_DURATION: &str = "imagepipe_handler_duration_seconds";
/// Messages fetched and not yet settled, by `source`.
pub const MESSAGES_IN_FLIGHT: &str = "imagepipe_messages_in_flight";
/// 1 while the worker's queue is paused by an operator, else 0, by `source`.
pub const QUEUE_PAUSED: &str = "imagepipe_queue_paused";
/// Messages moved to a dead-letter queue, by `source` and `reason`.
pub const MESSAGES_DEAD_LETTERED: &str = "imagepipe_messages_dead_lettered_total";
/// Failed fetches from the broker, by `source`.
pub const FETCH_ERRORS: &str = "imagepipe_fetch_errors_total";
/// Failed acks, nacks, progress and terminates, by `source` and `action`; the broker redelivers.
pub const SETTLE_ERRORS: &str = "imagepipe_settle_errors_total";
/// Messages abandoned unsettled at shutdown (left for redelivery), by `source`.
pub const MESSAGES_ABANDONED: &str = "imagepipe_messages_abandoned_total";
/// Events a subscriber skipped because their `eventId` was already handled, by `source` (the
/// subscriber group).
pub const SUBSCRIBER_DUPLICATES: &str = "imagepipe_subscriber_duplicates_total";

/// Label names.
pub mod labels {
    /// The queue or subscriber group a message came from.
    pub const SOURCE: &str = "source";
    /// How handling ended (values in [`super::outcome`]).
    pub const OUTCOME: &str = "outcome";
    /// Why a message was dead-lettered (values in [`super::dead_letter_reason`]).
    pub const REASON: &str = "reason";
    /// Which settle call failed: `ack`, `nack`, `progress`, `terminate`.
    pub const ACTION: &str = "action";
}

/// Values of the `outcome` label.
pub mod outcome {
    /// Handled and acknowledged.
    pub const ACK: &str = "ack";
    /// Failed, to be retried.
    pub const RETRY: &str = "retry";
    /// Failed permanently; dead-lettered.
    pub const REJECT: &str = "reject";
    /// The handler panicked; retried.
    pub const PANIC: &str = "panic";
    /// The handler ran out of time; retried.
    pub const TIMEOUT: &str = "timeout";
}

/// Values of the `reason` label of [`MESSAGES_DEAD_LETTERED`].
pub mod dead_letter_reason {
    /// The handler rejected the message as permanently failed.
    pub const REJECTED: &str = "rejected";
    /// The message failed on its last allowed delivery.
    pub const MAX_DELIVERIES: &str = "max_deliveries";
}

/// Histogram buckets (seconds) of every `_seconds` metric: 1 ms to 5 min.
const DURATION_BUCKETS: [f64; 16] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// How often histogram samples are folded into buckets when nobody scrapes.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[error("installing the Prometheus metrics recorder")]
pub struct MetricsError(#[source] metrics_exporter_prometheus::BuildError);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the Prometheus recorder for this process on first call and returns its handle;
/// later calls return the same handle. Fails if another `metrics` recorder was installed.
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    static INSTALLING: Mutex<()> = Mutex::new(());
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let _installing = INSTALLING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(handle) = HANDLE.get() {
        return Ok(handle.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &DURATION_BUCKETS)
        .map_err(MetricsError)?
        .install_recorder()
        .map_err(MetricsError)?;
    describe();
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            }
        })
        .map_err(|e| MetricsError(metrics_exporter_prometheus::BuildError::FailedToCreateRuntime(e.to_string())))?;
    Ok(HANDLE.get_or_init(|| handle).clone())
}

fn describe() {
    describe_counter!(
        SUBSCRIBER_DUPLICATES,
        Unit::Count,
        "Events a subscriber skipped as already handled (same eventId), by source (the subscriber group)."
    );
    describe_counter!(MESSAGES_HANDLED, Unit::Count, "Messages a worker finished with, by source and outcome.");
    describe_histogram!(HANDLER_DURATION, Unit::Seconds, "Time a handler took, by source and outcome.");
    describe_gauge!(MESSAGES_IN_FLIGHT, Unit::Count, "Messages fetched and not yet settled, by source.");
    describe_gauge!(QUEUE_PAUSED, Unit::Count, "1 while an operator has paused the worker's queue, else 0, by source.");
    describe_counter!(
        MESSAGES_DEAD_LETTERED,
        Unit::Count,
        "Messages moved to a dead-letter queue, by source and reason."
    );
    describe_counter!(FETCH_ERRORS, Unit::Count, "Failed fetches from the broker, by source.");
    describe_counter!(SETTLE_ERRORS, Unit::Count, "Failed settle calls (the broker redelivers), by source and action.");
    describe_counter!(MESSAGES_ABANDONED, Unit::Count, "Messages left unsettled at shutdown for redelivery.");
    describe_budgets();
}

/// The memory budgets' metrics ([`crate::budget::metrics`]), by `budget`.
fn describe_budgets() {
    use crate::budget::metrics as budget;
    describe_gauge!(
        budget::IN_USE_BYTES,
        Unit::Bytes,
        "Bytes of image buffers granted and not yet released, by budget."
    );
    describe_gauge!(budget::CAPACITY_BYTES, Unit::Bytes, "The memory budget's capacity in bytes, by budget.");
    describe_counter!(
        budget::WAITS,
        Unit::Count,
        "Requests that waited for other holders to release bytes, by budget."
    );
    describe_gauge!(budget::WAITING, Unit::Count, "Requests waiting for bytes now, by budget.");
    describe_histogram!(budget::WAIT_DURATION, Unit::Seconds, "Time a request that had to wait waited, by budget.");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installing_twice_gives_the_same_recorder_and_renders_prometheus_text() {
        let first = install().unwrap();
        let second = install().unwrap();
        metrics::counter!(MESSAGES_HANDLED, labels::SOURCE => "tasks.metrics-test", labels::OUTCOME => outcome::ACK)
            .increment(3);
        metrics::histogram!(HANDLER_DURATION, labels::SOURCE => "tasks.metrics-test").record(0.02);
        for handle in [first, second] {
            let text = handle.render();
            assert!(
                text.contains(r#"imagepipe_messages_handled_total{source="tasks.metrics-test",outcome="ack"} 3"#),
                "{text}"
            );
            assert!(
                text.contains(r#"imagepipe_handler_duration_seconds_bucket{source="tasks.metrics-test",le="0.025"} 1"#),
                "histograms have buckets: {text}"
            );
            assert!(text.contains("# HELP imagepipe_messages_handled_total"), "{text}");
        }
    }
}
