//! The dashboard's stylesheet, script and icon, compiled into the binary. Pages link them with
//! a fingerprint (`/assets/app.js?v=<crc>`), so a browser keeps them for a year and fetches the
//! new ones after an upgrade.

use std::sync::LazyLock;

use axum::extract::{Path, Query};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The logo, inline in the navigation.
pub const LOGO: &str = r##"<svg viewBox="0 0 32 32" width="24" height="24" aria-hidden="true"><rect x="2" y="6" width="28" height="20" rx="3" fill="#2563eb"/><circle cx="11" cy="13" r="3" fill="#fff"/><path d="M5 24l8-8 5 5 4-4 7 7z" fill="#bfdbfe"/></svg>"##;

/// Each asset: name, content type, bytes.
const ASSETS: [(&str, &str, &str); 3] = [
    ("app.css", "text/css; charset=utf-8", include_str!("assets/app.css")),
    ("app.js", "text/javascript; charset=utf-8", include_str!("assets/app.js")),
    ("icon.svg", "image/svg+xml", LOGO),
];

/// The fingerprint of every asset together (CRC-32 of their bytes, hex).
static FINGERPRINT: LazyLock<String> = LazyLock::new(|| {
    let mut hasher = crc32fast::Hasher::new();
    for (_, _, body) in ASSETS {
        hasher.update(body.as_bytes());
    }
    format!("{:08x}", hasher.finalize())
});

/// The URL a page links asset `name` by.
pub fn url(name: &str) -> String {
    format!("/assets/{name}?v={}", *FINGERPRINT)
}

/// Query of an asset request.
#[derive(Debug, serde::Deserialize)]
pub struct AssetQuery {
    v: Option<String>,
}

/// `GET /assets/{name}`: the asset, cached for a year when asked for by the current
/// fingerprint, revalidated by its ETag otherwise.
pub async fn serve(Path(name): Path<String>, Query(query): Query<AssetQuery>, headers: HeaderMap) -> Response {
    let Some((_, content_type, body)) = ASSETS.into_iter().find(|(n, _, _)| *n == name) else {
        return (StatusCode::NOT_FOUND, "no such asset").into_response();
    };
    let etag = format!("\"{}\"", *FINGERPRINT);
    let cache = if query.v.as_deref() == Some(FINGERPRINT.as_str()) {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    if headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        return (StatusCode::NOT_MODIFIED, [(header::ETAG, etag)]).into_response();
    }
    (
        [
            (header::CONTENT_TYPE, content_type.to_owned()),
            (header::CACHE_CONTROL, cache.to_owned()),
            (header::ETAG, etag),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff".to_owned()),
        ],
        body,
    )
        .into_response()
}
