//! `POST /v1/tasks:batch`: up to [`MAX_BATCH`] submit commands in one request, one result per
//! item, in order. An item is the JSON of `POST /v1/tasks`; one the API refuses (malformed, a
//! broken rule, a `taskId` or `idempotencyKey` an earlier item of the batch has, a `taskId` of
//! a task with another source, a store failure) is answered with its error, and never keeps
//! the others from being created. The items go through [`Engine::submit_batch`]: a handful of
//! store round trips for the whole batch, not a few per item.

use std::collections::HashMap;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::{Json, Router};
use imagepipe_contracts::{SubmitTask, decode};
use imagepipe_runtime::http::{ApiError, BodyLimit, Scope, WholeBody};
use imagepipe_runtime::telemetry::continue_http_trace;
use schemars::{JsonSchema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{Instrument, Span};

use super::route::{Answer, Content, Operation, Route, Schema, mount, reference};
use super::{ApiState, decode_object, new_task_id};
use crate::engine::{Origin, Submission, SubmitFailure};
use crate::slots::Slots;
use crate::task::TaskState;

/// Most items of one batch.
pub const MAX_BATCH: usize = 1_000;

/// Largest body of a batch: 4 KiB per item on average (a submit with a URL and a few labels
/// takes a few hundred bytes; one item may use the full 64 KiB of `POST /v1/tasks`).
pub const BATCH_BODY_BYTES: u64 = 4 * 1024 * 1024;

/// The batch route, with its own body limit.
pub(super) fn router(state: ApiState) -> Router {
    BodyLimit::new(BATCH_BODY_BYTES).apply(mount(routes()).with_state(state))
}

/// The batch route.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let example = json!({ "tasks": [
        { "url": "https://example.com/cat.jpg", "priority": "low" },
        { "taskId": "tsk_photo_0002", "blob": format!("sha256:{}", "0".repeat(64)), "labels": { "album": "summer" } }
    ] });
    let batch = Operation::post(
        "/v1/tasks:batch",
        Scope::Submit,
        "submitTaskBatch",
        "Submit up to 1000 tasks; one result per item, in order (a refused item never fails the others)",
    )
    .body(true, vec![Content::new("application/json", Schema::Generated(request_schema)).example(example)])
    .ok::<BatchResponse>(200, "One result per item: {index, taskId, state, created} or {index, error: {code, message}}")
    .error(400, "Not a JSON object with a `tasks` array of 1 to 1000 items")
    .answer(Answer::too_large(format!("{BATCH_BODY_BYTES} bytes")))
    .error(503, "The store failed for the whole batch; try again");
    vec![Route::new(batch, submit_batch)]
}

/// The schema of the body as the route reads it ([`raw::BatchRequest`]): an object of 1 to
/// [`MAX_BATCH`] items, each a [`SubmitTask`] or anything else (refused on its own).
fn request_schema(generator: &mut SchemaGenerator) -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["tasks"],
        "properties": { "tasks": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_BATCH,
            "description": "Submit commands as POST /v1/tasks takes them. An item that is not one is refused on its \
                            own (its result names the problem), so any JSON value is taken here.",
            "items": { "anyOf": [reference::<SubmitTask>(generator), {}] }
        } }
    })
}

/// Body of `POST /v1/tasks:batch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 1000 submit commands, each as `POST /v1/tasks` takes it.
    #[schemars(length(min = 1, max = 1000))]
    pub tasks: Vec<SubmitTask>,
}

/// The body as read: each item is decoded on its own, so a malformed one is refused alone.
mod raw {
    /// (Named as the public type: decoding errors name it.)
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct BatchRequest {
        pub tasks: Vec<serde_json::Value>,
    }
}

/// Answer of `POST /v1/tasks:batch`: one result per item, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchResponse {
    /// One per item, in the order of the request.
    pub results: Vec<BatchItem>,
    /// How many items were accepted (created, or the existing task of their id or key).
    pub accepted: usize,
    /// How many items were refused.
    pub refused: usize,
}

/// The result of one item of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum BatchItem {
    /// Accepted.
    Accepted(BatchAccepted),
    /// Refused.
    Refused(BatchRefused),
}

impl BatchItem {
    /// The item's position in the request.
    pub fn index(&self) -> usize {
        match self {
            BatchItem::Accepted(a) => a.index,
            BatchItem::Refused(r) => r.index,
        }
    }
}

/// An accepted item of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchAccepted {
    /// The item's position in the request, from 0.
    pub index: usize,
    /// The task id.
    pub task_id: String,
    /// Its state now.
    pub state: TaskState,
    /// False when the id or idempotency key named an existing task.
    pub created: bool,
}

/// A refused item of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BatchRefused {
    /// The item's position in the request, from 0.
    pub index: usize,
    /// Why it was refused.
    pub error: ItemError,
}

/// Why an item of a batch was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ItemError {
    /// `invalid_request` (not a submit command), `invalid_submit` (a broken rule),
    /// `duplicate_in_batch`, `conflict` (the `taskId` names a task with another source) or
    /// `unavailable` (the store failed: submit the item again).
    pub code: String,
    /// What is wrong, naming the field or value.
    pub message: String,
}

impl ItemError {
    fn new(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.to_owned(), message: message.into() }
    }
}

/// `POST /v1/tasks:batch`, in a server span continuing the request's `traceparent`: with one,
/// every task created joins the caller's trace; without, each starts a trace of its own (as
/// it would submitted alone).
async fn submit_batch(
    State(state): State<ApiState>,
    request_headers: HeaderMap,
    WholeBody(body): WholeBody,
) -> Result<Json<BatchResponse>, ApiError> {
    let span = tracing::info_span!("request", otel.name = "POST /v1/tasks:batch", otel.kind = "server");
    continue_http_trace(&span, &request_headers);
    let traced = request_headers.contains_key("traceparent");
    accept_batch(state, &body, traced.then(|| span.clone())).instrument(span).await
}

async fn accept_batch(state: ApiState, body: &[u8], parent: Option<Span>) -> Result<Json<BatchResponse>, ApiError> {
    let raw: raw::BatchRequest = decode_object(body)?;
    let items = raw.tasks.len();
    if items == 0 {
        return Err(ApiError::invalid("`tasks` is empty: give 1 to 1000 submit commands"));
    }
    if items > MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "`tasks` has {items} submit commands; a batch takes at most {MAX_BATCH}: split it"
        )));
    }
    let mut results = Slots::new(items);
    let refuse = |results: &mut Slots<BatchItem>, index: usize, error: ItemError| {
        results.fill(index, BatchItem::Refused(BatchRefused { index, error }));
    };
    let (mut submissions, mut positions) = (Vec::with_capacity(items), Vec::with_capacity(items));
    let (mut ids, mut keys) = (HashMap::new(), HashMap::new());
    for (index, item) in raw.tasks.into_iter().enumerate() {
        let command = match decode_item(&item) {
            Ok(command) => command,
            Err(message) => {
                refuse(&mut results, index, ItemError::new("invalid_request", message));
                continue;
            }
        };
        if let Err(e) = command.validate() {
            refuse(&mut results, index, ItemError::new("invalid_submit", e.to_string()));
            continue;
        }
        if let Some(id) = &command.task_id
            && let Some(first) = ids.get(id)
        {
            let message = format!("`taskId` {id:?} is item {first}'s too: a batch names each task once");
            refuse(&mut results, index, ItemError::new("duplicate_in_batch", message));
            continue;
        }
        if let Some(key) = &command.idempotency_key
            && let Some(first) = keys.get(key)
        {
            let message = format!("`idempotencyKey` {key:?} is item {first}'s too: a batch names each task once");
            refuse(&mut results, index, ItemError::new("duplicate_in_batch", message));
            continue;
        }
        if let Some(id) = &command.task_id {
            ids.insert(id.clone(), index);
        }
        if let Some(key) = &command.idempotency_key {
            keys.insert(key.clone(), index);
        }
        // Untraced: a root span of its own, so the task gets a trace of its own.
        let span = parent.clone().unwrap_or_else(
            || tracing::info_span!(parent: None, "submission", otel.name = "POST /v1/tasks:batch item", index),
        );
        submissions.push(Submission { command, derived_id: new_task_id(), span });
        positions.push(index);
    }
    let engine = &state.engine;
    let submitted = engine.submit_batch(&submissions, Origin::Http).await;
    let mut queued = false;
    for (index, submitted) in positions.into_iter().zip(submitted) {
        match submitted {
            Ok(s) => {
                queued |= s.created && s.task.state == TaskState::Queued;
                let accepted = BatchAccepted { index, task_id: s.task.id, state: s.task.state, created: s.created };
                results.fill(index, BatchItem::Accepted(accepted));
            }
            Err(SubmitFailure::Invalid(e)) => {
                refuse(&mut results, index, ItemError::new("invalid_submit", e.to_string()))
            }
            Err(e @ SubmitFailure::Conflict { .. }) => {
                refuse(&mut results, index, ItemError::new("conflict", e.to_string()))
            }
            Err(SubmitFailure::Store(e)) => {
                tracing::warn!(error = %e, index, "batch item not submitted: the store failed");
                refuse(&mut results, index, ItemError::new("unavailable", format!("try again: {e}")));
            }
        }
    }
    if queued && let Err(e) = engine.start_queued().await {
        tracing::warn!(error = %e, "queued tasks not started; the sweeper starts them");
    }
    let results = results.into_vec();
    let accepted = results.iter().filter(|r| matches!(r, BatchItem::Accepted(_))).count();
    tracing::info!(items, accepted, refused = items - accepted, "batch submitted");
    Ok(Json(BatchResponse { results, accepted, refused: items - accepted }))
}

/// One item as a submit command, or what is wrong with it, in the words of `POST /v1/tasks`.
fn decode_item(item: &Value) -> Result<SubmitTask, String> {
    let bytes = serde_json::to_vec(item).expect("a JSON value serializes");
    decode(&bytes).map_err(|e| e.to_string())
}
