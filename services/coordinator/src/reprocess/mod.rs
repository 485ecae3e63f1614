//! Reprocessing: `POST /v1/reprocess` runs a step and the ones after it again for every
//! finished task a filter matches, as a new generation of each
//! ([`Input::Reprocess`](crate::machine::Input::Reprocess)).
//!
//! A [`ReprocessJob`] runs in the background of the coordinator that accepted it: it pages
//! through the tasks, skips what the filter rejects, and reprocesses the rest without passing
//! the in-flight cap (it waits for room, so a backfill never floods the queues). Its
//! progress is kept in the control store
//! ([`ControlStore::put_job`](imagepipe_runtime::control::ControlStore::put_job)), so
//! `GET /v1/reprocess/{id}` answers on every replica.
//!
//! [`Jobs`] keeps the jobs a coordinator runs, in its memory: one per selection (a request
//! identical to a running job's gets that job), at most `coordinator.max_reprocess_jobs` at
//! once. `DELETE /v1/reprocess/{id}` cancels one ([`Jobs::cancel`]): at once on the replica
//! running it, else through the control store, which the job looks at between pages; it then
//! ends `cancelled`.
//!
//! This module holds the request and the job's record; `jobs` the running jobs and their
//! records in the control store; `run` one job's pass through the tasks.

mod jobs;
mod run;
#[cfg(test)]
mod tests;

use imagepipe_contracts::{Labels, Priority, Step};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use jobs::{Jobs, get};

use crate::task::{Task, TaskState};

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
