//! Timers: each sweep claims the tasks that are due (a deadline, a retry's backoff, an outbox
//! left behind), relays and fires them, and starts queued tasks; after a restart of a bus that
//! keeps nothing, running attempts are sent again.

use std::time::Duration;

use imagepipe_runtime::shutdown::Shutdown;
use metrics::counter;
use tracing::Instrument;

use super::{Engine, EngineError, Handled, task_span};
use crate::machine::Input;
use crate::metrics as m;
use crate::store::ListQuery;
use crate::task::{Task, TaskState, TimerKind};

impl Engine {
    /// Re-sends the command of every running attempt, with a fresh deadline; returns how many.
    /// For a bus that keeps nothing across a restart (the in-process bus): the commands in flight
    /// died with the process, and waiting for their old deadlines would stall the tasks.
    pub async fn redispatch_running(&self) -> Result<usize, EngineError> {
        let mut running = Vec::new();
        for state in [TaskState::Downloading, TaskState::ExtractingMetadata, TaskState::Analyzing] {
            let mut cursor = None;
            loop {
                let page = self
                    .store
                    .list(&ListQuery { state: Some(state), limit: 256, cursor, ..ListQuery::default() })
                    .await?;
                running.extend(page.tasks.into_iter().map(|task| task.id));
                match page.next_cursor {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        let mut resent = 0;
        for id in &running {
            if let Handled::Applied(_) = self.handle(id, Input::Redispatch).await? {
                resent += 1;
            }
        }
        Ok(resent)
    }

    /// One sweep: claims due tasks, relays their leftover outbox, fires their due timers,
    /// releases them; then starts queued tasks. Returns how many tasks were claimed.
    pub async fn sweep(&self) -> Result<usize, EngineError> {
        let now = self.clock.unix_ms();
        let (lease, max) = (self.config.lease, self.config.sweep_batch);
        let ids = match &self.ownership {
            Some(ownership) => {
                let owned = ownership.shards();
                if owned.is_empty() { Vec::new() } else { self.store.claim_due_in(&owned, now, lease, max).await? }
            }
            None => self.store.claim_due(now, lease, max).await?,
        };
        for id in &ids {
            if let Err(e) = self.wake(id, now).await {
                counter!(m::SWEEP_ERRORS).increment(1);
                tracing::warn!(task_id = %id, error = %e, "due task not handled; retried when its lease ends");
                continue;
            }
            if let Err(e) = self.store.release(id, self.clock.unix_ms()).await {
                counter!(m::SWEEP_ERRORS).increment(1);
                tracing::warn!(task_id = %id, error = %e, "due task not released; retried when its lease ends");
            }
        }
        self.start_queued().await?;
        Ok(ids.len())
    }

    async fn wake(&self, id: &str, now: u64) -> Result<(), EngineError> {
        let Some(task) = self.store.get(id).await? else { return Ok(()) };
        let span = task_span(&task, "wake", "due");
        self.fire(task, now).instrument(span).await
    }

    /// Relays the leftover outbox of `task` and fires its timer if it is due at `now`.
    async fn fire(&self, task: Task, now: u64) -> Result<(), EngineError> {
        let id = task.id.as_str();
        self.relay(id).await?;
        if let Some(timer) = task.timer.filter(|t| t.due_at <= now) {
            if timer.kind == TimerKind::Deadline {
                self.waits.refresh(timer.step, now).await;
            }
            match self.handle(id, Input::Timer(timer)).await {
                Ok(Handled::Applied(_)) => {
                    let kind = match timer.kind {
                        TimerKind::Deadline => "deadline",
                        TimerKind::Retry => "retry",
                    };
                    counter!(m::TIMERS_FIRED, "kind" => kind).increment(1);
                }
                Ok(Handled::Ignored(_)) | Err(EngineError::Illegal(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sweeps every `interval` until `shutdown`.
    pub async fn run_sweeper(&self, interval: Duration, shutdown: Shutdown) {
        loop {
            if let Err(e) = self.sweep().await {
                counter!(m::SWEEP_ERRORS).increment(1);
                tracing::warn!(error = %e, "sweep failed");
            }
            if !shutdown.sleep(interval).await {
                return;
            }
        }
    }
}
