//! [`Control`]: one worker's live view of its queue's control state, and its reports back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::{Beat, ControlStore, QueueControl};
use crate::clock::{Clock, SystemClock};

/// How often a worker reads its queue's control state by default (pauses apply within it).
pub const REFRESH: Duration = Duration::from_millis(500);

/// Running steps of this process that can be told to stop, by task id.
#[derive(Clone, Default)]
pub struct CancelRegistry {
    running: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
}

impl CancelRegistry {
    /// Registers a running step of `task_id`; the returned guard's [`RunningStep::cancelled`]
    /// completes when an operator cancels the task. Dropping the guard unregisters it.
    pub fn register(&self, task_id: &str) -> RunningStep {
        let notify = Arc::new(Notify::new());
        self.running.lock().unwrap_or_else(|e| e.into_inner()).insert(task_id.to_owned(), notify.clone());
        RunningStep { registry: self.clone(), task_id: task_id.to_owned(), notify }
    }

    fn ids(&self) -> Vec<String> {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).keys().cloned().collect()
    }

    fn cancel(&self, task_id: &str) {
        if let Some(notify) = self.running.lock().unwrap_or_else(|e| e.into_inner()).get(task_id) {
            notify.notify_one();
        }
    }
}

/// A registered running step (see [`CancelRegistry::register`]).
pub struct RunningStep {
    registry: CancelRegistry,
    task_id: String,
    notify: Arc<Notify>,
}

impl RunningStep {
    /// Completes when the step's task is cancelled.
    pub async fn cancelled(&self) {
        self.notify.notified().await;
    }
}

impl Drop for RunningStep {
    fn drop(&mut self) {
        let mut running = self.registry.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.get(&self.task_id).is_some_and(|n| Arc::ptr_eq(n, &self.notify)) {
            running.remove(&self.task_id);
        }
    }
}

/// What the worker loop tells its [`Control`] about itself.
#[derive(Default)]
pub struct LoopStats {
    /// Messages held now.
    pub in_flight: AtomicU32,
    /// Messages it may hold.
    pub concurrency: AtomicU32,
    /// Messages taken since the last beat.
    pub taken: AtomicU64,
    /// The `updatedAt` of the pause the loop has stopped taking messages under; 0 while it
    /// takes messages.
    pub paused_at: AtomicU64,
    /// Notified when `paused_at` changes, so the next beat reports it at once.
    pub pause_changed: Notify,
}

/// A worker's control: which queue it serves and where the control state is (see
/// [`Worker::controlled`](crate::worker::Worker::controlled)).
pub struct Control {
    store: Arc<dyn ControlStore>,
    queue: String,
    replica: String,
    refresh: Duration,
    cancels: CancelRegistry,
    clock: Arc<dyn Clock>,
}

impl Control {
    /// The control of a consumer of `queue` (`tasks.download`), read from `store`.
    pub fn new(store: Arc<dyn ControlStore>, queue: impl Into<String>) -> Self {
        Self {
            store,
            queue: queue.into(),
            replica: uuid::Uuid::new_v4().simple().to_string(),
            refresh: REFRESH,
            cancels: CancelRegistry::default(),
            clock: Arc::new(SystemClock),
        }
    }

    /// Reads the state every `refresh` instead of [`REFRESH`].
    pub fn with_refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// The running steps this control stops when their task is cancelled; give it to the
    /// step handler ([`Reporting::with_cancels`](crate::step::Reporting::with_cancels)).
    pub fn cancels(&self) -> CancelRegistry {
        self.cancels.clone()
    }

    /// Starts reading the state and beating; the handle ends both when dropped. The first beat
    /// is written before it returns, so a replica is counted before it can take a message (a
    /// pause is not in force while a consumer that may take messages has not reported).
    pub(crate) async fn start(self) -> ControlHandle {
        let first = match self.store.state().await {
            Ok(state) => state.queue(&self.queue),
            Err(error) => {
                tracing::warn!(queue = %self.queue, error = %crate::error_text::error_chain(&error),
                    "reading the control state; starting unpaused");
                QueueControl::default()
            }
        };
        let beat = Beat { at: self.clock.unix_ms(), ..Beat::default() };
        if let Err(error) = self.store.beat(&self.queue, &self.replica, beat).await {
            tracing::warn!(queue = %self.queue, error = %crate::error_text::error_chain(&error),
                "reporting this consumer to the control state");
        }
        let (tx, rx) = watch::channel(first);
        let stats = Arc::new(LoopStats::default());
        let task = tokio::spawn(refresh(self, tx, stats.clone()));
        ControlHandle { rx, stats, task }
    }
}

/// A running [`Control`]: the latest settings, and the counters the loop reports through.
pub struct ControlHandle {
    /// The queue's latest settings.
    pub rx: watch::Receiver<QueueControl>,
    /// What the worker loop reports.
    pub stats: Arc<LoopStats>,
    task: JoinHandle<()>,
}

impl Drop for ControlHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn refresh(control: Control, tx: watch::Sender<QueueControl>, stats: Arc<LoopStats>) {
    let mut tick = tokio::time::interval(control.refresh);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stats.pause_changed.notified() => {}
        }
        let now = control.clock.unix_ms();
        // Read before the in-flight count: a pause reported comes with the count the loop
        // stored before obeying it (or a later, smaller one).
        let paused_at = stats.paused_at.load(Ordering::Acquire);
        let beat = Beat {
            at: now,
            in_flight: stats.in_flight.load(Ordering::Acquire),
            concurrency: stats.concurrency.load(Ordering::Relaxed),
            taken: stats.taken.swap(0, Ordering::Relaxed),
            paused_at,
        };
        let running = control.cancels.ids();
        let (state, beaten, cancelled) = tokio::join!(
            control.store.state(),
            control.store.beat(&control.queue, &control.replica, beat),
            control.store.cancelled(&running, now),
        );
        let outcome = state.and_then(|state| {
            tx.send_if_modified(|current| {
                let next = state.queue(&control.queue);
                let changed = *current != next;
                *current = next;
                changed
            });
            beaten?;
            for (id, cancelled) in running.iter().zip(cancelled?) {
                if cancelled {
                    control.cancels.cancel(id);
                }
            }
            Ok(())
        });
        match outcome {
            Ok(()) if failing => {
                failing = false;
                tracing::info!(queue = %control.queue, "the control state is readable again");
            }
            Ok(()) => {}
            Err(error) => {
                if beat.taken > 0 {
                    stats.taken.fetch_add(beat.taken, Ordering::Relaxed);
                }
                if !failing {
                    tracing::warn!(queue = %control.queue, error = %crate::error_text::error_chain(&error),
                        "reading the control state failed; keeping the last one");
                }
                failing = true;
            }
        }
    }
}
