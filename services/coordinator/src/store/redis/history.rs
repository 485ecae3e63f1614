//! Reading a task's history: the stream and the list earlier versions kept, then the `hist`
//! field of the task hash (the lines [`TRANSITION`](super::scripts::TRANSITION) appends).

use super::{RedisStore, redis_err};
use crate::store::{StoreError, decode};
use crate::task::HistoryEntry;

/// The store's [`TaskStore::history`](crate::store::TaskStore::history): the legacy stream's
/// entries, the legacy list's, then the hash field's, oldest first.
pub(super) async fn read(store: &RedisStore, id: &str) -> Result<Vec<HistoryEntry>, StoreError> {
    let (legacy, listed, field): (redis::streams::StreamRangeReply, Vec<Vec<u8>>, Option<Vec<u8>>) = redis::pipe()
        .xrange_all(store.legacy_history_key(id))
        .lrange(store.history_key(id), 0, -1)
        .hget(store.task_key(id), "hist")
        .query_async(&mut store.conn.clone())
        .await
        .map_err(redis_err("reading history"))?;
    let legacy = legacy.ids.iter().map(|entry| {
        entry.get::<Vec<u8>>("entry").ok_or_else(|| StoreError::Corrupt {
            what: "history entry",
            id: format!("{id}/{}", entry.id),
            message: "has no `entry` field".into(),
        })
    });
    let mut entries = legacy
        .chain(listed.into_iter().map(Ok))
        .map(|json| decode("history entry", id, &json?))
        .collect::<Result<Vec<HistoryEntry>, _>>()?;
    if let Some(field) = field {
        append_lines(id, &field, &mut entries)?;
    }
    Ok(entries)
}

/// Appends to `entries` those of a `hist` field: one JSON entry per line; a line `=<JSON>` is an
/// entry written by the replica of the entry before it.
pub(super) fn append_lines(id: &str, field: &[u8], entries: &mut Vec<HistoryEntry>) -> Result<(), StoreError> {
    for line in field.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let entry = match line.strip_prefix(b"=") {
            Some(json) => {
                let replica = entries.last().and_then(|e| e.replica.clone());
                HistoryEntry { replica, ..decode("history entry", id, json)? }
            }
            None => decode("history entry", id, line)?,
        };
        entries.push(entry);
    }
    Ok(())
}
