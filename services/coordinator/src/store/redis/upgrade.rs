//! What a store written by an older version lacks, brought in before the first operation on
//! tasks ([`RedisStore::ready`]): the key layout per shard with short tags (layout 3) and the
//! indexes.
//!
//! # Layout 3: short tags
//!
//! Layout 2 tagged a task's keys with its shard's lease tag (`P:{P:sN}:task:<id>`, the prefix
//! twice in every key); layout 3 with the shortest tag of the same slot (`P:{T}:task:<id>`), so
//! each rename stays within one slot and runs on a cluster too. The move is layout 2's below,
//! from layout 2's names (or layout 1's, for a store that never had the marker), without the
//! copy of the per-shard sets when they are there already. The leases keep their names.
//!
//! # Layout 2: keys per shard
//!
//! Layout 1 tagged a task's keys with its id (`P:task:{<id>}`, `P:hist:{<id>}`,
//! `P:history:{<id>}`, `P:outbox:{<id>}`); layout 2 tags them with its shard
//! (`P:{P:sN}:task:<id>`, ...). The move runs when the marker `P:{P:idx}:layout` is below `2`:
//! it pins the shard count (the new names depend on it), renames each task's keys (the tasks of
//! the creation and finished indexes; a key already moved, or whose new name is taken, is left
//! alone, so replicas that start together may move at the same time), copies the due, claimed
//! and queued sets into their per-shard sets (an entry only while it is still in the global set,
//! at its score there), and then sets the marker. A crash before the marker only makes the next
//! start do it again. Coordinators of the older version must be stopped first: they would go on
//! writing the old names.

use redis::{AsyncCommands, Script};

use super::scripts::{BUILD_FINISHED, COPY_TO_SHARDS, MOVE_KEYS};
use super::{RedisStore, redis_err};
use crate::store::StoreError;
use crate::task::TaskState;

/// The key layout this version writes.
const LAYOUT: u32 = 3;

/// Tasks moved or indexed per round trip.
const PAGE: usize = 500;

impl RedisStore {
    /// Brings the store up to date once (per store value): checks the pinned shard count, moves
    /// an older layout's keys, builds the indexes an older store lacks. Every operation on tasks
    /// waits for it; one that fails is tried again by the next operation.
    pub(super) async fn ready(&self) -> Result<(), StoreError> {
        self.ready
            .get_or_try_init(|| async {
                if let Some(stored) = self.pinned().await?
                    && stored != self.shards
                {
                    return Err(StoreError::ShardsChanged { stored, configured: self.shards });
                }
                self.move_to_shard_layout().await?;
                self.build_in_flight_set().await?;
                self.build_finished_set().await?;
                self.build_blob_references().await
            })
            .await
            .map(|_| ())
    }

    /// The shard count the store is pinned to, if it is.
    async fn pinned(&self) -> Result<Option<u16>, StoreError> {
        let stored: Option<String> =
            self.conn.clone().get(self.index_key("shards")).await.map_err(redis_err("reading the shard count"))?;
        stored
            .map(|s| s.parse::<u16>().map_err(|e| crate::store::corrupt("shard count", &self.index_key("shards"), e)))
            .transpose()
    }

    /// Pins the store to `shards` shards unless it is pinned already; refuses another count.
    pub(super) async fn pin(&self, shards: u16) -> Result<(), StoreError> {
        let key = self.index_key("shards");
        let _: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(shards)
            .arg("NX")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(redis_err("pinning the shard count"))?;
        match self.pinned().await? {
            Some(stored) if stored != shards => Err(StoreError::ShardsChanged { stored, configured: shards }),
            _ => Ok(()),
        }
    }

    /// Moves a layout-1 store's keys to layout 2 and fills the per-shard sets (the module's
    /// docs). A store without tasks only gets the marker.
    async fn move_to_shard_layout(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let marker = self.index_key("layout");
        let layout: Option<u32> = conn.get(&marker).await.map_err(redis_err("reading the key layout"))?;
        if layout.is_some_and(|l| l >= LAYOUT) {
            return Ok(());
        }
        let from = layout.unwrap_or(1);
        let (all, finished): (u64, u64) = redis::pipe()
            .zcard(self.index_key("all"))
            .zcard(self.index_key("finished"))
            .query_async(&mut conn)
            .await
            .map_err(redis_err("reading the key layout"))?;
        if all + finished > 0 {
            self.pin(self.shards).await?;
            let (moved, taken) = self.move_task_keys(from).await?;
            tracing::info!(moved, shards = self.shards, from, "moved the store's task keys into layout {LAYOUT}");
            if taken > 0 {
                tracing::warn!(taken, "task keys left under their old names: their new names were taken");
            }
            if from < 2 {
                for name in ["due", "claimed"] {
                    self.copy_to_shards(&self.index_key(name), name).await?;
                }
                self.copy_to_shards(&self.state_key(TaskState::Queued), "queued").await?;
            }
        }
        conn.set::<_, _, ()>(&marker, LAYOUT).await.map_err(redis_err("moving to the key layout per shard"))
    }

    /// Renames the keys of layout `from` (1 or 2) of every task of the creation and finished
    /// indexes; how many keys moved and how many were left because their new name was taken.
    async fn move_task_keys(&self, from: u32) -> Result<(u64, u64), StoreError> {
        let script = Script::new(MOVE_KEYS);
        let mut conn = self.conn.clone();
        script.prepare_invoke().load_async(&mut conn).await.map_err(redis_err("moving task keys"))?;
        let (mut moved, mut taken) = (0, 0);
        for index in ["all", "finished"] {
            let mut start = 0;
            loop {
                let ids: Vec<String> = conn
                    .zrange(self.index_key(index), start as isize, (start + PAGE - 1) as isize)
                    .await
                    .map_err(redis_err("moving task keys"))?;
                let mut pipe = redis::pipe();
                for id in &ids {
                    let mut invocation = script.prepare_invoke();
                    for (old, new) in [
                        ("task", self.task_key(id)),
                        ("hist", self.history_key(id)),
                        ("history", self.legacy_history_key(id)),
                        ("outbox", self.outbox_key(id)),
                    ] {
                        // layout 1 (one server only) had the id as tag; layout 2 the shard's
                        // lease tag, in the slot of layout 3's short one
                        let old = if from < 2 { self.unsharded_key(old, id) } else { self.layout_2_key(old, id) };
                        invocation.key(old).key(new);
                    }
                    pipe.invoke_script(&invocation);
                }
                if !ids.is_empty() {
                    let counts: Vec<(u64, u64)> =
                        pipe.query_async(&mut conn).await.map_err(redis_err("moving task keys"))?;
                    moved += counts.iter().map(|c| c.0).sum::<u64>();
                    taken += counts.iter().map(|c| c.1).sum::<u64>();
                }
                if ids.len() < PAGE {
                    break;
                }
                start += PAGE;
            }
        }
        Ok((moved, taken))
    }

    /// Copies the entries of global sorted set `global` into the per-shard sets `name:sN`.
    async fn copy_to_shards(&self, global: &str, name: &str) -> Result<(), StoreError> {
        let script = Script::new(COPY_TO_SHARDS);
        let mut conn = self.conn.clone();
        let mut start = 0;
        loop {
            let ids: Vec<String> = conn
                .zrange(global, start as isize, (start + PAGE - 1) as isize)
                .await
                .map_err(redis_err("indexing shards"))?;
            if !ids.is_empty() {
                let mut invocation = script.key(global);
                for id in &ids {
                    invocation.key(self.shard_index_key(name, self.shard(id))).arg(id);
                }
                invocation.invoke_async::<()>(&mut conn).await.map_err(redis_err("indexing shards"))?;
            }
            if ids.len() < PAGE {
                return Ok(());
            }
            start += PAGE;
        }
    }

    /// Indexes the blob references of every task unless they are in (a store written before
    /// they were kept): page by page through the creation index, then the marker. Replicas that
    /// start together may both do it; the index is a set.
    pub(super) async fn build_blob_references(&self) -> Result<(), StoreError> {
        const PAGE: isize = 500;
        let mut conn = self.conn.clone();
        let marker = self.index_key("blob_refs_built");
        let built: bool = conn.exists(&marker).await.map_err(redis_err("indexing blob references"))?;
        if built {
            return Ok(());
        }
        let mut start = 0;
        loop {
            let ids: Vec<String> = conn
                .zrange(self.index_key("all"), start, start + PAGE - 1)
                .await
                .map_err(redis_err("indexing blob references"))?;
            let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
            let tasks = self.read_tasks(&refs).await?;
            let mut pipe = redis::pipe();
            for task in tasks.iter().flatten() {
                self.queue_blob_references(&mut pipe, task);
            }
            if !pipe.is_empty() {
                pipe.query_async::<()>(&mut conn).await.map_err(redis_err("indexing blob references"))?;
            }
            if ids.len() < PAGE as usize {
                break;
            }
            start += PAGE;
        }
        conn.set::<_, _, ()>(&marker, 1).await.map_err(redis_err("indexing blob references"))
    }

    /// Builds the finished set from the terminal states' sets when it does not exist (a store
    /// written before the set was kept), so that tasks finished back then expire too.
    pub(super) async fn build_finished_set(&self) -> Result<(), StoreError> {
        let script = Script::new(BUILD_FINISHED);
        let mut invocation = script.key(self.index_key("finished"));
        for state in TaskState::ALL.into_iter().filter(|s| s.is_terminal()) {
            invocation.key(self.state_key(state));
        }
        invocation.invoke_async::<()>(&mut self.conn.clone()).await.map_err(redis_err("indexing"))
    }

    /// Builds the in-flight set from the in-flight states' sets when it does not exist (a store
    /// written before the set was kept).
    pub(super) async fn build_in_flight_set(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let key = self.index_key("in_flight");
        let exists: bool = conn.exists(&key).await.map_err(redis_err("indexing"))?;
        if exists {
            return Ok(());
        }
        let sources: Vec<String> = TaskState::IN_FLIGHT.into_iter().map(|s| self.state_key(s)).collect();
        redis::cmd("ZUNIONSTORE")
            .arg(&key)
            .arg(sources.len())
            .arg(sources)
            .query_async::<()>(&mut conn)
            .await
            .map_err(redis_err("indexing"))
    }
}
