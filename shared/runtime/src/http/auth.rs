//! The one check of every `/v1` request ([`Access::check`]) and of every dashboard login
//! ([`Access::log_in`]): after the cross-origin check every state-changing request passes, the
//! caller is found by its bearer token (`http.auth_token`, `http.tokens`; compared in constant
//! time) or its dashboard session with its CSRF token ([`session`](super::session)), and
//! becomes the request's [`Caller`] with the token's [`Scope`]. Failed attempts are counted per
//! client address ([`Throttle`]): past `http.auth_failure_limit` the address is answered `429`.
//! Without any token, every caller is `admin` (the server answers loopback names only, see
//! [`peer`](super::peer)).

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use imagepipe_secret::Secret;
use ipnet::IpNet;

use super::ApiError;
use super::peer::Peer;
use super::scope::{Caller, Scope};
use super::session::{self, Revocations, Session};
use super::throttle::Throttle;
use crate::config::{ConfigError, HttpConfig, ScopedToken};

/// The tokens a server accepts and what it remembers about the people using them: logged-out
/// sessions, failed attempts per client address. Clones share all of it.
#[derive(Clone)]
pub struct Access {
    inner: Arc<Inner>,
}

struct Inner {
    tokens: Vec<ScopedToken>,
    proxies: Vec<IpNet>,
    throttle: Throttle,
    revocations: Revocations,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tokens: Vec<(&str, Scope)> = self.inner.tokens.iter().map(|t| (t.name.as_str(), t.scope)).collect();
        f.debug_struct("Access").field("tokens", &tokens).field("proxies", &self.inner.proxies).finish_non_exhaustive()
    }
}

/// Why a login was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginRefused {
    /// The token is none the server accepts.
    WrongToken,
    /// The client address used up its failed attempts; it may try again after this long.
    TooManyFailures(std::time::Duration),
}

impl Access {
    /// The tokens, trusted proxies and failure limits of the `http` section.
    pub fn from_config(http: &HttpConfig) -> Result<Self, ConfigError> {
        Ok(Self::build(
            http.scoped_tokens(),
            http.trusted_proxy_networks()?,
            Throttle::new(http.auth_failure_limit, http.auth_failure_window),
        ))
    }

    /// `token` as the one (admin) token, with the default failure limits and no trusted proxy;
    /// no token at all for `None`.
    pub fn token(token: Option<Secret<String>>) -> Self {
        let http = HttpConfig { auth_token: token, ..HttpConfig::default() };
        let defaults = HttpConfig::default();
        Self::build(
            http.scoped_tokens(),
            Vec::new(),
            Throttle::new(defaults.auth_failure_limit, defaults.auth_failure_window),
        )
    }

    fn build(tokens: Vec<ScopedToken>, proxies: Vec<IpNet>, throttle: Throttle) -> Self {
        Self { inner: Arc::new(Inner { tokens, proxies, throttle, revocations: Revocations::default() }) }
    }

    /// Whether no token is set: every caller may do everything (loopback names only).
    pub fn is_open(&self) -> bool {
        self.inner.tokens.is_empty()
    }

    /// The tokens, `http.auth_token` first.
    pub fn tokens(&self) -> &[ScopedToken] {
        &self.inner.tokens
    }

    /// The reverse proxies whose forwarded headers are believed (`http.trusted_proxies`).
    pub fn trusted_proxies(&self) -> &[IpNet] {
        &self.inner.proxies
    }

    /// The token `given` is, compared with every token in constant time.
    fn bearer(&self, given: &str) -> Option<&ScopedToken> {
        self.inner.tokens.iter().fold(None, |found, t| {
            if constant_time_eq(given.as_bytes(), t.token.expose().as_bytes()) { Some(t) } else { found }
        })
    }

    fn client(&self, peer: Peer, headers: &HeaderMap) -> Option<IpAddr> {
        peer.client_ip(headers, &self.inner.proxies)
    }

    /// The token `given` is, made as an attempt of `client` ([`Throttle::attempt`]): `Err` with
    /// how long the client must wait when it used up its failed attempts; a wrong token counts
    /// (and is logged as `what`).
    fn attempt(
        &self,
        client: Option<IpAddr>,
        given: &str,
        what: &str,
    ) -> Result<Option<&ScopedToken>, std::time::Duration> {
        let mut found = None;
        let mut find = || {
            found = self.bearer(given);
            found.is_some()
        };
        let known = match client {
            Some(ip) => self.inner.throttle.attempt(ip, find)?,
            None => find(),
        };
        if !known {
            tracing::warn!(client = ?client, "{what}");
        }
        Ok(found)
    }

    /// The caller of a `/v1` request from `peer`, or the answer refusing it: `403 cross_origin`
    /// for a state-changing request a browser sent from another site; `429` for a client over
    /// its failed attempts; `401` without a known token or a live session (a wrong token counts
    /// as a failed attempt); `403 csrf` for a state-changing request on a session without its
    /// CSRF token; `400` for a bad [`SCOPE_HEADER`](super::scope::SCOPE_HEADER).
    #[expect(clippy::result_large_err, reason = "the error is the answer, built once per refused request")]
    pub fn check(&self, method: &Method, headers: &HeaderMap, peer: Peer, now_ms: u64) -> Result<Caller, Response> {
        if let Some(reason) = session::cross_origin(method, headers) {
            return Err(ApiError::new(StatusCode::FORBIDDEN, "cross_origin", reason).into_response());
        }
        if self.is_open() {
            return Caller::new(None, Scope::Admin).lowered_by(headers);
        }
        let client = self.client(peer, headers);
        let caller = if let Some(given) = headers.get(header::AUTHORIZATION) {
            // Not `Bearer <token>` at all is a wrong token too.
            let given = given.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).unwrap_or_default();
            match self.attempt(client, given, "an API request with a wrong bearer token") {
                Ok(Some(token)) => Caller::new(Some(&token.name), token.scope),
                Ok(None) => return Err(unauthorized()),
                Err(wait) => return Err(too_many_failures(wait)),
            }
        } else {
            if let Some(wait) = client.and_then(|ip| self.inner.throttle.retry_after(ip)) {
                return Err(too_many_failures(wait));
            }
            let Some((session, token)) = self.session(headers, now_ms) else { return Err(unauthorized()) };
            if session::is_state_changing(method) && !session.csrf_in(headers) {
                let message =
                    format!("a {method} on a dashboard session needs its token in the {} header", session::CSRF_HEADER);
                return Err(ApiError::new(StatusCode::FORBIDDEN, "csrf", message).into_response());
            }
            Caller::new(Some(&token.name), token.scope)
        };
        caller.lowered_by(headers)
    }

    /// The live session the request's cookie holds, with the token it was opened with (whose
    /// scope it has).
    pub fn session(&self, headers: &HeaderMap, now_ms: u64) -> Option<(Session, &ScopedToken)> {
        let mut token = None;
        let session = Session::from_headers(headers, now_ms, |name| {
            token = self.inner.tokens.iter().find(|t| t.name == name);
            token.map(|t| &t.token)
        })?;
        let token = token?;
        (!self.inner.revocations.is_revoked(&session)).then_some((session, token))
    }

    /// A dashboard login with the token `given` from `peer`: the `Set-Cookie` value of a new
    /// session, or why not. A wrong token counts as a failed attempt of the client address.
    pub fn log_in(
        &self,
        given: &str,
        peer: Peer,
        headers: &HeaderMap,
        now_ms: u64,
    ) -> Result<HeaderValue, LoginRefused> {
        let client = self.client(peer, headers);
        let token = self.attempt(client, given, "a dashboard login with a wrong token");
        let token = token.map_err(LoginRefused::TooManyFailures)?.ok_or(LoginRefused::WrongToken)?;
        let session = Session::issue(&token.name, &token.token, now_ms);
        let secure = peer.forwarded_https(headers, &self.inner.proxies);
        tracing::info!(token = %token.name, "dashboard login");
        Ok(session.set_cookie(&token.token, now_ms, secure))
    }

    /// Ends `session`: a copy of its cookie is no session either.
    pub fn log_out(&self, session: &Session, now_ms: u64) {
        self.inner.revocations.revoke(session, now_ms);
    }
}

/// The `401` answer, with `WWW-Authenticate: Bearer`.
pub fn unauthorized() -> Response {
    let mut response = ApiError::unauthorized().into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The `429 too_many_failures` answer, with `Retry-After` (whole seconds, rounded up).
pub fn too_many_failures(wait: std::time::Duration) -> Response {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let message =
        format!("too many failed token attempts from this address: try again in {seconds} s (http.auth_failure_limit)");
    let mut response = ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_failures", message).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// Whether `a == b`, in time that depends on their lengths only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use super::*;

    const ADMIN: &str = "admin-token-0123456789abcdef0123456789";
    const READER: &str = "reader-token-0123456789abcdef012345678";
    const NOW: u64 = 1_800_000_000_000;

    fn access(limit: u32) -> Access {
        let http = HttpConfig {
            auth_token: Some(ADMIN.to_owned().into()),
            tokens: vec![ScopedToken { name: "grafana".into(), token: READER.to_owned().into(), scope: Scope::Read }],
            auth_failure_limit: limit,
            ..HttpConfig::default()
        };
        Access::from_config(&http).unwrap()
    }

    fn peer(last: u8) -> Peer {
        Peer(Some(SocketAddr::from(([192, 0, 2, last], 40_000))))
    }

    fn bearer(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn cookie_headers(set_cookie: &HeaderValue) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let pair = set_cookie.to_str().unwrap().split(';').next().unwrap().to_owned();
        headers.insert(header::COOKIE, HeaderValue::from_str(&pair).unwrap());
        headers
    }

    fn status(result: Result<Caller, Response>) -> Result<Scope, u16> {
        result.map(|c| c.scope).map_err(|r| r.status().as_u16())
    }

    #[test]
    fn each_token_is_its_scope_and_only_the_exact_token_passes() {
        let access = access(100);
        let check = |headers: &HeaderMap| status(access.check(&Method::GET, headers, peer(1), NOW));
        assert_eq!(check(&bearer(&format!("Bearer {ADMIN}"))), Ok(Scope::Admin));
        assert_eq!(check(&bearer(&format!("Bearer {READER}"))), Ok(Scope::Read));
        let wrong = [
            format!("Bearer {}", &ADMIN[1..]),
            format!("Bearer {ADMIN} "),
            format!("bearer {ADMIN}"),
            format!("Basic {ADMIN}"),
            ADMIN.to_owned(),
        ];
        for value in wrong {
            assert_eq!(check(&bearer(&value)), Err(401), "{value}");
        }
        assert_eq!(check(&HeaderMap::new()), Err(401));
        let open = Access::token(None);
        assert_eq!(
            status(open.check(&Method::POST, &HeaderMap::new(), peer(1), NOW)),
            Ok(Scope::Admin),
            "no token set"
        );
    }

    #[test]
    fn a_session_has_its_tokens_scope_needs_its_csrf_token_for_changes_and_ends_at_logout() {
        let access = access(100);
        let set = access.log_in(READER, peer(1), &HeaderMap::new(), NOW).unwrap();
        assert!(!set.to_str().unwrap().contains("Secure"));
        let mut headers = cookie_headers(&set);
        let check = |method: Method, headers: &HeaderMap| status(access.check(&method, headers, peer(1), NOW));
        assert_eq!(check(Method::GET, &headers), Ok(Scope::Read));
        assert_eq!(check(Method::POST, &headers), Err(403), "no CSRF token");
        let (session, _) = access.session(&headers, NOW).unwrap();
        headers.insert(session::CSRF_HEADER, HeaderValue::from_str(session.csrf_token()).unwrap());
        assert_eq!(check(Method::POST, &headers), Ok(Scope::Read));
        let mut cross = headers.clone();
        cross.insert("origin", HeaderValue::from_static("http://evil.example"));
        cross.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert_eq!(check(Method::POST, &cross), Err(403), "cross-origin");
        assert_eq!(
            status(Access::token(None).check(&Method::POST, &cross, peer(1), NOW)),
            Err(403),
            "also without a token"
        );
        assert_eq!(status(access.check(&Method::GET, &headers, peer(1), session.expires_at_ms())), Err(401), "expired");

        let copied = headers.clone();
        access.log_out(&session, NOW + 1);
        assert_eq!(check(Method::GET, &copied), Err(401), "a copied cookie ends with the logout");
    }

    #[test]
    fn the_secure_flag_follows_forwarded_proto_from_trusted_proxies_only() {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        let set = access(100).log_in(ADMIN, peer(1), &headers, NOW).unwrap();
        assert!(!set.to_str().unwrap().contains("Secure"), "a client's own header");
        let http = HttpConfig {
            auth_token: Some(ADMIN.to_owned().into()),
            trusted_proxies: vec!["192.0.2.0/24".into()],
            ..HttpConfig::default()
        };
        let behind_proxy = Access::from_config(&http).unwrap();
        assert!(behind_proxy.log_in(ADMIN, peer(1), &headers, NOW).unwrap().to_str().unwrap().ends_with("; Secure"));
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_tokens_are_limited_per_address_on_every_way_in() {
        let access = access(3);
        let wrong = bearer("Bearer not-the-token-not-the-token-not-the-token");
        for _ in 0..2 {
            assert_eq!(status(access.check(&Method::GET, &wrong, peer(7), NOW)), Err(401));
        }
        assert_eq!(access.log_in("guess", peer(7), &HeaderMap::new(), NOW), Err(LoginRefused::WrongToken));
        let refused = access.check(&Method::GET, &bearer(&format!("Bearer {ADMIN}")), peer(7), NOW).unwrap_err();
        assert_eq!(refused.status(), 429, "even the right token: a guess must not tell");
        assert_eq!(refused.headers()[header::RETRY_AFTER], "60");
        assert_eq!(
            access.log_in(ADMIN, peer(7), &HeaderMap::new(), NOW),
            Err(LoginRefused::TooManyFailures(Duration::from_secs(60)))
        );
        let admin = bearer(&format!("Bearer {ADMIN}"));
        assert_eq!(status(access.check(&Method::GET, &admin, peer(8), NOW)), Ok(Scope::Admin), "another address");
        for _ in 0..10 {
            assert_eq!(
                status(access.check(&Method::GET, &admin, peer(9), NOW)),
                Ok(Scope::Admin),
                "successes never count"
            );
        }
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(status(access.check(&Method::GET, &admin, peer(7), NOW)), Ok(Scope::Admin), "after the window");
    }
}
