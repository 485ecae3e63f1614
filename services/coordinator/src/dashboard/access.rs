//! Who may see the dashboard. With `http.auth_token` set: a browser with a valid session cookie
//! (others are sent to the login form). Without a token: only a client on loopback that also
//! names a loopback host (so a web page whose own name was pointed at 127.0.0.1 — DNS
//! rebinding — cannot read it); everyone else is told to set a token. This is the rule that
//! keeps an unauthenticated server on loopback (`http.bind`), applied to the person's browser.

use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use imagepipe_runtime::http::session::Session;

use super::Dashboard;
use super::layout;

/// The person looking at a page: the CSRF token their requests carry (none without a token
/// configured) and whether they logged in.
#[derive(Debug, Clone)]
pub struct Viewer {
    /// The session's CSRF token; `None` when no `http.auth_token` is set.
    pub csrf: Option<String>,
}

impl FromRequestParts<Dashboard> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, dashboard: &Dashboard) -> Result<Self, Self::Rejection> {
        match dashboard.api.token() {
            Some(token) => match Session::from_headers(token, &parts.headers, dashboard.clock.unix_ms()) {
                Some(session) => Ok(Self { csrf: Some(session.csrf_token().to_owned()) }),
                None if parts.uri.path().starts_with("/partials/") => {
                    Err((StatusCode::UNAUTHORIZED, "the session ended: log in again").into_response())
                }
                None => {
                    let next = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                    let target =
                        url::form_urlencoded::Serializer::new(String::new()).append_pair("next", next).finish();
                    Err(Redirect::to(&format!("/login?{target}")).into_response())
                }
            },
            None => {
                let peer = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
                if peer.is_some_and(|ip| ip.is_loopback()) && host_is_loopback(&parts.headers) {
                    Ok(Self { csrf: None })
                } else {
                    Err(loopback_only())
                }
            }
        }
    }
}

/// The answer to a browser beyond loopback when no token is set.
fn loopback_only() -> Response {
    let body = layout::bare(
        "Set a token to open the dashboard",
        maud::html! {
            h1 { "The dashboard answers loopback only" }
            p {
                "No " code { "http.auth_token" } " is set, so the dashboard opens only for a browser on this \
                 machine at " code { "http://127.0.0.1:<port>/" } ". Set " code { "IMAGEPIPE_HTTP__AUTH_TOKEN" }
                " to open it to others: they log in with the token."
            }
        },
    );
    (StatusCode::FORBIDDEN, body).into_response()
}

/// Whether the request's `Host` names this machine: `localhost` or a loopback address, with or
/// without a port.
pub fn host_is_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else { return false };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => {
            host.rsplit_once(':').map_or(host, |(name, port)| if port.parse::<u16>().is_ok() { name } else { host })
        }
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::Request;
    use axum::http::HeaderValue;
    use axum::routing::get;
    use imagepipe_runtime::clock::SystemClock;
    use imagepipe_runtime::config::TelemetryConfig;
    use imagepipe_runtime::http::ApiRoutes;
    use imagepipe_secret::Secret;
    use tower::ServiceExt as _;

    use super::*;

    /// The status a page answers `peer` asking for `host`, with and without a token.
    async fn status(token: Option<&str>, peer: [u8; 4], host: &'static str) -> (u16, Option<String>) {
        let api = ApiRoutes::new(token.map(|t| Secret::new(t.to_owned())));
        let dashboard = Dashboard::new(api, &TelemetryConfig::default(), Arc::new(SystemClock));
        let router = Router::new().route("/tasks", get(|_: Viewer| async { "page" })).with_state(dashboard);
        let mut request = Request::get("/tasks?state=failed").header(header::HOST, host).body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(SocketAddr::from((peer, 40_000))));
        let response = router.oneshot(request).await.unwrap();
        let location = response.headers().get(header::LOCATION).map(|l| l.to_str().unwrap().to_owned());
        (response.status().as_u16(), location)
    }

    #[tokio::test]
    async fn without_a_token_only_loopback_browsers_see_pages() {
        assert_eq!(status(None, [127, 0, 0, 1], "127.0.0.1:8080").await.0, 200);
        assert_eq!(status(None, [127, 0, 0, 1], "localhost:8080").await.0, 200);
        assert_eq!(status(None, [10, 0, 0, 7], "10.0.0.1:8080").await.0, 403, "another machine");
        assert_eq!(status(None, [127, 0, 0, 1], "rebound.example:8080").await.0, 403, "a rebound name");
        let (code, location) = status(Some("t0ken"), [10, 0, 0, 7], "images.example").await;
        assert_eq!(
            (code, location.as_deref()),
            (303, Some("/login?next=%2Ftasks%3Fstate%3Dfailed")),
            "with a token: log in first"
        );
    }

    #[test]
    fn only_loopback_names_pass() {
        let check = |host: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_static(host));
            host_is_loopback(&headers)
        };
        for host in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.9.9.9:80",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(check(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "10.0.0.1:8080",
            "localhost.evil.example",
            "[::2]:80",
            "127.0.0.1.nip.io",
        ] {
            assert!(!check(host), "{host}");
        }
        assert!(!host_is_loopback(&HeaderMap::new()));
    }
}
