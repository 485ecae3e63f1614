//! `GET /v1/search?tags=cat,animal&mode=all|any&limit=20`: matching tasks, best first, with
//! their thumbnail keys. A bad parameter is a `400` with `{"error": "..."}`.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::index::{Hit, Mode, TagIndex};

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
    pub mode: Mode,
    /// Matching tasks, best first.
    pub results: Vec<Hit>,
}

/// The search routes over `index`.
pub fn routes(index: Arc<dyn TagIndex>) -> Router {
    Router::new().route("/v1/search", get(search)).with_state(index)
}

fn bad_request(message: impl Into<String>) -> Response {
    (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": message.into() }))).into_response()
}

async fn search(
    State(index): State<Arc<dyn TagIndex>>,
    query: Result<Query<SearchQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(query) => query,
        Err(rejection) => return bad_request(rejection.body_text()),
    };
    let mut tags: Vec<String> = Vec::new();
    for tag in query.tags.as_deref().unwrap_or_default().split(',').map(crate::normalize_tag) {
        if !tag.is_empty() && !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    if tags.is_empty() {
        return bad_request("tags: give at least one tag, e.g. ?tags=cat,animal");
    }
    if tags.len() > MAX_TAGS {
        return bad_request(format!("tags: at most {MAX_TAGS} tags"));
    }
    let mode = match query.mode.as_deref() {
        None | Some("all") => Mode::All,
        Some("any") => Mode::Any,
        Some(other) => return bad_request(format!("mode: {other:?} is not all or any")),
    };
    let limit = match query.limit.as_deref().map(str::parse::<usize>) {
        None => DEFAULT_LIMIT,
        Some(Ok(limit)) if (1..=MAX_LIMIT).contains(&limit) => limit,
        Some(_) => return bad_request(format!("limit: must be a whole number 1-{MAX_LIMIT}")),
    };
    match index.search(&tags, mode, limit).await {
        Ok(results) => Json(SearchResponse { tags, mode, results }).into_response(),
        Err(error) => {
            tracing::error!(error = %crate::error_chain(&error), "search failed");
            (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({ "error": error.to_string() }))).into_response()
        }
    }
}
