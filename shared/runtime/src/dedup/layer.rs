//! [`Deduplicated`]: the one dedup protocol of every event subscriber, as a layer around its
//! [`EventHandler`]. Per delivery: decode the event (malformed → dead letter), skip it if its
//! `eventId` was handled, apply it, and remember the id once the inner handler acknowledged.
//! A crash between the effect and the mark repeats the effect on redelivery
//! (at-least-once), never loses it.

use async_trait::async_trait;
use imagepipe_bus::Delivery;
use imagepipe_contracts::{Event, decode};
use serde_json::Value;

use super::{Dedup, DedupError};
use crate::metrics;
use crate::worker::{Handler, Outcome, error_chain};

/// A subscriber's own work on one event it has not handled before.
#[async_trait]
pub trait EventHandler: Send + Sync + 'static {
    /// Applies `event`; only [`Outcome::Ack`] marks it handled. `seen` remembers parts of the
    /// event done separately (a webhook per target), so a retry skips them.
    async fn apply(&self, event: Event<Value>, seen: &Seen<'_>) -> Outcome;
}

/// What an [`EventHandler`] gets besides the event: the delivery, and the dedup store keyed
/// under the event's id.
pub struct Seen<'a> {
    /// The delivery being handled (its raw body, headers and delivery count).
    pub delivery: &'a Delivery,
    event_id: &'a str,
    dedup: &'a dyn Dedup,
}

impl Seen<'_> {
    fn key(&self, part: &str) -> String {
        format!("{}:{part}", self.event_id)
    }

    /// Whether `part` of this event was marked done.
    pub async fn is_done(&self, part: &str) -> Result<bool, DedupError> {
        self.dedup.is_done(&self.key(part)).await
    }

    /// Marks `part` of this event done.
    pub async fn mark_done(&self, part: &str) -> Result<bool, DedupError> {
        self.dedup.mark_done(&self.key(part)).await
    }
}

/// The worker [`Handler`] of an [`EventHandler`] for subscriber group `group` (see the module
/// docs); duplicates are counted in [`metrics::SUBSCRIBER_DUPLICATES`].
pub struct Deduplicated<H> {
    inner: H,
    dedup: Box<dyn Dedup>,
    group: String,
}

impl<H: EventHandler> Deduplicated<H> {
    /// `inner`, remembering the events of subscriber group `group` in `dedup`.
    pub fn new(inner: H, dedup: Box<dyn Dedup>, group: impl Into<String>) -> Self {
        Self { inner, dedup, group: group.into() }
    }

    /// The subscriber's own handler.
    pub fn inner(&self) -> &H {
        &self.inner
    }
}

#[async_trait]
impl<H: EventHandler> Handler for Deduplicated<H> {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let event: Event<Value> = match decode(&delivery.message.payload) {
            Ok(event) => event,
            Err(error) => return Outcome::reject(error),
        };
        let event_id = event.event_id.to_string();
        match self.dedup.is_done(&event_id).await {
            Ok(true) => {
                ::metrics::counter!(metrics::SUBSCRIBER_DUPLICATES, metrics::labels::SOURCE => self.group.clone())
                    .increment(1);
                tracing::debug!(group = %self.group, event_id, "event already handled");
                return Outcome::Ack;
            }
            Ok(false) => {}
            Err(error) => return Outcome::retry(format!("checking the event id: {}", error_chain(&error))),
        }
        let seen = Seen { delivery, event_id: &event_id, dedup: self.dedup.as_ref() };
        match self.inner.apply(event, &seen).await {
            Outcome::Ack => {}
            other => return other,
        }
        match self.dedup.mark_done(&event_id).await {
            Ok(_) => Outcome::Ack,
            Err(error) => Outcome::retry(format!("remembering the handled event: {}", error_chain(&error))),
        }
    }
}
