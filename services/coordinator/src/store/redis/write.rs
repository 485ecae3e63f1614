//! Writing transitions: the index commands and the transition scripts in one round trip, and
//! pruning the index entries a task has left behind.

use super::{RedisStore, redis_err};
use crate::machine::Decision;
use crate::store::{Applied, StoreError, encode, rank, wake_at};
use crate::task::{Task, TaskState};

impl RedisStore {
    /// Indexes transitions (each one's new state and wake time, globally and in its shard's
    /// sets) and then writes them, in one round trip (two on a cluster, which would run the
    /// slots of one pipeline concurrently): the index commands run first, in a MULTI
    /// block of the index slot, then one transition script per decision in its shard's slot
    /// (each its own compare-and-set on `version - 1`, under its fence when it has one). What
    /// each write did.
    ///
    /// A write that is then refused leaves its index entries behind: state entries readers skip
    /// (the caller prunes them), and a due entry that is at worst *early* (`ZADD LT` never moves
    /// a wake later or drops one): whoever claims it reads the stored task, relays only what is
    /// stored and fires only a timer the stored task has due, and its release re-indexes the task
    /// from what is stored. So a fenced writer can make the shard's owner look at a task early,
    /// never act on the fenced decision, and its own `claim_due_in` does not reach a shard it
    /// lost. The entries are not removed afterwards: that would race the owner's own writes of
    /// the task (a removal could drop the owner's new timer).
    pub(super) async fn index_and_write(&self, decisions: &[Decision]) -> Result<Vec<Applied>, StoreError> {
        let mut pipe = redis::pipe();
        pipe.cmd("MULTI").ignore();
        for decision in decisions {
            let task = &decision.task;
            let shard = self.shard(&task.id);
            pipe.zadd(self.state_key(task.state), &task.id, task.index_at()).ignore();
            if task.state == TaskState::Queued {
                pipe.zadd(self.shard_index_key("queued", shard), &task.id, task.index_at()).ignore();
            }
            if TaskState::IN_FLIGHT.contains(&task.state) {
                pipe.zadd(self.index_key("in_flight"), &task.id, task.created_at).ignore();
            }
            if task.version == 1 {
                pipe.zadd(self.index_key("all"), &task.id, task.created_at).ignore();
            }
            if task.state.is_terminal() {
                pipe.zadd(self.index_key("finished"), &task.id, task.updated_at).ignore();
            }
            if let Some(at) = wake_at(task, !decision.outbox.is_empty(), decision.history.at, self.relay_grace) {
                pipe.cmd("ZADD").arg(self.index_key("due")).arg("LT").arg(at).arg(&task.id).ignore();
                pipe.cmd("ZADD").arg(self.shard_index_key("due", shard)).arg("LT").arg(at).arg(&task.id).ignore();
            }
            self.queue_blob_references(&mut pipe, task);
        }
        pipe.cmd("EXEC").ignore();
        let mut conn = self.conn.clone();
        if conn.is_cluster() {
            // A cluster runs a pipeline's slots concurrently: the index block must be in before
            // any transition is written, so it is its own round trip there.
            pipe.query_async::<()>(&mut conn).await.map_err(redis_err("indexing a transition"))?;
            pipe = redis::pipe();
        }
        let mut invocations = Vec::with_capacity(decisions.len());
        for decision in decisions {
            let task = &decision.task;
            let (token, now) = decision.fence.map_or((String::new(), 0), |f| (f.token.to_string(), f.now));
            let mut invocation = self.transition.key(self.task_key(&task.id));
            invocation
                .key(self.outbox_key(&task.id))
                .key(self.lease_key(self.shard(&task.id)))
                .arg(task.version - 1)
                .arg(task.version)
                .arg(encode(task))
                .arg(encode(&decision.history))
                .arg(decision.history.replica.as_deref().unwrap_or_default())
                .arg(token)
                .arg(now);
            for entry in &decision.outbox {
                invocation.arg(&entry.id).arg(encode(entry));
            }
            pipe.invoke_script(&invocation);
            invocations.push(invocation);
        }
        let written = match pipe.query_async::<Vec<i64>>(&mut conn).await {
            // The server does not know the script yet (first use, or restarted), so none of the
            // pipeline's scripts ran: load it and send the whole pipeline again (its index
            // commands are repeatable).
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                if let Some(invocation) = invocations.first() {
                    invocation.load_async(&mut conn).await.map_err(redis_err("writing a transition"))?;
                }
                pipe.query_async::<Vec<i64>>(&mut conn).await
            }
            other => other,
        };
        let applied = written.map_err(redis_err("writing a transition"))?;
        if applied.len() != decisions.len() {
            return Err(StoreError::Redis {
                operation: "writing a transition",
                source: redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "the transition pipeline answered with another number of replies",
                )),
            });
        }
        Ok(applied
            .into_iter()
            .map(|code| match code {
                1 => Applied::Yes,
                2 => Applied::Fenced,
                _ => Applied::Conflict,
            })
            .collect())
    }

    /// Prunes the index entries of each task `(id, state)` its state has left behind, in one
    /// round trip; a task that is gone leaves the entries `gone` names (its state and the due
    /// and in-flight sets, and its shard's queued and due sets).
    pub(super) async fn prune_many(&self, tasks: &[(&str, TaskState)], gone: &[&Task]) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        self.queue_prunes(&mut pipe, tasks);
        for task in gone {
            let shard = self.shard(&task.id);
            pipe.zrem(self.state_key(task.state), &task.id).ignore();
            pipe.zrem(self.shard_index_key("queued", shard), &task.id).ignore();
            pipe.zrem(self.index_key("due"), &task.id).ignore();
            pipe.zrem(self.shard_index_key("due", shard), &task.id).ignore();
            pipe.zrem(self.index_key("in_flight"), &task.id).ignore();
        }
        if pipe.is_empty() {
            return Ok(());
        }
        pipe.query_async::<()>(&mut self.conn.clone()).await.map_err(redis_err("indexing"))
    }

    /// Adds to `pipe` the removal of each task `(id, state)` from the index sets its state
    /// can never be in again.
    pub(super) fn queue_prunes(&self, pipe: &mut redis::Pipeline, tasks: &[(&str, TaskState)]) {
        for (id, state) in tasks {
            let left = TaskState::ALL
                .into_iter()
                .filter(|s| rank(*s) < rank(*state) || (state.is_terminal() && s != state))
                .map(|s| self.state_key(s));
            for key in left {
                pipe.zrem(key, *id).ignore();
            }
            if *state != TaskState::Queued {
                pipe.zrem(self.shard_index_key("queued", self.shard(id)), *id).ignore();
            }
            if state.is_terminal() {
                pipe.zrem(self.index_key("in_flight"), *id).ignore();
            }
        }
    }
}
