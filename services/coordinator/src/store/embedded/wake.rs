//! The wake index: due tasks (`due`, by wake time) and the leases on them (`claimed`).

use std::collections::BTreeSet;
use std::time::Duration;

use imagepipe_contracts::shard::shard_of;

use redb::{ReadableTable, WriteTransaction};

use super::tables::{
    CLAIMED, CLAIMED_ORDER, DUE, DUE_ORDER, OUTBOX, SEP_END, TASKS, at_key, id_of, prefixed, range_keys, read_task,
    write,
};
use super::{EmbeddedStore, err};
use crate::store::{StoreError, wake_at};

/// Adds `id` to the due index at `at`, unless it is already due earlier (Redis `ZADD LT`).
pub(super) fn due_add_lt(txn: &WriteTransaction, id: &str, at: u64) -> Result<(), StoreError> {
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

/// The store's [`TaskStore::claim_due`](crate::store::TaskStore::claim_due), and with `shards`
/// its [`TaskStore::claim_due_in`](crate::store::TaskStore::claim_due_in): the due index is
/// walked in wake order and the tasks of other shards passed over, so a claim costs the due
/// entries up to the last one it takes (one process owns every shard of this store).
pub(super) async fn claim_due(
    store: &EmbeddedStore,
    shards: Option<BTreeSet<u16>>,
    now: u64,
    lease: Duration,
    max: usize,
) -> Result<Vec<String>, StoreError> {
    let until = now.saturating_add(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX));
    let count = store.shards;
    let wanted = move |id: &str| shards.as_ref().is_none_or(|s| s.contains(&shard_of(id, count)));
    store
        .run("claiming due tasks", move |db, _| {
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
                let mut keys = Vec::new();
                for row in due_order.range(..hi.as_str()).map_err(|e| err(op, e))? {
                    if keys.len() == max {
                        break;
                    }
                    let (key, _) = row.map_err(|e| err(op, e))?;
                    if wanted(id_of(key.value())) {
                        keys.push(key.value().to_owned());
                    }
                }
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

/// The store's [`TaskStore::release`](crate::store::TaskStore::release).
pub(super) async fn release(store: &EmbeddedStore, id: &str, now: u64) -> Result<(), StoreError> {
    let id = id.to_owned();
    store
        .run("releasing a task", move |db, grace| {
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
