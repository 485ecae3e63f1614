//! The one check of every `/v1` request: the bearer token (`http.auth_token`, compared in
//! constant time) or a dashboard session with its CSRF token ([`session`](super::session)),
//! after the cross-origin check every state-changing request passes.

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use imagepipe_secret::Secret;

use super::ApiError;
use super::session::{self, Session};

/// What a configured token prints as.
pub(super) const MASKED: &str = imagepipe_secret::MASK;

/// Whether `headers` carry `Authorization: Bearer <token>`; always true without a token.
pub fn authorized(token: Option<&Secret<String>>, headers: &HeaderMap) -> bool {
    let Some(token) = token else { return true };
    let given = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    given
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| constant_time_eq(t.as_bytes(), token.expose().as_bytes()))
}

/// Lets a `/v1` request through, or answers it: `403 cross_origin` for a state-changing request
/// a browser sent from another site; with a token set, `401` unless the request carries the
/// bearer token or a valid session cookie, and `403 csrf` for a state-changing request on a
/// session without its CSRF token.
#[expect(clippy::result_large_err, reason = "the error is the answer, built once per refused request")]
pub fn check(
    token: Option<&Secret<String>>,
    method: &Method,
    headers: &HeaderMap,
    now_ms: u64,
) -> Result<(), Response> {
    if let Some(reason) = session::cross_origin(method, headers) {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "cross_origin", reason).into_response());
    }
    let Some(token) = token else { return Ok(()) };
    if headers.contains_key(header::AUTHORIZATION) {
        return if authorized(Some(token), headers) { Ok(()) } else { Err(unauthorized()) };
    }
    let Some(session) = Session::from_headers(token, headers, now_ms) else { return Err(unauthorized()) };
    if session::is_state_changing(method) && !session.csrf_in(headers) {
        let message =
            format!("a {method} on a dashboard session needs its token in the {} header", session::CSRF_HEADER);
        return Err(ApiError::new(StatusCode::FORBIDDEN, "csrf", message).into_response());
    }
    Ok(())
}

/// The `401` answer, with `WWW-Authenticate: Bearer`.
pub fn unauthorized() -> Response {
    let mut response = ApiError::unauthorized().into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Whether `a == b`, in time that depends on their lengths only.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn a_session_passes_reads_and_needs_its_csrf_token_for_changes() {
        let token = Secret::new("s3cret".to_owned());
        let now = 1_800_000_000_000;
        let session = Session::issue(&token, now);
        let cookie = session.set_cookie(&token, now, false);
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_str(cookie.to_str().unwrap().split(';').next().unwrap()).unwrap(),
        );
        let status = |result: Result<(), Response>| result.err().map(|r| r.status().as_u16());
        assert_eq!(status(check(Some(&token), &Method::GET, &headers, now)), None);
        assert_eq!(status(check(Some(&token), &Method::POST, &headers, now)), Some(403), "no CSRF token");
        headers.insert(session::CSRF_HEADER, HeaderValue::from_str(session.csrf_token()).unwrap());
        assert_eq!(status(check(Some(&token), &Method::POST, &headers, now)), None);
        headers.insert("origin", HeaderValue::from_static("http://evil.example"));
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert_eq!(status(check(Some(&token), &Method::POST, &headers, now)), Some(403), "cross-origin");
        assert_eq!(status(check(None, &Method::POST, &headers, now)), Some(403), "also without a token");
        assert_eq!(status(check(Some(&token), &Method::GET, &HeaderMap::new(), now)), Some(401));
        assert_eq!(
            status(check(Some(&token), &Method::POST, &self::headers("Bearer s3cret"), now)),
            None,
            "bearer needs no CSRF"
        );
        assert_eq!(status(check(Some(&token), &Method::GET, &headers, session.expires_at_ms())), Some(401), "expired");
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let token = Secret::new("s3cret".to_owned());
        assert!(authorized(Some(&token), &headers("Bearer s3cret")));
        for wrong in ["Bearer s3cre", "Bearer s3cret ", "bearer s3cret", "Basic s3cret", "s3cret"] {
            assert!(!authorized(Some(&token), &headers(wrong)), "{wrong}");
        }
        assert!(!authorized(Some(&token), &HeaderMap::new()));
        assert!(authorized(None, &HeaderMap::new()), "no token configured");
    }
}
