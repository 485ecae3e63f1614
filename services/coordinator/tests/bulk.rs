//! Batch submit (`POST /v1/tasks:batch`) and bulk dead-letter replay (`POST /v1/dlq/replay`)
//! over real HTTP on 127.0.0.1.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use imagepipe_blob::LocalBlobStore;
use imagepipe_contracts::Priority;
use imagepipe_contracts::names::queues;
use imagepipe_coordinator::api;
use imagepipe_coordinator::engine::Engine;
use imagepipe_coordinator::events::EventHub;
use imagepipe_coordinator::store::embedded::EmbeddedStore;
use imagepipe_coordinator::store::redis::RedisStore;
use imagepipe_coordinator::store::{DeadLetter, TaskStore};
use imagepipe_runtime::Shutdown;
use imagepipe_runtime::clock::ManualClock;
use imagepipe_runtime::http::{ApiRoutes, HealthServer, Readiness, testing};
use reqwest::StatusCode;
use serde_json::{Value, json};

struct Server {
    base: String,
    engine: Engine,
    bus: imagepipe_bus::Bus,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn serve_on(store: Arc<dyn TaskStore>, max_in_flight: u64) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(store, &bus, &clock, max_in_flight);
    let blobs = Arc::new(LocalBlobStore::new(dir.path().join("blobs")));
    let routes = ApiRoutes::new(None);
    let slots = imagepipe_runtime::http::UploadSlots::new(8, std::time::Duration::from_secs(2));
    routes.add(api::router(
        engine.clone(),
        EventHub::new(64, 2),
        blobs,
        1024 * 1024,
        slots,
        imagepipe_coordinator::reprocess::Jobs::new(4),
    ));
    let metrics = imagepipe_runtime::metrics::install().unwrap();
    let bound = HealthServer::new(Readiness::new(), metrics).api(routes).bind("127.0.0.1:0".parse().unwrap()).await;
    let bound = bound.unwrap();
    let base = format!("http://{}", bound.local_addr());
    tokio::spawn(bound.serve(Shutdown::new()));
    Server { base, engine, bus, client: reqwest::Client::new(), _dir: dir }
}

async fn serve(max_in_flight: u64) -> (Server, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(10)).unwrap());
    (serve_on(store, max_in_flight).await, dir)
}

impl Server {
    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.post_raw(path, &body.to_string()).await
    }

    async fn post_raw(&self, path: &str, body: &str) -> (StatusCode, Value) {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap())
    }

    async fn archived(&self) -> Vec<String> {
        let page = self.engine.store().dead_letters(500, None).await.unwrap();
        page.entries.into_iter().map(|l| l.id).collect()
    }
}

/// The `error.code` of a refused item, or `created` of an accepted one.
fn outcome(item: &Value) -> String {
    match item.get("error") {
        Some(error) => error["code"].as_str().unwrap().to_owned(),
        None => format!("created={}", item["created"]),
    }
}

#[tokio::test]
async fn a_batch_answers_every_item_in_order_and_a_bad_item_never_fails_the_others() {
    let (s, _store) = serve(100).await;
    s.post("/v1/tasks", &json!({"taskId": "tsk_old", "url": "https://example.com/old.jpg"})).await;
    s.post("/v1/tasks", &json!({"taskId": "tsk_same", "url": "https://example.com/same.jpg"})).await;
    let blob = format!("sha256:{}", "a".repeat(64));
    let batch = json!({"tasks": [
        {"taskId": "tsk_b0", "url": "https://example.com/0.jpg", "priority": "high"},
        {"url": "ftp://example.com/1.jpg"},
        {"url": "https://example.com/2.jpg", "blob": blob},
        {"taskId": "tsk_b0", "url": "https://example.com/3.jpg"},
        {"blob": blob, "idempotencyKey": "order-1", "labels": {"file": "4.jpg"}},
        5,
        {"url": "https://example.com/6.jpg", "task_id": "tsk_snake"},
        {"taskId": "tsk_old", "url": "https://example.com/other.jpg"},
        {"taskId": "tsk_same", "url": "https://example.com/same.jpg"},
        {"url": "https://example.com/9.jpg", "idempotencyKey": "order-1"},
        {"url": "https://example.com/10.jpg", "priority": "low"}
    ]});
    let (status, body) = s.post("/v1/tasks:batch", &batch).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let results = body["results"].as_array().unwrap();
    let outcomes: Vec<String> = results.iter().map(outcome).collect();
    assert_eq!(
        outcomes,
        [
            "created=true",
            "invalid_submit",
            "invalid_submit",
            "duplicate_in_batch",
            "created=true",
            "invalid_request",
            "invalid_request",
            "conflict",
            "created=false",
            "duplicate_in_batch",
            "created=true"
        ]
    );
    for (i, item) in results.iter().enumerate() {
        assert_eq!(item["index"], i, "{item}");
    }
    assert_eq!((body["accepted"].as_u64(), body["refused"].as_u64()), (Some(4), Some(7)));
    let message = |i: usize| results[i]["error"]["message"].as_str().unwrap().to_owned();
    assert!(message(1).contains("`url` must be an absolute http:// or https:// URL"), "{}", message(1));
    assert!(message(2).contains("not both"), "{}", message(2));
    assert!(message(3).contains("\"tsk_b0\" is item 0's too"), "{}", message(3));
    assert_eq!(message(5), "invalid SubmitTask: the body must be a JSON object");
    assert!(message(6).contains("unknown field `task_id`"), "{}", message(6));
    assert!(message(7).contains("tsk_old") && message(7).contains("another source"), "{}", message(7));
    assert!(message(9).contains("\"order-1\" is item 4's too"), "{}", message(9));
    assert_eq!(results[0]["taskId"], "tsk_b0");
    assert_eq!(results[0]["state"], "downloading", "started under the cap");
    assert_eq!(results[8]["taskId"], "tsk_same");

    let store = s.engine.store();
    assert_eq!(store.get("tsk_b0").await.unwrap().unwrap().priority, Priority::High);
    let low = results[10]["taskId"].as_str().unwrap();
    assert_eq!(store.get(low).await.unwrap().unwrap().priority, Priority::Low);
    let all = store.list(&imagepipe_coordinator::store::ListQuery { limit: 100, ..Default::default() }).await.unwrap();
    assert_eq!(all.tasks.len(), 5, "tsk_old, tsk_same and the three created");

    // The same idempotency key in a later batch (or a single submit) names the same task.
    let keyed = results[4]["taskId"].as_str().unwrap().to_owned();
    let again = json!({"tasks": [{"url": "https://example.com/elsewhere.jpg", "idempotencyKey": "order-1"}]});
    let (status, body) = s.post("/v1/tasks:batch", &again).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["results"][0], json!({"index": 0, "taskId": keyed, "state": "downloading", "created": false}));
}

#[tokio::test]
async fn a_batch_that_is_empty_too_long_or_not_a_batch_is_refused_whole() {
    let (s, _store) = serve(100).await;
    let item = json!({"url": "https://example.com/a.jpg"});
    let (status, body) = s.post("/v1/tasks:batch", &json!({"tasks": vec![item; 1001]})).await;
    assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_request")), "{body}");
    assert_eq!(body["message"], "`tasks` has 1001 submit commands; a batch takes at most 1000: split it");
    let (status, body) = s.post("/v1/tasks:batch", &json!({"tasks": []})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["message"].as_str().unwrap().contains("empty"), "{body}");
    for (bad, says) in [
        ("[]", "must be a JSON object"),
        ("{}", "missing field `tasks`"),
        (r#"{"tasks": {}}"#, "at `tasks`"),
        (r#"{"tasks": [], "dryRun": true}"#, "unknown field `dryRun`"),
        ("{not json", "BatchRequest"),
    ] {
        let (status, body) = s.post_raw("/v1/tasks:batch", bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body["message"].as_str().unwrap().contains(says), "{bad}: {body}");
    }
    let addr: std::net::SocketAddr = s.base.trim_start_matches("http://").parse().unwrap();
    let huge = vec![b' '; api::batch::BATCH_BODY_BYTES as usize + 1];
    let answer = testing::request_with_body(addr, "POST", "/v1/tasks:batch", None, &huge).await;
    assert_eq!(answer.status, 413);
    assert!(answer.body.contains("4194304 bytes"), "{}", answer.body);
    assert_eq!(s.engine.store().count_queued().await.unwrap(), 0, "nothing was created");
}

#[tokio::test]
async fn the_tasks_of_a_traced_batch_join_its_trace_and_an_untraced_batch_gives_each_its_own() {
    let provider = imagepipe_runtime::telemetry::tracer_provider("bulk-test", None).unwrap();
    let filter = imagepipe_runtime::telemetry::env_filter(None, "info").unwrap();
    let (subscriber, _telemetry) = imagepipe_runtime::telemetry::subscriber(
        imagepipe_runtime::config::LogFormat::Text,
        filter,
        provider,
        std::io::sink,
    );
    let _guard = tracing::subscriber::set_default(subscriber);
    let (s, _store) = serve(10).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let batch = json!({"tasks": [
        {"taskId": "tsk_t1", "url": "https://example.com/1.jpg"},
        {"taskId": "tsk_t2", "url": "https://example.com/2.jpg"}
    ]});
    let response = s
        .client
        .post(format!("{}/v1/tasks:batch", s.base))
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .body(batch.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let store = s.engine.store();
    for id in ["tsk_t1", "tsk_t2"] {
        assert_eq!(store.get(id).await.unwrap().unwrap().trace_id.to_string(), trace, "{id}");
    }
    let batch = json!({"tasks": [
        {"taskId": "tsk_u1", "url": "https://example.com/1.jpg"},
        {"taskId": "tsk_u2", "url": "https://example.com/2.jpg"}
    ]});
    s.post("/v1/tasks:batch", &batch).await;
    let (u1, u2) = (store.get("tsk_u1").await.unwrap().unwrap(), store.get("tsk_u2").await.unwrap().unwrap());
    assert_ne!(u1.trace_id, u2.trace_id, "a trace per task, as submitted alone");
    assert_ne!(u1.trace_id.to_string(), trace);
}

/// A batch of 1000 new tasks, timed (run with `--no-capture` to see the times), on the embedded
/// store and on Redis.
#[tokio::test]
async fn a_batch_of_1000_tasks_takes_a_few_store_round_trips() {
    let batch = json!({"tasks": (0..1000).map(|i| json!({
        "url": format!("https://example.com/{i}.jpg"),
        "labels": {"file": format!("{i}.jpg")}
    })).collect::<Vec<_>>()});
    let (embedded, _store) = serve(1_000).await;
    let prefix = unique_prefix("batch");
    let _cleanup = RedisCleanup(prefix.clone());
    let redis = serve_on(Arc::new(RedisStore::connect(REDIS, &prefix, Duration::from_secs(10)).await.unwrap()), 1_000);
    let redis = redis.await;
    for (name, s) in [("embedded", &embedded), ("redis", &redis)] {
        let started = Instant::now();
        let (status, body) = s.post("/v1/tasks:batch", &batch).await;
        let took = started.elapsed();
        println!("{name}: 1000 items in {took:?}");
        assert_eq!((status, body["accepted"].as_u64()), (StatusCode::OK, Some(1000)), "{name}");
        let states: Vec<&str> =
            body["results"].as_array().unwrap().iter().map(|r| r["state"].as_str().unwrap()).collect();
        assert!(states.iter().all(|s| *s == "downloading"), "{name}: every task started under the cap of 1000");
        assert_eq!(s.engine.in_flight().await.unwrap(), 1000, "{name}");
        assert!(took < Duration::from_secs(30), "{name}: {took:?}");
    }
}

const STUCK: &str = r#"{"taskId":"tsk_x","attempt":1}"#;

fn letter(id: &str, source: &str, reason: &str, at: u64) -> DeadLetter {
    DeadLetter {
        id: id.into(),
        source: source.into(),
        dlq: format!("dlq.{source}"),
        reason: reason.into(),
        delivery_count: 5,
        dead_lettered_at: at,
        key: Some(id.into()),
        message_id: Some(format!("m-{id}")),
        headers: vec![],
        body: STUCK.into(),
    }
}

/// a, b (a lane), c: timeouts of task queues; d: another reason; e: not from a task queue;
/// f: its body was cut. One second apart.
async fn archive(s: &Server) {
    let cut = format!("{{\"url\":\"{}\"}}", "a".repeat(70 * 1024));
    for letter in [
        letter("dl_a", queues::DOWNLOAD, "download timed out after 30 s (timeout)", T0),
        letter("dl_b", "tasks.download.high", "Timeout: no answer", T0 + 1_000),
        letter("dl_c", queues::METADATA, "deadline: timeout", T0 + 2_000),
        letter("dl_d", queues::DOWNLOAD, "http_404: gone", T0 + 3_000),
        letter("dl_e", "events.analytics", "timeout of the subscriber", T0 + 4_000),
        DeadLetter { body: cut, ..letter("dl_f", queues::DOWNLOAD, "timeout", T0 + 5_000) },
    ] {
        s.engine.store().put_dead_letter(&letter).await.unwrap();
    }
}

fn ids(value: &Value) -> Vec<&str> {
    value.as_array().unwrap().iter().map(|v| v.as_str().or_else(|| v["id"].as_str()).unwrap()).collect()
}

#[tokio::test]
async fn a_dry_run_counts_what_a_filter_matches_and_changes_nothing() {
    let (s, _store) = serve(10).await;
    archive(&s).await;
    let before = s.archived().await;
    let dry = |filter: Value| {
        let mut filter = filter;
        filter["dryRun"] = json!(true);
        let s = &s;
        async move {
            let (status, body) = s.post("/v1/dlq/replay", &filter).await;
            assert_eq!(status, StatusCode::OK, "{filter}: {body}");
            assert_eq!(body["dryRun"], true);
            assert!(body.get("replayed").is_none() && body.get("failed").is_none(), "{body}");
            body
        }
    };

    let body = dry(json!({"reasonContains": "TIMEOUT"})).await;
    assert_eq!((body["matched"].as_u64(), body["more"].as_bool()), (Some(3), Some(false)), "{body}");
    assert_eq!(ids(&body["sample"]), ["dl_a", "dl_b", "dl_c"]);
    assert_eq!(body["skipped"], 2);
    assert_eq!(ids(&body["skippedDetails"]), ["dl_e", "dl_f"]);
    assert!(body["skippedDetails"][0]["reason"].as_str().unwrap().contains("only task queues"), "{body}");
    assert!(body["skippedDetails"][1]["reason"].as_str().unwrap().contains("65536 bytes"), "{body}");

    // A queue by its short name takes its lanes; a lane by its full name only itself.
    let body = dry(json!({"queue": "download", "reasonContains": "timeout"})).await;
    assert_eq!(ids(&body["sample"]), ["dl_a", "dl_b"]);
    let body = dry(json!({"queue": "tasks.download.high"})).await;
    assert_eq!(ids(&body["sample"]), ["dl_b"]);
    let body = dry(json!({"queue": "tasks.download"})).await;
    assert_eq!(ids(&body["sample"]), ["dl_a", "dl_b", "dl_d"]);
    assert_eq!(ids(&body["skippedDetails"]), ["dl_f"]);

    // since is inclusive, until exclusive.
    let body = dry(json!({"since": T0 + 1_000, "until": T0 + 3_000})).await;
    assert_eq!(ids(&body["sample"]), ["dl_b", "dl_c"]);
    let body = dry(json!({"since": T0 + 3_000})).await;
    assert_eq!((ids(&body["sample"]), body["skipped"].as_u64()), (vec!["dl_d"], Some(2)));

    // max: the first ones, and `more` says there are others.
    let body = dry(json!({"all": true, "max": 2})).await;
    assert_eq!((ids(&body["sample"]), body["more"].as_bool()), (vec!["dl_a", "dl_b"], Some(true)));
    let body = dry(json!({"all": true, "max": 4})).await;
    assert_eq!((body["matched"].as_u64(), body["more"].as_bool()), (Some(4), Some(false)));

    assert_eq!(s.archived().await, before, "a dry run changes nothing");

    for (bad, says) in [
        (json!({}), "\"all\": true"),
        (json!({"dryRun": true, "max": 3}), "\"all\": true"),
        (json!({"all": false}), "\"all\": true"),
        (json!({"queue": "thumbnails"}), "no task queue"),
        (json!({"reasonContains": ""}), "must not be empty"),
        (json!({"all": true, "max": 0}), "`max` must be from 1 to 10000"),
        (json!({"all": true, "max": 10_001}), "`max` must be from 1 to 10000"),
        (json!({"since": T0, "until": T0}), "must be before"),
        (json!({"all": true, "queues": "ai"}), "unknown field `queues`"),
        (json!({"since": "1h"}), "at `since`"),
    ] {
        let (status, body) = s.post("/v1/dlq/replay", &bad).await;
        assert_eq!((status, body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_request")), "{bad}");
        assert!(body["message"].as_str().unwrap().contains(says), "{bad}: {body}");
    }
}

#[tokio::test]
async fn a_bulk_replay_sends_each_match_back_to_its_queue_or_lane_and_removes_it() {
    let (s, _store) = serve(10).await;
    archive(&s).await;
    let download = s.bus.queues.consume(queues::DOWNLOAD, consumer_config()).await.unwrap();
    let high = s.bus.queues.consume("tasks.download.high", consumer_config()).await.unwrap();
    let metadata = s.bus.queues.consume(queues::METADATA, consumer_config()).await.unwrap();

    let (status, body) = s.post("/v1/dlq/replay", &json!({"queue": "download", "reasonContains": "timeout"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({
            "matched": 2, "replayed": 2, "failed": [], "dryRun": false, "more": false,
            "skipped": 1, "skippedDetails": [body["skippedDetails"][0].clone()]
        })
    );
    assert_eq!(body["skippedDetails"][0]["id"], "dl_f");
    let sent = drain(download.as_ref()).await;
    assert_eq!(sent.len(), 1);
    assert_eq!((&sent[0].payload[..], sent[0].key.as_deref()), (STUCK.as_bytes(), Some("dl_a")));
    assert!(sent[0].id.as_deref().unwrap().starts_with("replay-"), "a new message id");
    let sent = drain(high.as_ref()).await;
    assert_eq!(sent.len(), 1, "the lane it was taken from");
    assert_eq!(s.archived().await, ["dl_c", "dl_d", "dl_e", "dl_f"]);

    // Everything else: what cannot be replayed stays, counted.
    let (status, body) = s.post("/v1/dlq/replay", &json!({"all": true, "max": 1})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["replayed"].as_u64(), body["more"].as_bool()), (Some(1), Some(true)));
    assert_eq!(drain(metadata.as_ref()).await.len(), 1);
    let (_, body) = s.post("/v1/dlq/replay", &json!({"all": true})).await;
    assert_eq!((body["replayed"].as_u64(), body["skipped"].as_u64()), (Some(1), Some(2)), "{body}");
    assert_eq!(drain(download.as_ref()).await.len(), 1, "dl_d");
    assert_eq!(s.archived().await, ["dl_e", "dl_f"]);
    let (_, body) = s.post("/v1/dlq/replay", &json!({"all": true})).await;
    assert_eq!((body["matched"].as_u64(), body["replayed"].as_u64()), (Some(0), Some(0)), "{body}");

    // The single route replays a lane's letter too (it shares the bulk route's core).
    s.engine.store().put_dead_letter(&letter("dl_low", "tasks.ai.low", "timeout", T0)).await.unwrap();
    let low = s.bus.queues.consume("tasks.ai.low", consumer_config()).await.unwrap();
    let (status, body) = s.post_raw("/v1/dlq/dl_low/replay", "").await;
    assert_eq!((status, body), (StatusCode::ACCEPTED, json!({"id": "dl_low", "queue": "tasks.ai.low"})));
    assert_eq!(drain(low.as_ref()).await.len(), 1);
}

#[tokio::test]
async fn the_openapi_document_describes_both_routes_strictly() {
    let (s, _store) = serve(10).await;
    let response = s.client.get(format!("{}/v1/openapi.json", s.base)).send().await.unwrap();
    let doc: Value = response.json().await.unwrap();
    let batch = &doc["paths"]["/v1/tasks:batch"]["post"];
    let request = &batch["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(request["additionalProperties"], false);
    assert_eq!(
        (request["properties"]["tasks"]["minItems"].as_u64(), request["properties"]["tasks"]["maxItems"].as_u64()),
        (Some(1), Some(1000))
    );
    for status in ["200", "400", "401", "413"] {
        assert!(batch["responses"].get(status).is_some(), "batch {status}");
    }
    let replay = &doc["paths"]["/v1/dlq/replay"]["post"];
    for status in ["200", "400", "401", "413"] {
        assert!(replay["responses"].get(status).is_some(), "replay {status}");
    }
    let filter = &doc["components"]["schemas"]["ReplayFilter"];
    assert_eq!(filter["additionalProperties"], false, "{filter}");
    assert_eq!(filter["anyOf"].as_array().unwrap().len(), 5, "{filter}");
    let queues = filter["properties"]["queue"]["enum"].to_string();
    assert!(queues.contains("\"download\"") && queues.contains("\"tasks.download.high\""), "{queues}");
    assert!(doc["components"]["schemas"]["BatchResponse"].is_object());
}
