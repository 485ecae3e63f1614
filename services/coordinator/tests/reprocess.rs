//! `POST /v1/reprocess` and `DELETE /v1/reprocess/{id}` over real HTTP on 127.0.0.1: one job
//! per selection, at most `coordinator.max_reprocess_jobs` at once, and cancelling.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use imagepipe_blob::LocalBlobStore;
use imagepipe_contracts::{Step, SubmitTask};
use imagepipe_coordinator::api;
use imagepipe_coordinator::engine::{Engine, Handled, Origin};
use imagepipe_coordinator::events::EventHub;
use imagepipe_coordinator::reprocess::Jobs;
use imagepipe_coordinator::store::embedded::EmbeddedStore;
use imagepipe_coordinator::{Input, TaskState};
use imagepipe_runtime::Shutdown;
use imagepipe_runtime::clock::ManualClock;
use imagepipe_runtime::http::{ApiRoutes, HealthServer, Readiness, UploadSlots};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Serves the API over a store holding one completed task and one running one, under an
/// in-flight cap of one: a job that matches the completed task waits for room until cancelled.
async fn serve(max_jobs: usize) -> (String, Engine, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let store = Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(10)).unwrap());
    let engine = engine(store, &bus, &clock, 1);
    let submit = |id: &str| SubmitTask { task_id: Some(id.into()), ..SubmitTask::url("https://example.com/a.jpg") };
    engine.submit(&submit("tsk_done"), Origin::Http, String::new).await.unwrap();
    engine.start_queued().await.unwrap();
    for step in Step::ALL {
        let handled = engine.handle("tsk_done", Input::Result(Box::new(ok("tsk_done", step, 1)))).await.unwrap();
        assert!(matches!(handled, Handled::Applied(_)));
    }
    engine.submit(&submit("tsk_running"), Origin::Http, String::new).await.unwrap();
    engine.start_queued().await.unwrap();
    assert_eq!(engine.store().get("tsk_running").await.unwrap().unwrap().state, TaskState::Downloading);

    let routes = ApiRoutes::new(None);
    let blobs = Arc::new(LocalBlobStore::new(dir.path().join("blobs")));
    let slots = UploadSlots::new(8, Duration::from_secs(2));
    routes.add(api::router(engine.clone(), EventHub::new(64, 2), blobs, 1024 * 1024, slots, Jobs::new(max_jobs)));
    let metrics = imagepipe_runtime::metrics::install().unwrap();
    let bound =
        HealthServer::new(Readiness::new(), metrics).api(routes).bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let base = format!("http://{}", bound.local_addr());
    tokio::spawn(bound.serve(Shutdown::new()));
    (base, engine, dir)
}

async fn call(base: &str, method: Method, path: &str, body: &str) -> (StatusCode, Value) {
    let mut request = reqwest::Client::new().request(method, format!("{base}{path}"));
    if !body.is_empty() {
        request = request.header("content-type", "application/json").body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap())
}

#[tokio::test]
async fn one_job_per_selection_a_cap_and_cancelling() {
    let (base, _engine, _dir) = serve(2).await;
    let all = r#"{"from":"analyze","select":"all"}"#;
    let (status, first) = call(&base, Method::POST, "/v1/reprocess", all).await;
    assert_eq!(
        (status, &first["created"], &first["status"]),
        (StatusCode::ACCEPTED, &Value::Bool(true), &"running".into())
    );
    let id = first["id"].as_str().unwrap().to_owned();

    // The same selection, written otherwise (defaults spelled out, keys reordered).
    let same = r#"{"priority":"low","filter":{},"select":"all","from":"analyze"}"#;
    let (status, again) = call(&base, Method::POST, "/v1/reprocess", same).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!((again["id"].as_str(), &again["created"]), (Some(id.as_str()), &Value::Bool(false)));

    let (status, second) = call(&base, Method::POST, "/v1/reprocess", r#"{"from":"metadata","select":"all"}"#).await;
    assert_eq!(status, StatusCode::ACCEPTED, "another selection: {second}");
    let (status, refused) =
        call(&base, Method::POST, "/v1/reprocess", r#"{"from":"analyze","select":"missing"}"#).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{refused}");
    assert!(refused["message"].as_str().unwrap().contains("coordinator.max_reprocess_jobs"), "{refused}");

    let (status, cancelled) = call(&base, Method::DELETE, &format!("/v1/reprocess/{id}"), "").await;
    assert_eq!((status, &cancelled["status"]), (StatusCode::ACCEPTED, &"cancelled".into()), "{cancelled}");
    let (status, kept) = call(&base, Method::GET, &format!("/v1/reprocess/{id}"), "").await;
    assert_eq!((status, &kept["status"]), (StatusCode::OK, &"cancelled".into()));
    assert_eq!(kept["queued"], 0, "it never had room to reprocess anything");
    let (status, twice) = call(&base, Method::DELETE, &format!("/v1/reprocess/{id}"), "").await;
    assert_eq!(status, StatusCode::CONFLICT, "{twice}");
    let (status, _) = call(&base, Method::DELETE, "/v1/reprocess/rp_unknown", "").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The cancelled job's place is free, and its selection may run again as a new job.
    let (status, restarted) = call(&base, Method::POST, "/v1/reprocess", all).await;
    assert_eq!((status, &restarted["created"]), (StatusCode::ACCEPTED, &Value::Bool(true)), "{restarted}");
    assert_ne!(restarted["id"].as_str(), Some(id.as_str()));
}
