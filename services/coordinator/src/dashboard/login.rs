//! Logging in to the dashboard with a token (`/login`), and out (`/logout`). A login sets the
//! session cookie ([`Access::log_in`](imagepipe_runtime::http::Access::log_in)) and returns
//! the person to the page they asked for (a path on this server only, [`next_path`]). Both
//! forms are refused when a browser sends them from another site. A wrong token counts as a
//! failed attempt of the client address, as a wrong bearer token does, and waits a moment
//! before its answer; past `http.auth_failure_limit` the address is answered `429`. A logout
//! ends the session on the server, so a copy of its cookie is no session either.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use imagepipe_runtime::http::auth::LoginRefused;
use imagepipe_runtime::http::peer::Peer;
use imagepipe_runtime::http::session::{self, Session};
use maud::html;
use url::Url;

use super::Dashboard;
use super::layout;

/// How long a wrong token waits for its answer.
const WRONG_TOKEN_DELAY: Duration = Duration::from_millis(400);

/// Where to go after logging in: `next` when it is a path on this server (it resolves to this
/// origin as a browser would resolve it, and names no other host however it is read: no
/// control characters, no backslashes, not `//`), `/` for anything else. The path is returned
/// as the URL parser wrote it (percent-encoded, dot segments resolved, without a fragment).
fn next_path(next: Option<&String>) -> String {
    const HOME: &str = "/";
    let Some(next) = next else { return HOME.to_owned() };
    if !next.starts_with('/') || next.chars().any(|c| c.is_control() || c.is_whitespace() || c == '\\') {
        return HOME.to_owned();
    }
    let base = Url::parse("http://dashboard.invalid/").expect("a valid base URL");
    let Ok(url) = base.join(next) else { return HOME.to_owned() };
    if url.origin() != base.origin() || url.path().starts_with("//") {
        return HOME.to_owned();
    }
    match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    }
}

fn form_page(status: StatusCode, next: &str, error: Option<&str>) -> Response {
    let body = layout::bare(
        "Log in",
        html! {
            form.login method="post" action="/login" {
                h1 { "imagepipe" }
                p { "Log in with a token of this service (" code { "http.auth_token" } " or one of " code { "http.tokens" } ")." }
                @if let Some(error) = error { p.notice role="alert" id="login-error" { (error) } }
                input type="hidden" name="next" value=(next);
                label for="token" { "Token" }
                input id="token" type="password" name="token" autocomplete="current-password" required autofocus
                    aria-describedby=[error.map(|_| "login-error")];
                button type="submit" { "Log in" }
            }
        },
    );
    (status, body).into_response()
}

/// `GET /login`: the form; without a token set there is nothing to log in to.
pub async fn form(State(dashboard): State<Dashboard>, Query(query): Query<HashMap<String, String>>) -> Response {
    let next = next_path(query.get("next"));
    if dashboard.api.access().is_open() {
        return Redirect::to(&next).into_response();
    }
    form_page(StatusCode::OK, &next, None)
}

fn fields(body: &[u8]) -> HashMap<String, String> {
    url::form_urlencoded::parse(body).into_owned().collect()
}

fn refused_cross_site(headers: &HeaderMap) -> Option<Response> {
    session::cross_origin(&axum::http::Method::POST, headers)
        .map(|reason| (StatusCode::FORBIDDEN, reason).into_response())
}

/// `POST /login`: the token from the form; right, the session cookie and a redirect to `next`.
pub async fn submit(State(dashboard): State<Dashboard>, peer: Peer, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = refused_cross_site(&headers) {
        return refused;
    }
    let fields = fields(&body);
    let next = next_path(fields.get("next"));
    let access = dashboard.api.access();
    if access.is_open() {
        return Redirect::to(&next).into_response();
    }
    let given = fields.get("token").map(String::as_str).unwrap_or_default();
    match access.log_in(given, peer, &headers, dashboard.clock.unix_ms()) {
        Ok(cookie) => ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response(),
        Err(LoginRefused::WrongToken) => {
            tokio::time::sleep(WRONG_TOKEN_DELAY).await;
            form_page(StatusCode::UNAUTHORIZED, &next, Some("That is not the token."))
        }
        Err(LoginRefused::TooManyFailures(wait)) => {
            let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            let message = format!("Too many wrong tokens from this address: try again in {seconds} s.");
            let mut page = form_page(StatusCode::TOO_MANY_REQUESTS, &next, Some(&message));
            page.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            page
        }
    }
}

/// `POST /logout`: ends the session (the form carries its CSRF token) and removes its cookie.
pub async fn logout(State(dashboard): State<Dashboard>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = refused_cross_site(&headers) {
        return refused;
    }
    let access = dashboard.api.access();
    if access.is_open() {
        return Redirect::to("/").into_response();
    }
    let now = dashboard.clock.unix_ms();
    if let Some((session, _)) = access.session(&headers, now) {
        let csrf = fields(&body).remove("csrf").unwrap_or_default();
        if !session.csrf_matches(&csrf) {
            return (StatusCode::FORBIDDEN, "the logout form lacks the session's CSRF token").into_response();
        }
        access.log_out(&session, now);
    }
    ([(header::SET_COOKIE, Session::clear_cookie())], Redirect::to("/login")).into_response()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::{ConnectInfo, Request};
    use imagepipe_runtime::clock::{Clock as _, SystemClock};
    use imagepipe_runtime::config::{HttpConfig, TelemetryConfig};
    use imagepipe_runtime::http::{Access, ApiRoutes};
    use tower::ServiceExt as _;

    use super::*;

    const TOKEN: &str = "login-test-token-0123456789abcdef0123";

    /// The dashboard's router with `TOKEN` set and `proxies` trusted, and its API table.
    fn dashboard(proxies: &[&str]) -> (Router, ApiRoutes) {
        let http = HttpConfig {
            auth_token: Some(TOKEN.to_owned().into()),
            trusted_proxies: proxies.iter().map(|p| (*p).to_owned()).collect(),
            auth_failure_limit: 3,
            ..HttpConfig::default()
        };
        let api = ApiRoutes::with_access(Access::from_config(&http).unwrap());
        let router = Dashboard::new(api.clone(), &TelemetryConfig::default(), Arc::new(SystemClock)).router();
        (router, api)
    }

    /// `request` from `peer`.
    async fn send(router: &Router, mut request: Request, peer: [u8; 4]) -> Response {
        request.extensions_mut().insert(ConnectInfo(SocketAddr::from((peer, 40_000))));
        router.clone().oneshot(request).await.unwrap()
    }

    fn login(token: &str, headers: &[(&str, &str)]) -> Request {
        let mut request = Request::post("/login").header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = url::form_urlencoded::Serializer::new(String::new()).append_pair("token", token).finish();
        request.body(Body::from(body)).unwrap()
    }

    fn set_cookie(response: &Response) -> String {
        response.headers()[header::SET_COOKIE].to_str().unwrap().to_owned()
    }

    #[tokio::test]
    async fn a_tab_in_next_does_not_lead_off_site() {
        let (router, _) = dashboard(&[]);
        for next in ["%2F%09%2Fevil.example", "%2F%0A%2Fevil.example", "%2F%5Cevil.example", "%5C%2Fevil.example"] {
            let request = Request::get(format!("/login?next={next}")).body(Body::empty()).unwrap();
            let response = send(&router, request, [127, 0, 0, 1]).await;
            let page = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            let page = String::from_utf8_lossy(&page);
            assert!(page.contains(r#"name="next" value="/""#), "{next}: {page}");
        }
        let tab = "next=%2F%09%2Fevil.example&token=".to_owned() + TOKEN;
        let request = Request::post("/login").body(Body::from(tab)).unwrap();
        let response = send(&router, request, [127, 0, 0, 1]).await;
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        assert_eq!(response.headers()[header::LOCATION], "/");
    }

    #[tokio::test]
    async fn the_secure_flag_believes_forwarded_proto_from_a_trusted_proxy_only() {
        let (router, _) = dashboard(&["10.0.0.0/8"]);
        let https = [("x-forwarded-proto", "https")];
        let direct = send(&router, login(TOKEN, &https), [192, 0, 2, 1]).await;
        assert_eq!(direct.status(), StatusCode::SEE_OTHER);
        assert!(!set_cookie(&direct).contains("Secure"), "a client's own X-Forwarded-Proto: {}", set_cookie(&direct));
        let proxied = send(&router, login(TOKEN, &https), [10, 0, 0, 5]).await;
        assert!(set_cookie(&proxied).ends_with("; Secure"), "{}", set_cookie(&proxied));
    }

    #[tokio::test]
    async fn logout_ends_the_session_for_every_copy_of_its_cookie() {
        let (router, api) = dashboard(&[]);
        let response = send(&router, login(TOKEN, &[]), [127, 0, 0, 1]).await;
        let cookie = set_cookie(&response).split(';').next().unwrap().to_owned();
        let page = || Request::get("/dlq").header(header::COOKIE, &cookie).body(Body::empty()).unwrap();
        assert_ne!(send(&router, page(), [127, 0, 0, 1]).await.status(), StatusCode::SEE_OTHER, "logged in");
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, cookie.parse().unwrap());
        let (session, _) = api.access().session(&headers, SystemClock.unix_ms()).unwrap();
        let logout = Request::post("/logout")
            .header(header::COOKIE, &cookie)
            .body(Body::from(format!("csrf={}", session.csrf_token())))
            .unwrap();
        assert_eq!(send(&router, logout, [127, 0, 0, 1]).await.status(), StatusCode::SEE_OTHER);
        let copied = send(&router, page(), [127, 0, 0, 1]).await;
        assert_eq!(copied.status(), StatusCode::SEE_OTHER, "a copy of the cookie is sent to log in again");
        assert!(copied.headers()[header::LOCATION].to_str().unwrap().starts_with("/login"));
    }

    #[tokio::test(start_paused = true)]
    async fn wrong_logins_are_limited_per_address() {
        let (router, _) = dashboard(&[]);
        for _ in 0..3 {
            assert_eq!(send(&router, login("guess", &[]), [192, 0, 2, 7]).await.status(), StatusCode::UNAUTHORIZED);
        }
        let refused = send(&router, login(TOKEN, &[]), [192, 0, 2, 7]).await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS, "even the right token, while blocked");
        let retry_after: u64 = refused.headers()[header::RETRY_AFTER].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry_after), "the rest of the minute: {retry_after}");
        assert_eq!(send(&router, login(TOKEN, &[]), [192, 0, 2, 8]).await.status(), StatusCode::SEE_OTHER);
    }

    #[test]
    fn only_paths_on_this_server_are_followed_after_login() {
        let next = |s: &str| next_path(Some(&s.to_owned()));
        assert_eq!(next("/tasks?state=failed"), "/tasks?state=failed");
        assert_eq!(next("/tasks/tsk_1#history"), "/tasks/tsk_1", "no fragment");
        assert_eq!(next("/a/../dlq"), "/dlq");
        assert_eq!(next("/%2F/evil.example"), "/%2F/evil.example", "an encoded slash stays a path segment");
        assert_eq!(next("/%5C/evil.example"), "/%5C/evil.example", "an encoded backslash too");
        for outside in [
            "//evil.example/",
            "https://evil.example/",
            "/\\evil.example",
            "\\/evil.example",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r/evil.example",
            "/ /evil.example",
            "/.//evil.example",
            "/x/..//evil.example",
            "tasks",
            "",
        ] {
            assert_eq!(next(outside), "/", "{outside:?}");
        }
        assert_eq!(next_path(None), "/");
    }
}
