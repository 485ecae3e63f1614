//! Expiring finished tasks, in the order "Expiry" in the Redis store's docs gives.

use std::collections::BTreeSet;

use super::{RedisStore, blobs, redis_err};
use crate::store::{StoreError, TaskStore, encode};
use crate::task::{Task, TaskState};

/// The store's [`TaskStore::expire_finished`](crate::store::TaskStore::expire_finished).
pub(super) async fn expire_finished(store: &RedisStore, before: u64, max: usize) -> Result<usize, StoreError> {
    let finished = store.index_key("finished");
    let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
        .arg(&finished)
        .arg("-inf")
        .arg(before)
        .arg("LIMIT")
        .arg(0)
        .arg(max)
        .query_async(&mut store.conn.clone())
        .await
        .map_err(redis_err("expiring"))?;
    let (mut expired, mut settled, mut late) = (0, Vec::new(), Vec::new());
    for id in ids {
        match store.get(&id).await {
            Ok(Some(task)) if task.state.is_terminal() && task.updated_at <= before => {
                expired += usize::from(store.forget_task(&task).await?);
                settled.push(id);
            }
            Ok(Some(task)) if task.state.is_terminal() => late.push((task.updated_at, id)),
            Ok(_) => settled.push(id),
            Err(e @ StoreError::Corrupt { .. }) => tracing::warn!(error = %e, "finished task not expired"),
            Err(e) => return Err(e),
        }
    }
    let mut conn = store.conn.clone();
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
        store
            .unfinish
            .key(&finished)
            .arg(before)
            .arg(settled)
            .invoke_async::<()>(&mut conn)
            .await
            .map_err(redis_err("expiring"))?;
    }
    Ok(expired)
}

impl RedisStore {
    /// Deletes every key and index entry of finished `task` (the order is the module's
    /// "Expiry"), except its finished entry and its due and claimed entries (a claim of a task
    /// that is gone drops them); whether this call deleted its keys.
    pub(super) async fn forget_task(&self, task: &Task) -> Result<bool, StoreError> {
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
        // A queued entry is scored by priority band and creation time: one left behind (its
        // task's start was never settled) goes too, from the global and the shard's set.
        let as_queued = Task { state: TaskState::Queued, ..task.clone() };
        self.unindex
            .key(self.state_key(TaskState::Queued))
            .key(self.shard_index_key("queued", self.shard(&task.id)))
            .arg(&task.id)
            .arg(as_queued.index_at())
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
        // Its blob keys: those in its JSON, those it dropped or a refused write added (`gone`),
        // and those a store written before kept in a set per task.
        let (gone, legacy): (Option<String>, Vec<String>) = redis::pipe()
            .hget(self.task_key(&task.id), "gone")
            .smembers(self.task_blobs_key(&task.id))
            .query_async(&mut conn)
            .await
            .map_err(redis_err("expiring"))?;
        let json = encode(task);
        let mut blobs: BTreeSet<&str> = blobs::keys_in(&json);
        blobs.extend(gone.as_deref().unwrap_or_default().split_whitespace());
        blobs.extend(legacy.iter().map(String::as_str));
        let mut unreference = self.unreference.key(self.task_blobs_key(&task.id));
        unreference.key(self.index_key("released_blobs")).arg(&task.id);
        for key in blobs {
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
}
