//! [`Consumer`] over partitions of a task queue: partition `p` of `queue` is the subject
//! `<prefix>.<queue>.<p>` in the work-queue stream, read through its own durable consumer
//! `<queue consumer>_p<p>`.
//!
//! A fetch must not ask every partition in turn (64 round trips), so each partition has a
//! task that keeps one pull request waiting on the server (`expires` [`PULL_EXPIRY`]) and puts
//! what arrives into one buffer that `fetch` drains. A partition asks for no more than its
//! free room in the buffer ([`PREFETCH`] per partition), so what waits there is bounded and
//! handed out well within its ack deadline.
//!
//! Dropping the consumer gives back at once what it holds and has not handed out: each task
//! unsubscribes its outstanding request (so the server hands it nothing more, not even what
//! is given back), then nacks without delay its partition's messages in the buffer and what
//! was already on its way, so the next consumer of the partition gets them in order without
//! waiting for their ack deadline. A message that reaches the client after the subscription
//! is gone is redelivered after its deadline.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::BatchConfig;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self, AckKind};
use async_nats::{StatusCode, Subject, Subscriber};
use async_trait::async_trait;
use futures::StreamExt;
use imagepipe_contracts::names;
use tokio::sync::{Notify, Semaphore, watch};
use tokio::time::Instant;

use super::Shared;
use super::advisories::{self, Listener};
use super::consumer::admit;
use super::consumers::{self, ConsumerSpec};
use super::dead_letter::DeadLetterTarget;
use super::names::partition_durable;
use crate::config::ConsumerConfig;
use crate::delivery::Delivery;
use crate::error::BusError;
use crate::traits::Consumer;

/// How long a partition's pull request waits on the server before it is renewed.
const PULL_EXPIRY: Duration = Duration::from_secs(15);
/// Extra time given to the server to end a pull request before the client gives up on it.
const PULL_GRACE: Duration = Duration::from_secs(2);
/// Messages a partition may hold in the buffer, handed out or not yet.
const PREFETCH: usize = 32;
/// How often a waiting pull checks that the connection was not re-established meanwhile
/// (the server forgets pull requests of a lost connection).
const RECONNECT_CHECK: Duration = Duration::from_millis(500);
/// First and longest pause after a failed pull, doubling in between.
const RETRY_MIN: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a stopping task reads what was already on its way after unsubscribing.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// One message pulled for a partition, waiting in the buffer.
struct Pulled {
    partition: u16,
    message: jetstream::Message,
    target: Arc<DeadLetterTarget>,
    /// The partition's room in the buffer; one permit comes back when the message leaves it.
    room: Arc<Semaphore>,
}

/// What the partition tasks pulled and `fetch` has not handed out yet.
struct Buffer {
    items: Mutex<VecDeque<Pulled>>,
    /// Something was put in.
    filled: Notify,
}

impl Buffer {
    fn put(&self, pulled: Pulled) {
        self.items.lock().unwrap_or_else(|e| e.into_inner()).push_back(pulled);
        self.filled.notify_waiters();
    }

    /// Takes up to `max` messages, oldest first, giving their room back to their partitions.
    fn take(&self, max: usize) -> Vec<Pulled> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        let n = max.min(items.len());
        let taken: Vec<Pulled> = items.drain(..n).collect();
        for pulled in &taken {
            pulled.room.add_permits(1);
        }
        taken
    }

    /// Takes every message of `partition`, oldest first (a stopping partition task's).
    fn take_partition(&self, partition: u16) -> Vec<Pulled> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        let (of, rest): (VecDeque<Pulled>, VecDeque<Pulled>) =
            std::mem::take(&mut *items).into_iter().partition(|pulled| pulled.partition == partition);
        *items = rest;
        of.into()
    }
}

/// A consumer over some partitions of one task queue, as seen by one process.
pub(crate) struct PartitionsConsumer {
    shared: Arc<Shared>,
    queue: String,
    max_deliveries: u32,
    buffer: Arc<Buffer>,
    stop: watch::Sender<bool>,
    _advisories: Listener,
}

impl PartitionsConsumer {
    /// Creates (or reuses) the durable consumer of every partition in `partitions` of `queue`,
    /// concurrently, and starts pulling from each.
    pub(crate) async fn open(
        shared: Arc<Shared>,
        queue: &str,
        partitions: &[u16],
        config: ConsumerConfig,
    ) -> Result<Self, BusError> {
        shared.check_open()?;
        if partitions.is_empty() {
            return Err(BusError::Invalid(format!("consumer of partitions of {queue}: no partition given")));
        }
        if config.max_deliveries == 0 {
            return Err(BusError::Invalid(format!("{queue}: max_deliveries must be at least 1")));
        }
        if config.ack_wait < Duration::from_millis(1) {
            return Err(BusError::Invalid(format!("{queue}: ack_wait must be at least 1ms")));
        }
        let mut numbers = partitions.to_vec();
        numbers.sort_unstable();
        numbers.dedup();
        let subjects = numbers
            .iter()
            .map(|&p| Ok((p, shared.names.partition_subject(queue, p)?)))
            .collect::<Result<Vec<_>, BusError>>()?;
        let stream = shared.streams.tasks.clone();
        let stream_name = stream.cached_info().config.name.clone();
        let dead_letter_queue = names::dead_letter_queue(queue);
        let opened = futures::future::try_join_all(subjects.into_iter().map(|(partition, filter)| {
            let spec = ConsumerSpec {
                durable: partition_durable(queue, partition),
                description: format!("imagepipe queue {queue} partition {partition}"),
                filter,
                deliver: DeliverPolicy::All,
                consumer: config.clone(),
                inactive_threshold: None,
            };
            let (stream, nats) = (&stream, &shared.config);
            async move {
                let consumer = consumers::ensure(stream, &spec, nats).await?;
                Ok::<_, BusError>((partition, spec, consumer))
            }
        }))
        .await?;

        let buffer = Arc::new(Buffer { items: Mutex::new(VecDeque::new()), filled: Notify::new() });
        let (stop, stopped) = watch::channel(false);
        for (partition, spec, consumer) in opened {
            let target = Arc::new(DeadLetterTarget {
                source: queue.to_owned(),
                queue: dead_letter_queue.clone(),
                origin: format!("{stream_name}.{}", spec.durable),
            });
            let task = Puller {
                shared: shared.clone(),
                stream: stream.clone(),
                spec,
                consumer,
                partition,
                target,
                buffer: buffer.clone(),
                room: Arc::new(Semaphore::new(PREFETCH)),
                stopped: stopped.clone(),
            };
            tokio::spawn(task.run());
        }
        let listener = advisories::spawn_partitions(shared.clone(), stream, queue.to_owned(), dead_letter_queue);
        Ok(Self {
            shared,
            queue: queue.to_owned(),
            max_deliveries: config.max_deliveries,
            buffer,
            stop,
            _advisories: listener,
        })
    }

    fn connected(&self) -> bool {
        self.shared.client.connection_state() == async_nats::connection::State::Connected
    }
}

#[async_trait]
impl Consumer for PartitionsConsumer {
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        self.shared.check_open()?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let until = Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            let filled = self.buffer.filled.notified();
            tokio::pin!(filled);
            filled.as_mut().enable();
            for pulled in self.buffer.take(max - out.len()) {
                if let Some(mut delivery) =
                    admit(&self.shared, &pulled.target, self.max_deliveries, None, pulled.message).await?
                {
                    delivery.message.partition = Some(pulled.partition);
                    out.push(delivery);
                }
            }
            // Everything taken was dead-lettered: keep waiting for the rest of `wait`.
            if !out.is_empty() {
                return Ok(out);
            }
            if Instant::now() >= until {
                if !self.connected() {
                    return Err(BusError::Receive {
                        source_name: self.queue.clone(),
                        source: "the connection to NATS is down".into(),
                    });
                }
                return Ok(out);
            }
            tokio::select! {
                _ = &mut filled => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }
}

impl Drop for PartitionsConsumer {
    /// Stops the partition tasks, which give back what they pulled (see the module docs).
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

/// Nacks `message` without delay, so the next consumer of its partition gets it at once.
async fn give_back(message: jetstream::Message, target: &DeadLetterTarget) {
    if let Err(err) = message.ack_with(AckKind::Nak(None)).await {
        tracing::debug!(source = %target.source, error = %err,
            "giving back a prefetched message failed; it comes back after its ack deadline");
    }
}

/// Returns once the consumer is dropped.
async fn stopping(stopped: &mut watch::Receiver<bool>) {
    // An error means the consumer, which holds the sender, is gone: stopping too.
    let _ = stopped.wait_for(|stopped| *stopped).await;
}

/// How one pull request ended.
enum Ended {
    /// Served or expired: ask again.
    Done,
    /// The server may have forgotten it (a reconnect, no answer in time): ask again on a new
    /// subscription.
    Lost,
    /// The server refused or ended it with an error.
    Failed(String),
    /// The consumer was dropped.
    Stopping,
}

/// Keeps one pull request of one partition waiting on the server and moves what it brings
/// into the buffer.
struct Puller {
    shared: Arc<Shared>,
    stream: Stream,
    spec: ConsumerSpec,
    consumer: PullConsumer,
    partition: u16,
    target: Arc<DeadLetterTarget>,
    buffer: Arc<Buffer>,
    room: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
}

impl Puller {
    /// Pulls until the consumer is dropped or the bus closed.
    async fn run(mut self) {
        let mut retry = RETRY_MIN;
        let mut inbox: Option<(Subject, Subscriber)> = None;
        while self.shared.check_open().is_ok() {
            let Some(want) = self.wait_for_room().await else { break };
            let (subject, mut subscriber) = match inbox.take() {
                Some(open) => open,
                None => {
                    let subject = Subject::from(self.shared.client.new_inbox());
                    match self.shared.client.subscribe(subject.clone()).await {
                        Ok(subscriber) => (subject, subscriber),
                        Err(err) => {
                            self.room.add_permits(want);
                            if !self.pause(&mut retry, &format!("subscribing to {subject}: {err}")).await {
                                break;
                            }
                            continue;
                        }
                    }
                }
            };
            let (ended, received) = self.pull(want, &subject, &mut subscriber).await;
            self.room.add_permits(want - received);
            match ended {
                Ended::Done => {
                    retry = RETRY_MIN;
                    inbox = Some((subject, subscriber));
                }
                Ended::Lost => {}
                Ended::Failed(reason) => {
                    if !self.pause(&mut retry, &reason).await {
                        break;
                    }
                    self.recover().await;
                }
                Ended::Stopping => {
                    self.hand_back(Some(subscriber)).await;
                    return;
                }
            }
        }
        self.hand_back(None).await;
    }

    /// Waits for room in the buffer and takes all there is; `None` once the consumer is dropped.
    async fn wait_for_room(&mut self) -> Option<usize> {
        let first = tokio::select! {
            biased;
            _ = stopping(&mut self.stopped) => return None,
            permit = self.room.acquire() => permit.ok()?,
        };
        first.forget();
        let more = self.room.available_permits();
        match u32::try_from(more).ok().and_then(|n| self.room.try_acquire_many(n).ok()) {
            Some(permits) if more > 0 => {
                permits.forget();
                Some(1 + more)
            }
            _ => Some(1),
        }
    }

    /// Asks for `want` messages on `inbox` and moves them into the buffer as they come; returns
    /// how the request ended and how many messages it brought.
    async fn pull(&self, want: usize, inbox: &Subject, subscriber: &mut Subscriber) -> (Ended, usize) {
        let statistics = self.shared.client.statistics();
        let connects = statistics.connects.load(Ordering::Relaxed);
        let request = BatchConfig { batch: want, expires: Some(PULL_EXPIRY), ..BatchConfig::default() };
        if let Err(err) = self.consumer.request_batch(request, inbox.clone()).await {
            return (Ended::Failed(format!("asking for messages: {err}")), 0);
        }
        let deadline = tokio::time::sleep(PULL_EXPIRY + PULL_GRACE);
        tokio::pin!(deadline);
        let mut check = tokio::time::interval(RECONNECT_CHECK);
        let mut stopped = self.stopped.clone();
        let mut received = 0;
        loop {
            tokio::select! {
                biased;
                _ = stopping(&mut stopped) => return (Ended::Stopping, received),
                next = subscriber.next() => match next {
                    None => return (Ended::Lost, received),
                    Some(message) => match message.status {
                        None | Some(StatusCode::OK) => {
                            received += 1;
                            self.keep(message);
                            if received == want {
                                return (Ended::Done, received);
                            }
                        }
                        Some(StatusCode::IDLE_HEARTBEAT) => {}
                        Some(StatusCode::TIMEOUT | StatusCode::NOT_FOUND) => return (Ended::Done, received),
                        Some(status) => {
                            let reason = format!(
                                "the server ended the pull request: {status} {}",
                                message.description.unwrap_or_default()
                            );
                            return (Ended::Failed(reason), received);
                        }
                    },
                },
                _ = check.tick() => {
                    if statistics.connects.load(Ordering::Relaxed) != connects {
                        return (Ended::Lost, received);
                    }
                }
                _ = &mut deadline => return (Ended::Lost, received),
            }
        }
    }

    /// Puts a pulled message into the buffer.
    fn keep(&self, message: async_nats::Message) {
        self.buffer.put(Pulled {
            partition: self.partition,
            message: jetstream::Message { message, context: self.shared.js.clone() },
            target: self.target.clone(),
            room: self.room.clone(),
        });
    }

    /// Gives back everything of this partition the consumer holds: first ends the
    /// subscription of the outstanding request, if any (so that the server hands nothing more
    /// to it, the messages given back included), then nacks what waits in the buffer, then
    /// what was already on its way to the subscription.
    async fn hand_back(&self, outstanding: Option<Subscriber>) {
        let mut draining = None;
        if let Some(mut subscriber) = outstanding {
            match subscriber.drain().await {
                Ok(()) => draining = Some(subscriber),
                Err(err) => tracing::debug!(source = %self.target.source, partition = self.partition, error = %err,
                    "ending a partition's subscription failed"),
            }
        }
        if draining.is_some() {
            // A round trip through the server: the unsubscribe before it is then processed, so
            // the request it ended takes none of what is given back.
            if let Err(err) = self.stream.consumer_info(&self.spec.durable).await {
                tracing::debug!(source = %self.target.source, partition = self.partition, error = %err,
                    "waiting for the server to end a partition's pull request failed");
            }
        }
        for pulled in self.buffer.take_partition(self.partition) {
            give_back(pulled.message, &self.target).await;
        }
        let Some(mut subscriber) = draining else { return };
        let until = Instant::now() + DRAIN_LIMIT;
        while let Ok(Some(message)) = tokio::time::timeout_at(until, subscriber.next()).await {
            if matches!(message.status, None | Some(StatusCode::OK)) {
                give_back(jetstream::Message { message, context: self.shared.js.clone() }, &self.target).await;
            }
        }
    }

    /// Waits `retry` after a failure, doubling it up to [`RETRY_MAX`] for the next one; false
    /// when the consumer was dropped meanwhile.
    async fn pause(&mut self, retry: &mut Duration, reason: &str) -> bool {
        let wait = *retry;
        *retry = (wait * 2).min(RETRY_MAX);
        tracing::warn!(source = %self.target.source, partition = self.partition, error = reason,
            "pulling from a partition failed; trying again in {wait:?}");
        tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = stopping(&mut self.stopped) => false,
        }
    }

    /// After a failed pull: recreates the streams and the partition's consumer if the server
    /// lost them (a restarted server with memory storage, an operator deleting them).
    async fn recover(&mut self) {
        if self.shared.check_open().is_err() {
            return;
        }
        match self.stream.consumer_info(&self.spec.durable).await {
            Ok(_) => {}
            Err(err) if consumers::is_missing(&err) => {
                tracing::warn!(consumer = %self.spec.durable, "consumer is gone from the server; recreating it");
                let shared = &self.shared;
                let recreated = async {
                    super::streams::ensure(&shared.js, &shared.names, &shared.config).await?;
                    consumers::ensure(&self.stream, &self.spec, &shared.config).await
                }
                .await;
                match recreated {
                    Ok(consumer) => self.consumer = consumer,
                    Err(err) => {
                        tracing::warn!(consumer = %self.spec.durable, error = %err, "recreating the consumer failed")
                    }
                }
            }
            Err(err) => {
                tracing::debug!(consumer = %self.spec.durable, error = %err, "asking for the consumer failed");
            }
        }
    }
}
