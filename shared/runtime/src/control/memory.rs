//! [`MemoryControl`]: the control state in process memory, its queue settings kept in a file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;

use super::{
    BEAT_TTL, Beat, CANCEL_TTL, ControlError, ControlState, ControlStore, JOB_TTL, QueueActivity, QueueControl,
    RATE_BUCKET_MS, RATE_WINDOW, rate_from_buckets,
};
use crate::clock::millis;

/// Name of the file under `store.path` that keeps the queue settings.
pub const CONTROL_FILE: &str = "control.json";

#[derive(Default)]
struct Inner {
    state: ControlState,
    beats: HashMap<String, BTreeMap<String, Beat>>,
    /// By queue: (bucket, count), oldest first.
    rates: HashMap<String, Vec<(u64, u64)>>,
    /// Task id → when its cancellation was asked.
    cancels: HashMap<String, u64>,
    /// Job id → (last update, record).
    jobs: HashMap<String, (std::time::Instant, String)>,
}

/// The control state of one process (see the module docs); with a file, the queue settings
/// are written to it on every change and read back at start.
pub struct MemoryControl {
    inner: Mutex<Inner>,
    file: Option<PathBuf>,
}

impl MemoryControl {
    /// A control state that lives and dies with this value.
    pub fn ephemeral() -> Self {
        Self { inner: Mutex::new(Inner::default()), file: None }
    }

    /// The control state kept in `file` (read now when it exists).
    pub fn in_file(file: PathBuf) -> Result<Self, ControlError> {
        let io = |source| ControlError::Io { path: file.display().to_string(), source };
        let state = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| ControlError::Corrupt { what: file.display().to_string(), message: e.to_string() })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ControlState::default(),
            Err(e) => return Err(io(e)),
        };
        Ok(Self { inner: Mutex::new(Inner { state, ..Inner::default() }), file: Some(file) })
    }

    /// The one control state of directory `dir` in this process ([`CONTROL_FILE`] in it), so
    /// that every service `imagepipe run` starts shares it.
    pub fn for_dir(dir: &Path) -> Result<Arc<dyn ControlStore>, ControlError> {
        static BY_DIR: OnceLock<Mutex<HashMap<PathBuf, Arc<MemoryControl>>>> = OnceLock::new();
        let mut by_dir = BY_DIR.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if let Some(existing) = by_dir.get(&key) {
            return Ok(existing.clone());
        }
        std::fs::create_dir_all(dir).map_err(|source| ControlError::Io { path: dir.display().to_string(), source })?;
        let control = Arc::new(Self::in_file(dir.join(CONTROL_FILE))?);
        by_dir.insert(key, control.clone());
        Ok(control)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the queue settings to the file, atomically (a temporary file renamed over it).
    fn persist(&self, state: &ControlState) -> Result<(), ControlError> {
        let Some(file) = &self.file else { return Ok(()) };
        let io = |source| ControlError::Io { path: file.display().to_string(), source };
        let tmp = file.with_extension("json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(state).expect("control state serializes")).map_err(io)?;
        std::fs::rename(&tmp, file).map_err(io)
    }

    fn update(
        &self,
        queue: &str,
        now: u64,
        change: impl FnOnce(&mut QueueControl) -> bool,
    ) -> Result<bool, ControlError> {
        let mut inner = self.lock();
        let mut state = inner.state.clone();
        let entry = state.queues.entry(queue.to_owned()).or_default();
        if !change(entry) {
            return Ok(false);
        }
        entry.updated_at = now;
        self.persist(&state)?;
        inner.state = state;
        Ok(true)
    }
}

#[async_trait]
impl ControlStore for MemoryControl {
    async fn state(&self) -> Result<ControlState, ControlError> {
        Ok(self.lock().state.clone())
    }

    async fn set_paused(&self, queue: &str, paused: bool, now: u64) -> Result<bool, ControlError> {
        self.update(queue, now, |q| {
            let changed = std::mem::replace(&mut q.paused, paused) != paused;
            if changed && !paused {
                q.resumed_at = now;
            }
            changed
        })
    }

    async fn set_concurrency(&self, queue: &str, per_replica: Option<u32>, now: u64) -> Result<(), ControlError> {
        self.update(queue, now, |q| {
            q.per_replica = per_replica;
            true
        })
        .map(drop)
    }

    async fn beat(&self, queue: &str, replica: &str, beat: Beat) -> Result<(), ControlError> {
        let mut inner = self.lock();
        let beats = inner.beats.entry(queue.to_owned()).or_default();
        beats.insert(replica.to_owned(), beat);
        let stale = beat.at.saturating_sub(millis(BEAT_TTL) * 12);
        beats.retain(|_, b| b.at >= stale);
        if beat.taken > 0 {
            let bucket = beat.at / RATE_BUCKET_MS;
            let rates = inner.rates.entry(queue.to_owned()).or_default();
            match rates.last_mut() {
                Some((b, n)) if *b == bucket => *n += beat.taken,
                _ => rates.push((bucket, beat.taken)),
            }
            let keep = bucket.saturating_sub(millis(RATE_WINDOW) / RATE_BUCKET_MS + 1);
            rates.retain(|(b, _)| *b >= keep);
        }
        Ok(())
    }

    async fn activity(&self, queue: &str, now: u64) -> Result<QueueActivity, ControlError> {
        let inner = self.lock();
        let mut activity = QueueActivity::default();
        let alive = now.saturating_sub(millis(BEAT_TTL));
        for beat in inner.beats.get(queue).into_iter().flat_map(|b| b.values()).filter(|b| b.at >= alive) {
            activity.count(beat);
        }
        activity.rate_per_sec = rate_from_buckets(inner.rates.get(queue).map_or(&[][..], Vec::as_slice), now);
        Ok(activity)
    }

    async fn request_cancel(&self, task_id: &str, now: u64) -> Result<(), ControlError> {
        let mut inner = self.lock();
        let expired = now.saturating_sub(millis(CANCEL_TTL));
        inner.cancels.retain(|_, at| *at >= expired);
        inner.cancels.insert(task_id.to_owned(), now);
        Ok(())
    }

    async fn cancelled(&self, task_ids: &[String], now: u64) -> Result<Vec<bool>, ControlError> {
        let inner = self.lock();
        let expired = now.saturating_sub(millis(CANCEL_TTL));
        Ok(task_ids.iter().map(|id| inner.cancels.get(id).is_some_and(|at| *at >= expired)).collect())
    }

    async fn clear_cancel(&self, task_id: &str) -> Result<(), ControlError> {
        self.lock().cancels.remove(task_id);
        Ok(())
    }

    async fn put_job(&self, id: &str, record: &str) -> Result<(), ControlError> {
        let mut inner = self.lock();
        inner.jobs.retain(|_, (at, _)| at.elapsed() < JOB_TTL);
        inner.jobs.insert(id.to_owned(), (std::time::Instant::now(), record.to_owned()));
        Ok(())
    }

    async fn job(&self, id: &str) -> Result<Option<String>, ControlError> {
        Ok(self.lock().jobs.get(id).filter(|(at, _)| at.elapsed() < JOB_TTL).map(|(_, record)| record.clone()))
    }
}
