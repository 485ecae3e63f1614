//! The similarity routes, answered from the replica's [`LiveIndex`] (synced with the store
//! before each answer). Errors are the runtime's [`ApiError`].
//!
//! - `GET /v1/tasks/{id}/similar?limit=10`: the images most similar to a task's.
//! - `POST /v1/search/similar?limit=10`: the images most similar to an uploaded image (its bytes
//!   as the body), or to a stored blob (`{"blobKey": "sha256:…"}` as JSON); the model runs on it.
//! - `GET /v1/duplicates?threshold=0.95&limit=100`: groups of near-duplicates.
//! - `POST /v1/similarity/rebuild`, `GET /v1/similarity/rebuild`: start a rebuild of the index
//!   from the event stream, and see how it goes ([`crate::rebuild`]).

use std::sync::Arc;

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use imagepipe_ai_worker::{AnalyzeError, Classifier};
use imagepipe_blob::{BlobError, BlobKey, BlobStore, Sniffed, sniff};
use imagepipe_runtime::http::{ApiError, BodyLimit, ImageBody, Scope, UploadSlots, require};
use serde::{Deserialize, Serialize};

use crate::live::{IndexSize, LiveIndex, Similar};
use crate::rebuild::{Rebuild, RebuildStatus};
use crate::store::SimilarityStore;

/// Results returned when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 10;
/// Largest `limit` of the similar-image routes.
pub const MAX_LIMIT: usize = 100;
/// Groups returned by `GET /v1/duplicates` when `limit` is not given, and the most it returns.
pub const DEFAULT_GROUPS: usize = 100;
/// Most groups `GET /v1/duplicates` returns.
pub const MAX_GROUPS: usize = 1000;

/// What the routes answer from.
#[derive(Clone)]
pub struct SimilarityApi {
    /// The store the live index follows.
    pub store: Arc<dyn SimilarityStore>,
    /// The replica's index.
    pub live: Arc<LiveIndex>,
    /// The model, to embed an image given to `POST /v1/search/similar`; `None` when it could
    /// not be loaded (that route then answers `503`, saying why).
    pub model: Result<Classifier, String>,
    /// The blob store, for a `blobKey` given to `POST /v1/search/similar`.
    pub blobs: Arc<dyn BlobStore>,
    /// The rebuild of this replica.
    pub rebuild: Arc<Rebuild>,
}

/// The answer of the similar-image routes.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SimilarResponse {
    /// The task compared with, for `GET /v1/tasks/{id}/similar`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The embedding version compared in.
    pub version: String,
    /// The most similar images, best first.
    pub results: Vec<Similar>,
}

/// One group of near-duplicates.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DuplicateGroup {
    /// The tasks of the group, by task id.
    pub tasks: Vec<GroupMember>,
}

/// A task of a [`DuplicateGroup`].
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupMember {
    /// The task.
    pub task_id: String,
    /// Blob key of its thumbnail, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thumbnail_key: Option<String>,
}

/// The answer of `GET /v1/duplicates`.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DuplicatesResponse {
    /// The cosine a pair needed (or a hash within `similarity.phash_max_distance`).
    pub threshold: f64,
    /// Groups found in all.
    pub total: usize,
    /// The first `limit` groups, largest first.
    pub groups: Vec<DuplicateGroup>,
    /// How much the index holds.
    pub index: IndexSize,
}

#[derive(Debug, Deserialize)]
struct LimitQuery {
    limit: Option<String>,
}

#[derive(Debug, Deserialize)]
struct DuplicatesQuery {
    threshold: Option<String>,
    limit: Option<String>,
}

/// The JSON body of `POST /v1/search/similar`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SearchBody {
    blob_key: String,
}

/// Largest JSON body of `POST /v1/search/similar` (`{"blobKey": "sha256:…"}` is under 100
/// bytes).
pub const SEARCH_JSON_BYTES: u64 = 4 * 1024;

/// The routes over `api`; uploads to `POST /v1/search/similar` up to `max_bytes`
/// (`download.max_bytes`), as many at once as `slots` let in.
pub fn routes(api: SimilarityApi, max_bytes: u64, slots: UploadSlots) -> Router {
    let search =
        Router::new().route("/v1/search/similar", require(Scope::Read, post(search_similar))).with_state(api.clone());
    let search = slots.apply(BodyLimit::new(max_bytes).set_by("download.max_bytes").apply(search));
    Router::new()
        .route("/v1/tasks/{id}/similar", require(Scope::Read, get(similar_to_task)))
        .route("/v1/duplicates", require(Scope::Read, get(duplicates)))
        .route(
            "/v1/similarity/rebuild",
            require(Scope::Admin, post(start_rebuild)).merge(require(Scope::Read, get(rebuild_status))),
        )
        .with_state(api)
        .merge(search)
}

/// `limit` as a whole number in `1..=max`, `default` when absent.
fn limit(param: Option<&str>, default: usize, max: usize) -> Result<usize, ApiError> {
    match param.map(str::parse::<usize>) {
        None => Ok(default),
        Some(Ok(limit)) if (1..=max).contains(&limit) => Ok(limit),
        Some(_) => Err(ApiError::invalid(format!("limit: must be a whole number 1-{max}"))),
    }
}

impl SimilarityApi {
    async fn synced(&self) -> Result<&LiveIndex, ApiError> {
        self.live
            .sync(self.store.as_ref())
            .await
            .map_err(|e| ApiError::unavailable(imagepipe_runtime::error_chain(&e)))?;
        Ok(&self.live)
    }
}

async fn similar_to_task(
    State(api): State<SimilarityApi>,
    id: Result<Path<String>, PathRejection>,
    query: Result<Query<LimitQuery>, QueryRejection>,
) -> Result<Json<SimilarResponse>, ApiError> {
    let (Path(task_id), Query(query)) = (id?, query?);
    let limit = limit(query.limit.as_deref(), DEFAULT_LIMIT, MAX_LIMIT)?;
    let live = api.synced().await?;
    let Some(results) = live.similar_to(&task_id, limit) else {
        return Err(ApiError::not_found(format!(
            "task {task_id} has no embedding in the similarity index (unknown, not analysed yet, or expired)"
        )));
    };
    let version = live.version_of(&task_id).unwrap_or_default();
    Ok(Json(SimilarResponse { task_id: Some(task_id), version, results }))
}

/// The image of a search: an upload is read as [`ImageBody`] (judged by its head, bounded as it
/// streams), a JSON body within [`SEARCH_JSON_BYTES`] names a stored blob.
async fn search_image(api: &SimilarityApi, request: Request) -> Result<Bytes, ApiError> {
    let is_json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("application/json"));
    if !is_json {
        let ImageBody(image) = ImageBody::from_request(request, &()).await.map_err(|e| match e.status {
            400 => ApiError::invalid("the body is empty: send an image's bytes or {\"blobKey\": \"sha256:…\"}"),
            _ => e,
        })?;
        return Ok(image);
    }
    let body = BodyLimit::new(SEARCH_JSON_BYTES).read(request).await?;
    let SearchBody { blob_key } = serde_json::from_slice(&body)
        .map_err(|e| ApiError::invalid(format!("body: {e}; send {{\"blobKey\": \"sha256:…\"}} or an image")))?;
    let key = blob_key.parse::<BlobKey>().map_err(|e| ApiError::invalid(format!("blobKey: {e}")))?;
    let image = match api.blobs.get(&key).await {
        Ok(bytes) => bytes,
        Err(BlobError::NotFound(key)) => return Err(ApiError::not_found(format!("no blob {key}"))),
        Err(e) => return Err(ApiError::unavailable(e)),
    };
    if let Sniffed::Other(what) = sniff(&image) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("blob {key} is not an image ({what})"),
        ));
    }
    Ok(image)
}

async fn search_similar(
    State(api): State<SimilarityApi>,
    query: Result<Query<LimitQuery>, QueryRejection>,
    request: Request,
) -> Result<Json<SimilarResponse>, ApiError> {
    let Query(query) = query?;
    let limit = limit(query.limit.as_deref(), DEFAULT_LIMIT, MAX_LIMIT)?;
    // The body is judged first: what is not an image is a 415 whether or not a model is loaded.
    let image = search_image(&api, request).await?;
    let model = api.model.as_ref().map_err(|why| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "model_unavailable", format!("the model is not loaded: {why}"))
    })?;
    let wait = api.live.config().model_wait;
    let analysis = model.analyze_within(image, wait).await.map_err(|e| match e {
        AnalyzeError::Busy { waited } => {
            ApiError::busy(format!("{e}: try again (similarity.model_wait)"), waited.max(Duration::from_secs(1)))
        }
        e => ApiError::invalid(format!("the image: {e}")),
    })?;
    let Some(embedding) = analysis.embedding else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "model_unavailable",
            "the model gives no embedding (prepare it again: scripts/prepare-model.sh)",
        ));
    };
    let live = api.synced().await?;
    let results = live.search(&embedding, limit);
    Ok(Json(SimilarResponse { task_id: None, version: embedding.version, results }))
}

async fn duplicates(
    State(api): State<SimilarityApi>,
    query: Result<Query<DuplicatesQuery>, QueryRejection>,
) -> Result<Json<DuplicatesResponse>, ApiError> {
    let Query(query) = query?;
    let live = api.synced().await?;
    let (floor, default) = (live.config().pair_floor, live.config().duplicate_threshold);
    let threshold = match query.threshold.as_deref().map(str::parse::<f64>) {
        None => default,
        Some(Ok(t)) if (floor..=1.0).contains(&t) => t,
        Some(_) => {
            return Err(ApiError::invalid(format!(
                "threshold: must be a cosine from {floor} (similarity.pair_floor) to 1"
            )));
        }
    };
    let limit = limit(query.limit.as_deref(), DEFAULT_GROUPS, MAX_GROUPS)?;
    let mut groups = live.duplicate_groups(threshold);
    groups.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    let total = groups.len();
    let groups = groups
        .into_iter()
        .take(limit)
        .map(|ids| DuplicateGroup {
            tasks: ids
                .into_iter()
                .map(|task_id| GroupMember { thumbnail_key: live.thumbnail_key(&task_id), task_id })
                .collect(),
        })
        .collect();
    Ok(Json(DuplicatesResponse { threshold, total, groups, index: live.size() }))
}

async fn start_rebuild(State(api): State<SimilarityApi>) -> Response {
    match api.rebuild.start() {
        Ok(status) => (StatusCode::ACCEPTED, Json(status)).into_response(),
        Err(running) => {
            ApiError::conflict(format!("a rebuild is already running (started {})", running.started)).into_response()
        }
    }
}

async fn rebuild_status(State(api): State<SimilarityApi>) -> Result<Json<RebuildStatus>, ApiError> {
    api.rebuild.status().map(Json).ok_or_else(|| ApiError::not_found("no rebuild has run on this replica"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_a_whole_number_within_bounds() {
        assert_eq!(limit(None, 10, 100).unwrap(), 10);
        assert_eq!(limit(Some("100"), 10, 100).unwrap(), 100);
        for bad in ["0", "101", "-1", "ten", ""] {
            assert!(limit(Some(bad), 10, 100).is_err(), "{bad}");
        }
    }
}
