//! The Redis store: one Lua script per transition, keys hash-tagged so it runs on Redis Cluster.
//!
//! # Keys (`P` is the configured prefix)
//!
//! | key | type | slot |
//! |---|---|---|
//! | `P:task:{id}` | hash: `version`, `state`, `task` (JSON) | the task's |
//! | `P:hist:{id}` | list of history entries (JSON), oldest first | the task's |
//! | `P:history:{id}` | stream of the history a store written before `P:hist` kept (read first) | the task's |
//! | `P:outbox:{id}` | hash: entry id → JSON | the task's |
//! | `P:idem:{key}` | string: task id | its own |
//! | `P:{P:idx}:state:<state>`, `P:{P:idx}:all` | sorted sets, score = creation time | the index slot |
//! | `P:{P:idx}:in_flight` | sorted set: tasks started and unfinished, score = creation time | the index slot |
//! | `P:{P:idx}:due`, `P:{P:idx}:claimed` | sorted sets: wake time, lease end | the index slot |
//! | `P:{P:idx}:finished` | sorted set: finished tasks, score = time of the last transition | the index slot |
//! | `P:{P:dlq}:entries`, `P:{P:dlq}:order` | dead-letter archive | the DLQ slot |
//! | `P:{P:idx}:blob:<key>`, `P:{P:idx}:task_blobs:<id>` | sets: the tasks referencing a blob, the blobs a task references | the index slot |
//! | `P:{P:idx}:released_blobs` | set: blobs whose last referencing task expired | the index slot |
//! | `P:{P:idx}:blob_refs_built` | string: the blob references of the tasks written before they were kept are in | the index slot |
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

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};

use super::{
    Applied, Created, DeadLetter, DeadLetterPage, ListOrder, ListQuery, Listing, Settled, StoreError, TaskPage,
    TaskStore, blob_keys, decode, encode, make_cursor, parse_cursor, rank, wake_at,
};
use crate::machine::Decision;
use crate::task::{HistoryEntry, OutboxEntry, Task, TaskState};

/// Checks the version, writes the task, appends history, writes the outbox: one transition.
/// KEYS: task, history (a list: a stream per task would take 4 KiB even when small), outbox.
/// ARGV: expected version (0: must not exist), new version, state, task JSON, history JSON,
/// then outbox entry id / JSON pairs.
const TRANSITION: &str = r#"
local current = redis.call('HGET', KEYS[1], 'version')
if current == false then current = '0' end
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'state', ARGV[3], 'task', ARGV[4])
redis.call('RPUSH', KEYS[2], ARGV[5])
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
end
return 1
"#;

/// Returns expired leases to the due set, then moves up to ARGV[3] due entries to the claimed
/// set with lease end ARGV[2]. KEYS: due, claimed. ARGV: now, lease end, max.
const CLAIM: &str = r#"
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZADD', KEYS[1], 'LT', ARGV[1], id)
end
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], ARGV[2], id)
end
return ids
"#;

/// Removes task ARGV[1] from every sorted set of KEYS where its score is ARGV[2] (its creation
/// time), so that a new task reusing the id keeps its entries.
const UNINDEX: &str = r#"
for _, key in ipairs(KEYS) do
  local score = redis.call('ZSCORE', key, ARGV[1])
  if score and tonumber(score) == tonumber(ARGV[2]) then redis.call('ZREM', key, ARGV[1]) end
end
return 0
"#;

/// Removes ARGV[2..] from the finished set KEYS[1] where finished at or before ARGV[1].
const UNFINISH: &str = r#"
for i = 2, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= tonumber(ARGV[1]) then redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return 0
"#;

/// Drops task ARGV[1]'s blob references: KEYS[1] its set of blobs, KEYS[2] the released set,
/// KEYS[3..] the reference sets of the blobs ARGV[2..]; a blob left without references is
/// released.
const UNREFERENCE: &str = r#"
for i = 3, #KEYS do
  redis.call('SREM', KEYS[i], ARGV[1])
  if redis.call('SCARD', KEYS[i]) == 0 then redis.call('SADD', KEYS[2], ARGV[i - 1]) end
end
redis.call('DEL', KEYS[1])
return 0
"#;

/// Deletes the idempotency key KEYS[1] while it names task ARGV[1].
const RELEASE_KEY: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"#;

/// Deletes a task's keys (KEYS: task, history, legacy history stream, outbox) if it is still
/// at version ARGV[1].
const FORGET: &str = r#"
if redis.call('HGET', KEYS[1], 'version') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
return 1
"#;

/// Builds the finished set KEYS[1] from the terminal states' sets KEYS[2..] when it does not
/// exist (a store written before it was kept; scores are creation times, corrected on expiry).
const BUILD_FINISHED: &str = r#"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('ZUNIONSTORE', KEYS[1], #KEYS - 1, unpack(KEYS, 2))
"#;

/// Deletes dead letters (KEYS: entries hash, order set) dead-lettered at or before ARGV[1],
/// then the oldest beyond ARGV[2] entries; at most ARGV[3] in all. Returns how many.
const TRIM_DEAD_LETTERS: &str = r#"
local budget = tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, budget)
local excess = redis.call('ZCARD', KEYS[2]) - #ids - tonumber(ARGV[2])
if excess > 0 and #ids < budget then
  local oldest = redis.call('ZRANGE', KEYS[2], #ids, #ids + math.min(excess, budget - #ids) - 1)
  for _, id in ipairs(oldest) do ids[#ids + 1] = id end
end
for _, id in ipairs(ids) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
return #ids
"#;

/// Tasks in Redis, shared by every coordinator replica.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    relay_grace: Duration,
    transition: Script,
    claim: Script,
    unindex: Script,
    unfinish: Script,
    release_key: Script,
    forget: Script,
    trim_dead_letters: Script,
    unreference: Script,
}

/// A score bound of a `ZRANGEBYSCORE`: `open` (`-inf` / `+inf`) at the end of the `u64` range.
fn score_arg(score: u64, open: &str) -> String {
    if (open == "-inf" && score == 0) || (open == "+inf" && score == u64::MAX) {
        open.to_owned()
    } else {
        score.to_string()
    }
}

fn redis_err(operation: &'static str) -> impl FnOnce(redis::RedisError) -> StoreError {
    move |source| StoreError::Redis { operation, source }
}

impl RedisStore {
    /// Connects to `url`; every key starts with `prefix` (no braces).
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
        let client = redis::Client::open(url).map_err(redis_err("connecting"))?;
        let conn = ConnectionManager::new(client).await.map_err(redis_err("connecting"))?;
        let store = Self {
            conn,
            prefix: prefix.to_owned(),
            relay_grace,
            transition: Script::new(TRANSITION),
            claim: Script::new(CLAIM),
            unindex: Script::new(UNINDEX),
            unfinish: Script::new(UNFINISH),
            release_key: Script::new(RELEASE_KEY),
            forget: Script::new(FORGET),
            trim_dead_letters: Script::new(TRIM_DEAD_LETTERS),
            unreference: Script::new(UNREFERENCE),
        };
        store.build_in_flight_set().await?;
        store.build_finished_set().await?;
        store.build_blob_references().await?;
        Ok(store)
    }

    /// Indexes the blob references of every task unless they are in (a store written before
    /// they were kept): page by page through the creation index, then the marker. Replicas that
    /// start together may both do it; the index is a set.
    async fn build_blob_references(&self) -> Result<(), StoreError> {
        const PAGE: isize = 500;
        let mut conn = self.conn.clone();
        let marker = self.index_key("blob_refs_built");
        let built: bool = conn.exists(&marker).await.map_err(redis_err("indexing blob references"))?;
        if built {
            return Ok(());
        }
        let mut start = 0;
        loop {
            let ids: Vec<String> = conn
                .zrange(self.index_key("all"), start, start + PAGE - 1)
                .await
                .map_err(redis_err("indexing blob references"))?;
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            let tasks = self.get_many(&refs).await?;
            let mut pipe = redis::pipe();
            for task in tasks.iter().flatten() {
                self.queue_blob_references(&mut pipe, task);
            }
            if !pipe.is_empty() {
                pipe.query_async::<()>(&mut conn).await.map_err(redis_err("indexing blob references"))?;
            }
            if ids.len() < PAGE as usize {
                break;
            }
            start += PAGE;
        }
        conn.set::<_, _, ()>(&marker, 1).await.map_err(redis_err("indexing blob references"))
    }

    /// Adds to `pipe` the records that `task` references its [`blob_keys`].
    fn queue_blob_references(&self, pipe: &mut redis::Pipeline, task: &Task) {
        let keys = blob_keys(task);
        if keys.is_empty() {
            return;
        }
        pipe.sadd(self.task_blobs_key(&task.id), &keys).ignore();
        for key in keys {
            pipe.sadd(self.blob_key(key), &task.id).ignore();
        }
    }

    /// Builds the finished set from the terminal states' sets when it does not exist (a store
    /// written before the set was kept), so that tasks finished back then expire too.
    async fn build_finished_set(&self) -> Result<(), StoreError> {
        let script = Script::new(BUILD_FINISHED);
        let mut invocation = script.key(self.index_key("finished"));
        for state in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            invocation.key(self.state_key(state));
        }
        invocation.invoke_async::<()>(&mut self.conn.clone()).await.map_err(redis_err("indexing"))
    }

    /// Builds the in-flight set from the in-flight states' sets when it does not exist (a store
    /// written before the set was kept).
    async fn build_in_flight_set(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let key = self.index_key("in_flight");
        let exists: bool = conn.exists(&key).await.map_err(redis_err("indexing"))?;
        if exists {
            return Ok(());
        }
        let sources: Vec<String> = TaskState::IN_FLIGHT.into_iter().map(|s| self.state_key(s)).collect();
        redis::cmd("ZUNIONSTORE")
            .arg(&key)
            .arg(sources.len())
            .arg(sources)
            .query_async::<()>(&mut conn)
            .await
            .map_err(redis_err("indexing"))
    }

    fn task_key(&self, id: &str) -> String {
        format!("{}:task:{{{id}}}", self.prefix)
    }

    fn history_key(&self, id: &str) -> String {
        format!("{}:hist:{{{id}}}", self.prefix)
    }

    /// The history stream of a store written before [`history_key`](Self::history_key) lists.
    fn legacy_history_key(&self, id: &str) -> String {
        format!("{}:history:{{{id}}}", self.prefix)
    }

    fn outbox_key(&self, id: &str) -> String {
        format!("{}:outbox:{{{id}}}", self.prefix)
    }

    fn idem_key(&self, key: &str) -> String {
        format!("{}:idem:{{{key}}}", self.prefix)
    }

    fn index_key(&self, name: &str) -> String {
        format!("{p}:{{{p}:idx}}:{name}", p = self.prefix)
    }

    fn blob_key(&self, key: &str) -> String {
        self.index_key(&format!("blob:{key}"))
    }

    fn task_blobs_key(&self, id: &str) -> String {
        self.index_key(&format!("task_blobs:{id}"))
    }

    fn state_key(&self, state: TaskState) -> String {
        self.index_key(&format!("state:{}", state.as_str()))
    }

    fn dlq_key(&self, name: &str) -> String {
        format!("{p}:{{{p}:dlq}}:{name}", p = self.prefix)
    }

    /// Indexes transitions (each one's new state and wake time) and then writes them, in one
    /// round trip: the index commands run first, in a MULTI block of the index slot, then one
    /// transition script per decision in its task's slot (each its own compare-and-set on
    /// `version - 1`). Whether each transition was written.
    async fn index_and_write(&self, decisions: &[Decision]) -> Result<Vec<bool>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI").ignore();
        for decision in decisions {
            let task = &decision.task;
            pipe.zadd(self.state_key(task.state), &task.id, task.index_at()).ignore();
            if TaskState::IN_FLIGHT.contains(&task.state) {
                pipe.zadd(self.index_key("in_flight"), &task.id, task.created_at).ignore();
            }
            if task.version == 1 {
                pipe.zadd(self.index_key("all"), &task.id, task.created_at).ignore();
            }
            if task.state.is_terminal() {
                pipe.zadd(self.index_key("finished"), &task.id, task.updated_at).ignore();
            }
            if let Some(at) = wake_at(task, !decision.outbox.is_empty(), decision.history.at, self.relay_grace) {
                pipe.cmd("ZADD").arg(self.index_key("due")).arg("LT").arg(at).arg(&task.id).ignore();
            }
            self.queue_blob_references(&mut pipe, task);
        }
        pipe.cmd("EXEC").ignore();
        let mut invocations = Vec::with_capacity(decisions.len());
        for decision in decisions {
            let task = &decision.task;
            let mut invocation = self.transition.key(self.task_key(&task.id));
            invocation
                .key(self.history_key(&task.id))
                .key(self.outbox_key(&task.id))
                .arg(task.version - 1)
                .arg(task.version)
                .arg(task.state.as_str())
                .arg(encode(task))
                .arg(encode(&decision.history));
            for entry in &decision.outbox {
                invocation.arg(&entry.id).arg(encode(entry));
            }
            pipe.invoke_script(&invocation);
            invocations.push(invocation);
        }
        let mut conn = self.conn.clone();
        let written = match pipe.query_async::<Vec<i64>>(&mut conn).await {
            // The server does not know the script yet (first use, or restarted), so none of the
            // pipeline's scripts ran: load it and send the whole pipeline again (its index
            // commands are repeatable).
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                if let Some(invocation) = invocations.first() {
                    invocation.load_async(&mut conn).await.map_err(redis_err("writing a transition"))?;
                }
                pipe.query_async::<Vec<i64>>(&mut conn).await
            }
            other => other,
        };
        let applied = written.map_err(redis_err("writing a transition"))?;
        if applied.len() != decisions.len() {
            return Err(StoreError::Redis {
                operation: "writing a transition",
                source: redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "the transition pipeline answered with another number of replies",
                )),
            });
        }
        Ok(applied.into_iter().map(|a| a == 1).collect())
    }

    /// Prunes the index entries of each task `(id, state)` its state has left behind, in one
    /// round trip; a task that is gone leaves the entries `gone` names (its state and the due
    /// and in-flight sets).
    async fn prune_many(&self, tasks: &[(&str, TaskState)], gone: &[&Task]) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        self.queue_prunes(&mut pipe, tasks);
        for task in gone {
            pipe.zrem(self.state_key(task.state), &task.id).ignore();
            pipe.zrem(self.index_key("due"), &task.id).ignore();
            pipe.zrem(self.index_key("in_flight"), &task.id).ignore();
        }
        if pipe.is_empty() {
            return Ok(());
        }
        pipe.query_async::<()>(&mut self.conn.clone()).await.map_err(redis_err("indexing"))
    }

    /// Adds to `pipe` the removal of each task `(id, state)` from the index sets its state
    /// can never be in again.
    fn queue_prunes(&self, pipe: &mut redis::Pipeline, tasks: &[(&str, TaskState)]) {
        for (id, state) in tasks {
            let left = TaskState::ALL
                .into_iter()
                .filter(|s| rank(*s) < rank(*state) || (state.is_terminal() && s != state))
                .map(|s| self.state_key(s));
            for key in left {
                pipe.zrem(key, *id).ignore();
            }
            if state.is_terminal() {
                pipe.zrem(self.index_key("in_flight"), *id).ignore();
            }
        }
    }

    /// Deletes every key and index entry of finished `task` (the order is the module's
    /// "Expiry"), except its finished entry; whether this call deleted its keys.
    async fn forget_task(&self, task: &Task) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let mut unindex = self.unindex.key(self.index_key("all"));
        unindex.key(self.index_key("in_flight"));
        for state in TaskState::ALL {
            unindex.key(self.state_key(state));
        }
        unindex
            .arg(&task.id)
            .arg(task.created_at)
            .invoke_async::<()>(&mut conn)
            .await
            .map_err(redis_err("expiring"))?;
        if let Some(key) = &task.idempotency_key {
            self.release_key
                .key(self.idem_key(key))
                .arg(&task.id)
                .invoke_async::<()>(&mut conn)
                .await
                .map_err(redis_err("expiring"))?;
        }
        let blobs: Vec<String> = conn.smembers(self.task_blobs_key(&task.id)).await.map_err(redis_err("expiring"))?;
        let mut unreference = self.unreference.key(self.task_blobs_key(&task.id));
        unreference.key(self.index_key("released_blobs")).arg(&task.id);
        for key in &blobs {
            unreference.key(self.blob_key(key)).arg(key);
        }
        unreference.invoke_async::<()>(&mut conn).await.map_err(redis_err("expiring"))?;
        let deleted: i64 = self
            .forget
            .key(self.task_key(&task.id))
            .key(self.history_key(&task.id))
            .key(self.legacy_history_key(&task.id))
            .key(self.outbox_key(&task.id))
            .arg(task.version)
            .invoke_async(&mut conn)
            .await
            .map_err(redis_err("expiring"))?;
        Ok(deleted == 1)
    }

    /// Members of sorted set `key` after `cursor`, in score order, `batch` at a time.
    async fn range_after(
        &self,
        key: &str,
        cursor: Option<(u64, &str)>,
        offset: usize,
        batch: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let min = cursor.map_or("-inf".to_owned(), |(at, _)| at.to_string());
        let rows = self.scored_range("ZRANGEBYSCORE", key, (&min, "+inf"), offset, batch, "listing").await?;
        Ok(rows
            .into_iter()
            .filter(|(id, at)| cursor.is_none_or(|(c_at, c_id)| *at > c_at || id.as_str() > c_id))
            .collect())
    }

    /// `command` (`ZRANGEBYSCORE`, or `ZREVRANGEBYSCORE` with `from` the higher bound) of sorted
    /// set `key`: members with their scores, `count` of them after skipping `offset`.
    async fn scored_range(
        &self,
        command: &str,
        key: &str,
        (from, to): (&str, &str),
        offset: usize,
        count: usize,
        operation: &'static str,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        redis::cmd(command)
            .arg(key)
            .arg(from)
            .arg(to)
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(offset)
            .arg(count)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_err(operation))
    }
}

#[async_trait]
impl TaskStore for RedisStore {
    async fn create(&self, decision: &Decision) -> Result<Created, StoreError> {
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
        if self.index_and_write(std::slice::from_ref(decision)).await?.first() == Some(&true) {
            return Ok(Created::New);
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
        let written = self.index_and_write(decisions).await?;
        let lost: Vec<&str> =
            decisions.iter().zip(&written).filter(|(_, w)| !**w).map(|(d, _)| d.task.id.as_str()).collect();
        if !lost.is_empty() {
            let actual = self.get_many(&lost).await?;
            let lost_tasks = decisions.iter().zip(&written).filter(|(_, w)| !**w).map(|(d, _)| &d.task);
            let gone: Vec<&Task> = lost_tasks.zip(&actual).filter(|(_, a)| a.is_none()).map(|(t, _)| t).collect();
            let stored: Vec<(&str, TaskState)> = actual.iter().flatten().map(|t| (t.id.as_str(), t.state)).collect();
            self.prune_many(&stored, &gone).await?;
        }
        Ok(written.into_iter().map(|w| if w { Applied::Yes } else { Applied::Conflict }).collect())
    }

    async fn get_many(&self, ids: &[&str]) -> Result<Vec<Option<Task>>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.hget(self.task_key(id), "task");
        }
        let json: Vec<Option<Vec<u8>>> =
            pipe.query_async(&mut self.conn.clone()).await.map_err(redis_err("reading a task"))?;
        ids.iter().zip(json).map(|(id, j)| j.map(|j| decode("task", id, &j)).transpose()).collect()
    }

    async fn find_by_idempotency_key(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.conn.clone().get(self.idem_key(key)).await.map_err(redis_err("reading an idempotency key"))
    }

    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
        let (legacy, listed): (redis::streams::StreamRangeReply, Vec<Vec<u8>>) = redis::pipe()
            .xrange_all(self.legacy_history_key(id))
            .lrange(self.history_key(id), 0, -1)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("reading history"))?;
        let legacy = legacy.ids.iter().map(|entry| {
            entry.get::<Vec<u8>>("entry").ok_or_else(|| StoreError::Corrupt {
                what: "history entry",
                id: format!("{id}/{}", entry.id),
                message: "has no `entry` field".into(),
            })
        });
        legacy.chain(listed.into_iter().map(Ok)).map(|json| decode("history entry", id, &json?)).collect()
    }

    async fn list(&self, query: &ListQuery) -> Result<TaskPage, StoreError> {
        let mut listing = Listing::new(query)?;
        let Some((lo, hi)) = listing.range() else { return Ok(listing.finish()) };
        let key = query.state.map_or_else(|| self.index_key("all"), |s| self.state_key(s));
        let (min, max) = (score_arg(lo, "-inf"), score_arg(hi, "+inf"));
        // A filtered scan takes growing batches: a page may need many entries.
        let mut batch = (query.limit + 1).clamp(16, 512);
        let mut offset = 0;
        'scan: loop {
            let (command, bounds) = match query.order {
                ListOrder::Oldest => ("ZRANGEBYSCORE", (min.as_str(), max.as_str())),
                ListOrder::Newest => ("ZREVRANGEBYSCORE", (max.as_str(), min.as_str())),
            };
            let rows = self.scored_range(command, &key, bounds, offset, batch, "listing tasks").await?;
            let fetched = rows.len();
            offset += fetched;
            let rows: Vec<(String, u64)> =
                rows.into_iter().filter(|(id, at)| listing.is_past_cursor(*at, id)).collect();
            let mut pipe = redis::pipe();
            for (id, _) in &rows {
                pipe.hget(self.task_key(id), "task");
            }
            let json: Vec<Option<Vec<u8>>> = if rows.is_empty() {
                Vec::new()
            } else {
                pipe.query_async(&mut self.conn.clone()).await.map_err(redis_err("listing tasks"))?
            };
            for ((id, at), json) in rows.iter().zip(json) {
                // Decoded only when it may match: a label filter skips most tasks unread.
                let task = match json {
                    Some(json) if listing.may_match(&json) => Some(decode("task", id, &json)?),
                    _ => None,
                };
                if !listing.offer(*at, id, task) {
                    break 'scan;
                }
            }
            if fetched < batch {
                break;
            }
            if listing.is_bounded() {
                batch = (batch * 2).min(1024);
            }
        }
        Ok(listing.finish())
    }

    async fn count_in_flight(&self) -> Result<u64, StoreError> {
        self.conn.clone().zcard(self.index_key("in_flight")).await.map_err(redis_err("counting tasks"))
    }

    async fn count_queued(&self) -> Result<u64, StoreError> {
        self.conn.clone().zcard(self.state_key(TaskState::Queued)).await.map_err(redis_err("counting tasks"))
    }

    async fn outbox(&self, id: &str) -> Result<Vec<OutboxEntry>, StoreError> {
        let mut entries: Vec<(String, Vec<u8>)> =
            self.conn.clone().hgetall(self.outbox_key(id)).await.map_err(redis_err("reading the outbox"))?;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.iter().map(|(_, json)| decode("outbox entry", id, json)).collect()
    }

    async fn settle(&self, settled: &[Settled<'_>]) -> Result<(), StoreError> {
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
        let until = now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
        self.claim
            .key(self.index_key("due"))
            .key(self.index_key("claimed"))
            .arg(now)
            .arg(until)
            .arg(max)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("claiming due tasks"))
    }

    async fn release(&self, id: &str, now: u64) -> Result<(), StoreError> {
        let task = self.get(id).await?;
        let outbox_len: usize =
            self.conn.clone().hlen(self.outbox_key(id)).await.map_err(redis_err("releasing a task"))?;
        let mut pipe = redis::pipe();
        pipe.atomic();
        if let Some(at) = task.and_then(|t| wake_at(&t, outbox_len > 0, now, self.relay_grace)) {
            pipe.cmd("ZADD").arg(self.index_key("due")).arg("LT").arg(at).arg(id).ignore();
        }
        pipe.zrem(self.index_key("claimed"), id).ignore();
        pipe.query_async::<()>(&mut self.conn.clone()).await.map_err(redis_err("releasing a task"))
    }

    async fn expire_finished(&self, before: u64, max: usize) -> Result<usize, StoreError> {
        let finished = self.index_key("finished");
        let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(&finished)
            .arg("-inf")
            .arg(before)
            .arg("LIMIT")
            .arg(0)
            .arg(max)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("expiring"))?;
        let (mut expired, mut settled, mut late) = (0, Vec::new(), Vec::new());
        for id in ids {
            match self.get(&id).await {
                Ok(Some(task)) if task.state.is_terminal() && task.updated_at <= before => {
                    expired += usize::from(self.forget_task(&task).await?);
                    settled.push(id);
                }
                Ok(Some(task)) if task.state.is_terminal() => late.push((task.updated_at, id)),
                Ok(_) => settled.push(id),
                Err(e @ StoreError::Corrupt { .. }) => tracing::warn!(error = %e, "finished task not expired"),
                Err(e) => return Err(e),
            }
        }
        let mut conn = self.conn.clone();
        if !late.is_empty() {
            redis::cmd("ZADD")
                .arg(&finished)
                .arg("XX")
                .arg("GT")
                .arg(late)
                .query_async::<()>(&mut conn)
                .await
                .map_err(redis_err("expiring"))?;
        }
        if !settled.is_empty() {
            self.unfinish
                .key(&finished)
                .arg(before)
                .arg(settled)
                .invoke_async::<()>(&mut conn)
                .await
                .map_err(redis_err("expiring"))?;
        }
        Ok(expired)
    }

    async fn put_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        let letter = letter.capped();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .hset(self.dlq_key("entries"), &letter.id, encode(&letter))
            .ignore()
            .cmd("ZADD")
            .arg(self.dlq_key("order"))
            .arg("NX")
            .arg(letter.dead_lettered_at)
            .arg(&letter.id)
            .ignore();
        pipe.query_async::<()>(&mut self.conn.clone()).await.map_err(redis_err("archiving a dead letter"))
    }

    async fn trim_dead_letters(&self, before: u64, max_entries: u64, max: usize) -> Result<usize, StoreError> {
        self.trim_dead_letters
            .key(self.dlq_key("entries"))
            .key(self.dlq_key("order"))
            .arg(before)
            .arg(max_entries)
            .arg(max)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("trimming dead letters"))
    }

    async fn dead_letters(&self, limit: usize, cursor: Option<&str>) -> Result<DeadLetterPage, StoreError> {
        let cursor = cursor.map(parse_cursor).transpose()?;
        let rows =
            self.range_after(&self.dlq_key("order"), cursor, 0, limit + 1 + usize::from(cursor.is_some())).await?;
        let more = rows.len() > limit;
        let mut entries = Vec::new();
        for (id, _) in rows.into_iter().take(limit) {
            if let Some(letter) = self.dead_letter(&id).await? {
                entries.push(letter);
            }
        }
        let next_cursor = more.then(|| entries.last().map(|e| make_cursor(e.dead_lettered_at, &e.id))).flatten();
        Ok(DeadLetterPage { entries, next_cursor })
    }

    async fn dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, StoreError> {
        let json: Option<Vec<u8>> =
            self.conn.clone().hget(self.dlq_key("entries"), id).await.map_err(redis_err("reading a dead letter"))?;
        json.map(|j| decode("dead letter", id, &j)).transpose()
    }

    async fn remove_dead_letter(&self, id: &str) -> Result<bool, StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic().hdel(self.dlq_key("entries"), id).zrem(self.dlq_key("order"), id).ignore();
        let (removed,): (u32,) =
            pipe.query_async(&mut self.conn.clone()).await.map_err(redis_err("removing a dead letter"))?;
        Ok(removed == 1)
    }

    async fn count_dead_letters(&self) -> Result<u64, StoreError> {
        self.conn.clone().zcard(self.dlq_key("order")).await.map_err(redis_err("counting dead letters"))
    }

    async fn referenced_blobs(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.exists(self.blob_key(key));
        }
        pipe.query_async(&mut self.conn.clone()).await.map_err(redis_err("reading blob references"))
    }

    async fn take_released_blobs(&self, max: usize) -> Result<Vec<String>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        redis::cmd("SPOP")
            .arg(self.index_key("released_blobs"))
            .arg(max)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("taking released blobs"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use imagepipe_contracts::{ImageSource, SubmitTask, TraceId};

    use super::*;
    use crate::machine;
    use crate::store::suite;

    /// Any fixed time, Unix ms.
    const T0: u64 = 1_763_800_000_000;

    pub(crate) const URL: &str = "redis://127.0.0.1:6379";

    /// Deletes every key of a test's prefix when dropped.
    pub(crate) struct Cleanup(pub(crate) String);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let Ok(mut conn) = redis::Client::open(URL).and_then(|c| c.get_connection()) else { return };
            let keys: Vec<String> =
                redis::cmd("KEYS").arg(format!("{}:*", self.0)).query(&mut conn).unwrap_or_default();
            if !keys.is_empty() {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
            }
        }
    }

    pub(crate) fn unique_prefix(name: &str) -> String {
        format!("test-coord-{name}-{}", uuid::Uuid::new_v4().simple())
    }

    async fn make(name: &'static str) -> (RedisStore, Cleanup) {
        let prefix = unique_prefix(name);
        (RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap(), Cleanup(prefix))
    }

    crate::store_suite!(make);

    /// Timings of listings at 100,000 tasks: `cargo nextest run --all-features -p
    /// imagepipe-coordinator --run-ignored only --no-capture -E 'test(listing_timings)'`.
    #[tokio::test]
    #[ignore = "a timing, not a check: run by hand"]
    async fn listing_timings_at_100_000_tasks() {
        let (store, _cleanup) = make("timings").await;
        let timings = suite::time_listings(&store, 100_000).await;
        assert!(timings[0].1 < 50.0, "{timings:?}");
    }

    #[tokio::test]
    async fn survives_a_reconnect() {
        let prefix = unique_prefix("reconnect");
        let _cleanup = Cleanup(prefix.clone());
        let id =
            suite::write_a_started_task(&RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap()).await;
        let again = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap();
        suite::check_a_started_task(&again, &id).await;
    }

    #[tokio::test]
    async fn every_key_of_a_task_shares_its_hash_slot() {
        let (store, _cleanup) = make("slots").await;
        let slot = |key: &str| {
            let tag = key.split_once('{').and_then(|(_, rest)| rest.split_once('}')).map(|(t, _)| t.to_owned());
            tag.unwrap_or_else(|| key.to_owned())
        };
        let id = "tsk_01J";
        assert_eq!(slot(&store.task_key(id)), id);
        assert_eq!(slot(&store.history_key(id)), id);
        assert_eq!(slot(&store.legacy_history_key(id)), id);
        assert_eq!(slot(&store.outbox_key(id)), id);
        assert_eq!(slot(&store.index_key("due")), slot(&store.index_key("claimed")));
        assert_eq!(slot(&store.state_key(TaskState::Queued)), slot(&store.index_key("all")));
    }

    #[tokio::test]
    async fn the_in_flight_set_of_an_older_store_is_built_at_connect() {
        let prefix = unique_prefix("in-flight");
        let _cleanup = Cleanup(prefix.clone());
        let store = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap();
        suite::write_a_started_task(&store).await;
        let () = store.conn.clone().del(store.index_key("in_flight")).await.unwrap();
        assert_eq!(store.count_in_flight().await.unwrap(), 0);
        let again = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap();
        assert_eq!(again.count_in_flight().await.unwrap(), 1);
    }

    #[tokio::test]
    async fn a_transition_loads_its_script_when_the_server_lost_it() {
        let (store, _cleanup) = make("noscript").await;
        let created = machine::create(
            "tsk_noscript".into(),
            &SubmitTask::url("https://example.com/a.jpg"),
            ImageSource::Url("https://example.com/a.jpg".into()),
            TraceId::random(),
            T0,
        );
        assert_eq!(store.create(&created).await.unwrap(), Created::New);
        let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut store.conn.clone()).await.unwrap();
        let ctx = machine::Context { now: T0 + 1, seed: 0, ..machine::Context::default() };
        let machine::Verdict::Apply(start) =
            machine::decide(&created.task, &machine::Input::Start, &ctx, &machine::Policy::default()).unwrap()
        else {
            panic!("a queued task starts")
        };
        assert_eq!(store.apply(&start).await.unwrap(), Applied::Yes);
        assert_eq!(store.get("tsk_noscript").await.unwrap().unwrap().state, TaskState::Downloading);
    }

    #[tokio::test]
    async fn an_expired_task_leaves_no_key_behind() {
        let (store, _cleanup) = make("expired").await;
        suite::expire_the_only_task(&store).await;
        let mut keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("{}:*", store.prefix)).query_async(&mut store.conn.clone()).await.unwrap();
        keys.sort();
        // The store's own marker, and the task's blobs, released for the blob sweeper.
        assert_eq!(keys, [store.index_key("blob_refs_built"), store.index_key("released_blobs")]);
        assert!(!store.take_released_blobs(10).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn tasks_written_before_blob_references_were_kept_keep_their_blobs() {
        let (store, _cleanup) = make("legacy-blobs").await;
        let keys = suite::write_a_blob_task(&store).await;
        let mut conn = store.conn.clone();
        let mut dropped = vec![store.index_key("blob_refs_built"), store.task_blobs_key("tsk_blob_legacy")];
        dropped.extend(keys.iter().map(|k| store.blob_key(k)));
        let () = conn.del(&dropped).await.unwrap();
        assert_eq!(store.referenced_blobs(&[keys[0].as_str()]).await.unwrap(), [false]);
        let again = RedisStore::connect(URL, &store.prefix, suite::RELAY_GRACE).await.unwrap();
        suite::check_blobs_referenced(&again, &keys).await;
    }

    #[tokio::test]
    async fn tasks_finished_before_the_finished_set_was_kept_expire_too() {
        let (store, _cleanup) = make("legacy").await;
        suite::write_a_cancelled_task(&store).await;
        let () = store.conn.clone().del(store.index_key("finished")).await.unwrap();
        let again = RedisStore::connect(URL, &store.prefix, suite::RELAY_GRACE).await.unwrap();
        suite::check_the_cancelled_task_expires(&again).await;
    }

    #[tokio::test]
    async fn history_an_older_store_wrote_as_a_stream_is_read_first_and_expires_too() {
        let (store, _cleanup) = make("legacy-history").await;
        let created = machine::create(
            "tsk_stream".into(),
            &SubmitTask::url("https://example.com/a.jpg"),
            ImageSource::Url("https://example.com/a.jpg".into()),
            TraceId::random(),
            T0,
        );
        store.create(&created).await.unwrap();
        let mut conn = store.conn.clone();
        let first: Vec<u8> = conn.lpop(store.history_key("tsk_stream"), None).await.unwrap();
        let () = redis::cmd("XADD")
            .arg(store.legacy_history_key("tsk_stream"))
            .arg("1-0")
            .arg("entry")
            .arg(first)
            .query_async(&mut conn)
            .await
            .unwrap();
        let ctx = machine::Context { now: T0 + 1, seed: 0, ..machine::Context::default() };
        let cancel = machine::Input::Cancel { reason: None };
        let machine::Verdict::Apply(cancelled) =
            machine::decide(&created.task, &cancel, &ctx, &machine::Policy::default()).unwrap()
        else {
            panic!("a queued task is cancelled")
        };
        assert_eq!(store.apply(&cancelled).await.unwrap(), Applied::Yes);
        let versions: Vec<_> = store.history("tsk_stream").await.unwrap().iter().map(|h| h.version).collect();
        assert_eq!(versions, [1, 2]);

        assert_eq!(store.expire_finished(T0 + 1, 10).await.unwrap(), 1);
        let keys: Vec<String> =
            redis::cmd("KEYS").arg(format!("{}:*tsk_stream*", store.prefix)).query_async(&mut conn).await.unwrap();
        assert!(keys.is_empty(), "left behind: {keys:?}");
    }

    #[tokio::test]
    async fn a_prefix_with_braces_is_refused() {
        assert!(RedisStore::connect(URL, "a{b}", suite::RELAY_GRACE).await.is_err());
    }
}
