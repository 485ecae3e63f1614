//! [`EmbeddedIndex`]: the tag index in the tag indexer group's redb file under `store.path`
//! (`tag-indexer.redb`), kept across restarts, beside the group's dedup set. The tables hold
//! what the Redis keys hold: each tag's tasks with their scores, each task's tags, thumbnails,
//! and each task's latest event time with an index by it for [`TagIndex::expire`].

use async_trait::async_trait;
use imagepipe_runtime::embedded::EmbeddedDb;
use redb::{ReadableTable, TableDefinition, WriteTransaction};

use super::{Hit, IndexError, TagIndex, TagMatch, best_matching};

/// (tag, task) → the tag's score.
const TAG_TASKS: TableDefinition<(&str, &str), f64> = TableDefinition::new("tags_by_tag");
/// (task, tag): every tag a task has.
const TASK_TAGS: TableDefinition<(&str, &str), ()> = TableDefinition::new("tags_by_task");
/// Task → its thumbnail's blob key.
const THUMBNAILS: TableDefinition<&str, &str> = TableDefinition::new("tags_thumbnails");
/// Task → the time of its latest event, Unix ms.
const LATEST: TableDefinition<&str, u64> = TableDefinition::new("tags_latest");
/// (latest event time, task): the tasks oldest first.
const BY_TIME: TableDefinition<(u64, &str), ()> = TableDefinition::new("tags_by_time");

/// The index in an embedded database file (see the module docs).
#[derive(Debug, Clone)]
pub struct EmbeddedIndex {
    db: EmbeddedDb,
}

impl EmbeddedIndex {
    /// The index in `db` (its tables created when new).
    pub async fn open(db: EmbeddedDb) -> Result<Self, IndexError> {
        db.write("creating the tag index tables", |txn| {
            txn.open_table(TAG_TASKS)?;
            txn.open_table(TASK_TAGS)?;
            txn.open_table(THUMBNAILS)?;
            txn.open_table(LATEST)?;
            txn.open_table(BY_TIME)?;
            Ok(())
        })
        .await
        .map_err(IndexError::Embedded)?;
        Ok(Self { db })
    }
}

/// Notes an event of time `at` for `task_id`: the latest one counts (Redis `ZADD GT`).
fn touch(txn: &WriteTransaction, task_id: &str, at: u64) -> Result<(), redb::Error> {
    let mut latest = txn.open_table(LATEST)?;
    let previous = latest.get(task_id)?.map(|v| v.value());
    if previous.is_some_and(|previous| previous >= at) {
        return Ok(());
    }
    let mut by_time = txn.open_table(BY_TIME)?;
    if let Some(previous) = previous {
        by_time.remove((previous, task_id))?;
    }
    latest.insert(task_id, at)?;
    by_time.insert((at, task_id), ())?;
    Ok(())
}

/// Each key of `table` whose first part is `first`: its second part and its value, to `each`.
fn each_under<V: redb::Value + 'static>(
    table: &impl ReadableTable<(&'static str, &'static str), V>,
    first: &str,
    mut each: impl FnMut(&str, V::SelfType<'_>),
) -> Result<(), redb::Error> {
    for row in table.range((first, "")..)? {
        let (key, value) = row?;
        let (of, second) = key.value();
        if of != first {
            break;
        }
        each(second, value.value());
    }
    Ok(())
}

#[async_trait]
impl TagIndex for EmbeddedIndex {
    async fn index(&self, task_id: &str, tags: &[(String, f64)], at: u64) -> Result<(), IndexError> {
        let (task_id, tags) = (task_id.to_owned(), tags.to_vec());
        self.db
            .write("indexing tags", move |txn| {
                let mut tag_tasks = txn.open_table(TAG_TASKS)?;
                let mut task_tags = txn.open_table(TASK_TAGS)?;
                for (tag, score) in &tags {
                    tag_tasks.insert((tag.as_str(), task_id.as_str()), score)?;
                    task_tags.insert((task_id.as_str(), tag.as_str()), ())?;
                }
                touch(txn, &task_id, at)
            })
            .await
            .map_err(IndexError::Embedded)
    }

    async fn set_thumbnail(&self, task_id: &str, thumbnail_key: &str, at: u64) -> Result<(), IndexError> {
        let (task_id, thumbnail_key) = (task_id.to_owned(), thumbnail_key.to_owned());
        self.db
            .write("storing a thumbnail key", move |txn| {
                txn.open_table(THUMBNAILS)?.insert(task_id.as_str(), thumbnail_key.as_str())?;
                touch(txn, &task_id, at)
            })
            .await
            .map_err(IndexError::Embedded)
    }

    async fn expire(&self, before: u64, max: usize) -> Result<usize, IndexError> {
        self.db
            .write("expiring old entries", move |txn| {
                let mut by_time = txn.open_table(BY_TIME)?;
                let mut old = Vec::new();
                for row in by_time.iter()?.take(max) {
                    let (key, _) = row?;
                    let (at, task_id) = key.value();
                    if at > before {
                        break;
                    }
                    old.push((at, task_id.to_owned()));
                }
                let mut tag_tasks = txn.open_table(TAG_TASKS)?;
                let mut task_tags = txn.open_table(TASK_TAGS)?;
                let mut thumbnails = txn.open_table(THUMBNAILS)?;
                let mut latest = txn.open_table(LATEST)?;
                for (at, task_id) in &old {
                    let mut tags = Vec::new();
                    each_under(&task_tags, task_id, |tag, ()| tags.push(tag.to_owned()))?;
                    for tag in tags {
                        tag_tasks.remove((tag.as_str(), task_id.as_str()))?;
                        task_tags.remove((task_id.as_str(), tag.as_str()))?;
                    }
                    thumbnails.remove(task_id.as_str())?;
                    latest.remove(task_id.as_str())?;
                    by_time.remove((*at, task_id.as_str()))?;
                }
                Ok(old.len())
            })
            .await
            .map_err(IndexError::Embedded)
    }

    async fn search(&self, tags: &[String], mode: TagMatch, limit: usize) -> Result<Vec<Hit>, IndexError> {
        let tags = tags.to_vec();
        self.db
            .read("searching tags", move |txn| {
                let tag_tasks = txn.open_table(TAG_TASKS)?;
                let mut matches = Vec::new();
                for tag in &tags {
                    each_under(&tag_tasks, tag, |task_id, score| matches.push((task_id.to_owned(), score)))?;
                }
                let thumbnails = txn.open_table(THUMBNAILS)?;
                best_matching(matches, tags.len(), mode, limit)
                    .into_iter()
                    .map(|(task_id, score)| {
                        let thumbnail_key = thumbnails.get(task_id.as_str())?.map(|key| key.value().to_owned());
                        Ok(Hit { task_id, score, thumbnail_key })
                    })
                    .collect()
            })
            .await
            .map_err(IndexError::Embedded)
    }
}
