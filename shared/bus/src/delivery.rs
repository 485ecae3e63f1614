//! A received message and how its handler settles it.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::BusError;
use crate::message::Message;

/// The backend's side of one delivery: how to settle it on the broker.
///
/// Backends implement this; handlers use [`Delivery`]'s methods, which also apply the
/// max-deliveries rule in one place.
#[async_trait]
pub trait AckHandle: Send + Sync {
    /// The message is handled; never deliver it again.
    async fn ack(&self) -> Result<(), BusError>;
    /// The attempt failed; deliver the message again, not before `delay`.
    async fn nack(&self, delay: Duration) -> Result<(), BusError>;
    /// Still working: restart the ack deadline.
    async fn progress(&self) -> Result<(), BusError>;
    /// Move the message to the dead-letter queue with `reason`, and never deliver it again.
    async fn dead_letter(&self, message: &Message, delivery_count: u32, reason: &str) -> Result<(), BusError>;
    /// Where the message sits on the broker (stream sequence, partition/offset), for logs.
    fn position(&self) -> String;
}

/// One delivery of a message from a task queue or a subscription.
///
/// Settle it exactly once with [`ack`](Self::ack), [`nack`](Self::nack) or
/// [`terminate`](Self::terminate); a delivery dropped unsettled is redelivered after its ack
/// deadline, so a crash loses nothing.
pub struct Delivery {
    /// The message.
    pub message: Message,
    /// How many times it has been delivered, this time included (1 on first delivery).
    pub delivery_count: u32,
    /// Deliveries allowed before the message is dead-lettered.
    pub max_deliveries: u32,
    /// The queue or subscriber group it came from (logical name, no prefix).
    pub source: String,
    handle: Box<dyn AckHandle>,
}

impl Delivery {
    /// A delivery settled through `handle` (for backends).
    pub fn new(
        message: Message,
        delivery_count: u32,
        max_deliveries: u32,
        source: String,
        handle: Box<dyn AckHandle>,
    ) -> Self {
        Self { message, delivery_count, max_deliveries, source, handle }
    }

    /// Whether this is the last delivery the message gets before it is dead-lettered.
    pub fn is_last_attempt(&self) -> bool {
        self.delivery_count >= self.max_deliveries
    }

    /// Done: the message is never delivered again.
    pub async fn ack(self) -> Result<(), BusError> {
        self.handle.ack().await
    }

    /// Failed with `reason`: deliver again after `delay`, or dead-letter it when this was the
    /// last allowed delivery.
    pub async fn nack(self, delay: Duration, reason: &str) -> Result<(), BusError> {
        if self.is_last_attempt() {
            let reason = format!("max deliveries ({}) reached; last error: {reason}", self.max_deliveries);
            self.handle.dead_letter(&self.message, self.delivery_count, &reason).await
        } else {
            self.handle.nack(delay).await
        }
    }

    /// Still working: restart the ack deadline so the message is not redelivered meanwhile.
    pub async fn progress(&self) -> Result<(), BusError> {
        self.handle.progress().await
    }

    /// Permanently failed: move it to the dead-letter queue with `reason` at once.
    pub async fn terminate(self, reason: &str) -> Result<(), BusError> {
        self.handle.dead_letter(&self.message, self.delivery_count, reason).await
    }

    /// Where the message sits on the broker, for logs.
    pub fn position(&self) -> String {
        self.handle.position()
    }
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("source", &self.source)
            .field("position", &self.handle.position())
            .field("delivery_count", &self.delivery_count)
            .field("max_deliveries", &self.max_deliveries)
            .field("message", &self.message)
            .finish()
    }
}
