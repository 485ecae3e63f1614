//! Wires the coordinator together: the sweeper, the expirer, the consumers of submissions,
//! results and dead letters, and the event fan-out behind `/v1/events`.

use std::time::Duration;

use futures::TryFutureExt;
use imagepipe_blob::BlobConfigError;
use imagepipe_bus::{BusError, ConsumerConfig, Selector, Subscription};
use imagepipe_contracts::names::{self, queues};
use imagepipe_runtime::shutdown::Shutdown;
use imagepipe_runtime::worker::{Handler, LoopConfig, Worker, WorkerError};
use tokio::task::JoinSet;

use crate::consumers::{CappedConsumer, DeadLetterArchiver, ResultHandler, SubmitHandler};
use crate::engine::Engine;
use crate::events::{EventHub, Fanout};
use crate::retention::{Expirer, Retention};
use crate::store::StoreError;

/// The worker name (the `source` label of its metrics, the `worker` of its log lines) of the
/// `/v1/events` fan-out; its subscriber group is this name plus a per-process id, which must
/// not become a label value: one new series per start would pile up without bound.
pub const EVENTS_WORKER: &str = "coordinator-sse";

/// How the coordinator's loops run.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopsConfig {
    /// Worker settings of every consumer (its name is set per consumer).
    pub worker: LoopConfig,
    /// Consumer settings of every queue.
    pub consumer: ConsumerConfig,
    /// How often the sweeper looks for due timers and unrelayed outbox entries.
    pub sweep_interval: Duration,
    /// While at the in-flight cap, how often to check for room.
    pub cap_recheck: Duration,
    /// Subscriber groups whose dead letters are archived too (besides every task queue's).
    pub dlq_groups: Vec<String>,
    /// This process's subscriber group for `/v1/events`.
    pub events_group: String,
    /// The broker deletes `events_group` once this process has not pulled from it for this
    /// long (it stopped, or lost the broker): no group is left behind per start.
    pub events_idle: Duration,
    /// How long finished tasks and dead letters are kept.
    pub retention: Retention,
    /// How often the expirer deletes what outlived its retention.
    pub expiry_interval: Duration,
}

/// Why the coordinator stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Opening a consumer failed.
    #[error("opening {what}")]
    Consume {
        /// Which queue or group.
        what: String,
        /// Bus error.
        #[source]
        source: BusError,
    },
    /// A worker stopped.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// The task store could not be opened.
    #[error("opening the task store")]
    Store(#[source] StoreError),
    /// The blob store of `blob.*` (behind the upload API) could not be opened.
    #[error("opening the blob store")]
    BlobStore(#[source] BlobConfigError),
}

/// Runs every loop of the coordinator until `shutdown`.
pub async fn run(engine: Engine, hub: EventHub, config: LoopsConfig, shutdown: Shutdown) -> Result<(), RunError> {
    let bus = engine.bus().clone();
    let open = |what: String, source| RunError::Consume { what, source };
    let mut loops: JoinSet<Result<(), RunError>> = JoinSet::new();

    // Event streams end as the stop begins, so watching clients never hold it up.
    let (watched, stop) = (hub.clone(), shutdown.clone());
    loops.spawn(async move {
        stop.wait().await;
        watched.close();
        Ok(())
    });

    let sweeper = engine.clone();
    let (interval, stop) = (config.sweep_interval, shutdown.clone());
    loops.spawn(async move {
        sweeper.run_sweeper(interval, stop).await;
        Ok(())
    });

    let expirer = Expirer::new(engine.store().clone(), engine.clock().clone(), config.retention);
    let (interval, stop, expiring) = (config.expiry_interval, shutdown.clone(), expirer.clone());
    loops.spawn(async move {
        expiring.run(interval, stop).await;
        Ok(())
    });

    // Every consumer is requested at once: joining a Kafka group takes seconds each, and the
    // bus counts them all as opening from here, so readiness waits for the last one.
    let dlq_names: Vec<String> = queues::ALL
        .iter()
        .map(|q| names::dead_letter_queue(q))
        .chain(config.dlq_groups.iter().map(|g| names::dead_letter_queue_of_group(g)))
        .collect();
    let subscription = Subscription::new(config.events_group.clone(), Selector::all())
        .with_consumer(config.consumer.clone())
        .expiring_when_idle(config.events_idle);
    let submit = bus.queues.consume(queues::SUBMIT, config.consumer.clone());
    let results = bus.queues.consume(queues::RESULTS, config.consumer.clone());
    let dlqs = futures::future::try_join_all(
        dlq_names.iter().map(|dlq| bus.queues.consume(dlq, config.consumer.clone()).map_err(|e| open(dlq.clone(), e))),
    );
    let events = bus.events.subscribe(subscription);
    let (submit, results, dlqs, events) = tokio::try_join!(
        submit.map_err(|e| open(queues::SUBMIT.into(), e)),
        results.map_err(|e| open(queues::RESULTS.into(), e)),
        dlqs,
        events.map_err(|e| open(format!("event group {}", config.events_group), e)),
    )?;

    let submit = CappedConsumer::new(submit, engine.clone(), config.cap_recheck);
    spawn(
        &mut loops,
        Box::new(submit),
        SubmitHandler::new(engine.clone()),
        named(&config.worker, queues::SUBMIT),
        &shutdown,
    );
    let results_worker = named(&config.worker, queues::RESULTS).orderly();
    spawn(&mut loops, results, ResultHandler::new(engine.clone()), results_worker, &shutdown);
    for (dlq, consumer) in dlq_names.iter().zip(dlqs) {
        let archiver = DeadLetterArchiver::new(engine.clone(), expirer.clone());
        spawn(&mut loops, consumer, archiver, named(&config.worker, dlq), &shutdown);
    }
    spawn(&mut loops, events, Fanout(hub), named(&config.worker, EVENTS_WORKER), &shutdown);

    tracing::info!("coordinator running");
    let mut outcome = Ok(());
    while let Some(joined) = loops.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(e)) if outcome.is_ok() => {
                tracing::error!(error = %e, "coordinator loop failed; stopping");
                shutdown.trigger();
                outcome = Err(e);
            }
            Ok(Err(_)) => {}
            Err(e) => tracing::error!(error = %e, "coordinator loop panicked"),
        }
    }
    outcome
}

fn named(worker: &LoopConfig, name: &str) -> LoopConfig {
    LoopConfig { name: name.to_owned(), ..worker.clone() }
}

fn spawn<H: Handler>(
    loops: &mut JoinSet<Result<(), RunError>>,
    consumer: Box<dyn imagepipe_bus::Consumer>,
    handler: H,
    config: LoopConfig,
    shutdown: &Shutdown,
) {
    let stop = shutdown.clone();
    loops.spawn(async move { Ok(Worker::new(consumer, handler, config).run(stop).await?) });
}
