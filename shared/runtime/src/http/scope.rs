//! What a caller may do: the [`Caller`] the token check found (its token's name and
//! [`Scope`]), put in every request's extensions, and the scope each route declares with
//! [`require`] where it is defined. A caller below the scope a route needs is answered
//! `403 forbidden` naming the scope; so is a request that reached a route without a caller (one
//! that did not come through the token check).
//!
//! A request may lower its own scope with [`SCOPE_HEADER`] (never raise it): the coordinator
//! forwards a caller's request to another service with the caller's scope in it.

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;

pub use crate::config::Scope;

use super::ApiError;

/// Request header that lowers a request's scope (`read`, `submit`, `operate`, `admin`).
pub const SCOPE_HEADER: &str = "x-imagepipe-scope";

/// Who sent a request, as the token check found: its token's name and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name (`auth_token`, an `http.tokens` name), `None` without tokens.
    pub name: Option<String>,
    /// What the caller may do.
    pub scope: Scope,
}

impl Caller {
    /// A caller holding `scope` under the token `name`.
    pub fn new(name: Option<&str>, scope: Scope) -> Self {
        Self { name: name.map(str::to_owned), scope }
    }

    /// The same caller lowered to the scope the request's [`SCOPE_HEADER`] names, if any;
    /// `400 invalid_request` for a value that is no scope.
    #[expect(clippy::result_large_err, reason = "the error is the answer, built once per refused request")]
    pub fn lowered_by(self, headers: &HeaderMap) -> Result<Self, Response> {
        let Some(value) = headers.get(SCOPE_HEADER) else { return Ok(self) };
        let asked = value.to_str().ok().and_then(|v| v.parse::<Scope>().ok()).ok_or_else(|| {
            ApiError::invalid(format!("{SCOPE_HEADER}: {value:?} is not read, submit, operate or admin"))
                .into_response()
        })?;
        Ok(Self { scope: self.scope.min(asked), ..self })
    }

    /// The header value that passes this caller's scope on ([`SCOPE_HEADER`]).
    pub fn scope_header(&self) -> HeaderValue {
        HeaderValue::from_static(self.scope.as_str())
    }
}

/// `403 forbidden`: the caller's scope is below what the route needs.
pub fn forbidden(needed: Scope, held: Option<Scope>) -> ApiError {
    let held = held.map_or_else(|| "no token check".to_owned(), |held| format!("a {held} token"));
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!("this needs a token of scope {needed} or higher ({held} was given)"),
    )
}

/// `route` answered only for callers whose scope allows `needed` (see the module docs).
pub fn require<S: Clone + Send + Sync + 'static>(needed: Scope, route: MethodRouter<S>) -> MethodRouter<S> {
    route.route_layer(axum::middleware::from_fn(move |request: Request, next: Next| async move {
        match request.extensions().get::<Caller>().map(|caller| caller.scope) {
            Some(held) if held.allows(needed) => next.run(request).await,
            held => forbidden(needed, held).into_response(),
        }
    }))
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::Body;
    use axum::routing::{get, post};
    use tower::ServiceExt as _;

    use super::*;

    async fn status(router: &Router, method: &str, caller: Option<Scope>) -> (u16, String) {
        let mut request = Request::builder().method(method).uri("/thing").body(Body::empty()).unwrap();
        if let Some(scope) = caller {
            request.extensions_mut().insert(Caller::new(Some("t"), scope));
        }
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 4096).await.unwrap();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn each_method_needs_the_scope_its_route_declares() {
        let thing =
            require(Scope::Read, get(|| async { "read" })).merge(require(Scope::Operate, post(|| async { "op" })));
        let router = Router::new().route("/thing", thing);
        assert_eq!(status(&router, "GET", Some(Scope::Read)).await.0, 200);
        let (code, body) = status(&router, "POST", Some(Scope::Submit)).await;
        assert_eq!(code, 403);
        assert!(body.contains(r#""error":"forbidden""#) && body.contains("scope operate"), "{body}");
        assert_eq!(status(&router, "POST", Some(Scope::Operate)).await.0, 200);
        assert_eq!(status(&router, "POST", Some(Scope::Admin)).await.0, 200);
        assert_eq!(status(&router, "GET", None).await.0, 403, "no caller, no answer");
    }

    #[test]
    fn the_scope_header_only_lowers() {
        let mut headers = HeaderMap::new();
        headers.insert(SCOPE_HEADER, HeaderValue::from_static("read"));
        assert_eq!(Caller::new(None, Scope::Admin).lowered_by(&headers).unwrap().scope, Scope::Read);
        headers.insert(SCOPE_HEADER, HeaderValue::from_static("admin"));
        assert_eq!(Caller::new(None, Scope::Submit).lowered_by(&headers).unwrap().scope, Scope::Submit);
        headers.insert(SCOPE_HEADER, HeaderValue::from_static("root"));
        assert_eq!(Caller::new(None, Scope::Admin).lowered_by(&headers).unwrap_err().status(), StatusCode::BAD_REQUEST);
    }
}
