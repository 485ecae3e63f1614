//! `GET /v1/search?tags=cat,animal&mode=all|any&limit=20`: matching tasks, best first, with
//! their thumbnail keys. Errors are the runtime's [`ApiError`] (a bad parameter is a `400`).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use imagepipe_runtime::http::ApiError;
use serde::{Deserialize, Serialize};

use crate::index::{Hit, TagIndex, TagMatch};

/// Results returned when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 20;
/// Largest `limit` accepted.
pub const MAX_LIMIT: usize = 1000;
/// Most tags one query may name.
pub const MAX_TAGS: usize = 32;

/// The query string.
#[derive(Debug, Deserialize)]
struct SearchQuery {
    tags: Option<String>,
    mode: Option<String>,
    limit: Option<String>,
}

/// The answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct SearchResponse {
    /// The normalized tags searched for.
    pub tags: Vec<String>,
    /// How they were combined.
    pub mode: TagMatch,
    /// Matching tasks, best first.
    pub results: Vec<Hit>,
}

/// The search routes over `index`.
pub fn routes(index: Arc<dyn TagIndex>) -> Router {
    Router::new().route("/v1/search", get(search)).with_state(index)
}

async fn search(
    State(index): State<Arc<dyn TagIndex>>,
    query: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Json<SearchResponse>, ApiError> {
    let Query(query) = query?;
    let mut tags: Vec<String> = Vec::new();
    for tag in query.tags.as_deref().unwrap_or_default().split(',').map(crate::normalize_tag) {
        if !tag.is_empty() && !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    if tags.is_empty() {
        return Err(ApiError::invalid("tags: give at least one tag, e.g. ?tags=cat,animal"));
    }
    if tags.len() > MAX_TAGS {
        return Err(ApiError::invalid(format!("tags: at most {MAX_TAGS} tags")));
    }
    let mode = match query.mode.as_deref() {
        None | Some("all") => TagMatch::All,
        Some("any") => TagMatch::Any,
        Some(other) => return Err(ApiError::invalid(format!("mode: {other:?} is not all or any"))),
    };
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(limit)) if (1..=MAX_LIMIT).contains(&limit) => limit,
        Some(_) => return Err(ApiError::invalid(format!("limit: must be a whole number 1-{MAX_LIMIT}"))),
    };
    let results = index.search(&tags, mode, limit).await.map_err(|e| ApiError::unavailable(crate::error_chain(&e)))?;
    Ok(Json(SearchResponse { tags, mode, results }))
}
