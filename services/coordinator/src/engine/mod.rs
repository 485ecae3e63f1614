//! The coordinator's core, the only writer of task state, in four rooms along the message path:
//! [`intake`] (submissions, batches and the in-flight cap), [`apply`] (inputs decided by
//! [`machine::decide`](crate::machine::decide) and written by compare-and-set), [`relay`] (the
//! outbox sent on the bus) and [`timers`] (sweeps, deadlines, retries, redispatch). See
//! docs/design.md, "Coordinator".

mod apply;
mod intake;
mod relay;
mod timers;

use std::sync::Arc;
use std::time::Duration;

use imagepipe_bus::Bus;
use imagepipe_runtime::clock::Clock;
use imagepipe_runtime::control::{ControlStore, MemoryControl};
use imagepipe_runtime::telemetry::join_trace;
use metrics::gauge;
use tracing::Span;

use crate::cluster::Ownership;
use crate::control::QueueControls;
use crate::machine::{Ignored, IllegalTransition, Policy};
use crate::metrics as m;
use crate::queue_wait::QueueWaits;
use crate::store::{StoreError, TaskStore};
use crate::task::Task;

use apply::MAX_CONFLICTS;
pub use intake::{Origin, Submission, SubmitFailure, Submitted};

/// Engine settings.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Retry and deadline rules.
    pub policy: Policy,
    /// Most tasks started and unfinished at once.
    pub max_in_flight: u64,
    /// How long a claimed wake-index entry is this replica's before another may take it.
    pub lease: Duration,
    /// Most due tasks handled per sweep.
    pub sweep_batch: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self { policy: Policy::default(), max_in_flight: 1_000, lease: Duration::from_secs(30), sweep_batch: 256 }
    }
}

/// Something that kept an input from being handled.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store failed; try again. (Shared: one failed batch call fails each of its inputs.)
    #[error(transparent)]
    Store(Arc<StoreError>),
    /// No task has this id.
    #[error("no task {0}")]
    UnknownTask(String),
    /// The input has no edge from the task's state (logged and counted).
    #[error(transparent)]
    Illegal(#[from] IllegalTransition),
    /// This replica does not hold the lease on the task's shard (it never did, or lost it:
    /// the store refused the write); the input belongs to the shard's owner.
    #[error("task {task} is in shard {shard}, which this replica does not own")]
    NotOwner {
        /// The task.
        task: String,
        /// Its shard.
        shard: u16,
    },
    /// Other writers kept changing the task; try again.
    #[error("task {0} kept changing under {MAX_CONFLICTS} attempts to update it")]
    Contention(String),
}

impl From<StoreError> for EngineError {
    fn from(error: StoreError) -> Self {
        Self::Store(Arc::new(error))
    }
}

/// What an input did.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// A transition was written; the task after it.
    Applied(Box<Task>),
    /// Acknowledged without effect.
    Ignored(Ignored),
}

/// The coordinator: the only writer of task state. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    store: Arc<dyn TaskStore>,
    bus: Bus,
    clock: Arc<dyn Clock>,
    config: Arc<EngineConfig>,
    /// One [`Engine::start_queued`] pass at a time in this process: passes racing each other
    /// would only lose compare-and-sets to each other.
    starting: Arc<tokio::sync::Mutex<()>>,
    /// A start pass was asked for while another ran: the running one makes another pass
    /// instead of the caller waiting for it.
    start_wanted: Arc<std::sync::atomic::AtomicBool>,
    /// The tasks this process wrote last, so the next input is decided without reading.
    recent: Arc<Recent>,
    /// The operator controls: which stages are paused (their deadlines start over).
    controls: QueueControls,
    /// What the stage queues hold (a deadline whose command may still wait is postponed).
    waits: Arc<QueueWaits>,
    /// The shards this replica owns; `None`: an engine outside a cluster, which writes every
    /// task unfenced (tests, tools).
    ownership: Option<Ownership>,
}

/// Tasks as this process last wrote them (unfinished ones, at most four times the in-flight
/// cap): the next input of such a task is decided on this copy instead of a store read. A copy
/// gone stale (another replica wrote the task since) loses its compare-and-set, and an input it
/// would not apply is decided again on the stored task, so a stale copy costs a read, never a
/// wrong transition.
#[derive(Default)]
struct Recent(std::sync::Mutex<std::collections::HashMap<String, Task>>);

impl Recent {
    fn get(&self, id: &str) -> Option<Task> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(id).cloned()
    }

    fn put(&self, task: &Task, max_in_flight: u64) {
        let mut tasks = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if task.state.is_terminal() {
            tasks.remove(&task.id);
            return;
        }
        if tasks.get(&task.id).is_some_and(|known| known.version >= task.version) {
            return;
        }
        if tasks.len() as u64 >= max_in_flight.saturating_mul(4).max(64) {
            tasks.clear();
        }
        tasks.insert(task.id.clone(), task.clone());
    }
}

impl Engine {
    /// An engine over `store`, sending on `bus`, telling time by `clock`.
    pub fn new(store: Arc<dyn TaskStore>, bus: Bus, clock: Arc<dyn Clock>, config: EngineConfig) -> Self {
        gauge!(m::IN_FLIGHT_CAP).set(config.max_in_flight as f64);
        Self {
            store,
            waits: Arc::new(QueueWaits::new(bus.clone(), config.policy.steps())),
            controls: QueueControls::new(Arc::new(MemoryControl::ephemeral()), clock.clone(), config.policy.steps()),
            bus,
            clock,
            config: Arc::new(config),
            starting: Arc::default(),
            start_wanted: Arc::default(),
            recent: Arc::default(),
            ownership: None,
        }
    }

    /// The same engine as one replica of a cluster: it writes only under its leases on the
    /// shards of `ownership` (docs/design.md, "Shards, leases and routing").
    pub fn with_ownership(mut self, ownership: Ownership) -> Self {
        self.ownership = Some(ownership);
        self
    }

    /// The shards this replica owns, when it is one of a cluster.
    pub fn ownership(&self) -> Option<&Ownership> {
        self.ownership.as_ref()
    }

    /// The same engine with its operator controls kept in `control` (by default in this
    /// engine's memory only).
    pub fn with_control(mut self, control: Arc<dyn ControlStore>) -> Self {
        self.controls = QueueControls::new(control, self.clock.clone(), self.config.policy.steps());
        self
    }

    /// The operator controls.
    pub fn controls(&self) -> &QueueControls {
        &self.controls
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn TaskStore> {
        &self.store
    }

    /// The bus.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }
}

/// The span the coordinator works on `task` in (`kind` is `transition` or `wake`, `what` the
/// input or cause), in the task's trace so that what it sends continues that trace.
fn task_span(task: &Task, kind: &'static str, what: &'static str) -> Span {
    let span = tracing::info_span!(
        "task",
        otel.name = %format!("task {kind} {what}"),
        task_id = %task.id,
        trace_id = %task.trace_id,
    );
    join_trace(&span, task.trace_id);
    span
}
