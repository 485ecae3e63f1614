//! Settling one Kafka delivery.
//!
//! ack → the offset is finished (the member's thread commits its partition's point when it
//! moved, batching the commits of one tick);
//! nack → a copy with the next delivery count and its due time goes to the group's retry topic
//! of the delay's tier (same partition number as read from), then the offset is finished; progress → the client-side ack deadline
//! restarts; dead letter → the dead letter is written, then the offset is finished. A settle
//! that fails leaves the message in flight: it is redelivered after its ack deadline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::codec;
use super::dead_letter;
use super::member::Core;
use super::retry::now_ms;
use super::state::{Claim, EntryId, Revoked};
use crate::delivery::AckHandle;
use crate::error::BusError;
use crate::message::Message;

/// The member side of one delivery.
pub(crate) struct KafkaAckHandle {
    pub core: Arc<Core>,
    pub id: EntryId,
    pub epoch: u64,
    pub attempt: u32,
}

impl KafkaAckHandle {
    fn settle_error(&self, action: &'static str, err: impl Into<crate::error::BoxError>) -> BusError {
        BusError::Settle {
            action,
            message: self.position(),
            source_name: self.core.spec.source.clone(),
            source: err.into(),
        }
    }

    fn revoked(&self, action: &'static str) -> BusError {
        self.settle_error(action, "the partition was reassigned since; the message is delivered again")
    }

    /// Finishes the offset after a redelivery or dead letter was written.
    fn finish(&self) {
        let _ = self.core.lock().finish(&self.id, self.epoch);
    }

    /// The partition of `retry_topic` a redelivery goes to: the one the message was read from
    /// when the retry topic has it (so a consumer of chosen partitions reads its own
    /// redeliveries), else the key's.
    fn retry_partition(&self, retry_topic: &str) -> Option<u16> {
        let count = self.core.shared.topics.partitions(retry_topic)?;
        u16::try_from(self.id.partition).ok().filter(|p| i32::from(*p) < count)
    }

    /// Claims the message for a nack or dead letter; `None` when this attempt no longer owns it.
    fn claim(&self, action: &'static str) -> Result<Option<(Message, u32)>, BusError> {
        match self.core.lock().claim(&self.id, self.epoch, self.attempt) {
            Claim::Granted { message, delivery_count } => Ok(Some((message, delivery_count))),
            Claim::Stale => {
                tracing::debug!(position = %self.id, action, "a later delivery owns the message; ignored");
                Ok(None)
            }
            Claim::Revoked => Err(self.revoked(action)),
        }
    }
}

#[async_trait]
impl AckHandle for KafkaAckHandle {
    async fn ack(&self) -> Result<(), BusError> {
        self.core.lock().ack(&self.id, self.epoch).map(drop).map_err(|Revoked| self.revoked("ack"))
    }

    async fn nack(&self, delay: Duration) -> Result<(), BusError> {
        let Some((message, delivery_count)) = self.claim("nack")? else { return Ok(()) };
        let tier = self.core.shared.tiers.tier_for(delay);
        let topic = self.core.spec.retry_topic(tier);
        let next = delivery_count.saturating_add(1).to_string();
        let due = now_ms().saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)).to_string();
        let extra = [(codec::DELIVERY_COUNT, next.as_str()), (codec::DUE, due.as_str())];
        match self.core.shared.send(topic, &message, self.retry_partition(topic), &extra).await {
            Ok(()) => {
                self.finish();
                Ok(())
            }
            Err(err) => {
                self.core.lock().release(&self.id, Instant::now());
                Err(self.settle_error("nack", err))
            }
        }
    }

    async fn progress(&self) -> Result<(), BusError> {
        self.core
            .lock()
            .progress(&self.id, self.epoch, self.attempt, Instant::now())
            .map_err(|Revoked| self.revoked("progress"))
    }

    async fn dead_letter(&self, message: &Message, delivery_count: u32, reason: &str) -> Result<(), BusError> {
        if self.claim("terminate")?.is_none() {
            return Ok(());
        }
        match dead_letter::write(
            &self.core.shared,
            &self.core.spec.source,
            &self.core.spec.dlq_topic,
            message,
            delivery_count,
            reason,
        )
        .await
        {
            Ok(()) => {
                self.finish();
                Ok(())
            }
            Err(err) => {
                self.core.lock().release(&self.id, Instant::now());
                Err(self.settle_error("terminate", err))
            }
        }
    }

    fn position(&self) -> String {
        self.id.to_string()
    }
}
