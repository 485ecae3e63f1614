//! The values the [`TaskStore`](super::TaskStore) methods take and return: errors, write
//! outcomes, and archived dead letters.

use std::borrow::Cow;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::task::{Task, TaskState};

/// A store operation that failed; the coordinator retries it or surfaces it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The Redis server failed or could not be reached.
    #[error("redis {operation}")]
    Redis {
        /// What was being done.
        operation: &'static str,
        /// Client error.
        #[source]
        source: ::redis::RedisError,
    },
    /// Fewer replicas than `store.redis.min_replicas` acknowledged a batch of transitions in
    /// time: the batch is written on its primary but might not survive its loss.
    #[error(
        "{acked} replica(s) acknowledged the transitions within {timeout_ms} ms, store.redis.min_replicas is \
         {wanted}: the batch is not acknowledged (its inputs are retried)"
    )]
    NotReplicated {
        /// `store.redis.min_replicas`.
        wanted: u32,
        /// The fewest replicas a written primary reported.
        acked: u32,
        /// How long `WAIT` waited.
        timeout_ms: u64,
    },
    /// The embedded database failed.
    #[error("embedded store {operation}: {message}")]
    Embedded {
        /// What was being done.
        operation: &'static str,
        /// The database's error.
        message: String,
    },
    /// A stored record does not decode: the store was written by something else.
    #[error("stored {what} of {id} is corrupt: {message}")]
    Corrupt {
        /// Which record.
        what: &'static str,
        /// Its key.
        id: String,
        /// The decoding error.
        message: String,
    },
    /// A list cursor that this store did not hand out.
    #[error("invalid cursor {0:?}")]
    InvalidCursor(String),
    /// The store was set up with another number of shards: tasks would change shards.
    #[error(
        "coordinator.shards is {configured} but this store was written with {stored} shards; the shard \
         count of a live system cannot change (every task's shard would move): set it back to {stored}"
    )]
    ShardsChanged {
        /// The count the store holds.
        stored: u16,
        /// The count this process was configured with.
        configured: u16,
    },
    /// A new task was not written: its fence is not the shard's current lease (another replica
    /// owns the shard, or this replica's lease ran out). [`TaskStore::apply_many`](super::TaskStore::apply_many)
    /// reports the same as [`Applied::Fenced`].
    #[error(
        "task {task} was not written: the lease on its shard {shard} is no longer at fencing token {token} \
         (the shard is another replica's now, or the lease ran out)"
    )]
    Fenced {
        /// The task.
        task: String,
        /// Its shard.
        shard: u16,
        /// The token the write carried.
        token: u64,
    },
    /// A replica id that cannot name a lease's owner or an announcement.
    #[error("{operation}: a replica id must not be empty")]
    EmptyReplicaId {
        /// What was being done.
        operation: &'static str,
    },
}

/// What [`TaskStore::create`](super::TaskStore::create) did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// The task was written.
    New,
    /// A task with this id, or with this idempotency key, already exists; nothing was written.
    Existing(Box<Task>),
}

/// What [`TaskStore::apply`](super::TaskStore::apply) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The transition was written.
    Yes,
    /// The task had moved on (or does not exist): re-read it and decide again.
    Conflict,
    /// The write's [`Fence`](crate::machine::Fence) is not the shard's current lease: this
    /// replica no longer owns the shard and must not write it.
    Fenced,
}

/// What [`TaskStore::settle`](super::TaskStore::settle) does for one task.
#[derive(Debug, Clone, Copy)]
pub struct Settled<'a> {
    /// The task.
    pub task: &'a str,
    /// Its outbox entries that need no relaying any more.
    pub relayed: &'a [String],
    /// The state its last transition wrote, when it is to be settled in the indexes.
    pub state: Option<TaskState>,
}
/// A dead-lettered message, archived by the coordinator so operators can inspect, replay or
/// purge it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetter {
    /// Archive id.
    pub id: String,
    /// The queue or subscriber group the message was taken from.
    pub source: String,
    /// The dead-letter queue it arrived on.
    pub dlq: String,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Deliveries before it was dead-lettered.
    pub delivery_count: u32,
    /// When it was dead-lettered, Unix ms.
    pub dead_lettered_at: u64,
    /// The message key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The message id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// The original headers (the dead-letter headers removed).
    pub headers: Vec<(String, String)>,
    /// The body, as UTF-8 when it is, else lossily converted.
    pub body: String,
}

/// Most bytes of a dead letter's body the archive keeps; a longer body is cut at a UTF-8
/// character boundary, and the entry carries [`BODY_CUT_HEADER`].
pub const DEAD_LETTER_BODY_BYTES: usize = 64 * 1024;

/// Header of an archived dead letter whose body was cut to [`DEAD_LETTER_BODY_BYTES`]: the
/// original body's length in bytes. Such a letter is kept for inspection and cannot be replayed.
pub const BODY_CUT_HEADER: &str = "imagepipe-dlq-body-bytes";

impl DeadLetter {
    /// The letter as the archive keeps it: the body cut to [`DEAD_LETTER_BODY_BYTES`] (and
    /// [`BODY_CUT_HEADER`] added) when longer.
    pub fn capped(&self) -> Cow<'_, DeadLetter> {
        if self.body.len() <= DEAD_LETTER_BODY_BYTES {
            return Cow::Borrowed(self);
        }
        let mut end = DEAD_LETTER_BODY_BYTES;
        while !self.body.is_char_boundary(end) {
            end -= 1;
        }
        let mut capped = self.clone();
        capped.body.truncate(end);
        capped.headers.push((BODY_CUT_HEADER.to_owned(), self.body.len().to_string()));
        Cow::Owned(capped)
    }

    /// Whether the archive cut this letter's body (so it cannot be replayed as it was).
    pub fn body_was_cut(&self) -> bool {
        self.headers.iter().any(|(name, _)| name == BODY_CUT_HEADER)
    }
}

/// A page of dead letters, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterPage {
    /// The entries.
    pub entries: Vec<DeadLetter>,
    /// Pass it as `cursor` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}
