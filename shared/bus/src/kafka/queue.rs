//! [`TaskQueue`] on one topic per queue (and per dead-letter queue), keyed by task id; every
//! queue is one consumer group whose members compete for its partitions, or whose partitions
//! are read by consumers of chosen partitions (the coordinator's shards), assigned by hand.

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
        self.shared.send(&topic, &message, message.partition, &[]).await
    }

    async fn send_batch(&self, queue: &str, messages: Vec<Message>) -> Result<(), BusError> {
        let topic = self.shared.names.queue_topic(queue)?;
        self.shared.send_all(&topic, &messages).await
    }

    async fn consume(&self, queue: &str, config: ConsumerConfig) -> Result<Box<dyn Consumer>, BusError> {
        let names = &self.shared.names;
        let topic = names.queue_topic(queue)?;
        let min_partitions = match self.shared.config.shards {
            Some(shards) if self.shared.sharded.contains(&topic) => i32::from(shards),
            _ => 1,
        };
        let spec = self.queue_spec(queue, topic, None, min_partitions)?;
        self.open(spec, config).await
    }

    async fn consume_partitions(
        &self,
        queue: &str,
        partitions: &[u16],
        config: ConsumerConfig,
    ) -> Result<Box<dyn Consumer>, BusError> {
        self.shared.check_open()?;
        let topic = self.shared.names.queue_topic(queue)?;
        let mut wanted = partitions.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let Some(&highest) = wanted.last() else {
            return Err(BusError::Invalid(format!("{queue}: consume_partitions needs at least one partition")));
        };
        self.shared.topics.ensure(std::slice::from_ref(&topic)).await?;
        let count = self.shared.topics.partitions(&topic).unwrap_or(0);
        if i32::from(highest) >= count {
            return Err(BusError::Invalid(format!(
                "{queue}: partition {highest} does not exist: topic {topic} has {count} partitions \
                 (bus.kafka.shards sets how many the coordinator's queues have)"
            )));
        }
        // Redeliveries stay in the partition they were read from, so the retry topics need the
        // main topic's partitions.
        let spec = self.queue_spec(queue, topic, Some(wanted), count)?;
        self.open(spec, config).await
    }

    fn routes_by_key(&self) -> bool {
        true
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

impl KafkaBus {
    /// The member of `queue` (topic `topic`): its group, retry and dead-letter topics, reading
    /// `assigned` partitions by hand or, when `None`, what the group assigns.
    fn queue_spec(
        &self,
        queue: &str,
        topic: String,
        assigned: Option<Vec<u16>>,
        min_partitions: i32,
    ) -> Result<MemberSpec, BusError> {
        let names = &self.shared.names;
        Ok(MemberSpec {
            source: queue.to_owned(),
            group_id: names.group_id(queue),
            main_topics: vec![topic],
            retry_topics: self.retry_topics(queue)?,
            dlq_topic: names.dlq_topic(&names::dead_letter_queue(queue))?,
            selector: None,
            start: StartPosition::Beginning,
            assigned,
            min_partitions,
        })
    }
}
