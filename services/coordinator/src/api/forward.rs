//! The coordinator's API as the one front door: the user-facing `/v1` routes other services
//! serve — search (the tag indexer), stats (the analytics worker), similarity (the similarity
//! indexer) — forwarded to the base URL that `coordinator.search_url`, `.stats_url` and
//! `.similarity_url` name, so one address (`:8080` in compose) answers every route of the
//! OpenAPI document. `imagepipe run` serves search and stats itself and forwards only what it
//! does not serve ([`Upstream`]s served here get no forwarding route).
//!
//! A forwarded request keeps its method, path, query, body (streamed) and the headers that
//! say what it is (`content-type`, `accept`, trace context). It goes with the caller's scope,
//! never more: each route needs the same scope here as at its service (`Upstream::operations`),
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
use imagepipe_analytics_worker::api::StatsResponse;
use imagepipe_runtime::Settings;
use imagepipe_runtime::config::{CoordinatorConfig, ScopedToken, Secret};
use imagepipe_runtime::http::Scope::{Admin, Read};
use imagepipe_runtime::http::{ApiError, Caller, SCOPE_HEADER, Scope};
use imagepipe_tag_indexer_worker::api::{MAX_LIMIT as SEARCH_MAX_LIMIT, SearchResponse};
use serde_json::json;

use super::blobs::NOT_AN_IMAGE;
use super::route::{Answer, Content, Operation, Route, Schema, id_param, mount, query};

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

    /// Its routes, each with the scope it needs (as the service declares it) and what the
    /// document says of it: the service's own answers, and those of the forwarding (a `404`
    /// when its key is unset, `502`, `504`).
    pub(crate) fn operations(self) -> Vec<Operation> {
        let operations = match self {
            Self::Search => vec![search()],
            Self::Stats => vec![
                Operation::get("/v1/stats", Read, "getStats", "Counters and stage latencies (the analytics worker's)")
                    .ok::<StatsResponse>(200, "Counters, and per span a histogram with percentiles"),
            ],
            Self::Similarity => similarity(),
        };
        let (service, key, variable) = (self.service(), self.key(), self.variable());
        let not_configured = format!("Not configured here: the message names {key}; or, from {service}, not found");
        operations
            .into_iter()
            .map(|operation| {
                operation
                    .describe(format!("Served by {service}; the coordinator forwards it to {key} ({variable})."))
                    .answer_unless_given(Answer::error(404, not_configured.clone()))
                    .error(502, &format!("{service} could not be reached"))
                    .error(504, &format!("{service} did not answer in time"))
            })
            .collect()
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
            let routes = upstream.operations().into_iter().map(|operation| Route::new(operation, forward)).collect();
            router = router.merge(mount(routes).with_state(target));
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

/// `GET /v1/search`, the tag indexer's.
fn search() -> Operation {
    let tags = json!({
        "name": "tags", "in": "query", "required": true,
        "description": "Comma-separated tags, e.g. `cat,animal` (at most 32)",
        "schema": { "type": "string", "minLength": 1 }
    });
    Operation::get("/v1/search", Read, "searchTags", "Tasks by tag, best first (the tag indexer's)")
        .param(tags)
        .param(query(
            "mode",
            "Whether a task needs all tags (default) or any",
            json!({ "type": "string", "enum": ["all", "any"] }),
        ))
        .param(query(
            "limit",
            "Most results (default 20)",
            json!({ "type": "integer", "minimum": 1, "maximum": SEARCH_MAX_LIMIT }),
        ))
        .ok::<SearchResponse>(200, "Matching tasks")
        .error(400, "A bad parameter")
}

/// The similarity indexer's routes (its answers are documented as JSON objects).
fn similarity() -> Vec<Operation> {
    let object = |status, description: &str| Answer::with(status, description, Content::any_object());
    let most_results =
        query("limit", "Most results (1-100, default 10)", json!({ "type": "integer", "minimum": 1, "maximum": 100 }));
    let blob_key = json!({ "type": "object", "required": ["blobKey"],
        "properties": { "blobKey": { "type": "string", "description": "A stored blob, sha256:<hex>" } } });
    let threshold = query(
        "threshold",
        "Cosine a pair needs, from similarity.pair_floor to 1 (default similarity.duplicate_threshold); a pair \
         within similarity.phash_max_distance counts too",
        json!({ "type": "number", "maximum": 1 }),
    );
    let rebuild_summary = "Rebuild the similarity index from the retained event stream (the similarity indexer's)";
    vec![
        Operation::get(
            "/v1/tasks/{id}/similar",
            Read,
            "getSimilarTasks",
            "Images similar to a task's (the similarity indexer's)",
        )
        .param(id_param("Task id"))
        .param(most_results.clone())
        .answer(object(
            200,
            "The task's embedding version and the most similar tasks, closest first (taskId, cosine, \
                 phashDistance, thumbnailKey)",
        ))
        .error(400, "A bad limit"),
        Operation::post(
            "/v1/search/similar",
            Read,
            "searchSimilar",
            "Images similar to the one given (the similarity indexer's): the model runs on it",
        )
        .param(most_results)
        .body(
            true,
            vec![
                Content::binary("application/octet-stream"),
                Content::new("application/json", Schema::Inline(blob_key)),
            ],
        )
        .answer(object(200, "The most similar tasks, closest first"))
        .error(400, "An empty body, a bad limit or blobKey, or an image the model cannot read")
        .error(404, "No blob of that blobKey")
        .answer(Answer::too_large("download.max_bytes (a few KiB for a JSON body)"))
        .error(415, NOT_AN_IMAGE)
        .answer(Answer::busy(
            "http.max_uploads searches at once, every model slot taken for similarity.model_wait, or the model not \
             loaded (model_unavailable, without Retry-After)",
        )),
        Operation::get(
            "/v1/duplicates",
            Read,
            "getDuplicates",
            "Groups of near-duplicate images (the similarity indexer's)",
        )
        .param(threshold)
        .param(query(
            "limit",
            "Most groups (1-1000, default 100), largest first",
            json!({ "type": "integer", "minimum": 1, "maximum": 1000 }),
        ))
        .answer(object(200, "Near-duplicate groups"))
        .error(400, "A threshold outside similarity.pair_floor..1, or a bad limit"),
        Operation::post("/v1/similarity/rebuild", Admin, "startSimilarityRebuild", rebuild_summary)
            .answer(object(202, "The rebuild started: its status"))
            .answer(object(409, "A rebuild is already running on that replica")),
        Operation::get(
            "/v1/similarity/rebuild",
            Read,
            "getSimilarityRebuild",
            "How the latest rebuild of the similarity index went (running, done, failed; events read; duration)",
        )
        .answer(object(200, "The latest rebuild's status")),
    ]
}
