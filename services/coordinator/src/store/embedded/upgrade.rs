//! Indexes a store written by an older version does not have yet, filled at open.

use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use super::blobs::reference_blobs;
use super::err;
use super::tables::{BLOB_REFS, BY_STATE, FINISHED, TASKS, at_key, id_of, prefixed, read_task};
use crate::store::{StoreError, blob_keys, decode};
use crate::task::{Task, TaskState};

/// Fills the finished index from the terminal states' entries when it is empty (a store
/// written before it was kept), so that tasks finished back then expire too.
pub(super) fn index_finished_tasks(txn: &WriteTransaction) -> Result<(), StoreError> {
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

/// Fills the blob reference index from the tasks when it is empty (a store written before it
/// was kept), so that no blob of a task written back then looks unreferenced.
pub(super) fn index_blob_references(txn: &WriteTransaction) -> Result<(), StoreError> {
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
