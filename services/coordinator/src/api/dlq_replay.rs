//! Replaying dead letters: one by id (`POST /v1/dlq/{id}/replay`) and every one a filter
//! matches (`POST /v1/dlq/replay`), both through [`replay`].
//!
//! A bulk replay first scans the archive page by page, oldest first, and keeps the ids of the
//! letters the filter matches (at most `max`); only then does it replay them, each as the
//! single route does. Scanning before replaying keeps a letter that is dead-lettered again
//! during the run (a new archive entry, later in the order) from being replayed twice.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use futures::StreamExt;
use imagepipe_bus::Message;
use imagepipe_contracts::lane_of;
use imagepipe_contracts::names::queues;
use imagepipe_runtime::http::Scope::Operate;
use imagepipe_runtime::http::{ApiError, WholeBody};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::dlq::{Replayed, letter_id};
use super::route::{Answer, Content, Operation, Route};
use super::{ApiState, decode_object};
use crate::engine::Engine;
use crate::store::{BODY_CUT_HEADER, DEAD_LETTER_BODY_BYTES, DeadLetter, StoreError};

/// Default and largest `max` of a bulk replay.
pub const MAX_REPLAY: usize = 10_000;

/// Most archive entries one bulk replay looks at: the scan ends there (`more` is true) even
/// when fewer than `max` matched, so a request over a huge archive stays bounded.
pub const MAX_SCANNED: usize = 100_000;

/// How many matching ids a dry run shows.
pub const SAMPLE: usize = 10;

/// Most skipped letters listed with their reason (all of them are counted).
pub const SKIPPED_LISTED: usize = 100;

/// Longest `reasonContains`, in bytes.
pub const MAX_REASON_FILTER: usize = 1024;

/// Archive page size of the scan.
const SCAN_PAGE: usize = 500;

/// Replays run side by side.
const REPLAY_CONCURRENCY: usize = 16;

/// The replay routes.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let one = Operation::post(
        "/v1/dlq/{id}/replay",
        Operate,
        "replayDeadLetter",
        "Send a dead letter back to its queue and remove it",
    )
    .param(letter_id())
    .ok::<Replayed>(202, "Replayed")
    .error(404, "No such dead letter")
    .error(409, "Its source is not a task queue, or the archive kept only part of its body");
    let example = json!({ "queue": "download", "reasonContains": "timeout", "since": 1_763_800_000_000_u64, "max": 100, "dryRun": true });
    let matching = Operation::post(
        "/v1/dlq/replay",
        Operate,
        "replayDeadLetters",
        "Replay every dead letter a filter matches (or count them: dryRun)",
    )
    .describe(
        "Scans the archive oldest first and replays each matching letter from a task queue as POST \
         /v1/dlq/{id}/replay does. Letters that can never be replayed (not from a task queue, body cut) are \
         counted as skipped and left in the archive.",
    )
    .body(true, vec![Content::json::<ReplayFilter>().example(example)])
    .ok::<ReplayReport>(200, "What matched and what was replayed")
    .error(400, "No filter (give one, or \"all\": true), an unknown queue, or a value out of range")
    .answer(Answer::too_large_json())
    .error(503, "The store or the broker failed; try again");
    vec![Route::new(one, replay_one), Route::new(matching, replay_matching)]
}

/// Why a dead letter was not replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The archive has no such entry (any more).
    #[error("no dead letter {0}")]
    NotFound(String),
    /// The entry can never be replayed: the reason.
    #[error("{0}")]
    NotReplayable(String),
    /// The store or the broker failed; try again.
    #[error("try again: {0}")]
    Unavailable(String),
}

impl From<StoreError> for ReplayError {
    fn from(e: StoreError) -> Self {
        Self::Unavailable(e.to_string())
    }
}

impl From<ReplayError> for ApiError {
    fn from(e: ReplayError) -> Self {
        match e {
            ReplayError::NotFound(_) => ApiError::not_found(e.to_string()),
            ReplayError::NotReplayable(reason) => ApiError::conflict(reason),
            ReplayError::Unavailable(reason) => ApiError::unavailable(reason),
        }
    }
}

/// Why `letter` can never be replayed, if it cannot: it was not taken from a task queue (or one
/// of its priority lanes), or the archive kept only part of its body.
pub fn unreplayable(letter: &DeadLetter) -> Option<String> {
    if !queues::all_lanes().contains(&letter.source) {
        return Some(format!(
            "dead letters from {:?} cannot be replayed: only task queues ({}, and their priority lanes) can",
            letter.source,
            queues::ALL.join(", ")
        ));
    }
    if letter.body_was_cut() {
        return Some(format!(
            "dead letter {} kept only the first {DEAD_LETTER_BODY_BYTES} bytes of its body (header {BODY_CUT_HEADER}): \
             it cannot be replayed",
            letter.id
        ));
    }
    None
}

/// Sends dead letter `id` back to the queue it was taken from (its key, headers and body as
/// they were, under a new message id) and removes it from the archive.
pub async fn replay(engine: &Engine, id: &str) -> Result<Replayed, ReplayError> {
    let store = engine.store();
    let letter = store.dead_letter(id).await?.ok_or_else(|| ReplayError::NotFound(id.to_owned()))?;
    if let Some(reason) = unreplayable(&letter) {
        return Err(ReplayError::NotReplayable(reason));
    }
    let mut message = Message::new(letter.body.into_bytes()).with_id(format!("replay-{}", uuid::Uuid::new_v4()));
    message.key = letter.key;
    for (name, value) in letter.headers {
        message.headers.insert(name, value);
    }
    engine.bus().queues.send(&letter.source, message).await.map_err(|e| ReplayError::Unavailable(e.to_string()))?;
    store.remove_dead_letter(id).await?;
    tracing::info!(id, queue = %letter.source, "dead letter replayed");
    Ok(Replayed { id: id.to_owned(), queue: letter.source })
}

/// `POST /v1/dlq/{id}/replay`.
async fn replay_one(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<Replayed>), ApiError> {
    let Path(id) = path?;
    Ok((StatusCode::ACCEPTED, Json(replay(&state.engine, &id).await?)))
}

/// Body of `POST /v1/dlq/replay`: which dead letters to replay. At least one of `queue`,
/// `reasonContains`, `since` and `until` must be given, or `all: true`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("anyOf" = [
    {"required": ["queue"]},
    {"required": ["reasonContains"]},
    {"required": ["since"]},
    {"required": ["until"]},
    {"required": ["all"], "properties": {"all": {"const": true}}}
]))]
pub struct ReplayFilter {
    /// Only letters taken from this queue: `submit`, `download`, `metadata`, `ai`, `results`
    /// or a full name (`tasks.download`), each with its priority lanes (`tasks.download.high`,
    /// `tasks.download.low`); or one lane by its full name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("enum" = queue_enum()))]
    pub queue: Option<String>,
    /// Only letters whose reason contains this text (ignoring case).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub reason_contains: Option<String>,
    /// Only letters dead-lettered at or after this time, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<u64>,
    /// Only letters dead-lettered before this time, Unix ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<u64>,
    /// Most letters replayed (default and largest 10000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10_000))]
    pub max: Option<usize>,
    /// Count the matching letters and show the first few, without replaying any.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// Match every letter (required when no other filter is given).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// Every name `queue` takes: the short names, then every queue and lane by its full name.
pub fn queue_names() -> Vec<String> {
    let short = queues::ALL.iter().filter_map(|q| q.strip_prefix("tasks.")).map(str::to_owned);
    short.chain(queues::all_lanes()).collect()
}

/// The `enum` of `queue` in the schema: [`queue_names`], and null (no filter, as absent).
fn queue_enum() -> Vec<serde_json::Value> {
    queue_names().into_iter().map(serde_json::Value::String).chain([serde_json::Value::Null]).collect()
}

/// A letter a bulk replay matched but could not replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayFailure {
    /// The dead letter (still in the archive).
    pub id: String,
    /// Why it was not replayed.
    pub error: String,
}

/// A letter the filter matched that can never be replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Skipped {
    /// The dead letter (left in the archive).
    pub id: String,
    /// Why it cannot be replayed.
    pub reason: String,
}

/// Answer of `POST /v1/dlq/replay`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayReport {
    /// How many replayable letters the filter matched (at most `max`).
    pub matched: usize,
    /// Whether this was a dry run (nothing changed).
    pub dry_run: bool,
    /// Whether the scan stopped before the end of the archive (`max` matched, or 100000
    /// entries looked at): more letters may match; run again after this one.
    pub more: bool,
    /// Dry run: the first matching ids, oldest first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<Vec<String>>,
    /// Real run: how many were replayed (and removed from the archive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed: Option<usize>,
    /// Real run: the matched letters that were not replayed, and why (they stay archived).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<Vec<ReplayFailure>>,
    /// How many letters the filter matched that can never be replayed (not from a task
    /// queue, or their body was cut); they are left in the archive.
    pub skipped: usize,
    /// The first 100 of them, with the reason.
    pub skipped_details: Vec<Skipped>,
}

/// Which queues a filter's `queue` stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum QueueMatch {
    /// A queue and every lane of it.
    WithLanes(&'static str),
    /// One lane.
    Lane(String),
}

impl QueueMatch {
    fn parse(name: &str) -> Result<Self, ApiError> {
        let base = queues::stage(name)
            .or_else(|| queues::ALL.into_iter().find(|q| *q == name || q.strip_prefix("tasks.") == Some(name)));
        if let Some(base) = base {
            return Ok(Self::WithLanes(base));
        }
        if queues::all_lanes().iter().any(|lane| lane == name) {
            return Ok(Self::Lane(name.to_owned()));
        }
        Err(ApiError::invalid(format!("`queue` {name:?} is no task queue: give one of {}", queue_names().join(", "))))
    }

    fn matches(&self, source: &str) -> bool {
        match self {
            Self::WithLanes(base) => lane_of(source).0 == *base,
            Self::Lane(lane) => source == lane,
        }
    }
}

/// A checked [`ReplayFilter`].
struct Filter {
    queue: Option<QueueMatch>,
    reason: Option<String>,
    since: Option<u64>,
    until: Option<u64>,
    max: usize,
}

impl Filter {
    fn new(request: &ReplayFilter) -> Result<Self, ApiError> {
        let narrowed = request.queue.is_some()
            || request.reason_contains.is_some()
            || request.since.is_some()
            || request.until.is_some();
        if !narrowed && !request.all {
            return Err(ApiError::invalid(
                "give at least one of `queue`, `reasonContains`, `since`, `until`, or `\"all\": true` to replay \
                 every dead letter",
            ));
        }
        let queue = request.queue.as_deref().map(QueueMatch::parse).transpose()?;
        let reason = match request.reason_contains.as_deref() {
            Some("") => return Err(ApiError::invalid("`reasonContains` must not be empty")),
            Some(r) if r.len() > MAX_REASON_FILTER => {
                return Err(ApiError::invalid(format!("`reasonContains` must be at most {MAX_REASON_FILTER} bytes")));
            }
            r => r.map(str::to_lowercase),
        };
        if let (Some(since), Some(until)) = (request.since, request.until)
            && since >= until
        {
            return Err(ApiError::invalid(format!("`since` ({since}) must be before `until` ({until})")));
        }
        let max = match request.max {
            None => MAX_REPLAY,
            Some(n) if (1..=MAX_REPLAY).contains(&n) => n,
            Some(n) => return Err(ApiError::invalid(format!("`max` must be from 1 to {MAX_REPLAY} (got {n})"))),
        };
        Ok(Self { queue, reason, since: request.since, until: request.until, max })
    }

    fn matches(&self, letter: &DeadLetter) -> bool {
        self.queue.as_ref().is_none_or(|q| q.matches(&letter.source))
            && self.reason.as_ref().is_none_or(|r| letter.reason.to_lowercase().contains(r))
            && self.since.is_none_or(|since| letter.dead_lettered_at >= since)
            && self.until.is_none_or(|until| letter.dead_lettered_at < until)
    }
}

/// What a scan of the archive found.
#[derive(Default)]
struct Scan {
    matched: Vec<String>,
    skipped: usize,
    skipped_details: Vec<Skipped>,
    more: bool,
}

/// The ids of the replayable letters `filter` matches (at most its `max`), oldest first, and
/// the matching letters that cannot be replayed.
async fn scan(engine: &Engine, filter: &Filter) -> Result<Scan, StoreError> {
    let store = engine.store();
    let mut found = Scan::default();
    let (mut cursor, mut scanned) = (None::<String>, 0usize);
    'pages: loop {
        let page = store.dead_letters(SCAN_PAGE, cursor.as_deref()).await?;
        for letter in &page.entries {
            if scanned == MAX_SCANNED {
                found.more = true;
                break 'pages;
            }
            scanned += 1;
            if filter.until.is_some_and(|until| letter.dead_lettered_at >= until) {
                // The archive lists oldest first: nothing after this one matches.
                break 'pages;
            }
            if !filter.matches(letter) {
                continue;
            }
            if let Some(reason) = unreplayable(letter) {
                found.skipped += 1;
                if found.skipped_details.len() < SKIPPED_LISTED {
                    found.skipped_details.push(Skipped { id: letter.id.clone(), reason });
                }
                continue;
            }
            if found.matched.len() == filter.max {
                found.more = true;
                break 'pages;
            }
            found.matched.push(letter.id.clone());
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    Ok(found)
}

/// `POST /v1/dlq/replay`.
async fn replay_matching(
    State(state): State<ApiState>,
    WholeBody(body): WholeBody,
) -> Result<Json<ReplayReport>, ApiError> {
    let request: ReplayFilter = decode_object(&body)?;
    let filter = Filter::new(&request)?;
    let found = scan(&state.engine, &filter).await?;
    let mut report = ReplayReport {
        matched: found.matched.len(),
        dry_run: request.dry_run,
        more: found.more,
        sample: None,
        replayed: None,
        failed: None,
        skipped: found.skipped,
        skipped_details: found.skipped_details,
    };
    if request.dry_run {
        report.sample = Some(found.matched.iter().take(SAMPLE).cloned().collect());
        return Ok(Json(report));
    }
    let engine = &state.engine;
    let outcomes: Vec<(String, Result<Replayed, ReplayError>)> = futures::stream::iter(found.matched)
        .map(|id| async move {
            let replayed = replay(engine, &id).await;
            (id, replayed)
        })
        .buffered(REPLAY_CONCURRENCY)
        .collect()
        .await;
    let mut failed = Vec::new();
    for (id, outcome) in outcomes {
        if let Err(e) = outcome {
            failed.push(ReplayFailure { id, error: e.to_string() });
        }
    }
    report.replayed = Some(report.matched - failed.len());
    tracing::info!(
        matched = report.matched,
        replayed = report.matched - failed.len(),
        failed = failed.len(),
        skipped = report.skipped,
        "dead letters replayed in bulk"
    );
    report.failed = Some(failed);
    Ok(Json(report))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_short_full_and_lanes() {
        for name in queue_names() {
            assert!(QueueMatch::parse(&name).is_ok(), "{name}");
        }
        assert_eq!(QueueMatch::parse("download").unwrap(), QueueMatch::WithLanes(queues::DOWNLOAD));
        assert_eq!(QueueMatch::parse("tasks.download").unwrap(), QueueMatch::WithLanes(queues::DOWNLOAD));
        assert_eq!(QueueMatch::parse("submit").unwrap(), QueueMatch::WithLanes(queues::SUBMIT));
        assert_eq!(QueueMatch::parse("results").unwrap(), QueueMatch::WithLanes(queues::RESULTS));
        assert_eq!(QueueMatch::parse("tasks.ai.low").unwrap(), QueueMatch::Lane("tasks.ai.low".into()));
        let err = QueueMatch::parse("thumbnails").unwrap_err();
        assert!(err.message.contains("download") && err.message.contains("tasks.ai.high"), "{}", err.message);

        let download = QueueMatch::parse("download").unwrap();
        for source in ["tasks.download", "tasks.download.high", "tasks.download.low"] {
            assert!(download.matches(source), "{source}");
        }
        assert!(!download.matches("tasks.metadata") && !download.matches("tasks.download.urgent"));
        let lane = QueueMatch::parse("tasks.download.high").unwrap();
        assert!(lane.matches("tasks.download.high") && !lane.matches("tasks.download"));
    }

    #[test]
    fn a_filter_must_be_explicit_and_in_range() {
        let filter = |json: &str| Filter::new(&serde_json::from_str(json).unwrap()).map(|f| f.max);
        assert!(filter("{}").unwrap_err().message.contains("\"all\": true"));
        assert!(filter(r#"{"dryRun": true, "max": 5}"#).is_err());
        assert_eq!(filter(r#"{"all": true}"#).unwrap(), MAX_REPLAY);
        assert_eq!(filter(r#"{"queue": "ai", "max": 3}"#).unwrap(), 3);
        for bad in [r#"{"all": true, "max": 0}"#, r#"{"all": true, "max": 10001}"#, r#"{"reasonContains": ""}"#] {
            assert!(filter(bad).is_err(), "{bad}");
        }
        assert!(filter(r#"{"since": 5, "until": 5}"#).unwrap_err().message.contains("before"));
    }
}
