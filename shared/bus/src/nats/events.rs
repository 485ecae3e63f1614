//! [`EventBus`] on the events stream: one durable consumer per subscriber group (one with an
//! `inactive_threshold` for a group of [`GroupLifetime::UntilIdle`]).
//!
//! A selector of one pattern becomes the consumer's filter subject. NATS 2.9 takes a single
//! filter per consumer, so a selector of several patterns is filtered to the narrowest subject
//! covering them all and the events it does not want are acked and skipped here, read from the
//! `imagepipe-event-type` header without parsing the body.

use async_nats::jetstream::consumer::DeliverPolicy;
use async_trait::async_trait;
use imagepipe_contracts::names::{self, headers};

use super::NatsBus;
use super::consumer::NatsConsumer;
use super::consumers::ConsumerSpec;
use super::names::{covering_pattern, durable_name};
use crate::config::{GroupLifetime, StartPosition, Subscription};
use crate::error::BusError;
use crate::message::Message;
use crate::traits::{Consumer, EventBus};

#[async_trait]
impl EventBus for NatsBus {
    async fn publish(&self, event_type: &str, message: Message) -> Result<(), BusError> {
        let subject = self.shared.names.event_subject(event_type)?;
        self.shared.publish(&subject, &message, &[(headers::EVENT_TYPE, event_type)]).await
    }

    async fn subscribe(&self, subscription: Subscription) -> Result<Box<dyn Consumer>, BusError> {
        let group = subscription.group;
        let valid = !group.is_empty() && group.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(BusError::Invalid(format!("subscriber group {group:?} must be made of [A-Za-z0-9_-]")));
        }
        let patterns = subscription.selector.patterns();
        let filter = self.shared.names.event_filter(&covering_pattern(patterns));
        let client_side = (patterns.len() > 1).then(|| subscription.selector.clone());
        let spec = ConsumerSpec {
            durable: durable_name(&group),
            description: format!("imagepipe group {group}"),
            filter,
            deliver: deliver_policy(subscription.start),
            consumer: subscription.consumer,
            inactive_threshold: match subscription.lifetime {
                GroupLifetime::Durable => None,
                GroupLifetime::UntilIdle(idle) => Some(idle),
            },
        };
        let consumer = NatsConsumer::open(
            self.shared.clone(),
            self.shared.streams.events.clone(),
            spec,
            group.clone(),
            names::dead_letter_queue_of_group(&group),
            client_side,
            false,
        )
        .await?;
        Ok(Box::new(consumer))
    }
}

fn deliver_policy(start: StartPosition) -> DeliverPolicy {
    match start {
        StartPosition::New => DeliverPolicy::New,
        StartPosition::Beginning => DeliverPolicy::All,
        StartPosition::Since(at) => DeliverPolicy::ByStartTime { start_time: time::OffsetDateTime::from(at) },
    }
}
