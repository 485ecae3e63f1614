//! Listing tasks: the query ([`ListQuery`]), the page ([`TaskPage`]), the cursors, and
//! [`Listing`], the filters and scan bound both stores run a listing with.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{StoreError, encode};
use crate::task::{Task, TaskState};

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
mod tests;
