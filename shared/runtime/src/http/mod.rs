//! The HTTP server every service runs: `/healthz`, `/readyz`, `/metrics`, plus the service's
//! own `/v1` routes ([`ApiRoutes`]) behind one token check ([`auth`]) and the scope each route
//! declares ([`scope`]), answering errors in one shape ([`ApiError`]). Without any token, the
//! whole server answers loopback names only ([`peer`]). Uploads are bounded as they arrive
//! ([`upload`]).

mod api;
pub mod auth;
pub mod peer;
pub mod scope;
mod server;
pub mod session;
pub mod testing;
pub mod throttle;
pub mod upload;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;

use crate::shutdown::Shutdown;

pub use api::{ApiError, ApiRoutes, BodyLimit, WholeBody};
pub use auth::Access;
pub use scope::{Caller, SCOPE_HEADER, Scope, require};
pub use server::ConnectionLimits;
pub use upload::{ImageBody, UploadSlots};

/// Content type of the Prometheus text exposition format.
pub const PROMETHEUS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

type Check = Arc<dyn Fn() -> bool + Send + Sync>;

/// Named readiness checks; `/readyz` is 200 only while all of them pass. Clones share the
/// same checks, so a service can add checks after the server started.
#[derive(Clone, Default)]
pub struct Readiness {
    checks: Arc<RwLock<Vec<(String, Check)>>>,
}

impl Readiness {
    /// No checks (always ready).
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the check `name` (e.g. `bus`), ready while `check` returns true.
    pub fn add(&self, name: impl Into<String>, check: impl Fn() -> bool + Send + Sync + 'static) {
        self.checks.write().unwrap_or_else(std::sync::PoisonError::into_inner).push((name.into(), Arc::new(check)));
    }

    /// The names of the checks failing now, in the order they were added.
    pub fn failing(&self) -> Vec<String> {
        let checks = self.checks.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        checks.into_iter().filter(|(_, check)| !check()).map(|(name, _)| name).collect()
    }
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let checks = self.checks.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        f.debug_list().entries(checks.iter().map(|(name, _)| name)).finish()
    }
}

/// The HTTP server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Binding the listening socket failed.
    #[error(
        "binding the HTTP server to {addr} (http.bind and http.port, IMAGEPIPE_HTTP__BIND and IMAGEPIPE_HTTP__PORT)"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving HTTP on {addr}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Clone)]
struct HealthState {
    readiness: Readiness,
    metrics: PrometheusHandle,
}

/// Health, readiness and metrics endpoints, merged with the service's own routes.
pub struct HealthServer {
    router: Router,
    /// Whether the server has no token, so every path answers loopback names only.
    loopback_names_only: bool,
}

impl HealthServer {
    /// `/healthz`, `/readyz` (from `readiness`) and `/metrics` (from `metrics`).
    pub fn new(readiness: Readiness, metrics: PrometheusHandle) -> Self {
        let router = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(render_metrics))
            .with_state(HealthState { readiness, metrics });
        Self { router, loopback_names_only: false }
    }

    /// Adds the service's own routes (which must not reuse the health paths).
    pub fn merge(mut self, routes: Router) -> Self {
        self.router = self.router.merge(routes);
        self
    }

    /// Serves `api` for every path the health routes do not take: the `/v1` routes, added to
    /// `api` as the service's parts come up, each request checked for the token first. When
    /// `api` has no token, every path (health and metrics included) refuses a request from
    /// loopback that names another host ([`peer::rebound`]): a rebinding page learns nothing.
    pub fn api(mut self, api: ApiRoutes) -> Self {
        self.loopback_names_only = api.access().is_open();
        self.router = self.router.fallback(move |request: axum::extract::Request| api.clone().dispatch(request));
        self
    }

    /// The whole router, for serving elsewhere or testing in-process.
    pub fn into_router(self) -> Router {
        if self.loopback_names_only {
            self.router.layer(axum::middleware::from_fn(peer::refuse_rebound))
        } else {
            self.router
        }
    }

    /// Binds `addr` (port 0 picks a free port), with the default [`ConnectionLimits`].
    pub async fn bind(self, addr: SocketAddr) -> Result<BoundServer, HttpError> {
        self.bind_with(addr, ConnectionLimits::default()).await
    }

    /// Binds `addr` (port 0 picks a free port); connections are held to `limits`.
    pub async fn bind_with(self, addr: SocketAddr, limits: ConnectionLimits) -> Result<BoundServer, HttpError> {
        let listener = TcpListener::bind(addr).await.map_err(|source| HttpError::Bind { addr, source })?;
        let addr = listener.local_addr().map_err(|source| HttpError::Bind { addr, source })?;
        Ok(BoundServer { listener, router: self.into_router(), addr, limits })
    }
}

/// A [`HealthServer`] with its socket bound, ready to serve.
pub struct BoundServer {
    listener: TcpListener,
    router: Router,
    addr: SocketAddr,
    limits: ConnectionLimits,
}

impl BoundServer {
    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` fires, then finishes the requests in progress and returns.
    pub async fn serve(self, shutdown: Shutdown) -> Result<(), HttpError> {
        let addr = self.addr;
        tracing::info!(%addr, limits = ?self.limits, "HTTP server listening");
        server::serve(self.listener, self.router, self.limits, shutdown)
            .await
            .map_err(|source| HttpError::Serve { addr, source })
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HealthState>) -> impl IntoResponse {
    let failing = state.readiness.failing();
    if failing.is_empty() {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", failing.join(", ")))
    }
}

async fn render_metrics(State(state): State<HealthState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, PROMETHEUS_CONTENT_TYPE)], state.metrics.render())
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use imagepipe_secret::Secret;
    use tokio::net::TcpStream;

    use super::*;

    async fn http_get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let answer = testing::get(addr, path).await;
        (answer.status, answer.head, answer.body)
    }

    async fn start(server: HealthServer) -> (SocketAddr, Shutdown, tokio::task::JoinHandle<Result<(), HttpError>>) {
        let bound = server.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await.unwrap();
        let addr = bound.local_addr();
        let shutdown = Shutdown::new();
        let task = tokio::spawn(bound.serve(shutdown.clone()));
        (addr, shutdown, task)
    }

    #[tokio::test]
    async fn health_readiness_metrics_and_service_routes_are_served() {
        let readiness = Readiness::new();
        let bus_up = Arc::new(AtomicBool::new(false));
        let up = bus_up.clone();
        readiness.add("bus", move || up.load(Ordering::SeqCst));
        readiness.add("store", || true);
        let metrics = crate::metrics::install().unwrap();
        metrics::counter!(crate::metrics::FETCH_ERRORS, crate::metrics::labels::SOURCE => "tasks.http-test")
            .increment(1);
        let server = HealthServer::new(readiness.clone(), metrics)
            .merge(Router::new().route("/v1/hello", get(|| async { "hello\n" })));
        let (addr, shutdown, task) = start(server).await;

        assert_eq!(http_get(addr, "/healthz").await.0, 200);

        let (status, _, body) = http_get(addr, "/readyz").await;
        assert_eq!((status, body.as_str()), (503, "not ready: bus\n"));
        bus_up.store(true, Ordering::SeqCst);
        assert_eq!(http_get(addr, "/readyz").await.0, 200);
        readiness.add("late", || false);
        assert_eq!(http_get(addr, "/readyz").await.2, "not ready: late\n", "checks added after start count");

        let (status, head, body) = http_get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
        assert!(body.contains(r#"imagepipe_fetch_errors_total{source="tasks.http-test"} 1"#), "{body}");

        let (status, _, body) = http_get(addr, "/v1/hello").await;
        assert_eq!((status, body.as_str()), (200, "hello\n"));
        assert_eq!(http_get(addr, "/nope").await.0, 404);

        shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(10), task).await.expect("server stops").unwrap().unwrap();
        assert!(TcpStream::connect(addr).await.is_err(), "socket closed after shutdown");
    }

    #[tokio::test]
    async fn unknown_routes_wrong_methods_and_large_bodies_are_answered_in_the_error_shape() {
        let api = ApiRoutes::new(None);
        api.add(Router::new().route("/v1/thing", get(|| async { "thing\n" })));
        let upload = axum::routing::post(|WholeBody(body): WholeBody| async move { body.len().to_string() });
        api.add(BodyLimit::new(16).set_by("test.max_bytes").apply(Router::new().route("/v1/upload", upload)));
        let server = HealthServer::new(Readiness::new(), crate::metrics::install().unwrap()).api(api);
        let (addr, _shutdown, _task) = start(server).await;
        let json = |answer: &testing::Answer| -> serde_json::Value {
            assert!(answer.head.contains("content-type: application/json"), "{}", answer.head);
            serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {}", answer.body))
        };

        let unknown = testing::get(addr, "/v1/nope?secret=1").await;
        assert_eq!(unknown.status, 404);
        let body = json(&unknown);
        assert_eq!(body["error"], "not_found");
        assert_eq!(body["message"], "no route /v1/nope on this server", "the path, not the query");

        let wrong = testing::request(addr, "DELETE", "/v1/thing", None).await;
        assert_eq!(wrong.status, 405);
        assert!(wrong.head.contains("allow: get,head"), "{}", wrong.head);
        assert_eq!(json(&wrong)["error"], "method_not_allowed");
        let wrong = testing::request(addr, "GET", "/v1/upload", None).await;
        assert_eq!((wrong.status, json(&wrong)["error"].as_str()), (405, Some("method_not_allowed")));

        let fits = testing::request_with_body(addr, "POST", "/v1/upload", None, &[7; 16]).await;
        assert_eq!((fits.status, fits.body.as_str()), (200, "16"));
        let large = testing::request_with_body(addr, "POST", "/v1/upload", None, &[7; 64]).await;
        assert_eq!(large.status, 413);
        let body = json(&large);
        assert_eq!(body["error"], "too_large");
        assert_eq!(body["message"], "the body is larger than the 16 bytes this route takes (test.max_bytes)");
    }

    /// A server over `api` with `GET /v1/thing` (read) and `POST /v1/thing` (operate).
    async fn scoped_server(api: ApiRoutes) -> SocketAddr {
        let thing = require(Scope::Read, get(|| async { "thing\n" }))
            .merge(require(Scope::Operate, axum::routing::post(|| async { "done\n" })));
        api.add(Router::new().route("/v1/thing", thing));
        let server = HealthServer::new(Readiness::new(), crate::metrics::install().unwrap()).api(api);
        start(server).await.0
    }

    async fn with_host(addr: SocketAddr, method: &str, path: &str, host: &str, extra: &[(&str, &str)]) -> u16 {
        let mut headers = vec![("Host", host)];
        headers.extend_from_slice(extra);
        testing::request_with_headers(addr, method, path, &headers, &[]).await.status
    }

    #[tokio::test]
    async fn without_a_token_every_path_answers_loopback_names_only() {
        let addr = scoped_server(ApiRoutes::new(None)).await;
        let port = addr.port();
        let rebound = format!("rebound.example:{port}");
        for path in ["/v1/thing", "/v1/events", "/healthz", "/readyz", "/metrics", "/v1/nope"] {
            let answer = testing::request_with_headers(addr, "GET", path, &[("Host", &rebound)], &[]).await;
            assert_eq!(answer.status, 403, "{path}");
            assert!(
                answer.body.contains("forbidden_host") && answer.body.contains("http.auth_token"),
                "{}",
                answer.body
            );
        }
        let same_origin = [("Sec-Fetch-Site", "same-origin")];
        assert_eq!(with_host(addr, "POST", "/v1/thing", &rebound, &same_origin).await, 403, "a rebound change");
        for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), "localhost".to_owned()] {
            assert_eq!(with_host(addr, "GET", "/v1/thing", &host, &[]).await, 200, "{host}");
            assert_eq!(with_host(addr, "POST", "/v1/thing", &host, &same_origin).await, 200, "{host}");
            assert_eq!(with_host(addr, "GET", "/healthz", &host, &[]).await, 200, "{host}");
        }
    }

    #[tokio::test]
    async fn with_a_token_any_host_may_ask_and_the_token_decides() {
        let token = "any-host-token-0123456789abcdef0123";
        let addr = scoped_server(ApiRoutes::new(Some(Secret::new(token.to_owned())))).await;
        let bearer = format!("Bearer {token}");
        assert_eq!(with_host(addr, "GET", "/v1/thing", "images.example", &[]).await, 401);
        assert_eq!(with_host(addr, "GET", "/v1/thing", "images.example", &[("Authorization", &bearer)]).await, 200);
        assert_eq!(with_host(addr, "GET", "/healthz", "images.example", &[]).await, 200);
    }

    #[tokio::test]
    async fn each_token_may_do_what_its_scope_allows() {
        let (admin, reader) = ("scope-admin-token-0123456789abcdef", "scope-reader-token-0123456789abcdef");
        let http = crate::config::HttpConfig {
            auth_token: Some(admin.to_owned().into()),
            tokens: vec![crate::config::ScopedToken {
                name: "grafana".into(),
                token: reader.to_owned().into(),
                scope: Scope::Read,
            }],
            ..crate::config::HttpConfig::default()
        };
        let addr = scoped_server(ApiRoutes::with_access(Access::from_config(&http).unwrap())).await;
        assert_eq!(testing::request(addr, "GET", "/v1/thing", Some(reader)).await.status, 200);
        let refused = testing::request(addr, "POST", "/v1/thing", Some(reader)).await;
        assert_eq!(refused.status, 403);
        assert!(refused.body.contains("forbidden") && refused.body.contains("operate"), "{}", refused.body);
        assert_eq!(testing::request(addr, "POST", "/v1/thing", Some(admin)).await.status, 200);
        let lowered = [("Authorization", format!("Bearer {admin}")), (SCOPE_HEADER, "read".to_owned())];
        let lowered: Vec<(&str, &str)> = lowered.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let answer = testing::request_with_headers(addr, "POST", "/v1/thing", &lowered, &[]).await;
        assert_eq!(answer.status, 403, "a scope header lowers an admin token");
    }

    #[tokio::test]
    async fn wrong_tokens_from_one_address_are_answered_429_until_the_window_ends() {
        let token = "limit-token-0123456789abcdef0123456";
        let http = crate::config::HttpConfig {
            auth_token: Some(token.to_owned().into()),
            auth_failure_limit: 5,
            ..crate::config::HttpConfig::default()
        };
        let addr = scoped_server(ApiRoutes::with_access(Access::from_config(&http).unwrap())).await;
        let guesses: Vec<u16> = futures::future::join_all((0..8).map(|i| async move {
            testing::request(addr, "GET", "/v1/thing", Some(&format!("guess-{i}"))).await.status
        }))
        .await;
        assert_eq!(guesses.iter().filter(|s| **s == 401).count(), 5, "{guesses:?}");
        assert_eq!(guesses.iter().filter(|s| **s == 429).count(), 3, "{guesses:?}");
        let blocked = testing::request(addr, "GET", "/v1/thing", Some(token)).await;
        assert_eq!(blocked.status, 429, "the right token too, while the address is blocked");
        assert!(blocked.head.contains("retry-after: "), "{}", blocked.head);
        assert!(blocked.body.contains("too_many_failures"), "{}", blocked.body);
        assert_eq!(testing::get(addr, "/healthz").await.status, 200, "health is not behind the token");
    }

    #[tokio::test]
    async fn binding_a_taken_port_names_the_address() {
        let taken = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await.unwrap();
        let addr = taken.local_addr().unwrap();
        let server = HealthServer::new(Readiness::new(), crate::metrics::install().unwrap());
        let err = server.bind(addr).await.err().expect("port in use");
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }
}
