//! `POST /v1/blobs` (upload an image, answered with its key for a `blob` submit) and
//! `GET /v1/blobs/{key}` (an image or thumbnail by key), part of the coordinator's API in every
//! deployment (the coordinator shares `blob.*` with the workers).

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use imagepipe_blob::{BlobError, BlobKey, BlobStore, Sniffed, sniff};
use imagepipe_runtime::http::{ApiError, BodyLimit, WholeBody};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Answer of `POST /v1/blobs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Uploaded {
    /// The blob's key, `sha256:<hex>`: submit it as `{"blob": key}`.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// The blob routes over `blobs`, refusing uploads over `max_bytes` (`download.max_bytes`: a
/// `413` naming it).
pub fn router(blobs: Arc<dyn BlobStore>, max_bytes: u64) -> Router {
    let routes =
        Router::new().route("/v1/blobs", post(upload)).route("/v1/blobs/{key}", get(download)).with_state(blobs);
    BodyLimit::new(max_bytes).set_by("download.max_bytes").apply(routes)
}

async fn upload(State(blobs): State<Arc<dyn BlobStore>>, WholeBody(body): WholeBody) -> Result<Response, ApiError> {
    if body.is_empty() {
        return Err(ApiError::invalid("the body is empty: send the image's bytes"));
    }
    if let Sniffed::Other(what) = sniff(&body) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the body is not an image ({what}): upload the bytes of a JPEG, PNG, GIF, WebP, TIFF or other image file"
            ),
        ));
    }
    let size = body.len() as u64;
    let key = blobs.put(body).await.map_err(ApiError::unavailable)?;
    let location = format!("/v1/blobs/{key}");
    let body = Uploaded { key: key.to_string(), size };
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(body)).into_response())
}

async fn download(
    State(blobs): State<Arc<dyn BlobStore>>,
    key: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(key) = key?;
    let key = key.parse::<BlobKey>().map_err(|e| ApiError::invalid(e.to_string()))?;
    match blobs.get(&key).await {
        Ok(bytes) => {
            let content_type = match sniff(&bytes) {
                Sniffed::Image(format) => format.content_type(),
                Sniffed::Other(_) => "application/octet-stream",
            };
            // A key is the SHA-256 of the bytes: what it names never changes.
            let headers = [
                (header::CONTENT_TYPE, content_type),
                (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            ];
            Ok((headers, bytes).into_response())
        }
        Err(BlobError::NotFound(key)) => Err(ApiError::not_found(format!("no blob {key}"))),
        Err(e) => Err(ApiError::unavailable(e)),
    }
}
