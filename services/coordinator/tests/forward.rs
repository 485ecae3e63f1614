//! The coordinator as the front door, over real HTTP on 127.0.0.1: a forwarded route reaches
//! its service with the request as sent and the coordinator's token, the answer comes back as
//! given (a redirect unfollowed), and an unset or unreachable service is a JSON error naming
//! the key that points at it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use imagepipe_coordinator::api::forward::{Forwarding, Upstream};
use imagepipe_runtime::Settings;
use imagepipe_runtime::Shutdown;
use imagepipe_runtime::http::{ApiRoutes, HealthServer, Readiness};
use serde_json::{Value, json};

const TOKEN: &str = "front-d00r-0123456789abcdef0123456789";

/// Serves `router` on a free loopback port; its base URL.
async fn start(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    format!("http://{addr}")
}

/// What the fake service saw of each request.
type Seen = Arc<Mutex<Vec<Value>>>;

/// A stand-in for the tag indexer, analytics and similarity services: records each request and
/// answers with a header the coordinator should pass back and one it should not.
async fn service(seen: Seen) -> String {
    let record = move |request: Request| {
        let seen = seen.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap();
            let header = |name: &str| parts.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
            seen.lock().unwrap().push(json!({
                "method": parts.method.as_str(),
                "uri": parts.uri.to_string(),
                "authorization": header("authorization"),
                "traceparent": header("traceparent"),
                "contentType": header("content-type"),
                "cookie": header("cookie"),
                "body": String::from_utf8_lossy(&body),
            }));
            let mut headers = HeaderMap::new();
            headers.insert(header::CACHE_CONTROL, "no-store".parse().unwrap());
            headers.insert("x-internal", "not for clients".parse().unwrap());
            (StatusCode::CREATED, headers, axum::Json(json!({ "served": parts.uri.path() })))
        }
    };
    let router =
        Router::new().route("/v1/search", get(record.clone())).route("/v1/search/similar", post(record)).route(
            "/v1/stats",
            get(|| async { (StatusCode::FOUND, [(header::LOCATION, "/v1/elsewhere")]).into_response() }),
        );
    start(router).await
}

/// A front door with `settings`' forwarding (a token set), besides the local routes `local`
/// of the upstreams `served_here`.
async fn front_door(mut settings: Settings, served_here: &[Upstream], local: Router) -> SocketAddr {
    settings.http.auth_token = Some(TOKEN.to_owned().into());
    let routes = ApiRoutes::new(settings.http.auth_token.clone());
    routes.add(local);
    routes.add(Forwarding::new(&settings).router(served_here));
    let metrics = imagepipe_runtime::metrics::install().unwrap();
    let bound = HealthServer::new(Readiness::new(), metrics).api(routes).bind("127.0.0.1:0".parse().unwrap()).await;
    let bound = bound.unwrap();
    let addr = bound.local_addr();
    tokio::spawn(bound.serve(Shutdown::new()));
    addr
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// A loopback URL nothing listens on.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", listener.local_addr().unwrap())
}

#[tokio::test]
async fn a_forwarded_request_reaches_its_service_as_sent_and_its_answer_comes_back() {
    let seen = Seen::default();
    let url = service(seen.clone()).await;
    let mut settings = Settings::default();
    settings.coordinator.search_url = Some(format!("{url}/"));
    settings.coordinator.similarity_url = Some(url.clone());
    settings.coordinator.stats_url = Some(url);
    let addr = front_door(settings, &[], Router::new()).await;
    let base = format!("http://{addr}");

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let answer = client()
        .get(format!("{base}/v1/search?tags=cat,animal&mode=any"))
        .bearer_auth(TOKEN)
        .header("traceparent", traceparent)
        .header("cookie", "session=not-forwarded")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED, "the service's status");
    assert_eq!(answer.headers()["cache-control"], "no-store");
    assert!(answer.headers().get("x-internal").is_none(), "only the headers that describe the answer");
    assert_eq!(answer.json::<Value>().await.unwrap(), json!({ "served": "/v1/search" }));

    let body = r#"{"blob":"sha256:00"}"#;
    let answer = client()
        .post(format!("{base}/v1/search/similar"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);

    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            json!({ "method": "GET", "uri": "/v1/search?tags=cat,animal&mode=any",
                    "authorization": format!("Bearer {TOKEN}"), "traceparent": traceparent,
                    "contentType": null, "cookie": null, "body": "" }),
            json!({ "method": "POST", "uri": "/v1/search/similar", "authorization": format!("Bearer {TOKEN}"),
                    "traceparent": null, "contentType": "application/json", "cookie": null, "body": body }),
        ]
    );

    let answer = client().get(format!("{base}/v1/stats")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::FOUND, "a redirect comes back, unfollowed");
    assert_eq!(answer.headers()["location"], "/v1/elsewhere");

    let answer = client().get(format!("{base}/v1/search?tags=cat")).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::UNAUTHORIZED, "the front door checks the token itself");
}

#[tokio::test]
async fn an_unset_or_unreachable_service_is_an_error_naming_its_key() {
    let down = closed_port_url();
    let mut settings = Settings::default();
    settings.coordinator.stats_url = Some(down.clone());
    let addr = front_door(settings, &[], Router::new()).await;
    let get = |path: &str| {
        let url = format!("http://{addr}{path}");
        async move {
            let answer = client().get(url).bearer_auth(TOKEN).send().await.unwrap();
            let status = answer.status();
            (status, answer.json::<Value>().await.unwrap())
        }
    };

    let (status, body) = get("/v1/search?tags=cat").await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::NOT_FOUND, Some("not_configured")), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("coordinator.search_url (IMAGEPIPE_COORDINATOR__SEARCH_URL)"), "{message}");
    assert!(message.contains("the tag indexer"), "{message}");

    let (status, body) = get("/v1/stats").await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_GATEWAY, Some("bad_gateway")), "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(message.starts_with("the analytics worker could not be reached"), "{message}");
    assert!(message.ends_with(&format!("(coordinator.stats_url = {down})")), "{message}");
}

#[tokio::test]
async fn routes_served_here_are_not_forwarded() {
    let mut settings = Settings::default();
    settings.coordinator.search_url = Some(closed_port_url());
    let local = Router::new().route("/v1/search", get(|body: Bytes| async move { format!("local {}", body.len()) }));
    // Two routers claiming /v1/search would panic here.
    let addr = front_door(settings, &[Upstream::Search], local).await;
    let answer = client().get(format!("http://{addr}/v1/search?tags=cat")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!((answer.status(), answer.text().await.unwrap()), (StatusCode::OK, "local 0".to_owned()));
    let answer = client().get(format!("http://{addr}/v1/duplicates")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(answer.status(), StatusCode::NOT_FOUND, "what is not served here is still forwarded (unset: 404)");
}
