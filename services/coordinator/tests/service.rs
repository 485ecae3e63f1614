//! The coordinator as its binary runs it ([`imagepipe_coordinator::serve`] on a started
//! [`Service`]): a client watching `/v1/events` does not hold a stopping coordinator up, and
//! never sees a task's `callbackUrl`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use imagepipe_runtime::http::testing;
use imagepipe_runtime::{Service, Settings, Shutdown};
use serde_json::{Value, json};

/// Settings of a coordinator on a free port, storing under `dir`.
fn settings(dir: &tempfile::TempDir) -> Settings {
    let mut settings = Settings::default();
    settings.http.port = 0;
    settings.store.path = dir.path().join("store");
    settings.blob.dir = dir.path().join("blobs");
    settings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_client_does_not_hold_a_stopping_coordinator_up() {
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(&dir);
    let service = Service::start_with("coordinator", settings, Shutdown::new()).await.unwrap();
    let addr = service.http_addr();
    let client = reqwest::Client::new();

    let watching = async {
        let served = testing::get_until(addr, "/v1/tasks", None, |a| a.status != 404).await;
        assert_eq!(served.status, 200, "{served:?}");
        let stream = client.get(format!("http://{addr}/v1/events")).send().await.unwrap();
        assert_eq!(stream.status(), 200);
        let stopping = Instant::now();
        service.shutdown.trigger();
        let ended = tokio::time::timeout(Duration::from_secs(3), stream.bytes()).await;
        assert!(ended.expect("the event stream ends on shutdown").is_ok());
        stopping
    };
    let (served, stopping) = tokio::join!(imagepipe_coordinator::serve(&service), watching);
    served.unwrap();
    service.stop().await.unwrap();
    // The HTTP server closes connections left open after 5 s; the stream ended on its own.
    assert!(stopping.elapsed() < Duration::from_secs(4), "stopped in {:?}", stopping.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_leaves_the_callback_url_out_and_the_task_shows_it_to_its_api_client() {
    const CALLBACK: &str = "https://hooks.example.com/imagepipe?token=s3cr3t";
    let dir = tempfile::tempdir().unwrap();
    let service = Service::start_with("coordinator", settings(&dir), Shutdown::new()).await.unwrap();
    let addr = service.http_addr();
    let client = reqwest::Client::new();

    let watching = async {
        // Ready once every consumer is open, the event fan-out's included.
        let ready = testing::get_until(addr, "/readyz", None, |a| a.status == 200).await;
        assert_eq!(ready.status, 200, "{ready:?}");
        let stream = client.get(format!("http://{addr}/v1/events?taskId=tsk_sse_callback")).send().await.unwrap();
        assert_eq!(stream.status(), 200);
        let submit =
            json!({"taskId": "tsk_sse_callback", "url": "https://example.com/cat.jpg", "callbackUrl": CALLBACK});
        let accepted = client.post(format!("http://{addr}/v1/tasks")).json(&submit).send().await.unwrap();
        assert_eq!(accepted.status(), 202);

        let mut stream = stream.bytes_stream();
        let mut text = String::new();
        while !text.contains("\n\n") {
            let chunk = tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap().unwrap();
            text.push_str(std::str::from_utf8(&chunk).unwrap());
        }
        assert!(text.starts_with("event: task.created\n"), "{text}");
        let data = text.lines().find_map(|line| line.strip_prefix("data: ")).expect("a data line");
        let event: Value = serde_json::from_str(data).unwrap();
        assert_eq!(event["payload"]["source"], json!({"url": "https://example.com/cat.jpg"}), "{event}");
        assert!(event["payload"].get("callbackUrl").is_none(), "{event}");
        assert!(!text.contains("hooks.example.com") && !text.contains("s3cr3t"), "{text}");

        // The API client that may submit and read the task sees where it will be notified.
        let task: Value =
            client.get(format!("http://{addr}/v1/tasks/tsk_sse_callback")).send().await.unwrap().json().await.unwrap();
        assert_eq!(task["callbackUrl"], CALLBACK, "{task}");
        service.shutdown.trigger();
    };
    let (served, ()) = tokio::join!(imagepipe_coordinator::serve(&service), watching);
    served.unwrap();
    service.stop().await.unwrap();
}
