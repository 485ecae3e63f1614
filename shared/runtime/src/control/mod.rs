//! Operator control state every replica of every service sees: which stage queues are paused,
//! the concurrency each replica of a stage runs at, which consumers are alive and how fast
//! they go, and which running steps were cancelled.
//!
//! The coordinator's API writes it ([`ControlStore::set_paused`],
//! [`ControlStore::set_concurrency`], [`ControlStore::request_cancel`]); workers read it
//! ([`ControlStore::state`], polled by [`Control`] every `control.refresh`, and at once when
//! the coordinator pushes a `queue.paused` / `queue.resumed` event) and report on themselves
//! ([`ControlStore::beat`]). It survives restarts: Redis keys when `store.kind = redis`
//! ([`RedisControl`], in one hash slot), else one process-wide [`MemoryControl`] per
//! `store.path`, its queue settings kept in `control.json` there ([`connect`]).

mod memory;
mod redis;
mod watch;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::config::{Settings, StoreKind};

pub use memory::MemoryControl;
pub use redis::RedisControl;
pub use watch::{CancelRegistry, Control, ControlHandle, LoopStats, REFRESH, RunningStep};

/// How long a consumer's last beat counts it as alive.
pub const BEAT_TTL: Duration = Duration::from_secs(5);
/// The window of [`QueueActivity::rate_per_sec`].
pub const RATE_WINDOW: Duration = Duration::from_secs(60);
/// How long a cancellation of a running step is kept for its worker to see.
pub const CANCEL_TTL: Duration = Duration::from_secs(600);

/// The control state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Connecting to Redis failed.
    #[error("connecting to Redis for the control state")]
    Connect(#[source] ::redis::RedisError),
    /// A Redis command failed.
    #[error("Redis {op} of the control state")]
    Redis {
        /// What was being done.
        op: &'static str,
        /// What Redis said.
        #[source]
        source: ::redis::RedisError,
    },
    /// The control file could not be read or written.
    #[error("control file {path}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A stored value does not parse.
    #[error("control state {what} is corrupt: {message}")]
    Corrupt {
        /// Which value.
        what: String,
        /// Why.
        message: String,
    },
}

/// What operators set for one stage queue.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueControl {
    /// No replica takes new messages of the queue.
    #[serde(default)]
    pub paused: bool,
    /// Messages each replica handles at once, replacing `worker.concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_replica: Option<u32>,
    /// When it last changed, Unix ms.
    #[serde(default)]
    pub updated_at: u64,
    /// When it was last resumed, Unix ms (0: never paused): the tasks that waited in it get
    /// their whole step deadline from then.
    #[serde(default)]
    pub resumed_at: u64,
}

/// The control settings of every queue that has any, by queue name (`tasks.download`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlState {
    /// By queue.
    pub queues: BTreeMap<String, QueueControl>,
}

impl ControlState {
    /// The settings of `queue` (the defaults when it has none).
    pub fn queue(&self, queue: &str) -> QueueControl {
        self.queues.get(queue).cloned().unwrap_or_default()
    }

    /// Whether `queue` is paused.
    pub fn is_paused(&self, queue: &str) -> bool {
        self.queues.get(queue).is_some_and(|q| q.paused)
    }
}

/// One replica's report on the queue it consumes, sent every second or so.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Beat {
    /// When, Unix ms.
    pub at: u64,
    /// Messages it holds now.
    pub in_flight: u32,
    /// Messages it may hold at once.
    pub concurrency: u32,
    /// Messages it took since its last beat (counted into the queue's rate).
    pub taken: u64,
    /// The `updatedAt` of the pause it obeys: it has stopped taking messages of the queue (no
    /// fetch outstanding) under the queue's control as of that time; 0 while it takes messages.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub paused_at: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What the live consumers of one queue report together.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueActivity {
    /// Replicas that beat within [`BEAT_TTL`].
    pub consumers: u32,
    /// Messages they hold now.
    pub in_flight: u64,
    /// What they may hold at once, summed.
    pub concurrency: u64,
    /// Messages taken per second over the last [`RATE_WINDOW`].
    pub rate_per_sec: f64,
    /// Consumers that report having stopped taking messages because of a pause.
    pub paused: u32,
    /// The oldest pause they obey (the least [`Beat::paused_at`]; 0 when none is paused).
    pub oldest_pause: u64,
}

impl QueueActivity {
    /// Adds the report of one live consumer.
    fn count(&mut self, beat: &Beat) {
        self.consumers += 1;
        self.in_flight += u64::from(beat.in_flight);
        self.concurrency += u64::from(beat.concurrency);
        if beat.paused_at > 0 {
            self.oldest_pause = if self.paused == 0 { beat.paused_at } else { self.oldest_pause.min(beat.paused_at) };
            self.paused += 1;
        }
    }

    /// Whether `control`'s pause is in force: it is paused and every live consumer has stopped
    /// taking messages under it (or a later change of the queue's control). True with no live
    /// consumer: none takes anything.
    pub fn pause_in_force(&self, control: &QueueControl) -> bool {
        control.paused && self.paused == self.consumers && (self.paused == 0 || self.oldest_pause >= control.updated_at)
    }
}

/// Where the control state lives (see the module docs).
#[async_trait]
pub trait ControlStore: Send + Sync + 'static {
    /// Every queue's settings.
    async fn state(&self) -> Result<ControlState, ControlError>;

    /// Pauses or resumes `queue`; whether that changed anything.
    async fn set_paused(&self, queue: &str, paused: bool, now: u64) -> Result<bool, ControlError>;

    /// Sets (or, with `None`, clears) the per-replica concurrency of `queue`.
    async fn set_concurrency(&self, queue: &str, per_replica: Option<u32>, now: u64) -> Result<(), ControlError>;

    /// Records `beat` of consumer `replica` of `queue`.
    async fn beat(&self, queue: &str, replica: &str, beat: Beat) -> Result<(), ControlError>;

    /// What the live consumers of `queue` reported, as of `now`.
    async fn activity(&self, queue: &str, now: u64) -> Result<QueueActivity, ControlError>;

    /// Asks the worker running a step of `task_id` to stop it.
    async fn request_cancel(&self, task_id: &str, now: u64) -> Result<(), ControlError>;

    /// Which of `task_ids` were asked to stop (within [`CANCEL_TTL`] of `now`).
    async fn cancelled(&self, task_ids: &[String], now: u64) -> Result<Vec<bool>, ControlError>;

    /// Forgets the request to stop `task_id`'s running step (its task runs again: a new
    /// generation must not be stopped by its last one's cancellation).
    async fn clear_cancel(&self, task_id: &str) -> Result<(), ControlError>;

    /// Keeps the JSON `record` of background job `id` (a reprocessing run) for [`JOB_TTL`].
    async fn put_job(&self, id: &str, record: &str) -> Result<(), ControlError>;

    /// The record of job `id`, while kept.
    async fn job(&self, id: &str) -> Result<Option<String>, ControlError>;
}

/// How long a background job's record is kept after its last update.
pub const JOB_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The control store `settings` call for: Redis keys under `bus.prefix` when
/// `store.kind = redis`; else the process's [`MemoryControl`] of `store.path` (one per
/// directory, shared by every service of `imagepipe run`).
pub async fn connect(settings: &Settings) -> Result<std::sync::Arc<dyn ControlStore>, ControlError> {
    match settings.store.kind {
        StoreKind::Redis => {
            let connection = crate::redis_connection::RedisConnection::open(settings.store.redis.url.expose())
                .await
                .map_err(ControlError::Connect)?;
            Ok(std::sync::Arc::new(RedisControl::new(connection, &settings.bus.prefix)))
        }
        StoreKind::Embedded => Ok(MemoryControl::for_dir(&settings.store.path)?),
    }
}

/// Bucket width of the rate counters.
const RATE_BUCKET_MS: u64 = 5_000;

/// The rate over [`RATE_WINDOW`] from per-bucket counts `(bucket, count)`: the full buckets
/// of the window and the current one, over the time they cover.
fn rate_from_buckets(buckets: &[(u64, u64)], now: u64) -> f64 {
    let current = now / RATE_BUCKET_MS;
    let window = RATE_WINDOW.as_millis() as u64 / RATE_BUCKET_MS;
    let first = current.saturating_sub(window);
    let taken: u64 = buckets.iter().filter(|(b, _)| *b > first && *b <= current).map(|(_, n)| n).sum();
    let covered_ms = window.saturating_sub(1) * RATE_BUCKET_MS + (now % RATE_BUCKET_MS).max(1);
    taken as f64 * 1000.0 / covered_ms as f64
}

#[cfg(test)]
mod tests;
