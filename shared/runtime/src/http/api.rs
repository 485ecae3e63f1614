//! The `/v1` edge every service shares: one error shape ([`ApiError`]) and one route table
//! ([`ApiRoutes`]) whose every request passes the bearer-token check of [`auth`](super::auth)
//! first. A service adds its routes once the parts they need are connected; until then its
//! `/v1` answers 404 like any unknown route, while health and readiness already answer.

use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::Request;
use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use imagepipe_secret::Secret;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tower::ServiceExt as _;

use super::auth;

/// An error answer of any `/v1` route of any service: `{"error": "<code>", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ApiError {
    /// HTTP status.
    #[serde(skip)]
    #[schemars(skip)]
    pub status: u16,
    /// Stable code: `invalid_request`, `not_found`, `conflict`, `unauthorized`, `unavailable`, ...
    pub error: String,
    /// What is wrong, naming the field or value.
    pub message: String,
}

impl ApiError {
    /// An error answered with `status` and code `error`.
    pub fn new(status: StatusCode, error: &str, message: impl Into<String>) -> Self {
        Self { status: status.as_u16(), error: error.to_owned(), message: message.into() }
    }

    /// `400 invalid_request`: the request names something wrong.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// `404 not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// `409 conflict`: the request contradicts the current state.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// `401 unauthorized`: no or a wrong bearer token.
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "send `Authorization: Bearer <token>` (http.auth_token)")
    }

    /// `503 unavailable`: a dependency (store, broker, blob store) failed; logged, and worth a
    /// retry.
    pub fn unavailable(e: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %e, "API request failed on a dependency");
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", format!("try again: {e}"))
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.error, self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self)).into_response()
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        Self::invalid(e.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        Self::invalid(e.body_text())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(e: JsonRejection) -> Self {
        Self::new(e.status(), "invalid_request", e.body_text())
    }
}

/// The `/v1` routes of one HTTP server (see the module docs). Clones share the table.
#[derive(Clone)]
pub struct ApiRoutes {
    router: Arc<RwLock<Router>>,
    token: Option<Arc<Secret<String>>>,
}

impl std::fmt::Debug for ApiRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRoutes").field("token", &self.token.as_ref().map(|_| auth::MASKED)).finish()
    }
}

impl ApiRoutes {
    /// No routes yet; every `/v1` request must carry `token` when it is set.
    pub fn new(token: Option<Secret<String>>) -> Self {
        Self { router: Arc::default(), token: token.map(Arc::new) }
    }

    /// Adds `routes` beside those added before. A path added twice panics (axum's overlap
    /// check): two parts of one server claiming one route is a programming error.
    pub fn add(&self, routes: Router) {
        let mut router = self.router.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *router = std::mem::take(&mut *router).merge(routes);
    }

    /// Handles one request: the token check for `/v1` paths, then the routes.
    pub(super) async fn dispatch(self, request: Request) -> Response {
        let path = request.uri().path();
        if (path == "/v1" || path.starts_with("/v1/")) && !auth::authorized(self.token.as_deref(), request.headers()) {
            return auth::unauthorized();
        }
        let router = self.router.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        match router.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}
