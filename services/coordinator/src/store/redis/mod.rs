//! The Redis store: one Lua script per transition, keys hash-tagged so it runs on Redis Cluster:
//! a task's keys and the lease of its shard share the shard's slot, so every transition script
//! touches one slot and a cluster can spread the shards over its nodes.
//!
//! # Keys (`P` is the configured prefix, `N` a task's shard: `shard_of(id, shards)`, `T` the shortest hash tag of the slot of `{P:sN}`, two or three characters)
//!
//! | key | type | slot |
//! |---|---|---|
//! | `P:{T}:task:<id>` | hash: `task` (the version, a space, the JSON; a hash written before has a `version` field and the JSON alone), `hist` (the history, a line per entry, see below), `gone` (blob keys the task no longer holds, see "Blob references") | shard N's |
//! | `P:{T}:hist:<id>` | list of the history entries (JSON) a store written before the `hist` field kept (read after the stream, before the field) | shard N's |
//! | `P:{T}:history:<id>` | stream of the history a store written before the list kept (read first) | shard N's |
//! | `P:{T}:outbox:<id>` | hash: entry id → JSON | shard N's |
//! | `P:{P:sN}:lease` | hash: `owner` (empty once released), `token`, `expires_at` (Unix ms) | shard N's |
//! | `P:idem:{key}` | string: task id | its own |
//! | `P:{P:idx}:state:<state>`, `P:{P:idx}:all` | sorted sets, score = creation time | the index slot |
//! | `P:{P:idx}:in_flight` | sorted set: tasks started and unfinished, score = creation time | the index slot |
//! | `P:{P:idx}:due`, `P:{P:idx}:claimed` | sorted sets: wake time, lease end | the index slot |
//! | `P:{P:idx}:due:sN`, `P:{P:idx}:claimed:sN` | the same, shard N's tasks only | the index slot |
//! | `P:{P:idx}:queued:sN` | sorted set: shard N's queued tasks, scored as `state:queued` | the index slot |
//! | `P:{P:idx}:finished` | sorted set: finished tasks, score = time of the last transition | the index slot |
//! | `P:{P:idx}:shards` | string: the shard count the store is pinned to | the index slot |
//! | `P:{P:idx}:layout` | string: the key layout version (3: per shard, short tags) | the index slot |
//! | `P:{P:dlq}:entries`, `P:{P:dlq}:order` | dead-letter archive | the DLQ slot |
//! | `P:{P:idx}:blob:<key>` | set: the tasks referencing a blob | the index slot |
//! | `P:{P:idx}:task_blobs:<id>` | set: the blobs a task referenced, as a store written before `gone` kept them (read and deleted by the expiry) | the index slot |
//! | `P:{P:idx}:released_blobs` | set: blobs whose last referencing task expired | the index slot |
//! | `P:{P:idx}:blob_refs_built` | string: the blob references of the tasks written before they were kept are in | the index slot |
//! | `P:{P:cluster}:replicas`, `P:{P:cluster}:alive` | hash: replica id → announcement (JSON); sorted set: id → when it runs out | the cluster slot |
//! | `P:{P:cluster}:handovers` | list of handovers (JSON), newest first, the newest [`HANDOVERS_KEPT`](crate::store::HANDOVERS_KEPT) | the cluster slot |
//!
//! The per-shard sets hold exactly the global sets' entries of their shard, with the same
//! scores: every command that changes a global set changes the shard's in the same MULTI block
//! or script, so the claims of [`TaskStore::claim_due_in`] and [`TaskStore::claim_due`] are
//! disjoint.
//!
//! # History
//!
//! A transition appends its history entry to the `hist` field of the task hash, as a line of
//! JSON; an entry that names the same replica as the entry before it is kept without it, as `=`
//! followed by the JSON (the replica is the same for most of a task's entries: a line is about
//! 45 bytes shorter). Reading the history fills the replica back in. The entries a store written
//! before kept in a stream or a list per task are read first.
//!
//! # Blob references
//!
//! Before a write, the index commands add the task to the reference set `blob:<key>` of each of
//! its blob keys. The blobs a task references are found again from the task itself: every blob
//! key in its JSON, and those kept in its `gone` field, which the transition script keeps: the
//! keys a write drops from the task's JSON (a reprocessing that replaced a derivative), and those
//! of a refused write (a lost compare-and-set, a fenced write) that the stored task does not hold.
//! So a finished task costs no record of its own for its blobs, and its expiry drops every
//! reference it ever had (with those of the per-task set `task_blobs:<id>` a store written before
//! kept). A write whose index commands ran but whose transition script did not (the connection
//! lost between them) can leave a reference the task does not record: its blob is then kept
//! until an operator removes the reference.
//!
//! # Shards, leases and fencing
//!
//! The store is opened for a shard count ([`RedisStore::with_shards`]), which places every
//! task's keys; a store pinned to another count ([`TaskStore::pin_shards`]) refuses to work.
//! A shard's lease is taken and renewed by one script per shard (all of them in one pipeline);
//! its token only ever grows. A transition that carries a fence checks the lease inside the
//! transition script (the lease key is in the task's slot), so a replica whose lease is gone
//! writes nothing.
//!
//! # Atomicity across slots
//!
//! The transition script touches only the task's slot: it checks the version, writes the task
//! hash, appends the history entry and writes the outbox, all or nothing. The indexes live in
//! another slot, so they are kept by separate, repeatable steps that never lose a task:
//!
//! - *Before* a transition, the task is added to its new state's set and to the due set at its
//!   wake time with `ZADD LT` (an earlier wake wins). A transition that then loses its
//!   compare-and-set leaves at worst an early wake-up or an extra state entry, both harmless.
//! - *After* it, entries of states the task has left for good are removed (states only move
//!   forward; a finished task leaves every other set, the in-flight set included). Readers skip
//!   entries whose task is not in the listed state. The in-flight set is the union of the
//!   in-flight states' sets, kept as one set so that counting it is `ZCARD`.
//! - [`TaskStore::claim_due`] moves due entries to the claimed set in one script, so two
//!   replicas never claim the same entry; [`TaskStore::release`] re-adds the task at the wake
//!   time read from the task itself. A task written while claimed was re-added by that write.
//!   A lease that runs out (the claimer died) makes the task due again.
//!
//! # Expiry
//!
//! A transition to a terminal state adds the task to the finished set beforehand (with the
//! other index commands). [`TaskStore::expire_finished`] takes the entries older than the
//! retention, reads each task and deletes, in this order: its index entries (only those scored
//! with its creation time, so a new task that reuses the id keeps its own), its idempotency key
//! (only while it names the task), its blob references (releasing the blobs no other task
//! references), its keys (only at the version read), and last its finished entry. A crash between the steps leaves the finished entry, so the next sweep finishes the
//! job. An entry whose task is not finished (its terminal write lost the compare-and-set) or is
//! gone is dropped; one scored earlier than its task finished (a store written before the set
//! was kept is indexed by creation time) is scored again.
//!
//! # Where things are
//!
//! Here the store and its [`TaskStore`] methods on tasks; `keys` the key formats above,
//! `scripts` the Lua scripts, `write` the transitions and their index commands, `list` the
//! listings, `expiry` the expiry, `dead_letters` the dead-letter archive, `blobs` the blob
//! reference index, `shards` leases, replicas, handovers and the per-shard claims, `upgrade` the
//! key layout and the indexes an older store lacks, moved and built before the first use.

mod blobs;
mod dead_letters;
mod expiry;
mod history;
mod keys;
mod list;
mod scripts;
mod shards;
#[cfg(test)]
pub(crate) mod tests;
mod upgrade;
mod write;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_contracts::shard::DEFAULT_SHARDS;
use imagepipe_runtime::redis_connection::RedisConnection;
use redis::{AsyncCommands, Script};
use tokio::sync::OnceCell;

use scripts::{
    ACQUIRE, CLAIM_IN, CLAIM_LISTED, FORGET, LIVE_REPLICAS, RELEASE_KEY, RELEASE_LEASE, TRIM_DEAD_LETTERS, UNFINISH,
    UNINDEX, UNREFERENCE,
};

use super::{
    Applied, Created, DeadLetter, DeadLetterPage, Handover, Lease, ListQuery, Replica, Settled, StoreError, TaskPage,
    TaskStore, decode, wake_at,
};
use crate::machine::Decision;
use crate::task::{HistoryEntry, OutboxEntry, Task, TaskState};

/// Tasks in Redis, shared by every coordinator replica.
#[derive(Clone)]
pub struct RedisStore {
    conn: RedisConnection,
    prefix: String,
    relay_grace: Duration,
    shards: u16,
    /// Per shard, the start of its tasks' keys ([`slot_prefixes`](Self::slot_prefixes)),
    /// worked out once: every key of a task write starts with one.
    slot_prefixes: Arc<[String]>,
    /// `store.redis.min_replicas`: replicas `WAIT`ed for after each batch of transitions.
    min_replicas: u32,
    /// Set once the key layout is current and the indexes are built ([`RedisStore::ready`]).
    ready: Arc<OnceCell<()>>,
    transition: Script,
    claim_in: Script,
    claim_listed: Script,
    acquire: Script,
    release_lease: Script,
    live_replicas: Script,
    unindex: Script,
    unfinish: Script,
    release_key: Script,
    forget: Script,
    trim_dead_letters: Script,
    unreference: Script,
}

fn redis_err(operation: &'static str) -> impl FnOnce(redis::RedisError) -> StoreError {
    move |source| StoreError::Redis { operation, source }
}

impl RedisStore {
    /// Connects to `url`; every key starts with `prefix` (no braces). The store works with
    /// [`DEFAULT_SHARDS`] shards unless [`with_shards`](Self::with_shards) says otherwise. A
    /// store written by an older version is brought up to date (its keys moved into the layout
    /// per shard, its missing indexes built) before the first operation that reads or writes
    /// tasks, so after the shard count is set.
    pub async fn connect(url: &str, prefix: &str, relay_grace: Duration) -> Result<Self, StoreError> {
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(StoreError::Redis {
                operation: "configuring",
                source: redis::RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "key prefix must be non-empty, without braces",
                )),
            });
        }
        let conn = RedisConnection::open(url).await.map_err(redis_err("connecting"))?;
        let store = Self {
            conn,
            prefix: prefix.to_owned(),
            relay_grace,
            shards: DEFAULT_SHARDS,
            slot_prefixes: Self::slot_prefixes(prefix, DEFAULT_SHARDS),
            min_replicas: 0,
            ready: Arc::new(OnceCell::new()),
            transition: Script::new(&scripts::transition_script()),
            claim_in: Script::new(CLAIM_IN),
            claim_listed: Script::new(CLAIM_LISTED),
            acquire: Script::new(ACQUIRE),
            release_lease: Script::new(RELEASE_LEASE),
            live_replicas: Script::new(LIVE_REPLICAS),
            unindex: Script::new(UNINDEX),
            unfinish: Script::new(UNFINISH),
            release_key: Script::new(RELEASE_KEY),
            forget: Script::new(FORGET),
            trim_dead_letters: Script::new(TRIM_DEAD_LETTERS),
            unreference: Script::new(UNREFERENCE),
        };
        Ok(store)
    }

    /// The store with `shards` shards (at least 1): where each task's keys are, and which
    /// shard's indexes list it. It must be the count the store was written with
    /// ([`TaskStore::pin_shards`]); a store pinned to another count refuses every task operation
    /// with [`StoreError::ShardsChanged`].
    #[must_use]
    pub fn with_shards(self, shards: u16) -> Self {
        let shards = shards.max(1);
        let slot_prefixes = Self::slot_prefixes(&self.prefix, shards);
        Self { shards, slot_prefixes, ready: Arc::new(OnceCell::new()), ..self }
    }

    /// The store waiting, after each batch of transitions ([`TaskStore::create`],
    /// [`TaskStore::apply_many`]), until `replicas` replicas of every primary written hold it
    /// (`WAIT`, at most [`REPLICA_WAIT`]); fewer is [`StoreError::NotReplicated`]. 0 (the
    /// default) does not wait.
    #[must_use]
    pub fn with_min_replicas(self, replicas: u32) -> Self {
        Self { min_replicas: replicas, ..self }
    }

    /// Waits until [`min_replicas`](Self::with_min_replicas) replicas acknowledged the writes
    /// of `decisions` (their tasks' slots and the index slot, which the same batch wrote).
    async fn replicated(&self, decisions: &[Decision]) -> Result<(), StoreError> {
        if self.min_replicas == 0 || decisions.is_empty() {
            return Ok(());
        }
        let index = self.index_key("all");
        let mut keys: Vec<String> = decisions.iter().map(|d| self.task_key(&d.task.id)).collect();
        keys.push(index);
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let acked = self
            .conn
            .wait_replicas(&keys, self.min_replicas, REPLICA_WAIT)
            .await
            .map_err(redis_err("waiting for replicas"))?;
        if acked >= self.min_replicas {
            return Ok(());
        }
        metrics::counter!(crate::metrics::UNREPLICATED).increment(1);
        let error =
            StoreError::NotReplicated { wanted: self.min_replicas, acked, timeout_ms: REPLICA_WAIT.as_millis() as u64 };
        tracing::warn!(transitions = decisions.len(), "{error}");
        Err(error)
    }
}

/// How long a batch of transitions waits for `store.redis.min_replicas` replicas (`WAIT`'s
/// timeout): under the client's response timeout of 500 ms.
pub const REPLICA_WAIT: Duration = Duration::from_millis(400);

#[async_trait]
impl TaskStore for RedisStore {
    /// Refused with [`StoreError::Fenced`] when `decision` carries a fence that is not the
    /// shard's current lease (nothing of the task is written then).
    async fn create(&self, decision: &Decision) -> Result<Created, StoreError> {
        self.ready().await?;
        let task = &decision.task;
        let mut conn = self.conn.clone();
        if let Some(key) = &task.idempotency_key {
            let set: bool = redis::cmd("SET")
                .arg(self.idem_key(key))
                .arg(&task.id)
                .arg("NX")
                .query_async::<Option<String>>(&mut conn)
                .await
                .map_err(redis_err("reserving an idempotency key"))?
                .is_some();
            if !set {
                let owner: Option<String> =
                    conn.get(self.idem_key(key)).await.map_err(redis_err("reading an idempotency key"))?;
                if let Some(owner) = owner.filter(|o| *o != task.id) {
                    if let Some(existing) = self.get(&owner).await? {
                        return Ok(Created::Existing(Box::new(existing)));
                    }
                    // the owner's creator died before writing it: this submit takes the key over
                    let () = conn
                        .set(self.idem_key(key), &task.id)
                        .await
                        .map_err(redis_err("reserving an idempotency key"))?;
                }
            }
        }
        let written = self.index_and_write(std::slice::from_ref(decision)).await?;
        self.replicated(std::slice::from_ref(decision)).await?;
        match written.first() {
            Some(Applied::Yes) => return Ok(Created::New),
            Some(Applied::Fenced) => {
                self.repair(&[decision]).await?;
                let fence = decision.fence.unwrap_or(crate::machine::Fence { shard: 0, token: 0, now: 0 });
                return Err(StoreError::Fenced { task: task.id.clone(), shard: fence.shard, token: fence.token });
            }
            _ => {}
        }
        let existing = self.get(&task.id).await?.ok_or_else(|| StoreError::Corrupt {
            what: "task",
            id: task.id.clone(),
            message: "has a version but no record".into(),
        })?;
        self.prune_many(&[(&existing.id, existing.state)], &[]).await?;
        Ok(Created::Existing(Box::new(existing)))
    }

    async fn apply_many(&self, decisions: &[Decision]) -> Result<Vec<Applied>, StoreError> {
        if decisions.is_empty() {
            return Ok(Vec::new());
        }
        self.ready().await?;
        let written = self.index_and_write(decisions).await?;
        self.replicated(decisions).await?;
        let lost: Vec<&Decision> =
            decisions.iter().zip(&written).filter(|(_, w)| **w != Applied::Yes).map(|(d, _)| d).collect();
        self.repair(&lost).await?;
        Ok(written)
    }

    async fn get_many(&self, ids: &[&str]) -> Result<Vec<Option<Task>>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.ready().await?;
        self.read_tasks(ids).await
    }

    async fn find_by_idempotency_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.ready().await?;
        self.conn.clone().get(self.idem_key(key)).await.map_err(redis_err("reading an idempotency key"))
    }

    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        self.ready().await?;
        history::read(self, id).await
    }

    async fn list(&self, query: &ListQuery) -> Result<TaskPage, StoreError> {
        self.ready().await?;
        list::tasks(self, query).await
    }

    async fn count_in_flight(&self) -> Result<u64, StoreError> {
        self.ready().await?;
        self.conn.clone().zcard(self.index_key("in_flight")).await.map_err(redis_err("counting tasks"))
    }

    async fn count_queued(&self) -> Result<u64, StoreError> {
        self.ready().await?;
        self.conn.clone().zcard(self.state_key(TaskState::Queued)).await.map_err(redis_err("counting tasks"))
    }

    async fn outbox(&self, id: &str) -> Result<Vec<OutboxEntry>, StoreError> {
        self.ready().await?;
        let mut entries: Vec<(String, Vec<u8>)> =
            self.conn.clone().hgetall(self.outbox_key(id)).await.map_err(redis_err("reading the outbox"))?;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.iter().map(|(_, json)| decode("outbox entry", id, json)).collect()
    }

    async fn settle(&self, settled: &[Settled<'_>]) -> Result<(), StoreError> {
        self.ready().await?;
        let mut pipe = redis::pipe();
        for s in settled.iter().filter(|s| !s.relayed.is_empty()) {
            pipe.hdel(self.outbox_key(s.task), s.relayed).ignore();
        }
        let states: Vec<(&str, TaskState)> = settled.iter().filter_map(|s| Some((s.task, s.state?))).collect();
        self.queue_prunes(&mut pipe, &states);
        if pipe.is_empty() {
            return Ok(());
        }
        pipe.query_async::<()>(&mut self.conn.clone()).await.map_err(redis_err("settling relayed tasks"))
    }

    async fn claim_due(&self, now: u64, lease: Duration, max: usize) -> Result<Vec<String>, StoreError> {
        self.ready().await?;
        shards::claim_due(self, now, lease, max).await
    }

    async fn release(&self, id: &str, now: u64) -> Result<(), StoreError> {
        self.ready().await?;
        let task = self.get(id).await?;
        let outbox_len: usize =
            self.conn.clone().hlen(self.outbox_key(id)).await.map_err(redis_err("releasing a task"))?;
        let shard = self.shard(id);
        let mut pipe = redis::pipe();
        pipe.atomic();
        if let Some(at) = task.and_then(|t| wake_at(&t, outbox_len > 0, now, self.relay_grace)) {
            pipe.cmd("ZADD").arg(self.index_key("due")).arg("LT").arg(at).arg(id).ignore();
            pipe.cmd("ZADD").arg(self.shard_index_key("due", shard)).arg("LT").arg(at).arg(id).ignore();
        }
        pipe.zrem(self.index_key("claimed"), id).ignore();
        pipe.zrem(self.shard_index_key("claimed", shard), id).ignore();
        pipe.query_async::<()>(&mut self.conn.clone()).await.map_err(redis_err("releasing a task"))
    }

    async fn expire_finished(&self, before: u64, max: usize) -> Result<usize, StoreError> {
        self.ready().await?;
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
        self.ready().await?;
        blobs::referenced(self, keys).await
    }

    async fn take_released_blobs(&self, max: usize) -> Result<Vec<String>, StoreError> {
        blobs::take_released(self, max).await
    }

    async fn pin_shards(&self, shards: u16) -> Result<(), StoreError> {
        self.pin(shards).await?;
        self.ready().await
    }

    async fn heartbeat(&self, replica: &Replica, ttl: Duration) -> Result<(), StoreError> {
        shards::heartbeat(self, replica, ttl).await
    }

    async fn replicas(&self, now: u64) -> Result<Vec<Replica>, StoreError> {
        shards::replicas(self, now).await
    }

    async fn leave(&self, id: &str) -> Result<(), StoreError> {
        shards::leave(self, id).await
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
        self.ready().await?;
        shards::claim_due_in(self, shards, now, lease, max).await
    }

    async fn queued_in(&self, shards: &[u16], room: usize, max: usize) -> Result<Vec<Task>, StoreError> {
        self.ready().await?;
        shards::queued_in(self, shards, room, max).await
    }
}

impl RedisStore {
    /// The tasks `ids`, in order, in one round trip (without waiting for [`ready`](Self::ready):
    /// the upgrade reads tasks too).
    async fn read_tasks(&self, ids: &[&str]) -> Result<Vec<Option<Task>>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hget(self.task_key(id), "task");
        }
        let json: Vec<Option<Vec<u8>>> =
            pipe.query_async(&mut self.conn.clone()).await.map_err(redis_err("reading a task"))?;
        ids.iter().zip(json).map(|(id, j)| j.map(|j| decode("task", id, scripts::task_json(&j))).transpose()).collect()
    }

    /// Prunes the index entries that refused writes (`lost`: lost compare-and-sets, fenced
    /// writes) left for their tasks' stored states, and those of tasks that do not exist.
    async fn repair(&self, lost: &[&Decision]) -> Result<(), StoreError> {
        if lost.is_empty() {
            return Ok(());
        }
        let ids: Vec<&str> = lost.iter().map(|d| d.task.id.as_str()).collect();
        let actual = self.get_many(&ids).await?;
        let gone: Vec<&Task> = lost.iter().zip(&actual).filter(|(_, a)| a.is_none()).map(|(d, _)| &d.task).collect();
        let stored: Vec<(&str, TaskState)> = actual.iter().flatten().map(|t| (t.id.as_str(), t.state)).collect();
        self.prune_many(&stored, &gone).await
    }
}
