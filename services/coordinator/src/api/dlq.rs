//! The dead-letter archive: `GET /v1/dlq` (a page of it) and `DELETE /v1/dlq/{id}` (purge a
//! letter). Replaying letters is [`dlq_replay`](super::dlq_replay).

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use imagepipe_runtime::http::ApiError;
use imagepipe_runtime::http::Scope::{Admin, Read};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::route::{Answer, Operation, Route, path_param};
use super::tasks::{cursor, page_limit};
use super::{ApiState, limit};
use crate::store::DeadLetterPage;

/// The archive's routes.
pub(super) fn routes() -> Vec<Route<ApiState>> {
    let list = Operation::get("/v1/dlq", Read, "listDeadLetters", "Dead letters, oldest first")
        .param(page_limit())
        .param(cursor())
        .ok::<DeadLetterListing>(200, "A page of the archive, and how many letters it holds")
        .error(400, "A bad parameter");
    let purge = Operation::delete("/v1/dlq/{id}", Admin, "purgeDeadLetter", "Purge a dead letter")
        .param(letter_id())
        .answer(Answer::empty(204, "Purged"))
        .error(404, "No such dead letter");
    vec![Route::new(list, dead_letters), Route::new(purge, purge_dead_letter)]
}

/// The `{id}` of a dead letter.
pub(super) fn letter_id() -> Value {
    path_param("id", "Dead letter id", json!({ "type": "string" }))
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
