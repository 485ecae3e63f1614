//! `POST /v1/blobs` (upload an image, answered with its key for a `blob` submit) and
//! `GET /v1/blobs/{key}` (an image or thumbnail by key), part of the coordinator's API in every
//! deployment (the coordinator shares `blob.*` with the workers).
//!
//! `GET /v1/blobs/{key}` streams the blob through the coordinator ([`BlobStore::read`]): from S3
//! as the object store sends it, never whole in memory, with its `Content-Length`; not a redirect
//! to a presigned URL, so clients need no route to the bucket, the API's token and scopes stay
//! the only access control, and the bytes are checked on the way. The stream hashes what passes
//! and holds the last chunk back until the whole hashes to the key: bytes that do not (a corrupt
//! or tampered object) get a `503` when the first chunks, read to type the blob, were all of it,
//! and otherwise end the response early, so the client sees a body shorter than its
//! `Content-Length` (an error), never wrong bytes as a complete answer.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use futures::StreamExt;
use imagepipe_blob::{BlobError, BlobKey, BlobStore, Sniffed, sniff};
use imagepipe_runtime::http::{ApiError, BodyLimit, ImageBody, Scope, UploadSlots};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::route::{Answer, Content, Operation, Route, mount, path_param};

/// `Cache-Control` of `GET /v1/blobs/{key}`: kept for a year by the client alone.
const BLOB_CACHE_CONTROL: &str = "private, max-age=31536000, immutable";

/// How many first bytes of a blob `GET /v1/blobs/{key}` reads to type it (every signature
/// [`sniff`] knows is shorter).
const SNIFF_BYTES: usize = 64;

/// Answer of `POST /v1/blobs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Uploaded {
    /// The blob's key, `sha256:<hex>`: submit it as `{"blob": key}`.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
}

/// The blob routes over `blobs`: uploads as many at once as `slots` let in, each judged by its
/// first bytes and refused as soon as it passes `max_bytes` (`download.max_bytes`: a `413`
/// naming it), as [`ImageBody`] reads it.
pub fn router(blobs: Arc<dyn BlobStore>, max_bytes: u64, slots: UploadSlots) -> Router {
    let [upload, download] = routes().map(|route| mount(vec![route]).with_state(blobs.clone()));
    let uploads = slots.apply(BodyLimit::new(max_bytes).set_by("download.max_bytes").apply(upload));
    download.merge(uploads)
}

/// The upload route and the download route.
pub(super) fn routes() -> [Route<Arc<dyn BlobStore>>; 2] {
    let stored = Answer::json::<Uploaded>(201, "Stored (or already stored: keys are content addresses)")
        .links(json!({ "getBlob": { "operationId": "getBlob", "parameters": { "key": "$response.body#/key" } } }));
    let upload_blob =
        Operation::post("/v1/blobs", Scope::Submit, "uploadBlob", "Upload an image; submit its key as {\"blob\": key}")
            .body(true, vec![Content::binary("application/octet-stream")])
            .answer(stored)
            .error(400, "An empty body")
            .answer(Answer::too_large("download.max_bytes"))
            .error(415, NOT_AN_IMAGE)
            .answer(Answer::busy("http.max_uploads uploads are being received at once"));
    let key = json!({ "type": "string", "pattern": "^sha256:[0-9a-f]{64}$" });
    let get_blob = Operation::get("/v1/blobs/{key}", Scope::Read, "getBlob", "An image or thumbnail by key")
        .param(path_param("key", "sha256:<64 hex digits>", key))
        .answer(Answer::with(200, "The bytes, typed by their magic numbers", Content::binary("image/*")))
        .error(400, "Not a blob key")
        .error(404, "No such blob");
    [Route::new(upload_blob, upload), Route::new(get_blob, download)]
}

/// The `415` of a route taking an image (here, and the similarity search it forwards).
pub(super) const NOT_AN_IMAGE: &str = "The bytes are not an image (the message says what they look like); judged by the first bytes, before the rest is read";

async fn upload(State(blobs): State<Arc<dyn BlobStore>>, ImageBody(body): ImageBody) -> Result<Response, ApiError> {
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
    match blobs.read(&key).await {
        Ok(mut blob) => {
            // The first bytes say the type: read chunks until there are enough (or the blob ends),
            // then send them ahead of the rest.
            let mut head = Vec::new();
            while head.len() < SNIFF_BYTES {
                match blob.chunks.next().await {
                    Some(Ok(chunk)) => head.push(chunk),
                    Some(Err(BlobError::NotFound(key))) => return Err(ApiError::not_found(format!("no blob {key}"))),
                    Some(Err(e)) => return Err(ApiError::unavailable(e)),
                    None => break,
                }
                if head.iter().map(bytes::Bytes::len).sum::<usize>() >= SNIFF_BYTES {
                    break;
                }
            }
            let first: Vec<u8> = head.iter().flat_map(|chunk| chunk.iter().copied()).take(SNIFF_BYTES).collect();
            let content_type = match sniff(&first) {
                Sniffed::Image(format) => format.content_type(),
                Sniffed::Other(_) => "application/octet-stream",
            };
            // A key is the SHA-256 of the bytes: what it names never changes. `private`: the
            // answer needed the API's token, so no shared cache may keep it for others.
            let headers = [
                (header::CONTENT_TYPE, content_type.to_owned()),
                (header::CONTENT_LENGTH, blob.size.to_string()),
                (header::CACHE_CONTROL, BLOB_CACHE_CONTROL.to_owned()),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
            ];
            let body = futures::stream::iter(head.into_iter().map(Ok)).chain(blob.chunks.fuse());
            Ok((headers, Body::from_stream(body)).into_response())
        }
        Err(BlobError::NotFound(key)) => Err(ApiError::not_found(format!("no blob {key}"))),
        Err(e) => Err(ApiError::unavailable(e)),
    }
}
