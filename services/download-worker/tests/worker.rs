//! The download worker end to end on the memory bus: commands in on `tasks.download`, the
//! `image.downloaded` event and the step results out, a malformed command dead-lettered.

mod common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::*;
use imagepipe_blob::{BlobKey, BlobStore, LocalBlobStore};
use imagepipe_bus::{Bus, BusConfig, Consumer, ConsumerConfig, Message, Selector, Subscription};
use imagepipe_contracts::names::{self, headers, queues};
use imagepipe_contracts::payload::ImageDownloaded;
use imagepipe_contracts::{
    DownloadCommand, Event, EventType, ImageSource, Step, StepOutcome, StepOutput, StepResult, decode, event_id,
};
use imagepipe_download_worker::{client_builder, run_with_client};
use imagepipe_net::StaticResolver;
use imagepipe_net::testing::{FixtureServer, LoopbackOnly, Route};
use imagepipe_runtime::backoff::{ExponentialBackoff, Jitter};
use imagepipe_runtime::step::outgoing;
use imagepipe_runtime::{Settings, Shutdown};

/// Fetches (and acks) until `want` messages arrived; fails after 20 s.
async fn fetch_n(consumer: &dyn Consumer, want: usize, what: &str) -> Vec<Message> {
    let mut messages = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while messages.len() < want {
        assert!(tokio::time::Instant::now() < deadline, "{what}: {} of {want} within 20 s", messages.len());
        for delivery in consumer.fetch(want - messages.len(), Duration::from_millis(200)).await.unwrap() {
            messages.push(delivery.message.clone());
            delivery.ack().await.unwrap();
        }
    }
    messages
}

/// Every message `consumer` still holds (acked), once nothing can add more: the worker has
/// stopped, and the memory bus hands out at once what it holds.
async fn rest(consumer: &dyn Consumer) -> Vec<Message> {
    let mut messages = Vec::new();
    loop {
        let deliveries = consumer.fetch(16, Duration::from_millis(50)).await.unwrap();
        if deliveries.is_empty() {
            return messages;
        }
        for delivery in deliveries {
            messages.push(delivery.message.clone());
            delivery.ack().await.unwrap();
        }
    }
}

fn command(task_id: &str, attempt: u32, source: ImageSource) -> Message {
    let labels = BTreeMap::from([("album".to_owned(), "summer".to_owned())]);
    let command = DownloadCommand { task_id: task_id.into(), attempt, source, labels };
    outgoing(&command, task_id, format!("{task_id}:download:{attempt}"))
}

#[tokio::test]
async fn commands_become_events_and_step_results() {
    let jpeg = jpeg_with_exif_and_gps();
    let server = FixtureServer::start([
        ("/cat.jpg", Route::ok("application/octet-stream", jpeg.clone())),
        ("/busy.jpg", Route::with_headers(503, &[("Retry-After", "30")])),
        ("/fake.jpg", Route::ok("image/jpeg", "not a picture")),
        ("/jump", Route::redirect("http://cloud-metadata.test/latest/meta-data/")),
    ])
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let uploaded = LocalBlobStore::new(dir.path()).put(png_with_alpha().into()).await.unwrap();

    let mut settings = Settings::default();
    settings.blob.dir = dir.path().to_owned();
    settings.net.allow_cidrs = vec![LOOPBACK.into()];
    settings.worker.concurrency = 4;
    settings.validate().unwrap();
    let dial = LoopbackOnly::new();
    let resolver = StaticResolver::new()
        .with("images.test", [IpAddr::V4(Ipv4Addr::LOCALHOST)])
        // A host of its own: its 503 pauses it (per-host politeness), not the other tasks' host.
        .with("busy.test", [IpAddr::V4(Ipv4Addr::LOCALHOST)])
        .with("cloud-metadata.test", [IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254))]);
    let client = client_builder(&settings).unwrap().resolver(resolver).dial_check(dial.clone()).build().unwrap();

    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let events = bus.events.subscribe(Subscription::new("watch", Selector::all())).await.unwrap();
    let results_queue = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
    let dead_queue =
        bus.queues.consume(&names::dead_letter_queue(queues::DOWNLOAD), ConsumerConfig::default()).await.unwrap();
    let shutdown = Shutdown::new();
    let worker = tokio::spawn({
        let (bus, settings, shutdown) = (bus.clone(), settings.clone(), shutdown.clone());
        async move { run_with_client(bus, &settings, client, shutdown).await }
    });

    let port = server.addr().port();
    let commands = [
        command("tsk_ok", 2, ImageSource::Url(format!("http://images.test:{port}/cat.jpg"))),
        command("tsk_missing", 1, ImageSource::Url(server.url("/missing.jpg"))),
        command("tsk_busy", 1, ImageSource::Url(format!("http://busy.test:{port}/busy.jpg"))),
        command("tsk_text", 1, ImageSource::Url(server.url("/fake.jpg"))),
        command("tsk_ssrf", 1, ImageSource::Url(server.url("/jump"))),
        command("tsk_blob", 1, ImageSource::Blob(uploaded.to_string())),
    ];
    for message in commands {
        bus.queues.send(queues::DOWNLOAD, message).await.unwrap();
    }
    bus.queues.send(queues::DOWNLOAD, Message::new(&b"{\"taskId\": 7}"[..])).await.unwrap();

    // Six well-formed commands give six step results; the malformed one is dead-lettered. Once
    // all seven are seen the worker is stopped, so whatever else it sent is there to be counted.
    let mut results = fetch_n(&*results_queue, 6, "step results").await;
    let dead = fetch_n(&*dead_queue, 1, "dead letters").await;
    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(30), worker).await.unwrap().unwrap().unwrap();
    results.extend(rest(&*results_queue).await);
    assert_eq!(rest(&*dead_queue).await.len(), 0, "one dead letter, for the malformed command");
    let events: Vec<Message> = rest(&*events).await;

    assert_eq!(results.len(), 6, "one step result per command: {results:?}");
    let results: BTreeMap<String, StepResult> =
        results.iter().map(|m| decode::<StepResult>(&m.payload).unwrap()).map(|r| (r.task_id.clone(), r)).collect();
    assert_eq!(results.len(), 6, "one per task: {results:?}");
    assert!(results.values().all(|r| r.step == Step::Download));

    let StepOutcome::Ok { output: StepOutput::Download(image) } = &results["tsk_ok"].outcome else {
        panic!("tsk_ok: {:?}", results["tsk_ok"]);
    };
    assert_eq!(results["tsk_ok"].attempt, 2);
    assert_eq!((image.blob_key.as_str(), image.format.as_str()), (BlobKey::of(&jpeg).as_str(), "jpeg"));
    assert_eq!(image.final_url.as_deref(), Some(format!("http://images.test:{port}/cat.jpg").as_str()));
    let stored = LocalBlobStore::new(dir.path()).get(&BlobKey::of(&jpeg)).await.unwrap();
    assert_eq!(&stored[..], &jpeg[..], "the image is durable before it is reported");

    let permanent = |task: &str| match &results[task].outcome {
        StepOutcome::Permanent { error } => (error.code.clone(), error.message.clone()),
        other => panic!("{task}: {other:?}"),
    };
    assert_eq!(permanent("tsk_missing").0, "http_404");
    assert_eq!(permanent("tsk_text"), ("not_an_image".into(), "not an image (detected: text)".into()));
    let (code, message) = permanent("tsk_ssrf");
    assert_eq!(code, "address_refused");
    assert!(
        message.ends_with("add 169.254.169.254/32 to download.allow_cidrs (IMAGEPIPE_DOWNLOAD__ALLOW_CIDRS)"),
        "the refusal says the way out: {message}"
    );
    match &results["tsk_busy"].outcome {
        StepOutcome::Retryable { error, retry_after_ms } => {
            assert_eq!((error.code.as_str(), *retry_after_ms), ("http_503", Some(30_000)));
        }
        other => panic!("tsk_busy: {other:?}"),
    }
    assert!(matches!(&results["tsk_blob"].outcome,
        StepOutcome::Ok { output: StepOutput::Download(out) } if out.blob_key == uploaded.as_str() && out.final_url.is_none()));

    let mut events: Vec<Event<ImageDownloaded>> = events.iter().map(|m| decode(&m.payload).unwrap()).collect();
    events.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    assert_eq!(events.len(), 2, "one event per success, none for failures: {events:?}");
    let ok = &events[1];
    assert_eq!(ok.task_id.as_deref(), Some("tsk_ok"));
    assert_eq!(ok.event_id, event_id("tsk_ok", EventType::ImageDownloaded, 2));
    assert_eq!((ok.source.as_str(), ok.payload.image.clone()), ("download-worker", image.clone()));
    assert_eq!(ok.payload.labels["album"], "summer");
    assert_eq!(events[0].payload.image.format, "png");

    let reason = dead[0].headers.get(headers::DLQ_REASON).unwrap();
    assert!(reason.contains("taskId"), "{reason}");

    assert!(dial.violations().is_empty(), "{:?}", dial.violations());
}

/// A change to default settings.
type Change = fn(&mut Settings);

#[test]
fn download_settings_are_validated_by_key() {
    let cases: [(Change, &str); 11] = [
        (|s| s.download.max_bytes = 0, "download.max_bytes"),
        (|s| s.download.connect_timeout = Duration::ZERO, "download.connect_timeout"),
        (|s| s.download.connect_timeout = s.download.total_timeout * 2, "download.connect_timeout"),
        (|s| s.download.read_timeout = Duration::ZERO, "download.read_timeout"),
        (|s| s.download.read_timeout = s.download.total_timeout * 2, "download.read_timeout"),
        (|s| s.download.max_redirects = 21, "download.max_redirects"),
        (|s| s.download.user_agent = "bad\nagent".into(), "download.user_agent"),
        (|s| s.download.per_host.concurrency = 0, "download.per_host.concurrency"),
        (|s| s.download.per_host.rate = f64::INFINITY, "download.per_host.rate"),
        (|s| s.download.per_host.throttle_max = Duration::ZERO, "download.per_host.throttle_max"),
        (|s| s.download.per_host.lease = Some(s.download.total_timeout / 2), "download.per_host.lease"),
    ];
    for (change, key) in cases {
        let mut settings = Settings::default();
        change(&mut settings);
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains(key), "{key}: {error}");
    }
    let defaults = Settings::default().download;
    assert_eq!((defaults.max_bytes, defaults.max_redirects), (25 * 1024 * 1024, 5));
}

#[test]
fn a_bad_allowlist_stops_the_worker_before_it_starts() {
    let mut settings = Settings::default();
    settings.net.allow_cidrs = vec!["10.0.0.0/33".into()];
    let error = client_builder(&settings).unwrap_err();
    assert!(format!("{error:?}").contains("net.allow_cidrs[0]"), "{error:?}");

    settings.net.allow_cidrs.clear();
    settings.download.allow_cidrs = Some(vec!["10.0.0.0/8".into(), "::1/128".into(), "10.0.0.300/8".into()]);
    let error = client_builder(&settings).unwrap_err();
    assert!(format!("{error:?}").contains("download.allow_cidrs[2]"), "{error:?}");
}

#[tokio::test]
async fn download_allow_cidrs_replaces_net_allow_cidrs_for_downloads() {
    let server = FixtureServer::start([("/cat.jpg", Route::ok("image/jpeg", jpeg_with_exif_and_gps()))]).await.unwrap();
    let server = &server;
    let fetch = |settings: Settings| async move {
        let client = client_builder(&settings).unwrap().dial_check(LoopbackOnly::new()).build().unwrap();
        client.get(&server.url("/cat.jpg")).await.map(|r| r.status)
    };
    let mut settings = Settings::default();
    settings.net.allow_cidrs = vec![LOOPBACK.into()];
    assert_eq!(fetch(settings.clone()).await.unwrap(), 200, "unset: net.allow_cidrs applies");
    settings.download.allow_cidrs = Some(vec!["10.0.0.0/8".into()]);
    let error = fetch(settings.clone()).await.unwrap_err();
    assert!(error.to_string().contains("download.allow_cidrs"), "set: it replaces net.allow_cidrs: {error}");
    settings.net.allow_cidrs.clear();
    settings.download.allow_cidrs = Some(vec![LOOPBACK.into()]);
    assert_eq!(fetch(settings).await.unwrap(), 200);
}

/// The worst case of a task whose server drips its image a byte a second (or never answers),
/// with default settings: every download attempt runs to `download.total_timeout` (which
/// includes connecting, so `connect_timeout` adds nothing), and between attempts the
/// coordinator waits its retry backoff (full jitter: at most the un-jittered doubling) plus up to
/// one `coordinator.sweep_interval` before its timer is seen. It must end within two minutes.
#[test]
fn default_limits_end_a_dripping_or_silent_download_within_two_minutes() {
    let settings = Settings::default();
    let (download, coordinator) = (&settings.download, &settings.coordinator);
    assert!(download.connect_timeout <= download.total_timeout && download.read_timeout <= download.total_timeout);
    let cap =
        ExponentialBackoff::new(coordinator.retry_min_backoff, coordinator.retry_max_backoff, Jitter::None).unwrap();
    let attempts = coordinator.max_attempts;
    let downloading = download.total_timeout * attempts;
    let waiting: Duration = (0..attempts - 1).map(|retry| cap.delay(retry) + coordinator.sweep_interval).sum();
    let worst = downloading + waiting;
    assert!(
        worst <= Duration::from_secs(120),
        "{attempts} attempts × {:?} + {waiting:?} between them = {worst:?}, over two minutes",
        download.total_timeout
    );
}
