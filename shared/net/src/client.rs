//! The guarded HTTP client: every hop's host is resolved by the guard and every address checked
//! before the connector sees it; redirects are followed by hand (each one re-checked); time and
//! size are limited, the body while it streams.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use ipnet::IpNet;
use reqwest::header::{self, HeaderMap};
use reqwest::{Method, StatusCode, Url};

use crate::error::{BuildError, FetchError, TimeoutKind};
use crate::guard::{DialCheck, Guard, GuardError, GuardedDns};
use crate::resolve::{Resolver, SystemResolver};

/// Largest buffer reserved up front for a body, whatever its declared length.
const INITIAL_BODY_CAPACITY: u64 = 1 << 20;

/// Headers not carried to another origin when a redirect leaves the first one.
const CREDENTIAL_HEADERS: [header::HeaderName; 3] =
    [header::AUTHORIZATION, header::COOKIE, header::PROXY_AUTHORIZATION];

/// Time, size and redirect limits of one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest body accepted, in bytes.
    pub max_bytes: u64,
    /// Longest time to resolve and connect one hop.
    pub connect_timeout: Duration,
    /// Longest time for the whole exchange: every redirect and the body.
    pub total_timeout: Duration,
    /// Most redirects followed.
    pub max_redirects: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_bytes: 25 * 1024 * 1024,
            connect_timeout: Duration::from_secs(10),
            total_timeout: Duration::from_secs(60),
            max_redirects: 5,
        }
    }
}

/// An outgoing request.
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    url: String,
    headers: HeaderMap,
    body: Option<Bytes>,
}

impl Request {
    /// `GET url`.
    pub fn get(url: impl Into<String>) -> Self {
        Self { method: Method::GET, url: url.into(), headers: HeaderMap::new(), body: None }
    }

    /// `POST url` with `body`.
    pub fn post(url: impl Into<String>, body: impl Into<Bytes>) -> Self {
        Self { method: Method::POST, url: url.into(), headers: HeaderMap::new(), body: Some(body.into()) }
    }

    /// Adds a header.
    pub fn header(mut self, name: header::HeaderName, value: header::HeaderValue) -> Self {
        self.headers.append(name, value);
        self
    }
}

/// The final response of an exchange, after redirects.
#[derive(Debug, Clone)]
pub struct Response {
    /// Its status.
    pub status: StatusCode,
    /// The URL that answered, after redirects.
    pub final_url: Url,
    /// Its headers.
    pub headers: HeaderMap,
    /// The body of a 2xx response, read in full within the limits; empty for other statuses.
    pub body: Bytes,
    /// How many redirects were followed.
    pub redirects: u32,
}

impl Response {
    /// The delay the `Retry-After` header asks for, from `now`.
    pub fn retry_after(&self, now: SystemTime) -> Option<Duration> {
        crate::retry_after::retry_after(&self.headers, now)
    }
}

/// Builds a [`GuardedClient`].
pub struct ClientBuilder {
    allow: Vec<IpNet>,
    resolver: Arc<dyn Resolver>,
    dial_check: Option<Arc<dyn DialCheck>>,
    limits: Limits,
    user_agent: String,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("allow", &self.allow)
            .field("limits", &self.limits)
            .field("user_agent", &self.user_agent)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// Networks reachable despite the policy (`net.allow_cidrs`).
    pub fn allow(mut self, networks: impl IntoIterator<Item = IpNet>) -> Self {
        self.allow.extend(networks);
        self
    }

    /// Resolves host names with `resolver` instead of the system's.
    pub fn resolver(mut self, resolver: impl Resolver) -> Self {
        self.resolver = Arc::new(resolver);
        self
    }

    /// Runs `check` on every approved address just before it is dialled.
    pub fn dial_check(mut self, check: impl DialCheck) -> Self {
        self.dial_check = Some(Arc::new(check));
        self
    }

    /// Time, size and redirect limits.
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// The `User-Agent` header.
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = user_agent.into();
        self
    }

    /// The client.
    pub fn build(self) -> Result<GuardedClient, BuildError> {
        let guard = Arc::new(Guard::new(self.allow, self.resolver, self.dial_check));
        let http = reqwest::Client::builder()
            .use_rustls_tls()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            .connect_timeout(self.limits.connect_timeout)
            .dns_resolver(Arc::new(GuardedDns(guard.clone())))
            .user_agent(self.user_agent)
            .build()
            .map_err(BuildError)?;
        Ok(GuardedClient { http, guard, limits: self.limits })
    }
}

/// An HTTP(S) client that reaches only addresses the policy allows (see the crate docs).
/// Cheap to clone; clones share connections.
#[derive(Debug, Clone)]
pub struct GuardedClient {
    http: reqwest::Client,
    guard: Arc<Guard>,
    limits: Limits,
}

impl GuardedClient {
    /// A builder with the system resolver, no allowlist and default limits.
    pub fn builder() -> ClientBuilder {
        ClientBuilder {
            allow: Vec::new(),
            resolver: Arc::new(SystemResolver),
            dial_check: None,
            limits: Limits::default(),
            user_agent: concat!("imagepipe/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }

    /// The client's limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// `GET url`, following redirects.
    pub async fn get(&self, url: &str) -> Result<Response, FetchError> {
        self.send(Request::get(url)).await
    }

    /// Sends `request`, following redirects, within the total timeout.
    pub async fn send(&self, request: Request) -> Result<Response, FetchError> {
        let mut at = request.url.clone();
        let total = self.limits.total_timeout;
        let outcome = tokio::time::timeout(total, self.exchange(request, &mut at)).await;
        outcome.unwrap_or(Err(FetchError::Timeout { url: at, kind: TimeoutKind::Total, after: total }))
    }

    /// The exchange; `at` follows the URL being fetched, for the timeout's error.
    async fn exchange(&self, request: Request, at: &mut String) -> Result<Response, FetchError> {
        let Request { mut method, url, mut headers, mut body } = request;
        let mut url =
            Url::parse(&url).map_err(|e| FetchError::InvalidUrl { url: url.clone(), reason: e.to_string() })?;
        let mut redirects = 0;
        loop {
            *at = shown(&url);
            self.check_target(&url)?;
            let mut outgoing = self.http.request(method.clone(), url.clone()).headers(headers.clone());
            if let Some(body) = &body {
                outgoing = outgoing.body(body.clone());
            }
            let response = outgoing.send().await.map_err(|e| self.classify(&url, e))?;
            let status = response.status();

            let location = response.headers().get(header::LOCATION).filter(|_| is_followed_redirect(status));
            if let Some(location) = location {
                if redirects == self.limits.max_redirects {
                    return Err(FetchError::TooManyRedirects { url: shown(&url), limit: self.limits.max_redirects });
                }
                let next =
                    location.to_str().ok().and_then(|l| url.join(l).ok()).ok_or_else(|| FetchError::BadRedirect {
                        url: shown(&url),
                        location: String::from_utf8_lossy(location.as_bytes()).into(),
                    })?;
                redirects += 1;
                if status == StatusCode::SEE_OTHER || (method == Method::POST && status.as_u16() < 303) {
                    method = Method::GET;
                    body = None;
                    headers.remove(header::CONTENT_TYPE);
                    headers.remove(header::CONTENT_LENGTH);
                }
                if next.origin() != url.origin() {
                    for name in &CREDENTIAL_HEADERS {
                        headers.remove(name);
                    }
                }
                url = next;
                continue;
            }

            let response_headers = response.headers().clone();
            let body = if status.is_success() { self.read_body(&url, response).await? } else { Bytes::new() };
            return Ok(Response { status, final_url: url, headers: response_headers, body, redirects });
        }
    }

    /// Refuses a URL the client must not fetch before anything is sent: a scheme other than http
    /// and https, or an IP literal the policy refuses (names are checked when resolved).
    fn check_target(&self, url: &Url) -> Result<(), FetchError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(FetchError::Scheme { url: shown(url), scheme: url.scheme().to_owned() });
        }
        let ip = match url.host() {
            None => return Err(FetchError::InvalidUrl { url: shown(url), reason: "no host".into() }),
            Some(url::Host::Domain(_)) => return Ok(()),
            Some(url::Host::Ipv4(ip)) => ip.into(),
            Some(url::Host::Ipv6(ip)) => ip.into(),
        };
        let host = url.host_str().unwrap_or_default();
        self.guard.approve(host, ip).map_err(|e| guard_error(url, &e))
    }

    async fn read_body(&self, url: &Url, mut response: reqwest::Response) -> Result<Bytes, FetchError> {
        let limit = self.limits.max_bytes;
        let too_large = || FetchError::TooLarge { url: shown(url), limit };
        let declared = response.content_length();
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let capacity = declared.unwrap_or(0).min(limit).min(INITIAL_BODY_CAPACITY);
        let mut body = BytesMut::with_capacity(usize::try_from(capacity).unwrap_or(0));
        while let Some(chunk) = response.chunk().await.map_err(|e| self.classify(url, e))? {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }

    fn classify(&self, url: &Url, error: reqwest::Error) -> FetchError {
        if let Some(guard) = find_in_chain::<GuardError>(&error) {
            return guard_error(url, guard);
        }
        if error.is_timeout() {
            let after = self.limits.connect_timeout;
            return FetchError::Timeout { url: shown(url), kind: TimeoutKind::Connect, after };
        }
        if error.is_connect() {
            FetchError::Connect { url: shown(url), source: error }
        } else {
            FetchError::Transport { url: shown(url), source: error }
        }
    }
}

/// Statuses whose `Location` is followed.
fn is_followed_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
}

fn guard_error(url: &Url, error: &GuardError) -> FetchError {
    let url = shown(url);
    match error {
        GuardError::Refused { host, addr, reason } => {
            FetchError::Refused { url, host: host.clone(), addr: *addr, reason: *reason }
        }
        GuardError::Resolve { host, source } => {
            FetchError::Resolve { url, host: host.clone(), source: io::Error::new(source.kind(), source.to_string()) }
        }
        GuardError::DialRefused { addr } => FetchError::DialRefused { url, addr: *addr },
    }
}

fn find_in_chain<'a, E: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a E> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(found) = error.downcast_ref::<E>() {
            return Some(found);
        }
        current = error.source();
    }
    None
}

/// The URL without its password, for errors, logs and reports.
pub fn shown(url: &Url) -> String {
    if url.password().is_none() {
        return url.to_string();
    }
    let mut url = url.clone();
    let _ = url.set_password(None);
    url.to_string()
}
