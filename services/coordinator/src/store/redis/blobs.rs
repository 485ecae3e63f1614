//! The blob reference index: which tasks reference which blobs, and the released blobs.

use super::{RedisStore, redis_err};
use crate::store::{StoreError, blob_keys};
use crate::task::Task;

impl RedisStore {
    /// Adds to `pipe` the records that `task` references its [`blob_keys`].
    pub(super) fn queue_blob_references(&self, pipe: &mut redis::Pipeline, task: &Task) {
        let keys = blob_keys(task);
        if keys.is_empty() {
            return;
        }
        pipe.sadd(self.task_blobs_key(&task.id), &keys).ignore();
        for key in keys {
            pipe.sadd(self.blob_key(key), &task.id).ignore();
        }
    }
}

/// The store's [`TaskStore::referenced_blobs`](crate::store::TaskStore::referenced_blobs).
pub(super) async fn referenced(store: &RedisStore, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.exists(store.blob_key(key));
    }
    pipe.query_async(&mut store.conn.clone()).await.map_err(redis_err("reading blob references"))
}

/// The store's [`TaskStore::take_released_blobs`](crate::store::TaskStore::take_released_blobs).
pub(super) async fn take_released(store: &RedisStore, max: usize) -> Result<Vec<String>, StoreError> {
    if max == 0 {
        return Ok(Vec::new());
    }
    redis::cmd("SPOP")
        .arg(store.index_key("released_blobs"))
        .arg(max)
        .query_async(&mut store.conn.clone())
        .await
        .map_err(redis_err("taking released blobs"))
}
