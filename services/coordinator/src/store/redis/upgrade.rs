//! Indexes a store written by an older version does not have yet, built at connect.

use redis::{AsyncCommands, Script};

use super::scripts::BUILD_FINISHED;
use super::{RedisStore, redis_err};
use crate::store::{StoreError, TaskStore};
use crate::task::TaskState;

impl RedisStore {
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
            let tasks = self.get_many(&refs).await?;
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
