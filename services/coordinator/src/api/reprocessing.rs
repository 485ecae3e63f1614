//! Reprocessing jobs ([`crate::reprocess`]) over HTTP: `POST /v1/reprocess` starts one,
//! `GET /v1/reprocess/{id}` shows its progress, `DELETE /v1/reprocess/{id}` cancels it.

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use imagepipe_contracts::command::is_valid_id;
use imagepipe_runtime::http::Scope::{Operate, Read};
use imagepipe_runtime::http::{ApiError, WholeBody};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::route::{Answer, Content, Operation, Route, id_param};
use super::{ApiState, decode_object};
use crate::reprocess::{self, ReprocessJob, ReprocessRequest};

/// The reprocessing routes.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let example =
        json!({ "from": "analyze", "select": "all", "filter": { "model": "not-current" }, "priority": "low" });
    let start = Operation::post(
        "/v1/reprocess",
        Operate,
        "startReprocess",
        "Run a step and the ones after it again for matching finished tasks, as a new generation",
    )
    .body(true, vec![Content::json::<ReprocessRequest>().example(example)])
    .ok::<StartedJob>(200, "A job of an identical request runs already: that job (`created` false)")
    .ok::<StartedJob>(202, "The job, started (`created` true)")
    .error(400, "A malformed request (the message names the field)")
    .answer(Answer::too_large_json())
    .error(429, "coordinator.max_reprocess_jobs jobs run already: wait for one to end or cancel one")
    .error(503, "The control state could not be written");
    let get = Operation::get("/v1/reprocess/{id}", Read, "getReprocess", "A reprocessing job's progress")
        .param(id_param("Job id"))
        .ok::<ReprocessJob>(200, "The job")
        .error(400, "Not a job id")
        .error(404, "No such job (kept 7 days)");
    let cancel = Operation::delete(
        "/v1/reprocess/{id}",
        Operate,
        "cancelReprocess",
        "Cancel a running reprocessing job (the tasks it reprocessed so far go on)",
    )
    .param(id_param("Job id"))
    .ok::<ReprocessJob>(202, "The job: `cancelled` once stopped, still `running` while the replica running it stops it")
    .error(400, "Not a job id")
    .error(404, "No such job (kept 7 days)")
    .error(409, "The job is not running (done, failed or cancelled)")
    .error(503, "The control state could not be read or written");
    vec![Route::new(start, start_reprocess), Route::new(get, reprocess_job), Route::new(cancel, cancel_reprocess)]
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
