//! The in-process backend: JetStream's semantics without a broker, for `imagepipe run` and tests.
//!
//! - Every queue and subscriber group is bounded by [`MemoryConfig::capacity`] (ready, delayed
//!   and in-flight messages); a send waits up to [`MemoryConfig::send_timeout`] for room, then
//!   fails with [`BusError::Full`].
//! - A delivery not settled within its consumer's `ack_wait` is redelivered; the expired
//!   `max_deliveries`-th one is dead-lettered instead. Dead letters go to the ordinary queue
//!   `dlq.<queue>` (or `dlq.events.<group>`) with the dead-letter headers.
//! - First deliveries keep send order, so messages with the same key arrive in order.
//! - Partition `p` of a queue ([`Message::partition`], [`TaskQueue::consume_partitions`]) is a
//!   queue of its own with the same rules, dead-lettering into the queue's `dlq.<queue>`.
//! - A message whose id was accepted on the same queue or topic within
//!   [`MemoryConfig::dedup_window`] is accepted and dropped.
//! - Each topic retains its last [`MemoryConfig::retention`] events for groups that start from
//!   the beginning or from a time.
//! - A group that expires when idle ([`GroupLifetime::UntilIdle`]) is deleted when its last
//!   consumer is dropped.
//!
//! Time is tokio time, so tests can pause it. There are no background tasks: due times are
//! acted on by `fetch`. Dropping the last handle of the bus closes every queue: waiting calls
//! return [`BusError::Closed`].

mod consumer;
mod dedup;
mod handle;
mod partitions;
mod queue;
mod topics;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use imagepipe_contracts::names;

use crate::bus::Bus;
pub use crate::config::MemoryConfig;
use crate::config::{ConsumerConfig, GroupLifetime, Subscription, is_valid_name};
use crate::error::BusError;
use crate::inspect::Backlog;
use crate::message::Message;
use crate::selector::is_valid_event_type;
use crate::traits::{Consumer, EventBus, TaskQueue};
use consumer::{Member, MemoryConsumer};
use partitions::PartitionsConsumer;
use queue::Queue;
use tokio::sync::Notify;
use topics::Events;

/// An in-process bus; clones share the same queues and topics.
#[derive(Clone)]
pub struct MemoryBus {
    shared: Arc<Shared>,
}

struct Shared {
    prefix: String,
    config: MemoryConfig,
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    partitions: Mutex<Partitions>,
    events: Events,
}

/// The partitions of every queue, created on first use.
#[derive(Default)]
struct Partitions {
    queues: HashMap<(String, u16), Arc<Queue>>,
    /// Per queue: notified whenever one of its partitions may have something for a fetch.
    families: HashMap<String, Arc<Notify>>,
}

impl MemoryBus {
    /// An empty bus whose names start with `prefix` (in logs and errors).
    pub fn new(prefix: String, config: MemoryConfig) -> Self {
        let events = Events::new(prefix.clone(), config.clone());
        let shared = Shared {
            prefix,
            config,
            queues: Mutex::new(HashMap::new()),
            partitions: Mutex::new(Partitions::default()),
            events,
        };
        Self { shared: Arc::new(shared) }
    }

    /// This bus as a [`Bus`]; it is always connected.
    pub fn into_bus(self) -> Bus {
        Bus::from_parts(Arc::new(self.clone()), Arc::new(self), Arc::new(|| true))
    }

    /// The prefix of every name.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The queue called `name`, created empty on first use.
    fn queue(&self, name: &str) -> Arc<Queue> {
        let shared = &self.shared;
        let mut queues = shared.queues.lock().expect("memory bus registry lock poisoned");
        queues
            .entry(name.to_owned())
            .or_insert_with(|| {
                Arc::new(Queue::new(
                    name.to_owned(),
                    format!("{}.{name}", shared.prefix),
                    shared.config.capacity,
                    shared.config.send_timeout,
                    shared.config.dedup_window,
                    None,
                ))
            })
            .clone()
    }

    /// Partition `partition` of queue `name`, created empty on first use, and the notifier
    /// the partitions of `name` share.
    fn partition(&self, name: &str, partition: u16) -> (Arc<Queue>, Arc<Notify>) {
        let shared = &self.shared;
        let mut partitions = shared.partitions.lock().expect("memory bus registry lock poisoned");
        let family = partitions.families.entry(name.to_owned()).or_default().clone();
        let queue = partitions
            .queues
            .entry((name.to_owned(), partition))
            .or_insert_with(|| {
                Arc::new(Queue::new(
                    name.to_owned(),
                    format!("{}.{name}.{partition}", shared.prefix),
                    shared.config.capacity,
                    shared.config.send_timeout,
                    shared.config.dedup_window,
                    Some(family.clone()),
                ))
            })
            .clone();
        (queue, family)
    }

    /// Where `message` goes on `queue`: the queue itself, or the partition it names.
    fn destination(&self, queue: &str, message: &Message) -> Result<Arc<Queue>, BusError> {
        match message.partition {
            None => Ok(self.queue(queue)),
            Some(partition) => {
                check_partitioned(queue)?;
                Ok(self.partition(queue, partition).0)
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        for queue in self.queues.get_mut().map(|q| q.values()).into_iter().flatten() {
            queue.close();
        }
        for queue in self.partitions.get_mut().map(|p| p.queues.values()).into_iter().flatten() {
            queue.close();
        }
        self.events.close();
    }
}

fn check_queue_name(queue: &str) -> Result<(), BusError> {
    if is_valid_name(queue) {
        Ok(())
    } else {
        Err(BusError::Invalid(format!("queue name {queue:?}: use dot-separated tokens of [A-Za-z0-9_-]")))
    }
}

/// Dead-letter queues have no partitions: their messages come from every partition.
fn check_partitioned(queue: &str) -> Result<(), BusError> {
    if queue.split('.').next() == Some(names::DLQ) {
        return Err(BusError::Invalid(format!("{queue}: a dead-letter queue has no partitions")));
    }
    Ok(())
}

fn check_consumer(what: &str, config: &ConsumerConfig) -> Result<(), BusError> {
    if config.ack_wait.is_zero() {
        return Err(BusError::Invalid(format!("consumer of {what}: ack_wait must be more than zero")));
    }
    if config.max_deliveries == 0 {
        return Err(BusError::Invalid(format!("consumer of {what}: max_deliveries must be at least 1")));
    }
    Ok(())
}

#[async_trait]
impl TaskQueue for MemoryBus {
    async fn send(&self, queue: &str, message: Message) -> Result<(), BusError> {
        check_queue_name(queue)?;
        self.destination(queue, &message)?.push(message, true).await
    }

    async fn send_batch(&self, queue: &str, messages: Vec<Message>) -> Result<(), BusError> {
        check_queue_name(queue)?;
        for message in messages {
            self.destination(queue, &message)?.push(message, true).await?;
        }
        Ok(())
    }

    async fn consume(&self, queue: &str, config: ConsumerConfig) -> Result<Box<dyn Consumer>, BusError> {
        check_queue_name(queue)?;
        check_consumer(queue, &config)?;
        let dlq = self.queue(&names::dead_letter_queue(queue));
        Ok(Box::new(MemoryConsumer { queue: self.queue(queue), dlq, config, _member: None }))
    }

    async fn consume_partitions(
        &self,
        queue: &str,
        partitions: &[u16],
        config: ConsumerConfig,
    ) -> Result<Box<dyn Consumer>, BusError> {
        check_queue_name(queue)?;
        check_partitioned(queue)?;
        check_consumer(queue, &config)?;
        if partitions.is_empty() {
            return Err(BusError::Invalid(format!("consumer of partitions of {queue}: no partition given")));
        }
        let mut numbers = partitions.to_vec();
        numbers.sort_unstable();
        numbers.dedup();
        let family = self.partition(queue, numbers[0]).1;
        let partitions = numbers.into_iter().map(|p| (p, self.partition(queue, p).0)).collect();
        let dlq = self.queue(&names::dead_letter_queue(queue));
        Ok(Box::new(PartitionsConsumer {
            queue: queue.to_owned(),
            partitions,
            family,
            dlq,
            config,
            next: std::sync::atomic::AtomicUsize::new(0),
        }))
    }

    async fn backlog(&self, queue: &str) -> Result<Option<Backlog>, BusError> {
        let queues = self.shared.queues.lock().expect("memory bus registry lock poisoned");
        Ok(queues.get(queue).map(|q| q.backlog()))
    }

    async fn oldest(&self, queue: &str) -> Result<Option<u64>, BusError> {
        let queues = self.shared.queues.lock().expect("memory bus registry lock poisoned");
        Ok(queues.get(queue).and_then(|q| q.oldest()))
    }
}

#[async_trait]
impl EventBus for MemoryBus {
    async fn publish(&self, event_type: &str, message: Message) -> Result<(), BusError> {
        if !is_valid_event_type(event_type) {
            return Err(BusError::Invalid(format!("event type {event_type:?}: use dot-separated tokens of [a-z0-9_]")));
        }
        self.shared.events.publish(event_type, message).await
    }

    async fn subscribe(&self, subscription: Subscription) -> Result<Box<dyn Consumer>, BusError> {
        let group = &subscription.group;
        if group.contains('.') || !is_valid_name(group) {
            return Err(BusError::Invalid(format!("subscriber group {group:?}: use [A-Za-z0-9_-]")));
        }
        check_consumer(&format!("subscriber group {group}"), &subscription.consumer)?;
        let queue = self.shared.events.join(&subscription);
        let dlq = self.queue(&names::dead_letter_queue_of_group(group));
        let member = match subscription.lifetime {
            GroupLifetime::Durable => None,
            GroupLifetime::UntilIdle(_) => {
                Some(Member { shared: Arc::downgrade(&self.shared), group: subscription.group.clone() })
            }
        };
        Ok(Box::new(MemoryConsumer { queue, dlq, config: subscription.consumer, _member: member }))
    }
}
