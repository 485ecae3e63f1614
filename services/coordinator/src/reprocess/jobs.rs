//! The jobs this coordinator runs: [`Jobs`] (start, cancel) and each job's record in the
//! control store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use imagepipe_runtime::control::ControlStore;
use imagepipe_runtime::shutdown::Shutdown;

use super::run::{Ran, run};
use super::{JobError, JobStatus, ReprocessJob, ReprocessRequest};
use crate::engine::Engine;

/// How long `DELETE /v1/reprocess/{id}` waits for a job of this replica to stop.
const CANCEL_WAIT: Duration = Duration::from_secs(5);

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
pub(super) fn cancel_key(id: &str) -> String {
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

pub(super) async fn save(store: &dyn ControlStore, job: &ReprocessJob) -> Result<(), String> {
    let json = serde_json::to_string(job).expect("jobs serialize");
    store.put_job(&job.id, &json).await.map_err(|e| imagepipe_runtime::error_chain(&e))
}
