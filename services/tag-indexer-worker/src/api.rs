//! `GET /v1/search?tags=cat,animal&mode=all|any&limit=20`: matching tasks, best first, with
//! their thumbnail keys. Errors are the runtime's [`ApiError`] (a bad parameter is a `400`).

use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::routing::get;
use axum::{Json, Router};
use imagepipe_runtime::http::{ApiError, Scope, require};
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

/// The answer of `GET /v1/search`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SearchResponse {
    /// The normalized tags searched for.
    pub tags: Vec<String>,
    /// How they were combined.
    pub mode: TagMatch,
    /// Matching tasks, best first.
    pub results: Vec<Hit>,
}

/// Longest `tags` parameter, in bytes.
pub const MAX_TAGS_PARAM_LEN: usize = 4096;

/// The distinct normalized tags of `?tags=a,b`; refuses an empty list, and stops at the
/// limits ([`MAX_TAGS_PARAM_LEN`], [`MAX_TAGS`]) before doing more work than they allow.
fn parse_tags(param: &str) -> Result<Vec<String>, ApiError> {
    if param.len() > MAX_TAGS_PARAM_LEN {
        return Err(ApiError::invalid(format!("tags: at most {MAX_TAGS_PARAM_LEN} bytes")));
    }
    let mut tags: Vec<String> = Vec::new();
    for tag in param.split(',').map(crate::normalize_tag) {
        if !tag.is_empty() && !tags.contains(&tag) {
            if tags.len() == MAX_TAGS {
                return Err(ApiError::invalid(format!("tags: at most {MAX_TAGS} tags")));
            }
            tags.push(tag);
        }
    }
    if tags.is_empty() {
        return Err(ApiError::invalid("tags: give at least one tag, e.g. ?tags=cat,animal"));
    }
    Ok(tags)
}

/// The search routes over `index`.
pub fn routes(index: Arc<dyn TagIndex>) -> Router {
    Router::new().route("/v1/search", require(Scope::Read, get(search))).with_state(index)
}

async fn search(
    State(index): State<Arc<dyn TagIndex>>,
    query: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Json<SearchResponse>, ApiError> {
    let Query(query) = query?;
    let tags = parse_tags(query.tags.as_deref().unwrap_or_default())?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_normalized_and_deduplicated() {
        assert_eq!(parse_tags(" Cat,animal,,cat ").unwrap(), ["cat", "animal"]);
        assert!(parse_tags(" , ,").is_err());
    }

    #[test]
    fn limits_stop_the_parser_before_it_does_more_work() {
        let within: Vec<String> = (0..MAX_TAGS).map(|i| format!("t{i}")).collect();
        assert_eq!(parse_tags(&within.join(",")).unwrap().len(), MAX_TAGS);
        let over = format!("{},one_more", within.join(","));
        assert!(parse_tags(&over).is_err());
        // Many repeats of few tags stay within MAX_TAGS distinct ones; a huge parameter is
        // refused by its length before it is split.
        assert_eq!(parse_tags(&"cat,".repeat(500)).unwrap(), ["cat"]);
        assert!(parse_tags(&",".repeat(MAX_TAGS_PARAM_LEN + 1)).is_err());
    }
}
