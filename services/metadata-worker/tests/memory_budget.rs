//! Ten 10000×10000 16-bit RGBA PNGs (800 MB of pixels each) submitted at once to a metadata
//! worker whose memory budget fits two: never more than two decode at once, all ten are
//! extracted, and the process's peak memory stays near the budget. Alone in its test binary, so
//! the metrics recorder and the peak memory are this test's own.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use imagepipe_blob::{BlobStore, LocalBlobStore};
use imagepipe_bus::{Bus, BusConfig, ConsumerConfig};
use imagepipe_contracts::names::queues;
use imagepipe_contracts::{Labels, MetadataCommand, StepOutcome, StepOutput, StepResult, decode};
use imagepipe_metadata_worker::extract::memory_needed;
use imagepipe_metadata_worker::{metrics as worker_metrics, run};
use imagepipe_runtime::budget::metrics as budget_metrics;
use imagepipe_runtime::step::outgoing;
use imagepipe_runtime::{Settings, Shutdown};
use metrics::{Counter, CounterFn, Gauge, GaugeFn, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use support::{flat_rgba16_png, with_comment};

const IMAGES: usize = 10;
const EDGE: u32 = 10_000;
/// Memory the process holds besides the decoded pixels (runtime, bus, blobs, allocator slack).
const OVERHEAD: u64 = 512 << 20;

/// A metrics recorder keeping, by metric name, each gauge's highest value and each counter's
/// total.
#[derive(Default)]
struct Peaks {
    gauges: Mutex<HashMap<String, Arc<PeakGauge>>>,
    counters: Mutex<HashMap<String, Arc<Total>>>,
}

impl Peaks {
    fn gauge(&self, name: &str) -> Arc<PeakGauge> {
        self.gauges.lock().unwrap().entry(name.to_owned()).or_default().clone()
    }

    fn counter(&self, name: &str) -> Arc<Total> {
        self.counters.lock().unwrap().entry(name.to_owned()).or_default().clone()
    }
}

/// A gauge's value now and the highest it has been.
#[derive(Default)]
struct PeakGauge(Mutex<(f64, f64)>);

impl PeakGauge {
    fn update(&self, change: impl FnOnce(f64) -> f64) {
        let mut values = self.0.lock().unwrap();
        values.0 = change(values.0);
        values.1 = values.1.max(values.0);
    }

    fn highest(&self) -> f64 {
        self.0.lock().unwrap().1
    }
}

impl GaugeFn for PeakGauge {
    fn increment(&self, value: f64) {
        self.update(|now| now + value);
    }
    fn decrement(&self, value: f64) {
        self.update(|now| now - value);
    }
    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

#[derive(Default)]
struct Total(AtomicU64);

impl CounterFn for Total {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.fetch_max(value, Ordering::Relaxed);
    }
}

impl Recorder for Peaks {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.counter(key.name()))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.gauge(key.name()))
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

static PEAKS: LazyLock<Peaks> = LazyLock::new(Peaks::default);

/// A line of `/proc/self/status` in bytes (`VmHWM`: peak resident memory); `None` off Linux.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))?;
    Some(line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()? * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_huge_pngs_at_once_decode_at_most_two_at_a_time_within_the_budget() {
    metrics::set_global_recorder(&*PEAKS).expect("the only recorder of this test binary");
    let started = Instant::now();
    let png = flat_rgba16_png(EDGE, EDGE, [0x1234, 0x5678, 0x9abc, 0xffff]);
    assert!(png.len() < 1 << 20, "{} bytes", png.len());
    let mut settings = Settings::default();
    let needed = memory_needed(&png, &settings.metadata).unwrap();
    assert!(needed >= 800_000_000, "every pixel is 8 bytes: {needed}");
    println!("{} bytes of PNG, {needed} bytes to decode, made in {:?}", png.len(), started.elapsed());

    let dir = tempfile::tempdir().unwrap();
    settings.blob.dir = dir.path().join("blobs");
    settings.metadata.memory_budget = 2 * needed + needed / 2;
    settings.worker.concurrency = IMAGES;
    settings.worker.handler_timeout = Duration::from_secs(600);
    let blobs = LocalBlobStore::new(&settings.blob.dir);
    let mut keys = Vec::new();
    for i in 0..IMAGES {
        keys.push(blobs.put(Bytes::from(with_comment(&png, &format!("image {i}")))).await.unwrap());
    }
    drop(png);

    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
    for (i, key) in keys.iter().enumerate() {
        let task_id = format!("tsk_huge_{i}");
        let command =
            MetadataCommand { task_id: task_id.clone(), attempt: 1, blob_key: key.to_string(), labels: Labels::new() };
        bus.queues.send(queues::METADATA, outgoing(&command, &task_id, format!("{task_id}:metadata:1"))).await.unwrap();
    }
    // Peak memory from here on: the PNGs above were built and dropped.
    let resettable = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    let shutdown = Shutdown::new();
    let worker = tokio::spawn({
        let (bus, settings, shutdown) = (bus.clone(), settings.clone(), shutdown.clone());
        async move { run(bus, &settings, shutdown).await.expect("the worker runs") }
    });

    let decoding = Instant::now();
    let mut outcomes = HashMap::new();
    while outcomes.len() < IMAGES {
        let batch = results.fetch(IMAGES, Duration::from_secs(300)).await.unwrap();
        assert!(!batch.is_empty(), "no step result within 300 s; have {outcomes:?}");
        for delivery in batch {
            let result: StepResult = decode(&delivery.message.payload).unwrap();
            outcomes.insert(result.task_id, result.outcome);
            delivery.ack().await.unwrap();
        }
    }
    println!("{IMAGES} images extracted in {:?}", decoding.elapsed());
    for (task, outcome) in &outcomes {
        let StepOutcome::Ok { output: StepOutput::Metadata(metadata) } = outcome else {
            panic!("{task}: {outcome:?}");
        };
        assert_eq!((metadata.width, metadata.height, metadata.color_type.as_str()), (EDGE, EDGE, "rgba16"), "{task}");
        assert_eq!(metadata.dominant_colors.len(), 1, "{task}: one flat colour");
    }

    let most_decoding = PEAKS.gauge(worker_metrics::DECODING).highest();
    let most_in_use = PEAKS.gauge(budget_metrics::IN_USE_BYTES).highest();
    let waits = PEAKS.counter(budget_metrics::WAITS).0.load(Ordering::Relaxed);
    println!("at most {most_decoding} decoding, {most_in_use} bytes of the budget in use, {waits} waits");
    assert!((1.0..=2.0).contains(&most_decoding), "{most_decoding} images decoded at once");
    assert!(most_in_use <= settings.metadata.memory_budget as f64, "{most_in_use} bytes in use");
    assert!(waits >= (IMAGES - 2) as u64, "all but the first two waited for the budget: {waits}");
    match status_bytes("VmHWM") {
        Some(peak) if resettable => {
            println!("peak resident memory {} MiB", peak >> 20);
            assert!(peak < settings.metadata.memory_budget + OVERHEAD, "peak resident memory {peak} bytes");
        }
        _ => println!("peak resident memory not measured (no resettable /proc/self/status here)"),
    }

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(60), worker).await.expect("the worker stops").unwrap();
}
