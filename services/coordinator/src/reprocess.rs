//! Reprocessing: `POST /v1/reprocess` runs a step and the ones after it again for every
//! finished task a filter matches, as a new generation of each ([`Input::Reprocess`]).
//!
//! A [`ReprocessJob`] runs in the background of the coordinator that accepted it: it pages
//! through the tasks, skips what the filter rejects, and reprocesses the rest without passing
//! the in-flight cap (it waits for room, so a backfill never floods the queues). Its progress
//! is kept in the control store ([`ControlStore::put_job`]), so `GET /v1/reprocess/{id}`
//! answers on every replica.
//!
//! [`Jobs`] keeps the jobs a coordinator runs, in its memory: one per selection (a request
//! identical to a running job's gets that job), at most `coordinator.max_reprocess_jobs` at
//! once. `DELETE /v1/reprocess/{id}` cancels one ([`Jobs::cancel`]): at once on the replica
//! running it, else through the control store, which the job looks at between pages; it then
//! ends `cancelled`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use imagepipe_contracts::{Labels, Priority, Step};
use imagepipe_runtime::control::ControlStore;
use imagepipe_runtime::shutdown::Shutdown;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
/// How long `DELETE /v1/reprocess/{id}` waits for a job of this replica to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

/// The first step to run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum From {
    /// Metadata, then analysis (after a thumbnail or preview change).
    Metadata,
    /// Analysis only (after a model change).
    Analyze,
}

impl From {
    /// The step.
    pub fn step(self) -> Step {
        match self {
            From::Metadata => Step::Metadata,
            From::Analyze => Step::Analyze,
        }
    }
}

/// Which of the filtered tasks are reprocessed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Select {
    /// Those without the step's output: failed or cancelled at or before it, or, for metadata,
    /// without the preview derivative the AI step reads.
    #[default]
    Missing,
    /// Every one.
    All,
}

/// A state a finished task is in: what a reprocessing filter may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishedState {
    /// Every step succeeded.
    Completed,
    /// A step failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl FinishedState {
    /// The task state.
    pub fn state(self) -> TaskState {
        match self {
            FinishedState::Completed => TaskState::Completed,
            FinishedState::Failed => TaskState::Failed,
            FinishedState::Cancelled => TaskState::Cancelled,
        }
    }
}

/// Which tasks a reprocessing considers (every condition must hold). Only finished tasks
/// (completed, failed, cancelled) are ever reprocessed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Filter {
    /// Only tasks in this state (`completed`, `failed` or `cancelled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<FinishedState>,
    /// Only tasks carrying every one of these labels.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// Only tasks created after this time, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<u64>,
    /// `not-current`: only tasks analysed by another model than the one of the most recent
    /// analysis; any other value: only tasks analysed by another model than this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Body of `POST /v1/reprocess`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReprocessRequest {
    /// The first step to run again.
    pub from: From,
    /// `missing` (default) or `all`.
    #[serde(default)]
    pub select: Select,
    /// Which tasks to consider.
    #[serde(default)]
    pub filter: Filter,
    /// The lanes the new generations run in (default `low`, behind new work).
    #[serde(default = "low")]
    pub priority: Priority,
}

fn low() -> Priority {
    Priority::Low
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// Still going through the tasks.
    Running,
    /// Every task was looked at.
    Done,
    /// It stopped early (the store failed, or its coordinator stopped); `error` says why.
    Failed,
    /// `DELETE /v1/reprocess/{id}` stopped it; the tasks it reprocessed so far go on.
    Cancelled,
}

/// A reprocessing run and its progress (`GET /v1/reprocess/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReprocessJob {
    /// The job id (`rp_` and 32 hex digits).
    pub id: String,
    /// What was asked.
    pub request: ReprocessRequest,
    /// Where it is.
    pub status: JobStatus,
    /// Tasks looked at.
    pub scanned: u64,
    /// Tasks the filter and `select` matched.
    pub matched: u64,
    /// Tasks reprocessed (a new generation dispatched).
    pub queued: u64,
    /// Matched tasks that could not be reprocessed (changed meanwhile, no downloaded image).
    pub skipped: u64,
    /// When it started, Unix ms.
    pub started_at: u64,
    /// When it ended, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl ReprocessRequest {
    /// Whether `task` is to be reprocessed; `current_model` is the model `not-current` means.
    fn matches(&self, task: &Task, current_model: Option<&str>) -> bool {
        let f = &self.filter;
        if !task.state.is_terminal()
            || f.state.is_some_and(|s| s.state() != task.state)
            || f.created_after.is_some_and(|after| task.created_at <= after)
            || !f.labels.iter().all(|(k, v)| task.labels.get(k) == Some(v))
        {
            return false;
        }
        if let Some(model) = &f.model {
            let wanted = if model == "not-current" { current_model } else { Some(model.as_str()) };
            let analysed_by = task.outputs.analysis.as_ref().map(|a| a.model.as_str());
            if wanted.is_none() || analysed_by == wanted {
                return false;
            }
        }
        let from = self.from.step();
        match self.select {
            Select::All => true,
            Select::Missing => match from {
                Step::Metadata => task.outputs.metadata.as_ref().is_none_or(|m| m.preview_key.is_none()),
                _ => task.outputs.analysis.is_none(),
            },
        }
    }
}

/// Why a job was not started or cancelled.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// As many jobs as `coordinator.max_reprocess_jobs` run already.
    #[error(
        "{max} reprocessing jobs run already (coordinator.max_reprocess_jobs): wait for one to end or cancel one (DELETE /v1/reprocess/{{id}})"
    )]
    TooMany {
        /// The cap.
        max: usize,
    },
    /// No job has this id (or its record is no longer kept).
    #[error("no reprocessing job {0} (records are kept for 7 days)")]
    Unknown(String),
    /// The job is not running.
    #[error("reprocessing job {id} is {status:?} already: only a running job is cancelled")]
    NotRunning {
        /// The job.
        id: String,
        /// How it ended.
        status: JobStatus,
    },
    /// The control store failed.
    #[error("control store: {0}")]
    Store(String),
}

/// A job running in this process.
struct Running {
    /// Its [`selection`].
    selection: String,
    /// Its first record, for an answer while the saved one cannot be read.
    job: ReprocessJob,
    /// Triggered to stop it.
    stop: Shutdown,
    /// Triggered once its last record is saved.
    ended: Shutdown,
}

/// The reprocessing jobs this coordinator runs (kept in its memory only); cheap to clone.
#[derive(Clone)]
pub struct Jobs {
    running: Arc<Mutex<HashMap<String, Running>>>,
    max: usize,
}

/// The key identical requests share: the request normalised (its labels sorted, its defaults
/// filled in) as JSON.
fn selection(request: &ReprocessRequest) -> String {
    serde_json::to_string(request).expect("requests serialize")
}

/// Where a job's cancellation is asked in the control store (never a task id: those have no
/// `:`).
fn cancel_key(id: &str) -> String {
    format!("reprocess:{id}")
}

impl Jobs {
    /// No job running; at most `max` at once (`coordinator.max_reprocess_jobs`).
    pub fn new(max: usize) -> Self {
        Self { running: Arc::default(), max: max.max(1) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many jobs run in this process now.
    pub fn running(&self) -> usize {
        self.lock().len()
    }

    /// Registers `job` of selection `key` as running, unless a job of that selection runs
    /// (then its first record) or the cap is reached.
    fn reserve(
        &self,
        key: String,
        job: &ReprocessJob,
        stop: &Shutdown,
        ended: &Shutdown,
    ) -> Result<Option<ReprocessJob>, JobError> {
        let mut running = self.lock();
        if let Some(existing) = running.values().find(|r| r.selection == key) {
            return Ok(Some(existing.job.clone()));
        }
        if running.len() >= self.max {
            return Err(JobError::TooMany { max: self.max });
        }
        let entry = Running { selection: key, job: job.clone(), stop: stop.clone(), ended: ended.clone() };
        running.insert(job.id.clone(), entry);
        Ok(None)
    }

    /// Starts a job for `request` in the background (its first record is saved before this
    /// returns) and says so with `true`; or, when a job of an identical request runs here, that
    /// job as it is now, and `false`.
    pub async fn start(&self, engine: Engine, request: ReprocessRequest) -> Result<(ReprocessJob, bool), JobError> {
        let key = selection(&request);
        let job = ReprocessJob {
            id: format!("rp_{}", uuid::Uuid::new_v4().simple()),
            request,
            status: JobStatus::Running,
            scanned: 0,
            matched: 0,
            queued: 0,
            skipped: 0,
            started_at: engine.clock().unix_ms(),
            finished_at: None,
            error: None,
        };
        let (stop, ended) = (Shutdown::new(), Shutdown::new());
        if let Some(first) = self.reserve(key, &job, &stop, &ended)? {
            let now = get(engine.controls().store().as_ref(), &first.id).await.map_err(JobError::Store)?;
            return Ok((now.unwrap_or(first), false));
        }
        if let Err(e) = save(engine.controls().store().as_ref(), &job).await {
            self.lock().remove(&job.id);
            return Err(JobError::Store(e));
        }
        let (jobs, running) = (self.clone(), job.clone());
        tokio::spawn(async move {
            let store = engine.controls().store().clone();
            let mut job = running;
            let outcome = run(&engine, &mut job, &stop).await;
            job.finished_at = Some(engine.clock().unix_ms());
            match outcome {
                Ok(Ran::ToTheEnd) => job.status = JobStatus::Done,
                Ok(Ran::Cancelled) => job.status = JobStatus::Cancelled,
                Err(error) => {
                    tracing::warn!(job = %job.id, %error, "reprocessing stopped");
                    job.status = JobStatus::Failed;
                    job.error = Some(error);
                }
            }
            tracing::info!(job = %job.id, status = ?job.status, matched = job.matched, queued = job.queued, skipped = job.skipped, "reprocessing ended");
            if let Err(error) = save(store.as_ref(), &job).await {
                tracing::warn!(job = %job.id, %error, "saving the end of a reprocessing");
            }
            if job.status == JobStatus::Cancelled
                && let Err(e) = store.clear_cancel(&cancel_key(&job.id)).await
            {
                tracing::debug!(job = %job.id, error = %imagepipe_runtime::error_chain(&e), "clearing a job's cancellation");
            }
            jobs.lock().remove(&job.id);
            ended.trigger();
        });
        Ok((job, true))
    }

    /// Cancels running job `id`: one of this process stops at once (this waits a few seconds
    /// for its `cancelled` record); one of another replica at its next page, through the
    /// control store. The job as it is after.
    pub async fn cancel(&self, engine: &Engine, id: &str) -> Result<ReprocessJob, JobError> {
        let store = engine.controls().store().clone();
        let here = self.lock().get(id).map(|r| (r.stop.clone(), r.ended.clone(), r.job.clone()));
        if let Some((stop, ended, first)) = here {
            stop.trigger();
            if tokio::time::timeout(CANCEL_WAIT, ended.wait()).await.is_err() {
                tracing::warn!(job = id, "a cancelled reprocessing has not stopped yet");
            }
            return Ok(get(store.as_ref(), id).await.map_err(JobError::Store)?.unwrap_or(first));
        }
        let job =
            get(store.as_ref(), id).await.map_err(JobError::Store)?.ok_or_else(|| JobError::Unknown(id.to_owned()))?;
        if job.status != JobStatus::Running {
            return Err(JobError::NotRunning { id: id.to_owned(), status: job.status });
        }
        let now = engine.clock().unix_ms();
        store
            .request_cancel(&cancel_key(id), now)
            .await
            .map_err(|e| JobError::Store(imagepipe_runtime::error_chain(&e)))?;
        Ok(job)
    }
}

/// Job `id`'s record, while kept.
pub async fn get(store: &dyn ControlStore, id: &str) -> Result<Option<ReprocessJob>, String> {
    match store.job(id).await.map_err(|e| imagepipe_runtime::error_chain(&e))? {
        Some(json) => serde_json::from_str(&json).map(Some).map_err(|e| format!("job {id} is corrupt: {e}")),
        None => Ok(None),
    }
}

async fn save(store: &dyn ControlStore, job: &ReprocessJob) -> Result<(), String> {
    let json = serde_json::to_string(job).expect("jobs serialize");
    store.put_job(&job.id, &json).await.map_err(|e| imagepipe_runtime::error_chain(&e))
}

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
enum Ran {
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

async fn run(engine: &Engine, job: &mut ReprocessJob, stop: &Shutdown) -> Result<Ran, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: serde_json::Value) -> ReprocessRequest {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn requests_default_to_missing_and_low() {
        let r = request(serde_json::json!({"from": "analyze"}));
        assert_eq!((r.select, r.priority), (Select::Missing, Priority::Low));
        assert!(serde_json::from_value::<ReprocessRequest>(serde_json::json!({"from": "download"})).is_err());
        assert!(serde_json::from_value::<ReprocessRequest>(serde_json::json!({"from": "analyze", "x": 1})).is_err());
        let running = serde_json::from_value::<ReprocessRequest>(
            serde_json::json!({"from": "analyze", "filter": {"state": "analyzing"}}),
        );
        assert!(running.is_err(), "only finished states can be named");
    }
}
