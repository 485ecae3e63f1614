//! Where tasks live: the [`TaskStore`] seam and its two backends.
//!
//! - [`redis::RedisStore`] (production, shared by coordinator replicas).
//! - [`embedded::EmbeddedStore`] (one process, file-backed with redb; `imagepipe run`).
//!
//! Every transition is one atomic write of the task (compare-and-set on its version), its
//! history entry and its outbox entries. Besides the tasks, a store keeps a *wake index*: for
//! each task that needs the coordinator's attention later (a timer, or outbox entries the fast
//! path did not relay), the time to look at it. [`TaskStore::claim_due`] hands each due entry
//! to exactly one caller for a lease; [`TaskStore::release`] re-indexes the task from its
//! stored state after the caller is done. Both stores pass the same suite (`suite`).
//!
//! Nothing grows without bound: a *finished index* (tasks that completed, failed or were
//! cancelled, by the time of their last transition) lets [`TaskStore::expire_finished`] delete
//! every record and index entry of a task once it is older than the retention, and
//! [`TaskStore::trim_dead_letters`] keeps the dead-letter archive within its limits; every
//! archived body is cut to [`DEAD_LETTER_BODY_BYTES`].
//!
//! A *blob reference index* records which tasks reference which blobs ([`blob_keys`]: the
//! uploaded source, the downloaded image, every derivative), added with each write of a task
//! and kept while the task lives (a derivative a reprocessing replaced stays referenced until
//! its task expires). Expiring a task drops its references, and a blob it was the last task to
//! reference becomes *released* ([`TaskStore::take_released_blobs`]): the blob sweeper
//! ([`crate::blob_sweep`]) deletes it, and any other blob [`TaskStore::referenced_blobs`] says
//! no task references, once it is older than `blob.orphan_grace`.
//!
//! *Shards* (docs/design.md, "Shards, leases and routing"): every task belongs to the shard
//! [`imagepipe_contracts::shard::shard_of`] gives its id under the store's shard count (each
//! backend's `with_shards`, pinned with [`TaskStore::pin_shards`]). A replica works the shards
//! it holds a *lease* on ([`TaskStore::acquire_shards`]); each lease carries a *fencing token*
//! that grows each time the shard changes hands, and a write that carries a [`Decision::fence`]
//! is made only while that token is the shard's current lease, checked atomically with the
//! write, so a replica that lost a shard writes nothing to it. The wake and queued indexes are
//! kept per shard too ([`TaskStore::claim_due_in`], [`TaskStore::queued_in`]); replicas announce
//! themselves ([`TaskStore::heartbeat`]) and handovers are logged
//! ([`TaskStore::record_handovers`]).
//!
//! Here: the [`TaskStore`] trait and the helpers both backends share; the values it takes and
//! returns are in `types`, listing (query, page, cursors, filters) in `listing`.

pub mod embedded;
mod listing;
pub mod redis;
mod shards;
#[cfg(test)]
pub(crate) mod suite;
mod types;

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;

pub use listing::{LABEL_SCAN_LIMIT, LabelFilter, ListOrder, ListQuery, TaskPage};
pub(crate) use listing::{Listing, make_cursor, parse_cursor};
pub use shards::{HANDOVERS_KEPT, Handover, Lease, Replica};
pub use types::{
    Applied, BODY_CUT_HEADER, Created, DEAD_LETTER_BODY_BYTES, DeadLetter, DeadLetterPage, Settled, StoreError,
};

use crate::machine::Decision;
use crate::task::{HistoryEntry, OutboxEntry, Task, TaskState};
use imagepipe_contracts::ImageSource;

/// The coordinator's state store.
#[async_trait]
pub trait TaskStore: Send + Sync + 'static {
    /// Writes a new task (`decision` from [`crate::machine::create`]) unless its id, or its
    /// idempotency key, is taken; then returns the task that has it. With a fence
    /// ([`Decision::fence`]) that is not the shard's current lease, writes nothing and fails
    /// with [`StoreError::Fenced`].
    async fn create(&self, decision: &Decision) -> Result<Created, StoreError>;

    /// Writes `decision` if the stored task is still at version `decision.task.version - 1`,
    /// and then settles its index entries ([`settle`](Self::settle)).
    async fn apply(&self, decision: &Decision) -> Result<Applied, StoreError> {
        let applied = self.apply_many(std::slice::from_ref(decision)).await?;
        let applied = applied.into_iter().next().unwrap_or(Applied::Conflict);
        if applied == Applied::Yes {
            let task = &decision.task;
            self.settle(&[Settled { task: &task.id, relayed: &[], state: Some(task.state) }]).await?;
        }
        Ok(applied)
    }

    /// Writes each of `decisions` (of distinct tasks) whose task is still at version
    /// `task.version - 1`, an absent task counting as version 0 (so a decision of
    /// [`crate::machine::create`] without an idempotency key creates its task): each one a
    /// compare-and-set of its own, all of them in one round trip (Redis) or one write
    /// transaction (embedded: one commit for the batch). One [`Applied`] per decision, in order.
    ///
    /// A decision with a fence ([`Decision::fence`]) is written only while the lease on its
    /// task's shard has the fence's token and runs past the fence's `now`, checked atomically
    /// with the write; otherwise nothing of it is written and it is [`Applied::Fenced`]. Without
    /// a fence, only the version is compared.
    ///
    /// A written task may stay listed under the state it left (readers skip such entries) and
    /// counted in flight until [`settle`](Self::settle) names its new state; the caller settles
    /// after relaying the outbox, in the same round trip as the outbox removal.
    async fn apply_many(&self, decisions: &[Decision]) -> Result<Vec<Applied>, StoreError>;

    /// After a batch was relayed, in one round trip (one write transaction): removes each
    /// task's relayed outbox entries and, where its new `state` is given, the index entries of
    /// the states it has left for good.
    async fn settle(&self, settled: &[Settled<'_>]) -> Result<(), StoreError>;

    /// The task `id`.
    async fn get(&self, id: &str) -> Result<Option<Task>, StoreError> {
        Ok(self.get_many(&[id]).await?.pop().flatten())
    }

    /// The tasks `ids`, in order (`None` where there is none), in one round trip.
    async fn get_many(&self, ids: &[&str]) -> Result<Vec<Option<Task>>, StoreError>;

    /// The id of the task created with idempotency key `key`.
    async fn find_by_idempotency_key(&self, key: &str) -> Result<Option<String>, StoreError>;

    /// Every transition of task `id`, oldest first.
    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>, StoreError>;

    /// A page of tasks, as [`ListQuery`] says: its order, filters and scan bound.
    async fn list(&self, query: &ListQuery) -> Result<TaskPage, StoreError>;

    /// How many tasks are started and unfinished (downloading, extracting or analyzing).
    async fn count_in_flight(&self) -> Result<u64, StoreError>;

    /// How many tasks are queued, at most: an entry may outlive its task's start until the
    /// start is settled.
    async fn count_queued(&self) -> Result<u64, StoreError>;

    /// The outbox entries of task `id` not yet relayed, in order.
    async fn outbox(&self, id: &str) -> Result<Vec<OutboxEntry>, StoreError>;

    /// Removes relayed outbox entries of task `id`.
    async fn remove_outbox(&self, id: &str, entry_ids: &[String]) -> Result<(), StoreError> {
        self.settle(&[Settled { task: id, relayed: entry_ids, state: None }]).await
    }

    /// Up to `max` tasks whose wake time is at or before `now`, each leased to this caller
    /// until `now + lease`; a lease that runs out makes the task due again.
    async fn claim_due(&self, now: u64, lease: Duration, max: usize) -> Result<Vec<String>, StoreError>;

    /// Ends the lease on task `id` and re-indexes it from what is stored: its timer, and
    /// `now + relay_grace` while it has outbox entries.
    async fn release(&self, id: &str, now: u64) -> Result<(), StoreError>;

    /// Deletes up to `max` tasks that finished (completed, failed or cancelled) with a last
    /// transition at or before `before` (Unix ms): the record, history, outbox, idempotency
    /// key (while it names the task) and every index entry. Returns how many were deleted;
    /// repeatable, and safe to run on several replicas at once.
    async fn expire_finished(&self, before: u64, max: usize) -> Result<usize, StoreError>;

    /// Archives a dead letter, its body cut as [`DeadLetter::capped`] says.
    async fn put_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError>;

    /// Deletes archived dead letters dead-lettered at or before `before` (Unix ms), then the
    /// oldest beyond `max_entries`; at most `max` per call. Returns how many were deleted.
    async fn trim_dead_letters(&self, before: u64, max_entries: u64, max: usize) -> Result<usize, StoreError>;

    /// A page of archived dead letters, oldest first.
    async fn dead_letters(&self, limit: usize, cursor: Option<&str>) -> Result<DeadLetterPage, StoreError>;

    /// One archived dead letter.
    async fn dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, StoreError>;

    /// Removes an archived dead letter; whether it was there.
    async fn remove_dead_letter(&self, id: &str) -> Result<bool, StoreError>;

    /// How many dead letters the archive holds (the DLQ size gauge).
    async fn count_dead_letters(&self) -> Result<u64, StoreError>;

    /// Whether a stored task references each of `keys` (blob keys, `sha256:<hex>`), in order:
    /// one written with it among its [`blob_keys`] and not expired since.
    async fn referenced_blobs(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError>;

    /// Takes up to `max` blob keys that the expiry of their last referencing task released
    /// (each key is handed out once; one taken and not deleted is found again by the blob
    /// sweeper's listing).
    async fn take_released_blobs(&self, max: usize) -> Result<Vec<String>, StoreError>;

    // --- Shards (docs/design.md, "Shards, leases and routing") ---

    /// Records `shards` as the store's shard count the first time; afterwards refuses any
    /// other count with [`StoreError::ShardsChanged`]. A coordinator pins its configured count
    /// (the one its store was opened with) before it works.
    async fn pin_shards(&self, shards: u16) -> Result<(), StoreError>;

    /// Announces `replica` (or renews its announcement) until `replica.heartbeat_at + ttl`
    /// (its id must not be empty: [`StoreError::EmptyReplicaId`]).
    async fn heartbeat(&self, replica: &Replica, ttl: std::time::Duration) -> Result<(), StoreError>;

    /// The replicas whose announcement runs past `now`, by id (the others are forgotten).
    async fn replicas(&self, now: u64) -> Result<Vec<Replica>, StoreError>;

    /// Withdraws replica `id`'s announcement (it stops).
    async fn leave(&self, id: &str) -> Result<(), StoreError>;

    /// For each of `shards`, in one round trip: takes its lease for `owner` until `now + ttl`
    /// when it is free, released or run out (the token goes up by one), or renews it when
    /// `owner` holds it (the token stays). `None` where another replica holds it. Each shard's
    /// step is atomic, so of owners racing for a free shard exactly one gets it; a token never
    /// goes down, across releases too. `owner` must not be empty
    /// ([`StoreError::EmptyReplicaId`]).
    async fn acquire_shards(
        &self,
        owner: &str,
        shards: &[u16],
        now: u64,
        ttl: std::time::Duration,
    ) -> Result<Vec<Option<Lease>>, StoreError>;

    /// Releases each of `leases` that is still `owner`'s with the same token (it becomes free
    /// at once; its token stays, so the next owner's is higher).
    async fn release_shards(&self, owner: &str, leases: &[Lease]) -> Result<(), StoreError>;

    /// Every shard's lease record, by shard (shards never leased are absent).
    async fn leases(&self) -> Result<Vec<Lease>, StoreError>;

    /// Appends `handovers` to the handover log, which keeps the newest [`HANDOVERS_KEPT`].
    async fn record_handovers(&self, handovers: &[Handover]) -> Result<(), StoreError>;

    /// The newest `limit` handovers, newest first.
    async fn handovers(&self, limit: usize) -> Result<Vec<Handover>, StoreError>;

    /// Like [`claim_due`](Self::claim_due), but only tasks of `shards` (shards as the store's
    /// shard count, set when it is opened, places tasks; shards beyond it are ignored). The
    /// claims of this and of [`claim_due`](Self::claim_due) are disjoint.
    async fn claim_due_in(
        &self,
        shards: &[u16],
        now: u64,
        lease: std::time::Duration,
        max: usize,
    ) -> Result<Vec<String>, StoreError>;

    /// Queued tasks of `shards` in start order, high priority first, then oldest first (the
    /// order [`list`](Self::list) gives queued tasks): the first `room` whatever their priority,
    /// and after them only high-priority ones, `max` in all (a start pass under the in-flight
    /// cap, past which only high tasks start).
    async fn queued_in(&self, shards: &[u16], room: usize, max: usize) -> Result<Vec<Task>, StoreError>;
}

/// The blobs `task` references: its uploaded source, its downloaded image, and every derivative
/// its metadata output names (thumbnails, the preview).
pub fn blob_keys(task: &Task) -> BTreeSet<&str> {
    let mut keys = BTreeSet::new();
    if let ImageSource::Blob(key) = &task.source {
        keys.insert(key.as_str());
    }
    if let Some(download) = &task.outputs.download {
        keys.insert(download.blob_key.as_str());
    }
    if let Some(metadata) = &task.outputs.metadata {
        keys.insert(metadata.thumbnail_key.as_str());
        keys.extend(metadata.thumbnails.iter().map(|t| t.key.as_str()));
        keys.extend(metadata.preview_key.as_deref());
    }
    keys
}

/// When a task needs attention after a write: its timer, or `now + relay_grace` when it has
/// outbox entries the fast path may fail to relay.
pub fn wake_at(task: &Task, has_outbox: bool, now: u64, relay_grace: Duration) -> Option<u64> {
    let relay = has_outbox.then(|| now.saturating_add(u64::try_from(relay_grace.as_millis()).unwrap_or(u64::MAX)));
    match (task.timer.map(|t| t.due_at), relay) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The position of a state in the pipeline, terminal states last. Index entries of lower ranks
/// are pruned after a transition. The moves back (a resumed pause, a reprocessed task) leave
/// their old state's entry behind: harmless, as listings check each task's actual state, and
/// gone when the task expires.
pub(crate) fn rank(state: TaskState) -> u8 {
    match state {
        TaskState::Queued => 0,
        TaskState::Downloading => 1,
        TaskState::ExtractingMetadata => 2,
        TaskState::Analyzing => 3,
        // Stages of users' own mostly follow the built-in ones; one placed before `analyze`
        // leaves its entry behind until the task finishes.
        TaskState::Processing => 4,
        TaskState::Paused => 5,
        TaskState::Completed | TaskState::Failed | TaskState::Cancelled => 6,
    }
}

pub(crate) fn corrupt(what: &'static str, id: &str, err: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt { what, id: id.to_owned(), message: err.to_string() }
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    id: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(what, id, e))
}

pub(crate) fn encode<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("store records serialize infallibly")
}
