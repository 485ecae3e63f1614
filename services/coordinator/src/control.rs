//! [`QueueControls`]: the coordinator's side of the operator controls. It writes the control
//! state ([`imagepipe_runtime::control`]) for the API, announces pauses on the bus
//! (`queue.paused` / `queue.resumed`), waits for a pause to be in force at the workers, asks
//! workers to stop cancelled steps, and keeps the set of paused stages the state machine reads:
//! deadlines of tasks waiting in a paused queue start over instead of firing, and a cancel of a
//! task waiting in a paused queue that runs nothing is at once.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use imagepipe_bus::{Bus, BusError};
use imagepipe_contracts::payload::{QueueChanged, QueuePaused, QueueResumed};
use imagepipe_contracts::{Event, EventPayload, Step, TraceId};
use imagepipe_runtime::clock::Clock;
use imagepipe_runtime::control::{ControlError, ControlState, ControlStore, QueueActivity};
use imagepipe_runtime::shutdown::Shutdown;
use imagepipe_runtime::step::event_message;

use crate::machine::{PausedSteps, SOURCE};

/// How often the coordinator reads the control state (pauses other replicas set reach its
/// deadlines within it).
pub const REFRESH: Duration = Duration::from_millis(500);

/// How long a pause waits for every live consumer of the queue to stop taking messages before
/// it answers that the queue is still pausing (workers stop within a refresh and a fetch, about
/// a second).
pub const PAUSE_WAIT: Duration = Duration::from_secs(3);

/// How often a pause being waited for is looked at.
const PAUSE_POLL: Duration = Duration::from_millis(50);

/// A control change failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlFailure {
    /// The control state could not be written.
    #[error("writing the control state")]
    Store(#[from] ControlError),
    /// The change was written but its event could not be published.
    #[error("publishing {event_type}")]
    Publish {
        /// The event.
        event_type: &'static str,
        /// Why.
        #[source]
        source: BusError,
    },
}

/// The coordinator's side of the operator controls (see the module docs).
#[derive(Clone)]
pub struct QueueControls {
    store: Arc<dyn ControlStore>,
    clock: Arc<dyn Clock>,
    /// The pipeline's steps, built-in and users' own, whose queues the machine asks about.
    steps: Arc<[Step]>,
    /// What the last read found: which steps' queues are paused, which of those run nothing,
    /// and when each was last resumed.
    paused: Arc<Mutex<PausedSteps>>,
}

/// Whether a paused queue runs nothing: its pause is in force at every live consumer and none
/// of them holds a message.
fn runs_nothing(activity: &QueueActivity, state: &ControlState, queue: &str) -> bool {
    activity.pause_in_force(&state.queue(queue)) && activity.in_flight == 0
}

impl QueueControls {
    /// Controls kept in `store`, telling the consumers' liveness by `clock`, for the queues of
    /// `steps` (the pipeline's).
    pub fn new(store: Arc<dyn ControlStore>, clock: Arc<dyn Clock>, steps: impl IntoIterator<Item = Step>) -> Self {
        Self { store, clock, steps: steps.into_iter().collect(), paused: Arc::default() }
    }

    /// The control store.
    pub fn store(&self) -> &Arc<dyn ControlStore> {
        &self.store
    }

    /// The steps whose queues were paused at the last read, which of them ran nothing, and
    /// when each was last resumed.
    pub fn paused_steps(&self) -> PausedSteps {
        self.paused.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Reads the control state and, for each paused stage, what its consumers report; remembers
    /// which stages are paused, which of those run nothing, and when each was last resumed.
    pub async fn refresh(&self) -> Result<ControlState, ControlError> {
        let state = self.store.state().await?;
        let now = self.clock.unix_ms();
        let mut steps = PausedSteps::of(self.steps.iter().copied().filter(|step| state.is_paused(step.queue())));
        for &step in self.steps.iter() {
            let queue = step.queue();
            steps = steps.resumed(step, state.queue(queue).resumed_at);
            if !state.is_paused(queue) {
                continue;
            }
            // Unread, the consumers may run anything: a cancel there waits for the step.
            match self.store.activity(queue, now).await {
                Ok(activity) if runs_nothing(&activity, &state, queue) => steps = steps.idle(step),
                Ok(_) => {}
                Err(error) => tracing::debug!(queue, error = %imagepipe_runtime::error_chain(&error),
                    "reading what the consumers of a paused queue report"),
            }
        }
        *self.paused.lock().unwrap_or_else(PoisonError::into_inner) = steps;
        Ok(state)
    }

    /// Waits up to `within` until the pause of stage queue `queue` is in force: every live
    /// consumer has stopped taking its messages. Whether it is (false also when the queue is not
    /// paused, or was resumed meanwhile).
    pub async fn until_paused(&self, queue: &str, within: Duration) -> Result<bool, ControlError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let state = self.store.state().await?;
            let activity = self.store.activity(queue, self.clock.unix_ms()).await?;
            let control = state.queue(queue);
            if !control.paused || activity.pause_in_force(&control) {
                self.refresh().await?;
                return Ok(control.paused);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(PAUSE_POLL).await;
        }
    }

    /// Pauses or resumes stage queue `queue` (every lane of it) and, when that changed
    /// anything, publishes `queue.paused` / `queue.resumed`; whether it changed.
    pub async fn set_paused(
        &self,
        bus: &Bus,
        clock: &dyn Clock,
        queue: &str,
        paused: bool,
        reason: Option<String>,
    ) -> Result<bool, ControlFailure> {
        let now = clock.unix_ms();
        let changed = self.store.set_paused(queue, paused, now).await?;
        self.refresh().await?;
        if changed {
            let change = QueueChanged { queue: queue.to_owned(), reason };
            if paused {
                publish(bus, now, queue, QueuePaused(change)).await?;
            } else {
                publish(bus, now, queue, QueueResumed(change)).await?;
            }
            tracing::info!(queue, paused, "queue control changed");
        }
        Ok(changed)
    }

    /// Reads the state every [`REFRESH`] until `shutdown`.
    pub async fn run_refresher(self, shutdown: Shutdown) {
        let mut failing = false;
        loop {
            match self.refresh().await {
                Ok(_) if failing => {
                    failing = false;
                    tracing::info!("the control state is readable again");
                }
                Ok(_) => {}
                Err(error) if !failing => {
                    failing = true;
                    tracing::warn!(error = %imagepipe_runtime::error_chain(&error), "reading the control state failed; keeping the last one");
                }
                Err(_) => {}
            }
            if !shutdown.sleep(REFRESH).await {
                return;
            }
        }
    }
}

/// Publishes a queue event, keyed by `queue`: the standard envelope without a task id, its id
/// random (each change is news), its trace a new one.
async fn publish<P: EventPayload>(bus: &Bus, now: u64, queue: &str, payload: P) -> Result<(), ControlFailure> {
    let event = Event {
        event_id: uuid::Uuid::new_v4(),
        event_type: P::EVENT_TYPE,
        task_id: None,
        trace_id: TraceId::random(),
        timestamp: now,
        source: SOURCE.to_owned(),
        payload,
    };
    let message = event_message(&event, queue);
    bus.events
        .publish(P::EVENT_TYPE.as_str(), message)
        .await
        .map_err(|source| ControlFailure::Publish { event_type: P::EVENT_TYPE.as_str(), source })
}

#[cfg(test)]
mod tests;
