//! Durable pull consumers: one per task queue, dead-letter queue or subscriber group,
//! created or updated at `consume` / `subscribe`. A group that must not outlive its process
//! ([`GroupLifetime::UntilIdle`](crate::config::GroupLifetime)) gets an `inactive_threshold`
//! (durables honour it since NATS 2.9): the server deletes it once nothing pulls from it.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, ReplayPolicy, pull};
use async_nats::jetstream::context::{ConsumerInfoError, ConsumerInfoErrorKind};
use async_nats::jetstream::stream::Stream;

use async_nats::jetstream::Context;
use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::response::Response;

use super::names::reads_partitions_of;
use crate::config::{ConsumerConfig, NatsConfig};
use crate::error::{BoxError, BusError};

/// What a consumer is for, before it is turned into a JetStream config.
pub(crate) struct ConsumerSpec {
    /// Consumer name (no dots).
    pub durable: String,
    /// What it serves, stored as the description so two names that sanitize alike are caught.
    pub description: String,
    /// The one subject it is filtered to (NATS 2.9 takes a single filter).
    pub filter: String,
    /// Where a new consumer starts; an existing one keeps its own.
    pub deliver: DeliverPolicy,
    /// Ack deadline and allowed deliveries.
    pub consumer: ConsumerConfig,
    /// When set, the server deletes the consumer once no pull has come for this long.
    pub inactive_threshold: Option<Duration>,
}

/// JetStream's `max_deliver` for a consumer allowing `max_deliveries`: one more, so that a
/// message whose last allowed delivery expired unsettled is handed out once more and the
/// fetch dead-letters it on the spot, instead of JetStream parking it with only an advisory.
pub(crate) fn jetstream_max_deliver(max_deliveries: u32) -> i64 {
    i64::from(max_deliveries) + 1
}

/// The JetStream config of `spec`.
pub(crate) fn pull_config(spec: &ConsumerSpec, nats: &NatsConfig) -> pull::Config {
    pull::Config {
        durable_name: Some(spec.durable.clone()),
        description: Some(spec.description.clone()),
        filter_subject: spec.filter.clone(),
        deliver_policy: spec.deliver,
        ack_policy: AckPolicy::Explicit,
        ack_wait: spec.consumer.ack_wait,
        max_deliver: jetstream_max_deliver(spec.consumer.max_deliveries),
        backoff: backoff(spec.consumer.ack_wait, spec.consumer.max_deliveries, &nats.redelivery_backoff),
        replay_policy: ReplayPolicy::Instant,
        inactive_threshold: spec.inactive_threshold.unwrap_or_default(),
        ..pull::Config::default()
    }
}

/// Ack deadlines of deliveries 1..=max_deliveries: `max(ack_wait, backoff[n-1])`, the last
/// backoff entry repeating. JetStream wants fewer entries than `max_deliver`.
fn backoff(ack_wait: Duration, max_deliveries: u32, configured: &[Duration]) -> Vec<Duration> {
    let Some(last) = configured.last() else { return Vec::new() };
    (0..max_deliveries as usize).map(|i| configured.get(i).unwrap_or(last).max(&ack_wait).to_owned()).collect()
}

/// Creates the consumer of `spec` on `stream`, or updates the existing one in place (keeping
/// its start position, which JetStream cannot change).
pub(crate) async fn ensure(stream: &Stream, spec: &ConsumerSpec, nats: &NatsConfig) -> Result<PullConsumer, BusError> {
    let stream_name = stream.cached_info().config.name.clone();
    let what = format!("consumer {} on stream {stream_name}", spec.durable);
    let setup = |source: BoxError| BusError::Setup { what: what.clone(), source };
    let mut desired = pull_config(spec, nats);
    match stream.consumer_info(&spec.durable).await {
        Ok(info) => {
            let existing = &info.config;
            if existing.description.as_deref().is_some_and(|d| d != spec.description) {
                return Err(setup(
                    format!(
                        "it belongs to {:?}, not {:?}: two names map to the same consumer name",
                        existing.description.as_deref().unwrap_or_default(),
                        spec.description
                    )
                    .into(),
                ));
            }
            desired.deliver_policy = existing.deliver_policy;
            let unchanged = existing.filter_subject == desired.filter_subject
                && existing.ack_wait == desired.ack_wait
                && existing.max_deliver == desired.max_deliver
                && existing.backoff == desired.backoff
                && existing.ack_policy == desired.ack_policy
                && existing.inactive_threshold == desired.inactive_threshold;
            if unchanged {
                return stream.get_consumer(&spec.durable).await.map_err(setup);
            }
            if existing.filter_subject != desired.filter_subject {
                tracing::info!(
                    consumer = %spec.durable,
                    from = %existing.filter_subject,
                    to = %desired.filter_subject,
                    "changing the consumer's filter (needs NATS 2.10+)"
                );
            }
            stream.create_consumer(desired).await.map_err(|err| {
                setup(format!("updating it to filter {:?}, ack_wait and max_deliver failed: {err}", spec.filter).into())
            })
        }
        Err(err) if err.kind() == ConsumerInfoErrorKind::NotFound => {
            stream.create_consumer(desired).await.map_err(|err| setup(Box::new(err)))
        }
        Err(err) => Err(setup(Box::new(err))),
    }
}

/// Whether the server takes several filter subjects on one consumer (NATS 2.10+), going by
/// the version it announced (`2.9.10`, `2.15.1`, `2.11.0-beta.2`).
pub(crate) fn takes_filter_lists(version: &str) -> bool {
    let mut numbers = version.split(['.', '-']).map(|part| part.parse::<u32>().ok());
    match (numbers.next().flatten(), numbers.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= (2, 10),
        _ => false,
    }
}

/// How often [`create_group`] tries when it may take the partitions over.
const TAKE_OVER_TRIES: u32 = 5;
/// Its pause between tries when nothing was there to delete.
const TAKE_OVER_PAUSE: Duration = Duration::from_millis(100);

/// Creates the consumer `spec.durable` reading the subjects `filters` (one per partition; NATS
/// 2.10+). A work-queue stream refuses a consumer whose filters overlap another's: with
/// `take_over`, the partitions' consumers of `queue` holding any of `filters` (left by an
/// earlier owner, a replica that died, or a per-partition consumer of the NATS 2.9 layout)
/// are deleted and the create is tried again. Only the partitions' owner takes over: whoever
/// read them before has no right to them any more, and what they held and did not settle is
/// delivered again from the stream, which keeps every message until one consumer acks it.
pub(crate) async fn create_group(
    js: &Context,
    stream: &Stream,
    queue: &str,
    spec: &ConsumerSpec,
    filters: &[String],
    nats: &NatsConfig,
    take_over: bool,
) -> Result<PullConsumer, BusError> {
    let stream_name = stream.cached_info().config.name.clone();
    let what = format!("consumer {} on stream {stream_name}", spec.durable);
    let setup = |source: BoxError| BusError::Setup { what: what.clone(), source };
    let mut config = serde_json::to_value(pull_config(spec, nats)).map_err(|e| setup(Box::new(e)))?;
    if let Some(fields) = config.as_object_mut() {
        fields.remove("filter_subject");
        fields.insert("filter_subjects".into(), serde_json::json!(filters));
    }
    let request = serde_json::json!({ "stream_name": stream_name, "config": config });
    let subject = format!("CONSUMER.CREATE.{stream_name}.{}", spec.durable);
    // Only an overlap is taken over. It may also be a consumer being deleted right then (an
    // earlier opening's in this process, handing back): a few tries, a short pause apart, see
    // it gone.
    let mut tries = if take_over { TAKE_OVER_TRIES } else { 1 };
    loop {
        let response: Response<serde_json::Value> =
            js.request(subject.clone(), &request).await.map_err(|e| setup(Box::new(e)))?;
        let error = match response {
            Response::Ok(_) => break,
            Response::Err { error } => error,
        };
        tries -= 1;
        if tries == 0 || error.error_code() != ErrorCode::CONSUMER_WQ_CONSUMER_NOT_UNIQUE {
            return Err(setup(Box::new(error)));
        }
        let deleted = delete_overlapping(js, stream, queue, filters).await.map_err(setup)?;
        if deleted > 0 {
            tracing::info!(consumer = %spec.durable, deleted, "deleted the earlier consumers of these partitions");
        } else {
            tokio::time::sleep(TAKE_OVER_PAUSE).await;
        }
    }
    stream.get_consumer(&spec.durable).await.map_err(setup)
}

/// Deletes the consumers of `queue`'s partitions ([`reads_partitions_of`]) that filter on any
/// of `filters`; returns how many.
async fn delete_overlapping(js: &Context, stream: &Stream, queue: &str, filters: &[String]) -> Result<usize, BoxError> {
    let stream_name = stream.cached_info().config.name.clone();
    let mut doomed = Vec::new();
    let mut offset = 0usize;
    loop {
        let page: Response<ConsumerList> =
            js.request(format!("CONSUMER.LIST.{stream_name}"), &serde_json::json!({ "offset": offset })).await?;
        let page = match page {
            Response::Ok(page) => page,
            Response::Err { error } => return Err(Box::new(error)),
        };
        let listed = page.consumers.len();
        for consumer in page.consumers {
            let config = consumer.config;
            let overlaps =
                config.filter_subjects.iter().chain(config.filter_subject.as_ref()).any(|f| filters.contains(f));
            if overlaps && reads_partitions_of(queue, &consumer.name) {
                doomed.push(consumer.name);
            }
        }
        offset += listed;
        if listed == 0 || offset >= page.total {
            break;
        }
    }
    futures::future::join_all(doomed.iter().map(|name| delete_when_settled(stream, name, SETTLE_LIMIT))).await;
    Ok(doomed.len())
}

/// How long a consumer about to be deleted is given to have what it delivered settled.
pub(crate) const SETTLE_LIMIT: Duration = Duration::from_secs(2);
/// How often [`delete_when_settled`] looks.
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// Deletes the consumer `name` once no message it delivered waits for an ack on the server, or
/// once `limit` has passed (a holder that died settles nothing). The server applies acks apart
/// from API requests, so a delete right after an ack can overtake it, and on a work queue the
/// acked message would then be delivered again to the next consumer. True once the consumer
/// is gone.
pub(crate) async fn delete_when_settled(stream: &Stream, name: &str, limit: Duration) -> bool {
    let until = tokio::time::Instant::now() + limit;
    loop {
        match stream.consumer_info(name).await {
            Ok(info) if info.num_ack_pending == 0 || tokio::time::Instant::now() >= until => break,
            Ok(_) => tokio::time::sleep(SETTLE_POLL).await,
            Err(err) if is_missing(&err) => return true,
            Err(err) => {
                tracing::debug!(consumer = %name, error = %err, "asking for a consumer before deleting it failed");
                break;
            }
        }
    }
    match stream.delete_consumer(name).await {
        Ok(_) => true,
        Err(err) => {
            tracing::debug!(consumer = %name, error = %err, "deleting a consumer failed (gone already?)");
            matches!(stream.consumer_info(name).await, Err(err) if is_missing(&err))
        }
    }
}

/// One page of `CONSUMER.LIST`, as much of it as [`delete_overlapping`] reads.
#[derive(serde::Deserialize)]
struct ConsumerList {
    #[serde(default)]
    total: usize,
    #[serde(default)]
    consumers: Vec<ListedConsumer>,
}

#[derive(serde::Deserialize)]
struct ListedConsumer {
    name: String,
    config: ListedConfig,
}

#[derive(serde::Deserialize)]
struct ListedConfig {
    #[serde(default)]
    filter_subject: Option<String>,
    #[serde(default)]
    filter_subjects: Vec<String>,
}

/// Whether `err` says the consumer (or its whole stream) does not exist.
pub(crate) fn is_missing(err: &ConsumerInfoError) -> bool {
    matches!(err.kind(), ConsumerInfoErrorKind::NotFound | ConsumerInfoErrorKind::StreamNotFound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_never_shorter_than_ack_wait_and_fits_max_deliver() {
        let s = Duration::from_secs;
        assert!(backoff(s(1), 5, &[]).is_empty());
        let b = backoff(s(2), 4, &[s(1), s(10), s(60)]);
        assert_eq!(b, vec![s(2), s(10), s(60), s(60)]);
        assert!((b.len() as i64) < jetstream_max_deliver(4));
    }

    #[test]
    fn filter_lists_are_taken_from_nats_2_10_on() {
        for (version, takes) in [
            ("2.9.10", false),
            ("2.10.0", true),
            ("2.15.1", true),
            ("2.11.0-beta.2", true),
            ("3.0.0", true),
            ("1.4.1", false),
            ("", false),
            ("garbage", false),
        ] {
            assert_eq!(takes_filter_lists(version), takes, "{version}");
        }
    }
}
