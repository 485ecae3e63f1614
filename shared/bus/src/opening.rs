//! Which consumers a [`Bus`](crate::Bus) is still opening: a service is ready to take work
//! only once every consumer it asked for is open. Joining a Kafka group can take seconds, and
//! a subscriber group starting at "new events" would miss what is published in between while
//! the service already reported ready.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;

use crate::config::{ConsumerConfig, Subscription};
use crate::error::BusError;
use crate::inspect::Backlog;
use crate::message::Message;
use crate::traits::{Consumer, EventBus, TaskQueue};

/// Counts of consumers being opened and opened, shared by a bus and its clones.
#[derive(Debug, Default)]
pub(crate) struct Openings {
    opening: AtomicUsize,
    opened: AtomicUsize,
}

impl Openings {
    /// At least one consumer is open and none is still opening.
    pub(crate) fn settled(&self) -> bool {
        self.opening.load(Ordering::Acquire) == 0 && self.opened.load(Ordering::Acquire) > 0
    }

    /// Counts an opening from now (not from the first poll), so that consumers requested
    /// together never leave a moment where none is counted as opening.
    fn start(self: &Arc<Self>) -> Opening {
        self.opening.fetch_add(1, Ordering::AcqRel);
        Opening { openings: self.clone() }
    }
}

/// One consumer being opened; counted as opened by [`Opening::finish`] when it succeeded.
struct Opening {
    openings: Arc<Openings>,
}

impl Opening {
    fn finish<T>(self, result: Result<T, BusError>) -> Result<T, BusError> {
        if result.is_ok() {
            self.openings.opened.fetch_add(1, Ordering::AcqRel);
        }
        result
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.openings.opening.fetch_sub(1, Ordering::AcqRel);
    }
}

type Opened<'a> = Pin<Box<dyn Future<Output = Result<Box<dyn Consumer>, BusError>> + Send + 'a>>;

/// The largest message a bus sends, shared by a bus and its clones; every backend's sends are
/// checked against it in one place, before anything reaches the broker.
#[derive(Debug)]
pub(crate) struct SizeLimit(AtomicUsize);

impl SizeLimit {
    pub(crate) fn new(max: usize) -> Self {
        Self(AtomicUsize::new(max))
    }

    pub(crate) fn set(&self, max: usize) {
        self.0.store(max, Ordering::Release);
    }

    fn check(&self, destination: &str, message: &Message) -> Result<(), BusError> {
        let (size, max) = (message.size(), self.0.load(Ordering::Acquire));
        if size > max { Err(BusError::TooLarge { destination: destination.to_owned(), size, max }) } else { Ok(()) }
    }
}

/// A backend's task queues, counting the consumers opened through them and refusing messages
/// over the size limit.
pub(crate) struct CountedQueues {
    pub(crate) inner: Arc<dyn TaskQueue>,
    pub(crate) openings: Arc<Openings>,
    pub(crate) limit: Arc<SizeLimit>,
}

#[async_trait]
impl TaskQueue for CountedQueues {
    async fn send(&self, queue: &str, message: Message) -> Result<(), BusError> {
        self.limit.check(queue, &message)?;
        self.inner.send(queue, message).await
    }

    async fn send_batch(&self, queue: &str, messages: Vec<Message>) -> Result<(), BusError> {
        messages.iter().try_for_each(|m| self.limit.check(queue, m))?;
        self.inner.send_batch(queue, messages).await
    }

    fn consume<'s, 'q, 'f>(&'s self, queue: &'q str, config: ConsumerConfig) -> Opened<'f>
    where
        's: 'f,
        'q: 'f,
        Self: 'f,
    {
        let opening = self.openings.start();
        Box::pin(async move { opening.finish(self.inner.consume(queue, config).await) })
    }

    fn consume_partitions<'s, 'q, 'p, 'f>(
        &'s self,
        queue: &'q str,
        partitions: &'p [u16],
        config: ConsumerConfig,
    ) -> Opened<'f>
    where
        's: 'f,
        'q: 'f,
        'p: 'f,
        Self: 'f,
    {
        let opening = self.openings.start();
        Box::pin(async move { opening.finish(self.inner.consume_partitions(queue, partitions, config).await) })
    }

    fn routes_by_key(&self) -> bool {
        self.inner.routes_by_key()
    }

    async fn flush(&self) -> Result<(), BusError> {
        self.inner.flush().await
    }

    async fn backlog(&self, queue: &str) -> Result<Option<Backlog>, BusError> {
        self.inner.backlog(queue).await
    }

    async fn oldest(&self, queue: &str) -> Result<Option<u64>, BusError> {
        self.inner.oldest(queue).await
    }
}

/// A backend's event topics, counting the subscriptions opened through them and refusing
/// messages over the size limit.
pub(crate) struct CountedEvents {
    pub(crate) inner: Arc<dyn EventBus>,
    pub(crate) openings: Arc<Openings>,
    pub(crate) limit: Arc<SizeLimit>,
}

#[async_trait]
impl EventBus for CountedEvents {
    async fn publish(&self, event_type: &str, message: Message) -> Result<(), BusError> {
        self.limit.check(event_type, &message)?;
        self.inner.publish(event_type, message).await
    }

    fn subscribe<'s, 'f>(&'s self, subscription: Subscription) -> Opened<'f>
    where
        's: 'f,
        Self: 'f,
    {
        let opening = self.openings.start();
        Box::pin(async move { opening.finish(self.inner.subscribe(subscription).await) })
    }
}

#[cfg(all(test, feature = "memory"))]
mod tests {
    use crate::config::BusConfig;
    use crate::{Bus, ConsumerConfig, Selector, Subscription};

    #[tokio::test]
    async fn a_bus_is_settled_once_every_requested_consumer_is_open() {
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        assert!(!bus.consumers_open(), "nothing opened yet");

        let queue = bus.queues.consume("tasks.download", ConsumerConfig::default());
        let group = bus.events.subscribe(Subscription::new("audit", Selector::all()));
        assert!(!bus.consumers_open(), "requested, not yet open");
        let queue = queue.await.unwrap();
        assert!(!bus.consumers_open(), "one of two still opening");
        let group = group.await.unwrap();
        assert!(bus.consumers_open());

        assert!(bus.clone().consumers_open(), "clones share the count");
        let failed = bus.queues.consume("not a queue name!", ConsumerConfig::default()).await;
        assert!(failed.is_err());
        assert!(bus.consumers_open(), "a failed open is no longer opening");
        drop((queue, group));
    }
}
