//! The tag index: tag → task ids with the tag's score, and each task's thumbnail key.
//!
//! [`RedisIndex`] keeps one sorted set per tag (member task id, score the tag's score) and one
//! hash of thumbnail keys, every key under `<prefix>:{<prefix>:tags}:`, one Redis Cluster slot
//! (its module docs have the layout, the trade-off and the move from the old layout);
//! [`EmbeddedIndex`] holds the same in the group's redb file under `store.path`
//! (`tag-indexer.redb`, kept across restarts), [`MemoryIndex`] in process memory (tests). Writing
//! the same tag, task and score again changes nothing, so re-indexing an event is harmless.
//!
//! Nothing stays for ever: every write carries the time of its event, the index remembers each
//! task's latest (Redis: a sorted set by time) and the tags it has (Redis: a hash per task), and
//! [`TagIndex::expire`] drops every entry of the tasks whose latest event is older than the
//! retention (the coordinator's, so a task leaves the index when it leaves the coordinator).

mod embedded;
mod redis;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;

use async_trait::async_trait;
use imagepipe_runtime::embedded::EmbeddedError;
use serde::{Deserialize, Serialize};

pub use self::redis::RedisIndex;
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
    Connect(#[source] ::redis::RedisError),
    /// A Redis command failed.
    #[error("tag index: {action}")]
    Redis {
        /// What was being done.
        action: &'static str,
        /// What Redis said.
        #[source]
        source: ::redis::RedisError,
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
