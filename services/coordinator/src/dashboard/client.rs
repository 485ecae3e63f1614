//! The dashboard's way to the data: a request to the server's own `/v1` routes, handled in
//! process (no socket, no token check: the person was checked before the page), answered
//! exactly as a client of the API would be answered, forwarded routes included. Every such
//! request only reads, and goes as a caller of scope `read`.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use imagepipe_runtime::http::{Access, ApiError, ApiRoutes, Caller, Scope};
use serde::de::DeserializeOwned;

/// Largest answer the dashboard reads.
const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

/// `/v1` requests answered in process.
#[derive(Clone, Debug)]
pub struct ApiClient {
    routes: ApiRoutes,
}

impl ApiClient {
    /// A client of `routes`.
    pub fn new(routes: ApiRoutes) -> Self {
        Self { routes }
    }

    /// The tokens the API accepts and what the server remembers of their use.
    pub fn access(&self) -> &Access {
        self.routes.access()
    }

    /// `GET path_and_query`, its JSON answer read as `T`; an error answer as the [`ApiError`]
    /// it carries.
    pub async fn get<T: DeserializeOwned>(&self, path_and_query: impl AsRef<str>) -> Result<T, ApiError> {
        let path_and_query = path_and_query.as_ref();
        let request = Request::get(path_and_query)
            .header(header::ACCEPT, "application/json")
            .extension(Caller::new(Some("dashboard"), Scope::Read))
            .body(Body::empty())
            .map_err(|e| ApiError::invalid(format!("{path_and_query}: {e}")))?;
        let response = self.routes.call(request).await;
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES)
            .await
            .map_err(|e| ApiError::unavailable(format!("reading the answer of {path_and_query}: {e}")))?;
        if status.is_success() {
            serde_json::from_slice(&body).map_err(|e| {
                ApiError::new(StatusCode::BAD_GATEWAY, "bad_answer", format!("{path_and_query} answered: {e}"))
            })
        } else {
            let mut error = serde_json::from_slice::<ApiError>(&body).unwrap_or_else(|_| {
                ApiError::new(
                    status,
                    "unavailable",
                    String::from_utf8_lossy(&body).chars().take(300).collect::<String>(),
                )
            });
            error.status = status.as_u16();
            Err(error)
        }
    }
}
