//! The coordinator's HTTP API (axum): tasks, their history, events as SSE, dead letters,
//! uploaded blobs ([`blobs`]), the routes of other services it forwards ([`forward`]), and the
//! OpenAPI document generated from the handlers' types. Errors are the runtime's one
//! [`ApiError`] shape.

pub mod batch;
pub mod blobs;
pub mod dlq_replay;
pub mod forward;
mod openapi;
pub mod queue_control;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::Stream;
use imagepipe_blob::BlobStore;
use imagepipe_bus::Selector;
use imagepipe_contracts::command::is_valid_id;
use imagepipe_contracts::{EventType, Step, StepError, SubmitTask, decode};
use imagepipe_runtime::http::Scope::{Admin, Operate, Read, Submit};
use imagepipe_runtime::http::{ApiError, BodyLimit, UploadSlots, WholeBody, require};
use imagepipe_runtime::telemetry::continue_http_trace;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::engine::{Engine, EngineError, Handled, Origin, SubmitFailure};
use crate::events::{EventHub, Watched};
use crate::machine::Input;
use crate::reprocess::{self, ReprocessJob, ReprocessRequest};
use crate::store::{DeadLetterPage, ListQuery, StoreError, TaskPage};
use crate::task::{HistoryEntry, Task, TaskState};

/// Default and largest page sizes of the list endpoints.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 500;

/// Largest body of the JSON routes (a submit, a cancel): far above what the submit's own caps
/// let through (a 2 KiB URL, 8 KiB of labels).
pub const JSON_BODY_BYTES: u64 = 64 * 1024;

/// What the API handlers share.
#[derive(Clone)]
pub struct ApiState {
    engine: Engine,
    hub: EventHub,
    jobs: reprocess::Jobs,
}

/// The coordinator's API routes (`/v1/...`): tasks, events, dead letters, blobs and the OpenAPI
/// document; JSON bodies up to [`JSON_BODY_BYTES`], uploads up to `max_upload_bytes`, as many
/// at once as `upload_slots` let in. The
/// service's HTTP edge puts them behind the token check; each route declares the scope it needs
/// (reads `read`, submitting `submit`, controls `operate`, purging `admin`).
pub fn router(
    engine: Engine,
    hub: EventHub,
    blobs: Arc<dyn BlobStore>,
    max_upload_bytes: u64,
    upload_slots: UploadSlots,
    jobs: reprocess::Jobs,
) -> Router {
    let state = ApiState { engine, hub, jobs };
    let batch = batch::router(state.clone());
    let routes = Router::new()
        .route("/v1/tasks", require(Submit, post(submit)).merge(require(Read, get(list))))
        .route("/v1/tasks/{id}", require(Read, get(get_task)))
        .route("/v1/tasks/{id}/history", require(Read, get(history)))
        .route("/v1/tasks/{id}/cancel", require(Operate, post(cancel)))
        .route("/v1/tasks/{id}/pause", require(Operate, post(pause)))
        .route("/v1/tasks/{id}/resume", require(Operate, post(resume)))
        .route("/v1/tasks/{id}/retry", require(Operate, post(retry)))
        .route("/v1/reprocess", require(Operate, post(start_reprocess)))
        .route(
            "/v1/reprocess/{id}",
            require(Read, get(reprocess_job)).merge(require(Operate, axum::routing::delete(cancel_reprocess))),
        )
        .route("/v1/queues", require(Read, get(queue_control::list)))
        .route("/v1/queues/{queue}/pause", require(Operate, post(queue_control::pause)))
        .route("/v1/queues/{queue}/resume", require(Operate, post(queue_control::resume)))
        .route("/v1/queues/{queue}/concurrency", require(Operate, axum::routing::put(queue_control::concurrency)))
        .route("/v1/events", require(Read, get(events)))
        .route("/v1/dlq", require(Read, get(dead_letters)))
        .route("/v1/dlq/{id}", require(Admin, axum::routing::delete(purge_dead_letter)))
        .route("/v1/dlq/{id}/replay", require(Operate, post(dlq_replay::replay_one)))
        .route("/v1/dlq/replay", require(Operate, post(dlq_replay::replay_matching)))
        .route("/v1/openapi.json", require(Read, get(openapi_document)))
        .with_state(state);
    BodyLimit::new(JSON_BODY_BYTES).apply(routes).merge(batch).merge(blobs::router(
        blobs,
        max_upload_bytes,
        upload_slots,
    ))
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidCursor(c) => Self::invalid(format!("`cursor` {c:?} was not handed out by this API")),
            e => Self::unavailable(e),
        }
    }
}

fn task_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = path?;
    if is_valid_id(&id) {
        Ok(id)
    } else {
        Err(ApiError::invalid(format!("task id {id:?} must be 1 to 128 characters of [A-Za-z0-9_.-]")))
    }
}

fn limit(raw: Option<&str>) -> Result<usize, ApiError> {
    match raw {
        None => Ok(DEFAULT_LIMIT),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(format!("`limit` must be a whole number from 1 to {MAX_LIMIT} (got {s:?})"))),
        },
    }
}

/// Answer of `POST /v1/tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Accepted {
    /// The task id (follow it at `Location`).
    pub task_id: String,
    /// Its state now.
    pub state: TaskState,
    /// False when the id or idempotency key named an existing task.
    pub created: bool,
}

/// `POST /v1/tasks`, in a server span continuing the request's `traceparent` (a new trace
/// without one): the task created is in that trace.
async fn submit(
    State(state): State<ApiState>,
    request_headers: HeaderMap,
    WholeBody(body): WholeBody,
) -> Result<Response, ApiError> {
    let span = tracing::info_span!("request", otel.name = "POST /v1/tasks", otel.kind = "server");
    continue_http_trace(&span, &request_headers);
    accept(state, body).instrument(span).await
}

async fn accept(state: ApiState, body: Bytes) -> Result<Response, ApiError> {
    let submit: SubmitTask = decode_object(&body)?;
    let engine = &state.engine;
    let submitted = match engine.submit(&submit, Origin::Http, new_task_id).await {
        Ok(submitted) => submitted,
        Err(SubmitFailure::Invalid(e)) => {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_submit", e.to_string()));
        }
        Err(SubmitFailure::Conflict { existing }) => {
            let location = format!("/v1/tasks/{}", existing.id);
            let error = ApiError::conflict(SubmitFailure::Conflict { existing }.to_string());
            return Ok((StatusCode::CONFLICT, [(header::LOCATION, location)], error).into_response());
        }
        Err(SubmitFailure::Store(e)) => return Err(ApiError::unavailable(e)),
    };
    if let Err(e) = engine.start_queued().await {
        tracing::warn!(error = %e, "queued tasks not started; the sweeper starts them");
    }
    let task = engine.store().get(&submitted.task.id).await?.unwrap_or(submitted.task);
    let location = format!("/v1/tasks/{}", task.id);
    let body = Accepted { task_id: task.id, state: task.state, created: submitted.created };
    Ok((StatusCode::ACCEPTED, [(header::LOCATION, location)], Json(body)).into_response())
}

/// Decodes a JSON body as `T`: a body that is not one JSON object, or breaks `T`, is a `400`
/// naming the problem.
fn decode_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    decode(body).map_err(|e| ApiError::invalid(e.to_string()))
}

/// A new task id: `tsk_` and 32 hex digits.
pub fn new_task_id() -> String {
    format!("tsk_{}", uuid::Uuid::new_v4().simple())
}

/// A task as `GET /v1/tasks/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskView {
    /// The task: state, each step's attempts and last error, the outputs.
    #[serde(flatten)]
    pub task: Task,
    /// The latest error of any step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<StepError>,
}

impl From<Task> for TaskView {
    fn from(task: Task) -> Self {
        let last_error = task.failure.as_ref().map(|f| f.error.clone()).or_else(|| {
            let current = task.state.step().map(|s| task.steps.get(s).last_error.clone());
            current.flatten()
        });
        Self { task, last_error }
    }
}

async fn get_task(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TaskView>, ApiError> {
    let id = task_id(path)?;
    let task = state.engine.store().get(&id).await?.ok_or_else(|| ApiError::not_found(format!("no task {id}")))?;
    Ok(Json(task.into()))
}

/// Answer of `GET /v1/tasks/{id}/history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct History {
    /// The task.
    pub task_id: String,
    /// Every transition, oldest first.
    pub entries: Vec<HistoryEntry>,
}

async fn history(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<History>, ApiError> {
    let id = task_id(path)?;
    let store = state.engine.store();
    if store.get(&id).await?.is_none() {
        return Err(ApiError::not_found(format!("no task {id}")));
    }
    let entries = store.history(&id).await?;
    Ok(Json(History { task_id: id, entries }))
}

/// Query of `GET /v1/tasks`. An empty `status`, `cursor`, `order` or `label` is an absent one
/// (as an HTML form sends it); the times and `limit` are numbers or absent.
///
/// `createdAfter` and `createdBefore` bound the scan of the index where its order is the
/// creation time (every listing but `status=queued`, which lists higher priorities first). A
/// `label` filter (and a time bound on `status=queued`) is applied while scanning, at most
/// [`LABEL_SCAN_LIMIT`](crate::store::LABEL_SCAN_LIMIT) tasks per page: a page may then be short of `limit`, even empty, and
/// still carry `nextCursor`; the listing ends only when a page comes without one.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListParams {
    /// Only tasks in this state.
    pub status: Option<String>,
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<String>,
    /// `nextCursor` of the previous page (of either order: it is a position, and the listing
    /// goes on from it in the order asked).
    pub cursor: Option<String>,
    /// `oldest` (default) or `newest` first: by creation time, or within `status=queued` by
    /// priority, then creation time.
    pub order: Option<String>,
    /// Only tasks created at or after this time, Unix ms.
    pub created_after: Option<String>,
    /// Only tasks created before this time, Unix ms (greater than `createdAfter`).
    pub created_before: Option<String>,
    /// Only tasks with this label: `key=value` (split at the first `=`; the value may be empty).
    pub label: Option<String>,
}

use crate::store::{LabelFilter, ListOrder};
use imagepipe_contracts::command::{MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN};

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

/// A Unix-ms time parameter: a whole number of milliseconds, 0 to `u64::MAX`.
fn unix_ms(name: &str, raw: Option<String>) -> Result<Option<u64>, ApiError> {
    let Some(s) = raw else { return Ok(None) };
    match s.parse::<u64>() {
        Ok(ms) if s.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(ms)),
        _ => Err(ApiError::invalid(format!(
            "`{name}` must be a time in Unix milliseconds, 0 to {} (got {s:?})",
            u64::MAX
        ))),
    }
}

/// The `label` parameter, `key=value`, within the label caps of a submit.
fn label_filter(raw: Option<String>) -> Result<Option<LabelFilter>, ApiError> {
    let Some(raw) = non_empty(raw) else { return Ok(None) };
    let Some((key, value)) = raw.split_once('=') else {
        return Err(ApiError::invalid(format!("`label` must be `key=value` (got {raw:?})")));
    };
    if key.is_empty() || key.len() > MAX_LABEL_KEY_LEN {
        return Err(ApiError::invalid(format!(
            "`label` key must be 1 to {MAX_LABEL_KEY_LEN} bytes (got {} bytes)",
            key.len()
        )));
    }
    if value.len() > MAX_LABEL_VALUE_LEN {
        return Err(ApiError::invalid(format!(
            "`label` value must be at most {MAX_LABEL_VALUE_LEN} bytes (got {} bytes)",
            value.len()
        )));
    }
    Ok(Some(LabelFilter { key: key.to_owned(), value: value.to_owned() }))
}

async fn list(
    State(state): State<ApiState>,
    query: Result<Query<ListParams>, QueryRejection>,
) -> Result<Json<TaskPage>, ApiError> {
    let Query(params) = query?;
    let status = match non_empty(params.status) {
        Some(s) => Some(s.parse::<TaskState>().map_err(|e| ApiError::invalid(format!("`status`: {e}")))?),
        None => None,
    };
    let order = match non_empty(params.order) {
        Some(s) => s.parse::<ListOrder>().map_err(|e| ApiError::invalid(format!("`order` {e}")))?,
        None => ListOrder::default(),
    };
    let created_after = unix_ms("createdAfter", params.created_after)?;
    let created_before = unix_ms("createdBefore", params.created_before)?;
    if let (Some(after), Some(before)) = (created_after, created_before)
        && after >= before
    {
        return Err(ApiError::invalid(format!("`createdAfter` ({after}) must be before `createdBefore` ({before})")));
    }
    let query = ListQuery {
        state: status,
        limit: limit(params.limit.as_deref())?,
        cursor: non_empty(params.cursor),
        order,
        created_after,
        created_before,
        label: label_filter(params.label)?,
    };
    Ok(Json(state.engine.store().list(&query).await?))
}

/// Body of `POST /v1/tasks/{id}/cancel`, `/pause` and `POST /v1/queues/{queue}/pause|resume`
/// (optional).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CancelRequest {
    /// Why; shown in the history and the event (`task.cancelled`, `task.paused`, `queue.paused`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

async fn cancel(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    WholeBody(body): WholeBody,
) -> Result<(StatusCode, Json<TaskView>), ApiError> {
    let id = task_id(path)?;
    let reason = reason(&body)?;
    let task = control_task(&state, &id, Input::Cancel { reason }).await?;
    if task.cancel_requested.is_some() && task.steps.total_attempts() > 0 {
        // A step may run, or its command still wait in a paused queue (the task is then
        // cancelled at once): the worker that has it, or takes it, stops it within a refresh
        // of the control state.
        let now = state.engine.clock().unix_ms();
        state.engine.controls().store().request_cancel(&id, now).await.map_err(ApiError::unavailable)?;
    }
    Ok((StatusCode::ACCEPTED, Json(task.into())))
}

async fn pause(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    WholeBody(body): WholeBody,
) -> Result<(StatusCode, Json<TaskView>), ApiError> {
    let id = task_id(path)?;
    let reason = reason(&body)?;
    let task = control_task(&state, &id, Input::Pause { reason }).await?;
    Ok((StatusCode::ACCEPTED, Json(task.into())))
}

async fn resume(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<TaskView>), ApiError> {
    let id = task_id(path)?;
    let task = control_task(&state, &id, Input::Resume).await?;
    Ok((StatusCode::ACCEPTED, Json(task.into())))
}

/// `POST /v1/tasks/{id}/retry`: a failed or cancelled task runs again from the first step whose
/// output it lacks, as a new generation in its own lanes; `409` for a task that is not
/// finished or lacks nothing.
async fn retry(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<TaskView>), ApiError> {
    let id = task_id(path)?;
    let task = state.engine.store().get(&id).await?.ok_or_else(|| ApiError::not_found(format!("no task {id}")))?;
    let outputs = &task.outputs;
    let missing = [
        (Step::Download, outputs.download.is_some()),
        (Step::Metadata, outputs.metadata.is_some()),
        (Step::Analyze, outputs.analysis.is_some()),
    ]
    .into_iter()
    .find_map(|(step, done)| (!done).then_some(step));
    let Some(from) = missing.filter(|_| task.state.is_terminal()) else {
        return Err(ApiError::conflict(format!(
            "the task is {}: only a failed or cancelled task is retried (POST /v1/reprocess runs finished ones again)",
            task.state
        )));
    };
    // The cancellation of its last run's step must not stop the new generation's.
    state.engine.controls().store().clear_cancel(&id).await.map_err(ApiError::unavailable)?;
    let task = control_task(&state, &id, Input::Reprocess { from, priority: None }).await?;
    Ok((StatusCode::ACCEPTED, Json(task.into())))
}

/// Answer of `POST /v1/reprocess`: the job, and whether this request started it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartedJob {
    /// The job (follow it at `Location`).
    #[serde(flatten)]
    pub job: ReprocessJob,
    /// False when a job of an identical request was running already: this is that job.
    pub created: bool,
}

impl From<reprocess::JobError> for ApiError {
    fn from(e: reprocess::JobError) -> Self {
        use reprocess::JobError;
        match e {
            JobError::TooMany { .. } => Self::new(StatusCode::TOO_MANY_REQUESTS, "too_many_jobs", e.to_string()),
            JobError::Unknown(_) => Self::not_found(e.to_string()),
            JobError::NotRunning { .. } => Self::conflict(e.to_string()),
            JobError::Store(_) => Self::unavailable(e),
        }
    }
}

/// `POST /v1/reprocess`: `202` and a new job, `200` and the running job of an identical
/// request, `429` at `coordinator.max_reprocess_jobs`.
async fn start_reprocess(State(state): State<ApiState>, WholeBody(body): WholeBody) -> Result<Response, ApiError> {
    let request: ReprocessRequest = decode_object(&body)?;
    let (job, created) = state.jobs.start(state.engine.clone(), request).await?;
    if created {
        tracing::info!(job = %job.id, from = ?job.request.from, "reprocessing started");
    }
    let status = if created { StatusCode::ACCEPTED } else { StatusCode::OK };
    let location = format!("/v1/reprocess/{}", job.id);
    Ok((status, [(header::LOCATION, location)], Json(StartedJob { job, created })).into_response())
}

fn job_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = path?;
    if !is_valid_id(&id) {
        return Err(ApiError::invalid(format!("job id {id:?} must be 1 to 128 characters of [A-Za-z0-9_.-]")));
    }
    Ok(id)
}

/// `DELETE /v1/reprocess/{id}`: cancels a running job; `202` and the job (`cancelled` once it
/// stopped, still `running` while another replica stops it), `409` for one that ended.
async fn cancel_reprocess(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, Json<ReprocessJob>), ApiError> {
    let id = job_id(path)?;
    let job = state.jobs.cancel(&state.engine, &id).await?;
    tracing::info!(job = %job.id, status = ?job.status, "reprocessing cancelled");
    Ok((StatusCode::ACCEPTED, Json(job)))
}

async fn reprocess_job(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<ReprocessJob>, ApiError> {
    let id = job_id(path)?;
    let job = reprocess::get(state.engine.controls().store().as_ref(), &id).await.map_err(ApiError::unavailable)?;
    job.map(Json).ok_or_else(|| ApiError::not_found(format!("no reprocessing job {id} (records are kept for 7 days)")))
}

/// The optional `{"reason": ...}` body of the task and queue controls.
fn reason(body: &[u8]) -> Result<Option<String>, ApiError> {
    let request: CancelRequest = if body.is_empty() { CancelRequest::default() } else { decode_object(body)? };
    if request.reason.as_ref().is_some_and(|r| r.len() > 1024) {
        return Err(ApiError::invalid("`reason` must be at most 1024 bytes"));
    }
    Ok(request.reason)
}

/// Applies an operator's `input` to task `id`: the task after it (as it is, when the input
/// changed nothing), 404 for no such task, 409 when the task's state has no such edge.
async fn control_task(state: &ApiState, id: &str, input: Input) -> Result<Task, ApiError> {
    match state.engine.handle(id, input).await {
        Ok(Handled::Applied(task)) => Ok(*task),
        Ok(Handled::Ignored(_)) => {
            state.engine.store().get(id).await?.ok_or_else(|| ApiError::not_found(format!("no task {id}")))
        }
        Err(EngineError::UnknownTask(_)) => Err(ApiError::not_found(format!("no task {id}"))),
        Err(EngineError::Illegal(e)) => Err(ApiError::conflict(e.reason)),
        Err(e) => Err(ApiError::unavailable(e)),
    }
}

/// Query of `GET /v1/events`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventParams {
    /// Only events of this task.
    pub task_id: Option<String>,
    /// Only these event types: a selector such as `task.completed || task.failed` or `image.*`.
    #[serde(rename = "type")]
    pub event_type: Option<String>,
}

/// Longest `Last-Event-ID` taken (event ids are UUIDs; this leaves room for other ids).
const MAX_LAST_EVENT_ID: usize = 128;

async fn events(
    State(state): State<ApiState>,
    headers: HeaderMap,
    query: Result<Query<EventParams>, QueryRejection>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let Query(params) = query?;
    let last_event_id = match headers.get("last-event-id").map(|value| value.to_str()) {
        None => None,
        Some(Ok(id)) if id.len() <= MAX_LAST_EVENT_ID => Some(id.trim()).filter(|id| !id.is_empty()),
        Some(_) => {
            return Err(ApiError::invalid(format!(
                "`Last-Event-ID` must be visible ASCII, at most {MAX_LAST_EVENT_ID} characters"
            )));
        }
    };
    let selector = match params.event_type.as_deref().filter(|s| !s.is_empty()) {
        Some(s) => Selector::parse(s).map_err(|e| ApiError::invalid(format!("`type`: {e}")))?,
        None => Selector::all(),
    };
    let known = EventType::ALL.map(EventType::as_str);
    if let Some(pattern) = selector.pattern_matching_none(&known) {
        return Err(ApiError::invalid(format!(
            "`type`: {pattern:?} matches no event type; known: {}",
            known.join(", ")
        )));
    }
    let task_id = params.task_id.filter(|t| !t.is_empty());
    if let Some(id) = &task_id
        && !is_valid_id(id)
    {
        return Err(ApiError::invalid(format!("`taskId` {id:?} must be 1 to 128 characters of [A-Za-z0-9_.-]")));
    }
    let watch = state
        .hub
        .watch_after(last_event_id)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "too_many_clients", e.to_string()))?;
    let stream = futures::stream::unfold((watch, selector, task_id), |(mut watch, selector, task_id)| async move {
        loop {
            match watch.next().await? {
                Watched::Event(event) => {
                    let wanted = selector.matches(&event.event_type)
                        && task_id.as_ref().is_none_or(|id| event.task_id.as_deref() == Some(id.as_str()));
                    if wanted {
                        let sse = SseEvent::default().event(&event.event_type).id(&event.event_id).data(&event.json);
                        return Some((Ok(sse), (watch, selector, task_id)));
                    }
                }
                Watched::Lagged(missed) => {
                    let sse = SseEvent::default().event("lagged").data(format!("{{\"missed\":{missed}}}"));
                    return Some((Ok(sse), (watch, selector, task_id)));
                }
                Watched::Gap => {
                    let sse = SseEvent::default()
                        .event("reset")
                        .data(r#"{"reason":"the events after Last-Event-ID are no longer held: reload"}"#);
                    return Some((Ok(sse), (watch, selector, task_id)));
                }
            }
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// Query of `GET /v1/dlq`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct DlqParams {
    /// Page size, 1 to 500 (default 50).
    pub limit: Option<String>,
    /// `nextCursor` of the previous page.
    pub cursor: Option<String>,
}

/// Answer of `GET /v1/dlq`: a page of the archive and how many letters it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterListing {
    /// The page.
    #[serde(flatten)]
    pub page: DeadLetterPage,
    /// Letters in the archive now.
    pub total: u64,
}

async fn dead_letters(
    State(state): State<ApiState>,
    query: Result<Query<DlqParams>, QueryRejection>,
) -> Result<Json<DeadLetterListing>, ApiError> {
    let Query(params) = query?;
    let limit = limit(params.limit.as_deref())?;
    let store = state.engine.store();
    let cursor = params.cursor.as_deref().filter(|c| !c.is_empty());
    let (page, total) = tokio::try_join!(store.dead_letters(limit, cursor), store.count_dead_letters())?;
    Ok(Json(DeadLetterListing { page, total }))
}

/// Answer of `POST /v1/dlq/{id}/replay`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Replayed {
    /// The archive entry replayed (and removed).
    pub id: String,
    /// The queue the message was sent back to.
    pub queue: String,
}

async fn purge_dead_letter(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let Path(id) = path?;
    if state.engine.store().remove_dead_letter(&id).await? {
        tracing::info!(id, "dead letter purged");
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no dead letter {id}")))
    }
}

async fn openapi_document() -> impl IntoResponse {
    Json(openapi::document())
}
