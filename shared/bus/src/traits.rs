//! The two seams where backends differ: task queues and event topics.

use std::time::Duration;

use async_trait::async_trait;

use crate::config::{ConsumerConfig, Subscription};
use crate::delivery::Delivery;
use crate::error::BusError;
use crate::inspect::Backlog;
use crate::message::Message;

/// Pulls deliveries from one queue or one subscriber group. Replicas that open a consumer on
/// the same queue (or group) compete for its messages.
#[async_trait]
pub trait Consumer: Send + Sync {
    /// Waits up to `wait` for messages and returns at most `max` of them; empty when none
    /// arrived in time. A fetch dropped before it returns loses nothing: what it had taken is
    /// delivered again, at the latest after its ack deadline.
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError>;
}

/// Task queues: each message is a command for one kind of worker (names in
/// [`imagepipe_contracts::names::queues`], unprefixed; dead letters under `dlq.<queue>`).
#[async_trait]
pub trait TaskQueue: Send + Sync {
    /// Durably enqueues `message` on `queue`; returns once the broker has accepted it.
    async fn send(&self, queue: &str, message: Message) -> Result<(), BusError>;

    /// Enqueues several messages, letting the backend pipeline them; returns once all are
    /// accepted. On error, some of them may have been accepted.
    async fn send_batch(&self, queue: &str, messages: Vec<Message>) -> Result<(), BusError> {
        for message in messages {
            self.send(queue, message).await?;
        }
        Ok(())
    }

    /// Hands everything the client has buffered (settlements that are not confirmed, such as
    /// NATS acks) to the broker; a service calls it before it exits.
    async fn flush(&self) -> Result<(), BusError> {
        Ok(())
    }

    /// Opens a consumer on `queue`, shared by every replica that opens one.
    async fn consume(&self, queue: &str, config: ConsumerConfig) -> Result<Box<dyn Consumer>, BusError>;

    /// Opens a consumer on partitions `partitions` of `queue`: it gets only the messages sent
    /// to those partitions ([`Message::partition`]), in the order sent within each
    /// partition, and none sent to the queue itself. The coordinator that owns a shard is
    /// the only one to open its partition. A consumer that is dropped gives back at once what
    /// it holds but has not handed out (a NATS consumer prefetches), so the next consumer of
    /// the partition gets it without waiting for an ack deadline; deliveries already handed
    /// out are settled by their holders or redelivered after their ack deadline, as always
    /// (on NATS 2.10+, where the next consumer replaces the dropped one's, they may be
    /// delivered to it again at once: at least once either way).
    /// [`Delivery::source`](crate::Delivery::source) is `queue` (no partition), so retries and
    /// dead letters (`dlq.<queue>`) work as for [`consume`](Self::consume); a retried message
    /// comes back in its partition.
    ///
    /// On NATS a partition is the subject `<queue subject>.<partition>`, read through one
    /// consumer with a filter per partition (2.10+) or a durable consumer per partition (2.9);
    /// on Kafka the topic's partition of that number, assigned to this
    /// consumer by hand (offsets committed in the queue's group); in memory a queue of its own.
    ///
    /// [`Message::partition`]: crate::Message::partition
    async fn consume_partitions(
        &self,
        queue: &str,
        partitions: &[u16],
        config: ConsumerConfig,
    ) -> Result<Box<dyn Consumer>, BusError> {
        let _ = (partitions, config);
        Err(BusError::Setup {
            what: format!("partitions of {queue}"),
            source: "this backend has no partitioned queues".into(),
        })
    }

    /// Whether a send without a partition is already routed to a partition by its key
    /// (Kafka: the topic's partitions are the shards), so that the queue has no unrouted
    /// channel: [`consume`](Self::consume) and [`consume_partitions`](Self::consume_partitions)
    /// then read the same messages. False when a send without a partition goes to the queue
    /// itself, apart from every partition (memory, NATS).
    fn routes_by_key(&self) -> bool {
        false
    }

    /// How many messages of `queue` its consumer has not finished, as the broker counts them
    /// (for gauges); `None` when the backend cannot say, or nothing has consumed `queue` yet.
    /// Messages of the queue's partitions are not counted (unless [`routes_by_key`]).
    ///
    /// [`routes_by_key`]: Self::routes_by_key
    async fn backlog(&self, queue: &str) -> Result<Option<Backlog>, BusError> {
        let _ = queue;
        Ok(None)
    }

    /// When the oldest message `queue` still holds (waiting or being handled) was enqueued,
    /// Unix ms; `None` when it holds none or the backend cannot say (Kafka). Like
    /// [`backlog`](Self::backlog), the queue itself, not its partitions.
    async fn oldest(&self, queue: &str) -> Result<Option<u64>, BusError> {
        let _ = queue;
        Ok(None)
    }
}

/// Event topics: every subscriber group gets every event its selector accepts.
#[async_trait]
pub trait EventBus: Send + Sync {
    /// Durably publishes an event of type `event_type` (e.g. `image.downloaded`); returns once
    /// the broker has accepted it. The backend adds the `imagepipe-event-type` header.
    async fn publish(&self, event_type: &str, message: Message) -> Result<(), BusError>;

    /// Joins (creating if new) the subscriber group of `subscription`, durable or expiring when
    /// idle as its [`GroupLifetime`](crate::GroupLifetime) says. The start position applies only
    /// when the group is created; a known group resumes where it was.
    async fn subscribe(&self, subscription: Subscription) -> Result<Box<dyn Consumer>, BusError>;
}
