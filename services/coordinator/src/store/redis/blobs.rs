//! The blob reference index: which tasks reference which blobs, and the released blobs.
//!
//! `P:{P:idx}:blob:<key>` is the set of the tasks that reference blob `key`. Which blobs a task
//! references is not kept beside it: it is every blob key in its JSON ([`keys_in`]), and those a
//! write of it dropped or a refused write added, kept in its hash's `gone` field (the transition
//! script, [`TRANSITION`](super::scripts::TRANSITION)). A store written before kept them in a set
//! per task, `P:{P:idx}:task_blobs:<id>`, which the expiry still reads.

use std::collections::BTreeSet;

use imagepipe_contracts::command::is_blob_key;

use super::{RedisStore, redis_err};
use crate::store::{StoreError, blob_keys};
use crate::task::Task;

impl RedisStore {
    /// Adds to `pipe` the records that `task` references its [`blob_keys`] (those of a blob
    /// key's form: no other names a blob, and the expiry finds only those, [`keys_in`]).
    pub(super) fn queue_blob_references(&self, pipe: &mut redis::Pipeline, task: &Task) {
        for key in blob_keys(task).into_iter().filter(|k| is_blob_key(k)) {
            pipe.sadd(self.blob_key(key), &task.id).ignore();
        }
    }
}

/// Every blob key in `text`: each `sha256:` followed by exactly 64 lowercase hex digits (not
/// more), as the transition script's `blob_keys` finds them. Of a task's JSON, a superset of its
/// [`blob_keys`] of a blob key's form.
pub(super) fn keys_in(text: &str) -> BTreeSet<&str> {
    const TAG: &str = "sha256:";
    let mut keys = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(TAG) {
        let after = &rest[at + TAG.len()..];
        let hex = after.bytes().take_while(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)).count();
        if hex == 64 {
            keys.insert(&rest[at..at + TAG.len() + hex]);
        }
        rest = &after[hex..];
    }
    keys
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
