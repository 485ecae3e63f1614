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
    /// Longest wait for the next byte: for the response head once a hop's request is under way
    /// (its connection included), then for each piece of the body. A server that accepts the
    /// connection and never answers fails after this long instead of holding the exchange until
    /// the total timeout.
    pub read_timeout: Duration,
    /// Longest time for the whole exchange: every redirect and the body. This is what ends a
    /// server that drips its body just fast enough never to trip `read_timeout`.
    pub total_timeout: Duration,
    /// Most redirects followed.
    pub max_redirects: u32,
}

impl Default for Limits {
    /// 25 MiB, 5 redirects, 10 s to connect, 10 s of silence, 20 s in all. The total is short
    /// because a server dripping a byte a second is only stopped by it, and the download step is
    /// retried: with the coordinator's default 5 attempts and retry backoff (at most 1 + 2 + 4 +
    /// 8 s), such a server ends its task in at most 5 × 20 + 15 = 115 s, within two minutes
    /// (25 MiB in 20 s still takes only ~10 Mbit/s).
    fn default() -> Self {
        Self {
            max_bytes: 25 * 1024 * 1024,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(10),
            total_timeout: Duration::from_secs(20),
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
    allowlist_setting: Option<String>,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("allow", &self.allow)
            .field("limits", &self.limits)
            .field("user_agent", &self.user_agent)
            .field("allowlist_setting", &self.allowlist_setting)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// Networks reachable despite the policy (`download.allow_cidrs`, `net.allow_cidrs`, ...).
    pub fn allow(mut self, networks: impl IntoIterator<Item = IpNet>) -> Self {
        self.allow.extend(networks);
        self
    }

    /// The setting that extends this client's allowlist, named in every refusal so that whoever
    /// reads it knows the way out (`download.allow_cidrs (IMAGEPIPE_DOWNLOAD__ALLOW_CIDRS)`).
    pub fn allowlist_setting(mut self, setting: impl Into<String>) -> Self {
        self.allowlist_setting = Some(setting.into());
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
        let allowlist_setting = self.allowlist_setting.map(Arc::from);
        Ok(GuardedClient { http, guard, limits: self.limits, allowlist_setting })
    }
}

/// An HTTP(S) client that reaches only addresses the policy allows (see the crate docs).
/// Cheap to clone; clones share connections.
#[derive(Debug, Clone)]
pub struct GuardedClient {
    http: reqwest::Client,
    guard: Arc<Guard>,
    limits: Limits,
    allowlist_setting: Option<Arc<str>>,
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
            allowlist_setting: None,
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
        let mut at = redacted_raw(&request.url);
        let total = self.limits.total_timeout;
        let outcome = tokio::time::timeout(total, self.exchange(request, &mut at)).await;
        outcome.unwrap_or(Err(FetchError::Timeout { url: at, kind: TimeoutKind::Total, after: total }))
    }

    /// The exchange; `at` follows the URL being fetched, for the timeout's error.
    async fn exchange(&self, request: Request, at: &mut String) -> Result<Response, FetchError> {
        let Request { mut method, url, mut headers, mut body } = request;
        let mut url =
            Url::parse(&url).map_err(|e| FetchError::InvalidUrl { url: redacted_raw(&url), reason: e.to_string() })?;
        let mut redirects = 0;
        loop {
            *at = redacted(&url);
            self.check_target(&url)?;
            let mut outgoing = self.http.request(method.clone(), url.clone()).headers(headers.clone());
            if let Some(body) = &body {
                outgoing = outgoing.body(body.clone());
            }
            let response = tokio::time::timeout(self.limits.read_timeout, outgoing.send())
                .await
                .map_err(|_| self.read_timed_out(&url))?
                .map_err(|e| self.classify(&url, e))?;
            let status = response.status();

            let location = response.headers().get(header::LOCATION).filter(|_| is_followed_redirect(status));
            if let Some(location) = location {
                if redirects == self.limits.max_redirects {
                    return Err(FetchError::TooManyRedirects { url: redacted(&url), limit: self.limits.max_redirects });
                }
                let next =
                    location.to_str().ok().and_then(|l| url.join(l).ok()).ok_or_else(|| FetchError::BadRedirect {
                        url: redacted(&url),
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
            return Err(FetchError::Scheme { url: redacted(url), scheme: url.scheme().to_owned() });
        }
        let ip = match url.host() {
            None => return Err(FetchError::InvalidUrl { url: redacted(url), reason: "no host".into() }),
            Some(url::Host::Domain(_)) => return Ok(()),
            Some(url::Host::Ipv4(ip)) => ip.into(),
            Some(url::Host::Ipv6(ip)) => ip.into(),
        };
        let host = url.host_str().unwrap_or_default();
        self.guard.approve(host, ip).map_err(|e| self.guard_error(url, &e))
    }

    async fn read_body(&self, url: &Url, mut response: reqwest::Response) -> Result<Bytes, FetchError> {
        let limit = self.limits.max_bytes;
        let too_large = || FetchError::TooLarge { url: redacted(url), limit };
        let declared = response.content_length();
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let capacity = declared.unwrap_or(0).min(limit).min(INITIAL_BODY_CAPACITY);
        let mut body = BytesMut::with_capacity(usize::try_from(capacity).unwrap_or(0));
        let read_timeout = self.limits.read_timeout;
        while let Some(chunk) = tokio::time::timeout(read_timeout, response.chunk())
            .await
            .map_err(|_| self.read_timed_out(url))?
            .map_err(|e| self.classify(url, e))?
        {
            if (body.len() + chunk.len()) as u64 > limit {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body.freeze())
    }

    fn read_timed_out(&self, url: &Url) -> FetchError {
        FetchError::Timeout { url: redacted(url), kind: TimeoutKind::Read, after: self.limits.read_timeout }
    }

    fn classify(&self, url: &Url, error: reqwest::Error) -> FetchError {
        if let Some(guard) = find_in_chain::<GuardError>(&error) {
            return self.guard_error(url, guard);
        }
        if error.is_timeout() {
            let after = self.limits.connect_timeout;
            return FetchError::Timeout { url: redacted(url), kind: TimeoutKind::Connect, after };
        }
        // reqwest's message names the whole URL, query included; the error names it redacted.
        let error = error.without_url();
        if error.is_connect() {
            FetchError::Connect { url: redacted(url), source: error }
        } else {
            FetchError::Transport { url: redacted(url), source: error }
        }
    }

    fn guard_error(&self, url: &Url, error: &GuardError) -> FetchError {
        let url = redacted(url);
        match error {
            GuardError::Refused { host, addr, reason } => FetchError::Refused {
                url,
                host: host.clone(),
                addr: *addr,
                reason: *reason,
                allowlist_setting: self.allowlist_setting.as_deref().map(str::to_owned),
            },
            GuardError::Resolve { host, source } => FetchError::Resolve {
                url,
                host: host.clone(),
                source: io::Error::new(source.kind(), source.to_string()),
            },
            GuardError::DialRefused { addr } => FetchError::DialRefused { url, addr: *addr },
        }
    }
}

/// Statuses whose `Location` is followed.
fn is_followed_redirect(status: StatusCode) -> bool {
    matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308)
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

/// The URL as errors, logs and reports show it: scheme, host, port and path. The user name,
/// password, query and fragment are left out, for any of them may carry a credential (a signed
/// URL's signature, an API key, a token).
pub fn redacted(url: &Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// A string that does not parse as a URL, shown as [`redacted`] would: cut at the first `?` or
/// `#`, and without the user information before an `@` in its authority.
fn redacted_raw(raw: &str) -> String {
    let raw = &raw[..raw.find(['?', '#']).unwrap_or(raw.len())];
    let authority = raw.find("://").map_or(0, |i| i + 3);
    let authority_end = raw[authority..].find('/').map_or(raw.len(), |i| authority + i);
    match raw[authority..authority_end].rfind('@') {
        Some(at) => format!("{}{}", &raw[..authority], &raw[authority + at + 1..]),
        None => raw.to_owned(),
    }
}
