//! The stage queues as operators see and steer them: `GET /v1/queues`,
//! `POST /v1/queues/{queue}/pause|resume`, `PUT /v1/queues/{queue}/concurrency`. A pause
//! answers once every live consumer has stopped taking messages, or after [`PAUSE_WAIT`] with
//! `pausing: true`.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use imagepipe_contracts::Priority;
use imagepipe_contracts::names::queues;
use imagepipe_runtime::http::Scope::{Operate, Read};
use imagepipe_runtime::http::{ApiError, WholeBody};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::route::{Answer, Content, Operation, Route, path_param};
use super::task_control::{CancelRequest, reason};
use super::{ApiState, decode_object};
use crate::control::PAUSE_WAIT;
use crate::engine::Engine;

/// The stage queue routes.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let list_queues = Operation::get(
        "/v1/queues",
        Read,
        "listQueues",
        "Every stage queue: depth per priority lane, in flight, oldest wait, rate over a minute, consumers, \
         concurrency, paused",
    )
    .ok::<QueuesView>(200, "The stage queues")
    .error(503, "The broker or the control state could not be read");
    let set_concurrency = Operation::put(
        "/v1/queues/{queue}/concurrency",
        Operate,
        "setQueueConcurrency",
        "Set the messages each replica of a stage handles at once, without a restart",
    )
    .param(stage_param())
    .body(true, vec![Content::json::<ConcurrencyRequest>()])
    .ok::<QueueView>(200, "The queue after the change")
    .error(400, "perReplica is not 1 to 1024 or null, or a malformed body")
    .error(404, "No such stage queue")
    .answer(Answer::too_large_json())
    .error(503, "The control state could not be written");
    vec![
        Route::new(list_queues, list),
        Route::new(
            change(
                "/v1/queues/{queue}/pause",
                "pauseQueue",
                "Pause a stage queue on every replica within a second (in-flight messages finish)",
            ),
            pause,
        ),
        Route::new(change("/v1/queues/{queue}/resume", "resumeQueue", "Resume a paused stage queue"), resume),
        Route::new(set_concurrency, concurrency),
    ]
}

/// The `{queue}` of a route.
fn stage_param() -> Value {
    path_param(
        "queue",
        "The stage queue: download, metadata or ai (or its full name, tasks.download), or a stage of users' own \
         in pipeline.stages (faces, tasks.faces)",
        json!({ "type": "string", "examples": ["download", "tasks.metadata", "ai"] }),
    )
}

/// A pause or a resume of a queue.
fn change(path: &'static str, id: &'static str, summary: &str) -> Operation {
    Operation::post(path, Operate, id, summary)
        .param(stage_param())
        .body(false, vec![Content::json::<CancelRequest>()])
        .ok::<QueueView>(200, "The queue after the change")
        .error(400, "A malformed body")
        .error(404, "No such stage queue")
        .answer(Answer::too_large_json())
        .error(503, "The control state could not be written")
}

/// Most messages a replica may be set to handle at once.
pub const MAX_PER_REPLICA: u32 = 1_024;

/// One priority lane of a queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaneView {
    /// `high`, `normal` or `low`.
    pub priority: Priority,
    /// The lane's queue (`tasks.download.high`).
    pub queue: String,
    /// Messages waiting in the lane; `null` when the broker cannot say (nothing consumed it yet).
    pub depth: Option<u64>,
}

/// One stage queue, every lane together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    /// The short name operators use: `download`, `metadata`, `ai`, or a stage's name.
    pub name: String,
    /// The queue (`tasks.download`).
    pub queue: String,
    /// Messages waiting in every lane; `null` when the broker cannot say.
    pub depth: Option<u64>,
    /// Messages the consumers hold now.
    pub in_flight: u64,
    /// How long the oldest unfinished message has been in the queue, ms; `null` when it is
    /// empty or the broker cannot say (Kafka).
    pub oldest_wait_ms: Option<u64>,
    /// Messages taken per second over the last minute.
    pub rate_per_sec: f64,
    /// Consumers (worker replicas) alive.
    pub consumers: u32,
    /// Messages the live consumers may hold at once, together.
    pub concurrency: u64,
    /// The per-replica concurrency an operator set; `null`: each replica's `worker.concurrency`.
    pub per_replica: Option<u32>,
    /// An operator paused the queue: no replica takes new messages of it once the pause is in
    /// force (see `pausing`).
    pub paused: bool,
    /// Paused, but not yet in force: a live consumer has not reported that it stopped taking
    /// messages (each does within about a second).
    #[serde(default)]
    pub pausing: bool,
    /// Each lane, highest first.
    pub lanes: Vec<LaneView>,
}

/// Body of `GET /v1/queues`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QueuesView {
    /// The stage queues in pipeline order, the queues of stages of users' own among them.
    pub queues: Vec<QueueView>,
}

/// Body of `PUT /v1/queues/{queue}/concurrency`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConcurrencyRequest {
    /// Messages each replica handles at once (1 to 1024); `null` returns to each replica's
    /// `worker.concurrency`.
    #[schemars(range(min = 1, max = 1024))]
    pub per_replica: Option<u32>,
}

/// The stage queue an operator names (`download`, `tasks.download`, a stage of users' own of
/// `pipeline.stages` by its name or queue, ...).
fn stage(state: &ApiState, path: Result<Path<String>, PathRejection>) -> Result<&'static str, ApiError> {
    let Path(name) = path?;
    let stages = &state.engine.config().policy.stages;
    let custom = || stages.iter().map(|s| s.step).find(|s| s.is_custom() && (s.as_str() == name || s.queue() == name));
    queues::stage(&name).or_else(|| custom().map(|s| s.queue())).ok_or_else(|| {
        let names: Vec<&str> = stages.iter().map(|s| s.step.queue().trim_start_matches("tasks.")).collect();
        ApiError::not_found(format!("no stage queue {name:?}; the stage queues are {}", names.join(", ")))
    })
}

/// What `engine` knows of stage queue `queue` now.
pub async fn view(engine: &Engine, queue: &'static str) -> Result<QueueView, ApiError> {
    let bus = engine.bus();
    let now = engine.clock().unix_ms();
    let lanes = Priority::ALL.map(|p| (p, p.lane(queue)));
    let backlogs = futures::future::join_all(lanes.iter().map(|(_, lane)| bus.queues.backlog(lane)));
    let oldest = futures::future::join_all(lanes.iter().map(|(_, lane)| bus.queues.oldest(lane)));
    let (backlogs, oldest) = tokio::join!(backlogs, oldest);
    let control = engine.controls().store();
    let (state, activity) = tokio::join!(control.state(), control.activity(queue, now));
    let (state, activity) = (state.map_err(ApiError::unavailable)?, activity.map_err(ApiError::unavailable)?);
    let mut views = Vec::with_capacity(3);
    for ((priority, lane), backlog) in lanes.into_iter().zip(backlogs) {
        let depth = backlog.map_err(ApiError::unavailable)?.map(|b| b.waiting);
        views.push(LaneView { priority, queue: lane, depth });
    }
    // Unknown only when no lane's broker count is known.
    let known: Vec<u64> = views.iter().filter_map(|l| l.depth).collect();
    let depth = (!known.is_empty()).then(|| known.iter().sum());
    let oldest = oldest.into_iter().filter_map(|o| o.ok().flatten()).min();
    let control = state.queue(queue);
    Ok(QueueView {
        name: queue.strip_prefix("tasks.").unwrap_or(queue).to_owned(),
        queue: queue.to_owned(),
        depth,
        in_flight: activity.in_flight,
        oldest_wait_ms: oldest.map(|at| now.saturating_sub(at)),
        rate_per_sec: (activity.rate_per_sec * 100.0).round() / 100.0,
        consumers: activity.consumers,
        concurrency: activity.concurrency,
        per_replica: control.per_replica,
        paused: control.paused,
        pausing: control.paused && !activity.pause_in_force(&control),
        lanes: views,
    })
}

async fn list(State(state): State<ApiState>) -> Result<Json<QueuesView>, ApiError> {
    let stages = state.engine.config().policy.stages.clone();
    let views =
        futures::future::try_join_all(stages.iter().map(|stage| view(&state.engine, stage.step.queue()))).await?;
    Ok(Json(QueuesView { queues: views }))
}

async fn set_paused(
    state: ApiState,
    queue: &'static str,
    body: &[u8],
    paused: bool,
) -> Result<Json<QueueView>, ApiError> {
    let reason = reason(body)?;
    let engine = &state.engine;
    let controls = engine.controls();
    controls
        .set_paused(engine.bus(), engine.clock().as_ref(), queue, paused, reason)
        .await
        .map_err(ApiError::unavailable)?;
    if paused {
        // Answer once no replica takes new messages, or say it is still pausing (`pausing`).
        controls.until_paused(queue, PAUSE_WAIT).await.map_err(ApiError::unavailable)?;
    }
    Ok(Json(view(engine, queue).await?))
}

async fn pause(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    WholeBody(body): WholeBody,
) -> Result<Json<QueueView>, ApiError> {
    let queue = stage(&state, path)?;
    set_paused(state, queue, &body, true).await
}

async fn resume(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    WholeBody(body): WholeBody,
) -> Result<Json<QueueView>, ApiError> {
    let queue = stage(&state, path)?;
    set_paused(state, queue, &body, false).await
}

async fn concurrency(
    State(state): State<ApiState>,
    path: Result<Path<String>, PathRejection>,
    WholeBody(body): WholeBody,
) -> Result<Json<QueueView>, ApiError> {
    let queue = stage(&state, path)?;
    let request: ConcurrencyRequest = decode_object(&body)?;
    if request.per_replica.is_some_and(|n| !(1..=MAX_PER_REPLICA).contains(&n)) {
        return Err(ApiError::invalid(format!("`perReplica` must be 1 to {MAX_PER_REPLICA}, or null")));
    }
    let engine = &state.engine;
    let now = engine.clock().unix_ms();
    engine.controls().store().set_concurrency(queue, request.per_replica, now).await.map_err(ApiError::unavailable)?;
    tracing::info!(queue, per_replica = ?request.per_replica, "queue concurrency changed");
    Ok(Json(view(engine, queue).await?))
}
