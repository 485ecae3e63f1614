//! Handling one delivery: the handler runs in its own task, inside the message's span,
//! supervised for panics, the timeout and ack-deadline progress.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use imagepipe_bus::Delivery;
use tokio::task::{JoinError, JoinHandle};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::Instrument;

use super::settle::{HandlerExit, settle};
use super::{Fetched, Handler, LoopConfig, Outcome};
use ::metrics::histogram;

use crate::metrics::{self, labels};
use crate::telemetry;

/// How long an aborted handler may take to stop before its delivery is left unsettled.
pub(super) const ABORT_WAIT: Duration = Duration::from_secs(5);

/// Handles `fetched` with `handler` and settles it; its permit and in-flight place are
/// released after settling.
pub(super) async fn handle<H: Handler>(handler: Arc<H>, fetched: Fetched, config: Arc<LoopConfig>) {
    let Fetched { delivery, _permit, _in_flight } = fetched;
    let span = telemetry::message_span(&delivery);
    async move {
        let source = config.name.clone();
        let started = Instant::now();
        let (exit, delivery) = supervise(handler, delivery, &config).await;
        histogram!(metrics::HANDLER_DURATION, labels::SOURCE => source, labels::OUTCOME => exit.label())
            .record(started.elapsed().as_secs_f64());
        match delivery {
            Some(delivery) => settle(delivery, exit, &config).await,
            None => tracing::error!(
                outcome = exit.label(),
                "the abandoned handler did not stop; leaving its message unsettled for redelivery"
            ),
        }
    }
    .instrument(span)
    .await
}

/// Runs the handler until it exits. Gives the delivery back to settle, or `None` if an abandoned
/// handler would not stop (the delivery stays with the stuck task, unsettled).
async fn supervise<H: Handler>(
    handler: Arc<H>,
    delivery: Delivery,
    config: &LoopConfig,
) -> (HandlerExit, Option<Delivery>) {
    let delivery = Arc::new(delivery);
    let mut task = AbortOnDrop(tokio::spawn({
        let delivery = delivery.clone();
        async move { handler.handle(&delivery).await }.instrument(tracing::Span::current())
    }));

    let period = config.progress_interval();
    let mut progress = tokio::time::interval_at(Instant::now() + period, period);
    progress.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let timeout = tokio::time::sleep(config.handler_timeout);
    tokio::pin!(timeout);

    let exit = loop {
        tokio::select! {
            joined = &mut task.0 => break exit_of(joined),
            () = &mut timeout => {
                task.0.abort();
                if tokio::time::timeout(ABORT_WAIT, &mut task.0).await.is_err() {
                    return (HandlerExit::TimedOut(config.handler_timeout), None);
                }
                break HandlerExit::TimedOut(config.handler_timeout);
            }
            _ = progress.tick() => super::settle::progress(&delivery, config).await,
        }
    };
    drop(task);
    (exit, Arc::try_unwrap(delivery).ok())
}

pub(super) fn exit_of(joined: Result<Outcome, JoinError>) -> HandlerExit {
    match joined {
        Ok(outcome) => HandlerExit::Returned(outcome),
        Err(error) if error.is_panic() => HandlerExit::Panicked(panic_message(error.into_panic())),
        Err(_) => HandlerExit::Panicked("the handler task was cancelled".into()),
    }
}

fn panic_message(payload: Box<dyn Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_owned(),
            Err(_) => "panic with a non-string payload".to_owned(),
        },
    }
}

/// Aborts the handler task if its supervisor is dropped (shutdown past the grace period).
pub(super) struct AbortOnDrop<T>(pub(super) JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
