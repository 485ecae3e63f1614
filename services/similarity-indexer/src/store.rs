//! The similarity store: what the indexer knows of each analysed image ([`Entry`]: its
//! perceptual hash, thumbnail key, embedding and the near pairs found for it), and a change log
//! that every replica's in-memory index ([`LiveIndex`](crate::LiveIndex)) follows.
//!
//! Each write gives the task the next sequence number of the log, so a reader asking for the
//! changes after its cursor gets every entry written since, once, in order; an entry that
//! expired comes back as a removal. [`SimilarityStore::clear`] (a rebuild) starts a new epoch:
//! readers that see the epoch change drop what they hold and read from the start.
//!
//! [`RedisStore`] keeps every key in one Redis Cluster slot (`<prefix>:{<prefix>:similarity}:…`);
//! [`EmbeddedStore`] keeps the same in the group's redb file under `store.path`.

mod embedded;
mod redis;

use async_trait::async_trait;
use imagepipe_contracts::{Embedding, Labels};
use imagepipe_runtime::embedded::EmbeddedError;
use serde::{Deserialize, Serialize};

pub use self::embedded::EmbeddedStore;
pub use self::redis::RedisStore;

/// Removals older than this leave the change log (a reader further behind reads from the start).
pub const TOMBSTONE_TTL_MS: u64 = 3_600_000;

/// What the indexer knows of one task's image.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// The task.
    pub task_id: String,
    /// Time of the first event seen for it, Unix ms: of two near-duplicates, the later one is
    /// announced as the duplicate.
    pub created: u64,
    /// Time of its latest event, Unix ms (expiry goes by it).
    pub at: u64,
    /// Its 64-bit perceptual hash, from `image.metadata_extracted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phash: Option<u64>,
    /// Its thumbnail's blob key, from `image.metadata_extracted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thumbnail_key: Option<String>,
    /// Its embedding, from `image.analyzed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embedding: Option<Embedding>,
    /// The task's labels, as its latest event carried them.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// The earlier images found near it once it had both a hash and an embedding.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<Pair>,
}

impl Entry {
    /// Whether it has what near-duplicate detection compares: a hash and an embedding.
    pub fn is_complete(&self) -> bool {
        self.phash.is_some() && self.embedding.is_some()
    }
}

/// An earlier image near an entry's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pair {
    /// The earlier task.
    pub task_id: String,
    /// Cosine of the two embeddings, when both have one of one version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cosine: Option<f64>,
    /// Hamming distance of the two perceptual hashes, when both have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phash_distance: Option<u32>,
}

/// What an event adds to an entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// `image.metadata_extracted`: the hash and thumbnail.
    Metadata {
        /// The perceptual hash.
        phash: Option<u64>,
        /// The thumbnail's blob key.
        thumbnail_key: String,
        /// The task's labels.
        labels: Labels,
    },
    /// `image.analyzed`: the embedding.
    Embedding {
        /// The embedding.
        embedding: Embedding,
        /// The task's labels.
        labels: Labels,
    },
    /// The near pairs found for it (replacing earlier ones).
    Pairs(Vec<Pair>),
}

impl Change {
    /// Applies the change to `entry`, an event of time `at` (Unix ms).
    pub fn apply(self, entry: &mut Entry, at: u64) {
        if entry.created == 0 || at < entry.created {
            entry.created = at;
        }
        entry.at = entry.at.max(at);
        match self {
            Change::Metadata { phash, thumbnail_key, labels } => {
                entry.phash = phash;
                entry.thumbnail_key = Some(thumbnail_key);
                entry.labels = labels;
            }
            Change::Embedding { embedding, labels } => {
                entry.embedding = Some(embedding);
                entry.labels = labels;
            }
            Change::Pairs(pairs) => entry.pairs = pairs,
        }
    }
}

/// One item of the change log.
#[derive(Debug, Clone, PartialEq)]
pub struct Changed {
    /// Its place in the log.
    pub seq: u64,
    /// The task.
    pub task_id: String,
    /// The entry as it is now; `None` when it was removed.
    pub entry: Option<Entry>,
}

/// A page of the change log.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Changes {
    /// The store's epoch (see the module docs).
    pub epoch: u64,
    /// The changes after the cursor asked for, in order.
    pub items: Vec<Changed>,
}

/// The store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Connecting to Redis failed.
    #[error("connecting to Redis for the similarity store")]
    Connect(#[source] ::redis::RedisError),
    /// A Redis command failed.
    #[error("similarity store: {action}")]
    Redis {
        /// What was being done.
        action: &'static str,
        /// What Redis said.
        #[source]
        source: ::redis::RedisError,
    },
    /// The embedded file failed.
    #[error("similarity store")]
    Embedded(#[source] EmbeddedError),
    /// A stored entry could not be read back.
    #[error("similarity store: the entry of {task_id} is unreadable: {reason}")]
    Corrupt {
        /// The task.
        task_id: String,
        /// What is wrong.
        reason: String,
    },
}

/// Where the similarity entries and their change log live.
#[async_trait]
pub trait SimilarityStore: Send + Sync + 'static {
    /// Applies `change` to the entry of `task_id` (creating it), from an event of time `at`
    /// (Unix ms), logs it, and returns the entry as it is now.
    async fn update(&self, task_id: &str, at: u64, change: Change) -> Result<Entry, StoreError>;
    /// The entry of `task_id`.
    async fn entry(&self, task_id: &str) -> Result<Option<Entry>, StoreError>;
    /// Up to `limit` changes after sequence number `after`, with the epoch.
    async fn changes(&self, after: u64, limit: usize) -> Result<Changes, StoreError>;
    /// Removes up to `max` entries whose latest event is at or before `before` (Unix ms), and
    /// drops removals older than [`TOMBSTONE_TTL_MS`] at `now` from the log; returns how many
    /// entries.
    async fn expire(&self, before: u64, now: u64, max: usize) -> Result<usize, StoreError>;
    /// Removes every entry and starts a new epoch, which it returns.
    async fn clear(&self) -> Result<u64, StoreError>;
}

/// The entry's JSON.
fn encode(entry: &Entry) -> Vec<u8> {
    serde_json::to_vec(entry).expect("an entry serializes")
}

/// An entry from its JSON.
fn decode(task_id: &str, bytes: &[u8]) -> Result<Entry, StoreError> {
    serde_json::from_slice(bytes)
        .map_err(|e| StoreError::Corrupt { task_id: task_id.to_owned(), reason: e.to_string() })
}

#[cfg(test)]
mod tests;
