//! The embedded store: one redb file, every transition one write transaction.
//!
//! For one coordinator process (`imagepipe run`): redb allows one writer at a time, and the
//! file survives restarts. The wake index has the same semantics as the Redis store's, so the
//! same suite runs against both. Finished tasks are indexed by the time of their last
//! transition (`finished`), and [`TaskStore::expire_finished`] deletes the old ones in batches,
//! each batch one write transaction. The blob reference index is two tables, `blob_refs`
//! (`<blob key>\0<task id>`) and `task_blobs` (`<task id>\0<blob key>`), and the keys its
//! expiries released wait in `released_blobs`.
//!
//! Shards: one process owns every shard of this store, so tasks are not laid out per shard.
//! The shard count ([`EmbeddedStore::with_shards`]) only says which tasks
//! [`TaskStore::claim_due_in`] and [`TaskStore::queued_in`] return; it is pinned in `meta`.
//! Leases (with their fencing tokens, checked in a transition's write transaction) and the
//! handover log are tables; replica announcements are kept in memory (`shards`).
//!
//! # Where things are
//!
//! Here the store and its [`TaskStore`] methods on tasks; `tables` the tables and their keys,
//! `write` a transition's write, `wake` the wake index, `list` the listings and counts,
//! `expiry` the expiry, `dead_letters` the dead-letter archive, `blobs` the blob reference
//! index, `shards` leases, replicas, handovers and the per-shard claims and queues, `upgrade`
//! the indexes an older store lacks, filled at open.

mod blobs;
mod dead_letters;
mod expiry;
mod list;
mod shards;
mod tables;
#[cfg(test)]
mod tests;
mod upgrade;
mod wake;
mod write;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_contracts::shard::DEFAULT_SHARDS;
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::error_chain;
use redb::{Database, Durability, ReadableDatabase, ReadableTable};

use shards::{Announcements, fence_holds};
use tables::{
    BY_CREATION, BY_STATE, CLAIMED, CLAIMED_ORDER, DEAD_LETTER_ORDER, DEAD_LETTERS, DUE, DUE_ORDER, FINISHED,
    HANDOVERS, HISTORY, IDEMPOTENCY, LEASES, META, OUTBOX, RELEASED_BLOBS, TASK_BLOBS, TASKS, key2, prefixed,
    read_task, write,
};
use upgrade::{index_blob_references, index_finished_tasks};
use write::write_transition;

use super::{
    Applied, Created, DeadLetter, DeadLetterPage, Handover, Lease, ListQuery, Replica, Settled, StoreError, TaskPage,
    TaskStore, decode,
};
use crate::machine::Decision;
use crate::task::{HistoryEntry, OutboxEntry, Task};

/// File-backed store for a single coordinator process.
#[derive(Clone)]
pub struct EmbeddedStore {
    db: EmbeddedDb,
    relay_grace: Duration,
    shards: u16,
    announcements: Arc<Mutex<Announcements>>,
}

impl EmbeddedStore {
    /// Opens (creating if new) the store in directory `dir`: its file `coordinator.redb`, with
    /// [`DEFAULT_SHARDS`] shards unless [`with_shards`](Self::with_shards) says otherwise.
    pub fn open(dir: &Path, relay_grace: Duration) -> Result<Self, StoreError> {
        let db = EmbeddedDb::open(&dir.join("coordinator.redb")).map_err(|e| err("opening", error_chain(&e)))?;
        let txn = db.database().begin_write().map_err(|e| err("opening", e))?;
        {
            for table in [TASKS, HISTORY, OUTBOX, DEAD_LETTERS] {
                txn.open_table(table).map_err(|e| err("opening", e))?;
            }
            for table in [BY_STATE, BY_CREATION, DUE_ORDER, CLAIMED_ORDER, DEAD_LETTER_ORDER, FINISHED] {
                txn.open_table(table).map_err(|e| err("opening", e))?;
            }
            for table in [TASK_BLOBS, RELEASED_BLOBS] {
                txn.open_table(table).map_err(|e| err("opening", e))?;
            }
            txn.open_table(IDEMPOTENCY).map_err(|e| err("opening", e))?;
            txn.open_table(DUE).map_err(|e| err("opening", e))?;
            txn.open_table(CLAIMED).map_err(|e| err("opening", e))?;
            txn.open_table(META).map_err(|e| err("opening", e))?;
            txn.open_table(LEASES).map_err(|e| err("opening", e))?;
            txn.open_table(HANDOVERS).map_err(|e| err("opening", e))?;
            index_finished_tasks(&txn)?;
            index_blob_references(&txn)?;
        }
        txn.commit().map_err(|e| err("opening", e))?;
        Ok(Self { db, relay_grace, shards: DEFAULT_SHARDS, announcements: Arc::default() })
    }

    /// The store with `shards` shards (at least 1): which tasks the per-shard claims and
    /// queues return ([`TaskStore::pin_shards`] records the count).
    #[must_use]
    pub fn with_shards(self, shards: u16) -> Self {
        Self { shards: shards.max(1), ..self }
    }

    /// The live replica announcements (a poisoned lock still holds whole entries).
    fn announcements(&self) -> MutexGuard<'_, Announcements> {
        self.announcements.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn run<T: Send + 'static>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&Database, Duration) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let grace = self.relay_grace;
        self.db.blocking(operation, move |db| f(db, grace)).await.map_err(|e| err(operation, error_chain(&e)))?
    }
}

fn err(operation: &'static str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Embedded { operation, message: e.to_string() }
}

#[async_trait]
impl TaskStore for EmbeddedStore {
    async fn create(&self, decision: &Decision) -> Result<Created, StoreError> {
        let decision = decision.clone();
        self.run("creating a task", move |db, grace| {
            write(db, "creating a task", |txn| {
                let task = &decision.task;
                if let Some(fence) = &decision.fence
                    && !fence_holds(txn, fence)?
                {
                    return Err(StoreError::Fenced { task: task.id.clone(), shard: fence.shard, token: fence.token });
                }
                let tasks = txn.open_table(TASKS).map_err(|e| err("creating a task", e))?;
                if let Some(existing) = read_task(&tasks, &task.id)? {
                    return Ok(Created::Existing(Box::new(existing)));
                }
                if let Some(key) = &task.idempotency_key {
                    let mut idem = txn.open_table(IDEMPOTENCY).map_err(|e| err("creating a task", e))?;
                    let owner =
                        idem.get(key.as_str()).map_err(|e| err("creating a task", e))?.map(|v| v.value().to_owned());
                    match owner {
                        Some(owner) if owner != task.id => {
                            if let Some(existing) = read_task(&tasks, &owner)? {
                                return Ok(Created::Existing(Box::new(existing)));
                            }
                        }
                        _ => {}
                    }
                    idem.insert(key.as_str(), task.id.as_str()).map_err(|e| err("creating a task", e))?;
                }
                drop(tasks);
                write_transition(txn, &decision, None, grace)?;
                Ok(Created::New)
            })
        })
        .await
    }

    async fn apply_many(&self, decisions: &[Decision]) -> Result<Vec<Applied>, StoreError> {
        if decisions.is_empty() {
            return Ok(Vec::new());
        }
        let decisions = decisions.to_vec();
        self.run("applying transitions", move |db, grace| {
            write(db, "applying transitions", |txn| {
                let mut applied = Vec::with_capacity(decisions.len());
                for decision in &decisions {
                    if let Some(fence) = &decision.fence
                        && !fence_holds(txn, fence)?
                    {
                        applied.push(Applied::Fenced);
                        continue;
                    }
                    let tasks = txn.open_table(TASKS).map_err(|e| err("applying a transition", e))?;
                    let previous = read_task(&tasks, &decision.task.id)?;
                    drop(tasks);
                    if previous.as_ref().map_or(0, |p| p.version) + 1 != decision.task.version {
                        applied.push(Applied::Conflict);
                        continue;
                    }
                    write_transition(txn, decision, previous.as_ref(), grace)?;
                    applied.push(Applied::Yes);
                }
                Ok(applied)
            })
        })
        .await
    }

    async fn get_many(&self, ids: &[&str]) -> Result<Vec<Option<Task>>, StoreError> {
        let ids: Vec<String> = ids.iter().map(|id| (*id).to_owned()).collect();
        self.run("reading a task", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("reading a task", e))?;
            let table = txn.open_table(TASKS).map_err(|e| err("reading a task", e))?;
            ids.iter().map(|id| read_task(&table, id)).collect()
        })
        .await
    }

    async fn find_by_idempotency_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_owned();
        self.run("reading an idempotency key", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("reading an idempotency key", e))?;
            let table = txn.open_table(IDEMPOTENCY).map_err(|e| err("reading an idempotency key", e))?;
            Ok(table.get(key.as_str()).map_err(|e| err("reading an idempotency key", e))?.map(|v| v.value().to_owned()))
        })
        .await
    }

    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let id = id.to_owned();
        self.run("reading history", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("reading history", e))?;
            let table = txn.open_table(HISTORY).map_err(|e| err("reading history", e))?;
            prefixed(&table, &id)?
                .iter()
                .map(|k| {
                    let bytes = table.get(k.as_str()).map_err(|e| err("reading history", e))?;
                    decode("history entry", &id, bytes.map(|b| b.value().to_vec()).unwrap_or_default().as_slice())
                })
                .collect()
        })
        .await
    }

    async fn list(&self, query: &ListQuery) -> Result<TaskPage, StoreError> {
        list::tasks(self, query).await
    }

    async fn count_in_flight(&self) -> Result<u64, StoreError> {
        list::count_in_flight(self).await
    }

    async fn count_queued(&self) -> Result<u64, StoreError> {
        list::count_queued(self).await
    }

    async fn outbox(&self, id: &str) -> Result<Vec<OutboxEntry>, StoreError> {
        let id = id.to_owned();
        self.run("reading the outbox", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("reading the outbox", e))?;
            let table = txn.open_table(OUTBOX).map_err(|e| err("reading the outbox", e))?;
            prefixed(&table, &id)?
                .iter()
                .filter_map(|k| table.get(k.as_str()).map_err(|e| err("reading the outbox", e)).transpose())
                .map(|bytes| decode("outbox entry", &id, bytes?.value()))
                .collect()
        })
        .await
    }

    /// A transition moves a task's state entry itself, so only the outbox is left to do. The
    /// removal is committed without waiting for the disk (the next transition's commit makes it
    /// durable): lost in a crash, the entries are only relayed again, which receivers absorb
    /// (message ids are deterministic), and one fsync per relay is saved.
    async fn settle(&self, settled: &[Settled<'_>]) -> Result<(), StoreError> {
        let keys: Vec<String> = settled.iter().flat_map(|s| s.relayed.iter().map(move |e| key2(s.task, e))).collect();
        if keys.is_empty() {
            return Ok(());
        }
        self.run("removing outbox entries", move |db, _| {
            let mut txn = db.begin_write().map_err(|e| err("removing outbox entries", e))?;
            txn.set_durability(Durability::None).map_err(|e| err("removing outbox entries", e))?;
            {
                let mut table = txn.open_table(OUTBOX).map_err(|e| err("removing outbox entries", e))?;
                for key in &keys {
                    table.remove(key.as_str()).map_err(|e| err("removing outbox entries", e))?;
                }
            }
            txn.commit().map_err(|e| err("removing outbox entries", e))
        })
        .await
    }

    async fn claim_due(&self, now: u64, lease: Duration, max: usize) -> Result<Vec<String>, StoreError> {
        wake::claim_due(self, None, now, lease, max).await
    }

    async fn release(&self, id: &str, now: u64) -> Result<(), StoreError> {
        wake::release(self, id, now).await
    }

    async fn expire_finished(&self, before: u64, max: usize) -> Result<usize, StoreError> {
        expiry::expire_finished(self, before, max).await
    }

    async fn put_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        dead_letters::put(self, letter).await
    }

    async fn trim_dead_letters(&self, before: u64, max_entries: u64, max: usize) -> Result<usize, StoreError> {
        dead_letters::trim(self, before, max_entries, max).await
    }

    async fn dead_letters(&self, limit: usize, cursor: Option<&str>) -> Result<DeadLetterPage, StoreError> {
        dead_letters::page(self, limit, cursor).await
    }

    async fn dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, StoreError> {
        dead_letters::get(self, id).await
    }

    async fn remove_dead_letter(&self, id: &str) -> Result<bool, StoreError> {
        dead_letters::remove(self, id).await
    }

    async fn count_dead_letters(&self) -> Result<u64, StoreError> {
        dead_letters::count(self).await
    }

    async fn referenced_blobs(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        blobs::referenced(self, keys).await
    }

    async fn take_released_blobs(&self, max: usize) -> Result<Vec<String>, StoreError> {
        blobs::take_released(self, max).await
    }

    async fn pin_shards(&self, shards: u16) -> Result<(), StoreError> {
        shards::pin(self, shards).await
    }

    async fn heartbeat(&self, replica: &Replica, ttl: Duration) -> Result<(), StoreError> {
        shards::heartbeat(self, replica, ttl)
    }

    async fn replicas(&self, now: u64) -> Result<Vec<Replica>, StoreError> {
        Ok(shards::replicas(self, now))
    }

    async fn leave(&self, id: &str) -> Result<(), StoreError> {
        shards::leave(self, id);
        Ok(())
    }

    async fn acquire_shards(
        &self,
        owner: &str,
        shards: &[u16],
        now: u64,
        ttl: Duration,
    ) -> Result<Vec<Option<Lease>>, StoreError> {
        shards::acquire(self, owner, shards, now, ttl).await
    }

    async fn release_shards(&self, owner: &str, leases: &[Lease]) -> Result<(), StoreError> {
        shards::release(self, owner, leases).await
    }

    async fn leases(&self) -> Result<Vec<Lease>, StoreError> {
        shards::leases(self).await
    }

    async fn record_handovers(&self, handovers: &[Handover]) -> Result<(), StoreError> {
        shards::record_handovers(self, handovers).await
    }

    async fn handovers(&self, limit: usize) -> Result<Vec<Handover>, StoreError> {
        shards::handovers(self, limit).await
    }

    async fn claim_due_in(
        &self,
        shards: &[u16],
        now: u64,
        lease: Duration,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        let shards: BTreeSet<u16> = shards.iter().copied().filter(|s| *s < self.shards).collect();
        if shards.is_empty() || max == 0 {
            return Ok(Vec::new());
        }
        wake::claim_due(self, Some(shards), now, lease, max).await
    }

    async fn queued_in(&self, shards: &[u16], room: usize, max: usize) -> Result<Vec<Task>, StoreError> {
        shards::queued_in(self, shards, room, max).await
    }
}
