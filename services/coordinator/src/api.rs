//! The coordinator's HTTP API (axum): tasks (`tasks`, `task_control`), reprocessing
//! (`reprocessing`), stage queues ([`queue_control`]), events as SSE (`events`), dead letters
//! (`dlq`, [`dlq_replay`]), uploaded blobs ([`blobs`]), the routes of other services it forwards
//! ([`forward`]), and the OpenAPI document of them all (`openapi`). Each module lists its routes
//! in a table of `route::Route`s: the routers are mounted from those tables and the document is
//! rendered from the same ones, so what is served and what is documented cannot part. Errors
//! are the runtime's one [`ApiError`] shape.

pub mod batch;
pub mod blobs;
mod cluster;
mod dlq;
pub mod dlq_replay;
mod events;
pub mod forward;
mod openapi;
pub mod queue_control;
mod reprocessing;
mod route;
mod task_control;
mod tasks;

use std::sync::Arc;

use axum::Router;
use axum::extract::Path;
use axum::extract::rejection::PathRejection;
use imagepipe_blob::BlobStore;
use imagepipe_contracts::command::is_valid_id;
use imagepipe_contracts::decode;
use imagepipe_runtime::http::{ApiError, BodyLimit, UploadSlots};

pub use dlq::{DeadLetterListing, DlqParams, Replayed};
pub use events::EventParams;
pub use reprocessing::StartedJob;
pub use task_control::CancelRequest;
pub use tasks::{Accepted, History, ListParams, TaskView};

use crate::engine::Engine;
use crate::events::EventHub;
use crate::reprocess;
use crate::store::StoreError;
use route::{Operation, Route, mount};

/// Default and largest page sizes of the list endpoints.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 500;

/// Largest body of the JSON routes (a submit, a cancel): far above what the submit's own caps
/// let through (a 2 KiB URL, 8 KiB of labels).
pub const JSON_BODY_BYTES: u64 = 64 * 1024;

/// What the API handlers share.
#[derive(Clone)]
pub struct ApiState {
    engine: Engine,
    hub: EventHub,
    jobs: reprocess::Jobs,
}

/// The coordinator's API routes (`/v1/...`): tasks, events, dead letters, blobs and the OpenAPI
/// document; JSON bodies up to [`JSON_BODY_BYTES`], uploads up to `max_upload_bytes`, as many
/// at once as `upload_slots` let in. The
/// service's HTTP edge puts them behind the token check; each route declares the scope it needs
/// (reads `read`, submitting `submit`, controls `operate`, purging `admin`).
pub fn router(
    engine: Engine,
    hub: EventHub,
    blobs: Arc<dyn BlobStore>,
    max_upload_bytes: u64,
    upload_slots: UploadSlots,
    jobs: reprocess::Jobs,
) -> Router {
    let state = ApiState { engine, hub, jobs };
    let batch = batch::router(state.clone());
    let routes = mount(json_routes()).with_state(state);
    BodyLimit::new(JSON_BODY_BYTES).apply(routes).merge(batch).merge(blobs::router(
        blobs,
        max_upload_bytes,
        upload_slots,
    ))
}

/// The routes whose bodies are JSON up to [`JSON_BODY_BYTES`] (all but the batch and blobs).
fn json_routes() -> Vec<Route<ApiState>> {
    [
        tasks::routes(),
        task_control::routes(),
        reprocessing::routes(),
        queue_control::routes(),
        events::routes(),
        dlq::routes(),
        dlq_replay::routes(),
        cluster::routes(),
        openapi::routes(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Every operation of the OpenAPI document: those of [`router`] and the forwarded ones, each
/// from the route table it is mounted from.
fn operations() -> Vec<Operation> {
    let own = json_routes().into_iter().map(|r| r.operation);
    let batch = batch::routes().into_iter().map(|r| r.operation);
    let blobs = blobs::routes().into_iter().map(|r| r.operation);
    let forwarded = forward::Upstream::ALL.into_iter().flat_map(forward::Upstream::operations);
    own.chain(batch).chain(blobs).chain(forwarded).collect()
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::InvalidCursor(c) => Self::invalid(format!("`cursor` {c:?} was not handed out by this API")),
            e => Self::unavailable(e),
        }
    }
}

fn task_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = path?;
    if is_valid_id(&id) {
        Ok(id)
    } else {
        Err(ApiError::invalid(format!("task id {id:?} must be 1 to 128 characters of [A-Za-z0-9_.-]")))
    }
}

fn limit(raw: Option<&str>) -> Result<usize, ApiError> {
    match raw {
        None => Ok(DEFAULT_LIMIT),
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(format!("`limit` must be a whole number from 1 to {MAX_LIMIT} (got {s:?})"))),
        },
    }
}

/// Decodes a JSON body as `T`: a body that is not one JSON object, or breaks `T`, is a `400`
/// naming the problem.
fn decode_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    decode(body).map_err(|e| ApiError::invalid(e.to_string()))
}

/// A new task id: `tsk_` and 32 hex digits.
pub fn new_task_id() -> String {
    format!("tsk_{}", uuid::Uuid::new_v4().simple())
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}
