//! The coordinator's API as the one front door: the user-facing `/v1` routes other services
//! serve — search (the tag indexer), stats (the analytics worker), similarity (the similarity
//! indexer) — forwarded to the base URL that `coordinator.search_url`, `.stats_url` and
//! `.similarity_url` name, so one address (`:8080` in compose) answers every route of the
//! OpenAPI document. `imagepipe run` serves search and stats itself and forwards only what it
//! does not serve ([`Upstream`]s served here get no forwarding route).
//!
//! A forwarded request keeps its method, path, query, body (streamed) and the headers that
//! say what it is (`content-type`, `accept`, trace context). It goes with the caller's scope,
//! never more: each route needs the same scope here as at its service ([`Upstream::routes`]),
//! and the request carries the least token of the coordinator's (`http.auth_token`,
//! `http.tokens`, which the services share) whose scope covers the caller's, with the caller's
//! scope in [`SCOPE_HEADER`] (which only lowers a token's). The answer comes back as the target gave it
//! (status, body, the headers that describe it), redirects included, never followed. A target
//! that cannot be reached is `502 bad_gateway`, one that does not answer within
//! [`FORWARD_TIMEOUT`] `504 gateway_timeout`, each naming the key that points at it; an
//! unset key is `404 not_configured` naming it.

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, HttpBody as _};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use imagepipe_runtime::Settings;
use imagepipe_runtime::config::{CoordinatorConfig, ScopedToken, Secret};
use imagepipe_runtime::http::{ApiError, Caller, SCOPE_HEADER, Scope, require};

/// Longest a forwarded request may take, its answer's body included.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest wait for a connection to a target.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Request headers passed to the target (besides the coordinator's own `authorization`).
const REQUEST_HEADERS: [HeaderName; 6] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::ACCEPT,
    header::IF_NONE_MATCH,
    HeaderName::from_static("traceparent"),
    HeaderName::from_static("tracestate"),
];

/// Answer headers passed back to the client.
const RESPONSE_HEADERS: [HeaderName; 9] = [
    header::CONTENT_TYPE,
    header::CONTENT_ENCODING,
    header::CACHE_CONTROL,
    header::ETAG,
    header::LOCATION,
    header::RETRY_AFTER,
    header::WWW_AUTHENTICATE,
    header::ALLOW,
    header::VARY,
];

/// A service whose user-facing routes the coordinator forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// The tag indexer: `GET /v1/search`.
    Search,
    /// The analytics worker: `GET /v1/stats`.
    Stats,
    /// The similarity indexer: `GET /v1/tasks/{id}/similar`, `POST /v1/search/similar`,
    /// `GET /v1/duplicates`.
    Similarity,
}

impl Upstream {
    /// Every forwarded service.
    pub const ALL: [Upstream; 3] = [Self::Search, Self::Stats, Self::Similarity];

    /// The config key of its base URL.
    pub fn key(self) -> &'static str {
        match self {
            Self::Search => "coordinator.search_url",
            Self::Stats => "coordinator.stats_url",
            Self::Similarity => "coordinator.similarity_url",
        }
    }

    /// The environment variable of [`Upstream::key`].
    pub fn variable(self) -> String {
        format!("IMAGEPIPE_{}", self.key().to_ascii_uppercase().replace('.', "__"))
    }

    /// The service, as a message names it.
    pub fn service(self) -> &'static str {
        match self {
            Self::Search => "the tag indexer",
            Self::Stats => "the analytics worker",
            Self::Similarity => "the similarity indexer",
        }
    }

    /// Its routes: each path with its methods and the scope each needs (as the service
    /// declares it).
    pub fn routes(self) -> &'static [(&'static str, &'static [(MethodFilter, Scope)])] {
        match self {
            Self::Search => &[("/v1/search", &[(MethodFilter::GET, Scope::Read)])],
            Self::Stats => &[("/v1/stats", &[(MethodFilter::GET, Scope::Read)])],
            Self::Similarity => &[
                ("/v1/tasks/{id}/similar", &[(MethodFilter::GET, Scope::Read)]),
                ("/v1/search/similar", &[(MethodFilter::POST, Scope::Read)]),
                ("/v1/duplicates", &[(MethodFilter::GET, Scope::Read)]),
                ("/v1/similarity/rebuild", &[(MethodFilter::GET, Scope::Read), (MethodFilter::POST, Scope::Admin)]),
            ],
        }
    }

    /// Its base URL in `config`, without a trailing `/`.
    fn url(self, config: &CoordinatorConfig) -> Option<String> {
        let url = match self {
            Self::Search => &config.search_url,
            Self::Stats => &config.stats_url,
            Self::Similarity => &config.similarity_url,
        };
        url.as_deref().map(|url| url.trim_end_matches('/').to_owned())
    }
}

/// Where each [`Upstream`] is and the tokens to send it, from the settings.
#[derive(Debug, Clone)]
pub struct Forwarding {
    urls: Vec<(Upstream, Option<String>)>,
    tokens: Arc<[ScopedToken]>,
}

impl Forwarding {
    /// The targets of `settings.coordinator`, sent a token of `settings.http` for each caller.
    pub fn new(settings: &Settings) -> Self {
        let urls = Upstream::ALL.into_iter().map(|u| (u, u.url(&settings.coordinator))).collect();
        Self { urls, tokens: settings.http.scoped_tokens().into() }
    }

    /// The forwarding routes of every upstream but those in `served_here` (whose routes this
    /// process serves itself).
    ///
    /// # Panics
    ///
    /// When the HTTP client cannot be built (no TLS backend), as `reqwest::Client::new` does.
    pub fn router(&self, served_here: &[Upstream]) -> Router {
        let client = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(FORWARD_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("imagepipe-coordinator/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("an HTTP client without custom TLS settings builds");
        let mut router = Router::new();
        for (upstream, url) in self.urls.iter().filter(|(u, _)| !served_here.contains(u)) {
            let target = Arc::new(Target {
                upstream: *upstream,
                url: url.clone(),
                tokens: self.tokens.clone(),
                client: client.clone(),
            });
            for &(path, methods) in upstream.routes() {
                let route = methods
                    .iter()
                    .map(|&(method, scope)| require(scope, on(method, forward)))
                    .reduce(MethodRouter::merge)
                    .expect("every forwarded path has a method");
                router = router.merge(Router::new().route(path, route).with_state(target.clone()));
            }
        }
        router
    }
}

/// One upstream as its routes' handler sees it.
struct Target {
    upstream: Upstream,
    url: Option<String>,
    tokens: Arc<[ScopedToken]>,
    client: reqwest::Client,
}

impl Target {
    /// The token to send for a caller of `scope`: the least of those whose scope covers it.
    fn token_for(&self, scope: Scope) -> Option<&Secret<String>> {
        self.tokens.iter().filter(|t| t.scope.allows(scope)).min_by_key(|t| t.scope).map(|t| &t.token)
    }

    fn not_configured(&self, path: &str) -> ApiError {
        let upstream = self.upstream;
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_configured",
            format!(
                "this server does not serve {path}: set {} ({}) to the base URL of {}",
                upstream.key(),
                upstream.variable(),
                upstream.service()
            ),
        )
    }

    fn unreachable(&self, url: &str, error: reqwest::Error) -> ApiError {
        let timed_out = error.is_timeout();
        let error = error.without_url();
        let mut cause = error.to_string();
        let mut source = error.source();
        while let Some(e) = source {
            cause = format!("{cause}: {e}");
            source = e.source();
        }
        let upstream = self.upstream;
        tracing::warn!(target_url = url, key = upstream.key(), error = %cause, "forwarding failed");
        let (status, code, what) = if timed_out {
            (StatusCode::GATEWAY_TIMEOUT, "gateway_timeout", format!("did not answer within {FORWARD_TIMEOUT:?}"))
        } else {
            (StatusCode::BAD_GATEWAY, "bad_gateway", format!("could not be reached ({cause})"))
        };
        ApiError::new(status, code, format!("{} {what} ({} = {url})", upstream.service(), upstream.key()))
    }
}

async fn forward(State(target): State<Arc<Target>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Some(base) = &target.url else { return target.not_configured(parts.uri.path()).into_response() };
    let path = parts.uri.path_and_query().map_or_else(|| parts.uri.path(), |p| p.as_str());
    let mut outgoing = target.client.request(parts.method.clone(), format!("{base}{path}"));
    for name in &REQUEST_HEADERS {
        for value in parts.headers.get_all(name) {
            outgoing = outgoing.header(name, value);
        }
    }
    // The route's scope check put the caller there; without one, forward as the least.
    let scope = parts.extensions.get::<Caller>().map_or(Scope::Read, |caller| caller.scope);
    if let Some(token) = target.token_for(scope) {
        outgoing = outgoing.bearer_auth(token.expose());
    }
    outgoing = outgoing.header(SCOPE_HEADER, scope.as_str());
    if body.size_hint().exact() != Some(0) {
        outgoing = outgoing.body(reqwest::Body::wrap_stream(body.into_data_stream()));
    }
    let answer = match outgoing.send().await {
        Ok(answer) => answer,
        Err(error) => return target.unreachable(base, error).into_response(),
    };
    let mut headers = HeaderMap::new();
    for name in &RESPONSE_HEADERS {
        for value in answer.headers().get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let status = answer.status();
    let mut response = Response::new(Body::from_stream(answer.bytes_stream()));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}
