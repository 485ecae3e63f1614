//! The tag index: tag → task ids with the tag's score, and each task's thumbnail key.
//!
//! [`RedisIndex`] keeps one sorted set per tag (`<prefix>:tags:tag:<tag>`, member task id,
//! score the tag's score) and one hash of thumbnail keys (`<prefix>:tags:thumbnails`);
//! [`EmbeddedIndex`] holds the same in the group's redb file under `store.path`
//! (`tag-indexer.redb`, kept across restarts), [`MemoryIndex`] in process memory (tests). Writing
//! the same tag, task and score again changes nothing, so re-indexing an event is harmless.
//!
//! Nothing stays for ever: every write carries the time of its event, the index remembers each
//! task's latest (`<prefix>:tags:indexed`, a sorted set by time) and the tags it has
//! (`<prefix>:tags:task:<id>`, a hash of tag → empty: small hashes are kept compact, small
//! sets are not before Redis 7.2), and [`TagIndex::expire`] drops every entry of the tasks whose
//! latest event is older than the retention (the coordinator's, so a task leaves the index
//! when it leaves the coordinator).

mod embedded;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;
use imagepipe_runtime::embedded::EmbeddedError;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};

pub use embedded::EmbeddedIndex;

/// How several query tags combine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TagMatch {
    /// Tasks having every tag; score: the sum of their scores.
    #[default]
    All,
    /// Tasks having at least one tag; score: the sum of the scores of the tags they have.
    Any,
}

/// One search result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hit {
    /// The task.
    pub task_id: String,
    /// Summed score of the matched tags.
    pub score: f64,
    /// Blob key of the task's thumbnail, once the metadata step has reported it.
    pub thumbnail_key: Option<String>,
}

/// The index could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Connecting to Redis failed.
    #[error("connecting to Redis for the tag index")]
    Connect(#[source] redis::RedisError),
    /// A Redis command failed.
    #[error("tag index: {action}")]
    Redis {
        /// What was being done.
        action: &'static str,
        /// What Redis said.
        #[source]
        source: redis::RedisError,
    },
    /// The embedded file failed.
    #[error("tag index")]
    Embedded(#[source] EmbeddedError),
}

/// Where tags and thumbnails are indexed.
#[async_trait]
pub trait TagIndex: Send + Sync + 'static {
    /// Records that `task_id` has each of `tags` with its score, from an event of time `at`
    /// (Unix ms).
    async fn index(&self, task_id: &str, tags: &[(String, f64)], at: u64) -> Result<(), IndexError>;
    /// Records the thumbnail of `task_id`, from an event of time `at` (Unix ms).
    async fn set_thumbnail(&self, task_id: &str, thumbnail_key: &str, at: u64) -> Result<(), IndexError>;
    /// Drops every entry (tags, thumbnail) of up to `max` tasks whose latest event is at or
    /// before `before` (Unix ms); returns how many tasks.
    async fn expire(&self, before: u64, max: usize) -> Result<usize, IndexError>;
    /// The best `limit` tasks matching `tags` by `mode`, best first (ties by task id).
    async fn search(&self, tags: &[String], mode: TagMatch, limit: usize) -> Result<Vec<Hit>, IndexError>;
}

/// Drops the entries of up to ARGV[2] tasks whose latest event (KEYS[1], the indexed set) is at
/// or before ARGV[1]: their tag entries (tag keys under ARGV[3], found in each task's hash of
/// tags), their tag hash and their thumbnail (KEYS[2]). Returns how many tasks.
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

/// The index in Redis, keys under `<prefix>:tags:`.
#[derive(Clone)]
pub struct RedisIndex {
    connection: ConnectionManager,
    prefix: String,
    expire: redis::Script,
}

impl RedisIndex {
    /// Connects to `url`, keys under `<prefix>:tags:`.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, IndexError> {
        let client = redis::Client::open(url).map_err(IndexError::Connect)?;
        let connection = ConnectionManager::new(client).await.map_err(IndexError::Connect)?;
        Ok(Self { connection, prefix: format!("{prefix}:tags"), expire: redis::Script::new(EXPIRE) })
    }

    fn tag_key(&self, tag: &str) -> String {
        format!("{}:tag:{tag}", self.prefix)
    }

    fn task_key(&self, task_id: &str) -> String {
        format!("{}:task:{task_id}", self.prefix)
    }

    fn indexed_key(&self) -> String {
        format!("{}:indexed", self.prefix)
    }

    fn thumbnails_key(&self) -> String {
        format!("{}:thumbnails", self.prefix)
    }
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
            pipe.cmd("ZADD").arg(self.tag_key(tag)).arg(*score).arg(task_id).ignore();
            pipe.cmd("HSET").arg(self.task_key(task_id)).arg(tag).arg("").ignore();
        }
        pipe.cmd("ZADD").arg(self.indexed_key()).arg("GT").arg(at).arg(task_id).ignore();
        pipe.query_async::<()>(&mut self.connection.clone()).await.map_err(redis_err("indexing tags"))
    }

    async fn set_thumbnail(&self, task_id: &str, thumbnail_key: &str, at: u64) -> Result<(), IndexError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("HSET").arg(self.thumbnails_key()).arg(task_id).arg(thumbnail_key).ignore();
        pipe.cmd("ZADD").arg(self.indexed_key()).arg("GT").arg(at).arg(task_id).ignore();
        pipe.query_async::<()>(&mut self.connection.clone()).await.map_err(redis_err("storing a thumbnail key"))
    }

    async fn expire(&self, before: u64, max: usize) -> Result<usize, IndexError> {
        self.expire
            .key(self.indexed_key())
            .key(self.thumbnails_key())
            .arg(before)
            .arg(max)
            .arg(&self.prefix)
            .invoke_async(&mut self.connection.clone())
            .await
            .map_err(redis_err("expiring old entries"))
    }

    async fn search(&self, tags: &[String], mode: TagMatch, limit: usize) -> Result<Vec<Hit>, IndexError> {
        if tags.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let keys: Vec<String> = tags.iter().map(|t| self.tag_key(t)).collect();
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
            .arg(self.thumbnails_key())
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

/// Sorts by score descending, then task id, and keeps `limit`.
fn best_first(mut scored: Vec<(String, f64)>, limit: usize) -> Vec<(String, f64)> {
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    scored.truncate(limit);
    scored
}

/// The best `limit` tasks of `matches` (every task of each of the `tags` query tags, with that
/// tag's score) by `mode`, with their summed scores, best first.
fn best_matching(
    matches: impl IntoIterator<Item = (String, f64)>,
    tags: usize,
    mode: TagMatch,
    limit: usize,
) -> Vec<(String, f64)> {
    let mut scores: HashMap<String, (f64, usize)> = HashMap::new();
    for (task_id, score) in matches {
        let entry = scores.entry(task_id).or_default();
        entry.0 += score;
        entry.1 += 1;
    }
    let scored = scores
        .into_iter()
        .filter(|(_, (_, matched))| mode == TagMatch::Any || *matched == tags)
        .map(|(task_id, (score, _))| (task_id, score))
        .collect();
    best_first(scored, limit)
}

/// The index in process memory, gone with the process (tests, handlers run in process).
#[derive(Debug, Default)]
pub struct MemoryIndex {
    inner: Mutex<Tables>,
}

#[derive(Debug, Default)]
struct Tables {
    tags: HashMap<String, HashMap<String, f64>>,
    thumbnails: HashMap<String, String>,
    /// Each task's latest event time and its tags.
    tasks: HashMap<String, (u64, HashSet<String>)>,
    /// `(latest event time, task id)`, oldest first.
    by_time: BTreeSet<(u64, String)>,
}

impl Tables {
    /// Notes an event of time `at` for `task_id` (the latest one counts) and its `tags`.
    fn touch<'t>(&mut self, task_id: &str, at: u64, tags: impl IntoIterator<Item = &'t String>) {
        let (latest, known) = self.tasks.entry(task_id.to_owned()).or_insert_with(|| (at, HashSet::new()));
        if at > *latest {
            self.by_time.remove(&(*latest, task_id.to_owned()));
            *latest = at;
        }
        self.by_time.insert((*latest, task_id.to_owned()));
        known.extend(tags.into_iter().cloned());
    }
}

impl MemoryIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl TagIndex for MemoryIndex {
    async fn index(&self, task_id: &str, tags: &[(String, f64)], at: u64) -> Result<(), IndexError> {
        let mut tables = self.inner.lock().expect("tag index lock");
        for (tag, score) in tags {
            tables.tags.entry(tag.clone()).or_default().insert(task_id.to_owned(), *score);
        }
        tables.touch(task_id, at, tags.iter().map(|(tag, _)| tag));
        Ok(())
    }

    async fn set_thumbnail(&self, task_id: &str, thumbnail_key: &str, at: u64) -> Result<(), IndexError> {
        let mut tables = self.inner.lock().expect("tag index lock");
        tables.thumbnails.insert(task_id.to_owned(), thumbnail_key.to_owned());
        tables.touch(task_id, at, []);
        Ok(())
    }

    async fn expire(&self, before: u64, max: usize) -> Result<usize, IndexError> {
        let mut tables = self.inner.lock().expect("tag index lock");
        let old: Vec<(u64, String)> =
            tables.by_time.iter().take_while(|(at, _)| *at <= before).take(max).cloned().collect();
        for entry in &old {
            tables.by_time.remove(entry);
            let task_id = &entry.1;
            for tag in tables.tasks.remove(task_id).map(|(_, tags)| tags).unwrap_or_default() {
                if let Some(tasks) = tables.tags.get_mut(&tag) {
                    tasks.remove(task_id);
                    if tasks.is_empty() {
                        tables.tags.remove(&tag);
                    }
                }
            }
            tables.thumbnails.remove(task_id);
        }
        Ok(old.len())
    }

    async fn search(&self, tags: &[String], mode: TagMatch, limit: usize) -> Result<Vec<Hit>, IndexError> {
        let tables = self.inner.lock().expect("tag index lock");
        let matches = tags
            .iter()
            .flat_map(|tag| tables.tags.get(tag).into_iter().flatten())
            .map(|(task_id, score)| (task_id.clone(), *score));
        Ok(best_matching(matches, tags.len(), mode, limit)
            .into_iter()
            .map(|(task_id, score)| {
                let thumbnail_key = tables.thumbnails.get(&task_id).cloned();
                Hit { task_id, score, thumbnail_key }
            })
            .collect())
    }
}
