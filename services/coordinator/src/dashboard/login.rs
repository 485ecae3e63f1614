//! Logging in to the dashboard with `http.auth_token` (`/login`), and out (`/logout`). A login
//! sets the session cookie ([`Session`]) and returns the person to the page they asked for
//! (a path on this server only). Both forms are refused when a browser sends them from another
//! site; a wrong token waits a moment before the answer, so guessing is slow.

use std::collections::HashMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use imagepipe_runtime::http::auth::constant_time_eq;
use imagepipe_runtime::http::session::{self, Session};
use maud::html;

use super::Dashboard;
use super::layout;

/// How long a wrong token waits for its answer.
const WRONG_TOKEN_DELAY: Duration = Duration::from_millis(400);

/// Where to go after logging in: a path on this server, `/` for anything else.
fn next_path(next: Option<&String>) -> String {
    match next {
        Some(path) if path.starts_with('/') && !path.starts_with("//") && !path.contains('\\') => path.clone(),
        _ => "/".to_owned(),
    }
}

fn form_page(status: StatusCode, next: &str, error: Option<&str>) -> Response {
    let body = layout::bare(
        "Log in",
        html! {
            form.login method="post" action="/login" {
                h1 { "imagepipe" }
                p { "Log in with the service's token (" code { "http.auth_token" } ")." }
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
    if dashboard.api.token().is_none() {
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
pub async fn submit(State(dashboard): State<Dashboard>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = refused_cross_site(&headers) {
        return refused;
    }
    let fields = fields(&body);
    let next = next_path(fields.get("next"));
    let Some(token) = dashboard.api.token() else { return Redirect::to(&next).into_response() };
    let given = fields.get("token").map(String::as_str).unwrap_or_default();
    if !constant_time_eq(given.as_bytes(), token.expose().as_bytes()) {
        tokio::time::sleep(WRONG_TOKEN_DELAY).await;
        tracing::warn!("dashboard login with a wrong token");
        return form_page(StatusCode::UNAUTHORIZED, &next, Some("That is not the token."));
    }
    let now = dashboard.clock.unix_ms();
    let secure = headers.get("x-forwarded-proto").is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"));
    let cookie = Session::issue(token, now).set_cookie(token, now, secure);
    tracing::info!("dashboard login");
    ([(header::SET_COOKIE, cookie)], Redirect::to(&next)).into_response()
}

/// `POST /logout`: removes the session cookie (the form carries the session's CSRF token).
pub async fn logout(State(dashboard): State<Dashboard>, headers: HeaderMap, body: Bytes) -> Response {
    if let Some(refused) = refused_cross_site(&headers) {
        return refused;
    }
    let Some(token) = dashboard.api.token() else { return Redirect::to("/").into_response() };
    let session = Session::from_headers(token, &headers, dashboard.clock.unix_ms());
    let csrf = fields(&body).remove("csrf").unwrap_or_default();
    if session.is_some_and(|s| !s.csrf_matches(&csrf)) {
        return (StatusCode::FORBIDDEN, "the logout form lacks the session's CSRF token").into_response();
    }
    ([(header::SET_COOKIE, Session::clear_cookie())], Redirect::to("/login")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_on_this_server_are_followed_after_login() {
        let next = |s: &str| next_path(Some(&s.to_owned()));
        assert_eq!(next("/tasks?state=failed"), "/tasks?state=failed");
        for outside in ["//evil.example/", "https://evil.example/", "/\\evil.example", "tasks"] {
            assert_eq!(next(outside), "/", "{outside}");
        }
        assert_eq!(next_path(None), "/");
    }
}
