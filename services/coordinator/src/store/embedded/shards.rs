//! The cluster's records and the per-shard claims and queues of the embedded store.
//!
//! Leases (`leases`) and handovers (`handovers`) are kept in redb, so tokens keep growing and
//! the log survives restarts; replica announcements are kept in memory, as they describe the
//! running process and mean nothing after it (one process owns every shard of this store).
//! Per-shard claims and queues walk the store's due and queued indexes in order and pass over
//! other shards' tasks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use imagepipe_contracts::Priority;
use imagepipe_contracts::shard::shard_of;
use redb::{ReadableDatabase, ReadableTable, WriteTransaction};

use super::tables::{BY_STATE, HANDOVERS, LEASES, META, SEP, SEP_END, TASKS, id_of, read_task, write};
use super::{EmbeddedStore, err};
use crate::machine::Fence;
use crate::store::{HANDOVERS_KEPT, Handover, Lease, Replica, StoreError, decode, encode};
use crate::task::{Task, TaskState};

/// The live replica announcements: id → the announcement and when it runs out.
pub(super) type Announcements = BTreeMap<String, (Replica, u64)>;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn check_replica_id(id: &str, operation: &'static str) -> Result<(), StoreError> {
    if id.is_empty() { Err(StoreError::EmptyReplicaId { operation }) } else { Ok(()) }
}

/// Shard `shard`'s lease record, if it was ever leased.
fn read_lease(
    table: &impl ReadableTable<u16, &'static [u8]>,
    shard: u16,
    operation: &'static str,
) -> Result<Option<Lease>, StoreError> {
    match table.get(shard).map_err(|e| err(operation, e))? {
        Some(json) => decode("lease", &format!("shard {shard}"), json.value()).map(Some),
        None => Ok(None),
    }
}

/// Whether `fence` is its shard's current lease, read in the write transaction `txn`.
pub(super) fn fence_holds(txn: &WriteTransaction, fence: &Fence) -> Result<bool, StoreError> {
    let op = "checking a fence";
    let table = txn.open_table(LEASES).map_err(|e| err(op, e))?;
    Ok(read_lease(&table, fence.shard, op)?.is_some_and(|l| l.token == fence.token && l.expires_at > fence.now))
}

/// The store's [`TaskStore::pin_shards`](crate::store::TaskStore::pin_shards).
pub(super) async fn pin(store: &EmbeddedStore, shards: u16) -> Result<(), StoreError> {
    store
        .run("pinning the shard count", move |db, _| {
            write(db, "pinning the shard count", |txn| {
                let op = "pinning the shard count";
                let mut meta = txn.open_table(META).map_err(|e| err(op, e))?;
                let stored = meta.get("shards").map_err(|e| err(op, e))?.map(|v| v.value());
                match stored {
                    None => {
                        meta.insert("shards", u64::from(shards)).map_err(|e| err(op, e))?;
                        Ok(())
                    }
                    Some(stored) if stored == u64::from(shards) => Ok(()),
                    Some(stored) => Err(StoreError::ShardsChanged {
                        stored: u16::try_from(stored).map_err(|e| crate::store::corrupt("shard count", "meta", e))?,
                        configured: shards,
                    }),
                }
            })
        })
        .await
}

/// The store's [`TaskStore::heartbeat`](crate::store::TaskStore::heartbeat).
pub(super) fn heartbeat(store: &EmbeddedStore, replica: &Replica, ttl: Duration) -> Result<(), StoreError> {
    check_replica_id(&replica.id, "announcing a replica")?;
    let until = replica.heartbeat_at.saturating_add(millis(ttl));
    store.announcements().insert(replica.id.clone(), (replica.clone(), until));
    Ok(())
}

/// The store's [`TaskStore::replicas`](crate::store::TaskStore::replicas).
pub(super) fn replicas(store: &EmbeddedStore, now: u64) -> Vec<Replica> {
    let mut announcements = store.announcements();
    announcements.retain(|_, (_, until)| *until > now);
    announcements.values().map(|(replica, _)| replica.clone()).collect()
}

/// The store's [`TaskStore::leave`](crate::store::TaskStore::leave).
pub(super) fn leave(store: &EmbeddedStore, id: &str) {
    store.announcements().remove(id);
}

/// The store's [`TaskStore::acquire_shards`](crate::store::TaskStore::acquire_shards): one
/// write transaction for all of them.
pub(super) async fn acquire(
    store: &EmbeddedStore,
    owner: &str,
    shards: &[u16],
    now: u64,
    ttl: Duration,
) -> Result<Vec<Option<Lease>>, StoreError> {
    check_replica_id(owner, "acquiring shards")?;
    if shards.is_empty() {
        return Ok(Vec::new());
    }
    let (owner, shards) = (owner.to_owned(), shards.to_vec());
    let until = now.saturating_add(millis(ttl));
    store
        .run("acquiring shards", move |db, _| {
            write(db, "acquiring shards", |txn| {
                let op = "acquiring shards";
                let mut table = txn.open_table(LEASES).map_err(|e| err(op, e))?;
                let mut out = Vec::with_capacity(shards.len());
                for shard in shards {
                    let current = read_lease(&table, shard, op)?;
                    let token = match &current {
                        Some(lease) if lease.is_held(now) && lease.owner != owner => {
                            out.push(None);
                            continue;
                        }
                        Some(lease) if lease.held_by(&owner, now) => lease.token,
                        Some(lease) => lease.token + 1,
                        None => 1,
                    };
                    let lease = Lease { shard, owner: owner.clone(), token, expires_at: until };
                    table.insert(shard, encode(&lease).as_bytes()).map_err(|e| err(op, e))?;
                    out.push(Some(lease));
                }
                Ok(out)
            })
        })
        .await
}

/// The store's [`TaskStore::release_shards`](crate::store::TaskStore::release_shards).
pub(super) async fn release(store: &EmbeddedStore, owner: &str, leases: &[Lease]) -> Result<(), StoreError> {
    check_replica_id(owner, "releasing shards")?;
    if leases.is_empty() {
        return Ok(());
    }
    let (owner, leases) = (owner.to_owned(), leases.to_vec());
    store
        .run("releasing shards", move |db, _| {
            write(db, "releasing shards", |txn| {
                let op = "releasing shards";
                let mut table = txn.open_table(LEASES).map_err(|e| err(op, e))?;
                for held in leases {
                    let current = read_lease(&table, held.shard, op)?;
                    if let Some(mut lease) = current.filter(|l| l.owner == owner && l.token == held.token) {
                        lease.owner.clear();
                        lease.expires_at = 0;
                        table.insert(held.shard, encode(&lease).as_bytes()).map_err(|e| err(op, e))?;
                    }
                }
                Ok(())
            })
        })
        .await
}

/// The store's [`TaskStore::leases`](crate::store::TaskStore::leases).
pub(super) async fn leases(store: &EmbeddedStore) -> Result<Vec<Lease>, StoreError> {
    store
        .run("reading leases", move |db, _| {
            let op = "reading leases";
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            let table = txn.open_table(LEASES).map_err(|e| err(op, e))?;
            let mut leases = Vec::new();
            for row in table.iter().map_err(|e| err(op, e))? {
                let (shard, json) = row.map_err(|e| err(op, e))?;
                leases.push(decode("lease", &format!("shard {}", shard.value()), json.value())?);
            }
            Ok(leases)
        })
        .await
}

/// The store's [`TaskStore::record_handovers`](crate::store::TaskStore::record_handovers).
pub(super) async fn record_handovers(store: &EmbeddedStore, handovers: &[Handover]) -> Result<(), StoreError> {
    if handovers.is_empty() {
        return Ok(());
    }
    let handovers = handovers.to_vec();
    store
        .run("recording handovers", move |db, _| {
            write(db, "recording handovers", |txn| {
                let op = "recording handovers";
                let mut table = txn.open_table(HANDOVERS).map_err(|e| err(op, e))?;
                let mut next = table.last().map_err(|e| err(op, e))?.map_or(0, |(seq, _)| seq.value() + 1);
                for handover in &handovers {
                    table.insert(next, encode(handover).as_bytes()).map_err(|e| err(op, e))?;
                    next += 1;
                }
                let keep_from = next.saturating_sub(HANDOVERS_KEPT as u64);
                table.retain_in(..keep_from, |_, _| false).map_err(|e| err(op, e))?;
                Ok(())
            })
        })
        .await
}

/// The store's [`TaskStore::handovers`](crate::store::TaskStore::handovers).
pub(super) async fn handovers(store: &EmbeddedStore, limit: usize) -> Result<Vec<Handover>, StoreError> {
    store
        .run("reading handovers", move |db, _| {
            let op = "reading handovers";
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            let table = txn.open_table(HANDOVERS).map_err(|e| err(op, e))?;
            let mut out = Vec::new();
            for row in table.iter().map_err(|e| err(op, e))?.rev().take(limit.min(HANDOVERS_KEPT)) {
                let (seq, json) = row.map_err(|e| err(op, e))?;
                out.push(decode("handover", &seq.value().to_string(), json.value())?);
            }
            Ok(out)
        })
        .await
}

/// The store's [`TaskStore::queued_in`](crate::store::TaskStore::queued_in): the queued index
/// in its order (priority band, then creation time), other shards' tasks passed over; past
/// `room`, it stops at the first task that is not high.
pub(super) async fn queued_in(
    store: &EmbeddedStore,
    shards: &[u16],
    room: usize,
    max: usize,
) -> Result<Vec<Task>, StoreError> {
    let shards: BTreeSet<u16> = shards.iter().copied().filter(|s| *s < store.shards).collect();
    if shards.is_empty() || max == 0 {
        return Ok(Vec::new());
    }
    let count = store.shards;
    store
        .run("listing queued tasks", move |db, _| {
            let op = "listing queued tasks";
            let txn = db.begin_read().map_err(|e| err(op, e))?;
            let index = txn.open_table(BY_STATE).map_err(|e| err(op, e))?;
            let tasks = txn.open_table(TASKS).map_err(|e| err(op, e))?;
            let queued = TaskState::Queued.as_str();
            let (lo, hi) = (format!("{queued}{SEP}"), format!("{queued}{SEP_END}"));
            let mut out = Vec::new();
            for row in index.range(lo.as_str()..hi.as_str()).map_err(|e| err(op, e))? {
                if out.len() == max {
                    break;
                }
                let (key, _) = row.map_err(|e| err(op, e))?;
                let id = id_of(key.value());
                if !shards.contains(&shard_of(id, count)) {
                    continue;
                }
                if let Some(task) = read_task(&tasks, id)?.filter(|t| t.state == TaskState::Queued) {
                    if out.len() >= room && task.priority != Priority::High {
                        break;
                    }
                    out.push(task);
                }
            }
            Ok(out)
        })
        .await
}
