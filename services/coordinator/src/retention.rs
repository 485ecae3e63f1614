//! Nothing the coordinator stores grows without bound: the [`Expirer`] deletes finished tasks
//! `coordinator.retention` after their last transition, and keeps the dead-letter archive
//! within `dlq.max_entries` and `dlq.max_age` (its bodies are cut by the store, see
//! [`crate::store::DEAD_LETTER_BODY_BYTES`]).

use std::sync::Arc;
use std::time::Duration;

use imagepipe_runtime::batches::until_short;
use imagepipe_runtime::clock::{Clock, millis};
use imagepipe_runtime::config::{CoordinatorConfig, DlqConfig};
use imagepipe_runtime::shutdown::Shutdown;
use metrics::counter;

use crate::metrics as m;
use crate::store::{StoreError, TaskStore};

/// Most tasks (or dead letters) deleted per store call; a pass repeats calls until one comes
/// back short.
const BATCH: usize = 256;

/// How long things are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// How long a finished task is kept after its last transition.
    pub tasks: Duration,
    /// Most dead letters archived at once.
    pub dlq_max_entries: u64,
    /// How long a dead letter is kept after it was dead-lettered.
    pub dlq_max_age: Duration,
}

impl Retention {
    /// The retention of `coordinator.retention` and the `dlq` section.
    pub fn from_settings(coordinator: &CoordinatorConfig, dlq: &DlqConfig) -> Self {
        Self { tasks: coordinator.retention, dlq_max_entries: dlq.max_entries, dlq_max_age: dlq.max_age }
    }
}

impl Default for Retention {
    fn default() -> Self {
        Self::from_settings(&CoordinatorConfig::default(), &DlqConfig::default())
    }
}

/// What one [`Expirer::pass`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Finished tasks.
    pub tasks: usize,
    /// Archived dead letters.
    pub dead_letters: usize,
}

/// Deletes what outlived its retention; cheap to clone. Several replicas may run one each.
#[derive(Clone)]
pub struct Expirer {
    store: Arc<dyn TaskStore>,
    clock: Arc<dyn Clock>,
    retention: Retention,
}

/// `now` minus `age`, in Unix ms (0 when `age` reaches back before 1970).
fn cutoff(now: u64, age: Duration) -> u64 {
    now.saturating_sub(millis(age))
}

impl Expirer {
    /// An expirer of `store`'s tasks and dead letters, telling time by `clock`.
    pub fn new(store: Arc<dyn TaskStore>, clock: Arc<dyn Clock>, retention: Retention) -> Self {
        Self { store, clock, retention }
    }

    /// Deletes every finished task and dead letter past its retention now.
    pub async fn pass(&self) -> Result<Expired, StoreError> {
        let now = self.clock.unix_ms();
        let before = cutoff(now, self.retention.tasks);
        let tasks = until_short(BATCH, |max| async move {
            let n = self.store.expire_finished(before, max).await?;
            counter!(m::TASKS_EXPIRED).increment(n as u64);
            Ok::<_, StoreError>(n)
        })
        .await?;
        let expired = Expired { tasks, dead_letters: self.trim_dead_letters().await? };
        if expired != Expired::default() {
            tracing::info!(tasks = expired.tasks, dead_letters = expired.dead_letters, "expired");
        }
        Ok(expired)
    }

    /// Deletes the dead letters beyond `dlq.max_age` or `dlq.max_entries`; how many. The
    /// archiver calls it after each dead letter, so the count stays within its bound.
    pub async fn trim_dead_letters(&self) -> Result<usize, StoreError> {
        let before = cutoff(self.clock.unix_ms(), self.retention.dlq_max_age);
        until_short(BATCH, |max| async move {
            let n = self.store.trim_dead_letters(before, self.retention.dlq_max_entries, max).await?;
            counter!(m::DEAD_LETTERS_TRIMMED).increment(n as u64);
            Ok::<_, StoreError>(n)
        })
        .await
    }

    /// Runs a [`pass`](Self::pass) every `interval` until `shutdown`.
    pub async fn run(&self, interval: Duration, shutdown: Shutdown) {
        loop {
            if let Err(e) = self.pass().await {
                counter!(m::SWEEP_ERRORS).increment(1);
                tracing::warn!(error = %e, "expiry pass failed; tried again at the next");
            }
            if !shutdown.sleep(interval).await {
                return;
            }
        }
    }
}
