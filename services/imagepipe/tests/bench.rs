//! `imagepipe bench` on small runs: every task completes, the message count matches the flow,
//! percentiles are ordered, and the run cleans up after itself. No timing is asserted.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::TryStreamExt;

use imagepipe::bench::report::{Report, RunFigures};
use imagepipe::bench::stats::Percentiles;
use imagepipe::bench::{self, BenchOptions, Stages};
use imagepipe_bus::BusKind;
use imagepipe_runtime::Settings;
use imagepipe_runtime::config::StoreKind;

/// Messages of one task that succeeds at every step, by queue or event type.
const FLOW: [(&str, f64); 10] = [
    ("tasks.submit", 1.0),
    ("task.created", 1.0),
    ("tasks.download", 1.0),
    ("image.downloaded", 1.0),
    ("tasks.metadata", 1.0),
    ("image.metadata_extracted", 1.0),
    ("tasks.ai", 1.0),
    ("image.analyzed", 1.0),
    ("tasks.results", 3.0),
    ("task.completed", 1.0),
];

fn options(mode: Stages, tasks: usize, low_load_tasks: usize, runs: usize) -> BenchOptions {
    BenchOptions {
        scenario: imagepipe::bench::Scenario::Throughput,
        mode,
        tasks,
        low_load_tasks,
        runs,
        timeout: Duration::from_secs(120),
        photos: None,
    }
}

fn ordered(p: &Percentiles, what: &str) {
    assert!(p.p50_ms > 0.0 && p.p50_ms <= p.p95_ms && p.p95_ms <= p.p99_ms, "{what}: {p:?}");
}

fn check_run(run: &RunFigures, options: &BenchOptions) {
    let full = &run.full_load;
    assert_eq!((full.tasks, full.completed, full.failed), (options.tasks, options.tasks, 0), "{full:?}");
    assert!(full.tasks_per_s > 0.0 && full.seconds > 0.0, "{full:?}");
    ordered(&full.latency, "full-load latency");
    let low = &run.low_load;
    assert_eq!((low.tasks, low.completed, low.failed), (options.low_load_tasks, options.low_load_tasks, 0));
    ordered(&low.latency, "low-load latency");
    let stages: Vec<&str> = run.stage_ms.keys().map(String::as_str).collect();
    assert_eq!(stages, ["analyze", "download", "metadata"]);
    for p in run.stage_ms.values() {
        assert!(p.p50_ms <= p.p95_ms && p.p95_ms <= p.p99_ms, "{p:?}");
    }
    let flow: BTreeMap<String, f64> = FLOW.iter().map(|(d, n)| ((*d).to_owned(), *n)).collect();
    assert_eq!(run.messages.by_destination, flow);
    assert_eq!(run.messages.bus_per_task, 12.0);
    assert_eq!(run.messages.per_task, 12.0);
    assert!(run.cpu_ms_per_task.imagepipe.is_some());
    assert!(run.peak_rss_bytes.is_some_and(|b| b > 0));
}

fn check(report: &Report, options: &BenchOptions) {
    assert_eq!(report.runs.len(), options.runs);
    for run in &report.runs {
        check_run(run, options);
    }
    check_run(&report.median, options);
    assert!(report.left_behind.is_empty(), "{:?}", report.left_behind);
    let text = report.text();
    assert!(text.contains("/s (") && text.contains("12.00 per task"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_embedded_runs_complete_every_task_with_twelve_messages_each() {
    let settings = Settings::default();
    let options = options(Stages::Noop, 60, 10, 2);
    let report = bench::report(&settings, &options, None).await.unwrap();
    check(&report, &options);
    assert_eq!((report.bus.as_str(), report.store.as_str()), ("memory", "embedded"));
    assert_eq!(report.median.messages.counted_by, "bus");
    assert_eq!(report.median.messages.broker_by_stream, None);
}

/// What a bench run creates, as the broker and the store list them: NATS streams of a
/// `bench-<id>` prefix (`BENCH-<ID>_TASKS`, ...) and the `bench-<id>` prefixes of Redis keys.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Listed {
    streams: BTreeSet<String>,
    redis_prefixes: BTreeSet<String>,
}

impl Listed {
    async fn now(settings: &Settings) -> Self {
        let client = async_nats::connect(&settings.bus.nats.url).await.expect("connect to NATS");
        let js = async_nats::jetstream::new(client);
        let names: Vec<String> = js.stream_names().try_collect().await.expect("list streams");
        let streams = names.into_iter().filter(|name| name.starts_with("BENCH-")).collect();
        let redis = redis::Client::open(settings.store.redis.url.expose()).expect("Redis URL");
        let mut conn = redis.get_multiplexed_async_connection().await.expect("connect to Redis");
        let mut redis_prefixes = BTreeSet::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg("bench-*")
                .arg("COUNT")
                .arg(1_000)
                .query_async(&mut conn)
                .await
                .expect("SCAN");
            redis_prefixes.extend(keys.iter().filter_map(|key| key.split_once(':')).map(|(p, _)| p.to_owned()));
            if next == 0 {
                return Self { streams, redis_prefixes };
            }
            cursor = next;
        }
    }

    fn minus(&self, other: &Self) -> Self {
        Self {
            streams: self.streams.difference(&other.streams).cloned().collect(),
            redis_prefixes: self.redis_prefixes.difference(&other.redis_prefixes).cloned().collect(),
        }
    }

    fn and(&self, other: &Self) -> Self {
        Self {
            streams: self.streams.intersection(&other.streams).cloned().collect(),
            redis_prefixes: self.redis_prefixes.intersection(&other.redis_prefixes).cloned().collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.streams.is_empty() && self.redis_prefixes.is_empty()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_and_redis_runs_are_counted_by_the_broker_and_cleaned_up() {
    let mut settings = Settings::default();
    settings.bus.kind = BusKind::Nats;
    settings.store.kind = StoreKind::Redis;
    let options = options(Stages::Noop, 60, 10, 1);

    // What the run creates, seen in the broker's and the store's own lists while it runs.
    let before = Listed::now(&settings).await;
    let running = Arc::new(AtomicBool::new(true));
    let watcher = tokio::spawn({
        let (settings, running, before) = (settings.clone(), running.clone(), before.clone());
        async move {
            let mut seen = Listed::default();
            while running.load(Ordering::SeqCst) {
                let new = Listed::now(&settings).await.minus(&before);
                seen.streams.extend(new.streams);
                seen.redis_prefixes.extend(new.redis_prefixes);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            seen
        }
    });
    let report = bench::report(&settings, &options, None).await.unwrap();
    running.store(false, Ordering::SeqCst);
    let seen = watcher.await.unwrap();
    assert_eq!(seen.streams.len() % 3, 0, "tasks, events and dead-letter streams per run: {seen:?}");
    assert!(!seen.streams.is_empty() && !seen.redis_prefixes.is_empty(), "the run's streams and keys: {seen:?}");
    // Another process's bench may be running on the same servers: what is left of it goes when
    // that run ends, what this run left stays.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = Listed::now(&settings).await.and(&seen);
        if left.is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "left behind on the servers: {left:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    check(&report, &options);
    assert_eq!(report.median.messages.counted_by, "broker");
    let streams: BTreeMap<String, f64> =
        [("dlq".to_owned(), 0.0), ("events".to_owned(), 5.0), ("tasks".to_owned(), 7.0)].into();
    assert_eq!(report.median.messages.broker_by_stream, Some(streams));
    assert!(report.median.cpu_ms_per_task.imagepipe.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_mode_runs_the_sample_photos_through_the_real_workers() {
    let Some(model_dir) = common::model_dir() else { return };
    let mut settings = Settings::default();
    settings.ai.model_dir = model_dir;
    settings.ai.threads = 2;
    let options = options(Stages::Real, 4, 2, 1);
    let report = bench::report(&settings, &options, None).await.unwrap();
    check(&report, &options);
    assert_eq!(report.mode, Stages::Real);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_prints_a_json_report() {
    let args = [
        "bench",
        "--bus",
        "memory",
        "--store",
        "embedded",
        "--tasks",
        "20",
        "--low-load-tasks",
        "5",
        "--runs",
        "1",
        "--no-idle-rss",
        "--json",
    ];
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_imagepipe")).args(args).output().unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["mode"], "noop");
    assert_eq!(report["median"]["fullLoad"]["completed"], 20, "{report}");
    assert_eq!(report["median"]["messages"]["perTask"], 12.0, "{report}");
}
