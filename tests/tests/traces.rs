//! One task is one trace across processes: the coordinator, the download worker and the
//! analytics subscriber run as separate OS processes over NATS and Redis, export their spans
//! over OTLP to a receiver in this test, and every span of the task carries the `traceId` of
//! the task's events.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use imagepipe_e2e::backend::{Backend, Cleanup};
use imagepipe_e2e::cluster::{Cluster, ClusterConfig, ServiceKind};
use imagepipe_e2e::fixtures::Fixtures;
use imagepipe_e2e::observe::{EventRecorder, Seen};
use imagepipe_e2e::otlp::{OtlpReceiver, ReceivedSpan};
use serde_json::json;

/// The services of these tests and the `service.name` each exports under.
const COORDINATOR: (ServiceKind, &str) = (ServiceKind::Coordinator, "coordinator");
const DOWNLOAD: (ServiceKind, &str) = (ServiceKind::Download, "download-worker");
const ANALYTICS: (ServiceKind, &str) = (ServiceKind::Analytics, "analytics-worker");

/// A run: the receiver, the photo server, the services (exporting to the receiver, batching
/// spans for `batch_delay_ms`) and a recorder of their events.
struct Run {
    receiver: OtlpReceiver,
    fixtures: Fixtures,
    backend: Backend,
    cluster: Cluster,
    recorder: EventRecorder,
    _cleanup: Cleanup,
}

impl Run {
    async fn start(label: &str, services: &[(ServiceKind, &str)], batch_delay_ms: u64) -> Self {
        let receiver = OtlpReceiver::start().await.expect("OTLP receiver");
        let fixtures = Fixtures::start().await.expect("fixture server");
        let backend = Backend::nats();
        let kinds: Vec<ServiceKind> = services.iter().map(|(kind, _)| *kind).collect();
        let config = ClusterConfig::new(backend.clone(), label)
            .services(&kinds)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint())
            .env("OTEL_BSP_SCHEDULE_DELAY", batch_delay_ms.to_string());
        let cleanup = Cleanup::new(&backend, &config.prefix);
        let recorder = EventRecorder::start(&backend.bus_config(&config.prefix)).await.expect("event recorder");
        let cluster = Cluster::start(config).await.expect("cluster");
        Self { receiver, fixtures, backend, cluster, recorder, _cleanup: cleanup }
    }

    /// Publishes one submit command for a sample photo, as plain JSON on
    /// `<prefix>.tasks.submit`, and returns the task id.
    async fn submit(&self) -> String {
        let prefix = self.cluster.prefix();
        let task_id = format!("tsk_{prefix}_traced");
        let body = json!({ "taskId": task_id, "url": self.fixtures.photo_url("chelsea.jpg") });
        let submitter = self.backend.submitter(prefix).await.expect("submitter");
        submitter.publish_all(vec![serde_json::to_vec(&body).expect("JSON")]).await.expect("publish the submit");
        task_id
    }

    /// The task's `image.downloaded` event, once published.
    async fn downloaded(&self, task_id: &str) -> Seen {
        let of_task = |seen: &Seen| seen.task_id == task_id && seen.event_type == "image.downloaded";
        let published = self.recorder.wait_until(Duration::from_secs(60), |r| r.seen().iter().any(of_task)).await;
        assert!(published, "no image.downloaded for {task_id}; events: {:?}", self.recorder.seen());
        self.recorder.seen().into_iter().find(of_task).expect("just seen")
    }
}

/// The spans of trace `trace_id`, by span id.
fn trace(spans: &[ReceivedSpan], trace_id: &str) -> BTreeMap<String, ReceivedSpan> {
    spans.iter().filter(|s| s.trace_id == trace_id).map(|s| (s.span_id.clone(), s.clone())).collect()
}

/// Whether the trace has spans of every service in `services` and the parent of each of its
/// spans is one of them (nothing of it is still on the way).
fn complete(spans: &[ReceivedSpan], trace_id: &str, services: &[(ServiceKind, &str)]) -> bool {
    let trace = trace(spans, trace_id);
    let names: BTreeSet<&str> = trace.values().map(|s| s.service_name.as_str()).collect();
    services.iter().all(|(_, name)| names.contains(name))
        && trace.values().all(|s| s.parent_span_id.as_ref().is_none_or(|p| trace.contains_key(p)))
}

/// The (parent, child) services of the spans of `trace` whose parent is in another service:
/// the hops of the trace between processes.
fn hops(trace: &BTreeMap<String, ReceivedSpan>) -> BTreeSet<(String, String)> {
    trace
        .values()
        .filter_map(|span| {
            let parent = trace.get(span.parent_span_id.as_ref()?)?;
            (parent.service_name != span.service_name).then(|| (parent.service_name.clone(), span.service_name.clone()))
        })
        .collect()
}

/// Whether trace `trace_id` is complete and has at least the hops `expected`.
fn has_hops(
    spans: &[ReceivedSpan],
    trace_id: &str,
    services: &[(ServiceKind, &str)],
    expected: &[(&str, &str)],
) -> bool {
    complete(spans, trace_id, services) && {
        let hops = hops(&trace(spans, trace_id));
        expected.iter().all(|(from, to)| hops.contains(&((*from).to_owned(), (*to).to_owned())))
    }
}

fn owned(hops: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    hops.iter().map(|(from, to)| ((*from).to_owned(), (*to).to_owned())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_task_is_one_trace_across_the_coordinator_a_worker_and_a_subscriber() {
    let services = [COORDINATOR, DOWNLOAD, ANALYTICS];
    // The download command, task.created, image.downloaded and the step result.
    let expected = [
        (COORDINATOR.1, DOWNLOAD.1),
        (COORDINATOR.1, ANALYTICS.1),
        (DOWNLOAD.1, ANALYTICS.1),
        (DOWNLOAD.1, COORDINATOR.1),
    ];
    let run = Run::start("traces", &services, 100).await;
    let task_id = run.submit().await;
    let downloaded = run.downloaded(&task_id).await;
    let trace_id = downloaded.trace_id.clone();
    assert_eq!(trace_id.len(), 32, "a W3C trace id: {trace_id:?}");
    let events: Vec<Seen> = run.recorder.seen().into_iter().filter(|s| s.task_id == task_id).collect();
    assert!(events.iter().any(|s| s.event_type == "task.created"), "{events:?}");
    assert!(events.iter().all(|s| s.trace_id == trace_id), "every event of the task in one trace: {events:?}");

    let waited =
        run.receiver.wait_for(|spans| has_hops(spans, &trace_id, &services, &expected), Duration::from_secs(30));
    let spans = waited.await.unwrap_or_else(|timeout| {
        panic!("{timeout}; spans of the trace: {:#?}", trace(&timeout.received, &trace_id).values())
    });
    let trace = trace(&spans, &trace_id);
    let roots: Vec<&ReceivedSpan> = trace.values().filter(|s| s.parent_span_id.is_none()).collect();
    assert_eq!(roots.len(), 1, "one root: {roots:#?}");
    assert_eq!(roots[0].service_name, COORDINATOR.1, "the trace starts where the submit is handled");
    assert_eq!(hops(&trace), owned(&expected), "every message between the processes, and only those");

    let failures = run.cluster.stop(Duration::from_secs(30)).await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_stopped_with_sigterm_export_the_spans_they_still_held() {
    let services = [COORDINATOR, DOWNLOAD];
    let hour_ms = 3_600_000;
    let run = Run::start("traces_flush", &services, hour_ms).await;
    let task_id = run.submit().await;
    let trace_id = run.downloaded(&task_id).await.trace_id;
    assert!(run.receiver.spans().is_empty(), "nothing exported before the batch delay of an hour");

    let failures = run.cluster.stop(Duration::from_secs(30)).await;
    assert!(failures.is_empty(), "services that did not stop cleanly on SIGTERM: {failures:?}");
    let spans = run.receiver.spans();
    assert!(
        has_hops(&spans, &trace_id, &services, &[(COORDINATOR.1, DOWNLOAD.1)]),
        "after the exits, the task's spans from both services: {:#?}",
        trace(&spans, &trace_id).values()
    );
}
