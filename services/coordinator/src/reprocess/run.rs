//! One job's run: page through the tasks, reprocess those the request matches, within the
//! in-flight cap.

use std::time::Duration;

use imagepipe_runtime::shutdown::Shutdown;

use super::jobs::{cancel_key, save};
use super::{FinishedState, ReprocessJob};
use crate::engine::{Engine, EngineError, Handled};
use crate::machine::Input;
use crate::store::ListQuery;
use crate::task::{Task, TaskState};

/// Tasks read per page.
const PAGE: usize = 256;
/// How long a job waits for room under the in-flight cap before looking again.
const ROOM_WAIT: Duration = Duration::from_millis(250);
/// Progress is saved at least this often (and at the end).
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// Every task, page by page: of the filter's state, or all of them.
struct Pages<'a> {
    engine: &'a Engine,
    state: Option<TaskState>,
    cursor: Option<String>,
    done: bool,
}

impl<'a> Pages<'a> {
    fn new(engine: &'a Engine, state: Option<TaskState>) -> Self {
        Self { engine, state, cursor: None, done: false }
    }

    /// The next page; `None` after the last.
    async fn next(&mut self) -> Result<Option<Vec<Task>>, String> {
        if self.done {
            return Ok(None);
        }
        let query = ListQuery { state: self.state, limit: PAGE, cursor: self.cursor.take(), ..ListQuery::default() };
        let page = self.engine.store().list(&query).await.map_err(|e| imagepipe_runtime::error_chain(&e))?;
        self.cursor = page.next_cursor;
        self.done = self.cursor.is_none();
        Ok(Some(page.tasks))
    }
}

/// How a job's run ended without an error.
pub(super) enum Ran {
    /// Every task was looked at.
    ToTheEnd,
    /// It was cancelled.
    Cancelled,
}

/// Whether job `id` was asked to stop: here (`stop`) or through the control store.
async fn cancelled(engine: &Engine, id: &str, stop: &Shutdown) -> Result<bool, String> {
    if stop.is_triggered() {
        return Ok(true);
    }
    let asked = engine
        .controls()
        .store()
        .cancelled(&[cancel_key(id)], engine.clock().unix_ms())
        .await
        .map_err(|e| imagepipe_runtime::error_chain(&e))?;
    Ok(asked.first().copied().unwrap_or(false))
}

pub(super) async fn run(engine: &Engine, job: &mut ReprocessJob, stop: &Shutdown) -> Result<Ran, String> {
    let request = job.request.clone();
    let current_model = match request.filter.model.as_deref() {
        Some("not-current") => latest_model(engine).await?,
        _ => None,
    };
    let store = engine.controls().store().clone();
    let mut saved = tokio::time::Instant::now();
    let mut pages = Pages::new(engine, request.filter.state.map(FinishedState::state));
    while let Some(tasks) = pages.next().await? {
        if cancelled(engine, &job.id, stop).await? {
            return Ok(Ran::Cancelled);
        }
        for task in tasks {
            if stop.is_triggered() {
                return Ok(Ran::Cancelled);
            }
            job.scanned += 1;
            if !request.matches(&task, current_model.as_deref()) {
                continue;
            }
            job.matched += 1;
            if !wait_for_room(engine, &job.id, stop).await? {
                return Ok(Ran::Cancelled);
            }
            // A cancellation of its last run's step must not stop the new generation's.
            store.clear_cancel(&task.id).await.map_err(|e| imagepipe_runtime::error_chain(&e))?;
            let input = Input::Reprocess { from: request.from.step(), priority: Some(request.priority) };
            match engine.handle(&task.id, input).await {
                Ok(Handled::Applied(_)) => job.queued += 1,
                Ok(Handled::Ignored(_)) => job.skipped += 1,
                Err(EngineError::Illegal(_) | EngineError::UnknownTask(_)) => job.skipped += 1,
                Err(e) => return Err(imagepipe_runtime::error_chain(&e)),
            }
        }
        if saved.elapsed() >= SAVE_EVERY {
            save(store.as_ref(), job).await?;
            saved = tokio::time::Instant::now();
        }
    }
    Ok(Ran::ToTheEnd)
}

/// The model of the most recent analysis among the completed tasks.
async fn latest_model(engine: &Engine) -> Result<Option<String>, String> {
    let mut latest: Option<(u64, String)> = None;
    let mut pages = Pages::new(engine, Some(TaskState::Completed));
    while let Some(tasks) = pages.next().await? {
        for task in tasks {
            if let (Some(analysis), Some(at)) = (&task.outputs.analysis, task.steps.analyze.finished_at)
                && latest.as_ref().is_none_or(|(t, _)| at > *t)
            {
                latest = Some((at, analysis.model.clone()));
            }
        }
    }
    Ok(latest.map(|(_, model)| model))
}

/// Waits until the in-flight cap has room (true), or job `id` is cancelled meanwhile (false).
async fn wait_for_room(engine: &Engine, id: &str, stop: &Shutdown) -> Result<bool, String> {
    loop {
        if engine.has_room().await.map_err(|e| imagepipe_runtime::error_chain(&e))? {
            return Ok(true);
        }
        if !stop.sleep(ROOM_WAIT).await || cancelled(engine, id, stop).await? {
            return Ok(false);
        }
    }
}
