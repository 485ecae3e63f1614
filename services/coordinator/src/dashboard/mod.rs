//! The dashboard: a person's window into the pipeline, served at `/` by the coordinator (and by
//! `imagepipe run`) on the API's port. Pages are rendered on the server ([`maud`]) from the very
//! answers the `/v1` API gives ([`client`]), so the page shows what a script would see; a little
//! plain JavaScript ([`assets`]) follows `/v1/events` and refreshes the parts of a page that
//! changed, at most four times a second, and sends the buttons' requests to the API.
//!
//! Who may look ([`access`]): with `http.auth_token` set, a person logs in with the token
//! ([`login`]) and gets a session cookie; without one, the pages answer loopback clients only.
//! Every state-changing request carries the session's CSRF token.
//!
//! Pages: [`overview`] (queues, throughput, latencies, failures, dead letters), [`tasks`]
//! (filterable, live), [`detail`] (one task), [`search`] (tags, similar images) and [`dlq`].

pub mod access;
pub mod assets;
pub mod client;
pub mod detail;
pub mod dlq;
mod format;
mod layout;
pub mod login;
pub mod overview;
pub mod search;
pub mod tasks;

use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::routing::{get, post};
use imagepipe_runtime::clock::Clock;
use imagepipe_runtime::config::TelemetryConfig;
use imagepipe_runtime::http::ApiRoutes;

use self::client::ApiClient;

/// What every dashboard handler shares.
#[derive(Clone)]
pub struct Dashboard {
    api: ApiClient,
    telemetry: Arc<TelemetryConfig>,
    clock: Arc<dyn Clock>,
}

impl Dashboard {
    /// A dashboard over the `/v1` routes of `api` (the same table the server answers from),
    /// linking traces as `telemetry.trace_ui_url` says.
    pub fn new(api: ApiRoutes, telemetry: &TelemetryConfig, clock: Arc<dyn Clock>) -> Self {
        Self { api: ApiClient::new(api), telemetry: Arc::new(telemetry.clone()), clock }
    }

    /// The dashboard's routes: the pages, their live fragments (`/partials/...`), login and the
    /// embedded assets. None is under `/v1`.
    pub fn router(self) -> Router {
        Router::new()
            .route("/", get(overview::page))
            .route("/partials/overview", get(overview::partial))
            .route("/tasks", get(tasks::page))
            .route("/partials/task-rows", get(tasks::rows))
            .route("/tasks/{id}", get(detail::page))
            .route("/partials/tasks/{id}", get(detail::partial))
            .route("/partials/tasks/{id}/similar", get(detail::similar))
            .route("/search", get(search::page))
            .route("/dlq", get(dlq::page))
            .route("/login", get(login::form).post(login::submit))
            .route("/logout", post(login::logout))
            .route("/assets/{name}", get(assets::serve))
            .layer(axum::middleware::map_response(security_headers))
            .with_state(self)
    }
}

/// Content-Security-Policy of every dashboard answer: scripts, styles, images and connections
/// from this server only (images also from `blob:`, the dropped file's preview), no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; \
     connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
