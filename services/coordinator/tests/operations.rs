//! The coordinator as an operator sees it: started before its Redis it waits (not ready)
//! instead of exiting, and its `/metrics` describe every family, carry the backlog gauges and
//! no label value that grows with every start.

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use imagepipe_bus::Message;
use imagepipe_contracts::names::queues;
use imagepipe_runtime::config::{SecretUrl, StoreKind};
use imagepipe_runtime::http::testing;
use imagepipe_runtime::{Service, Settings, Shutdown};
use tokio::time::Instant;

/// Settings of a coordinator on a free loopback port, storing under `dir`.
fn settings(dir: &tempfile::TempDir) -> Settings {
    let mut settings = Settings::default();
    settings.http.bind = Ipv4Addr::LOCALHOST.into();
    settings.http.port = 0;
    settings.store.path = dir.path().join("store");
    settings.blob.dir = dir.path().join("blobs");
    settings
}

/// A loopback port nothing listens on now.
fn spare_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap().local_addr().unwrap().port()
}

/// A redis-server of this test's own, stopped (by its process id) when dropped.
struct PrivateRedis(Child);

impl PrivateRedis {
    fn start(port: u16, dir: &std::path::Path) -> Self {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting redis-server (scripts/test.sh installs Redis)");
        Self(child)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_before_its_redis_the_coordinator_waits_unready_then_serves() {
    let dir = tempfile::tempdir().unwrap();
    let port = spare_port();
    let mut settings = settings(&dir);
    settings.store.kind = StoreKind::Redis;
    settings.store.redis.url = SecretUrl::new(format!("redis://127.0.0.1:{port}"));
    let service = Service::start_with("coordinator", settings, Shutdown::new()).await.unwrap();
    let addr = service.http_addr();
    let mut serving = Box::pin(imagepipe_coordinator::serve(&service));

    // Redis is down: once the coordinator tries it, it keeps retrying, unready, for as long as
    // we watch.
    let watched = async {
        let tried = testing::get_until(addr, "/readyz", None, |a| a.body.contains("store")).await;
        assert!(tried.body.contains("store"), "readiness names the store: {tried:?}");
        let until = Instant::now() + Duration::from_millis(1500);
        while Instant::now() < until {
            let ready = testing::get(addr, "/readyz").await;
            assert_eq!(ready.status, 503, "{ready:?}");
            assert!(ready.body.contains("store"), "readiness names the store: {}", ready.body);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        outcome = &mut serving => panic!("the coordinator stopped while Redis was down: {outcome:?}"),
        () = watched => {}
    }

    let _redis = PrivateRedis::start(port, dir.path());
    let became_ready = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = testing::get(addr, "/readyz").await;
            if ready.status == 200 {
                return;
            }
            assert!(Instant::now() < deadline, "not ready a minute after Redis started: {ready:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::select! {
        outcome = &mut serving => panic!("the coordinator stopped: {outcome:?}"),
        () = became_ready => {}
    }
    service.shutdown.trigger();
    serving.await.unwrap();
    service.stop().await.unwrap();
}

/// Whether `value` holds a UUID, with or without dashes (32 hex digits in a row once dashes
/// are dropped).
fn holds_a_uuid(value: &str) -> bool {
    let mut run = 0;
    for c in value.chars().filter(|c| *c != '-') {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 32 {
            return true;
        }
    }
    false
}

/// The label values of a sample line (`name{a="x",b="y"} 1`).
fn label_values(line: &str) -> Vec<&str> {
    let Some(labels) = line.split_once('{').and_then(|(_, rest)| rest.rsplit_once('}')).map(|(labels, _)| labels)
    else {
        return Vec::new();
    };
    labels.split("\",").filter_map(|pair| pair.split_once("=\"")).map(|(_, v)| v.trim_end_matches('"')).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_described_the_backlog_is_gauged_and_no_label_is_a_per_process_id() {
    assert!(holds_a_uuid("coordinator-sse-0b6c3f4e9a8d4c1f8e2a7b5d6c4e3f21"));
    assert!(holds_a_uuid("0b6c3f4e-9a8d-4c1f-8e2a-7b5d6c4e3f21"));
    assert!(!holds_a_uuid("coordinator-sse") && !holds_a_uuid("tasks.download"));
    assert_eq!(label_values(r#"m{source="a",outcome="b"} 1"#), ["a", "b"]);

    let dir = tempfile::tempdir().unwrap();
    let service = Service::start_with("coordinator", settings(&dir), Shutdown::new()).await.unwrap();
    let addr = service.http_addr();
    let checked = async {
        let ready = testing::get_until(addr, "/readyz", None, |a| a.status == 200).await;
        assert_eq!(ready.status, 200, "{ready:?}");
        // The event fan-out subscribes while a client watches; its answer comes once it has.
        let watching = reqwest::get(format!("http://{addr}/v1/events")).await.unwrap();
        assert_eq!(watching.status(), 200);
        let submit = r#"{"taskId":"tsk_metrics_1","url":"https://example.com/cat.jpg"}"#;
        service.bus.queues.send(queues::SUBMIT, Message::new(submit).with_key("tsk_metrics_1")).await.unwrap();

        // The event fan-out handled task.created, and the sampler ran since the queues exist.
        let wanted = [
            r#"imagepipe_messages_handled_total{source="coordinator-sse""#,
            r#"imagepipe_queue_depth{queue="tasks.download"} 1"#,
            r#"imagepipe_queue_consumer_lag{queue="tasks.submit"} 0"#,
            "imagepipe_coordinator_dead_letters 0",
        ];
        let deadline = Instant::now() + Duration::from_secs(20);
        let text = loop {
            let text = testing::get(addr, "/metrics").await.body;
            if wanted.iter().all(|w| text.contains(w)) {
                break text;
            }
            assert!(Instant::now() < deadline, "missing some of {wanted:?} in:\n{text}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };

        let families: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
        assert!(families.len() > 10, "{text}");
        for family in &families {
            assert!(text.contains(&format!("# HELP {family} ")), "{family} has no # HELP:\n{text}");
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            for value in label_values(line) {
                assert!(!holds_a_uuid(value), "unbounded label value {value:?} in {line}");
            }
        }
        drop(watching);
        service.shutdown.trigger();
    };
    let (served, ()) = tokio::join!(imagepipe_coordinator::serve(&service), checked);
    served.unwrap();
    service.stop().await.unwrap();
}
