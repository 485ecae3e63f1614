//! Durable pull consumers: one per task queue, dead-letter queue or subscriber group,
//! created or updated at `consume` / `subscribe`. A group that must not outlive its process
//! ([`GroupLifetime::UntilIdle`](crate::config::GroupLifetime)) gets an `inactive_threshold`
//! (durables honour it since NATS 2.9): the server deletes it once nothing pulls from it.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer, ReplayPolicy, pull};
use async_nats::jetstream::context::{ConsumerInfoError, ConsumerInfoErrorKind};
use async_nats::jetstream::stream::Stream;

use crate::config::{ConsumerConfig, NatsConfig};
use crate::error::BusError;

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
    let setup = |source: crate::error::BoxError| BusError::Setup { what: what.clone(), source };
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
}
