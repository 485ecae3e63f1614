//! The HTTP API over real HTTP on 127.0.0.1.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use imagepipe_blob::{BlobStore, LocalBlobStore};
use imagepipe_contracts::names::queues;
use imagepipe_coordinator::api;
use imagepipe_coordinator::engine::Engine;
use imagepipe_coordinator::events::{EventHub, HubEvent};
use imagepipe_coordinator::store::DeadLetter;
use imagepipe_coordinator::store::embedded::EmbeddedStore;
use imagepipe_runtime::Shutdown;
use imagepipe_runtime::clock::ManualClock;
use imagepipe_runtime::http::{ApiRoutes, HealthServer, Readiness, testing};
use reqwest::StatusCode;
use serde_json::{Value, json};

struct Server {
    base: String,
    engine: Engine,
    hub: EventHub,
    bus: imagepipe_bus::Bus,
    blobs: Arc<LocalBlobStore>,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn serve(max_in_flight: u64, token: Option<&str>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let store = Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(10)).unwrap());
    let engine = engine(store, &bus, &clock, max_in_flight);
    let hub = EventHub::new(64, 2);
    let blobs = Arc::new(LocalBlobStore::new(dir.path().join("blobs")));
    // Served through the runtime's HTTP edge, as every service serves its routes.
    let routes = ApiRoutes::new(token.map(|t| t.to_owned().into()));
    let slots = imagepipe_runtime::http::UploadSlots::new(8, Duration::from_secs(2));
    routes.add(api::router(
        engine.clone(),
        hub.clone(),
        blobs.clone(),
        1024 * 1024,
        slots,
        imagepipe_coordinator::reprocess::Jobs::new(4),
    ));
    let metrics = imagepipe_runtime::metrics::install().unwrap();
    let server = HealthServer::new(Readiness::new(), metrics).api(routes);
    let bound = server.bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = format!("http://{}", bound.local_addr());
    tokio::spawn(bound.serve(Shutdown::new()));
    Server { base, engine, hub, bus, blobs, client: reqwest::Client::new(), _dir: dir }
}

impl Server {
    async fn post(&self, path: &str, body: &str) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let (status, headers) = (response.status(), response.headers().clone());
        let text = response.text().await.unwrap();
        (status, headers, if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap() })
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self.client.get(format!("{}{path}", self.base)).send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }
}

#[tokio::test]
async fn submit_read_list_and_history() {
    let s = serve(10, None).await;
    let (status, headers, body) =
        s.post("/v1/tasks", r#"{"taskId":"tsk_api","url":"https://example.com/cat.jpg"}"#).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(headers["location"], "/v1/tasks/tsk_api");
    assert_eq!(body, json!({"taskId": "tsk_api", "state": "downloading", "created": true}));

    let (status, _, body) = s.post("/v1/tasks", r#"{"url":"https://example.com/b.jpg","idempotencyKey":"k-1"}"#).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let generated = body["taskId"].as_str().unwrap().to_owned();
    assert!(generated.starts_with("tsk_"));
    let (_, _, again) = s.post("/v1/tasks", r#"{"url":"https://example.com/other.jpg","idempotencyKey":"k-1"}"#).await;
    assert_eq!((again["taskId"].as_str(), again["created"].as_bool()), (Some(generated.as_str()), Some(false)));

    let (status, task) = s.get("/v1/tasks/tsk_api").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(task["state"], "downloading");
    assert_eq!(task["steps"]["download"]["attempts"], 1);
    assert_eq!(task["source"], json!({"url": "https://example.com/cat.jpg"}));

    let (status, history) = s.get("/v1/tasks/tsk_api/history").await;
    assert_eq!(status, StatusCode::OK);
    let events: Vec<_> = history["entries"].as_array().unwrap().iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(events, ["created", "started"]);
    assert!(history["entries"][0]["at"].as_u64().unwrap() >= T0);

    let (status, page) = s.get("/v1/tasks?status=downloading&limit=1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    let cursor = page["nextCursor"].as_str().unwrap().to_owned();
    let (_, rest) = s.get(&format!("/v1/tasks?status=downloading&limit=1&cursor={cursor}")).await;
    assert_eq!(rest["tasks"].as_array().unwrap().len(), 1);
    assert!(rest.get("nextCursor").is_none());
    let (_, all) = s.get("/v1/tasks").await;
    assert_eq!(all["tasks"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn list_takes_an_order_creation_times_and_a_label() {
    let s = serve(10, None).await;
    for (id, labels) in [
        ("tsk_list_a", r#"{"album":"summer"}"#),
        ("tsk_list_b", r#"{"album":"winter"}"#),
        ("tsk_list_c", r#"{"album":"summer","eq":"a=b"}"#),
    ] {
        let submit = format!(r#"{{"taskId":"{id}","url":"https://example.com/{id}.jpg","labels":{labels}}}"#);
        assert_eq!(s.post("/v1/tasks", &submit).await.0, StatusCode::ACCEPTED);
    }
    // Every task is created at T0 (the clock stands still): ties go by id.
    let list = |query: String| {
        let s = &s;
        async move {
            let (status, page) = s.get(&format!("/v1/tasks?{query}")).await;
            assert_eq!(status, StatusCode::OK, "{query}: {page}");
            let ids: Vec<String> =
                page["tasks"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect();
            (ids, page["nextCursor"].as_str().map(str::to_owned))
        }
    };
    let (a, b, c) = ("tsk_list_a", "tsk_list_b", "tsk_list_c");
    assert_eq!(list("order=newest".into()).await, (vec![c.into(), b.into(), a.into()], None));
    assert_eq!(list("order=oldest".into()).await.0, [a, b, c]);
    let (first, cursor) = list("order=newest&limit=2".into()).await;
    assert_eq!(first, [c, b]);
    let cursor = cursor.expect("a cursor");
    assert_eq!(list(format!("order=newest&limit=2&cursor={cursor}")).await, (vec![a.into()], None));
    assert_eq!(list(format!("limit=2&cursor={cursor}")).await.0, [c], "the other order goes on the other way");

    assert_eq!(list("label=album%3Dsummer&order=newest".into()).await, (vec![c.into(), a.into()], None));
    assert_eq!(list("label=eq%3Da%3Db".into()).await.0, [c], "split at the first =");
    assert_eq!(list("label=album%3D".into()).await, (vec![], None), "an empty value is a value");
    let t0 = T0;
    assert_eq!(list(format!("createdAfter={t0}")).await.0.len(), 3, "inclusive");
    assert_eq!(list(format!("createdAfter={}", t0 + 1)).await, (vec![], None));
    assert_eq!(list(format!("createdBefore={}", t0 + 1)).await.0.len(), 3);
    assert_eq!(list(format!("createdBefore={t0}")).await, (vec![], None), "exclusive");
    let combined =
        format!("status=downloading&order=newest&label=album%3Dsummer&createdAfter={t0}&createdBefore={}", t0 + 1);
    assert_eq!(list(combined).await.0, [c, a]);
    assert_eq!(list("status=&order=&label=&cursor=".into()).await.0, [a, b, c], "empty: absent, as a form sends it");

    let long_key = format!("label={}%3Dv", "k".repeat(65));
    let long_value = format!("label=k%3D{}", "v".repeat(1025));
    let bad = [
        ("order=up", "`order`"),
        ("order=NEWEST", "`order`"),
        ("createdAfter=yesterday", "`createdAfter`"),
        ("createdAfter=-1", "`createdAfter`"),
        ("createdAfter=%2B5", "`createdAfter`"),
        ("createdAfter=", "`createdAfter`"),
        ("createdBefore=1.5", "`createdBefore`"),
        ("createdBefore=18446744073709551616", "`createdBefore`"),
        ("createdAfter=5&createdBefore=5", "`createdAfter` (5) must be before `createdBefore` (5)"),
        ("createdAfter=6&createdBefore=5", "`createdAfter`"),
        ("label=album", "`label` must be `key=value`"),
        ("label=%3Dsummer", "`label` key"),
        (long_key.as_str(), "`label` key must be 1 to 64 bytes"),
        (long_value.as_str(), "`label` value must be at most 1024 bytes"),
        ("label=a%3D1&label=b%3D2", "label"),
    ];
    for (query, says) in bad {
        let (status, body) = s.get(&format!("/v1/tasks?{query}")).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_request")),
            "{query}: {body}"
        );
        assert!(body["message"].as_str().unwrap().contains(says), "{query}: {body}");
    }
    let ok = format!("createdAfter=0&createdBefore={}&label=k%3D{}", u64::MAX, "v".repeat(1024));
    assert_eq!(list(ok).await, (vec![], None), "the largest values are taken");
}

#[tokio::test]
async fn a_submitted_task_continues_the_trace_of_the_request() {
    let provider = imagepipe_runtime::telemetry::tracer_provider("api-test", None).unwrap();
    let filter = imagepipe_runtime::telemetry::env_filter(None, "info").unwrap();
    let (subscriber, _telemetry) = imagepipe_runtime::telemetry::subscriber(
        imagepipe_runtime::config::LogFormat::Text,
        filter,
        provider,
        std::io::sink,
    );
    let _guard = tracing::subscriber::set_default(subscriber);
    let s = serve(10, None).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let response = s
        .client
        .post(format!("{}/v1/tasks", s.base))
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .body(r#"{"taskId":"tsk_traced","url":"https://example.com/cat.jpg"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    let task = s.engine.store().get("tsk_traced").await.unwrap().unwrap();
    assert_eq!(task.trace_id.to_string(), trace);
    let (_, _, untraced) =
        s.post("/v1/tasks", r#"{"taskId":"tsk_untraced","url":"https://example.com/cat.jpg"}"#).await;
    assert_eq!(untraced["created"], true);
    assert_ne!(s.engine.store().get("tsk_untraced").await.unwrap().unwrap().trace_id.to_string(), trace);
}

#[tokio::test]
async fn invalid_input_gets_a_json_error_naming_the_problem() {
    let s = serve(10, None).await;
    let (status, _, body) = s.post("/v1/tasks", "{not json").await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_request")));
    let (status, _, body) = s.post("/v1/tasks", r#"{"url": 5}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"].as_str().unwrap().contains("url"), "{body}");
    let (status, _, body) = s.post("/v1/tasks", r#"{"task_id":"tsk_snake","url":"https://e.com/a.jpg"}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["message"].as_str().unwrap().contains("unknown field `task_id`"), "{body}");
    assert!(s.engine.store().get("tsk_snake").await.unwrap().is_none());

    let (status, _, _) = s.post("/v1/tasks", r#"{"taskId":"tsk_same","url":"https://e.com/a.jpg"}"#).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (status, _, body) = s.post("/v1/tasks", r#"{"taskId":"tsk_same","url":"https://e.com/a.jpg"}"#).await;
    assert_eq!((status, body["created"].as_bool()), (StatusCode::ACCEPTED, Some(false)), "the same submit again");
    let (status, headers, body) =
        s.post("/v1/tasks", r#"{"taskId":"tsk_same","url":"https://e.com/other.jpg?sig=secret"}"#).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::CONFLICT, Some("conflict")), "{body}");
    assert_eq!(headers["location"], "/v1/tasks/tsk_same");
    let message = body["message"].as_str().unwrap();
    assert!(message.contains("tsk_same") && message.contains("https://e.com/a.jpg"), "{message}");
    for (submit, says) in [
        (r#"{"labels":{}}"#.to_owned(), "`url` or `blob`"),
        (r#"{"url":"ftp://x/a.jpg"}"#.to_owned(), "http"),
        (r#"{"url":"http://user:secret@example.com/a.jpg"}"#.to_owned(), "user info"),
        (format!(r#"{{"url":"https://e.com/{}"}}"#, "a".repeat(2048)), "at most 2048 bytes"),
        (format!(r#"{{"url":"https://e.com/a","labels":{{"album":"{}"}}}}"#, "v".repeat(1025)), "label `album`"),
    ] {
        let (status, _, body) = s.post("/v1/tasks", &submit).await;
        assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_submit")), "{body}");
        let message = body["message"].as_str().unwrap();
        assert!(message.contains(says) && !message.contains("secret"), "{says}: {body}");
    }

    let (status, body) = s.get("/v1/tasks/tsk_nothing").await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
    let (status, body) = s.get("/v1/tasks/bad%20id").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let (status, body) = s.get("/v1/tasks?status=sleeping").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"].as_str().unwrap().contains("sleeping"));
    for bad in ["limit=0", "limit=501", "limit=ten", "cursor=nope"] {
        let (status, body) = s.get(&format!("/v1/tasks?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (status, body) = s.get("/v1/tasks/tsk_nothing/history").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let response = s.client.get(format!("{}/v1/events?type=Bad..Type", s.base)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let (status, body) = s.get("/v1/events?type=task.completed%20||%20bogus").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["message"].as_str().unwrap().contains("\"bogus\" matches no event type"), "{body}");
}

#[tokio::test]
async fn cancel_stops_a_queued_task_at_once_and_a_running_one_at_the_boundary() {
    let s = serve(1, None).await;
    s.post("/v1/tasks", r#"{"taskId":"tsk_run","url":"https://example.com/a.jpg"}"#).await;
    let (_, _, queued) = s.post("/v1/tasks", r#"{"taskId":"tsk_wait","url":"https://example.com/b.jpg"}"#).await;
    assert_eq!(queued["state"], "queued", "the cap of 1 keeps it queued");

    let (status, _, body) = s.post("/v1/tasks/tsk_wait/cancel", r#"{"reason":"not needed"}"#).await;
    assert_eq!((status, body["state"].as_str()), (StatusCode::ACCEPTED, Some("cancelled")));
    let (status, _, body) = s.post("/v1/tasks/tsk_wait/cancel", "").await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::CONFLICT, Some("conflict")));

    let (status, _, body) = s.post("/v1/tasks/tsk_run/cancel", "").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(body["state"], "downloading");
    assert!(body["cancelRequested"].is_object());
    let (status, _, _) = s.post("/v1/tasks/tsk_nobody/cancel", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) = s.post("/v1/tasks/tsk_run/cancel", r#"{"reason": 1}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_bearer_token_guards_every_v1_route() {
    let s = serve(10, Some("s3cret-0123456789abcdef0123456789ab")).await;
    let response = s.client.get(format!("{}/v1/tasks", s.base)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"], "unauthorized");
    let wrong = s.client.get(format!("{}/v1/tasks", s.base)).bearer_auth("nope").send().await.unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    let right = s
        .client
        .get(format!("{}/v1/tasks", s.base))
        .bearer_auth("s3cret-0123456789abcdef0123456789ab")
        .send()
        .await
        .unwrap();
    assert_eq!(right.status(), StatusCode::OK);

    for (method, path) in [("GET", "/v1/openapi.json"), ("POST", "/v1/blobs"), ("GET", "/v1/no-such-route")] {
        let request = s.client.request(method.parse().unwrap(), format!("{}{path}", s.base));
        assert_eq!(request.send().await.unwrap().status(), StatusCode::UNAUTHORIZED, "{method} {path}");
    }
    let response = s
        .client
        .get(format!("{}/v1/openapi.json", s.base))
        .bearer_auth("s3cret-0123456789abcdef0123456789ab")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let doc: Value = response.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/v1/tasks",
        "/v1/tasks/{id}",
        "/v1/tasks/{id}/history",
        "/v1/tasks/{id}/cancel",
        "/v1/events",
        "/v1/dlq",
        "/v1/dlq/{id}",
        "/v1/dlq/{id}/replay",
        "/v1/blobs",
        "/v1/blobs/{key}",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in ["SubmitTask", "TaskView", "TaskPage", "History", "DeadLetterListing"] {
        assert!(schemas.contains_key(name), "{name} missing: {:?}", schemas.keys().collect::<Vec<_>>());
    }
    assert!(doc["components"]["schemas"]["SubmitTask"]["properties"]["idempotencyKey"].is_object());
}

fn letter(id: &str, source: &str) -> DeadLetter {
    DeadLetter {
        id: id.into(),
        source: source.into(),
        dlq: format!("dlq.{source}"),
        reason: "invalid SubmitTask: expected value".into(),
        delivery_count: 1,
        dead_lettered_at: T0,
        key: Some("k".into()),
        message_id: Some("m".into()),
        headers: vec![("traceparent".into(), "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into())],
        body: r#"{"url":"https://example.com/fixed.jpg"}"#.into(),
    }
}

#[tokio::test]
async fn dead_letters_are_listed_replayed_and_purged() {
    let s = serve(10, None).await;
    let store = s.engine.store();
    store.put_dead_letter(&letter("dl_1", queues::SUBMIT)).await.unwrap();
    store.put_dead_letter(&letter("dl_2", "events.analytics")).await.unwrap();
    let (status, page) = s.get("/v1/dlq").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["entries"].as_array().unwrap().len(), 2);
    assert_eq!(page["entries"][0]["reason"], "invalid SubmitTask: expected value");

    let submits = s.bus.queues.consume(queues::SUBMIT, consumer_config()).await.unwrap();
    let (status, _, body) = s.post("/v1/dlq/dl_1/replay", "").await;
    assert_eq!((status, body["queue"].as_str()), (StatusCode::ACCEPTED, Some(queues::SUBMIT)));
    let replayed = drain(submits.as_ref()).await;
    assert_eq!(replayed.len(), 1);
    assert_eq!(&replayed[0].payload[..], br#"{"url":"https://example.com/fixed.jpg"}"#);
    assert!(replayed[0].headers.traceparent().is_some());
    let (status, _, _) = s.post("/v1/dlq/dl_1/replay", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "replayed entries leave the archive");
    let (status, _, body) = s.post("/v1/dlq/dl_2/replay", "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    let deleted = s.client.delete(format!("{}/v1/dlq/dl_2", s.base)).send().await.unwrap();
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let again = s.client.delete(format!("{}/v1/dlq/dl_2", s.base)).send().await.unwrap();
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
    let (_, page) = s.get("/v1/dlq").await;
    assert!(page["entries"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn a_dead_letter_whose_body_was_cut_is_not_replayed() {
    let s = serve(10, None).await;
    let long =
        DeadLetter { body: format!("{{\"url\":\"{}\"}}", "a".repeat(70 * 1024)), ..letter("dl_long", queues::SUBMIT) };
    s.engine.store().put_dead_letter(&long).await.unwrap();
    let (status, _, body) = s.post("/v1/dlq/dl_long/replay", "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body["message"].as_str().unwrap().contains("65536 bytes"), "{body}");
    let (_, page) = s.get("/v1/dlq").await;
    assert_eq!(page["entries"][0]["id"], "dl_long", "kept for inspection");
}

#[tokio::test]
async fn events_stream_as_sse_filtered_by_task_and_type() {
    let s = serve(10, None).await;
    let response = s
        .client
        .get(format!("{}/v1/events?taskId=tsk_mine&type=task.completed%20||%20task.failed", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let event = |id: &str, event_type: &str, task: &str| HubEvent {
        event_id: id.into(),
        event_type: event_type.into(),
        task_id: Some(task.into()),
        json: format!(r#"{{"eventId":"{id}","eventType":"{event_type}","taskId":"{task}"}}"#),
    };
    s.hub.send(event("e1", "task.completed", "tsk_other"));
    s.hub.send(event("e2", "task.created", "tsk_mine"));
    s.hub.send(event("e3", "task.completed", "tsk_mine"));
    let mut stream = response.bytes_stream();
    let mut text = String::new();
    while !text.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap().unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(text.contains("event: task.completed"), "{text}");
    assert!(text.contains("id: e3"), "{text}");
    assert!(!text.contains("e1") && !text.contains("e2"), "{text}");
}

/// Reads `stream` until it holds `events` SSE events (blank-line separated), or panics after 5 s.
async fn read_events(
    stream: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    events: usize,
) -> String {
    let mut text = String::new();
    while text.matches("\n\n").count() < events {
        let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap().unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    text
}

#[tokio::test]
async fn a_client_reconnecting_with_last_event_id_resumes_or_is_told_to_reload() {
    let s = serve(10, None).await;
    let event = |id: &str| HubEvent {
        event_id: id.into(),
        event_type: "task.created".into(),
        task_id: Some("tsk_r".into()),
        json: format!(r#"{{"eventId":"{id}"}}"#),
    };
    for id in ["e1", "e2", "e3"] {
        s.hub.send(event(id));
    }
    let open = |last: &str| s.client.get(format!("{}/v1/events", s.base)).header("Last-Event-ID", last).send();

    let resumed = open("e1").await.unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    let mut stream = resumed.bytes_stream();
    let replayed = read_events(&mut stream, 2).await;
    assert!(replayed.find("id: e2").unwrap() < replayed.find("id: e3").unwrap(), "{replayed}");
    assert!(!replayed.contains("id: e1"), "{replayed}");
    s.hub.send(event("e4"));
    let live = read_events(&mut stream, 1).await;
    assert!(live.contains("id: e4") && !live.contains("id: e3"), "then live, nothing twice: {live}");
    drop(stream);

    let unknown = open("e0-never-seen").await.unwrap();
    let mut stream = unknown.bytes_stream();
    let first = read_events(&mut stream, 1).await;
    assert!(first.starts_with("event: reset"), "{first}");
    drop(stream);

    let too_long = open(&"x".repeat(129)).await.unwrap();
    assert_eq!(too_long.status(), StatusCode::BAD_REQUEST);
    let body: Value = too_long.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("Last-Event-ID"), "{body}");
}

#[tokio::test]
async fn blobs_are_uploaded_and_read_back_through_the_coordinator() {
    let s = serve(10, None).await;
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89".to_vec();
    let response = s.client.post(format!("{}/v1/blobs", s.base)).body(png.clone()).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let location = response.headers()["location"].to_str().unwrap().to_owned();
    let uploaded: Value = response.json().await.unwrap();
    let key = uploaded["key"].as_str().unwrap();
    assert!(key.starts_with("sha256:"), "{uploaded}");
    assert_eq!(
        (location.as_str(), uploaded["size"].as_u64()),
        (format!("/v1/blobs/{key}").as_str(), Some(png.len() as u64))
    );

    let read = s.client.get(format!("{}{location}", s.base)).send().await.unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    assert_eq!(read.headers()["content-type"], "image/png");
    assert_eq!(read.headers()["x-content-type-options"], "nosniff");
    // Content-addressed, so immutable; behind the API's token, so for this client's cache only.
    assert_eq!(read.headers()["cache-control"], "private, max-age=31536000, immutable");
    assert_eq!(read.bytes().await.unwrap().as_ref(), png.as_slice());

    // Derivatives are served as what they are, whatever extension a client expects.
    for (bytes, content_type) in [
        (&b"RIFF\x1a\0\0\0WEBPVP8L\x0d\0\0\0\x2f\0\0\0\x10\x07\x10\x11\x11\x88\x88\xfe\x07\0"[..], "image/webp"),
        (&b"\0\0\0\x18ftypheic\0\0\0\0mif1heic"[..], "image/heic"),
        (&b"\xff\xd8\xff\xe0\0\x10JFIF\0"[..], "image/jpeg"),
    ] {
        let key = imagepipe_blob::BlobKey::of(bytes);
        s.blobs.put(bytes::Bytes::copy_from_slice(bytes)).await.unwrap();
        let read = s.client.get(format!("{}/v1/blobs/{key}", s.base)).send().await.unwrap();
        assert_eq!(read.headers()["content-type"], content_type);
    }

    let empty = s.client.post(format!("{}/v1/blobs", s.base)).send().await.unwrap();
    assert_eq!(empty.status(), StatusCode::BAD_REQUEST);
    for (not_an_image, says) in [(&b"%PDF-1.7 ..."[..], "pdf"), (b"<html><body>hi</body></html>", "html")] {
        let refused = s.client.post(format!("{}/v1/blobs", s.base)).body(not_an_image).send().await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["error"], "unsupported_media_type");
        assert!(body["message"].as_str().unwrap().contains(says), "{body}");
    }
    let (status, body) = s.get("/v1/blobs/not-a-key").await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_request")));
    let missing = format!("/v1/blobs/sha256:{}", "0".repeat(64));
    let (status, body) = s.get(&missing).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
}

#[tokio::test]
async fn event_streams_are_capped_and_end_when_the_hub_closes() {
    let s = serve(10, None).await;
    let open = || s.client.get(format!("{}/v1/events", s.base)).send();
    let first = open().await.unwrap();
    let second = open().await.unwrap();
    assert_eq!((first.status(), second.status()), (StatusCode::OK, StatusCode::OK));
    let refused = open().await.unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE, "the hub allows two clients");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"], "too_many_clients");
    assert!(body["message"].as_str().unwrap().contains("http.max_sse_clients"), "{body}");

    drop(second);
    let mut third = None;
    for _ in 0..100 {
        let response = open().await.unwrap();
        if response.status() == StatusCode::OK {
            third = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let third = third.expect("a closed stream frees its slot");

    s.hub.close();
    for response in [first, third] {
        let ended = tokio::time::timeout(Duration::from_secs(5), response.bytes()).await;
        assert!(ended.expect("the stream ends once the hub closes").is_ok());
    }
}

#[tokio::test]
async fn bodies_over_their_limit_unknown_routes_wrong_methods_and_arrays_are_json_errors() {
    let s = serve(10, None).await;
    let addr: std::net::SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();
    let json = |answer: &testing::Answer| -> Value {
        assert!(answer.head.contains("content-type: application/json"), "{}", answer.head);
        serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
    };

    let submit = vec![b' '; api::JSON_BODY_BYTES as usize + 1];
    let answer = testing::request_with_body(addr, "POST", "/v1/tasks", None, &submit).await;
    assert_eq!(answer.status, 413);
    let body = json(&answer);
    assert_eq!(body["error"], "too_large");
    assert_eq!(body["message"], format!("the body is larger than the {} bytes this route takes", api::JSON_BODY_BYTES));
    let upload = vec![0u8; 1024 * 1024 + 1];
    let answer = testing::request_with_body(addr, "POST", "/v1/blobs", None, &upload).await;
    assert_eq!(answer.status, 413);
    assert_eq!(
        json(&answer)["message"],
        "the body is larger than the 1048576 bytes this route takes (download.max_bytes)"
    );

    let answer = testing::get(addr, "/v1/nothing/here").await;
    assert_eq!((answer.status, json(&answer)["error"].as_str()), (404, Some("not_found")));
    let answer = testing::request(addr, "DELETE", "/v1/tasks", None).await;
    assert_eq!((answer.status, json(&answer)["error"].as_str()), (405, Some("method_not_allowed")));
    assert!(answer.head.contains("allow: "), "{}", answer.head);

    // serde alone reads an array as a struct's fields in order: the API takes objects only.
    let (status, _, body) = s.post("/v1/tasks", r#"[null, "https://e.com/a.jpg"]"#).await;
    assert_eq!(
        (status, body["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid SubmitTask: the body must be a JSON object"))
    );
    s.post("/v1/tasks", r#"{"taskId":"tsk_array","url":"https://e.com/a.jpg"}"#).await;
    let (status, _, body) = s.post("/v1/tasks/tsk_array/cancel", "[]").await;
    assert_eq!(
        (status, body["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid CancelRequest: the body must be a JSON object"))
    );
}
