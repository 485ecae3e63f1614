//! Settling one in-memory delivery.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::queue::Queue;
use crate::delivery::AckHandle;
use crate::error::BusError;
use crate::message::Message;

/// Settles delivery `attempt` of message `seq` on `queue`. A handle whose delivery was
/// redelivered meanwhile (its ack deadline passed) is stale: settling it fails and changes
/// nothing.
pub(super) struct MemoryAckHandle {
    pub(super) queue: Arc<Queue>,
    pub(super) dlq: Arc<Queue>,
    pub(super) seq: u64,
    pub(super) attempt: u32,
}

#[async_trait]
impl AckHandle for MemoryAckHandle {
    async fn ack(&self) -> Result<(), BusError> {
        self.queue.ack(self.seq, self.attempt)
    }

    async fn nack(&self, delay: Duration) -> Result<(), BusError> {
        self.queue.nack(self.seq, self.attempt, delay)
    }

    async fn progress(&self) -> Result<(), BusError> {
        self.queue.progress(self.seq, self.attempt)
    }

    async fn dead_letter(&self, _message: &Message, delivery_count: u32, reason: &str) -> Result<(), BusError> {
        self.queue.dead_letter(self.seq, self.attempt, delivery_count, reason, &self.dlq).await
    }

    fn position(&self) -> String {
        self.queue.position(self.seq)
    }
}
