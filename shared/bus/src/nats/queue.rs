//! [`TaskQueue`] on the work-queue stream (and on the dead-letter stream for `dlq.*`).
//!
//! One durable consumer per queue, shared by every replica; delivery policy `all`, so a new
//! consumer gets what was queued before it existed. Partition `p` of a queue is the subject
//! `<queue subject>.<p>`, read through consumers of their own (see the partitions module); no
//! consumer filters with a wildcard, so a queue's consumer and its partitions' never overlap.

use async_nats::jetstream::consumer::DeliverPolicy;
use async_trait::async_trait;
use imagepipe_contracts::names;

use super::NatsBus;
use super::consumer::NatsConsumer;
use super::consumers::ConsumerSpec;
use super::inspect::consumer_backlog;
use super::names::{QueueKind, durable_name};
use super::partitions::PartitionsConsumer;
use crate::config::ConsumerConfig;
use crate::error::BusError;
use crate::inspect::Backlog;
use crate::message::Message;
use crate::traits::{Consumer, TaskQueue};

#[async_trait]
impl TaskQueue for NatsBus {
    async fn send(&self, queue: &str, message: Message) -> Result<(), BusError> {
        let subject = self.subject_of(queue, &message)?;
        self.shared.publish(&subject, &message, &[]).await
    }

    async fn send_batch(&self, queue: &str, messages: Vec<Message>) -> Result<(), BusError> {
        let addressed = messages
            .into_iter()
            .map(|message| Ok((self.subject_of(queue, &message)?, message)))
            .collect::<Result<Vec<_>, BusError>>()?;
        self.shared.publish_pipelined(&addressed, &[]).await
    }

    async fn flush(&self) -> Result<(), BusError> {
        self.shared.client.flush().await.map_err(|e| BusError::Settle {
            action: "flush",
            message: "every buffered settlement".into(),
            source_name: "the NATS client".into(),
            source: Box::new(e),
        })
    }

    async fn consume(&self, queue: &str, config: ConsumerConfig) -> Result<Box<dyn Consumer>, BusError> {
        let (kind, subject) = self.shared.names.queue_subject(queue)?;
        let stream = match kind {
            QueueKind::Tasks => self.shared.streams.tasks.clone(),
            QueueKind::DeadLetters => self.shared.streams.dlq.clone(),
        };
        let spec = ConsumerSpec {
            durable: durable_name(queue),
            description: format!("imagepipe queue {queue}"),
            filter: subject,
            deliver: DeliverPolicy::All,
            consumer: config,
            inactive_threshold: None,
        };
        let consumer = NatsConsumer::open(
            self.shared.clone(),
            stream,
            spec,
            queue.to_owned(),
            names::dead_letter_queue(queue),
            None,
            kind == QueueKind::Tasks,
        )
        .await?;
        Ok(Box::new(consumer))
    }

    async fn consume_partitions(
        &self,
        queue: &str,
        partitions: &[u16],
        config: ConsumerConfig,
    ) -> Result<Box<dyn Consumer>, BusError> {
        Ok(Box::new(PartitionsConsumer::open(self.shared.clone(), queue, partitions, config).await?))
    }

    async fn backlog(&self, queue: &str) -> Result<Option<Backlog>, BusError> {
        self.shared.check_open()?;
        let (kind, _) = self.shared.names.queue_subject(queue)?;
        let stream = match kind {
            QueueKind::Tasks => &self.shared.streams.tasks,
            QueueKind::DeadLetters => &self.shared.streams.dlq,
        };
        consumer_backlog(stream, &durable_name(queue)).await
    }

    async fn oldest(&self, queue: &str) -> Result<Option<u64>, BusError> {
        self.shared.check_open()?;
        let (kind, subject) = self.shared.names.queue_subject(queue)?;
        let stream = match kind {
            QueueKind::Tasks => &self.shared.streams.tasks,
            QueueKind::DeadLetters => &self.shared.streams.dlq,
        };
        // A work queue keeps only unfinished messages: its first one of the subject is the oldest.
        match stream.get_first_raw_message_by_subject(&subject, 1).await {
            Ok(message) => Ok(Some(u64::try_from(message.time.unix_timestamp_nanos() / 1_000_000).unwrap_or(0))),
            Err(error) if error.kind() == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound => {
                Ok(None)
            }
            Err(error) => Err(BusError::Receive { source_name: queue.to_owned(), source: Box::new(error) }),
        }
    }
}

impl NatsBus {
    /// The subject `message` is published on: the queue's, or its partition's.
    fn subject_of(&self, queue: &str, message: &Message) -> Result<String, BusError> {
        match message.partition {
            None => Ok(self.shared.names.queue_subject(queue)?.1),
            Some(partition) => self.shared.names.partition_subject(queue, partition),
        }
    }
}
