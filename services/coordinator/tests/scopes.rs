//! Scoped tokens over real HTTP on 127.0.0.1: every operation of the OpenAPI document needs the
//! scope it declares, and a token below it is answered `403 forbidden` naming that scope; a
//! forwarded request goes on with the caller's scope, not the coordinator's admin token.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::get;
use common::*;
use imagepipe_blob::LocalBlobStore;
use imagepipe_coordinator::api;
use imagepipe_coordinator::api::forward::Forwarding;
use imagepipe_coordinator::events::EventHub;
use imagepipe_coordinator::store::embedded::EmbeddedStore;
use imagepipe_runtime::clock::ManualClock;
use imagepipe_runtime::config::{HttpConfig, ScopedToken};
use imagepipe_runtime::http::{Access, ApiRoutes, HealthServer, Readiness, Scope, UploadSlots};
use imagepipe_runtime::{Settings, Shutdown};
use reqwest::StatusCode;
use serde_json::Value;

/// Every operation of the OpenAPI document with the scope it needs; a route added without a
/// row here fails [`each_route_needs_its_scope`].
const SCOPES: &[(&str, &str, Scope)] = &[
    ("get", "/v1/tasks", Scope::Read),
    ("post", "/v1/tasks", Scope::Submit),
    ("post", "/v1/tasks:batch", Scope::Submit),
    ("get", "/v1/tasks/{id}", Scope::Read),
    ("get", "/v1/tasks/{id}/history", Scope::Read),
    ("post", "/v1/tasks/{id}/cancel", Scope::Operate),
    ("post", "/v1/tasks/{id}/pause", Scope::Operate),
    ("post", "/v1/tasks/{id}/resume", Scope::Operate),
    ("post", "/v1/tasks/{id}/retry", Scope::Operate),
    ("post", "/v1/reprocess", Scope::Operate),
    ("get", "/v1/reprocess/{id}", Scope::Read),
    ("delete", "/v1/reprocess/{id}", Scope::Operate),
    ("get", "/v1/queues", Scope::Read),
    ("get", "/v1/cluster", Scope::Read),
    ("post", "/v1/queues/{queue}/pause", Scope::Operate),
    ("post", "/v1/queues/{queue}/resume", Scope::Operate),
    ("put", "/v1/queues/{queue}/concurrency", Scope::Operate),
    ("get", "/v1/events", Scope::Read),
    ("get", "/v1/dlq", Scope::Read),
    ("delete", "/v1/dlq/{id}", Scope::Admin),
    ("post", "/v1/dlq/{id}/replay", Scope::Operate),
    ("post", "/v1/dlq/replay", Scope::Operate),
    ("get", "/v1/openapi.json", Scope::Read),
    ("post", "/v1/blobs", Scope::Submit),
    ("get", "/v1/blobs/{key}", Scope::Read),
    ("get", "/v1/search", Scope::Read),
    ("get", "/v1/stats", Scope::Read),
    ("get", "/v1/tasks/{id}/similar", Scope::Read),
    ("post", "/v1/search/similar", Scope::Read),
    ("get", "/v1/duplicates", Scope::Read),
    ("get", "/v1/similarity/rebuild", Scope::Read),
    ("post", "/v1/similarity/rebuild", Scope::Admin),
];

fn token(scope: Scope) -> String {
    format!("{scope}-token-0123456789abcdef0123456789")
}

/// An admin `http.auth_token` and a `read`, a `submit` and an `operate` token.
fn http() -> HttpConfig {
    HttpConfig {
        auth_token: Some(token(Scope::Admin).into()),
        tokens: [Scope::Read, Scope::Submit, Scope::Operate]
            .into_iter()
            .map(|scope| ScopedToken { name: scope.to_string(), token: token(scope).into(), scope })
            .collect(),
        ..HttpConfig::default()
    }
}

/// The coordinator's routes, forwarded ones included (to no target), behind an admin
/// `http.auth_token` and a `read`, a `submit` and an `operate` token; the base URL.
async fn serve(dir: &tempfile::TempDir) -> String {
    let http = http();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let store = Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(10)).unwrap());
    let engine = engine(store, &bus, &clock, 10);
    let blobs = Arc::new(LocalBlobStore::new(dir.path().join("blobs")));
    let routes = ApiRoutes::with_access(Access::from_config(&http).unwrap());
    let slots = UploadSlots::new(8, Duration::from_secs(2));
    routes.add(api::router(
        engine,
        EventHub::new(64, 64),
        blobs,
        1024 * 1024,
        slots,
        imagepipe_coordinator::reprocess::Jobs::new(4),
    ));
    routes.add(Forwarding::new(&Settings::default()).router(&[]));
    let metrics = imagepipe_runtime::metrics::install().unwrap();
    let server = HealthServer::new(Readiness::new(), metrics).api(routes);
    let bound = server.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = format!("http://{}", bound.local_addr());
    tokio::spawn(bound.serve(Shutdown::new()));
    base
}

#[tokio::test]
async fn each_route_needs_its_scope() {
    let dir = tempfile::tempdir().unwrap();
    let base = serve(&dir).await;
    let client = reqwest::Client::new();

    let doc = client.get(format!("{base}/v1/openapi.json")).bearer_auth(token(Scope::Read)).send().await.unwrap();
    let doc: Value = doc.json().await.unwrap();
    let mut documented: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| ops.as_object().unwrap().keys().map(move |method| (method.clone(), path.clone())))
        .collect();
    let mut declared: Vec<(String, String)> =
        SCOPES.iter().map(|(m, p, _)| ((*m).to_owned(), (*p).to_owned())).collect();
    documented.sort();
    declared.sort();
    assert_eq!(documented, declared, "every documented operation has its scope here");

    for &(method, path, needed) in SCOPES {
        let concrete =
            path.replace("{id}", "tsk_scope").replace("{queue}", "metadata").replace("{key}", "uploads/none.png");
        for held in Scope::ALL {
            let response = client
                .request(method.to_uppercase().parse().unwrap(), format!("{base}{concrete}"))
                .bearer_auth(token(held))
                .header("content-type", "application/json")
                .send()
                .await
                .unwrap();
            let status = response.status();
            let forbidden = status == StatusCode::FORBIDDEN;
            assert_eq!(forbidden, !held.allows(needed), "{method} {path} with a {held} token: {status}");
            if forbidden {
                let body: Value = response.json().await.unwrap();
                assert_eq!(body["error"], "forbidden", "{method} {path}");
                assert!(body["message"].as_str().unwrap().contains(&format!("scope {needed}")), "{body}");
            }
        }
    }
}

/// The routers serve each documented path with exactly its documented methods: any other is a
/// `405`, and none of the documented ones is (with the unit test that the document has every
/// operation of the route tables, a method served but not documented fails here).
#[tokio::test]
async fn each_documented_path_takes_exactly_its_documented_methods() {
    let dir = tempfile::tempdir().unwrap();
    let base = serve(&dir).await;
    let client = reqwest::Client::new();
    let doc = client.get(format!("{base}/v1/openapi.json")).bearer_auth(token(Scope::Read)).send().await.unwrap();
    let doc: Value = doc.json().await.unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        // One segment per parameter (a key with a `/` would match no route at all).
        let concrete = path.replace("{id}", "tsk_scope").replace("{queue}", "metadata").replace("{key}", "none.png");
        for method in ["get", "post", "put", "delete", "patch"] {
            let response = client
                .request(method.to_uppercase().parse().unwrap(), format!("{base}{concrete}"))
                .bearer_auth(token(Scope::Admin))
                .header("content-type", "application/json")
                .send()
                .await
                .unwrap();
            let status = response.status();
            let documented = item.get(method).is_some();
            assert_eq!(status == StatusCode::METHOD_NOT_ALLOWED, !documented, "{method} {path}: {status}");
        }
    }
}

/// The `Authorization` and `X-Imagepipe-Scope` headers an upstream saw, per request.
type SeenHeaders = Arc<Mutex<Vec<(Option<String>, Option<String>)>>>;

#[tokio::test]
async fn a_forwarded_request_carries_the_callers_scope() {
    let seen: SeenHeaders = Arc::default();
    let record = seen.clone();
    let upstream = Router::new().route(
        "/v1/search",
        get(move |headers: HeaderMap| {
            let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
            record.lock().unwrap().push((header("authorization"), header("x-imagepipe-scope")));
            async { "[]" }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, upstream).await.unwrap() });

    let mut settings = Settings { http: http(), ..Settings::default() };
    settings.coordinator.search_url = Some(upstream_url);
    let routes = ApiRoutes::with_access(Access::from_config(&settings.http).unwrap());
    routes.add(Forwarding::new(&settings).router(&[]));
    let metrics = imagepipe_runtime::metrics::install().unwrap();
    let bound = HealthServer::new(Readiness::new(), metrics).api(routes).bind("127.0.0.1:0".parse().unwrap()).await;
    let bound = bound.unwrap();
    let base = format!("http://{}", bound.local_addr());
    tokio::spawn(bound.serve(Shutdown::new()));

    let client = reqwest::Client::new();
    for held in [Scope::Read, Scope::Operate, Scope::Admin] {
        let answer = client.get(format!("{base}/v1/search?tags=cat")).bearer_auth(token(held)).send().await.unwrap();
        assert_eq!(answer.status(), StatusCode::OK, "{held}");
        let lowered = client
            .get(format!("{base}/v1/search?tags=cat"))
            .bearer_auth(token(held))
            .header("x-imagepipe-scope", "read");
        assert_eq!(lowered.send().await.unwrap().status(), StatusCode::OK);
    }
    let seen = seen.lock().unwrap().clone();
    let expected: Vec<(Option<String>, Option<String>)> = [Scope::Read, Scope::Operate, Scope::Admin]
        .into_iter()
        .flat_map(|held| {
            [
                (Some(format!("Bearer {}", token(held))), Some(held.to_string())),
                (Some(format!("Bearer {}", token(Scope::Read))), Some("read".to_owned())),
            ]
        })
        .collect();
    assert_eq!(seen, expected, "the token of the caller's scope, and the scope named");
}
