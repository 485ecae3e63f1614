//! The blob reference index (`blob_refs`, `task_blobs`) and the released blobs.

use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

use super::tables::{BLOB_REFS, RELEASED_BLOBS, SEP, SEP_END, TASK_BLOBS, id_of, key2, prefixed, range_keys, write};
use super::{EmbeddedStore, err};
use crate::store::StoreError;

/// Records that task `id` references the blobs `keys`.
pub(super) fn reference_blobs(txn: &WriteTransaction, id: &str, keys: &[&str]) -> Result<(), StoreError> {
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

/// Drops the blob references of task `id`; the blobs no task references any more are released.
pub(super) fn unreference_blobs(txn: &WriteTransaction, id: &str) -> Result<(), StoreError> {
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

/// The store's [`TaskStore::referenced_blobs`](crate::store::TaskStore::referenced_blobs).
pub(super) async fn referenced(store: &EmbeddedStore, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
    let keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    store
        .run("reading blob references", move |db, _| {
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

/// The store's [`TaskStore::take_released_blobs`](crate::store::TaskStore::take_released_blobs).
pub(super) async fn take_released(store: &EmbeddedStore, max: usize) -> Result<Vec<String>, StoreError> {
    store
        .run("taking released blobs", move |db, _| {
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
