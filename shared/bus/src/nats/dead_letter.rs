//! Writing a dead letter: the original message and headers, plus why, how often it was
//! delivered, where from and when, on `<prefix>.dlq.<queue>`.

use std::time::{SystemTime, UNIX_EPOCH};

use imagepipe_contracts::names::headers;

use super::Shared;
use super::codec;
use crate::error::BusError;
use crate::message::Message;

/// Longest reason kept in the header (the rest is cut, marked with `…`).
const MAX_REASON_BYTES: usize = 4096;

/// Where the dead letters of one queue or subscriber group go.
#[derive(Debug, Clone)]
pub(crate) struct DeadLetterTarget {
    /// The queue or group the messages come from (logical name).
    pub source: String,
    /// The dead-letter queue (`dlq.tasks.download`, `dlq.events.analytics`).
    pub queue: String,
    /// Stream and consumer the messages come from, to name each dead letter uniquely.
    pub origin: String,
}

impl DeadLetterTarget {
    /// The `Nats-Msg-Id` of the dead letter of the message at `stream_seq`: writing it twice
    /// (a retry, or the fetch path and the advisory path racing) stores it once.
    fn dedup_id(&self, stream_seq: u64) -> String {
        format!("dlq:{}:{stream_seq}", self.origin)
    }
}

/// Publishes the dead letter of `message` and returns once JetStream has stored it.
pub(crate) async fn write(
    shared: &Shared,
    target: &DeadLetterTarget,
    stream_seq: u64,
    message: &Message,
    delivery_count: u32,
    reason: &str,
) -> Result<(), BusError> {
    let subject = shared.names.dlq_subject(&target.queue);
    let mut letter = message.clone();
    if let Some(original_id) = letter.id.take() {
        letter.headers.insert(headers::MESSAGE_ID, original_id);
    }
    letter.id = Some(target.dedup_id(stream_seq));
    let reason = codec::header_text(reason, MAX_REASON_BYTES);
    let count = delivery_count.to_string();
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis().to_string();
    let extra = [
        (headers::DLQ_REASON, reason.as_str()),
        (headers::DLQ_DELIVERY_COUNT, count.as_str()),
        (headers::DLQ_SOURCE, target.source.as_str()),
        (headers::DLQ_TIMESTAMP, now_ms.as_str()),
    ];
    shared.publish(&subject, &letter, &extra).await?;
    tracing::warn!(
        source = %target.source,
        dead_letter_queue = %target.queue,
        stream_seq,
        delivery_count,
        reason = %reason,
        "message dead-lettered"
    );
    Ok(())
}
