//! [`Consumer`] over a durable pull consumer: fetching, the client-side part of selectors, and
//! dead-lettering deliveries past `max_deliveries`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::consumer::pull::BatchConfig;
use async_nats::jetstream::stream::Stream;
use async_nats::jetstream::{self, AckKind};
use async_trait::async_trait;
use futures::StreamExt;
use imagepipe_contracts::names::headers;
use tokio::time::Instant;

use super::Shared;
use super::advisories::{self, Listener};
use super::codec;
use super::consumers::{self, ConsumerSpec};
use super::dead_letter::DeadLetterTarget;
use super::handle::NatsAckHandle;
use super::pull::{Answer, Inbox, answer};
use crate::delivery::Delivery;
use crate::error::BusError;
use crate::selector::Selector;
use crate::traits::Consumer;

/// Shortest pull that is worth sending to the server to wait on.
const MIN_WAIT: Duration = Duration::from_millis(10);
/// Extra time given to the server to answer a pull before the client gives up on it.
const PULL_GRACE: Duration = Duration::from_secs(2);
/// How often a waiting pull checks that the connection is still up.
const CONNECTION_CHECK: Duration = Duration::from_millis(250);
/// Inboxes a consumer keeps between fetches: one per fetch running at once (a worker's
/// waiting fetch and its fetch of what is there now). A kept inbox makes a pull cost the
/// server one request, not a subscription made and ended around it. A fetch takes one for
/// itself and puts it back only once its request has ended, so that a late answer to a
/// request it gave up on (or a fetch dropped midway) reaches no other fetch; such an inbox is
/// dropped, which ends its subscription.
const KEPT_INBOXES: usize = 4;

/// One queue or subscriber group, as seen by one process.
pub(crate) struct NatsConsumer {
    shared: Arc<Shared>,
    stream: Stream,
    spec: ConsumerSpec,
    consumer: std::sync::Mutex<PullConsumer>,
    target: Arc<DeadLetterTarget>,
    /// Set for selectors the consumer's single filter subject cannot express exactly.
    selector: Option<Selector>,
    /// A fetch failed: check the consumer still exists before the next one.
    recheck: AtomicBool,
    /// Inboxes not in use by a fetch.
    inboxes: std::sync::Mutex<Vec<Inbox>>,
    _advisories: Listener,
}

impl NatsConsumer {
    /// Creates or updates the consumer of `spec` on `stream` and starts listening for its
    /// max-deliveries advisories. `removes_on_ack` says the stream is a work queue.
    pub(crate) async fn open(
        shared: Arc<Shared>,
        stream: Stream,
        spec: ConsumerSpec,
        source: String,
        dead_letter_queue: String,
        selector: Option<Selector>,
        removes_on_ack: bool,
    ) -> Result<Self, BusError> {
        shared.check_open()?;
        if spec.consumer.max_deliveries == 0 {
            return Err(BusError::Invalid(format!("{source}: max_deliveries must be at least 1")));
        }
        if spec.consumer.ack_wait < Duration::from_millis(1) {
            return Err(BusError::Invalid(format!("{source}: ack_wait must be at least 1ms")));
        }
        let consumer = consumers::ensure(&stream, &spec, &shared.config).await?;
        let origin = format!("{}.{}", stream.cached_info().config.name, spec.durable);
        let target = Arc::new(DeadLetterTarget { source, queue: dead_letter_queue, origin });
        let listener =
            advisories::spawn(shared.clone(), stream.clone(), spec.durable.clone(), target.clone(), removes_on_ack);
        Ok(Self {
            shared,
            stream,
            spec,
            consumer: std::sync::Mutex::new(consumer),
            target,
            selector,
            recheck: AtomicBool::new(false),
            inboxes: std::sync::Mutex::new(Vec::new()),
            _advisories: listener,
        })
    }

    fn receive_error(&self, err: impl Into<crate::error::BoxError>) -> BusError {
        BusError::Receive { source_name: self.target.source.clone(), source: err.into() }
    }

    fn connected(&self) -> bool {
        self.shared.client.connection_state() == State::Connected
    }

    /// After a failed fetch: recreate the streams and the consumer if the server lost them
    /// (a restarted server with memory storage, an operator deleting them).
    async fn recover(&self) -> Result<(), BusError> {
        self.shared.check_open()?;
        match self.stream.consumer_info(&self.spec.durable).await {
            Ok(_) => Ok(()),
            Err(err) if consumers::is_missing(&err) => {
                tracing::warn!(consumer = %self.spec.durable, "consumer is gone from the server; recreating it");
                super::streams::ensure(&self.shared.js, &self.shared.names, &self.shared.config).await?;
                let consumer = consumers::ensure(&self.stream, &self.spec, &self.shared.config).await?;
                *self.consumer.lock().unwrap_or_else(|e| e.into_inner()) = consumer;
                Ok(())
            }
            Err(err) => Err(self.receive_error(err)),
        }
    }

    /// Up to `max` messages: what is there now, or else the first to arrive within `wait`,
    /// returned at once (whatever arrived with it is there for the next fetch, which asks
    /// without waiting: asking for it here would hold the first message one round trip).
    /// Both requests are answered on one kept inbox (see [`KEPT_INBOXES`]).
    async fn pull(&self, max: usize, wait: Duration) -> Result<Vec<jetstream::Message>, BusError> {
        let consumer = self.consumer.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut inbox = self.take_inbox().await?;
        let now = BatchConfig { batch: max, no_wait: true, ..BatchConfig::default() };
        let (mut got, mut ended) = self.request(&consumer, &mut inbox, now, PULL_GRACE).await?;
        if got.is_empty() && ended && wait >= MIN_WAIT {
            let first = BatchConfig { batch: 1, expires: Some(wait), ..BatchConfig::default() };
            (got, ended) = self.request(&consumer, &mut inbox, first, wait + PULL_GRACE).await?;
        }
        if ended {
            let mut kept = self.inboxes.lock().unwrap_or_else(|e| e.into_inner());
            if kept.len() < KEPT_INBOXES {
                kept.push(inbox);
            }
        }
        Ok(got)
    }

    /// A kept inbox, or a new one.
    async fn take_inbox(&self) -> Result<Inbox, BusError> {
        let kept = self.inboxes.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(inbox) = kept {
            return Ok(inbox);
        }
        Inbox::open(&self.shared.client).await.map_err(|err| self.receive_error(err))
    }

    /// Sends one pull request answered on `inbox` and reads its messages until the server
    /// ends it (its batch served, nothing more there, expired), giving up `limit` from now
    /// or as soon as the connection is seen down or re-established (the server forgets the
    /// requests of a lost connection). Returns the messages and whether the request ended:
    /// only then may the inbox carry another, since a late answer to an abandoned one would
    /// reach it.
    async fn request(
        &self,
        consumer: &PullConsumer,
        inbox: &mut Inbox,
        batch: BatchConfig,
        limit: Duration,
    ) -> Result<(Vec<jetstream::Message>, bool), BusError> {
        let statistics = self.shared.client.statistics();
        let connects = statistics.connects.load(Ordering::Relaxed);
        let want = batch.batch;
        consumer.request_batch(batch, inbox.subject.clone()).await.map_err(|err| self.receive_error(err))?;
        let deadline = tokio::time::sleep(limit);
        tokio::pin!(deadline);
        let mut watch = tokio::time::interval(CONNECTION_CHECK);
        let mut got = Vec::new();
        let lost = |got: Vec<jetstream::Message>, why: &str| {
            if got.is_empty() { Err(self.receive_error(why.to_owned())) } else { Ok((got, false)) }
        };
        loop {
            tokio::select! {
                next = inbox.subscriber.next() => match next.map(answer) {
                    None => return lost(got, "the inbox of a pull request was closed"),
                    Some(Answer::Message(message)) => {
                        got.push(jetstream::Message { message, context: self.shared.js.clone() });
                        if got.len() == want {
                            return Ok((got, true));
                        }
                    }
                    Some(Answer::Heartbeat) => {}
                    Some(Answer::Ended) => return Ok((got, true)),
                    Some(Answer::Refused(reason)) => {
                        if got.is_empty() {
                            return Err(self.receive_error(reason));
                        }
                        tracing::debug!(source = %self.target.source, error = %reason, "pull ended early");
                        return Ok((got, true));
                    }
                },
                _ = watch.tick() => {
                    if !self.connected() {
                        return lost(got, "the connection to NATS is down");
                    }
                    if statistics.connects.load(Ordering::Relaxed) != connects {
                        return lost(got, "the connection to NATS was re-established during a pull");
                    }
                }
                _ = &mut deadline => return Ok((got, false)),
            }
        }
    }

    /// Turns a pulled message into a delivery, or settles it here (see [`admit`]).
    async fn admit(&self, message: jetstream::Message) -> Result<Option<Delivery>, BusError> {
        admit(&self.shared, &self.target, self.spec.consumer.max_deliveries, self.selector.as_ref(), message).await
    }
}

/// Turns a message pulled for `target` into a delivery, or settles it here: events `selector`
/// rejects are acked and skipped, deliveries past `max_deliveries` are dead-lettered.
pub(crate) async fn admit(
    shared: &Arc<Shared>,
    target: &Arc<DeadLetterTarget>,
    max_deliveries: u32,
    selector: Option<&Selector>,
    message: jetstream::Message,
) -> Result<Option<Delivery>, BusError> {
    let (stream_seq, delivered) = {
        let info = message
            .info()
            .map_err(|err| BusError::Receive { source_name: target.source.clone(), source: err.to_string().into() })?;
        (info.stream_sequence, u32::try_from(info.delivered.max(1)).unwrap_or(u32::MAX))
    };
    let (raw, acker) = message.split();
    let decoded = codec::decode(raw.headers.as_ref(), raw.payload);
    if let Some(selector) = selector {
        let event_type = decoded
            .headers
            .get(headers::EVENT_TYPE)
            .map(str::to_owned)
            .or_else(|| shared.names.event_type_of(raw.subject.as_str()).map(str::to_owned));
        if !event_type.is_some_and(|t| selector.matches(&t)) {
            if let Err(err) = acker.ack_with(AckKind::Ack).await {
                tracing::debug!(source = %target.source, error = %err, "ack of a skipped event failed; it comes back");
            }
            return Ok(None);
        }
    }
    let handle = NatsAckHandle { shared: shared.clone(), acker, stream_seq, target: target.clone() };
    if delivered > max_deliveries {
        let reason = format!("ack deadline expired after {max_deliveries} deliveries");
        if let Err(err) = crate::delivery::AckHandle::dead_letter(&handle, &decoded, max_deliveries, &reason).await {
            tracing::error!(
                source = %target.source,
                stream_seq,
                error = %err,
                "dead-lettering an expired message failed; it is delivered again"
            );
        }
        return Ok(None);
    }
    Ok(Some(Delivery::new(decoded, delivered, max_deliveries, target.source.clone(), Box::new(handle))))
}

#[async_trait]
impl Consumer for NatsConsumer {
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        self.shared.check_open()?;
        if max == 0 {
            return Ok(Vec::new());
        }
        if !self.connected() {
            return Err(self.receive_error("the connection to NATS is down"));
        }
        if self.recheck.swap(false, Ordering::AcqRel) {
            self.recover().await.inspect_err(|_| self.recheck.store(true, Ordering::Release))?;
        }
        let deadline = Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let pulled = self.pull(max - out.len(), remaining).await.inspect_err(|_| {
                self.recheck.store(true, Ordering::Release);
            })?;
            let any = !pulled.is_empty();
            for message in pulled {
                if let Some(delivery) = self.admit(message).await? {
                    out.push(delivery);
                }
            }
            // Everything pulled was skipped or dead-lettered: keep waiting for the rest of `wait`.
            if !out.is_empty() || !any || Instant::now() >= deadline {
                break;
            }
        }
        if out.is_empty() && !self.connected() {
            return Err(self.receive_error("the connection to NATS is down"));
        }
        Ok(out)
    }
}
