//! [`RedisIndex`]: the tag index in Redis, every key in one Redis Cluster slot.
//!
//! | key (`P` = `bus.prefix`) | type |
//! |---|---|
//! | `P:{P:tags}:tag:<tag>` | sorted set: task id, score the tag's score |
//! | `P:{P:tags}:task:<id>` | hash: the task's tags → empty (small hashes are kept compact, small sets are not before Redis 7.2) |
//! | `P:{P:tags}:indexed` | sorted set: task id, score the time of its latest event (Unix ms) |
//! | `P:{P:tags}:thumbnails` | hash: task id → thumbnail blob key |
//!
//! # One slot
//!
//! Every key carries the hash tag `{P:tags}`, so the whole index is in one Redis Cluster slot
//! and every command touching several keys is one a cluster accepts (it refuses keys of several
//! slots with `CROSSSLOT`): a search over several tags (`ZINTER`/`ZUNION` of their sorted
//! sets), the `MULTI` block of a write (tag keys, the task's hash, `indexed`) and the expiry
//! script, which reaches the tag and task keys it finds through its tasks besides the two keys
//! it declares (Redis Cluster runs a script's undeclared keys when they are in the declared
//! keys' slot).
//!
//! One slot is the simple, correct choice at this scale: a search intersects or unites any tags
//! in one command, and a write stays one atomic block. The price is that a cluster does not
//! spread the index: one primary holds all of it (about 1.7 KB per task with 8 tags, so some
//! 12 GB for a week of a million tasks a day) and serves every search and every write of it,
//! while the pipeline's other keys spread over the cluster. Spreading it would take a slot per
//! tag and searches merged by the client, worth it only once one node can no longer hold or
//! serve the index.
//!
//! # Keys of the old layout
//!
//! Before the hash tag, the keys were `P:tags:tag:<tag>`, `P:tags:task:<id>`, `P:tags:indexed`
//! and `P:tags:thumbnails` (one slot each, so that layout only ran on a single Redis node).
//! [`RedisIndex::connect`] moves them to their new names ([`migrate`]): when `P:tags:indexed` or
//! `P:tags:thumbnails` exists (every write of the old layout touched one of them, except the
//! tag writes of versions before expiry, whose tasks have thumbnails anyway), it walks the
//! old keys with `SCAN` (a bounded batch at a time) and moves each in a script: renamed when the
//! new name is free, merged into it otherwise (the newer event time; the new layout's score and
//! thumbnail where both have one), then deleted. `indexed` and `thumbnails` go last, so an
//! interrupted move is resumed at the next start; a start with nothing to move costs one
//! round trip. Old indexers still running write old names again, and the next start of this
//! version moves those too: stop them before starting it, or restart it once they are gone.
//! On a Redis Cluster the old layout never wrote anything (its multi-key writes were refused),
//! so the move, whose script spans an old and a new slot, never runs there.

use async_trait::async_trait;
use imagepipe_runtime::redis_connection::RedisConnection;

use super::{Hit, IndexError, TagIndex, TagMatch, best_first};

/// Drops the entries of up to `ARGV[2]` tasks whose latest event (`KEYS[1]`, the indexed set)
/// is at or before `ARGV[1]`: their tag entries (tag keys under `ARGV[3]`, found in each task's
/// hash of tags), their tag hash and their thumbnail (`KEYS[2]`). Returns how many tasks.
const EXPIRE: &str = r"
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  local task = ARGV[3] .. ':task:' .. id
  for _, tag in ipairs(redis.call('HKEYS', task)) do
    redis.call('ZREM', ARGV[3] .. ':tag:' .. tag, id)
  end
  redis.call('DEL', task)
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
end
return #ids
";

/// Moves the old layout's key `KEYS[1]` to its new name `KEYS[2]`: a rename when `KEYS[2]`
/// does not exist, else a merge (sorted set members by `ZADD` flag `ARGV[1]`, hash fields the
/// new ones kept) and the old key deleted. Returns 1 when a key moved, 0 when `KEYS[1]` was
/// gone.
const MOVE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('RENAME', KEYS[1], KEYS[2])
  return 1
end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'zset' then
  local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    redis.call('ZADD', KEYS[2], ARGV[1], entries[i + 1], entries[i])
  end
elseif kind == 'hash' then
  local entries = redis.call('HGETALL', KEYS[1])
  for i = 1, #entries, 2 do
    redis.call('HSETNX', KEYS[2], entries[i], entries[i + 1])
  end
else
  return redis.error_reply(KEYS[1] .. ' is a ' .. kind .. ', not a sorted set or a hash')
end
redis.call('DEL', KEYS[1])
return 1
";

/// Old keys asked for per `SCAN` call while moving them.
const SCAN_BATCH: usize = 1_000;

/// The names of the index's keys (see the module docs).
#[derive(Debug, Clone)]
struct Keys {
    /// `P:{P:tags}`, the start of every key.
    root: String,
}

impl Keys {
    fn new(bus_prefix: &str) -> Self {
        Self { root: format!("{bus_prefix}:{{{bus_prefix}:tags}}") }
    }

    fn tag(&self, tag: &str) -> String {
        format!("{}:tag:{tag}", self.root)
    }

    fn task(&self, task_id: &str) -> String {
        format!("{}:task:{task_id}", self.root)
    }

    fn indexed(&self) -> String {
        format!("{}:indexed", self.root)
    }

    fn thumbnails(&self) -> String {
        format!("{}:thumbnails", self.root)
    }
}

/// The names of the old layout, `P:tags:…`, and where each moves.
#[derive(Debug, Clone)]
struct OldKeys {
    /// `P:tags`.
    root: String,
}

impl OldKeys {
    fn new(bus_prefix: &str) -> Self {
        Self { root: format!("{bus_prefix}:tags") }
    }

    fn indexed(&self) -> String {
        format!("{}:indexed", self.root)
    }

    fn thumbnails(&self) -> String {
        format!("{}:thumbnails", self.root)
    }

    /// The `SCAN` pattern of every old key.
    fn pattern(&self) -> String {
        let mut pattern: String = self
            .root
            .chars()
            .flat_map(|c| matches!(c, '*' | '?' | '[' | ']' | '\\').then_some('\\').into_iter().chain([c]))
            .collect();
        pattern.push_str(":*");
        pattern
    }

    /// The new name of the old key `old` in `keys` and the `ZADD` flag merging a sorted set
    /// into an existing one (`GT`: the later event time; `NX`: the new layout's score); `None`
    /// for a name the index never wrote.
    fn moved(&self, old: &str, keys: &Keys) -> Option<(String, &'static str)> {
        let rest = old.strip_prefix(self.root.as_str())?.strip_prefix(':')?;
        let flag = match rest {
            "indexed" => "GT",
            "thumbnails" => "NX",
            _ if rest.starts_with("tag:") || rest.starts_with("task:") => "NX",
            _ => return None,
        };
        Some((format!("{}:{rest}", keys.root), flag))
    }
}

/// The index in Redis (see the module docs).
#[derive(Clone)]
pub struct RedisIndex {
    connection: RedisConnection,
    keys: Keys,
    expire: redis::Script,
}

impl RedisIndex {
    /// Connects to `url`, keys under `<prefix>:{<prefix>:tags}:`, and moves the keys an older
    /// version wrote under `<prefix>:tags:` to their new names (see the module docs).
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, IndexError> {
        let connection = RedisConnection::open(url).await.map_err(IndexError::Connect)?;
        let index = Self { connection, keys: Keys::new(prefix), expire: redis::Script::new(EXPIRE) };
        let moved = migrate(&mut index.connection.clone(), prefix).await?;
        if moved > 0 {
            tracing::info!(keys = moved, "tag index keys of the old layout moved under {}", index.keys.root);
        }
        Ok(index)
    }
}

/// Moves the keys of the old layout under `<prefix>:tags:` to their new names (see the module
/// docs); returns how many moved.
async fn migrate(connection: &mut RedisConnection, prefix: &str) -> Result<usize, IndexError> {
    let (keys, old) = (Keys::new(prefix), OldKeys::new(prefix));
    let markers = [old.thumbnails(), old.indexed()];
    let mut exists = redis::pipe();
    for marker in &markers {
        exists.cmd("EXISTS").arg(marker);
    }
    let found: Vec<bool> =
        exists.query_async(connection).await.map_err(redis_err("looking for keys of the old layout"))?;
    if !found.contains(&true) {
        return Ok(0);
    }
    let pattern = old.pattern();
    let mut moved = 0;
    let mut cursor = 0_u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(SCAN_BATCH)
            .query_async(connection)
            .await
            .map_err(redis_err("listing keys of the old layout"))?;
        let batch = batch.iter().filter(|key| !markers.contains(key)).filter_map(|key| {
            let (new, flag) = old.moved(key, &keys)?;
            Some((key.as_str(), new, flag))
        });
        moved += move_keys(connection, batch).await?;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let last = markers.iter().filter_map(|key| old.moved(key, &keys).map(|(new, flag)| (key.as_str(), new, flag)));
    Ok(moved + move_keys(connection, last).await?)
}

/// Runs [`MOVE`] on each `(old name, new name, ZADD flag)` in one round trip; returns how many
/// keys moved.
async fn move_keys<'a>(
    connection: &mut RedisConnection,
    moves: impl Iterator<Item = (&'a str, String, &'static str)>,
) -> Result<usize, IndexError> {
    let script = redis::Script::new(MOVE);
    let mut pipe = redis::pipe();
    pipe.cmd("SCRIPT").arg("LOAD").arg(MOVE).ignore();
    let mut any = false;
    for (old, new, flag) in moves {
        pipe.cmd("EVALSHA").arg(script.get_hash()).arg(2).arg(old).arg(new).arg(flag);
        any = true;
    }
    if !any {
        return Ok(0);
    }
    let moved: Vec<usize> =
        pipe.query_async(connection).await.map_err(redis_err("moving keys of the old layout to their new names"))?;
    Ok(moved.into_iter().sum())
}

fn redis_err(action: &'static str) -> impl FnOnce(redis::RedisError) -> IndexError {
    move |source| IndexError::Redis { action, source }
}

#[async_trait]
impl TagIndex for RedisIndex {
    async fn index(&self, task_id: &str, tags: &[(String, f64)], at: u64) -> Result<(), IndexError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        for (tag, score) in tags {
            pipe.cmd("ZADD").arg(self.keys.tag(tag)).arg(*score).arg(task_id).ignore();
            pipe.cmd("HSET").arg(self.keys.task(task_id)).arg(tag).arg("").ignore();
        }
        pipe.cmd("ZADD").arg(self.keys.indexed()).arg("GT").arg(at).arg(task_id).ignore();
        pipe.query_async::<()>(&mut self.connection.clone()).await.map_err(redis_err("indexing tags"))
    }

    async fn set_thumbnail(&self, task_id: &str, thumbnail_key: &str, at: u64) -> Result<(), IndexError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("HSET").arg(self.keys.thumbnails()).arg(task_id).arg(thumbnail_key).ignore();
        pipe.cmd("ZADD").arg(self.keys.indexed()).arg("GT").arg(at).arg(task_id).ignore();
        pipe.query_async::<()>(&mut self.connection.clone()).await.map_err(redis_err("storing a thumbnail key"))
    }

    async fn expire(&self, before: u64, max: usize) -> Result<usize, IndexError> {
        self.expire
            .key(self.keys.indexed())
            .key(self.keys.thumbnails())
            .arg(before)
            .arg(max)
            .arg(&self.keys.root)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("expiring old entries"))
    }

    async fn search(&self, tags: &[String], mode: TagMatch, limit: usize) -> Result<Vec<Hit>, IndexError> {
        if tags.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = tags.iter().map(|t| self.keys.tag(t)).collect();
        let command = match mode {
            TagMatch::All => "ZINTER",
            TagMatch::Any => "ZUNION",
        };
        let scored: Vec<(String, f64)> = redis::cmd(command)
            .arg(keys.len())
            .arg(&keys)
            .arg("AGGREGATE")
            .arg("SUM")
            .arg("WITHSCORES")
            .query_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("searching tags"))?;
        let best = best_first(scored, limit);
        if best.is_empty() {
            return Ok(Vec::new());
        }
        let task_ids: Vec<&str> = best.iter().map(|(id, _)| id.as_str()).collect();
        let thumbnails: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(self.keys.thumbnails())
            .arg(&task_ids)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("reading thumbnail keys"))?;
        Ok(best
            .into_iter()
            .zip(thumbnails)
            .map(|((task_id, score), thumbnail_key)| Hit { task_id, score, thumbnail_key })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_old_name_the_index_wrote_moves_under_the_hash_tag_and_nothing_else_does() {
        let (keys, old) = (Keys::new("ip"), OldKeys::new("ip"));
        let moved = |name: &str| old.moved(name, &keys);
        assert_eq!(moved("ip:tags:tag:tiger cat"), Some(("ip:{ip:tags}:tag:tiger cat".into(), "NX")));
        assert_eq!(moved("ip:tags:tag:a:b"), Some((keys.tag("a:b"), "NX")));
        assert_eq!(moved("ip:tags:task:tsk_1"), Some((keys.task("tsk_1"), "NX")));
        assert_eq!(moved("ip:tags:indexed"), Some((keys.indexed(), "GT")));
        assert_eq!(moved("ip:tags:thumbnails"), Some((keys.thumbnails(), "NX")));
        for foreign in ["ip:tags:other", "ip:tagsx:tag:cat", "ipx:tags:tag:cat", "ip:{ip:tags}:tag:cat", "ip:tags:"] {
            assert_eq!(moved(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn the_scan_pattern_matches_the_old_prefix_literally() {
        assert_eq!(OldKeys::new("ip").pattern(), "ip:tags:*");
        assert_eq!(OldKeys::new("a*b[c]?\\").pattern(), r"a\*b\[c\]\?\\:tags:*");
    }
}
