//! Writing a transition: the task, its history entry and outbox entries, and its index rows.

use std::time::Duration;

use redb::WriteTransaction;

use super::blobs::reference_blobs;
use super::err;
use super::tables::{BY_CREATION, BY_STATE, FINISHED, HISTORY, OUTBOX, TASKS, at_key, key2, state_key};
use super::wake::due_add_lt;
use crate::machine::Decision;
use crate::store::{StoreError, blob_keys, encode, wake_at};
use crate::task::Task;

pub(super) fn write_transition(
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
