//! The loop every worker runs: fetch deliveries while there is room, hand each to a
//! [`Handler`], settle it by the [`Outcome`], and stop cleanly on shutdown.
//!
//! - **Backpressure**: a [`Semaphore`] of `concurrency` permits; a delivery holds one from
//!   fetch to settle, and the loop fetches only as many as there are free permits.
//! - **Batches** ([`BatchWorker`]): a [`BatchHandler`] takes every fetched delivery at once
//!   (the coordinator writes a batch's transitions in one store round trip).
//! - **Modes** ([`Scheduling`]): *concurrent* handles deliveries as they come; *orderly* handles at
//!   most one delivery per message key at a time, in fetch order per key, other keys in
//!   parallel.
//! - **Each delivery** is handled in its own task, inside [`telemetry::message_span`]: a
//!   panic or a run past `handler_timeout` becomes a retry; a handler running past
//!   `ack_wait / 2` extends its ack deadline with `progress` every `ack_wait / 2`.
//! - **Fetch errors** (broker hiccups) are retried with [`ExponentialBackoff`].
//! - **Shutdown**: stop fetching, let fetched deliveries finish within `shutdown_grace`, and
//!   leave the rest unsettled for redelivery. A fetch still waiting is cut short; whatever a
//!   broker had already handed it is redelivered after `ack_wait`, never lost.
//!
//! [`telemetry::message_span`]: crate::telemetry::message_span

mod batch;
mod orderly;
mod process;
mod settle;

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_bus::{Bus, BusError, Consumer, Delivery, Lanes};
use std::sync::atomic::Ordering;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

pub use crate::error_text::error_chain;
pub use batch::{BatchHandler, BatchWorker};

use crate::backoff::ExponentialBackoff;
use crate::config::WorkerConfig;
use crate::control::{Control, ControlHandle};
use ::metrics::{counter, gauge};

use crate::metrics::{self, labels};
use crate::shutdown::Shutdown;

/// What a worker does with each delivery.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Handles `delivery` and says how to settle it. The worker settles it; the handler must
    /// not. Handlers are idempotent: the same message may arrive more than once.
    async fn handle(&self, delivery: &Delivery) -> Outcome;
}

#[async_trait]
impl<H: Handler + ?Sized> Handler for Arc<H> {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        (**self).handle(delivery).await
    }
}

/// How a handled delivery is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: acknowledge it.
    Ack,
    /// Failed for now: deliver it again after `delay` (by default the worker's retry backoff
    /// for the delivery count), or dead-letter it if this was its last allowed delivery.
    Retry {
        /// When to redeliver; `None` for the worker's backoff.
        delay: Option<Duration>,
        /// Why it failed (logged, and recorded on the dead letter at the last attempt).
        reason: String,
    },
    /// Failed for good (malformed, not allowed, ...): move it to the dead-letter queue now.
    Reject {
        /// Why (recorded on the dead letter).
        reason: String,
    },
}

impl Outcome {
    /// A retry after the worker's backoff.
    pub fn retry(reason: impl fmt::Display) -> Self {
        Self::Retry { delay: None, reason: reason.to_string() }
    }

    /// A retry not before `delay`.
    pub fn retry_after(delay: Duration, reason: impl fmt::Display) -> Self {
        Self::Retry { delay: Some(delay), reason: reason.to_string() }
    }

    /// A permanent failure.
    pub fn reject(reason: impl fmt::Display) -> Self {
        Self::Reject { reason: reason.to_string() }
    }
}

/// How deliveries are scheduled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scheduling {
    /// Up to `concurrency` deliveries at once, in any order.
    #[default]
    Concurrent,
    /// At most one delivery per message key at once, in fetch order per key; different keys
    /// (and keyless messages) in parallel, up to `concurrency` deliveries held in all.
    Orderly,
}

/// Settings of one [`Worker`].
#[derive(Debug, Clone, PartialEq)]
pub struct LoopConfig {
    /// Name in logs and in the `source` label of every metric of the worker: the queue or
    /// subscriber group consumed, or a fixed name for a group named per process (the label
    /// must not take a new value with every start).
    pub name: String,
    /// How deliveries are scheduled.
    pub scheduling: Scheduling,
    /// Most deliveries held (being handled or, in orderly mode, waiting for their key) at once.
    pub concurrency: usize,
    /// The consumer's ack wait; progress is sent every half of it.
    pub ack_wait: Duration,
    /// A handler running longer is abandoned and its delivery retried.
    pub handler_timeout: Duration,
    /// On shutdown, how long fetched deliveries may take to finish.
    pub shutdown_grace: Duration,
    /// How long one fetch waits for messages.
    pub fetch_wait: Duration,
    /// Delay of [`Outcome::Retry`] without a delay, by delivery count.
    pub retry_backoff: ExponentialBackoff,
    /// Delay between failed fetches.
    pub fetch_backoff: ExponentialBackoff,
}

impl LoopConfig {
    /// The `worker` section's settings for the worker called `name`; open its consumer with
    /// [`WorkerConfig::consumer_config`] so both agree on `ack_wait`.
    pub fn from_settings(name: impl Into<String>, settings: &WorkerConfig) -> Self {
        Self {
            name: name.into(),
            scheduling: Scheduling::Concurrent,
            concurrency: settings.concurrency,
            ack_wait: settings.ack_wait,
            handler_timeout: settings.handler_timeout,
            shutdown_grace: settings.shutdown_grace,
            fetch_wait: Duration::from_secs(5),
            retry_backoff: ExponentialBackoff::step_retries(),
            fetch_backoff: ExponentialBackoff::broker_reconnect(),
        }
    }

    /// The same, in orderly mode.
    pub fn orderly(mut self) -> Self {
        self.scheduling = Scheduling::Orderly;
        self
    }

    /// How often a running handler's delivery, or a delivery waiting for its key, is extended.
    fn progress_interval(&self) -> Duration {
        (self.ack_wait / 2).max(Duration::from_millis(1))
    }

    fn check(&self) -> Result<(), WorkerError> {
        let invalid = |reason: &str| Err(WorkerError::Invalid { name: self.name.clone(), reason: reason.to_owned() });
        if self.concurrency == 0 {
            return invalid("concurrency must be at least 1");
        }
        if self.ack_wait.is_zero() || self.handler_timeout.is_zero() || self.fetch_wait.is_zero() {
            return invalid("ack_wait, handler_timeout and fetch_wait must be longer than 0s");
        }
        Ok(())
    }
}

/// Why a worker stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The bus was closed under the worker.
    #[error("worker {name}: the bus was closed")]
    Closed {
        /// Worker name.
        name: String,
    },
    /// The worker's settings cannot work.
    #[error("worker {name}: {reason}")]
    Invalid {
        /// Worker name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// Consumes one queue or subscriber group with one handler.
pub struct Worker<H> {
    consumer: Box<dyn Consumer>,
    handler: Arc<H>,
    config: Arc<LoopConfig>,
    control: Option<Control>,
}

/// Longest fetch wait of a controlled worker: with the control refresh
/// ([`crate::control::REFRESH`], 0.5 s), a pause stops new fetches within a second.
const CONTROLLED_FETCH_WAIT: Duration = Duration::from_millis(500);

impl<H: Handler> Worker<H> {
    /// A worker handling `consumer`'s deliveries with `handler`.
    pub fn new(consumer: Box<dyn Consumer>, handler: H, config: LoopConfig) -> Self {
        Self { consumer, handler: Arc::new(handler), config: Arc::new(config), control: None }
    }

    /// Follows the operator controls of its queue: while the queue is paused it takes no new
    /// messages (those it holds finish), it runs at the queue's per-replica concurrency when
    /// one is set, and it reports its consumers, messages in flight and rate.
    pub fn controlled(mut self, control: Control) -> Self {
        self.control = Some(control);
        self
    }

    /// Runs until `shutdown` fires and fetched deliveries are finished (or the grace period
    /// is over), then returns `Ok`. Fails only if the bus is closed under it or the config
    /// cannot work.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), WorkerError> {
        self.config.check()?;
        let config = &self.config;
        let permits = Arc::new(Semaphore::new(config.concurrency));
        let mut tasks = JoinSet::new();
        let mut dispatcher = match config.scheduling {
            Scheduling::Concurrent => Dispatcher::Concurrent,
            Scheduling::Orderly => Dispatcher::Orderly(orderly::KeyLanes::default()),
        };
        let mut fetch_failures = config.fetch_backoff.attempts();
        tracing::info!(worker = %config.name, scheduling = ?config.scheduling, concurrency = config.concurrency, "worker started");
        let mut control = match self.control {
            Some(control) => Some(control.start().await),
            None => None,
        };
        let mut capacity = config.concurrency;
        let fetch_wait =
            if control.is_some() { config.fetch_wait.min(CONTROLLED_FETCH_WAIT) } else { config.fetch_wait };

        let result = loop {
            while let Some(joined) = tasks.try_join_next() {
                log_task_failure(&config.name, joined);
            }
            if let Some(control) = &mut control {
                capacity = resize(&permits, capacity, control, config);
                if !wait_while_paused(control, &permits, capacity, config, &shutdown).await {
                    break Ok(());
                }
            }
            let first = tokio::select! {
                biased;
                () = shutdown.wait() => break Ok(()),
                permit = permits.clone().acquire_owned() => permit.expect("the worker never closes its semaphore"),
                // Every slot busy: a pause or a new concurrency applies now, not once one frees.
                () = control_changed(&mut control) => continue,
            };
            let mut held = vec![first];
            while held.len() < capacity {
                match permits.clone().try_acquire_owned() {
                    Ok(permit) => held.push(permit),
                    Err(_) => break,
                }
            }
            let fetched = tokio::select! {
                biased;
                () = shutdown.wait() => break Ok(()),
                fetched = self.consumer.fetch(held.len(), fetch_wait) => fetched,
            };
            match fetched {
                Ok(deliveries) => {
                    fetch_failures.reset();
                    if let Some(control) = &control {
                        control.stats.taken.fetch_add(deliveries.len() as u64, Ordering::Relaxed);
                    }
                    for delivery in deliveries {
                        let permit = match held.pop() {
                            Some(permit) => permit,
                            None => {
                                permits.clone().acquire_owned().await.expect("the worker never closes its semaphore")
                            }
                        };
                        let fetched = Fetched::new(delivery, permit, &config.name);
                        dispatcher.dispatch(fetched, &mut tasks, &self.handler, config);
                    }
                }
                Err(BusError::Closed) => break Err(WorkerError::Closed { name: config.name.clone() }),
                Err(error) => {
                    if !fetch_failed(config, &mut fetch_failures, &error, &shutdown).await {
                        break Ok(());
                    }
                }
            }
        };

        drain(&mut tasks, config).await;
        tracing::info!(worker = %config.name, "worker stopped");
        result
    }
}

/// Opens a consumer on every priority lane of the stage queue `queue` (`tasks.download`,
/// `tasks.download.high`, `tasks.download.low`), read as one with `worker.priority_shares`.
pub async fn consume_lanes(bus: &Bus, queue: &str, worker: &WorkerConfig) -> Result<Box<dyn Consumer>, BusError> {
    let lanes = Lanes::open(&*bus.queues, queue, worker.consumer_config(), worker.priority_shares.shares()).await?;
    Ok(Box::new(lanes))
}

/// Applies the queue's per-replica concurrency (or `worker.concurrency` when none is set) to
/// `permits`, which hold `capacity` now; returns the new capacity. Permits taken away are
/// taken as messages in flight finish.
fn resize(permits: &Arc<Semaphore>, capacity: usize, control: &ControlHandle, config: &LoopConfig) -> usize {
    let wanted =
        control.rx.borrow().per_replica.map_or(config.concurrency, |n| n as usize).clamp(1, Semaphore::MAX_PERMITS);
    if wanted > capacity {
        permits.add_permits(wanted - capacity);
    } else if wanted < capacity {
        // The free permits go at once (a task spawned to take them may run only after the
        // loop has taken them for new messages); the rest as messages in flight finish.
        let surplus = capacity - wanted - permits.forget_permits(capacity - wanted);
        if surplus > 0 {
            let (permits, surplus) = (permits.clone(), u32::try_from(surplus).unwrap_or(u32::MAX));
            tokio::spawn(async move {
                if let Ok(taken) = permits.acquire_many_owned(surplus).await {
                    taken.forget();
                }
            });
        }
    }
    if wanted != capacity {
        tracing::info!(worker = %config.name, from = capacity, to = wanted, "concurrency changed");
    }
    control.stats.concurrency.store(u32::try_from(wanted).unwrap_or(u32::MAX), Ordering::Relaxed);
    wanted
}

/// While the queue is paused, waits for a change of its control state, keeping the
/// in-flight count reported; false if `shutdown` fired meanwhile.
async fn wait_while_paused(
    control: &mut ControlHandle,
    permits: &Semaphore,
    capacity: usize,
    config: &LoopConfig,
    shutdown: &Shutdown,
) -> bool {
    let report = |control: &ControlHandle| {
        let in_flight = capacity.saturating_sub(permits.available_permits());
        control.stats.in_flight.store(u32::try_from(in_flight).unwrap_or(u32::MAX), Ordering::Release);
    };
    report(control);
    if !control.rx.borrow().paused {
        return true;
    }
    tracing::info!(worker = %config.name, "queue paused: taking no new messages");
    gauge!(metrics::QUEUE_PAUSED, labels::SOURCE => config.name.clone()).set(1.0);
    // No fetch is outstanding here: the beats say from now on that this replica obeys the pause.
    let obey = |control: &ControlHandle, paused_at: u64| {
        if control.stats.paused_at.swap(paused_at, Ordering::AcqRel) != paused_at {
            control.stats.pause_changed.notify_one();
        }
    };
    while control.rx.borrow().paused {
        obey(control, control.rx.borrow().updated_at.max(1));
        tokio::select! {
            biased;
            () = shutdown.wait() => return false,
            changed = control.rx.changed() => if changed.is_err() { break },
            () = tokio::time::sleep(Duration::from_millis(500)) => report(control),
        }
    }
    obey(control, 0);
    gauge!(metrics::QUEUE_PAUSED, labels::SOURCE => config.name.clone()).set(0.0);
    tracing::info!(worker = %config.name, "queue resumed");
    true
}

/// Completes when the queue's control state changes; never without a control (or once its
/// state is gone).
async fn control_changed(control: &mut Option<ControlHandle>) {
    if let Some(control) = control
        && control.rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

/// Counts and logs a failed fetch, then waits the backoff's next delay before the worker
/// fetches again; false if `shutdown` fired meanwhile.
async fn fetch_failed(
    config: &LoopConfig,
    failures: &mut crate::backoff::Attempts,
    error: &BusError,
    shutdown: &Shutdown,
) -> bool {
    let delay = failures.next_delay();
    counter!(metrics::FETCH_ERRORS, labels::SOURCE => config.name.clone()).increment(1);
    tracing::warn!(worker = %config.name, error = %error_chain(error), retry_in = ?delay,
        failures = failures.failures(), "fetch failed; retrying");
    shutdown.sleep(delay).await
}

/// A fetched delivery and the room it takes: a permit, and a place in the in-flight gauge,
/// both released when it is settled or dropped.
struct Fetched {
    delivery: Delivery,
    _permit: OwnedSemaphorePermit,
    _in_flight: InFlight,
}

impl Fetched {
    fn new(delivery: Delivery, permit: OwnedSemaphorePermit, worker: &str) -> Self {
        let in_flight = InFlight::enter(worker);
        Self { delivery, _permit: permit, _in_flight: in_flight }
    }
}

/// One unit of [`metrics::MESSAGES_IN_FLIGHT`] while alive.
struct InFlight(::metrics::Gauge);

impl InFlight {
    fn enter(source: &str) -> Self {
        let gauge = gauge!(metrics::MESSAGES_IN_FLIGHT, labels::SOURCE => source.to_owned());
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

enum Dispatcher {
    Concurrent,
    Orderly(orderly::KeyLanes),
}

impl Dispatcher {
    fn dispatch<H: Handler>(
        &mut self,
        fetched: Fetched,
        tasks: &mut JoinSet<()>,
        handler: &Arc<H>,
        config: &Arc<LoopConfig>,
    ) {
        match self {
            Self::Concurrent => {
                tasks.spawn(process::handle(handler.clone(), fetched, config.clone()));
            }
            Self::Orderly(lanes) => lanes.dispatch(fetched, tasks, handler, config),
        }
    }
}

/// Waits up to the grace period for `tasks`, then abandons the rest (their deliveries are
/// dropped unsettled, so the broker redelivers them).
async fn drain(tasks: &mut JoinSet<()>, config: &LoopConfig) {
    if tasks.is_empty() {
        return;
    }
    tracing::info!(worker = %config.name, tasks = tasks.len(), grace = ?config.shutdown_grace, "draining");
    let deadline = tokio::time::sleep(config.shutdown_grace);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                Some(joined) => log_task_failure(&config.name, joined),
                None => return,
            },
            () = &mut deadline => {
                let left = tasks.len();
                tracing::warn!(worker = %config.name, tasks = left,
                    "shutdown grace period over; leaving unfinished messages for redelivery");
                counter!(metrics::MESSAGES_ABANDONED, labels::SOURCE => config.name.clone())
                    .increment(left as u64);
                tasks.shutdown().await;
                return;
            }
        }
    }
}

fn log_task_failure(worker: &str, joined: Result<(), tokio::task::JoinError>) {
    if let Err(error) = joined
        && !error.is_cancelled()
    {
        tracing::error!(worker, %error, "worker task failed; its message is left for redelivery");
    }
}
