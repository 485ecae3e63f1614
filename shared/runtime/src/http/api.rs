//! The `/v1` edge every service shares: one error shape ([`ApiError`]) and one route table
//! ([`ApiRoutes`]) whose every request passes the token check of [`auth`](super::auth) first,
//! which puts the request's [`Caller`] in its extensions for the scope each route
//! [`require`](super::scope::require)s. A service adds its routes once the parts they need are connected; until then its
//! `/v1` answers 404 like any unknown route, while health and readiness already answer.
//! Whatever the routes do not answer is still answered in that shape: an unknown route is
//! `404 not_found`, a method a route does not take `405 method_not_allowed` (with `Allow`), and
//! a body over its route's [`BodyLimit`] `413 too_large` naming the limit.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use imagepipe_secret::Secret;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tower::ServiceExt as _;

use super::auth::Access;
use super::peer::Peer;
use super::scope::{Caller, Scope};
use crate::clock::Clock as _;

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
    /// Whole seconds to wait before trying again, sent as `Retry-After`.
    #[serde(skip)]
    #[schemars(skip)]
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// An error answered with `status` and code `error`.
    pub fn new(status: StatusCode, error: &str, message: impl Into<String>) -> Self {
        Self { status: status.as_u16(), error: error.to_owned(), message: message.into(), retry_after: None }
    }

    /// The same error, telling the client to wait `wait` (rounded up to whole seconds) before
    /// trying again.
    pub fn with_retry_after(self, wait: Duration) -> Self {
        Self { retry_after: Some(wait.as_secs() + u64::from(wait.subsec_nanos() > 0)), ..self }
    }

    /// `503 busy` with `Retry-After: wait`: the server is at a limit it sets itself (uploads at
    /// once, model slots); worth a retry after the wait.
    pub fn busy(message: impl Into<String>, wait: Duration) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message).with_retry_after(wait)
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
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send `Authorization: Bearer <token>` (http.auth_token or one of http.tokens)",
        )
    }

    /// `413 too_large`: the request body is over the route's limit of `bytes`, set by the
    /// config key `key` when one does.
    pub fn too_large(bytes: Option<usize>, key: Option<&str>) -> Self {
        let limit = bytes.map_or_else(|| "the bytes".to_owned(), |bytes| format!("the {bytes} bytes"));
        let key = key.map(|key| format!(" ({key})")).unwrap_or_default();
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body is larger than {limit} this route takes{key}"),
        )
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
        let retry_after = self.retry_after;
        let mut response = (status, axum::Json(self)).into_response();
        if let Some(seconds) = retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
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
        match e {
            JsonRejection::BytesRejection(e) => e.into(),
            e => Self::new(e.status(), "invalid_request", e.body_text()),
        }
    }
}

impl From<BytesRejection> for ApiError {
    /// A body over the limit is `413 too_large` (without the limit: [`WholeBody`] names it);
    /// a body that broke off is `400`.
    fn from(e: BytesRejection) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::too_large(None, None)
        } else {
            Self::new(e.status(), "invalid_request", e.body_text())
        }
    }
}

/// The size limit of the request bodies of some routes, and the config key that sets it when
/// one does. [`BodyLimit::apply`] puts it on the routes (axum's [`DefaultBodyLimit`]); a
/// handler reading its body as [`WholeBody`] answers a larger one `413 too_large` naming both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimit {
    bytes: usize,
    key: Option<&'static str>,
}

impl BodyLimit {
    /// At most `bytes` (saturating on 32-bit targets).
    pub fn new(bytes: u64) -> Self {
        Self { bytes: usize::try_from(bytes).unwrap_or(usize::MAX), key: None }
    }

    /// The same limit, named as set by the config key `key` (`download.max_bytes`).
    pub fn set_by(self, key: &'static str) -> Self {
        Self { key: Some(key), ..self }
    }

    /// The largest body, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// `routes` with this limit on every request body.
    pub fn apply(self, routes: Router) -> Router {
        routes.layer(DefaultBodyLimit::max(self.bytes)).layer(Extension(self))
    }

    /// The `413` of a body over this limit.
    pub fn exceeded(&self) -> ApiError {
        ApiError::too_large(Some(self.bytes), self.key)
    }
}

/// A request's whole body, read within its route's [`BodyLimit`]: a larger body is answered
/// `413 too_large` naming the limit and its key (axum's plain-text rejection otherwise).
#[derive(Debug, Clone)]
pub struct WholeBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for WholeBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let limit = request.extensions().get::<BodyLimit>().copied();
        match Bytes::from_request(request, state).await {
            Ok(bytes) => Ok(Self(bytes)),
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(limit.map_or_else(|| ApiError::from(e), |limit| limit.exceeded()))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The answer to a path no route takes.
async fn unknown_route(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route {} on this server", uri.path()))
}

/// The answer to a method a route does not take (axum adds `Allow`).
async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method} (the Allow header lists what it takes)", uri.path()),
    )
}

/// The `/v1` routes of one HTTP server (see the module docs). Clones share the table.
#[derive(Clone)]
pub struct ApiRoutes {
    router: Arc<RwLock<Router>>,
    access: Access,
}

impl std::fmt::Debug for ApiRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiRoutes").field("access", &self.access).finish()
    }
}

impl ApiRoutes {
    /// No routes yet (every path answers `404 not_found`); every `/v1` request must carry
    /// `token` (scope `admin`) when it is set.
    pub fn new(token: Option<Secret<String>>) -> Self {
        Self::with_access(Access::token(token))
    }

    /// No routes yet; every `/v1` request passes `access`'s check.
    pub fn with_access(access: Access) -> Self {
        let router = Router::new().fallback(unknown_route);
        Self { router: Arc::new(RwLock::new(router)), access }
    }

    /// Adds `routes` beside those added before; a method they do not take is answered `405`
    /// in the one error shape. A path added twice panics (axum's overlap check), and so do
    /// `routes` with a fallback of their own: two parts of one server claiming one route is a
    /// programming error.
    pub fn add(&self, routes: Router) {
        let mut router = self.router.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        *router = std::mem::take(&mut *router).merge(routes).method_not_allowed_fallback(method_not_allowed);
    }

    /// Handles one request: for `/v1` paths the token check ([`Access::check`]), whose
    /// [`Caller`] goes into the request's extensions; then the routes.
    pub(super) async fn dispatch(self, mut request: Request) -> Response {
        let path = request.uri().path();
        if path == "/v1" || path.starts_with("/v1/") {
            let now_ms = crate::clock::SystemClock.unix_ms();
            let peer = Peer::of(request.extensions());
            match self.access.check(request.method(), request.headers(), peer, now_ms) {
                Ok(caller) => {
                    request.extensions_mut().insert(caller);
                }
                Err(refused) => return refused,
            }
        }
        self.call(request).await
    }

    /// Handles `request` with the routes, without any token check: for callers inside the
    /// process (the dashboard renders from the same answers the API gives). A request without
    /// a [`Caller`] is answered as an `admin`'s; the caller may put a lesser one in.
    pub async fn call(&self, mut request: Request) -> Response {
        if request.extensions().get::<Caller>().is_none() {
            request.extensions_mut().insert(Caller::new(None, Scope::Admin));
        }
        let router = self.router.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        match router.oneshot(request).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }

    /// The tokens and what the server remembers of their use.
    pub fn access(&self) -> &Access {
        &self.access
    }
}
