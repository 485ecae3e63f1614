//! The coordinator as its binary runs it ([`imagepipe_coordinator::serve`] on a started
//! [`Service`]): a client watching `/v1/events` does not hold a stopping coordinator up.

use std::time::{Duration, Instant};

use imagepipe_runtime::http::testing;
use imagepipe_runtime::{Service, Settings, Shutdown};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_client_does_not_hold_a_stopping_coordinator_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.http.port = 0;
    settings.store.path = dir.path().join("store");
    settings.blob.dir = dir.path().join("blobs");
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
