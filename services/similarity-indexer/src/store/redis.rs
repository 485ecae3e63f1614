//! [`RedisStore`]: the similarity store in Redis. Every key sits in one Redis Cluster slot,
//! `{<prefix>:similarity}` (so the scripts below touch one node):
//!
//! - `…:entry:<task>`: a hash of the entry's fields (`created`, `at`, `phash` as 16 hex
//!   digits, `thumb`, `emb` and `pairs` as JSON);
//! - `…:log`: a sorted set, task by its latest sequence number; `…:seq` the last one;
//! - `…:at`: a sorted set, task by its latest event time (expiry);
//! - `…:gone`: a sorted set, removed task by removal time (removals still in the log);
//! - `…:epoch`: the epoch, raised by a rebuild.

use std::collections::HashMap;

use async_trait::async_trait;
use imagepipe_runtime::redis_connection::RedisConnection;
use imagepipe_similarity::parse_phash;

use super::{Change, Changed, Changes, Entry, SimilarityStore, StoreError, TOMBSTONE_TTL_MS};

/// Applies fields to the entry hash KEYS[1] of task ARGV[1] from an event of time ARGV[2]
/// (field/value pairs from ARGV[3]; an empty value deletes the field), keeps the first and
/// latest event time, logs it (KEYS[2] log, KEYS[3] seq), indexes it by time (KEYS[4]) and
/// forgets an earlier removal (KEYS[5]). Returns the hash.
const UPDATE: &str = r"
local at = tonumber(ARGV[2])
local created = tonumber(redis.call('HGET', KEYS[1], 'created') or '0')
if created == 0 or at < created then redis.call('HSET', KEYS[1], 'created', ARGV[2]) end
local latest = tonumber(redis.call('HGET', KEYS[1], 'at') or '0')
if at > latest then
  redis.call('HSET', KEYS[1], 'at', ARGV[2])
  redis.call('ZADD', KEYS[4], at, ARGV[1])
end
for i = 3, #ARGV, 2 do
  if ARGV[i + 1] == '' then redis.call('HDEL', KEYS[1], ARGV[i]) else redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
local seq = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], seq, ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
return redis.call('HGETALL', KEYS[1])
";

/// Removes up to ARGV[2] entries (hashes under ARGV[3]) whose latest event (KEYS[1]) is at or
/// before ARGV[1], logging each as removed (KEYS[2] log, KEYS[3] seq, KEYS[4] gone at ARGV[4]);
/// then drops removals made before ARGV[5] from the log. Returns how many entries.
const EXPIRE: &str = r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  redis.call('DEL', ARGV[3] .. id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), id)
  redis.call('ZADD', KEYS[4], tonumber(ARGV[4]), id)
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. ARGV[5])) do
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[4], id)
end
return #ids
";

/// Deletes every entry (hashes under ARGV[1], tasks of the log KEYS[1]) and the log, time and
/// removal sets (KEYS[1], KEYS[2], KEYS[3]); raises the epoch (KEYS[4]) and returns it.
const CLEAR: &str = r"
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  redis.call('DEL', ARGV[1] .. id)
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
return redis.call('INCR', KEYS[4])
";

/// The store in Redis (see the module docs).
#[derive(Clone)]
pub struct RedisStore {
    connection: RedisConnection,
    /// `<prefix>:{<prefix>:similarity}`: every key in one cluster slot.
    slot: String,
    update: redis::Script,
    expire: redis::Script,
    clear: redis::Script,
}

impl RedisStore {
    /// Connects to `url`, keys under `<prefix>:{<prefix>:similarity}:`.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        let connection = RedisConnection::open(url).await.map_err(StoreError::Connect)?;
        Ok(Self {
            connection,
            slot: format!("{prefix}:{{{prefix}:similarity}}"),
            update: redis::Script::new(UPDATE),
            expire: redis::Script::new(EXPIRE),
            clear: redis::Script::new(CLEAR),
        })
    }

    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.slot)
    }

    fn entry_prefix(&self) -> String {
        self.key("entry:")
    }
}

fn redis_err(action: &'static str) -> impl FnOnce(redis::RedisError) -> StoreError {
    move |source| StoreError::Redis { action, source }
}

/// The entry of `task_id` from its hash's fields.
fn from_fields(task_id: &str, fields: HashMap<String, String>) -> Result<Entry, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt { task_id: task_id.to_owned(), reason };
    let number =
        |name: &str| fields.get(name).map_or(Ok(0), |v| v.parse::<u64>().map_err(|e| corrupt(format!("{name}: {e}"))));
    fn json<T: serde::de::DeserializeOwned>(
        fields: &HashMap<String, String>,
        name: &str,
        task_id: &str,
    ) -> Option<Result<T, StoreError>> {
        let corrupt =
            |e: serde_json::Error| StoreError::Corrupt { task_id: task_id.to_owned(), reason: format!("{name}: {e}") };
        fields.get(name).map(|v| serde_json::from_str(v).map_err(corrupt))
    }
    Ok(Entry {
        task_id: task_id.to_owned(),
        created: number("created")?,
        at: number("at")?,
        phash: fields
            .get("phash")
            .map(|v| parse_phash(v).ok_or_else(|| corrupt(format!("phash: {v:?}"))))
            .transpose()?,
        thumbnail_key: fields.get("thumb").cloned(),
        embedding: json(&fields, "emb", task_id).transpose()?,
        labels: json(&fields, "labels", task_id).transpose()?.unwrap_or_default(),
        pairs: json(&fields, "pairs", task_id).transpose()?.unwrap_or_default(),
    })
}

/// The `labels` field: JSON, or empty (deleting the field) for none.
fn labels_field(labels: &imagepipe_contracts::Labels) -> String {
    if labels.is_empty() { String::new() } else { serde_json::to_string(labels).expect("labels serialize") }
}

/// The hash fields `change` sets (an empty value deletes one).
fn fields_of(change: &Change) -> Vec<(&'static str, String)> {
    match change {
        Change::Metadata { phash, thumbnail_key, labels } => vec![
            ("phash", phash.map(|p| format!("{p:016x}")).unwrap_or_default()),
            ("thumb", thumbnail_key.clone()),
            ("labels", labels_field(labels)),
        ],
        Change::Embedding { embedding, labels } => vec![
            ("emb", serde_json::to_string(embedding).expect("an embedding serializes")),
            ("labels", labels_field(labels)),
        ],
        Change::Pairs(pairs) if pairs.is_empty() => vec![("pairs", String::new())],
        Change::Pairs(pairs) => vec![("pairs", serde_json::to_string(pairs).expect("pairs serialize"))],
    }
}

#[async_trait]
impl SimilarityStore for RedisStore {
    async fn update(&self, task_id: &str, at: u64, change: Change) -> Result<Entry, StoreError> {
        let mut invocation = self.update.prepare_invoke();
        invocation
            .key(format!("{}{task_id}", self.entry_prefix()))
            .key(self.key("log"))
            .key(self.key("seq"))
            .key(self.key("at"))
            .key(self.key("gone"))
            .arg(task_id)
            .arg(at);
        for (field, value) in fields_of(&change) {
            invocation.arg(field).arg(value);
        }
        let fields: HashMap<String, String> =
            invocation.invoke_async(&mut self.connection.clone()).await.map_err(redis_err("updating an entry"))?;
        from_fields(task_id, fields)
    }

    async fn entry(&self, task_id: &str) -> Result<Option<Entry>, StoreError> {
        let fields: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(format!("{}{task_id}", self.entry_prefix()))
            .query_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("reading an entry"))?;
        if fields.is_empty() { Ok(None) } else { from_fields(task_id, fields).map(Some) }
    }

    async fn changes(&self, after: u64, limit: usize) -> Result<Changes, StoreError> {
        let mut connection = self.connection.clone();
        let (epoch, logged): (Option<u64>, Vec<(String, u64)>) = redis::pipe()
            .cmd("GET")
            .arg(self.key("epoch"))
            .cmd("ZRANGE")
            .arg(self.key("log"))
            .arg(format!("({after}"))
            .arg("+inf")
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .arg("WITHSCORES")
            .query_async(&mut connection)
            .await
            .map_err(redis_err("reading the change log"))?;
        if logged.is_empty() {
            return Ok(Changes { epoch: epoch.unwrap_or(0), items: Vec::new() });
        }
        let mut pipe = redis::pipe();
        for (task_id, _) in &logged {
            pipe.cmd("HGETALL").arg(format!("{}{task_id}", self.entry_prefix()));
        }
        let hashes: Vec<HashMap<String, String>> =
            pipe.query_async(&mut connection).await.map_err(redis_err("reading changed entries"))?;
        let mut items = Vec::with_capacity(logged.len());
        for ((task_id, seq), fields) in logged.into_iter().zip(hashes) {
            let entry = if fields.is_empty() { None } else { Some(from_fields(&task_id, fields)?) };
            items.push(Changed { seq, task_id, entry });
        }
        Ok(Changes { epoch: epoch.unwrap_or(0), items })
    }

    async fn expire(&self, before: u64, now: u64, max: usize) -> Result<usize, StoreError> {
        self.expire
            .key(self.key("at"))
            .key(self.key("log"))
            .key(self.key("seq"))
            .key(self.key("gone"))
            .arg(before)
            .arg(max)
            .arg(self.entry_prefix())
            .arg(now)
            .arg(now.saturating_sub(TOMBSTONE_TTL_MS))
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("expiring old entries"))
    }

    async fn clear(&self) -> Result<u64, StoreError> {
        self.clear
            .key(self.key("log"))
            .key(self.key("at"))
            .key(self.key("gone"))
            .key(self.key("epoch"))
            .arg(self.entry_prefix())
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("clearing the store"))
    }
}
