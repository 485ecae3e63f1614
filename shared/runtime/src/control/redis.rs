//! [`RedisControl`]: the control state in Redis, shared by every replica.
//!
//! | key (`P` = `bus.prefix`) | type |
//! |---|---|
//! | `P:{P:control}:queues` | hash: queue → [`QueueControl`] JSON |
//! | `P:{P:control}:beats:<queue>` | hash: replica → [`Beat`] JSON |
//! | `P:{P:control}:rate:<queue>:<bucket>` | counter of messages taken, expiring after the window |
//! | `P:{P:control}:cancels` | hash: task id → Unix ms of the cancellation |
//! | `P:{P:control}:job:<id>` | a background job's JSON record, expiring after [`JOB_TTL`] |
//!
//! Every key carries the hash tag `{P:control}`, so they share one Redis Cluster slot.

use async_trait::async_trait;
use redis::AsyncCommands;

use super::{
    BEAT_TTL, Beat, CANCEL_TTL, ControlError, ControlState, ControlStore, JOB_TTL, QueueActivity, QueueControl,
    RATE_BUCKET_MS, RATE_WINDOW, rate_from_buckets,
};
use crate::clock::millis;
use crate::redis_connection::RedisConnection;

/// Sets one field of a queue's JSON in the queues hash: ARGV[1] field name, ARGV[2] JSON value
/// (`null` removes the field), ARGV[3] now, ARGV[4] the queue. Returns 1 when it changed.
const UPDATE: &str = r#"
local current = redis.call('HGET', KEYS[1], ARGV[4])
local q = {}
if current then q = cjson.decode(current) end
local value = nil
if ARGV[2] ~= 'null' then value = cjson.decode(ARGV[2]) end
if q[ARGV[1]] == value then return 0 end
q[ARGV[1]] = value
q['updatedAt'] = tonumber(ARGV[3])
if ARGV[1] == 'paused' and value == false then q['resumedAt'] = tonumber(ARGV[3]) end
redis.call('HSET', KEYS[1], ARGV[4], cjson.encode(q))
return 1
"#;

/// The control state in Redis (see the module docs).
#[derive(Clone)]
pub struct RedisControl {
    connection: RedisConnection,
    prefix: String,
    update: redis::Script,
}

impl RedisControl {
    /// Keys under `bus_prefix` on `connection`.
    pub fn new(connection: RedisConnection, bus_prefix: &str) -> Self {
        Self {
            connection,
            prefix: format!("{bus_prefix}:{{{bus_prefix}:control}}"),
            update: redis::Script::new(UPDATE),
        }
    }

    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    async fn set_field(&self, queue: &str, field: &str, json: String, now: u64) -> Result<bool, ControlError> {
        let changed: i64 = self
            .update
            .key(self.key("queues"))
            .arg(field)
            .arg(json)
            .arg(now)
            .arg(queue)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(|source| ControlError::Redis { op: "update", source })?;
        Ok(changed == 1)
    }
}

fn redis_err(op: &'static str) -> impl Fn(redis::RedisError) -> ControlError {
    move |source| ControlError::Redis { op, source }
}

#[async_trait]
impl ControlStore for RedisControl {
    async fn state(&self) -> Result<ControlState, ControlError> {
        let all: Vec<(String, String)> =
            self.connection.clone().hgetall(self.key("queues")).await.map_err(redis_err("HGETALL"))?;
        let mut state = ControlState::default();
        for (queue, json) in all {
            let control: QueueControl = serde_json::from_str(&json)
                .map_err(|e| ControlError::Corrupt { what: format!("queue {queue}"), message: e.to_string() })?;
            state.queues.insert(queue, control);
        }
        Ok(state)
    }

    async fn set_paused(&self, queue: &str, paused: bool, now: u64) -> Result<bool, ControlError> {
        self.set_field(queue, "paused", paused.to_string(), now).await
    }

    async fn set_concurrency(&self, queue: &str, per_replica: Option<u32>, now: u64) -> Result<(), ControlError> {
        let json = per_replica.map_or_else(|| "null".to_owned(), |n| n.to_string());
        self.set_field(queue, "perReplica", json, now).await.map(drop)
    }

    async fn beat(&self, queue: &str, replica: &str, beat: Beat) -> Result<(), ControlError> {
        let beats = self.key(&format!("beats:{queue}"));
        let mut pipe = redis::pipe();
        pipe.hset(&beats, replica, serde_json::to_string(&beat).expect("beats serialize")).ignore();
        pipe.pexpire(&beats, (millis(BEAT_TTL) * 12) as i64).ignore();
        if beat.taken > 0 {
            let rate = self.key(&format!("rate:{queue}:{}", beat.at / RATE_BUCKET_MS));
            pipe.incr(&rate, beat.taken).ignore();
            pipe.pexpire(&rate, (millis(RATE_WINDOW) + 2 * RATE_BUCKET_MS) as i64).ignore();
        }
        pipe.query_async::<()>(&mut self.connection.clone()).await.map_err(redis_err("beat"))
    }

    async fn activity(&self, queue: &str, now: u64) -> Result<QueueActivity, ControlError> {
        let beats_key = self.key(&format!("beats:{queue}"));
        let current = now / RATE_BUCKET_MS;
        let buckets: Vec<u64> = (0..=millis(RATE_WINDOW) / RATE_BUCKET_MS).map(|i| current.saturating_sub(i)).collect();
        let rate_keys: Vec<String> = buckets.iter().map(|b| self.key(&format!("rate:{queue}:{b}"))).collect();
        let mut conn = self.connection.clone();
        let beats: Vec<(String, String)> = conn.hgetall(&beats_key).await.map_err(redis_err("HGETALL"))?;
        let counts: Vec<Option<u64>> = conn.mget(&rate_keys).await.map_err(redis_err("MGET"))?;
        let mut activity = QueueActivity::default();
        let alive = now.saturating_sub(millis(BEAT_TTL));
        let mut stale = Vec::new();
        for (replica, json) in beats {
            match serde_json::from_str::<Beat>(&json) {
                Ok(beat) if beat.at >= alive => activity.count(&beat),
                _ => stale.push(replica),
            }
        }
        if !stale.is_empty() {
            let _: Result<(), _> = conn.hdel(&beats_key, &stale).await;
        }
        let pairs: Vec<(u64, u64)> = buckets.into_iter().zip(counts).map(|(b, n)| (b, n.unwrap_or(0))).collect();
        activity.rate_per_sec = rate_from_buckets(&pairs, now);
        Ok(activity)
    }

    async fn request_cancel(&self, task_id: &str, now: u64) -> Result<(), ControlError> {
        let key = self.key("cancels");
        let mut conn = self.connection.clone();
        let () = conn.hset(&key, task_id, now).await.map_err(redis_err("HSET"))?;
        // Cancellations are rare: prune the expired ones while here.
        let all: Vec<(String, u64)> = conn.hgetall(&key).await.map_err(redis_err("HGETALL"))?;
        let expired: Vec<String> =
            all.into_iter().filter(|(_, at)| *at + millis(CANCEL_TTL) < now).map(|(id, _)| id).collect();
        if !expired.is_empty() {
            let () = conn.hdel(&key, &expired).await.map_err(redis_err("HDEL"))?;
        }
        Ok(())
    }

    async fn cancelled(&self, task_ids: &[String], now: u64) -> Result<Vec<bool>, ControlError> {
        if task_ids.is_empty() {
            return Ok(Vec::new());
        }
        let at: Vec<Option<u64>> = redis::cmd("HMGET")
            .arg(self.key("cancels"))
            .arg(task_ids)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("HMGET"))?;
        Ok(at.into_iter().map(|at| at.is_some_and(|at| at + millis(CANCEL_TTL) >= now)).collect())
    }

    async fn clear_cancel(&self, task_id: &str) -> Result<(), ControlError> {
        self.connection.clone().hdel(self.key("cancels"), task_id).await.map_err(redis_err("HDEL"))
    }

    async fn put_job(&self, id: &str, record: &str) -> Result<(), ControlError> {
        let key = self.key(&format!("job:{id}"));
        self.connection.clone().set_ex(key, record, JOB_TTL.as_secs()).await.map_err(redis_err("SET"))
    }

    async fn job(&self, id: &str) -> Result<Option<String>, ControlError> {
        self.connection.clone().get(self.key(&format!("job:{id}"))).await.map_err(redis_err("GET"))
    }
}
