//! Settling a handled delivery on the broker by how its handler exited ([`HandlerExit`]),
//! counted and logged.

use std::time::Duration;

use imagepipe_bus::{BusError, Delivery};

use super::{LoopConfig, Outcome, error_chain};
use ::metrics::counter;

use crate::metrics::{self, dead_letter_reason, labels, outcome};

/// How a handler exited: returned an [`Outcome`], panicked, or was abandoned at the timeout.
#[derive(Debug)]
pub(super) enum HandlerExit {
    /// The handler returned.
    Returned(Outcome),
    /// The handler panicked with this message.
    Panicked(String),
    /// The handler ran past the timeout and was abandoned.
    TimedOut(Duration),
}

impl HandlerExit {
    /// The `outcome` metric label.
    pub(super) fn label(&self) -> &'static str {
        match self {
            Self::Returned(Outcome::Ack) => outcome::ACK,
            Self::Returned(Outcome::Retry { .. }) => outcome::RETRY,
            Self::Returned(Outcome::Reject { .. }) => outcome::REJECT,
            Self::Panicked(_) => outcome::PANIC,
            Self::TimedOut(_) => outcome::TIMEOUT,
        }
    }

    /// Panics and timeouts are retried like any transient failure.
    fn into_outcome(self) -> Outcome {
        match self {
            Self::Returned(outcome) => outcome,
            Self::Panicked(message) => Outcome::retry(format_args!("handler panicked: {message}")),
            Self::TimedOut(after) => Outcome::retry(format_args!("handler timed out after {after:?}")),
        }
    }
}

/// Acks, nacks or dead-letters `delivery` as `exit` says. A failed settle is logged and
/// counted; the broker then redelivers the message.
pub(super) async fn settle(delivery: Delivery, exit: HandlerExit, config: &LoopConfig) {
    let label = exit.label();
    let source = config.name.clone();
    counter!(metrics::MESSAGES_HANDLED, labels::SOURCE => source.clone(), labels::OUTCOME => label).increment(1);
    let (count, max) = (delivery.delivery_count, delivery.max_deliveries);
    match exit.into_outcome() {
        Outcome::Ack => match delivery.ack().await {
            Ok(()) => tracing::debug!(outcome = label, "handled"),
            Err(error) => settle_failed("ack", &source, &error),
        },
        Outcome::Retry { delay, reason } => {
            let delay = delay.unwrap_or_else(|| config.retry_backoff.delay(count.saturating_sub(1)));
            let last = delivery.is_last_attempt();
            match delivery.nack(delay, &reason).await {
                Ok(()) if last => {
                    dead_lettered(&source, dead_letter_reason::MAX_DELIVERIES);
                    tracing::error!(outcome = label, %reason, delivery_count = count,
                        "failed on its last allowed delivery; moved to the dead-letter queue");
                }
                Ok(()) => tracing::warn!(outcome = label, %reason, delivery_count = count, max_deliveries = max,
                    retry_in = ?delay, "failed; will be redelivered"),
                Err(error) => settle_failed(if last { "terminate" } else { "nack" }, &source, &error),
            }
        }
        Outcome::Reject { reason } => match delivery.terminate(&reason).await {
            Ok(()) => {
                dead_lettered(&source, dead_letter_reason::REJECTED);
                tracing::error!(outcome = label, %reason, delivery_count = count,
                    "rejected; moved to the dead-letter queue");
            }
            Err(error) => settle_failed("terminate", &source, &error),
        },
    }
}

/// Extends the ack deadline of `delivery`, a delivery of the worker `config` describes.
pub(super) async fn progress(delivery: &Delivery, config: &LoopConfig) {
    match delivery.progress().await {
        Ok(()) => tracing::trace!("ack deadline extended"),
        Err(error) => settle_failed("progress", &config.name, &error),
    }
}

fn dead_lettered(source: &str, reason: &'static str) {
    counter!(metrics::MESSAGES_DEAD_LETTERED, labels::SOURCE => source.to_owned(), labels::REASON => reason)
        .increment(1);
}

fn settle_failed(action: &'static str, source: &str, error: &BusError) {
    counter!(metrics::SETTLE_ERRORS, labels::SOURCE => source.to_owned(), labels::ACTION => action).increment(1);
    tracing::warn!(action, error = %error_chain(error), "settling failed; the broker will redeliver the message");
}
