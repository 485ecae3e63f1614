//! `imagepipe bench` on small runs: every task completes, the message count matches the flow,
//! percentiles are ordered, and the run cleans up after itself. No timing is asserted.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

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
    BenchOptions { mode, tasks, low_load_tasks, runs, timeout: Duration::from_secs(120) }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_and_redis_runs_are_counted_by_the_broker_and_cleaned_up() {
    let mut settings = Settings::default();
    settings.bus.kind = BusKind::Nats;
    settings.store.kind = StoreKind::Redis;
    let options = options(Stages::Noop, 60, 10, 1);
    let report = bench::report(&settings, &options, None).await.unwrap();
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
