//! Blobs do not outlive their tasks: the [`BlobSweeper`] deletes a blob once no task
//! references it ([`TaskStore::referenced_blobs`]) and it was last written more than
//! `blob.orphan_grace` ago.
//!
//! Two sources feed it, each pass bounded:
//!
//! - the blobs whose last referencing task expired ([`TaskStore::take_released_blobs`]), so a
//!   task's image and derivatives go with it (the retention of a task's blobs is the task's);
//! - a walk through the blob store's listing, one page per pass, resumed where the last pass
//!   stopped and started over at the end: uploads never submitted, and images or derivatives a
//!   worker stored for an attempt whose result no task recorded.
//!
//! The grace keeps what is on its way to a task: an upload until its submit, a worker's output
//! until its result is applied. Blobs are content-addressed, so a blob is deleted only when no
//! task at all references it, and an upload of bytes already stored renews the blob's time.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use imagepipe_blob::{BlobError, BlobKey, BlobStore};
use imagepipe_runtime::clock::{Clock, millis};
use imagepipe_runtime::shutdown::Shutdown;
use metrics::counter;

use crate::metrics as m;
use crate::store::{StoreError, TaskStore};

/// Most released blobs a pass looks at.
pub const RELEASED_PER_PASS: usize = 1_000;
/// Most blobs of the listing a pass looks at.
pub const LISTED_PER_PASS: usize = 1_000;

/// A pass that stopped; the next one tries again.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The task store failed.
    #[error("reading blob references")]
    Store(#[from] StoreError),
    /// The blob store failed.
    #[error("blob store")]
    Blob(#[from] BlobError),
}

/// What one [`BlobSweeper::pass`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Blobs whose last task expired.
    pub released: usize,
    /// Blobs the listing found unreferenced.
    pub orphans: usize,
}

/// Deletes the blobs no task references past the grace; cheap to clone (clones share the
/// listing's position). Several replicas may run one each.
#[derive(Clone)]
pub struct BlobSweeper {
    store: Arc<dyn TaskStore>,
    blobs: Arc<dyn BlobStore>,
    clock: Arc<dyn Clock>,
    grace: Duration,
    after: Arc<Mutex<Option<BlobKey>>>,
}

impl BlobSweeper {
    /// A sweeper of `blobs` by the references `store` keeps, telling time by `clock`, keeping
    /// unreferenced blobs `grace` after they were last written (`blob.orphan_grace`).
    pub fn new(store: Arc<dyn TaskStore>, blobs: Arc<dyn BlobStore>, clock: Arc<dyn Clock>, grace: Duration) -> Self {
        Self { store, blobs, clock, grace, after: Arc::new(Mutex::new(None)) }
    }

    /// One bounded pass: up to [`RELEASED_PER_PASS`] released blobs, then [`LISTED_PER_PASS`]
    /// blobs of the listing from where the last pass stopped.
    pub async fn pass(&self) -> Result<Swept, SweepError> {
        let released = self.store.take_released_blobs(RELEASED_PER_PASS).await?;
        let mut candidates = Vec::with_capacity(released.len());
        for key in released {
            // A key the store released is one a task recorded: a malformed one names no blob.
            let Ok(key) = key.parse::<BlobKey>() else { continue };
            if let Some(modified) = self.blobs.modified(&key).await? {
                candidates.push((key, modified));
            }
        }
        let released = self.delete_unreferenced(candidates, "released").await?;

        let after = self.after.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let page = self.blobs.list(after.as_ref(), LISTED_PER_PASS).await?;
        let next = (page.len() == LISTED_PER_PASS).then(|| page.last().map(|b| b.key.clone())).flatten();
        let listed = page.into_iter().map(|b| (b.key, b.modified)).collect();
        let orphans = self.delete_unreferenced(listed, "orphan").await?;
        *self.after.lock().unwrap_or_else(PoisonError::into_inner) = next;

        let swept = Swept { released, orphans };
        if swept != Swept::default() {
            tracing::info!(released, orphans, "unreferenced blobs deleted");
        }
        Ok(swept)
    }

    /// Deletes those of `blobs` (key, last written) written before the grace and referenced by
    /// no task; how many.
    async fn delete_unreferenced(
        &self,
        blobs: Vec<(BlobKey, SystemTime)>,
        reason: &'static str,
    ) -> Result<usize, SweepError> {
        let cutoff = self.clock.unix_ms().saturating_sub(millis(self.grace));
        let old: Vec<BlobKey> =
            blobs.into_iter().filter(|(_, modified)| unix_ms(*modified) <= cutoff).map(|(k, _)| k).collect();
        if old.is_empty() {
            return Ok(0);
        }
        let keys: Vec<&str> = old.iter().map(BlobKey::as_str).collect();
        let referenced = self.store.referenced_blobs(&keys).await?;
        let mut deleted = 0;
        for (key, referenced) in old.iter().zip(referenced) {
            if !referenced {
                self.blobs.delete(key).await?;
                counter!(m::BLOBS_DELETED, "reason" => reason).increment(1);
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Runs a [`pass`](Self::pass) every `interval` until `shutdown`.
    pub async fn run(&self, interval: Duration, shutdown: Shutdown) {
        loop {
            if let Err(e) = self.pass().await {
                counter!(m::SWEEP_ERRORS).increment(1);
                tracing::warn!(error = %imagepipe_runtime::error_chain(&e), "blob sweep failed; tried again at the next");
            }
            if !shutdown.sleep(interval).await {
                return;
            }
        }
    }
}

/// `time` in Unix ms (0 before 1970).
fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(SystemTime::UNIX_EPOCH).map_or(0, millis)
}
