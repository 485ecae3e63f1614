//! The controls of one task: `POST /v1/tasks/{id}/cancel`, `/pause`, `/resume` and `/retry`,
//! each an [`Input`] to the state machine.

use axum::Json;
use axum::extract::Path;
use axum::extract::State;
use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use imagepipe_contracts::Step;
use imagepipe_runtime::http::Scope::Operate;
use imagepipe_runtime::http::{ApiError, WholeBody};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::route::{Answer, Content, Operation, Route, id_param};
use super::tasks::TaskView;
use super::{ApiState, decode_object, task_id};
use crate::engine::{EngineError, Handled};
use crate::machine::Input;
use crate::task::Task;

/// The task control routes.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let cancel_task = Operation::post(
        "/v1/tasks/{id}/cancel",
        Operate,
        "cancelTask",
        "Cancel a task; it stops at the next step boundary",
    )
    .param(id_param("Task id"))
    .body(false, vec![Content::json::<CancelRequest>()])
    .ok::<TaskView>(202, "Cancelled, or cancelling at the step boundary")
    .error(400, "Not a task id, or a malformed body")
    .error(404, "No such task")
    .error(409, "The task already finished")
    .answer(Answer::too_large_json());
    vec![
        Route::new(cancel_task, cancel),
        Route::new(
            change(
                "/v1/tasks/{id}/pause",
                "pauseTask",
                "Pause a task at its next step boundary (at once when no step runs)",
            )
            .body(false, vec![Content::json::<CancelRequest>()])
            .answer(Answer::too_large_json()),
            pause,
        ),
        Route::new(
            change("/v1/tasks/{id}/resume", "resumeTask", "Resume a paused task (or withdraw a pending pause)"),
            resume,
        ),
        Route::new(
            change(
                "/v1/tasks/{id}/retry",
                "retryTask",
                "Run a failed or cancelled task again from the first step whose output it lacks, as a new generation",
            ),
            retry,
        ),
    ]
}

/// A control that answers with the task after it (pause, resume, retry).
fn change(path: &'static str, id: &'static str, summary: &str) -> Operation {
    Operation::post(path, Operate, id, summary)
        .param(id_param("Task id"))
        .ok::<TaskView>(202, "The task after the request")
        .error(400, "Not a task id, or a malformed body")
        .error(404, "No such task")
        .error(409, "The task's state has no such move (it finished)")
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
/// output it lacks (or the stage of users' own it failed at), as a new generation in its own lanes; `409` for a task that is not
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
    .find_map(|(step, done)| (!done).then_some(step))
    // A task that failed at a stage of users' own has every built-in output.
    .or_else(|| task.failure.as_ref().map(|f| f.step).filter(|s| s.is_custom()));
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

/// The optional `{"reason": ...}` body of the task and queue controls.
pub(super) fn reason(body: &[u8]) -> Result<Option<String>, ApiError> {
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
