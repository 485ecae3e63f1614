//! Settling one JetStream delivery.
//!
//! ack → `+ACK`, not confirmed: the server's reply would cost a round trip and a message per
//! delivery, and an ack that is lost only means the message is delivered again, which every
//! handler absorbs (they are idempotent); nack → `-NAK {"delay": ...}`; progress → `+WPI`
//! (restarts the ack deadline); dead-letter → the dead letter is written and confirmed, then
//! `+TERM` (confirmed) stops redelivery and, on the work-queue stream, removes the message.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::AckKind;
use async_nats::jetstream::message::Acker;
use async_trait::async_trait;

use super::Shared;
use super::dead_letter::{self, DeadLetterTarget};
use crate::delivery::AckHandle;
use crate::error::BusError;
use crate::message::Message;

/// The broker side of one delivery.
pub(crate) struct NatsAckHandle {
    pub shared: Arc<Shared>,
    pub acker: Acker,
    pub stream_seq: u64,
    pub target: Arc<DeadLetterTarget>,
}

impl NatsAckHandle {
    fn settle_error(&self, action: &'static str, err: impl std::fmt::Display) -> BusError {
        BusError::Settle {
            action,
            message: self.position(),
            source_name: self.target.source.clone(),
            source: err.to_string().into(),
        }
    }
}

#[async_trait]
impl AckHandle for NatsAckHandle {
    async fn ack(&self) -> Result<(), BusError> {
        self.acker.ack_with(AckKind::Ack).await.map_err(|err| self.settle_error("ack", err))
    }

    async fn nack(&self, delay: Duration) -> Result<(), BusError> {
        let delay = (!delay.is_zero()).then_some(delay);
        self.acker.ack_with(AckKind::Nak(delay)).await.map_err(|err| self.settle_error("nack", err))
    }

    async fn progress(&self) -> Result<(), BusError> {
        self.acker.ack_with(AckKind::Progress).await.map_err(|err| self.settle_error("progress", err))
    }

    async fn dead_letter(&self, message: &Message, delivery_count: u32, reason: &str) -> Result<(), BusError> {
        dead_letter::write(&self.shared, &self.target, self.stream_seq, message, delivery_count, reason).await?;
        self.acker.double_ack_with(AckKind::Term).await.map_err(|err| self.settle_error("terminate", err))
    }

    fn position(&self) -> String {
        format!("{}#{}", self.target.origin, self.stream_seq)
    }
}
