//! Expiring finished tasks: every row of a task and its index entries, in one transaction.

use redb::{ReadableTable, WriteTransaction};

use super::blobs::unreference_blobs;
use super::tables::{
    BY_CREATION, BY_STATE, CLAIMED, CLAIMED_ORDER, DUE, DUE_ORDER, FINISHED, HISTORY, IDEMPOTENCY, OUTBOX, SEP_END,
    TASKS, at_key, id_of, prefixed, range_keys, read_task, state_key, write,
};
use super::{EmbeddedStore, err};
use crate::store::StoreError;
use crate::task::Task;

/// Deletes every row of finished `task` but its finished entry.
pub(super) fn forget_task(txn: &WriteTransaction, task: &Task) -> Result<(), StoreError> {
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

/// The store's [`TaskStore::expire_finished`](crate::store::TaskStore::expire_finished).
pub(super) async fn expire_finished(store: &EmbeddedStore, before: u64, max: usize) -> Result<usize, StoreError> {
    store
        .run("expiring finished tasks", move |db, _| {
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
