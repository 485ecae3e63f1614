//! [`TaskQueue`] on one topic per queue (and per dead-letter queue), keyed by task id; every
//! queue is one consumer group whose members compete for its partitions.

use async_trait::async_trait;
use imagepipe_contracts::names;

use super::KafkaBus;
use super::member::MemberSpec;
use crate::config::{ConsumerConfig, StartPosition};
use crate::error::BusError;
use crate::inspect::Backlog;
use crate::message::Message;
use crate::traits::{Consumer, TaskQueue};

#[async_trait]
impl TaskQueue for KafkaBus {
    async fn send(&self, queue: &str, message: Message) -> Result<(), BusError> {
        let topic = self.shared.names.queue_topic(queue)?;
        self.shared.send(&topic, &message, &[]).await
    }

    async fn send_batch(&self, queue: &str, messages: Vec<Message>) -> Result<(), BusError> {
        let topic = self.shared.names.queue_topic(queue)?;
        self.shared.send_all(&topic, &messages, &[]).await
    }

    async fn consume(&self, queue: &str, config: ConsumerConfig) -> Result<Box<dyn Consumer>, BusError> {
        let names = &self.shared.names;
        let topic = names.queue_topic(queue)?;
        let spec = MemberSpec {
            source: queue.to_owned(),
            group_id: names.group_id(queue),
            main_topics: vec![topic],
            retry_topics: self.retry_topics(queue)?,
            dlq_topic: names.dlq_topic(&names::dead_letter_queue(queue))?,
            selector: None,
            start: StartPosition::Beginning,
        };
        self.open(spec, config).await
    }

    async fn backlog(&self, queue: &str) -> Result<Option<Backlog>, BusError> {
        self.shared.check_open()?;
        let topic = self.shared.names.queue_topic(queue)?;
        let Some(partitions) = self.shared.topics.partitions(&topic) else { return Ok(None) };
        let (offsets, group) = (self.shared.offsets.clone(), self.shared.names.group_id(queue));
        tokio::task::spawn_blocking(move || offsets.backlog(&group, &topic, partitions))
            .await
            .map_err(|e| BusError::Inspect { what: format!("the backlog of {queue}"), source: Box::new(e) })?
    }
}
