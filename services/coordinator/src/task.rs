//! The task record the coordinator owns, and what a transition writes next to it.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use imagepipe_contracts::step::{AnalysisOutput, DownloadOutput, MetadataOutput};
use imagepipe_contracts::{ImageSource, Labels, Priority, Step, StepError, TraceId};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a task is in the pipeline (docs/design.md, "Task state machine").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Accepted, waiting for room under the in-flight cap.
    Queued,
    /// The download step runs (or waits to be retried).
    Downloading,
    /// The metadata step runs (or waits to be retried).
    ExtractingMetadata,
    /// The analyze step runs (or waits to be retried).
    Analyzing,
    /// A stage of users' own runs (or waits to be retried); [`Task::stage`] names it.
    Processing,
    /// Every step succeeded.
    Completed,
    /// A step failed for good.
    Failed,
    /// Cancelled through the API.
    Cancelled,
    /// Stopped at a step boundary through the API; resumed into the step it stopped before.
    Paused,
}

impl TaskState {
    /// Every state, in pipeline order.
    pub const ALL: [TaskState; 9] = [
        Self::Queued,
        Self::Downloading,
        Self::ExtractingMetadata,
        Self::Analyzing,
        Self::Processing,
        Self::Paused,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The states of a started, unfinished task: the ones the in-flight cap counts. A paused
    /// task keeps its place: resuming it never waits for room.
    pub const IN_FLIGHT: [TaskState; 5] =
        [Self::Downloading, Self::ExtractingMetadata, Self::Analyzing, Self::Processing, Self::Paused];

    /// The wire name, e.g. `extracting_metadata`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Downloading => "downloading",
            Self::ExtractingMetadata => "extracting_metadata",
            Self::Analyzing => "analyzing",
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Paused => "paused",
        }
    }

    /// Whether nothing can change the task any more.
    pub const fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The built-in step that runs in this state ([`Task::current_step`] also knows a custom
    /// stage's).
    pub const fn step(self) -> Option<Step> {
        match self {
            Self::Downloading => Some(Step::Download),
            Self::ExtractingMetadata => Some(Step::Metadata),
            Self::Analyzing => Some(Step::Analyze),
            _ => None,
        }
    }

    /// The state in which `step` runs.
    pub const fn of_step(step: Step) -> Self {
        match step {
            Step::Download => Self::Downloading,
            Step::Metadata => Self::ExtractingMetadata,
            Step::Analyze => Self::Analyzing,
            Step::Custom(_) => Self::Processing,
        }
    }

    /// Whether a step runs (or waits for its retry) in this state.
    pub const fn is_running(self) -> bool {
        matches!(self, Self::Downloading | Self::ExtractingMetadata | Self::Analyzing | Self::Processing)
    }

    /// Whether the state machine has an edge from `self` to `to`.
    pub fn can_become(self, to: TaskState) -> bool {
        use TaskState::*;
        match (self, to) {
            (from, Failed | Cancelled) => !from.is_terminal(),
            (Paused, Paused) => false,
            (from, Paused) => !from.is_terminal(),
            (Paused, Queued) => true,
            (Paused, to) if to.is_running() => true,
            // Reprocessing runs a finished task's step again.
            (Completed | Failed | Cancelled, to) if to.is_running() => true,
            (Queued, Downloading) | (Downloading, ExtractingMetadata) | (ExtractingMetadata, Analyzing) => true,
            // Stages of users' own go anywhere after the download, in the configured order.
            (Downloading | ExtractingMetadata | Analyzing, Processing) => true,
            (Processing, ExtractingMetadata | Analyzing | Processing | Completed) => true,
            (Analyzing, Completed) => true,
            (from, to) => from == to && !from.is_terminal(),
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no task state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown task state {0:?}; expected one of queued, downloading, extracting_metadata, analyzing, processing, paused, completed, failed, cancelled"
)]
pub struct UnknownState(pub String);

impl FromStr for TaskState {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|t| t.as_str() == s).ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// What happened to one step of a task so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    /// Attempts dispatched so far.
    pub attempts: u32,
    /// The error of the last failed attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<StepError>,
    /// When the first attempt was dispatched, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// When the step succeeded, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// Times a worker deferred the current attempt (its host was busy); each re-send of the
    /// attempt gets its own message id from it.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deferrals: u32,
    /// Attempts of earlier generations (see [`Task::generation`]): attempt numbers go on
    /// across a reprocessing, so its events get new ids, and the retry budget counts from here.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt_base: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The outputs of the steps that succeeded; a stage of users' own keeps its output under its
/// name (`outputs.faces`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Outputs {
    /// Output of the download step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<DownloadOutput>,
    /// Output of the metadata step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<MetadataOutput>,
    /// Output of the analyze step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisOutput>,
    /// Outputs of the stages of users' own, by stage name.
    #[serde(flatten)]
    pub stages: BTreeMap<String, serde_json::Map<String, serde_json::Value>>,
}

impl Outputs {
    /// Every output as one JSON object, by its name in the task's outputs (`download`,
    /// `metadata`, `analysis`, and each custom stage's name): what stage conditions and
    /// inputs read.
    pub fn as_json(&self) -> serde_json::Map<String, serde_json::Value> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        }
    }
}

/// Per-step records, one per pipeline step; a stage of users' own has its record under its
/// name once it was dispatched (`steps.faces`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Steps {
    /// The download step.
    pub download: StepRecord,
    /// The metadata step.
    pub metadata: StepRecord,
    /// The analyze step.
    pub analyze: StepRecord,
    /// The stages of users' own, by name.
    #[serde(flatten)]
    pub stages: BTreeMap<String, StepRecord>,
}

/// The record of a stage not dispatched yet.
const NOT_STARTED: StepRecord =
    StepRecord { attempts: 0, last_error: None, started_at: None, finished_at: None, deferrals: 0, attempt_base: 0 };

impl Steps {
    /// The record of `step`.
    pub fn get(&self, step: Step) -> &StepRecord {
        match step {
            Step::Download => &self.download,
            Step::Metadata => &self.metadata,
            Step::Analyze => &self.analyze,
            Step::Custom(stage) => self.stages.get(stage.as_str()).unwrap_or(&NOT_STARTED),
        }
    }

    /// The record of `step`, mutable (a custom stage's is added when missing).
    pub fn get_mut(&mut self, step: Step) -> &mut StepRecord {
        match step {
            Step::Download => &mut self.download,
            Step::Metadata => &mut self.metadata,
            Step::Analyze => &mut self.analyze,
            Step::Custom(stage) => self.stages.entry(stage.as_str().to_owned()).or_default(),
        }
    }

    /// Attempts dispatched over every step: a per-task ordinal of attempts.
    pub fn total_attempts(&self) -> u32 {
        Step::ALL.iter().map(|s| self.get(*s).attempts).sum::<u32>()
            + self.stages.values().map(|r| r.attempts).sum::<u32>()
    }
}

/// What a timer does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TimerKind {
    /// The attempt's deadline: a missing result counts as a failed attempt.
    Deadline,
    /// The backoff is over: dispatch the next attempt.
    Retry,
}

/// The one timer a running task has: a deadline while an attempt runs, a retry while it
/// backs off. A fired timer applies only if it is still the task's timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timer {
    /// What it does.
    pub kind: TimerKind,
    /// The step it belongs to.
    pub step: Step,
    /// For a deadline, the attempt it guards; for a retry, the attempt it dispatches.
    pub attempt: u32,
    /// When it is due, Unix ms.
    pub due_at: u64,
}

/// The error that ended a failed task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskFailure {
    /// The step that failed.
    pub step: Step,
    /// The last attempt.
    pub attempt: u32,
    /// Why.
    pub error: StepError,
}

/// A task, as stored. `version` grows by one with every applied transition; a transition is a
/// compare-and-set on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// The task id.
    pub id: String,
    /// Number of transitions applied (1 after creation).
    pub version: u64,
    /// Where it is.
    pub state: TaskState,
    /// Where the image comes from.
    pub source: ImageSource,
    /// The submit's idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The notification target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// User labels, copied into every event.
    #[serde(default)]
    pub labels: Labels,
    /// Which lane of each queue carries the task's work.
    #[serde(default, skip_serializing_if = "Priority::is_normal")]
    pub priority: Priority,
    /// The task's trace.
    pub trace_id: TraceId,
    /// Submission time, Unix ms.
    pub created_at: u64,
    /// Time of the last transition, Unix ms.
    pub updated_at: u64,
    /// Per-step attempts and errors.
    pub steps: Steps,
    /// Outputs of the steps that succeeded.
    pub outputs: Outputs,
    /// The pending timer of a running task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer: Option<Timer>,
    /// Set when cancellation was asked while an attempt ran: the task stops at the step boundary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<PendingCancel>,
    /// Why the task failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<TaskFailure>,
    /// Set when a pause was asked while an attempt ran: the task pauses at the step boundary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_requested: Option<PendingPause>,
    /// Where a paused task goes on when resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<PausedAt>,
    /// How many times the task was reprocessed (`POST /v1/reprocess`): 0 for its first run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub generation: u32,
    /// The stage of users' own that runs while the state is `processing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Step>,
}

/// A pending pause.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingPause {
    /// Why, as given by whoever paused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was asked, Unix ms.
    pub at: u64,
}

/// Where a paused task stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PausedAt {
    /// The step to dispatch on resume; `None` when the task had not started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    /// The attempt of `step` to dispatch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: u32,
    /// Why, as given by whoever paused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Since when, Unix ms.
    pub at: u64,
}

/// A pending cancellation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingCancel {
    /// Why, as given by whoever cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it was asked, Unix ms.
    pub at: u64,
}

/// Width of one priority band of the queued index: more than any Unix-ms time of the next
/// thousand years, small enough that three bands stay exact in an `f64` (Redis scores).
const QUEUED_BAND: u64 = 1 << 46;

impl Task {
    /// Where the task sorts in its state's index: its creation time, except while queued, when
    /// higher priorities sort first (then creation time), so the start loop takes a `high`
    /// task before a backlog of `low` ones.
    pub fn index_at(&self) -> u64 {
        if self.state == TaskState::Queued {
            (self.priority.index() as u64) * QUEUED_BAND + self.created_at
        } else {
            self.created_at
        }
    }

    /// Whether a score of the queued index ([`index_at`](Self::index_at) of a queued task) is in
    /// the high band.
    pub fn queued_score_is_high(score: u64) -> bool {
        score / QUEUED_BAND == Priority::High.index() as u64
    }

    /// The step that runs now (or waits for its retry): the state's built-in step, or the
    /// custom stage while `processing`.
    pub fn current_step(&self) -> Option<Step> {
        match self.state {
            TaskState::Processing => self.stage,
            state => state.step(),
        }
    }

    /// The steps to show for this task, in pipeline order as far as it ran: the built-in
    /// ones, and each stage of users' own it dispatched, placed by when it started.
    pub fn shown_steps(&self) -> Vec<Step> {
        let mut steps: Vec<Step> = Step::ALL.to_vec();
        for (name, record) in &self.steps.stages {
            let Ok(stage) = Step::named(name) else { continue };
            let started = record.started_at.unwrap_or(u64::MAX);
            let at = steps
                .iter()
                .position(|s| self.steps.get(*s).started_at.is_none_or(|t| t > started))
                .unwrap_or(steps.len());
            steps.insert(at, stage);
        }
        steps
    }

    /// The attempt of the current step that was dispatched last (0 outside a step).
    pub fn current_attempt(&self) -> u32 {
        self.current_step().map_or(0, |s| self.steps.get(s).attempts)
    }

    /// The blob key of the downloaded image, once the download step succeeded.
    pub fn blob_key(&self) -> Option<&str> {
        self.outputs.download.as_ref().map(|d| d.blob_key.as_str())
    }
}

/// One applied transition, as kept in the task's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryEntry {
    /// The task version this transition produced.
    pub version: u64,
    /// When, Unix ms.
    pub at: u64,
    /// State before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<TaskState>,
    /// State after.
    pub to: TaskState,
    /// What happened (`created`, `started`, `step_succeeded`, `retry_scheduled`, ...).
    pub event: HistoryEvent,
    /// The step involved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<Step>,
    /// The attempt involved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Details (error, reason).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The coordinator replica that wrote it, under its lease on the task's shard (absent
    /// from writes that held no lease: creations, operator requests to a replica that does
    /// not own the shard, and stores written before shards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// The kinds of history entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HistoryEvent {
    /// The task was accepted.
    Created,
    /// The first step was dispatched.
    Started,
    /// A step succeeded and the next one was dispatched (or the task completed). Stages whose
    /// condition (`pipeline.stages[].when`) did not hold are passed over, each named with the
    /// reason in the entry's detail (`skipped faces: format png is not one of jpeg`).
    StepSucceeded,
    /// An attempt failed with a retryable error (or missed its deadline); a retry is scheduled.
    RetryScheduled,
    /// The backoff ended and the next attempt was dispatched.
    AttemptDispatched,
    /// Cancellation was asked while an attempt ran.
    CancelRequested,
    /// A pause was asked while an attempt ran.
    PauseRequested,
    /// The task stopped at a step boundary.
    Paused,
    /// The task went on after a pause (or a pending pause was withdrawn).
    Resumed,
    /// A step deadline came due while the step's queue was paused: it starts over.
    DeadlinePostponed,
    /// A finished task runs a step again, as a new generation.
    Reprocessed,
    /// A worker deferred the attempt (its host was busy); it is sent again later, uncharged.
    Deferred,
    /// The task completed.
    Completed,
    /// The task failed.
    Failed,
    /// The task was cancelled.
    Cancelled,
}

/// Where an outbox entry goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "name", rename_all = "snake_case")]
pub enum Destination {
    /// A task queue (logical name).
    Queue(String),
    /// An event topic, by event type.
    Event(String),
}

/// A message a transition must send, kept in the task's outbox until the broker confirmed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboxEntry {
    /// Unique within the task and ordered: `<version, 20 digits>-<index>`.
    pub id: String,
    /// Where it goes.
    pub destination: Destination,
    /// The bus message id (publish deduplication).
    pub message_id: String,
    /// The trace it belongs to.
    pub trace_id: TraceId,
    /// The JSON body.
    pub body: String,
}

impl OutboxEntry {
    /// The id of the `index`th entry written by the transition to `version`.
    pub fn entry_id(version: u64, index: usize) -> String {
        format!("{version:020}-{index:04}")
    }
}
