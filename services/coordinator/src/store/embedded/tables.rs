//! The redb tables, the keys of their rows, and the helpers that read and write them.

use redb::{Database, ReadableTable, TableDefinition, WriteTransaction};

use super::err;
use crate::store::{StoreError, decode};
use crate::task::{Task, TaskState};

pub(super) const TASKS: TableDefinition<&str, &[u8]> = TableDefinition::new("tasks");
pub(super) const HISTORY: TableDefinition<&str, &[u8]> = TableDefinition::new("history");
pub(super) const OUTBOX: TableDefinition<&str, &[u8]> = TableDefinition::new("outbox");
pub(super) const IDEMPOTENCY: TableDefinition<&str, &str> = TableDefinition::new("idempotency");
pub(super) const BY_STATE: TableDefinition<&str, ()> = TableDefinition::new("by_state");
pub(super) const BY_CREATION: TableDefinition<&str, ()> = TableDefinition::new("by_creation");
pub(super) const DUE: TableDefinition<&str, u64> = TableDefinition::new("due");
pub(super) const DUE_ORDER: TableDefinition<&str, ()> = TableDefinition::new("due_order");
pub(super) const CLAIMED: TableDefinition<&str, u64> = TableDefinition::new("claimed");
pub(super) const CLAIMED_ORDER: TableDefinition<&str, ()> = TableDefinition::new("claimed_order");
pub(super) const DEAD_LETTERS: TableDefinition<&str, &[u8]> = TableDefinition::new("dead_letters");
pub(super) const DEAD_LETTER_ORDER: TableDefinition<&str, ()> = TableDefinition::new("dead_letter_order");
/// Finished tasks: `<last transition, 20 digits>\0<id>`.
pub(super) const FINISHED: TableDefinition<&str, ()> = TableDefinition::new("finished");
/// The tasks that reference a blob: `<blob key>\0<task id>`.
pub(super) const BLOB_REFS: TableDefinition<&str, ()> = TableDefinition::new("blob_refs");
/// The blobs a task references: `<task id>\0<blob key>`.
pub(super) const TASK_BLOBS: TableDefinition<&str, ()> = TableDefinition::new("task_blobs");
/// Blob keys whose last referencing task expired, for the blob sweeper.
pub(super) const RELEASED_BLOBS: TableDefinition<&str, ()> = TableDefinition::new("released_blobs");

/// The store's settings: `shards`, the pinned shard count.
pub(super) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The lease of each shard ever leased: shard → [`Lease`](crate::store::Lease) (JSON).
pub(super) const LEASES: TableDefinition<u16, &[u8]> = TableDefinition::new("leases");
/// The handover log: sequence number → [`Handover`](crate::store::Handover) (JSON), the newest
/// [`HANDOVERS_KEPT`](crate::store::HANDOVERS_KEPT).
pub(super) const HANDOVERS: TableDefinition<u64, &[u8]> = TableDefinition::new("handovers");

/// Separates the parts of a composite key; ids never contain it.
pub(super) const SEP: char = '\u{0}';
/// One past [`SEP`]: the upper bound of a key prefix.
pub(super) const SEP_END: char = '\u{1}';

pub(super) fn key2(a: &str, b: &str) -> String {
    format!("{a}{SEP}{b}")
}

pub(super) fn at_key(at: u64, id: &str) -> String {
    format!("{at:020}{SEP}{id}")
}

pub(super) fn state_key(state: TaskState, index_at: u64, id: &str) -> String {
    format!("{}{SEP}{}", state.as_str(), at_key(index_at, id))
}

pub(super) fn id_of(composite: &str) -> &str {
    composite.rsplit(SEP).next().unwrap_or(composite)
}

pub(super) fn at_of(composite: &str) -> u64 {
    composite.split(SEP).next().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Keys of `table` starting with `prefix` + [`SEP`].
pub(super) fn prefixed<V: redb::Value + 'static>(
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

pub(super) fn write<T>(
    db: &Database,
    operation: &'static str,
    f: impl FnOnce(&WriteTransaction) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let txn = db.begin_write().map_err(|e| err(operation, e))?;
    let value = f(&txn)?;
    txn.commit().map_err(|e| err(operation, e))?;
    Ok(value)
}

pub(super) fn read_task(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    id: &str,
) -> Result<Option<Task>, StoreError> {
    match table.get(id).map_err(|e| err("reading a task", e))? {
        Some(bytes) => decode("task", id, bytes.value()).map(Some),
        None => Ok(None),
    }
}

pub(super) fn page_of_keys(
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

pub(super) fn range_keys<V: redb::Value + 'static>(
    table: &impl ReadableTable<&'static str, V>,
    lo: &str,
    hi: &str,
    limit: usize,
) -> Result<(Vec<String>, bool), StoreError> {
    let rows = table.range(lo..hi).map_err(|e| err("listing", e))?;
    page_of_keys(rows.map(|r| r.map(|(k, _)| k.value().to_owned()).map_err(|e| err("listing", e))), limit)
}
