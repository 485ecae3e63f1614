//! A [`Bus`] that counts every message published through it, by destination: the broker
//! message count of backends whose broker cannot be asked (the in-process bus, Kafka).
//! A message counts when it is handed to the backend, so a publish whose acknowledgement is
//! still on its way is counted (and a failed attempt too: its retry is another message).
//! Dead letters a backend writes by itself are not publishes through the bus and are not
//! counted here.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use imagepipe_bus::{Backlog, Bus, BusError, Consumer, ConsumerConfig, EventBus, Message, Subscription, TaskQueue};

/// Publishes accepted so far, by queue name or event type.
#[derive(Clone, Default)]
pub struct Counts(Arc<Mutex<BTreeMap<String, u64>>>);

impl Counts {
    fn add(&self, destination: &str, n: u64) {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match counts.get_mut(destination) {
            Some(count) => *count += n,
            None => {
                counts.insert(destination.to_owned(), n);
            }
        }
    }

    /// Every destination's count now.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The sum over every destination now.
    pub fn total(&self) -> u64 {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).values().sum()
    }
}

/// The per-destination counts of `after` minus those of `before`.
pub fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

struct CountingQueues {
    inner: Arc<dyn TaskQueue>,
    counts: Counts,
}

#[async_trait]
impl TaskQueue for CountingQueues {
    async fn send(&self, queue: &str, message: Message) -> Result<(), BusError> {
        self.counts.add(queue, 1);
        self.inner.send(queue, message).await
    }

    async fn send_batch(&self, queue: &str, messages: Vec<Message>) -> Result<(), BusError> {
        self.counts.add(queue, messages.len() as u64);
        self.inner.send_batch(queue, messages).await
    }

    async fn flush(&self) -> Result<(), BusError> {
        self.inner.flush().await
    }

    async fn consume(&self, queue: &str, config: ConsumerConfig) -> Result<Box<dyn Consumer>, BusError> {
        self.inner.consume(queue, config).await
    }

    async fn consume_partitions(
        &self,
        queue: &str,
        partitions: &[u16],
        config: ConsumerConfig,
    ) -> Result<Box<dyn Consumer>, BusError> {
        self.inner.consume_partitions(queue, partitions, config).await
    }

    fn routes_by_key(&self) -> bool {
        self.inner.routes_by_key()
    }

    async fn backlog(&self, queue: &str) -> Result<Option<Backlog>, BusError> {
        self.inner.backlog(queue).await
    }

    async fn oldest(&self, queue: &str) -> Result<Option<u64>, BusError> {
        self.inner.oldest(queue).await
    }
}

struct CountingEvents {
    inner: Arc<dyn EventBus>,
    counts: Counts,
}

#[async_trait]
impl EventBus for CountingEvents {
    async fn publish(&self, event_type: &str, message: Message) -> Result<(), BusError> {
        self.counts.add(event_type, 1);
        self.inner.publish(event_type, message).await
    }

    async fn subscribe(&self, subscription: Subscription) -> Result<Box<dyn Consumer>, BusError> {
        self.inner.subscribe(subscription).await
    }
}

/// `bus`, counting what is published through it into the returned [`Counts`].
pub fn counting(bus: Bus) -> (Bus, Counts) {
    let counts = Counts::default();
    let queues = Arc::new(CountingQueues { inner: bus.queues.clone(), counts: counts.clone() });
    let events = Arc::new(CountingEvents { inner: bus.events.clone(), counts: counts.clone() });
    let connected = Arc::new(move || bus.is_connected());
    (Bus::from_parts(queues, events, connected), counts)
}

#[cfg(test)]
mod tests {
    use imagepipe_bus::BusConfig;

    use super::*;

    #[tokio::test]
    async fn sends_batches_and_publishes_are_counted_by_destination_attempts_included() {
        let (bus, counts) = counting(Bus::connect(&BusConfig::default()).await.unwrap());
        let before = counts.snapshot();
        bus.queues.send("tasks.submit", Message::new("a")).await.unwrap();
        bus.queues.send_batch("tasks.submit", vec![Message::new("b"), Message::new("c")]).await.unwrap();
        bus.events.publish("task.completed", Message::new("d")).await.unwrap();
        assert!(bus.queues.send("not a queue", Message::new("x")).await.is_err());
        let after = counts.snapshot();
        let expected: BTreeMap<String, u64> =
            [("not a queue".into(), 1), ("task.completed".into(), 1), ("tasks.submit".into(), 3)].into();
        assert_eq!(delta(&before, &after), expected);
        assert_eq!(counts.total(), 5);
        assert!(bus.is_connected());
    }
}
