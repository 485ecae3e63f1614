//! Who may see the dashboard, and what they may do there. With tokens set (`http.auth_token`,
//! `http.tokens`): a browser with a live session (others are sent to the login form), which may
//! do what its token's scope allows; the pages show only those buttons. Without a token: only
//! a client on loopback that also names a loopback host (so a web page whose own name was
//! pointed at 127.0.0.1 — DNS rebinding — cannot read it), with every button; everyone else is
//! told to set a token. This is the rule that keeps an unauthenticated server on loopback
//! (`http.bind`, [`peer`](imagepipe_runtime::http::peer)), applied to the person's browser.

use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Redirect, Response};
use imagepipe_runtime::http::Scope;
use imagepipe_runtime::http::peer::{Peer, host_is_loopback};

use super::Dashboard;
use super::layout;

/// The person looking at a page: the CSRF token their requests carry (none without a token
/// configured) and what they may do.
#[derive(Debug, Clone)]
pub struct Viewer {
    /// The session's CSRF token; `None` when no token is set.
    pub csrf: Option<String>,
    /// The scope of the token the session was opened with; `admin` without tokens.
    pub scope: Scope,
}

impl Viewer {
    /// Whether the viewer may do what `needed` allows (the page shows its buttons).
    pub fn may(&self, needed: Scope) -> bool {
        self.scope.allows(needed)
    }
}

impl FromRequestParts<Dashboard> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, dashboard: &Dashboard) -> Result<Self, Self::Rejection> {
        let access = dashboard.api.access();
        if access.is_open() {
            let peer = Peer::of(&parts.extensions).ip();
            return if peer.is_some_and(|ip| ip.is_loopback()) && host_is_loopback(&parts.headers) {
                Ok(Self { csrf: None, scope: Scope::Admin })
            } else {
                Err(loopback_only())
            };
        }
        match access.session(&parts.headers, dashboard.clock.unix_ms()) {
            Some((session, token)) => Ok(Self { csrf: Some(session.csrf_token().to_owned()), scope: token.scope }),
            None if parts.uri.path().starts_with("/partials/") => {
                Err((StatusCode::UNAUTHORIZED, "the session ended: log in again").into_response())
            }
            None => {
                let next = parts.uri.path_and_query().map_or("/", |p| p.as_str());
                let target = url::form_urlencoded::Serializer::new(String::new()).append_pair("next", next).finish();
                Err(Redirect::to(&format!("/login?{target}")).into_response())
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
                " (make one with " code { "openssl rand -hex 32" } ") to open it to others: they log in with the token."
            }
        },
    );
    (StatusCode::FORBIDDEN, body).into_response()
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::Arc;

    use axum::Router;
    use axum::body::Body;
    use axum::extract::{ConnectInfo, Request};
    use axum::http::header;
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
        let (code, location) =
            status(Some("dashboard-token-0123456789abcdef0123"), [10, 0, 0, 7], "images.example").await;
        assert_eq!(
            (code, location.as_deref()),
            (303, Some("/login?next=%2Ftasks%3Fstate%3Dfailed")),
            "with a token: log in first"
        );
    }

    #[tokio::test]
    async fn a_session_sees_only_the_buttons_its_scope_allows() {
        use imagepipe_runtime::config::{HttpConfig, ScopedToken};
        use imagepipe_runtime::http::Access;

        let (admin, reader) = ("admin-page-token-0123456789abcdef0123", "reader-page-token-0123456789abcdef012");
        let http = HttpConfig {
            auth_token: Some(admin.to_owned().into()),
            tokens: vec![ScopedToken { name: "viewer".into(), token: reader.to_owned().into(), scope: Scope::Read }],
            ..HttpConfig::default()
        };
        let api = ApiRoutes::with_access(Access::from_config(&http).unwrap());
        let router = Dashboard::new(api, &TelemetryConfig::default(), Arc::new(SystemClock)).router();
        let send = |request: Request| {
            let router = router.clone();
            async move {
                let mut request = request;
                request.extensions_mut().insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 40_000))));
                router.oneshot(request).await.unwrap()
            }
        };
        for (token, sees) in [(reader, false), (admin, true)] {
            let login = Request::post("/login").body(Body::from(format!("token={token}"))).unwrap();
            let answer = send(login).await;
            let cookie = answer.headers()[header::SET_COOKIE].to_str().unwrap().split(';').next().unwrap().to_owned();
            for (path, control) in [("/", "data-upload"), ("/tasks", "data-upload"), ("/dlq", "data-replay-filter")] {
                let page = send(Request::get(path).header(header::COOKIE, &cookie).body(Body::empty()).unwrap()).await;
                assert_eq!(page.status(), StatusCode::OK, "{path}");
                let page = axum::body::to_bytes(page.into_body(), 1 << 22).await.unwrap();
                let page = String::from_utf8_lossy(&page);
                assert_eq!(
                    page.contains(control),
                    sees,
                    "{path} for {}: {control}",
                    if sees { "admin" } else { "read" }
                );
            }
        }
    }
}
