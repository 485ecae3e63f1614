//! Routes that take uploads (`POST /v1/blobs`, `POST /v1/search/similar`), bounded before and
//! while their bodies arrive:
//!
//! - [`UploadSlots`]: at most `http.max_uploads` requests of a route group at once; one that gets
//!   no slot within `http.upload_wait` is answered `503 busy` with `Retry-After`, before any of
//!   its body is read.
//! - [`ImageBody`]: the body read as it streams: judged by its first [`SNIFF_BYTES`] (`415` when
//!   they are no image, before the rest is read), refused `413` as soon as it passes its route's
//!   [`BodyLimit`] (at once when its `Content-Length` does).
//! - [`BodyLimit::read`]: any body read as it streams within a limit.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use futures::StreamExt as _;
use imagepipe_blob::{Sniffed, sniff};
use tokio::sync::Semaphore;

use super::api::{ApiError, BodyLimit};
use crate::config::HttpConfig;

/// Bytes of a body's head judged by their signature before the rest is read: more than every
/// image signature needs (a BMP's DIB size ends at byte 18, an ISO-BMFF brand at 12).
pub const SNIFF_BYTES: usize = 32;

/// A judgement of a body's first bytes: `Err` refuses the body before the rest is read.
type HeadCheck = fn(&[u8]) -> Result<(), ApiError>;

/// Body limit of a request read without a [`BodyLimit`] on its route: axum's default.
const DEFAULT_BODY_BYTES: u64 = 2 << 20;

/// The slots of one group of upload routes (see the module docs). Clones share the slots.
#[derive(Debug, Clone)]
pub struct UploadSlots {
    slots: Arc<Semaphore>,
    max: usize,
    wait: Duration,
}

impl UploadSlots {
    /// `max` requests at once (at least 1); more wait up to `wait` for a slot.
    pub fn new(max: usize, wait: Duration) -> Self {
        let max = max.max(1);
        Self { slots: Arc::new(Semaphore::new(max)), max, wait }
    }

    /// `http.max_uploads` requests at once, waiting up to `http.upload_wait`.
    pub fn from_config(http: &HttpConfig) -> Self {
        Self::new(http.max_uploads, http.upload_wait)
    }

    /// `routes` with every request holding a slot until its answer is made.
    pub fn apply(self, routes: Router) -> Router {
        routes.route_layer(middleware::from_fn_with_state(self, hold_slot))
    }

    /// The `503 busy` of a request that got no slot.
    fn busy(&self) -> ApiError {
        ApiError::busy(
            format!(
                "{} uploads are being received, the most this server takes at once (http.max_uploads): try again",
                self.max
            ),
            self.wait.max(Duration::from_secs(1)),
        )
    }
}

async fn hold_slot(State(slots): State<UploadSlots>, request: Request, next: Next) -> Response {
    let permit = match tokio::time::timeout(slots.wait, slots.slots.clone().acquire_owned()).await {
        Ok(Ok(permit)) => permit,
        Ok(Err(_)) | Err(_) => return slots.busy().into_response(),
    };
    let response = next.run(request).await;
    drop(permit);
    response
}

/// A request's body that must be an image, read as it streams (see the module docs): empty is
/// `400 invalid_request`, no image `415 unsupported_media_type` naming what it is, over its
/// route's [`BodyLimit`] `413 too_large` naming the limit.
#[derive(Debug, Clone)]
pub struct ImageBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for ImageBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let limit = route_limit(&request);
        let bytes = limit.collect(request, Some(judge)).await?;
        if bytes.is_empty() {
            return Err(ApiError::invalid("the body is empty: send the bytes of an image"));
        }
        Ok(Self(bytes))
    }
}

/// `Err` unless `head` starts an image.
fn judge(head: &[u8]) -> Result<(), ApiError> {
    match sniff(head) {
        Sniffed::Image(_) => Ok(()),
        Sniffed::Other("empty") => Ok(()),
        Sniffed::Other(what) => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the body is not an image ({what}): send the bytes of a JPEG, PNG, GIF, WebP, BMP, TIFF, HEIC or AVIF file"
            ),
        )),
    }
}

/// The [`BodyLimit`] on `request`'s route, or axum's default.
fn route_limit(request: &Request) -> BodyLimit {
    request.extensions().get::<BodyLimit>().copied().unwrap_or_else(|| BodyLimit::new(DEFAULT_BODY_BYTES))
}

/// The body's `Content-Length`, when it sends a valid one.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

impl BodyLimit {
    /// `request`'s body, read as it streams within this limit: `413 too_large` as soon as it
    /// passes it (at once when its `Content-Length` does), `400` when it breaks off.
    pub async fn read(self, request: Request) -> Result<Bytes, ApiError> {
        self.collect(request, None).await
    }

    /// [`BodyLimit::read`], judging the first [`SNIFF_BYTES`] (or the whole body when shorter)
    /// with `head` before reading on.
    async fn collect(self, request: Request, head: Option<HeadCheck>) -> Result<Bytes, ApiError> {
        if content_length(request.headers()).is_some_and(|length| length > self.bytes() as u64) {
            return Err(self.exceeded());
        }
        let mut chunks = request.into_body().into_data_stream();
        let mut bytes = BytesMut::new();
        let mut head = head;
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| ApiError::invalid(format!("the body broke off: {e}")))?;
            if chunk.len() > self.bytes() - bytes.len() {
                return Err(self.exceeded());
            }
            bytes.extend_from_slice(&chunk);
            if bytes.len() >= SNIFF_BYTES {
                if let Some(judge) = head.take() {
                    judge(&bytes)?;
                }
            }
        }
        if let Some(judge) = head {
            judge(&bytes)?;
        }
        Ok(bytes.freeze())
    }
}
