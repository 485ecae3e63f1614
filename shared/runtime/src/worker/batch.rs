//! Batched consumption: fetch up to `concurrency` deliveries, hand them to a [`BatchHandler`]
//! at once, settle each by its outcome, then fetch again. One batch at a time, so deliveries of
//! one key are handled in fetch order: within a batch the handler keeps their order, and a
//! later batch starts only after the earlier one settled.
//!
//! The handler runs under the same supervision as a single delivery's: a panic or a run past
//! `handler_timeout` retries the whole batch, and while it runs every delivery's ack deadline
//! is extended every `ack_wait / 2`. On shutdown the batch being handled may finish within
//! `shutdown_grace`; past it, its deliveries are left unsettled for redelivery.

use std::sync::Arc;

use async_trait::async_trait;
use futures::future::join_all;
use imagepipe_bus::{BusError, Consumer, Delivery};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use ::metrics::{counter, histogram};

use super::process::{ABORT_WAIT, AbortOnDrop, exit_of};
use super::settle::{HandlerExit, settle};
use super::{InFlight, LoopConfig, Outcome, WorkerError, fetch_failed};
use crate::metrics::{self, labels};
use crate::shutdown::Shutdown;
use crate::telemetry;

/// What a batching worker does with each fetched batch.
#[async_trait]
pub trait BatchHandler: Send + Sync + 'static {
    /// Handles `deliveries` (in fetch order) and says how to settle each: one outcome per
    /// delivery, in the same order. `spans` holds each delivery's message span (in its
    /// sender's trace): the work done for a delivery belongs in it. The worker settles them;
    /// the handler must not. Handlers are idempotent: the same message may arrive more than once.
    async fn handle_batch(&self, deliveries: &[Delivery], spans: &[tracing::Span]) -> Vec<Outcome>;
}

/// Consumes one queue with one [`BatchHandler`], a batch at a time.
pub struct BatchWorker<H> {
    consumer: Box<dyn Consumer>,
    handler: Arc<H>,
    config: Arc<LoopConfig>,
}

impl<H: BatchHandler> BatchWorker<H> {
    /// A worker handling `consumer`'s deliveries with `handler`, batches of up to
    /// `config.concurrency` (the `scheduling` of `config` is not used: batches keep fetch order).
    pub fn new(consumer: Box<dyn Consumer>, handler: H, config: LoopConfig) -> Self {
        Self { consumer, handler: Arc::new(handler), config: Arc::new(config) }
    }

    /// Runs until `shutdown` fires and the batch being handled is settled (or the grace period
    /// is over), then returns `Ok`. Fails only if the bus is closed under it or the config
    /// cannot work.
    pub async fn run(self, shutdown: Shutdown) -> Result<(), WorkerError> {
        self.config.check()?;
        let config = &self.config;
        let mut fetch_failures = config.fetch_backoff.attempts();
        tracing::info!(worker = %config.name, max_batch = config.concurrency, "batch worker started");
        let result = loop {
            let fetched = tokio::select! {
                biased;
                () = shutdown.wait() => break Ok(()),
                fetched = self.consumer.fetch(config.concurrency, config.fetch_wait) => fetched,
            };
            match fetched {
                Ok(deliveries) if deliveries.is_empty() => fetch_failures.reset(),
                Ok(deliveries) => {
                    fetch_failures.reset();
                    let held = deliveries.len() as u64;
                    let batch = handle(self.handler.clone(), deliveries, config.clone());
                    tokio::pin!(batch);
                    let grace_over = async {
                        shutdown.wait().await;
                        tokio::time::sleep(config.shutdown_grace).await;
                    };
                    tokio::select! {
                        () = &mut batch => {}
                        () = grace_over => {
                            tracing::warn!(worker = %config.name,
                                "shutdown grace period over; leaving the batch's messages for redelivery");
                            counter!(metrics::MESSAGES_ABANDONED, labels::SOURCE => config.name.clone()).increment(held);
                            break Ok(());
                        }
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
        tracing::info!(worker = %config.name, "batch worker stopped");
        result
    }
}

/// Handles one batch under supervision and settles every delivery of it.
async fn handle<H: BatchHandler>(handler: Arc<H>, deliveries: Vec<Delivery>, config: Arc<LoopConfig>) {
    let _in_flight: Vec<InFlight> = deliveries.iter().map(|_| InFlight::enter(&config.name)).collect();
    let spans: Vec<tracing::Span> = deliveries.iter().map(telemetry::message_span).collect();
    let started = Instant::now();
    let (exits, deliveries) = supervise(handler, deliveries, spans.clone(), &config).await;
    let elapsed = started.elapsed().as_secs_f64();
    let Some(deliveries) = deliveries else {
        tracing::error!(worker = %config.name, "the abandoned batch handler did not stop; leaving its messages unsettled");
        return;
    };
    let settled = deliveries.into_iter().zip(exits).zip(spans).map(|((delivery, exit), span)| {
        histogram!(metrics::HANDLER_DURATION, labels::SOURCE => config.name.clone(), labels::OUTCOME => exit.label())
            .record(elapsed);
        settle(delivery, exit, &config).instrument(span)
    });
    join_all(settled).await;
}

/// Runs the handler on the batch until it exits, one [`HandlerExit`] per delivery. Gives the deliveries back to
/// settle, or `None` if an abandoned handler would not stop.
async fn supervise<H: BatchHandler>(
    handler: Arc<H>,
    deliveries: Vec<Delivery>,
    spans: Vec<tracing::Span>,
    config: &LoopConfig,
) -> (Vec<HandlerExit>, Option<Vec<Delivery>>) {
    let n = deliveries.len();
    let deliveries = Arc::new(deliveries);
    let mut task = AbortOnDrop(tokio::spawn({
        let deliveries = deliveries.clone();
        async move { handler.handle_batch(&deliveries, &spans).await }.in_current_span()
    }));
    let period = config.progress_interval();
    let mut progress = tokio::time::interval_at(Instant::now() + period, period);
    progress.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let timeout = tokio::time::sleep(config.handler_timeout);
    tokio::pin!(timeout);

    let exits = loop {
        tokio::select! {
            joined = &mut task.0 => break match joined {
                Ok(outcomes) if outcomes.len() == n => outcomes.into_iter().map(HandlerExit::Returned).collect(),
                Ok(outcomes) => {
                    let reason = format!("the batch handler gave {} outcomes for {n} deliveries", outcomes.len());
                    tracing::error!(worker = %config.name, %reason, "batch retried");
                    (0..n).map(|_| HandlerExit::Returned(Outcome::retry(&reason))).collect()
                }
                Err(error) => {
                    let exit = exit_of(Err(error));
                    let label = exit.label();
                    let reason = match exit { HandlerExit::Panicked(m) => m, _ => label.to_owned() };
                    (0..n).map(|_| HandlerExit::Panicked(reason.clone())).collect()
                }
            },
            () = &mut timeout => {
                task.0.abort();
                if tokio::time::timeout(ABORT_WAIT, &mut task.0).await.is_err() {
                    return ((0..n).map(|_| HandlerExit::TimedOut(config.handler_timeout)).collect(), None);
                }
                break (0..n).map(|_| HandlerExit::TimedOut(config.handler_timeout)).collect();
            }
            _ = progress.tick() => {
                join_all(deliveries.iter().map(|d| super::settle::progress(d, config))).await;
            }
        }
    };
    drop(task);
    (exits, Arc::try_unwrap(deliveries).ok())
}
