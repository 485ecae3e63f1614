//! The max-deliveries advisory: the backstop for a message whose very last delivery expired.
//!
//! JetStream stops delivering a message after `max_deliver` and only publishes
//! `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>`; on a work-queue stream the
//! message would sit there forever. Every process consuming a queue listens in one queue group
//! (so one of them handles each advisory), reads the message by stream sequence, writes its
//! dead letter and, on the work-queue stream, deletes it.

use std::sync::Arc;

use async_nats::jetstream::stream::Stream;
use futures::StreamExt;
use serde::Deserialize;

use super::Shared;
use super::codec;
use super::dead_letter::{self, DeadLetterTarget};
use super::names::{durable_name, reads_partitions_of};
use crate::error::BusError;

/// The listener task of one consumer; stops when dropped.
pub(crate) struct Listener(tokio::task::JoinHandle<()>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The fields of `io.nats.jetstream.advisory.v1.max_deliver` this needs.
#[derive(Debug, Deserialize)]
struct MaxDeliveries {
    stream_seq: u64,
    deliveries: u64,
}

/// Starts handling the advisories of consumer `durable` on `stream`.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    stream: Stream,
    durable: String,
    target: Arc<DeadLetterTarget>,
    removes_on_ack: bool,
) -> Listener {
    Listener(tokio::spawn(async move {
        let stream_name = stream.cached_info().config.name.clone();
        let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream_name}.{durable}");
        let group = format!("imagepipe-dlq-{stream_name}-{durable}");
        let mut advisories = match shared.client.queue_subscribe(subject.clone(), group).await {
            Ok(subscriber) => subscriber,
            Err(err) => {
                tracing::error!(%subject, error = %err, "cannot listen for max-deliveries advisories");
                return;
            }
        };
        while let Some(advisory) = advisories.next().await {
            let parsed: MaxDeliveries = match serde_json::from_slice(&advisory.payload) {
                Ok(parsed) => parsed,
                Err(err) => {
                    tracing::error!(%subject, error = %err, "unreadable max-deliveries advisory");
                    continue;
                }
            };
            if let Err(err) = handle(&shared, &stream, &target, &parsed, removes_on_ack).await {
                tracing::error!(
                    source = %target.source,
                    stream_seq = parsed.stream_seq,
                    error = %err,
                    "could not dead-letter a message past max deliveries; it stays in stream {stream_name}"
                );
            }
        }
    }))
}

/// Starts handling the advisories of every partitions' consumer of `queue` on `stream` (see
/// [`reads_partitions_of`]): one subscription for them all,
/// whichever partitions this process reads, as any process can dead-letter any of them.
pub(crate) fn spawn_partitions(
    shared: Arc<Shared>,
    stream: Stream,
    queue: String,
    dead_letter_queue: String,
) -> Listener {
    Listener(tokio::spawn(async move {
        let stream_name = stream.cached_info().config.name.clone();
        let subject = format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream_name}.*");
        let group = format!("imagepipe-dlq-{stream_name}-{}_p", durable_name(&queue));
        let mut advisories = match shared.client.queue_subscribe(subject.clone(), group).await {
            Ok(subscriber) => subscriber,
            Err(err) => {
                tracing::error!(%subject, error = %err, "cannot listen for max-deliveries advisories");
                return;
            }
        };
        while let Some(advisory) = advisories.next().await {
            let durable = advisory.subject.rsplit('.').next().unwrap_or_default();
            if !reads_partitions_of(&queue, durable) {
                continue;
            }
            let parsed: MaxDeliveries = match serde_json::from_slice(&advisory.payload) {
                Ok(parsed) => parsed,
                Err(err) => {
                    tracing::error!(subject = %advisory.subject, error = %err, "unreadable max-deliveries advisory");
                    continue;
                }
            };
            let target = DeadLetterTarget {
                source: queue.clone(),
                queue: dead_letter_queue.clone(),
                origin: format!("{stream_name}.{durable}"),
            };
            if let Err(err) = handle(&shared, &stream, &target, &parsed, true).await {
                tracing::error!(
                    source = %queue,
                    consumer = durable,
                    stream_seq = parsed.stream_seq,
                    error = %err,
                    "could not dead-letter a message past max deliveries; it stays in stream {stream_name}"
                );
            }
        }
    }))
}

async fn handle(
    shared: &Shared,
    stream: &Stream,
    target: &DeadLetterTarget,
    advisory: &MaxDeliveries,
    removes_on_ack: bool,
) -> Result<(), BusError> {
    let seq = advisory.stream_seq;
    let setup = |what: &str, err: &dyn std::fmt::Display| BusError::Setup {
        what: format!("{what} message {seq} of {}", target.origin),
        source: err.to_string().into(),
    };
    let stored = match stream.get_raw_message(seq).await {
        Ok(stored) => stored,
        Err(err) if err.kind() == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound => {
            tracing::debug!(source = %target.source, stream_seq = seq, "message past max deliveries is already gone");
            return Ok(());
        }
        Err(err) => return Err(setup("reading", &err)),
    };
    let message = codec::decode(Some(&stored.headers), stored.payload);
    let deliveries = u32::try_from(advisory.deliveries).unwrap_or(u32::MAX);
    let reason = format!("ack deadline expired after {deliveries} deliveries");
    dead_letter::write(shared, target, seq, &message, deliveries, &reason).await?;
    if removes_on_ack {
        stream.delete_message(seq).await.map_err(|err| setup("deleting", &err))?;
    }
    Ok(())
}
