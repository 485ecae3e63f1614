//! Where tasks live: the [`TaskStore`] seam and its two backends.
//!
//! - [`redis::RedisStore`] (production, shared by coordinator replicas).
//! - [`embedded::EmbeddedStore`] (one process, file-backed with redb; `imagepipe run`).
//!
//! Every transition is one atomic write of the task (compare-and-set on its version), its
//! history entry and its outbox entries. Besides the tasks, a store keeps a *wake index*: for
//! each task that needs the coordinator's attention later (a timer, or outbox entries the fast
//! path did not relay), the time to look at it. [`TaskStore::claim_due`] hands each due entry
//! to exactly one caller for a lease; [`TaskStore::release`] re-indexes the task from its
//! stored state after the caller is done. Both stores pass the same suite (`suite`).
//!
//! Nothing grows without bound: a *finished index* (tasks that completed, failed or were
//! cancelled, by the time of their last transition) lets [`TaskStore::expire_finished`] delete
//! every record and index entry of a task once it is older than the retention, and
//! [`TaskStore::trim_dead_letters`] keeps the dead-letter archive within its limits; every
//! archived body is cut to [`DEAD_LETTER_BODY_BYTES`].
//!
//! A *blob reference index* records which tasks reference which blobs ([`blob_keys`]: the
//! uploaded source, the downloaded image, every derivative), added with each write of a task
//! and kept while the task lives (a derivative a reprocessing replaced stays referenced until
//! its task expires). Expiring a task drops its references, and a blob it was the last task to
//! reference becomes *released* ([`TaskStore::take_released_blobs`]): the blob sweeper
//! ([`crate::blob_sweep`]) deletes it, and any other blob [`TaskStore::referenced_blobs`] says
//! no task references, once it is older than `blob.orphan_grace`.

pub mod embedded;
pub mod redis;
#[cfg(test)]
pub(crate) mod suite;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::machine::Decision;
use crate::task::{HistoryEntry, OutboxEntry, Task, TaskState};
use imagepipe_contracts::ImageSource;

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
}

/// What [`TaskStore::create`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// The task was written.
    New,
    /// A task with this id, or with this idempotency key, already exists; nothing was written.
    Existing(Box<Task>),
}

/// What [`TaskStore::apply`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The transition was written.
    Yes,
    /// The task had moved on (or does not exist): re-read it and decide again.
    Conflict,
}

/// What [`TaskStore::settle`] does for one task.
#[derive(Debug, Clone, Copy)]
pub struct Settled<'a> {
    /// The task.
    pub task: &'a str,
    /// Its outbox entries that need no relaying any more.
    pub relayed: &'a [String],
    /// The state its last transition wrote, when it is to be settled in the indexes.
    pub state: Option<TaskState>,
}

/// Which tasks a page lists, and in which order.
///
/// A listing runs through an index: the creation index (score: `created_at`) without a
/// `state`, else that state's index (score: [`Task::index_at`], the creation time but while
/// queued, where higher priorities sort first). `created_after` / `created_before` are range
/// bounds of the scan where the score is the creation time; on the queued index, and for
/// `label`, tasks are filtered while scanning, at most [`LABEL_SCAN_LIMIT`] index entries per
/// page, so such a page may be short, or empty, and still carry a `next_cursor`.
///
/// ```
/// # use imagepipe_coordinator::store::{ListOrder, ListQuery};
/// let newest = ListQuery { limit: 50, order: ListOrder::Newest, ..ListQuery::default() };
/// # assert!(newest.state.is_none());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Most tasks on the page.
    pub limit: usize,
    /// Where the previous page ended (the `next_cursor` of a page of either order: a position
    /// in the index, so a cursor of one order continues from there in the other).
    pub cursor: Option<String>,
    /// Oldest first (the default) or newest first, by the index's score.
    pub order: ListOrder,
    /// Only tasks created at or after this time, Unix ms.
    pub created_after: Option<u64>,
    /// Only tasks created before this time, Unix ms.
    pub created_before: Option<u64>,
    /// Only tasks whose labels have this key with this value.
    pub label: Option<LabelFilter>,
}

/// Which way a listing runs through its index.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListOrder {
    /// Ascending score: creation time, or [`Task::index_at`] within a state.
    #[default]
    Oldest,
    /// Descending score.
    Newest,
}

impl ListOrder {
    /// `oldest` or `newest`, as the API takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Oldest => "oldest",
            Self::Newest => "newest",
        }
    }
}

impl std::str::FromStr for ListOrder {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "oldest" => Ok(Self::Oldest),
            "newest" => Ok(Self::Newest),
            _ => Err(format!("must be `oldest` or `newest` (got {s:?})")),
        }
    }
}

/// One label a listed task must carry: `key` with exactly `value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelFilter {
    /// The label key.
    pub key: String,
    /// Its value.
    pub value: String,
}

impl LabelFilter {
    /// Whether `task` carries this label.
    pub fn matches(&self, task: &Task) -> bool {
        task.labels.get(&self.key).is_some_and(|v| *v == self.value)
    }
}

/// Most index entries a listing scans for one page when it filters while scanning (by `label`,
/// or by creation time on the queued index): past it, the page ends short (possibly empty) with
/// a `next_cursor` to scan on from.
pub const LABEL_SCAN_LIMIT: usize = 5_000;

/// A page of tasks, in the order the query asked (oldest first by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskPage {
    /// The tasks.
    pub tasks: Vec<Task>,
    /// Pass it as `cursor` for the next page; absent on the last page. A listing filtered by
    /// `label` (or by creation time while listing queued tasks) scans a bounded number of
    /// entries per page, so a page short of the limit, even an empty one, may still have it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
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

/// The coordinator's state store.
#[async_trait]
pub trait TaskStore: Send + Sync + 'static {
    /// Writes a new task (`decision` from [`crate::machine::create`]) unless its id, or its
    /// idempotency key, is taken; then returns the task that has it.
    async fn create(&self, decision: &Decision) -> Result<Created, StoreError>;

    /// Writes `decision` if the stored task is still at version `decision.task.version - 1`,
    /// and then settles its index entries ([`settle`](Self::settle)).
    async fn apply(&self, decision: &Decision) -> Result<Applied, StoreError> {
        let applied = self.apply_many(std::slice::from_ref(decision)).await?;
        let applied = applied.into_iter().next().unwrap_or(Applied::Conflict);
        if applied == Applied::Yes {
            let task = &decision.task;
            self.settle(&[Settled { task: &task.id, relayed: &[], state: Some(task.state) }]).await?;
        }
        Ok(applied)
    }

    /// Writes each of `decisions` (of distinct tasks) whose task is still at version
    /// `task.version - 1`, an absent task counting as version 0 (so a decision of
    /// [`crate::machine::create`] without an idempotency key creates its task): each one a
    /// compare-and-set of its own, all of them in one round trip (Redis) or one write
    /// transaction (embedded: one commit for the batch). One [`Applied`] per decision, in order.
    ///
    /// A written task may stay listed under the state it left (readers skip such entries) and
    /// counted in flight until [`settle`](Self::settle) names its new state; the caller settles
    /// after relaying the outbox, in the same round trip as the outbox removal.
    async fn apply_many(&self, decisions: &[Decision]) -> Result<Vec<Applied>, StoreError>;

    /// After a batch was relayed, in one round trip (one write transaction): removes each
    /// task's relayed outbox entries and, where its new `state` is given, the index entries of
    /// the states it has left for good.
    async fn settle(&self, settled: &[Settled<'_>]) -> Result<(), StoreError>;

    /// The task `id`.
    async fn get(&self, id: &str) -> Result<Option<Task>, StoreError> {
        Ok(self.get_many(&[id]).await?.pop().flatten())
    }

    /// The tasks `ids`, in order (`None` where there is none), in one round trip.
    async fn get_many(&self, ids: &[&str]) -> Result<Vec<Option<Task>>, StoreError>;

    /// The id of the task created with idempotency key `key`.
    async fn find_by_idempotency_key(&self, key: &str) -> Result<Option<String>, StoreError>;

    /// Every transition of task `id`, oldest first.
    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>, StoreError>;

    /// A page of tasks, as [`ListQuery`] says: its order, filters and scan bound.
    async fn list(&self, query: &ListQuery) -> Result<TaskPage, StoreError>;

    /// How many tasks are started and unfinished (downloading, extracting or analyzing).
    async fn count_in_flight(&self) -> Result<u64, StoreError>;

    /// How many tasks are queued, at most: an entry may outlive its task's start until the
    /// start is settled.
    async fn count_queued(&self) -> Result<u64, StoreError>;

    /// The outbox entries of task `id` not yet relayed, in order.
    async fn outbox(&self, id: &str) -> Result<Vec<OutboxEntry>, StoreError>;

    /// Removes relayed outbox entries of task `id`.
    async fn remove_outbox(&self, id: &str, entry_ids: &[String]) -> Result<(), StoreError> {
        self.settle(&[Settled { task: id, relayed: entry_ids, state: None }]).await
    }

    /// Up to `max` tasks whose wake time is at or before `now`, each leased to this caller
    /// until `now + lease`; a lease that runs out makes the task due again.
    async fn claim_due(&self, now: u64, lease: Duration, max: usize) -> Result<Vec<String>, StoreError>;

    /// Ends the lease on task `id` and re-indexes it from what is stored: its timer, and
    /// `now + relay_grace` while it has outbox entries.
    async fn release(&self, id: &str, now: u64) -> Result<(), StoreError>;

    /// Deletes up to `max` tasks that finished (completed, failed or cancelled) with a last
    /// transition at or before `before` (Unix ms): the record, history, outbox, idempotency
    /// key (while it names the task) and every index entry. Returns how many were deleted;
    /// repeatable, and safe to run on several replicas at once.
    async fn expire_finished(&self, before: u64, max: usize) -> Result<usize, StoreError>;

    /// Archives a dead letter, its body cut as [`DeadLetter::capped`] says.
    async fn put_dead_letter(&self, letter: &DeadLetter) -> Result<(), StoreError>;

    /// Deletes archived dead letters dead-lettered at or before `before` (Unix ms), then the
    /// oldest beyond `max_entries`; at most `max` per call. Returns how many were deleted.
    async fn trim_dead_letters(&self, before: u64, max_entries: u64, max: usize) -> Result<usize, StoreError>;

    /// A page of archived dead letters, oldest first.
    async fn dead_letters(&self, limit: usize, cursor: Option<&str>) -> Result<DeadLetterPage, StoreError>;

    /// One archived dead letter.
    async fn dead_letter(&self, id: &str) -> Result<Option<DeadLetter>, StoreError>;

    /// Removes an archived dead letter; whether it was there.
    async fn remove_dead_letter(&self, id: &str) -> Result<bool, StoreError>;

    /// How many dead letters the archive holds (the DLQ size gauge).
    async fn count_dead_letters(&self) -> Result<u64, StoreError>;

    /// Whether a stored task references each of `keys` (blob keys, `sha256:<hex>`), in order:
    /// one written with it among its [`blob_keys`] and not expired since.
    async fn referenced_blobs(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError>;

    /// Takes up to `max` blob keys that the expiry of their last referencing task released
    /// (each key is handed out once; one taken and not deleted is found again by the blob
    /// sweeper's listing).
    async fn take_released_blobs(&self, max: usize) -> Result<Vec<String>, StoreError>;
}

/// The blobs `task` references: its uploaded source, its downloaded image, and every derivative
/// its metadata output names (thumbnails, the preview).
pub fn blob_keys(task: &Task) -> BTreeSet<&str> {
    let mut keys = BTreeSet::new();
    if let ImageSource::Blob(key) = &task.source {
        keys.insert(key.as_str());
    }
    if let Some(download) = &task.outputs.download {
        keys.insert(download.blob_key.as_str());
    }
    if let Some(metadata) = &task.outputs.metadata {
        keys.insert(metadata.thumbnail_key.as_str());
        keys.extend(metadata.thumbnails.iter().map(|t| t.key.as_str()));
        keys.extend(metadata.preview_key.as_deref());
    }
    keys
}

/// When a task needs attention after a write: its timer, or `now + relay_grace` when it has
/// outbox entries the fast path may fail to relay.
pub fn wake_at(task: &Task, has_outbox: bool, now: u64, relay_grace: Duration) -> Option<u64> {
    let relay = has_outbox.then(|| now.saturating_add(u64::try_from(relay_grace.as_millis()).unwrap_or(u64::MAX)));
    match (task.timer.map(|t| t.due_at), relay) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The position of a state in the pipeline, terminal states last. Index entries of lower ranks
/// are pruned after a transition. The moves back (a resumed pause, a reprocessed task) leave
/// their old state's entry behind: harmless, as listings check each task's actual state, and
/// gone when the task expires.
pub(crate) fn rank(state: TaskState) -> u8 {
    match state {
        TaskState::Queued => 0,
        TaskState::Downloading => 1,
        TaskState::ExtractingMetadata => 2,
        TaskState::Analyzing => 3,
        TaskState::Paused => 4,
        TaskState::Completed | TaskState::Failed | TaskState::Cancelled => 5,
    }
}

fn corrupt(what: &'static str, id: &str, err: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt { what, id: id.to_owned(), message: err.to_string() }
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    id: &str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(what, id, e))
}

pub(crate) fn encode<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("store records serialize infallibly")
}

/// Cursor of a creation-ordered listing: `<created_at>:<id>`.
pub(crate) fn parse_cursor(cursor: &str) -> Result<(u64, &str), StoreError> {
    cursor
        .split_once(':')
        .and_then(|(at, id)| Some((at.parse().ok()?, id)))
        .filter(|(_, id)| !id.is_empty())
        .ok_or_else(|| StoreError::InvalidCursor(cursor.to_owned()))
}

pub(crate) fn make_cursor(at: u64, id: &str) -> String {
    format!("{at}:{id}")
}

/// One listing as a store runs it: the score range of its scan, the cursor it continues after,
/// and the page it builds from the entries the store offers in scan order
/// ([`offer`](Self::offer)), with the filters and the scan bound of [`ListQuery`].
pub(crate) struct Listing<'q> {
    query: &'q ListQuery,
    cursor: Option<(u64, String)>,
    range: Option<(u64, u64)>,
    bounded: bool,
    scanned: usize,
    last: Option<(u64, String)>,
    tasks: Vec<Task>,
    next_cursor: Option<String>,
    /// The label's key and value as JSON strings: a stored task without both cannot match.
    needles: Option<(String, String)>,
}

impl<'q> Listing<'q> {
    /// Plans `query`; its cursor must be one a listing handed out.
    pub(crate) fn new(query: &'q ListQuery) -> Result<Self, StoreError> {
        let cursor = query.cursor.as_deref().map(parse_cursor).transpose()?.map(|(at, id)| (at, id.to_owned()));
        // The queued index is scored by priority band, then creation time: no time range.
        let creation_scored = query.state != Some(TaskState::Queued);
        let timed = query.created_after.is_some() || query.created_before.is_some();
        let (mut lo, mut hi, mut empty) = (0, u64::MAX, false);
        if creation_scored {
            lo = query.created_after.unwrap_or(0);
            match query.created_before {
                Some(0) => empty = true,
                Some(before) => hi = before - 1,
                None => {}
            }
        }
        if let Some((at, _)) = &cursor {
            match query.order {
                ListOrder::Oldest => lo = lo.max(*at),
                ListOrder::Newest => hi = hi.min(*at),
            }
        }
        Ok(Self {
            query,
            cursor,
            range: (!empty && lo <= hi).then_some((lo, hi)),
            bounded: query.label.is_some() || (timed && !creation_scored),
            scanned: 0,
            last: None,
            tasks: Vec::new(),
            next_cursor: None,
            needles: query.label.as_ref().map(|l| (encode(&l.key), encode(&l.value))),
        })
    }

    /// The scores to scan, both inclusive; `None` when nothing can match.
    pub(crate) fn range(&self) -> Option<(u64, u64)> {
        self.range
    }

    /// The position the scan continues after.
    pub(crate) fn cursor(&self) -> Option<(u64, &str)> {
        self.cursor.as_ref().map(|(at, id)| (*at, id.as_str()))
    }

    /// Whether the scan filters while scanning, so it stops after [`LABEL_SCAN_LIMIT`] entries.
    pub(crate) fn is_bounded(&self) -> bool {
        self.bounded
    }

    /// Whether the entry `(score, id)` comes after the cursor in the scan's order (entries of
    /// the cursor's own score up to it were on earlier pages).
    pub(crate) fn is_past_cursor(&self, score: u64, id: &str) -> bool {
        self.cursor().is_none_or(|(at, c_id)| match self.query.order {
            ListOrder::Oldest => score > at || (score == at && id > c_id),
            ListOrder::Newest => score < at || (score == at && id < c_id),
        })
    }

    /// Whether the task stored as `json` ([`encode`]d) may match: false only when it cannot
    /// carry the label (its key or its value, as JSON strings, is nowhere in it), so a scan need
    /// not decode it.
    pub(crate) fn may_match(&self, json: &[u8]) -> bool {
        let Some((key, value)) = &self.needles else { return true };
        std::str::from_utf8(json).map_or(true, |json| json.contains(key.as_str()) && json.contains(value.as_str()))
    }

    fn matches(&self, task: &Task) -> bool {
        let q = self.query;
        q.state.is_none_or(|s| s == task.state)
            && q.created_after.is_none_or(|a| task.created_at >= a)
            && q.created_before.is_none_or(|b| task.created_at < b)
            && q.label.as_ref().is_none_or(|l| l.matches(task))
    }

    /// Takes the next index entry past the cursor, in scan order, with its task (`None`: gone).
    /// False when the page is done: full, with this entry left for the next page, or out of
    /// its scan bound; then no more entries are offered.
    pub(crate) fn offer(&mut self, score: u64, id: &str, task: Option<Task>) -> bool {
        if self.bounded && self.scanned >= LABEL_SCAN_LIMIT {
            self.stop();
            return false;
        }
        self.scanned += 1;
        if let Some(task) = task.filter(|t| self.matches(t)) {
            if self.tasks.len() >= self.query.limit {
                self.stop();
                return false;
            }
            self.tasks.push(task);
        }
        self.last = Some((score, id.to_owned()));
        true
    }

    /// Ends the page with more entries left: the next page starts after the last entry taken.
    fn stop(&mut self) {
        let at = self.last.as_ref().map(|(at, id)| (*at, id.as_str())).or(self.cursor());
        self.next_cursor = at.map(|(at, id)| make_cursor(at, id));
    }

    /// The page: a cursor when [`offer`](Self::offer) said it was done, none when the store
    /// ran out of entries.
    pub(crate) fn finish(self) -> TaskPage {
        TaskPage { tasks: self.tasks, next_cursor: self.next_cursor }
    }
}

#[cfg(test)]
mod tests {
    use imagepipe_contracts::{SubmitTask, TraceId};

    use super::*;
    use crate::machine;

    fn label(key: &str, value: &str) -> ListQuery {
        let label = Some(LabelFilter { key: key.into(), value: value.into() });
        ListQuery { limit: 10, label, ..ListQuery::default() }
    }

    #[test]
    fn the_label_prefilter_never_skips_a_task_that_carries_the_label() {
        let labels = [("quote\"d", "back\\slash"), ("é", "ünï\u{1}code\nline"), ("album", "summer"), ("empty", "")];
        let submit = SubmitTask {
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            ..SubmitTask::url("https://example.com/winter.jpg")
        };
        let task = machine::create("tsk_pre".into(), &submit, submit.validate().unwrap(), TraceId::random(), 1).task;
        let json = encode(&task);
        for (key, value) in labels {
            let query = label(key, value);
            let listing = Listing::new(&query).unwrap();
            assert!(listing.may_match(json.as_bytes()) && listing.matches(&task), "{key}={value}");
        }
        for (key, value) in [("album", "winter"), ("albums", "summer"), ("camera", "summer"), ("quote", "d")] {
            let query = label(key, value);
            let listing = Listing::new(&query).unwrap();
            assert!(!listing.matches(&task), "{key}={value}");
        }
        let query = label("camera", "summer");
        assert!(!Listing::new(&query).unwrap().may_match(json.as_bytes()), "no such key in the record: skipped");
        assert!(Listing::new(&ListQuery::default()).unwrap().may_match(b"anything"), "no label: every task");
    }
}
