//! The coordinator's consumers: submissions, step results, dead letters. Submissions and step
//! results are handled in batches ([`BatchHandler`]: one store round trip per batch, not per
//! message), dead letters one by one ([`Handler`]); decoding failures are rejected to the
//! dead-letter queue with the reason.

use std::time::Duration;

use async_trait::async_trait;
use imagepipe_bus::{BusError, Consumer, Delivery};
use imagepipe_contracts::names::headers;
use imagepipe_contracts::{StepResult, SubmitTask, decode};
use imagepipe_runtime::backoff::ExponentialBackoff;
use imagepipe_runtime::error_text::error_chain;
use imagepipe_runtime::worker::{BatchHandler, Handler, Outcome};
use metrics::counter;
use tracing::Span;
use uuid::Uuid;

use crate::engine::{Engine, EngineError, Handled, Origin, Submission, SubmitFailure};
use crate::machine::Input;
use crate::metrics as m;
use crate::retention::Expirer;
use crate::routing::{Route, hand_on, route, with_task_id};
use crate::slots::Slots;
use crate::store::DeadLetter;
use crate::task::TaskState;

/// How long an input waits before it is delivered again after this replica lost its
/// shard while handling it (the shard's new owner reads it then).
const NOT_OWNER_RETRY: Duration = Duration::from_secs(1);

/// The outcome of `delivery` when the store failed its handling: redelivered after the
/// store-outage backoff for its delivery count ([`ExponentialBackoff::store_outage`]), so that
/// its deliveries last out a store failing over instead of being spent in seconds.
fn store_failed(delivery: &Delivery, error: &(dyn std::error::Error + 'static)) -> Outcome {
    let delay = ExponentialBackoff::store_outage().delay(delivery.delivery_count.saturating_sub(1));
    Outcome::retry_after(delay, error_chain(error))
}

/// Namespace of task ids derived from bus submissions without a `taskId`.
const SUBMIT_ID_NAMESPACE: Uuid = Uuid::from_u128(0x3c1e_9b2a_5f04_4d7e_b8a1_6e2f_0d9c_7a51);

/// Handles `tasks.submit`: creates the task (or finds it by id or idempotency key) and starts
/// it under the cap.
pub struct SubmitHandler {
    engine: Engine,
}

impl SubmitHandler {
    /// A handler creating tasks through `engine`.
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

/// The id of a submission without `taskId`: stable across redeliveries of the same message
/// (from its message id, or its broker position and body).
pub fn derived_task_id(delivery: &Delivery) -> String {
    let name = match &delivery.message.id {
        Some(id) => format!("id\n{id}"),
        None => format!("pos\n{}\n{}", delivery.position(), String::from_utf8_lossy(&delivery.message.payload)),
    };
    format!("tsk_{}", Uuid::new_v5(&SUBMIT_ID_NAMESPACE, name.as_bytes()).simple())
}

#[async_trait]
impl BatchHandler for SubmitHandler {
    async fn handle_batch(&self, deliveries: &[Delivery], spans: &[Span]) -> Vec<Outcome> {
        let mut outcomes = Slots::new(deliveries.len());
        let mut submissions = Vec::with_capacity(deliveries.len());
        let mut decoded = Vec::with_capacity(deliveries.len());
        let mut away = Vec::new();
        for (i, (delivery, span)) in deliveries.iter().zip(spans).enumerate() {
            match decode::<SubmitTask>(&delivery.message.payload) {
                Ok(command) => {
                    let derived_id = derived_task_id(delivery);
                    let id = command.task_id.as_deref().unwrap_or(&derived_id);
                    if let Route::To(shard) = route(self.engine.ownership(), delivery, id) {
                        away.push((i, shard, with_task_id(&delivery.message.payload, id)));
                        continue;
                    }
                    let span = span.clone();
                    submissions.push(Submission { command, derived_id, span });
                    decoded.push(i);
                }
                Err(e) => {
                    counter!(m::SUBMISSIONS_REJECTED, "origin" => "bus").increment(1);
                    outcomes.fill(i, Outcome::reject(e));
                }
            }
        }
        let bus = self.engine.bus();
        let handed_on = futures::future::join_all(
            away.into_iter()
                .map(|(i, shard, body)| async move { (i, hand_on(bus, &deliveries[i], shard, body).await) }),
        );
        let (submitted, handed_on) = tokio::join!(self.engine.submit_batch(&submissions, Origin::Bus), handed_on);
        for (i, outcome) in handed_on {
            outcomes.fill(i, outcome);
        }
        let mut queued = false;
        for (i, submitted) in decoded.into_iter().zip(submitted) {
            outcomes.fill(
                i,
                match submitted {
                    Ok(submitted) => {
                        queued |= submitted.created && submitted.task.state == TaskState::Queued;
                        Outcome::Ack
                    }
                    Err(SubmitFailure::Invalid(e)) => Outcome::reject(format!("invalid submit command: {e}")),
                    Err(e @ SubmitFailure::Conflict { .. }) => Outcome::reject(e),
                    Err(SubmitFailure::Store(e)) => store_failed(&deliveries[i], &e),
                },
            );
        }
        if queued && let Err(e) = self.engine.start_queued().await {
            tracing::warn!(error = %e, "queued tasks not started; the sweeper starts them");
        }
        outcomes.into_vec()
    }
}

#[async_trait]
impl Handler for SubmitHandler {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        one(self.handle_batch(std::slice::from_ref(delivery), &[Span::current()]).await)
    }
}

/// The outcome of a batch of one.
fn one(mut outcomes: Vec<Outcome>) -> Outcome {
    outcomes.pop().unwrap_or_else(|| Outcome::retry("the batch handler gave no outcome"))
}

/// Handles `tasks.results`: applies each step result to its task.
pub struct ResultHandler {
    engine: Engine,
}

impl ResultHandler {
    /// A handler applying results through `engine`.
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

#[async_trait]
impl BatchHandler for ResultHandler {
    async fn handle_batch(&self, deliveries: &[Delivery], spans: &[Span]) -> Vec<Outcome> {
        let mut outcomes = Slots::new(deliveries.len());
        let (mut inputs, mut decoded) = (Vec::with_capacity(deliveries.len()), Vec::with_capacity(deliveries.len()));
        let mut away = Vec::new();
        for (i, (delivery, span)) in deliveries.iter().zip(spans).enumerate() {
            match decode::<StepResult>(&delivery.message.payload) {
                Ok(result) => {
                    if let Route::To(shard) = route(self.engine.ownership(), delivery, &result.task_id) {
                        away.push((i, shard));
                        continue;
                    }
                    inputs.push((result.task_id.clone(), Input::Result(Box::new(result)), span.clone()));
                    decoded.push(i);
                }
                Err(e) => outcomes.fill(i, Outcome::reject(e)),
            }
        }
        let bus = self.engine.bus();
        let handed_on = futures::future::join_all(
            away.into_iter().map(|(i, shard)| async move { (i, hand_on(bus, &deliveries[i], shard, None).await) }),
        );
        let (handled, handed_on) = tokio::join!(self.engine.handle_batch(inputs), handed_on);
        for (i, outcome) in handed_on {
            outcomes.fill(i, outcome);
        }
        let mut finished = false;
        for (i, handled) in decoded.into_iter().zip(handled) {
            outcomes.fill(
                i,
                match handled {
                    Ok(Handled::Applied(task)) => {
                        finished |= task.state.is_terminal();
                        Outcome::Ack
                    }
                    Ok(Handled::Ignored(_)) => Outcome::Ack,
                    Err(EngineError::UnknownTask(id)) => Outcome::reject(format!("step result for unknown task {id}")),
                    Err(EngineError::Illegal(illegal)) => Outcome::reject(illegal),
                    Err(e @ EngineError::Store(_)) => store_failed(&deliveries[i], &e),
                    Err(e @ EngineError::Contention(_)) => Outcome::retry(e),
                    // Handed over meanwhile: the partition's next owner gets it.
                    Err(e @ EngineError::NotOwner { .. }) => Outcome::retry_after(NOT_OWNER_RETRY, e),
                },
            );
        }
        if finished && let Err(e) = self.engine.start_queued().await {
            tracing::warn!(error = %e, "queued tasks not started; the sweeper starts them");
        }
        outcomes.into_vec()
    }
}

#[async_trait]
impl Handler for ResultHandler {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        one(self.handle_batch(std::slice::from_ref(delivery), &[Span::current()]).await)
    }
}

/// A consumer that fetches nothing while the coordinator is at its in-flight cap, so
/// submissions wait in their queue (docs/design.md, "Backpressure").
///
/// The `high` submit lane's ([`CappedConsumer::high`]) is gated on [`Engine::high_cap`]: a high
/// submission is taken and started at once, never behind the backlog of the lanes below (and
/// one recheck period).
pub struct CappedConsumer {
    inner: Box<dyn Consumer>,
    engine: Engine,
    recheck: Duration,
    /// The cap it is gated on: `max_in_flight`, or the high cap.
    cap: u64,
}

impl CappedConsumer {
    /// Gates `inner` on `engine`'s cap, checking again every `recheck` while full.
    pub fn new(inner: Box<dyn Consumer>, engine: Engine, recheck: Duration) -> Self {
        let cap = engine.config().max_in_flight;
        Self { inner, engine, recheck, cap }
    }

    /// Gates the high lane `inner` on `engine`'s high cap.
    pub fn high(inner: Box<dyn Consumer>, engine: Engine, recheck: Duration) -> Self {
        let cap = engine.high_cap();
        Self { inner, engine, recheck, cap }
    }
}

#[async_trait]
impl Consumer for CappedConsumer {
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        let room = match self.engine.in_flight().await {
            Ok(n) => self.cap.saturating_sub(n),
            Err(e) => {
                tracing::warn!(error = %e, "in-flight count unavailable; not pulling submissions");
                0
            }
        };
        if self.cap == self.engine.config().max_in_flight {
            metrics::gauge!(m::SUBMISSIONS_PAUSED, "reason" => m::PAUSED_BY_CAP).set(if room == 0 { 1.0 } else { 0.0 });
        }
        if room == 0 {
            tokio::time::sleep(self.recheck.min(wait)).await;
            return Ok(Vec::new());
        }
        self.inner.fetch(max.min(usize::try_from(room).unwrap_or(usize::MAX)), wait).await
    }
}

/// Archives dead letters from a dead-letter queue into the store, for `/v1/dlq`, and keeps the
/// archive within `dlq.max_entries` as it grows.
pub struct DeadLetterArchiver {
    engine: Engine,
    expirer: Expirer,
}

impl DeadLetterArchiver {
    /// An archiver writing to `engine`'s store, trimming it with `expirer`.
    pub fn new(engine: Engine, expirer: Expirer) -> Self {
        Self { engine, expirer }
    }
}

/// The archive entry of a dead letter delivered from queue `dlq`.
pub fn dead_letter_of(delivery: &Delivery, now: u64) -> DeadLetter {
    let message = &delivery.message;
    let h = &message.headers;
    let at = h.get(headers::DLQ_TIMESTAMP).and_then(|t| t.parse().ok()).unwrap_or(now);
    let source = h.get(headers::DLQ_SOURCE).unwrap_or_default().to_owned();
    let identity = format!(
        "{}\n{}\n{at}\n{}",
        delivery.source,
        message.id.as_deref().unwrap_or_default(),
        String::from_utf8_lossy(&message.payload)
    );
    let dlq_headers = [headers::DLQ_REASON, headers::DLQ_DELIVERY_COUNT, headers::DLQ_SOURCE, headers::DLQ_TIMESTAMP];
    DeadLetter {
        id: format!("dl_{}", Uuid::new_v5(&SUBMIT_ID_NAMESPACE, identity.as_bytes()).simple()),
        source,
        dlq: delivery.source.clone(),
        reason: h.get(headers::DLQ_REASON).unwrap_or("unknown").to_owned(),
        delivery_count: h.get(headers::DLQ_DELIVERY_COUNT).and_then(|c| c.parse().ok()).unwrap_or(0),
        dead_lettered_at: at,
        key: message.key.clone(),
        message_id: message.id.clone(),
        headers: h
            .iter()
            .filter(|(k, _)| !dlq_headers.contains(k))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        body: String::from_utf8_lossy(&message.payload).into_owned(),
    }
}

#[async_trait]
impl Handler for DeadLetterArchiver {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let letter = dead_letter_of(delivery, self.engine.clock().unix_ms());
        match self.engine.store().put_dead_letter(&letter).await {
            Ok(()) => {
                counter!(m::DEAD_LETTERS_ARCHIVED, "dlq" => delivery.source.clone()).increment(1);
                tracing::warn!(dlq = %delivery.source, source = %letter.source, reason = %letter.reason, id = %letter.id, "dead letter archived");
                if let Err(e) = self.expirer.trim_dead_letters().await {
                    tracing::warn!(error = %e, "dead-letter archive not trimmed; the next expiry pass does it");
                }
                Outcome::Ack
            }
            Err(e) => store_failed(delivery, &e),
        }
    }
}
