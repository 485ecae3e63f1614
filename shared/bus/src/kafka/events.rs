//! [`EventBus`] on one topic per event family (`<prefix>.events.image`, `<prefix>.events.task`):
//! the event type travels in the `imagepipe-event-type` header, and a subscriber group skips the
//! events its selector rejects by that header, without parsing their bodies.

use async_trait::async_trait;
use imagepipe_contracts::names::{self, headers};

use super::KafkaBus;
use super::member::MemberSpec;
use super::names::group_home;
use crate::config::Subscription;
use crate::error::BusError;
use crate::message::Message;
use crate::traits::{Consumer, EventBus};

#[async_trait]
impl EventBus for KafkaBus {
    async fn publish(&self, event_type: &str, message: Message) -> Result<(), BusError> {
        let topic = self.shared.names.event_topic(event_type)?;
        self.shared.send(&topic, &message, None, &[(headers::EVENT_TYPE, event_type)]).await
    }

    async fn subscribe(&self, subscription: Subscription) -> Result<Box<dyn Consumer>, BusError> {
        let group = subscription.group;
        let valid = !group.is_empty() && group.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(BusError::Invalid(format!("subscriber group {group:?} must be made of [A-Za-z0-9_-]")));
        }
        let names = &self.shared.names;
        let home = group_home(&group);
        let spec = MemberSpec {
            source: group.clone(),
            group_id: names.group_id(&home),
            main_topics: names.event_topics_for(subscription.selector.patterns()),
            retry_topics: self.retry_topics(&home)?,
            dlq_topic: names.dlq_topic(&names::dead_letter_queue_of_group(&group))?,
            selector: Some(subscription.selector),
            start: subscription.start,
            assigned: None,
            min_partitions: 1,
        };
        self.open(spec, subscription.consumer).await
    }
}
