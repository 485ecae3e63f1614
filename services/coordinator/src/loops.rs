//! Wires the coordinator together: the sweeper, the expirer, the consumers of submissions,
//! results and dead letters, and the event fan-out behind `/v1/events`.

use std::time::Duration;

use futures::{FutureExt, TryFutureExt};
use imagepipe_blob::BlobConfigError;
use imagepipe_bus::{Bus, BusError, Consumer, ConsumerConfig, Lanes, Selector, Shares, Subscription};
use imagepipe_contracts::Priority;
use imagepipe_contracts::names::{self, queues};
use imagepipe_runtime::backoff::ExponentialBackoff;
use imagepipe_runtime::clock::{Clock, SystemClock};
use imagepipe_runtime::shutdown::Shutdown;
use imagepipe_runtime::worker::{BatchHandler, BatchWorker, Handler, LoopConfig, Worker, WorkerError};
use tokio::task::JoinSet;

use crate::cluster::{ClusterConfig, LeaseLoop, Ownership};
use crate::consumers::{CappedConsumer, DeadLetterArchiver, ResultHandler, SubmitHandler};
use crate::engine::Engine;
use crate::events::{EventHub, Fanout};
use crate::retention::{Expirer, Retention};
use crate::store::StoreError;

/// The worker name (the `source` label of its metrics, the `worker` of its log lines) of the
/// `/v1/events` fan-out; its subscriber group is this name plus a per-process id, which must
/// not become a label value: one new series per start would pile up without bound.
pub const EVENTS_WORKER: &str = "coordinator-sse";

/// How long the `/v1/events` subscription outlives its last client (a client that reconnects
/// soon finds it in place).
pub const FEED_LINGER: Duration = Duration::from_secs(30);

/// Events published up to this long before the hub subscribed are still handed on: the
/// publishers' clocks may run a little behind this process's.
const FEED_CLOCK_SLACK_MS: u64 = 1_000;

/// Most submissions, and most step results, the coordinator handles as one batch by default.
pub const MAX_BATCH: usize = 128;

/// Most high-priority submissions, and results, handled as one batch: small, so each round of
/// the express loops is quick.
pub const EXPRESS_BATCH: usize = 16;
/// The worker name of the loop of the high submit lane.
pub const EXPRESS_SUBMIT: &str = "tasks.submit.high";
/// The worker name of the loop of the high results lane.
pub const EXPRESS_RESULTS: &str = "tasks.results.high";

/// How the coordinator's loops run.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopsConfig {
    /// Worker settings of every consumer (its name is set per consumer).
    pub worker: LoopConfig,
    /// Most submissions, and most step results, handled as one batch.
    pub max_batch: usize,
    /// Consumer settings of every queue.
    pub consumer: ConsumerConfig,
    /// Shares of the submit queue's priority lanes under backlog.
    pub shares: Shares,
    /// How often the sweeper looks for due timers and unrelayed outbox entries.
    pub sweep_interval: Duration,
    /// While at the in-flight cap, how often to check for room.
    pub cap_recheck: Duration,
    /// Subscriber groups whose dead letters are archived too (besides every task queue's).
    pub dlq_groups: Vec<String>,
    /// This process's subscriber group for `/v1/events` (joined only while a client watches).
    pub events_group: String,
    /// The broker deletes `events_group` once this process has not pulled from it for this
    /// long (it stopped, or lost the broker): no group is left behind per start.
    pub events_idle: Duration,
    /// How long finished tasks and dead letters are kept.
    pub retention: Retention,
    /// How often the expirer deletes what outlived its retention.
    pub expiry_interval: Duration,
    /// This replica's part in the cluster (its engine has the [`Ownership`]); `None`: an
    /// engine outside a cluster, reading every input from the queues themselves.
    pub cluster: Option<ClusterConfig>,
    /// How many batch loops read the owned shards' partitions (each a share of them).
    pub shard_loops: usize,
}

/// Runs a batch worker of `handler` on `consumer` in `loops` until `shutdown`.
fn spawn_batch<H: BatchHandler>(
    loops: &mut JoinSet<Result<(), RunError>>,
    consumer: Box<dyn Consumer>,
    handler: H,
    config: LoopConfig,
    shutdown: &Shutdown,
) {
    let (worker, stop) = (BatchWorker::new(consumer, handler, config), shutdown.clone());
    loops.spawn(async move { Ok(worker.run(stop).await?) });
}

/// One consumer per priority lane.
type LaneConsumers = Vec<(Priority, Box<dyn Consumer>)>;

/// The high lane's consumer of `lanes` ([`Lanes::open_each`], highest first), and the others.
fn split_high(mut lanes: LaneConsumers) -> (Box<dyn Consumer>, LaneConsumers) {
    let (priority, high) = lanes.remove(0);
    debug_assert_eq!(priority, Priority::High, "open_each lists the high lane first");
    (high, lanes)
}

/// Why the coordinator stopped other than by shutdown.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The control state could not be reached.
    #[error("connecting to the control state")]
    Control(#[source] imagepipe_runtime::control::ControlError),
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

    loops.spawn(engine.controls().clone().run_refresher(shutdown.clone()).map(Ok));

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
    let dlqs = futures::future::try_join_all(
        dlq_names.iter().map(|dlq| bus.queues.consume(dlq, config.consumer.clone()).map_err(|e| open(dlq.clone(), e))),
    );
    // The queues themselves: every input outside a cluster; in a cluster, what clients sent
    // without addressing a partition, handled here when this replica owns the shard and
    // handed on to the shard's partition otherwise. (On a bus that routes by key, Kafka, the
    // queue has no such channel: its partitions are the shards.)
    let unrouted = config.cluster.is_none() || !bus.queues.routes_by_key();
    let intake = async {
        if !unrouted {
            return Ok(());
        }
        let inputs = Inputs::open(&engine, &config, None).await?;
        inputs.spawn(&engine, &config, &mut loops, &shutdown);
        Ok::<_, RunError>(())
    };
    let (dlqs, ()) = tokio::try_join!(dlqs, intake)?;
    if let (Some(ownership), Some(cluster)) = (engine.ownership().cloned(), config.cluster.clone()) {
        let lease_loop = LeaseLoop::new(engine.store().clone(), ownership.clone(), engine.clock().clone(), cluster);
        loops.spawn(lease_loop.run(shutdown.clone()).map(Ok));
        loops.spawn(read_owned_shards(engine.clone(), ownership, config.clone(), shutdown.clone()));
    }
    for (dlq, consumer) in dlq_names.iter().zip(dlqs) {
        let archiver = DeadLetterArchiver::new(engine.clone(), expirer.clone());
        spawn(&mut loops, consumer, archiver, named(&config.worker, dlq), &shutdown);
    }
    let subscription = Subscription::new(config.events_group.clone(), Selector::all())
        .with_consumer(config.consumer.clone())
        .expiring_when_idle(config.events_idle);
    let feeder = named(&config.worker, EVENTS_WORKER);
    loops.spawn(feed_hub(bus.clone(), hub, subscription, feeder, shutdown.clone()));

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

/// The submit and results intake of one set of partitions (or of the queues themselves):
/// one consumer per priority lane of each queue.
struct Inputs {
    submit: LaneConsumers,
    results: LaneConsumers,
}

impl Inputs {
    /// Opens every lane of `tasks.submit` and `tasks.results`: partitions `shards` of each,
    /// or the queues themselves.
    async fn open(engine: &Engine, config: &LoopsConfig, shards: Option<&[u16]>) -> Result<Self, RunError> {
        let queues = &*engine.bus().queues;
        let lanes = |queue: &'static str| async move {
            let consumer = config.consumer.clone();
            let opened = match shards {
                Some(shards) => Lanes::open_each_partitions(queues, queue, shards, consumer).await,
                None => Lanes::open_each(queues, queue, consumer).await,
            };
            opened.map_err(|source| RunError::Consume { what: queue.to_owned(), source })
        };
        let (submit, results) = tokio::try_join!(lanes(queues::SUBMIT), lanes(queues::RESULTS))?;
        Ok(Self { submit, results })
    }

    /// Runs the loops over these consumers until `shutdown`: the high lanes of the submit and
    /// results queues have loops of their own, in small batches, so a high task's transitions
    /// never wait behind a backlog's batch; the other lanes share the bulk loops by their
    /// shares. Each submit lane is gated on the cap, the high one on the high cap.
    fn spawn(
        self,
        engine: &Engine,
        config: &LoopsConfig,
        loops: &mut JoinSet<Result<(), RunError>>,
        shutdown: &Shutdown,
    ) {
        let batched = |name, max| LoopConfig { concurrency: max, ..named(&config.worker, name) };
        let (express_submit, submit) = split_high(self.submit);
        let express_submit = CappedConsumer::high(express_submit, engine.clone(), config.cap_recheck);
        let submit = submit
            .into_iter()
            .map(|(p, c)| {
                (p, Box::new(CappedConsumer::new(c, engine.clone(), config.cap_recheck)) as Box<dyn Consumer>)
            })
            .collect();
        let (express_results, results) = split_high(self.results);
        let submissions = || SubmitHandler::new(engine.clone());
        let step_results = || ResultHandler::new(engine.clone());
        spawn_batch(loops, Box::new(express_submit), submissions(), batched(EXPRESS_SUBMIT, EXPRESS_BATCH), shutdown);
        let submit = Box::new(Lanes::new(submit, config.shares));
        spawn_batch(loops, submit, submissions(), batched(queues::SUBMIT, config.max_batch), shutdown);
        spawn_batch(loops, express_results, step_results(), batched(EXPRESS_RESULTS, EXPRESS_BATCH), shutdown);
        let results = Box::new(Lanes::new(results, config.shares));
        spawn_batch(loops, results, step_results(), batched(queues::RESULTS, config.max_batch), shutdown);
    }
}

/// Reads the partitions of the shards `ownership` holds, in `config.shard_loops` groups of
/// shards with loops of their own (so one replica works its shards on every core, a task's
/// inputs in one group, in order). Whenever the owned set changes, the loops finish their
/// batches and stop, the lease loop is told (it releases a shard only after), and loops over
/// the new set start. Stops with `shutdown`, after its loops.
async fn read_owned_shards(
    engine: Engine,
    ownership: Ownership,
    config: LoopsConfig,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let mut owned = ownership.watch();
    let mut failures = ExponentialBackoff::broker_reconnect().attempts();
    loop {
        let current = owned.borrow_and_update().clone();
        let stop = shutdown.child();
        let mut loops: JoinSet<Result<(), RunError>> = JoinSet::new();
        ownership.drained(current.generation);
        let shards: Vec<u16> = current.shards.iter().copied().collect();
        let groups = config.shard_loops.clamp(1, shards.len().max(1));
        let mut opened = true;
        for group in 0..groups {
            if shards.is_empty() {
                break;
            }
            let mine: Vec<u16> = shards.iter().copied().skip(group).step_by(groups).collect();
            match Inputs::open(&engine, &config, Some(&mine)).await {
                Ok(inputs) => inputs.spawn(&engine, &config, &mut loops, &stop),
                Err(e) => {
                    tracing::warn!(error = %e, "partitions of owned shards not opened; retrying");
                    opened = false;
                    break;
                }
            }
        }
        if opened {
            failures.reset();
            tracing::info!(shards = shards.len(), groups, generation = current.generation, "reading owned shards");
        }
        let retry = if opened { None } else { Some(failures.next_delay()) };
        let failed = tokio::select! {
            // The shutdown first: the loops stop with it too, and are not to be seen as ending.
            biased;
            () = shutdown.wait() => None,
            changed = owned.changed() => changed.err().map(|_| ()),
            () = async { match retry { Some(delay) => tokio::time::sleep(delay).await, None => std::future::pending().await } } => None,
            Some(joined) = loops.join_next() => {
                match joined {
                    Ok(Err(e)) => tracing::warn!(error = %e, "a loop over owned shards failed; opening them again"),
                    Err(e) => tracing::error!(error = %e, "a loop over owned shards panicked; opening them again"),
                    Ok(Ok(())) => tracing::warn!("a loop over owned shards ended; opening them again"),
                }
                None
            }
        };
        stop.trigger();
        while loops.join_next().await.is_some() {}
        if shutdown.is_triggered() || failed.is_some() {
            ownership.drained(u64::MAX);
            return Ok(());
        }
    }
}

/// Feeds `hub` from the event topics while anyone watches: subscribes (as `subscription`'s
/// group) when the first client arrives, and stops pulling once nobody has watched for
/// [`FEED_LINGER`]; the broker then deletes the group after its idle time, or it is resumed
/// when a client comes back first. A subscription that fails is retried while clients wait.
async fn feed_hub(
    bus: Bus,
    hub: EventHub,
    subscription: Subscription,
    worker: LoopConfig,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let mut watchers = hub.watchers();
    hub.set_fed(false);
    let mut failures = ExponentialBackoff::broker_reconnect().attempts();
    loop {
        tokio::select! {
            () = shutdown.wait() => return Ok(()),
            watched = watchers.wait_for(|n| *n > 0) => if watched.is_err() { return Ok(()) },
        }
        let since = SystemClock.unix_ms().saturating_sub(FEED_CLOCK_SLACK_MS);
        let consumer = match bus.events.subscribe(subscription.clone()).await {
            Ok(consumer) => consumer,
            Err(e) => {
                let delay = failures.next_delay();
                tracing::warn!(group = %subscription.group, error = %e, retry_in = ?delay, "event subscription failed; retrying");
                if !shutdown.sleep(delay).await {
                    return Ok(());
                }
                continue;
            }
        };
        failures.reset();
        hub.set_fed(true);
        let stop = shutdown.child();
        let idle = tokio::spawn(stop_when_unwatched(hub.watchers(), stop.clone()));
        let fed = Worker::new(consumer, Fanout { hub: hub.clone(), since }, worker.clone()).run(stop).await;
        idle.abort();
        hub.set_fed(false);
        fed?;
        if shutdown.is_triggered() {
            return Ok(());
        }
    }
}

/// Triggers `stop` once nobody has watched for [`FEED_LINGER`].
async fn stop_when_unwatched(mut watchers: tokio::sync::watch::Receiver<usize>, stop: Shutdown) {
    loop {
        if watchers.wait_for(|n| *n == 0).await.is_err() {
            break;
        }
        if tokio::time::timeout(FEED_LINGER, watchers.wait_for(|n| *n > 0)).await.is_err() {
            break;
        }
    }
    stop.trigger();
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
