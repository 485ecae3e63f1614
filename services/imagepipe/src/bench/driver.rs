//! The load driver: submits tasks by publishing their submit JSON on the submit queue (the
//! durable path every client uses) and times each one to its `task.completed` (or
//! `task.failed`) event, received by a subscriber group of its own.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use futures::future::join_all;
use imagepipe_bus::{Bus, BusError, Consumer, Message, Selector, Subscription};
use imagepipe_contracts::SubmitTask;
use imagepipe_contracts::names::{headers, queues};
use imagepipe_contracts::shard::shard_of;
use imagepipe_runtime::Shutdown;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Submit commands sent per batch at full load (the backend pipelines a batch).
const SUBMIT_BATCH: usize = 128;
/// Deliveries the observer takes per fetch.
const OBSERVE_BATCH: usize = 512;
/// How long one observer fetch waits.
const OBSERVE_WAIT: Duration = Duration::from_millis(200);

/// The driver could not finish a phase.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The observer's subscriber group could not be created.
    #[error("subscribing to task.completed and task.failed")]
    Subscribe(#[source] BusError),
    /// A submit command was not accepted.
    #[error("submitting tasks")]
    Submit(#[source] BusError),
    /// Tasks did not finish in time.
    #[error("{finished} of {expected} tasks finished within {waited:?}")]
    Timeout {
        /// Tasks submitted.
        expected: usize,
        /// Tasks that finished.
        finished: usize,
        /// How long the phase waited.
        waited: Duration,
    },
}

/// A task's end as the observer saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The task.
    pub task_id: String,
    /// `task.completed` (else `task.failed`).
    pub completed: bool,
    /// When the event was received.
    pub at: Instant,
}

/// Receives `task.completed` and `task.failed` in a subscriber group of its own; acks them.
pub struct Observer {
    finished: mpsc::UnboundedReceiver<Finished>,
    stop: Shutdown,
    task: JoinHandle<()>,
}

impl Observer {
    /// Joins the new group `group` (start at new events); call it before submitting.
    pub async fn start(bus: &Bus, group: &str) -> Result<Self, DriverError> {
        let selector = Selector::parse("task.completed || task.failed").expect("the selector is valid");
        let consumer =
            bus.events.subscribe(Subscription::new(group, selector)).await.map_err(DriverError::Subscribe)?;
        let (tx, finished) = mpsc::unbounded_channel();
        let stop = Shutdown::new();
        let task = tokio::spawn(observe(consumer, tx, stop.clone()));
        Ok(Self { finished, stop, task })
    }

    /// The next task end seen before `deadline`.
    pub(crate) async fn next(&mut self, deadline: Instant) -> Option<Finished> {
        tokio::time::timeout_at(deadline, self.finished.recv()).await.ok().flatten()
    }

    /// Stops receiving.
    pub async fn stop(self) {
        self.stop.trigger();
        let _ = self.task.await;
    }
}

async fn observe(consumer: Box<dyn Consumer>, tx: mpsc::UnboundedSender<Finished>, stop: Shutdown) {
    loop {
        let fetched = tokio::select! {
            () = stop.wait() => return,
            fetched = consumer.fetch(OBSERVE_BATCH, OBSERVE_WAIT) => fetched,
        };
        let deliveries = match fetched {
            Ok(deliveries) => deliveries,
            Err(error) => {
                tracing::warn!(error = %imagepipe_runtime::error_chain(&error), "observer fetch failed; retrying");
                tokio::time::sleep(OBSERVE_WAIT).await;
                continue;
            }
        };
        let at = Instant::now();
        for delivery in &deliveries {
            let message = &delivery.message;
            let event_type = message.headers.get(headers::EVENT_TYPE);
            let (Some(task_id), Some(event_type)) = (&message.key, event_type) else { continue };
            let finished = Finished { task_id: task_id.clone(), completed: event_type == "task.completed", at };
            if tx.send(finished).is_err() {
                return;
            }
        }
        for acked in join_all(deliveries.into_iter().map(|d| d.ack())).await {
            if let Err(error) = acked {
                tracing::debug!(error = %error, "observer ack failed; the event comes again");
            }
        }
    }
}

/// The submit message of `submit`, keyed by its task id, as every client sends it.
pub fn submit_message(submit: &SubmitTask) -> Message {
    let body = serde_json::to_vec(submit).expect("a submit command serializes");
    let message = Message::new(body);
    match &submit.task_id {
        Some(id) => message.with_key(id.clone()),
        None => message,
    }
}

/// Where the driver sends a submit command.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SubmitRoute {
    /// To the queue `tasks.submit` itself, as a client that knows nothing of shards does: a
    /// coordinator that does not own the task's shard hands it on (one more hop).
    #[default]
    Queue,
    /// To the partition of the task's shard among this many shards (docs/contracts.md,
    /// "Shards"): read by the shard's owner directly.
    Shard(u16),
}

impl SubmitRoute {
    /// The submit message of `submit`, sent where this route says.
    pub fn message(self, submit: &SubmitTask) -> Message {
        let message = submit_message(submit);
        match (self, &submit.task_id) {
            (Self::Shard(shards), Some(id)) => message.with_partition(shard_of(id, shards)),
            _ => message,
        }
    }
}

/// What a phase measured.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    /// Tasks submitted.
    pub submitted: usize,
    /// Tasks that completed.
    pub completed: usize,
    /// Tasks that failed.
    pub failed: usize,
    /// From the first submit to the last task's end.
    pub wall: Duration,
    /// Submit to end, per task.
    pub latencies: Vec<Duration>,
}

/// Submits every task of `submits` as fast as the bus accepts them (batches of
/// [`SUBMIT_BATCH`], sent where `route` says) while the observer collects their ends;
/// `timeout` bounds the phase.
pub async fn full_load(
    bus: &Bus,
    observer: &mut Observer,
    submits: Vec<SubmitTask>,
    route: SubmitRoute,
    timeout: Duration,
) -> Result<Phase, DriverError> {
    let expected: HashSet<String> = submits.iter().filter_map(|s| s.task_id.clone()).collect();
    let started = Instant::now();
    let deadline = started + timeout;
    let mut submitter = {
        let bus = bus.clone();
        tokio::spawn(async move {
            let mut sent_at = HashMap::with_capacity(submits.len());
            for chunk in submits.chunks(SUBMIT_BATCH) {
                let at = Instant::now();
                sent_at.extend(chunk.iter().filter_map(|s| s.task_id.clone()).map(|id| (id, at)));
                bus.queues.send_batch(queues::SUBMIT, chunk.iter().map(|s| route.message(s)).collect()).await?;
            }
            Ok::<_, BusError>(sent_at)
        })
    };
    let mut sent_at = None;
    let mut ends: HashMap<String, Finished> = HashMap::with_capacity(expected.len());
    while ends.len() < expected.len() && Instant::now() < deadline {
        if sent_at.is_none() && submitter.is_finished() {
            sent_at = Some(submitted(&mut submitter).await?);
        }
        let slice = (Instant::now() + Duration::from_secs(1)).min(deadline);
        if let Some(end) = observer.next(slice).await
            && expected.contains(&end.task_id)
        {
            ends.entry(end.task_id.clone()).or_insert(end);
        }
    }
    let sent_at = match sent_at {
        Some(sent_at) => sent_at,
        None => submitted(&mut submitter).await?,
    };
    if ends.len() < expected.len() {
        return Err(DriverError::Timeout { expected: expected.len(), finished: ends.len(), waited: timeout });
    }
    Ok(phase(&sent_at, ends.into_values(), started))
}

/// Submits the tasks of `submits` one at a time (sent where `route` says), each after the
/// previous one ended; `timeout` bounds each task.
pub async fn one_at_a_time(
    bus: &Bus,
    observer: &mut Observer,
    submits: Vec<SubmitTask>,
    route: SubmitRoute,
    timeout: Duration,
) -> Result<Phase, DriverError> {
    let started = Instant::now();
    let mut sent_at = HashMap::with_capacity(submits.len());
    let mut ends = Vec::with_capacity(submits.len());
    for submit in &submits {
        let id = submit.task_id.clone().unwrap_or_default();
        let at = Instant::now();
        bus.queues.send(queues::SUBMIT, route.message(submit)).await.map_err(DriverError::Submit)?;
        sent_at.insert(id.clone(), at);
        let deadline = at + timeout;
        loop {
            match observer.next(deadline).await {
                Some(end) if end.task_id == id => {
                    ends.push(end);
                    break;
                }
                Some(_) => {}
                None => {
                    return Err(DriverError::Timeout {
                        expected: submits.len(),
                        finished: ends.len(),
                        waited: timeout,
                    });
                }
            }
        }
    }
    Ok(phase(&sent_at, ends, started))
}

type SentAt = HashMap<String, Instant>;

async fn submitted(submitter: &mut JoinHandle<Result<SentAt, BusError>>) -> Result<SentAt, DriverError> {
    match submitter.await {
        Ok(sent) => sent.map_err(DriverError::Submit),
        Err(join) => std::panic::resume_unwind(join.into_panic()),
    }
}

fn phase(sent_at: &HashMap<String, Instant>, ends: impl IntoIterator<Item = Finished>, started: Instant) -> Phase {
    let mut result = Phase { submitted: sent_at.len(), ..Phase::default() };
    let mut last = started;
    for end in ends {
        let Some(sent) = sent_at.get(&end.task_id) else { continue };
        if end.completed {
            result.completed += 1;
        } else {
            result.failed += 1;
        }
        result.latencies.push(end.at.saturating_duration_since(*sent));
        last = last.max(end.at);
    }
    result.wall = last.saturating_duration_since(started);
    result
}
