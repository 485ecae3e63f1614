//! [`Consumer`] over partitions of a task queue. Partition `p` of `queue` is the subject
//! `<prefix>.<queue>.<p>` in the work-queue stream. How the server is asked for them depends
//! on its version:
//! - **NATS 2.10+**: one consumer for all the partitions opened together, with a filter
//!   subject per partition (`<queue consumer>_g<unique>`). It is created for this opening
//!   and deleted when the consumer is dropped; an earlier consumer of any of its partitions
//!   (an earlier owner's, one left by a replica that died) is deleted when it is created. A
//!   replica owning 32 shards thus has one consumer and one waiting pull per lane instead of
//!   32: the server's cost per message grows with the consumers on the stream.
//! - **NATS 2.9** (one filter per consumer): a durable consumer per partition,
//!   `<queue consumer>_p<p>`, kept on the server and reused by each owner in turn.
//!
//! A fetch must not ask every consumer in turn, so each has a task that keeps one pull
//! request waiting on the server (`expires` [`PULL_EXPIRY`]) and puts what arrives into one
//! buffer that `fetch` drains. A task asks for no more than its free room in the buffer
//! ([`PREFETCH`] per partition, at most [`GROUP_PREFETCH`] for a group), so what waits there
//! is bounded and handed out well within its ack deadline.
//!
//! Dropping the consumer gives back at once what it holds and has not handed out: each task
//! unsubscribes its outstanding request (so the server hands it nothing more, not even what
//! is given back), then nacks without delay its messages in the buffer and what was already
//! on its way, so the next consumer of the partition gets them in order without waiting for
//! their ack deadline. A message that reaches the client after the subscription is gone is
//! redelivered after its deadline. A group's consumer is then deleted, once nothing it
//! delivered waits for an ack on the server (at most [`consumers::SETTLE_LIMIT`]): an ack
//! the server had not applied yet would otherwise be lost with it. The stream keeps every
//! unacked message for the next consumer of those partitions. Deliveries still held after
//! that are delivered again to the next consumer at once (at least once, as always; the
//! coordinator's fenced writes make the second handling harmless).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::Subscriber;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::BatchConfig;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self, AckKind};
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
use super::names::{group_durable, partition_durable, partition_of_subject};
use super::pull::{Answer, Inbox, answer};
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
/// Messages a group's consumer may hold in the buffer (a coordinator's batch is 128).
const GROUP_PREFETCH: usize = 256;
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
    /// Its partition (from its subject, for a group's consumer).
    partition: Option<u16>,
    /// The task that pulled it.
    puller: usize,
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

    /// Takes every message pulled by `puller`, oldest first (a stopping task's).
    fn take_from(&self, puller: usize) -> Vec<Pulled> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        let (of, rest): (VecDeque<Pulled>, VecDeque<Pulled>) =
            std::mem::take(&mut *items).into_iter().partition(|pulled| pulled.puller == puller);
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
    /// Opens the server's consumers of `partitions` of `queue` (see the module docs) and
    /// starts pulling from each.
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
        let spec = |durable: String, description: String, filter: String| ConsumerSpec {
            durable,
            description,
            filter,
            deliver: DeliverPolicy::All,
            consumer: config.clone(),
            inactive_threshold: None,
        };
        let opened: Vec<(Scope, ConsumerSpec, PullConsumer)> =
            if consumers::takes_filter_lists(&shared.client.server_info().version) {
                let unique = uuid::Uuid::new_v4().simple().to_string();
                let spec = spec(
                    group_durable(queue, &unique),
                    format!("imagepipe queue {queue}, {} partitions", subjects.len()),
                    String::new(),
                );
                let filters: Vec<String> = subjects.into_iter().map(|(_, subject)| subject).collect();
                let consumer =
                    consumers::create_group(&shared.js, &stream, queue, &spec, &filters, &shared.config, true).await?;
                vec![(Scope::Group { filters }, spec, consumer)]
            } else {
                futures::future::try_join_all(subjects.into_iter().map(|(partition, filter)| {
                    let spec = spec(
                        partition_durable(queue, partition),
                        format!("imagepipe queue {queue} partition {partition}"),
                        filter,
                    );
                    let (stream, nats) = (&stream, &shared.config);
                    async move {
                        let consumer = consumers::ensure(stream, &spec, nats).await?;
                        Ok::<_, BusError>((Scope::Partition(partition), spec, consumer))
                    }
                }))
                .await?
            };

        let stream_name = stream.cached_info().config.name.clone();
        let dead_letter_queue = names::dead_letter_queue(queue);
        let buffer = Arc::new(Buffer { items: Mutex::new(VecDeque::new()), filled: Notify::new() });
        let (stop, stopped) = watch::channel(false);
        for (id, (scope, spec, consumer)) in opened.into_iter().enumerate() {
            let target = Arc::new(DeadLetterTarget {
                source: queue.to_owned(),
                queue: dead_letter_queue.clone(),
                origin: format!("{stream_name}.{}", spec.durable),
            });
            let room = match &scope {
                Scope::Partition(_) => PREFETCH,
                Scope::Group { filters, .. } => (PREFETCH * filters.len()).min(GROUP_PREFETCH),
            };
            let task = Puller {
                shared: shared.clone(),
                stream: stream.clone(),
                spec,
                consumer,
                scope,
                id,
                target,
                buffer: buffer.clone(),
                room: Arc::new(Semaphore::new(room)),
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
                    delivery.message.partition = pulled.partition;
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

/// What one pulling task reads.
enum Scope {
    /// One partition, through its durable consumer (NATS 2.9).
    Partition(u16),
    /// Partitions through one consumer with a filter subject each (NATS 2.10+),
    /// deleted when the task stops.
    Group { filters: Vec<String> },
}

impl Scope {
    /// The partition of `message`, which this scope's consumer delivered.
    fn partition_of(&self, message: &async_nats::Message) -> Option<u16> {
        match self {
            Scope::Partition(partition) => Some(*partition),
            Scope::Group { .. } => partition_of_subject(&message.subject),
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scope::Partition(partition) => write!(f, "partition {partition}"),
            Scope::Group { filters, .. } => write!(f, "a group of {} partitions", filters.len()),
        }
    }
}

/// Keeps one pull request of one consumer waiting on the server and moves what it brings
/// into the buffer.
struct Puller {
    shared: Arc<Shared>,
    stream: Stream,
    spec: ConsumerSpec,
    consumer: PullConsumer,
    scope: Scope,
    /// Tells its messages in the buffer from other tasks'.
    id: usize,
    target: Arc<DeadLetterTarget>,
    buffer: Arc<Buffer>,
    room: Arc<Semaphore>,
    stopped: watch::Receiver<bool>,
}

impl Puller {
    /// Pulls until the consumer is dropped or the bus closed.
    async fn run(mut self) {
        let mut retry = RETRY_MIN;
        let mut kept: Option<Inbox> = None;
        while self.shared.check_open().is_ok() {
            let Some(want) = self.wait_for_room().await else { break };
            let mut inbox = match kept.take() {
                Some(open) => open,
                None => match Inbox::open(&self.shared.client).await {
                    Ok(inbox) => inbox,
                    Err(err) => {
                        self.room.add_permits(want);
                        if !self.pause(&mut retry, &format!("subscribing to an inbox: {err}")).await {
                            break;
                        }
                        continue;
                    }
                },
            };
            let (ended, received) = self.pull(want, &mut inbox).await;
            self.room.add_permits(want - received);
            match ended {
                Ended::Done => {
                    retry = RETRY_MIN;
                    kept = Some(inbox);
                }
                Ended::Lost => {}
                Ended::Failed(reason) => {
                    if !self.pause(&mut retry, &reason).await {
                        break;
                    }
                    self.recover().await;
                }
                Ended::Stopping => {
                    self.hand_back(Some(inbox.subscriber)).await;
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
    async fn pull(&self, want: usize, inbox: &mut Inbox) -> (Ended, usize) {
        let statistics = self.shared.client.statistics();
        let connects = statistics.connects.load(Ordering::Relaxed);
        let request = BatchConfig { batch: want, expires: Some(PULL_EXPIRY), ..BatchConfig::default() };
        if let Err(err) = self.consumer.request_batch(request, inbox.subject.clone()).await {
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
                next = inbox.subscriber.next() => match next.map(answer) {
                    None => return (Ended::Lost, received),
                    Some(Answer::Message(message)) => {
                        received += 1;
                        self.keep(message);
                        if received == want {
                            return (Ended::Done, received);
                        }
                    }
                    Some(Answer::Heartbeat) => {}
                    Some(Answer::Ended) => return (Ended::Done, received),
                    Some(Answer::Refused(reason)) => return (Ended::Failed(reason), received),
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
            partition: self.scope.partition_of(&message),
            puller: self.id,
            message: jetstream::Message { message, context: self.shared.js.clone() },
            target: self.target.clone(),
            room: self.room.clone(),
        });
    }

    /// Gives back everything this task holds: first ends the subscription of the outstanding
    /// request, if any (so that the server hands nothing more to it, the messages given back
    /// included), then nacks what waits in the buffer, then what was already on its way to
    /// the subscription. A group's consumer is then deleted, once what it delivered is settled
    /// on the server (or after [`consumers::SETTLE_LIMIT`]).
    async fn hand_back(&self, outstanding: Option<Subscriber>) {
        let mut draining = None;
        if let Some(mut subscriber) = outstanding {
            match subscriber.drain().await {
                Ok(()) => draining = Some(subscriber),
                Err(err) => tracing::debug!(source = %self.target.source, scope = %self.scope, error = %err,
                    "ending a consumer's subscription failed"),
            }
        }
        if draining.is_some() {
            // A round trip through the server: the unsubscribe before it is then processed, so
            // the request it ended takes none of what is given back.
            if let Err(err) = self.stream.consumer_info(&self.spec.durable).await {
                tracing::debug!(source = %self.target.source, scope = %self.scope, error = %err,
                    "waiting for the server to end a pull request failed");
            }
        }
        for pulled in self.buffer.take_from(self.id) {
            give_back(pulled.message, &self.target).await;
        }
        if let Some(mut subscriber) = draining {
            let until = Instant::now() + DRAIN_LIMIT;
            while let Ok(Some(next)) = tokio::time::timeout_at(until, subscriber.next()).await {
                if let Answer::Message(message) = answer(next) {
                    give_back(jetstream::Message { message, context: self.shared.js.clone() }, &self.target).await;
                }
            }
        }
        if let Scope::Group { .. } = self.scope
            && !consumers::delete_when_settled(&self.stream, &self.spec.durable, consumers::SETTLE_LIMIT).await
        {
            tracing::debug!(consumer = %self.spec.durable,
                "a group's consumer was not deleted; the next owner of its partitions deletes it");
        }
    }

    /// Waits `retry` after a failure, doubling it up to [`RETRY_MAX`] for the next one; false
    /// when the consumer was dropped meanwhile.
    async fn pause(&mut self, retry: &mut Duration, reason: &str) -> bool {
        let wait = *retry;
        *retry = (wait * 2).min(RETRY_MAX);
        tracing::warn!(source = %self.target.source, scope = %self.scope, error = reason,
            "pulling from a partitions' consumer failed; trying again in {wait:?}");
        tokio::select! {
            _ = tokio::time::sleep(wait) => true,
            _ = stopping(&mut self.stopped) => false,
        }
    }

    /// After a failed pull: recreates the streams and the consumer if the server lost them (a
    /// restarted server with memory storage, an operator deleting them). A group's consumer is
    /// recreated only if no other consumer reads its partitions meanwhile: one that does
    /// belongs to their new owner, and this one's owner is about to let them go.
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
                    match &self.scope {
                        Scope::Partition(_) => consumers::ensure(&self.stream, &self.spec, &shared.config).await,
                        Scope::Group { filters } => {
                            consumers::create_group(
                                &shared.js,
                                &self.stream,
                                &self.target.source,
                                &self.spec,
                                filters,
                                &shared.config,
                                false,
                            )
                            .await
                        }
                    }
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
