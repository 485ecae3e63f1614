//! Browser sessions and cross-site request forgery (CSRF) protection for the dashboard.
//!
//! A person logs in with a token (`http.auth_token` or one of `http.tokens`); the answer sets
//! [`COOKIE`], HttpOnly and SameSite=Strict, holding the token's name, an expiry and a random
//! nonce, signed with HMAC-SHA-256 keyed by that token. A session is valid while its signature
//! checks out, it has not expired and it was not logged out ([`Revocations`]); it has the scope
//! its token has now, and changing the token ends its sessions. Each session has a CSRF token
//! derived from its nonce, which the page sends in [`CSRF_HEADER`] (or a form field) with every
//! state-changing request; a request that rides on the cookie alone is refused.
//!
//! Independently of any session, [`cross_origin`] refuses state-changing requests a browser
//! marks as sent from another site (`Sec-Fetch-Site`, else `Origin` against `Host`), which also
//! guards a loopback server without a token.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method, header};
use hmac::{Hmac, Mac};
use imagepipe_secret::Secret;
use sha2::Sha256;

use super::auth::constant_time_eq;

/// Name of the session cookie.
pub const COOKIE: &str = "imagepipe_session";

/// Request header carrying a session's CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";

/// How long a session lasts after login.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 60 * 60);

/// Most logged-out sessions remembered at once (see [`Revocations`]).
pub const MAX_REVOKED: usize = 10_000;

/// Version tag of the cookie format; a cookie of another version is not a session.
const VERSION: &str = "v2";

type HmacSha256 = Hmac<Sha256>;

/// A logged-in browser: the token it logged in with (by name), valid until `expires_at_ms`.
#[derive(Clone, PartialEq, Eq)]
pub struct Session {
    name: String,
    nonce: String,
    expires_at_ms: u64,
    csrf: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("name", &self.name)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

fn sign(key: &Secret<String>, parts: &[&str]) -> String {
    let mut mac = HmacSha256::new_from_slice(key.expose().as_bytes()).expect("HMAC takes keys of any length");
    for part in parts {
        mac.update(part.as_bytes());
        mac.update(b"|");
    }
    hex::encode(mac.finalize().into_bytes())
}

impl Session {
    /// A new session for a browser that presented the token `name` (`key`) at `now_ms` (Unix
    /// ms). `name` must not contain `.` (token names are `[A-Za-z0-9_-]`).
    pub fn issue(name: &str, key: &Secret<String>, now_ms: u64) -> Self {
        let nonce = hex::encode(rand::random::<[u8; 16]>());
        let expires_at_ms = now_ms.saturating_add(crate::clock::millis(SESSION_TTL));
        Self::signed(name.to_owned(), key, nonce, expires_at_ms)
    }

    fn signed(name: String, key: &Secret<String>, nonce: String, expires_at_ms: u64) -> Self {
        let csrf = sign(key, &["imagepipe-csrf", VERSION, &name, &nonce]);
        Self { name, nonce, expires_at_ms, csrf }
    }

    /// The session the request's [`COOKIE`] holds, when it is signed with the key `key_of`
    /// gives for its token's name and not expired at `now_ms` (whether it was logged out is
    /// [`Revocations::is_revoked`]).
    pub fn from_headers<'k>(
        headers: &HeaderMap,
        now_ms: u64,
        key_of: impl FnOnce(&str) -> Option<&'k Secret<String>>,
    ) -> Option<Self> {
        let value = cookie(headers, COOKIE)?;
        let mut parts = value.split('.');
        let (version, name, expiry, nonce, mac) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version != VERSION || parts.next().is_some() || nonce.len() != 32 {
            return None;
        }
        let key = key_of(name)?;
        let expected = sign(key, &["imagepipe-session", VERSION, name, expiry, nonce]);
        if !constant_time_eq(mac.as_bytes(), expected.as_bytes()) {
            return None;
        }
        let expires_at_ms = expiry.parse::<u64>().ok().filter(|at| *at > now_ms)?;
        Some(Self::signed(name.to_owned(), key, nonce.to_owned(), expires_at_ms))
    }

    /// The name of the token the session was opened with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The token the page sends in [`CSRF_HEADER`] with every state-changing request.
    pub fn csrf_token(&self) -> &str {
        &self.csrf
    }

    /// When the session ends, Unix ms.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// When the session began, Unix ms.
    pub fn issued_at_ms(&self) -> u64 {
        self.expires_at_ms.saturating_sub(crate::clock::millis(SESSION_TTL))
    }

    /// Whether `given` is this session's CSRF token.
    pub fn csrf_matches(&self, given: &str) -> bool {
        constant_time_eq(given.as_bytes(), self.csrf.as_bytes())
    }

    /// Whether the request carries this session's CSRF token in [`CSRF_HEADER`].
    pub fn csrf_in(&self, headers: &HeaderMap) -> bool {
        headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()).is_some_and(|given| self.csrf_matches(given))
    }

    /// The `Set-Cookie` value that stores the session, signed with `key` (its token): HttpOnly,
    /// SameSite=Strict, for the whole site, `Secure` when `secure` (the page was served over
    /// HTTPS).
    pub fn set_cookie(&self, key: &Secret<String>, now_ms: u64, secure: bool) -> HeaderValue {
        let expiry = self.expires_at_ms.to_string();
        let mac = sign(key, &["imagepipe-session", VERSION, &self.name, &expiry, &self.nonce]);
        let max_age = self.expires_at_ms.saturating_sub(now_ms) / 1000;
        let secure = if secure { "; Secure" } else { "" };
        let value = format!(
            "{COOKIE}={VERSION}.{}.{expiry}.{}.{mac}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}",
            self.name, self.nonce
        );
        HeaderValue::from_str(&value).expect("the cookie is ASCII without control characters")
    }

    /// The `Set-Cookie` value that removes the session cookie (logout).
    pub fn clear_cookie() -> HeaderValue {
        HeaderValue::from_static("imagepipe_session=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")
    }
}

/// The sessions logged out before they expired, so a copy of the cookie is no session either.
/// At most [`MAX_REVOKED`] are remembered (expired ones are forgotten, they are no sessions
/// anyway); should that many be live, every session issued until then is ended instead. The
/// list lives in the process: a restarted server no longer knows it (change the token to end
/// every session for good).
#[derive(Debug, Default)]
pub struct Revocations {
    state: Mutex<Revoked>,
}

#[derive(Debug, Default)]
struct Revoked {
    /// Nonce → the session's expiry (Unix ms).
    nonces: HashMap<String, u64>,
    /// Sessions issued before this (Unix ms) are ended.
    not_before_ms: u64,
}

impl Revocations {
    /// Ends `session` at `now_ms`.
    pub fn revoke(&self, session: &Session, now_ms: u64) {
        self.revoke_within(session, now_ms, MAX_REVOKED);
    }

    fn revoke_within(&self, session: &Session, now_ms: u64, capacity: usize) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.nonces.len() >= capacity {
            state.nonces.retain(|_, expires| *expires > now_ms);
        }
        if state.nonces.len() >= capacity {
            state.nonces.clear();
            state.not_before_ms = now_ms.saturating_add(1);
            tracing::warn!(capacity, "too many logged-out sessions to remember: every session is ended");
            return;
        }
        state.nonces.insert(session.nonce.clone(), session.expires_at_ms);
    }

    /// Whether `session` was logged out.
    pub fn is_revoked(&self, session: &Session) -> bool {
        let state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        session.issued_at_ms() < state.not_before_ms || state.nonces.contains_key(&session.nonce)
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Whether `method` changes state (anything but GET, HEAD, OPTIONS, TRACE).
pub fn is_state_changing(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE)
}

/// Why a state-changing request from a browser was refused as cross-origin, or `None` when it
/// may go on: `Sec-Fetch-Site` must be `same-origin` or `none` (typed by the user); without it
/// an `Origin` must name the host the request was sent to. A request with neither header is
/// not from a browser that could be tricked, and goes on.
pub fn cross_origin(method: &Method, headers: &HeaderMap) -> Option<String> {
    if !is_state_changing(method) {
        return None;
    }
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = value("sec-fetch-site") {
        return match site {
            "same-origin" | "none" => None,
            other => Some(format!("a {method} from another site (Sec-Fetch-Site: {other}) is refused")),
        };
    }
    let origin = value("origin")?;
    let host = value("host").unwrap_or_default();
    let origin_host = origin.split_once("://").map(|(_, rest)| rest.trim_end_matches('/'));
    if origin_host.is_some_and(|h| h.eq_ignore_ascii_case(host)) {
        None
    } else {
        Some(format!("a {method} from origin {origin:?} to host {host:?} is refused"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    fn token() -> Secret<String> {
        Secret::new("s3cret-token-of-at-least-32-bytes".to_owned())
    }

    fn with_cookie(set_cookie: &HeaderValue) -> HeaderMap {
        let pair = set_cookie.to_str().unwrap().split(';').next().unwrap().to_owned();
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, HeaderValue::from_str(&format!("theme=dark; {pair}")).unwrap());
        headers
    }

    fn read(headers: &HeaderMap, now: u64) -> Option<Session> {
        let key = token();
        Session::from_headers(headers, now, |name| (name == "ops").then_some(&key))
    }

    #[test]
    fn a_session_round_trips_through_its_cookie_until_it_expires() {
        let session = Session::issue("ops", &token(), NOW);
        let set = session.set_cookie(&token(), NOW, false);
        let text = set.to_str().unwrap();
        for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
            assert!(text.contains(attribute), "{text}");
        }
        assert!(!text.contains("Secure"));
        let headers = with_cookie(&set);
        let read_back = read(&headers, NOW + 1).expect("valid");
        assert_eq!(read_back, session);
        assert_eq!(read_back.name(), "ops");
        assert_eq!(read_back.csrf_token(), session.csrf_token());
        assert_eq!(read_back.issued_at_ms(), NOW);
        assert!(read(&headers, session.expires_at_ms()).is_none(), "expired");
        let other = Secret::new("another".to_owned());
        assert!(Session::from_headers(&headers, NOW, |_| Some(&other)).is_none(), "a new token ends every session");
        assert!(Session::from_headers(&headers, NOW, |_| None).is_none(), "a token no longer configured");
        assert!(session.set_cookie(&token(), NOW, true).to_str().unwrap().ends_with("; Secure"));
    }

    #[test]
    fn a_tampered_cookie_is_no_session() {
        let set = Session::issue("ops", &token(), NOW).set_cookie(&token(), NOW, false);
        let pair = set.to_str().unwrap().split(';').next().unwrap().to_owned();
        let (name, value) = pair.split_once('=').unwrap();
        let parts: Vec<&str> = value.split('.').collect();
        let later = (NOW + 10 * crate::clock::millis(SESSION_TTL)).to_string();
        let tampered = [
            format!("v2.ops.{later}.{}.{}", parts[3], parts[4]),
            format!("v2.ops.{}.{}.{}", parts[2], "0".repeat(32), parts[4]),
            format!("v2.admin.{}.{}.{}", parts[2], parts[3], parts[4]),
            format!("v1.ops.{}.{}.{}", parts[2], parts[3], parts[4]),
            format!("{value}.x"),
            "garbage".to_owned(),
        ];
        for value in tampered {
            let mut headers = HeaderMap::new();
            headers.insert(header::COOKIE, HeaderValue::from_str(&format!("{name}={value}")).unwrap());
            assert!(read(&headers, NOW).is_none(), "{value}");
        }
    }

    #[test]
    fn the_csrf_token_is_the_sessions_own() {
        let (a, b) = (Session::issue("ops", &token(), NOW), Session::issue("ops", &token(), NOW));
        assert_ne!(a.csrf_token(), b.csrf_token());
        let mut headers = HeaderMap::new();
        headers.insert(CSRF_HEADER, HeaderValue::from_str(a.csrf_token()).unwrap());
        assert!(a.csrf_in(&headers));
        assert!(!b.csrf_in(&headers));
        assert!(!a.csrf_in(&HeaderMap::new()));
    }

    #[test]
    fn a_logged_out_session_stays_out_and_the_list_stays_bounded() {
        let revocations = Revocations::default();
        let (out, kept) = (Session::issue("ops", &token(), NOW), Session::issue("ops", &token(), NOW));
        revocations.revoke(&out, NOW + 5);
        assert!(revocations.is_revoked(&out));
        assert!(!revocations.is_revoked(&kept));

        let full = Revocations::default();
        for i in 0..4 {
            full.revoke_within(&Session::issue("ops", &token(), NOW + i), NOW + 10, 4);
        }
        assert!(!full.is_revoked(&kept), "room left");
        full.revoke_within(&out, NOW + 10, 4);
        assert!(full.is_revoked(&out) && full.is_revoked(&kept), "full: every session until now ends");
        assert!(full.state.lock().unwrap().nonces.is_empty());
        assert!(!full.is_revoked(&Session::issue("ops", &token(), NOW + 11)), "later sessions live");
    }

    #[test]
    fn cross_site_state_changes_are_refused() {
        let check = |method: Method, pairs: &[(&'static str, &'static str)]| {
            let mut headers = HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, HeaderValue::from_static(value));
            }
            cross_origin(&method, &headers)
        };
        assert!(check(Method::GET, &[("sec-fetch-site", "cross-site")]).is_none(), "reads are not guarded");
        assert!(check(Method::POST, &[]).is_none(), "not a browser");
        assert!(check(Method::POST, &[("sec-fetch-site", "same-origin")]).is_none());
        assert!(check(Method::POST, &[("sec-fetch-site", "none")]).is_none());
        assert!(check(Method::POST, &[("sec-fetch-site", "cross-site")]).is_some());
        assert!(check(Method::DELETE, &[("sec-fetch-site", "same-site")]).is_some());
        let same = [("origin", "http://127.0.0.1:8080"), ("host", "127.0.0.1:8080")];
        assert!(check(Method::POST, &same).is_none());
        let other = [("origin", "http://evil.example"), ("host", "127.0.0.1:8080")];
        assert!(check(Method::PUT, &other).unwrap().contains("evil.example"));
        assert!(check(Method::POST, &[("origin", "null"), ("host", "127.0.0.1:8080")]).is_some());
    }
}
