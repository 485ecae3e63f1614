//! `POST /v1/blobs` (upload an image, answered with its key for a `blob` submit) and
//! `GET /v1/blobs/{key}` (an image or thumbnail by key), served by `imagepipe run`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use imagepipe_blob::{BlobError, BlobKey, BlobStore};
use imagepipe_download_worker::Sniffed;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// Answer of `POST /v1/blobs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Uploaded {
    /// The blob's key, `sha256:<hex>`: submit it as `{"blob": key}`.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

#[derive(Clone)]
struct BlobState {
    blobs: Arc<dyn BlobStore>,
    token: Option<Arc<str>>,
}

/// The blob routes over `blobs`, requiring `Authorization: Bearer <token>` when `token` is set
/// and refusing uploads over `max_bytes`.
pub fn router(blobs: Arc<dyn BlobStore>, token: Option<String>, max_bytes: u64) -> Router {
    let state = BlobState { blobs, token: token.map(Into::into) };
    Router::new()
        .route("/v1/blobs", post(upload))
        .route("/v1/blobs/{key}", get(download))
        .layer(DefaultBodyLimit::max(usize::try_from(max_bytes).unwrap_or(usize::MAX)))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (status, Json(json!({ "error": code, "message": message.into() }))).into_response()
}

fn unavailable(e: &BlobError) -> Response {
    tracing::warn!(error = %e, "blob store request failed");
    error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("try again: {e}"))
}

async fn require_token(State(state): State<BlobState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.token {
        let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let ok = given.and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|t| {
            t.len() == token.len() && t.bytes().zip(token.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
        });
        if !ok {
            let mut response = error(StatusCode::UNAUTHORIZED, "unauthorized", "send `Authorization: Bearer <token>`");
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
    }
    next.run(request).await
}

async fn upload(State(state): State<BlobState>, body: Bytes) -> Response {
    if body.is_empty() {
        return error(StatusCode::BAD_REQUEST, "invalid_request", "the body is empty: send the image's bytes");
    }
    let size = body.len() as u64;
    match state.blobs.put(body).await {
        Ok(key) => {
            let location = format!("/v1/blobs/{key}");
            let body = Uploaded { key: key.to_string(), size };
            (StatusCode::CREATED, [(header::LOCATION, location)], Json(body)).into_response()
        }
        Err(e) => unavailable(&e),
    }
}

async fn download(State(state): State<BlobState>, Path(key): Path<String>) -> Response {
    let key = match key.parse::<BlobKey>() {
        Ok(key) => key,
        Err(e) => return error(StatusCode::BAD_REQUEST, "invalid_request", e.to_string()),
    };
    match state.blobs.get(&key).await {
        Ok(bytes) => {
            let content_type = match imagepipe_download_worker::sniff(&bytes) {
                Sniffed::Image(format) => format!("image/{}", format.as_str()),
                Sniffed::Other(_) => "application/octet-stream".to_owned(),
            };
            ([(header::CONTENT_TYPE, content_type)], bytes).into_response()
        }
        Err(BlobError::NotFound(key)) => error(StatusCode::NOT_FOUND, "not_found", format!("no blob {key}")),
        Err(e) => unavailable(&e),
    }
}
