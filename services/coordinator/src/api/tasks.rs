//! Tasks: `POST /v1/tasks` (submit), `GET /v1/tasks` (a page of them), `GET /v1/tasks/{id}`
//! and its history. The controls of one task (cancel, pause, resume, retry) are in
//! [`task_control`](super::task_control).

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use imagepipe_contracts::command::{MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN};
use imagepipe_contracts::{StepError, SubmitTask};
use imagepipe_runtime::http::Scope::{Read, Submit};
use imagepipe_runtime::http::{ApiError, WholeBody};
use imagepipe_runtime::telemetry::continue_http_trace;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tracing::Instrument;

use super::route::{Answer, Content, Operation, Route, id_param, query};
use super::{ApiState, MAX_LIMIT, decode_object, limit, new_task_id, non_empty, task_id};
use crate::engine::{Origin, SubmitFailure};
use crate::store::{LABEL_SCAN_LIMIT, LabelFilter, ListOrder, ListQuery, TaskPage};
use crate::task::{HistoryEntry, Task, TaskState};

/// The task routes.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let task_links: Map<String, Value> = ["getTask", "getTaskHistory", "cancelTask"]
        .into_iter()
        .map(|op| (op.to_owned(), json!({ "operationId": op, "parameters": { "id": "$response.body#/taskId" } })))
        .collect();
    let example =
        json!({ "taskId": "tsk_photo_0001", "url": "https://example.com/cat.jpg", "labels": { "album": "summer" } });
    let accepted = Answer::json::<Accepted>(202, "Accepted (or the existing task of this id or idempotency key)")
        .header("Location", json!({ "schema": { "type": "string" }, "description": "The task's URL" }))
        .links(Value::Object(task_links));
    let submit_task = Operation::post("/v1/tasks", Submit, "submitTask", "Submit a task")
        .body(true, vec![Content::json::<SubmitTask>().example(example)])
        .answer(accepted)
        .error(400, "Malformed JSON, a wrong field type, or a submit that breaks a rule (the message names it)")
        .error(409, "The taskId names a task with another source (Location names it)")
        .answer(Answer::too_large_json());
    vec![
        Route::new(submit_task, submit),
        Route::new(list_operation(), list),
        Route::new(
            Operation::get(
                "/v1/tasks/{id}",
                Read,
                "getTask",
                "A task: state, each step's output and attempts, last error",
            )
            .param(id_param("Task id"))
            .ok::<TaskView>(200, "The task")
            .error(400, "Not a task id")
            .error(404, "No such task"),
            get_task,
        ),
        Route::new(
            Operation::get(
                "/v1/tasks/{id}/history",
                Read,
                "getTaskHistory",
                "Every transition of a task with its time",
            )
            .param(id_param("Task id"))
            .ok::<History>(200, "The history")
            .error(400, "Not a task id")
            .error(404, "No such task"),
            history,
        ),
    ]
}

/// `GET /v1/tasks` as the document shows it.
fn list_operation() -> Operation {
    // An empty `status` is no filter, as an absent one.
    let states: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).chain([""]).collect();
    let time = json!({ "type": "integer", "minimum": 0, "maximum": u64::MAX });
    let summary = "A page of tasks, oldest or newest first, filtered by state, creation time and label";
    Operation::get("/v1/tasks", Read, "listTasks", summary)
        .describe(format!(
            "Tasks in creation order (within status=queued: higher priorities first, then creation order), \
             oldest first or, with order=newest, newest first. createdAfter and createdBefore bound the scan \
             (except within status=queued, where they filter as label does). A label filter is applied while \
             scanning, at most {LABEL_SCAN_LIMIT} tasks per page: such a page may be shorter than limit, even \
             empty, and still have a nextCursor; the listing ends at the first page without one. A cursor is a \
             position: given with the other order, the listing goes on from it the other way."
        ))
        .param(query("status", "Only tasks in this state (empty: every state)", json!({ "type": "string", "enum": states })))
        .param(page_limit())
        .param(cursor())
        .param(query(
            "order",
            "oldest (default) or newest first (empty: oldest)",
            json!({ "type": "string", "enum": ["oldest", "newest", ""] }),
        ))
        .param(query("createdAfter", "Only tasks created at or after this time, Unix ms", time.clone()))
        .param(query(
            "createdBefore",
            "Only tasks created before this time, Unix ms; must be greater than createdAfter (else 400)",
            time,
        ))
        .param(query(
            "label",
            &format!(
                "Only tasks with this label: key=value, split at the first =; the key 1 to {MAX_LABEL_KEY_LEN} bytes, \
                 the value at most {MAX_LABEL_VALUE_LEN} bytes (empty: no filter). Filtered while scanning: see the \
                 description."
            ),
            json!({ "type": "string", "pattern": "^(?:$|[^=]+=)", "maxLength": MAX_LABEL_KEY_LEN + 1 + MAX_LABEL_VALUE_LEN }),
        ))
        .ok::<TaskPage>(200, "A page (short or empty with a nextCursor when a filtered scan reached its bound)")
        .error(
            400,
            "A bad parameter (the message names it): status, limit, cursor, order, createdAfter, createdBefore (not \
             a Unix-ms time, or createdAfter not before it), label (no =, an empty key, over the label caps)",
        )
}

/// The `limit` parameter of a list route.
pub(super) fn page_limit() -> Value {
    query("limit", "Page size (default 50)", json!({ "type": "integer", "minimum": 1, "maximum": MAX_LIMIT }))
}

/// The `cursor` parameter of a list route.
pub(super) fn cursor() -> Value {
    query("cursor", "nextCursor of the previous page", json!({ "type": "string" }))
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
    /// The task's shard (`GET /v1/tasks/{id}` of a sharded coordinator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u16>,
    /// The replica holding the lease on the task's shard now, if any holds one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl From<Task> for TaskView {
    fn from(task: Task) -> Self {
        let last_error = task.failure.as_ref().map(|f| f.error.clone()).or_else(|| {
            let current = task.current_step().map(|s| task.steps.get(s).last_error.clone());
            current.flatten()
        });
        Self { task, last_error, shard: None, owner: None }
    }
}

async fn get_task(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<TaskView>, ApiError> {
    let id = task_id(path)?;
    let store = state.engine.store();
    let task = store.get(&id).await?.ok_or_else(|| ApiError::not_found(format!("no task {id}")))?;
    let mut view = TaskView::from(task);
    if let Some(ownership) = state.engine.ownership() {
        let shard = ownership.shard_of(&id);
        let now = state.engine.clock().unix_ms();
        view.shard = Some(shard);
        view.owner = store.leases().await?.into_iter().find(|l| l.shard == shard && l.is_held(now)).map(|l| l.owner);
    }
    Ok(Json(view))
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
