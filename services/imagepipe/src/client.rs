//! The HTTP API client behind the operator commands (`imagepipe submit`, `status`, `list`,
//! `history`, `cancel`, `thumbnail`, `watch`, `search`, `stats`, `dlq`).

use bytes::Bytes;
use futures::{Stream, StreamExt};
use imagepipe_contracts::SubmitTask;
use imagepipe_coordinator::TaskState;
use imagepipe_coordinator::api::batch::BatchResponse;
use imagepipe_coordinator::api::dlq_replay::{ReplayFilter, ReplayReport};
use imagepipe_coordinator::api::{Accepted, CancelRequest, History, Replayed, TaskView};
use imagepipe_coordinator::store::{DeadLetterPage, TaskPage};
use imagepipe_runtime::http::ApiError;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;

use crate::sse::{SseEvent, SseParser};
use imagepipe_coordinator::api::blobs::Uploaded;

/// The default API address.
pub const DEFAULT_API: &str = "http://127.0.0.1:8080";

/// A request to the API failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `--api` is not an http(s) URL.
    #[error("--api {0:?} is not an http:// or https:// URL (such as {DEFAULT_API})")]
    BadUrl(String),
    /// The API could not be reached.
    #[error(
        "cannot reach the imagepipe API at {url} (is `imagepipe run` running? set --api URL or IMAGEPIPE_API): {source}"
    )]
    Unreachable {
        /// The URL.
        url: String,
        /// Transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The API answered with an error.
    #[error("{method} {path}: {status} {code}: {message}")]
    Api {
        /// Request method.
        method: Method,
        /// Request path.
        path: String,
        /// HTTP status.
        status: StatusCode,
        /// Stable error code (`not_found`, ...).
        code: String,
        /// What is wrong.
        message: String,
    },
    /// The answer was not what the API promises.
    #[error("{method} {path}: unexpected answer: {reason}")]
    Unexpected {
        /// Request method.
        method: Method,
        /// Request path.
        path: String,
        /// What was wrong with it.
        reason: String,
    },
}

impl ClientError {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// What [`ApiClient::tasks`] asks `GET /v1/tasks` for.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskQuery<'a> {
    /// Most tasks in the page (the API serves up to 500).
    pub limit: usize,
    /// Newest first (else oldest first).
    pub newest_first: bool,
    /// Only tasks in this state.
    pub state: Option<TaskState>,
    /// Only tasks with this label (`key`, `value`).
    pub label: Option<(&'a str, &'a str)>,
    /// Only tasks created at or after this Unix-ms time.
    pub created_after: Option<u64>,
    /// Where the previous page ended.
    pub cursor: Option<&'a str>,
}

/// A client of one imagepipe API.
#[derive(Debug, Clone)]
pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ApiClient {
    /// A client of the API at `base` (`http://host:port`), sending `token` as a bearer token.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, ClientError> {
        base_url(base)?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("imagepipe-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|source| ClientError::Unreachable { url: base.to_owned(), source })?;
        Ok(Self { base: base.trim_end_matches('/').to_owned(), token, http })
    }

    /// The API's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    async fn send(&self, method: Method, path: &str, request: RequestBuilder) -> Result<Response, ClientError> {
        let response =
            request.send().await.map_err(|source| ClientError::Unreachable { url: self.base.clone(), source })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let html = is_html(&response);
        let body = response.bytes().await.unwrap_or_default();
        let (code, message) = match serde_json::from_slice::<ApiError>(&body) {
            Ok(e) => (e.error, e.message),
            Err(_) if html => (
                status.canonical_reason().unwrap_or("error").to_lowercase().replace(' ', "_"),
                format!("{} answered with a web page, not the imagepipe API: {NOT_THE_API}", self.base),
            ),
            Err(_) if status == StatusCode::NOT_FOUND && body.is_empty() => {
                ("not_found".to_owned(), format!("this server has no {path} (an older or partial imagepipe?)"))
            }
            Err(_) => (
                status.canonical_reason().unwrap_or("error").to_lowercase().replace(' ', "_"),
                String::from_utf8_lossy(&body).trim().chars().take(200).collect(),
            ),
        };
        Err(ClientError::Api { method, path: path.to_owned(), status, code, message })
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        request: RequestBuilder,
    ) -> Result<T, ClientError> {
        let response = self.send(method.clone(), path, request).await?;
        let unexpected =
            |reason: String| ClientError::Unexpected { method: method.clone(), path: path.to_owned(), reason };
        if is_html(&response) {
            return Err(unexpected(format!("{} answered with a web page: {NOT_THE_API}", self.base)));
        }
        let body = response.bytes().await.map_err(|e| unexpected(e.to_string()))?;
        serde_json::from_slice(&body).map_err(|e| unexpected(format!("{e} (is {} the imagepipe API?)", self.base)))
    }

    /// `GET path?query` as JSON.
    pub async fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, String)]) -> Result<T, ClientError> {
        self.json(Method::GET, path, self.request(Method::GET, path).query(query)).await
    }

    /// `POST /v1/tasks`.
    pub async fn submit(&self, submit: &SubmitTask) -> Result<Accepted, ClientError> {
        let path = "/v1/tasks";
        self.json(Method::POST, path, self.request(Method::POST, path).json(submit)).await
    }

    /// `POST /v1/tasks:batch`: up to 1000 submit commands, one result per command, in order.
    pub async fn submit_batch(&self, tasks: &[SubmitTask]) -> Result<BatchResponse, ClientError> {
        let path = "/v1/tasks:batch";
        let body = serde_json::json!({ "tasks": tasks });
        self.json(Method::POST, path, self.request(Method::POST, path).json(&body)).await
    }

    /// `POST /v1/blobs`: uploads an image and returns its key.
    pub async fn upload(&self, bytes: Bytes) -> Result<Uploaded, ClientError> {
        let path = "/v1/blobs";
        let request = self.request(Method::POST, path).header("content-type", "application/octet-stream").body(bytes);
        self.json(Method::POST, path, request).await
    }

    /// `GET /v1/tasks/{id}/similar?limit=N`: the images most like a task's.
    pub async fn similar_to<T: DeserializeOwned>(&self, id: &str, limit: usize) -> Result<T, ClientError> {
        self.get(&format!("/v1/tasks/{}/similar", encode(id)), &[("limit", limit.to_string())]).await
    }

    /// `POST /v1/search/similar?limit=N` with an image's bytes: the images most like it (the
    /// similarity indexer runs the model on it).
    pub async fn search_similar<T: DeserializeOwned>(&self, bytes: Bytes, limit: usize) -> Result<T, ClientError> {
        let path = "/v1/search/similar";
        let request = self
            .request(Method::POST, path)
            .query(&[("limit", limit.to_string())])
            .header("content-type", "application/octet-stream")
            .body(bytes);
        self.json(Method::POST, path, request).await
    }

    /// `GET /v1/tasks/{id}`.
    pub async fn task(&self, id: &str) -> Result<TaskView, ClientError> {
        self.get(&format!("/v1/tasks/{}", encode(id)), &[]).await
    }

    /// `GET /v1/tasks`: one page of the tasks `query` asks for.
    pub async fn tasks(&self, query: &TaskQuery<'_>) -> Result<TaskPage, ClientError> {
        let mut params = vec![("limit", query.limit.to_string())];
        params.push(("order", if query.newest_first { "newest" } else { "oldest" }.to_owned()));
        if let Some(state) = query.state {
            params.push(("status", state.as_str().to_owned()));
        }
        if let Some((key, value)) = query.label {
            params.push(("label", format!("{key}={value}")));
        }
        if let Some(after) = query.created_after {
            params.push(("createdAfter", after.to_string()));
        }
        if let Some(cursor) = query.cursor {
            params.push(("cursor", cursor.to_owned()));
        }
        self.get("/v1/tasks", &params).await
    }

    /// `GET /v1/tasks/{id}/history`: every transition of a task, oldest first.
    pub async fn history(&self, id: &str) -> Result<History, ClientError> {
        self.get(&format!("/v1/tasks/{}/history", encode(id)), &[]).await
    }

    /// `POST /v1/tasks/{id}/cancel`: the task as it is after the request (cancelled, or still
    /// running with the cancellation pending until its attempt ends).
    pub async fn cancel(&self, id: &str, reason: Option<String>) -> Result<TaskView, ClientError> {
        let path = format!("/v1/tasks/{}/cancel", encode(id));
        let request = self.request(Method::POST, &path).json(&CancelRequest { reason });
        self.json(Method::POST, &path, request).await
    }

    /// `POST path` with the JSON `body` (or none), as JSON.
    pub async fn post<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, ClientError> {
        let request = self.request(Method::POST, path);
        let request = match body {
            Some(body) => request.json(body),
            None => request,
        };
        self.json(Method::POST, path, request).await
    }

    /// `PUT path` with the JSON `body`, as JSON.
    pub async fn put<B: serde::Serialize, T: DeserializeOwned>(&self, path: &str, body: &B) -> Result<T, ClientError> {
        self.json(Method::PUT, path, self.request(Method::PUT, path).json(body)).await
    }

    /// `POST /v1/tasks/{id}/pause` or `/resume`: the task after the request.
    pub async fn pause(&self, id: &str, pause: bool, reason: Option<String>) -> Result<TaskView, ClientError> {
        let action = if pause { "pause" } else { "resume" };
        self.post(&format!("/v1/tasks/{}/{action}", encode(id)), Some(&CancelRequest { reason })).await
    }

    /// `GET /v1/blobs/{key}`: the blob's bytes and the content type the API gave them.
    pub async fn blob(&self, key: &str) -> Result<(Option<String>, Bytes), ClientError> {
        let path = format!("/v1/blobs/{}", encode(key));
        let response = self.send(Method::GET, &path, self.request(Method::GET, &path)).await?;
        let content_type =
            response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bytes =
            response.bytes().await.map_err(|source| ClientError::Unreachable { url: self.base.clone(), source })?;
        Ok((content_type, bytes))
    }

    /// `GET /v1/dlq`: one page of dead letters.
    pub async fn dead_letters(&self, limit: usize, cursor: Option<&str>) -> Result<DeadLetterPage, ClientError> {
        let mut query = vec![("limit", limit.to_string())];
        if let Some(cursor) = cursor {
            query.push(("cursor", cursor.to_owned()));
        }
        self.get("/v1/dlq", &query).await
    }

    /// `POST /v1/dlq/{id}/replay`.
    pub async fn replay(&self, id: &str) -> Result<Replayed, ClientError> {
        let path = format!("/v1/dlq/{}/replay", encode(id));
        self.json(Method::POST, &path, self.request(Method::POST, &path)).await
    }

    /// `POST /v1/dlq/replay`: replays (or, with `dry_run`, counts) the dead letters `filter`
    /// matches.
    pub async fn replay_matching(&self, filter: &ReplayFilter) -> Result<ReplayReport, ClientError> {
        let path = "/v1/dlq/replay";
        self.json(Method::POST, path, self.request(Method::POST, path).json(filter)).await
    }

    /// `DELETE /v1/dlq/{id}`.
    pub async fn purge(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/v1/dlq/{}", encode(id));
        self.send(Method::DELETE, &path, self.request(Method::DELETE, &path)).await.map(drop)
    }

    /// `GET /v1/events`: the event stream, optionally of one task and of the event types
    /// `selector` matches, resuming after event `last_event_id` when given (`Last-Event-ID`).
    pub async fn events(
        &self,
        task_id: Option<&str>,
        selector: Option<&str>,
        last_event_id: Option<&str>,
    ) -> Result<impl Stream<Item = Result<SseEvent, ClientError>> + use<>, ClientError> {
        let path = "/v1/events";
        let mut query = Vec::new();
        if let Some(id) = task_id {
            query.push(("taskId", id.to_owned()));
        }
        if let Some(selector) = selector {
            query.push(("type", selector.to_owned()));
        }
        let mut request = self.request(Method::GET, path).query(&query).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = self.send(Method::GET, path, request).await?;
        let base = self.base.clone();
        let mut parser = SseParser::new();
        Ok(response.bytes_stream().flat_map(move |chunk| {
            let items: Vec<Result<SseEvent, ClientError>> = match chunk {
                Ok(chunk) => parser.push(&chunk).into_iter().map(Ok).collect(),
                Err(source) => vec![Err(ClientError::Unreachable { url: base.clone(), source })],
            };
            futures::stream::iter(items)
        }))
    }
}

/// What an answer that is not the API's says to check.
const NOT_THE_API: &str = "is --api (or IMAGEPIPE_API) the address of `imagepipe run` or the coordinator?";

/// `base` as the API's URL: an `http://` or `https://` URL with a host.
pub fn base_url(base: &str) -> Result<url::Url, ClientError> {
    match url::Url::parse(base) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => Ok(url),
        _ => Err(ClientError::BadUrl(base.to_owned())),
    }
}

/// Whether `response` is a web page (another web server than the API's, or its dashboard).
fn is_html(response: &Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().to_ascii_lowercase().starts_with("text/html"))
}

/// `s` as one URL path segment.
pub fn encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>().replace('+', "%20")
}
