//! The embedded store: one redb file, every transition one write transaction.
//!
//! For one coordinator process (`imagepipe run`): redb allows one writer at a time, and the
//! file survives restarts. The wake index has the same semantics as the Redis store's, so the
//! same suite runs against both. Finished tasks are indexed by the time of their last
//! transition (`finished`), and [`TaskStore::expire_finished`] deletes the old ones in batches,
//! each batch one write transaction. The blob reference index is two tables, `blob_refs`
//! (`<blob key>\0<task id>`) and `task_blobs` (`<task id>\0<blob key>`), and the keys its
//! expiries released wait in `released_blobs`.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::error_chain;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, WriteTransaction,
};

use super::{
    Applied, Created, DeadLetter, DeadLetterPage, ListOrder, ListQuery, Listing, Settled, StoreError, TaskPage,
    TaskStore, blob_keys, decode, encode, make_cursor, parse_cursor, wake_at,
};
use crate::machine::Decision;
use crate::task::{HistoryEntry, OutboxEntry, Task, TaskState};

const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
const HISTORY: TableDefinition<&str, &[u8]> = TableDefinition::new("history");
const OUTBOX: TableDefinition<&str, &[u8]> = TableDefinition::new("outbox");
const IDEMPOTENCY: TableDefinition<&str, &str> = TableDefinition::new("idempotency");
const BY_STATE: TableDefinition<&str, ()> = TableDefinition::new("by_state");
const BY_CREATION: TableDefinition<&str, ()> = TableDefinition::new("by_creation");
const DUE: TableDefinition<&str, u64> = TableDefinition::new("due");
const DUE_ORDER: TableDefinition<&str, ()> = TableDefinition::new("due_order");
const CLAIMED: TableDefinition<&str, u64> = TableDefinition::new("claimed");
const CLAIMED_ORDER: TableDefinition<&str, ()> = TableDefinition::new("claimed_order");
const DEAD_LETTERS: TableDefinition<&str, &[u8]> = TableDefinition::new("dead_letters");
const DEAD_LETTER_ORDER: TableDefinition<&str, ()> = TableDefinition::new("dead_letter_order");
/// Finished tasks: `<last transition, 20 digits>\0<id>`.
const FINISHED: TableDefinition<&str, ()> = TableDefinition::new("finished");
/// The tasks that reference a blob: `<blob key>\0<task id>`.
const BLOB_REFS: TableDefinition<&str, ()> = TableDefinition::new("blob_refs");
/// The blobs a task references: `<task id>\0<blob key>`.
const TASK_BLOBS: TableDefinition<&str, ()> = TableDefinition::new("task_blobs");
/// Blob keys whose last referencing task expired, for the blob sweeper.
const RELEASED_BLOBS: TableDefinition<&str, ()> = TableDefinition::new("released_blobs");

/// Separates the parts of a composite key; ids never contain it.
const SEP: char = '\u{0}';
/// One past [`SEP`]: the upper bound of a key prefix.
const SEP_END: char = '\u{1}';

/// File-backed store for a single coordinator process.
#[derive(Clone)]
pub struct EmbeddedStore {
    db: EmbeddedDb,
    relay_grace: Duration,
}

impl EmbeddedStore {
    /// Opens (creating if new) the store in directory `dir`: its file `coordinator.redb`.
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
            index_finished_tasks(&txn)?;
            index_blob_references(&txn)?;
        }
        txn.commit().map_err(|e| err("opening", e))?;
        Ok(Self { db, relay_grace })
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

fn key2(a: &str, b: &str) -> String {
    format!("{a}{SEP}{b}")
}

fn at_key(at: u64, id: &str) -> String {
    format!("{at:020}{SEP}{id}")
}

fn state_key(state: TaskState, index_at: u64, id: &str) -> String {
    format!("{}{SEP}{}", state.as_str(), at_key(index_at, id))
}

fn id_of(composite: &str) -> &str {
    composite.rsplit(SEP).next().unwrap_or(composite)
}

fn at_of(composite: &str) -> u64 {
    composite.split(SEP).next().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Keys of `table` starting with `prefix` + [`SEP`].
fn prefixed<V: redb::Value + 'static>(
    table: &impl ReadableTable<&'static str, V>,
    prefix: &str,
) -> Result<Vec<String>, StoreError> {
    let lo = format!("{prefix}{SEP}");
    let hi = format!("{prefix}{SEP_END}");
    let mut keys = Vec::new();
    for row in table.range(lo.as_str()..hi.as_str()).map_err(|e| err("reading", e))? {
        let (k, _) = row.map_err(|e| err("reading", e))?;
        keys.push(k.value().to_owned());
    }
    Ok(keys)
}

fn write<T>(
    db: &Database,
    operation: &'static str,
    f: impl FnOnce(&WriteTransaction) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let txn = db.begin_write().map_err(|e| err(operation, e))?;
    let value = f(&txn)?;
    txn.commit().map_err(|e| err(operation, e))?;
    Ok(value)
}

fn read_task(table: &impl ReadableTable<&'static str, &'static [u8]>, id: &str) -> Result<Option<Task>, StoreError> {
    match table.get(id).map_err(|e| err("reading a task", e))? {
        Some(bytes) => decode("task", id, bytes.value()).map(Some),
        None => Ok(None),
    }
}

/// Adds `id` to the due index at `at`, unless it is already due earlier (Redis `ZADD LT`).
fn due_add_lt(txn: &WriteTransaction, id: &str, at: u64) -> Result<(), StoreError> {
    let mut due = txn.open_table(DUE).map_err(|e| err("indexing", e))?;
    let mut order = txn.open_table(DUE_ORDER).map_err(|e| err("indexing", e))?;
    let current = due.get(id).map_err(|e| err("indexing", e))?.map(|v| v.value());
    if current.is_some_and(|c| c <= at) {
        return Ok(());
    }
    if let Some(c) = current {
        order.remove(at_key(c, id).as_str()).map_err(|e| err("indexing", e))?;
    }
    due.insert(id, at).map_err(|e| err("indexing", e))?;
    order.insert(at_key(at, id).as_str(), ()).map_err(|e| err("indexing", e))?;
    Ok(())
}

fn write_transition(
    txn: &WriteTransaction,
    decision: &Decision,
    previous: Option<&Task>,
    grace: Duration,
) -> Result<(), StoreError> {
    let task = &decision.task;
    let mut tasks = txn.open_table(TASKS).map_err(|e| err("writing a task", e))?;
    tasks.insert(task.id.as_str(), encode(task).as_bytes()).map_err(|e| err("writing a task", e))?;
    let mut history = txn.open_table(HISTORY).map_err(|e| err("writing history", e))?;
    let hkey = key2(&task.id, &format!("{:020}", decision.history.version));
    history.insert(hkey.as_str(), encode(&decision.history).as_bytes()).map_err(|e| err("writing history", e))?;
    let mut outbox = txn.open_table(OUTBOX).map_err(|e| err("writing the outbox", e))?;
    for entry in &decision.outbox {
        let okey = key2(&task.id, &entry.id);
        outbox.insert(okey.as_str(), encode(entry).as_bytes()).map_err(|e| err("writing the outbox", e))?;
    }
    let mut by_state = txn.open_table(BY_STATE).map_err(|e| err("indexing", e))?;
    if let Some(previous) = previous {
        by_state
            .remove(state_key(previous.state, previous.index_at(), &previous.id).as_str())
            .map_err(|e| err("indexing", e))?;
    } else {
        let mut by_creation = txn.open_table(BY_CREATION).map_err(|e| err("indexing", e))?;
        by_creation.insert(at_key(task.created_at, &task.id).as_str(), ()).map_err(|e| err("indexing", e))?;
    }
    by_state.insert(state_key(task.state, task.index_at(), &task.id).as_str(), ()).map_err(|e| err("indexing", e))?;
    if task.state.is_terminal() {
        let mut finished = txn.open_table(FINISHED).map_err(|e| err("indexing", e))?;
        finished.insert(at_key(task.updated_at, &task.id).as_str(), ()).map_err(|e| err("indexing", e))?;
    }
    drop((tasks, history, outbox, by_state));
    let known = previous.map(blob_keys).unwrap_or_default();
    let added: Vec<&str> = blob_keys(task).into_iter().filter(|k| !known.contains(k)).collect();
    reference_blobs(txn, &task.id, &added)?;
    if let Some(at) = wake_at(task, !decision.outbox.is_empty(), decision.history.at, grace) {
        due_add_lt(txn, &task.id, at)?;
    }
    Ok(())
}

/// Fills the finished index from the terminal states' entries when it is empty (a store
/// written before it was kept), so that tasks finished back then expire too.
fn index_finished_tasks(txn: &WriteTransaction) -> Result<(), StoreError> {
    let op = "indexing finished tasks";
    let mut finished = txn.open_table(FINISHED).map_err(|e| err(op, e))?;
    if !finished.is_empty().map_err(|e| err(op, e))? {
        return Ok(());
    }
    let by_state = txn.open_table(BY_STATE).map_err(|e| err(op, e))?;
    let tasks = txn.open_table(TASKS).map_err(|e| err(op, e))?;
    for state in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
        for key in prefixed(&by_state, state.as_str())? {
            if let Some(task) = read_task(&tasks, id_of(&key))? {
                finished.insert(at_key(task.updated_at, &task.id).as_str(), ()).map_err(|e| err(op, e))?;
            }
        }
    }
    Ok(())
}

/// Records that task `id` references the blobs `keys`.
fn reference_blobs(txn: &WriteTransaction, id: &str, keys: &[&str]) -> Result<(), StoreError> {
    if keys.is_empty() {
        return Ok(());
    }
    let op = "indexing blob references";
    let mut refs = txn.open_table(BLOB_REFS).map_err(|e| err(op, e))?;
    let mut of_task = txn.open_table(TASK_BLOBS).map_err(|e| err(op, e))?;
    for key in keys {
        refs.insert(key2(key, id).as_str(), ()).map_err(|e| err(op, e))?;
        of_task.insert(key2(id, key).as_str(), ()).map_err(|e| err(op, e))?;
    }
    Ok(())
}

/// Fills the blob reference index from the tasks when it is empty (a store written before it
/// was kept), so that no blob of a task written back then looks unreferenced.
fn index_blob_references(txn: &WriteTransaction) -> Result<(), StoreError> {
    let op = "indexing blob references";
    if !txn.open_table(BLOB_REFS).map_err(|e| err(op, e))?.is_empty().map_err(|e| err(op, e))? {
        return Ok(());
    }
    let tasks: Vec<Task> = {
        let table = txn.open_table(TASKS).map_err(|e| err(op, e))?;
        let mut tasks = Vec::new();
        for row in table.iter().map_err(|e| err(op, e))? {
            let (id, json) = row.map_err(|e| err(op, e))?;
            tasks.push(decode("task", id.value(), json.value())?);
        }
        tasks
    };
    for task in &tasks {
        reference_blobs(txn, &task.id, &blob_keys(task).into_iter().collect::<Vec<_>>())?;
    }
    Ok(())
}

/// Drops the blob references of task `id`; the blobs no task references any more are released.
fn unreference_blobs(txn: &WriteTransaction, id: &str) -> Result<(), StoreError> {
    let op = "expiring a task";
    let mut of_task = txn.open_table(TASK_BLOBS).map_err(|e| err(op, e))?;
    let mut refs = txn.open_table(BLOB_REFS).map_err(|e| err(op, e))?;
    let mut released = txn.open_table(RELEASED_BLOBS).map_err(|e| err(op, e))?;
    for entry in prefixed(&of_task, id)? {
        of_task.remove(entry.as_str()).map_err(|e| err(op, e))?;
        let key = id_of(&entry);
        refs.remove(key2(key, id).as_str()).map_err(|e| err(op, e))?;
        let lo = format!("{key}{SEP}");
        let hi = format!("{key}{SEP_END}");
        if refs.range(lo.as_str()..hi.as_str()).map_err(|e| err(op, e))?.next().is_none() {
            released.insert(key, ()).map_err(|e| err(op, e))?;
        }
    }
    Ok(())
}

/// Deletes every row of finished `task` but its finished entry.
fn forget_task(txn: &WriteTransaction, task: &Task) -> Result<(), StoreError> {
    let op = "expiring a task";
    let id = task.id.as_str();
    txn.open_table(TASKS).map_err(|e| err(op, e))?.remove(id).map_err(|e| err(op, e))?;
    unreference_blobs(txn, id)?;
    for table in [HISTORY, OUTBOX] {
        let mut table = txn.open_table(table).map_err(|e| err(op, e))?;
        for key in prefixed(&table, id)? {
            table.remove(key.as_str()).map_err(|e| err(op, e))?;
        }
    }
    if let Some(key) = &task.idempotency_key {
        let mut idem = txn.open_table(IDEMPOTENCY).map_err(|e| err(op, e))?;
        let owner = idem.get(key.as_str()).map_err(|e| err(op, e))?.map(|v| v.value() == id);
        if owner == Some(true) {
            idem.remove(key.as_str()).map_err(|e| err(op, e))?;
        }
    }
    let mut by_state = txn.open_table(BY_STATE).map_err(|e| err(op, e))?;
    by_state.remove(state_key(task.state, task.index_at(), id).as_str()).map_err(|e| err(op, e))?;
    let mut by_creation = txn.open_table(BY_CREATION).map_err(|e| err(op, e))?;
    by_creation.remove(at_key(task.created_at, id).as_str()).map_err(|e| err(op, e))?;
    for (times, order) in [(DUE, DUE_ORDER), (CLAIMED, CLAIMED_ORDER)] {
        let mut times = txn.open_table(times).map_err(|e| err(op, e))?;
        if let Some(at) = times.remove(id).map_err(|e| err(op, e))?.map(|v| v.value()) {
            txn.open_table(order).map_err(|e| err(op, e))?.remove(at_key(at, id).as_str()).map_err(|e| err(op, e))?;
        }
    }
    Ok(())
}

fn page_of_keys(
    keys: impl Iterator<Item = Result<String, StoreError>>,
    limit: usize,
) -> Result<(Vec<String>, bool), StoreError> {
    let mut out = Vec::new();
    for key in keys {
        if out.len() == limit {
            return Ok((out, true));
        }
        out.push(key?);
    }
    Ok((out, false))
}

fn range_keys<V: redb::Value + 'static>(
    table: &impl ReadableTable<&'static str, V>,
    lo: &str,
    hi: &str,
    limit: usize,
) -> Result<(Vec<String>, bool), StoreError> {
    let rows = table.range(lo..hi).map_err(|e| err("listing", e))?;
    page_of_keys(rows.map(|r| r.map(|(k, _)| k.value().to_owned()).map_err(|e| err("listing", e))), limit)
}

#[async_trait]
impl TaskStore for EmbeddedStore {
    async fn create(&self, decision: &Decision) -> Result<Created, StoreError> {
        let decision = decision.clone();
        self.run("creating a task", move |db, grace| {
            write(db, "creating a task", |txn| {
                let task = &decision.task;
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
        let query = query.clone();
        self.run("listing tasks", move |db, _| {
            let op = "listing tasks";
            let mut listing = Listing::new(&query)?;
            let Some((lo, hi)) = listing.range() else { return Ok(listing.finish()) };
            let prefix = query.state.map_or_else(String::new, |s| format!("{}{SEP}", s.as_str()));
            let mut from = format!("{prefix}{lo:020}");
            let mut until = format!("{prefix}{hi:020}{SEP_END}");
            if let Some((at, id)) = listing.cursor() {
                match query.order {
                    ListOrder::Oldest => from = from.max(format!("{prefix}{}{SEP_END}", at_key(at, id))),
                    ListOrder::Newest => until = until.min(format!("{prefix}{}", at_key(at, id))),
                }
            }
            if from >= until {
                return Ok(listing.finish());
            }
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            let index =
                txn.open_table(if query.state.is_some() { BY_STATE } else { BY_CREATION }).map_err(|e| err(op, e))?;
            let tasks = txn.open_table(TASKS).map_err(|e| err(op, e))?;
            let rows = index.range(from.as_str()..until.as_str()).map_err(|e| err(op, e))?;
            let rows: Box<dyn Iterator<Item = _>> =
                if query.order == ListOrder::Newest { Box::new(rows.rev()) } else { Box::new(rows) };
            for row in rows {
                let (key, _) = row.map_err(|e| err(op, e))?;
                let entry = &key.value()[prefix.len()..];
                let id = id_of(entry);
                let task = match tasks.get(id).map_err(|e| err(op, e))? {
                    Some(json) if listing.may_match(json.value()) => Some(decode("task", id, json.value())?),
                    _ => None,
                };
                if !listing.offer(at_of(entry), id, task) {
                    break;
                }
            }
            Ok(listing.finish())
        })
        .await
    }

    async fn count_in_flight(&self) -> Result<u64, StoreError> {
        self.run("counting tasks", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("counting tasks", e))?;
            let table = txn.open_table(BY_STATE).map_err(|e| err("counting tasks", e))?;
            let mut n = 0;
            for state in TaskState::IN_FLIGHT {
                let (lo, hi) = (format!("{}{SEP}", state.as_str()), format!("{}{SEP_END}", state.as_str()));
                n += table.range(lo.as_str()..hi.as_str()).map_err(|e| err("counting tasks", e))?.count() as u64;
            }
            Ok(n)
        })
        .await
    }

    async fn count_queued(&self) -> Result<u64, StoreError> {
        self.run("counting tasks", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("counting tasks", e))?;
            let table = txn.open_table(BY_STATE).map_err(|e| err("counting tasks", e))?;
            let queued = TaskState::Queued.as_str();
            let (lo, hi) = (format!("{queued}{SEP}"), format!("{queued}{SEP_END}"));
            Ok(table.range(lo.as_str()..hi.as_str()).map_err(|e| err("counting tasks", e))?.count() as u64)
        })
        .await
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
        let until = now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
        self.run("claiming due tasks", move |db, _| {
            write(db, "claiming due tasks", |txn| {
                let op = "claiming due tasks";
                let hi = format!("{now:020}{SEP_END}");
                {
                    let mut claimed = txn.open_table(CLAIMED).map_err(|e| err(op, e))?;
                    let mut claimed_order = txn.open_table(CLAIMED_ORDER).map_err(|e| err(op, e))?;
                    let (expired, _) = range_keys(&claimed_order, "", &hi, usize::MAX)?;
                    for key in expired {
                        claimed_order.remove(key.as_str()).map_err(|e| err(op, e))?;
                        claimed.remove(id_of(&key)).map_err(|e| err(op, e))?;
                        due_add_lt(txn, id_of(&key), now)?;
                    }
                }
                let mut due = txn.open_table(DUE).map_err(|e| err(op, e))?;
                let mut due_order = txn.open_table(DUE_ORDER).map_err(|e| err(op, e))?;
                let mut claimed = txn.open_table(CLAIMED).map_err(|e| err(op, e))?;
                let mut claimed_order = txn.open_table(CLAIMED_ORDER).map_err(|e| err(op, e))?;
                let (keys, _) = range_keys(&due_order, "", &hi, max)?;
                let mut ids = Vec::with_capacity(keys.len());
                for key in keys {
                    let id = id_of(&key).to_owned();
                    due_order.remove(key.as_str()).map_err(|e| err(op, e))?;
                    due.remove(id.as_str()).map_err(|e| err(op, e))?;
                    if let Some(old) = claimed.insert(id.as_str(), until).map_err(|e| err(op, e))?.map(|v| v.value()) {
                        claimed_order.remove(at_key(old, &id).as_str()).map_err(|e| err(op, e))?;
                    }
                    claimed_order.insert(at_key(until, &id).as_str(), ()).map_err(|e| err(op, e))?;
                    ids.push(id);
                }
                Ok(ids)
            })
        })
        .await
    }

    async fn release(&self, id: &str, now: u64) -> Result<(), StoreError> {
        let id = id.to_owned();
        self.run("releasing a task", move |db, grace| {
            write(db, "releasing a task", |txn| {
                let op = "releasing a task";
                {
                    let mut claimed = txn.open_table(CLAIMED).map_err(|e| err(op, e))?;
                    if let Some(lease) = claimed.remove(id.as_str()).map_err(|e| err(op, e))?.map(|v| v.value()) {
                        let mut order = txn.open_table(CLAIMED_ORDER).map_err(|e| err(op, e))?;
                        order.remove(at_key(lease, &id).as_str()).map_err(|e| err(op, e))?;
                    }
                }
                let task = read_task(&txn.open_table(TASKS).map_err(|e| err(op, e))?, &id)?;
                let has_outbox = !prefixed(&txn.open_table(OUTBOX).map_err(|e| err(op, e))?, &id)?.is_empty();
                if let Some(at) = task.and_then(|t| wake_at(&t, has_outbox, now, grace)) {
                    due_add_lt(txn, &id, at)?;
                }
                Ok(())
            })
        })
        .await
    }

    async fn expire_finished(&self, before: u64, max: usize) -> Result<usize, StoreError> {
        self.run("expiring finished tasks", move |db, _| {
            write(db, "expiring finished tasks", |txn| {
                let op = "expiring finished tasks";
                let (keys, _) = {
                    let finished = txn.open_table(FINISHED).map_err(|e| err(op, e))?;
                    range_keys(&finished, "", &format!("{before:020}{SEP_END}"), max)?
                };
                let mut expired = 0;
                for key in keys {
                    txn.open_table(FINISHED).map_err(|e| err(op, e))?.remove(key.as_str()).map_err(|e| err(op, e))?;
                    let task = read_task(&txn.open_table(TASKS).map_err(|e| err(op, e))?, id_of(&key))?;
                    if let Some(task) = task.filter(|t| t.state.is_terminal()) {
                        forget_task(txn, &task)?;
                        expired += 1;
                    }
                }
                Ok(expired)
            })
        })
        .await
    }

    async fn put_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError> {
        let letter = letter.capped().into_owned();
        self.run("archiving a dead letter", move |db, _| {
            write(db, "archiving a dead letter", |txn| {
                let op = "archiving a dead letter";
                let mut table = txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?;
                let previous =
                    table.insert(letter.id.as_str(), encode(&letter).as_bytes()).map_err(|e| err(op, e))?.is_some();
                if !previous {
                    let mut order = txn.open_table(DEAD_LETTER_ORDER).map_err(|e| err(op, e))?;
                    order.insert(at_key(letter.dead_lettered_at, &letter.id).as_str(), ()).map_err(|e| err(op, e))?;
                }
                Ok(())
            })
        })
        .await
    }

    async fn trim_dead_letters(&self, before: u64, max_entries: u64, max: usize) -> Result<usize, StoreError> {
        self.run("trimming dead letters", move |db, _| {
            write(db, "trimming dead letters", |txn| {
                let op = "trimming dead letters";
                let mut order = txn.open_table(DEAD_LETTER_ORDER).map_err(|e| err(op, e))?;
                let (mut doomed, _) = range_keys(&order, "", &format!("{before:020}{SEP_END}"), max)?;
                let count = order.len().map_err(|e| err(op, e))?;
                let excess = count.saturating_sub(doomed.len() as u64).saturating_sub(max_entries);
                let room = max.saturating_sub(doomed.len());
                if excess > 0 && room > 0 {
                    let take = room.min(usize::try_from(excess).unwrap_or(usize::MAX));
                    let (oldest, _) = range_keys(&order, "", "\u{10ffff}", doomed.len() + take)?;
                    doomed = oldest;
                }
                let mut letters = txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?;
                for key in &doomed {
                    order.remove(key.as_str()).map_err(|e| err(op, e))?;
                    letters.remove(id_of(key)).map_err(|e| err(op, e))?;
                }
                Ok(doomed.len())
            })
        })
        .await
    }

    async fn dead_letters(&self, limit: usize, cursor: Option<&str>) -> Result<DeadLetterPage, StoreError> {
        let after = match cursor {
            Some(c) => {
                let (at, id) = parse_cursor(c)?;
                format!("{}{SEP_END}", at_key(at, id))
            }
            None => String::new(),
        };
        self.run("listing dead letters", move |db, _| {
            let op = "listing dead letters";
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            let order = txn.open_table(DEAD_LETTER_ORDER).map_err(|e| err(op, e))?;
            let table = txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?;
            let (keys, more) = range_keys(&order, &after, "\u{10ffff}", limit)?;
            let mut entries = Vec::with_capacity(keys.len());
            for key in &keys {
                if let Some(bytes) = table.get(id_of(key)).map_err(|e| err(op, e))? {
                    entries.push(decode::<DeadLetter>("dead letter", id_of(key), bytes.value())?);
                }
            }
            let next_cursor = more.then(|| keys.last().map(|k| make_cursor(at_of(k), id_of(k)))).flatten();
            Ok(DeadLetterPage { entries, next_cursor })
        })
        .await
    }

    async fn dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, StoreError> {
        let id = id.to_owned();
        self.run("reading a dead letter", move |db, _| {
            let txn = db.begin_read().map_err(|e| err("reading a dead letter", e))?;
            let table = txn.open_table(DEAD_LETTERS).map_err(|e| err("reading a dead letter", e))?;
            match table.get(id.as_str()).map_err(|e| err("reading a dead letter", e))? {
                Some(bytes) => decode("dead letter", &id, bytes.value()).map(Some),
                None => Ok(None),
            }
        })
        .await
    }

    async fn remove_dead_letter(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.run("removing a dead letter", move |db, _| {
            write(db, "removing a dead letter", |txn| {
                let op = "removing a dead letter";
                let mut table = txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?;
                let Some(bytes) = table.remove(id.as_str()).map_err(|e| err(op, e))? else { return Ok(false) };
                let letter: DeadLetter = decode("dead letter", &id, bytes.value())?;
                drop(bytes);
                let mut order = txn.open_table(DEAD_LETTER_ORDER).map_err(|e| err(op, e))?;
                order.remove(at_key(letter.dead_lettered_at, &id).as_str()).map_err(|e| err(op, e))?;
                Ok(true)
            })
        })
        .await
    }

    async fn count_dead_letters(&self) -> Result<u64, StoreError> {
        self.run("counting dead letters", |db, _| {
            let op = "counting dead letters";
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            txn.open_table(DEAD_LETTERS).map_err(|e| err(op, e))?.len().map_err(|e| err(op, e))
        })
        .await
    }

    async fn referenced_blobs(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
        self.run("reading blob references", move |db, _| {
            let op = "reading blob references";
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            let refs = txn.open_table(BLOB_REFS).map_err(|e| err(op, e))?;
            keys.iter()
                .map(|key| {
                    let (lo, hi) = (format!("{key}{SEP}"), format!("{key}{SEP_END}"));
                    Ok(refs.range(lo.as_str()..hi.as_str()).map_err(|e| err(op, e))?.next().is_some())
                })
                .collect()
        })
        .await
    }

    async fn take_released_blobs(&self, max: usize) -> Result<Vec<String>, StoreError> {
        self.run("taking released blobs", move |db, _| {
            write(db, "taking released blobs", |txn| {
                let op = "taking released blobs";
                let mut released = txn.open_table(RELEASED_BLOBS).map_err(|e| err(op, e))?;
                let (keys, _) = range_keys(&released, "", "\u{7f}", max)?;
                for key in &keys {
                    released.remove(key.as_str()).map_err(|e| err(op, e))?;
                }
                Ok(keys)
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use redb::TableHandle;

    use super::*;
    use crate::store::suite;

    async fn make(_name: &'static str) -> (EmbeddedStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        (EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap(), dir)
    }

    crate::store_suite!(make);

    #[tokio::test]
    async fn an_expired_task_leaves_no_row_behind() {
        let (store, _dir) = make("expired").await;
        suite::expire_the_only_task(&store).await;
        let txn = store.db.database().begin_read().unwrap();
        let mut rows = Vec::new();
        for table in [TASKS, HISTORY, OUTBOX, DEAD_LETTERS] {
            rows.push((table.name().to_owned(), txn.open_table(table).unwrap().len().unwrap()));
        }
        for table in
            [BY_STATE, BY_CREATION, DUE_ORDER, CLAIMED_ORDER, DEAD_LETTER_ORDER, FINISHED, BLOB_REFS, TASK_BLOBS]
        {
            rows.push((table.name().to_owned(), txn.open_table(table).unwrap().len().unwrap()));
        }
        for table in [DUE, CLAIMED] {
            rows.push((table.name().to_owned(), txn.open_table(table).unwrap().len().unwrap()));
        }
        rows.push((IDEMPOTENCY.name().to_owned(), txn.open_table(IDEMPOTENCY).unwrap().len().unwrap()));
        assert!(rows.iter().all(|(_, n)| *n == 0), "rows left: {rows:?}");
    }

    #[tokio::test]
    async fn tasks_finished_before_the_finished_table_was_kept_expire_too() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
        suite::write_a_cancelled_task(&store).await;
        let txn = store.db.database().begin_write().unwrap();
        txn.delete_table(FINISHED).unwrap();
        txn.commit().unwrap();
        drop(store);
        let reopened = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
        suite::check_the_cancelled_task_expires(&reopened).await;
    }

    /// Timings of listings at 100,000 tasks: `cargo nextest run --all-features -p
    /// imagepipe-coordinator --run-ignored only --no-capture -E 'test(listing_timings)'`.
    #[tokio::test]
    #[ignore = "a timing, not a check: run by hand"]
    async fn listing_timings_at_100_000_tasks() {
        let (store, _dir) = make("timings").await;
        let timings = suite::time_listings(&store, 100_000).await;
        assert!(timings[0].1 < 50.0, "{timings:?}");
    }

    #[tokio::test]
    async fn tasks_written_before_blob_references_were_kept_keep_their_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let store = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
        let keys = suite::write_a_blob_task(&store).await;
        let txn = store.db.database().begin_write().unwrap();
        txn.delete_table(BLOB_REFS).unwrap();
        txn.delete_table(TASK_BLOBS).unwrap();
        txn.commit().unwrap();
        drop(store);
        let reopened = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
        suite::check_blobs_referenced(&reopened, &keys).await;
    }

    #[tokio::test]
    async fn survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let id = suite::write_a_started_task(&EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap()).await;
        let reopened = EmbeddedStore::open(dir.path(), suite::RELAY_GRACE).unwrap();
        suite::check_a_started_task(&reopened, &id).await;
    }
}
